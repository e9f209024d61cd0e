//! The leader keeps the node-membership labels
//! ([`steward_api::node_label_key`]) true, so that each agent can watch
//! only the objects of the Instances its node sees:
//!
//! * an Instance carries exactly the labels of its `spec.nodes`;
//! * a SlotClaim carries at least those of its Instance's nodes;
//! * a Reserved Reservation carries at least those of the nodes of every
//!   Instance it holds slots of.
//!
//! Their writers label them as they write them (the agents their Instances
//! and claims, the leader the Reservations it creates); this fixes the rest:
//! objects written before the labels existed, a node joining a shared
//! Instance (its claims and reservations gain the node), a Reservation
//! decided on the two-write path. Labels are only added to claims and
//! Reservations, never removed: a node that stops seeing an Instance does
//! not need to stop seeing its claims, and one that still does must never
//! miss one.
//!
//! [`Labeler`] is pure: it folds the leader's watch changes in and says
//! which patches to send; [`send`] sends one, conditional on the
//! resourceVersion it was computed from (a conflict is left to the next
//! watch event, which looks again).

use std::collections::{BTreeMap, BTreeSet};

use kube::api::{Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use serde_json::{Map, Value, json};
use steward_api::{
    Instance, NODE_LABEL_PREFIX, Reservation, SlotClaim, extra_node_labels, missing_node_labels,
};
use steward_core::slots::parse_slot_id;
use steward_kube::Change;

/// The kind of object a [`Relabel`] patches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Instance,
    SlotClaim,
    Reservation,
}

/// One metadata patch: labels to set (`Some`) or remove (`None`), under
/// the resourceVersion they were computed from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relabel {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
    pub resource_version: String,
    pub labels: BTreeMap<String, Option<String>>,
}

type Key = (String, String);

/// What the labels depend on, as the leader's watches show it.
#[derive(Debug, Default)]
pub struct Labeler {
    /// Instance name → its nodes (Instances are named cluster-wide, as
    /// slot ids name them).
    nodes: BTreeMap<String, BTreeSet<String>>,
    instances: BTreeMap<Key, Instance>,
    claims: BTreeMap<Key, SlotClaim>,
    reservations: BTreeMap<Key, Reservation>,
    /// Instance name → the claims and reservations that depend on it.
    claims_of: BTreeMap<String, BTreeSet<Key>>,
    reservations_of: BTreeMap<String, BTreeSet<Key>>,
    /// Patches sent and not yet seen back, by object and resourceVersion.
    sent: BTreeSet<(Kind, Key, String)>,
}

fn key<K: Resource>(o: &K) -> Key {
    (o.namespace().unwrap_or_default(), o.name_any())
}

/// The Instances a Reservation holds slots of, while it is Reserved.
fn held(r: &Reservation) -> BTreeSet<String> {
    r.status
        .iter()
        .filter(|s| s.phase == "Reserved")
        .flat_map(|s| s.slots.iter())
        .filter_map(|slot| parse_slot_id(slot).map(|(i, _)| i.to_owned()))
        .collect()
}

impl Labeler {
    /// Folds an Instance change in; the patches it calls for.
    pub fn instances(&mut self, change: &Change<Instance>) -> Vec<Relabel> {
        let mut touched = BTreeSet::new();
        match change {
            Change::Relisted(all) => {
                self.instances = all.iter().map(|i| (key(i), i.clone())).collect();
                self.nodes = all
                    .iter()
                    .map(|i| (i.name_any(), i.spec.nodes.iter().cloned().collect()))
                    .collect();
                touched.extend(self.nodes.keys().cloned());
            }
            Change::Applied(i) => {
                let nodes: BTreeSet<String> = i.spec.nodes.iter().cloned().collect();
                if self.nodes.get(&i.name_any()) != Some(&nodes) {
                    touched.insert(i.name_any());
                }
                self.nodes.insert(i.name_any(), nodes);
                self.instances.insert(key(i), i.clone());
                let mut out = Vec::new();
                out.extend(self.check_instance(&key(i)));
                for name in touched {
                    out.extend(self.dependents(&name));
                }
                return out;
            }
            Change::Deleted(i) => {
                self.instances.remove(&key(i));
                self.nodes.remove(&i.name_any());
                return Vec::new();
            }
            Change::Interrupted(_) => return Vec::new(),
        }
        let mut out: Vec<Relabel> = self
            .instances
            .keys()
            .cloned()
            .collect::<Vec<_>>()
            .iter()
            .filter_map(|k| self.check_instance(k))
            .collect();
        for name in touched {
            out.extend(self.dependents(&name));
        }
        out
    }

