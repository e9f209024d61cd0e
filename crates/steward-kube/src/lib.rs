//! The Kubernetes API adapter steward's components share.
//!
//! * [`follow`] / [`changes`]: one way to follow a watch. kube-runtime's
//!   watcher reports a (re)list as `Init`, one `InitApply` per object and
//!   `InitDone`; every consumer had to buffer those into "the complete set"
//!   itself. Here they arrive as one [`Change::Relisted`] with the whole
//!   list, so a consumer only ever sees complete pictures.
//! * [`Mirror`]: the one picture a consumer keeps of a followed watch —
//!   objects (or a projection of them) by identity, relists replacing it,
//!   and a [`Delta`] per change naming what was stored and what removed.
//! * [`SharedWatch`]: one watch per kind per process. The process's
//!   assembly starts it once and hands it to every consumer, which reads
//!   its one store ([`Reader`]) or subscribes to its changes
//!   ([`Subscription`]: the same [`Change`]s as [`follow`], relisted from
//!   the store when the subscriber falls behind). Consumers do not call
//!   [`follow`] themselves.
//! * [`EventSink`]: Kubernetes Events through a bounded queue, so writing
//!   one never waits on the API server.
//! * [`lease::elect`]: leader election on a `coordination.k8s.io` Lease
//!   (client-go's algorithm), for components that must have one writer.
//! * [`serves`] / [`dra_served`]: whether the cluster serves a kind, asked
//!   once before using it, so an older cluster gets one clear line.
//! * [`client::connect`]: a client whose requests name the component
//!   (`User-Agent: steward-<component>/<version> (<instance>)`).

pub mod client;
mod events;
pub mod lease;
mod mirror;
mod served;
mod shared;
mod watch;

pub use events::{EventSink, QUEUE as EVENT_QUEUE, pod_ref};
pub use mirror::{Delta, Mirror, ObjectKey};
pub use served::{DRA_API_SINCE, DRA_API_VERSION, dra_served, serves};
pub use shared::{Reader, SUBSCRIBER_QUEUE, SharedWatch, Subscription};
pub use watch::{BACKOFF_MAX, BACKOFF_MIN, Change, backoff, changes, follow};
