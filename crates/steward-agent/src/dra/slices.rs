//! Publishing this node's devices as `resource.k8s.io/v1` ResourceSlices
//! (driver `steward.dev`): the adapter of [`steward_core::dra::plan`].
//!
//! Follows every Instance; after each change writes the slices this node
//! is responsible for — its own pool and the pools of the shared Instances
//! it is the writer of — and deletes the ones it wrote that are no longer
//! wanted. Writes are proportional to change: a slice whose content did not
//! change is not written, and a pool's generation moves only when one of
//! its slices changes. A shared pool that changes writer (its first node
//! went) is taken over by update: the slice names do not depend on the
//! writer, and a node deletes a slice only if it is still the one that
//! wrote it (the resourceVersion it last saw). On shutdown the node's own
//! slices are deleted.
//!
//! Taints are the plan's (held slots, devices whose discovery reports a
//! fault: `steward_core::dra::device_taints`), mapped as they are; a
//! device untainted in the plan is written without them, so recovery
//! needs no restart. Whether the API server keeps taints is learnt from
//! the first tainted write.
//!
//! DeviceClasses per Configuration are `steward controller`'s; the kubelet
//! plugin is `super::kubelet`. Not here: ownerReferences to the Node.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::FutureExt as _;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Device, DeviceAttribute, DeviceCapacity,
    DeviceTaint, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::Api;
use kube::api::{DeleteParams, ListParams, ObjectMeta, PostParams, Preconditions};
use steward_api::{Instance, SlotClaim};
use steward_core::dra::{
    Attribute, DRIVER, DraInstance, Layout, PlannedTaint, PoolScope, SLOTS_CAPACITY, SliceDevice,
    SlicePlan, next_generation, plan_with, slice_name,
};
use steward_kube::{Mirror, SharedWatch};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

pub use steward_core::dra::{WRITER_LABEL, writer_label};

/// How long a failed write waits before the slices are synced again.
const RETRY: Duration = Duration::from_secs(1);

fn attribute(a: &Attribute) -> DeviceAttribute {
    let mut out = DeviceAttribute::default();
    match a {
        Attribute::String(s) => out.string = Some(s.clone()),
        Attribute::Int(n) => out.int = Some(*n),
        Attribute::Bool(b) => out.bool = Some(*b),
        Attribute::Version(v) => out.version = Some(v.clone()),
    }
    out
}

/// The API's form of a planned taint; `timeAdded` is the API server's
/// (and ignored when comparing, [`content`]).
fn taint(t: &PlannedTaint) -> DeviceTaint {
    DeviceTaint {
        key: t.key.clone(),
        value: Some(t.value.clone()),
        effect: t.effect.as_str().into(),
        time_added: None,
    }
}

/// Whether the API server keeps device taints (`DRADeviceTaints`), as the
/// first write of a tainted device showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Taints {
    /// Not written yet: taints are sent.
    Unknown,
    Kept,
    /// Dropped: the feature gate is off (Kubernetes 1.35's default).
    /// Taints are no longer sent, so the slices stay what was stored.
    Dropped,
}

/// Whether the API server keeps `allowMultipleAllocations`
/// (`DRAConsumableCapacity`), as the first write of a consumable device
/// showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Consumable {
    Unknown,
    Kept,
    /// Dropped: the slices go back to one device per slot.
    Dropped,
}

/// One slot of capacity, consumed by an allocation that asks for none.
fn one() -> Quantity {
    Quantity("1".into())
}

/// The API's form of one planned device; with its planned taints (held,
/// unhealthy) when `taints`.
fn device(d: &SliceDevice, taints: bool) -> Device {
    let consumable = d.slots.map(|n| {
        BTreeMap::from([(
            SLOTS_CAPACITY.to_owned(),
            DeviceCapacity {
                value: Quantity(n.to_string()),
                request_policy: Some(CapacityRequestPolicy {
                    default: Some(one()),
                    valid_range: Some(CapacityRequestPolicyRange {
                        min: one(),
                        step: Some(one()),
                        max: None,
                    }),
                    valid_values: None,
                }),
            },
        )])
    });
    Device {
        name: d.name.clone(),
        attributes: Some(
            d.attributes
                .iter()
                .map(|(k, v)| (k.clone(), attribute(v)))
                .collect(),
        ),
        taints: (taints && !d.taints.is_empty()).then(|| d.taints.iter().map(taint).collect()),
        allow_multiple_allocations: consumable.is_some().then_some(true),
        capacity: consumable,
        ..Device::default()
    }
}

