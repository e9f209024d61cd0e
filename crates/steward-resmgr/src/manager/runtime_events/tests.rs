//! The NRI event path against orderings containerd produces: pods whose
//! removal a Synchronize does not see, or that containerd never announces.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use steward_proto::cri::runtime::v1 as cri;

use super::super::ResourceManager;
use super::super::resync::{GivenStatus, RuntimeListing};
use super::super::testing::{manager, pod, shared};

/// What a Synchronize lists: `pods`, each with its running containers.
fn listing(pods: &[(&str, &[&str])]) -> RuntimeListing {
    let mut given = GivenStatus::default();
    let mut l = RuntimeListing::default();
    for (p, containers) in pods {
        given.pod_cgroup_parents.insert((*p).into(), String::new());
        l.pods.push(cri::PodSandbox {
            id: (*p).into(),
            metadata: Some(cri::PodSandboxMetadata {
                name: format!("name-{p}"),
                uid: format!("uid-{p}"),
                namespace: "default".into(),
                attempt: 0,
            }),
            state: cri::PodSandboxState::SandboxReady as i32,
            ..Default::default()
        });
        for c in *containers {
            given.containers.insert((*c).into(), (Some(shared()), None));
            l.containers.push(cri::Container {
                id: (*c).into(),
                pod_sandbox_id: (*p).into(),
                metadata: Some(cri::ContainerMetadata {
                    name: format!("name-{c}"),
                    attempt: 0,
                }),
                state: cri::ContainerState::ContainerRunning as i32,
                ..Default::default()
            });
        }
    }
    l.given = Some(given);
    l
}

async fn cached(m: &ResourceManager) -> (Vec<String>, Vec<String>) {
    let st = m.state.lock().await;
    (
        st.cache.data().pods.keys().cloned().collect(),
        st.cache.data().containers.keys().cloned().collect(),
    )
}

async fn create(m: &ResourceManager, pod_id: &str, id: &str) {
    m.pod_created(pod(pod_id)).await.unwrap();
    m.container_creating(pod(pod_id), id, format!("name-{id}"), shared())
        .await
        .unwrap();
    m.container_started(id, None).await;
}

/// The snapshot is taken with the pod, the pod's removal handled, then
/// the snapshot applied: the pod stays gone.
#[tokio::test]
async fn a_pod_removed_after_the_snapshot_is_not_brought_back_by_synchronize() {
    let f = manager().await;
    let m = &f.manager;
    create(m, "p1", "c1").await;
    create(m, "p2", "c2").await;
    let snapshot = listing(&[("p1", &["c1"]), ("p2", &["c2"])]);

    m.container_stopped("c1").await;
    m.container_removed("c1", Some("p1")).await;
    m.pod_removed("p1").await;
    let s = m.synchronize(snapshot).await.unwrap();

    assert_eq!(
        cached(m).await,
        (vec!["p2".to_owned()], vec!["c2".to_owned()])
    );
    assert!(s.report.pods_adopted.is_empty(), "{:?}", s.report);
    assert!(s.report.containers_adopted.is_empty(), "{:?}", s.report);
    // The next Synchronize (the pod gone from the runtime too) agrees.
    let s = m.synchronize(listing(&[("p2", &["c2"])])).await.unwrap();
    assert!(s.report.pods_vanished.is_empty(), "{:?}", s.report);
    assert!(s.report.pods_adopted.is_empty(), "{:?}", s.report);
    assert_eq!(
        cached(m).await,
        (vec!["p2".to_owned()], vec!["c2".to_owned()])
    );
}

/// containerd announces neither StopPodSandbox nor RemovePodSandbox for a
/// pod that predates its restart, only its containers' events: the pod is
/// forgotten with its last container, and comes back with a new one.
#[tokio::test]
async fn a_pod_whose_removal_is_never_announced_goes_with_its_last_container() {
    let f = manager().await;
    let m = &f.manager;
    // After a containerd restart: the pods come from its Synchronize.
    let s = m
        .synchronize(listing(&[("p1", &["c1", "c2"]), ("p2", &["c3"])]))
        .await
        .unwrap();
    assert_eq!(s.report.pods_adopted, vec!["p1", "p2"]);
    assert_eq!(s.report.containers_adopted, vec!["c1", "c2", "c3"]);

    m.container_stopped("c1").await;
    m.container_removed("c1", Some("p1")).await;
    assert_eq!(cached(m).await.0, vec!["p1", "p2"], "p1 still has c2");
    m.container_stopped("c2").await;
    // The event's pod, or the cached record's when the event has none.
    m.container_removed("c2", None).await;
    assert_eq!(
        cached(m).await,
        (vec!["p2".to_owned()], vec!["c3".to_owned()])
    );

    // Not removed after all: its next container brings it back.
    m.container_creating(pod("p2"), "c4", "name-c4".into(), shared())
        .await
        .unwrap();
    m.container_removed("c3", Some("p2")).await;
    assert_eq!(
        cached(m).await,
        (vec!["p2".to_owned()], vec!["c4".to_owned()])
    );
}

/// A pod without containers is adopted only if the cache knows it (from
/// RunPodSandbox): an unknown one may be on its way out with no event to
/// come, and a live one comes in with its first CreateContainer.
#[tokio::test]
async fn synchronize_does_not_adopt_unknown_pods_without_containers() {
    let f = manager().await;
    let m = &f.manager;
    m.pod_created(pod("p1")).await.unwrap();
    let s = m
        .synchronize(listing(&[("p1", &[]), ("p2", &[]), ("p3", &["c3"])]))
        .await
        .unwrap();
    assert_eq!(s.report.pods_adopted, vec!["p3"]);
    assert!(s.report.pods_vanished.is_empty(), "{:?}", s.report);
    assert_eq!(cached(m).await.0, vec!["p1", "p3"]);
    m.container_creating(pod("p2"), "c2", "name-c2".into(), shared())
        .await
        .unwrap();
    assert_eq!(cached(m).await.0, vec!["p1", "p2", "p3"]);
}

