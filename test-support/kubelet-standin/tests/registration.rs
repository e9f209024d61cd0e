//! Registration validation and ListAndWatch tracking over real sockets.

mod common;

use common::{RESOURCE, WAIT, plugin, set, start};
use steward_proto::deviceplugin::v1beta1::{DevicePluginOptions, RegisterRequest, VERSION};
use steward_testing_kubelet::testing::{TestPlugin, TestPluginConfig, device};

fn request(version: &str, endpoint: &str, resource: &str) -> RegisterRequest {
    RegisterRequest {
        version: version.to_string(),
        endpoint: endpoint.to_string(),
        resource_name: resource.to_string(),
        options: None,
    }
}

#[tokio::test]
async fn registration_rejects_bad_requests_like_kubelet() {
    let env = start().await;
    let p = TestPlugin::serve(
        env.kubelet.plugin_dir(),
        TestPluginConfig::new(RESOURCE, "p.sock", &["a"]),
    )
    .await
    .unwrap();
    let sock = env.kubelet.kubelet_socket();

    let err = p
        .register_with(sock, request("v1", "p.sock", RESOURCE))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unknown);
    assert_eq!(
        err.message(),
        r#"requested API version "v1" is not supported by kubelet. Supported versions are ["v1beta1"]"#
    );

    for bad in [
        "gpu",
        "kubernetes.io/gpu",
        "Example.com/gpu",
        "example.com/a/b",
    ] {
        let err = p
            .register_with(sock, request(VERSION, "p.sock", bad))
            .await
            .unwrap_err();
        assert_eq!(
            err.message(),
            format!("the ResourceName {bad:?} is invalid")
        );
    }

    for bad in ["../p.sock", "sub/p.sock", ""] {
        let err = p
            .register_with(sock, request(VERSION, bad, RESOURCE))
            .await
            .unwrap_err();
        assert!(
            err.message().contains("is invalid"),
            "{bad}: {}",
            err.message()
        );
    }

    let err = p
        .register_with(sock, request(VERSION, "missing.sock", RESOURCE))
        .await
        .unwrap_err();
    assert!(
        err.message().starts_with("failed to dial device plugin"),
        "{}",
        err.message()
    );

    // None of that registered anything or called the plugin.
    assert!(env.kubelet.resources().is_empty());
    assert_eq!(p.calls().options, 0);
    assert_eq!(p.calls().list_and_watch, 0);

    // The valid request goes through.
    p.register(sock).await.unwrap();
    let st = env
        .kubelet
        .wait_for_resource(RESOURCE, |s| s.healthy.len() == 1, WAIT)
        .await
        .unwrap();
    assert_eq!(st.endpoint, "p.sock");
    assert_eq!(p.calls().options, 1);
}

#[tokio::test]
async fn list_and_watch_tracks_health_topology_and_endpoint_stop() {
    let env = start().await;
    let mut config = TestPluginConfig::new(RESOURCE, "p.sock", &[]);
    config.devices = vec![
        device("a", true, &[0]),
        device("b", true, &[]),
        device("c", false, &[1]),
    ];
    config.options = DevicePluginOptions {
        pre_start_required: true,
        get_preferred_allocation_available: false,
    };
    let mut p = plugin(&env.kubelet, config).await;

    let st = env.kubelet.resource(RESOURCE).unwrap();
    assert_eq!(st.healthy, set(&["a", "b"]));
    assert_eq!(st.unhealthy, set(&["c"]));
    assert_eq!(st.topology["a"], vec![0]);
    assert!(st.topology["b"].is_empty());
    assert_eq!(st.topology["c"], vec![1]);
    assert!(st.pre_start_required);
    assert!(!st.get_preferred_allocation_available);
    assert_eq!((st.capacity(), st.allocatable()), (3, 2));

    // Health changes are pushed.
    p.set_health("a", false);
    p.set_health("c", true);
    let st = env
        .kubelet
        .wait_for_resource(RESOURCE, |s| s.healthy == set(&["b", "c"]), WAIT)
        .await
        .unwrap();
    assert_eq!(st.unhealthy, set(&["a"]));

    // The device list is replaced wholesale.
    p.set_devices(vec![device("b", true, &[]), device("d", true, &[1])]);
    let st = env
        .kubelet
        .wait_for_resource(RESOURCE, |s| s.healthy == set(&["b", "d"]), WAIT)
        .await
        .unwrap();
    assert!(st.unhealthy.is_empty());
    assert!(!st.topology.contains_key("a"));

    // The plugin goes away: its devices become unhealthy, allocatable drops to 0.
    p.stop().await;
    let st = env
        .kubelet
        .wait_for_resource(RESOURCE, |s| !s.connected, WAIT)
        .await
        .unwrap();
    assert!(st.healthy.is_empty());
    assert_eq!(st.unhealthy, set(&["b", "d"]));
    assert_eq!((st.capacity(), st.allocatable()), (2, 0));
}

#[tokio::test]
async fn re_registration_replaces_the_old_endpoint() {
    let env = start().await;
    let mut first = plugin(
        &env.kubelet,
        TestPluginConfig::new(RESOURCE, "one.sock", &["a", "b"]),
    )
    .await;
    first.wait_for_open_streams(1, WAIT).await.unwrap();

    let second = plugin(
        &env.kubelet,
        TestPluginConfig::new(RESOURCE, "two.sock", &["x"]),
    )
    .await;
    let st = env
        .kubelet
        .wait_for_resource(RESOURCE, |s| s.healthy == set(&["x"]), WAIT)
        .await
        .unwrap();
    assert_eq!(st.endpoint, "two.sock");
    assert_eq!(st.registrations, 2);
    // The stand-in dropped the old ListAndWatch stream.
    first.wait_for_open_streams(0, WAIT).await.unwrap();
    assert_eq!(second.open_streams(), 1);

    // The old plugin stopping does not mark the new endpoint's devices unhealthy.
    first.stop().await;
    second.set_devices(vec![device("x", true, &[]), device("y", true, &[])]);
    let st = env
        .kubelet
        .wait_for_resource(RESOURCE, |s| s.healthy == set(&["x", "y"]), WAIT)
        .await
        .unwrap();
    assert!(st.connected);
    assert!(st.unhealthy.is_empty());
}
