//! The DRA kubelet plugin: what kubelet's plugin watcher and DRA manager
//! call.
//!
//! * **Registration** on `<kubelet>/plugins_registry/steward.dev-reg.sock`
//!   (`pluginregistration.Registration`): GetInfo answers type
//!   [`PLUGIN_TYPE`], the driver name, the DRA socket and the services
//!   served there, [`SUPPORTED_SERVICES`]; NotifyRegistrationStatus marks
//!   the plugin ready (or logs kubelet's refusal).
//! * **DRAPlugin** (`k8s.io.kubelet.pkg.apis.dra.v1`) on
//!   `<kubelet>/plugins/steward.dev/dra.sock`: NodePrepareResources reads
//!   each claim's allocation from the API and prepares its devices on the
//!   slot ledger (durable before the answer), answering the Instances' CDI
//!   devices; NodeUnprepareResources frees exactly what the claim holds.
//!   Batch semantics: one answer per claim UID, each with its own error;
//!   one claim failing disturbs no other.
//! * **DRAResourceHealth**, `v1` and `v1alpha1`, on the same socket: device
//!   health from discovery, streamed (see `health` and `health_wire`).
//!
//! The sockets and the registration are the shared skeleton's
//! ([`steward_nodeio::kubelet_plugin`]): both are re-bound if they
//! disappear. Unprepare of a claim that
//! holds nothing answers success: kubelet retries an unprepare error until
//! it succeeds, so an error would keep the pod from finishing for nothing.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

use steward_core::dra::DRIVER;
use steward_core::ledger::ClaimRef;
use steward_nodeio::kubelet_plugin::{self, KubeletPlugin};
use steward_proto::dra::v1::dra_plugin_client::DraPluginClient;
use steward_proto::dra::v1::{
    Claim, Device, NodePrepareResourceResponse, NodePrepareResourcesRequest,
    NodePrepareResourcesResponse, NodeUnprepareResourceResponse, NodeUnprepareResourcesRequest,
    NodeUnprepareResourcesResponse,
    dra_plugin_server::{DraPlugin, DraPluginServer},
};
use steward_proto::dra_health::{v1 as health_v1, v1alpha1 as health_v1alpha1};
use tonic::service::Routes;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use super::claims::read_claim;
use super::handover::{self, CoreReader, CoreSlot, Peers};
use crate::claims::ClaimStore;
use crate::slot_keeper::SlotKeeper;

/// The plugin type kubelet's plugin watcher routes to its DRA manager, and
/// the gRPC service kubelet 1.34+ calls, as listed in `supported_versions`.
pub use steward_proto::dra::v1::{PLUGIN_TYPE, SERVICE_VERSION};

/// `PluginInfo.supported_versions`: every gRPC service on the DRA socket,
/// as `<package>.<service>`. kubelet takes the first DRAPlugin entry it
/// knows, so `v1.DRAPlugin` leads (steward serves no `v1beta1.DRAPlugin`;
/// every kubelet from 1.34 knows v1). kubelet 1.37 picks the health stream
/// from this list, v1 before v1alpha1; 1.34–1.36 dial v1alpha1 without
/// looking at it.
pub const SUPPORTED_SERVICES: [&str; 3] = [
    SERVICE_VERSION,
    health_v1::SERVICE_VERSION,
    health_v1alpha1::SERVICE_VERSION,
];
/// File name of the registration socket in kubelet's `plugins_registry`.
pub const REGISTRATION_SOCKET: &str = "steward.dev-reg.sock";
/// File name of the DRA socket in `<kubelet>/plugins/steward.dev/`.
pub const PLUGIN_SOCKET: &str = kubelet_plugin::PLUGIN_SOCKET;
/// The readiness condition: registered with kubelet.
pub const READINESS: &str = "dra-plugin";

/// Largest message decoded or encoded (gRPC's default, as kubelet's).
const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// Where the kubelet plugin lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraPluginConfig {
    /// kubelet's plugin watcher directory (`<kubelet>/plugins_registry`).
    pub registry_dir: PathBuf,
    /// This driver's directory (`<kubelet>/plugins/steward.dev`).
    pub plugin_dir: PathBuf,
    /// How often the sockets are checked for removal.
    pub poll: Duration,
    /// Bound on each API read of a prepare.
    pub op_timeout: Duration,
    /// How often the claims holding slots are read back, to release those
    /// gone from the API ([`super::gc`]).
    pub gc_interval: Duration,
    /// After how long without a change the health stream sends the state
    /// again (kubelet forgets a device's health 30 s after the last report
    /// naming it).
    pub health_resend: Duration,
    /// The pod this agent runs in (its UID), when the DaemonSet rolls with
    /// `maxSurge`: the sockets are named after it, so the old and the new
    /// agent are registered side by side ([`super::handover`]).
    pub instance: Option<String>,
    /// How long a call waits for this agent to hold the node's store (the
    /// agent before it stopping), below kubelet's 45 s call timeout.
    pub hold: Duration,
}

