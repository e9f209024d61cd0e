//! One discovery stream: a handler (embedded or external) asked to discover
//! for one Configuration. The task reports what happens to the discovery
//! loop and never panics the agent: every failure becomes a message.

use std::sync::Arc;

use futures::StreamExt;
use steward_core::discovery::{ConfigKey, Device, Endpoint, HandlerKey};
use steward_discovery::client::ClientOptions;
use steward_discovery::{DiscoverRequest, DiscoveryError, DiscoveryHandler};
use tokio::sync::mpsc;

/// How to reach the handler.
#[derive(Clone)]
pub(crate) enum Target {
    Embedded(Arc<dyn DiscoveryHandler>),
    Remote(Endpoint),
}

/// What a discovery task reports.
#[derive(Debug)]
pub(crate) enum DiscoveryMsg {
    /// The handler accepted the request.
    Connected,
    /// The handler's full, current device list (unvalidated).
    Devices(Vec<Device>),
    /// The handler refused the details; retrying will not help.
    InvalidDetails(String),
    /// Connecting failed or the stream broke, hung, sent garbage or ended.
    Lost(String),
    /// Nothing was sent: the details may not go to this handler.
    Withheld(crate::error::InvalidDetails),
}

/// A message from task `task` about the pair `(key, config)`.
#[derive(Debug)]
pub(crate) struct TaskReport {
    pub task: u64,
    pub key: HandlerKey,
    pub config: ConfigKey,
    pub msg: DiscoveryMsg,
}

pub(crate) async fn run(
    task: u64,
    key: HandlerKey,
    config: ConfigKey,
    target: Target,
    req: DiscoverRequest,
    opts: ClientOptions,
    tx: mpsc::Sender<TaskReport>,
) {
    let send = |msg: DiscoveryMsg| {
        let tx = tx.clone();
        let report = TaskReport {
            task,
            key: key.clone(),
            config: config.clone(),
            msg,
        };
        async move { tx.send(report).await.is_ok() }
    };
    let opened = match target {
        Target::Embedded(h) => h.discover(req),
        Target::Remote(endpoint) => {
            steward_discovery::client::discover(&endpoint, req, &opts).await
        }
    };
    let mut stream = match opened {
        Ok(s) => s,
        Err(DiscoveryError::InvalidDetails(m)) => {
            send(DiscoveryMsg::InvalidDetails(m)).await;
            return;
        }
        Err(e) => {
            send(DiscoveryMsg::Lost(e.to_string())).await;
            return;
        }
    };
    if !send(DiscoveryMsg::Connected).await {
        return;
    }
    while let Some(item) = stream.next().await {
        let msg = match item {
            Ok(devices) => DiscoveryMsg::Devices(devices),
            Err(DiscoveryError::InvalidDetails(m)) => {
                send(DiscoveryMsg::InvalidDetails(m)).await;
                return;
            }
            Err(e) => {
                send(DiscoveryMsg::Lost(e.to_string())).await;
                return;
            }
        };
        if !send(msg).await {
            return;
        }
    }
    send(DiscoveryMsg::Lost(
        "the handler closed the discovery stream".into(),
    ))
    .await;
}
