//! The safety net under unprepare: kubelet unprepares every claim it
//! prepared (it checkpoints a claim before preparing it), but a node whose
//! kubelet state was wiped, or a hold brought back by a restart after a
//! failed local delete, would otherwise keep a slot forever. Every
//! interval (and when a hold turns one interval old), each claim holding
//! slots here for at least one interval is read back from the API; a hold
//! whose claim is gone, replaced (another UID) or no longer allocated that
//! device is released as if kubelet had unprepared it: within one
//! interval of the claim going, never before the hold is one interval
//! old. A claim keeps
//! its allocation while any pod still uses it (the resourceclaim
//! controller deallocates only a claim nobody reserves), so a live pod's
//! device is never taken.

use std::collections::BTreeMap;
use std::sync::Weak;
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use steward_core::Millis;
use steward_core::dra::DRIVER;
use steward_core::ledger::{ClaimHold, Holding};

use crate::claims::ClaimStore;
use crate::slot_keeper::SlotKeeper;

/// Why a hold is released, or `None` to keep it.
pub fn stale(hold: &ClaimHold, claim: Option<&ResourceClaim>) -> Option<String> {
    let Some(claim) = claim else {
        return Some(format!("ResourceClaim {} no longer exists", hold.claim));
    };
    if claim.metadata.uid.as_deref() != Some(hold.uid()) {
        return Some(format!("ResourceClaim {} was replaced", hold.claim));
    }
    let allocated = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
        .is_some_and(|results| {
            results.iter().any(|r| {
                r.driver == DRIVER
                    && r.pool == hold.pool
                    && r.device == hold.device
                    && r.share_id.as_deref().unwrap_or_default() == hold.share_id
            })
        });
    (!allocated).then(|| {
        format!(
            "ResourceClaim {} is no longer allocated device {}/{}",
            hold.claim, hold.pool, hold.device
        )
    })
}

/// The holds a sweep at `now` reads back, by claim UID: those at least
/// one interval old (a prepare that just answered is left alone). And how
/// long until the next sweep: one interval, or less when a younger hold
/// turns one interval old before that. So a hold is released within one
/// interval of its claim going (gone, replaced, no longer allocated that
/// device), never before it is one interval old.
pub fn due(
    holders: &[Holding],
    now: Millis,
    interval: Duration,
) -> (BTreeMap<String, Vec<ClaimHold>>, Duration) {
    let interval_ms = u64::try_from(interval.as_millis()).unwrap_or(u64::MAX);
    let mut next = interval;
    let mut by_uid: BTreeMap<String, Vec<ClaimHold>> = BTreeMap::new();
    for h in holders {
        let Some(hold) = h.claim.as_deref() else {
            continue;
        };
        let age = now.since(h.since);
        if age >= interval_ms {
            by_uid
                .entry(hold.uid().to_owned())
                .or_default()
                .push(hold.clone());
        } else {
            next = next.min(Duration::from_millis(interval_ms - age));
        }
    }
    (by_uid, next)
}

/// Sweeps until dropped: every `interval`, and when a hold turns one
/// interval old ([`due`]).
pub(crate) async fn collect<L: ClaimStore, C: ClaimStore>(
    core: Weak<SlotKeeper<L, C>>,
    client: kube::Client,
    interval: Duration,
    op_timeout: Duration,
) {
    let mut wait = interval;
    loop {
        tokio::time::sleep(wait).await;
        let Some(keeper) = core.upgrade() else {
            return;
        };
        let (holds, next) = {
            let st = keeper.lock_quiet().await;
            due(&st.ledger.holders(), crate::slot_keeper::now(), interval)
        };
        wait = next;
        for (uid, holds) in holds {
            let Some(first) = holds.first() else { continue };
            let api: Api<ResourceClaim> = Api::namespaced(client.clone(), &first.claim.namespace);
            let claim = match tokio::time::timeout(op_timeout, api.get_opt(&first.claim.name)).await
            {
                Ok(Ok(claim)) => claim,
                Ok(Err(e)) => {
                    tracing::debug!(claim = %first.claim, error = %e, "cannot read a prepared claim back; kept");
                    continue;
                }
                Err(_) => continue,
            };
            if let Some(why) = holds.iter().find_map(|h| stale(h, claim.as_ref())) {
                tracing::warn!(claim = %first.claim, claim_uid = %uid, reason = %why, "releasing the slots of a claim kubelet never unprepared");
                let slots = keeper.unprepare_claim(&uid, true).await;
                tracing::info!(claim_uid = %uid, ?slots, "stale DRA hold released");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use steward_core::ledger::ClaimRef;

    fn hold() -> ClaimHold {
        let mut h = ClaimHold::of(ClaimRef::new("u1", "default", "cam"));
        h.pool = "node-a".into();
        h.device = "cam-0".into();
        h
    }

    fn claim(uid: &str, devices: &[(&str, &str, &str)]) -> ResourceClaim {
        let results: Vec<serde_json::Value> = devices
            .iter()
            .map(|(driver, pool, device)| {
                serde_json::json!({"request": "r", "driver": driver, "pool": pool, "device": device})
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "cam", "namespace": "default", "uid": uid},
            "spec": {"devices": {}},
            "status": {"allocation": {"devices": {"results": results}}}
        }))
        .unwrap()
    }

    #[test]
    fn a_young_hold_brings_the_next_sweep_forward_to_its_first_interval() {
        let interval = Duration::from_secs(60);
        let holding = |slot: &str, since: u64, claim: Option<ClaimHold>| Holding {
            resource: slot.into(),
            holder: None,
            since: Millis(since),
            reservation: None,
            claim: claim.map(Box::new),
        };
        let held = [
            holding("cam-0", 1_000, Some(hold())),
            holding("cam-1", 100_000, Some(hold())),
            holding("cam-2", 0, None),
        ];
        let (holds, next) = due(&held, Millis(120_000), interval);
        assert_eq!(holds.keys().collect::<Vec<_>>(), ["u1"]);
        assert_eq!(holds["u1"].len(), 1);
        assert_eq!(
            next,
            Duration::from_secs(40),
            "cam-1 is one interval old at 160 s"
        );
        let (holds, next) = due(&held[..1], Millis(120_000), interval);
        assert_eq!((holds.len(), next), (1, interval));
    }

    #[test]
    fn only_a_claim_gone_replaced_or_moved_off_the_device_is_stale() {
        let h = hold();
        assert_eq!(
            stale(
                &h,
                Some(&claim("u1", &[("steward.dev", "node-a", "cam-0")]))
            ),
            None
        );
        assert!(stale(&h, None).unwrap().contains("no longer exists"));
        assert!(
            stale(
                &h,
                Some(&claim("u2", &[("steward.dev", "node-a", "cam-0")]))
            )
            .unwrap()
            .contains("replaced")
        );
        for other in [
            ("steward.dev", "node-a", "cam-1"),
            ("gpu.example.com", "node-a", "cam-0"),
            ("steward.dev", "node-b", "cam-0"),
        ] {
            assert!(
                stale(&h, Some(&claim("u1", &[other]))).is_some(),
                "{other:?}"
            );
        }
        assert!(stale(&h, Some(&claim("u1", &[]))).is_some());
    }
}
