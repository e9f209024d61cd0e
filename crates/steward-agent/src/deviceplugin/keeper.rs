//! The node's slot ledger behind one lock, with the claim stores it makes
//! its decisions durable in and the ListAndWatch channels of its plugins.
//!
//! Every input (Allocate, pod events, pod resources, cluster claims, ticks,
//! Instances) takes the lock, feeds the ledger and carries out the returned
//! effects before releasing it: effects come out in order, per slot, and an
//! Allocate racing a delete waits for it (ordering 2 of the three in `steward_core::slots`).

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use steward_core::Millis;
use steward_core::ledger::Holding;
use steward_core::slots::{
    AllocateError, AllocatePlan, Claim, Effect, Health, PodInfo, PodResources, RecoveryInput,
    SlotConfig, SlotLedger, parse_slot_id,
};
use steward_proto::deviceplugin::v1beta1::{
    AllocateRequest, AllocateResponse, CdiDevice, ContainerAllocateResponse,
    ContainerPreferredAllocationResponse, Device, DeviceSpec, HEALTHY, Mount, NumaNode,
    PreferredAllocationRequest, PreferredAllocationResponse, TopologyInfo, UNHEALTHY,
};
use tokio::sync::{Mutex, MutexGuard, mpsc, watch};
use tonic::Status;

use super::instance::ServedInstance;
use super::metrics::DevicePluginMetrics;
use crate::claims::{ClaimError, ClaimStore, ClaimWrite};

/// Wall-clock milliseconds: claim times survive agent restarts.
pub fn now() -> Millis {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    Millis(u64::try_from(ms).unwrap_or(u64::MAX))
}

/// Added to a settle instant before listing pod resources for it.
const SETTLE_MARGIN_MS: u64 = 5;

/// Annotation naming the slots handed to a container.
pub const SLOTS_ANNOTATION: &str = "steward.dev/slots";
/// Annotation naming the Instance of the slots.
pub const INSTANCE_ANNOTATION: &str = "steward.dev/instance";

/// Everything behind the lock.
pub(crate) struct State {
    pub ledger: SlotLedger,
    pub instances: BTreeMap<String, ServedInstance>,
    /// (namespace, configuration) → broker properties.
    pub broker: BTreeMap<(String, String), BTreeMap<String, String>>,
    /// ListAndWatch content per Instance.
    pub channels: BTreeMap<String, watch::Sender<Vec<Device>>>,
}

impl State {
    fn devices(&self, instance: &str) -> Vec<Device> {
        let numa = self
            .instances
            .get(instance)
            .map(|i| i.numa.clone())
            .unwrap_or_default();
        self.ledger
            .health(instance)
            .into_iter()
            .map(|(id, health)| Device {
                id,
                health: match health {
                    Health::Healthy => HEALTHY,
                    Health::Unhealthy => UNHEALTHY,
                }
                .to_owned(),
                topology: (!numa.is_empty()).then(|| TopologyInfo {
                    nodes: numa.iter().map(|&id| NumaNode { id }).collect(),
                }),
            })
            .collect()
    }

    /// Sends the Instance's current health on its ListAndWatch channel.
    pub fn push_health(&self, instance: &str) {
        let devices = self.devices(instance);
        if let Some(tx) = self.channels.get(instance) {
            tx.send_if_modified(|current| {
                if *current == devices {
                    false
                } else {
                    *current = devices;
                    true
                }
            });
        }
    }

    fn any_awaiting(&self) -> bool {
        self.ledger.any_awaiting()
    }

    /// How long until a pod-resources `List` could release a pending claim
    /// by the ledger's settle rule (slightly after that instant, so the
    /// list's own timestamp is past it); `None` when none is waiting.
    fn settle_wait(&self, after: Millis) -> Option<Duration> {
        let due = self.ledger.next_settle(after)?;
        Some(Duration::from_millis(due.since(now()) + SETTLE_MARGIN_MS))
    }
}

/// Why an allocate plan could not be made durable.
enum Durable {
    Done,
    Conflict { slot: String, node: String },
    ClusterDown(String),
    Failed(String),
}

