//! Cluster slot claims (`SlotClaim` objects) through the real kube client
//! against the API server stand-in.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "../benches/support/instance_status.rs"]
mod instance_status;
use instance_status::InstanceStatusClaimStore;

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Container, Namespace, Pod, PodSpec};
use kube::Api;
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use steward_agent::claims::{
    ClaimError, ClaimEvent, ClaimStore, ClaimWrite, InstanceDirectory, InstanceRef, KubeClaimStore,
    watch_claims,
};
use steward_api::{Instance, InstanceSpec, SlotClaim};
use steward_core::Millis;
use steward_core::ledger::{Holder, Holding, PodRef};
use steward_core::slots::Claim;
use steward_testing_apiserver::ApiServer;

use common::{NS, api_server, eventually};

const WAIT: Duration = Duration::from_secs(5);

async fn create_instance(server: &ApiServer, ns: &str, name: &str, capacity: u32) -> Instance {
    let inst = Instance {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            ..ObjectMeta::default()
        },
        spec: InstanceSpec {
            configuration_name: "cfg".into(),
            device_id: format!("dev-{name}"),
            shared: true,
            nodes: vec!["node-a".into(), "node-b".into()],
            capacity,
            properties: Default::default(),
            mounts: Vec::new(),
            device_specs: Vec::new(),
            cdi_name: format!("steward.dev/cfg={name}"),
        },
        status: None,
    };
    Api::<Instance>::namespaced(server.client(), ns)
        .create(&PostParams::default(), &inst)
        .await
        .unwrap()
}

async fn create_namespace(server: &ApiServer, name: &str) {
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    Api::<Namespace>::all(server.client())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
}

async fn create_pod(server: &ApiServer, ns: &str, name: &str) -> PodRef {
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "main".into(),
                image: Some("busybox".into()),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        ..Pod::default()
    };
    let pod = Api::<Pod>::namespaced(server.client(), ns)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    PodRef::new(pod.metadata.uid.unwrap(), ns, name)
}

fn pending(node: &str, slot: &str, epoch: u64) -> Claim {
    Claim {
        node: node.into(),
        epoch,
        holding: Holding::pending(slot, Millis(1_000 + epoch)),
        awaiting: Some(Millis(1_000 + epoch)),
    }
}

fn held(node: &str, slot: &str, epoch: u64, pod: PodRef) -> Claim {
    Claim {
        node: node.into(),
        epoch,
        holding: Holding::held(slot, Holder::new(pod, Some("main".into())), Millis(2_000)),
        awaiting: None,
    }
}

fn store(server: &ApiServer) -> KubeClaimStore {
    KubeClaimStore::new(server.client(), InstanceDirectory::new())
}

async fn get_claim(server: &ApiServer, ns: &str, name: &str) -> Option<SlotClaim> {
    Api::<SlotClaim>::namespaced(server.client(), ns)
        .get_opt(name)
        .await
        .unwrap()
}

fn owner_kinds(c: &SlotClaim) -> Vec<(String, String)> {
    c.metadata
        .owner_references
        .iter()
        .flatten()
        .map(|o| (o.kind.clone(), o.name.clone()))
        .collect()
}

