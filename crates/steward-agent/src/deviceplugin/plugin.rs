//! One device plugin (v1beta1) per Instance: serves `DevicePlugin` on its
//! own socket in kubelet's plugin directory, registers with kubelet, and
//! registers again when kubelet restarts (its socket directory is wiped:
//! the plugin's socket disappears, `kubelet.sock` is re-created).

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Weak;
use std::time::Duration;

use futures::Stream;
use steward_nodeio::backoff::Backoff;
use steward_nodeio::{AuthorityMode, BindOptions, FileIdentity, SocketGuard, UnixIncoming};
use steward_proto::deviceplugin::v1beta1::{
    AllocateRequest, AllocateResponse, Device, DevicePluginOptions, Empty, ListAndWatchResponse,
    PreStartContainerRequest, PreStartContainerResponse, PreferredAllocationRequest,
    PreferredAllocationResponse, RegisterRequest, VERSION,
    device_plugin_server::{DevicePlugin, DevicePluginServer},
    registration_client::RegistrationClient,
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tonic::transport::Server;
use tonic::{Request, Response, Status};

use super::kubelet_socket::KubeletSocket;
use super::podresources::connect_unix;
use super::serving::{Serving, ServingBoard};
use crate::claims::ClaimStore;
use crate::slot_keeper::SlotKeeper;

/// The options every steward plugin advertises.
pub const OPTIONS: DevicePluginOptions = DevicePluginOptions {
    pre_start_required: false,
    get_preferred_allocation_available: true,
};

/// Largest device-plugin message decoded or encoded: gRPC's default
/// (4 MiB), what kubelet's client uses, set explicitly.
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// Mode of a plugin's socket: only kubelet (root) connects.
const SOCKET_MODE: u32 = 0o600;
/// Longest pause between two attempts to bind the plugin socket.
const MAX_BIND_BACKOFF: Duration = Duration::from_secs(5);
/// A registered plugin checks its own socket every this many polls when
/// kubelet.sock has not changed (kubelet's restarts are published by the
/// node's one watcher of kubelet.sock at once).
const OWN_SOCKET_CHECK_POLLS: u32 = 50;
/// Longest pause between two registration attempts.
const MAX_REGISTER_BACKOFF: Duration = Duration::from_secs(2);

/// Waits up to `grace` for `task` to end, then aborts it (dropping the
/// handle aborts; a killed agent leaves no server behind).
pub(crate) async fn finish_task<T>(mut task: AbortOnDropHandle<T>, grace: Duration) {
    if tokio::time::timeout(grace, &mut task).await.is_err() {
        task.abort();
    }
}

struct Service<L, C> {
    /// Weak: the agent owns the core; a server outliving it answers
    /// Unavailable instead of keeping its stores open.
    core: Weak<SlotKeeper<L, C>>,
    instance: String,
    devices: watch::Receiver<Vec<Device>>,
    /// Ends this generation's ListAndWatch streams.
    stop: CancellationToken,
}

impl<L, C> Service<L, C> {
    fn core(&self) -> Result<std::sync::Arc<SlotKeeper<L, C>>, Status> {
        self.core
            .upgrade()
            .ok_or_else(|| Status::unavailable("steward agent is shutting down"))
    }
}

type DeviceStream = Pin<Box<dyn Stream<Item = Result<ListAndWatchResponse, Status>> + Send>>;

/// The ListAndWatch stream: the current list, then every change. It ends
/// when the plugin stops (restart, shutdown), or when the Instance's channel
/// is closed (the Instance left this node) after its last list, the
/// all-Unhealthy one, has been sent.
fn device_updates(
    rx: watch::Receiver<Vec<Device>>,
    stop: CancellationToken,
) -> impl Stream<Item = Result<ListAndWatchResponse, Status>> + Send {
    futures::stream::unfold((rx, stop, true), |(mut rx, stop, first)| async move {
        if !first {
            tokio::select! {
                biased;
                () = stop.cancelled() => {
                    // A restart or shutdown (channel still open) ends at
                    // once; a removal closed the channel first, and its
                    // last list, if not yet sent, still goes out.
                    if rx.has_changed().is_ok() {
                        return None;
                    }
                    rx.changed().await.ok()?;
                }
                changed = rx.changed() => changed.ok()?,
            }
        }
        let devices = rx.borrow_and_update().clone();
        Some((Ok(ListAndWatchResponse { devices }), (rx, stop, false)))
    })
}

#[tonic::async_trait]
impl<L: ClaimStore, C: ClaimStore> DevicePlugin for Service<L, C> {
    async fn get_device_plugin_options(
        &self,
        _request: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(OPTIONS))
    }

    type ListAndWatchStream = DeviceStream;

    async fn list_and_watch(
        &self,
        _request: Request<Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        tracing::debug!(instance = %self.instance, "ListAndWatch opened");
        Ok(Response::new(Box::pin(device_updates(
            self.devices.clone(),
            self.stop.clone(),
        ))))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        let core = self.core()?;
        Ok(Response::new(core.preferred(request.get_ref()).await))
    }

    async fn allocate(
        &self,
        request: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        let core = self.core()?;
        core.allocate(&self.instance, request.get_ref())
            .await
            .map(Response::new)
    }

    async fn pre_start_container(
        &self,
        _request: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        Ok(Response::new(PreStartContainerResponse {}))
    }
}

