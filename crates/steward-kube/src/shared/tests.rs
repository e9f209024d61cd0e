use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ObjectMeta;
use proptest::prelude::*;

use super::hub::Hub;
use super::*;
use crate::mirror::{Mirror, ObjectKey};

fn cm(name: &str, value: u8) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            namespace: Some("ns".to_owned()),
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([("v".to_owned(), value.to_string())])),
        ..ConfigMap::default()
    }
}

/// A shared watch whose hub the test feeds by hand (no task publishes).
fn by_hand(capacity: usize) -> (SharedWatch<ConfigMap>, Arc<Mutex<Hub<ConfigMap>>>) {
    let hub = Arc::new(Mutex::new(Hub::new(capacity)));
    let task = tokio::spawn(std::future::pending::<()>());
    let watch = SharedWatch {
        shared: Arc::new(Shared {
            kind: "ConfigMap".to_owned(),
            hub: hub.clone(),
            _task: AbortOnDropHandle::new(task),
        }),
    };
    (watch, hub)
}

fn publish(hub: &Mutex<Hub<ConfigMap>>, change: Change<ConfigMap>) {
    let _ = lock(hub).publish(change);
}

/// The subscription's next change if it has one ready. Unconstrained:
/// tokio's cooperative budget would otherwise answer "not ready" after a
/// hundred reads in one task poll.
fn next_now(sub: &mut Subscription<ConfigMap>) -> Option<Option<Change<ConfigMap>>> {
    tokio::task::unconstrained(sub.next()).now_or_never()
}

/// What a subscription has ready now, without waiting.
fn ready(sub: &mut Subscription<ConfigMap>) -> Vec<String> {
    let mut out = Vec::new();
    while let Some(Some(c)) = next_now(sub) {
        out.push(describe(&c));
    }
    out
}

fn describe(c: &Change<ConfigMap>) -> String {
    let n = |o: &ConfigMap| {
        format!(
            "{}={}",
            o.metadata.name.clone().unwrap_or_default(),
            o.data
                .as_ref()
                .and_then(|d| d.get("v"))
                .cloned()
                .unwrap_or_default()
        )
    };
    match c {
        Change::Relisted(all) => format!(
            "relisted[{}]",
            all.iter().map(n).collect::<Vec<_>>().join(",")
        ),
        Change::Applied(o) => format!("applied {}", n(o)),
        Change::Deleted(o) => format!("deleted {}", n(o)),
        Change::Interrupted(_) => "interrupted".to_owned(),
    }
}

#[tokio::test]
async fn subscribers_get_the_store_first_then_every_change() {
    let (watch, hub) = by_hand(16);
    let mut early = watch.subscribe();
    assert!(ready(&mut early).is_empty(), "nothing before the list");
    publish(&hub, Change::Relisted(vec![cm("a", 1)]));
    publish(&hub, Change::Applied(cm("b", 1)));
    let mut late = watch.subscribe();
    publish(&hub, Change::Deleted(cm("a", 1)));
    publish(&hub, Change::Interrupted(watcher::Error::NoResourceVersion));
    publish(&hub, Change::Applied(cm("b", 2)));
    assert_eq!(
        ready(&mut early),
        ["relisted[a=1]", "applied b=1", "deleted a=1", "applied b=2"]
    );
    assert_eq!(
        ready(&mut late),
        ["relisted[a=1,b=1]", "deleted a=1", "applied b=2"]
    );
    let reader = watch.reader();
    assert!(reader.listed());
    assert_eq!(reader.len(), 1);
    let b = reader.get(&ObjectKey::new("ns", "b"));
    assert_eq!(
        b.map(|b| describe(&Change::Applied(ConfigMap::clone(&b)))),
        Some("applied b=2".to_owned())
    );
}

#[tokio::test]
async fn a_subscriber_that_falls_behind_is_relisted_from_the_store() {
    let (watch, hub) = by_hand(2);
    let mut slow = watch.subscribe();
    publish(&hub, Change::Relisted(vec![cm("a", 1), cm("b", 1)]));
    for v in 2..6 {
        publish(&hub, Change::Applied(cm("a", v)));
    }
    publish(&hub, Change::Deleted(cm("b", 1)));
    // Five steps behind with room for two: the store, then what follows.
    assert_eq!(ready(&mut slow), ["relisted[a=5]"]);
    assert_eq!(watch.lags(), 1);
    publish(&hub, Change::Applied(cm("c", 1)));
    assert_eq!(ready(&mut slow), ["applied c=1"]);
}

