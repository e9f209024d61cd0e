//! The leader's side of the direct path: asks waiting for their decision.
//!
//! An ask is answered with the first Reservation object the leader writes
//! or sees that answers it: the awaited object ([`Target`]), decided for
//! its current spec ([`answered`]). Waiters whose caller went away are
//! dropped on the next look.

use std::collections::HashMap;

use steward_api::{Reservation, ReservationSpec};
use tokio::sync::oneshot;

use steward_reservations::ask::{Target, answered};

/// What the leader answers an ask with.
#[derive(Debug)]
pub enum Outcome {
    /// The pod's Reservation, decided for this ask.
    Decided(Box<Reservation>),
    /// Rejected by the kept ledger without a write: the Reservation as it
    /// would read (no object exists).
    Rejected(Box<Reservation>),
    /// Refused, with the reason in full: out of bounds
    /// ([`steward_reservations::bounds::check`]), the Reservation of the pod's name is
    /// another existing pod's, or the API server refused the Reservation
    /// as written (422).
    Refused(String),
    /// Reading or writing the Reservation failed.
    Failed(String),
}

/// One pod's ask, as the endpoint hands it to the decision loop.
#[derive(Debug)]
pub struct Ask {
    pub spec: ReservationSpec,
    pub reply: oneshot::Sender<Outcome>,
}

/// Asks waiting for a decision, by pod uid.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    by_uid: HashMap<String, Vec<(Target, oneshot::Sender<Outcome>)>>,
}

impl Pending {
    /// Waits for the decision of `target` for pod `uid`.
    pub(crate) fn wait(&mut self, uid: String, target: Target, reply: oneshot::Sender<Outcome>) {
        self.by_uid.entry(uid).or_default().push((target, reply));
    }

    /// Whether anything waits for pod `uid`.
    pub(crate) fn wants(&self, uid: &str) -> bool {
        self.by_uid.contains_key(uid)
    }

    /// Stops waiting for pod `uid`: the callers of its asks, to be asked
    /// again another way.
    pub(crate) fn take(&mut self, uid: &str) -> Vec<oneshot::Sender<Outcome>> {
        self.by_uid
            .remove(uid)
            .unwrap_or_default()
            .into_iter()
            .map(|(_, reply)| reply)
            .filter(|reply| !reply.is_closed())
            .collect()
    }

    /// How many asks wait.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.by_uid.values().map(Vec::len).sum()
    }

    /// Answers every ask `r` decides.
    pub(crate) fn offer(&mut self, r: &Reservation) {
        let uid = &r.spec.pod.uid;
        let Some(waiting) = self.by_uid.remove(uid) else {
            return;
        };
        let decided = answered(r);
        let mut left = Vec::new();
        for (target, reply) in waiting {
            if reply.is_closed() {
                continue;
            }
            if decided && target.matches(r) {
                let _ = reply.send(Outcome::Decided(Box::new(r.clone())));
            } else {
                left.push((target, reply));
            }
        }
        if !left.is_empty() {
            self.by_uid.insert(uid.clone(), left);
        }
    }

    /// Drops asks whose caller stopped waiting.
    pub(crate) fn sweep(&mut self) {
        self.by_uid.retain(|_, v| {
            v.retain(|(_, reply)| !reply.is_closed());
            !v.is_empty()
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use steward_api::{PodRef, ReservationStatus};

    fn object(uid: &str, generation: i64, status: Option<(&str, i64)>) -> Reservation {
        let mut r = Reservation::new(
            "p",
            ReservationSpec {
                pod: PodRef {
                    namespace: "ns".into(),
                    name: "p".into(),
                    uid: uid.into(),
                },
                slots: [("cam".to_owned(), 1)].into(),
                exclusive_cpus: 0,
                candidates: vec!["n1".into()],
                cancel: None,
            },
        );
        r.metadata.uid = Some("obj-1".into());
        r.metadata.generation = Some(generation);
        r.status = status.map(|(phase, observed)| ReservationStatus {
            phase: phase.into(),
            observed_generation: Some(observed),
            ..ReservationStatus::default()
        });
        r
    }

    #[test]
    fn only_a_decision_of_the_awaited_spec_answers() {
        let mut p = Pending::default();
        let (tx, mut rx) = oneshot::channel();
        p.wait("u".into(), Target::of(&object("u", 2, None)), tx);
        // The older spec's decision, a Requested status, another pod: no.
        p.offer(&object("u", 1, Some(("Reserved", 1))));
        p.offer(&object("u", 2, Some(("Requested", 2))));
        p.offer(&object("v", 2, Some(("Reserved", 2))));
        p.offer(&object("u", 2, Some(("Reserved", 1))));
        assert!(rx.try_recv().is_err());
        assert_eq!(p.len(), 1);
        p.offer(&object("u", 2, Some(("Rejected", 2))));
        match rx.try_recv().unwrap() {
            Outcome::Decided(r) => assert_eq!(r.status.unwrap().phase, "Rejected"),
            other => panic!("{other:?}"),
        }
        assert_eq!(p.len(), 0);
        assert!(!p.wants("u"));
    }

    #[test]
    fn a_caller_that_left_is_dropped() {
        let mut p = Pending::default();
        let (tx, rx) = oneshot::channel();
        p.wait("u".into(), Target::default(), tx);
        drop(rx);
        p.sweep();
        assert!(!p.wants("u"));
    }
}
