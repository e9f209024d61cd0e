//! Leader election on a `coordination.k8s.io/v1` Lease, with client-go's
//! algorithm (`leaderelection` + the `LeaseLock`): get, then create or
//! replace under the read `resourceVersion`, so two candidates can never
//! both win one round (the loser gets 409 Conflict).
//!
//! * A candidate takes the Lease when it has none, when it names no holder,
//!   or when its record has not changed for `lease_duration` *as observed
//!   by this candidate's own clock* (client-go's skew rule: the holder's
//!   `renewTime` is never compared with our clock).
//! * The leader renews every `retry_period`. It stops being leader at once
//!   when a read shows another holder, and when no renewal succeeded for
//!   `renew_deadline` (shorter than `lease_duration`, so it has stopped
//!   before anyone else may take over).
//! * On cancellation a leader releases the Lease (no holder, one-second
//!   duration) so a successor need not wait out the duration.
//!
//! Leadership is published on a `watch` channel; a consumer that sees
//! `false` must stop acting on it at once.
//!
//! **Proven death.** A candidate may also be told that a holder is proven
//! dead ([`elect_with_proof`]: e.g. its process's listening socket refuses
//! connections). Then it does not wait out the duration: it tries at once
//! and takes the Lease from that holder, still only by a replace under the
//! resourceVersion it read (two candidates never both win). What counts as
//! proof is the caller's business; a partition is not one.
//!
//! A leader can say more about itself in the Lease's annotations
//! ([`LeaseConfig::annotations`], e.g. where it answers requests): they are
//! written with every acquire and renewal and removed when it releases.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Where and how to elect.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
    /// This candidate's identity (the pod name, usually).
    pub identity: String,
    /// How long a record that stopped changing keeps others away (whole
    /// seconds on the wire, rounded up).
    pub lease_duration: Duration,
    /// How long the leader may fail to renew before it steps down.
    pub renew_deadline: Duration,
    /// Between attempts (and renewals).
    pub retry_period: Duration,
    /// Annotations the holder writes on the Lease while it holds it (and
    /// removes on release).
    pub annotations: BTreeMap<String, String>,
}

impl LeaseConfig {
    /// client-go's defaults: 15 s lease, 10 s renew deadline, 2 s retry.
    pub fn new(namespace: &str, name: &str, identity: &str) -> Self {
        Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            identity: identity.to_owned(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            annotations: BTreeMap::new(),
        }
    }
}

/// The outcome of one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Attempt {
    /// We hold the Lease (taken or renewed).
    Held,
    /// Someone else holds it and their record is fresh.
    Taken,
    /// The API did not answer or refused (409 included); try again.
    Failed,
}

/// What we last saw of the Lease, and when (our clock).
#[derive(Debug, Clone, PartialEq)]
struct Observed {
    holder: Option<String>,
    renew: Option<MicroTime>,
    transitions: Option<i32>,
    at: Instant,
}

/// One candidate.
struct Candidate {
    api: Api<Lease>,
    cfg: LeaseConfig,
    observed: Option<Observed>,
    /// A holder proven dead: its record is not waited out.
    dead: Option<String>,
}

impl Candidate {
    fn observe(&mut self, lease: &Lease) {
        let spec = lease.spec.clone().unwrap_or_default();
        let same = self.observed.as_ref().is_some_and(|o| {
            o.holder == spec.holder_identity
                && o.renew == spec.renew_time
                && o.transitions == spec.lease_transitions
        });
        if !same {
            self.observed = Some(Observed {
                holder: spec.holder_identity,
                renew: spec.renew_time,
                transitions: spec.lease_transitions,
                at: Instant::now(),
            });
        }
    }