impl DraPluginConfig {
    /// Defaults for a kubelet rooted at `kubelet_root`.
    pub fn new(kubelet_root: &Path) -> Self {
        Self {
            registry_dir: kubelet_root.join("plugins_registry"),
            plugin_dir: kubelet_root.join("plugins").join(DRIVER),
            poll: Duration::from_millis(200),
            op_timeout: Duration::from_secs(5),
            gc_interval: Duration::from_secs(60),
            health_resend: Duration::from_secs(10),
            instance: None,
            hold: Duration::from_secs(40),
        }
    }

    pub fn registration_socket(&self) -> PathBuf {
        self.kubelet_plugin().registration_socket()
    }

    pub fn plugin_socket(&self) -> PathBuf {
        self.kubelet_plugin().plugin_socket()
    }

    /// The shared skeleton's view: driver [`DRIVER`], these directories,
    /// [`SUPPORTED_SERVICES`], readiness [`READINESS`].
    fn kubelet_plugin(&self) -> KubeletPlugin {
        KubeletPlugin {
            driver: DRIVER.to_owned(),
            registry_dir: self.registry_dir.clone(),
            plugin_dir: self.plugin_dir.clone(),
            supported_versions: SUPPORTED_SERVICES.map(str::to_owned).to_vec(),
            readiness: READINESS.to_owned(),
            poll: self.poll,
            instance: None,
        }
        .with_instance(self.instance.clone())
    }
}

struct Node<L, C> {
    core: CoreReader<L, C>,
    peers: Peers,
    hold: Duration,
    client: kube::Client,
    op_timeout: Duration,
}

/// Who serves a call: this agent's ledger, or the agent before it.
enum Route<L, C> {
    Here(Arc<SlotKeeper<L, C>>),
    Peer(PathBuf, DraPluginClient<Channel>),
}

/// Set on a call relayed to a peer: a relayed call is never relayed again
/// (two successors could otherwise pass it between them).
const RELAYED: &str = "x-steward-relayed";

impl<L: ClaimStore, C: ClaimStore> Node<L, C> {
    /// This agent's ledger once it holds the node's store; before that,
    /// the agent before it, if one is serving; else the ledger, waited for.
    async fn route(&self, relayed: bool) -> Result<Route<L, C>, Status> {
        if let Some(core) = self.core.now() {
            return core.map(Route::Here);
        }
        if !relayed && let Some((socket, channel)) = self.peers.connect().await {
            let client = DraPluginClient::new(channel)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES);
            return Ok(Route::Peer(socket, client));
        }
        self.core.wait(self.hold).await.map(Route::Here)
    }

    /// A call for the peer, marked relayed.
    fn relay<T>(message: T) -> Request<T> {
        let mut request = Request::new(message);
        request
            .metadata_mut()
            .insert(RELAYED, tonic::metadata::MetadataValue::from_static("1"));
        request
    }

    async fn prepare_one(
        &self,
        core: &SlotKeeper<L, C>,
        claim: Claim,
    ) -> NodePrepareResourceResponse {
        let claim = ClaimRef::new(claim.uid, claim.namespace, claim.name);
        let result = match read_claim(&self.client, &claim, self.op_timeout).await {
            Ok(allocated) => core
                .prepare_claim(&claim, &allocated.users, &allocated.devices)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => {
                core.metrics.preparation(e.label());
                Err(e.to_string())
            }
        };
        match result {
            Ok(devices) => NodePrepareResourceResponse {
                devices: devices
                    .into_iter()
                    .map(|d| Device {
                        request_names: vec![d.request],
                        pool_name: d.pool,
                        device_name: d.device,
                        cdi_device_ids: d.cdi_ids,
                        share_id: (!d.share_id.is_empty()).then_some(d.share_id),
                    })
                    .collect(),
                error: String::new(),
            },
            Err(error) => {
                tracing::warn!(%claim, %error, "NodePrepareResources refused a claim");
                NodePrepareResourceResponse {
                    devices: Vec::new(),
                    error,
                }
            }
        }
    }
}

/// A claim kubelet named without a namespace, name or UID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("claim {namespace}/{name} (UID {uid:?}) lacks a namespace, name or UID")]
struct IncompleteClaim {
    namespace: String,
    name: String,
    uid: String,
}

fn valid(claim: &Claim) -> Result<(), IncompleteClaim> {
    if claim.uid.is_empty() || claim.name.is_empty() || claim.namespace.is_empty() {
        return Err(IncompleteClaim {
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            uid: claim.uid.clone(),
        });
    }
    Ok(())
}

