//! The scheduler extender: kube-scheduler's Filter and Prioritize over HTTP,
//! backed by Reservations the controller decides.
//!
//! **Protocol: the decision is awaited inside Filter, within a bound.**
//! Filter creates (or renews) the pod's Reservation with the candidate nodes
//! kube-scheduler passed, then waits — at most `decision_timeout` — until the
//! controller has answered that spec (`status.observedGeneration` equals the
//! object's generation). The wait is woken by one watch of every Reservation
//! shared by all Filter calls (`seen.rs`), not by reading the object in a
//! loop. Reserved on node N: only N passes, every other
//! candidate fails with "reserved on N". Rejected: every candidate fails
//! with its own reason (unresolvable where no preemption can help: the node
//! does not see the device). Not decided in time: every candidate fails as
//! resolvable, so the scheduler retries the pod. Answering "no nodes" until
//! a later cycle (csi-baremetal's protocol) costs a whole scheduling retry
//! per pod; waiting costs one controller round trip, measured in
//! BENCHMARKS.md.
//!
//! A retry after Rejected or Canceled asks anew: the old Reservation is
//! deleted (precondition: its UID) and a fresh one created. Extenders never
//! hear of a failed binding or of Unreserve; a scheduler plugin can call
//! `/reserve` and `/unreserve` ([`reserve`]), and the controller releases a
//! reservation whose pod bound elsewhere, is gone, ended, or did not consume
//! it within the TTL.

pub mod reserve;
mod seen;
pub mod server;
pub mod wire;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Api;
use kube::api::{DeleteParams, ObjectMeta, PostParams, Preconditions};
use steward_api::{PodRef, Reservation, ReservationSpec};
use steward_core::reservation::{EXCLUSIVE_CPUS_RESOURCE, reservation_name};
use tokio_util::task::AbortOnDropHandle;

use self::seen::Seen;

pub use wire::{ExtenderArgs, ExtenderFilterResult, HostPriority, MAX_EXTENDER_PRIORITY};

/// The extended-resource prefix of steward's device plugins.
pub const RESOURCE_PREFIX: &str = "steward.dev/";

/// How the extender waits for decisions.
#[derive(Debug, Clone)]
pub struct ExtenderConfig {
    /// Longest wait for the controller inside one Filter call.
    pub decision_timeout: Duration,
    /// While waiting, how often the Reservation is also read from the API:
    /// the shared watch wakes the wait when the decision arrives, this
    /// only bounds the delay while that watch is re-established.
    pub poll: Duration,
    /// Wait on the shared watch (default). `false`: only read the object
    /// every `poll`, the protocol before the watch (kept as the benchmark's
    /// baseline).
    pub shared_watch: bool,
}

impl Default for ExtenderConfig {
    fn default() -> Self {
        Self {
            decision_timeout: Duration::from_secs(2),
            poll: Duration::from_millis(250),
            shared_watch: true,
        }
    }
}

/// Filter and Prioritize for pods that ask for steward slots.
#[derive(Clone)]
pub struct Extender {
    client: kube::Client,
    cfg: ExtenderConfig,
    /// Every Reservation, from one watch shared by all Filter calls.
    seen: Arc<Seen>,
    /// Stops that watch when the last clone is dropped (`None`: no watch).
    _watch: Option<Arc<AbortOnDropHandle<()>>>,
}

/// Slots per Instance a pod asks for: the `steward.dev/<instance>` limits
/// (else requests) of its containers added up; an init container runs
/// before them, so each resource needs the larger of the two.
pub fn slot_request(pod: &Pod) -> BTreeMap<String, u32> {
    summed(pod, |k| k.strip_prefix(RESOURCE_PREFIX).map(str::to_owned))
}

/// Exclusive CPUs a pod asks to have reserved on one NUMA node: its
/// [`EXCLUSIVE_CPUS_RESOURCE`] requests, combined as [`slot_request`]
/// combines slots. A pod opts in with that resource (next to its integer
/// `cpu` request, which is what the node's resource manager pins): a
/// Guaranteed pod that does not ask is not held to NUMA fit.
pub fn cpu_request(pod: &Pod) -> u32 {
    summed(pod, |k| (k == EXCLUSIVE_CPUS_RESOURCE).then(String::new))
        .into_values()
        .next()
        .unwrap_or(0)
}

