//! A small scriptable device plugin, used to exercise the stand-in over the
//! real device plugin wire protocol.
//!
//! It serves `DevicePlugin` on `<plugin dir>/<endpoint>`, registers with
//! kubelet, streams its device list through ListAndWatch (every change the
//! test makes is pushed), records every Allocate / PreStartContainer /
//! GetPreferredAllocation call, and can be told to fail Allocate.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{Stream, StreamExt};
use steward_proto::deviceplugin::v1beta1::{
    AllocateRequest, AllocateResponse, CdiDevice, ContainerAllocateResponse,
    ContainerPreferredAllocationRequest, ContainerPreferredAllocationResponse, Device,
    DevicePluginOptions, DeviceSpec, Empty, HEALTHY, ListAndWatchResponse, Mount, NumaNode,
    PreStartContainerRequest, PreStartContainerResponse, PreferredAllocationRequest,
    PreferredAllocationResponse, RegisterRequest, TopologyInfo, UNHEALTHY, VERSION,
    device_plugin_server::{DevicePlugin, DevicePluginServer},
    registration_client::RegistrationClient,
};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::{UnixListenerStream, WatchStream};
use tonic::transport::Server;
use tonic::{Request, Response, Status};

use crate::endpoint::connect_unix;
use crate::error::Error;

pub mod dra;

/// Builds a device. `numa` lists NUMA node IDs (empty: no topology).
pub fn device(id: &str, healthy: bool, numa: &[i64]) -> Device {
    Device {
        id: id.to_string(),
        health: if healthy { HEALTHY } else { UNHEALTHY }.to_string(),
        topology: (!numa.is_empty()).then(|| TopologyInfo {
            nodes: numa.iter().map(|&id| NumaNode { id }).collect(),
        }),
    }
}

/// How the test plugin presents itself.
#[derive(Debug, Clone)]
pub struct TestPluginConfig {
    pub resource_name: String,
    /// Socket file name inside the plugin directory.
    pub endpoint: String,
    pub devices: Vec<Device>,
    pub options: DevicePluginOptions,
}

impl TestPluginConfig {
    /// A plugin for `resource_name` on `endpoint` with healthy devices
    /// `ids` and default options.
    pub fn new(resource_name: &str, endpoint: &str, ids: &[&str]) -> Self {
        TestPluginConfig {
            resource_name: resource_name.to_string(),
            endpoint: endpoint.to_string(),
            devices: ids.iter().map(|id| device(id, true, &[])).collect(),
            options: DevicePluginOptions::default(),
        }
    }
}

/// Everything the plugin was asked, in order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Calls {
    pub allocate: Vec<Vec<String>>,
    pub pre_start: Vec<Vec<String>>,
    pub preferred: Vec<ContainerPreferredAllocationRequest>,
    pub options: usize,
    pub list_and_watch: usize,
}

#[derive(Default)]
struct Behaviour {
    calls: Calls,
    fail_allocate: Option<String>,
    fail_pre_start: Option<String>,
    /// Fixed answer to GetPreferredAllocation; `None`: must-include devices
    /// then the available ones from the highest ID down.
    preferred: Option<Vec<String>>,
}

struct PluginShared {
    options: DevicePluginOptions,
    devices: watch::Sender<Vec<Device>>,
    behaviour: Mutex<Behaviour>,
    /// Number of ListAndWatch streams currently open.
    open_streams: watch::Sender<usize>,
    /// Bumped by `stop()`: every open ListAndWatch stream ends, like when a
    /// plugin process exits.
    stop_epoch: watch::Sender<u64>,
}

impl PluginShared {
    fn behaviour(&self) -> MutexGuard<'_, Behaviour> {
        self.behaviour.lock().unwrap_or_else(|p| p.into_inner())
    }
}

struct Service(Arc<PluginShared>);

/// A ListAndWatch stream that counts itself open until kubelet drops it.
pub struct TrackedStream {
    inner: Pin<Box<dyn Stream<Item = Vec<Device>> + Send>>,
    shared: Arc<PluginShared>,
}

impl Stream for TrackedStream {
    type Item = Result<ListAndWatchResponse, Status>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner
            .as_mut()
            .poll_next(cx)
            .map(|d| d.map(|devices| Ok(ListAndWatchResponse { devices })))
    }
}

impl Drop for TrackedStream {
    fn drop(&mut self) {
        self.shared
            .open_streams
            .send_modify(|n| *n = n.saturating_sub(1));
    }
}

