//! Device admission as kubelet's devicemanager does it, over real sockets.

mod common;

use common::{RESOURCE, WAIT, plugin, set, start};
use steward_proto::deviceplugin::v1beta1::DevicePluginOptions;
use steward_testing_kubelet::testing::{TestPluginConfig, device};
use steward_testing_kubelet::{
    CREATE_CONTAINER_CONFIG_ERROR, ContainerSpec, Error, Phase, PodSpec, UNEXPECTED_ADMISSION_ERROR,
};

fn pod(name: &str, count: i64) -> PodSpec {
    PodSpec::new("default", name).container(ContainerSpec::new("main").limit(RESOURCE, count))
}

fn admission_error(err: Error) -> (String, String) {
    match err {
        Error::Admission {
            reason, message, ..
        } => (reason, message),
        other => panic!("expected an admission error, got {other:?}"),
    }
}

#[tokio::test]
async fn admission_picks_free_healthy_devices_and_never_shares_them() {
    let env = start().await;
    let mut config = TestPluginConfig::new(RESOURCE, "p.sock", &[]);
    config.devices = vec![
        device("a", true, &[]),
        device("b", false, &[]),
        device("c", true, &[]),
    ];
    let p = plugin(&env.kubelet, config).await;

    let one = env.kubelet.add_pod(pod("one", 1)).await.unwrap();
    let two = env.kubelet.add_pod(pod("two", 1)).await.unwrap();
    let d1 = one.devices["main"][RESOURCE].clone();
    let d2 = two.devices["main"][RESOURCE].clone();
    assert_eq!(d1.len(), 1);
    assert_eq!(d2.len(), 1);
    assert!(d1.is_disjoint(&d2), "{d1:?} vs {d2:?}");
    // The unhealthy device is never handed out.
    assert_eq!(&d1 | &d2, set(&["a", "c"]));

    // The plugin saw exactly those Allocate calls and its answer is returned.
    let calls = p.calls();
    assert_eq!(calls.allocate.len(), 2);
    assert_eq!(
        set(&calls.allocate[0]
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()),
        d1
    );
    let resp = &one.responses["main"][RESOURCE];
    let id = d1.iter().next().unwrap();
    assert_eq!(resp.envs["TEST_DEVICES"], *id);
    assert_eq!(resp.devices[0].host_path, format!("/dev/test-{id}"));
    assert_eq!(resp.cdi_devices[0].name, format!("example.com/test={id}"));
    assert_eq!(resp.annotations["test.example.com/devices"], *id);
    assert_eq!(
        env.kubelet
            .allocate_response(&one.uid, "main", RESOURCE)
            .as_ref(),
        Some(resp)
    );
    assert!(
        calls.preferred.is_empty(),
        "GetPreferredAllocation not advertised"
    );
    assert!(calls.pre_start.is_empty(), "PreStartContainer not required");
    assert_eq!(env.kubelet.pod(&one.uid).unwrap().phase, Phase::Running);

    // Nothing free is left: the third pod is rejected like kubelet does.
    let err = env.kubelet.add_pod(pod("three", 1)).await.unwrap_err();
    let uid = match &err {
        Error::Admission { uid, .. } => uid.clone(),
        other => panic!("{other:?}"),
    };
    let (reason, message) = admission_error(err);
    assert_eq!(reason, UNEXPECTED_ADMISSION_ERROR);
    assert_eq!(
        message,
        "Allocate failed due to requested number of devices unavailable for example.com/dev. Requested: 1, Available: 0, which is unexpected"
    );
    let rejected = env.kubelet.pod(&uid).unwrap();
    assert_eq!(rejected.phase, Phase::Failed);
    assert_eq!(rejected.reason.as_deref(), Some(UNEXPECTED_ADMISSION_ERROR));
    assert_eq!(
        rejected.message,
        Some(format!("Pod was rejected: {message}"))
    );
    assert_eq!(
        p.calls().allocate.len(),
        2,
        "no Allocate for a rejected pod"
    );

    // Asking for more than exists says how many are available.
    env.kubelet
        .terminate_pod(&one.uid, Phase::Succeeded)
        .await
        .unwrap();
    let (_, message) = admission_error(env.kubelet.add_pod(pod("four", 2)).await.unwrap_err());
    assert!(message.contains("Requested: 2, Available: 1"), "{message}");
}

