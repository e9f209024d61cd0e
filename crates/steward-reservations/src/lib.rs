//! What `steward controller` (crate `steward-leader`) and `steward
//! extender` (crate `steward-extender`) share, around the pure
//! `steward_core::reservation`:
//!
//! * [`ask`]: a pod's ask written as its Reservation (create or renew),
//!   the way both the extender (API path) and the leader (direct path)
//!   write it.
//! * [`bounds`]: what one ask may be, applied on every way in.
//! * [`direct`]: the direct path's wire (`POST /v1/decide`) and the client
//!   that follows the leader's Lease and asks it.
//! * [`http`]: the serving (`steward_nodeio::bounded`, plain or TLS) and
//!   the answer builders both HTTP endpoints use.

pub mod ask;
pub mod bounds;
pub mod direct;
pub mod http;