    /// Folds a SlotClaim change in; the patches it calls for.
    pub fn claims(&mut self, change: &Change<SlotClaim>) -> Vec<Relabel> {
        match change {
            Change::Relisted(all) => {
                self.claims.clear();
                self.claims_of.clear();
                for c in all {
                    self.put_claim(c);
                }
                let keys: Vec<Key> = self.claims.keys().cloned().collect();
                keys.iter().filter_map(|k| self.check_claim(k)).collect()
            }
            Change::Applied(c) => {
                self.put_claim(c);
                self.check_claim(&key(c)).into_iter().collect()
            }
            Change::Deleted(c) => {
                self.claims.remove(&key(c));
                if let Some(set) = self.claims_of.get_mut(&c.spec.instance) {
                    set.remove(&key(c));
                }
                Vec::new()
            }
            Change::Interrupted(_) => Vec::new(),
        }
    }

    /// Folds a Reservation change in; the patches it calls for.
    pub fn reservations(&mut self, change: &Change<Reservation>) -> Vec<Relabel> {
        match change {
            Change::Relisted(all) => {
                self.reservations.clear();
                self.reservations_of.clear();
                for r in all {
                    self.put_reservation(r);
                }
                let keys: Vec<Key> = self.reservations.keys().cloned().collect();
                keys.iter()
                    .filter_map(|k| self.check_reservation(k))
                    .collect()
            }
            Change::Applied(r) => {
                self.put_reservation(r);
                self.check_reservation(&key(r)).into_iter().collect()
            }
            Change::Deleted(r) => {
                self.reservations.remove(&key(r));
                for i in held(r) {
                    if let Some(set) = self.reservations_of.get_mut(&i) {
                        set.remove(&key(r));
                    }
                }
                Vec::new()
            }
            Change::Interrupted(_) => Vec::new(),
        }
    }

    /// The labels a Reservation the leader is about to create needs.
    pub fn label_held(&self, r: &mut Reservation) {
        let nodes: BTreeSet<String> = held(r)
            .iter()
            .filter_map(|i| self.nodes.get(i))
            .flatten()
            .cloned()
            .collect();
        steward_api::add_node_labels(&mut r.metadata, &nodes);
    }

    /// A patch sent failed: it may be computed again.
    pub fn failed(&mut self, r: &Relabel) {
        self.sent.remove(&(
            r.kind,
            (r.namespace.clone(), r.name.clone()),
            r.resource_version.clone(),
        ));
    }

    fn put_claim(&mut self, c: &SlotClaim) {
        self.claims_of
            .entry(c.spec.instance.clone())
            .or_default()
            .insert(key(c));
        self.claims.insert(key(c), c.clone());
    }

    fn put_reservation(&mut self, r: &Reservation) {
        if let Some(old) = self.reservations.get(&key(r)) {
            for i in held(old) {
                if let Some(set) = self.reservations_of.get_mut(&i) {
                    set.remove(&key(r));
                }
            }
        }
        for i in held(r) {
            self.reservations_of.entry(i).or_default().insert(key(r));
        }
        self.reservations.insert(key(r), r.clone());
    }

    fn dependents(&mut self, instance: &str) -> Vec<Relabel> {
        let claims: Vec<Key> = self
            .claims_of
            .get(instance)
            .into_iter()
            .flatten()
            .cloned()
            .collect();
        let reservations: Vec<Key> = self
            .reservations_of
            .get(instance)
            .into_iter()
            .flatten()
            .cloned()
            .collect();
        let mut out: Vec<Relabel> = claims.iter().filter_map(|k| self.check_claim(k)).collect();
        out.extend(
            reservations
                .iter()
                .filter_map(|k| self.check_reservation(k)),
        );
        out
    }

    fn check_instance(&mut self, k: &Key) -> Option<Relabel> {
        let i = self.instances.get(k)?;
        let mut labels: BTreeMap<String, Option<String>> =
            missing_node_labels(&i.metadata, &i.spec.nodes)
                .into_iter()
                .map(|(k, v)| (k, Some(v)))
                .collect();
        labels.extend(
            extra_node_labels(&i.metadata, &i.spec.nodes)
                .into_iter()
                .map(|k| (k, None)),
        );
        let rv = i.metadata.resource_version.clone();
        self.relabel(Kind::Instance, k, rv, labels)
    }

