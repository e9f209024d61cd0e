//! The hub: the node view ([`NodeView`], [`AllocatableView`]) behind one
//! lock, and the watchers it feeds.
//!
//! Every change goes through the hub: it is applied to the view, and the
//! events it causes are converted to wire messages once and offered to every
//! watcher in the same critical section, so each watcher receives events in
//! the view's order. Offering never waits: each watcher has a bounded buffer,
//! and one whose buffer is full is cut off — its stream ends with `ABORTED`
//! and a message telling it to list and watch again — so a slow watcher can
//! never delay the ledger or the other watchers, and is never shown a
//! picture with holes in it.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::task::{Context, Poll};

use futures::Stream;
use steward_core::ledger::{
    Allocatable, AllocatableEvent, AllocatableView, NodeView, PodAssignments, PodEvent, Source,
};
use steward_proto::podresources::v1 as wire;
use tokio::sync::mpsc;
use tonic::Status;

use crate::convert;
use crate::metrics::{PodResourcesMetrics, WatchKind};

/// Limits on watchers.
#[derive(Debug, Clone, Copy)]
pub struct WatchLimits {
    /// Watch streams open at once, per kind; one more is refused with
    /// `RESOURCE_EXHAUSTED`.
    pub max_watchers: usize,
    /// Events a watcher may have unread before it is cut off.
    pub buffer: usize,
}

impl Default for WatchLimits {
    fn default() -> Self {
        Self {
            max_watchers: 256,
            buffer: 1024,
        }
    }
}

/// A watch was refused.
#[derive(Debug, thiserror::Error)]
#[error("{open} {kind} watchers are open, the limit is {limit}")]
pub struct TooManyWatchers {
    pub kind: &'static str,
    pub open: usize,
    pub limit: usize,
}

impl From<TooManyWatchers> for Status {
    fn from(e: TooManyWatchers) -> Status {
        Status::resource_exhausted(e.to_string())
    }
}

/// The `cut` value of a watcher ended because the server is stopping.
const SHUTDOWN: u64 = u64::MAX;

type PodMsg = wire::ListAndWatchPodResourcesResponse;
type AllocMsg = wire::ListAndWatchAllocatableResourcesResponse;

struct Watcher<M> {
    tx: mpsc::Sender<M>,
    /// Set (to the sequence number where it fell behind) when cut off.
    cut: Arc<AtomicU64>,
}

struct Fanout<M> {
    kind: &'static str,
    next_id: u64,
    watchers: BTreeMap<u64, Watcher<M>>,
}

impl<M: Clone> Fanout<M> {
    fn new(kind: &'static str) -> Self {
        Self {
            kind,
            next_id: 0,
            watchers: BTreeMap::new(),
        }
    }

    /// Offers `msgs` to every watcher without waiting; cuts the ones whose
    /// buffer is full and forgets the ones that hung up.
    fn offer(&mut self, msgs: &[(u64, M)], metrics: &PodResourcesMetrics) {
        if msgs.is_empty() || self.watchers.is_empty() {
            return;
        }
        let label = WatchKind { stream: self.kind };
        let mut gone = Vec::new();
        for (id, w) in &self.watchers {
            for (seq, msg) in msgs {
                match w.tx.try_send(msg.clone()) {
                    Ok(()) => {}
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        w.cut.store((*seq).max(1), Ordering::Release);
                        metrics.watchers_cut.get_or_create(&label).inc();
                        let undelivered = msgs.iter().filter(|(s, _)| s >= seq).count();
                        metrics
                            .events_dropped
                            .get_or_create(&label)
                            .inc_by(undelivered as u64);
                        gone.push(*id);
                        break;
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => {
                        gone.push(*id);
                        break;
                    }
                }
            }
        }
        for id in gone {
            self.watchers.remove(&id);
        }
    }
}

struct State {
    view: NodeView,
    allocatable: AllocatableView,
    pods: Fanout<PodMsg>,
    allocs: Fanout<AllocMsg>,
}

/// The node view and its watchers.
pub struct Hub {
    state: Mutex<State>,
    limits: WatchLimits,
    metrics: PodResourcesMetrics,
    me: Weak<Hub>,
}

impl Hub {
    pub fn new(limits: WatchLimits, metrics: PodResourcesMetrics) -> Arc<Hub> {
        Arc::new_cyclic(|me| Hub {
            state: Mutex::new(State {
                view: NodeView::new(),
                allocatable: AllocatableView::new(),
                pods: Fanout::new("pods"),
                allocs: Fanout::new("allocatable"),
            }),
            limits: WatchLimits {
                max_watchers: limits.max_watchers,
                buffer: limits.buffer.max(1),
            },
            metrics,
            me: me.clone(),
        })
    }

