//! Prometheus metrics of the resource manager. Registered into a registry the
//! caller owns; [`Metrics::default`] gives unregistered (but working) metrics.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Label set naming a CRI method.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodLabels {
    /// CRI method name.
    pub method: String,
}

/// Label set naming a kind of event or drift.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    /// What happened.
    pub kind: String,
}

/// Event kinds exported from the start (the alerts and the dashboard use
/// them): a container the policy refused, a cache save that failed, a
/// configuration refused.
const ALERTED_EVENTS: [&str; 3] = ["container-refused", "cache-save-failed", "config-rejected"];

/// Drift kinds exported from the start: what the read-back of cgroupfs
/// finds changed.
const ALERTED_DRIFT: [&str; 3] = ["cpuset", "cpuset-mems", "memory"];

fn latency_histogram() -> Histogram {
    // 10 µs .. ~40 s.
    Histogram::new(exponential_buckets(1e-5, 2.5, 17))
}

/// Handles to every metric; cheap to clone.
#[derive(Clone, Debug)]
pub struct Metrics {
    relay_seconds: Histogram,
    intercepted_seconds: Family<MethodLabels, Histogram, fn() -> Histogram>,
    events: Family<KindLabels, Counter>,
    drift: Family<KindLabels, Counter>,
    update_failures: Counter,
    runtime_up: Gauge,
    containers: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            relay_seconds: latency_histogram(),
            intercepted_seconds: Family::new_with_constructor(latency_histogram),
            events: Family::default(),
            drift: Family::default(),
            update_failures: Counter::default(),
            runtime_up: Gauge::default(),
            containers: Gauge::default(),
        }
    }
}

impl Metrics {
    /// Create the metrics and register them under `steward_resmgr_`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        let r = registry.sub_registry_with_prefix("steward_resmgr");
        r.register(
            "relay_seconds",
            "Latency of calls relayed untouched to the runtime",
            m.relay_seconds.clone(),
        );
        r.register(
            "intercepted_seconds",
            "Latency of intercepted CRI calls, by method",
            m.intercepted_seconds.clone(),
        );
        r.register(
            "events",
            "Pipeline events processed, by kind",
            m.events.clone(),
        );
        r.register(
            "drift",
            "Differences found between the cache, the runtime and cgroupfs, by kind",
            m.drift.clone(),
        );
        r.register(
            "update_failures",
            "UpdateContainerResources calls for other containers that failed",
            m.update_failures.clone(),
        );
        r.register(
            "runtime_up",
            "1 while the runtime answers, else 0",
            m.runtime_up.clone(),
        );
        r.register(
            "containers",
            "Containers tracked in the cache",
            m.containers.clone(),
        );
        // What the alerts watch, at 0 from the start: an empty family is
        // not exported at all, and a counter's first increment is lost to
        // increase() unless a 0 was scraped before it.
        for kind in ALERTED_EVENTS {
            drop(m.events.get_or_create(&KindLabels { kind: kind.into() }));
        }
        for kind in ALERTED_DRIFT {
            drop(m.drift.get_or_create(&KindLabels { kind: kind.into() }));
        }
        m
    }

    pub(crate) fn observe_relay(&self, d: Duration) {
        self.relay_seconds.observe(d.as_secs_f64());
    }

    pub(crate) fn observe_intercepted(&self, method: &str, d: Duration) {
        self.intercepted_seconds
            .get_or_create(&MethodLabels {
                method: method.to_owned(),
            })
            .observe(d.as_secs_f64());
    }

    pub(crate) fn event(&self, kind: &str) {
        self.events
            .get_or_create(&KindLabels {
                kind: kind.to_owned(),
            })
            .inc();
    }

    pub(crate) fn drift(&self, kind: &str) {
        self.drift
            .get_or_create(&KindLabels {
                kind: kind.to_owned(),
            })
            .inc();
    }

    /// How many drifts of `kind` were counted so far.
    pub fn drift_count(&self, kind: &str) -> u64 {
        self.drift
            .get_or_create(&KindLabels {
                kind: kind.to_owned(),
            })
            .get()
    }

    /// How many events of `kind` were processed so far.
    pub fn event_count(&self, kind: &str) -> u64 {
        self.events
            .get_or_create(&KindLabels {
                kind: kind.to_owned(),
            })
            .get()
    }

    pub(crate) fn update_failed(&self) {
        self.update_failures.inc();
    }

    pub(crate) fn set_runtime_up(&self, up: bool) {
        self.runtime_up.set(i64::from(up));
    }

    pub(crate) fn set_containers(&self, n: usize) {
        self.containers.set(i64::try_from(n).unwrap_or(i64::MAX));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_metrics_encode_with_prefix() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        m.observe_relay(Duration::from_micros(30));
        m.observe_intercepted("CreateContainer", Duration::from_millis(3));
        m.drift("cpuset");
        m.set_runtime_up(true);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        assert!(
            out.contains("steward_resmgr_relay_seconds_count 1"),
            "{out}"
        );
        assert!(out.contains("method=\"CreateContainer\""), "{out}");
        assert!(
            out.contains("steward_resmgr_drift_total{kind=\"cpuset\"} 1"),
            "{out}"
        );
        assert!(out.contains("steward_resmgr_runtime_up 1"), "{out}");
        assert_eq!(m.drift_count("cpuset"), 1);
    }
}
