//! steward-agent: the node agent's discovery half.
//!
//! [`run`] serves the discovery-handler Registration service on a unix
//! socket, keeps the handler registry (persisted in the node's embedded store
//! so registrations survive a restart), watches Configurations (Kubernetes or
//! a standalone YAML file), runs discovery for every handler/Configuration
//! pair, validates what handlers report and writes Instances through an
//! [`InstanceStore`] (Kubernetes custom resources or the embedded store).

pub mod cdi_names;
pub mod claims;
mod config;
pub mod deviceplugin;
mod discovery;
mod discovery_loop;
pub mod dra;
mod error;
pub mod events;
pub mod host_paths;
pub mod local_api;
pub mod metrics;
pub mod node_store;
mod nodes;
pub mod pod_resources;
pub mod selection;
mod slot_keeper;
pub mod source;
pub mod status;
pub mod store;
pub mod watches;

use std::future::Future;

pub use config::{AgentConfig, AgentTimings, Mode, embedded_handlers};
pub use error::{AgentError, InvalidDetails, SourceError, StateError, StoreError, Unresolved};
pub use metrics::AgentMetrics;
pub use node_store::NodeStore;
pub use store::{InstanceStore, KubeInstanceStore, LocalInstanceStore, OpContext};

use steward_core::discovery::registry::Registry;
use steward_discovery::policy::RegistrationPolicy;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use discovery_loop::{DiscoveryLoop, DiscoveryLoopParts, Inputs};