/// The spec of one planned slice at `generation`; devices tainted as
/// planned when `taints`.
fn spec(p: &SlicePlan, generation: i64, taints: bool) -> ResourceSliceSpec {
    let (node_name, node_selector) = match &p.scope {
        PoolScope::Node(n) => (Some(n.clone()), None),
        PoolScope::Nodes(ns) => (
            None,
            Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_fields: Some(vec![NodeSelectorRequirement {
                        key: "metadata.name".into(),
                        operator: "In".into(),
                        values: Some(ns.iter().cloned().collect()),
                    }]),
                    ..NodeSelectorTerm::default()
                }],
            }),
        ),
    };
    ResourceSliceSpec {
        driver: DRIVER.into(),
        pool: ResourcePool {
            name: p.pool.clone(),
            generation,
            resource_slice_count: i64::try_from(p.count).unwrap_or(i64::MAX),
        },
        node_name,
        node_selector,
        devices: Some(p.devices.iter().map(|d| device(d, taints)).collect()),
        ..ResourceSliceSpec::default()
    }
}

/// The spec with the pool generation zeroed and the taints' `timeAdded`
/// (set by the API server) cleared: what comparisons look at.
fn content(s: &ResourceSliceSpec) -> ResourceSliceSpec {
    let mut s = s.clone();
    s.pool.generation = 0;
    for d in s.devices.iter_mut().flatten() {
        for t in d.taints.iter_mut().flatten() {
            t.time_added = None;
        }
    }
    s
}

/// Whether `stored` is `wanted` (generation included).
fn same(stored: &ResourceSliceSpec, wanted: &ResourceSliceSpec) -> bool {
    stored.pool.generation == wanted.pool.generation && content(stored) == content(wanted)
}

/// Whether the server kept the taints `sent` had.
fn kept_taints(sent: &ResourceSliceSpec, stored: &ResourceSliceSpec) -> Option<bool> {
    let count = |s: &ResourceSliceSpec| -> usize {
        s.devices
            .iter()
            .flatten()
            .map(|d| d.taints.as_ref().map_or(0, Vec::len))
            .sum()
    };
    let sent = count(sent);
    (sent > 0).then(|| count(stored) == sent)
}

/// Whether the server kept `allowMultipleAllocations` of the devices
/// `sent` had it on.
fn kept_consumable(sent: &ResourceSliceSpec, stored: &ResourceSliceSpec) -> Option<bool> {
    let count = |s: &ResourceSliceSpec| -> usize {
        s.devices
            .iter()
            .flatten()
            .filter(|d| d.allow_multiple_allocations == Some(true))
            .count()
    };
    let sent = count(sent);
    (sent > 0).then(|| count(stored) == sent)
}

/// The slices one node has written, as last seen.
pub struct SlicePublisher {
    api: Api<ResourceSlice>,
    node: String,
    label: String,
    /// slice name → the object as written (its resourceVersion).
    written: Option<BTreeMap<String, ResourceSlice>>,
    taints: Taints,
    /// The layout asked for, and whether the server keeps it.
    layout: Layout,
    consumable: Consumable,
}

impl SlicePublisher {
    pub fn new(client: kube::Client, node: &str) -> Self {
        Self {
            api: Api::all(client),
            node: node.to_owned(),
            label: writer_label(node),
            written: None,
            taints: Taints::Unknown,
            layout: Layout::PerSlot,
            consumable: Consumable::Unknown,
        }
    }

    /// The same, publishing Instances of several slots as `layout` says
    /// while the API server keeps it.
    pub fn with_layout(mut self, layout: Layout) -> Self {
        self.layout = layout;
        self
    }

