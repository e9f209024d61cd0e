//! Property tests: a small simulated world (this node's kubelet, pods and
//! pod watch, the cluster with two other nodes, the local durable ledger,
//! restarts and API server outages) drives the ledger through random
//! interleavings, and the invariants of the issue are checked after every
//! step.
//!
//! World assumptions, as in the real system: kubelet offers Allocate only
//! Healthy devices it considers free (or the same pod's), frees a pod's
//! devices when the pod terminates and drops inactive pods' devices at its
//! next allocation; the adapter writes plans before committing, creates
//! cluster claims with optimistic concurrency, and queries pod resources
//! right after answering Allocate; the pod watch delivers within half the
//! pending timeout; other nodes claim only shared slots, only when the
//! cluster has no claim for them.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use proptest::prelude::*;

use super::*;
use crate::Millis;
use crate::ledger::{ClaimHold, ClaimRef, Holding, PodRef};

const NODE: &str = "node-a";
const OTHER_NODES: [&str; 2] = ["node-b", "node-c"];
const TIMEOUT: u64 = 10_000;
const WATCH_LATENCY: u64 = TIMEOUT / 2;
const SETTLE: u64 = 1_000;

fn config() -> SlotConfig {
    SlotConfig {
        pending_timeout_ms: TIMEOUT,
        settle_ms: SETTLE,
    }
}

fn instances() -> Vec<InstanceInfo> {
    [("cam-a", 2, true), ("usb-b", 2, false), ("gpu-c", 1, true)]
        .into_iter()
        .map(|(name, capacity, shared)| InstanceInfo {
            name: name.to_owned(),
            resource_name: format!("steward.dev/{name}"),
            capacity,
            shared,
            present: true,
            usable: true,
        })
        .collect()
}