fn response_for(ids: &[String]) -> ContainerAllocateResponse {
    let joined = ids.join(",");
    ContainerAllocateResponse {
        envs: [("TEST_DEVICES".to_string(), joined.clone())]
            .into_iter()
            .collect(),
        mounts: vec![Mount {
            container_path: "/var/run/test-device".to_string(),
            host_path: "/var/run/test-device".to_string(),
            read_only: true,
        }],
        devices: ids
            .iter()
            .map(|id| DeviceSpec {
                container_path: format!("/dev/test-{id}"),
                host_path: format!("/dev/test-{id}"),
                permissions: "rw".to_string(),
            })
            .collect(),
        annotations: [("test.example.com/devices".to_string(), joined)]
            .into_iter()
            .collect(),
        cdi_devices: ids
            .iter()
            .map(|id| CdiDevice {
                name: format!("example.com/test={id}"),
            })
            .collect(),
    }
}

#[tonic::async_trait]
impl DevicePlugin for Service {
    async fn get_device_plugin_options(
        &self,
        _request: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        self.0.behaviour().calls.options += 1;
        Ok(Response::new(self.0.options))
    }

    type ListAndWatchStream = TrackedStream;

    async fn list_and_watch(
        &self,
        _request: Request<Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        self.0.behaviour().calls.list_and_watch += 1;
        self.0.open_streams.send_modify(|n| *n += 1);
        let mut stop = self.0.stop_epoch.subscribe();
        stop.borrow_and_update();
        let inner = WatchStream::new(self.0.devices.subscribe()).take_until(async move {
            let _ = stop.changed().await;
        });
        Ok(Response::new(TrackedStream {
            inner: Box::pin(inner),
            shared: self.0.clone(),
        }))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        let req = request.into_inner();
        let mut b = self.0.behaviour();
        b.calls
            .preferred
            .extend(req.container_requests.iter().cloned());
        let container_responses = req
            .container_requests
            .iter()
            .map(|c| {
                let device_i_ds = match &b.preferred {
                    Some(fixed) => fixed.clone(),
                    None => {
                        let size = usize::try_from(c.allocation_size).unwrap_or(0);
                        let mut out = c.must_include_device_i_ds.clone();
                        let mut rest: Vec<&String> = c
                            .available_device_i_ds
                            .iter()
                            .filter(|d| !out.contains(d))
                            .collect();
                        rest.sort();
                        rest.reverse();
                        for d in rest {
                            if out.len() >= size {
                                break;
                            }
                            out.push(d.clone());
                        }
                        out
                    }
                };
                ContainerPreferredAllocationResponse { device_i_ds }
            })
            .collect();
        Ok(Response::new(PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        let req = request.into_inner();
        let mut b = self.0.behaviour();
        for c in &req.container_requests {
            b.calls.allocate.push(c.devices_ids.clone());
        }
        if let Some(msg) = &b.fail_allocate {
            return Err(Status::internal(msg.clone()));
        }
        let known: Vec<String> = self
            .0
            .devices
            .borrow()
            .iter()
            .map(|d| d.id.clone())
            .collect();
        if let Some(unknown) = req
            .container_requests
            .iter()
            .flat_map(|c| &c.devices_ids)
            .find(|id| !known.contains(id))
        {
            return Err(Status::invalid_argument(format!(
                "unknown device {unknown}"
            )));
        }
        let container_responses = req
            .container_requests
            .iter()
            .map(|c| response_for(&c.devices_ids))
            .collect();
        Ok(Response::new(AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        request: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        let req = request.into_inner();
        let mut b = self.0.behaviour();
        b.calls.pre_start.push(req.devices_ids);
        if let Some(msg) = &b.fail_pre_start {
            return Err(Status::internal(msg.clone()));
        }
        Ok(Response::new(PreStartContainerResponse {}))
    }
}

/// A running test device plugin.
pub struct TestPlugin {
    config: TestPluginConfig,
    socket: PathBuf,
    shared: Arc<PluginShared>,
    server: Option<(oneshot::Sender<()>, JoinHandle<()>)>,
}

impl TestPlugin {
    /// Binds `<plugin_dir>/<endpoint>` and serves DevicePlugin on it.
    pub async fn serve(plugin_dir: &Path, config: TestPluginConfig) -> Result<TestPlugin, Error> {
        let (devices, _) = watch::channel(config.devices.clone());
        let (open_streams, _) = watch::channel(0);
        let (stop_epoch, _) = watch::channel(0);
        let shared = Arc::new(PluginShared {
            options: config.options,
            devices,
            behaviour: Mutex::new(Behaviour::default()),
            open_streams,
            stop_epoch,
        });
        let mut plugin = TestPlugin {
            socket: plugin_dir.join(&config.endpoint),
            config,
            shared,
            server: None,
        };
        plugin.start_server()?;
        Ok(plugin)
    }

    fn start_server(&mut self) -> Result<(), Error> {
        match std::fs::remove_file(&self.socket) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(&self.socket, e)),
        }
        let listener =
            tokio::net::UnixListener::bind(&self.socket).map_err(|e| Error::io(&self.socket, e))?;
        let (tx, rx) = oneshot::channel::<()>();
        let server = Server::builder()
            .add_service(DevicePluginServer::new(Service(self.shared.clone())))
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                let _ = rx.await;
            });
        let task = tokio::spawn(async move {
            if let Err(e) = server.await {
                tracing::error!(error = %e, "test device plugin server failed");
            }
        });
        self.server = Some((tx, task));
        Ok(())
    }

