//! The KEP's pod resources metrics, plus watchers connected and cut.
//!
//! kubelet exposes `kubelet_pod_resources_endpoint_requests_list` and
//! friends as Prometheus counters; here they are OpenMetrics counters, so
//! each name gains `_total` on the wire
//! (`steward_pod_resources_endpoint_requests_list_total`). Every family has
//! kubelet's `server_api_version` label.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The label every pod resources family carries.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ApiVersion {
    pub server_api_version: &'static str,
}

/// The label of the watcher families.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct WatchKind {
    /// `pods` or `allocatable`.
    pub stream: &'static str,
}

pub(crate) const V1: ApiVersion = ApiVersion {
    server_api_version: "v1",
};

/// Handles to the families (clones share values).
#[derive(Debug, Clone, Default)]
pub struct PodResourcesMetrics {
    pub requests_total: Family<ApiVersion, Counter>,
    pub requests_list: Family<ApiVersion, Counter>,
    pub requests_get: Family<ApiVersion, Counter>,
    pub requests_get_allocatable: Family<ApiVersion, Counter>,
    pub errors_list: Family<ApiVersion, Counter>,
    pub errors_get: Family<ApiVersion, Counter>,
    pub errors_get_allocatable: Family<ApiVersion, Counter>,
    pub requests_list_and_watch: Family<ApiVersion, Counter>,
    pub requests_list_and_watch_allocatable: Family<ApiVersion, Counter>,
    /// Calls refused by the rate limit or the watcher cap.
    pub rejected: Family<ApiVersion, Counter>,
    /// Watch streams open now.
    pub watchers: Family<WatchKind, Gauge>,
    /// Watchers cut off because they fell behind by a whole buffer.
    pub watchers_cut: Family<WatchKind, Counter>,
    /// Events not delivered to a watcher that was cut.
    pub events_dropped: Family<WatchKind, Counter>,
}

impl PodResourcesMetrics {
    pub fn register(&self, registry: &mut Registry) {
        let families: [(&str, &str, &Family<ApiVersion, Counter>); 10] = [
            (
                "pod_resources_endpoint_requests",
                "Calls to the pod resources endpoint, every rpc",
                &self.requests_total,
            ),
            (
                "pod_resources_endpoint_requests_list",
                "List calls",
                &self.requests_list,
            ),
            (
                "pod_resources_endpoint_requests_get",
                "Get calls",
                &self.requests_get,
            ),
            (
                "pod_resources_endpoint_requests_get_allocatable",
                "GetAllocatableResources calls",
                &self.requests_get_allocatable,
            ),
            (
                "pod_resources_endpoint_errors_list",
                "List calls that failed",
                &self.errors_list,
            ),
            (
                "pod_resources_endpoint_errors_get",
                "Get calls that failed",
                &self.errors_get,
            ),
            (
                "pod_resources_endpoint_errors_get_allocatable",
                "GetAllocatableResources calls that failed",
                &self.errors_get_allocatable,
            ),
            (
                "pod_resources_endpoint_requests_list_and_watch",
                "ListAndWatch calls",
                &self.requests_list_and_watch,
            ),
            (
                "pod_resources_endpoint_requests_list_and_watch_allocatable_resources",
                "ListAndWatchAllocatableResources calls",
                &self.requests_list_and_watch_allocatable,
            ),
            (
                "pod_resources_endpoint_rejected",
                "Calls refused by the rate limit or the watcher cap (ResourceExhausted)",
                &self.rejected,
            ),
        ];
        for (name, help, family) in families {
            registry.register(format!("steward_{name}"), help, family.clone());
        }
        registry.register(
            "steward_pod_resources_watchers",
            "Pod resources watch streams open",
            self.watchers.clone(),
        );
        registry.register(
            "steward_pod_resources_watchers_cut",
            "Watchers ended because they fell a whole buffer behind",
            self.watchers_cut.clone(),
        );
        registry.register(
            "steward_pod_resources_events_dropped",
            "Events not delivered to watchers that were cut",
            self.events_dropped.clone(),
        );
        // Both streams at 0 from the start: an empty family is not
        // exported at all, and a counter's first increment is lost to
        // increase() unless a 0 was scraped before it.
        for stream in ["pods", "allocatable"] {
            let kind = WatchKind { stream };
            drop(self.watchers.get_or_create(&kind));
            drop(self.watchers_cut.get_or_create(&kind));
            drop(self.events_dropped.get_or_create(&kind));
        }
    }
}