/// A container the policy refuses is counted as
/// `steward_resmgr_events_total{kind="container-refused"}` (the alert
/// StewardResourceManagerRefusingContainers watches it); one it places is not.
#[tokio::test]
async fn a_refused_container_is_counted() {
    let f = manager().await;
    let m = &f.manager;
    create(m, "p1", "c1").await;
    assert_eq!(m.metrics().event_count("container-refused"), 0);
    let mut bad = pod("p2");
    bad.annotations.insert(
        crate::requests::QOS_ANNOTATION.into(),
        "no-such-class".into(),
    );
    let refused = m
        .container_creating(bad, "c2", "name-c2".into(), shared())
        .await;
    assert!(refused.is_err(), "{refused:?}");
    assert_eq!(m.metrics().event_count("container-refused"), 1);
}

/// The attack on the annotations: a BestEffort pod (nothing in its spec
/// for the scheduler or ResourceQuota to count) annotates itself
/// Guaranteed with 2 CPUs. It runs in the shared pool with no exclusive
/// CPU, and a Warning Event on the Pod says why. A Guaranteed pod's
/// annotation that narrows (1 of its 2 CPUs) is still followed.
#[tokio::test]
async fn an_annotation_grants_nothing_the_pod_spec_does_not_ask() {
    use k8s_openapi::api::events::v1::Event;
    use kube::Api;
    use kube::api::ListParams;

    // The stand-in has the namespace "default" already.
    let api = steward_testing_apiserver::ApiServer::start().await.unwrap();
    let f = manager().await;
    let m = &f.manager;
    let (sink, _task) = steward_kube::EventSink::start(api.client(), "steward-resmgr", "n1");
    m.emit_events(sink);

    let mut attacker = pod("p1");
    attacker.cgroup_parent = "/kubepods/besteffort/poduid-p1".into();
    attacker.annotations.extend([
        (
            crate::requests::QOS_ANNOTATION.to_owned(),
            "Guaranteed".to_owned(),
        ),
        (
            format!("{}c1", crate::requests::RESOURCES_PREFIX),
            r#"{"requests":{"cpu":"2","memory":"32Mi"},"limits":{"cpu":"2","memory":"32Mi"}}"#
                .to_owned(),
        ),
    ]);
    let best_effort = cri::LinuxContainerResources {
        cpu_shares: 2,
        ..Default::default()
    };
    m.pod_created(attacker.clone()).await.unwrap();
    let (resources, _) = m
        .container_creating(attacker, "c1", "c1".into(), best_effort)
        .await
        .unwrap();
    let key = steward_core::cpu::ContainerKey {
        pod_uid: "uid-p1".into(),
        container: "c1".into(),
    };
    let exclusive_of = |a: Option<&steward_core::cpu::Assignment>| {
        a.filter(|a| a.exclusive).map_or(0, |a| a.cpus.len())
    };
    {
        let st = m.state.lock().await;
        let a = st.policy.assignments().get(&key).cloned();
        assert_eq!(exclusive_of(a.as_ref()), 0, "{a:?}");
        let a = a.unwrap();
        assert_eq!(a.cpus.len(), 4, "the whole shared pool: {a:?}");
        assert_eq!(st.cache.data().containers["c1"].request.qos, "BestEffort");
    }
    assert_eq!(
        steward_core::cpu::CpuSet::parse(&resources.cpuset_cpus)
            .unwrap()
            .len(),
        4,
        "{resources:?}"
    );

    // A Guaranteed pod of 2 CPUs that asks for 1 exclusive CPU gets 1.
    let mut narrow = pod("p2");
    narrow.cgroup_parent = "/kubepods/poduid-p2".into();
    narrow.annotations.insert(
        format!("{}c2", crate::requests::RESOURCES_PREFIX),
        r#"{"requests":{"cpu":"1"}}"#.to_owned(),
    );
    let guaranteed = cri::LinuxContainerResources {
        cpu_shares: 2048,
        cpu_quota: 200_000,
        cpu_period: 100_000,
        memory_limit_in_bytes: 64 << 20,
        ..Default::default()
    };
    m.pod_created(narrow.clone()).await.unwrap();
    m.container_creating(narrow, "c2", "c2".into(), guaranteed)
        .await
        .unwrap();
    {
        let st = m.state.lock().await;
        let key = steward_core::cpu::ContainerKey {
            pod_uid: "uid-p2".into(),
            container: "c2".into(),
        };
        let a = st.policy.assignments().get(&key).cloned();
        assert_eq!(exclusive_of(a.as_ref()), 1, "{a:?}");
    }

    // The attacker's Pod is told, the narrowing one is not.
    let events: Api<Event> = Api::namespaced(api.client(), "default");
    let mut found = Vec::new();
    for _ in 0..100 {
        found = events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(super::super::ANNOTATION_ABOVE_SPEC_REASON))
            .collect();
        if !found.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(found.len(), 1, "{found:?}");
    let e = &found[0];
    assert_eq!(
        e.regarding.as_ref().and_then(|r| r.name.as_deref()),
        Some("name-p1")
    );
    let note = e.note.as_deref().unwrap_or_default();
    assert!(
        note.contains("asks Guaranteed, above the pod's QoS class BestEffort")
            && note.contains("cpu request of 2000m, above the 0m"),
        "{note}"
    );
}
