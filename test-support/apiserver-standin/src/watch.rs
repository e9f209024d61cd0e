//! Watch streams: newline-delimited JSON `WatchEvent`s with selector transitions,
//! bookmarks and timeouts.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::selector::Selectors;
use crate::stats::WatchMeter;
use crate::store::{EventType, Store, StoredEvent, WatchStart, meta_str};
use crate::table::{Output, render_one};
use crate::types::ResourceType;

/// Which events a watch delivers and how objects are rendered.
#[derive(Debug, Clone)]
pub struct WatchFilter {
    /// Watched kind (also the version objects are presented in).
    pub rt: ResourceType,
    /// Namespace restriction (None: all namespaces / cluster-scoped).
    pub ns: Option<String>,
    /// Label / field selectors.
    pub sel: Selectors,
    /// Full objects, `PartialObjectMetadata` or one-row `Table`s.
    pub output: Output,
}

/// Watch request parameters.
#[derive(Debug, Clone, Copy)]
pub struct WatchParams {
    /// `allowWatchBookmarks=true`.
    pub bookmarks: bool,
    /// `sendInitialEvents=true`: end the initial ADDED burst with the
    /// `k8s.io/initial-events-end` bookmark.
    pub send_initial: bool,
    /// `timeoutSeconds`.
    pub timeout: Option<Duration>,
    /// Period of BOOKMARK events.
    pub bookmark_interval: Duration,
}

impl WatchFilter {
    fn in_scope(&self, obj: &Value) -> bool {
        match &self.ns {
            Some(ns) => meta_str(obj, "namespace") == Some(ns.as_str()),
            None => true,
        }
    }

    fn passes(&self, obj: &Value) -> bool {
        self.in_scope(obj) && self.sel.matches(obj)
    }

    /// Converts a stored event into what this watcher sees (if anything), presented in
    /// the watched version (not yet rendered: see [`Renderer`]).
    pub fn convert(&self, ev: &StoredEvent) -> Option<(&'static str, Value)> {
        if ev.key != self.rt.storage_key() {
            return None;
        }
        let cur = self.passes(&ev.object);
        let present = |o: &Value| Store::present(&self.rt, o);
        match ev.etype {
            EventType::Added => cur.then(|| ("ADDED", present(&ev.object))),
            EventType::Deleted => cur.then(|| ("DELETED", present(&ev.object))),
            EventType::Modified => {
                let old = ev.prev.as_ref().is_some_and(|p| self.passes(p));
                match (old, cur) {
                    (true, true) => Some(("MODIFIED", present(&ev.object))),
                    (false, true) => Some(("ADDED", present(&ev.object))),
                    (true, false) => {
                        // previous content, with the resourceVersion of this event
                        let mut prev = ev.prev.clone().unwrap_or(Value::Null);
                        if let Some(Value::Object(m)) = prev.get_mut("metadata") {
                            m.insert("resourceVersion".into(), json!(ev.rv.to_string()));
                        }
                        Some(("DELETED", present(&prev)))
                    }
                    (false, false) => None,
                }
            }
        }
    }
}

/// Renders watched objects; a Table watch carries the column definitions in its first
/// event only, as kube-apiserver does.
struct Renderer {
    rt: ResourceType,
    output: Output,
    headers: bool,
}

impl Renderer {
    fn line(&mut self, etype: &str, obj: &Value) -> Bytes {
        let v = render_one(&self.rt, obj, self.output, self.headers);
        self.headers = false;
        line(etype, &v)
    }
}

fn line(etype: &str, object: &Value) -> Bytes {
    let mut v = serde_json::to_vec(&json!({"type": etype, "object": object})).unwrap_or_default();
    v.push(b'\n');
    Bytes::from(v)
}

fn bookmark(rt: &ResourceType, rv: u64, initial_end: bool) -> Bytes {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    line(
        "BOOKMARK",
        &json!({"kind": rt.kind, "apiVersion": rt.api_version(), "metadata": meta}),
    )
}

/// A response body with a single ERROR event (e.g. 410 Expired).
pub fn error_body(status: &Value) -> Body {
    Body::from(line("ERROR", status))
}

type Tx = mpsc::Sender<Result<Bytes, Infallible>>;

/// Sends one line of `event_type`, counting it in `meter` once it is on the channel.
async fn send(tx: &Tx, meter: &mut WatchMeter, event_type: &str, b: Bytes) -> bool {
    let len = b.len();
    if tx.send(Ok(b)).await.is_err() {
        return false;
    }
    meter.sent(event_type, len);
    true
}

/// Spawns the task feeding a watch response and returns its body. The task
/// owns `meter`: the watch counts as open until the task ends.
pub fn spawn(
    store: Arc<Mutex<Store>>,
    start: WatchStart,
    filter: WatchFilter,
    params: WatchParams,
    meter: WatchMeter,
) -> Body {
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(256);
    tokio::spawn(run(store, start, filter, params, tx, meter));
    Body::from_stream(ReceiverStream::new(rx))
}

async fn run(
    store: Arc<Mutex<Store>>,
    start: WatchStart,
    filter: WatchFilter,
    params: WatchParams,
    tx: Tx,
    mut meter: WatchMeter,
) {
    let WatchStart {
        initial,
        replay,
        mut rx,
        start_rv,
    } = start;
    let mut last_rv = start_rv;
    let mut out = Renderer {
        rt: filter.rt.clone(),
        output: filter.output,
        headers: true,
    };
    for obj in &initial {
        if !send(&tx, &mut meter, "ADDED", out.line("ADDED", obj)).await {
            return;
        }
    }
    for ev in &replay {
        if let Some((t, o)) = filter.convert(ev)
            && !send(&tx, &mut meter, t, out.line(t, &o)).await
        {
            return;
        }
    }
    if (params.bookmarks || params.send_initial)
        && !send(
            &tx,
            &mut meter,
            "BOOKMARK",
            bookmark(&filter.rt, last_rv, params.send_initial),
        )
        .await
    {
        return;
    }
    let deadline = params.timeout.map(|t| tokio::time::Instant::now() + t);
    let mut ticker = tokio::time::interval(params.bookmark_interval);
    ticker.reset();
    loop {
        tokio::select! {
            ev = rx.recv() => {
                let Some(ev) = ev else { break };
                last_rv = last_rv.max(ev.rv);
                if let Some((t, o)) = filter.convert(&ev)
                    && !send(&tx, &mut meter, t, out.line(t, &o)).await
                {
                    break;
                }
            }
            _ = ticker.tick(), if params.bookmarks => {
                let current = match store.lock() {
                    Ok(s) => s.rv(),
                    Err(_) => break,
                };
                let mut closed = false;
                loop {
                    match rx.try_recv() {
                        Ok(ev) => {
                            last_rv = last_rv.max(ev.rv);
                            if let Some((t, o)) = filter.convert(&ev)
                                && !send(&tx, &mut meter, t, out.line(t, &o)).await
                            {
                                closed = true;
                                break;
                            }
                        }
                        Err(mpsc::error::TryRecvError::Empty) => break,
                        Err(mpsc::error::TryRecvError::Disconnected) => {
                            closed = true;
                            break;
                        }
                    }
                }
                if closed {
                    break;
                }
                last_rv = last_rv.max(current);
                if !send(&tx, &mut meter, "BOOKMARK", bookmark(&filter.rt, last_rv, false)).await {
                    break;
                }
            }
            _ = sleep_until(deadline) => break,
            _ = tx.closed() => break,
        }
    }
    tracing::debug!(kind = %filter.rt.kind, "watch stream ended");
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending::<()>().await,
    }
}