#[tokio::test]
async fn create_replace_own_and_never_overwrite_a_higher_epoch() {
    let server = api_server().await;
    let inst = create_instance(&server, NS, "cam", 2).await;
    let a = store(&server);

    assert_eq!(
        a.write(&pending("node-a", "cam-0", 1)).await.unwrap(),
        ClaimWrite::Written
    );
    let obj = get_claim(&server, NS, "cam-0").await.unwrap();
    assert_eq!(obj.spec.node, "node-a");
    assert_eq!(obj.spec.epoch, 1);
    assert_eq!(obj.spec.awaiting, Some(1_001));
    assert_eq!(owner_kinds(&obj), [("Instance".into(), "cam".into())]);
    assert_eq!(
        obj.metadata.owner_references.as_ref().unwrap()[0].uid,
        inst.metadata.uid.clone().unwrap()
    );

    // Replace own record (bind to a pod), a single replace request.
    let pod = create_pod(&server, NS, "web-0").await;
    let before = a.stats();
    let bound = held("node-a", "cam-0", 3, pod.clone());
    assert_eq!(a.write(&bound).await.unwrap(), ClaimWrite::Written);
    let after = a.stats();
    assert_eq!(after.writes() - before.writes(), 1);
    assert_eq!(after.reads, before.reads);
    let obj = get_claim(&server, NS, "cam-0").await.unwrap();
    assert_eq!(obj.spec.epoch, 3);
    assert_eq!(obj.to_claim().unwrap(), bound);

    // An older write never replaces the newer record, whether this store
    // remembers it or reads it (a second store: the agent restarted).
    assert_eq!(
        a.write(&pending("node-a", "cam-0", 2)).await.unwrap(),
        ClaimWrite::Written
    );
    let restarted = store(&server);
    assert_eq!(
        restarted
            .write(&pending("node-a", "cam-0", 2))
            .await
            .unwrap(),
        ClaimWrite::Written
    );
    let obj = get_claim(&server, NS, "cam-0").await.unwrap();
    assert_eq!(obj.to_claim().unwrap(), bound);

    // The restarted store replaces its node's record found by create → 409.
    let newer = pending("node-a", "cam-0", 4);
    assert_eq!(restarted.write(&newer).await.unwrap(), ClaimWrite::Written);
    // One create → 409 → read (the epoch-2 write), then one replace under
    // the resourceVersion it read.
    let st = restarted.stats();
    assert_eq!((st.creates, st.already_exists, st.replaces), (1, 1, 1));
    let obj = get_claim(&server, NS, "cam-0").await.unwrap();
    assert_eq!(obj.to_claim().unwrap(), newer);

    // `a` remembers a stale resourceVersion now: 409 Conflict → re-read → replace.
    let newest = held("node-a", "cam-0", 5, pod);
    assert_eq!(a.write(&newest).await.unwrap(), ClaimWrite::Written);
    assert_eq!(a.stats().conflicts, 1);
    assert_eq!(
        get_claim(&server, NS, "cam-0")
            .await
            .unwrap()
            .to_claim()
            .unwrap(),
        newest
    );

    let listed = a.list().await.unwrap();
    assert_eq!(listed, vec![newest]);
}

#[tokio::test]
async fn another_nodes_claim_is_never_written_or_deleted() {
    let server = api_server().await;
    create_instance(&server, NS, "cam", 2).await;
    let a = store(&server);
    let b = store(&server);

    let mine = pending("node-a", "cam-1", 7);
    assert_eq!(a.write(&mine).await.unwrap(), ClaimWrite::Written);
    assert_eq!(
        b.write(&pending("node-b", "cam-1", 100)).await.unwrap(),
        ClaimWrite::HeldByOtherNode {
            node: "node-a".into()
        }
    );
    b.delete("cam-1", "node-b", u64::MAX).await.unwrap();
    // Deleting under the wrong node name leaves the record alone too.
    a.delete("cam-1", "node-b", u64::MAX).await.unwrap();
    assert_eq!(
        get_claim(&server, NS, "cam-1")
            .await
            .unwrap()
            .to_claim()
            .unwrap(),
        mine
    );
    // The other slot is free for node-b.
    assert_eq!(
        b.write(&pending("node-b", "cam-0", 1)).await.unwrap(),
        ClaimWrite::Written
    );
    let mut nodes: Vec<_> = a
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|c| (c.holding.resource, c.node))
        .collect();
    nodes.sort();
    assert_eq!(
        nodes,
        [
            ("cam-0".to_string(), "node-b".to_string()),
            ("cam-1".to_string(), "node-a".to_string())
        ]
    );
}

#[tokio::test]
async fn delete_only_removes_records_up_to_the_epoch() {
    let server = api_server().await;
    create_instance(&server, NS, "cam", 1).await;
    let a = store(&server);
    a.write(&pending("node-a", "cam-0", 5)).await.unwrap();

    // A late delete of an older claim leaves the newer record.
    a.delete("cam-0", "node-a", 4).await.unwrap();
    assert!(get_claim(&server, NS, "cam-0").await.is_some());
    // Same through a store that has to read the record.
    let restarted = store(&server);
    restarted.delete("cam-0", "node-a", 4).await.unwrap();
    assert!(get_claim(&server, NS, "cam-0").await.is_some());

    restarted.delete("cam-0", "node-a", 5).await.unwrap();
    assert!(get_claim(&server, NS, "cam-0").await.is_none());
    // Deleting what is gone is fine, from either store (a's memory is stale).
    restarted.delete("cam-0", "node-a", 5).await.unwrap();
    a.delete("cam-0", "node-a", 9).await.unwrap();
    assert!(a.list().await.unwrap().is_empty());

    // `a` remembered the deleted record; a new write must create again.
    assert_eq!(
        a.write(&pending("node-a", "cam-0", 10)).await.unwrap(),
        ClaimWrite::Written
    );
    assert_eq!(
        get_claim(&server, NS, "cam-0").await.unwrap().spec.epoch,
        10
    );
}

