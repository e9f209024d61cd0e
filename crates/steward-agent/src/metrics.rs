//! The agent's metrics. The caller owns the registry and passes it in
//! explicitly; nothing is registered globally.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// `{configuration, reason}`: a rejected device.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RejectedLabels {
    /// `namespace/name` of the Configuration.
    pub configuration: String,
    /// Why validation refused the device.
    pub reason: String,
}

/// `{state}`: a handler state (`Waiting`, `Active`, `Offline`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    /// The state.
    pub state: String,
}

/// `{configuration}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConfigurationLabels {
    /// `namespace/name` of the Configuration.
    pub configuration: String,
}

/// `{op}`: an Instance write operation.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    /// The operation.
    pub op: String,
}

/// `{handler}`: a discovery handler's name.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HandlerLabels {
    /// The handler.
    pub handler: String,
}

/// Handles to the agent's metric families (cheap to clone; clones share values).
#[derive(Clone, Debug, Default)]
pub struct AgentMetrics {
    /// `steward_discovery_rejected_devices_total{configuration,reason}`
    pub rejected_devices: Family<RejectedLabels, Counter>,
    /// `steward_discovery_handlers{state}`: registered handlers by state.
    pub handlers: Family<StateLabels, Gauge>,
    /// `steward_discovery_instances{configuration}`: Instances of a
    /// Configuration that list this node.
    pub instances: Family<ConfigurationLabels, Gauge>,
    /// `steward_discovery_instance_writes_total{op}`
    pub instance_writes: Family<OpLabels, Counter>,
    /// `steward_discovery_instance_conflicts_total`
    pub instance_conflicts: Counter,
    /// `steward_discovery_handler_connections_lost_total{handler}`
    pub connections_lost: Family<HandlerLabels, Counter>,
    /// Device plugin metrics (`steward_deviceplugin_*`).
    pub device_plugins: crate::deviceplugin::DevicePluginMetrics,
}

impl AgentMetrics {
    /// New metrics registered into `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "steward_discovery_rejected_devices",
            "Devices reported by discovery handlers and rejected by validation",
            m.rejected_devices.clone(),
        );
        registry.register(
            "steward_discovery_handlers",
            "Registered discovery handlers by state",
            m.handlers.clone(),
        );
        registry.register(
            "steward_discovery_instances",
            "Instances of a Configuration that list this node",
            m.instances.clone(),
        );
        registry.register(
            "steward_discovery_instance_writes",
            "Instance writes by operation",
            m.instance_writes.clone(),
        );
        registry.register(
            "steward_discovery_instance_conflicts",
            "Instance writes that met a concurrent change and were planned again",
            m.instance_conflicts.clone(),
        );
        registry.register(
            "steward_discovery_handler_connections_lost",
            "Discovery streams that failed or broke, by handler name",
            m.connections_lost.clone(),
        );
        m.device_plugins.register(registry);
        m
    }

    pub(crate) fn rejected(&self, configuration: &str, reason: &str) {
        self.rejected_devices
            .get_or_create(&RejectedLabels {
                configuration: configuration.into(),
                reason: reason.into(),
            })
            .inc();
    }

    pub(crate) fn write(&self, op: &str) {
        self.instance_writes
            .get_or_create(&OpLabels { op: op.into() })
            .inc();
    }

    pub(crate) fn lost(&self, handler: &str) {
        self.connections_lost
            .get_or_create(&HandlerLabels {
                handler: handler.into(),
            })
            .inc();
    }

    pub(crate) fn set_instances(&self, configuration: &str, n: usize) {
        self.instances
            .get_or_create(&ConfigurationLabels {
                configuration: configuration.into(),
            })
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    pub(crate) fn set_handlers(&self, waiting: usize, active: usize, offline: usize) {
        for (state, n) in [
            ("Waiting", waiting),
            ("Active", active),
            ("Offline", offline),
        ] {
            self.handlers
                .get_or_create(&StateLabels {
                    state: state.into(),
                })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }
}