    /// Stops serving (open ListAndWatch streams end).
    pub async fn stop(&mut self) {
        self.shared.stop_epoch.send_modify(|e| *e += 1);
        if let Some((tx, task)) = self.server.take() {
            let _ = tx.send(());
            let abort = task.abort_handle();
            if tokio::time::timeout(Duration::from_secs(2), task)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
    }

    /// Stops and serves again on a fresh socket, as a plugin does when it
    /// notices kubelet restarted.
    pub async fn restart(&mut self) -> Result<(), Error> {
        self.stop().await;
        self.start_server()
    }

    /// The plugin's socket path.
    pub fn socket_path(&self) -> &Path {
        &self.socket
    }

    /// Registers with kubelet using the plugin's own resource, endpoint and options.
    pub async fn register(&self, kubelet_socket: &Path) -> Result<(), Status> {
        self.register_with(
            kubelet_socket,
            RegisterRequest {
                version: VERSION.to_string(),
                endpoint: self.config.endpoint.clone(),
                resource_name: self.config.resource_name.clone(),
                options: Some(self.config.options),
            },
        )
        .await
    }

    /// Sends an arbitrary registration request.
    pub async fn register_with(
        &self,
        kubelet_socket: &Path,
        req: RegisterRequest,
    ) -> Result<(), Status> {
        register(kubelet_socket, req).await
    }

    /// Replaces the advertised device list (pushed on ListAndWatch).
    pub fn set_devices(&self, devices: Vec<Device>) {
        self.shared.devices.send_replace(devices);
    }

    /// Changes one device's health (pushed on ListAndWatch).
    pub fn set_health(&self, id: &str, healthy: bool) {
        self.shared.devices.send_modify(|devices| {
            for d in devices.iter_mut().filter(|d| d.id == id) {
                d.health = if healthy { HEALTHY } else { UNHEALTHY }.to_string();
            }
        });
    }

    /// Makes Allocate fail with this message (`None`: succeed again).
    pub fn fail_allocate(&self, message: Option<&str>) {
        self.shared.behaviour().fail_allocate = message.map(str::to_string);
    }

    /// Makes PreStartContainer fail with this message (`None`: succeed again).
    pub fn fail_pre_start(&self, message: Option<&str>) {
        self.shared.behaviour().fail_pre_start = message.map(str::to_string);
    }

    /// Fixes the GetPreferredAllocation answer (`None`: default policy).
    pub fn set_preferred(&self, ids: Option<Vec<String>>) {
        self.shared.behaviour().preferred = ids;
    }

    /// The calls received so far.
    pub fn calls(&self) -> Calls {
        self.shared.behaviour().calls.clone()
    }

    /// Number of ListAndWatch streams currently open.
    pub fn open_streams(&self) -> usize {
        *self.shared.open_streams.borrow()
    }

    /// Waits until exactly `n` ListAndWatch streams are open.
    pub async fn wait_for_open_streams(&self, n: usize, timeout: Duration) -> Result<(), Error> {
        let mut rx = self.shared.open_streams.subscribe();
        tokio::time::timeout(timeout, rx.wait_for(|open| *open == n))
            .await
            .map_err(|_| Error::Timeout(timeout, format!("{n} open ListAndWatch streams")))?
            .map_err(|_| Error::Plugin("plugin state dropped".to_string()))?;
        Ok(())
    }
}

impl Drop for TestPlugin {
    fn drop(&mut self) {
        if let Some((_, task)) = self.server.take() {
            task.abort();
        }
    }
}

/// Sends a registration request to kubelet's Registration service.
pub async fn register(kubelet_socket: &Path, req: RegisterRequest) -> Result<(), Status> {
    let channel = connect_unix(kubelet_socket)
        .await
        .map_err(|e| Status::unavailable(format!("cannot dial kubelet: {e}")))?;
    RegistrationClient::new(channel).register(req).await?;
    Ok(())
}