/// Run the agent's discovery until `shutdown` resolves.
pub async fn run(
    cfg: AgentConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), AgentError> {
    cfg.check()?;
    std::fs::create_dir_all(&cfg.state_dir).map_err(|source| AgentError::StateDir {
        path: cfg.state_dir.clone(),
        source,
    })?;
    if let Some(parent) = cfg.registration_socket.parent() {
        std::fs::create_dir_all(parent).map_err(|source| AgentError::StateDir {
            path: parent.to_owned(),
            source,
        })?;
    }
    // The DRA kubelet plugin is served before the store is held: during a
    // roll, the agent before this one still holds it, and calls are relayed
    // to it until then (dra::handover). Dropped last, after the ledger.
    let ledger_slot = std::sync::Arc::new(dra::handover::CoreSlot::new());
    let _dra_plugin = match (&cfg.mode, &cfg.dra_plugin, &cfg.device_plugins) {
        (Mode::Kubernetes(client), Some(dra), Some(_)) => {
            Some(AbortOnDropHandle::new(tokio::spawn(dra::kubelet::serve(
                ledger_slot.reader(),
                client.clone(),
                dra.clone(),
                cfg.readiness.clone(),
            ))))
        }
        _ => None,
    };
    let state = NodeStore::open_waiting(&cfg.state_dir, cfg.store_wait).await?;
    let metrics = cfg.metrics.clone().unwrap_or_default();

    let stop = CancellationToken::new();
    // Dropping this future (an aborted agent task) stops what it spawned.
    let _cancel_on_drop = stop.clone().drop_guard();
    cfg.readiness.not_ready(
        discovery_loop::READY_CONFIGURATIONS,
        "the Configurations have not been read and applied yet",
    );
    let (reg_tx, reg_rx) = mpsc::channel(64);
    let (cfg_tx, cfg_rx) = mpsc::channel(64);
    let (node_tx, node_rx) = mpsc::channel(64);
    let inputs = Inputs {
        registrations: reg_rx,
        configs: cfg_rx,
        nodes_gone: node_rx,
    };

    let mut background = Vec::new();
    // One watch per kind for the whole agent (Kubernetes mode), opened on
    // first use and handed to every consumer of the kind.
    let watches = match &cfg.mode {
        Mode::Kubernetes(client) => Some(watches::AgentWatches::new(
            client.clone(),
            &cfg.node_name,
            cfg_selection(cfg.select_by_node_labels, &cfg.node_name),
        )),
        Mode::Standalone { .. } => None,
    };
    let view = match &cfg.pod_resources {
        Some(pr) => {
            let pods = watches.as_ref().map(watches::AgentWatches::pods);
            let running = pod_resources::start(pr, pods, &stop)?;
            background.extend(running.tasks);
            Some((running.hub, running._socket))
        }
        None => None,
    };
    let hub = view.as_ref().map(|(hub, _)| hub.clone());
    let mut plugins = None;
    let mut dra_task = None;
    // Standalone: the read API holds the store; awaited at the end so the
    // store is free when `run` returns.
    let mut local_api = None;
    let local_view = local_api::LocalView::default();
    let mut watches = watches;
    let (status, kube_store) = match &cfg.mode {
        Mode::Kubernetes(client) => {
            let watches = &*watches.get_or_insert_with(|| {
                watches::AgentWatches::new(
                    client.clone(),
                    &cfg.node_name,
                    cfg_selection(cfg.select_by_node_labels, &cfg.node_name),
                )
            });
            let (events, events_task) = events::EventSink::start(client.clone(), &cfg.node_name);
            background.push(events_task);
            background.push(tokio::spawn(source::kube_source(
                client.clone(),
                watches.configurations(),
                cfg_tx,
            )));
            if cfg.follow_node_deletions {
                background.push(tokio::spawn(nodes::watch_nodes(watches.nodes(), node_tx)));
            } else {
                drop(node_tx);
            }
            if cfg.dra_slices {
                let (client, node, stop) = (client.clone(), cfg.node_name.clone(), stop.clone());
                let layout = cfg.dra_layout;
                let watches = watches.clone();
                // During a roll the successor's plugin serves beside this
                // one: the slices stay for it when this agent stops.
                let on_stop = match &cfg.dra_plugin {
                    Some(dra) => dra::OnStop::KeepForSuccessor {
                        plugin_dir: dra.plugin_dir.clone(),
                        own_socket: dra.plugin_socket(),
                    },
                    None => dra::OnStop::Delete,
                };
                dra_task = Some(AbortOnDropHandle::new(tokio::spawn(async move {
                    // An older cluster: one warning, no ResourceSlices; the
                    // device plugins and the rest go on.
                    if steward_kube::dra_served(
                        &client,
                        "resourceslices",
                        "publishing ResourceSlices",
                    )
                    .await
                    {
                        let (instances, claims) = (watches.instances(), watches.slot_claims());
                        dra::publish_until(client, node, layout, instances, claims, stop, on_stop)
                            .await;
                    }
                })));
            }
            if let Some(dp) = &cfg.device_plugins {
                plugins = Some(AbortOnDropHandle::new(tokio::spawn(device_plugins(
                    &cfg,
                    events.clone(),
                    dp.clone(),
                    watches.clone(),
                    state.clone(),
                    metrics.device_plugins.clone(),
                    hub.clone(),
                    ledger_slot.clone(),
                    stop.clone().cancelled_owned(),
                ))));
            }
            (
                Some(status::StatusWriter::new(
                    client.clone(),
                    cfg.node_name.clone(),
                )),
                Some(KubeInstanceStore::new(client.clone()).with_events(events)),
            )
        }
        Mode::Standalone {
            configurations_file,
        } => {
            drop(node_tx);
            let socket = cfg.state_dir.join(local_api::SOCKET);
            let (reader, view, until) = (state.clone(), local_view.clone(), stop.clone());
            local_api = Some(AbortOnDropHandle::new(tokio::spawn(async move {
                if let Err(e) = local_api::serve(&socket, reader, view, until).await {
                    tracing::error!(error = %e, "the local read API could not start");
                }
            })));
            background.push(tokio::spawn(source::file_source(
                configurations_file.clone(),
                cfg.timings.file_poll_interval,
                cfg_tx,
            )));
            (None, None)
        }
    };

    let policy = RegistrationPolicy::new(
        cfg.embedded_handlers.iter().map(|h| h.name().to_owned()),
        cfg.network_handler_cidrs.clone(),
    );
    let server = tokio::spawn(steward_discovery::registration::serve(
        cfg.registration_socket.clone(),
        reg_tx,
        policy,
        stop.clone().cancelled_owned(),
    ));

    let registry = Registry::new(cfg.registry);
    let (result, server) = match kube_store {
        Some(store) => {
            drive(
                &cfg, store, registry, state, metrics, status, None, inputs, shutdown, server,
            )
            .await
        }
        None => {
            let store = LocalInstanceStore::new(state.clone());
            let view = Some(local_view.clone());
            drive(
                &cfg, store, registry, state, metrics, status, view, inputs, shutdown, server,
            )
            .await
        }
    };

    stop.cancel();
    for task in background {
        task.abort();
    }
    if let Some(task) = local_api {
        // Ends on the stop signal, after its connections.
        deviceplugin::finish_task(task, std::time::Duration::from_secs(5)).await;
    }
    if let Some(task) = dra_task {
        // Bounded: it deletes this node's ResourceSlices on the stop signal.
        deviceplugin::finish_task(task, std::time::Duration::from_secs(5)).await;
    }
    if let Some(task) = plugins {
        // Bounded: the plugins stop their servers on the stop signal.
        deviceplugin::finish_task(task, std::time::Duration::from_secs(5)).await;
    }
    if let Some(server) = server {
        match server.await {
            Ok(Err(e)) if result.is_ok() => return Err(AgentError::Registration(e)),
            Err(e) if result.is_ok() => {
                return Err(AgentError::Task {
                    task: "registration server",
                    message: e.to_string(),
                });
            }
            _ => {}
        }
    }
    result
}

