//! What the node can hand out: every device per resource name with its NUMA
//! nodes, every allocatable CPU, and memory per NUMA node — merged from the
//! same sources as the pod view, with the changes as add / delete / update
//! sets.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::assignment::{MemoryAssignment, Source};
use super::view::Action;
use crate::cpu::CpuSet;

/// Allocatable resources as one source reports them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Allocatable {
    /// resource name → device id → NUMA nodes.
    #[serde(default)]
    pub devices: BTreeMap<String, BTreeMap<String, BTreeSet<i64>>>,
    #[serde(default)]
    pub cpus: CpuSet,
    /// One block per memory type and NUMA node set.
    #[serde(default)]
    pub memory: Vec<MemoryAssignment>,
}

impl Allocatable {
    pub fn is_empty(&self) -> bool {
        self.devices.values().all(BTreeMap::is_empty)
            && self.cpus.is_empty()
            && self.memory.is_empty()
    }
}

/// One change of what is allocatable: for [`Action::Added`] what appeared,
/// for [`Action::Deleted`] what went, for [`Action::Updated`] devices and
/// memory blocks whose topology or size changed (with their new values).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocatableEvent {
    pub seq: u64,
    pub action: Action,
    pub resources: Allocatable,
}

/// The merged allocatable resources of the node.
#[derive(Debug, Clone, Default)]
pub struct AllocatableView {
    records: BTreeMap<Source, Allocatable>,
    steward_resources: BTreeSet<String>,
    merged: Allocatable,
    seq: u64,
}

impl AllocatableView {
    pub fn new() -> Self {
        Self::default()
    }

    /// The merged allocatable resources.
    pub fn current(&self) -> &Allocatable {
        &self.merged
    }

    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The resource names steward's device plugins serve.
    pub fn set_steward_resources(&mut self, names: BTreeSet<String>) -> Vec<AllocatableEvent> {
        self.steward_resources = names;
        self.settle()
    }

    /// `source`'s whole report, replacing its earlier one.
    pub fn replace(&mut self, source: Source, report: Allocatable) -> Vec<AllocatableEvent> {
        if self.records.get(&source) == Some(&report) {
            return Vec::new();
        }
        self.records.insert(source, report);
        self.settle()
    }

    /// The same precedence as the pod view: steward's device plugins for the
    /// resource names they serve, kubelet for the others; CPUs and memory
    /// from the CRI resource manager's topology when it reports, else kubelet.
    fn merge(&self) -> Allocatable {
        let mut out = Allocatable::default();
        if let Some(k) = self.records.get(&Source::Kubelet) {
            for (name, devs) in &k.devices {
                if !self.steward_resources.contains(name) && !devs.is_empty() {
                    out.devices.insert(name.clone(), devs.clone());
                }
            }
            out.cpus = k.cpus.clone();
            out.memory = k.memory.clone();
        }
        if let Some(c) = self.records.get(&Source::Cri)
            && !(c.cpus.is_empty() && c.memory.is_empty())
        {
            out.cpus = c.cpus.clone();
            out.memory = c.memory.clone();
        }
        for source in [Source::Slots, Source::Dra] {
            if let Some(s) = self.records.get(&source) {
                for (name, devs) in &s.devices {
                    if !devs.is_empty() {
                        out.devices
                            .entry(name.clone())
                            .or_default()
                            .extend(devs.iter().map(|(id, numa)| (id.clone(), numa.clone())));
                    }
                }
            }
        }
        out.memory.sort();
        out
    }

    /// Emits what went first, then what changed, then what appeared, so a
    /// client never counts a device twice.
    fn settle(&mut self) -> Vec<AllocatableEvent> {
        let next = self.merge();
        let (added, deleted, updated) = diff(&self.merged, &next);
        self.merged = next;
        let mut events = Vec::new();
        for (action, resources) in [
            (Action::Deleted, deleted),
            (Action::Updated, updated),
            (Action::Added, added),
        ] {
            if !resources.is_empty() {
                self.seq += 1;
                events.push(AllocatableEvent {
                    seq: self.seq,
                    action,
                    resources,
                });
            }
        }
        events
    }
}

