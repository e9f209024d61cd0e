//! Metrics of the device plugins, part of the agent's metrics.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// `{result}`: an Allocate outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// `ok`, `unknown_device`, `held_elsewhere`, `unavailable`, ...
    pub result: String,
}

/// `{store, op, result}`: a claim store operation.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClaimOpLabels {
    /// `local` or `cluster`.
    pub store: String,
    /// `write` or `delete`.
    pub op: String,
    /// The outcome.
    pub result: String,
}

/// `{steward_instance, health}`: an Instance's slots on this node by the
/// health its device plugin reports. (`instance` would clash with the label
/// Prometheus gives every scraped target.)
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SlotHealthLabels {
    /// The Instance's name.
    pub steward_instance: String,
    /// `Healthy` or `Unhealthy`.
    pub health: String,
}

/// Handles to the device-plugin metric families (clones share values).
#[derive(Clone, Debug)]
pub struct DevicePluginMetrics {
    /// `steward_deviceplugin_allocations_total{result}`: Allocate calls by
    /// outcome (`ok`, `unknown_device`, `held_elsewhere`, `unavailable`, ...).
    pub allocations: Family<ResultLabels, Counter>,
    /// `steward_deviceplugin_allocate_seconds`: Allocate latency, claims
    /// included.
    pub allocate_seconds: Histogram,
    /// `steward_deviceplugin_registrations_total`: registrations with kubelet.
    pub registrations: Counter,
    /// `steward_deviceplugin_plugins`: plugins currently served.
    pub plugins: Gauge,
    /// `steward_deviceplugin_plugins_registered`: plugins registered with
    /// kubelet now (the rest are retrying).
    pub registered: Gauge,
    /// `steward_deviceplugin_slots{steward_instance,health}`: slots by the
    /// health kubelet is told.
    pub slots: Family<SlotHealthLabels, Gauge>,
    /// `steward_deviceplugin_claim_ops_total{store,op,result}`.
    pub claim_ops: Family<ClaimOpLabels, Counter>,
    /// `steward_deviceplugin_slots_released_total`: slots freed (pod gone,
    /// expired, rolled back).
    pub released: Counter,
    /// `steward_dra_prepares_total{result}`: NodePrepareResources per
    /// claim, by outcome: `ok`; what was wrong with the claim
    /// (`claim_gone`, `claim_replaced`, `claim_unreadable`,
    /// `not_allocated`, `no_devices`); or the slot refusals (`unknown_device`,
    /// `no_cdi`, `in_use`, ... as docs/DRA.md lists).
    pub prepares: Family<ResultLabels, Counter>,
    /// `steward_dra_prepare_seconds`: one claim's prepare, durable slot
    /// claims included.
    pub prepare_seconds: Histogram,
    /// `steward_dra_unprepares_total{result}`: NodeUnprepareResources per
    /// claim (`ok`, or `none` when it held nothing), and `collected`: holds
    /// of claims gone from the API, released without kubelet.
    pub unprepares: Family<ResultLabels, Counter>,
}

impl Default for DevicePluginMetrics {
    fn default() -> Self {
        Self {
            allocations: Family::default(),
            allocate_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 14)),
            registrations: Counter::default(),
            plugins: Gauge::default(),
            registered: Gauge::default(),
            slots: Family::default(),
            claim_ops: Family::default(),
            released: Counter::default(),
            prepares: Family::default(),
            prepare_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 14)),
            unprepares: Family::default(),
        }
    }
}

impl DevicePluginMetrics {
    /// Registers the families into `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "steward_deviceplugin_allocations",
            "Device plugin Allocate calls by result",
            self.allocations.clone(),
        );
        registry.register(
            "steward_deviceplugin_allocate_seconds",
            "Device plugin Allocate latency, durable slot claims included",
            self.allocate_seconds.clone(),
        );
        registry.register(
            "steward_dra_prepares",
            "DRA NodePrepareResources outcomes, per claim",
            self.prepares.clone(),
        );
        registry.register(
            "steward_dra_prepare_seconds",
            "DRA claim prepare latency, durable slot claims included",
            self.prepare_seconds.clone(),
        );
        registry.register(
            "steward_dra_unprepares",
            "DRA NodeUnprepareResources outcomes, per claim",
            self.unprepares.clone(),
        );
        registry.register(
            "steward_deviceplugin_registrations",
            "Device plugin registrations with kubelet",
            self.registrations.clone(),
        );
        registry.register(
            "steward_deviceplugin_plugins",
            "Device plugins currently served by this node",
            self.plugins.clone(),
        );
        registry.register(
            "steward_deviceplugin_plugins_registered",
            "Device plugins registered with kubelet now",
            self.registered.clone(),
        );
        registry.register(
            "steward_deviceplugin_slots",
            "Slots of each Instance served here, by the health kubelet is told",
            self.slots.clone(),
        );
        registry.register(
            "steward_deviceplugin_claim_ops",
            "Slot claim store operations by store, op and result",
            self.claim_ops.clone(),
        );
        registry.register(
            "steward_deviceplugin_slots_released",
            "Slot claims released (pod gone, expired, rolled back)",
            self.released.clone(),
        );
        // The claim outcomes and a successful Allocate at 0 from the
        // start: an empty family is not exported at all, and a counter's
        // first increment is lost to increase() unless a 0 was scraped
        // before it.
        for store in ["local", "cluster"] {
            for op in ["write", "delete"] {
                for result in ["ok", "unreachable", "failed"] {
                    drop(self.claim_ops.get_or_create(&ClaimOpLabels {
                        store: store.into(),
                        op: op.into(),
                        result: result.into(),
                    }));
                }
            }
        }
        drop(self.allocations.get_or_create(&ResultLabels {
            result: "ok".into(),
        }));
    }

    pub(crate) fn preparation(&self, result: &str) {
        self.prepares
            .get_or_create(&ResultLabels {
                result: result.into(),
            })
            .inc();
    }

    pub(crate) fn unprepared(&self, result: &str) {
        self.unprepares
            .get_or_create(&ResultLabels {
                result: result.into(),
            })
            .inc();
    }

    pub(crate) fn allocation(&self, result: &str) {
        self.allocations
            .get_or_create(&ResultLabels {
                result: result.into(),
            })
            .inc();
    }

    pub(crate) fn claim_op(&self, store: &str, op: &str, result: &str) {
        self.claim_ops
            .get_or_create(&ClaimOpLabels {
                store: store.into(),
                op: op.into(),
                result: result.into(),
            })
            .inc();
    }
}
