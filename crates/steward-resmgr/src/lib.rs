//! steward's CRI resource manager.
//!
//! A relaying CRI proxy: it serves `runtime.v1` RuntimeService and
//! ImageService on a unix socket and relays to the runtime's socket.
//! `RunPodSandbox`, `StopPodSandbox`, `RemovePodSandbox`, `CreateContainer`,
//! `StartContainer`, `StopContainer`, `RemoveContainer`,
//! `UpdateContainerResources` and `ListContainers` are intercepted; every
//! other call (streaming ones and ones this build does not know included)
//! is relayed byte for byte by method path.
//!
//! Intercepted calls that change allocations run through the request
//! pipeline, serialized by one lock over the [`cache`] and the CPU/memory
//! policy; the event pipeline (re-sync, drift, configuration, read-back)
//! takes the same lock. Relayed calls never wait on it.
//!
//! Optionally ([`ManagerConfig::cluster`]) configuration also comes from
//! ConfigMaps ([`cluster_config`]) and the policy and topology are published
//! on the Node ([`node_publisher`]).
//!
//! Start it with [`run`], or [`Proxy::start`] to keep a handle (tests).
//!
//! The same resource manager also runs as an NRI plugin of the runtime
//! ([`nri::NriPlugin`], `steward nri-plugin`): driven by the runtime's NRI
//! events instead of intercepted CRI calls, with the same placement
//! (`assemble.rs` builds both). With [`dra`], the NRI plugin is also a DRA
//! driver of its own, `cpu.steward.dev`: the node's CPUs as devices.

mod assemble;
pub mod assignments;
pub mod cache;
pub mod cgroups;
pub mod cluster_config;
pub mod config;
pub mod control;
pub mod dra;
pub mod error;
pub mod kubelet_cpus;
pub mod manager;
pub mod metrics;
pub mod node_publisher;
pub mod nri;
pub mod quantity;
pub mod relay;
pub mod requests;
pub mod reservations;
pub mod server;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use steward_proto::cri::runtime::v1 as cri;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::info;

pub use config::ClusterConfig;
pub use config::{AUTHORITY_FIX_DEFAULT, FileConfig, ManagerConfig, ProxyConfig};
pub use error::ResmgrError;
pub use manager::{
    ANNOTATION_ABOVE_SPEC_REASON, ControlReport, Event, POLICY_DECISION_FAILED, PipelineGuard,
    ResourceManager, ResyncReport, VerifyReport,
};
pub use metrics::Metrics;

/// A running proxy.
pub struct Proxy {
    socket: PathBuf,
    manager: Arc<ResourceManager>,
    stop: CancellationToken,
    server: Option<JoinHandle<()>>,
    tasks: Vec<JoinHandle<()>>,
    /// Sockets besides the CRI one (pod resources), removed when dropped.
    _socket_guards: Vec<steward_nodeio::SocketGuard>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("socket", &self.socket)
            .finish_non_exhaustive()
    }
}

impl Proxy {
    /// Discover the topology, load the configuration and the cache, re-sync
    /// with the runtime (when it answers), bind the socket and serve.
    pub async fn start(cfg: ProxyConfig) -> Result<Proxy, ResmgrError> {
        let upstream = relay::Upstream::new(&cfg.runtime, cfg.runtime_timeout)?;
        let assembled = assemble::assemble(&cfg.manager, upstream.clone(), false).await?;
        let assemble::Assembled {
            manager,
            stop,
            mut tasks,
            socket_guards,
            ..
        } = assembled;
        let listener = server::bind(&cfg.listen, cfg.authority_fix).await?;
        info!(listen = %cfg.listen.display(), runtime = %cfg.runtime.display(), "CRI proxy serving");
        let router = server::Router {
            upstream: upstream.clone(),
            resmgr: manager.clone(),
            metrics: cfg.manager.metrics.clone(),
        };
        let server = tokio::spawn(server::serve(listener, router, stop.clone()));
        tasks.push(tokio::spawn(monitor(
            manager.clone(),
            cfg.runtime_probe,
            cfg.manager.verify_interval,
            cfg.manager.metrics.clone(),
        )));
        Ok(Proxy {
            socket: cfg.listen.clone(),
            manager,
            stop,
            server: Some(server),
            tasks,
            _socket_guards: socket_guards,
        })
    }

    /// The socket the proxy serves on.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The resource manager (for inspection).
    pub fn manager(&self) -> &Arc<ResourceManager> {
        &self.manager
    }

    /// Stop serving, let in-flight calls finish, persist the cache.
    pub async fn shutdown(mut self) {
        self.stop.cancel();
        if let Some(server) = self.server.take() {
            let _ = server.await;
        }
        for t in self.tasks.drain(..) {
            t.abort();
        }
        // In-flight intercepted calls hold the lock; once we get it they are done.
        let _ = self.manager.snapshot().await;
        let _ = std::fs::remove_file(&self.socket);
        info!("CRI proxy stopped");
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(s) = self.server.take() {
            s.abort();
        }
        for t in self.tasks.drain(..) {
            t.abort();
        }
    }
}

/// Probe the runtime; after an outage re-sync. Periodically read back
/// cgroups and retry failed updates.
async fn monitor(
    manager: Arc<ResourceManager>,
    probe: Duration,
    verify: Duration,
    metrics: Metrics,
) {
    let mut tick = tokio::time::interval(probe.max(Duration::from_millis(50)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_verify = tokio::time::Instant::now();
    loop {
        tick.tick().await;
        let up = manager.upstream();
        let mut rt = up.runtime();
        let ok = tokio::time::timeout(up.timeout(), rt.version(cri::VersionRequest::default()))
            .await
            .is_ok_and(|r| r.is_ok());
        metrics.set_runtime_up(ok);
        if !ok {
            up.set_healthy(false);
            continue;
        }
        up.set_healthy(true);
        if up.take_went_down() {
            manager.post(Event::Resync("runtime reachable again"));
        }
        if !verify.is_zero() && last_verify.elapsed() >= verify {
            last_verify = tokio::time::Instant::now();
            manager.post(Event::Rebalance);
            manager.post(Event::Verify);
        }
    }
}

/// Run the proxy until `shutdown` completes.
pub async fn run(
    cfg: ProxyConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ResmgrError> {
    let proxy = Proxy::start(cfg).await?;
    shutdown.await;
    proxy.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::assemble::choose_policy;
    use steward_core::cpu::PolicyKind;

    #[test]
    fn policy_switch_at_start_needs_the_flag() {
        let s = PolicyKind::Static;
        let b = PolicyKind::Balloons;
        assert_eq!(choose_policy("", true, b, false), b);
        assert_eq!(choose_policy("static", false, b, false), b);
        assert_eq!(choose_policy("static", true, b, false), s);
        assert_eq!(choose_policy("static", true, b, true), b);
        assert_eq!(choose_policy("junk", true, b, false), b);
    }
}
