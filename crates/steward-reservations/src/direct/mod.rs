//! The direct path: the extender asks the leading controller for a pod's
//! decision over HTTP instead of through the API server's watches.
//!
//! ```text
//! kube-scheduler ─Filter─► extender ─POST /v1/decide─► leading controller
//!                              ▲                           │ writes the ask (create / renew)
//!                              │                           │ decides it in its kept ledger
//!                              │                           │ writes the decision (status)
//!                              └──────── the object ◄──────┘ only once both landed
//! ```
//!
//! The leader writes its endpoint in the election Lease
//! ([`ENDPOINT_ANNOTATION`]); extenders follow that one object
//! ([`client::Leader`]). Every guarantee of the API path holds: the leader
//! is the only writer of decisions, a decision is answered only once it is
//! persisted (a successor starts from exactly what was), and writes are
//! conditional on the resourceVersion they were decided from. What goes
//! away are two watch hops (the ask reaching the controller, the decision
//! reaching the extender) and, with them, the fan-out latency of every
//! other watcher. When no leader answers (none elected yet, a failover,
//! an older controller), the extender falls back to the API path.
//!
//! Callers are authenticated when the controller is told whom to admit
//! (`steward_leader::direct::auth`): the extender sends a projected
//! ServiceAccount token ([`token`]), the controller has the API server
//! review it. The leader is authenticated to the extenders when it serves
//! HTTPS (`steward_leader::direct::server::DecideTls`) and they verify its
//! certificate ([`transport::DecideTrust`]): then the token and the asks
//! no longer travel in clear, and a Lease naming another endpoint cannot
//! make an extender hand them to it.
//!
//! Here: what both ends share — the wire ([`wire`]) and the client that
//! follows the Lease and asks ([`client::Leader`]: the extender asks
//! through it, a standby controller probes the holder it names). The
//! endpoint is the leader's (`steward_leader::direct`).

pub mod client;
pub mod token;
pub mod transport;
pub mod wire;

pub use wire::ENDPOINT_ANNOTATION;