/// Per-key totals of a pod's integer resource asks, keys mapped by `key`
/// (`None`: not counted).
fn summed(pod: &Pod, key: impl Fn(&str) -> Option<String>) -> BTreeMap<String, u32> {
    let Some(spec) = &pod.spec else {
        return BTreeMap::new();
    };
    let asks = |c: &k8s_openapi::api::core::v1::Container| -> BTreeMap<String, u32> {
        let r = c.resources.as_ref();
        let from = r
            .and_then(|r| r.limits.as_ref())
            .or_else(|| r.and_then(|r| r.requests.as_ref()));
        from.map(|m| {
            m.iter()
                .filter_map(|(k, v)| {
                    let instance = key(k)?;
                    // Beyond u32: more than any node has, not nothing.
                    let n = v.0.trim().parse::<u64>().ok()?;
                    let n = u32::try_from(n).unwrap_or(u32::MAX);
                    (n > 0).then_some((instance, n))
                })
                .collect()
        })
        .unwrap_or_default()
    };
    let mut total: BTreeMap<String, u32> = BTreeMap::new();
    for c in &spec.containers {
        for (k, n) in asks(c) {
            // Saturating: two containers asking u32::MAX each must read as
            // "more than any node has", not overflow.
            let t = total.entry(k).or_default();
            *t = t.saturating_add(n);
        }
    }
    for c in spec.init_containers.iter().flatten() {
        for (k, n) in asks(c) {
            let t = total.entry(k).or_default();
            *t = (*t).max(n);
        }
    }
    total
}

