//! The device plugins' slots as the `Slots` source of the node view: every
//! attributed slot under its holder pod and container, with its resource
//! name and NUMA nodes; every slot prepared for a DRA claim as the
//! `dynamic_resources` of the claim's containers; every slot of every
//! served Instance as allocatable.
//!
//! Published by one task, woken (coalesced) whenever the core's state is
//! locked, that takes one consistent copy of the ledger under the lock and
//! lets the view diff it — so the Allocate path pays one wake-up, and the
//! view sees every state the ledger went through in order (or a later one).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use steward_core::ledger::{
    Allocatable, ClaimDevice, ClaimHold, DynamicAssignment, Holding, PodAssignments, Source,
};
use steward_podresources::Hub;

use crate::claims::ClaimStore;
use crate::slot_keeper::{SlotKeeper, State};

/// What the view needs of one served Instance.
#[derive(Debug, Clone)]
pub(crate) struct Served {
    name: String,
    resource_name: String,
    numa: BTreeSet<i64>,
    capacity: u32,
    usable: bool,
    /// CDI device name (empty without CDI).
    cdi: String,
}

/// The raw copy taken under the core's lock: the ledger's holdings and the
/// served Instances. Everything else is built after the lock is released,
/// so the Allocate path waits for a copy, not for the view's work.
pub(crate) fn copy(st: &State) -> (Vec<Holding>, BTreeMap<String, Served>) {
    let served = st
        .instances
        .iter()
        .map(|(name, inst)| {
            (
                name.clone(),
                Served {
                    name: inst.name.clone(),
                    resource_name: inst.resource_name.clone(),
                    numa: inst.numa.iter().copied().collect(),
                    capacity: inst.capacity,
                    usable: inst.usable,
                    cdi: inst.cdi_name.clone(),
                },
            )
        })
        .collect();
    (st.ledger.holders(), served)
}

/// What the slot ledger shows the node view.
pub(crate) struct SlotsView {
    /// Slots held through the device plugins, by pod (`Source::Slots`).
    pub pods: Vec<PodAssignments>,
    /// Slots prepared for DRA claims, under the claims' pods and containers
    /// (`Source::Dra`).
    pub dra: Vec<PodAssignments>,
    pub allocatable: Allocatable,
    /// The resource names the plugins serve.
    pub names: BTreeSet<String>,
}

/// The slots held, by pod, what the plugins serve, and their resource names.
pub(crate) fn slots_view(holdings: Vec<Holding>, served: &BTreeMap<String, Served>) -> SlotsView {
    let mut pods: BTreeMap<String, PodAssignments> = BTreeMap::new();
    let mut dra: BTreeMap<String, PodAssignments> = BTreeMap::new();
    for h in holdings {
        let Some(inst) = h
            .resource
            .rsplit_once('-')
            .and_then(|(instance, _)| served.get(instance))
        else {
            continue;
        };
        if let Some(hold) = h.claim {
            add_claim(&mut dra, &hold, inst);
            continue;
        }
        let Some(holder) = h.holder else { continue };
        let pod = pods
            .entry(holder.pod.uid.clone())
            .or_insert_with(|| PodAssignments::new(holder.pod.clone()));
        let container = holder.container.as_deref().unwrap_or_default();
        pod.container_mut(container)
            .add_devices(&inst.resource_name, [h.resource], &inst.numa);
    }
    let mut allocatable = Allocatable::default();
    let mut names = BTreeSet::new();
    for inst in served.values() {
        names.insert(inst.resource_name.clone());
        if !inst.usable {
            continue;
        }
        let devices = allocatable
            .devices
            .entry(inst.resource_name.clone())
            .or_default();
        for n in 0..inst.capacity {
            devices.insert(format!("{}-{n}", inst.name), inst.numa.clone());
        }
    }
    SlotsView {
        pods: pods.into_values().collect(),
        dra: dra.into_values().collect(),
        allocatable,
        names,
    }
}

/// A slot prepared for a DRA claim, under every container of every pod the
/// claim was prepared for (`dynamic_resources` in pod resources).
fn add_claim(pods: &mut BTreeMap<String, PodAssignments>, hold: &ClaimHold, inst: &Served) {
    let device = ClaimDevice {
        driver_name: steward_core::dra::DRIVER.to_owned(),
        pool_name: hold.pool.clone(),
        device_name: hold.device.clone(),
        cdi_devices: if inst.cdi.is_empty() {
            Vec::new()
        } else {
            vec![inst.cdi.clone()]
        },
    };
    for user in &hold.users {
        let pod = pods
            .entry(user.pod.uid.clone())
            .or_insert_with(|| PodAssignments::new(user.pod.clone()));
        let container = pod.container_mut(user.container.as_deref().unwrap_or_default());
        let at = match container.dynamic.iter().position(|d| {
            d.claim_name == hold.claim.name && d.claim_namespace == hold.claim.namespace
        }) {
            Some(at) => at,
            None => {
                container.dynamic.push(DynamicAssignment {
                    claim_name: hold.claim.name.clone(),
                    claim_namespace: hold.claim.namespace.clone(),
                    devices: Vec::new(),
                });
                container.dynamic.len() - 1
            }
        };
        if let Some(d) = container.dynamic.get_mut(at) {
            d.devices.push(device.clone());
            d.devices.sort();
        }
        container.dynamic.sort();
    }
}

/// The shortest time between two publications: a burst of Allocates is
/// published as one change, so the view's work (a copy and a diff of every
/// holding) does not compete with each Allocate on a busy node.
pub(crate) const PUBLISH_GAP: std::time::Duration = std::time::Duration::from_millis(5);

/// Publishes the slots to `hub` now and after every change, until dropped.
pub(crate) async fn publish<L: ClaimStore, C: ClaimStore>(
    core: Arc<SlotKeeper<L, C>>,
    hub: Arc<Hub>,
) {
    let changed = core.changes();
    let mut last: Option<(Vec<Holding>, BTreeMap<String, Served>)> = None;
    loop {
        let (holdings, served) = {
            let st = core.lock_quiet().await;
            copy(&st)
        };
        // Most locks change nothing (reads, settled lists): skip the work.
        let same = last
            .as_ref()
            .is_some_and(|(h, s)| *h == holdings && same_served(s, &served));
        if !same {
            let view = slots_view(holdings.clone(), &served);
            hub.set_steward_resources(view.names);
            hub.replace_allocatable(Source::Slots, view.allocatable);
            hub.replace(Source::Slots, view.pods);
            hub.replace(Source::Dra, view.dra);
            last = Some((holdings, served));
        }
        // A change during the gap left a permit: the next round starts at
        // once after it. An idle node's first change is published at once.
        tokio::time::sleep(PUBLISH_GAP).await;
        changed.notified().await;
    }
}

fn same_served(a: &BTreeMap<String, Served>, b: &BTreeMap<String, Served>) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|((ka, va), (kb, vb))| {
            ka == kb
                && va.resource_name == vb.resource_name
                && va.numa == vb.numa
                && va.capacity == vb.capacity
                && va.usable == vb.usable
                && va.cdi == vb.cdi
        })
}
