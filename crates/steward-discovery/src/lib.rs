//! steward-discovery: the discovery handler (DH) transport and the built-in
//! discovery handlers.
//!
//! * [`DiscoveryHandler`] is what a handler implements, whether it runs
//!   embedded in the agent or as an external process.
//! * [`registration`] serves (agent side) and calls (DH side) the v0
//!   `Registration` service on a unix socket.
//! * [`client`] is the agent side of the v0 `DiscoveryHandler` service.
//! * [`server`] is the DH side: it serves a [`DiscoveryHandler`] and keeps it
//!   registered with the agent.
//! * [`handlers`] holds the built-in handlers (`debug-echo`, `udev`,
//!   `tcp-probe`).
//!
//! The wire protocol is `steward_proto::discovery::v0`, wire-compatible with
//! Akri's v0 discovery protocol.

use std::collections::BTreeMap;
use std::pin::Pin;

use futures::Stream;

pub use steward_core::discovery::{Device, DeviceSpec, Endpoint, HandlerKey, Mount};

pub mod client;
pub mod convert;
pub mod duration;
pub mod handlers;
pub mod policy;
pub mod registration;
pub mod server;
mod uds;

/// What the agent asks a handler to discover.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DiscoverRequest {
    /// Free text (usually YAML) the handler parses into its filter.
    pub details: String,
    /// Resolved discovery properties (values, Secret or ConfigMap keys).
    pub properties: BTreeMap<String, Vec<u8>>,
}

impl DiscoverRequest {
    /// A request with `details` and no properties.
    pub fn new(details: impl Into<String>) -> Self {
        Self {
            details: details.into(),
            properties: BTreeMap::new(),
        }
    }
}

/// The complete list of devices, re-sent each time it changes. An `Err` item
/// ends the stream; so does the handler closing it.
pub type DeviceStream = Pin<Box<dyn Stream<Item = Result<Vec<Device>, DiscoveryError>> + Send>>;

/// A discovery handler, embedded or served over the v0 protocol.
pub trait DiscoveryHandler: Send + Sync + 'static {
    /// Name Configurations use to select this handler (e.g. `udev`).
    fn name(&self) -> &str;
    /// Whether the devices found may be visible from several nodes.
    fn shared(&self) -> bool;
    /// Parses details first: a parse error is returned at once as
    /// [`DiscoveryError::InvalidDetails`]. The returned stream yields the
    /// full device list at once, then again whenever it changes. It must be
    /// polled inside a tokio runtime; dropping it stops discovery.
    fn discover(&self, req: DiscoverRequest) -> Result<DeviceStream, DiscoveryError>;
}

/// Everything that can go wrong in discovery.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// The discovery details (or properties) could not be parsed or are out of bounds.
    #[error("invalid discovery details: {0}")]
    InvalidDetails(String),
    /// The handler (or agent) could not be reached.
    #[error("cannot connect to discovery endpoint: {0}")]
    Connect(String),
    /// The device stream broke or carried something that is not a v0 message.
    #[error("discovery stream failed: {0}")]
    Stream(String),
    /// Something did not answer in time.
    #[error("discovery timed out: {0}")]
    Timeout(String),
    /// The handler itself failed (e.g. udev unavailable).
    #[error("discovery handler failed: {0}")]
    Handler(String),
    /// A registration was refused by the agent, or is invalid.
    #[error("discovery handler registration rejected: {0}")]
    Registration(String),
    /// A local I/O operation (socket, file) failed.
    #[error("discovery i/o error: {0}")]
    Io(#[from] std::io::Error),
}
