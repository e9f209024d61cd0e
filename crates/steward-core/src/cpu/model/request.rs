//! What a policy is asked to place: the container, its QoS class, its CPU
//! and memory requests, and the policy annotations of its pod.
//!
//! # What CRI tells and what it does not
//!
//! A CRI `CreateContainer` request carries `LinuxContainerResources`:
//! `cpu_shares`, `cpu_quota`/`cpu_period`, `memory_limit_in_bytes` and the
//! pod sandbox's `cgroup_parent`. From those:
//! - the CPU request is recovered from the shares kubelet computed
//!   (`shares = milli * 1024 / 1000`, at least 2) — exact to the millicore
//!   for requests ≥ 3m (1m and 2m give the same 2 shares as no request),
//!   see [`cpu_request_from_shares`];
//! - the CPU limit from quota/period ([`cpu_limit_from_quota`]);
//! - the QoS class from the cgroup parent (`...besteffort...`,
//!   `...burstable...`, otherwise Guaranteed; [`qos_from_cgroup_parent`]).
//!
//! CRI does **not** tell the memory *request* (only the limit), extended
//! resources, init-container-ness for sidecars, or the pod's other
//! containers. Where kubelet passes pod-level resources or the
//! `steward.dev` annotations, the adapter should prefer them; otherwise the
//! memory request is taken equal to the limit for Guaranteed containers and
//! as 0 for the rest ([`derive_from_cri`]).

use std::collections::BTreeMap;

use super::topology::MemoryKind;
use crate::cpu::PolicyError;

/// Kubernetes QoS class of a pod.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub enum Qos {
    Guaranteed,
    Burstable,
    BestEffort,
}

/// Identifies a container: its pod UID and container name.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct ContainerKey {
    pub pod_uid: String,
    pub container: String,
}

impl ContainerKey {
    /// Convenience constructor.
    pub fn new(pod_uid: impl Into<String>, container: impl Into<String>) -> ContainerKey {
        ContainerKey {
            pod_uid: pod_uid.into(),
            container: container.into(),
        }
    }
}

impl std::fmt::Display for ContainerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.pod_uid, self.container)
    }
}

/// A container to place.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ContainerRequest {
    pub key: ContainerKey,
    pub pod_namespace: String,
    pub pod_name: String,
    pub qos: Qos,
    pub cpu_request_milli: u64,
    pub cpu_limit_milli: Option<u64>,
    pub memory_request_bytes: u64,
    pub memory_limit_bytes: Option<u64>,
    /// Pod annotations relevant to policies (see [`Hints`]).
    pub annotations: BTreeMap<String, String>,
    /// UIDs of the DRA claims (driver `cpu.steward.dev`) whose CPUs this
    /// container runs on, exclusively, instead of what the policy would
    /// give it ([`crate::cpu::Policy::set_claims`]). Set by the resource
    /// manager from what the runtime shows of the claim's CDI device, never
    /// from the pod's annotations.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cpu_claims: Vec<String>,
}

/// Requests and limits of one container of a pod spec (`None` = unset).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ContainerResources {
    pub cpu_request_milli: Option<u64>,
    pub cpu_limit_milli: Option<u64>,
    pub memory_request_bytes: Option<u64>,
    pub memory_limit_bytes: Option<u64>,
}

/// QoS class of a pod from its containers' requests and limits, with the
/// Kubernetes rules: a request left unset defaults to the limit;
/// BestEffort when no container sets any CPU or memory request or limit;
/// Guaranteed when every container sets CPU and memory limits and its
/// requests equal them; Burstable otherwise.
pub fn qos_of(containers: &[ContainerResources]) -> Qos {
    let any_set = containers.iter().any(|c| {
        c.cpu_request_milli.is_some_and(|v| v > 0)
            || c.cpu_limit_milli.is_some_and(|v| v > 0)
            || c.memory_request_bytes.is_some_and(|v| v > 0)
            || c.memory_limit_bytes.is_some_and(|v| v > 0)
    });
    if !any_set {
        return Qos::BestEffort;
    }
    let guaranteed = !containers.is_empty()
        && containers.iter().all(|c| {
            let cpu_ok = match c.cpu_limit_milli {
                Some(l) if l > 0 => c.cpu_request_milli.unwrap_or(l) == l,
                _ => false,
            };
            let mem_ok = match c.memory_limit_bytes {
                Some(l) if l > 0 => c.memory_request_bytes.unwrap_or(l) == l,
                _ => false,
            };
            cpu_ok && mem_ok
        });
    if guaranteed {
        Qos::Guaranteed
    } else {
        Qos::Burstable
    }
}

