//! What the slot keeper holds behind its lock: the ledger, the Instances
//! served, the Configurations' broker properties, and the ListAndWatch
//! channel of each Instance (the device list kubelet is streamed).

use std::collections::BTreeMap;
use std::time::Duration;

use steward_core::Millis;
use steward_core::slots::{Health, SlotLedger};
use steward_proto::deviceplugin::v1beta1::{Device, HEALTHY, NumaNode, TopologyInfo, UNHEALTHY};
use tokio::sync::watch;

use super::clock::now;
use super::instance::ServedInstance;

/// Added to a settle instant before listing pod resources for it.
const SETTLE_MARGIN_MS: u64 = 5;

/// Everything behind the lock.
pub struct State {
    pub ledger: SlotLedger,
    pub instances: BTreeMap<String, ServedInstance>,
    /// (namespace, configuration) → broker properties.
    pub broker: BTreeMap<(String, String), BTreeMap<String, String>>,
    /// ListAndWatch content per Instance.
    pub channels: BTreeMap<String, watch::Sender<Vec<Device>>>,
}

impl State {
    fn devices(&self, instance: &str) -> Vec<Device> {
        let numa = self
            .instances
            .get(instance)
            .map(|i| i.numa.clone())
            .unwrap_or_default();
        self.ledger
            .health(instance)
            .into_iter()
            .map(|(id, health)| Device {
                id,
                health: match health {
                    Health::Healthy => HEALTHY,
                    Health::Unhealthy => UNHEALTHY,
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
