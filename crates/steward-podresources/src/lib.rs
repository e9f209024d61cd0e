//! The pod resources server: kubelet's podresources v1 API (`List`, `Get`,
//! `GetAllocatableResources`) plus the KEP's watch (`ListAndWatch`,
//! `ListAndWatchAllocatableResources`), over the node view of
//! `steward_core::ledger` — every device, CPU and memory assignment on the
//! node in one record.
//!
//! * [`hub`]: the view behind one lock and the watchers it feeds (bounded
//!   buffers; a watcher that falls a whole buffer behind is cut off with
//!   `ABORTED`, never shown a picture with holes).
//! * [`service`]: the gRPC service, rate limited like kubelet (100 qps,
//!   burst 10 by default → `RESOURCE_EXHAUSTED`).
//! * [`follow`]: feeding the hub from kubelet's socket (polled `List`) or
//!   another steward process's watch.
//! * [`serve`]: serving the service on a bound unix socket.

pub mod convert;
pub mod follow;
pub mod hub;
pub mod limiter;
pub mod metrics;
pub mod serve;
pub mod service;

pub use hub::{Hub, WatchLimits};
pub use metrics::PodResourcesMetrics;
pub use service::{INITIAL_EVENTS_HEADER, PodResourcesService};
