//! Deriving a policy request (QoS class, CPU and memory requests/limits)
//! from what CRI carries, and validating CRI resources.
//!
//! CRI does not carry the pod spec. What is known and how:
//! - CPU request: from `cpu_shares` (kubelet writes `milli * 1024 / 1000`,
//!   minimum 2), inverted with rounding up, which recovers whole millicores.
//! - CPU limit: `cpu_quota * 1000 / cpu_period` when a quota is set.
//! - Memory limit: `memory_limit_in_bytes` when non-zero.
//! - Memory request: NOT carried, except as `memory.min` where the kubelet
//!   writes it (Memory QoS). Else equal to the limit for Guaranteed
//!   containers, else 0.
//! - QoS class: NOT carried. Taken from the pod's cgroup parent
//!   (`.../besteffort/...`, `.../burstable/...`, other `kubepods` parents
//!   are Guaranteed), else guessed from the resources.
//!
//! The pod spec so recovered is the truth. The resource-manager annotations
//! (`qos.resmgr.steward.dev/class`, `resources.resmgr.steward.dev/...`) may
//! only narrow it — a lower class, smaller requests, lower limits — never
//! raise it: a BestEffort pod annotated Guaranteed with 8 CPUs stays
//! BestEffort with none, since neither the scheduler nor ResourceQuota saw
//! those CPUs. See [`derive`]. The annotations themselves — their keys,
//! validation and the classes they pick — are in `requests/annotations.rs`.

mod annotations;

use std::collections::BTreeMap;

use steward_core::cpu::{
    ContainerKey, ContainerRequest, CpuSet, CriResources, Hints, Qos, derive_from_cri,
};
use steward_proto::cri::runtime::v1 as cri;

use crate::error::ResmgrError;

pub use annotations::{
    BLOCKIO_POD, BLOCKIO_PREFIX, Classes, DOMAIN, QOS_ANNOTATION, RDT_POD, RDT_PREFIX,
    RESOURCES_PREFIX, ResourcesAnnotationError, classes_for, is_resmgr_annotation,
    validate_annotations, validate_own_annotations,
};
use annotations::{parse_qos, parse_resources_annotation};

/// Largest CFS period the kernel takes (1 s), in µs.
const MAX_PERIOD_US: i64 = 1_000_000;
/// Smallest CFS period and quota the kernel takes (1 ms), in µs.
const MIN_PERIOD_US: i64 = 1_000;
/// Kernel bounds of cgroup v1 `cpu.shares`.
const MIN_SHARES: i64 = 2;
const MAX_SHARES: i64 = 262_144;
/// Memory limits above this (1 PiB) are taken as a mistake.
const MAX_MEMORY: i64 = 1 << 50;
/// A memory limit below one page cannot be honoured.
const MIN_MEMORY: i64 = 4096;
/// Largest CPU request or limit accepted, in millicores (4096 CPUs).
const MAX_MILLI: u64 = 4_096_000;

pub use crate::quantity::{QuantityError, parse_cpu_quantity, parse_memory_quantity};

fn bad(msg: impl Into<String>) -> ResmgrError {
    ResmgrError::InvalidRequest(msg.into())
}

/// Check a cpuset list string; empty means "not set".
pub fn parse_cpuset(field: &str, s: &str) -> Result<Option<CpuSet>, ResmgrError> {
    if s.trim().is_empty() {
        return Ok(None);
    }
    CpuSet::parse(s)
        .map(Some)
        .map_err(|e| bad(format!("{field} {s:?} is not a cpuset list: {e}")))
}

/// Reject resources no kernel or kubelet would produce.
pub fn validate_resources(r: &cri::LinuxContainerResources) -> Result<(), ResmgrError> {
    if r.cpu_shares != 0 && !(MIN_SHARES..=MAX_SHARES).contains(&r.cpu_shares) {
        return Err(bad(format!(
            "cpu_shares {} outside {MIN_SHARES}..={MAX_SHARES}",
            r.cpu_shares
        )));
    }
    if r.cpu_period != 0 && !(MIN_PERIOD_US..=MAX_PERIOD_US).contains(&r.cpu_period) {
        return Err(bad(format!(
            "cpu_period {}µs outside {MIN_PERIOD_US}..={MAX_PERIOD_US}",
            r.cpu_period
        )));
    }
    if r.cpu_quota != 0 && r.cpu_quota != -1 && r.cpu_quota < MIN_PERIOD_US {
        return Err(bad(format!(
            "cpu_quota {}µs: must be -1, 0 or at least {MIN_PERIOD_US}",
            r.cpu_quota
        )));
    }
    if r.cpu_quota > 0 {
        let period = if r.cpu_period == 0 {
            100_000
        } else {
            r.cpu_period
        };
        let milli = u64::try_from(r.cpu_quota.saturating_mul(1000) / period).unwrap_or(u64::MAX);
        if milli > MAX_MILLI {
            return Err(bad(format!(
                "cpu_quota {} / cpu_period {period} is {milli} millicores, more than any node has",
                r.cpu_quota
            )));
        }
    }
    for (name, v) in [
        ("memory_limit_in_bytes", r.memory_limit_in_bytes),
        ("memory_swap_limit_in_bytes", r.memory_swap_limit_in_bytes),
    ] {
        if v < 0 || (v != 0 && !(MIN_MEMORY..=MAX_MEMORY).contains(&v)) {
            return Err(bad(format!(
                "{name} {v} outside 0 or {MIN_MEMORY}..={MAX_MEMORY}"
            )));
        }
    }
    if !(-1000..=1000).contains(&r.oom_score_adj) {
        return Err(bad(format!(
            "oom_score_adj {} outside -1000..=1000",
            r.oom_score_adj
        )));
    }
    parse_cpuset("cpuset_cpus", &r.cpuset_cpus)?;
    parse_cpuset("cpuset_mems", &r.cpuset_mems)?;
    for h in &r.hugepage_limits {
        let size = h.page_size.trim_end_matches('B');
        let ok = size
            .strip_suffix(['K', 'M', 'G'])
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        if !ok {
            return Err(bad(format!(
                "hugepage page_size {:?} is not of the form 2MB/1GB",
                h.page_size
            )));
        }
    }
    Ok(())
}

