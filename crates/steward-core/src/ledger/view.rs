//! The node view: one record of what every pod on the node holds, merged
//! from the sources that decide it, and the ordered stream of changes.
//!
//! Each source ([`Source`]) reports its own record of a pod; the view merges
//! them ([`super::assignment::merge`]) and emits an event whenever a pod's
//! merged state changes, carrying the pod's whole state (no diff, no
//! history). Events are ordered so that **the state after every event keeps
//! the capacity invariants**: no device and no exclusive CPU is ever shown
//! held by two pods at once. When one change moves a device from pod A to
//! pod B, A's event (DELETED, or UPDATED without the device) is emitted
//! strictly before B's. When two pods swap devices, one of them is first
//! shown holding only what it keeps. When a source reports a pod holding
//! something another pod still holds and nothing releases it, the newer
//! report wins and the older holder is shown without it first.
//!
//! Folding the events after any point onto the [`NodeView::list`] taken at
//! that point gives the list of every later point (property-tested).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

use super::assignment::{PodAssignments, Source, Token, merge};

/// How many deleted pod UIDs are remembered, so a lagging source cannot bring
/// a deleted pod back. Older ones are forgotten first.
pub const TOMBSTONES: usize = 4096;

/// What happened to a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Action {
    Added,
    Deleted,
    Updated,
}

/// One change of the view: the pod's whole merged state after it (for
/// [`Action::Deleted`], its last state).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodEvent {
    /// Position in the view's history; strictly increasing by one.
    pub seq: u64,
    pub action: Action,
    pub pod: PodAssignments,
}

/// The merged view of every pod on the node.
#[derive(Debug, Default, Clone)]
pub struct NodeView {
    records: BTreeMap<String, BTreeMap<Source, PodAssignments>>,
    merged: BTreeMap<String, PodAssignments>,
    by_name: BTreeMap<(String, String), String>,
    held: BTreeMap<Token, BTreeMap<String, bool>>,
    steward_resources: BTreeSet<String>,
    gone: BTreeSet<String>,
    gone_order: VecDeque<String>,
    seq: u64,
}

impl NodeView {
    pub fn new() -> Self {
        Self::default()
    }

    /// The sequence number of the last event (0 before any).
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Every pod, by UID.
    pub fn list(&self) -> impl Iterator<Item = &PodAssignments> {
        self.merged.values()
    }

    /// How many pods the view holds.
    pub fn len(&self) -> usize {
        self.merged.len()
    }

    pub fn is_empty(&self) -> bool {
        self.merged.is_empty()
    }

    /// The pod `namespace/name`.
    pub fn get(&self, namespace: &str, name: &str) -> Option<&PodAssignments> {
        let uid = self
            .by_name
            .get(&(namespace.to_string(), name.to_string()))?;
        self.merged.get(uid)
    }

    /// The pod with `uid`.
    pub fn get_uid(&self, uid: &str) -> Option<&PodAssignments> {
        self.merged.get(uid)
    }

    /// The resource names steward's device plugins serve (they decide the
    /// devices of those names; see [`merge`]).
    pub fn set_steward_resources(&mut self, names: BTreeSet<String>) -> Vec<PodEvent> {
        if names == self.steward_resources {
            return Vec::new();
        }
        self.steward_resources = names;
        let all: BTreeSet<String> = self.records.keys().cloned().collect();
        self.settle(all)
    }

    /// `source`'s record of one pod, replacing its earlier one.
    pub fn upsert(&mut self, source: Source, pod: PodAssignments) -> Vec<PodEvent> {
        let uid = pod.uid().to_string();
        if self.gone.contains(&uid) {
            return Vec::new();
        }
        let entry = self.records.entry(uid.clone()).or_default();
        if entry.get(&source) == Some(&pod) {
            return Vec::new();
        }
        entry.insert(source, pod);
        self.settle(BTreeSet::from([uid]))
    }