/// What the agent of `node` follows of the steward objects.
fn cfg_selection(by_node_labels: bool, node: &str) -> selection::Selection {
    if by_node_labels {
        selection::Selection::node(node)
    } else {
        selection::Selection::all()
    }
}

/// The device plugins of this node, with the claim stores they use.
#[allow(clippy::too_many_arguments)]
fn device_plugins(
    cfg: &AgentConfig,
    events: events::EventSink,
    dp: deviceplugin::DevicePluginConfig,
    watches: watches::AgentWatches,
    state: NodeStore,
    metrics: deviceplugin::DevicePluginMetrics,
    view: Option<std::sync::Arc<steward_podresources::Hub>>,
    ledger_slot: std::sync::Arc<
        dra::handover::CoreSlot<claims::LocalClaimStore, claims::KubeClaimStore>,
    >,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> impl Future<Output = ()> + Send + 'static {
    let client = watches.client().clone();
    let selection = watches.selection().clone();
    let mut dp = dp;
    dp.selection = selection.clone();
    let directory = claims::InstanceDirectory::new();
    let mut parts = deviceplugin::DevicePluginParts {
        node: cfg.node_name.clone(),
        client: client.clone(),
        watches: watches.clone(),
        local: claims::LocalClaimStore::new(state),
        cluster: claims::KubeClaimStore::new(client.clone(), directory.clone())
            .with_selection(selection.clone()),
        config: dp,
        metrics,
        directory: Some(directory),
        view,
        readiness: cfg.readiness.clone(),
        events: Some(events),
        with_core: Vec::new(),
        extended_through_dra: cfg.dra_plugin.is_some() && cfg.dra_slices,
        host_paths: cfg.host_paths.clone(),
    };
    if let Some(dra) = cfg.dra_plugin.clone() {
        let client = client.clone();
        parts.with_core.push(Box::new(move |core| {
            Box::pin(dra::kubelet::on_ledger(core, ledger_slot, client, dra))
        }));
    }
    let run = deviceplugin::run(parts, claims::watch_claims(watches.slot_claims()), shutdown);
    async move {
        if let Err(e) = run.await {
            tracing::error!(error = %e, "device plugins failed");
        }
    }
}

type ServerHandle = tokio::task::JoinHandle<Result<(), steward_discovery::DiscoveryError>>;

/// Run the discovery loop until shutdown, or until the registration server
/// fails. Returns the server handle if it is still running.
#[allow(clippy::too_many_arguments)]
async fn drive<S: InstanceStore>(
    cfg: &AgentConfig,
    store: S,
    registry: Registry,
    state: NodeStore,
    metrics: AgentMetrics,
    status: Option<status::StatusWriter>,
    local: Option<local_api::LocalView>,
    inputs: Inputs,
    shutdown: impl Future<Output = ()> + Send + 'static,
    mut server: ServerHandle,
) -> (Result<(), AgentError>, Option<ServerHandle>) {
    let mut discovery_loop = DiscoveryLoop::new(DiscoveryLoopParts {
        node: cfg.node_name.clone(),
        store,
        registry,
        state,
        metrics,
        embedded: cfg.embedded_handlers.clone(),
        client_opts: cfg.client.clone(),
        timings: cfg.timings,
        status,
        local,
        readiness: cfg.readiness.clone(),
    });
    if let Err(e) = discovery_loop.restore().await {
        return (Err(e), Some(server));
    }
    tracing::info!(node = %cfg.node_name, socket = %cfg.registration_socket.display(), mode = ?cfg.mode, "agent discovery started");
    let run = discovery_loop.run(inputs, shutdown);
    tokio::pin!(run);
    tokio::select! {
        () = &mut run => (Ok(()), Some(server)),
        outcome = &mut server => {
            let err = match outcome {
                Ok(Err(e)) => AgentError::Registration(e),
                Ok(Ok(())) => AgentError::Task {
                    task: "registration server",
                    message: "stopped unexpectedly".into(),
                },
                Err(e) => AgentError::Task {
                    task: "registration server",
                    message: e.to_string(),
                },
            };
            tracing::error!(error = %err, "agent stopping");
            (Err(err), None)
        }
    }
}