/// Pod facts a request is derived from.
#[derive(Debug, Clone)]
pub struct PodFacts<'a> {
    /// Pod UID.
    pub uid: &'a str,
    /// Pod name.
    pub name: &'a str,
    /// Pod namespace.
    pub namespace: &'a str,
    /// Cgroup parent of the sandbox.
    pub cgroup_parent: &'a str,
    /// Pod annotations.
    pub annotations: &'a BTreeMap<String, String>,
}

/// What an annotation asked beyond the pod spec, and was not given: the
/// pod spec (as the runtime carries it) is the truth, and an annotation
/// may only narrow it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overreach {
    /// The annotation.
    pub key: String,
    /// What it asked and what the pod spec gives instead.
    pub reason: String,
}

impl std::fmt::Display for Overreach {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "annotation {} {}", self.key, self.reason)
    }
}

/// A container's request and what its pod's annotations asked beyond the
/// pod spec (ignored: the spec's value is in the request).
#[derive(Debug, Clone)]
pub struct Derived {
    /// The request the policy sees.
    pub request: ContainerRequest,
    /// Each annotation value that asked more than the pod spec.
    pub overreach: Vec<Overreach>,
}

/// How much a QoS class is given: Guaranteed above Burstable above
/// BestEffort.
fn qos_rank(q: Qos) -> u8 {
    match q {
        Qos::BestEffort => 0,
        Qos::Burstable => 1,
        Qos::Guaranteed => 2,
    }
}

/// `asked` if it is no more than what the pod spec gives (`spec`, `None`:
/// unlimited), else the spec's value and why.
fn narrow_limit(
    asked: Option<u64>,
    spec: Option<u64>,
    what: &str,
    unit: &str,
) -> (Option<u64>, Option<String>) {
    match (asked, spec) {
        (Some(a), Some(s)) if a > s => (
            Some(s),
            Some(format!(
                "asks a {what} limit of {a}{unit}, above the {s}{unit} of the pod spec; the pod spec's is used"
            )),
        ),
        (Some(a), _) => (Some(a), None),
        (None, s) => (s, None),
    }
}

/// Build the policy request for one container, logging what its pod's
/// annotations asked beyond the pod spec (see [`derive`]).
pub fn derive_request(
    pod: &PodFacts<'_>,
    container: &str,
    res: &cri::LinuxContainerResources,
) -> Result<ContainerRequest, ResmgrError> {
    let d = derive(pod, container, res)?;
    log_overreach(pod, container, &d.overreach);
    Ok(d.request)
}

/// Logs each annotation value that asked beyond the pod spec.
pub fn log_overreach(pod: &PodFacts<'_>, container: &str, overreach: &[Overreach]) {
    for o in overreach {
        tracing::warn!(
            namespace = pod.namespace,
            pod = pod.name,
            container,
            annotation = %o.key,
            "{ANNOTATION_ABOVE_SPEC}: {o}"
        );
    }
}

/// The warning logged (and the Event reason's message prefix) when an
/// annotation asks more than the pod spec.
pub const ANNOTATION_ABOVE_SPEC: &str =
    "a resource-manager annotation asks more than the pod spec; ignored";