const SHARED_SLOTS: [&str; 3] = ["cam-a-0", "cam-a-1", "gpu-c-0"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Crash {
    Never,
    AfterLocalWrite,
    AfterClusterWrite,
}

#[derive(Debug, Clone)]
enum Op {
    NewPod {
        instance: usize,
        count: usize,
        init_main: bool,
        crash: Crash,
    },
    Terminate(usize),
    Delete(usize),
    DeliverWatch(usize),
    PodResources,
    OtherClaim(usize),
    OtherRelease(usize),
    DeliverCluster(usize),
    Tick(u64),
    Restart,
    ClusterDown,
    ClusterUp,
    DeviceFlap(usize),
    /// The scheduler allocated a DRA claim `count` slots of an Instance
    /// (blind to device-plugin use) and kubelet prepares it.
    Prepare {
        instance: usize,
        count: usize,
        crash: Crash,
    },
    /// kubelet unprepares a claim it prepared (or tried to).
    Unprepare(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let crash = prop_oneof![
        8 => Just(Crash::Never),
        1 => Just(Crash::AfterLocalWrite),
        1 => Just(Crash::AfterClusterWrite),
    ];
    prop_oneof![
        5 => (0..3usize, 1..=2usize, any::<bool>(), crash).prop_map(
            |(instance, count, init_main, crash)| Op::NewPod { instance, count, init_main, crash }
        ),
        2 => (0..16usize).prop_map(Op::Terminate),
        2 => (0..16usize).prop_map(Op::Delete),
        3 => (1..4usize).prop_map(Op::DeliverWatch),
        1 => Just(Op::PodResources),
        2 => (0..6usize).prop_map(Op::OtherClaim),
        1 => (0..6usize).prop_map(Op::OtherRelease),
        2 => (1..3usize).prop_map(Op::DeliverCluster),
        2 => (1..(TIMEOUT * 3 / 2)).prop_map(Op::Tick),
        1 => Just(Op::Restart),
        1 => Just(Op::ClusterDown),
        1 => Just(Op::ClusterUp),
        1 => (0..3usize).prop_map(Op::DeviceFlap),
        3 => (0..3usize, 1..=2usize, crash_dra()).prop_map(
            |(instance, count, crash)| Op::Prepare { instance, count, crash }
        ),
        2 => (0..16usize).prop_map(Op::Unprepare),
    ]
}

fn crash_dra() -> impl Strategy<Value = Crash> {
    prop_oneof![
        8 => Just(Crash::Never),
        1 => Just(Crash::AfterLocalWrite),
        1 => Just(Crash::AfterClusterWrite),
    ]
}

/// A DRA ResourceClaim as kubelet sees it.
#[derive(Debug, Clone)]
struct SimClaim {
    uid: String,
    slots: Vec<String>,
    /// Prepare answered OK and not unprepared since.
    prepared: bool,
    /// kubelet checkpointed it before preparing: it unprepares it later
    /// whatever the prepare answered.
    checkpointed: bool,
}

#[derive(Debug, Clone)]
struct SimPod {
    uid: String,
    name: String,
    phase: PodPhase,
    /// Not deleted from the API.
    api_live: bool,
    /// kubelet admitted it and has not terminated it.
    active: bool,
    devices: Vec<String>,
    containers: Vec<String>,
    /// kubelet dropped its device assignment (inactive at a later allocation).
    released: bool,
}

#[derive(Debug, Clone)]
enum ClusterEvent {
    Put(Claim),
    Removed { slot: String, node: String },
}

struct Sim {
    now: u64,
    ledger: SlotAllocator,
    instances: Vec<InstanceInfo>,
    local: BTreeMap<String, Claim>,
    cluster: BTreeMap<String, Claim>,
    reachable: bool,
    pods: Vec<SimPod>,
    watch: VecDeque<(u64, PodInfo)>,
    cluster_events: VecDeque<ClusterEvent>,
    /// Other nodes' claims as told to the ledger.
    fed_others: BTreeMap<String, String>,
    next_other_pod: usize,
    claims: Vec<SimClaim>,
    trace: Vec<String>,
}

fn pod_info(p: &SimPod) -> PodInfo {
    PodInfo {
        uid: p.uid.clone(),
        namespace: "default".to_owned(),
        name: p.name.clone(),
        node: NODE.to_owned(),
        phase: p.phase,
        deleted: !p.api_live,
    }
}

impl Sim {
    fn new() -> Self {
        let input = RecoveryInput {
            instances: instances(),
            cluster: Some(Vec::new()),
            ..RecoveryInput::default()
        };
        let (ledger, effects) = SlotAllocator::recover(NODE, config(), input);
        assert!(effects.is_empty());
        Sim {
            now: 0,
            ledger,
            instances: instances(),
            local: BTreeMap::new(),
            cluster: BTreeMap::new(),
            reachable: true,
            pods: Vec::new(),
            watch: VecDeque::new(),
            cluster_events: VecDeque::new(),
            fed_others: BTreeMap::new(),
            next_other_pod: 0,
            claims: Vec::new(),
            trace: Vec::new(),
        }
    }

    fn instance_of(&self, slot: &str) -> &InstanceInfo {
        let name = parse_slot_id(slot).map(|(i, _)| i).unwrap_or_default();
        self.instances
            .iter()
            .find(|i| i.name == name)
            .unwrap_or_else(|| panic!("no instance for {slot}"))
    }

    // ----- stores --------------------------------------------------------

    fn local_write(&mut self, claim: &Claim) {
        assert_eq!(claim.node, NODE);
        if self
            .local
            .get(claim.slot())
            .is_none_or(|c| c.epoch <= claim.epoch)
        {
            self.local.insert(claim.slot().to_owned(), claim.clone());
        }
    }

    fn cluster_write(&mut self, claim: &Claim) {
        assert!(self.reachable, "cluster write while unreachable: {claim:?}");
        match self.cluster.get(claim.slot()) {
            Some(c) if c.node != NODE => {
                panic!("write of {claim:?} over another node's claim {c:?}")
            }
            Some(c) if c.epoch > claim.epoch => {}
            _ => {
                self.cluster.insert(claim.slot().to_owned(), claim.clone());
            }
        }
    }

    fn apply(&mut self, effects: Vec<Effect>) {
        for effect in effects {
            self.trace.push(format!("{effect:?}"));
            match effect {
                Effect::WriteClaim { claim, target } => {
                    if target.local() {
                        self.local_write(&claim);
                    }
                    if target.cluster() {
                        self.cluster_write(&claim);
                    }
                }
                Effect::DeleteClaim {
                    slot,
                    epoch,
                    target,
                } => {
                    if target.local() && self.local.get(&slot).is_some_and(|c| c.epoch <= epoch) {
                        self.local.remove(&slot);
                    }
                    if target.cluster() {
                        assert!(self.reachable, "cluster delete while unreachable: {slot}");
                        if self
                            .cluster
                            .get(&slot)
                            .is_some_and(|c| c.node == NODE && c.epoch <= epoch)
                        {
                            self.cluster.remove(&slot);
                        }
                    }
                }
                Effect::HealthChanged { .. } => {}
            }
        }
    }

    // ----- kubelet -------------------------------------------------------

    fn in_use(&self) -> BTreeSet<String> {
        self.pods
            .iter()
            .filter(|p| p.active)
            .flat_map(|p| p.devices.iter().cloned())
            .collect()
    }

    fn podresources(&self) -> Vec<PodResources> {
        self.pods
            .iter()
            .filter(|p| p.api_live && !p.devices.is_empty() && !p.released)
            .map(|p| PodResources {
                namespace: "default".to_owned(),
                name: p.name.clone(),
                containers: p
                    .containers
                    .iter()
                    .map(|c| ContainerResources {
                        name: c.clone(),
                        devices: p
                            .devices
                            .iter()
                            .map(|d| ContainerDevices {
                                resource_name: self.instance_of(d).resource_name.clone(),
                                device_ids: vec![d.clone()],
                            })
                            .collect(),
                    })
                    .collect(),
            })
            .collect()
    }

    fn refresh_podresources(&mut self) {
        let list = self.podresources();
        let effects = self.ledger.podresources_listed(&list, Millis(self.now));
        self.apply(effects);
        // Settle rule: a pending claim whose Allocate was answered (here at
        // the Allocate time, or the restart that recovered it) at least
        // SETTLE ago is gone once a list does not mention its slot.
        let listed: BTreeSet<&str> = list
            .iter()
            .flat_map(|p| &p.containers)
            .flat_map(|c| &c.devices)
            .flat_map(|d| &d.device_ids)
            .map(String::as_str)
            .collect();
        for claim in self.ledger.claims() {
            let settled = claim.awaiting.is_some_and(|a| self.now >= a.0 + SETTLE);
            assert!(
                !(settled && claim.holding.holder.is_none() && !listed.contains(claim.slot())),
                "pending {} not mentioned by a list taken after settle, yet kept: {claim:?}",
                claim.slot()
            );
        }
    }

    /// One Allocate as the adapter runs it. Returns whether it was answered OK.
    fn allocate(&mut self, ids: &[String], crash: Crash) -> bool {
        let result = self.ledger.allocate(ids, Millis(self.now));
        self.trace.push(format!("{result:?}"));
        let plan = match result {
            Ok(plan) => plan,
            Err(AllocateError::ClusterUnreachable { id, .. }) => {
                assert!(!self.reachable && self.instance_of(&id).shared);
                return false;
            }
            Err(e) => panic!("kubelet offered {ids:?} (Healthy, free) and Allocate said: {e}"),
        };
        let slots: Vec<&str> = plan.writes.iter().map(Claim::slot).collect();
        assert_eq!(slots, ids.iter().map(String::as_str).collect::<Vec<_>>());
        for w in &plan.writes {
            self.local_write(w);
        }
        if crash == Crash::AfterLocalWrite {
            self.restart();
            return false;
        }
        if plan.target.cluster() {
            assert!(self.reachable);
            for w in &plan.writes {
                if let Some(c) = self.cluster.get(w.slot()).filter(|c| c.node != NODE) {
                    let (slot, node) = (w.slot().to_owned(), c.node.clone());
                    self.trace.push(format!("conflict {slot} {node}"));
                    let effects = self.ledger.claim_conflict(plan.id, &slot, &node);
                    let effects = effects.unwrap_or_else(|e| panic!("{e}"));
                    self.fed_others.insert(slot, node);
                    self.apply(effects);
                    return false;
                }
                self.cluster_write(w);
            }
        }
        if crash == Crash::AfterClusterWrite {
            self.restart();
            return false;
        }
        self.ledger
            .commit(plan.id, Millis(self.now))
            .unwrap_or_else(|e| panic!("{e}"));
        // Durable before the answer: locally, and in the cluster for shared
        // devices (offline only if this node already held it there).
        for w in &plan.writes {
            assert!(self.local.get(w.slot()).is_some_and(|c| c.node == NODE));
            if self.instance_of(w.slot()).shared {
                assert!(
                    self.cluster.get(w.slot()).is_some_and(|c| c.node == NODE),
                    "shared {} answered without a cluster claim",
                    w.slot()
                );
            }
        }
        true
    }

    fn new_pod(&mut self, instance: usize, count: usize, init_main: bool, crash: Crash) {
        let k = self.pods.len();
        self.pods.push(SimPod {
            uid: format!("uid-{k}"),
            name: format!("pod-{k}"),
            phase: PodPhase::Pending,
            api_live: true,
            active: false,
            devices: Vec::new(),
            containers: Vec::new(),
            released: false,
        });
        self.watch.push_back((self.now, pod_info(&self.pods[k])));
        // kubelet's UpdateAllocatedDevices, then admission.
        for p in &mut self.pods {
            if !p.active {
                p.released = true;
            }
        }
        let name = self.instances[instance].name.clone();
        let in_use = self.in_use();
        let available: Vec<String> = self
            .ledger
            .health(&name)
            .into_iter()
            .filter(|(slot, h)| *h == Health::Healthy && !in_use.contains(slot))
            .map(|(slot, _)| slot)
            .collect();
        let chosen = self.ledger.preferred_allocation(&available, &[], count);
        let admitted = available.len() >= count && {
            assert_eq!(chosen.len(), count);
            assert!(chosen.iter().all(|c| available.contains(c)));
            self.allocate(&chosen, crash)
        };
        if !admitted {
            let p = &mut self.pods[k];
            p.phase = PodPhase::Failed;
            p.released = true;
            self.watch.push_back((self.now, pod_info(&self.pods[k])));
            return;
        }
        {
            let p = &mut self.pods[k];
            p.active = true;
            p.released = false;
            p.devices = chosen.clone();
            p.containers = vec![if init_main { "init" } else { "main" }.to_owned()];
        }
        self.refresh_podresources();
        if init_main {
            // The main container gets the init container's devices again.
            assert!(
                self.allocate(&chosen, Crash::Never),
                "re-allocating the same pod's devices must succeed"
            );
            self.pods[k].containers.push("main".to_owned());
            self.refresh_podresources();
        }
        self.pods[k].phase = PodPhase::Running;
        self.watch.push_back((self.now, pod_info(&self.pods[k])));
    }

    fn live_pod(&self, i: usize) -> Option<usize> {
        let live: Vec<usize> = (0..self.pods.len())
            .filter(|&k| self.pods[k].api_live && !self.pods[k].phase.is_terminal())
            .collect();
        (!live.is_empty()).then(|| live[i % live.len()])
    }

    fn terminate(&mut self, i: usize) {
        let Some(k) = self.live_pod(i) else { return };
        let p = &mut self.pods[k];
        p.active = false;
        p.phase = if i.is_multiple_of(2) {
            PodPhase::Succeeded
        } else {
            PodPhase::Failed
        };
        self.watch.push_back((self.now, pod_info(&self.pods[k])));
    }

    fn delete(&mut self, i: usize) {
        let api: Vec<usize> = (0..self.pods.len())
            .filter(|&k| self.pods[k].api_live)
            .collect();
        if api.is_empty() {
            return;
        }
        let k = api[i % api.len()];
        let p = &mut self.pods[k];
        p.active = false;
        p.api_live = false;
        self.watch.push_back((self.now, pod_info(&self.pods[k])));
    }

    fn deliver_watch(&mut self) {
        let Some((_, info)) = self.watch.pop_front() else {
            return;
        };
        let before: Vec<Claim> = self
            .ledger
            .claims()
            .into_iter()
            .filter(|c| c.holding.is_held_by(&info.uid))
            .collect();
        let effects = self.ledger.pod_observed(&info);
        self.apply(effects);
        if !info.is_live() {
            self.check_released(&info.uid, &before);
        }
    }

    // ----- DRA --------------------------------------------------------------

    fn prepared_slots(&self) -> BTreeSet<String> {
        self.claims
            .iter()
            .filter(|c| c.prepared)
            .flat_map(|c| c.slots.iter().cloned())
            .collect()
    }

    fn prepare(&mut self, instance: usize, count: usize, crash: Crash) {
        let k = self.claims.len();
        let uid = format!("claim-{k}");
        let info = self.instances[instance].clone();
        // The scheduler picks slots blind to the device plugins, but never
        // two claims' devices at once (its own allocations).
        let taken: BTreeSet<String> = self
            .claims
            .iter()
            .filter(|c| c.checkpointed)
            .flat_map(|c| c.slots.iter().cloned())
            .collect();
        let slots: Vec<String> = (0..info.capacity)
            .map(|n| info.slot(n))
            .filter(|s| !taken.contains(s))
            .take(count)
            .collect();
        if slots.is_empty() {
            return;
        }
        self.claims.push(SimClaim {
            uid: uid.clone(),
            slots: slots.clone(),
            prepared: false,
            checkpointed: true,
        });
        let holds: Vec<(String, ClaimHold)> = slots
            .iter()
            .map(|s| {
                (
                    s.clone(),
                    ClaimHold::of(ClaimRef::new(&uid, "default", format!("c-{k}"))),
                )
            })
            .collect();
        let before = self.ledger.health_all();
        let result = self.ledger.prepare(&holds, Millis(self.now));
        self.trace.push(format!("prepare {result:?}"));
        let plan = match result {
            Ok(plan) => plan,
            Err(
                AllocateError::InUseByDevicePlugin { id, .. }
                | AllocateError::HeldByOtherNode { id, .. }
                | AllocateError::DeviceGone { id, .. }
                | AllocateError::ClusterUnreachable { id, .. },
            ) => {
                // Refused for a reason the world shows.
                let dp = self.in_use().contains(&id) || self.ledger.claim(&id).is_some();
                let other = self.fed_others.contains_key(&id);
                let gone = !self.instance_of(&id).available();
                let offline = !self.reachable && self.instance_of(&id).shared;
                assert!(dp || other || gone || offline, "prepare of {id} refused");
                assert_eq!(
                    self.ledger.health_all(),
                    before,
                    "a refused prepare changed health"
                );
                return;
            }
            Err(e) => panic!("prepare of {slots:?}: {e}"),
        };
        for w in &plan.writes {
            self.local_write(w);
        }
        if crash == Crash::AfterLocalWrite {
            self.restart();
            return;
        }
        if plan.target.cluster() {
            for w in &plan.writes {
                if let Some(c) = self.cluster.get(w.slot()).filter(|c| c.node != NODE) {
                    let (slot, node) = (w.slot().to_owned(), c.node.clone());
                    let effects = self.ledger.claim_conflict(plan.id, &slot, &node);
                    let effects = effects.unwrap_or_else(|e| panic!("{e}"));
                    self.fed_others.insert(slot, node);
                    self.apply(effects);
                    return;
                }
                self.cluster_write(w);
            }
        }
        if crash == Crash::AfterClusterWrite {
            self.restart();
            return;
        }
        self.ledger
            .commit(plan.id, Millis(self.now))
            .unwrap_or_else(|e| panic!("{e}"));
        for s in &slots {
            assert!(self.ledger.is_prepared(s, &uid));
            assert_eq!(self.ledger.health_of(s), Some(Health::Unhealthy));
            assert!(
                !self.in_use().contains(s),
                "{s} prepared while a pod uses it"
            );
        }
        self.claims[k].prepared = true;
    }

    fn unprepare(&mut self, i: usize) {
        let open: Vec<usize> = (0..self.claims.len())
            .filter(|&k| self.claims[k].checkpointed)
            .collect();
        if open.is_empty() {
            return;
        }
        let k = open[i % open.len()];
        let uid = self.claims[k].uid.clone();
        let effects = self.ledger.unprepare(&uid);
        self.apply(effects);
        assert!(self.ledger.prepared_for(&uid).is_empty());
        for s in &self.claims[k].slots {
            assert!(
                self.ledger
                    .claim(s)
                    .is_none_or(|c| c.holding.claim.is_none()),
                "{s} still held by a claim after unprepare"
            );
        }
        self.claims[k].prepared = false;
        self.claims[k].checkpointed = false;
    }

    // ----- other nodes and the cluster ------------------------------------

    fn other_claim(&mut self, k: usize) {
        let slot = SHARED_SLOTS[k % SHARED_SLOTS.len()];
        if self.cluster.contains_key(slot) {
            return;
        }
        self.next_other_pod += 1;
        let n = self.next_other_pod;
        let claim = Claim {
            node: OTHER_NODES[k % 2].to_owned(),
            epoch: 1,
            holding: Holding::held(
                slot,
                crate::ledger::Holder::new(
                    PodRef::new(format!("other-{n}"), "default", format!("other-{n}")),
                    None,
                ),
                Millis(self.now),
            ),
            awaiting: None,
        };
        self.cluster.insert(slot.to_owned(), claim.clone());
        self.cluster_events.push_back(ClusterEvent::Put(claim));
    }

    fn other_release(&mut self, k: usize) {
        let theirs: Vec<String> = self
            .cluster
            .iter()
            .filter(|(_, c)| c.node != NODE)
            .map(|(s, _)| s.clone())
            .collect();
        if theirs.is_empty() {
            return;
        }
        let slot = theirs[k % theirs.len()].clone();
        if let Some(c) = self.cluster.remove(&slot) {
            self.cluster_events
                .push_back(ClusterEvent::Removed { slot, node: c.node });
        }
    }

    fn deliver_cluster(&mut self) {
        if !self.reachable {
            return;
        }
        let Some(event) = self.cluster_events.pop_front() else {
            return;
        };
        let before = self.ledger.health_all();
        let effects = match event {
            ClusterEvent::Put(claim) => {
                self.fed_others
                    .insert(claim.slot().to_owned(), claim.node.clone());
                self.ledger.cluster_claim_observed(&claim)
            }
            ClusterEvent::Removed { slot, node } => {
                if self.fed_others.get(&slot) == Some(&node) {
                    self.fed_others.remove(&slot);
                }
                self.ledger.cluster_claim_removed(&slot, &node)
            }
        };
        // The per-slot health update names exactly the Instances whose
        // health vector changed.
        let mut expected = Vec::new();
        self.ledger.health_diff(&before, &mut expected);
        let named = |fx: &[Effect]| -> BTreeSet<String> {
            fx.iter()
                .filter_map(|e| match e {
                    Effect::HealthChanged { instance } => Some(instance.clone()),
                    _ => None,
                })
                .collect()
        };
        assert_eq!(
            named(&effects),
            named(&expected),
            "HealthChanged after a cluster event"
        );
        self.apply(effects);
    }

    fn truth_others(&self) -> BTreeMap<String, String> {
        self.cluster
            .iter()
            .filter(|(_, c)| c.node != NODE)
            .map(|(s, c)| (s.clone(), c.node.clone()))
            .collect()
    }

    fn cluster_up(&mut self) {
        self.reachable = true;
        let all: Vec<Claim> = self.cluster.values().cloned().collect();
        let effects = self.ledger.cluster_claims_listed(&all);
        self.fed_others = self.truth_others();
        self.cluster_events.clear();
        self.apply(effects);
        let effects = self.ledger.cluster_reachability(true);
        self.apply(effects);
    }

    fn cluster_down(&mut self) {
        self.reachable = false;
        let effects = self.ledger.cluster_reachability(false);
        self.apply(effects);
    }

    fn restart(&mut self) {
        let input = RecoveryInput {
            instances: self.instances.clone(),
            local: self.local.values().cloned().collect(),
            cluster: self
                .reachable
                .then(|| self.cluster.values().cloned().collect()),
            podresources: self.podresources(),
            pods: self
                .pods
                .iter()
                .filter(|p| p.api_live)
                .map(pod_info)
                .collect(),
            now: Millis(self.now),
        };
        let (ledger, effects) = SlotAllocator::recover(NODE, config(), input);
        self.trace.push("restart".to_owned());
        self.ledger = ledger;
        self.watch.clear();
        self.cluster_events.clear();
        self.fed_others = if self.reachable {
            self.truth_others()
        } else {
            BTreeMap::new()
        };
        self.apply(effects);
    }

    fn step(&mut self, op: &Op) {
        match *op {
            Op::NewPod {
                instance,
                count,
                init_main,
                crash,
            } => self.new_pod(instance, count, init_main, crash),
            Op::Terminate(i) => self.terminate(i),
            Op::Delete(i) => self.delete(i),
            Op::DeliverWatch(n) => {
                for _ in 0..n {
                    if self.watch.is_empty() {
                        break;
                    }
                    self.deliver_watch();
                }
            }
            Op::PodResources => self.refresh_podresources(),
            Op::OtherClaim(k) => self.other_claim(k),
            Op::OtherRelease(k) => self.other_release(k),
            Op::DeliverCluster(n) => {
                for _ in 0..n {
                    self.deliver_cluster();
                }
            }
            Op::Tick(dt) => {
                self.now += dt;
                while self
                    .watch
                    .front()
                    .is_some_and(|(t, _)| t + WATCH_LATENCY <= self.now)
                {
                    self.deliver_watch();
                }
                let effects = self.ledger.tick(Millis(self.now));
                self.apply(effects);
            }
            Op::Restart => self.restart(),
            Op::ClusterDown => self.cluster_down(),
            Op::ClusterUp => self.cluster_up(),
            Op::Prepare {
                instance,
                count,
                crash,
            } => self.prepare(instance, count, crash),
            Op::Unprepare(i) => self.unprepare(i),
            Op::DeviceFlap(i) => {
                let info = &mut self.instances[i];
                info.present = !info.present;
                let info = info.clone();
                let effects = self.ledger.instance_upserted(info);
                self.apply(effects);
            }
        }
        self.check();
    }

    // ----- invariants ----------------------------------------------------

    /// (2) Right after a pod's Deleted or terminal phase is applied.
    fn check_released(&self, uid: &str, before: &[Claim]) {
        assert!(
            self.ledger.slots_of(uid).is_empty(),
            "{uid} still holds slots after its end"
        );
        for claim in before {
            if claim.awaiting.is_none() {
                assert_eq!(
                    self.ledger.claim(claim.slot()),
                    None,
                    "slot of ended {uid} not freed at once"
                );
            }
        }
        let in_use = self.in_use();
        for claim in before {
            let slot = claim.slot();
            if in_use.contains(slot) {
                continue;
            }
            let info = self.instance_of(slot);
            if info.available() && !self.fed_others.contains_key(slot) {
                assert_eq!(self.ledger.health_of(slot), Some(Health::Healthy));
            }
        }
    }

    fn check(&self) {
        assert_eq!(
            self.ledger.any_awaiting(),
            self.ledger.claims().iter().any(|c| c.awaiting.is_some()),
            "any_awaiting disagrees with the claims"
        );
        let in_use = self.in_use();
        let truth_others = self.truth_others();
        for info in &self.instances {
            // (3) Unhealthy iff held by another node (as observed) or gone.
            for (slot, health) in self.ledger.health(&info.name) {
                let by_dra = self
                    .ledger
                    .claim(&slot)
                    .is_some_and(|c| c.holding.claim.is_some());
                let expected = if !info.available() || self.fed_others.contains_key(&slot) || by_dra
                {
                    Health::Unhealthy
                } else {
                    Health::Healthy
                };
                assert_eq!(health, expected, "health of {slot}");
                // (1) Never two live pods on one slot, on any node.
                let local = self
                    .pods
                    .iter()
                    .filter(|p| p.active && p.devices.contains(&slot))
                    .count();
                let remote = usize::from(truth_others.contains_key(&slot));
                let dra = self
                    .claims
                    .iter()
                    .filter(|c| c.prepared && c.slots.contains(&slot))
                    .count();
                assert!(
                    local + remote + dra <= 1,
                    "{slot} used by {local} local pods, {remote} remote pods and {dra} claims"
                );
            }
        }
        // Every prepared claim holds its slots.
        for c in self.claims.iter().filter(|c| c.prepared) {
            for slot in &c.slots {
                assert!(
                    self.ledger.is_prepared(slot, &c.uid),
                    "{slot} of {} lost",
                    c.uid
                );
            }
        }
        // Every slot kubelet has in use is claimed by this node.
        for slot in &in_use {
            assert!(
                self.ledger.claim(slot).is_some(),
                "{slot} in use by a running pod but not claimed"
            );
        }
        if !self.reachable {
            assert!(!self.ledger.cluster_reachable());
        }
    }
}

fn run(ops: &[Op]) -> Sim {
    let mut sim = Sim::new();
    for op in ops {
        sim.step(op);
    }
    sim
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// (1) no slot held by two live pods on any node, (2) release at once on
    /// Deleted / terminal, (3) health iff, plus durability before answers,
    /// over random interleavings with restarts and outages.
    #[test]
    fn random_interleavings_keep_the_invariants(ops in prop::collection::vec(op(), 1..80)) {
        let sim = run(&ops);
        // Eventually (everything delivered, windows passed, cluster up) the
        // ledger holds exactly what kubelet uses.
        let mut sim = sim;
        sim.step(&Op::ClusterUp);
        sim.step(&Op::DeliverWatch(usize::MAX >> 1));
        sim.step(&Op::Tick(2 * TIMEOUT));
        sim.step(&Op::Tick(2 * TIMEOUT));
        // kubelet unprepares what it checkpointed but never saw prepared.
        for k in 0..sim.claims.len() {
            if sim.claims[k].checkpointed && !sim.claims[k].prepared {
                let uid = sim.claims[k].uid.clone();
                let effects = sim.ledger.unprepare(&uid);
                sim.apply(effects);
                sim.claims[k].checkpointed = false;
            }
        }
        let claimed: BTreeSet<String> =
            sim.ledger.claims().iter().map(|c| c.slot().to_owned()).collect();
        let held: BTreeSet<String> = sim.in_use().union(&sim.prepared_slots()).cloned().collect();
        prop_assert_eq!(&claimed, &held);
        prop_assert!(sim.ledger.unsynced().is_empty());
        // Both stores agree with the ledger.
        let local: BTreeSet<String> = sim.local.keys().cloned().collect();
        prop_assert_eq!(&local, &claimed);
        let own: BTreeSet<String> = sim
            .cluster
            .iter()
            .filter(|(_, c)| c.node == NODE)
            .map(|(s, _)| s.clone())
            .collect();
        prop_assert_eq!(&own, &claimed);
    }

    /// (5) Same inputs, same outputs: effects, answers and final state.
    #[test]
    fn decisions_are_deterministic(ops in prop::collection::vec(op(), 1..60)) {
        let a = run(&ops);
        let b = run(&ops);
        prop_assert_eq!(&a.trace, &b.trace);
        prop_assert_eq!(&a.ledger, &b.ledger);
        prop_assert_eq!(&a.local, &b.local);
    }
}

// ----- (4) no starvation ---------------------------------------------------

#[derive(Debug, Clone)]
enum Noise {
    Allocate {
        slot: usize,
        finish: u8,
    },
    Observe {
        pod: usize,
        phase: PodPhase,
        deleted: bool,
    },
    Resources {
        pod: usize,
        slot: usize,
    },
    List,
    Tick(u64),
}

const NOISE_SLOTS: [&str; 3] = ["cam-a-1", "usb-b-1", "gpu-c-0"];
const P_SLOTS: [&str; 2] = ["cam-a-0", "usb-b-0"];

fn noise() -> impl Strategy<Value = Noise> {
    let phase = prop_oneof![
        Just(PodPhase::Pending),
        Just(PodPhase::Running),
        Just(PodPhase::Unknown),
        Just(PodPhase::Succeeded),
        Just(PodPhase::Failed),
    ];
    prop_oneof![
        (0..3usize, 0..3u8).prop_map(|(slot, finish)| Noise::Allocate { slot, finish }),
        (0..6usize, phase, any::<bool>()).prop_map(|(pod, phase, deleted)| Noise::Observe {
            pod,
            phase,
            deleted
        }),
        (0..6usize, 0..3usize).prop_map(|(pod, slot)| Noise::Resources { pod, slot }),
        Just(Noise::List),
        (0..(2 * TIMEOUT)).prop_map(Noise::Tick),
    ]
}

fn p_resources() -> PodResources {
    PodResources {
        namespace: "default".into(),
        name: "p".into(),
        containers: vec![ContainerResources {
            name: "main".into(),
            devices: P_SLOTS
                .iter()
                .map(|s| ContainerDevices {
                    resource_name: format!(
                        "steward.dev/{}",
                        parse_slot_id(s).map(|(i, _)| i).unwrap_or_default()
                    ),
                    device_ids: vec![(*s).to_owned()],
                })
                .collect(),
        }],
    }
}

fn noise_resources(pod: usize, slot: &str) -> PodResources {
    PodResources {
        namespace: "default".into(),
        name: format!("n{pod}"),
        containers: vec![ContainerResources {
            name: "main".into(),
            devices: vec![ContainerDevices {
                resource_name: format!(
                    "steward.dev/{}",
                    parse_slot_id(slot).map(|(i, _)| i).unwrap_or_default()
                ),
                device_ids: vec![slot.to_owned()],
            }],
        }],
    }
}

fn base_ledger() -> SlotAllocator {
    let input = RecoveryInput {
        instances: instances(),
        cluster: Some(Vec::new()),
        ..RecoveryInput::default()
    };
    SlotAllocator::recover(NODE, config(), input).0
}

/// P allocates and is bound at `at`.
fn p_history(l: &mut SlotAllocator, at: u64) {
    let plan = l
        .allocate(&P_SLOTS.map(str::to_owned), Millis(at))
        .unwrap_or_else(|e| panic!("{e}"));
    l.commit(plan.id, Millis(at))
        .unwrap_or_else(|e| panic!("{e}"));
    l.pod_observed(&PodInfo {
        uid: "uid-p".into(),
        namespace: "default".into(),
        name: "p".into(),
        node: NODE.into(),
        phase: PodPhase::Running,
        deleted: false,
    });
    l.podresources_got(&p_resources(), Millis(at));
}

fn apply_noise(l: &mut SlotAllocator, n: &Noise, now: &mut u64) {
    match *n {
        Noise::Allocate { slot, finish } => {
            if let Ok(plan) = l.allocate(&[NOISE_SLOTS[slot].to_owned()], Millis(*now)) {
                match finish {
                    0 => drop(l.commit(plan.id, Millis(*now))),
                    1 => drop(l.abort(plan.id)),
                    _ => {} // left outstanding
                }
            }
        }
        Noise::Observe {
            pod,
            phase,
            deleted,
        } => {
            l.pod_observed(&PodInfo {
                uid: format!("uid-n{pod}"),
                namespace: "default".into(),
                name: format!("n{pod}"),
                node: NODE.into(),
                phase,
                deleted,
            });
        }
        Noise::Resources { pod, slot } => {
            l.podresources_got(&noise_resources(pod, NOISE_SLOTS[slot]), Millis(*now));
        }
        Noise::List => {
            let mut list = vec![p_resources()];
            list.extend((0..3).map(|i| noise_resources(i, NOISE_SLOTS[i])));
            l.podresources_listed(&list, Millis(*now));
        }
        Noise::Tick(dt) => {
            *now += dt;
            l.tick(Millis(*now));
        }
    }
}

/// Effects on P's slots, without epochs.
fn on_p_slots(effects: &[Effect]) -> Vec<(String, &'static str, Target)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::WriteClaim { claim, target } => {
                Some((claim.slot().to_owned(), "write", *target))
            }
            Effect::DeleteClaim { slot, target, .. } => Some((slot.clone(), "delete", *target)),
            Effect::HealthChanged { .. } => None,
        })
        .filter(|(slot, _, _)| P_SLOTS.contains(&slot.as_str()))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// (4) Reclaiming P never depends on other pods: whatever other pods
    /// are doing (never seen, not ready, pending claims, terminating,
    /// outstanding plans), P's Deleted or terminal phase frees exactly P's
    /// slots at once, exactly as in a ledger where P is alone.
    #[test]
    fn reclaim_of_one_pod_does_not_depend_on_other_pods(
        before in prop::collection::vec(noise(), 0..20),
        after in prop::collection::vec(noise(), 0..20),
        deleted in any::<bool>(),
    ) {
        let end = PodInfo {
            uid: "uid-p".into(),
            namespace: "default".into(),
            name: "p".into(),
            node: NODE.into(),
            phase: if deleted { PodPhase::Running } else { PodPhase::Failed },
            deleted,
        };

        let mut quiet = base_ledger();
        p_history(&mut quiet, 0);
        let alone = quiet.pod_observed(&end);

        let mut busy = base_ledger();
        let mut now = 0;
        for n in &before {
            apply_noise(&mut busy, n, &mut now);
        }
        p_history(&mut busy, now);
        for n in &after {
            apply_noise(&mut busy, n, &mut now);
        }
        let crowded = busy.pod_observed(&end);

        prop_assert_eq!(on_p_slots(&crowded), on_p_slots(&alone));
        prop_assert_eq!(
            on_p_slots(&crowded),
            P_SLOTS.iter().map(|s| ((*s).to_owned(), "delete", Target::Both)).collect::<Vec<_>>()
        );
        for slot in P_SLOTS {
            prop_assert_eq!(busy.claim(slot), None);
            prop_assert_eq!(busy.health_of(slot), Some(Health::Healthy));
        }
    }
}
