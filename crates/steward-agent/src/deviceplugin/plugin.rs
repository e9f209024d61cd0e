//! One device plugin (v1beta1) per Instance: serves `DevicePlugin` on its
//! own socket in kubelet's plugin directory, registers with kubelet, and
//! registers again when kubelet restarts (its socket directory is wiped:
//! the plugin's socket disappears, `kubelet.sock` is re-created).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Weak;
use std::time::Duration;

use futures::{Stream, StreamExt};
use steward_proto::deviceplugin::v1beta1::{
    AllocateRequest, AllocateResponse, Device, DevicePluginOptions, Empty, ListAndWatchResponse,
    PreStartContainerRequest, PreStartContainerResponse, PreferredAllocationRequest,
    PreferredAllocationResponse, RegisterRequest, VERSION,
    device_plugin_server::{DevicePlugin, DevicePluginServer},
    registration_client::RegistrationClient,
};
use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::{UnixListenerStream, WatchStream};
use tonic::transport::Server;
use tonic::{Request, Response, Status};

use super::core::Core;
use super::podresources::connect_unix;
use crate::claims::ClaimStore;

/// The options every steward plugin advertises.
pub const OPTIONS: DevicePluginOptions = DevicePluginOptions {
    pre_start_required: false,
    get_preferred_allocation_available: true,
};

/// Aborts the task when dropped, so a killed agent leaves no server behind.
pub(crate) struct AbortOnDrop<T>(Option<JoinHandle<T>>);

impl<T> AbortOnDrop<T> {
    pub(crate) fn new(handle: JoinHandle<T>) -> Self {
        Self(Some(handle))
    }

    /// Waits up to `grace` for the task to end, then aborts it.
    pub(crate) async fn finish(mut self, grace: Duration) {
        if let Some(handle) = self.0.take() {
            let abort = handle.abort_handle();
            if tokio::time::timeout(grace, handle).await.is_err() {
                abort.abort();
            }
        }
    }
}

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        if let Some(handle) = &self.0 {
            handle.abort();
        }
    }
}

struct Service<L, C> {
    /// Weak: the agent owns the core; a server outliving it answers
    /// Unavailable instead of keeping its stores open.
    core: Weak<Core<L, C>>,
    instance: String,
    devices: watch::Receiver<Vec<Device>>,
    /// Ends this generation's ListAndWatch streams.
    stop: watch::Receiver<bool>,
}

impl<L, C> Service<L, C> {
    fn core(&self) -> Result<std::sync::Arc<Core<L, C>>, Status> {
        self.core
            .upgrade()
            .ok_or_else(|| Status::unavailable("steward agent is shutting down"))
    }
}

type DeviceStream = Pin<Box<dyn Stream<Item = Result<ListAndWatchResponse, Status>> + Send>>;

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
        let mut stop = self.stop.clone();
        let stream = WatchStream::new(self.devices.clone())
            .map(|devices| Ok(ListAndWatchResponse { devices }))
            .take_until(async move {
                let _ = stop.wait_for(|s| *s).await;
            });
        Ok(Response::new(Box::pin(stream)))
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
        core.allocate(request.get_ref()).await.map(Response::new)
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
}

impl PluginSite {
    fn kubelet_socket(&self) -> PathBuf {
        self.plugin_dir
            .join(steward_proto::deviceplugin::v1beta1::KUBELET_SOCKET)
    }
}

/// Identity of a socket file (inode, change time); `None` when absent.
fn identity(path: &Path) -> Option<(u64, i64, i64)> {
    std::fs::metadata(path)
        .ok()
        .map(|m| (m.ino(), m.ctime(), m.ctime_nsec()))
}

async fn register(site: &PluginSite, endpoint: &str, resource_name: &str) -> Result<(), String> {
    let channel = connect_unix(&site.kubelet_socket(), site.rpc_timeout)
        .await
        .map_err(|e| e.to_string())?;
    let mut client = RegistrationClient::new(channel);
    let request = RegisterRequest {
        version: VERSION.into(),
        endpoint: endpoint.into(),
        resource_name: resource_name.into(),
        options: Some(OPTIONS),
    };
    match tokio::time::timeout(site.rpc_timeout, client.register(request)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(status)) => Err(format!("kubelet refused: {}", status.message())),
        Err(_) => Err(format!("no answer within {:?}", site.rpc_timeout)),
    }
}