    /// The layout to plan with: the one asked for, unless the API server
    /// dropped consumable devices.
    pub fn layout(&self) -> Layout {
        if self.consumable == Consumable::Dropped {
            Layout::PerSlot
        } else {
            self.layout
        }
    }

    /// What this node wrote earlier (read once, then kept up to date by
    /// its own writes).
    async fn load(&mut self) -> Result<&mut BTreeMap<String, ResourceSlice>, kube::Error> {
        if self.written.is_none() {
            let lp = ListParams::default().labels(&format!("{WRITER_LABEL}={}", self.label));
            let mine = self
                .api
                .list(&lp)
                .await?
                .items
                .into_iter()
                .filter(|s| s.spec.driver == DRIVER)
                .filter_map(|s| Some((s.metadata.name.clone()?, s)))
                .collect();
            self.written = Some(mine);
        }
        Ok(self.written.get_or_insert_with(BTreeMap::new))
    }

    /// Makes the slices written by this node what `plans` says; returns
    /// how many objects were written or deleted.
    pub async fn sync(&mut self, plans: &[SlicePlan]) -> Result<usize, kube::Error> {
        let label = self.label.clone();
        let api = self.api.clone();
        let taints = self.taints != Taints::Dropped;
        let mut taint_support = self.taints;
        let mut consumable = self.consumable;
        let written = self.load().await?;
        // A slice wanted here that another node wrote (a shared pool whose
        // writer changed) is adopted: its generation and content count.
        for p in plans {
            let name = slice_name(&p.pool, p.index);
            if !written.contains_key(&name)
                && let Some(old) = api.get_opt(&name).await?
            {
                written.insert(name, old);
            }
        }
        // Generations per pool: kept while every slice of the pool is the
        // same, else one more than the highest seen.
        let mut wanted: BTreeMap<String, ResourceSliceSpec> = BTreeMap::new();
        let mut by_pool: BTreeMap<&str, Vec<&SlicePlan>> = BTreeMap::new();
        for p in plans {
            by_pool.entry(p.pool.as_str()).or_default().push(p);
        }
        for (pool, slices) in by_pool {
            let current: Vec<&ResourceSlice> = written
                .values()
                .filter(|s| s.spec.pool.name == pool)
                .collect();
            let highest = current.iter().map(|s| s.spec.pool.generation).max();
            let unchanged = current.len() == slices.len()
                && slices.iter().all(|p| {
                    written
                        .get(&slice_name(&p.pool, p.index))
                        .is_some_and(|s| content(&s.spec) == content(&spec(p, 0, taints)))
                });
            let generation = next_generation(highest, unchanged);
            for p in slices {
                wanted.insert(slice_name(&p.pool, p.index), spec(p, generation, taints));
            }
        }
        let mut writes = 0;
        for (name, spec) in &wanted {
            if written.get(name).is_some_and(|s| same(&s.spec, spec)) {
                continue;
            }
            let mut obj = ResourceSlice {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    labels: Some(BTreeMap::from([(WRITER_LABEL.to_owned(), label.clone())])),
                    ..ObjectMeta::default()
                },
                spec: spec.clone(),
            };
            let stored = match written.get(name) {
                Some(old) => {
                    obj.metadata.resource_version = old.metadata.resource_version.clone();
                    api.replace(name, &PostParams::default(), &obj).await
                }
                // Created meanwhile by another node: a 409, read again next
                // time.
                None => api.create(&PostParams::default(), &obj).await,
            };
            match stored {
                Ok(s) => {
                    match kept_taints(spec, &s.spec) {
                        Some(true) => taint_support = Taints::Kept,
                        Some(false) if taint_support != Taints::Dropped => {
                            warn!(
                                "the API server dropped the device taints of ResourceSlice {name}: \
                                 DRADeviceTaints is off (Kubernetes 1.35 has it off by default; on from 1.36). \
                                 Slots held through device plugins stay allocatable to DRA claims, whose \
                                 preparation is refused until the slot is free, and devices reporting a \
                                 fault stay allocatable (their health still reaches kubelet)"
                            );
                            taint_support = Taints::Dropped;
                        }
                        _ => {}
                    }
                    match kept_consumable(spec, &s.spec) {
                        Some(true) => consumable = Consumable::Kept,
                        Some(false) if consumable != Consumable::Dropped => {
                            warn!(
                                "the API server dropped allowMultipleAllocations of ResourceSlice {name}: \
                                 DRAConsumableCapacity is off (beta, on by default from Kubernetes 1.36). \
                                 Publishing one device per slot instead"
                            );
                            consumable = Consumable::Dropped;
                        }
                        _ => {}
                    }
                    written.insert(name.clone(), s);
                    writes += 1;
                }
                Err(e) => {
                    // Read again next time: someone else changed it.
                    written.remove(name);
                    return Err(e);
                }
            }
        }
        let stale: Vec<String> = written
            .keys()
            .filter(|n| !wanted.contains_key(*n))
            .cloned()
            .collect();
        for name in stale {
            let rv = written
                .get(&name)
                .and_then(|s| s.metadata.resource_version.clone());
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: None,
                    resource_version: rv,
                }),
                ..DeleteParams::default()
            };
            match api.delete(&name, &dp).await {
                Ok(_) => writes += 1,
                // Gone, or taken over by the pool's new writer: not ours.
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                Err(e) => return Err(e),
            }
            written.remove(&name);
        }
        self.taints = taint_support;
        self.consumable = consumable;
        if writes > 0 {
            debug!(node = %self.node, writes, "ResourceSlices synced");
        }
        Ok(writes)
    }
}