#[tonic::async_trait]
impl<L: ClaimStore, C: ClaimStore> DraPlugin for Node<L, C> {
    async fn node_prepare_resources(
        &self,
        request: Request<NodePrepareResourcesRequest>,
    ) -> Result<Response<NodePrepareResourcesResponse>, Status> {
        let relayed = request.metadata().contains_key(RELAYED);
        let request = request.into_inner();
        let core = match self.route(relayed).await? {
            Route::Here(core) => core,
            Route::Peer(socket, mut peer) => {
                match peer
                    .node_prepare_resources(Self::relay(request.clone()))
                    .await
                {
                    Ok(answer) => {
                        tracing::info!(peer = %socket.display(), claims = request.claims.len(), "NodePrepareResources relayed to the agent before this one");
                        return Ok(Response::new(answer.into_inner()));
                    }
                    Err(status) if handover::peer_gone(&status) => {
                        tracing::info!(peer = %socket.display(), error = %status, "the agent before this one is stopping; serving NodePrepareResources on this agent's ledger");
                        self.core.wait(self.hold).await?
                    }
                    Err(status) => return Err(status),
                }
            }
        };
        let mut claims = HashMap::new();
        let mut pending = Vec::new();
        for claim in request.claims {
            match valid(&claim) {
                Ok(()) => pending.push(claim),
                Err(error) => {
                    claims.insert(
                        claim.uid.clone(),
                        NodePrepareResourceResponse {
                            devices: Vec::new(),
                            error: error.to_string(),
                        },
                    );
                }
            }
        }
        let answers = futures::future::join_all(pending.into_iter().map(|c| {
            let uid = c.uid.clone();
            let core = &core;
            async move { (uid, self.prepare_one(core, c).await) }
        }))
        .await;
        claims.extend(answers);
        Ok(Response::new(NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<NodeUnprepareResourcesRequest>,
    ) -> Result<Response<NodeUnprepareResourcesResponse>, Status> {
        let relayed = request.metadata().contains_key(RELAYED);
        let request = request.into_inner();
        let core = match self.route(relayed).await? {
            Route::Here(core) => core,
            Route::Peer(socket, mut peer) => {
                match peer
                    .node_unprepare_resources(Self::relay(request.clone()))
                    .await
                {
                    Ok(answer) => {
                        tracing::info!(peer = %socket.display(), claims = request.claims.len(), "NodeUnprepareResources relayed to the agent before this one");
                        return Ok(Response::new(answer.into_inner()));
                    }
                    Err(status) if handover::peer_gone(&status) => {
                        tracing::info!(peer = %socket.display(), error = %status, "the agent before this one is stopping; serving NodeUnprepareResources on this agent's ledger");
                        self.core.wait(self.hold).await?
                    }
                    Err(status) => return Err(status),
                }
            }
        };
        let mut claims = HashMap::new();
        for claim in request.claims {
            let error = match valid(&claim) {
                Ok(()) => {
                    core.unprepare_claim(&claim.uid, false).await;
                    String::new()
                }
                Err(e) => e.to_string(),
            };
            claims.insert(claim.uid, NodeUnprepareResourceResponse { error });
        }
        Ok(Response::new(NodeUnprepareResourcesResponse { claims }))
    }
}

/// Serves the kubelet plugin until the task is dropped or aborted (the
/// sockets go with it): `v1.DRAPlugin` and both health streams on the DRA
/// socket, through the shared skeleton
/// ([`steward_nodeio::kubelet_plugin::serve`]). Served from the agent's
/// start, before it holds the node's store: calls are served on the ledger
/// `core` reads once there is one, relayed to the agent before this one
/// until then ([`super::handover`]).
pub(crate) async fn serve<L: ClaimStore, C: ClaimStore>(
    core: CoreReader<L, C>,
    client: kube::Client,
    config: DraPluginConfig,
    readiness: steward_nodeio::Readiness,
) {
    readiness.not_ready(READINESS, "not registered with kubelet yet");
    let plugin = config.kubelet_plugin();
    let peers = Peers::new(&plugin.plugin_dir, &plugin.plugin_socket());
    for path in peers
        .remove_stale(&plugin.registry_dir, &plugin.driver)
        .await
    {
        tracing::info!(path = %path.display(), "removed a socket a stopped DRA plugin left");
    }
    let routes = || {
        let node = Node {
            core: core.clone(),
            peers: peers.clone(),
            hold: config.hold,
            client: client.clone(),
            op_timeout: config.op_timeout,
        };
        let health_v1 = super::health_wire::v1::Health {
            core: core.clone(),
            hold: config.hold,
            resend: config.health_resend,
        };
        let health_v1alpha1 = super::health_wire::v1alpha1::Health {
            core: core.clone(),
            hold: config.hold,
            resend: config.health_resend,
        };
        Routes::new(
            DraPluginServer::new(node)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
        )
        .add_service(health_v1::dra_resource_health_server::DraResourceHealthServer::new(health_v1))
        .add_service(
            health_v1alpha1::dra_resource_health_server::DraResourceHealthServer::new(
                health_v1alpha1,
            ),
        )
    };
    kubelet_plugin::serve(plugin, routes, readiness).await;
}

/// Once the slot ledger is up: calls are served on it ([`serve`]), and the
/// safety net ([`super::gc`]) runs beside it until the task is dropped.
pub(crate) async fn on_ledger<L: ClaimStore, C: ClaimStore>(
    core: Weak<SlotKeeper<L, C>>,
    slot: Arc<CoreSlot<L, C>>,
    client: kube::Client,
    config: DraPluginConfig,
) {
    slot.set(core.clone());
    super::gc::collect(core, client, config.gc_interval, config.op_timeout).await;
}
