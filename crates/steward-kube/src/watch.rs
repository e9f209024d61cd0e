//! Following a Kubernetes watch as complete pictures and changes.
//!
//! kube-runtime's [`watcher`] is the transport: it lists, watches, resumes
//! from the last resourceVersion and relists when the server says the
//! version is gone (410). During a relist it reports `Init`, one
//! `InitApply` per object and `InitDone`; objects that disappeared while
//! the watch was down are never reported as deleted, only missing from the
//! list. [`changes`] folds that into one [`Change::Relisted`] carrying the
//! complete set, so the consumer replaces its picture at once, derives
//! deletions itself, and never acts on a half-listed picture.

use std::fmt::Debug;
use std::time::Duration;

use futures::{Stream, StreamExt, future};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;

/// One step of a followed watch.
#[derive(Debug)]
pub enum Change<K> {
    /// The watch (re)started and listed: this is every object; what is not
    /// in it is gone. The first change once the server answers, and again
    /// after each interruption the watch could not resume from.
    Relisted(Vec<K>),
    /// An object was created or changed.
    Applied(K),
    /// An object was deleted (its last known state).
    Deleted(K),
    /// The watch failed; it is retried with backoff and goes on with
    /// changes or a [`Change::Relisted`]. A list in progress is dropped.
    Interrupted(watcher::Error),
}

/// `api` watched with `config`, retried with [`backoff`], as [`Change`]s.
/// The stream never ends.
pub fn follow<K>(api: Api<K>, config: watcher::Config) -> impl Stream<Item = Change<K>> + Send
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    K::DynamicType: Default,
{
    changes(watcher::watcher(api, config).backoff(backoff()))
}

/// First retry of a failed watch.
pub const BACKOFF_MIN: Duration = Duration::from_millis(200);
/// Longest wait between two retries.
pub const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// The retry schedule of a failed watch: from [`BACKOFF_MIN`], doubling
/// up to [`BACKOFF_MAX`], each wait with a random jitter of up to its own
/// length; reset by the first event that gets through.
///
/// kube-runtime's default goes from 800 ms to 30 s. A node agent that comes
/// back from an API outage on that schedule takes up to half a minute to
/// see what changed meanwhile, and slots freed during the outage stay
/// claimed in the cluster that long (with it, 3 s after short partitions in
/// `fault_api`). Five seconds bounds the catch-up; the jitter keeps a fleet
/// of agents from retrying in step while the API server recovers.
pub fn backoff() -> watcher::ExponentialBackoff {
    backon::ExponentialBuilder::default()
        .with_min_delay(BACKOFF_MIN)
        .with_max_delay(BACKOFF_MAX)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .into()
}

/// Folds a kube-runtime watcher stream into [`Change`]s: the `Init` …
/// `InitApply` … `InitDone` of a (re)list become one
/// [`Change::Relisted`]; `Apply` and `Delete` pass through. An `InitApply`
/// outside a list (the watcher never sends one) counts as an `Apply`, and
/// an `InitDone` without an `Init` as an empty list's end only if a list
/// was started.
pub fn changes<K, S>(events: S) -> impl Stream<Item = Change<K>>
where
    S: Stream<Item = Result<Event<K>, watcher::Error>>,
{
    let mut listing: Option<Vec<K>> = None;
    events.filter_map(move |event| {
        let out = match event {
            Ok(Event::Init) => {
                listing = Some(Vec::new());
                None
            }
            Ok(Event::InitApply(obj)) => match listing.as_mut() {
                Some(list) => {
                    list.push(obj);
                    None
                }
                None => Some(Change::Applied(obj)),
            },
            Ok(Event::InitDone) => listing.take().map(Change::Relisted),
            Ok(Event::Apply(obj)) => Some(Change::Applied(obj)),
            Ok(Event::Delete(obj)) => Some(Change::Deleted(obj)),
            Err(e) => {
                listing = None;
                Some(Change::Interrupted(e))
            }
        };
        future::ready(out)
    })
}

#[cfg(test)]
mod tests {
    use futures::stream;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    use super::*;

    fn cm(name: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        }
    }

    fn names(c: &Change<ConfigMap>) -> String {
        let n = |o: &ConfigMap| o.metadata.name.clone().unwrap_or_default();
        match c {
            Change::Relisted(v) => format!(
                "relisted[{}]",
                v.iter().map(n).collect::<Vec<_>>().join(",")
            ),
            Change::Applied(o) => format!("applied {}", n(o)),
            Change::Deleted(o) => format!("deleted {}", n(o)),
            Change::Interrupted(_) => "interrupted".to_owned(),
        }
    }

    async fn fold(events: Vec<Result<Event<ConfigMap>, watcher::Error>>) -> Vec<String> {
        changes(stream::iter(events))
            .map(|c| names(&c))
            .collect()
            .await
    }

    #[tokio::test]
    async fn a_list_arrives_whole_and_changes_pass_through() {
        let got = fold(vec![
            Ok(Event::Init),
            Ok(Event::InitApply(cm("a"))),
            Ok(Event::InitApply(cm("b"))),
            Ok(Event::InitDone),
            Ok(Event::Apply(cm("c"))),
            Ok(Event::Delete(cm("a"))),
        ])
        .await;
        assert_eq!(got, ["relisted[a,b]", "applied c", "deleted a"]);
    }

    #[tokio::test]
    async fn an_empty_list_is_a_list() {
        let got = fold(vec![Ok(Event::Init), Ok(Event::InitDone)]).await;
        assert_eq!(got, ["relisted[]"]);
    }

    #[tokio::test]
    async fn a_failure_mid_list_drops_the_partial_list() {
        let got = fold(vec![
            Ok(Event::Init),
            Ok(Event::InitApply(cm("a"))),
            Err(watcher::Error::NoResourceVersion),
            Ok(Event::Init),
            Ok(Event::InitApply(cm("b"))),
            Ok(Event::InitDone),
        ])
        .await;
        assert_eq!(got, ["interrupted", "relisted[b]"]);
    }

    #[tokio::test]
    async fn stray_list_events_are_not_lost_or_invented() {
        let got = fold(vec![Ok(Event::InitApply(cm("a"))), Ok(Event::InitDone)]).await;
        assert_eq!(got, ["applied a"]);
    }
}
