//! What a pod asks steward for: slots per Instance (`steward.dev/<instance>`)
//! and exclusive CPUs, read from its containers with the one quantity parser
//! and checked against what a Reservation can hold.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use steward_core::quantity::{QuantityError, parse_count};
use steward_core::reservation::EXCLUSIVE_CPUS_RESOURCE;

use super::RESOURCE_PREFIX;

/// What a pod asks steward for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodAsks {
    /// Slots per Instance ([`slot_request`]).
    pub slots: BTreeMap<String, u32>,
    /// Exclusive CPUs on one NUMA node ([`cpu_request`]).
    pub cpus: u32,
}

impl PodAsks {
    /// Asks for nothing steward manages.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty() && self.cpus == 0
    }

    /// Why no Reservation can hold this ask (no node can take the pod,
    /// whatever is preempted), if so: [`steward_reservations::bounds::check_amounts`],
    /// the bounds every way in applies.
    pub fn beyond_bounds(&self) -> Option<String> {
        steward_reservations::bounds::check_amounts(&self.slots, self.cpus)
            .err()
            .map(|e| e.to_string())
    }
}

/// A resource quantity of the pod that is not a whole number of slots or
/// CPUs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("container {container}: {resource}: {source}")]
pub struct AskError {
    pub container: String,
    pub resource: String,
    #[source]
    pub source: QuantityError,
}

/// What the pod asks steward for, every quantity read by
/// [`steward_core::quantity::parse_count`] (`"2"`, `"1k"`, `"1e3"`).
pub fn pod_asks(pod: &Pod) -> Result<PodAsks, AskError> {
    Ok(PodAsks {
        slots: summed(pod, |k| k.strip_prefix(RESOURCE_PREFIX).map(str::to_owned))?,
        cpus: summed(pod, |k| (k == EXCLUSIVE_CPUS_RESOURCE).then(String::new))?
            .into_values()
            .next()
            .unwrap_or(0),
    })
}

/// Slots per Instance a pod asks for: the `steward.dev/<instance>` limits
/// (else requests) of its containers added up; an init container runs
/// before them, so each resource needs the larger of the two. A quantity
/// that is not a whole number is left out here; Filter refuses it
/// ([`pod_asks`]).
pub fn slot_request(pod: &Pod) -> BTreeMap<String, u32> {
    summed_lenient(pod, |k| k.strip_prefix(RESOURCE_PREFIX).map(str::to_owned))
}

/// Exclusive CPUs a pod asks to have reserved on one NUMA node: its
/// [`EXCLUSIVE_CPUS_RESOURCE`] requests, combined as [`slot_request`]
/// combines slots. A pod opts in with that resource (next to its integer
/// `cpu` request, which is what the node's resource manager pins): a
/// Guaranteed pod that does not ask is not held to NUMA fit.
pub fn cpu_request(pod: &Pod) -> u32 {
    summed_lenient(pod, |k| (k == EXCLUSIVE_CPUS_RESOURCE).then(String::new))
        .into_values()
        .next()
        .unwrap_or(0)
}

type Asked = BTreeMap<String, u32>;

/// Per-key totals of a pod's integer resource asks, keys mapped by `key`
/// (`None`: not counted); `on_error` decides about a quantity that is not
/// a whole number (`Err`: stop, `Ok`: leave it out).
fn summed_with(
    pod: &Pod,
    key: impl Fn(&str) -> Option<String>,
    on_error: impl Fn(AskError) -> Result<(), AskError>,
) -> Result<Asked, AskError> {
    let Some(spec) = &pod.spec else {
        return Ok(BTreeMap::new());
    };
    let asks = |c: &k8s_openapi::api::core::v1::Container| -> Result<Asked, AskError> {
        let r = c.resources.as_ref();
        let from = r
            .and_then(|r| r.limits.as_ref())
            .or_else(|| r.and_then(|r| r.requests.as_ref()));
        let mut out = BTreeMap::new();
        for (k, v) in from.into_iter().flatten() {
            let Some(instance) = key(k) else { continue };
            let n = match parse_count(&v.0) {
                Ok(n) => n,
                Err(source) => {
                    on_error(AskError {
                        container: c.name.clone(),
                        resource: k.clone(),
                        source,
                    })?;
                    continue;
                }
            };
            // Beyond u32: more than any node has, not nothing.
            let n = u32::try_from(n).unwrap_or(u32::MAX);
            if n > 0 {
                out.insert(instance, n);
            }
        }
        Ok(out)
    };
    let mut total: BTreeMap<String, u32> = BTreeMap::new();
    for c in &spec.containers {
        for (k, n) in asks(c)? {
            // Saturating: two containers asking u32::MAX each must read as
            // "more than any node has", not overflow.
            let t = total.entry(k).or_default();
            *t = t.saturating_add(n);
        }
    }
    for c in spec.init_containers.iter().flatten() {
        for (k, n) in asks(c)? {
            let t = total.entry(k).or_default();
            *t = (*t).max(n);
        }
    }
    Ok(total)
}

fn summed(pod: &Pod, key: impl Fn(&str) -> Option<String>) -> Result<Asked, AskError> {
    summed_with(pod, key, Err)
}

fn summed_lenient(pod: &Pod, key: impl Fn(&str) -> Option<String>) -> Asked {
    summed_with(pod, key, |_| Ok(())).unwrap_or_default()
}