/// CPU request in millicores from the cgroup v1 `cpu.shares` kubelet set
/// (`shares = milli * 1024 / 1000`, at least 2). Rounded up, so it is exact
/// for every request ≥ 3m; `shares <= 2` gives 0
/// (BestEffort and "no request" both map to 2 shares).
pub fn cpu_request_from_shares(shares: u64) -> u64 {
    if shares <= 2 {
        return 0;
    }
    // inverse of floor(milli * 1024 / 1000): the smallest milli with
    // floor(milli*1024/1000) == shares
    (shares * 1000).div_ceil(1024)
}

/// CPU limit in millicores from CFS quota and period; `None` when unlimited
/// (quota ≤ 0 or period 0).
pub fn cpu_limit_from_quota(quota: i64, period: u64) -> Option<u64> {
    if quota <= 0 || period == 0 {
        return None;
    }
    Some((quota as u64 * 1000).div_ceil(period))
}

/// QoS class from the pod sandbox cgroup parent, as kubelet names it
/// (`kubepods-besteffort-pod<uid>.slice`, `/kubepods/burstable/pod<uid>`,
/// and no class segment for Guaranteed). `None` when the path is not a
/// kubelet pod cgroup.
pub fn qos_from_cgroup_parent(cgroup_parent: &str) -> Option<Qos> {
    let lower = cgroup_parent.to_ascii_lowercase();
    if !lower.contains("kubepods") {
        return None;
    }
    if lower.contains("besteffort") {
        Some(Qos::BestEffort)
    } else if lower.contains("burstable") {
        Some(Qos::Burstable)
    } else {
        Some(Qos::Guaranteed)
    }
}

/// What a CRI `LinuxContainerResources` carries about CPU and memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CriResources {
    pub cpu_shares: u64,
    pub cpu_quota: i64,
    pub cpu_period: u64,
    pub memory_limit_in_bytes: i64,
}

/// Requests, limits and QoS recovered from CRI (see the module docs for
/// what cannot be recovered).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DerivedResources {
    pub qos: Qos,
    pub cpu_request_milli: u64,
    pub cpu_limit_milli: Option<u64>,
    pub memory_request_bytes: u64,
    pub memory_limit_bytes: Option<u64>,
}

/// Derives requests and QoS from CRI resources and the sandbox cgroup
/// parent. When the parent does not name a class, Guaranteed is inferred
/// from "CPU limit equals request and a memory limit is set", Burstable from
/// any request/limit, BestEffort otherwise. The memory request is unknown
/// to CRI: the limit for Guaranteed, 0 otherwise.
pub fn derive_from_cri(r: &CriResources, cgroup_parent: &str) -> DerivedResources {
    let mut cpu_request_milli = cpu_request_from_shares(r.cpu_shares);
    let cpu_limit_milli = cpu_limit_from_quota(r.cpu_quota, r.cpu_period);
    let memory_limit_bytes =
        (r.memory_limit_in_bytes > 0).then_some(r.memory_limit_in_bytes as u64);
    let qos = qos_from_cgroup_parent(cgroup_parent).unwrap_or_else(|| {
        match (cpu_limit_milli, memory_limit_bytes) {
            (Some(l), Some(_)) if l == cpu_request_milli => Qos::Guaranteed,
            _ if cpu_request_milli > 0
                || cpu_limit_milli.is_some()
                || memory_limit_bytes.is_some() =>
            {
                Qos::Burstable
            }
            _ => Qos::BestEffort,
        }
    });
    if qos == Qos::Guaranteed {
        // shares round down by < 1m; the quota is the exact request then
        if let Some(l) = cpu_limit_milli
            && l.abs_diff(cpu_request_milli) <= 1
        {
            cpu_request_milli = l;
        }
    }
    DerivedResources {
        qos,
        cpu_request_milli,
        cpu_limit_milli,
        memory_request_bytes: if qos == Qos::Guaranteed {
            memory_limit_bytes.unwrap_or(0)
        } else {
            0
        },
        memory_limit_bytes,
    }
}