    pub fn metrics(&self) -> &PodResourcesMetrics {
        &self.metrics
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is a value with no invariant a panic in a reader could
        // break half-way; keep serving.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Applies `change` to the pod view and delivers the events it returns.
    pub fn update<F>(&self, change: F) -> Vec<PodEvent>
    where
        F: FnOnce(&mut NodeView) -> Vec<PodEvent>,
    {
        let mut st = self.lock();
        let events = change(&mut st.view);
        let msgs: Vec<(u64, PodMsg)> = events
            .iter()
            .map(|e| (e.seq, convert::pod_event(e)))
            .collect();
        st.pods.offer(&msgs, &self.metrics);
        events
    }

    /// Applies `change` to the allocatable view and delivers its events.
    pub fn update_allocatable<F>(&self, change: F) -> Vec<AllocatableEvent>
    where
        F: FnOnce(&mut AllocatableView) -> Vec<AllocatableEvent>,
    {
        let mut st = self.lock();
        let events = change(&mut st.allocatable);
        let msgs: Vec<(u64, AllocMsg)> = events
            .iter()
            .map(|e| (e.seq, convert::allocatable_event(e)))
            .collect();
        st.allocs.offer(&msgs, &self.metrics);
        events
    }

    /// `source`'s record of one pod.
    pub fn upsert(&self, source: Source, pod: PodAssignments) -> Vec<PodEvent> {
        self.update(|v| v.upsert(source, pod))
    }

    /// `source` no longer reports pod `uid`.
    pub fn remove(&self, source: Source, uid: &str) -> Vec<PodEvent> {
        self.update(|v| v.remove(source, uid))
    }

    /// `source`'s whole report of pods.
    pub fn replace(&self, source: Source, pods: Vec<PodAssignments>) -> Vec<PodEvent> {
        self.update(|v| v.replace(source, pods))
    }

    /// Pod `uid` is gone from the node.
    pub fn pod_gone(&self, uid: &str) -> Vec<PodEvent> {
        self.update(|v| v.pod_gone(uid))
    }

    /// `source`'s whole report of allocatable resources.
    pub fn replace_allocatable(
        &self,
        source: Source,
        report: Allocatable,
    ) -> Vec<AllocatableEvent> {
        self.update_allocatable(|v| v.replace(source, report))
    }

    /// The resource names steward's device plugins serve.
    pub fn set_steward_resources(&self, names: BTreeSet<String>) {
        self.update(|v| v.set_steward_resources(names.clone()));
        self.update_allocatable(|v| v.set_steward_resources(names));
    }

    /// Every pod, as `List` answers.
    pub fn list(&self) -> Vec<wire::PodResources> {
        self.lock()
            .view
            .list()
            .map(convert::pod_resources)
            .collect()
    }

    /// Every pod with its UID, for in-process readers.
    pub fn snapshot(&self) -> Vec<PodAssignments> {
        self.lock().view.list().cloned().collect()
    }

    /// One pod by namespace and name.
    pub fn get(&self, namespace: &str, name: &str) -> Option<wire::PodResources> {
        self.lock()
            .view
            .get(namespace, name)
            .map(convert::pod_resources)
    }

    /// What the node can hand out.
    pub fn allocatable(&self) -> wire::AllocatableResourcesResponse {
        convert::allocatable(self.lock().allocatable.current())
    }

    /// A watch of pod changes: first every pod present now (ADDED), then
    /// every change, with no gap between the two.
    pub fn watch_pods(&self) -> Result<WatchStream<PodMsg>, TooManyWatchers> {
        let mut st = self.lock();
        let initial: VecDeque<PodMsg> = st
            .view
            .list()
            .map(|p| {
                convert::pod_event(&PodEvent {
                    seq: 0,
                    action: steward_core::ledger::Action::Added,
                    pod: p.clone(),
                })
            })
            .collect();
        self.subscribe(&mut st.pods, initial, Kind::Pods)
    }

    /// A watch of allocatable changes: first everything allocatable now
    /// (one ADDED), then every change.
    pub fn watch_allocatable(&self) -> Result<WatchStream<AllocMsg>, TooManyWatchers> {
        let mut st = self.lock();
        let now = st.allocatable.current().clone();
        let mut initial = VecDeque::new();
        if !now.is_empty() {
            initial.push_back(convert::allocatable_event(&AllocatableEvent {
                seq: 0,
                action: steward_core::ledger::Action::Added,
                resources: now,
            }));
        }
        self.subscribe(&mut st.allocs, initial, Kind::Allocatable)
    }

    fn subscribe<M>(
        &self,
        fanout: &mut Fanout<M>,
        initial: VecDeque<M>,
        kind: Kind,
    ) -> Result<WatchStream<M>, TooManyWatchers> {
        if fanout.watchers.len() >= self.limits.max_watchers {
            return Err(TooManyWatchers {
                kind: fanout.kind,
                open: fanout.watchers.len(),
                limit: self.limits.max_watchers,
            });
        }
        let (tx, rx) = mpsc::channel(self.limits.buffer);
        let cut = Arc::new(AtomicU64::new(0));
        let id = fanout.next_id;
        fanout.next_id += 1;
        fanout.watchers.insert(
            id,
            Watcher {
                tx,
                cut: cut.clone(),
            },
        );
        self.metrics
            .watchers
            .get_or_create(&WatchKind {
                stream: fanout.kind,
            })
            .inc();
        Ok(WatchStream {
            initial_len: initial.len(),
            initial,
            rx,
            cut,
            ended: false,
            _guard: Guard {
                hub: self.me.clone(),
                id,
                kind,
            },
        })
    }

    fn unsubscribe(&self, id: u64, kind: Kind) {
        let mut st = self.lock();
        let label = match kind {
            Kind::Pods => {
                st.pods.watchers.remove(&id);
                st.pods.kind
            }
            Kind::Allocatable => {
                st.allocs.watchers.remove(&id);
                st.allocs.kind
            }
        };
        self.metrics
            .watchers
            .get_or_create(&WatchKind { stream: label })
            .dec();
    }

    /// Ends every watch stream (after what it has buffered) with
    /// `UNAVAILABLE`: the server is going away. Open streams would otherwise
    /// hold a graceful shutdown forever.
    pub fn close_watchers(&self) {
        let mut st = self.lock();
        for w in st.pods.watchers.values() {
            w.cut.store(SHUTDOWN, Ordering::Release);
        }
        for w in st.allocs.watchers.values() {
            w.cut.store(SHUTDOWN, Ordering::Release);
        }
        st.pods.watchers.clear();
        st.allocs.watchers.clear();
    }

    /// Watchers open now (pods, allocatable).
    pub fn watchers(&self) -> (usize, usize) {
        let st = self.lock();
        (st.pods.watchers.len(), st.allocs.watchers.len())
    }
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Pods,
    Allocatable,
}

/// Removes its watcher from the hub when the stream is dropped (the client
/// hung up, or the stream ended).
struct Guard {
    hub: Weak<Hub>,
    id: u64,
    kind: Kind,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(hub) = self.hub.upgrade() {
            hub.unsubscribe(self.id, self.kind);
        }
    }
}

