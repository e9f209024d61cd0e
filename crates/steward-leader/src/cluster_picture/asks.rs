//! Asks of the direct path decided in the loop, before anything is
//! written: a rejection answered without a write, and a new pod's
//! Reservation proposed so that its ask and its decision are persisted
//! in one create.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::ObjectMeta;
use steward_api::{Reservation, ReservationSpec, ReservationStatus};
use steward_core::Millis;
use steward_core::reservation::{Phase, reservation_name};
use steward_kube::{Change as Watch, ObjectKey};

use super::{ClusterPicture, Write};

impl Write {
    /// Whether this write creates its object: a Reservation proposed by
    /// [`ClusterPicture::propose`], written with its decision in one create
    /// (through the version without the status subresource). Every other
    /// write replaces the status of an object as read.
    pub fn creates(&self) -> bool {
        is_proposed(&self.object)
    }
}

/// A proposed object: not in the API yet (no uid).
fn is_proposed(r: &Reservation) -> bool {
    r.metadata.uid.is_none()
}

impl ClusterPicture {
    /// Whether `spec`'s ask can be decided here: the picture is ready and
    /// kept, nothing is held or asked for the pod yet, and the pod is
    /// pending and unbound (`unseen`: or not seen yet).
    fn decidable(&self, spec: &ReservationSpec, unseen: bool) -> bool {
        let uid = spec.pod.uid.as_str();
        self.ready()
            && !self.stale
            && !self.by_uid.contains_key(uid)
            && self.decider.reservation(uid).is_none()
            && self
                .pods
                .get(uid)
                .map_or(unseen, |p| p.ended.is_none() && p.node.is_none())
    }

    /// Whether pod `uid` has been seen (its watch brought it).
    pub fn pod_seen(&self, uid: &str) -> bool {
        self.pods.contains(uid)
    }

    /// What deciding `spec` now would say when that is a rejection, tried
    /// on the kept decider and forgotten: a rejection holds nothing, so it
    /// can be answered without being written. `None`: it would be
    /// reserved, or it cannot be tried here (the picture is not ready, the
    /// pod is not seen, ended or bound, or already has a Reservation).
    pub fn rejection(&mut self, spec: &ReservationSpec, now: Millis) -> Option<ReservationStatus> {
        if !self.decidable(spec, false) {
            return None;
        }
        let uid = spec.pod.uid.as_str();
        let asked = self.decider.request_with_cpus(
            spec.pod_ref(),
            spec.slots.clone(),
            spec.exclusive_cpus,
            spec.candidates.clone(),
            now,
        );
        let status = if asked.is_ok() {
            let _ = self.decider.decide(uid, now);
            self.decider
                .reservation(uid)
                .filter(|r| r.phase == Phase::Rejected)
                .map(|r| ReservationStatus::from_core(r, Some(1)))
        } else {
            None
        };
        let _ = self.decider.forget(uid);
        status
    }

    /// Takes `spec`'s ask as a Reservation not yet in the API, to be
    /// decided in the next reconcile like any other; that reconcile's
    /// write for it creates it with its status ([`Write::creates`]), so
    /// the ask and its decision cost one write. The slots it is given are
    /// held from then on: no other decision can take them while its create
    /// is in flight. Whether it was taken (see
    /// [`ClusterPicture::rejection`] for when an ask cannot be decided
    /// here; nor can one whose object the picture shows).
    ///
    /// A proposal whose pod is not seen yet is decided (and written) in the
    /// reconcile after its pod's first event, as any fresh ask waits for
    /// its pod. A proposal whose create did not land (or was not sent: a
    /// relist came first, or its pod never came) must be
    /// [`ClusterPicture::retract`]ed.
    pub fn propose(&mut self, spec: &ReservationSpec) -> bool {
        let ns = &spec.pod.namespace;
        let name = reservation_name(ns, &spec.pod.name);
        if !self.decidable(spec, true) || self.reservation(ns, &name).is_some() {
            return false;
        }
        let mut r = Reservation::new(&name, spec.clone());
        r.metadata = ObjectMeta {
            name: Some(name),
            namespace: Some(ns.clone()),
            // What the API server gives a new object: the status written
            // with it answers this generation.
            generation: Some(1),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Pod".into(),
                name: spec.pod.name.clone(),
                uid: spec.pod.uid.clone(),
                ..OwnerReference::default()
            }]),
            ..ObjectMeta::default()
        };
        self.apply_reservation(Watch::Applied(r));
        true
    }

    /// Whether Reservation `namespace`/`name` is a proposal not created yet.
    pub fn proposed(&self, namespace: &str, name: &str) -> bool {
        self.reservation(namespace, name).is_some_and(is_proposed)
    }

    /// Drops proposal `namespace`/`name` (its create failed, or was never
    /// sent): what it held is released in the next reconcile. An object
    /// the watch brought meanwhile under that name stays.
    pub fn retract(&mut self, namespace: &str, name: &str) {
        let key = ObjectKey::new(namespace, name);
        if let Some(r) = self
            .reservations
            .get(&key)
            .filter(|r| is_proposed(r))
            .cloned()
        {
            self.apply_reservation(Watch::Deleted(r));
        }
    }
}
