//! Making a claim plan durable: the local store, then the cluster, then
//! the commit; rolled back on any failure. Allocate (the device plugins)
//! and NodePrepareResources (DRA) both claim through here and turn the
//! typed refusal into their own wire answer.

use steward_core::slots::{AllocateError, AllocatePlan, PlanError, SlotAllocator};

use super::clock::now;
use super::{SlotKeeper, State};
use crate::claims::{ClaimError, ClaimStore, ClaimWrite};

/// Why a claim plan was refused or could not be made durable; nothing was
/// claimed. The text is what kubelet is answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimRefused {
    /// The ledger refused the plan.
    #[error(transparent)]
    Ledger(#[from] AllocateError),
    /// The plan expired while it was being written.
    #[error("slot claim expired before it was durable: {0}")]
    Expired(PlanError),
    /// Another node claimed a slot in the cluster first.
    #[error(
        "slot {slot:?} is held by node {node:?} (claimed in the cluster first); nothing was allocated"
    )]
    HeldElsewhere { slot: String, node: String },
    /// A claim store failed (or the API server stayed unreachable).
    #[error("slot claims for {what} could not be made durable: {reason}; nothing was allocated")]
    NotDurable { what: String, reason: String },
}

impl ClaimRefused {
    /// The `result` label of the outcome metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Ledger(e) => match e {
                AllocateError::NoDevices => "invalid",
                AllocateError::UnknownDevice { .. } => "unknown_device",
                AllocateError::DeviceGone { .. } => "device_gone",
                AllocateError::HeldByOtherNode { .. } => "held_elsewhere",
                AllocateError::ReservedForOtherNode { .. } => "reserved_elsewhere",
                AllocateError::ClusterUnreachable { .. } => "cluster_unreachable",
                AllocateError::ClaimInFlight { .. } => "in_flight",
                AllocateError::HeldByClaim { .. } => "held_by_claim",
                AllocateError::InUseByDevicePlugin { .. } => "in_use",
            },
            Self::Expired(_) => "expired",
            Self::HeldElsewhere { .. } => "held_elsewhere",
            Self::NotDurable { .. } => "store_failed",
        }
    }
}

/// Why an allocate plan could not be made durable.
enum Durable {
    Done,
    Conflict { slot: String, node: String },
    ClusterDown(String),
    Failed(String),
}

impl<L: ClaimStore, C: ClaimStore> SlotKeeper<L, C> {
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

    /// Makes a plan of the ledger's (`make`: Allocate or a DRA prepare;
    /// `what` names its devices in errors, formatted only then)
    /// durable — local store, then the cluster — and commits it; on any
    /// failure the plan is rolled back and the error says why. A cluster
    /// found unreachable mid-way is retried once against the local store
    /// only (unshared devices go ahead, shared ones fail closed).
    pub(crate) async fn claim_durably(
        &self,
        st: &mut State,
        what: impl Fn() -> String,
        mut make: impl FnMut(&mut SlotAllocator) -> Result<AllocatePlan, AllocateError>,
    ) -> Result<(), ClaimRefused> {
        let mut retried = false;
        loop {
            let plan = match make(&mut st.ledger) {
                Ok(plan) => plan,
                Err(e) => {
                    tracing::warn!(devices = %what(), error = %e, "claim refused");
                    return Err(e.into());
                }
            };
            match self.make_durable(&plan).await {
                Durable::Done => {
                    // Answered right below: the settle window starts now.
                    return st
                        .ledger
                        .commit(plan.id, now())
                        .map_err(ClaimRefused::Expired);
                }
                Durable::Conflict { slot, node } => {
                    let fx = st
                        .ledger
                        .claim_conflict(plan.id, &slot, &node)
                        .unwrap_or_default();
                    self.apply(st, fx).await;
                    tracing::warn!(%slot, holder = %node, "claim lost the slot to another node");
                    return Err(ClaimRefused::HeldElsewhere { slot, node });
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
                    return Err(ClaimRefused::NotDurable {
                        what: what(),
                        reason: m,
                    });
                }
            }
        }
    }
}
