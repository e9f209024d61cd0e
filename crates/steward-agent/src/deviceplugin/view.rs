//! The device plugins' slots as the `Slots` source of the node view: every
//! attributed slot under its holder pod and container, with its resource
//! name and NUMA nodes; every slot of every served Instance as allocatable.
//!
//! Published by one task, woken (coalesced) whenever the core's state is
//! locked, that takes one consistent copy of the ledger under the lock and
//! lets the view diff it — so the Allocate path pays one wake-up, and the
//! view sees every state the ledger went through in order (or a later one).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use steward_core::ledger::{Allocatable, PodAssignments, Source};
use steward_podresources::Hub;

use super::core::{Core, State};
use crate::claims::ClaimStore;

/// The slots this node's ledger holds, by pod, and what its plugins serve.
pub(crate) fn slots_view(st: &State) -> (Vec<PodAssignments>, Allocatable, BTreeSet<String>) {
    let mut pods: BTreeMap<String, PodAssignments> = BTreeMap::new();
    for h in st.ledger.holders() {
        let Some(holder) = h.holder else { continue };
        let Some(inst) = h
            .resource
            .rsplit_once('-')
            .and_then(|(instance, _)| st.instances.get(instance))
        else {
            continue;
        };
        let numa: BTreeSet<i64> = inst.numa.iter().copied().collect();
        let pod = pods
            .entry(holder.pod.uid.clone())
            .or_insert_with(|| PodAssignments::new(holder.pod.clone()));
        let container = holder.container.as_deref().unwrap_or_default();
        pod.container_mut(container)
            .add_devices(&inst.resource_name, [h.resource.clone()], &numa);
    }
    let mut allocatable = Allocatable::default();
    let mut names = BTreeSet::new();
    for inst in st.instances.values() {
        names.insert(inst.resource_name.clone());
        if !inst.usable {
            continue;
        }
        let numa: BTreeSet<i64> = inst.numa.iter().copied().collect();
        let devices = allocatable
            .devices
            .entry(inst.resource_name.clone())
            .or_default();
        for n in 0..inst.capacity {
            devices.insert(format!("{}-{n}", inst.name), numa.clone());
        }
    }
    (pods.into_values().collect(), allocatable, names)
}

/// Publishes the slots to `hub` now and after every change, until dropped.
pub(crate) async fn publish<L: ClaimStore, C: ClaimStore>(core: Arc<Core<L, C>>, hub: Arc<Hub>) {
    let changed = core.changes();
    loop {
        let (pods, allocatable, names) = {
            let st = core.lock_quiet().await;
            slots_view(&st)
        };
        hub.set_steward_resources(names);
        hub.replace_allocatable(Source::Slots, allocatable);
        hub.replace(Source::Slots, pods);
        changed.notified().await;
    }
}
