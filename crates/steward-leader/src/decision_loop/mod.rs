//! The decision loop of `steward controller`, the only writer of
//! reservation decisions ([`asks`]: the direct path's asks in it;
//! [`write`]: a batch's writes).
//!
//! Replicas elect a leader on a Lease; only the leader follows the cluster
//! and writes statuses (and, with [`ControllerConfig::device_classes`], the
//! DeviceClasses of [`crate::deviceclass`]), and it stops the moment it is
//! no longer leader (the deciding task is dropped mid-flight; a write it had
//! sent either landed — and is what the next leader restores — or did not).
//!
//! With [`ControllerConfig::decide`], every replica also serves the direct
//! path ([`crate::direct`]): the leader takes extenders' asks, decides
//! each in the same loop as every other change and answers once the
//! decision is written. A new pod's ask is decided before anything is
//! written: a rejection is answered without a write, and a reservation is
//! created already decided, in one write. Any other ask (a renewal, or
//! one the picture cannot decide yet) is written first, as the extender
//! would, and decided in a later batch.

mod asks;
mod relabel;
mod write;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::{FutureExt as _, StreamExt};
use steward_core::Millis;
use steward_kube::EventSink;
use steward_kube::lease::{LeaseConfig, elect_with_proof};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::cluster_picture::ClusterPicture;
use crate::direct::pending::Ask;
use crate::direct::server::{DecideHandle, DecideTls};
use crate::leader_watches::LeaderWatches;
use crate::metrics::ControllerMetrics;
use crate::node_gone::{self, NodeGoneConfig};
use asks::Asks;
use relabel::Relabels;
use steward_reservations::direct::ENDPOINT_ANNOTATION;
use steward_reservations::direct::client::Leader;
use write::{WRITES_IN_FLIGHT, Wrote, write};

/// Where a replica serves the direct path ([`crate::direct`]).
#[derive(Debug, Clone)]
pub struct DecideConfig {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// The URL extenders reach it at, written in the Lease while leading;
    /// `None`: `http://` (`https://` with [`ControllerConfig::decide_tls`])
    /// and the address bound (which must then be a specific one, not
    /// 0.0.0.0).
    pub advertise: Option<String>,
}

/// How the controller runs.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// The Lease replicas elect on.
    pub lease: LeaseConfig,
    /// How long a Reserved reservation waits for its pod's claims.
    pub ttl: Duration,
    /// How often reservations are checked for expiry with nothing else
    /// happening (and the metrics by phase refreshed).
    pub resync: Duration,
    /// How often the kept ledger is checked against one rebuilt from
    /// every object (O(cluster), so seldom); a difference is logged and
    /// the ledger rebuilt.
    pub audit: Duration,
    /// Also keep one `resource.k8s.io/v1` DeviceClass per Configuration
    /// ([`crate::deviceclass`]); off by default, for clusters without that
    /// API.
    pub device_classes: bool,
    /// Where leadership and the Reservations by phase are reported
    /// (unregistered by default).
    pub metrics: ControllerMetrics,
    /// Serve the direct path there (`None`, the default: extenders use
    /// the API path only). A standby also probes the leader's endpoint and
    /// takes over at once when it refuses connections (the leader's
    /// process is gone), instead of waiting for the Lease to expire.
    pub decide: Option<DecideConfig>,
    /// Who may ask on the direct path ([`crate::direct::auth`]); `None`
    /// (the default): anyone who reaches it (warned once).
    pub decide_auth: Option<std::sync::Arc<crate::direct::auth::Authenticator>>,
    /// Serve the direct path over HTTPS with this certificate (the
    /// extenders verify it); `None` (the default): plain HTTP.
    pub decide_tls: Option<DecideTls>,
    /// How long a new leader waits before reading the cluster: writes its
    /// predecessor had sent when it died land first, and are in the lists
    /// it decides from.
    pub takeover_horizon: Duration,
    /// The leader removes deleted Nodes from the Instances
    /// ([`crate::node_gone`]); `None`: the agents do (each follows every
    /// Node), or nobody.
    pub node_gone: Option<NodeGoneConfig>,
    /// The leader keeps the node-membership labels of Instances,
    /// SlotClaims and Reserved Reservations ([`crate::node_labels`]), which
    /// the agents' selected watches follow. On by default.
    pub node_labels: bool,
}

