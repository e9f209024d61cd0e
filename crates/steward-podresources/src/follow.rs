//! Feeding the hub from another pod resources server: kubelet's (List,
//! polled — kubelet serves no watch) or another steward process's (the
//! watch, with the initial snapshot told apart by
//! [`INITIAL_EVENTS_HEADER`](crate::service::INITIAL_EVENTS_HEADER)).
//!
//! A peer that is missing or restarting never stops the hub from serving:
//! its last report stays, the outage is logged once when it starts and once
//! when it ends, and following resumes by itself.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use steward_core::ledger::{
    Action, Allocatable, PodAssignments, Source, allocatable::fold_allocatable,
};
use steward_proto::podresources::v1 as wire;
use steward_proto::podresources::v1::pod_resources_lister_client::PodResourcesListerClient;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use crate::convert;
use crate::hub::Hub;
use crate::service::INITIAL_EVENTS_HEADER;

/// Names the UID of pod `namespace/name` (podresources `List` carries no
/// UID). Pods it cannot name are left out of that round.
pub type Resolver = Arc<dyn Fn(&str, &str) -> Option<String> + Send + Sync>;

/// Why one round of following failed.
#[derive(Debug, thiserror::Error)]
pub enum FollowError {
    #[error("connecting to {path}: {source}")]
    Connect {
        path: PathBuf,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("{call} on {path}: {status}")]
    Call {
        call: &'static str,
        path: PathBuf,
        status: Box<tonic::Status>,
    },
    #[error("{call} on {path} timed out after {timeout:?}")]
    Timeout {
        call: &'static str,
        path: PathBuf,
        timeout: Duration,
    },
}

async fn connect(
    path: &Path,
    timeout: Duration,
) -> Result<PodResourcesListerClient<Channel>, FollowError> {
    let channel = steward_proto::uds::endpoint()
        .connect_timeout(timeout)
        .connect_with_connector(steward_proto::uds::UnixConnector::new(path))
        .await
        .map_err(|source| FollowError::Connect {
            path: path.to_path_buf(),
            source,
        })?;
    Ok(PodResourcesListerClient::new(channel))
}

fn call_error(call: &'static str, path: &Path, status: tonic::Status) -> FollowError {
    FollowError::Call {
        call,
        path: path.to_path_buf(),
        status: Box::new(status),
    }
}

/// Logs a peer's outage once when it starts and once when it ends.
struct Outage {
    peer: String,
    down: bool,
}

impl Outage {
    fn new(peer: &Path) -> Self {
        Self {
            peer: peer.display().to_string(),
            down: false,
        }
    }

    fn failed(&mut self, err: &FollowError) {
        if !self.down {
            self.down = true;
            tracing::warn!(peer = %self.peer, %err, "pod resources peer unavailable; the last report is kept and following resumes when it returns");
        }
    }

    fn ok(&mut self) {
        if self.down {
            self.down = false;
            tracing::info!(peer = %self.peer, "pod resources peer is back");
        }
    }
}

/// One List + GetAllocatableResources round against `socket`.
pub async fn list_once(
    socket: &Path,
    timeout: Duration,
    resolve: &Resolver,
) -> Result<(Vec<PodAssignments>, Allocatable), FollowError> {
    let mut client = connect(socket, timeout).await?;
    let pods = client
        .list(wire::ListPodResourcesRequest {})
        .await
        .map_err(|s| call_error("List", socket, s))?
        .into_inner()
        .pod_resources;
    let allocatable = match client
        .get_allocatable_resources(wire::AllocatableResourcesRequest {})
        .await
    {
        Ok(r) => convert::allocatable_of(&r.into_inner()),
        // Older kubelets gate GetAllocatableResources; devices still count.
        Err(s) if s.code() == tonic::Code::Unimplemented => Allocatable::default(),
        Err(s) => return Err(call_error("GetAllocatableResources", socket, s)),
    };
    let pods = pods
        .iter()
        .filter_map(|p| {
            let uid = resolve(&p.namespace, &p.name)?;
            Some(convert::pod_assignments(&uid, p))
        })
        .collect();
    Ok((pods, allocatable))
}

