//! The leader's side of the direct path ([`steward_reservations::direct`],
//! where the wire and the extenders' client are): every
//! replica serves `POST /v1/decide` ([`server`]), only the leader's
//! decision loop takes asks ([`pending`]: those waiting for their decision
//! to be written), callers are authenticated by a TokenReview ([`auth`]),
//! and a standby proves the leader dead when its endpoint refuses
//! connections ([`prober`]).
//!
//! The leader is authenticated to the extenders when it serves HTTPS
//! ([`server::DecideTls`]) and they verify its certificate
//! ([`steward_reservations::direct::transport::DecideTrust`]).

pub mod auth;
pub(crate) mod pending;
pub(crate) mod prober;
pub mod server;