#[tokio::test]
async fn deleting_the_pod_garbage_collects_its_claim() {
    let server = api_server().await;
    create_instance(&server, NS, "cam", 2).await;
    let a = store(&server);
    let pod = create_pod(&server, NS, "web-0").await;

    // Awaiting: the holder may be stale, so the Instance stays the owner.
    let mut awaiting = held("node-a", "cam-0", 1, pod.clone());
    awaiting.awaiting = Some(Millis(5));
    a.write(&awaiting).await.unwrap();
    assert_eq!(
        owner_kinds(&get_claim(&server, NS, "cam-0").await.unwrap()),
        [("Instance".into(), "cam".into())]
    );
    // Settled: the pod owns the claim.
    a.write(&held("node-a", "cam-0", 2, pod.clone()))
        .await
        .unwrap();
    let obj = get_claim(&server, NS, "cam-0").await.unwrap();
    assert_eq!(owner_kinds(&obj), [("Pod".into(), "web-0".into())]);
    assert_eq!(obj.metadata.owner_references.unwrap()[0].uid, pod.uid);
    // A pending claim of the same Instance is not touched by the pod.
    a.write(&pending("node-a", "cam-1", 3)).await.unwrap();

    // No agent involved from here: the API server's GC frees the slot.
    Api::<Pod>::namespaced(server.client(), NS)
        .delete("web-0", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the pod's claim is collected", WAIT, || async {
        get_claim(&server, NS, "cam-0")
            .await
            .is_none()
            .then_some(())
    })
    .await;
    assert!(get_claim(&server, NS, "cam-1").await.is_some());
}

#[tokio::test]
async fn a_pod_in_another_namespace_does_not_own_the_claim() {
    let server = api_server().await;
    create_instance(&server, NS, "cam", 1).await;
    create_namespace(&server, "apps").await;
    let pod = create_pod(&server, "apps", "job-0").await;
    let a = store(&server);
    let claim = held("node-a", "cam-0", 1, pod);
    a.write(&claim).await.unwrap();
    let obj = get_claim(&server, NS, "cam-0").await.unwrap();
    // A cross-namespace ownerReference would count as absent and get the
    // claim collected at once: the Instance owns it instead.
    assert_eq!(owner_kinds(&obj), [("Instance".into(), "cam".into())]);
    assert_eq!(obj.to_claim().unwrap(), claim);

    Api::<Pod>::namespaced(server.client(), "apps")
        .delete("job-0", &DeleteParams::default())
        .await
        .unwrap();
    // Several GC passes (every 100 ms): still there, the agent reclaims it.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(get_claim(&server, NS, "cam-0").await.is_some());
    a.delete("cam-0", "node-a", 1).await.unwrap();
    assert!(get_claim(&server, NS, "cam-0").await.is_none());
}

