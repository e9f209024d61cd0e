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
//! * [`bounded`] — HTTP/1.1 serving with every resource bounded (deadlines,
//!   body limit, buffered bytes, connections, accept back-off), shared by
//!   every HTTP listener.
//! * [`kubelet_plugin`] — a kubelet DRA plugin's sockets for any driver:
//!   registration on kubelet's plugin watcher directory, the driver's
//!   services on its DRA socket, both served again when removed.
//! * [`incoming`] — a unix listener for tonic and hyper servers that, when
//!   the server asks for it, lets gRPC C-core clients in (their default
//!   `:authority` for a unix socket is not a URI authority, which h2 refuses;
//!   the fix itself is the `steward-h2-authority` crate, re-exported as
//!   [`h2_authority`]).

pub mod backoff;
pub mod bounded;
pub mod durable;
mod error;
pub mod identity;
pub mod incoming;
pub mod kubelet_plugin;
pub mod readiness;
pub mod socket;

pub use error::NodeIoError;
pub use identity::FileIdentity;
pub use incoming::{AuthorityMode, UnixConnection, UnixIncoming};
pub use readiness::Readiness;
pub use socket::{BindOptions, SocketGuard, bind};
pub use steward_h2_authority as h2_authority;
pub use steward_h2_authority::AuthorityFix;
