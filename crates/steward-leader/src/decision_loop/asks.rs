//! The direct path's asks inside the decision loop: held until the ledger
//! is built, decided at once where they can be (a rejection answered
//! without a write, a new pod's reservation proposed and created with its
//! decision), otherwise written the two-write way off the loop; and each
//! answered by the first object that decides it.

use std::collections::HashSet;
use std::time::Duration;

use kube::Api;
use steward_api::{RESERVATION_DECIDED_VERSION, Reservation, ReservationSpec};
use steward_core::reservation::reservation_name;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::now;
use crate::cluster_picture::{ClusterPicture, Write};
use crate::direct::pending::{Ask, Outcome, Pending};
use steward_reservations::ask::{self, Current, Target, Written};

/// How often an ask's Reservation is written again after losing a write
/// race (409) before the ask is answered with the error.
const WRITE_ATTEMPTS: usize = 8;

/// How long a proposal waits for its pod's first event before its asks
/// are written the two-write way.
const POD_WAIT: Duration = Duration::from_secs(5);

/// How long asks are written the two-write way after the API server did
/// not serve the version a decided create goes through.
const UNSERVED_BACKOFF: Duration = Duration::from_secs(60);

/// What writing an ask off the loop came to: the ask, the result, and the
/// picture's relist count when it was sent.
pub(super) type AskResult = (Ask, Result<Written, kube::Error>, u64);

/// The asks the loop holds.
pub(super) struct Asks {
    client: kube::Client,
    /// Asks waiting for the decision of their Reservation.
    pending: Pending,
    /// Asks taken in this iteration (after the watch events already
    /// waiting), or held while the ledger is not built: nothing is decided
    /// before then, so they wait for it rather than be written the
    /// two-write way.
    held: Vec<Ask>,
    /// New pods' asks proposed and not created yet, with when: each is
    /// created with its decision (once its pod is seen), or asked again
    /// the two-write way.
    proposals: Vec<(ReservationSpec, Instant)>,
    /// Until when asks are written the two-write way only: the API server
    /// did not serve the version a decided create goes through (CRDs older
    /// than this controller).
    two_writes_until: Option<Instant>,
    /// Where asks written off the loop report back.
    results: mpsc::UnboundedSender<AskResult>,
}

impl Asks {
    pub(super) fn new(client: kube::Client, results: mpsc::UnboundedSender<AskResult>) -> Self {
        Self {
            client,
            pending: Pending::default(),
            held: Vec::new(),
            proposals: Vec::new(),
            two_writes_until: None,
            results,
        }
    }

    /// An ask from the endpoint, taken by [`Asks::take_held`].
    pub(super) fn hold(&mut self, a: Ask) {
        self.held.push(a);
    }

    /// Whether asks wait to be taken.
    pub(super) fn held(&self) -> bool {
        !self.held.is_empty()
    }

    /// Takes the held asks once the ledger is built (see [`Asks::take`]).
    pub(super) fn take_held(&mut self, picture: &mut ClusterPicture) {
        if !picture.kept() {
            return;
        }
        for a in std::mem::take(&mut self.held) {
            if !a.reply.is_closed() {
                self.take(picture, a);
            }
        }
    }

    /// A new pod's ask (the picture shows no Reservation for it) is
    /// decided at once: a rejection is answered from the kept ledger
    /// without a write (it holds nothing, and the scheduler retries the
    /// pod, each retry asking again); a reservation is proposed and created
    /// with its decision in this batch, one write. Only what holds capacity
    /// is persisted. Any other ask is written off the loop
    /// ([`Asks::write`]).
    fn take(&mut self, picture: &mut ClusterPicture, a: Ask) {
        // The endpoint checked it already; whatever hands the loop an ask,
        // nothing out of bounds reaches the ledger.
        if let Err(e) = steward_reservations::bounds::check(&a.spec) {
            let _ = a.reply.send(Outcome::Refused(e.to_string()));
            return;
        }
        let ns = a.spec.pod.namespace.clone();
        let rname = reservation_name(&ns, &a.spec.pod.name);
        if picture.proposed(&ns, &rname) {
            // Asked again before its create (its pod not seen yet): the
            // same ask is answered with it; another is refused meanwhile.
            let same = picture
                .reservation(&ns, &rname)
                .is_some_and(|p| ask::same_ask(&p.spec, &a.spec));
            if same {
                self.pending
                    .wait(a.spec.pod.uid.clone(), Target::default(), a.reply);
            } else {
                let _ = a.reply.send(Outcome::Failed(
                    "the pod's previous ask is still being written; ask again".into(),
                ));
            }
            return;
        }
        let Some(seen) = picture.reservation(&ns, &rname).cloned() else {
            if let Some(status) = picture.rejection(&a.spec, now()) {
                let mut r = Reservation::new(&rname, a.spec);
                r.metadata.namespace = Some(ns);
                r.status = Some(status);
                let _ = a.reply.send(Outcome::Rejected(Box::new(r)));
                return;
            }
            let one_write = self.two_writes_until.is_none_or(|t| t <= Instant::now());
            if one_write && picture.propose(&a.spec) {
                // Answered by the object its create returns (generation 1).
                self.pending
                    .wait(a.spec.pod.uid.clone(), Target::default(), a.reply);
                self.proposals.push((a.spec, Instant::now()));
            } else {
                self.write(picture, a, Current::Absent);
            }
            return;
        };
        self.write(picture, a, Current::Seen(Box::new(seen)));
    }

