//! Device health for kubelet's DRA resource health stream, typed: every
//! device this node publishes, in the pool it publishes it in
//! (`steward_core::dra::pool_of`, as the slices and prepare), plus each
//! device a prepared claim holds under the pool it was allocated from;
//! healthy while its Instance's device is present and usable here,
//! unhealthy (with the reason) otherwise — a device that left this node
//! entirely stays in the stream as unhealthy, and a device whose discovery
//! reports a fault (`steward_core::dra::HEALTH_PROPERTY`, fatal or
//! transient) is unhealthy with the handler's words while it lasts and
//! healthy again when it clears (the same fault the slices taint). The current state first,
//! then each change, and the whole state again every `resend` when nothing
//! changed: kubelet counts a device's health as Unknown once no report has
//! named it for its health timeout (30 s by default, the device's
//! `health_check_timeout_seconds` from 1.35), so a quiet stream would turn
//! every device Unknown in the pod's status. Each report states that
//! timeout as [`stale_after`] the resend period.
//!
//! kubelet reads it over two wire versions with one message shape
//! (`v1alpha1` and `v1` `DRAResourceHealth`); `health_wire` turns a
//! [`Report`] into either, and nothing here knows the wire.

use std::collections::BTreeMap;
use std::sync::Weak;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::Stream;
use steward_core::dra::{DeviceFault, device_name, pool_of};

use crate::claims::ClaimStore;
use crate::slot_keeper::SlotKeeper;

/// Why a device is reported unhealthy; its text is the message kubelet
/// shows in the pod's status.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Unhealthy {
    /// Discovery no longer finds the Instance's device on this node.
    NotPresent,
    /// The Instance's device is here, but this node may not use it.
    NotUsable,
    /// The ledger has no such Instance on this node.
    NotServed,
    /// The device was in the stream before and is no longer published here.
    Gone,
    /// Its discovery handler reports a fault (the device is still here and
    /// published, tainted).
    Fault(DeviceFault),
}

impl Unhealthy {
    /// The reason, as kubelet receives it (well under upstream's 1024
    /// characters).
    pub(crate) fn text(&self) -> std::borrow::Cow<'static, str> {
        match self {
            Self::NotPresent => "the device is not present on this node".into(),
            Self::NotUsable => "this node may not use the device".into(),
            Self::NotServed => "the device is not served on this node".into(),
            Self::Gone => "the device is gone from this node".into(),
            Self::Fault(f) => f.message().into(),
        }
    }
}

/// One device's health.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DeviceHealth {
    Healthy,
    Unhealthy(Unhealthy),
}

/// A device as the DRA driver publishes it: (pool, device name).
pub(crate) type DeviceId = (String, String);

/// One message of the stream: every device's health, as of `at`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Report {
    /// Unix seconds of when the health was determined.
    pub at: i64,
    /// After how long without a new report kubelet should stop trusting
    /// this one.
    pub stale_after: Duration,
    pub devices: BTreeMap<DeviceId, DeviceHealth>,
}

/// How long a report stays true when steward sends one every `resend`:
/// three periods, so one late report does not make a device Unknown.
pub(crate) fn stale_after(resend: Duration) -> Duration {
    resend.saturating_mul(3)
}

/// The agent is going away; no stream can start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("steward agent is shutting down")]
pub(crate) struct ShuttingDown;

type Snapshot = BTreeMap<DeviceId, DeviceHealth>;

