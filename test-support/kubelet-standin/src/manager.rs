//! Device manager state: resources and their devices, pod→container→resource
//! allocations, and the device selection logic of kubelet's devicemanager.
//!
//! Everything here is synchronous and runs under the stand-in's state lock;
//! gRPC calls to plugins happen in `admission`/`endpoint` with the lock released.

use std::collections::{BTreeMap, BTreeSet};

use steward_proto::deviceplugin::v1beta1::{
    ContainerAllocateResponse, Device, DevicePluginOptions, HEALTHY,
    device_plugin_client::DevicePluginClient,
};
use tonic::transport::Channel;
use tracing::{debug, warn};

use crate::checkpoint::{self, CheckpointData, DevicesPerNuma, NO_TOPOLOGY, PodDevicesEntry};
use crate::pods::PodStatus;

/// What the stand-in knows about one extended resource.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourceState {
    /// IDs of devices last reported `Healthy`.
    pub healthy: BTreeSet<String>,
    /// IDs of devices reported unhealthy, or all devices once the plugin's
    /// ListAndWatch stream has ended.
    pub unhealthy: BTreeSet<String>,
    /// NUMA nodes of each device (empty: the plugin reported no topology).
    pub topology: BTreeMap<String, Vec<i64>>,
    /// Whether a plugin endpoint is currently connected (ListAndWatch running).
    pub connected: bool,
    /// Socket file name the plugin registered with.
    pub endpoint: String,
    /// Options returned by the plugin's `GetDevicePluginOptions`.
    pub pre_start_required: bool,
    pub get_preferred_allocation_available: bool,
    /// How many times a plugin registered this resource since the stand-in
    /// (re)started.
    pub registrations: u64,
}

impl ResourceState {
    /// Node capacity for this resource as kubelet computes it.
    pub fn capacity(&self) -> usize {
        self.healthy.len() + self.unhealthy.len()
    }

    /// Node allocatable for this resource as kubelet computes it.
    pub fn allocatable(&self) -> usize {
        self.healthy.len()
    }
}

/// The live connection to a registered plugin.
pub(crate) struct Endpoint {
    pub client: DevicePluginClient<Channel>,
    pub options: DevicePluginOptions,
    pub generation: u64,
    pub task: tokio::task::AbortHandle,
}

pub(crate) struct ResourceEntry {
    pub state: ResourceState,
    pub endpoint: Option<Endpoint>,
}

/// One container's allocation of one resource.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Allocation {
    pub devices: DevicesPerNuma,
    pub response: Option<ContainerAllocateResponse>,
}

impl Allocation {
    pub fn ids(&self) -> BTreeSet<String> {
        self.devices.values().flatten().cloned().collect()
    }
}

/// pod UID → container → resource → allocation.
pub(crate) type PodDevices = BTreeMap<String, BTreeMap<String, BTreeMap<String, Allocation>>>;

/// Container → resource → device IDs, as reported by `Kubelet::allocated`.
pub type ContainerDevices = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

#[derive(Default)]
pub(crate) struct State {
    pub resources: BTreeMap<String, ResourceEntry>,
    pub pod_devices: PodDevices,
    pub pods: BTreeMap<String, PodStatus>,
    pub next_generation: u64,
    /// Pod UID currently being admitted: kubelet does not garbage collect a
    /// pod pending admission.
    pub admitting: Option<String>,
    /// resource → how long each successful Allocate rpc took, in call order
    /// (kubelet's `device_plugin_alloc_duration_seconds`).
    pub alloc_durations: BTreeMap<String, Vec<std::time::Duration>>,
    /// Registered DRA plugins (the plugin watcher's DRA handler).
    pub dra_plugins: crate::plugin_registry::Registry,
    /// The DRA manager's claim infos.
    pub dra_claims: crate::dra_state::ClaimInfos,
}

impl State {
    pub fn resource_states(&self) -> BTreeMap<String, ResourceState> {
        self.resources
            .iter()
            .map(|(k, v)| (k.clone(), v.state.clone()))
            .collect()
    }

    /// Whether a pod holds on to its devices (known and not terminated).
    pub fn is_live(&self, uid: &str) -> bool {
        self.admitting.as_deref() == Some(uid)
            || self.pods.get(uid).is_some_and(|p| !p.phase.is_terminal())
    }

