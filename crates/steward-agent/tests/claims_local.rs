//! The node-local durable claim ledger (a table of the node's redb store).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use steward_agent::NodeStore;
use steward_agent::claims::{ClaimStore, ClaimWrite, LocalClaimStore};
use steward_core::Millis;
use steward_core::ledger::{Holder, Holding, PodRef};
use steward_core::slots::Claim;

fn claim(node: &str, slot: &str, epoch: u64, pod: Option<&str>) -> Claim {
    let holding = match pod {
        Some(uid) => Holding::held(
            slot,
            Holder::new(PodRef::new(uid, "default", "web-0"), Some("main".into())),
            Millis(epoch * 10),
        ),
        None => Holding::pending(slot, Millis(epoch * 10)),
    };
    Claim {
        node: node.into(),
        epoch,
        holding,
        awaiting: pod.is_none().then_some(Millis(epoch * 10)),
    }
}

#[tokio::test]
async fn local_claims_follow_the_epoch_rules_and_survive_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let (kept, bound) = {
        let store = LocalClaimStore::new(NodeStore::open(dir.path()).unwrap());
        assert!(
            store.list().await.unwrap().is_empty(),
            "empty before any write"
        );

        let first = claim("node-a", "cam-0", 1, None);
        assert_eq!(store.write(&first).await.unwrap(), ClaimWrite::Written);
        let bound = claim("node-a", "cam-0", 3, Some("uid-1"));
        assert_eq!(store.write(&bound).await.unwrap(), ClaimWrite::Written);
        // An older write keeps the newer record.
        assert_eq!(
            store
                .write(&claim("node-a", "cam-0", 2, None))
                .await
                .unwrap(),
            ClaimWrite::Written
        );
        // Another node's write is refused.
        assert_eq!(
            store
                .write(&claim("node-b", "cam-0", 9, None))
                .await
                .unwrap(),
            ClaimWrite::HeldByOtherNode {
                node: "node-a".into()
            }
        );
        let kept = claim("node-a", "cam-1", 4, None);
        store.write(&kept).await.unwrap();
        store
            .write(&claim("node-a", "cam-2", 5, None))
            .await
            .unwrap();

        // Deletes: wrong node and older epoch leave the record.
        store.delete("cam-0", "node-b", 99).await.unwrap();
        store.delete("cam-0", "node-a", 2).await.unwrap();
        store.delete("cam-2", "node-a", 5).await.unwrap();
        store.delete("cam-9", "node-a", 5).await.unwrap();
        assert_eq!(
            store.list().await.unwrap(),
            vec![bound.clone(), kept.clone()]
        );
        (kept, bound)
    };
    // Reopen (agent restart): the same records, durable.
    let store = LocalClaimStore::new(NodeStore::open(dir.path()).unwrap());
    assert_eq!(store.list().await.unwrap(), vec![bound, kept.clone()]);
    store.delete("cam-0", "node-a", 3).await.unwrap();
    drop(store);
    let store = LocalClaimStore::new(NodeStore::open(dir.path()).unwrap());
    assert_eq!(store.list().await.unwrap(), vec![kept]);
}

#[tokio::test]
async fn concurrent_local_writers_keep_one_holder() {
    let dir = tempfile::tempdir().unwrap();
    let store = LocalClaimStore::new(NodeStore::open(dir.path()).unwrap());
    let mut tasks = Vec::new();
    for n in 0..8 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            store
                .write(&claim(&format!("node-{n}"), "cam-0", 1, None))
                .await
                .unwrap()
        }));
    }
    let mut written = 0;
    for t in tasks {
        if t.await.unwrap() == ClaimWrite::Written {
            written += 1;
        }
    }
    assert_eq!(written, 1);
    assert_eq!(store.list().await.unwrap().len(), 1);
}
