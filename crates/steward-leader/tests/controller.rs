//! The reservation controller against the API server stand-in: a shared
//! Instance counted once, every way a reservation is released, consumption
//! by the pod's claims, and a second replica that takes over from exactly
//! what the first persisted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::json;
use steward_api::{
    Instance, InstanceSpec, PodRef, Reservation, ReservationSpec, SlotClaim, SlotClaimSpec,
};
use steward_leader::{ControllerConfig, run};
use steward_testing_apiserver::ApiServer;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const NS: &str = "default";
const WAIT: Duration = Duration::from_secs(20);

struct Controller {
    stop: CancellationToken,
    task: JoinHandle<()>,
    metrics: steward_leader::ControllerMetrics,
}

impl Controller {
    fn start(api: &ApiServer, identity: &str, ttl: Duration) -> Self {
        let mut cfg = ControllerConfig::new("steward-system", identity);
        cfg.ttl = ttl;
        cfg.resync = Duration::from_millis(100);
        cfg.lease.lease_duration = Duration::from_secs(2);
        cfg.lease.renew_deadline = Duration::from_millis(1500);
        cfg.lease.retry_period = Duration::from_millis(100);
        // Every test also checks the kept ledger against a rebuild.
        cfg.audit = Duration::from_millis(100);
        let metrics = cfg.metrics.clone();
        let stop = CancellationToken::new();
        let client = api.client();
        let s = stop.clone();
        let task = tokio::spawn(async move {
            run(client, cfg, s).await.unwrap();
        });
        Self {
            stop,
            task,
            metrics,
        }
    }

    async fn stop(mut self) {
        self.stop.cancel();
        (&mut self.task).await.unwrap();
        assert_eq!(
            self.metrics.audit_differences.get(),
            0,
            "an audit found the kept ledger deciding otherwise than a rebuild"
        );
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn setup() -> ApiServer {
    let api = ApiServer::start().await.unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(api.client());
    for crd in steward_api::crds() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    for ns in ["steward-system", "other"] {
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
        Api::<Namespace>::all(api.client())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
    }
    for n in ["n1", "n2", "n3"] {
        node(&api, n).await;
    }
    api
}

async fn node(api: &ApiServer, name: &str) {
    let n: Node = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    Api::<Node>::all(api.client())
        .create(&PostParams::default(), &n)
        .await
        .unwrap();
}

async fn instance(api: &ApiServer, name: &str, capacity: u32, nodes: &[&str]) {
    let spec = InstanceSpec {
        configuration_name: "cams".into(),
        device_id: name.into(),
        shared: nodes.len() > 1,
        nodes: nodes.iter().map(|n| n.to_string()).collect(),
        capacity,
        properties: BTreeMap::new(),
        mounts: Vec::new(),
        device_specs: Vec::new(),
        cdi_name: String::new(),
    };
    Api::<Instance>::namespaced(api.client(), NS)
        .create(&PostParams::default(), &Instance::new(name, spec))
        .await
        .unwrap();
}

/// A pending pod and its Reservation (as the extender's Filter makes it).
async fn pod_with_reservation(
    api: &ApiServer,
    name: &str,
    slots: &[(&str, u32)],
    nodes: &[&str],
) -> String {
    pod_with_cpu_reservation(api, name, slots, 0, nodes).await
}

/// [`pod_with_reservation`] asking for `cpus` exclusive CPUs as well.
async fn pod_with_cpu_reservation(
    api: &ApiServer,
    name: &str,
    slots: &[(&str, u32)],
    cpus: u32,
    nodes: &[&str],
) -> String {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }))
    .unwrap();
    let pod = Api::<Pod>::namespaced(api.client(), NS)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    let uid = pod.metadata.uid.clone().unwrap();
    let spec = ReservationSpec {
        pod: PodRef {
            namespace: NS.into(),
            name: name.into(),
            uid: uid.clone(),
        },
        slots: slots.iter().map(|(i, n)| (i.to_string(), *n)).collect(),
        exclusive_cpus: cpus,
        candidates: nodes.iter().map(|n| n.to_string()).collect(),
        cancel: None,
    };
    Api::<Reservation>::namespaced(api.client(), NS)
        .create(&PostParams::default(), &Reservation::new(name, spec))
        .await
        .unwrap();
    uid
}

