//! `steward extender`, the scheduler extender: kube-scheduler's Filter and
//! Prioritize over HTTP, backed by Reservations the controller decides.
//!
//! **Protocol: the decision is awaited inside Filter, within a bound.**
//! With [`ExtenderConfig::leader`], Filter first asks the leading controller
//! directly ([`steward_reservations::direct`]): it writes the ask and answers with the
//! written decision (or, for a new ask it rejects, the rejection without a
//! write). When no leader answers, the API path below is taken.
//! On the API path Filter creates (or renews) the pod's Reservation with the candidate nodes
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

mod asks;
pub mod reserve;
mod seen;
pub mod server;
pub mod wire;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use steward_api::{PodRef, Reservation, ReservationSpec};
use steward_core::reservation::reservation_name;
use tokio_util::task::AbortOnDropHandle;

use self::seen::Seen;
use steward_reservations::ask::{self, Current, Written, answered, api_refused};
use steward_reservations::direct::client::{Answer, Leader};
use steward_reservations::direct::wire::DecideRequest;

pub use asks::{AskError, PodAsks, cpu_request, pod_asks, slot_request};

pub use wire::{
    ExtenderArgs, ExtenderFilterResult, FailedNodesMap, HostPriority, MAX_EXTENDER_PRIORITY,
};

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
    /// Ask the controller that leads on this Lease directly
    /// ([`steward_reservations::direct`]), falling back to the API path when it does not
    /// answer; `None`: the API path only.
    pub leader: Option<LeaderLease>,
    /// Sent to the leader as `Authorization: Bearer` (a projected
    /// ServiceAccount token, [`steward_reservations::direct::token`]); `None`: no
    /// credentials.
    pub decide_token: Option<steward_reservations::direct::token::DecideToken>,
    /// Ask the leader over HTTPS only, its certificate verified
    /// ([`steward_reservations::direct::transport::DecideTrust`]); `None`: over plain
    /// HTTP, the leader unauthenticated.
    pub decide_trust: Option<steward_reservations::direct::transport::DecideTrust>,
}

/// The controller's election Lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderLease {
    pub namespace: String,
    pub name: String,
}

