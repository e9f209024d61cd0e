//! Node-local I/O shared by every steward component: unix sockets bound
//! with an owner-only mode and served to any gRPC client, file identity,
//! durable file writes and retry backoff.
//!
//! * [`socket`] — bind a unix socket under a temporary name, set its mode
//!   and group, rename it into place; a guard removes it when it is still ours.
//! * [`identity`] — which file a path names now (device, inode, change time).
//! * [`durable`] — write a file so that a crash leaves the old or the new
//!   content, never a torn one.
//! * [`backoff`] — the exponential backoff steward's retry loops use.
//! * [`h2_authority`] and [`incoming`] — a unix listener for tonic and hyper
//!   servers that lets gRPC C-core clients in (their default `:authority` for a
//!   unix socket is not a URI authority, which h2 refuses).

pub mod backoff;
pub mod durable;
mod error;
pub mod h2_authority;
pub mod identity;
pub mod incoming;
pub mod readiness;
pub mod socket;

pub use error::NodeIoError;
pub use h2_authority::AuthorityFix;
pub use identity::FileIdentity;
pub use incoming::UnixIncoming;
pub use readiness::Readiness;
pub use socket::{BindOptions, SocketGuard, bind};