async fn snapshot<L: ClaimStore, C: ClaimStore>(core: &SlotKeeper<L, C>) -> Snapshot {
    let st = core.lock_quiet().await;
    let mut out = Snapshot::new();
    let mut health: BTreeMap<&str, DeviceHealth> = BTreeMap::new();
    for inst in st.instances.values() {
        let state = match st.ledger.instance(&inst.name) {
            Some(i) if i.available() => match DeviceFault::of_properties(&inst.properties) {
                Some(f) => DeviceHealth::Unhealthy(Unhealthy::Fault(f)),
                None => DeviceHealth::Healthy,
            },
            Some(i) if !i.present => DeviceHealth::Unhealthy(Unhealthy::NotPresent),
            Some(i) if !i.usable => DeviceHealth::Unhealthy(Unhealthy::NotUsable),
            // (`Some(_)` is not reached: available is present and usable.)
            Some(_) | None => DeviceHealth::Unhealthy(Unhealthy::NotServed),
        };
        health.insert(&inst.name, state.clone());
        // Only the devices this node publishes, in the pool it publishes
        // them in; a device no longer published here stays in the stream
        // as gone (see `watch`).
        let Some(pool) = pool_of(&core.node, &inst.name, &inst.nodes) else {
            continue;
        };
        for n in 0..inst.capacity {
            out.insert((pool.clone(), device_name(&inst.name, n)), state.clone());
        }
    }
    // A device a claim holds under the pool it was allocated from (its
    // Instance moved pool since) keeps its slot's health under that name.
    for h in st.ledger.holders() {
        let Some(hold) = h.claim.as_deref().filter(|c| !c.pool.is_empty()) else {
            continue;
        };
        let Some(state) = h
            .resource
            .rsplit_once('-')
            .and_then(|(instance, _)| health.get(instance))
        else {
            continue;
        };
        out.entry((hold.pool.clone(), hold.device.clone()))
            .or_insert_with(|| state.clone());
    }
    out
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The health of this node's devices: the current state first, then one
/// report per change, or the same state again after `resend` without one;
/// ends when the agent goes away.
pub(crate) fn watch<L: ClaimStore, C: ClaimStore>(
    core: Weak<SlotKeeper<L, C>>,
    resend: Duration,
) -> Result<impl Stream<Item = Report> + Send + 'static, ShuttingDown> {
    let changes = core.upgrade().ok_or(ShuttingDown)?.generations();
    // (last state sent, when it was sent)
    let sent: Option<(Snapshot, tokio::time::Instant)> = None;
    Ok(futures::stream::unfold(
        (core, changes, sent),
        move |(core, mut changes, mut sent)| async move {
            loop {
                // The state is due again `resend` after it was last sent,
                // however often the agent's state changes meanwhile without
                // changing any device's health.
                let due = match &sent {
                    None => true,
                    Some((_, at)) => {
                        let deadline = *at + resend;
                        match tokio::time::timeout_at(deadline, changes.changed()).await {
                            Ok(changed) => {
                                changed.ok()?;
                                tokio::time::Instant::now() >= deadline
                            }
                            Err(_quiet) => true,
                        }
                    }
                };
                let keeper = core.upgrade()?;
                let mut now = snapshot(&keeper).await;
                drop(keeper);
                // Devices that left this node stay, unhealthy.
                for key in sent.iter().flat_map(|(l, _)| l.keys()) {
                    now.entry(key.clone())
                        .or_insert(DeviceHealth::Unhealthy(Unhealthy::Gone));
                }
                if due || sent.as_ref().map(|(l, _)| l) != Some(&now) {
                    let report = Report {
                        at: unix_now(),
                        stale_after: stale_after(resend),
                        devices: now.clone(),
                    };
                    sent = Some((now, tokio::time::Instant::now()));
                    return Some((report, (core, changes, sent)));
                }
            }
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::Unhealthy;

    /// kubelet truncates a message over 1024 characters; none of ours is.
    #[test]
    fn every_reason_fits_kubelets_message_limit() {
        for r in [
            Unhealthy::NotPresent,
            Unhealthy::NotUsable,
            Unhealthy::NotServed,
            Unhealthy::Gone,
            Unhealthy::Fault(steward_core::dra::DeviceFault {
                kind: steward_core::dra::FaultKind::Fatal,
                reason: "x".repeat(5000),
            }),
        ] {
            assert!(!r.text().is_empty() && r.text().chars().count() <= 1024);
        }
    }
}