/// One watcher's stream: the initial state, then the changes, then — if it
/// was cut off — one `ABORTED` status.
pub struct WatchStream<M> {
    initial: VecDeque<M>,
    initial_len: usize,
    rx: mpsc::Receiver<M>,
    cut: Arc<AtomicU64>,
    ended: bool,
    _guard: Guard,
}

impl<M> WatchStream<M> {
    /// How many messages describe the state at subscription (they come
    /// first).
    pub fn initial_len(&self) -> usize {
        self.initial_len
    }
}

impl<M: Unpin> Stream for WatchStream<M> {
    type Item = Result<M, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if let Some(m) = this.initial.pop_front() {
            return Poll::Ready(Some(Ok(m)));
        }
        if this.ended {
            return Poll::Ready(None);
        }
        match this.rx.poll_recv(cx) {
            Poll::Ready(Some(m)) => Poll::Ready(Some(Ok(m))),
            Poll::Ready(None) => {
                this.ended = true;
                let at = this.cut.load(Ordering::Acquire);
                if at == SHUTDOWN {
                    Poll::Ready(Some(Err(Status::unavailable(
                        "the pod resources server is stopping; watch again",
                    ))))
                } else if at > 0 {
                    Poll::Ready(Some(Err(Status::aborted(format!(
                        "this watcher fell a whole buffer behind at event {at} and was cut off \
                         so it never sees a state with holes; list and watch again"
                    )))))
                } else {
                    Poll::Ready(None)
                }
            }
            Poll::Pending => Poll::Pending,
        }
    }
}