    /// `UpdateAllocatedDevices`: forget allocations of pods that are no longer
    /// active. Returns whether anything was removed.
    pub fn remove_inactive_pods(&mut self) -> bool {
        let stale: Vec<String> = self
            .pod_devices
            .keys()
            .filter(|uid| !self.is_live(uid))
            .cloned()
            .collect();
        for uid in &stale {
            debug!(pod_uid = %uid, "releasing devices of inactive pod");
            self.pod_devices.remove(uid);
        }
        !stale.is_empty()
    }

    /// Device IDs of `resource` held by any pod still in the allocation table.
    pub fn devices_in_use(&self, resource: &str) -> BTreeSet<String> {
        self.pod_devices
            .values()
            .flat_map(|containers| containers.values())
            .filter_map(|resources| resources.get(resource))
            .flat_map(|a| a.ids())
            .collect()
    }

    /// `isDevicePluginResource`: registered now, or present in allocations.
    pub fn is_device_plugin_resource(&self, resource: &str) -> bool {
        self.resources.contains_key(resource)
            || self
                .pod_devices
                .values()
                .flat_map(|c| c.values())
                .any(|r| r.contains_key(resource))
    }

    pub fn container_devices(&self, uid: &str) -> Option<ContainerDevices> {
        self.pod_devices.get(uid).map(|containers| {
            containers
                .iter()
                .map(|(c, resources)| {
                    (
                        c.clone(),
                        resources
                            .iter()
                            .map(|(r, a)| (r.clone(), a.ids()))
                            .collect(),
                    )
                })
                .collect()
        })
    }

    /// Groups device IDs by the NUMA nodes the plugin reported for them.
    pub fn devices_per_numa<'a>(
        &self,
        resource: &str,
        ids: impl IntoIterator<Item = &'a String>,
    ) -> DevicesPerNuma {
        let topology = self.resources.get(resource).map(|e| &e.state.topology);
        let mut out = DevicesPerNuma::new();
        for id in ids {
            let nodes = topology.and_then(|t| t.get(id)).filter(|n| !n.is_empty());
            match nodes {
                Some(nodes) => {
                    for node in nodes {
                        out.entry(*node).or_default().push(id.clone());
                    }
                }
                None => out.entry(NO_TOPOLOGY).or_default().push(id.clone()),
            }
        }
        out
    }

    /// Applies a ListAndWatch update: the device list replaces the old one.
    pub fn update_devices(&mut self, resource: &str, devices: &[Device]) -> bool {
        let Some(entry) = self.resources.get_mut(resource) else {
            return false;
        };
        let st = &mut entry.state;
        st.healthy.clear();
        st.unhealthy.clear();
        st.topology.clear();
        for d in devices {
            if d.health == HEALTHY {
                st.healthy.insert(d.id.clone());
            } else {
                st.unhealthy.insert(d.id.clone());
            }
            let nodes = d
                .topology
                .as_ref()
                .map(|t| t.nodes.iter().map(|n| n.id).collect())
                .unwrap_or_default();
            st.topology.insert(d.id.clone(), nodes);
        }
        true
    }

    /// After the endpoint stopped: every device becomes unhealthy.
    pub fn mark_resource_unhealthy(&mut self, resource: &str) {
        if let Some(entry) = self.resources.get_mut(resource) {
            let st = &mut entry.state;
            let healthy = std::mem::take(&mut st.healthy);
            st.unhealthy.extend(healthy);
            st.connected = false;
            entry.endpoint = None;
        }
    }

    /// Stops every plugin connection and forgets registered resources.
    pub fn drop_endpoints(&mut self) {
        for entry in self.resources.values() {
            if let Some(ep) = &entry.endpoint {
                ep.task.abort();
            }
        }
        self.resources.clear();
    }

    pub fn checkpoint_data(&self) -> CheckpointData {
        let mut entries = Vec::new();
        for (uid, containers) in &self.pod_devices {
            for (container, resources) in containers {
                for (resource, alloc) in resources {
                    entries.push(PodDevicesEntry {
                        pod_uid: uid.clone(),
                        container_name: container.clone(),
                        resource_name: resource.clone(),
                        device_ids: alloc.devices.clone(),
                        alloc_resp: alloc.response.as_ref().map(checkpoint::encode_alloc_resp),
                    });
                }
            }
        }
        let registered_devices = self
            .resources
            .iter()
            .map(|(r, e)| {
                let mut all: Vec<String> =
                    e.state.healthy.union(&e.state.unhealthy).cloned().collect();
                all.sort();
                (r.clone(), all)
            })
            .collect();
        CheckpointData {
            pod_device_entries: entries,
            registered_devices,
        }
    }

    /// Replaces the allocation table with the checkpoint's content.
    pub fn restore_pod_devices(&mut self, data: &CheckpointData) {
        self.pod_devices.clear();
        for e in &data.pod_device_entries {
            let response = match e.alloc_resp.as_deref().map(checkpoint::decode_alloc_resp) {
                Some(Ok(r)) => Some(r),
                Some(Err(err)) => {
                    warn!(pod_uid = %e.pod_uid, error = %err, "dropping unreadable AllocResp");
                    None
                }
                None => None,
            };
            self.pod_devices
                .entry(e.pod_uid.clone())
                .or_default()
                .entry(e.container_name.clone())
                .or_default()
                .insert(
                    e.resource_name.clone(),
                    Allocation {
                        devices: e.device_ids.clone(),
                        response,
                    },
                );
        }
    }
}

