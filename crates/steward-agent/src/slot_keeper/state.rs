//! What the slot keeper holds behind its lock: the ledger, the Instances
//! served, the Configurations' broker properties, and the ListAndWatch
//! channel of each Instance (the device list kubelet is streamed).

use std::collections::BTreeMap;
use std::time::Duration;

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use steward_core::Millis;
use steward_core::dra::{DeviceFault, FaultKind};
use steward_core::slots::{Health, SlotAllocator};
use steward_proto::deviceplugin::v1beta1::{Device, HEALTHY, NumaNode, TopologyInfo, UNHEALTHY};
use tokio::sync::watch;

use super::clock::now;
use super::instance::ServedInstance;
use super::metrics::SlotHealthLabels;

/// Added to a settle instant before listing pod resources for it.
const SETTLE_MARGIN_MS: u64 = 5;

/// Everything behind the lock.
pub struct State {
    pub ledger: SlotAllocator,
    pub instances: BTreeMap<String, ServedInstance>,
    /// (namespace, configuration) → broker properties.
    pub broker: BTreeMap<(String, String), BTreeMap<String, String>>,
    /// ListAndWatch content per Instance.
    pub channels: BTreeMap<String, watch::Sender<Vec<Device>>>,
    /// `steward_deviceplugin_slots`, kept with what the channels send.
    pub slot_health: Family<SlotHealthLabels, Gauge>,
}

impl State {
    /// The Instance's slots as ListAndWatch sends them: Unhealthy when the
    /// ledger says so, and every one while discovery reports a fatal fault
    /// of the device (as its DRA devices are tainted NoSchedule), so
    /// kubelet's device manager admits no new pod onto it; a transient
    /// fault keeps them Healthy (its taint's effect is None).
    fn devices(&self, instance: &str) -> Vec<Device> {
        let served = self.instances.get(instance);
        let numa = served.map(|i| i.numa.clone()).unwrap_or_default();
        let fatal = served
            .and_then(|i| DeviceFault::of_properties(&i.properties))
            .is_some_and(|f| f.kind == FaultKind::Fatal);
        self.ledger
            .health(instance)
            .into_iter()
            .map(|(id, health)| Device {
                id,
                health: match health {
                    Health::Healthy if !fatal => HEALTHY,
                    Health::Healthy | Health::Unhealthy => UNHEALTHY,
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
        let healthy = devices.iter().filter(|d| d.health == HEALTHY).count();
        for (health, n) in [
            (HEALTHY, healthy),
            (UNHEALTHY, devices.len().saturating_sub(healthy)),
        ] {
            self.slot_health
                .get_or_create(&slot_labels(instance, health))
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
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

    /// Drops the Instance's slot gauges (it is no longer served here).
    pub fn forget_health(&self, instance: &str) {
        for health in [HEALTHY, UNHEALTHY] {
            self.slot_health.remove(&slot_labels(instance, health));
        }
    }

    pub(crate) fn any_awaiting(&self) -> bool {
        self.ledger.any_awaiting()
    }

    /// How long until a pod-resources `List` could release a pending claim
    /// by the ledger's settle rule (slightly after that instant, so the
    /// list's own timestamp is past it); `None` when none is waiting.
    pub(crate) fn settle_wait(&self, after: Millis) -> Option<Duration> {
        let due = self.ledger.next_settle(after)?;
        Some(Duration::from_millis(due.since(now()) + SETTLE_MARGIN_MS))
    }
}

fn slot_labels(instance: &str, health: &str) -> SlotHealthLabels {
    SlotHealthLabels {
        steward_instance: instance.to_owned(),
        health: health.to_owned(),
    }
}