#[tokio::test]
async fn subscriptions_end_when_the_watch_does() {
    let watch = SharedWatch::<ConfigMap>::from_changes(
        futures::stream::iter(vec![Change::Relisted(vec![cm("a", 1)])]),
        4,
    );
    let mut sub = watch.subscribe();
    let got: Vec<String> = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        let mut out = Vec::new();
        while let Some(c) = sub.next().await {
            out.push(describe(&c));
        }
        out
    })
    .await
    .unwrap_or_else(|_| panic!("the subscription did not end"));
    // Subscribed before or after the list: the store either way, once.
    assert_eq!(got, ["relisted[a=1]"]);
}

#[tokio::test]
async fn the_last_holder_stops_the_watch() {
    let (tx, rx) = futures::channel::mpsc::unbounded::<Change<ConfigMap>>();
    let watch = SharedWatch::<ConfigMap>::from_changes(rx, 4);
    let reader = watch.reader();
    drop(watch);
    tx.unbounded_send(Change::Relisted(vec![cm("a", 1)]))
        .unwrap_or_else(|e| panic!("{e}"));
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    assert!(reader.listed(), "a reader keeps the watch");
    drop(reader);
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    assert!(tx.is_closed(), "nobody holds it: the task ended");
}

/// A change, as proptest can generate it (a [`Change`] is not `Clone`).
#[derive(Debug, Clone)]
enum Op {
    Relist(Vec<(u8, u8)>),
    Apply(u8, u8),
    Delete(u8, u8),
    Interrupt,
}

impl Op {
    fn change(&self) -> Change<ConfigMap> {
        let o = |n: &u8, v: &u8| cm(&format!("o{n}"), *v);
        match self {
            Op::Relist(all) => Change::Relisted(all.iter().map(|(n, v)| o(n, v)).collect()),
            Op::Apply(n, v) => Change::Applied(o(n, v)),
            Op::Delete(n, v) => Change::Deleted(o(n, v)),
            Op::Interrupt => Change::Interrupted(watcher::Error::NoResourceVersion),
        }
    }
}

fn op() -> impl Strategy<Value = Op> {
    let obj = (0u8..5, 0u8..4);
    prop_oneof![
        1 => proptest::collection::vec(obj.clone(), 0..5).prop_map(Op::Relist),
        5 => obj.clone().prop_map(|(n, v)| Op::Apply(n, v)),
        3 => obj.prop_map(|(n, v)| Op::Delete(n, v)),
        1 => Just(Op::Interrupt),
    ]
}

proptest! {
    /// Any changes, any capacity, subscribers joining and reading at any
    /// point: every subscriber's own Mirror, and every reader, ends with the
    /// picture one Mirror fed every change would have. A followed watch
    /// lists first, so the changes do.
    #[test]
    fn every_reader_and_subscriber_sees_what_one_mirror_would(
        first in proptest::collection::vec((0u8..5, 0u8..4), 0..5),
        rest in proptest::collection::vec(op(), 0..40),
        capacity in 1usize..5,
        // Per step: which subscribers read (bit i: subscriber i), and
        // whether a new one joins.
        reads in proptest::collection::vec((0u8..16, any::<bool>()), 41),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().build()
            .unwrap_or_else(|e| panic!("{e}"));
        let changes: Vec<_> = std::iter::once(Op::Relist(first)).chain(rest).collect();
        rt.block_on(async {
            let (watch, hub) = by_hand(capacity);
            let mut reference = Mirror::<ConfigMap>::new();
            let mut subs = vec![(watch.subscribe(), Mirror::<ConfigMap>::new())];
            for (i, c) in changes.iter().enumerate() {
                let _ = reference.apply(c.change());
                publish(&hub, c.change());
                let (mask, join) = reads[i];
                if join {
                    subs.push((watch.subscribe(), Mirror::new()));
                }
                for (j, (sub, mirror)) in subs.iter_mut().enumerate() {
                    if mask & (1 << (j % 4)) != 0 {
                        while let Some(Some(c)) = next_now(sub) {
                            prop_assert!(!matches!(c, Change::Interrupted(_)));
                            let _ = mirror.apply(c);
                        }
                    }
                }
            }
            let want: Vec<_> = reference.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            let reader: Vec<_> = watch
                .reader()
                .snapshot()
                .iter()
                .map(|o| (ObjectKey::of(o.as_ref()), ConfigMap::clone(o)))
                .collect();
            prop_assert_eq!(&reader, &want);
            prop_assert_eq!(watch.reader().listed(), reference.listed());
            for (sub, mirror) in subs.iter_mut() {
                while let Some(Some(c)) = next_now(sub) {
                    let _ = mirror.apply(c);
                }
                let got: Vec<_> = mirror.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
                prop_assert_eq!(&got, &want);
                prop_assert_eq!(mirror.listed(), reference.listed());
            }
            Ok(())
        })?;
    }
}