/// (added, deleted, updated) from `old` to `new`.
fn diff(old: &Allocatable, new: &Allocatable) -> (Allocatable, Allocatable, Allocatable) {
    let mut added = Allocatable::default();
    let mut deleted = Allocatable::default();
    let mut updated = Allocatable::default();
    let names: BTreeSet<&String> = old.devices.keys().chain(new.devices.keys()).collect();
    let empty = BTreeMap::new();
    for name in names {
        let before = old.devices.get(name).unwrap_or(&empty);
        let after = new.devices.get(name).unwrap_or(&empty);
        for (id, numa) in after {
            match before.get(id) {
                None => {
                    added
                        .devices
                        .entry(name.clone())
                        .or_default()
                        .insert(id.clone(), numa.clone());
                }
                Some(was) if was != numa => {
                    updated
                        .devices
                        .entry(name.clone())
                        .or_default()
                        .insert(id.clone(), numa.clone());
                }
                Some(_) => {}
            }
        }
        for (id, numa) in before {
            if !after.contains_key(id) {
                deleted
                    .devices
                    .entry(name.clone())
                    .or_default()
                    .insert(id.clone(), numa.clone());
            }
        }
    }
    added.cpus = new.cpus.difference(&old.cpus);
    deleted.cpus = old.cpus.difference(&new.cpus);
    let key = |m: &MemoryAssignment| (m.memory_type.clone(), m.numa_nodes.clone());
    let before: BTreeMap<_, _> = old.memory.iter().map(|m| (key(m), m)).collect();
    let after: BTreeMap<_, _> = new.memory.iter().map(|m| (key(m), m)).collect();
    for (k, m) in &after {
        match before.get(k) {
            None => added.memory.push((*m).clone()),
            Some(was) if was.size != m.size => updated.memory.push((*m).clone()),
            Some(_) => {}
        }
    }
    for (k, m) in &before {
        if !after.contains_key(k) {
            deleted.memory.push((*m).clone());
        }
    }
    (added, deleted, updated)
}

/// Applies an event to a client's copy of the allocatable resources.
pub fn fold_allocatable(view: &mut Allocatable, event: &AllocatableEvent) {
    let r = &event.resources;
    match event.action {
        Action::Added | Action::Updated => {
            for (name, devs) in &r.devices {
                view.devices
                    .entry(name.clone())
                    .or_default()
                    .extend(devs.iter().map(|(i, n)| (i.clone(), n.clone())));
            }
            view.cpus.union_with(&r.cpus);
            for m in &r.memory {
                view.memory
                    .retain(|x| (&x.memory_type, &x.numa_nodes) != (&m.memory_type, &m.numa_nodes));
                view.memory.push(m.clone());
            }
        }
        Action::Deleted => {
            for (name, devs) in &r.devices {
                if let Some(have) = view.devices.get_mut(name) {
                    for id in devs.keys() {
                        have.remove(id);
                    }
                    if have.is_empty() {
                        view.devices.remove(name);
                    }
                }
            }
            view.cpus.difference_with(&r.cpus);
            for m in &r.memory {
                view.memory
                    .retain(|x| (&x.memory_type, &x.numa_nodes) != (&m.memory_type, &m.numa_nodes));
            }
        }
    }
    view.memory.sort();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn devices(name: &str, ids: &[&str]) -> Allocatable {
        let mut a = Allocatable::default();
        a.devices.insert(
            name.to_string(),
            ids.iter()
                .map(|i| (i.to_string(), BTreeSet::from([0])))
                .collect(),
        );
        a
    }

    #[test]
    fn deletes_come_before_adds_and_fold_matches() {
        let mut view = AllocatableView::new();
        let mut client = Allocatable::default();
        for e in view.replace(Source::Slots, devices("steward.dev/cam", &["c0", "c1"])) {
            fold_allocatable(&mut client, &e);
        }
        let events = view.replace(Source::Slots, devices("steward.dev/cam", &["c1", "c2"]));
        let actions: Vec<Action> = events.iter().map(|e| e.action).collect();
        assert_eq!(actions, vec![Action::Deleted, Action::Added]);
        for e in &events {
            fold_allocatable(&mut client, e);
        }
        assert_eq!(&client, view.current());
        assert!(
            view.replace(Source::Slots, devices("steward.dev/cam", &["c1", "c2"]))
                .is_empty()
        );
    }

    #[test]
    fn kubelet_report_of_steward_names_is_ignored() {
        let mut view = AllocatableView::new();
        view.set_steward_resources(BTreeSet::from(["steward.dev/cam".to_string()]));
        view.replace(Source::Kubelet, devices("steward.dev/cam", &["stale"]));
        assert!(view.current().devices.is_empty());
        view.replace(Source::Kubelet, devices("vendor/gpu", &["g0"]));
        assert_eq!(view.current().devices.len(), 1);
    }
}
