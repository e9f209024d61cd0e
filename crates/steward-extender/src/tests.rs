use super::*;
use kube::api::PostParams;

#[test]
fn a_pods_slots_add_up_and_init_containers_take_the_larger() {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p"},
        "spec": {
            "initContainers": [{"name": "i", "resources": {"limits": {"steward.dev/cam": "3"}}}],
            "containers": [
                {"name": "a", "resources": {"limits": {"steward.dev/cam": "1", "cpu": "1"}}},
                {"name": "b", "resources": {"requests": {"steward.dev/cam": "1", "steward.dev/mic": "2"}}},
                {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
            ]
        }
    }))
    .unwrap();
    let r = slot_request(&pod);
    assert_eq!(r, BTreeMap::from([("cam".into(), 3), ("mic".into(), 2)]));
}

#[test]
fn exclusive_cpus_are_asked_with_their_own_resource() {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p"},
        "spec": {
            "initContainers": [{"name": "i", "resources": {"limits": {"resmgr.steward.dev/exclusive-cpus": "2"}}}],
            "containers": [
                {"name": "a", "resources": {"limits": {"resmgr.steward.dev/exclusive-cpus": "2", "cpu": "2"}}},
                {"name": "b", "resources": {"requests": {"resmgr.steward.dev/exclusive-cpus": "1"}}},
                {"name": "c", "resources": {"limits": {"cpu": "4", "memory": "1Gi"}}}
            ]
        }
    }))
    .unwrap();
    assert_eq!(cpu_request(&pod), 3, "integer cpu alone does not opt in");
    assert!(slot_request(&pod).is_empty(), "not a steward.dev slot");
}

#[test]
fn huge_asks_saturate_instead_of_overflowing() {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p"},
        "spec": {
            "containers": [
                {"name": "a", "resources": {"limits": {"steward.dev/cam": "4294967295"}}},
                {"name": "b", "resources": {"limits": {"steward.dev/cam": "4294967295"}}},
                {"name": "c", "resources": {"limits": {"steward.dev/cam": "4294967296"}}}
            ]
        }
    }))
    .unwrap();
    assert_eq!(
        slot_request(&pod),
        BTreeMap::from([("cam".into(), u32::MAX)])
    );
}

/// Prioritize on a replica whose picture lags: it still has the
/// Reservation as Requested while the API has it Reserved on n2.
/// A stand-in with steward's CRDs and pod p's Reservation decided
/// Reserved on n2 (of candidates n1, n2); the Reservation as created,
/// before its status.
async fn reserved_on_n2() -> (steward_testing_apiserver::ApiServer, Reservation) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use steward_api::ReservationStatus;

    let server = steward_testing_apiserver::ApiServer::start().await.unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(server.client());
    for crd in steward_api::crds() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    let api = Api::<Reservation>::namespaced(server.client(), "default");
    let spec = ReservationSpec {
        pod: PodRef {
            namespace: "default".into(),
            name: "p".into(),
            uid: "u1".into(),
        },
        slots: BTreeMap::from([("cam".into(), 1)]),
        exclusive_cpus: 0,
        candidates: vec!["n1".into(), "n2".into()],
        cancel: None,
    };
    let created = api
        .create(&PostParams::default(), &Reservation::new("p", spec))
        .await
        .unwrap();
    let mut decided = created.clone();
    decided.status = Some(ReservationStatus {
        phase: "Reserved".into(),
        node: Some("n2".into()),
        observed_generation: created.metadata.generation,
        ..ReservationStatus::default()
    });
    api.replace_status("p", &PostParams::default(), &decided)
        .await
        .unwrap();
    (server, created)
}

#[tokio::test]
async fn prioritize_reads_past_a_picture_that_lags() {
    let (server, created) = reserved_on_n2().await;
    let seen = Arc::new(Seen::empty());
    seen.apply(steward_kube::Change::Relisted(vec![created]));
    let ext = Extender::with_seen(server.client(), ExtenderConfig::default(), seen);
    let args: ExtenderArgs = serde_json::from_str(
        r#"{"Pod":{"metadata":{"name":"p","namespace":"default","uid":"u1"},"spec":{"containers":[{"name":"m","resources":{"limits":{"steward.dev/cam":"1"}}}]}},"Nodes":null,"NodeNames":["n1","n2"]}"#,
    )
    .unwrap();
    let scores = ext.prioritize(&args).await;
    assert_eq!(
        scores,
        vec![
            HostPriority {
                host: "n1".into(),
                score: 0
            },
            HostPriority {
                host: "n2".into(),
                score: MAX_EXTENDER_PRIORITY
            },
        ]
    );
}

#[tokio::test]
async fn a_first_filter_creates_without_reading_and_a_lagging_picture_costs_a_retry() {
    // Pod p was decided (Reserved on n2) by an earlier Filter; the picture
    // has not seen its Reservation yet.
    let (server, _) = reserved_on_n2().await;
    let seen = Arc::new(Seen::empty());
    seen.apply(steward_kube::Change::Relisted(Vec::new()));
    // No controller runs: an undecided pod waits out a short deadline, and
    // the wait reads nothing from the API.
    let cfg = ExtenderConfig {
        decision_timeout: Duration::from_millis(200),
        poll: Duration::from_secs(60),
        shared_watch: true,
        leader: None,
        decide_token: None,
        decide_trust: None,
    };
    let ext = Extender::with_seen(server.client(), cfg, seen);
    let args = |name: &str, uid: &str| -> ExtenderArgs {
        serde_json::from_str(&format!(
            r#"{{"Pod":{{"metadata":{{"name":"{name}","namespace":"default","uid":"{uid}"}},"spec":{{"containers":[{{"name":"m","resources":{{"limits":{{"steward.dev/cam":"1"}}}}}}]}}}},"Nodes":null,"NodeNames":["n1","n2"]}}"#
        ))
        .unwrap()
    };
    // The picture says p has none: created at once, refused (409), read,
    // and answered from what the API holds.
    server.reset_stats();
    let r = ext.filter(&args("p", "u1")).await;
    assert_eq!(r.node_names, Some(vec!["n2".to_owned()]), "{r:?}");
    let st = server.stats();
    assert_eq!(st.requests_for("create"), 1, "{:?}", st.requests);
    assert_eq!(st.requests_for("get"), 1, "{:?}", st.requests);
    // A pod filtered for the first time: one create, no read.
    server.reset_stats();
    let r = ext.filter(&args("q", "u2")).await;
    assert_eq!(r.node_names, Some(Vec::new()), "nothing decided q: {r:?}");
    let st = server.stats();
    assert_eq!(st.requests_for("create"), 1, "{:?}", st.requests);
    assert_eq!(st.requests_for("get"), 0, "{:?}", st.requests);
    assert_eq!(st.writes_for("reservations.steward.dev"), 1);
}

#[test]
fn a_rejection_is_split_per_node() {
    let r = per_node_reasons(
        "no candidate node can hold the pod: n1: cam: 0 of 2 slots free, 1 wanted; n2: cam is not seen by n2",
    );
    assert_eq!(r.get("n1"), Some(&"cam: 0 of 2 slots free, 1 wanted"));
    assert_eq!(r.get("n2"), Some(&"cam is not seen by n2"));
}
