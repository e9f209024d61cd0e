//! The leader's node-membership labels in the loop: the watch changes are
//! folded into a [`Labeler`], and the patches it calls for are sent off the
//! loop, a few at a time.

use futures::StreamExt;
use steward_api::{Instance, Reservation, SlotClaim};
use steward_kube::Change;
use tokio::sync::mpsc;
use tokio_util::task::AbortOnDropHandle;

use crate::node_labels::{Labeler, Relabel, send};

/// Patches in flight at once, at most.
const IN_FLIGHT: usize = 8;

/// The labels kept while leading (nothing when off).
pub(super) struct Relabels {
    labeler: Option<Labeler>,
    tx: mpsc::UnboundedSender<Relabel>,
    failed: mpsc::UnboundedReceiver<Relabel>,
    _sender: AbortOnDropHandle<()>,
}

impl Relabels {
    pub(super) fn new(client: kube::Client, on: bool) -> Self {
        let (tx, rx) = mpsc::unbounded_channel::<Relabel>();
        let (failed_tx, failed) = mpsc::unbounded_channel();
        let sender = tokio::spawn(async move {
            stream_of(rx)
                .map(|r| {
                    let client = client.clone();
                    async move {
                        let sent = send(&client, &r).await;
                        (r, sent)
                    }
                })
                .buffer_unordered(IN_FLIGHT)
                .for_each(|(r, sent)| {
                    match sent {
                        Ok(true) => {
                            tracing::debug!(kind = ?r.kind, namespace = %r.namespace, name = %r.name, "node labels set")
                        }
                        Ok(false) => {
                            let _ = failed_tx.send(r);
                        }
                        Err(e) => {
                            tracing::warn!(kind = ?r.kind, namespace = %r.namespace, name = %r.name, error = %e, "setting node labels failed; tried again on the object's next change");
                            let _ = failed_tx.send(r);
                        }
                    }
                    futures::future::ready(())
                })
                .await;
        });
        Self {
            labeler: on.then(Labeler::default),
            tx,
            failed,
            _sender: AbortOnDropHandle::new(sender),
        }
    }

    fn send(&mut self, out: Vec<Relabel>) {
        for r in out {
            let _ = self.tx.send(r);
        }
    }

    fn settle(&mut self) -> Option<&mut Labeler> {
        let labeler = self.labeler.as_mut()?;
        while let Ok(r) = self.failed.try_recv() {
            labeler.failed(&r);
        }
        Some(labeler)
    }

    pub(super) fn instances(&mut self, c: &Change<Instance>) {
        if let Some(l) = self.settle() {
            let out = l.instances(c);
            self.send(out);
        }
    }

    pub(super) fn claims(&mut self, c: &Change<SlotClaim>) {
        if let Some(l) = self.settle() {
            let out = l.claims(c);
            self.send(out);
        }
    }

    pub(super) fn reservations(&mut self, c: &Change<Reservation>) {
        if let Some(l) = self.settle() {
            let out = l.reservations(c);
            self.send(out);
        }
    }

    /// Labels a Reservation about to be created with its decision.
    pub(super) fn label_held(&self, r: &mut Reservation) {
        if let Some(l) = &self.labeler {
            l.label_held(r);
        }
    }
}

/// The receiver as a stream.
fn stream_of<T: Send + 'static>(
    mut rx: mpsc::UnboundedReceiver<T>,
) -> impl futures::Stream<Item = T> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}