#[tokio::test]
async fn terminated_pods_release_their_devices() {
    let env = start().await;
    let _p = plugin(
        &env.kubelet,
        TestPluginConfig::new(RESOURCE, "p.sock", &["only"]),
    )
    .await;

    let first = env.kubelet.add_pod(pod("first", 1)).await.unwrap();
    assert!(env.kubelet.add_pod(pod("blocked", 1)).await.is_err());

    env.kubelet
        .terminate_pod(&first.uid, Phase::Failed)
        .await
        .unwrap();
    assert_eq!(env.kubelet.pod(&first.uid).unwrap().phase, Phase::Failed);
    assert!(matches!(
        env.kubelet.terminate_pod(&first.uid, Phase::Running).await,
        Err(Error::NotTerminal(Phase::Running))
    ));

    let next = env.kubelet.add_pod(pod("next", 1)).await.unwrap();
    assert_eq!(next.devices["main"][RESOURCE], set(&["only"]));
    // The admission garbage-collected the terminated pod's allocation.
    assert_eq!(env.kubelet.allocated(&first.uid), None);

    // A deleted pod frees its device as well.
    env.kubelet.delete_pod(&next.uid).await.unwrap();
    assert!(env.kubelet.pod(&next.uid).is_none());
    assert!(env.kubelet.allocated(&next.uid).is_none());
    let last = env.kubelet.add_pod(pod("last", 1)).await.unwrap();
    assert_eq!(last.devices["main"][RESOURCE], set(&["only"]));
    assert!(matches!(
        env.kubelet.delete_pod("nope").await,
        Err(Error::UnknownPod(_))
    ));
}

#[tokio::test]
async fn init_container_devices_are_reused_and_not_double_counted() {
    let env = start().await;
    let p = plugin(
        &env.kubelet,
        TestPluginConfig::new(RESOURCE, "p.sock", &["a", "b", "c"]),
    )
    .await;

    // init(1) then main(1): main gets the init container's device again.
    let spec = PodSpec::new("default", "with-init")
        .init_container(ContainerSpec::new("init").limit(RESOURCE, 1))
        .container(ContainerSpec::new("main").limit(RESOURCE, 1));
    let a = env.kubelet.add_pod(spec).await.unwrap();
    let init = a.devices["init"][RESOURCE].clone();
    assert_eq!(init.len(), 1);
    assert_eq!(a.devices["main"][RESOURCE], init);
    let calls = p.calls().allocate;
    assert_eq!(calls.len(), 2, "Allocate called for both containers");
    assert_eq!(calls[0], calls[1], "same device allocated twice");

    // init(1) then two app containers: the first reuses, the second does not.
    let spec = PodSpec::new("default", "two-apps")
        .init_container(ContainerSpec::new("init").limit(RESOURCE, 1))
        .container(ContainerSpec::new("app1").limit(RESOURCE, 1))
        .container(ContainerSpec::new("app2").limit(RESOURCE, 1));
    let b = env.kubelet.add_pod(spec).await.unwrap();
    assert_eq!(b.devices["app1"][RESOURCE], b.devices["init"][RESOURCE]);
    assert!(b.devices["app2"][RESOURCE].is_disjoint(&b.devices["app1"][RESOURCE]));
    assert!(b.devices["app2"][RESOURCE].is_disjoint(&init));
    assert!(b.devices["app1"][RESOURCE].is_disjoint(&init));

    // 3 devices, pod A holds 1 (counted once), pod B holds 2: nothing is left.
    let err = env.kubelet.add_pod(pod("late", 1)).await.unwrap_err();
    assert!(err.to_string().contains("Available: 0"), "{err}");
    env.kubelet
        .terminate_pod(&b.uid, Phase::Succeeded)
        .await
        .unwrap();
    let c = env.kubelet.add_pod(pod("later", 2)).await.unwrap();
    assert!(c.devices["main"][RESOURCE].is_disjoint(&init));
}

#[tokio::test]
async fn allocate_errors_and_unknown_resources_reject_the_pod() {
    let env = start().await;
    let mut p = plugin(
        &env.kubelet,
        TestPluginConfig::new(RESOURCE, "p.sock", &["a"]),
    )
    .await;

    p.fail_allocate(Some("device on fire"));
    let (reason, message) =
        admission_error(env.kubelet.add_pod(pod("burnt", 1)).await.unwrap_err());
    assert_eq!(reason, UNEXPECTED_ADMISSION_ERROR);
    assert_eq!(
        message,
        "Allocate failed due to rpc error: code = Internal desc = device on fire, which is unexpected"
    );
    assert_eq!(p.calls().allocate, vec![vec!["a".to_string()]]);

    // The failed allocation does not hold the device.
    // A failed Allocate is not observed as an allocation duration.
    assert!(env.kubelet.allocate_durations(RESOURCE).is_empty());
    p.fail_allocate(None);
    let ok = env.kubelet.add_pod(pod("fine", 1)).await.unwrap();
    assert_eq!(ok.devices["main"][RESOURCE], set(&["a"]));
    let durations = env.kubelet.allocate_durations(RESOURCE);
    assert_eq!(durations.len(), 1, "one successful Allocate: {durations:?}");
    assert!(durations[0] > std::time::Duration::ZERO);

    // A resource nobody advertises fails the node predicate.
    let spec = PodSpec::new("default", "alien")
        .container(ContainerSpec::new("main").limit("example.com/unknown", 2));
    let (reason, message) = admission_error(env.kubelet.add_pod(spec).await.unwrap_err());
    assert_eq!(reason, "OutOfexample.com/unknown");
    assert_eq!(
        message,
        "Node didn't have enough resource: example.com/unknown, requested: 2, used: 0, capacity: 0"
    );

    // Once the plugin is gone, its resource has no healthy devices.
    env.kubelet
        .terminate_pod(&ok.uid, Phase::Succeeded)
        .await
        .unwrap();
    p.stop().await;
    env.kubelet
        .wait_for_resource(RESOURCE, |s| !s.connected, WAIT)
        .await
        .unwrap();
    let (_, message) = admission_error(env.kubelet.add_pod(pod("orphan", 1)).await.unwrap_err());
    assert_eq!(
        message,
        "Allocate failed due to no healthy devices present; cannot allocate unhealthy devices example.com/dev, which is unexpected"
    );

    // Invalid specs are refused before anything happens.
    let dup = PodSpec::new("default", "dup")
        .init_container(ContainerSpec::new("x"))
        .container(ContainerSpec::new("x"));
    assert!(matches!(
        env.kubelet.add_pod(dup).await,
        Err(Error::InvalidPod(_))
    ));
}