/// First half of `devicesToAllocate`: the checks and what can be taken from
/// devices already held by the pod's init containers.
#[derive(Debug)]
pub(crate) struct Selection {
    pub required: usize,
    /// Devices chosen so far (reused ones first).
    pub allocated: BTreeSet<String>,
    /// Healthy devices held by nobody.
    pub available: BTreeSet<String>,
}

impl Selection {
    pub fn needed(&self) -> usize {
        self.required.saturating_sub(self.allocated.len())
    }

    /// Takes devices from `from` (in order) until the request is satisfied.
    /// Returns true once complete.
    pub fn take_from<'a>(&mut self, from: impl IntoIterator<Item = &'a String>) -> bool {
        for d in from {
            if self.needed() == 0 {
                break;
            }
            self.allocated.insert(d.clone());
        }
        self.needed() == 0
    }
}

/// Starts a selection of `required` devices of `resource`, or returns the
/// error text kubelet's devicemanager produces.
pub(crate) fn begin_selection(
    state: &State,
    resource: &str,
    required: usize,
    reusable: Option<&BTreeSet<String>>,
) -> Result<Selection, String> {
    let Some(entry) = state.resources.get(resource) else {
        return Err(format!("cannot allocate unregistered device {resource}"));
    };
    if entry.state.healthy.is_empty() {
        return Err(format!(
            "no healthy devices present; cannot allocate unhealthy devices {resource}"
        ));
    }
    let in_use = state.devices_in_use(resource);
    let available: BTreeSet<String> = entry.state.healthy.difference(&in_use).cloned().collect();
    let mut sel = Selection {
        required,
        allocated: BTreeSet::new(),
        available,
    };
    if let Some(reusable) = reusable
        && sel.take_from(reusable)
    {
        return Ok(sel);
    }
    let needed = sel.needed();
    if sel.available.len() < needed {
        return Err(format!(
            "requested number of devices unavailable for {resource}. Requested: {needed}, Available: {}",
            sel.available.len()
        ));
    }
    Ok(sel)
}

