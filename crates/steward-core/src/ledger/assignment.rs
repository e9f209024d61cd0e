//! What one pod holds on the node, typed: device slots per resource name,
//! CPUs (exclusive or shared), memory per NUMA node and DRA claims.
//!
//! This is the vocabulary of the node view ([`super::view::NodeView`]) and of
//! every reader of it: the pod resources server speaks it on the wire as
//! kubelet's podresources v1 messages, the CLI prints it.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::PodRef;
use crate::cpu::CpuSet;

/// The devices of one resource name a container holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceAssignment {
    /// The extended resource name (`steward.dev/usb-camera`).
    pub resource_name: String,
    /// Device-plugin IDs of the devices held.
    pub device_ids: BTreeSet<String>,
    /// NUMA nodes the devices are attached to (empty: unknown or none).
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub numa_nodes: BTreeSet<i64>,
}

/// Memory a container is pinned to.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryAssignment {
    /// `memory`, or a huge page size such as `hugepages-2Mi` (kubelet's
    /// memory manager names).
    pub memory_type: String,
    /// Bytes.
    pub size: u64,
    /// NUMA nodes the memory comes from.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub numa_nodes: BTreeSet<i64>,
}

/// One device of a DRA claim prepared for a container.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimDevice {
    pub driver_name: String,
    pub pool_name: String,
    pub device_name: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cdi_devices: Vec<String>,
}

/// A DRA ResourceClaim a container uses.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DynamicAssignment {
    pub claim_name: String,
    pub claim_namespace: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<ClaimDevice>,
}

/// Everything one container holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerAssignments {
    /// Devices, one entry per resource name, ordered by it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<DeviceAssignment>,
    /// The CPUs the container may run on (`cpuset.cpus`).
    #[serde(default, skip_serializing_if = "CpuSet::is_empty")]
    pub cpus: CpuSet,
    /// Whether `cpus` are the container's alone.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub exclusive_cpus: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub memory: Vec<MemoryAssignment>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dynamic: Vec<DynamicAssignment>,
}

impl ContainerAssignments {
    /// Whether the container holds nothing at all.
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
            && self.cpus.is_empty()
            && self.memory.is_empty()
            && self.dynamic.is_empty()
    }

    /// Adds `ids` of `resource_name`, keeping one entry per resource name.
    pub fn add_devices<I, S>(&mut self, resource_name: &str, ids: I, numa_nodes: &BTreeSet<i64>)
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let at = match self
            .devices
            .binary_search_by(|d| d.resource_name.as_str().cmp(resource_name))
        {
            Ok(at) => at,
            Err(at) => {
                self.devices.insert(
                    at,
                    DeviceAssignment {
                        resource_name: resource_name.to_string(),
                        ..DeviceAssignment::default()
                    },
                );
                at
            }
        };
        if let Some(entry) = self.devices.get_mut(at) {
            entry.device_ids.extend(ids.into_iter().map(Into::into));
            entry.numa_nodes.extend(numa_nodes.iter().copied());
        }
    }

    /// The devices of `resource_name`, if any are held.
    pub fn devices_of(&self, resource_name: &str) -> Option<&DeviceAssignment> {
        self.devices
            .iter()
            .find(|d| d.resource_name == resource_name)
    }

    /// Removes the given exclusive tokens (devices, exclusive CPUs) from this
    /// container; returns whether anything changed.
    pub(crate) fn remove_tokens(&mut self, tokens: &BTreeSet<Token>) -> bool {
        let mut changed = false;
        for d in &mut self.devices {
            let before = d.device_ids.len();
            d.device_ids
                .retain(|id| !tokens.contains(&Token::Device(d.resource_name.clone(), id.clone())));
            changed |= d.device_ids.len() != before;
        }
        self.devices.retain(|d| !d.device_ids.is_empty());
        for cpu in self.cpus.clone().iter() {
            if tokens.contains(&Token::Cpu(cpu)) {
                self.cpus.remove(cpu);
                changed = true;
            }
        }
        if self.cpus.is_empty() {
            self.exclusive_cpus = false;
        }
        changed
    }
}

/// What one pod holds, per container.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodAssignments {
    pub pod: PodRef,
    /// By container name; init containers are containers too.
    #[serde(default)]
    pub containers: BTreeMap<String, ContainerAssignments>,
}

