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
//! Optionally ([`ProxyConfig::cluster`]) configuration also comes from
//! ConfigMaps ([`cluster_config`]) and the policy and topology are published
//! on the Node ([`node_publisher`]).
//!
//! Start it with [`run`], or [`Proxy::start`] to keep a handle (tests).

pub mod assignments;
pub mod cache;
pub mod cgroups;
pub mod cluster_config;
pub mod config;
pub mod control;
pub mod error;
pub mod manager;
pub mod metrics;
pub mod node_publisher;
pub mod quantity;
pub mod relay;
pub mod requests;
pub mod reservations;
pub mod server;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use steward_core::cpu::{PolicyKind, new_policy};
use steward_proto::cri::runtime::v1 as cri;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub use config::ClusterConfig;
pub use config::{AUTHORITY_FIX_DEFAULT, FileConfig, ProxyConfig};
pub use error::ResmgrError;
pub use manager::{
    ControlReport, Event, POLICY_DECISION_FAILED, PipelineGuard, ResourceManager, ResyncReport,
    VerifyReport,
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

fn choose_policy(
    cached: &str,
    has_containers: bool,
    configured: PolicyKind,
    allow_switch: bool,
) -> PolicyKind {
    let Ok(cached) = cached.parse::<PolicyKind>() else {
        return configured;
    };
    if cached == configured || !has_containers || allow_switch {
        return configured;
    }
    warn!(
        running = cached.as_str(),
        configured = configured.as_str(),
        "the configuration names another policy than the one that placed the running \
         containers; keeping it (switching needs the explicit allow-policy-switch flag)"
    );
    cached
}

/// Hands `p` to the Node publisher when it differs from what it has (the
/// Node is patched only on change).
fn offer(tx: &watch::Sender<Option<node_publisher::Publication>>, p: node_publisher::Publication) {
    tx.send_if_modified(|cur| {
        let changed = cur.as_ref() != Some(&p);
        if changed {
            *cur = Some(p);
        }
        changed
    });
}

impl Proxy {
    /// Discover the topology, load the configuration and the cache, re-sync
    /// with the runtime (when it answers), bind the socket and serve.
    pub async fn start(cfg: ProxyConfig) -> Result<Proxy, ResmgrError> {
        let topology =
            steward_topology::discover(&cfg.sysfs_root).map_err(|e| ResmgrError::Topology {
                source: Box::new(e),
            })?;
        let (file_cfg, file_text) = match &cfg.config_file {
            Some(path) => {
                let (parsed, text) = config::load_initial(path, cfg.config_poll).await?;
                (parsed, Some(text))
            }
            None => (FileConfig::default(), None),
        };
        let mut sources = cluster_config::ConfigSources::new(file_cfg);
        let mut cluster_updates = None;
        if let Some(c) = &cfg.cluster {
            let mut updates = Box::pin(cluster_config::watch(c, cfg.metrics.clone()));
            match tokio::time::timeout(c.initial_timeout, updates.next()).await {
                Ok(Some(u)) => {
                    sources.cluster_changed(u);
                }
                Ok(None) => {}
                Err(_) => warn!(
                    node = %c.node_name,
                    namespace = %c.namespace,
                    timeout = ?c.initial_timeout,
                    "no cluster configuration yet; starting with the file (or the defaults)"
                ),
            }
            cluster_updates = Some(updates);
        }
        let mut file_cfg = sources.effective().clone();
        let upstream = relay::Upstream::new(&cfg.runtime, cfg.runtime_timeout)?;
        let (cache, outcome) = cache::Cache::open(&cfg.state_dir)?;
        info!(?outcome, path = %cache.path().display(), "cache opened");
        let kind = choose_policy(
            &cache.data().policy,
            !cache.data().containers.is_empty(),
            file_cfg.policy.active,
            cfg.allow_policy_switch,
        );
        file_cfg.policy.active = kind;
        let policy = new_policy(kind, &topology, &file_cfg.policy.config).map_err(|e| {
            ResmgrError::Policy {
                source: Box::new(e),
            }
        })?;
        info!(policy = kind.as_str(), cpus = %topology.online_cpus(), "policy ready");
        let cgroups: Arc<dyn cgroups::Cgroups> = Arc::from(cgroups::detect(&cfg.cgroup_root));
        let (events_tx, mut events_rx) = mpsc::channel(256);
        let manager = Arc::new(ResourceManager::new(
            cache,
            policy,
            topology,
            file_cfg,
            upstream.clone(),
            events_tx,
            cfg.metrics.clone(),
            cgroups,
            &cfg.resctrl_root,
            cfg.allow_policy_switch,
        ));
        manager.startup().await?;

        let mut pod_resources = None;
        if let Some(path) = &cfg.pod_resources_socket {
            let hub = steward_podresources::Hub::new(
                steward_podresources::WatchLimits::default(),
                cfg.pod_resources_metrics.clone(),
            );
            manager.publish_to(hub.clone()).await;
            let (listener, guard) =
                steward_nodeio::bind(path, steward_nodeio::BindOptions::mode(0o660)).map_err(
                    |source| ResmgrError::PodResources {
                        path: path.clone(),
                        source,
                    },
                )?;
            info!(socket = %path.display(), "serving pod resources (the CRI resource manager's assignments)");
            pod_resources = Some((hub, listener, guard));
        }

        let listener = server::bind(&cfg.listen, cfg.authority_fix).await?;
        info!(listen = %cfg.listen.display(), runtime = %cfg.runtime.display(), "CRI proxy serving");
        let stop = CancellationToken::new();
        let router = server::Router {
            upstream: upstream.clone(),
            resmgr: manager.clone(),
            metrics: cfg.metrics.clone(),
        };
        let server = tokio::spawn(server::serve(listener, router, stop.clone()));

        let mut tasks = Vec::new();
        let mut socket_guards = Vec::new();
        if let Some((hub, listener, guard)) = pod_resources {
            socket_guards.push(guard);
            let stop = stop.clone();
            tasks.push(tokio::spawn(async move {
                if let Err(e) = steward_podresources::serve::serve(
                    hub,
                    listener,
                    steward_podresources::serve::ServeOptions::default(),
                    stop,
                )
                .await
                {
                    warn!(error = %e, "the pod resources server stopped");
                }
            }));
        }
        let (cfg_tx, mut cfg_rx) = mpsc::channel(4);
        if let Some(path) = cfg.config_file.clone() {
            tasks.push(tokio::spawn(config::watch(
                path,
                file_text,
                cfg.config_poll,
                cfg_tx,
                cfg.metrics.clone(),
            )));
        }
        let (cluster_tx, mut cluster_rx) = mpsc::channel(4);
        if let Some(mut updates) = cluster_updates {
            tasks.push(tokio::spawn(async move {
                while let Some(u) = updates.next().await {
                    if cluster_tx.send(u).await.is_err() {
                        return;
                    }
                }
            }));
        }
        let (publish_tx, publish_rx) = watch::channel(None);
        if let Some(c) = &cfg.cluster {
            let (sink, events_task) =
                steward_kube::EventSink::start(c.client.clone(), "steward-cri-proxy", &c.node_name);
            manager.emit_events(sink);
            tasks.push(events_task);
            let _ = publish_tx.send(Some(manager.publication().await));
            tasks.push(tokio::spawn(node_publisher::NodePublisher::new(c).run(
                publish_rx,
                c.publish_retry,
                cfg.metrics.clone(),
            )));
            // The free exclusive CPUs change with every placement: the
            // Node is patched only when the document changed.
            let (m, tx) = (manager.clone(), publish_tx.clone());
            tasks.push(tokio::spawn(async move {
                loop {
                    m.saved().await;
                    offer(&tx, m.publication().await);
                }
            }));
            // Exclusive CPUs reserved on this node for pods not yet here.
            let m = manager.clone();
            let holds = reservations::watch_holds(c.client.clone(), c.node_name.clone());
            tasks.push(tokio::spawn(async move {
                let mut holds = std::pin::pin!(holds);
                while let Some(h) = holds.next().await {
                    m.set_holds(h).await;
                }
            }));
        }
        {
            let m = manager.clone();
            let publish = cfg.cluster.is_some();
            tasks.push(tokio::spawn(async move {
                loop {
                    let apply = tokio::select! {
                        Some(e) = events_rx.recv() => {
                            m.handle(e).await;
                            None
                        }
                        Some(c) = cfg_rx.recv() => sources.file_changed(c),
                        Some(u) = cluster_rx.recv() => sources.cluster_changed(u),
                        else => break,
                    };
                    if let Some(c) = apply {
                        m.handle(Event::Config(Box::new(c))).await;
                        // A new policy or reserved set (placements that
                        // changed are published after the cache save).
                        if publish {
                            offer(&publish_tx, m.publication().await);
                        }
                    }
                }
            }));
        }
        tasks.push(tokio::spawn(monitor(
            manager.clone(),
            cfg.runtime_probe,
            cfg.verify_interval,
            cfg.metrics.clone(),
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
    use super::*;

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