/// The shared core of the node's device plugins.
pub(crate) struct SlotKeeper<L, C> {
    pub node: String,
    local: L,
    cluster: C,
    pub metrics: DevicePluginMetrics,
    op_timeout: Duration,
    pub(super) cdi: bool,
    state: Mutex<State>,
    /// Poked after every successful Allocate, after a pod ended while
    /// claims await attribution, and after recovery with such claims: the
    /// follower lists pod resources until the slots are attributed or
    /// released.
    followup: mpsc::UnboundedSender<()>,
    /// Poked whenever the state is locked (a possible change), for the
    /// node view's publisher (`view.rs`); permits coalesce.
    changed: Arc<tokio::sync::Notify>,
    /// Bumped whenever the state is locked, for any number of followers
    /// (the DRA health streams); they compare what they derive.
    generation: watch::Sender<u64>,
    /// Events on the Instances (slot released, claim conflict), if any.
    events: Option<crate::events::EventSink>,
}

/// Refuses ids that are not slots of `instance` (another Instance's slot
/// sent to this plugin) and ids named twice in one request. kubelet never
/// sends either; a plugin must not act on them.
fn own_slots(instance: &str, req: &AllocateRequest) -> Result<(), (Status, &'static str)> {
    let mut seen = std::collections::BTreeSet::new();
    for id in req.container_requests.iter().flat_map(|c| &c.devices_ids) {
        let own = id
            .rsplit_once('-')
            .is_some_and(|(i, n)| i == instance && n.parse::<u32>().is_ok());
        if !own {
            return Err((
                Status::not_found(format!(
                    "unknown device {id:?}: not a slot of {instance}; nothing was allocated"
                )),
                "unknown_device",
            ));
        }
        if !seen.insert(id.as_str()) {
            return Err((
                Status::invalid_argument(format!(
                    "device {id:?} is named twice in one Allocate; nothing was allocated"
                )),
                "duplicate_device",
            ));
        }
    }
    Ok(())
}

fn allocate_status(e: &AllocateError) -> (Status, &'static str) {
    let msg = e.to_string();
    match e {
        AllocateError::NoDevices => (Status::invalid_argument(msg), "invalid"),
        AllocateError::UnknownDevice { .. } => (Status::not_found(msg), "unknown_device"),
        AllocateError::DeviceGone { .. } => (Status::failed_precondition(msg), "device_gone"),
        AllocateError::HeldByOtherNode { .. } => {
            (Status::failed_precondition(msg), "held_elsewhere")
        }
        AllocateError::ReservedForOtherNode { .. } => {
            (Status::failed_precondition(msg), "reserved_elsewhere")
        }
        AllocateError::ClusterUnreachable { .. } => {
            (Status::unavailable(msg), "cluster_unreachable")
        }
        AllocateError::ClaimInFlight { .. } => (Status::aborted(msg), "in_flight"),
        AllocateError::HeldByClaim { .. } => (Status::failed_precondition(msg), "held_by_claim"),
        AllocateError::InUseByDevicePlugin { .. } => (Status::failed_precondition(msg), "in_use"),
    }
}

impl<L: ClaimStore, C: ClaimStore> SlotKeeper<L, C> {
    /// A core for `node` with an empty ledger (see [`SlotKeeper::recover`]).
    pub fn new(
        node: String,
        local: L,
        cluster: C,
        slots: SlotConfig,
        metrics: DevicePluginMetrics,
        op_timeout: Duration,
        cdi: bool,
    ) -> (Self, mpsc::UnboundedReceiver<()>) {
        let (followup, rx) = mpsc::unbounded_channel();
        let core = Self {
            state: Mutex::new(State {
                ledger: SlotLedger::new(node.clone(), slots),
                instances: BTreeMap::new(),
                broker: BTreeMap::new(),
                channels: BTreeMap::new(),
            }),
            node,
            local,
            cluster,
            metrics,
            op_timeout,
            cdi,
            followup,
            changed: Arc::new(tokio::sync::Notify::new()),
            generation: watch::channel(0).0,
            events: None,
        };
        (core, rx)
    }

    /// Emit Kubernetes Events on the Instances through `events`.
    pub fn with_events(mut self, events: Option<crate::events::EventSink>) -> Self {
        self.events = events;
        self
    }