/// Second half: preferred devices (restricted to available ones), then the
/// remaining available devices in order.
pub(crate) fn finish_selection(
    mut sel: Selection,
    preferred: Option<&[String]>,
) -> Result<BTreeSet<String>, String> {
    if let Some(preferred) = preferred {
        let usable: Vec<String> = preferred
            .iter()
            .filter(|d| sel.available.contains(*d))
            .cloned()
            .collect();
        if sel.take_from(&usable) {
            return Ok(sel.allocated);
        }
    }
    let rest: Vec<String> = sel.available.iter().cloned().collect();
    if sel.take_from(&rest) {
        return Ok(sel.allocated);
    }
    Err(format!(
        "unexpectedly allocated less resources than required. Requested: {}, Got: {}",
        sel.required,
        sel.allocated.len()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use steward_proto::deviceplugin::v1beta1::{NumaNode, TopologyInfo, UNHEALTHY};

    fn state_with(resource: &str, devices: &[(&str, bool, Option<i64>)]) -> State {
        let mut st = State::default();
        st.resources.insert(
            resource.to_string(),
            ResourceEntry {
                state: ResourceState::default(),
                endpoint: None,
            },
        );
        let devices: Vec<Device> = devices
            .iter()
            .map(|(id, healthy, numa)| Device {
                id: id.to_string(),
                health: if *healthy { HEALTHY } else { UNHEALTHY }.to_string(),
                topology: numa.map(|n| TopologyInfo {
                    nodes: vec![NumaNode { id: n }],
                }),
            })
            .collect();
        assert!(st.update_devices(resource, &devices));
        st
    }

    fn hold(st: &mut State, uid: &str, resource: &str, ids: &[&str]) {
        let ids: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
        let devices = st.devices_per_numa(resource, &ids);
        st.pod_devices
            .entry(uid.to_string())
            .or_default()
            .entry("c".to_string())
            .or_default()
            .insert(
                resource.to_string(),
                Allocation {
                    devices,
                    response: None,
                },
            );
    }

    #[test]
    fn selection_skips_held_and_unhealthy_devices() {
        let mut st = state_with(
            "r/x",
            &[("a", true, None), ("b", true, None), ("c", false, None)],
        );
        hold(&mut st, "p1", "r/x", &["a"]);
        let sel = begin_selection(&st, "r/x", 1, None).unwrap();
        assert_eq!(sel.available, ["b".to_string()].into_iter().collect());
        let got = finish_selection(sel, None).unwrap();
        assert_eq!(got, ["b".to_string()].into_iter().collect());
        let err = begin_selection(&st, "r/x", 2, None).unwrap_err();
        assert_eq!(
            err,
            "requested number of devices unavailable for r/x. Requested: 2, Available: 1"
        );
    }

    #[test]
    fn selection_reuses_first_and_honours_preference() {
        let st = state_with(
            "r/x",
            &[("a", true, None), ("b", true, None), ("c", true, None)],
        );
        let reuse: BTreeSet<String> = ["a".to_string()].into_iter().collect();
        let sel = begin_selection(&st, "r/x", 1, Some(&reuse)).unwrap();
        assert_eq!(sel.needed(), 0);
        let sel = begin_selection(&st, "r/x", 2, None).unwrap();
        let preferred = vec!["c".to_string(), "zz".to_string()];
        let got = finish_selection(sel, Some(&preferred)).unwrap();
        // "zz" is not available, so the rest comes from the ordered pool.
        assert_eq!(
            got,
            ["a".to_string(), "c".to_string()].into_iter().collect()
        );
    }

    #[test]
    fn selection_errors_like_kubelet() {
        let st = state_with("r/x", &[("a", false, None)]);
        assert_eq!(
            begin_selection(&st, "r/x", 1, None).unwrap_err(),
            "no healthy devices present; cannot allocate unhealthy devices r/x"
        );
        assert_eq!(
            begin_selection(&st, "r/y", 1, None).unwrap_err(),
            "cannot allocate unregistered device r/y"
        );
    }

    #[test]
    fn numa_grouping_and_checkpoint_round_trip() {
        let mut st = state_with(
            "r/x",
            &[
                ("a", true, Some(0)),
                ("b", true, Some(1)),
                ("c", true, None),
            ],
        );
        let ids = vec!["a".to_string(), "b".to_string(), "c".to_string()];
        let per = st.devices_per_numa("r/x", &ids);
        assert_eq!(per.get(&0), Some(&vec!["a".to_string()]));
        assert_eq!(per.get(&1), Some(&vec!["b".to_string()]));
        assert_eq!(per.get(&NO_TOPOLOGY), Some(&vec!["c".to_string()]));
        hold(&mut st, "p1", "r/x", &["a", "c"]);
        let data = st.checkpoint_data();
        assert_eq!(data.registered_devices["r/x"], ids);
        let mut other = State::default();
        other.restore_pod_devices(&data);
        assert_eq!(other.pod_devices, st.pod_devices);
        // p1 is unknown to `other`: it is garbage collected.
        assert!(other.remove_inactive_pods());
        assert!(other.pod_devices.is_empty());
    }

    #[test]
    fn endpoint_stop_marks_everything_unhealthy() {
        let mut st = state_with("r/x", &[("a", true, None), ("b", false, None)]);
        st.mark_resource_unhealthy("r/x");
        let s = &st.resources["r/x"].state;
        assert!(s.healthy.is_empty());
        assert_eq!(s.unhealthy.len(), 2);
        assert_eq!(s.capacity(), 2);
        assert_eq!(s.allocatable(), 0);
    }
}
