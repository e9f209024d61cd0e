//! Rebuilding the ledger after an agent (re)start, kill -9 included.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::Millis;

use super::model::{
    Claim, Effect, InstanceInfo, PodInfo, PodResources, SlotConfig, Target, parse_slot_id,
};
use super::state::{LocalClaim, PodRecord, SlotAllocator};

/// Everything the agent reads at start, before serving any device plugin.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecoveryInput {
    /// The Instances this node serves.
    pub instances: Vec<InstanceInfo>,
    /// This node's records in its local durable ledger.
    pub local: Vec<Claim>,
    /// Every claim in the cluster (all nodes), or `None` when the API server
    /// cannot be reached.
    pub cluster: Option<Vec<Claim>>,
    /// kubelet pod-resources `List`.
    pub podresources: Vec<PodResources>,
    /// The pods of this node as listed now.
    pub pods: Vec<PodInfo>,
    pub now: Millis,
}

/// Keeps the record with the highest epoch per slot (the first on ties).
fn newest<'a>(claims: impl Iterator<Item = &'a Claim>) -> BTreeMap<String, Claim> {
    let mut by_slot: BTreeMap<String, Claim> = BTreeMap::new();
    for claim in claims {
        match by_slot.get(claim.slot()) {
            Some(kept) if kept.epoch >= claim.epoch => {}
            _ => {
                by_slot.insert(claim.slot().to_owned(), claim.clone());
            }
        }
    }
    by_slot
}

