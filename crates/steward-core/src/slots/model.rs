//! Inputs, outputs and errors of the slot ledger.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::Millis;
use crate::ledger::Holding;

/// Timing of the slot ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SlotConfig {
    /// How long a slot handed out by Allocate may stay unattributed (no pod
    /// seen using it in kubelet's pod resources) before it is released. Also
    /// bounds how long an allocate plan may stay outstanding and how long a
    /// pod-resources entry naming a pod the pod watch has not delivered yet
    /// is kept. Must exceed the pod watch latency.
    pub pending_timeout_ms: u64,
    /// How long after an Allocate was answered kubelet has certainly
    /// recorded the devices it handed to the pod (kubelet stores a pod's
    /// devices when it receives the Allocate response and keeps them until
    /// the pod is removed). A full pod-resources `List` taken at least this
    /// long after the answer that shows no pod using a still unattributed
    /// slot releases it at once: the pod it was allocated for is gone.
    /// Should be well below `pending_timeout_ms`.
    #[serde(default = "SlotConfig::default_settle_ms")]
    pub settle_ms: u64,
}

impl SlotConfig {
    /// One minute: Allocate is followed within seconds by container creation,
    /// a pod-resources query and the pod watch event.
    pub const DEFAULT_PENDING_TIMEOUT_MS: u64 = 60_000;

    /// One second: kubelet records a pod's devices right after the Allocate
    /// response arrives, well within this.
    pub const DEFAULT_SETTLE_MS: u64 = 1_000;

    fn default_settle_ms() -> u64 {
        Self::DEFAULT_SETTLE_MS
    }
}

impl Default for SlotConfig {
    fn default() -> Self {
        Self {
            pending_timeout_ms: Self::DEFAULT_PENDING_TIMEOUT_MS,
            settle_ms: Self::DEFAULT_SETTLE_MS,
        }
    }
}

/// What the ledger needs to know about one Instance (one device plugin).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceInfo {
    /// Instance name; its slots are `<name>-<n>` for `0 <= n < capacity`.
    pub name: String,
    /// The extended resource name the Instance's device plugin registers
    /// with kubelet; pod-resources entries under other names are ignored.
    pub resource_name: String,
    /// Number of slots (concurrent users).
    pub capacity: u32,
    /// Visible from several nodes: claims must be won in the cluster.
    pub shared: bool,
    /// This node currently sees the device.
    pub present: bool,
    /// This node may use the device (e.g. it is listed in the Instance's
    /// nodes).
    pub usable: bool,
}

impl InstanceInfo {
    /// Whether the device is there for this node (present and usable).
    pub fn available(&self) -> bool {
        self.present && self.usable
    }

    /// The device ID of slot `n`.
    pub fn slot(&self, n: u32) -> String {
        slot_id(&self.name, n)
    }
}

/// The device ID of slot `n` of `instance`: `<instance>-<n>`.
pub fn slot_id(instance: &str, n: u32) -> String {
    format!("{instance}-{n}")
}

/// Splits a device ID into instance name and slot index. The index must be
/// written canonically (`cam-7`, not `cam-07` or `cam-+7`).
pub fn parse_slot_id(id: &str) -> Option<(&str, u32)> {
    let (instance, index) = id.rsplit_once('-')?;
    if instance.is_empty() || index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if index.len() > 1 && index.starts_with('0') {
        return None;
    }
    let n = index.parse().ok()?;
    Some((instance, n))
}

/// Kubernetes pod phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum PodPhase {
    Pending,
    Running,
    Succeeded,
    Failed,
    Unknown,
}

impl PodPhase {
    /// Succeeded or Failed: the pod will never run again, kubelet has freed
    /// its devices.
    pub fn is_terminal(self) -> bool {
        matches!(self, PodPhase::Succeeded | PodPhase::Failed)
    }
}

/// One pod as delivered by the pod watch (or a list).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodInfo {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    /// `spec.nodeName`; pods of other nodes are ignored.
    pub node: String,
    pub phase: PodPhase,
    /// This is a watch `Deleted` event (the pod object is gone).
    #[serde(default)]
    pub deleted: bool,
}

impl PodInfo {
    /// Not deleted and not in a terminal phase.
    pub fn is_live(&self) -> bool {
        !self.deleted && !self.phase.is_terminal()
    }
}

/// kubelet pod resources (v1 `List` entry or `Get` answer) for one pod.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodResources {
    pub namespace: String,
    pub name: String,
    pub containers: Vec<ContainerResources>,
}

/// Devices of one container.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerResources {
    pub name: String,
    pub devices: Vec<ContainerDevices>,
}