#[tokio::test]
async fn get_preferred_allocation_is_honoured() {
    let env = start().await;
    let mut config = TestPluginConfig::new(RESOURCE, "p.sock", &["a", "b", "c", "d"]);
    config.options = DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: true,
    };
    let p = plugin(&env.kubelet, config).await;

    // The test plugin prefers the highest IDs; the stand-in alone would pick a, b.
    let first = env.kubelet.add_pod(pod("first", 2)).await.unwrap();
    assert_eq!(first.devices["main"][RESOURCE], set(&["c", "d"]));
    let calls = p.calls();
    assert_eq!(calls.preferred.len(), 1);
    let req = &calls.preferred[0];
    assert_eq!(req.allocation_size, 2);
    assert_eq!(
        set(&req
            .available_device_i_ds
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()),
        set(&["a", "b", "c", "d"])
    );
    assert!(req.must_include_device_i_ds.is_empty());
    assert_eq!(calls.allocate, vec![vec!["c".to_string(), "d".to_string()]]);

    // Preferences outside the available set are ignored; valid ones are used.
    p.set_preferred(Some(vec!["d".to_string(), "b".to_string()]));
    let second = env.kubelet.add_pod(pod("second", 1)).await.unwrap();
    assert_eq!(second.devices["main"][RESOURCE], set(&["b"]));
    let req = &p.calls().preferred[1];
    assert_eq!(
        set(&req
            .available_device_i_ds
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()),
        set(&["a", "b"])
    );

    // An answer with nothing usable falls back to the free devices.
    p.set_preferred(Some(vec!["zz".to_string()]));
    let third = env.kubelet.add_pod(pod("third", 1)).await.unwrap();
    assert_eq!(third.devices["main"][RESOURCE], set(&["a"]));
}

#[tokio::test]
async fn pre_start_container_is_called_when_required() {
    let env = start().await;
    let mut config = TestPluginConfig::new(RESOURCE, "p.sock", &["a", "b"]);
    config.options = DevicePluginOptions {
        pre_start_required: true,
        get_preferred_allocation_available: false,
    };
    let p = plugin(&env.kubelet, config).await;

    let spec = PodSpec::new("default", "starts")
        .init_container(ContainerSpec::new("init").limit(RESOURCE, 1))
        .container(ContainerSpec::new("main").limit(RESOURCE, 1))
        .container(ContainerSpec::new("sidecar"));
    let admitted = env.kubelet.add_pod(spec).await.unwrap();
    let dev: Vec<String> = admitted.devices["main"][RESOURCE].iter().cloned().collect();
    // Once per container holding devices, in start order.
    assert_eq!(p.calls().pre_start, vec![dev.clone(), dev]);
    assert_eq!(
        env.kubelet.pod(&admitted.uid).unwrap().phase,
        Phase::Running
    );

    // A failing PreStartContainer keeps the pod from starting.
    p.fail_pre_start(Some("not ready"));
    let err = env.kubelet.add_pod(pod("stuck", 1)).await.unwrap_err();
    let uid = match err {
        Error::ContainerStart {
            uid,
            container,
            message,
        } => {
            assert_eq!(container, "main");
            assert_eq!(
                message,
                "device plugin PreStartContainer rpc failed with err: rpc error: code = Internal desc = not ready"
            );
            uid
        }
        other => panic!("{other:?}"),
    };
    let stuck = env.kubelet.pod(&uid).unwrap();
    assert_eq!(stuck.phase, Phase::Pending);
    assert_eq!(stuck.reason.as_deref(), Some(CREATE_CONTAINER_CONFIG_ERROR));
    assert_eq!(p.calls().pre_start.len(), 3);
}