impl ControllerConfig {
    /// Lease `steward-controller` in `namespace`, as `identity`; 2 minute
    /// TTL; 1 s expiry checks; an audit every 5 minutes; no DeviceClasses.
    pub fn new(namespace: &str, identity: &str) -> Self {
        Self {
            lease: LeaseConfig::new(namespace, "steward-controller", identity),
            ttl: Duration::from_secs(120),
            resync: Duration::from_secs(1),
            audit: Duration::from_secs(300),
            device_classes: false,
            metrics: ControllerMetrics::default(),
            decide: None,
            decide_auth: None,
            decide_tls: None,
            takeover_horizon: Duration::from_millis(300),
            node_gone: Some(NodeGoneConfig::default()),
            node_labels: true,
        }
    }
}

/// What went wrong around the decisions (never a decision itself).
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    #[error("the leader election task failed: {0}")]
    Election(#[from] tokio::task::JoinError),
    #[error("listening for direct decisions on {0}: {1}")]
    Listen(SocketAddr, std::io::Error),
    #[error("--decide-advertise is needed: {0} is not an address extenders can reach")]
    Advertise(SocketAddr),
    #[error("the decide endpoint stopped serving; stopped leading and released the Lease")]
    EndpointGone,
}

/// Asks queued for the decision loop at most; more are answered 503.
const ASK_QUEUE: usize = 4096;

fn now() -> Millis {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    Millis(u64::try_from(ms).unwrap_or(u64::MAX))
}

/// Runs until `stop` is cancelled: stands for election and decides while
/// leading.
pub async fn run(
    client: kube::Client,
    cfg: ControllerConfig,
    stop: CancellationToken,
) -> Result<(), ControllerError> {
    // Cancelled by the caller, or by this replica's endpoint ending.
    let outer = stop;
    let stop = outer.child_token();
    let mut lease = cfg.lease.clone();
    let (asks, mut asked) = mpsc::channel(ASK_QUEUE);
    let listener = match &cfg.decide {
        Some(d) => {
            let listener = tokio::net::TcpListener::bind(d.listen)
                .await
                .map_err(|e| ControllerError::Listen(d.listen, e))?;
            let bound = listener
                .local_addr()
                .map_err(|e| ControllerError::Listen(d.listen, e))?;
            let url = match &d.advertise {
                Some(url) => url.clone(),
                None if bound.ip().is_unspecified() => {
                    return Err(ControllerError::Advertise(bound));
                }
                None if cfg.decide_tls.is_some() => format!("https://{bound}"),
                None => format!("http://{bound}"),
            };
            tracing::info!(listen = %bound, advertise = %url, tls = cfg.decide_tls.is_some(), "serving direct decisions");
            lease.annotations.insert(ENDPOINT_ANNOTATION.into(), url);
            Some(listener)
        }
        None => None,
    };
    // A standby's proof that the leader's process is gone (direct path
    // only: it needs the leader's endpoint).
    let (proof, proofs) = watch::channel(None);
    let _prober = listener.is_some().then(|| {
        let leader = Leader::follow(client.clone(), &lease.namespace, &lease.name);
        AbortOnDropHandle::new(tokio::spawn(crate::direct::prober::run(
            leader,
            lease.identity.clone(),
            proof,
        )))
    });
    let (mut leading, election) = elect_with_proof(client.clone(), lease, stop.clone(), proofs);
    // Aborting this task (a crash) takes the election down with it: no
    // orphaned renewals keep a dead controller's Lease alive.
    let election = AbortOnDropHandle::new(election);
    // The same for the endpoint: its connections close with it. And a
    // replica whose endpoint is gone must not lead (a standby takes a
    // refused endpoint for a dead leader): its end, a panic included, stops
    // this replica, which releases the Lease.
    let endpoint_gone = CancellationToken::new();
    let _endpoint = listener.map(|l| {
        let handle = DecideHandle {
            asks,
            leading: leading.clone(),
            metrics: cfg.metrics.clone(),
            auth: cfg.decide_auth.clone(),
        };
        let (stop, gone) = (stop.clone(), endpoint_gone.clone());
        let tls = cfg.decide_tls.clone();
        AbortOnDropHandle::new(tokio::spawn(async move {
            let _stops = (stop.clone().drop_guard(), gone.drop_guard());
            match tls {
                None => crate::direct::server::serve(l, handle, stop).await,
                Some(tls) => crate::direct::server::serve_tls(l, handle, tls, stop).await,
            }
        }))
    });
    let (events, events_task) =
        EventSink::start(client.clone(), "steward-controller", &cfg.lease.identity);
    let events_task = AbortOnDropHandle::new(events_task);
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            r = leading.wait_for(|l| *l) => if r.is_err() { break },
        }
        tracing::info!(
            identity = %cfg.lease.identity,
            device_classes = cfg.device_classes,
            "leading: deciding reservations"
        );
        cfg.metrics.leading.set(1);
        // One watch per kind for the lead, shared by its tasks; they all
        // end with it.
        let watches = LeaderWatches::new(client.clone());
        let ended = tokio::select! {
            () = decide(client.clone(), &cfg, events.clone(), &mut asked, &watches) => false,
            () = device_classes(client.clone(), cfg.device_classes, events.clone(), &watches) => false,
            () = nodes_gone(client.clone(), cfg.node_gone.clone(), events.clone(), &watches) => false,
            () = lost(&mut leading) => {
                tracing::warn!(identity = %cfg.lease.identity, "no longer leader: stopped deciding");
                false
            }
            () = stop.cancelled() => true,
        };
        drop(watches);
        // A standby reports nothing it does not decide.
        cfg.metrics.leading.set(0);
        cfg.metrics.set_phases(&[], None);
        if ended {
            break;
        }
    }
    drop(events);
    let _ = events_task.await;
    election.await?;
    if endpoint_gone.is_cancelled() && !outer.is_cancelled() {
        return Err(ControllerError::EndpointGone);
    }
    Ok(())
}