    fn spec(&self, acquire: Option<MicroTime>, transitions: i32) -> LeaseSpec {
        let now = MicroTime(Timestamp::now());
        LeaseSpec {
            holder_identity: Some(self.cfg.identity.clone()),
            // Whole seconds on the wire: rounded up, never shorter.
            lease_duration_seconds: Some(
                i32::try_from(self.cfg.lease_duration.as_millis().div_ceil(1000))
                    .unwrap_or(i32::MAX),
            ),
            acquire_time: Some(acquire.unwrap_or_else(|| now.clone())),
            renew_time: Some(now),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }

    async fn try_acquire_or_renew(&mut self) -> Attempt {
        let current = match self.api.get_opt(&self.cfg.name).await {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(error = %e, lease = %self.cfg.name, "reading the Lease failed");
                return Attempt::Failed;
            }
        };
        let Some(mut lease) = current else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.cfg.name.clone()),
                    namespace: Some(self.cfg.namespace.clone()),
                    annotations: (!self.cfg.annotations.is_empty())
                        .then(|| self.cfg.annotations.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(self.spec(None, 0)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(created) => {
                    self.observe(&created);
                    Attempt::Held
                }
                Err(e) => {
                    tracing::debug!(error = %e, "creating the Lease failed");
                    Attempt::Failed
                }
            };
        };
        self.observe(&lease);
        let spec = lease.spec.clone().unwrap_or_default();
        let mine = spec.holder_identity.as_deref() == Some(self.cfg.identity.as_str());
        let held_by_other = spec
            .holder_identity
            .as_deref()
            .is_some_and(|h| !h.is_empty())
            && !mine;
        let duration = spec
            .lease_duration_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map_or(self.cfg.lease_duration, Duration::from_secs);
        let fresh = self
            .observed
            .as_ref()
            .is_some_and(|o| o.at + duration > Instant::now());
        let proven_dead = held_by_other && self.dead.is_some() && spec.holder_identity == self.dead;
        if held_by_other && fresh && !proven_dead {
            return Attempt::Taken;
        }
        if proven_dead && fresh {
            tracing::info!(lease = %self.cfg.name, holder = ?spec.holder_identity, "taking the lease from a holder proven dead, before its record expires");
        }
        let transitions = spec.lease_transitions.unwrap_or(0);
        if !self.cfg.annotations.is_empty() {
            lease
                .metadata
                .annotations
                .get_or_insert_with(BTreeMap::new)
                .extend(self.cfg.annotations.clone());
        }
        lease.spec = Some(if mine {
            self.spec(spec.acquire_time, transitions)
        } else {
            self.spec(None, transitions.saturating_add(1))
        });
        match self
            .api
            .replace(&self.cfg.name, &PostParams::default(), &lease)
            .await
        {
            Ok(replaced) => {
                self.observe(&replaced);
                Attempt::Held
            }
            Err(e) => {
                tracing::debug!(error = %e, "updating the Lease failed");
                Attempt::Failed
            }
        }
    }

    /// Gives the Lease up if we still hold it: no holder, one second.
    async fn release(&mut self) {
        let Ok(Some(mut lease)) = self.api.get_opt(&self.cfg.name).await else {
            return;
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.cfg.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        if let Some(a) = lease.metadata.annotations.as_mut() {
            a.retain(|k, _| !self.cfg.annotations.contains_key(k));
        }
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        if let Err(e) = self
            .api
            .replace(&self.cfg.name, &PostParams::default(), &lease)
            .await
        {
            tracing::debug!(error = %e, "releasing the Lease failed");
        }
    }
}

/// Runs for election until `stop` is cancelled; the receiver says, at each
/// moment, whether this candidate leads. The task releases the Lease on
/// the way out if it leads.
pub fn elect(
    client: kube::Client,
    cfg: LeaseConfig,
    stop: CancellationToken,
) -> (watch::Receiver<bool>, tokio::task::JoinHandle<()>) {
    // A sender kept by nobody: no holder is ever proven dead.
    let (_, proofs) = watch::channel(None);
    elect_with_proof(client, cfg, stop, proofs)
}

/// [`elect`], where `proofs` names a holder proven dead (the identity in
/// its Lease): this candidate then tries at once and may take the Lease
/// from that holder before its record expires.
pub fn elect_with_proof(
    client: kube::Client,
    cfg: LeaseConfig,
    stop: CancellationToken,
    mut proofs: watch::Receiver<Option<String>>,
) -> (watch::Receiver<bool>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = watch::channel(false);
    let mut candidate = Candidate {
        api: Api::namespaced(client, &cfg.namespace),
        cfg,
        observed: None,
        dead: None,
    };
    let task = tokio::spawn(async move {
        let mut last_renewal: Option<Instant> = None;
        // Closed from the start: nobody can prove anything.
        let mut proofs_open = proofs.has_changed().is_ok();
        loop {
            candidate.dead = proofs.borrow_and_update().clone();
            let leading = *tx.borrow();
            // A leader's attempt may not outlast its renew deadline: a hung
            // API call must not keep it leading past the point where another
            // candidate may take over.
            let limit = match (leading, last_renewal) {
                (true, Some(t)) => candidate.cfg.renew_deadline.saturating_sub(t.elapsed()),
                _ => candidate.cfg.renew_deadline,
            };
            let attempt = tokio::select! {
                a = tokio::time::timeout(limit, candidate.try_acquire_or_renew()) => {
                    a.unwrap_or(Attempt::Failed)
                }
                () = stop.cancelled() => break,
            };
            match attempt {
                Attempt::Held => {
                    last_renewal = Some(Instant::now());
                    if !leading {
                        tracing::info!(lease = %candidate.cfg.name, identity = %candidate.cfg.identity, "became leader");
                        tx.send_replace(true);
                    }
                }
                Attempt::Taken => {
                    if leading {
                        tracing::warn!(lease = %candidate.cfg.name, holder = ?candidate.observed.as_ref().and_then(|o| o.holder.clone()), "lost the lease to another holder");
                        tx.send_replace(false);
                    }
                    last_renewal = None;
                }
                Attempt::Failed => {
                    let overdue =
                        last_renewal.is_none_or(|t| t.elapsed() >= candidate.cfg.renew_deadline);
                    if leading && overdue {
                        tracing::warn!(lease = %candidate.cfg.name, "could not renew the lease within the deadline; stepping down");
                        tx.send_replace(false);
                        last_renewal = None;
                    }
                }
            }
            tokio::select! {
                () = tokio::time::sleep(candidate.cfg.retry_period) => {}
                // A proof is acted on at once, not at the next period.
                r = proofs.changed(), if proofs_open => {
                    if r.is_err() {
                        proofs_open = false;
                    }
                }
                () = stop.cancelled() => break,
            }
        }
        if *tx.borrow() {
            tx.send_replace(false);
            candidate.release().await;
        }
    });
    (rx, task)
}
