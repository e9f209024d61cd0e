//! The inputs of the device plugins: Instances and Configurations (which
//! plugins to serve, what Allocate answers), this node's pods (reclaim),
//! kubelet's pod resources (who uses a slot), the cluster's claims; and the
//! start-up read that rebuilds the ledger.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{FutureExt, Stream, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use steward_api::{Configuration, Instance, Reservation};
use steward_core::slots::{PodInfo, PodPhase, PodResources, RecoveryInput};
use steward_kube::{Change, Mirror, SharedWatch};
use tokio::sync::mpsc;

use super::podresources::PodResourcesClient;
use crate::claims::{ClaimEvent, ClaimStore, InstanceDirectory, InstanceRef};
use crate::selection::Selection;
use crate::slot_keeper::ServedInstance;
use crate::slot_keeper::{SlotKeeper, now};

/// Changes of what the plugins serve.
#[derive(Debug)]
pub(crate) enum CatalogEvent {
    /// What changed in the set of Instances this node serves, by name.
    Instances(ServedChanges),
    /// Broker properties of a Configuration (`None`: deleted), and whether
    /// its Instances are served through DRA only
    /// ([`Configuration::served_through_dra`]; `false` when deleted).
    Broker {
        key: (String, String),
        props: Option<BTreeMap<String, String>>,
        through_dra: bool,
    },
}

/// A change of the served set: each name a change touched, with what this
/// node serves under it now (`None`: nothing). When `complete`, the
/// entries are the whole set, and a name missing from them is gone.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct ServedChanges {
    pub complete: bool,
    pub entries: BTreeMap<String, Option<ServedInstance>>,
}

impl ServedChanges {
    /// The whole served set.
    pub(crate) fn complete(served: BTreeMap<String, ServedInstance>) -> Self {
        Self {
            complete: true,
            entries: served.into_iter().map(|(k, v)| (k, Some(v))).collect(),
        }
    }

    /// Folds `later` into `self`, as if both had been applied in order.
    pub(crate) fn merge(&mut self, later: ServedChanges) {
        if later.complete {
            *self = later;
        } else {
            self.entries.extend(later.entries);
        }
    }
}

fn served_on(
    instances: &BTreeMap<(String, String), Instance>,
    node: &str,
) -> BTreeMap<String, ServedInstance> {
    instances
        .values()
        .filter_map(|inst| served_here(inst, node))
        .map(|s| (s.name.clone(), s))
        .collect()
}

/// What this node serves of `inst`: nothing when the node does not see it.
fn served_here(inst: &Instance, node: &str) -> Option<ServedInstance> {
    if !inst.spec.nodes.iter().any(|n| n == node) {
        return None;
    }
    let served = ServedInstance::from_instance(inst, node);
    if served.is_none() {
        tracing::warn!(
            instance = ?inst.metadata.name,
            "instance name cannot be an extended resource name; not serving it"
        );
    }
    served
}

fn key_of(meta: &kube::api::ObjectMeta) -> Option<(String, String)> {
    Some((meta.namespace.clone()?, meta.name.clone()?))
}

/// The pod as the slot ledger sees it.
pub(crate) fn pod_info(pod: &Pod, deleted: bool) -> Option<PodInfo> {
    let m = &pod.metadata;
    let phase = match pod.status.as_ref().and_then(|s| s.phase.as_deref()) {
        Some("Running") => PodPhase::Running,
        Some("Succeeded") => PodPhase::Succeeded,
        Some("Failed") => PodPhase::Failed,
        Some("Unknown") => PodPhase::Unknown,
        _ => PodPhase::Pending,
    };
    Some(PodInfo {
        uid: m.uid.clone()?,
        namespace: m.namespace.clone()?,
        name: m.name.clone()?,
        node: pod.spec.as_ref()?.node_name.clone()?,
        phase,
        deleted,
    })
}

/// What the start-up read found.
pub(crate) struct Initial {
    pub served: BTreeMap<String, ServedInstance>,
    pub broker: BTreeMap<(String, String), BTreeMap<String, String>>,
    /// Configurations whose Instances are served through DRA only.
    pub through_dra: BTreeSet<(String, String)>,
    pub input: RecoveryInput,
}