/// Build the policy request for one container.
///
/// The pod spec is the truth: the QoS class and the requests and limits
/// come from what the runtime carries (the container's Linux resources and
/// the sandbox's cgroup parent, see the module docs). The annotations may
/// only narrow them — a lower QoS class, a smaller CPU or memory request,
/// a lower limit — never raise them: what the scheduler and ResourceQuota
/// never saw is never given. An annotation value asking more is ignored
/// (the spec's value is kept) and reported in [`Derived::overreach`].
pub fn derive(
    pod: &PodFacts<'_>,
    container: &str,
    res: &cri::LinuxContainerResources,
) -> Result<Derived, ResmgrError> {
    let key_ann = format!("{RESOURCES_PREFIX}{container}");
    let ann = pod
        .annotations
        .get(&key_ann)
        .map(|v| {
            parse_resources_annotation(v).map_err(|e| ResmgrError::Annotation {
                key: key_ann.clone(),
                reason: e.to_string(),
            })
        })
        .transpose()?
        .unwrap_or_default();

    let base = derive_from_cri(
        &CriResources {
            cpu_shares: u64::try_from(res.cpu_shares).unwrap_or(0),
            cpu_quota: res.cpu_quota,
            cpu_period: u64::try_from(res.cpu_period)
                .ok()
                .filter(|p| *p > 0)
                .unwrap_or(100_000),
            memory_limit_in_bytes: res.memory_limit_in_bytes,
        },
        pod.cgroup_parent,
    );
    let mut overreach = Vec::new();
    let mut over = |key: &str, reason: String| {
        overreach.push(Overreach {
            key: key.to_owned(),
            reason,
        });
    };

    // QoS: the annotation may lower the class (e.g. opt a Guaranteed
    // container out of exclusive CPUs), never raise it.
    let hinted = pod
        .annotations
        .get(QOS_ANNOTATION)
        .and_then(|v| parse_qos(v));
    let qos = match hinted {
        Some(q) if qos_rank(q) > qos_rank(base.qos) => {
            over(
                QOS_ANNOTATION,
                format!(
                    "asks {q:?}, above the pod's QoS class {:?}; the pod's is used",
                    base.qos
                ),
            );
            base.qos
        }
        Some(q) => q,
        None => base.qos,
    };

    // CPU request: at most what the runtime was given (cpu.shares).
    let cpu_request_milli = match ann.0 {
        Some(r) if r > base.cpu_request_milli => {
            over(
                &key_ann,
                format!(
                    "asks a cpu request of {r}m, above the {}m of the pod spec; the pod spec's is used",
                    base.cpu_request_milli
                ),
            );
            base.cpu_request_milli
        }
        Some(r) => r,
        None => base.cpu_request_milli,
    };
    // Limits: at most the runtime's (an unlimited one may be limited).
    let (cpu_limit_milli, why) = narrow_limit(ann.1, base.cpu_limit_milli, "cpu", "m");
    if let Some(why) = why {
        over(&key_ann, why);
    }
    let (memory_limit_bytes, why) =
        narrow_limit(ann.3, base.memory_limit_bytes, "memory", " bytes");
    if let Some(why) = why {
        over(&key_ann, why);
    }
    // Memory request: CRI does not carry it. What the spec gives is known
    // where the kubelet writes `memory.min` (Memory QoS) and for Guaranteed
    // containers (the limit); else it is unknown and taken as 0, so an
    // annotation cannot claim memory the scheduler never counted.
    let runtime_min = res
        .unified
        .get("memory.min")
        .and_then(|v| v.trim().parse::<u64>().ok());
    let spec_memory_request = runtime_min.unwrap_or(match base.qos {
        Qos::Guaranteed => base.memory_limit_bytes.unwrap_or(0),
        _ => 0,
    });
    let memory_ceiling =
        memory_limit_bytes.map_or(spec_memory_request, |l| l.min(spec_memory_request));
    let memory_request_bytes = match ann.2 {
        Some(r) if r > memory_ceiling => {
            over(
                &key_ann,
                format!(
                    "asks a memory request of {r} bytes, above the {memory_ceiling} bytes the pod spec is known to give; the pod spec's is used"
                ),
            );
            memory_ceiling
        }
        Some(r) => r,
        None if qos == Qos::Guaranteed || runtime_min.is_some() => memory_ceiling,
        None => 0,
    };
    if let Some(l) = cpu_limit_milli
        && cpu_request_milli > l
    {
        return Err(bad(format!(
            "cpu request {cpu_request_milli}m exceeds limit {l}m"
        )));
    }
    let policy_annotations: BTreeMap<String, String> = pod
        .annotations
        .iter()
        .filter(|(k, _)| !is_resmgr_annotation(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let req = ContainerRequest {
        key: ContainerKey {
            pod_uid: pod.uid.to_owned(),
            container: container.to_owned(),
        },
        pod_namespace: pod.namespace.to_owned(),
        pod_name: pod.name.to_owned(),
        qos,
        cpu_request_milli,
        cpu_limit_milli,
        memory_request_bytes,
        memory_limit_bytes,
        annotations: policy_annotations,
        cpu_claims: Vec::new(),
    };
    // The policy's own annotations are checked here, before anything
    // reaches the runtime.
    Hints::parse(&req).map_err(|e| ResmgrError::Annotation {
        key: "policy annotations".into(),
        reason: e.to_string(),
    })?;
    Ok(Derived {
        request: req,
        overreach,
    })
}

#[cfg(test)]
mod tests;
