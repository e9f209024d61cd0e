//! Time and the cluster: plans and attributions that time out, cluster
//! claims of other nodes, reachability and queued writes.

use super::*;

impl SlotAllocator {
    // ----- time ----------------------------------------------------------

    /// Time passed. Plans outstanding for `pending_timeout_ms` are rolled
    /// back; claims unattributed for `pending_timeout_ms` stop awaiting:
    /// with no holder they are freed, with one they stay with it; waiting
    /// pod-resources entries that old are dropped; queued cluster writes are
    /// retried when the API server is reachable.
    pub fn tick(&mut self, now: Millis) -> Vec<Effect> {
        let timeout = self.config.pending_timeout_ms;
        let mut effects = Vec::new();
        let expired: Vec<PlanId> = self
            .plans
            .iter()
            .filter(|(_, p)| now.since(p.at) >= timeout)
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            self.rollback(id, &mut effects);
        }
        let stale: Vec<String> = self
            .claims
            .iter()
            .filter(|(_, c)| {
                c.plan.is_none() && c.awaiting.is_some_and(|a| now.since(a) >= timeout)
            })
            .map(|(slot, _)| slot.clone())
            .collect();
        for slot in stale {
            let Some(c) = self.claims.get_mut(&slot) else {
                continue;
            };
            c.awaiting = None;
            if c.holder.is_none() {
                self.free(&slot, &mut effects);
            } else {
                self.emit_write(&slot, &mut effects);
            }
        }
        self.unresolved.retain(|_, u| now.since(u.at) < timeout);
        self.flush(&mut effects);
        effects
    }

    // ----- cluster -------------------------------------------------------

    /// A claim seen in the cluster (watch Added/Modified). Only other nodes'
    /// claims matter; this node's own records echo its writes and are
    /// compared on lists only.
    pub fn cluster_claim_observed(&mut self, claim: &Claim) -> Vec<Effect> {
        let mut effects = Vec::new();
        if claim.node == self.node {
            self.next_epoch = self.next_epoch.max(claim.epoch.saturating_add(1));
            return effects;
        }
        let slot = claim.slot();
        let was_others = self
            .others
            .insert(slot.to_owned(), claim.node.clone())
            .is_some();
        if !was_others {
            self.slot_health_flipped(slot, &mut effects);
        }
        effects
    }

    /// A claim disappeared from the cluster (watch Deleted). This node's own
    /// record gone while it still holds the slot is written again: the
    /// garbage collector takes a record with its owner (an Instance deleted
    /// while a prepared claim or a pod keeps the hold: the device went
    /// offline and may come back), and without the record other nodes and
    /// the reservation controller would count a held slot as free. The
    /// echo of this node's own release holds nothing and writes nothing.
    pub fn cluster_claim_removed(&mut self, slot: &str, node: &str) -> Vec<Effect> {
        let mut effects = Vec::new();
        if node == self.node {
            self.in_cluster.remove(slot);
            if self.claims.contains_key(slot) {
                self.unsynced.insert(slot.to_owned());
                self.flush(&mut effects);
            }
            return effects;
        }
        if self.others.get(slot).is_none_or(|n| n != node) {
            return effects;
        }
        self.others.remove(slot);
        if self.claims.contains_key(slot) {
            // Ours was shadowed by the other node's claim: write it now.
            self.unsynced.insert(slot.to_owned());
            self.flush(&mut effects);
        }
        self.slot_health_flipped(slot, &mut effects);
        effects
    }

    /// A full list of the cluster's claims (all nodes). Replaces the view of
    /// other nodes' claims; this node's records that differ from its state
    /// (missing, extra, other holder) are queued and, if the API server is
    /// reachable, written at once.
    /// The slots reserved at scheduling time, with the node each pod is
    /// bound for (the complete set, from the Reservations). Those reserved
    /// for another node turn Unhealthy here and are refused at Allocate,
    /// unless this node already holds them; health changes are reported.
    pub fn reservations_listed(&mut self, reserved: &BTreeMap<String, String>) -> Vec<Effect> {
        let before = self.health_all();
        self.reserved_elsewhere = reserved
            .iter()
            .filter(|(_, node)| **node != self.node)
            .map(|(s, n)| (s.clone(), n.clone()))
            .collect();
        let mut effects = Vec::new();
        self.health_diff(&before, &mut effects);
        effects
    }

    pub fn cluster_claims_listed(&mut self, claims: &[Claim]) -> Vec<Effect> {
        let before = self.health_all();
        self.others = claims
            .iter()
            .filter(|c| c.node != self.node)
            .map(|c| (c.slot().to_owned(), c.node.clone()))
            .collect();
        let own: BTreeMap<&str, &Claim> = claims
            .iter()
            .filter(|c| c.node == self.node)
            .map(|c| (c.slot(), c))
            .collect();
        self.in_cluster = own.keys().map(|s| (*s).to_owned()).collect();
        // Records written before a restart may carry epochs the local
        // ledger never saw: continue above them.
        if let Some(max) = own.values().map(|c| c.epoch).max() {
            self.next_epoch = self.next_epoch.max(max.saturating_add(1));
        }
        let slots: BTreeSet<String> = own
            .keys()
            .map(|s| (*s).to_owned())
            .chain(self.claims.keys().cloned())
            .collect();
        for slot in slots {
            let stored = own
                .get(slot.as_str())
                .map(|c| (&c.holding.holder, c.holding.claim.as_ref().map(|h| h.uid())));
            let mine = self
                .claims
                .get(&slot)
                .map(|c| (&c.holder, c.dra.as_ref().map(|h| h.uid())));
            if stored != mine {
                self.unsynced.insert(slot);
            }
        }
        let mut effects = Vec::new();
        self.flush(&mut effects);
        self.health_diff(&before, &mut effects);
        effects
    }

    /// The API server became reachable or unreachable. When reachable,
    /// queued claim writes are emitted as [`Target::Cluster`] effects.
    pub fn cluster_reachability(&mut self, reachable: bool) -> Vec<Effect> {
        self.reachable = reachable;
        let mut effects = Vec::new();
        self.flush(&mut effects);
        effects
    }

    /// The cluster part of a write or delete for `slot` failed: queue it
    /// again (it is retried on the next tick or reconnect).
    pub fn cluster_write_failed(&mut self, slot: &str) {
        self.unsynced.insert(slot.to_owned());
        self.in_cluster.remove(slot);
    }

    pub(in crate::slots) fn flush(&mut self, effects: &mut Vec<Effect>) {
        if !self.reachable {
            return;
        }
        let ready: Vec<String> = self
            .unsynced
            .iter()
            .filter(|s| !self.others.contains_key(s.as_str()))
            .filter(|s| self.claims.get(s.as_str()).is_none_or(|c| c.plan.is_none()))
            .cloned()
            .collect();
        for slot in ready {
            self.unsynced.remove(&slot);
            let epoch = self.bump();
            match self.claims.get_mut(&slot) {
                Some(c) => {
                    c.epoch = epoch;
                    effects.push(Effect::WriteClaim {
                        claim: self.record(&slot, &self.claims[slot.as_str()]),
                        target: Target::Cluster,
                    });
                    self.in_cluster.insert(slot);
                }
                None => {
                    self.in_cluster.remove(&slot);
                    effects.push(Effect::DeleteClaim {
                        slot,
                        epoch,
                        target: Target::Cluster,
                    });
                }
            }
        }
    }
}