impl Default for ExtenderConfig {
    fn default() -> Self {
        Self {
            decision_timeout: Duration::from_secs(2),
            poll: Duration::from_millis(250),
            shared_watch: true,
            leader: None,
            decide_token: None,
            decide_trust: None,
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
    /// The leading controller, asked directly.
    leader: Option<Arc<Leader>>,
}

pub use steward_reservations::bounds::{
    MAX_CANDIDATES, MAX_EXCLUSIVE_CPUS, MAX_SLOTS_PER_INSTANCE,
};
/// How often Filter writes the pod's Reservation again after losing a
/// write race (409) before answering an error.
const WRITE_ATTEMPTS: usize = 8;
/// Of the decision timeout, what the direct path leaves the API path when
/// the leader does not answer at all.
const FALLBACK_RESERVE: Duration = Duration::from_millis(250);

/// Why a Filter could not be answered from a decision.
#[derive(Debug, thiserror::Error)]
pub enum FilterError {
    #[error("the pod has no {0}")]
    Incomplete(&'static str),
    #[error("reading or writing the pod's Reservation failed")]
    Api(#[from] kube::Error),
    /// The ask is refused, the reason said in full: the API server
    /// refused the Reservation as written (validation), the ask is out of
    /// bounds, or the Reservation of the pod's name is another existing
    /// pod's. No retry changes that.
    #[error("{0}")]
    Refused(String),
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
        let leader = cfg
            .leader
            .as_ref()
            .map(|l| Leader::follow(client.clone(), &l.namespace, &l.name))
            .map(|l| {
                Arc::new(
                    l.with_token(cfg.decide_token.clone())
                        .with_trust(cfg.decide_trust.clone()),
                )
            });
        Self {
            client,
            cfg,
            seen,
            _watch: watch,
            leader,
        }
    }

    /// Where the leading controller decides, as last seen (`None`: no
    /// leader, or the direct path is off).
    pub fn leader_endpoint(&self) -> Option<String> {
        self.leader.as_ref().and_then(|l| l.endpoint())
    }

    /// An extender waiting on `seen` as it is (tests: a picture that lags).
    #[cfg(test)]
    fn with_seen(client: kube::Client, cfg: ExtenderConfig, seen: Arc<Seen>) -> Self {
        Self {
            client,
            cfg,
            seen,
            _watch: None,
            leader: None,
        }
    }

    /// The API client (Reserve and Unreserve use it as they are).
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// The filter verb. Only nodes of the input ever pass.
    pub async fn filter(&self, args: &ExtenderArgs) -> ExtenderFilterResult {
        let candidates = args.candidates();
        let every = |why: &str| -> FailedNodesMap {
            candidates
                .iter()
                .map(|n| (n.clone(), format!("steward: {why}")))
                .collect()
        };
        let asks = match pod_asks(&args.pod) {
            Ok(a) => a,
            // Not a quantity the API server lets through for an extended
            // resource: no node can take the pod as it is written.
            Err(e) => return passing(args, &[], BTreeMap::new(), every(&e.to_string())),
        };
        if asks.is_empty() {
            return passing(args, &candidates, BTreeMap::new(), BTreeMap::new());
        }
        if let Some(why) = asks.beyond_bounds() {
            return passing(args, &[], BTreeMap::new(), every(&why));
        }
        if candidates.is_empty() {
            return passing(args, &[], BTreeMap::new(), BTreeMap::new());
        }
        // A Reservation names at most MAX_CANDIDATES nodes: the first ones
        // are asked, the rest fail for this cycle (kube-scheduler starts
        // its node list elsewhere each cycle).
        let split = candidates.len().min(MAX_CANDIDATES);
        let (asked, later) = candidates.split_at(split);
        let mut result = match self.decide(&args.pod, asks, asked).await {
            Ok(Some(r)) => answer(args, asked, &r),
            Ok(None) => {
                let why = format!(
                    "steward: the reservation controller did not decide within {:?}; retrying",
                    self.cfg.decision_timeout
                );
                let failed = asked.iter().map(|n| (n.clone(), why.clone())).collect();
                passing(args, &[], failed, BTreeMap::new())
            }
            Err(FilterError::Refused(why)) => {
                return passing(args, &[], BTreeMap::new(), every(&why));
            }
            Err(e) => {
                return ExtenderFilterResult {
                    error: format!("{e}: {}", source_text(&e)),
                    ..ExtenderFilterResult::default()
                };
            }
        };
        for n in later {
            result.failed_nodes.insert(
                n.clone(),
                format!(
                    "steward: a reservation names at most {MAX_CANDIDATES} candidate nodes; this one was not considered in this cycle"
                ),
            );
        }
        result
    }

    /// The prioritize verb: the reserved node scores highest, the others 0.
    pub async fn prioritize(&self, args: &ExtenderArgs) -> Vec<HostPriority> {
        let candidates = args.candidates();
        let managed = pod_asks(&args.pod).is_ok_and(|a| !a.is_empty());
        let reserved = match pod_identity(&args.pod).filter(|_| managed) {
            Some((ns, name, uid)) => {
                let rname = reservation_name(&ns, &name);
                let reserved_on = |r: &Reservation| -> Option<String> {
                    (r.spec.pod.uid == uid && answered(r))
                        .then_some(r.status.as_ref())
                        .flatten()
                        .filter(|s| s.phase == "Reserved")
                        .and_then(|s| s.node.clone())
                };
                // The picture answers only when it shows the pod reserved
                // on a candidate: a replica whose watch lags (it has not
                // seen the decision yet, or still shows an older one) reads
                // the object.
                let cached = self
                    .seen
                    .get(&ns, &rname)
                    .as_ref()
                    .and_then(reserved_on)
                    .filter(|n| candidates.contains(n));
                match cached {
                    Some(n) => Some(n),
                    None => Api::<Reservation>::namespaced(self.client.clone(), &ns)
                        .get_opt(&rname)
                        .await
                        .ok()
                        .flatten()
                        .as_ref()
                        .and_then(reserved_on),
                }
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
        asks: PodAsks,
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
            slots: asks.slots,
            exclusive_cpus: asks.cpus,
            candidates: candidates.to_vec(),
            cancel: None,
        };
        let deadline = tokio::time::Instant::now() + self.cfg.decision_timeout;
        if let Some(leader) = &self.leader {
            let budget = self.cfg.decision_timeout.saturating_sub(FALLBACK_RESERVE);
            let ask = DecideRequest {
                spec: spec.clone(),
                timeout_ms: u64::try_from(budget.as_millis()).unwrap_or(u64::MAX),
            };
            match leader.decide(&ask).await {
                Ok(Answer::Decided(r)) => return Ok(Some(*r)),
                // The ask is written; what time is left is waited for on
                // the API path (which finds it asked already).
                Ok(Answer::Undecided) => {
                    tracing::debug!(reservation = %rname, "the leader did not decide in its time; waiting on the watch");
                }
                Ok(Answer::Refused(why)) => return Err(FilterError::Refused(why)),
                Err(e) => {
                    tracing::debug!(reservation = %rname, error = %e, "asking through the API instead");
                }
            }
        }
        // Subscribed before anything is written: no decision is missed.
        let mut changed = self.seen.subscribe();
        let mut attempt = 0;
        let target = loop {
            attempt += 1;
            // A pod filtered for the first time has no Reservation: when the
            // shared watch shows none, it is created without reading first
            // (one API round trip less); a 409 sends the retry to read.
            let current = if attempt == 1 && self.seen.absent(&ns, &rname) {
                Current::Absent
            } else {
                Current::Unknown
            };
            match ask::write(&api, &rname, &spec, current).await {
                Ok(Written::Answered(r)) => return Ok(Some(*r)),
                Ok(Written::Wait { target, .. }) => break target,
                Ok(Written::Refused(why)) => return Err(FilterError::Refused(why)),
                // Lost a write race (the controller's status, another
                // scheduler): read again and decide again.
                Err(kube::Error::Api(e)) if e.code == 409 && attempt < WRITE_ATTEMPTS => {
                    tracing::debug!(reservation = %rname, attempt, "Reservation changed meanwhile; writing again");
                }
                Err(kube::Error::Api(e)) if e.code == 422 => {
                    return Err(FilterError::Refused(api_refused(&e.message)));
                }
                Err(e) => return Err(e.into()),
            }
        };
        let decided = |r: &Reservation| r.spec.pod.uid == uid && target.matches(r) && answered(r);
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

/// A result passing `keep` (in the form the nodes came in). Only nodes of
/// the input pass: kube-scheduler rejects an answer naming any other.
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
    if let Some(list) = args.nodes.as_ref().filter(|_| args.node_names.is_none()) {
        let mut list = list.clone();
        list.items.retain(|n| {
            n.metadata
                .name
                .as_ref()
                .is_some_and(|name| keep.contains(name))
        });
        out.nodes = Some(list);
    } else {
        let input = args.node_names.as_deref().unwrap_or_default();
        out.node_names = Some(keep.iter().filter(|k| input.contains(k)).cloned().collect());
    }
    out
}

#[cfg(test)]
mod tests;