// ---------------------------------------------------------------------------
// Annotations

/// Annotation: exclusive CPUs should come from the isolated (isolcpus) set.
/// Value `"true"`/`"false"`.
pub const ANN_PREFER_ISOLATED: &str = "cpu.steward.dev/prefer-isolated";
/// Annotation: a Guaranteed integer-CPU container stays in the shared pool
/// (`"true"`), or a Burstable container with ≥ 1 whole CPU asks for
/// exclusive CPUs (`"false"`, topology-aware only).
pub const ANN_PREFER_SHARED: &str = "cpu.steward.dev/prefer-shared";
/// Annotation: memory tiers to pin to, comma-separated from
/// `dram`, `pmem`, `cxl`, `hbm` (default `dram`, plus `hbm` where present).
pub const ANN_MEMORY_TIER: &str = "memory.steward.dev/tier";
/// Annotation: name of the balloon type the container goes to.
pub const ANN_BALLOON: &str = "balloon.steward.dev/name";

/// Every annotation the CPU policies understand.
pub const KNOWN_ANNOTATIONS: [&str; 4] = [
    ANN_PREFER_ISOLATED,
    ANN_PREFER_SHARED,
    ANN_MEMORY_TIER,
    ANN_BALLOON,
];

/// Separator of a per-container annotation: `<key>.container.<name>`
/// applies only to that container and overrides the pod-wide `<key>`.
pub const CONTAINER_SUFFIX: &str = ".container.";

/// True for keys in a `steward.dev` domain (`steward.dev/...` or
/// `*.steward.dev/...`), which the policies validate strictly.
pub fn is_policy_annotation(key: &str) -> bool {
    match key.split_once('/') {
        Some((domain, _)) => domain == "steward.dev" || domain.ends_with(".steward.dev"),
        None => false,
    }
}

/// The policy hints of one container, parsed and validated from its pod's
/// annotations.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hints {
    pub prefer_isolated: Option<bool>,
    pub prefer_shared: Option<bool>,
    pub memory_tiers: Option<Vec<MemoryKind>>,
    pub balloon: Option<String>,
    /// Not an annotation: exclusive CPUs to leave free per NUMA node,
    /// held for other pods' reservations ([`crate::cpu::Policy::set_holds`]).
    pub withhold: BTreeMap<u32, usize>,
}

impl Hints {
    /// Parses the annotations of `req`. Every `*.steward.dev` key must be a
    /// known annotation (optionally with a `.container.<name>` suffix) with a
    /// well-formed value, otherwise the error names the offending key.
    /// A per-container key for this container overrides the pod-wide key.
    pub fn parse(req: &ContainerRequest) -> Result<Hints, PolicyError> {
        Hints::of_container(&req.annotations, &req.key.container)
    }