    /// `source` no longer reports the pod `uid`.
    pub fn remove(&mut self, source: Source, uid: &str) -> Vec<PodEvent> {
        let Some(entry) = self.records.get_mut(uid) else {
            return Vec::new();
        };
        if entry.remove(&source).is_none() {
            return Vec::new();
        }
        if entry.is_empty() {
            self.records.remove(uid);
        }
        self.settle(BTreeSet::from([uid.to_string()]))
    }

    /// `source`'s whole report: pods it no longer names are removed from its
    /// record. Every change of the report is settled at once, so a device
    /// that moved between two pods of the report is released before it is
    /// shown acquired.
    pub fn replace(&mut self, source: Source, pods: Vec<PodAssignments>) -> Vec<PodEvent> {
        let mut changed = BTreeSet::new();
        let named: BTreeMap<String, PodAssignments> = pods
            .into_iter()
            .filter(|p| !self.gone.contains(p.uid()))
            .map(|p| (p.uid().to_string(), p))
            .collect();
        let stale: Vec<String> = self
            .records
            .iter()
            .filter(|(uid, r)| r.contains_key(&source) && !named.contains_key(*uid))
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in stale {
            if let Some(entry) = self.records.get_mut(&uid) {
                entry.remove(&source);
                if entry.is_empty() {
                    self.records.remove(&uid);
                }
            }
            changed.insert(uid);
        }
        for (uid, pod) in named {
            let entry = self.records.entry(uid.clone()).or_default();
            if entry.get(&source) != Some(&pod) {
                entry.insert(source, pod);
                changed.insert(uid);
            }
        }
        self.settle(changed)
    }

    /// The pod `uid` is gone from the node (deleted, or terminal): every
    /// source's record of it is dropped, and later reports of it (a lagging
    /// source) are ignored.
    pub fn pod_gone(&mut self, uid: &str) -> Vec<PodEvent> {
        if self.gone.insert(uid.to_string()) {
            self.gone_order.push_back(uid.to_string());
            while self.gone_order.len() > TOMBSTONES {
                if let Some(old) = self.gone_order.pop_front() {
                    self.gone.remove(&old);
                }
            }
        }
        if self.records.remove(uid).is_none() {
            return Vec::new();
        }
        self.settle(BTreeSet::from([uid.to_string()]))
    }

    /// Whether every pod's merged state is what its records call for (a
    /// check for tests: it holds after every operation).
    #[cfg(test)]
    pub(crate) fn is_settled(&self) -> bool {
        let uids: BTreeSet<&String> = self.records.keys().chain(self.merged.keys()).collect();
        uids.into_iter()
            .all(|uid| self.target(uid).as_ref() == self.merged.get(uid))
    }

    /// Brings the merged state of `changed` pods in line with their records,
    /// emitting events in an order that keeps the invariants.
    fn settle(&mut self, changed: BTreeSet<String>) -> Vec<PodEvent> {
        let mut pending: BTreeMap<String, Option<PodAssignments>> = BTreeMap::new();
        for uid in changed {
            let target = self.target(&uid);
            if target.as_ref() != self.merged.get(&uid) {
                pending.insert(uid, target);
            }
        }
        let mut events = Vec::new();
        while !pending.is_empty() {
            // 1. Every pod whose new state takes nothing another pod holds.
            let ready: Vec<String> = pending.keys().cloned().collect();
            let mut progressed = false;
            for uid in ready {
                let free = match pending.get(&uid) {
                    Some(Some(target)) => self.blockers(&uid, target).is_empty(),
                    Some(None) => true,
                    None => false,
                };
                if free && let Some(target) = pending.remove(&uid) {
                    self.emit(&uid, target, &mut events);
                    progressed = true;
                }
            }
            if progressed {
                continue;
            }
            // 2. Release before acquire: show a pending pod holding only what
            //    it keeps (breaks swaps).
            let shrink = pending.iter().find_map(|(uid, target)| {
                let current = self.merged.get(uid)?;
                let mid = current.shrunk_to(target.as_ref());
                (mid != *current).then(|| (uid.clone(), mid))
            });
            if let Some((uid, mid)) = shrink {
                self.emit(&uid, Some(mid), &mut events);
                continue;
            }
            // 3. Someone holds what a pending pod wants and nothing releases
            //    it: the newer report wins, the older holder loses it.
            let Some((uid, Some(target))) =
                pending.iter().next().map(|(u, t)| (u.clone(), t.clone()))
            else {
                break;
            };
            for (holder, tokens) in self.blockers(&uid, &target) {
                self.evict(&holder, &tokens, &mut pending, &mut events);
            }
        }
        events
    }

