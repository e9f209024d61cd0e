//! A pod resources server on a real unix socket, and clients of it.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use steward_core::cpu::CpuSet;
use steward_core::ledger::{PodAssignments, PodRef};
use steward_podresources::serve::{ServeOptions, serve};
use steward_podresources::{Hub, PodResourcesMetrics, WatchLimits};
use steward_proto::podresources::v1::pod_resources_lister_client::PodResourcesListerClient;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

/// A served hub; stops serving when dropped.
pub struct Server {
    pub hub: Arc<Hub>,
    pub socket: PathBuf,
    cancel: CancellationToken,
    dir: Option<tempfile::TempDir>,
}

impl Server {
    /// Stops serving and hands over the socket's directory (so a restarted
    /// server can bind the same path).
    pub fn stop_keep_dir(mut self) -> tempfile::TempDir {
        self.cancel.cancel();
        self.dir.take().unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

pub async fn start(limits: WatchLimits, options: ServeOptions) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("pod-resources.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let hub = Hub::new(limits, PodResourcesMetrics::default());
    let cancel = CancellationToken::new();
    tokio::spawn(serve(hub.clone(), listener, options, cancel.clone()));
    Server {
        hub,
        socket,
        cancel,
        dir: Some(dir),
    }
}

pub async fn unlimited() -> Server {
    start(WatchLimits::default(), ServeOptions { qps: 0.0, burst: 1 }).await
}

pub async fn client(server: &Server) -> PodResourcesListerClient<Channel> {
    let channel = steward_proto::uds::endpoint()
        .connect_timeout(Duration::from_secs(5))
        .connect_with_connector(steward_proto::uds::UnixConnector::new(&server.socket))
        .await
        .unwrap();
    PodResourcesListerClient::new(channel)
}

/// Pod `uid` (named like it) with `devices` of `steward.dev/cam` in `main`.
pub fn pod_with(uid: &str, devices: &[&str]) -> PodAssignments {
    let mut p = PodAssignments::new(PodRef::new(uid, "ns", uid));
    let c = p.container_mut("main");
    if !devices.is_empty() {
        c.add_devices(
            "steward.dev/cam",
            devices.iter().copied(),
            &BTreeSet::from([0]),
        );
    }
    p
}

pub fn with_cpus(
    mut p: PodAssignments,
    container: &str,
    cpus: &[u32],
    exclusive: bool,
) -> PodAssignments {
    let c = p.container_mut(container);
    c.cpus = CpuSet::from_iter(cpus.iter().copied());
    c.exclusive_cpus = exclusive;
    p
}
