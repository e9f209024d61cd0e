//! The effect interpreter: what the ledger decided, carried out on the
//! claim stores in order while the lock is held, feeding back what the
//! stores answer (a conflict, an unreachable API server).

use std::collections::VecDeque;

use steward_core::ledger::Holding;
use steward_core::slots::{Claim, Effect};

use super::{SlotKeeper, State};
use crate::claims::{ClaimError, ClaimStore, ClaimWrite};

impl<L: ClaimStore, C: ClaimStore> SlotKeeper<L, C> {
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
                            Err(ClaimError::NoInstance(m)) => {
                                // The device is offline while the slot is
                                // held: retried each tick until it is back
                                // (counted by result="no_instance").
                                tracing::debug!(%slot, error = %m, "slot claim waits for its Instance");
                                st.ledger.cluster_write_failed(&slot);
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
}