/// Where a plugin lives and how it watches kubelet.
#[derive(Debug, Clone)]
pub(crate) struct PluginSite {
    pub plugin_dir: PathBuf,
    pub poll: Duration,
    pub rpc_timeout: Duration,
    /// `device-plugin/<instance>` holds while kubelet has it registered.
    pub readiness: steward_nodeio::Readiness,
    /// The same, for the Instances' status.
    pub serving: ServingBoard,
    /// kubelet's registration socket, as one watcher last saw it.
    pub kubelet: KubeletSocket,
}

impl PluginSite {
    /// Where kubelet's registration socket is.
    pub(crate) fn kubelet_socket_of(plugin_dir: &std::path::Path) -> PathBuf {
        plugin_dir.join(steward_proto::deviceplugin::v1beta1::KUBELET_SOCKET)
    }

    fn kubelet_socket(&self) -> PathBuf {
        Self::kubelet_socket_of(&self.plugin_dir)
    }
}

/// Why registering with kubelet failed.
#[derive(Debug, thiserror::Error)]
enum RegisterError {
    /// kubelet's registration socket could not be dialled.
    #[error("dialling kubelet: {0}")]
    Dial(#[from] super::podresources::KubeletError),
    /// kubelet answered with an error.
    #[error("kubelet refused: {}", .0.message())]
    Refused(#[source] Box<tonic::Status>),
    /// kubelet did not answer in time.
    #[error("no answer within {0:?}")]
    Timeout(std::time::Duration),
}

async fn register(
    site: &PluginSite,
    endpoint: &str,
    resource_name: &str,
) -> Result<(), RegisterError> {
    let channel = connect_unix(&site.kubelet_socket(), site.rpc_timeout).await?;
    let mut client = RegistrationClient::new(channel);
    let request = RegisterRequest {
        version: VERSION.into(),
        endpoint: endpoint.into(),
        resource_name: resource_name.into(),
        options: Some(OPTIONS),
    };
    match tokio::time::timeout(site.rpc_timeout, client.register(request)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(status)) => Err(RegisterError::Refused(Box::new(status))),
        Err(_) => Err(RegisterError::Timeout(site.rpc_timeout)),
    }
}

/// The readiness condition of one Instance's plugin.
pub(crate) fn readiness_name(instance: &str) -> String {
    format!("device-plugin/{instance}")
}

/// Serves Instance `instance` through DRA only, until `stop`: no socket,
/// no registration with kubelet (the node offers `steward.dev/<instance>`
/// through its ResourceSlices, never twice); the Instance status says so.
pub(crate) async fn through_dra(
    namespace: String,
    instance: String,
    site: PluginSite,
    stop: CancellationToken,
) {
    tracing::info!(%instance, "served through DRA on this node; no device plugin registered");
    site.serving
        .report(&namespace, &instance, Serving::ThroughDra);
    stop.cancelled().await;
}

/// Why a generation of the server ended.
enum End {
    Stop,
    Restart(&'static str),
}

/// Serves the plugin of `instance` until `stop` is cancelled; re-binds and
/// re-registers whenever kubelet restarts.
pub(crate) async fn run<L: ClaimStore, C: ClaimStore>(
    core: Weak<SlotKeeper<L, C>>,
    namespace: String,
    instance: String,
    resource_name: String,
    site: PluginSite,
    devices: watch::Receiver<Vec<Device>>,
    stop: CancellationToken,
) {
    let endpoint = crate::slot_keeper::socket_name(&instance);
    let socket = site.plugin_dir.join(&endpoint);
    let mut backoff = Backoff::doubling(site.poll, MAX_BIND_BACKOFF);
    loop {
        if stop.is_cancelled() {
            break;
        }
        let (listener, mut guard) = match steward_nodeio::bind(
            &socket,
            BindOptions::mode(SOCKET_MODE),
        ) {
            Ok(bound) => bound,
            Err(e) => {
                tracing::warn!(path = %socket.display(), error = %e, "cannot bind plugin socket; retrying");
                if wait_or_stop(&stop, backoff.next_delay()).await {
                    break;
                }
                continue;
            }
        };
        // Not a child of `stop`: on stop the socket goes first, the streams after.
        let generation_stop = CancellationToken::new();
        // Ends the streams also when this task is aborted (their connections
        // are tasks of their own).
        let _generation_on_drop = generation_stop.clone().drop_guard();
        let service = Service {
            core: core.clone(),
            instance: instance.clone(),
            devices: devices.clone(),
            stop: generation_stop.clone(),
        };
        let shutdown = generation_stop.clone().cancelled_owned();
        let server = AbortOnDropHandle::new(tokio::spawn(async move {
            let served = Server::builder()
                .add_service(
                    DevicePluginServer::new(service)
                        .max_decoding_message_size(MAX_MESSAGE_BYTES)
                        .max_encoding_message_size(MAX_MESSAGE_BYTES),
                )
                .serve_with_incoming_shutdown(
                    UnixIncoming::new(listener, AuthorityMode::AsSent),
                    shutdown,
                )
                .await;
            if let Err(e) = served {
                tracing::error!(error = %e, "device plugin server failed");
            }
        }));
        let end = generation(
            &site,
            (&namespace, &instance),
            &endpoint,
            &resource_name,
            &guard,
            &core,
            &stop,
        )
        .await;
        if matches!(end, End::Stop) {
            // Socket first, then the streams: whoever sees ListAndWatch end
            // finds the plugin already gone from the directory.
            guard.remove();
        }
        generation_stop.cancel();
        finish_task(server, Duration::from_millis(500)).await;
        // Removes the socket if it is still ours (kubelet.sock re-created).
        drop(guard);
        match end {
            End::Stop => break,
            End::Restart(why) => {
                tracing::info!(%instance, reason = why, "re-registering device plugin");
                backoff.reset();
            }
        }
    }
    tracing::info!(%instance, "device plugin stopped");
}

/// Counts one plugin registered with kubelet while it lives.
struct Registered(prometheus_client::metrics::gauge::Gauge);

impl Registered {
    fn new(gauge: prometheus_client::metrics::gauge::Gauge) -> Self {
        gauge.inc();
        Self(gauge)
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Returns true when stopped during the wait.
async fn wait_or_stop(stop: &CancellationToken, d: Duration) -> bool {
    tokio::select! {
        () = stop.cancelled() => true,
        () = tokio::time::sleep(d) => stop.is_cancelled(),
    }
}

/// One registration: register (retrying) then watch for kubelet restarts.
async fn generation<L: ClaimStore, C: ClaimStore>(
    site: &PluginSite,
    (namespace, instance): (&str, &str),
    endpoint: &str,
    resource_name: &str,
    socket: &SocketGuard,
    core: &Weak<SlotKeeper<L, C>>,
    stop: &CancellationToken,
) -> End {
    let mut backoff = Backoff::doubling(site.poll, MAX_REGISTER_BACKOFF);
    let condition = readiness_name(instance);
    let mut kubelet = site.kubelet.clone();
    // The Instance's status, and the log, hear only what changed: while
    // kubelet is away every attempt fails the same way, and a thousand
    // plugins repeating it would cost the status writer a read of each
    // Instance, and the log a line, every attempt. Nothing is reported
    // before the first outcome (until then the status says this node has
    // no device plugin yet).
    let mut reported: Option<String> = None;
    let mut not_ready = |why: String| {
        site.readiness.not_ready(&condition, why.clone());
        if reported.as_ref() != Some(&why) {
            tracing::warn!(%instance, resource = %resource_name, error = %why, "registration with kubelet failed; retrying");
            reported = Some(why.clone());
            site.serving
                .report(namespace, instance, Serving::NotRegistered(why));
        }
    };
    site.readiness
        .not_ready(&condition, "not registered with kubelet yet".to_owned());
    // `registered` counts this plugin in steward_deviceplugin_plugins_registered
    // until the generation ends.
    let (kubelet_id, _registered) = loop {
        // The watcher may be one poll behind: a fresh stat decides, the
        // watcher only wakes a plugin that waits for the socket. The
        // identity kept is the one seen just before registering, so a
        // kubelet restart is never counted twice (a second re-registration
        // would take the plugin away from kubelet for a moment).
        kubelet.borrow_and_update();
        let before = FileIdentity::of(&site.kubelet_socket());
        if before.is_none() {
            not_ready(format!(
                "registration with kubelet failed: {} is not there (kubelet not running?)",
                site.kubelet_socket().display()
            ));
            // One watcher looks for the socket on behalf of every plugin.
            tokio::select! {
                () = stop.cancelled() => return End::Stop,
                changed = kubelet.changed() => {
                    if changed.is_err() && wait_or_stop(stop, site.poll).await {
                        return End::Stop;
                    }
                }
            }
            if !socket.is_in_place() {
                return End::Restart("plugin socket removed before registration");
            }
            continue;
        }
        match register(site, endpoint, resource_name).await {
            Ok(()) => {
                tracing::info!(%instance, resource = %resource_name, "device plugin registered with kubelet");
                site.readiness.ready(&condition);
                site.serving
                    .report(namespace, instance, Serving::Registered);
                let registered = core.upgrade().map(|core| {
                    core.metrics.registrations.inc();
                    Registered::new(core.metrics.registered.clone())
                });
                break (before, registered);
            }
            Err(e) => {
                not_ready(format!("registration with kubelet failed: {e}"));
                if wait_or_stop(stop, backoff.next_delay()).await {
                    return End::Stop;
                }
                if !socket.is_in_place() {
                    return End::Restart("plugin socket removed before registration");
                }
            }
        }
    };
    // Registered: kubelet restarting re-creates kubelet.sock, which the
    // one watcher of the node publishes; only then does a plugin look (a
    // fresh stat of both sockets). A thousand plugins do not poll. A plugin
    // socket removed by anything else is noticed at the next slow check.
    let own_check = site.poll.saturating_mul(OWN_SOCKET_CHECK_POLLS);
    loop {
        tokio::select! {
            () = stop.cancelled() => return End::Stop,
            changed = kubelet.changed() => {
                if changed.is_err() && wait_or_stop(stop, site.poll).await {
                    return End::Stop;
                }
            }
            () = tokio::time::sleep(own_check) => {}
        }
        if !socket.is_in_place() {
            return End::Restart("plugin socket removed (kubelet restarted)");
        }
        let now = FileIdentity::of(&site.kubelet_socket());
        if now.is_some() && now != kubelet_id {
            return End::Restart("kubelet.sock re-created (kubelet restarted)");
        }
    }
}
