//! The plugin watcher: DRA drivers register through `plugins_registry`
//! (GetInfo, validation, NotifyRegistrationStatus), are refused with
//! kubelet's texts, and are deregistered when their socket goes.
// Test helpers: panicking on an unexpected answer is the point.
#![allow(clippy::unwrap_used)]

mod common;

use common::{WAIT, start};
use steward_testing_kubelet::Kubelet;
use steward_testing_kubelet::testing::dra::{TestDraPlugin, TestDraPluginConfig};

async fn serve(kubelet: &Kubelet, config: TestDraPluginConfig) -> TestDraPlugin {
    TestDraPlugin::serve(
        kubelet.plugins_registry_dir(),
        kubelet.plugins_dir(),
        config,
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn a_good_plugin_registers_and_is_deregistered_when_its_socket_goes() {
    let env = start().await;
    let kubelet = &env.kubelet;
    assert!(kubelet.plugins_registry_dir().is_dir());
    let mut plugin = serve(kubelet, TestDraPluginConfig::new("steward.dev")).await;
    let registered = kubelet
        .wait_for_dra_driver("steward.dev", WAIT)
        .await
        .unwrap();
    assert_eq!(registered.endpoint, plugin.endpoint());
    assert_eq!(registered.registration_socket, plugin.registration_socket());
    assert_eq!(registered.service, "v1.DRAPlugin");
    let notes = plugin.wait_for_notifications(1, WAIT).await.unwrap();
    assert!(notes[0].plugin_registered, "{notes:?}");
    assert_eq!(notes[0].error, "");
    assert!(plugin.calls().get_info >= 1);

    plugin.stop().await;
    kubelet
        .wait_for_dra_plugins(|p| !p.contains_key("steward.dev"), WAIT)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_plugin_of_another_type_is_refused_and_retried() {
    let env = start().await;
    let kubelet = &env.kubelet;
    let plugin = serve(
        kubelet,
        TestDraPluginConfig::new("csi.example.com").plugin_type("CSIPlugin"),
    )
    .await;
    // kubelet retries failed registrations with backoff, telling the plugin each time.
    let notes = plugin.wait_for_notifications(2, WAIT).await.unwrap();
    let want = format!(
        "RegisterPlugin error -- no handler registered for plugin type: CSIPlugin at socket {}",
        plugin.registration_socket().display()
    );
    for n in &notes {
        assert!(!n.plugin_registered);
        assert_eq!(n.error, want);
    }
    assert!(kubelet.dra_plugins().is_empty());
}

#[tokio::test]
async fn a_plugin_without_a_version_kubelet_speaks_is_refused() {
    let env = start().await;
    let kubelet = &env.kubelet;
    let plugin = serve(
        kubelet,
        TestDraPluginConfig::new("old.example.com").supported_versions(&["v1beta1.DRAPlugin"]),
    )
    .await;
    let notes = plugin.wait_for_notifications(1, WAIT).await.unwrap();
    assert!(!notes[0].plugin_registered);
    assert_eq!(
        notes[0].error,
        format!(
            r#"RegisterPlugin error -- plugin validation failed with err: invalid supported gRPC versions of DRA driver plugin old.example.com at endpoint {}: none of services supported by the plugin (["v1beta1.DRAPlugin"]) are supported by the kubelet (["v1.DRAPlugin"])"#,
            plugin.endpoint().display()
        )
    );
    assert!(kubelet.dra_plugins().is_empty());

    // Offering v1 as well is enough.
    let both = serve(
        kubelet,
        TestDraPluginConfig::new("new.example.com")
            .supported_versions(&["v1beta1.DRAPlugin", "v1.DRAPlugin"]),
    )
    .await;
    let p = kubelet
        .wait_for_dra_driver("new.example.com", WAIT)
        .await
        .unwrap();
    assert_eq!(p.service, "v1.DRAPlugin");
    assert!(both.wait_for_notifications(1, WAIT).await.unwrap()[0].plugin_registered);
}

#[tokio::test]
async fn instances_of_one_driver_stack_and_may_not_share_an_endpoint() {
    let env = start().await;
    let kubelet = &env.kubelet;
    let first = serve(kubelet, TestDraPluginConfig::new("steward.dev")).await;
    kubelet
        .wait_for_dra_driver("steward.dev", WAIT)
        .await
        .unwrap();

    // A second instance on the same endpoint is refused by the DRA handler.
    let endpoint = first.endpoint().to_string_lossy().into_owned();
    let hijack = serve(
        kubelet,
        TestDraPluginConfig::new("steward.dev")
            .registration_name("hijack-reg.sock")
            .socket_name("hijack.sock")
            .advertised_endpoint(&endpoint),
    )
    .await;
    let notes = hijack.wait_for_notifications(1, WAIT).await.unwrap();
    assert!(!notes[0].plugin_registered);
    assert_eq!(
        notes[0].error,
        format!(
            "RegisterPlugin error -- plugin registration failed with err: endpoint {endpoint} already registered for DRA driver plugin steward.dev"
        )
    );

    // A second instance on its own endpoint (a rolling update) is used next.
    let mut second = serve(
        kubelet,
        TestDraPluginConfig::new("steward.dev")
            .registration_name("second-reg.sock")
            .socket_name("second.sock"),
    )
    .await;
    let all = kubelet
        .wait_for_dra_plugins(|p| p.get("steward.dev").is_some_and(|v| v.len() == 2), WAIT)
        .await
        .unwrap();
    assert_eq!(all["steward.dev"][1].endpoint, second.endpoint());
    second.stop().await;
    let all = kubelet
        .wait_for_dra_plugins(|p| p.get("steward.dev").is_some_and(|v| v.len() == 1), WAIT)
        .await
        .unwrap();
    assert_eq!(all["steward.dev"][0].endpoint, first.endpoint());
}