    /// Writes an ask's Reservation (create or renew, as the extender
    /// would), off the loop: the result comes back as an [`AskResult`],
    /// to be decided in a later batch.
    fn write(&self, picture: &ClusterPicture, a: Ask, mut current: Current) {
        let relists = picture.relists();
        let ns = a.spec.pod.namespace.clone();
        let rname = reservation_name(&ns, &a.spec.pod.name);
        let api = Api::<Reservation>::namespaced(self.client.clone(), &ns);
        let done = self.results.clone();
        tokio::spawn(async move {
            let mut attempt = 0;
            let result = loop {
                attempt += 1;
                match ask::write(&api, &rname, &a.spec, current).await {
                    Err(kube::Error::Api(e)) if e.code == 409 && attempt < WRITE_ATTEMPTS => {
                        tracing::debug!(reservation = %rname, attempt, "Reservation changed meanwhile; writing the ask again");
                        current = Current::Unknown;
                    }
                    r => break r,
                }
            };
            // The loop is gone (no longer leading): the ask's caller hears
            // so when its reply is dropped.
            let _ = done.send((a, result, relists));
        });
    }

    /// An ask's Reservation is written: the object goes into the picture
    /// (its pod is decided in this batch) and the ask waits for the
    /// decision.
    pub(super) fn written(
        &mut self,
        picture: &mut ClusterPicture,
        (a, result, relists): AskResult,
    ) {
        let uid = a.spec.pod.uid.clone();
        match result {
            Ok(Written::Answered(r)) => {
                let _ = a.reply.send(Outcome::Decided(r));
            }
            Ok(Written::Refused(why)) => {
                let _ = a.reply.send(Outcome::Refused(why));
            }
            Ok(Written::Wait { target, written }) => {
                self.pending.wait(uid.clone(), target, a.reply);
                let applied = written.is_some_and(|w| picture.written_ask(*w, relists, now()));
                if !applied {
                    // The picture shows this object already (its watch
                    // event came first, and it may be decided already) or
                    // the ask left it as it was: answer from it, and look
                    // at it again.
                    let ns = &a.spec.pod.namespace;
                    if let Some(r) = picture
                        .reservation(ns, &reservation_name(ns, &a.spec.pod.name))
                        .cloned()
                    {
                        self.pending.offer(&r);
                    }
                    picture.unwritten(&uid);
                }
            }
            Err(kube::Error::Api(e)) if e.code == 422 => {
                let _ = a
                    .reply
                    .send(Outcome::Refused(steward_reservations::ask::api_refused(
                        &e.message,
                    )));
            }
            Err(e) => {
                let _ = a.reply.send(Outcome::Failed(format!(
                    "writing the pod's Reservation failed: {e}"
                )));
            }
        }
    }

    /// A Reservation as watched: into the picture, and to the asks it
    /// answers.
    pub(super) fn seen(
        &mut self,
        picture: &mut ClusterPicture,
        c: steward_kube::Change<Reservation>,
    ) {
        if let steward_kube::Change::Applied(r) = &c
            && self.pending.wants(&r.spec.pod.uid)
        {
            self.pending.offer(r);
        }
        picture.reservations(c);
    }

    /// A Reservation as this controller's write returned it.
    pub(super) fn own(&mut self, picture: &mut ClusterPicture, r: Reservation) {
        if self.pending.wants(&r.spec.pod.uid) {
            self.pending.offer(&r);
        }
        picture.written(r, now());
    }

    /// Answers the asks of proposal `w` when it is a rejection, and drops
    /// the proposal; whether it was one (a rejection holds nothing: it is
    /// not written).
    pub(super) fn unwritten_rejection(&mut self, picture: &mut ClusterPicture, w: &Write) -> bool {
        if !w.creates() || w.object.status.as_ref().map(|s| s.phase.as_str()) != Some("Rejected") {
            return false;
        }
        picture.retract(&w.namespace, &w.name);
        for reply in self.pending.take(&w.object.spec.pod.uid) {
            let _ = reply.send(Outcome::Rejected(Box::new(w.object.clone())));
        }
        true
    }

    /// A decided create found its version not served: asks are written
    /// the two-write way for a while.
    pub(super) fn unserved(&mut self) {
        if self.two_writes_until.is_none_or(|t| t <= Instant::now()) {
            tracing::warn!(
                version = RESERVATION_DECIDED_VERSION,
                "the API server does not serve this Reservation version: the CRDs are older than this controller (apply this release's CRDs); writing each ask and its decision apart for a minute"
            );
        }
        self.two_writes_until = Some(Instant::now() + UNSERVED_BACKOFF);
    }

    /// After a batch's writes (`landed`: the pods whose write landed): a
    /// proposal whose create did not land (another writer's object was
    /// there first, the API failed) or was never sent (a relist came
    /// first, its pod has not come in time) is dropped, releasing what it
    /// held, and its asks are written the two-write way, which reads what
    /// is there. One whose pod is not seen yet waits for it while it is
    /// asked for.
    pub(super) fn settle_proposals(
        &mut self,
        picture: &mut ClusterPicture,
        landed: &HashSet<String>,
    ) {
        for (spec, since) in std::mem::take(&mut self.proposals) {
            let uid = spec.pod.uid.as_str();
            if landed.contains(uid) {
                continue;
            }
            let ns = spec.pod.namespace.clone();
            let rname = reservation_name(&ns, &spec.pod.name);
            if picture.proposed(&ns, &rname)
                && !picture.pod_seen(uid)
                && self.pending.wants(uid)
                && since.elapsed() < POD_WAIT
            {
                self.proposals.push((spec, since));
                continue;
            }
            picture.retract(&ns, &rname);
            for reply in self.pending.take(uid) {
                let a = Ask {
                    spec: spec.clone(),
                    reply,
                };
                self.write(picture, a, Current::Unknown);
            }
        }
    }

    /// Drops asks whose caller stopped waiting.
    pub(super) fn sweep(&mut self) {
        self.pending.sweep();
    }
}