impl PodAssignments {
    /// A pod holding nothing yet.
    pub fn new(pod: PodRef) -> Self {
        Self {
            pod,
            containers: BTreeMap::new(),
        }
    }

    /// The pod's UID.
    pub fn uid(&self) -> &str {
        &self.pod.uid
    }

    /// The container `name`, created empty if absent.
    pub fn container_mut(&mut self, name: &str) -> &mut ContainerAssignments {
        self.containers.entry(name.to_string()).or_default()
    }

    /// Every exclusive token this pod holds, with whether it is held
    /// exclusively (shared CPUs are tokens that only conflict with an
    /// exclusive holder).
    pub(crate) fn tokens(&self) -> BTreeMap<Token, bool> {
        let mut out = BTreeMap::new();
        for c in self.containers.values() {
            for d in &c.devices {
                for id in &d.device_ids {
                    out.insert(Token::Device(d.resource_name.clone(), id.clone()), true);
                }
            }
            for cpu in c.cpus.iter() {
                let entry = out.entry(Token::Cpu(cpu)).or_insert(false);
                *entry |= c.exclusive_cpus;
            }
        }
        out
    }

    /// Removes `tokens` from every container; returns whether anything changed.
    pub(crate) fn remove_tokens(&mut self, tokens: &BTreeSet<Token>) -> bool {
        let mut changed = false;
        for c in self.containers.values_mut() {
            changed |= c.remove_tokens(tokens);
        }
        changed
    }

    /// The part of `self` that `other` also holds: every token of `self`
    /// that `other` does not hold is removed. Used to release before acquire.
    pub(crate) fn shrunk_to(&self, other: Option<&PodAssignments>) -> PodAssignments {
        let kept = other.map(PodAssignments::tokens).unwrap_or_default();
        let lost: BTreeSet<Token> = self
            .tokens()
            .into_keys()
            .filter(|t| !kept.contains_key(t))
            .collect();
        let mut out = self.clone();
        out.remove_tokens(&lost);
        out
    }
}

/// A unit that at most one pod may hold at a time: a device of a resource
/// name, or a CPU (a CPU conflicts when either holder has it exclusively).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Token {
    Device(String, String),
    Cpu(u32),
}

/// Where a record of a pod's holdings comes from. Each source is
/// authoritative for what it decides; see [`merge`] for the precedence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Source {
    /// kubelet's own pod resources report (other device plugins, kubelet's
    /// CPU and memory managers, DRA claims of other drivers).
    Kubelet,
    /// steward's CRI resource manager: CPUs and memory it pinned.
    Cri,
    /// steward's device plugins: the slots of steward's resource names.
    Slots,
    /// steward's DRA driver: claims it prepared.
    Dra,
}

impl Source {
    /// Every source, in the order records are merged.
    pub const ALL: [Source; 4] = [Source::Kubelet, Source::Cri, Source::Slots, Source::Dra];

    /// A short lower-case name for logs and metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Kubelet => "kubelet",
            Source::Cri => "cri",
            Source::Slots => "slots",
            Source::Dra => "dra",
        }
    }
}