/// Keeps the DeviceClasses while leading when `on`; never returns (not
/// even when the cluster does not serve DeviceClasses: the decisions go on).
async fn device_classes(
    client: kube::Client,
    on: bool,
    events: EventSink,
    watches: &LeaderWatches,
) {
    if on {
        crate::deviceclass::maintain_with(client, events, watches).await;
    }
    std::future::pending::<()>().await;
}

/// Removes deleted Nodes from the Instances while leading when asked;
/// never returns.
async fn nodes_gone(
    client: kube::Client,
    cfg: Option<NodeGoneConfig>,
    events: EventSink,
    watches: &LeaderWatches,
) {
    if let Some(cfg) = cfg {
        node_gone::maintain_with(client, cfg, events, watches).await;
    }
    std::future::pending::<()>().await;
}

async fn lost(leading: &mut watch::Receiver<bool>) {
    let _ = leading.wait_for(|l| !*l).await;
}

/// Follows the cluster and writes decisions; never returns on its own.
async fn decide(
    client: kube::Client,
    cfg: &ControllerConfig,
    events: EventSink,
    asks: &mut mpsc::Receiver<Ask>,
    watches: &LeaderWatches,
) {
    tokio::time::sleep(cfg.takeover_horizon).await;
    let mut instances = watches.instances().subscribe();
    let mut claims = watches.slot_claims().subscribe();
    let mut reservations = watches.reservations().subscribe();
    let mut pods = watches.pods().subscribe();
    let mut nodes = watches.nodes().subscribe();
    let mut tick = tokio::time::interval(cfg.resync);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut picture = ClusterPicture::default();
    let ttl_ms = u64::try_from(cfg.ttl.as_millis()).unwrap_or(u64::MAX);
    let mut audited = tokio::time::Instant::now();
    // Asks written off the loop report back here.
    let (asked, mut written) = mpsc::unbounded_channel();
    let mut held = Asks::new(client.clone(), asked);
    let mut relabels = Relabels::new(client.clone(), cfg.node_labels);
    loop {
        // Asks held for the ledger are taken as soon as it is built.
        let ticked = if held.held() && picture.kept() {
            false
        } else {
            tokio::select! {
                Some(c) = instances.next() => { relabels.instances(&c); picture.instances(c); false }
                Some(c) = claims.next() => { relabels.claims(&c); picture.slot_claims(c); false }
                Some(c) = reservations.next() => {
                    relabels.reservations(&c);
                    held.seen(&mut picture, c);
                    false
                }
                Some(c) = pods.next() => { picture.pods(c); false }
                Some(c) = nodes.next() => { picture.nodes(c); false }
                Some(a) = asks.recv() => { held.hold(a); false }
                Some(r) = written.recv() => { held.written(&mut picture, r); false }
                _ = tick.tick() => true,
            }
        };
        // Take everything already waiting before deciding, so a burst is
        // one batch.
        while let Some(Some(c)) = reservations.next().now_or_never() {
            relabels.reservations(&c);
            held.seen(&mut picture, c);
        }
        while let Ok(r) = written.try_recv() {
            held.written(&mut picture, r);
        }
        held.take_held(&mut picture);
        let at = now();
        let rebuilds = picture.rebuilds();
        let mut writes = picture.reconcile(ttl_ms, at);
        cfg.metrics
            .ledger_rebuilds
            .inc_by(picture.rebuilds().saturating_sub(rebuilds));
        writes.retain(|w| !held.unwritten_rejection(&mut picture, w));
        // A Reservation created with its decision carries its node labels
        // from the start.
        for w in writes.iter_mut().filter(|w| w.creates()) {
            relabels.label_held(&mut w.object);
        }
        // The batch's decisions come from one ledger, so no two of them
        // hold the same slot: their writes go out together, and every
        // result is applied before the next batch is decided (a written
        // decision counts at once: the next batch must not hand its slots
        // to another pod before the watch echoes it).
        let mut results = futures::stream::iter(writes)
            .map(|w| {
                let uid = w.object.spec.pod.uid.clone();
                let key = (w.namespace.clone(), w.name.clone());
                write(&client, &events, w).map(move |r| (uid, key, r))
            })
            .buffer_unordered(WRITES_IN_FLIGHT);
        let mut landed = HashSet::new();
        while let Some((uid, (ns, name), written)) = results.next().await {
            match written {
                Wrote::Done(written) => {
                    held.own(&mut picture, *written);
                    landed.insert(uid);
                }
                Wrote::Gone => {
                    picture.reservation_gone(&ns, &name);
                    picture.unwritten(&uid);
                }
                Wrote::Not => picture.unwritten(&uid),
                Wrote::Unserved => {
                    picture.unwritten(&uid);
                    held.unserved();
                }
            }
        }
        drop(results);
        held.settle_proposals(&mut picture, &landed);
        if ticked {
            held.sweep();
            let gave_up = picture.forget_expected(Millis(at.0.saturating_sub(ECHO_WAIT_MS)));
            if gave_up > 0 {
                tracing::warn!(
                    reservations = gave_up,
                    "the watch never brought this controller's own writes of some Reservations; following their events again"
                );
            }
        }
        if ticked && picture.ready() {
            // O(Reservations): once per resync, not per batch.
            let (counts, oldest) = picture.phases(at);
            cfg.metrics.set_phases(&counts, oldest);
            // After the batch and at its instant, so the audit and the
            // kept ledger judge the same moment.
            if audited.elapsed() >= cfg.audit {
                audited = tokio::time::Instant::now();
                audit(&mut picture, ttl_ms, at, &cfg.metrics);
            }
        }
    }
}

/// Longest a write's watch event is awaited before its key's events are
/// taken again.
const ECHO_WAIT_MS: u64 = 30_000;

/// Compares the kept ledger with one rebuilt from every object; where they
/// differ, says so and rebuilds.
fn audit(picture: &mut ClusterPicture, ttl_ms: u64, at: Millis, metrics: &ControllerMetrics) {
    let differ = picture.audit(ttl_ms, at);
    metrics.audits.inc();
    metrics
        .audit_differences
        .inc_by(u64::try_from(differ.len()).unwrap_or(u64::MAX));
    if differ.is_empty() {
        tracing::debug!("audit: the kept ledger agrees with every object");
        return;
    }
    let names: Vec<String> = differ
        .iter()
        .take(5)
        .map(|w| format!("{}/{}", w.namespace, w.name))
        .collect();
    tracing::warn!(
        differences = differ.len(),
        first = ?names,
        "audit: the kept reservation ledger differs from one rebuilt from every object; rebuilding"
    );
    picture.invalidate();
}