    /// [`Hints::parse`] over a pod's annotations for the container named
    /// `name`. With a name no key can carry (`""`), it validates every
    /// policy annotation of the pod and returns the pod-wide hints: what a
    /// runtime checks when the pod's sandbox is created, before any
    /// container.
    pub fn of_container(
        annotations: &BTreeMap<String, String>,
        name: &str,
    ) -> Result<Hints, PolicyError> {
        let mut pod = Hints::default();
        let mut own = Hints::default();
        for (key, value) in annotations {
            if !is_policy_annotation(key) {
                continue;
            }
            let (base, container) = match key.split_once(CONTAINER_SUFFIX) {
                Some((b, c)) => (b, Some(c)),
                None => (key.as_str(), None),
            };
            if container.is_some_and(|c| c.is_empty()) {
                return Err(PolicyError::BadAnnotation {
                    key: key.clone(),
                    value: value.clone(),
                    reason: "empty container name after `.container.`".into(),
                });
            }
            if !KNOWN_ANNOTATIONS.contains(&base) {
                return Err(PolicyError::UnknownAnnotation { key: key.clone() });
            }
            // parse even when it targets another container: bad values are errors
            let target = match container {
                None => &mut pod,
                Some(c) if c == name => &mut own,
                Some(_) => &mut Hints::default(),
            };
            let bad = |reason: &str| PolicyError::BadAnnotation {
                key: key.clone(),
                value: value.clone(),
                reason: reason.to_string(),
            };
            match base {
                ANN_PREFER_ISOLATED => {
                    target.prefer_isolated =
                        Some(parse_bool(value).ok_or_else(|| bad("expected true or false"))?)
                }
                ANN_PREFER_SHARED => {
                    target.prefer_shared =
                        Some(parse_bool(value).ok_or_else(|| bad("expected true or false"))?)
                }
                ANN_MEMORY_TIER => {
                    let mut tiers = Vec::new();
                    for part in value.split(',') {
                        let kind = MemoryKind::parse(part).ok_or_else(|| {
                            bad("expected a comma-separated list of dram, pmem, cxl, hbm")
                        })?;
                        if !tiers.contains(&kind) {
                            tiers.push(kind);
                        }
                    }
                    tiers.sort();
                    target.memory_tiers = Some(tiers);
                }
                ANN_BALLOON => {
                    let v = value.trim();
                    if v.is_empty()
                        || v.len() > 63
                        || !v.bytes().all(|b| {
                            b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.'
                        })
                    {
                        return Err(bad(
                            "expected a balloon type name ([A-Za-z0-9._-], 1-63 characters)",
                        ));
                    }
                    target.balloon = Some(v.to_string());
                }
                _ => return Err(PolicyError::UnknownAnnotation { key: key.clone() }),
            }
        }
        Ok(Hints {
            prefer_isolated: own.prefer_isolated.or(pod.prefer_isolated),
            prefer_shared: own.prefer_shared.or(pod.prefer_shared),
            memory_tiers: own.memory_tiers.or(pod.memory_tiers),
            balloon: own.balloon.or(pod.balloon),
            withhold: BTreeMap::new(),
        })
    }
}

fn parse_bool(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "true" => Some(true),
        "false" => Some(false),
        _ => None,
    }
}

/// Sanity limits on requests: anything above is an error, not a placement.
pub(crate) const MAX_CPU_MILLI: u64 = (super::cpuset::MAX_ID as u64 + 1) * 1000;

/// Checks request fields that no policy can honour.
pub(crate) fn validate_request(req: &ContainerRequest) -> Result<Hints, PolicyError> {
    if req.key.pod_uid.is_empty() || req.key.container.is_empty() {
        return Err(PolicyError::BadRequest {
            key: req.key.clone(),
            reason: "pod UID and container name must not be empty".into(),
        });
    }
    if req.cpu_request_milli > MAX_CPU_MILLI {
        return Err(PolicyError::BadRequest {
            key: req.key.clone(),
            reason: format!("CPU request {}m is absurd", req.cpu_request_milli),
        });
    }
    if let Some(l) = req.cpu_limit_milli
        && l < req.cpu_request_milli
    {
        return Err(PolicyError::BadRequest {
            key: req.key.clone(),
            reason: format!("CPU limit {l}m is below request {}m", req.cpu_request_milli),
        });
    }
    if let Some(l) = req.memory_limit_bytes
        && l < req.memory_request_bytes
    {
        return Err(PolicyError::BadRequest {
            key: req.key.clone(),
            reason: format!(
                "memory limit {l} is below request {}",
                req.memory_request_bytes
            ),
        });
    }
    Hints::parse(req)
}