impl SlotAllocator {
    /// Rebuilds the ledger of `node` from its local ledger, the cluster's
    /// claims, kubelet's pod resources and the live pods, and returns the
    /// writes that bring both stores in line with it.
    ///
    /// For every slot this node has a record of (local or cluster; the
    /// record with the higher epoch wins, the local one on ties):
    ///
    /// * held by a pod that is live now: kept, with that holder; if an
    ///   Allocate was awaiting attribution, it gets a fresh window from `now`;
    /// * held by a pod that is gone (deleted, terminal, or not listed), with
    ///   no Allocate awaiting: freed;
    /// * no holder, or a gone holder with an Allocate awaiting: kept as a
    ///   pending claim with a fresh window (and settle window,
    ///   [`SlotConfig::settle_ms`]) from `now` (the watch and pod resources
    ///   may lag a restart), except that a pending claim of a shared device
    ///   missing from a reachable cluster is dropped (such an Allocate was
    ///   never answered: shared claims are answered only once the cluster
    ///   holds them);
    /// * claimed by another node in the cluster and not held by a live pod:
    ///   dropped. With a live holder the claim is kept but not written to
    ///   the cluster (the slot reports Unhealthy).
    ///
    /// * prepared for a DRA ResourceClaim: kept, whoever its pods are
    ///   (kubelet unprepares it), except a shared slot missing from a
    ///   reachable cluster (that prepare was never answered).
    ///
    /// Then kubelet's pod resources (taken `now`) bind slots to the live
    /// pods using them, adopting slots no record mentions.
    ///
    /// Effects: a [`Effect::WriteClaim`] for each kept claim whose local
    /// record differs (new epoch) and/or whose cluster record is missing or
    /// names another holder; a [`Effect::DeleteClaim`] for each freed slot,
    /// in the stores that have it. With the cluster unreachable every slot
    /// that has or had a claim is queued for the cluster and written on
    /// reconnect; its others-view starts empty. After recovery, send
    /// [`SlotAllocator::health`] of every Instance on ListAndWatch.
    pub fn recover(
        node: impl Into<String>,
        config: SlotConfig,
        input: RecoveryInput,
    ) -> (Self, Vec<Effect>) {
        let mut ledger = SlotAllocator::new(node, config);
        let now = input.now;
        for info in input.instances {
            ledger.instances.insert(info.name.clone(), info);
        }
        for pod in &input.pods {
            if pod.node == ledger.node && !pod.deleted {
                ledger.pods.insert(
                    pod.uid.clone(),
                    PodRecord {
                        namespace: pod.namespace.clone(),
                        name: pod.name.clone(),
                        live: pod.is_live(),
                    },
                );
            }
        }
        let known_cluster = input.cluster.is_some();
        ledger.reachable = known_cluster;
        let cluster = input.cluster.unwrap_or_default();
        ledger.others = cluster
            .iter()
            .filter(|c| c.node != ledger.node)
            .map(|c| (c.slot().to_owned(), c.node.clone()))
            .collect();
        let own_cluster = newest(cluster.iter().filter(|c| c.node == ledger.node));
        let local = newest(input.local.iter().filter(|c| c.node == ledger.node));
        let max_epoch = own_cluster
            .values()
            .chain(local.values())
            .map(|c| c.epoch)
            .max()
            .unwrap_or(0);
        ledger.next_epoch = max_epoch.saturating_add(1);

        let recorded: BTreeSet<String> = local.keys().chain(own_cluster.keys()).cloned().collect();
        for slot in &recorded {
            let record = match (local.get(slot), own_cluster.get(slot)) {
                (Some(l), Some(c)) if c.epoch > l.epoch => c,
                (Some(l), _) => l,
                (None, Some(c)) => c,
                (None, None) => continue,
            };
            let shared = parse_slot_id(slot)
                .and_then(|(instance, _)| ledger.instances.get(instance))
                .is_some_and(|i| i.shared);
            let live_holder = record
                .holding
                .holder
                .clone()
                .filter(|h| ledger.pods.get(h.uid()).is_some_and(|p| p.live));
            let contested = ledger.others.contains_key(slot);
            let kept = if let Some(hold) = record.holding.claim.clone() {
                // Prepared for a DRA claim: held until kubelet unprepares
                // it (kubelet checkpoints a claim before preparing it and
                // unprepares it after the pod, a retry included), unless
                // it is a shared slot the reachable cluster never got: that
                // prepare was never answered, and kubelet prepares again.
                (!(shared && known_cluster && !own_cluster.contains_key(slot))).then_some(
                    LocalClaim {
                        epoch: record.epoch,
                        holder: None,
                        since: record.holding.since,
                        awaiting: None,
                        answered: None,
                        plan: None,
                        dra: Some(hold),
                    },
                )
            } else if let Some(holder) = live_holder {
                Some(LocalClaim {
                    epoch: record.epoch,
                    holder: Some(holder),
                    since: record.holding.since,
                    awaiting: record.awaiting.map(|_| now),
                    answered: record.awaiting.map(|_| now),
                    plan: None,
                    dra: None,
                })
            } else if (record.holding.holder.is_some() && record.awaiting.is_none())
                || contested
                || (shared && known_cluster && !own_cluster.contains_key(slot))
            {
                // Holder gone, or a pending claim that is someone else's or
                // was never answered.
                None
            } else {
                Some(LocalClaim {
                    epoch: record.epoch,
                    holder: None,
                    since: record.awaiting.unwrap_or(record.holding.since),
                    awaiting: Some(now),
                    answered: Some(now),
                    plan: None,
                    dra: None,
                })
            };
            if let Some(claim) = kept {
                ledger.claims.insert(slot.clone(), claim);
            }
        }

        // Bind from kubelet; the writes are derived below from the final
        // state, so the incremental effects are not needed.
        let mut scratch = Vec::new();
        ledger.apply_podresources(&input.podresources, now, &mut scratch);
        ledger.unsynced.clear();
        ledger.in_cluster.clear();

        let mut effects = Vec::new();
        let slots: BTreeSet<String> = recorded
            .iter()
            .cloned()
            .chain(ledger.claims.keys().cloned())
            .collect();
        for slot in slots {
            let local_rec = local.get(&slot);
            let cluster_rec = own_cluster.get(&slot);
            let contested = ledger.others.contains_key(&slot);
            if let Some(c) = ledger.claims.get(&slot) {
                let local_differs = local_rec.is_none_or(|r| {
                    r.holding.holder != c.holder
                        || r.holding.since != c.since
                        || r.awaiting != c.awaiting
                        || r.holding.claim != c.dra
                });
                let cluster_differs = !known_cluster
                    || cluster_rec.is_none_or(|r| {
                        r.holding.holder != c.holder
                            || r.holding.claim.as_ref().map(|h| h.uid())
                                != c.dra.as_ref().map(|h| h.uid())
                    });
                if local_differs {
                    let epoch = ledger.bump();
                    if let Some(c) = ledger.claims.get_mut(&slot) {
                        c.epoch = epoch;
                    }
                }
                let write_cluster = cluster_differs && known_cluster && !contested;
                if write_cluster || (known_cluster && cluster_rec.is_some() && !contested) {
                    ledger.in_cluster.insert(slot.clone());
                }
                if cluster_differs && !write_cluster {
                    ledger.unsynced.insert(slot.clone());
                }
                let target = match (local_differs, write_cluster) {
                    (true, true) => Some(Target::Both),
                    (true, false) => Some(Target::Local),
                    (false, true) => Some(Target::Cluster),
                    (false, false) => None,
                };
                if let (Some(target), Some(c)) = (target, ledger.claims.get(&slot)) {
                    effects.push(Effect::WriteClaim {
                        claim: ledger.record(&slot, c),
                        target,
                    });
                }
            } else {
                let epoch = local_rec
                    .iter()
                    .chain(cluster_rec.iter())
                    .map(|r| r.epoch)
                    .max()
                    .unwrap_or(0);
                if !known_cluster {
                    ledger.unsynced.insert(slot.clone());
                }
                let target = match (local_rec.is_some(), cluster_rec.is_some()) {
                    (true, true) => Some(Target::Both),
                    (true, false) => Some(Target::Local),
                    (false, true) => Some(Target::Cluster),
                    (false, false) => None,
                };
                if let Some(target) = target {
                    effects.push(Effect::DeleteClaim {
                        slot,
                        epoch,
                        target,
                    });
                }
            }
        }
        (ledger, effects)
    }
}