/// Polls `socket` every `interval` and feeds the hub as `source`, until
/// `cancel`.
pub async fn follow_list(
    hub: Arc<Hub>,
    source: Source,
    socket: PathBuf,
    interval: Duration,
    resolve: Resolver,
    cancel: CancellationToken,
) {
    let mut outage = Outage::new(&socket);
    let timeout = interval.clamp(Duration::from_millis(200), Duration::from_secs(10));
    loop {
        match list_once(&socket, timeout, &resolve).await {
            Ok((pods, allocatable)) => {
                outage.ok();
                hub.replace(source, pods);
                hub.replace_allocatable(source, allocatable);
            }
            Err(err) => outage.failed(&err),
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
    }
}

/// One watch of another steward process's pod stream: the snapshot replaces
/// what `source` reported, then every change is applied. Returns when the
/// stream ends or fails.
async fn watch_pods_once(
    hub: &Hub,
    source: Source,
    socket: &Path,
    outage: &mut Outage,
) -> Result<(), FollowError> {
    let mut client = connect(socket, Duration::from_secs(5)).await?;
    let resp = client
        .list_and_watch(wire::ListAndWatchPodResourcesRequest {})
        .await
        .map_err(|s| call_error("ListAndWatch", socket, s))?;
    let initial: usize = resp
        .metadata()
        .get(INITIAL_EVENTS_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    outage.ok();
    let mut stream = resp.into_inner();
    // The first `initial` messages are the peer's state now: they replace
    // what it reported before (pods that went while we were away go).
    let mut snapshot = Some(Vec::with_capacity(initial));
    if initial == 0 {
        hub.replace(source, Vec::new());
        snapshot = None;
    }
    while let Some(msg) = stream.next().await {
        let msg = msg.map_err(|s| call_error("ListAndWatch", socket, s))?;
        let Some(pod) = msg.pod_resources.first() else {
            continue;
        };
        let pod = convert::pod_assignments(&msg.uid, pod);
        if let Some(pods) = snapshot.as_mut() {
            pods.push(pod);
            if pods.len() == initial {
                hub.replace(source, std::mem::take(pods));
                snapshot = None;
            }
            continue;
        }
        match convert::action_of(msg.action) {
            Action::Deleted => hub.remove(source, &msg.uid),
            Action::Added | Action::Updated => hub.upsert(source, pod),
        };
    }
    Ok(())
}

/// One watch of another steward process's allocatable stream.
async fn watch_allocatable_once(
    hub: &Hub,
    source: Source,
    socket: &Path,
) -> Result<(), FollowError> {
    let mut client = connect(socket, Duration::from_secs(5)).await?;
    let mut stream = client
        .list_and_watch_allocatable_resources(wire::ListAndWatchAllocatableResourcesRequest {})
        .await
        .map_err(|s| call_error("ListAndWatchAllocatableResources", socket, s))?
        .into_inner();
    let mut known = Allocatable::default();
    hub.replace_allocatable(source, known.clone());
    while let Some(msg) = stream.next().await {
        let msg = msg.map_err(|s| call_error("ListAndWatchAllocatableResources", socket, s))?;
        let event = steward_core::ledger::AllocatableEvent {
            seq: 0,
            action: match wire::WatchResourceAction::try_from(msg.action) {
                Ok(wire::WatchResourceAction::ResourceDeleted) => Action::Deleted,
                Ok(wire::WatchResourceAction::ResourceUpdated) => Action::Updated,
                _ => Action::Added,
            },
            resources: convert::allocatable_of(&wire::AllocatableResourcesResponse {
                devices: msg.devices,
                cpu_ids: msg.cpu_ids,
                memory: msg.memory,
            }),
        };
        fold_allocatable(&mut known, &event);
        hub.replace_allocatable(source, known.clone());
    }
    Ok(())
}

/// Reconnect delays: 100 ms doubling to 5 s, from the first after a
/// stream that ended cleanly.
fn reconnect_backoff() -> steward_nodeio::backoff::Backoff {
    steward_nodeio::backoff::Backoff::doubling(Duration::from_millis(100), Duration::from_secs(5))
}

/// Follows another steward process's pod resources watch (both streams)
/// and feeds the hub as `source`, reconnecting with a capped backoff, until
/// `cancel`.
pub async fn follow_watch(
    hub: Arc<Hub>,
    source: Source,
    socket: PathBuf,
    cancel: CancellationToken,
) {
    let pods = {
        let (hub, socket, cancel) = (hub.clone(), socket.clone(), cancel.clone());
        async move {
            let mut outage = Outage::new(&socket);
            let mut backoff = reconnect_backoff();
            loop {
                let result = tokio::select! {
                    () = cancel.cancelled() => return,
                    r = watch_pods_once(&hub, source, &socket, &mut outage) => r,
                };
                let delay = match result {
                    Ok(()) => {
                        backoff.reset();
                        backoff.next_delay()
                    }
                    Err(err) => {
                        outage.failed(&err);
                        backoff.next_delay()
                    }
                };
                tokio::select! {
                    () = cancel.cancelled() => return,
                    () = tokio::time::sleep(delay) => {}
                }
            }
        }
    };
    let allocatable = async move {
        let mut backoff = reconnect_backoff();
        loop {
            let result = tokio::select! {
                () = cancel.cancelled() => return,
                r = watch_allocatable_once(&hub, source, &socket) => r,
            };
            let delay = match result {
                Ok(()) => {
                    backoff.reset();
                    backoff.next_delay()
                }
                Err(err) => {
                    tracing::debug!(%err, "allocatable watch ended");
                    backoff.next_delay()
                }
            };
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(delay) => {}
            }
        }
    };
    futures::join!(pods, allocatable);
}