    fn check_claim(&mut self, k: &Key) -> Option<Relabel> {
        let c = self.claims.get(k)?;
        let nodes = self.nodes.get(&c.spec.instance)?;
        let labels = missing_node_labels(&c.metadata, nodes)
            .into_iter()
            .map(|(k, v)| (k, Some(v)))
            .collect();
        let rv = c.metadata.resource_version.clone();
        self.relabel(Kind::SlotClaim, k, rv, labels)
    }

    fn check_reservation(&mut self, k: &Key) -> Option<Relabel> {
        let r = self.reservations.get(k)?;
        let nodes: BTreeSet<String> = held(r)
            .iter()
            .filter_map(|i| self.nodes.get(i))
            .flatten()
            .cloned()
            .collect();
        let labels = missing_node_labels(&r.metadata, &nodes)
            .into_iter()
            .map(|(k, v)| (k, Some(v)))
            .collect();
        let rv = r.metadata.resource_version.clone();
        self.relabel(Kind::Reservation, k, rv, labels)
    }

    fn relabel(
        &mut self,
        kind: Kind,
        k: &Key,
        rv: Option<String>,
        labels: BTreeMap<String, Option<String>>,
    ) -> Option<Relabel> {
        let rv = rv?;
        if labels.is_empty() || !self.sent.insert((kind, k.clone(), rv.clone())) {
            return None;
        }
        // Forget what was sent for older versions of this object.
        self.sent
            .retain(|(kd, key, v)| !(*kd == kind && key == k && *v != rv));
        Some(Relabel {
            kind,
            namespace: k.0.clone(),
            name: k.1.clone(),
            resource_version: rv,
            labels,
        })
    }
}