fn dra_instance(i: &Instance) -> (String, DraInstance) {
    let name = i.metadata.name.clone().unwrap_or_default();
    (
        format!("{}/{name}", i.metadata.namespace.as_deref().unwrap_or("")),
        DraInstance {
            name,
            namespace: i.metadata.namespace.clone().unwrap_or_default(),
            configuration: i.spec.configuration_name.clone(),
            capacity: i.spec.capacity,
            nodes: i.spec.nodes.iter().cloned().collect(),
            properties: i.spec.properties.clone(),
            held: Default::default(),
        },
    )
}

/// `<namespace>/<instance>` and slot of a SlotClaim held through a device
/// plugin (not for a DRA ResourceClaim); `None` for the others.
fn held_through_plugin(c: &SlotClaim) -> Option<(String, u32)> {
    if c.spec.resource_claim.is_some() {
        return None;
    }
    let ns = c.metadata.namespace.as_deref()?;
    Some((format!("{ns}/{}", c.spec.instance), c.spec.slot))
}

/// Publishes `node`'s ResourceSlices until `stop`, then deletes the ones it
/// wrote. Slots held through device plugins (their SlotClaims) are
/// published tainted (for a consumable device: off its capacity); a burst
/// of claim changes is one sync. Instances of several slots are published
/// as `layout` says, while the API server keeps consumable devices. The
/// Instances and SlotClaims are the agent's shared watches of them.
pub async fn publish(
    client: kube::Client,
    node: String,
    layout: Layout,
    instance_watch: SharedWatch<Instance>,
    claim_watch: SharedWatch<SlotClaim>,
    stop: CancellationToken,
) {
    publish_until(
        client,
        node,
        layout,
        instance_watch,
        claim_watch,
        stop,
        OnStop::Delete,
    )
    .await;
}

/// What [`publish_until`] does with this node's ResourceSlices when it
/// stops.
#[derive(Debug, Clone)]
pub enum OnStop {
    /// Deletes them: the node no longer offers its devices through DRA.
    Delete,
    /// Leaves them when another agent's DRA kubelet plugin is serving on
    /// the node (this agent's successor during a roll, which writes them
    /// from then on), deletes them otherwise.
    KeepForSuccessor {
        /// The driver's plugin directory.
        plugin_dir: std::path::PathBuf,
        /// This agent's own DRA socket there.
        own_socket: std::path::PathBuf,
    },
}