    /// The namespace and name of the Instance `slot` belongs to, if served.
    fn instance_of(st: &State, slot: &str) -> Option<(String, String)> {
        let (name, _) = slot.rsplit_once('-')?;
        st.instances
            .get(name)
            .map(|i| (i.namespace.clone(), i.name.clone()))
    }

    pub async fn lock(&self) -> MutexGuard<'_, State> {
        // The publisher's lock queues behind this one (the mutex is fair),
        // so it sees whatever this holder changes.
        self.changed.notify_one();
        self.generation.send_modify(|g| *g = g.wrapping_add(1));
        self.state.lock().await
    }

    /// Changes whenever the state may have changed (see [`SlotKeeper::lock`]).
    pub(crate) fn generations(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// The state, without telling the node view's publisher (it is the one
    /// asking).
    pub(crate) async fn lock_quiet(&self) -> MutexGuard<'_, State> {
        self.state.lock().await
    }

    /// Woken after the state may have changed.
    pub(crate) fn changes(&self) -> Arc<tokio::sync::Notify> {
        self.changed.clone()
    }

    async fn timed<T>(
        &self,
        fut: impl Future<Output = Result<T, ClaimError>>,
    ) -> Result<T, ClaimError> {
        match tokio::time::timeout(self.op_timeout, fut).await {
            Ok(r) => r,
            Err(_) => Err(ClaimError::Unreachable(format!(
                "no answer within {:?}",
                self.op_timeout
            ))),
        }
    }

    /// Carries out effects in order, feeding the ledger what the stores
    /// answer (and carrying out what that returns).
    pub async fn apply(&self, st: &mut State, effects: Vec<Effect>) {
        let mut queue: VecDeque<Effect> = effects.into();
        let mut cluster_down = !st.ledger.cluster_reachable();
        while let Some(effect) = queue.pop_front() {
            match effect {
                Effect::WriteClaim { claim, target } => {
                    if target.local() {
                        let r = self.timed(self.local.write(&claim)).await;
                        self.note("local", "write", &r);
                        if let Err(e) = r {
                            tracing::error!(slot = claim.slot(), error = %e, "writing local slot claim failed");
                        }
                    }
                    if target.cluster() {
                        let slot = claim.slot().to_owned();
                        if cluster_down {
                            st.ledger.cluster_write_failed(&slot);
                            continue;
                        }
                        let r = self.timed(self.cluster.write(&claim)).await;
                        self.note("cluster", "write", &r);
                        match r {
                            Ok(ClaimWrite::Written) => {}
                            Ok(ClaimWrite::HeldByOtherNode { node }) => {
                                tracing::warn!(%slot, holder = %node, "cluster claim refused: another node holds the slot");
                                if let (Some(ev), Some((ns, name))) =
                                    (&self.events, Self::instance_of(st, &slot))
                                {
                                    ev.instance_warning(
                                        &ns,
                                        &name,
                                        "ClaimConflict",
                                        format!(
                                            "slot {slot} is held by node {node}; node {} does not use it",
                                            self.node
                                        ),
                                    );
                                }
                                let other = Claim {
                                    node,
                                    epoch: 0,
                                    holding: Holding::pending(slot, claim.holding.since),
                                    awaiting: None,
                                };
                                queue.extend(st.ledger.cluster_claim_observed(&other));
                            }
                            Err(ClaimError::Unreachable(m)) => {
                                tracing::warn!(%slot, error = %m, "API server unreachable; slot claim queued");
                                cluster_down = true;
                                st.ledger.cluster_write_failed(&slot);
                                queue.extend(st.ledger.cluster_reachability(false));
                            }
                            Err(e) => {
                                tracing::warn!(%slot, error = %e, "cluster slot claim write failed; will retry");
                                st.ledger.cluster_write_failed(&slot);
                            }
                        }
                    }
                }
                Effect::DeleteClaim {
                    slot,
                    epoch,
                    target,
                } => {
                    self.metrics.released.inc();
                    if target.local() {
                        let r = self
                            .timed(self.local.delete(&slot, &self.node, epoch))
                            .await;
                        self.note("local", "delete", &r);
                        if let Err(e) = r {
                            tracing::error!(%slot, error = %e, "deleting local slot claim failed");
                        }
                    }
                    if target.cluster() {
                        if cluster_down {
                            st.ledger.cluster_write_failed(&slot);
                            continue;
                        }
                        let r = self
                            .timed(self.cluster.delete(&slot, &self.node, epoch))
                            .await;
                        self.note("cluster", "delete", &r);
                        match r {
                            Ok(()) => {
                                if let (Some(ev), Some((ns, name))) =
                                    (&self.events, Self::instance_of(st, &slot))
                                {
                                    ev.instance_normal(
                                        &ns,
                                        &name,
                                        "SlotReleased",
                                        format!(
                                            "slot {slot} released on node {}: free for the next pod",
                                            self.node
                                        ),
                                    );
                                }
                            }
                            Err(ClaimError::Unreachable(m)) => {
                                tracing::warn!(%slot, error = %m, "API server unreachable; slot release queued");
                                cluster_down = true;
                                st.ledger.cluster_write_failed(&slot);
                                queue.extend(st.ledger.cluster_reachability(false));
                            }
                            Err(e) => {
                                tracing::warn!(%slot, error = %e, "cluster slot claim delete failed; will retry");
                                st.ledger.cluster_write_failed(&slot);
                            }
                        }
                    }
                }
                Effect::HealthChanged { instance } => st.push_health(&instance),
            }
        }
    }

    fn note<T>(&self, store: &str, op: &str, r: &Result<T, ClaimError>) {
        let result = match r {
            Ok(_) => "ok",
            Err(ClaimError::Unreachable(_)) => "unreachable",
            Err(ClaimError::Failed(_)) => "failed",
        };
        self.metrics.claim_op(store, op, result);
    }

    async fn make_durable(&self, plan: &AllocatePlan) -> Durable {
        for claim in &plan.writes {
            let r = self.timed(self.local.write(claim)).await;
            self.note("local", "write", &r);
            match r {
                Ok(ClaimWrite::Written) => {}
                Ok(ClaimWrite::HeldByOtherNode { node }) => {
                    return Durable::Failed(format!(
                        "local claim store refused slot {} (held by {node})",
                        claim.slot()
                    ));
                }
                Err(e) => return Durable::Failed(format!("local claim store: {e}")),
            }
        }
        if plan.target.cluster() {
            for claim in &plan.writes {
                let r = self.timed(self.cluster.write(claim)).await;
                self.note("cluster", "write", &r);
                match r {
                    Ok(ClaimWrite::Written) => {}
                    Ok(ClaimWrite::HeldByOtherNode { node }) => {
                        return Durable::Conflict {
                            slot: claim.slot().to_owned(),
                            node,
                        };
                    }
                    Err(ClaimError::Unreachable(m)) => return Durable::ClusterDown(m),
                    Err(e) => return Durable::Failed(format!("cluster claim: {e}")),
                }
            }
        }
        Durable::Done
    }

    /// kubelet's Allocate: claims every slot durably (local, then cluster)
    /// before answering; on any failure nothing changed and the answer is an
    /// error saying why. Every id must be one of `instance`'s slots, each at
    /// most once, or nothing is allocated.
    pub async fn allocate(
        &self,
        instance: &str,
        req: &AllocateRequest,
    ) -> Result<AllocateResponse, Status> {
        let started = Instant::now();
        let result = match own_slots(instance, req) {
            Ok(()) => self.allocate_inner(req).await,
            Err(refused) => {
                tracing::warn!(%instance, error = %refused.0.message(), "Allocate refused");
                Err(refused)
            }
        };
        self.metrics
            .allocate_seconds
            .observe(started.elapsed().as_secs_f64());
        match &result {
            Ok(_) => self.metrics.allocation("ok"),
            Err((_, label)) => self.metrics.allocation(label),
        }
        result.map_err(|(s, _)| s)
    }

    async fn allocate_inner(
        &self,
        req: &AllocateRequest,
    ) -> Result<AllocateResponse, (Status, &'static str)> {
        let ids: Vec<String> = req
            .container_requests
            .iter()
            .flat_map(|c| c.devices_ids.iter().cloned())
            .collect();
        let mut st = self.lock().await;
        self.claim_durably(
            &mut st,
            || format!("{ids:?}"),
            |ledger| ledger.allocate(&ids, now()),
        )
        .await?;
        let response = self.response(&st, req);
        drop(st);
        let _ = self.followup.send(());
        tracing::info!(devices = ?ids, "Allocate answered");
        Ok(response)
    }

    /// Makes a plan of the ledger's (`make`: Allocate or a DRA prepare;
    /// `what` names its devices in errors, formatted only then)
    /// durable — local store, then the cluster — and commits it; on any
    /// failure the plan is rolled back and the error says why. A cluster
    /// found unreachable mid-way is retried once against the local ledger
    /// only (unshared devices go ahead, shared ones fail closed).
    pub(super) async fn claim_durably(
        &self,
        st: &mut State,
        what: impl Fn() -> String,
        mut make: impl FnMut(&mut SlotLedger) -> Result<AllocatePlan, AllocateError>,
    ) -> Result<(), (Status, &'static str)> {
        let mut retried = false;
        loop {
            let plan = match make(&mut st.ledger) {
                Ok(plan) => plan,
                Err(e) => {
                    tracing::warn!(devices = %what(), error = %e, "claim refused");
                    return Err(allocate_status(&e));
                }
            };
            match self.make_durable(&plan).await {
                Durable::Done => {
                    // Answered right below: the settle window starts now.
                    if let Err(e) = st.ledger.commit(plan.id, now()) {
                        return Err((
                            Status::aborted(format!(
                                "slot claim expired before it was durable: {e}"
                            )),
                            "expired",
                        ));
                    }
                    return Ok(());
                }
                Durable::Conflict { slot, node } => {
                    let fx = st
                        .ledger
                        .claim_conflict(plan.id, &slot, &node)
                        .unwrap_or_default();
                    self.apply(st, fx).await;
                    tracing::warn!(%slot, holder = %node, "claim lost the slot to another node");
                    return Err((
                        Status::failed_precondition(format!(
                            "slot {slot:?} is held by node {node:?} (claimed in the cluster first); nothing was allocated"
                        )),
                        "held_elsewhere",
                    ));
                }
                Durable::ClusterDown(m) if !retried => {
                    tracing::warn!(error = %m, "API server unreachable while claiming; retrying against the local ledger");
                    let mut fx = st.ledger.cluster_reachability(false);
                    fx.extend(st.ledger.abort(plan.id).unwrap_or_default());
                    self.apply(st, fx).await;
                    retried = true;
                }
                Durable::ClusterDown(m) | Durable::Failed(m) => {
                    let fx = st.ledger.abort(plan.id).unwrap_or_default();
                    self.apply(st, fx).await;
                    tracing::error!(devices = %what(), error = %m, "slot claims could not be made durable");
                    return Err((
                        Status::unavailable(format!(
                            "slot claims for {} could not be made durable: {m}; nothing was allocated",
                            what()
                        )),
                        "store_failed",
                    ));
                }
            }
        }
    }

    fn response(&self, st: &State, req: &AllocateRequest) -> AllocateResponse {
        let container_responses = req
            .container_requests
            .iter()
            .map(|c| {
                let mut out = ContainerAllocateResponse::default();
                let mut seen = Vec::new();
                for id in &c.devices_ids {
                    let Some((name, _)) = parse_slot_id(id) else {
                        continue;
                    };
                    if seen.contains(&name) {
                        continue;
                    }
                    seen.push(name);
                    let Some(inst) = st.instances.get(name) else {
                        continue;
                    };
                    let empty = BTreeMap::new();
                    let broker = st.broker.get(&inst.config_key()).unwrap_or(&empty);
                    out.envs.extend(inst.env(broker));
                    out.mounts.extend(inst.mounts.iter().map(|m| Mount {
                        container_path: m.container_path.clone(),
                        host_path: m.host_path.clone(),
                        read_only: m.read_only,
                    }));
                    out.devices
                        .extend(inst.device_specs.iter().map(|d| DeviceSpec {
                            container_path: d.container_path.clone(),
                            host_path: d.host_path.clone(),
                            permissions: d.permissions.clone(),
                        }));
                    if self.cdi && !inst.cdi_name.is_empty() {
                        out.cdi_devices.push(CdiDevice {
                            name: inst.cdi_name.clone(),
                        });
                    }
                    out.annotations
                        .insert(INSTANCE_ANNOTATION.into(), inst.name.clone());
                }
                out.annotations
                    .insert(SLOTS_ANNOTATION.into(), c.devices_ids.join(","));
                out
            })
            .collect();
        AllocateResponse {
            container_responses,
        }
    }

    /// GetPreferredAllocation.
    pub async fn preferred(&self, req: &PreferredAllocationRequest) -> PreferredAllocationResponse {
        let st = self.lock().await;
        PreferredAllocationResponse {
            container_responses: req
                .container_requests
                .iter()
                .map(|c| ContainerPreferredAllocationResponse {
                    device_i_ds: st.ledger.preferred_allocation(
                        &c.available_device_i_ds,
                        &c.must_include_device_i_ds,
                        usize::try_from(c.allocation_size).unwrap_or(0),
                    ),
                })
                .collect(),
        }
    }

    /// A pod watch event. Returns whether slots are awaiting attribution
    /// (the caller then asks kubelet about this pod).
    pub async fn pod_observed(&self, pod: &PodInfo) -> bool {
        let mut st = self.lock().await;
        let fx = st.ledger.pod_observed(pod);
        if !fx.is_empty() {
            tracing::debug!(pod = %pod.name, uid = %pod.uid, deleted = pod.deleted, phase = ?pod.phase, effects = fx.len(), "pod event changed slots");
        }
        self.apply(&mut st, fx).await;
        let awaiting = st.any_awaiting();
        if awaiting && !pod.is_live() {
            // The pod may have been the one a pending slot was handed to:
            // the follower lists again soon (and at the settle time).
            let _ = self.followup.send(());
        }
        pod.is_live() && awaiting
    }

    /// A full pod list (watch start or re-list).
    pub async fn pods_listed(&self, pods: &[PodInfo]) {
        let mut st = self.lock().await;
        let fx = st.ledger.pods_listed(pods);
        self.apply(&mut st, fx).await;
    }

    /// Pod resources `Get` of one pod taken at `at`.
    pub async fn podresources_got(&self, pod: &PodResources, at: Millis) {
        let mut st = self.lock().await;
        let fx = st.ledger.podresources_got(pod, at);
        self.apply(&mut st, fx).await;
    }

    /// Pod resources `List` taken at `at`. Returns whether slots still
    /// await attribution, and if so how long until a list could release a
    /// pending claim by the settle rule (`None`: no such instant ahead).
    pub async fn podresources_listed(
        &self,
        pods: &[PodResources],
        at: Millis,
    ) -> (bool, Option<Duration>) {
        let mut st = self.lock().await;
        let fx = st.ledger.podresources_listed(pods, at);
        self.apply(&mut st, fx).await;
        (st.any_awaiting(), st.settle_wait(at))
    }

    /// Time passed: expiries, queued cluster writes; probes the API server
    /// when it is considered unreachable.
    pub async fn tick(&self) {
        let mut st = self.lock().await;
        if !st.ledger.cluster_reachable() {
            self.probe_cluster(&mut st).await;
        }
        let fx = st.ledger.tick(now());
        self.apply(&mut st, fx).await;
    }

    async fn probe_cluster(&self, st: &mut State) {
        match self.timed(self.cluster.list()).await {
            Ok(claims) => {
                tracing::info!(
                    claims = claims.len(),
                    "API server reachable; syncing slot claims"
                );
                let mut fx = st.ledger.cluster_claims_listed(&claims);
                fx.extend(st.ledger.cluster_reachability(true));
                self.apply(st, fx).await;
            }
            Err(e) => tracing::debug!(error = %e, "API server still unreachable"),
        }
    }

    /// The slots reserved at scheduling time (slot → the node its pod is
    /// bound for), as the Reservation watch delivers them.
    pub async fn reservations_listed(&self, reserved: &BTreeMap<String, String>) {
        let mut st = self.lock().await;
        let fx = st.ledger.reservations_listed(reserved);
        self.apply(&mut st, fx).await;
    }

    /// Claims of the cluster, as a watch delivers them.
    pub async fn cluster_claims_listed(&self, claims: &[Claim]) {
        let mut st = self.lock().await;
        let mut fx = st.ledger.cluster_claims_listed(claims);
        if !st.ledger.cluster_reachable() {
            fx.extend(st.ledger.cluster_reachability(true));
        }
        self.apply(&mut st, fx).await;
    }

    pub async fn cluster_claim_observed(&self, claim: &Claim) {
        let mut st = self.lock().await;
        let fx = st.ledger.cluster_claim_observed(claim);
        self.apply(&mut st, fx).await;
    }

    pub async fn cluster_claim_removed(&self, slot: &str, node: &str) {
        let mut st = self.lock().await;
        let fx = st.ledger.cluster_claim_removed(slot, node);
        self.apply(&mut st, fx).await;
    }

    /// Replaces the ledger by one rebuilt from `input` and brings the stores
    /// in line with it.
    pub async fn recover(&self, input: RecoveryInput) {
        let mut st = self.lock().await;
        let config = st.ledger.config();
        let (ledger, fx) = SlotLedger::recover(self.node.clone(), config, input);
        tracing::info!(
            claims = ledger.claims().len(),
            effects = fx.len(),
            reachable = ledger.cluster_reachable(),
            "slot ledger recovered"
        );
        st.ledger = ledger;
        self.apply(&mut st, fx).await;
        let names: Vec<String> = st.channels.keys().cloned().collect();
        for name in names {
            st.push_health(&name);
        }
        if st.any_awaiting() {
            // Recovered pending claims: attribute or release them.
            let _ = self.followup.send(());
        }
    }

    /// An Instance served (or changed). Returns the receiver of its
    /// ListAndWatch channel.
    pub async fn instance_upserted(&self, inst: ServedInstance) -> watch::Receiver<Vec<Device>> {
        let mut st = self.lock().await;
        let name = inst.name.clone();
        let fx = st.ledger.instance_upserted(inst.info(true));
        st.instances.insert(name.clone(), inst);
        let rx = match st.channels.get(&name) {
            Some(tx) => tx.subscribe(),
            None => {
                let (tx, rx) = watch::channel(Vec::new());
                st.channels.insert(name.clone(), tx);
                rx
            }
        };
        self.apply(&mut st, fx).await;
        st.push_health(&name);
        rx
    }

    /// An Instance is no longer served by this node: its slots are reported
    /// Unhealthy, then it is forgotten (claims stay until their pods end).
    pub async fn instance_removed(&self, name: &str) {
        let mut st = self.lock().await;
        if let Some(info) = st.instances.get(name).map(|i| i.info(false)) {
            let fx = st.ledger.instance_upserted(info);
            self.apply(&mut st, fx).await;
            st.push_health(name);
        }
        // Closing the channel now makes the all-Unhealthy list the last one
        // kubelet is sent: ListAndWatch delivers it, then ends.
        st.channels.remove(name);
        let fx = st.ledger.instance_removed(name);
        self.apply(&mut st, fx).await;
        st.instances.remove(name);
    }

    pub async fn set_broker(&self, key: (String, String), props: Option<BTreeMap<String, String>>) {
        let mut st = self.lock().await;
        match props {
            Some(p) => st.broker.insert(key, p),
            None => st.broker.remove(&key),
        };
    }

    /// This node's local records and the cluster's claims (`None` when the
    /// API server cannot be reached), for recovery.
    pub async fn stored_claims(&self) -> (Vec<Claim>, Option<Vec<Claim>>) {
        let local = match self.timed(self.local.list()).await {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "cannot read the local claim store at start");
                Vec::new()
            }
        };
        let cluster = match self.timed(self.cluster.list()).await {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!(error = %e, "cannot list cluster claims at start; treating the API server as unreachable");
                None
            }
        };
        (local, cluster)
    }
}