/// Why a Filter could not be answered from a decision.
#[derive(Debug, thiserror::Error)]
pub enum FilterError {
    #[error("the pod has no {0}")]
    Incomplete(&'static str),
    #[error("reading or writing the pod's Reservation failed")]
    Api(#[from] kube::Error),
}

impl Extender {
    /// Starts the shared Reservation watch (on the current tokio runtime).
    pub fn new(client: kube::Client, cfg: ExtenderConfig) -> Self {
        let (seen, watch) = if cfg.shared_watch {
            let (seen, watch) = Seen::start(client.clone());
            (seen, Some(Arc::new(watch)))
        } else {
            (Arc::new(Seen::empty()), None)
        };
        Self {
            client,
            cfg,
            seen,
            _watch: watch,
        }
    }

    /// The API client (Reserve and Unreserve use it as they are).
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// The filter verb.
    pub async fn filter(&self, args: &ExtenderArgs) -> ExtenderFilterResult {
        let candidates = args.candidates();
        let request = slot_request(&args.pod);
        let cpus = cpu_request(&args.pod);
        if request.is_empty() && cpus == 0 {
            return passing(args, &candidates, BTreeMap::new(), BTreeMap::new());
        }
        match self.decide(&args.pod, request, cpus, &candidates).await {
            Ok(Some(r)) => answer(args, &candidates, &r),
            Ok(None) => {
                let why = format!(
                    "the reservation controller did not decide within {:?}; retrying",
                    self.cfg.decision_timeout
                );
                let failed = candidates
                    .iter()
                    .map(|n| (n.clone(), why.clone()))
                    .collect();
                passing(args, &[], failed, BTreeMap::new())
            }
            Err(e) => ExtenderFilterResult {
                error: format!("{e}: {}", source_text(&e)),
                ..ExtenderFilterResult::default()
            },
        }
    }

    /// The prioritize verb: the reserved node scores highest, the others 0.
    pub async fn prioritize(&self, args: &ExtenderArgs) -> Vec<HostPriority> {
        let candidates = args.candidates();
        let reserved = match pod_identity(&args.pod) {
            Some((ns, name, _)) => {
                let rname = reservation_name(&ns, &name);
                // Filter waited for the decision, so the watch has it.
                let r = match self.seen.get(&ns, &rname) {
                    Some(r) => Some(r),
                    None => Api::<Reservation>::namespaced(self.client.clone(), &ns)
                        .get_opt(&rname)
                        .await
                        .ok()
                        .flatten(),
                };
                r.and_then(|r| r.status)
                    .filter(|s| s.phase == "Reserved")
                    .and_then(|s| s.node)
            }
            None => None,
        };
        candidates
            .into_iter()
            .map(|host| HostPriority {
                score: if reserved.as_deref() == Some(host.as_str()) {
                    MAX_EXTENDER_PRIORITY
                } else {
                    0
                },
                host,
            })
            .collect()
    }

    /// Creates or renews the pod's Reservation for `candidates` and waits
    /// for the controller's answer to it (`None`: not in time).
    async fn decide(
        &self,
        pod: &Pod,
        request: BTreeMap<String, u32>,
        cpus: u32,
        candidates: &[String],
    ) -> Result<Option<Reservation>, FilterError> {
        let (ns, name, uid) =
            pod_identity(pod).ok_or(FilterError::Incomplete("name, namespace or uid"))?;
        let api = Api::<Reservation>::namespaced(self.client.clone(), &ns);
        let rname = reservation_name(&ns, &name);
        let spec = ReservationSpec {
            pod: PodRef {
                namespace: ns.clone(),
                name: name.clone(),
                uid: uid.clone(),
            },
            slots: request,
            exclusive_cpus: cpus,
            candidates: candidates.to_vec(),
            cancel: None,
        };
        // Subscribed before anything is written: no decision is missed.
        let mut changed = self.seen.subscribe();
        let mut current = api.get_opt(&rname).await?;
        if let Some(r) = &current {
            let phase = r.status.as_ref().map(|s| s.phase.as_str());
            let stale = r.spec.pod.uid != uid || matches!(phase, Some("Rejected" | "Canceled"));
            let same_ask =
                r.spec.slots == spec.slots && r.spec.exclusive_cpus == spec.exclusive_cpus;
            let decided_here = phase == Some("Reserved")
                && same_ask
                && r.status
                    .as_ref()
                    .and_then(|s| s.node.as_deref())
                    .is_some_and(|n| candidates.iter().any(|c| c == n));
            if decided_here && answered(r) {
                return Ok(current);
            }
            if stale || !same_ask {
                // Ask anew: a retry may fit now.
                let dp = DeleteParams {
                    preconditions: r.metadata.uid.clone().map(|u| Preconditions {
                        uid: Some(u),
                        resource_version: None,
                    }),
                    ..DeleteParams::default()
                };
                match api.delete(&rname, &dp).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                    Err(e) => return Err(e.into()),
                }
                current = None;
            } else if r.spec.candidates != spec.candidates && phase != Some("Reserved") {
                let mut renewed = r.clone();
                renewed.spec.candidates = spec.candidates.clone();
                current = Some(
                    api.replace(&rname, &PostParams::default(), &renewed)
                        .await?,
                );
            }
        }
        if current.is_none() {
            let mut r = Reservation::new(&rname, spec);
            r.metadata = ObjectMeta {
                name: Some(rname.clone()),
                namespace: Some(ns.clone()),
                owner_references: Some(vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "Pod".into(),
                    name: name.clone(),
                    uid: uid.clone(),
                    ..OwnerReference::default()
                }]),
                ..ObjectMeta::default()
            };
            match api.create(&PostParams::default(), &r).await {
                Ok(_) => {}
                // Another scheduler's Filter created it first: wait for that.
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
        }
        let decided = |r: &Reservation| r.spec.pod.uid == uid && answered(r);
        let deadline = tokio::time::Instant::now() + self.cfg.decision_timeout;
        let mut next_read = tokio::time::Instant::now() + self.cfg.poll;
        loop {
            if let Some(r) = self.seen.get(&ns, &rname).filter(|r| decided(r)) {
                return Ok(Some(r));
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            if now >= next_read {
                next_read = now + self.cfg.poll;
                if let Some(r) = api.get_opt(&rname).await?.filter(|r| decided(r)) {
                    return Ok(Some(r));
                }
                continue;
            }
            let wake = deadline.min(next_read);
            tokio::select! {
                woke = changed.changed() => {
                    // The watch task is gone (never while `self` lives):
                    // fall back to reading on the timer.
                    if woke.is_err() {
                        tokio::time::sleep_until(wake).await;
                    }
                }
                () = tokio::time::sleep_until(wake) => {}
            }
        }
    }
}

fn source_text(e: &FilterError) -> String {
    std::error::Error::source(e)
        .map(ToString::to_string)
        .unwrap_or_default()
}

fn pod_identity(pod: &Pod) -> Option<(String, String, String)> {
    let m = &pod.metadata;
    Some((
        m.namespace.clone().unwrap_or_else(|| "default".into()),
        m.name.clone()?,
        m.uid.clone().filter(|u| !u.is_empty())?,
    ))
}

/// Whether the controller answered the Reservation's current spec.
fn answered(r: &Reservation) -> bool {
    r.status.as_ref().is_some_and(|s| {
        s.observed_generation.is_some() && s.observed_generation == r.metadata.generation
    }) && r.status.as_ref().is_some_and(|s| s.phase != "Requested")
}

/// The result for a decided Reservation.
fn answer(args: &ExtenderArgs, candidates: &[String], r: &Reservation) -> ExtenderFilterResult {
    let Some(status) = &r.status else {
        return passing(args, &[], BTreeMap::new(), BTreeMap::new());
    };
    let mut failed = BTreeMap::new();
    let mut unresolvable = BTreeMap::new();
    if status.phase == "Reserved" {
        let node = status.node.clone().unwrap_or_default();
        for c in candidates.iter().filter(|c| **c != node) {
            failed.insert(
                c.clone(),
                format!("steward: the pod's capacity is reserved on {node}"),
            );
        }
        return passing(args, &[node], failed, unresolvable);
    }
    let reason = status.reason.clone().unwrap_or_default();
    let per_node = per_node_reasons(&reason);
    for c in candidates {
        let why = per_node
            .get(c.as_str())
            .map(|w| format!("steward: {w}"))
            .unwrap_or_else(|| format!("steward: {reason}"));
        // No preemption makes a node see a device it does not see.
        if why.contains("is not seen by")
            || why.contains("does not exist")
            || why.contains("no CRI resource manager")
        {
            unresolvable.insert(c.clone(), why);
        } else {
            failed.insert(c.clone(), why);
        }
    }
    passing(args, &[], failed, unresolvable)
}

/// `"no candidate node can hold the pod: n1: why; n2: why"` → per node.
fn per_node_reasons(reason: &str) -> BTreeMap<&str, &str> {
    let list = reason.split_once(": ").map_or("", |(_, rest)| rest);
    list.split("; ")
        .filter_map(|part| part.split_once(": "))
        .collect()
}

/// A result passing `keep` (in the form the nodes came in).
fn passing(
    args: &ExtenderArgs,
    keep: &[String],
    failed: BTreeMap<String, String>,
    unresolvable: BTreeMap<String, String>,
) -> ExtenderFilterResult {
    let mut out = ExtenderFilterResult {
        failed_nodes: failed,
        failed_and_unresolvable_nodes: unresolvable,
        ..ExtenderFilterResult::default()
    };
    if args.node_names.is_some() {
        out.node_names = Some(keep.to_vec());
    } else if let Some(list) = &args.nodes {
        let mut list = list.clone();
        list.items.retain(|n| {
            n.metadata
                .name
                .as_ref()
                .is_some_and(|name| keep.contains(name))
        });
        out.nodes = Some(list);
    } else {
        out.node_names = Some(keep.to_vec());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pods_slots_add_up_and_init_containers_take_the_larger() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {
                "initContainers": [{"name": "i", "resources": {"limits": {"steward.dev/cam": "3"}}}],
                "containers": [
                    {"name": "a", "resources": {"limits": {"steward.dev/cam": "1", "cpu": "1"}}},
                    {"name": "b", "resources": {"requests": {"steward.dev/cam": "1", "steward.dev/mic": "2"}}},
                    {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
                ]
            }
        }))
        .unwrap();
        let r = slot_request(&pod);
        assert_eq!(r, BTreeMap::from([("cam".into(), 3), ("mic".into(), 2)]));
    }

    #[test]
    fn exclusive_cpus_are_asked_with_their_own_resource() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {
                "initContainers": [{"name": "i", "resources": {"limits": {"resmgr.steward.dev/exclusive-cpus": "2"}}}],
                "containers": [
                    {"name": "a", "resources": {"limits": {"resmgr.steward.dev/exclusive-cpus": "2", "cpu": "2"}}},
                    {"name": "b", "resources": {"requests": {"resmgr.steward.dev/exclusive-cpus": "1"}}},
                    {"name": "c", "resources": {"limits": {"cpu": "4", "memory": "1Gi"}}}
                ]
            }
        }))
        .unwrap();
        assert_eq!(cpu_request(&pod), 3, "integer cpu alone does not opt in");
        assert!(slot_request(&pod).is_empty(), "not a steward.dev slot");
    }

    #[test]
    fn huge_asks_saturate_instead_of_overflowing() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {
                "containers": [
                    {"name": "a", "resources": {"limits": {"steward.dev/cam": "4294967295"}}},
                    {"name": "b", "resources": {"limits": {"steward.dev/cam": "4294967295"}}},
                    {"name": "c", "resources": {"limits": {"steward.dev/cam": "4294967296"}}}
                ]
            }
        }))
        .unwrap();
        assert_eq!(
            slot_request(&pod),
            BTreeMap::from([("cam".into(), u32::MAX)])
        );
    }

    #[test]
    fn a_rejection_is_split_per_node() {
        let r = per_node_reasons(
            "no candidate node can hold the pod: n1: cam: 0 of 2 slots free, 1 wanted; n2: cam is not seen by n2",
        );
        assert_eq!(r.get("n1"), Some(&"cam: 0 of 2 slots free, 1 wanted"));
        assert_eq!(r.get("n2"), Some(&"cam is not seen by n2"));
    }
}