/// [`publish`], doing `on_stop` with the slices when `stop` comes.
pub async fn publish_until(
    client: kube::Client,
    node: String,
    layout: Layout,
    instance_watch: SharedWatch<Instance>,
    claim_watch: SharedWatch<SlotClaim>,
    stop: CancellationToken,
    on_stop: OnStop,
) {
    let mut changes = instance_watch.subscribe();
    let mut claim_changes = claim_watch.subscribe();
    let mut instances = Mirror::keyed(
        |i: &Instance| Some(dra_instance(i).0),
        |i: Instance| Some(dra_instance(&i).1),
    );
    let mut held = Mirror::projected(|c: SlotClaim| held_through_plugin(&c));
    let mut publisher = SlicePublisher::new(client, &node).with_layout(layout);
    let mut retry_at: Option<tokio::time::Instant> = None;
    let mut noted: Vec<String> = Vec::new();
    // The held slots last planned with, and whether anything else changed
    // since the last sync: a SlotClaim change that leaves the held set as
    // it was (a DRA claim, a pending slot bound) costs no plan.
    let mut planned_held: Option<BTreeMap<String, std::collections::BTreeSet<u32>>> = None;
    let mut due = true;
    loop {
        let retry = async {
            match retry_at {
                Some(t) => tokio::time::sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = stop.cancelled() => break,
            () = retry => due = true,
            change = changes.next() => {
                let Some(change) = change else { break };
                if let Err(e) = instances.apply(change) {
                    warn!(error = %e, "the Instance watch for ResourceSlices failed; retrying");
                    continue;
                }
                due = true;
            }
            change = claim_changes.next() => {
                let Some(change) = change else { break };
                if let Err(e) = held.apply(change) {
                    warn!(error = %e, "the SlotClaim watch for ResourceSlices failed; retrying");
                    continue;
                }
            }
        }
        // Everything already waiting is one sync.
        while let Some(Some(change)) = changes.next().now_or_never() {
            let _ = instances.apply(change);
            due = true;
        }
        while let Some(Some(change)) = claim_changes.next().now_or_never() {
            let _ = held.apply(change);
        }
        if !instances.listed() || !held.listed() {
            continue;
        }
        let mut by_instance: BTreeMap<String, std::collections::BTreeSet<u32>> = BTreeMap::new();
        for (key, slot) in held.values() {
            by_instance.entry(key.clone()).or_default().insert(*slot);
        }
        if !due && planned_held.as_ref() == Some(&by_instance) {
            continue;
        }
        let all: Vec<DraInstance> = instances
            .iter()
            .map(|(key, i)| {
                let mut i = i.clone();
                i.held = by_instance.get(key.as_str()).cloned().unwrap_or_default();
                i
            })
            .collect();
        planned_held = Some(by_instance);
        due = false;
        let planned_layout = publisher.layout();
        let (plans, notes) = plan_with(&node, &all, planned_layout);
        if notes != noted {
            for n in &notes {
                info!(node = %node, "{n}");
            }
            noted = notes;
        }
        retry_at = match publisher.sync(&plans).await {
            // The server dropped consumable devices: plan again at once,
            // one device per slot.
            Ok(_) if publisher.layout() != planned_layout => {
                due = true;
                Some(tokio::time::Instant::now())
            }
            Ok(_) => None,
            Err(e) => {
                due = true;
                warn!(error = %e, "writing ResourceSlices failed; retrying");
                Some(tokio::time::Instant::now() + RETRY)
            }
        };
    }
    if let OnStop::KeepForSuccessor {
        plugin_dir,
        own_socket,
    } = &on_stop
        && super::handover::Peers::new(plugin_dir, own_socket)
            .any_serving()
            .await
    {
        info!(node = %node, "another steward agent serves DRA on this node (a roll); its ResourceSlices are left to it");
        return;
    }
    match publisher.sync(&[]).await {
        Ok(n) => info!(node = %node, deleted = n, "ResourceSlices of this node removed"),
        Err(e) => warn!(error = %e, "removing this node's ResourceSlices failed"),
    }
}