#[tokio::test]
async fn deleting_the_instance_collects_its_claims() {
    let server = api_server().await;
    create_instance(&server, NS, "cam", 3).await;
    create_instance(&server, NS, "mic", 1).await;
    let a = store(&server);
    let b = store(&server);
    a.write(&pending("node-a", "cam-0", 1)).await.unwrap();
    b.write(&pending("node-b", "cam-2", 1)).await.unwrap();
    a.write(&pending("node-a", "mic-0", 2)).await.unwrap();

    Api::<Instance>::namespaced(server.client(), NS)
        .delete("cam", &DeleteParams::default())
        .await
        .unwrap();
    eventually("cam's claims are collected", WAIT, || async {
        let left: Vec<String> = a
            .list()
            .await
            .unwrap()
            .into_iter()
            .map(|c| c.holding.resource)
            .collect();
        (left == ["mic-0"]).then_some(())
    })
    .await;

    // A recreated Instance of the same name gets a new uid: the directory
    // must follow it (the agent feeds it from its Instance watch).
    let again = create_instance(&server, NS, "cam", 3).await;
    a.directory().insert(InstanceRef::of(&again).unwrap());
    a.write(&pending("node-a", "cam-0", 3)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let obj = get_claim(&server, NS, "cam-0").await.unwrap();
    assert_eq!(
        obj.metadata.owner_references.unwrap()[0].uid,
        again.metadata.uid.unwrap()
    );
}

#[tokio::test]
async fn unavailable_api_server_is_unreachable() {
    let server = api_server().await;
    create_instance(&server, NS, "cam", 1).await;
    let a = store(&server);
    a.write(&pending("node-a", "cam-0", 1)).await.unwrap();

    server.set_available(false);
    let write = a.write(&pending("node-a", "cam-0", 2)).await;
    assert!(
        matches!(write, Err(ClaimError::Unreachable(_))),
        "{write:?}"
    );
    let delete = a.delete("cam-0", "node-a", 2).await;
    assert!(
        matches!(delete, Err(ClaimError::Unreachable(_))),
        "{delete:?}"
    );
    let list = a.list().await;
    assert!(matches!(list, Err(ClaimError::Unreachable(_))), "{list:?}");
    // Unknown Instance while down: the lookup is unreachable too.
    let fresh = store(&server);
    let write = fresh.write(&pending("node-a", "cam-0", 3)).await;
    assert!(
        matches!(write, Err(ClaimError::Unreachable(_))),
        "{write:?}"
    );

    server.set_available(true);
    assert_eq!(
        a.write(&pending("node-a", "cam-0", 4)).await.unwrap(),
        ClaimWrite::Written
    );
    assert_eq!(get_claim(&server, NS, "cam-0").await.unwrap().spec.epoch, 4);

    // Shut down entirely: a transport error, still Unreachable.
    let client_store = store(&server);
    server.shutdown().await;
    let write = client_store.write(&pending("node-a", "cam-0", 5)).await;
    assert!(
        matches!(write, Err(ClaimError::Unreachable(_))),
        "{write:?}"
    );
}

#[tokio::test]
async fn unknown_and_ambiguous_instances_fail() {
    let server = api_server().await;
    let a = store(&server);
    // No such Instance (its device offline, or never there): the write
    // waits for it.
    let write = a.write(&pending("node-a", "nope-0", 1)).await;
    assert!(matches!(write, Err(ClaimError::NoInstance(_))), "{write:?}");
    let not_a_slot = a.write(&pending("node-a", "cam", 1)).await;
    assert!(
        matches!(not_a_slot, Err(ClaimError::Failed(_))),
        "{not_a_slot:?}"
    );

    // Found by name in another namespace: the claim goes next to it.
    create_namespace(&server, "lab").await;
    create_instance(&server, "lab", "scope", 1).await;
    a.write(&pending("node-a", "scope-0", 1)).await.unwrap();
    assert!(get_claim(&server, "lab", "scope-0").await.is_some());
    assert_eq!(a.directory().get("scope").unwrap().namespace, "lab");

    create_instance(&server, NS, "twin", 1).await;
    create_instance(&server, "lab", "twin", 1).await;
    let twin = a.write(&pending("node-a", "twin-0", 1)).await;
    assert!(
        matches!(&twin, Err(ClaimError::Failed(m)) if m.contains("ambiguous")),
        "{twin:?}"
    );
}

#[tokio::test]
async fn two_nodes_racing_for_a_slot_exactly_one_wins() {
    let server = api_server().await;
    create_instance(&server, NS, "cam", 16).await;
    let a = store(&server);
    let b = store(&server);
    for n in 0..16 {
        let slot = format!("cam-{n}");
        let (ca, cb) = (pending("node-a", &slot, 1), pending("node-b", &slot, 1));
        let (ra, rb) = tokio::join!(a.write(&ca), b.write(&cb));
        let (ra, rb) = (ra.unwrap(), rb.unwrap());
        let winner = match (&ra, &rb) {
            (ClaimWrite::Written, ClaimWrite::HeldByOtherNode { node }) => {
                assert_eq!(node, "node-a");
                "node-a"
            }
            (ClaimWrite::HeldByOtherNode { node }, ClaimWrite::Written) => {
                assert_eq!(node, "node-b");
                "node-b"
            }
            other => panic!("slot {slot}: expected exactly one Written, got {other:?}"),
        };
        assert_eq!(
            get_claim(&server, NS, &slot).await.unwrap().spec.node,
            winner
        );
    }
    assert_eq!(a.list().await.unwrap().len(), 16);
    assert_eq!(
        a.stats().already_exists + b.stats().already_exists,
        16,
        "every race was decided by one 409 AlreadyExists"
    );
}

async fn next(events: &mut (impl futures::Stream<Item = ClaimEvent> + Unpin)) -> ClaimEvent {
    tokio::time::timeout(WAIT, events.next())
        .await
        .expect("watch event in time")
        .expect("stream goes on")
}

#[tokio::test]
async fn watch_reports_other_nodes_claims_and_their_deletion() {
    let server = api_server().await;
    create_instance(&server, NS, "cam", 2).await;
    let a = store(&server);
    let b = store(&server);
    let existing = pending("node-a", "cam-0", 1);
    a.write(&existing).await.unwrap();

    let mut events = Box::pin(watch_claims(steward_kube::SharedWatch::start(
        kube::Api::all(server.client()),
        steward_agent::selection::Selection::all().watcher(),
    )));
    assert_eq!(
        next(&mut events).await,
        ClaimEvent::Relisted(vec![existing])
    );

    let theirs = pending("node-b", "cam-1", 4);
    b.write(&theirs).await.unwrap();
    assert_eq!(next(&mut events).await, ClaimEvent::Applied(theirs));
    b.delete("cam-1", "node-b", 4).await.unwrap();
    assert_eq!(
        next(&mut events).await,
        ClaimEvent::Deleted {
            slot: "cam-1".into(),
            node: "node-b".into()
        }
    );

    // An outage: the watch is interrupted (the shared watch logs it; its
    // subscribers see nothing), then resumes where it was.
    server.set_available(false);
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    server.set_available(true);
    let after = pending("node-b", "cam-1", 6);
    b.write(&after).await.unwrap();
    let resumed = loop {
        match next(&mut events).await {
            ClaimEvent::Interrupted(_) => continue,
            other => break other,
        }
    };
    assert_eq!(resumed, ClaimEvent::Applied(after));

    // History compacted while disconnected: the watch cannot resume and
    // relists; the listed set is complete (deletions it missed are implied).
    b.delete("cam-1", "node-b", 6).await.unwrap();
    assert!(matches!(
        next(&mut events).await,
        ClaimEvent::Deleted { .. }
    ));
    server.set_available(false);
    // The watch fails and backs off, retrying; its subscribers see nothing.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    server.set_available(true);
    let missed = pending("node-b", "cam-1", 8);
    b.write(&missed).await.unwrap();
    server.compact();
    let relisted = loop {
        match next(&mut events).await {
            ClaimEvent::Interrupted(_) => continue,
            ClaimEvent::Relisted(mut claims) => {
                claims.sort();
                break claims;
            }
            other => panic!("expected a relist, got {other:?}"),
        }
    };
    let mut all = a.list().await.unwrap();
    all.sort();
    assert_eq!(all.len(), 2);
    assert_eq!(relisted, all);
}

#[tokio::test]
async fn instance_status_alternative_keeps_one_holder_per_slot() {
    let server = api_server().await;
    create_instance(&server, NS, "cam", 4).await;
    let dir = InstanceDirectory::new();
    let a = InstanceStatusClaimStore::new(server.client(), dir.clone());
    let b = InstanceStatusClaimStore::new(server.client(), dir);
    let pod = create_pod(&server, NS, "web-0").await;

    for n in 0..4 {
        let slot = format!("cam-{n}");
        let (ca, cb) = (pending("node-a", &slot, 1), pending("node-b", &slot, 1));
        let (ra, rb) = tokio::join!(a.write(&ca), b.write(&cb));
        let written = [ra.unwrap(), rb.unwrap()]
            .iter()
            .filter(|w| **w == ClaimWrite::Written)
            .count();
        assert_eq!(written, 1, "slot {slot}");
    }
    let claims = a.list().await.unwrap();
    assert_eq!(claims.len(), 4);
    // Entries carry no epoch; bind and release work on this node's entry.
    let mine = claims[0].clone();
    let (owner, other, other_node) = if mine.node == "node-a" {
        (&a, &b, "node-b")
    } else {
        (&b, &a, "node-a")
    };
    assert_eq!(mine.epoch, 0);
    let bound = held(&mine.node, mine.slot(), 2, pod);
    assert_eq!(owner.write(&bound).await.unwrap(), ClaimWrite::Written);
    let read = a.list().await.unwrap();
    let entry = read.iter().find(|c| c.slot() == mine.slot()).unwrap();
    assert_eq!(entry.holding.holder, bound.holding.holder);
    assert_eq!(entry.holding.since, bound.holding.since);
    other.delete(mine.slot(), other_node, 9).await.unwrap();
    assert_eq!(a.list().await.unwrap().len(), 4);
    owner.delete(mine.slot(), &mine.node, 9).await.unwrap();
    assert_eq!(a.list().await.unwrap().len(), 3);
}
