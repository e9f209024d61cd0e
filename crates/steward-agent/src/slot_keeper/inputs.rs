//! What the slot keeper is told from outside, each under the lock and
//! carried out before it is released: pod events and lists, kubelet's pod
//! resources, ticks, Reservations, the cluster's claims, recovery.

use std::collections::BTreeMap;
use std::time::Duration;

use steward_core::Millis;
use steward_core::slots::{Claim, PodInfo, PodResources, RecoveryInput, SlotAllocator};

use super::SlotKeeper;
use super::State;
use super::clock::now;
use crate::claims::ClaimStore;

impl<L: ClaimStore, C: ClaimStore> SlotKeeper<L, C> {
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
            self.follow_up();
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
        let (ledger, fx) = SlotAllocator::recover(self.node.clone(), config, input);
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
            self.follow_up();
        }
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