/// Why a generation of the server ended.
enum End {
    Stop,
    Restart(&'static str),
}

/// Serves the plugin of `instance` until `stop` turns true; re-binds and
/// re-registers whenever kubelet restarts.
pub(crate) async fn run<L: ClaimStore, C: ClaimStore>(
    core: Weak<Core<L, C>>,
    instance: String,
    resource_name: String,
    site: PluginSite,
    devices: watch::Receiver<Vec<Device>>,
    mut stop: watch::Receiver<bool>,
) {
    let endpoint = super::names::socket_name(&instance);
    let socket = site.plugin_dir.join(&endpoint);
    let mut backoff = site.poll;
    loop {
        if *stop.borrow() {
            break;
        }
        match std::fs::remove_file(&socket) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                tracing::warn!(path = %socket.display(), error = %e, "cannot remove stale plugin socket");
            }
            _ => {}
        }
        let listener = match UnixListener::bind(&socket) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(path = %socket.display(), error = %e, "cannot bind plugin socket; retrying");
                if wait_or_stop(&mut stop, backoff).await {
                    break;
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        let (gen_tx, gen_rx) = watch::channel(false);
        let service = Service {
            core: core.clone(),
            instance: instance.clone(),
            devices: devices.clone(),
            stop: gen_rx.clone(),
        };
        let mut shutdown = gen_rx.clone();
        let server = AbortOnDrop::new(tokio::spawn(async move {
            let served = Server::builder()
                .add_service(DevicePluginServer::new(service))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
                    let _ = shutdown.wait_for(|s| *s).await;
                })
                .await;
            if let Err(e) = served {
                tracing::error!(error = %e, "device plugin server failed");
            }
        }));
        let end = generation(
            &site,
            &instance,
            &endpoint,
            &resource_name,
            &socket,
            &core,
            &mut stop,
        )
        .await;
        if matches!(end, End::Stop) {
            // Socket first, then the streams: whoever sees ListAndWatch end
            // finds the plugin already gone from the directory.
            let _ = std::fs::remove_file(&socket);
        }
        let _ = gen_tx.send(true);
        server.finish(Duration::from_millis(500)).await;
        match end {
            End::Stop => break,
            End::Restart(why) => {
                tracing::info!(%instance, reason = why, "re-registering device plugin");
                backoff = site.poll;
            }
        }
    }
    let _ = std::fs::remove_file(&socket);
    tracing::info!(%instance, "device plugin stopped");
}

/// Returns true when stopped during the wait.
async fn wait_or_stop(stop: &mut watch::Receiver<bool>, d: Duration) -> bool {
    let stopped = tokio::select! {
        // An error means the sender is gone: stop as well.
        _ = stop.wait_for(|s| *s) => true,
        () = tokio::time::sleep(d) => false,
    };
    stopped || *stop.borrow()
}

/// One registration: register (retrying) then watch for kubelet restarts.
async fn generation<L: ClaimStore, C: ClaimStore>(
    site: &PluginSite,
    instance: &str,
    endpoint: &str,
    resource_name: &str,
    socket: &Path,
    core: &Weak<Core<L, C>>,
    stop: &mut watch::Receiver<bool>,
) -> End {
    let mut backoff = site.poll;
    let kubelet_id = loop {
        let before = identity(&site.kubelet_socket());
        match register(site, endpoint, resource_name).await {
            Ok(()) => {
                tracing::info!(%instance, resource = %resource_name, "device plugin registered with kubelet");
                if let Some(core) = core.upgrade() {
                    core.metrics.registrations.inc();
                }
                break before;
            }
            Err(e) => {
                tracing::warn!(%instance, resource = %resource_name, error = %e, "registration with kubelet failed; retrying");
                if wait_or_stop(stop, backoff).await {
                    return End::Stop;
                }
                backoff = (backoff * 2).min(Duration::from_secs(2));
                if identity(socket).is_none() {
                    return End::Restart("plugin socket removed before registration");
                }
            }
        }
    };
    loop {
        if wait_or_stop(stop, site.poll).await {
            return End::Stop;
        }
        if identity(socket).is_none() {
            return End::Restart("plugin socket removed (kubelet restarted)");
        }
        let now = identity(&site.kubelet_socket());
        if now.is_some() && now != kubelet_id {
            return End::Restart("kubelet.sock re-created (kubelet restarted)");
        }
    }
}