/// Merges the records of one pod from several sources into the one view.
///
/// Precedence, per container:
/// * **devices**, per resource name: steward's device plugins ([`Source::Slots`])
///   decide the slots of the resource names they serve; for those names
///   kubelet's report is ignored, whatever it says (it can lag a reclaim).
///   Every other resource name comes from kubelet.
/// * **CPUs and memory**: the CRI resource manager ([`Source::Cri`]) when it
///   has a record of the container (it re-pins what kubelet's managers chose),
///   else kubelet's report.
/// * **DRA claims**: steward's DRA driver for the claims it prepared, plus
///   kubelet's report for claims of other drivers.
///
/// `steward_resources` are the resource names steward's device plugins
/// serve. The pod identity is taken from the highest-precedence record.
pub fn merge(
    records: &BTreeMap<Source, &PodAssignments>,
    steward_resources: &BTreeSet<String>,
) -> Option<PodAssignments> {
    let pod = records.values().next_back()?.pod.clone();
    let mut out = PodAssignments::new(pod);
    if let Some(kubelet) = records.get(&Source::Kubelet) {
        for (name, c) in &kubelet.containers {
            let target = out.container_mut(name);
            for d in &c.devices {
                if !steward_resources.contains(&d.resource_name) {
                    target.add_devices(
                        &d.resource_name,
                        d.device_ids.iter().cloned(),
                        &d.numa_nodes,
                    );
                }
            }
            target.cpus = c.cpus.clone();
            target.exclusive_cpus = c.exclusive_cpus;
            target.memory = c.memory.clone();
            target.dynamic = c.dynamic.clone();
        }
    }
    if let Some(cri) = records.get(&Source::Cri) {
        for (name, c) in &cri.containers {
            let target = out.container_mut(name);
            target.cpus = c.cpus.clone();
            target.exclusive_cpus = c.exclusive_cpus;
            target.memory = c.memory.clone();
        }
    }
    if let Some(slots) = records.get(&Source::Slots) {
        for (name, c) in &slots.containers {
            let target = out.container_mut(name);
            for d in &c.devices {
                target.add_devices(
                    &d.resource_name,
                    d.device_ids.iter().cloned(),
                    &d.numa_nodes,
                );
            }
        }
    }
    if let Some(dra) = records.get(&Source::Dra) {
        for (name, c) in &dra.containers {
            let target = out.container_mut(name);
            for claim in &c.dynamic {
                target.dynamic.retain(|d| {
                    (d.claim_namespace.as_str(), d.claim_name.as_str())
                        != (claim.claim_namespace.as_str(), claim.claim_name.as_str())
                });
                target.dynamic.push(claim.clone());
            }
            target.dynamic.sort();
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str) -> PodAssignments {
        PodAssignments::new(PodRef::new(uid, "ns", uid))
    }

    #[test]
    fn slots_decide_steward_resource_names_and_kubelet_the_rest() {
        let mut kubelet = pod("a");
        let c = kubelet.container_mut("main");
        c.add_devices("steward.dev/cam", ["cam-0"], &BTreeSet::new());
        c.add_devices("vendor.com/gpu", ["gpu-1"], &BTreeSet::from([0]));
        c.cpus = CpuSet::from_iter([0, 1, 2, 3]);
        let mut slots = pod("a");
        slots
            .container_mut("main")
            .add_devices("steward.dev/cam", ["cam-1"], &BTreeSet::new());
        let mut cri = pod("a");
        cri.container_mut("main").cpus = CpuSet::from_iter([2]);
        cri.container_mut("main").exclusive_cpus = true;

        let records = BTreeMap::from([
            (Source::Kubelet, &kubelet),
            (Source::Cri, &cri),
            (Source::Slots, &slots),
        ]);
        let names = BTreeSet::from(["steward.dev/cam".to_string()]);
        let merged = merge(&records, &names).unwrap_or_else(|| pod("none"));
        let main = &merged.containers["main"];
        assert_eq!(
            main.devices_of("steward.dev/cam")
                .map(|d| d.device_ids.clone()),
            Some(BTreeSet::from(["cam-1".to_string()])),
            "kubelet's lagging cam-0 must not show"
        );
        assert_eq!(
            main.devices_of("vendor.com/gpu")
                .map(|d| d.numa_nodes.clone()),
            Some(BTreeSet::from([0]))
        );
        assert_eq!(main.cpus, CpuSet::from_iter([2]));
        assert!(main.exclusive_cpus);
    }

    #[test]
    fn kubelet_cpus_stand_when_the_cri_manager_has_no_record() {
        let mut kubelet = pod("a");
        kubelet.container_mut("side").cpus = CpuSet::from_iter([5]);
        let records = BTreeMap::from([(Source::Kubelet, &kubelet)]);
        let merged = merge(&records, &BTreeSet::new()).unwrap_or_else(|| pod("none"));
        assert_eq!(merged.containers["side"].cpus, CpuSet::from_iter([5]));
        assert!(merge(&BTreeMap::new(), &BTreeSet::new()).is_none());
    }

    #[test]
    fn shrunk_to_keeps_only_what_both_hold() {
        let mut before = pod("a");
        before
            .container_mut("main")
            .add_devices("r", ["d1", "d2"], &BTreeSet::new());
        let mut after = pod("a");
        after
            .container_mut("main")
            .add_devices("r", ["d2", "d3"], &BTreeSet::new());
        let mid = before.shrunk_to(Some(&after));
        assert_eq!(
            mid.containers["main"]
                .devices_of("r")
                .map(|d| d.device_ids.clone()),
            Some(BTreeSet::from(["d2".to_string()]))
        );
        assert!(before.shrunk_to(None).containers["main"].devices.is_empty());
    }
}