/// Device IDs of one extended resource.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerDevices {
    pub resource_name: String,
    pub device_ids: Vec<String>,
}

/// What a device plugin reports for a slot in ListAndWatch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Health {
    /// Free, or held by this node: kubelet may use it.
    Healthy,
    /// Held by another node, or the device is gone for this node.
    Unhealthy,
}

/// A slot claim by one node: the durable record, in the node's local ledger
/// and in the cluster.
///
/// `holding.resource` is the slot's device ID. Adapters whose cluster
/// representation cannot carry `epoch` or `awaiting` read them back as `0`
/// and `None`; the ledger only relies on the node and the holder there.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Claim {
    /// The node holding the slot.
    pub node: String,
    /// Write counter of the claiming node, increasing with every write it
    /// makes (any slot). A record with a higher epoch is newer.
    pub epoch: u64,
    pub holding: Holding,
    /// Set when an Allocate for this slot was answered (or is being answered)
    /// at this time and no pod has been seen using the slot since: the
    /// holder, if any, may be stale.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub awaiting: Option<Millis>,
}

impl Claim {
    /// The slot's device ID.
    pub fn slot(&self) -> &str {
        &self.holding.resource
    }
}

/// Where a write goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Target {
    /// The local ledger, then the cluster.
    Both,
    /// The local ledger only (the cluster part is queued in the ledger and
    /// re-emitted as [`Target::Cluster`] when the API server is back).
    Local,
    /// The cluster only (a queued write being synced).
    Cluster,
}

impl Target {
    pub fn local(self) -> bool {
        matches!(self, Target::Both | Target::Local)
    }

    pub fn cluster(self) -> bool {
        matches!(self, Target::Both | Target::Cluster)
    }
}

/// A write or notification for the adapters, in order.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Effect {
    /// Store this node's claim (create or replace). In the cluster the write
    /// must only succeed if the slot is unclaimed or claimed by this node,
    /// and must not replace a record of this node with a higher epoch.
    WriteClaim { claim: Claim, target: Target },
    /// Remove this node's claim on `slot` if its epoch is at most `epoch`
    /// (a newer claim of the same slot survives a late delete). Claims of
    /// other nodes are never removed.
    DeleteClaim {
        slot: String,
        epoch: u64,
        target: Target,
    },
    /// The health of the Instance's slots changed: send
    /// [`SlotAllocator::health`](super::SlotAllocator::health) on ListAndWatch.
    HealthChanged { instance: String },
}

/// Identity of an outstanding allocate plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PlanId(pub u64);

impl fmt::Display for PlanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "plan#{}", self.0)
    }
}

/// The claim writes an Allocate needs before it may be answered.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AllocatePlan {
    pub id: PlanId,
    /// One record per requested slot, in request order (duplicates removed).
    pub writes: Vec<Claim>,
    /// [`Target::Both`] when the API server is reachable, else
    /// [`Target::Local`].
    pub target: Target,
}

/// Why an Allocate is refused. Nothing changed in the ledger.
#[derive(Debug, Clone, PartialEq, Eq, Hash, thiserror::Error)]
pub enum AllocateError {
    #[error("allocate request names no device")]
    NoDevices,
    #[error("unknown device {id:?}: not a slot of any instance served by this node")]
    UnknownDevice { id: String },
    #[error(
        "device {id:?} is gone: instance {instance:?} is not present or not usable on this node"
    )]
    DeviceGone { id: String, instance: String },
    #[error("slot {id:?} is held by node {node:?}")]
    HeldByOtherNode { id: String, node: String },
    #[error("slot {id:?} is reserved for a pod scheduled to node {node:?}")]
    ReservedForOtherNode { id: String, node: String },
    #[error(
        "slot {id:?} of shared instance {instance:?} cannot be claimed while the API server is unreachable (shared devices fail closed)"
    )]
    ClusterUnreachable { id: String, instance: String },
    #[error("slot {id:?} is being claimed by another allocate still in flight; retry")]
    ClaimInFlight { id: String },
    #[error("slot {id:?} is held by DRA ResourceClaim {claim} (prepared by kubelet)")]
    HeldByClaim { id: String, claim: String },
    #[error("slot {id:?} is in use through the device plugin ({pod})")]
    InUseByDevicePlugin { id: String, pod: String },
}

/// A plan completion naming no outstanding plan.
#[derive(Debug, Clone, PartialEq, Eq, Hash, thiserror::Error)]
pub enum PlanError {
    #[error("{0} is not outstanding (already finished, expired, or lost in a restart)")]
    UnknownPlan(PlanId),
}