/// Sends one relabel: a JSON merge patch of the labels, conditional on the
/// resourceVersion (`Ok(false)`: the object changed or went first).
pub async fn send(client: &kube::Client, r: &Relabel) -> Result<bool, kube::Error> {
    let labels: Map<String, Value> = r
        .labels
        .iter()
        .map(|(k, v)| (k.clone(), v.clone().map_or(Value::Null, Value::String)))
        .collect();
    debug_assert!(labels.keys().all(|k| k.starts_with(NODE_LABEL_PREFIX)));
    let patch = json!({"metadata": {"resourceVersion": r.resource_version, "labels": labels}});
    let pp = PatchParams::default();
    let done = match r.kind {
        Kind::Instance => Api::<Instance>::namespaced(client.clone(), &r.namespace)
            .patch(&r.name, &pp, &Patch::Merge(&patch))
            .await
            .map(drop),
        Kind::SlotClaim => Api::<SlotClaim>::namespaced(client.clone(), &r.namespace)
            .patch(&r.name, &pp, &Patch::Merge(&patch))
            .await
            .map(drop),
        Kind::Reservation => Api::<Reservation>::namespaced(client.clone(), &r.namespace)
            .patch(&r.name, &pp, &Patch::Merge(&patch))
            .await
            .map(drop),
    };
    match done {
        Ok(()) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::collections::BTreeMap;

    use steward_api::{
        InstanceSpec, PodRef, ReservationSpec, ReservationStatus, SlotClaimSpec, node_label_key,
    };

    use super::*;

    fn instance(name: &str, nodes: &[&str], rv: &str) -> Instance {
        let mut i = Instance::new(
            name,
            InstanceSpec {
                configuration_name: "cams".into(),
                device_id: name.into(),
                shared: nodes.len() > 1,
                nodes: nodes.iter().map(|n| n.to_string()).collect(),
                capacity: 2,
                properties: BTreeMap::new(),
                mounts: Vec::new(),
                device_specs: Vec::new(),
                cdi_name: String::new(),
            },
        );
        i.metadata.namespace = Some("default".into());
        i.metadata.resource_version = Some(rv.into());
        i
    }

    fn claim(slot: u32, instance: &str, rv: &str) -> SlotClaim {
        let spec: SlotClaimSpec = serde_json::from_value(serde_json::json!({
            "instance": instance, "slot": slot, "node": "a", "epoch": 1, "since": 0
        }))
        .unwrap();
        let mut c = SlotClaim::new(&format!("{instance}-{slot}"), spec);
        c.metadata.namespace = Some("default".into());
        c.metadata.resource_version = Some(rv.into());
        c
    }

    fn reserved(name: &str, slots: &[&str], rv: &str) -> Reservation {
        let mut r = Reservation::new(
            name,
            ReservationSpec {
                pod: PodRef {
                    namespace: "default".into(),
                    name: name.into(),
                    uid: name.into(),
                },
                slots: [("cams".to_string(), 1)].into(),
                exclusive_cpus: 0,
                candidates: vec!["a".into()],
                cancel: None,
            },
        );
        r.metadata.namespace = Some("default".into());
        if !rv.is_empty() {
            r.metadata.resource_version = Some(rv.into());
        }
        r.status = Some(ReservationStatus {
            phase: "Reserved".into(),
            node: Some("a".into()),
            slots: slots.iter().map(|s| s.to_string()).collect(),
            ..ReservationStatus::default()
        });
        r
    }

    fn added(r: &Relabel) -> BTreeSet<String> {
        r.labels
            .iter()
            .filter(|(_, v)| v.is_some())
            .map(|(k, _)| k.clone())
            .collect()
    }

    fn keys(nodes: &[&str]) -> BTreeSet<String> {
        nodes.iter().map(|n| node_label_key(n)).collect()
    }

    #[test]
    fn unlabeled_objects_are_labeled_and_a_joining_node_reaches_every_dependent() {
        let mut l = Labeler::default();
        let out = l.instances(&Change::Relisted(vec![instance("cam", &["a", "b"], "1")]));
        assert_eq!(out.len(), 1);
        assert_eq!(added(&out[0]), keys(&["a", "b"]));
        let out = l.claims(&Change::Relisted(vec![claim(0, "cam", "2")]));
        assert_eq!(
            (out.len(), out[0].kind, added(&out[0])),
            (1, Kind::SlotClaim, keys(&["a", "b"]))
        );
        // The same version is not patched twice.
        assert!(l.claims(&Change::Applied(claim(0, "cam", "2"))).is_empty());
        let out = l.reservations(&Change::Applied(reserved("p", &["cam-1"], "3")));
        assert_eq!(added(&out[0]), keys(&["a", "b"]));
        // The patches come back on the watch: labeled, nothing more to do.
        let mut c = claim(0, "cam", "4");
        steward_api::add_node_labels(&mut c.metadata, &["a".to_string(), "b".to_string()]);
        assert!(l.claims(&Change::Applied(c)).is_empty());
        let mut r = reserved("p", &["cam-1"], "4");
        steward_api::add_node_labels(&mut r.metadata, &["a".to_string(), "b".to_string()]);
        assert!(l.reservations(&Change::Applied(r)).is_empty());

        // Node c joins: the Instance's labels, its claim's and its
        // reservation's each gain c.
        let mut joined = instance("cam", &["a", "b", "c"], "5");
        steward_api::add_node_labels(&mut joined.metadata, &["a".to_string(), "b".to_string()]);
        let out = l.instances(&Change::Applied(joined));
        let kinds: Vec<Kind> = out.iter().map(|r| r.kind).collect();
        assert_eq!(
            kinds,
            [Kind::Instance, Kind::SlotClaim, Kind::Reservation],
            "{out:?}"
        );
        for r in &out {
            assert!(added(r).contains(&node_label_key("c")), "{r:?}");
        }
    }

    #[test]
    fn an_instance_loses_the_label_of_a_node_that_left_and_its_claims_keep_theirs() {
        let mut l = Labeler::default();
        let mut i = instance("cam", &["a", "b"], "1");
        steward_api::set_node_labels(&mut i.metadata, &i.spec.nodes.clone());
        assert!(l.instances(&Change::Relisted(vec![i])).is_empty());
        let mut c = claim(0, "cam", "2");
        steward_api::add_node_labels(&mut c.metadata, &["a".to_string(), "b".to_string()]);
        assert!(l.claims(&Change::Relisted(vec![c])).is_empty());
        let mut left = instance("cam", &["a"], "3");
        steward_api::add_node_labels(&mut left.metadata, &["a".to_string(), "b".to_string()]);
        let out = l.instances(&Change::Applied(left));
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(out[0].kind, Kind::Instance);
        assert_eq!(out[0].labels, BTreeMap::from([(node_label_key("b"), None)]));
    }

    #[test]
    fn a_reservation_being_created_gets_the_nodes_of_what_it_holds() {
        let mut l = Labeler::default();
        l.instances(&Change::Relisted(vec![
            instance("cam", &["a", "b"], "1"),
            instance("mic", &["c"], "1"),
        ]));
        let mut r = reserved("p", &["cam-0", "mic-1"], "");
        l.label_held(&mut r);
        let labels: BTreeSet<String> = r.metadata.labels.unwrap().into_keys().collect();
        assert_eq!(labels, keys(&["a", "b", "c"]));
        // Not Reserved: nothing held, nothing labeled.
        let mut r = reserved("q", &["cam-0"], "");
        r.status.as_mut().unwrap().phase = "Rejected".into();
        l.label_held(&mut r);
        assert_eq!(r.metadata.labels, None);
    }
}