/// Reads everything [`steward_core::slots::SlotAllocator::recover`] needs.
/// Sources that cannot be read count as empty, except the pods: without
/// the API server, the holders kubelet still reports are taken as live
/// (their claims are kept; the pod watch settles them once it lists).
pub(crate) async fn recovery_input<L: ClaimStore, C: ClaimStore>(
    client: &kube::Client,
    node: &str,
    selection: &Selection,
    podres: &PodResourcesClient,
    core: &SlotKeeper<L, C>,
    directory: Option<&InstanceDirectory>,
) -> Initial {
    let mut served = BTreeMap::new();
    match Api::<Instance>::all(client.clone())
        .list(&selection.list())
        .await
    {
        Ok(list) => {
            let mut all = BTreeMap::new();
            for inst in list.items {
                if let (Some(dir), Some(r)) = (directory, InstanceRef::of(&inst)) {
                    dir.insert(r);
                }
                if let Some(k) = key_of(&inst.metadata) {
                    all.insert(k, inst);
                }
            }
            served = served_on(&all, node);
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot list Instances at start; serving none until the watch delivers them")
        }
    }
    let mut broker = BTreeMap::new();
    let mut through_dra = BTreeSet::new();
    match Api::<Configuration>::all(client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(list) => {
            for c in list.items {
                if let Some(k) = key_of(&c.metadata) {
                    if c.served_through_dra() {
                        through_dra.insert(k.clone());
                    }
                    broker.insert(k, c.spec.broker_properties.clone());
                }
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot list Configurations at start"),
    }
    let (local, cluster) = core.stored_claims().await;
    let at = now();
    let podresources = match podres.list().await {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read kubelet pod resources at start");
            Vec::new()
        }
    };
    let pods = match Api::<Pod>::all(client.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
    {
        Ok(list) => list
            .items
            .iter()
            .filter_map(|p| pod_info(p, false))
            .collect(),
        Err(e) => {
            tracing::warn!(error = %e, "cannot list this node's pods at start; trusting kubelet's pod resources");
            pods_from_kubelet(node, &local, &podresources)
        }
    };
    let instances = served.values().map(|s| s.info(true)).collect();
    Initial {
        served,
        broker,
        through_dra,
        input: RecoveryInput {
            instances,
            local,
            cluster,
            podresources,
            pods,
            now: at,
        },
    }
}

/// Holders of local claims that kubelet still reports, as live pods.
fn pods_from_kubelet(
    node: &str,
    local: &[steward_core::slots::Claim],
    podresources: &[PodResources],
) -> Vec<PodInfo> {
    let live: BTreeSet<(&str, &str)> = podresources
        .iter()
        .map(|p| (p.namespace.as_str(), p.name.as_str()))
        .collect();
    let mut seen = BTreeSet::new();
    local
        .iter()
        .filter_map(|c| c.holding.holder.as_ref())
        .filter(|h| live.contains(&(h.pod.namespace.as_str(), h.pod.name.as_str())))
        .filter(|h| seen.insert(h.pod.uid.clone()))
        .map(|h| PodInfo {
            uid: h.pod.uid.clone(),
            namespace: h.pod.namespace.clone(),
            name: h.pod.name.clone(),
            node: node.to_owned(),
            phase: PodPhase::Running,
            deleted: false,
        })
        .collect()
}

/// The agent's Instances (its shared watch); sends what changed in the set
/// this node serves, and keeps `directory` current.
///
/// Changes already waiting are applied together before one update is sent.
/// Only the names a change touches are looked at again and sent, so a
/// burst of a thousand new Instances costs a thousand small updates, not a
/// thousand copies of a growing set; a relist recomputes and sends the
/// whole set.
pub(crate) async fn watch_instances(
    instances: SharedWatch<Instance>,
    node: String,
    directory: Option<InstanceDirectory>,
    tx: mpsc::Sender<CatalogEvent>,
) {
    let mut changes = instances.subscribe();
    let mut index = ServedIndex::new(node);
    let mut sent = false;
    while let Some(first) = changes.next().await {
        let mut out = ServedChanges::default();
        let mut next = Some(first);
        while let Some(change) = next.take() {
            out.merge(index.apply(change, directory.as_ref()));
            next = changes.next().now_or_never().flatten();
        }
        if !sent {
            // The first update is complete: the manager may have started
            // from a list older than the watch's.
            out = ServedChanges::complete(index.served.clone());
        }
        if out.complete || !out.entries.is_empty() {
            sent = true;
            if tx.send(CatalogEvent::Instances(out)).await.is_err() {
                return;
            }
        }
    }
}

type InstanceMirror = Mirror<Instance, Instance, (String, String)>;

/// Every Instance, the namespaces each name is used in, and the set this
/// node serves (keyed by name alone, as kubelet's resource names are).
struct ServedIndex {
    node: String,
    all: InstanceMirror,
    by_name: BTreeMap<String, BTreeSet<String>>,
    served: BTreeMap<String, ServedInstance>,
}

impl ServedIndex {
    fn new(node: String) -> Self {
        Self {
            node,
            all: Mirror::keyed(|i: &Instance| key_of(&i.metadata), Some),
            by_name: BTreeMap::new(),
            served: BTreeMap::new(),
        }
    }

    /// Folds one change in; returns what changed in the served set.
    fn apply(
        &mut self,
        change: Change<Instance>,
        directory: Option<&InstanceDirectory>,
    ) -> ServedChanges {
        let delta = match self.all.apply(change) {
            Ok(delta) => delta,
            Err(e) => {
                tracing::warn!(error = %e, "Instance watch failed; retrying");
                return ServedChanges::default();
            }
        };
        if let Some(dir) = directory {
            for inst in delta.applied.iter().filter_map(|k| self.all.get(k)) {
                if let Some(r) = InstanceRef::of(inst) {
                    dir.insert(r);
                }
            }
            // Only a deletion seen as such leaves the directory: an
            // Instance missing from a relist stays resolvable.
            if !delta.relisted {
                for ((namespace, name), _) in &delta.removed {
                    if dir.get(name).is_some_and(|r| &r.namespace == namespace) {
                        dir.remove(name);
                    }
                }
            }
        }
        if delta.relisted {
            self.by_name.clear();
            for (namespace, name) in self.all.as_map().keys() {
                self.by_name
                    .entry(name.clone())
                    .or_default()
                    .insert(namespace.clone());
            }
            let now = served_on(self.all.as_map(), &self.node);
            if now == self.served {
                return ServedChanges::default();
            }
            self.served = now;
            return ServedChanges::complete(self.served.clone());
        }
        for ((namespace, name), _) in &delta.removed {
            if let Some(spaces) = self.by_name.get_mut(name) {
                spaces.remove(namespace);
                if spaces.is_empty() {
                    self.by_name.remove(name);
                }
            }
        }
        for (namespace, name) in &delta.applied {
            self.by_name
                .entry(name.clone())
                .or_default()
                .insert(namespace.clone());
        }
        // For each name a change touched, the entry is what a full
        // recompute (`served_on`) would give: the last Instance of that
        // name, in (namespace, name) order, that this node serves.
        let touched: BTreeSet<String> = delta
            .removed
            .into_iter()
            .map(|((_, name), _)| name)
            .chain(delta.applied.into_iter().map(|(_, name)| name))
            .collect();
        let mut out = ServedChanges::default();
        for name in touched {
            let now = self.by_name.get(&name).and_then(|spaces| {
                spaces.iter().rev().find_map(|ns| {
                    let inst = self.all.get(&(ns.clone(), name.clone()))?;
                    served_here(inst, &self.node)
                })
            });
            if self.served.get(&name) != now.as_ref() {
                match &now {
                    Some(s) => self.served.insert(name.clone(), s.clone()),
                    None => self.served.remove(&name),
                };
                out.entries.insert(name, now);
            }
        }
        out
    }
}

/// Configurations of every namespace: their broker properties, and whether
/// their Instances are served through DRA only.
pub(crate) async fn watch_configurations(
    configurations: SharedWatch<Configuration>,
    tx: mpsc::Sender<CatalogEvent>,
) {
    let mut changes = configurations.subscribe();
    let mut known = Mirror::keyed(
        |c: &Configuration| key_of(&c.metadata),
        |c: Configuration| {
            let through_dra = c.served_through_dra();
            Some((c.spec.broker_properties, through_dra))
        },
    );
    while let Some(change) = changes.next().await {
        let delta = match known.apply(change) {
            Ok(delta) => delta,
            Err(e) => {
                tracing::warn!(error = %e, "Configuration watch failed; retrying");
                continue;
            }
        };
        // Stored or replaced: its properties; gone: none.
        let mut out: Vec<_> = delta
            .applied
            .into_iter()
            .map(|k| {
                let seen = known.get(&k).cloned();
                (k, seen)
            })
            .collect();
        out.extend(delta.removed.into_iter().map(|(k, _)| (k, None)));
        for (key, seen) in out {
            let (props, through_dra) = match seen {
                Some((props, through_dra)) => (Some(props), through_dra),
                None => (None, false),
            };
            let event = CatalogEvent::Broker {
                key,
                props,
                through_dra,
            };
            if tx.send(event).await.is_err() {
                return;
            }
        }
    }
}

/// This node's pods (the shared `spec.nodeName=<node>` watch): reclaim on Deleted and on
/// terminal phases, at once; a live pod while slots await attribution is
/// looked up in kubelet's pod resources.
pub(crate) async fn watch_pods<L: ClaimStore, C: ClaimStore>(
    pods: SharedWatch<Pod>,
    core: Arc<SlotKeeper<L, C>>,
    podres: PodResourcesClient,
) {
    let mut changes = pods.subscribe();
    while let Some(change) = changes.next().await {
        match change {
            Change::Relisted(listed) => {
                let pods: Vec<PodInfo> = listed.iter().filter_map(|p| pod_info(p, false)).collect();
                tracing::debug!(pods = pods.len(), "pod list of this node");
                core.pods_listed(&pods).await;
            }
            Change::Applied(pod) => {
                if let Some(info) = pod_info(&pod, false)
                    && core.pod_observed(&info).await
                {
                    let at = now();
                    match podres.get(&info.namespace, &info.name).await {
                        Ok(resources) => core.podresources_got(&resources, at).await,
                        Err(e) if e.is_not_found() => {}
                        Err(e) => {
                            tracing::debug!(pod = %info.name, error = %e, "pod resources Get failed")
                        }
                    }
                }
            }
            Change::Deleted(pod) => {
                if let Some(info) = pod_info(&pod, true) {
                    core.pod_observed(&info).await;
                }
            }
            Change::Interrupted(e) => tracing::warn!(error = %e, "pod watch failed; retrying"),
        }
    }
}

/// After each Allocate (or poke), lists kubelet's pod resources until no
/// slot awaits attribution, or `limit` passed since the last poke. Lists
/// back off (20 ms doubling up to 2 s), start over on a poke (a poke
/// arriving during a wait cuts it short), and one list is always made right
/// after the next settle instant of a pending claim, so a slot whose pod
/// was deleted before it was attributed is released about `settle_ms` after
/// the Allocate, not after the pending timeout.
pub(crate) async fn follow_allocations<L: ClaimStore, C: ClaimStore>(
    core: Arc<SlotKeeper<L, C>>,
    podres: PodResourcesClient,
    mut pokes: mpsc::UnboundedReceiver<()>,
    limit: Duration,
) {
    const FIRST: Duration = Duration::from_millis(20);
    const MAX: Duration = Duration::from_secs(2);
    while pokes.recv().await.is_some() {
        let mut delay = FIRST;
        let mut deadline = Instant::now() + limit;
        loop {
            let mut poked = tokio::select! {
                () = tokio::time::sleep(delay) => false,
                Some(()) = pokes.recv() => true,
            };
            if poked {
                // Give kubelet a moment to record the Allocate answer.
                tokio::time::sleep(FIRST).await;
            }
            while pokes.try_recv().is_ok() {
                poked = true;
            }
            if poked {
                deadline = Instant::now() + limit;
            }
            let at = now();
            let (awaiting, settle) = match podres.list().await {
                Ok(pods) => core.podresources_listed(&pods, at).await,
                Err(e) => {
                    tracing::debug!(error = %e, "pod resources List failed");
                    (true, None)
                }
            };
            if !awaiting || Instant::now() >= deadline {
                break;
            }
            delay = if poked { FIRST } else { (delay * 2).min(MAX) };
            if let Some(settle) = settle {
                delay = delay.min(settle);
            }
        }
    }
}

/// Feeds the cluster's claims to the ledger.
pub(crate) async fn feed_claims<L: ClaimStore, C: ClaimStore>(
    core: Arc<SlotKeeper<L, C>>,
    events: impl Stream<Item = ClaimEvent> + Send + 'static,
) {
    let mut events = Box::pin(events);
    while let Some(ev) = events.next().await {
        match ev {
            ClaimEvent::Relisted(claims) => core.cluster_claims_listed(&claims).await,
            ClaimEvent::Applied(claim) => core.cluster_claim_observed(&claim).await,
            ClaimEvent::Deleted { slot, node } => core.cluster_claim_removed(&slot, &node).await,
            ClaimEvent::Interrupted(message) => {
                tracing::debug!(error = %message, "slot claim watch interrupted");
            }
        }
    }
}

/// The agent's Reservations (its shared watch): the slots held at scheduling time for
/// pods bound for a node (Reserved ones only). Slots reserved for another
/// node are kept from this node's kubelet (Unhealthy, refused at Allocate)
/// until the reservation is consumed, canceled or expires.
pub(crate) async fn watch_reservations<L: ClaimStore, C: ClaimStore>(
    reservations: SharedWatch<Reservation>,
    core: Arc<SlotKeeper<L, C>>,
) {
    let mut changes = reservations.subscribe();
    let slots = |r: &Reservation| -> Vec<(String, String)> {
        match &r.status {
            Some(s) if s.phase == "Reserved" => match &s.node {
                Some(node) => s
                    .slots
                    .iter()
                    .map(|slot| (slot.clone(), node.clone()))
                    .collect(),
                None => Vec::new(),
            },
            _ => Vec::new(),
        }
    };
    let mut held = Mirror::projected(move |r: Reservation| Some(slots(&r)));
    while let Some(change) = changes.next().await {
        if let Err(e) = held.apply(change) {
            tracing::debug!(error = %e, "Reservation watch failed; retrying");
            continue;
        }
        let reserved: BTreeMap<String, String> = held.values().flatten().cloned().collect();
        core.reservations_listed(&reserved).await;
    }
}

#[cfg(test)]
mod tests;