async fn phase_of(api: &ApiServer, name: &str, want: &str) -> Reservation {
    let rs = Api::<Reservation>::namespaced(api.client(), NS);
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let r = rs.get(name).await.unwrap();
        if r.status.as_ref().is_some_and(|s| s.phase == want) {
            return r;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name} never became {want}: {:?}",
            r.status
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn events_for(api: &ApiServer, name: &str) -> Vec<Event> {
    Api::<Event>::namespaced(api.client(), NS)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .collect()
}

/// Pod `name` (uid `uid`) holds slot 0 of "cam" on n1, as its node's
/// agent records it.
async fn claim_slot_0(api: &ApiServer, name: &str, uid: &str) {
    let claim = SlotClaim::new(
        "cam-0",
        SlotClaimSpec {
            instance: "cam".into(),
            slot: 0,
            node: "n1".into(),
            epoch: 1,
            pod: Some(PodRef {
                namespace: NS.into(),
                name: name.into(),
                uid: uid.into(),
            }),
            container: Some("main".into()),
            since: 1,
            awaiting: None,
            reservation: None,
            resource_claim: None,
        },
    );
    Api::<SlotClaim>::namespaced(api.client(), NS)
        .create(&PostParams::default(), &claim)
        .await
        .unwrap();
}

/// The status of Reservation `name` once the controller marked it
/// consumed.
async fn until_consumed(api: &ApiServer, name: &str) -> steward_api::ReservationStatus {
    let rs = Api::<Reservation>::namespaced(api.client(), NS);
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let s = rs.get(name).await.unwrap().status.unwrap();
        if s.reason
            .as_deref()
            .is_some_and(|r| r.starts_with("consumed"))
        {
            return s;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name} never consumed: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_shared_instance_is_reserved_once_cluster_wide() {
    let api = setup().await;
    instance(&api, "cam", 2, &["n1", "n2", "n3"]).await;
    let c = Controller::start(&api, "c1", Duration::from_secs(60));
    pod_with_reservation(&api, "p1", &[("cam", 1)], &["n1"]).await;
    pod_with_reservation(&api, "p2", &[("cam", 1)], &["n2"]).await;
    let r1 = phase_of(&api, "p1", "Reserved").await;
    let r2 = phase_of(&api, "p2", "Reserved").await;
    pod_with_reservation(&api, "p3", &[("cam", 1)], &["n3"]).await;
    let r3 = phase_of(&api, "p3", "Rejected").await;
    let s1 = r1.status.unwrap();
    let s2 = r2.status.unwrap();
    assert_eq!(s1.node.as_deref(), Some("n1"));
    assert_eq!(s2.node.as_deref(), Some("n2"));
    assert_ne!(s1.slots, s2.slots, "one slot reserved twice");
    let reason = r3.status.unwrap().reason.unwrap();
    assert!(
        reason.contains("n3: cam: 0 of 2 slots free, 1 wanted"),
        "{reason}"
    );
    // Events on the Reservations say what was decided.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let e = events_for(&api, "p3").await;
        if e.iter().any(|e| {
            e.reason.as_deref() == Some("Rejected") && e.type_.as_deref() == Some("Warning")
        }) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no Rejected event: {e:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A reservation made says so in its status only (the Events go out in
    // the order decided: p1's and p2's would be in by now).
    for name in ["p1", "p2"] {
        let e = events_for(&api, name).await;
        assert!(e.is_empty(), "an Event on a Reserved {name}: {e:?}");
    }
    // The metrics say the same: this replica leads; two Reserved, one
    // Rejected, none waiting.
    let phase = |p: &str| {
        c.metrics
            .reservations
            .get_or_create(&steward_leader::metrics::PhaseLabels { phase: p.into() })
            .get()
    };
    let deadline = tokio::time::Instant::now() + WAIT;
    while (phase("Reserved"), phase("Rejected"), phase("Requested")) != (2, 1, 0) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "phases never counted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(c.metrics.leading.get(), 1);
    assert_eq!(c.metrics.oldest_requested_seconds.get(), 0);
    let metrics = c.metrics.clone();
    c.stop().await;
    assert_eq!(metrics.leading.get(), 0, "a stopped replica does not lead");
    assert!(metrics.audits.get() > 0, "the leader audited its ledger");
    assert_eq!(metrics.ledger_rebuilds.get(), 1, "built once, then kept");
}

#[tokio::test]
async fn every_way_out_releases_and_nothing_is_stuck() {
    let api = setup().await;
    instance(&api, "cam", 5, &["n1", "n2"]).await;
    let c = Controller::start(&api, "c1", Duration::from_millis(1500));
    for p in ["gone", "unreserved", "diverted", "expired", "orphaned"] {
        let nodes: &[&str] = if p == "orphaned" { &["n2"] } else { &["n1"] };
        pod_with_reservation(&api, p, &[("cam", 1)], nodes).await;
        phase_of(&api, p, "Reserved").await;
    }
    let pods = Api::<Pod>::namespaced(api.client(), NS);
    let rs = Api::<Reservation>::namespaced(api.client(), NS);
    // The pod is deleted.
    pods.delete("gone", &DeleteParams::default()).await.unwrap();
    // The scheduler unreserves (the extender sets spec.cancel).
    let mut r = rs.get("unreserved").await.unwrap();
    r.spec.cancel = Some("binding failed".into());
    rs.replace("unreserved", &PostParams::default(), &r)
        .await
        .unwrap();
    // The pod is bound to another node than the reserved one.
    let binding = json!({
        "apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": "diverted"},
        "target": {"kind": "Node", "name": "n2"},
    });
    let _: serde_json::Value = pods
        .create_subresource("binding", "diverted", &PostParams::default(), &binding)
        .await
        .unwrap();
    // The reserved node is deleted.
    Api::<Node>::all(api.client())
        .delete("n2", &DeleteParams::default())
        .await
        .unwrap();
    for (name, why) in [
        ("unreserved", "unreserved: binding failed"),
        ("diverted", "bound to n2, not the reserved node"),
        ("orphaned", "n2"),
        // "expired" is never consumed: the TTL releases it.
        ("expired", "not consumed within 1500 ms"),
    ] {
        let r = phase_of(&api, name, "Canceled").await;
        let reason = r.status.unwrap().reason.unwrap();
        assert!(reason.contains(why), "{name}: {reason}");
        assert!(
            events_for(&api, name)
                .await
                .iter()
                .any(|e| e.reason.as_deref() == Some("Canceled"))
                || {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    events_for(&api, name)
                        .await
                        .iter()
                        .any(|e| e.reason.as_deref() == Some("Canceled"))
                },
            "{name}: no Canceled event"
        );
    }
    // The deleted pod's reservation is released (its object would be
    // garbage-collected with the pod in a real cluster).
    let r = phase_of(&api, "gone", "Canceled").await;
    assert!(
        r.status
            .unwrap()
            .reason
            .unwrap()
            .contains("the pod is gone")
    );
    c.stop().await;
}

#[tokio::test]
async fn the_pods_own_claim_consumes_its_reservation_and_a_claim_wins_over_others() {
    let api = setup().await;
    instance(&api, "cam", 1, &["n1", "n2"]).await;
    let c = Controller::start(&api, "c1", Duration::from_millis(1500));
    let uid = pod_with_reservation(&api, "p1", &[("cam", 1)], &["n1"]).await;
    let r = phase_of(&api, "p1", "Reserved").await;
    assert_eq!(r.status.unwrap().slots, ["cam-0"]);
    // The pod runs on n1 and its claim holds the slot.
    claim_slot_0(&api, "p1", &uid).await;
    let s = until_consumed(&api, "p1").await;
    assert_eq!(s.phase, "Reserved");
    let rs = Api::<Reservation>::namespaced(api.client(), NS);
    // Consumed, it is not expired by the TTL...
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert_eq!(
        rs.get("p1").await.unwrap().status.unwrap().phase,
        "Reserved"
    );
    // ...and the slot stays taken for everyone else.
    pod_with_reservation(&api, "p2", &[("cam", 1)], &["n2"]).await;
    phase_of(&api, "p2", "Rejected").await;
    c.stop().await;
}

#[tokio::test]
async fn a_second_replica_decides_only_when_leading_and_keeps_what_was_decided() {
    let api = setup().await;
    instance(&api, "cam", 2, &["n1", "n2", "n3"]).await;
    let first = Controller::start(&api, "c1", Duration::from_secs(60));
    pod_with_reservation(&api, "p1", &[("cam", 1)], &["n1"]).await;
    let before = phase_of(&api, "p1", "Reserved").await.status.unwrap();
    let second = Controller::start(&api, "c2", Duration::from_secs(60));
    // The first dies without releasing the Lease (kill -9).
    first.task.abort();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let lease = Api::<Lease>::namespaced(api.client(), "steward-system")
        .get("steward-controller")
        .await
        .unwrap()
        .spec
        .unwrap();
    assert_eq!(lease.holder_identity.as_deref(), Some("c1"));
    let last_renewal = u64::try_from(lease.renew_time.unwrap().0.as_millisecond()).unwrap();
    pod_with_reservation(&api, "p2", &[("cam", 1)], &["n2"]).await;
    let after = phase_of(&api, "p2", "Reserved").await.status.unwrap();
    // Nobody decided while the dead leader's Lease could still be valid.
    let decided = after.decided_at.unwrap();
    assert!(
        decided >= last_renewal + 1990,
        "decided {} ms after the dead leader's last renewal",
        decided.saturating_sub(last_renewal)
    );
    assert_ne!(
        before.slots, after.slots,
        "the successor reused a reserved slot"
    );
    let kept = phase_of(&api, "p1", "Reserved").await.status.unwrap();
    assert_eq!(
        kept, before,
        "the successor changed a decision it inherited"
    );
    second.stop().await;
    drop(first);
}

/// What a node's CRI resource manager publishes: free exclusive CPUs per
/// NUMA node and the pods holding some.
async fn publish_cpus(api: &ApiServer, node: &str, free: &[(u32, u32)], holders: &[&str]) {
    let doc = steward_core::reservation::NodeCpus {
        free: free.iter().copied().collect(),
        holders: holders.iter().map(|h| h.to_string()).collect(),
    };
    let patch = json!({"metadata": {"annotations": {
        steward_core::reservation::NODE_CPUS_ANNOTATION: serde_json::to_string(&doc).unwrap(),
    }}});
    Api::<Node>::all(api.client())
        .patch(
            node,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn exclusive_cpus_are_reserved_on_one_numa_node_until_the_node_names_the_pod() {
    let api = setup().await;
    instance(&api, "cam", 1, &["n1", "n2"]).await;
    // n1: NUMA 0 has 2 CPUs free, NUMA 1 has 4; n2 runs no resource manager.
    publish_cpus(&api, "n1", &[(0, 2), (1, 4)], &[]).await;
    let c = Controller::start(&api, "c1", Duration::from_secs(60));
    // 3 CPUs and the camera: n2 cannot pin CPUs, n1 holds them on NUMA 1.
    let big = pod_with_cpu_reservation(&api, "big", &[("cam", 1)], 3, &["n2", "n1"]).await;
    let s = phase_of(&api, "big", "Reserved").await.status.unwrap();
    assert_eq!(
        (s.node.as_deref(), s.numa_node, s.cpus),
        (Some("n1"), Some(1), 3)
    );
    let reserved = s.conditions.iter().find(|c| c.type_ == "Reserved").unwrap();
    assert_eq!(
        (reserved.status.as_str(), reserved.reason.as_str()),
        ("True", "Reserved")
    );
    // 3 more fit no NUMA node of n1 now (2 and 1 left), although n1 has 3 free.
    pod_with_cpu_reservation(&api, "more", &[], 3, &["n2", "n1"]).await;
    let reason = phase_of(&api, "more", "Rejected")
        .await
        .status
        .unwrap()
        .reason
        .unwrap();
    assert!(
        reason.contains("n2: no CRI resource manager publishes exclusive CPUs on n2")
            && reason
                .contains("n1: 3 exclusive CPUs wanted on one NUMA node, at most 2 free on any"),
        "{reason}"
    );
    // 2 fit NUMA 0.
    pod_with_cpu_reservation(&api, "small", &[], 2, &["n1"]).await;
    let s = phase_of(&api, "small", "Reserved").await.status.unwrap();
    assert_eq!(s.numa_node, Some(0));
    // "big" runs: its claim holds the camera, and the node pins its CPUs
    // and names it. Consumed only when both hold.
    claim_slot_0(&api, "big", &big).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let s = Api::<Reservation>::namespaced(api.client(), NS)
        .get("big")
        .await
        .unwrap()
        .status
        .unwrap();
    assert!(
        s.reason
            .as_deref()
            .is_none_or(|r| !r.starts_with("consumed")),
        "consumed before the node pinned its CPUs: {s:?}"
    );
    publish_cpus(&api, "n1", &[(0, 2), (1, 1)], &[&big]).await;
    let s = until_consumed(&api, "big").await;
    let cond = s.conditions.iter().find(|c| c.type_ == "Reserved").unwrap();
    assert_eq!(
        (cond.status.as_str(), cond.reason.as_str()),
        ("False", "Consumed")
    );
    // "small" fails admission on n1 (kubelet ends it Failed with the
    // reason): released, with the reason and an Event.
    let pods = Api::<Pod>::namespaced(api.client(), NS);
    let failed = json!({"status": {
        "phase": "Failed",
        "reason": "UnexpectedAdmissionError",
        "message": "Allocate failed due to no exclusive CPUs",
    }});
    pods.patch_status(
        "small",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&failed),
    )
    .await
    .unwrap();
    let r = phase_of(&api, "small", "Canceled").await;
    let reason = r.status.unwrap().reason.unwrap();
    assert!(
        reason.contains("allocation failed on its node: UnexpectedAdmissionError"),
        "{reason}"
    );
    let deadline = tokio::time::Instant::now() + WAIT;
    while !events_for(&api, "small").await.iter().any(|e| {
        e.reason.as_deref() == Some("Canceled")
            && e.note
                .as_deref()
                .is_some_and(|n| n.contains("UnexpectedAdmissionError"))
    }) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no Canceled event naming the failure"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    c.stop().await;
}
