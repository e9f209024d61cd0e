//! A subscriber's stream of a shared watch's changes, relisted from the
//! store when it falls behind.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::Stream;
use futures::stream::BoxStream;
use kube::ResourceExt;
use tokio::sync::broadcast::{self, error::RecvError};

use super::Shared;
use super::hub::{Snapshot, Step};
use crate::watch::Change;

/// The [`Change`]s of a [`super::SharedWatch`] for one subscriber: the
/// store as a [`Change::Relisted`] first (once it has listed), then every
/// change; a subscriber that fell behind is relisted from the store (see
/// the module documentation of [`super`]). Never yields
/// [`Change::Interrupted`]; ends only if the watch task does. Keeps the
/// watch alive while held.
pub struct Subscription<K> {
    inner: BoxStream<'static, Change<K>>,
}

struct State<K> {
    shared: Arc<Shared<K>>,
    rx: broadcast::Receiver<Step<K>>,
    /// The store's version this subscriber has seen up to.
    seen: u64,
    /// Sent before anything else.
    first: Option<Change<K>>,
}

fn relisted<K: Clone>(snapshot: &Snapshot<K>) -> Option<Change<K>> {
    snapshot
        .listed
        .then(|| Change::Relisted(snapshot.objects.iter().map(|o| K::clone(o)).collect()))
}

impl<K: ResourceExt + Clone + Send + Sync + 'static> Subscription<K> {
    pub(super) fn new(shared: Arc<Shared<K>>) -> Self {
        let (rx, snapshot) = shared.lock().subscribe();
        let state = State {
            seen: snapshot.seq,
            first: relisted(&snapshot),
            shared,
            rx,
        };
        let inner = futures::stream::unfold(state, |mut st| async move {
            if let Some(first) = st.first.take() {
                return Some((first, st));
            }
            loop {
                match st.rx.recv().await {
                    Ok(step) if step.seq <= st.seen => {}
                    Ok(step) => {
                        st.seen = step.seq;
                        return Some((step.what.to_change(), st));
                    }
                    Err(RecvError::Lagged(missed)) => {
                        let snapshot = {
                            let mut hub = st.shared.lock();
                            hub.lagged();
                            hub.snapshot()
                        };
                        tracing::warn!(
                            kind = %st.shared.kind,
                            missed,
                            "a consumer of the shared watch fell behind; relisting it from the store"
                        );
                        // Steps up to the snapshot are in it.
                        st.seen = snapshot.seq;
                        if let Some(all) = relisted(&snapshot) {
                            return Some((all, st));
                        }
                    }
                    Err(RecvError::Closed) => return None,
                }
            }
        });
        Self {
            inner: Box::pin(inner),
        }
    }
}

impl<K> Stream for Subscription<K> {
    type Item = Change<K>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Change<K>>> {
        self.inner.as_mut().poll_next(cx)
    }
}
