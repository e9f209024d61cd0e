//! What the CRI proxy and the NRI plugin share: topology, configuration
//! (file and cluster), cache, policy, the resource manager and its event
//! loop, the pod resources server, Node publication and reservation holds.
//! The transport (the CRI server, or the NRI session) is added by the caller.

use std::sync::Arc;

use futures::StreamExt;
use steward_core::cpu::{PolicyKind, new_policy};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::{self, FileConfig, ManagerConfig};
use crate::error::ResmgrError;
use crate::manager::{Event, ResourceManager};
use crate::{cache, cgroups, cluster_config, node_publisher, relay, reservations};

/// The resource manager with its background tasks running.
pub(crate) struct Assembled {
    pub manager: Arc<ResourceManager>,
    pub stop: CancellationToken,
    pub tasks: Vec<JoinHandle<()>>,
    /// Sockets besides the transport's (pod resources), removed when dropped.
    pub socket_guards: Vec<steward_nodeio::SocketGuard>,
    /// Moves after every cache save: each follower of the manager's
    /// assignments (Node publication, the CPU devices) holds its own
    /// receiver (`ResourceManager::saved` wakes one waiter only).
    pub saves: watch::Receiver<u64>,
}

pub(crate) fn choose_policy(
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

/// Discover the topology, load the configuration and the cache, start the
/// resource manager (re-synced with the runtime over CRI, or, with `nri`,
/// restored from the cache until the runtime's Synchronize) and its tasks.
pub(crate) async fn assemble(
    cfg: &ManagerConfig,
    upstream: relay::Upstream,
    nri: bool,
) -> Result<Assembled, ResmgrError> {
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
    let (cache, outcome) = cache::Cache::open(&cfg.state_dir)?;
    info!(?outcome, path = %cache.path().display(), "cache opened");
    let kind = choose_policy(
        &cache.data().policy,
        !cache.data().containers.is_empty(),
        file_cfg.policy.active,
        cfg.allow_policy_switch,
    );
    file_cfg.policy.active = kind;
    let policy =
        new_policy(kind, &topology, &file_cfg.policy.config).map_err(|e| ResmgrError::Policy {
            source: Box::new(e),
        })?;
    info!(policy = kind.as_str(), cpus = %topology.online_cpus(), "policy ready");
    let cgroups: Arc<dyn cgroups::Cgroups> = Arc::from(cgroups::detect(&cfg.cgroup_root));
    let (events_tx, mut events_rx) = mpsc::channel(256);
    let manager = Arc::new(ResourceManager::new(
        cache,
        policy,
        topology,
        file_cfg,
        upstream,
        events_tx,
        cfg.metrics.clone(),
        cgroups,
        &cfg.resctrl_root,
        cfg.allow_policy_switch,
    ));
    if nri {
        // The runtime's Synchronize re-syncs; until then, the cache.
        manager.collect_updates().await;
        manager.startup_from_cache().await;
    } else {
        manager.startup().await?;
    }

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

    let stop = CancellationToken::new();
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
    let (saves_tx, saves) = watch::channel(0u64);
    {
        let m = manager.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                m.saved().await;
                saves_tx.send_modify(|n| *n = n.wrapping_add(1));
            }
        }));
    }
    let (publish_tx, publish_rx) = watch::channel(None);
    if let Some(c) = &cfg.cluster {
        let (sink, events_task) = steward_kube::EventSink::start(
            c.client.clone(),
            if nri {
                "steward-nri-plugin"
            } else {
                "steward-cri-proxy"
            },
            &c.node_name,
        );
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
        let (m, tx, mut saved) = (manager.clone(), publish_tx.clone(), saves.clone());
        tasks.push(tokio::spawn(async move {
            while saved.changed().await.is_ok() {
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
    Ok(Assembled {
        manager,
        stop,
        tasks,
        socket_guards,
        saves,
    })
}
