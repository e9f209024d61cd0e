//! The NRI (Node Resource Interface) wire, plugin side.
//!
//! containerd 2.x (NRI on by default) and 1.7 (NRI off by default) call NRI
//! plugins over one unix stream: a multiplexer ([`mux`]) carries two ttrpc
//! connections ([`ttrpc`]): connection 1 the runtime's calls to the plugin's
//! `Plugin` service, connection 2 the plugin's calls to the runtime's
//! `Runtime` service. [`session`] runs a plugin on that wire: it registers,
//! serves the runtime's calls through a [`Handler`] and offers
//! [`RuntimeClient::update_containers`].
//!
//! No policy and no cgroups here: what a container gets is the handler's
//! business.

pub mod error;
pub mod events;
pub mod handler;
pub mod mux;
pub mod proto;
pub mod runtime;
pub mod serve;
pub mod session;
pub mod status;
pub mod ttrpc;

pub use error::NriError;
pub use events::EventMask;
pub use handler::Handler;
pub use runtime::RuntimeClient;
pub use session::{Session, SessionConfig};
pub use status::{Code, RpcStatus};