    /// The merged state the records of `uid` call for.
    fn target(&self, uid: &str) -> Option<PodAssignments> {
        let records = self.records.get(uid)?;
        let refs: BTreeMap<Source, &PodAssignments> =
            records.iter().map(|(s, p)| (*s, p)).collect();
        merge(&refs, &self.steward_resources)
    }

    /// The pods (other than `uid`) holding tokens `target` wants, with those
    /// tokens.
    fn blockers(&self, uid: &str, target: &PodAssignments) -> BTreeMap<String, BTreeSet<Token>> {
        let mut out: BTreeMap<String, BTreeSet<Token>> = BTreeMap::new();
        for (token, exclusive) in target.tokens() {
            let Some(holders) = self.held.get(&token) else {
                continue;
            };
            for (holder, holder_exclusive) in holders {
                let conflict = match token {
                    Token::Device(..) => true,
                    Token::Cpu(_) => exclusive || *holder_exclusive,
                };
                if holder != uid && conflict {
                    out.entry(holder.clone()).or_default().insert(token.clone());
                }
            }
        }
        out
    }

    /// Drops `tokens` from every record of `holder` and shows it without them.
    fn evict(
        &mut self,
        holder: &str,
        tokens: &BTreeSet<Token>,
        pending: &mut BTreeMap<String, Option<PodAssignments>>,
        events: &mut Vec<PodEvent>,
    ) {
        if let Some(records) = self.records.get_mut(holder) {
            for record in records.values_mut() {
                record.remove_tokens(tokens);
            }
        }
        if let Some(Some(target)) = pending.get_mut(holder) {
            target.remove_tokens(tokens);
        }
        if let Some(current) = self.merged.get(holder) {
            let mut shown = current.clone();
            if shown.remove_tokens(tokens) {
                self.emit(holder, Some(shown), events);
            }
        }
    }

    /// Makes `state` the merged state of `uid` and records the event.
    fn emit(&mut self, uid: &str, state: Option<PodAssignments>, events: &mut Vec<PodEvent>) {
        let previous = self.merged.get(uid).cloned();
        if previous == state {
            return;
        }
        if let Some(prev) = &previous {
            for token in prev.tokens().into_keys() {
                if let Some(holders) = self.held.get_mut(&token) {
                    holders.remove(uid);
                    if holders.is_empty() {
                        self.held.remove(&token);
                    }
                }
            }
            self.by_name
                .remove(&(prev.pod.namespace.clone(), prev.pod.name.clone()));
        }
        let (action, pod) = match (previous, state) {
            (None, Some(now)) => (Action::Added, now),
            (Some(_), Some(now)) => (Action::Updated, now),
            (Some(last), None) => (Action::Deleted, last),
            (None, None) => return,
        };
        if action == Action::Deleted {
            self.merged.remove(uid);
        } else {
            for (token, exclusive) in pod.tokens() {
                self.held
                    .entry(token)
                    .or_default()
                    .insert(uid.to_string(), exclusive);
            }
            self.by_name.insert(
                (pod.pod.namespace.clone(), pod.pod.name.clone()),
                uid.to_string(),
            );
            self.merged.insert(uid.to_string(), pod.clone());
        }
        self.seq += 1;
        events.push(PodEvent {
            seq: self.seq,
            action,
            pod,
        });
    }
}

/// Applies `event` to a client's copy of the view (a map by UID): what a
/// watcher does with each event.
pub fn fold(view: &mut BTreeMap<String, PodAssignments>, event: &PodEvent) {
    match event.action {
        Action::Added | Action::Updated => {
            view.insert(event.pod.uid().to_string(), event.pod.clone());
        }
        Action::Deleted => {
            view.remove(event.pod.uid());
        }
    }
}
