//! A scriptable DRA driver kubelet plugin, to exercise the stand-in's
//! plugin watcher and DRA manager over the real wire protocols: it serves
//! `k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin` on
//! `<plugins dir>/<driver>/dra.sock` and then `pluginregistration.Registration`
//! on `<plugins_registry>/<driver>-reg.sock` (the order of the upstream
//! kubelet plugin helper), and records every call.
//!
//! `NodePrepareResources` answers, per claim: a scripted error
//! ([`TestDraPlugin::fail_claim`]), else scripted devices
//! ([`TestDraPlugin::set_devices`]), else — with an API client — the
//! claim's allocation results for this driver, each device with the CDI ID
//! `<driver>/test=<device>`, else one device named after the claim.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use steward_proto::dra::v1::dra_plugin_server::{DraPlugin, DraPluginServer};
use steward_proto::dra::v1::{
    Claim, Device, NodePrepareResourceResponse, NodePrepareResourcesRequest,
    NodePrepareResourcesResponse, NodeUnprepareResourceResponse, NodeUnprepareResourcesRequest,
    NodeUnprepareResourcesResponse, PLUGIN_TYPE, SERVICE_VERSION,
};
use steward_proto::pluginregistration::v1::registration_server::{
    Registration, RegistrationServer,
};
use steward_proto::pluginregistration::v1::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Server;
use tonic::{Request, Response, Status};

use crate::error::Error;

/// How the test DRA plugin presents itself.
#[derive(Clone)]
pub struct TestDraPluginConfig {
    /// DRA driver name (`PluginInfo.name`).
    pub driver: String,
    /// `PluginInfo.type` (`DRAPlugin`).
    pub plugin_type: String,
    /// `PluginInfo.supported_versions` (`["v1.DRAPlugin"]`).
    pub supported_versions: Vec<String>,
    /// `PluginInfo.endpoint`; `None`: the plugin's DRA socket.
    pub advertised_endpoint: Option<String>,
    /// File name of the registration socket (`<driver>-reg.sock`).
    pub registration_name: String,
    /// File name of the DRA socket in `<plugins dir>/<driver>/` (`dra.sock`).
    pub socket_name: String,
    /// Where claims are read from to answer `NodePrepareResources`.
    pub api: Option<kube::Client>,
}

impl TestDraPluginConfig {
    /// A well-behaved plugin for `driver`.
    pub fn new(driver: &str) -> Self {
        TestDraPluginConfig {
            driver: driver.to_string(),
            plugin_type: PLUGIN_TYPE.to_string(),
            supported_versions: vec![SERVICE_VERSION.to_string()],
            advertised_endpoint: None,
            registration_name: format!("{driver}-reg.sock"),
            socket_name: "dra.sock".to_string(),
            api: None,
        }
    }

    /// Reads claims from this API server.
    pub fn api(mut self, client: kube::Client) -> Self {
        self.api = Some(client);
        self
    }

    /// Reports another plugin type.
    pub fn plugin_type(mut self, t: &str) -> Self {
        self.plugin_type = t.to_string();
        self
    }

    /// Reports other supported versions.
    pub fn supported_versions(mut self, versions: &[&str]) -> Self {
        self.supported_versions = versions.iter().map(|v| v.to_string()).collect();
        self
    }

    /// Uses another registration socket name.
    pub fn registration_name(mut self, name: &str) -> Self {
        self.registration_name = name.to_string();
        self
    }

    /// Uses another DRA socket name (a second instance of one driver).
    pub fn socket_name(mut self, name: &str) -> Self {
        self.socket_name = name.to_string();
        self
    }

    /// Advertises this endpoint in `GetInfo` instead of the DRA socket.
    pub fn advertised_endpoint(mut self, endpoint: &str) -> Self {
        self.advertised_endpoint = Some(endpoint.to_string());
        self
    }
}

/// Everything the plugin was asked, in order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DraCalls {
    pub get_info: usize,
    pub notifications: Vec<RegistrationStatus>,
    pub prepare: Vec<Vec<Claim>>,
    pub unprepare: Vec<Vec<Claim>>,
}

#[derive(Default)]
struct Behaviour {
    calls: DraCalls,
    /// claim name → per-claim error of NodePrepareResources.
    fail_claims: BTreeMap<String, String>,
    /// claim name → per-claim error of NodeUnprepareResources.
    fail_unprepare: BTreeMap<String, String>,
    /// gRPC error of NodePrepareResources.
    fail_prepare: Option<String>,
    /// claim name → scripted devices.
    devices: BTreeMap<String, Vec<Device>>,
    /// UIDs of claims prepared and not unprepared since.
    prepared: BTreeSet<String>,
}

struct Inner {
    config: TestDraPluginConfig,
    endpoint: PathBuf,
    behaviour: Mutex<Behaviour>,
    changes: watch::Sender<u64>,
}

impl Inner {
    fn behaviour(&self) -> MutexGuard<'_, Behaviour> {
        self.behaviour.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn changed(&self) {
        self.changes.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// The answer for one claim without a scripted one.
    async fn default_answer(&self, claim: &Claim) -> NodePrepareResourceResponse {
        let driver = &self.config.driver;
        let cdi = |device: &str| format!("{driver}/test={device}");
        let Some(api) = &self.config.api else {
            return NodePrepareResourceResponse {
                devices: vec![Device {
                    request_names: vec![],
                    pool_name: "pool".to_string(),
                    device_name: claim.name.clone(),
                    cdi_device_ids: vec![cdi(&claim.name)],
                    share_id: None,
                }],
                error: String::new(),
            };
        };
        let fail = |error: String| NodePrepareResourceResponse {
            devices: vec![],
            error,
        };
        let claims: Api<ResourceClaim> = Api::namespaced(api.clone(), &claim.namespace);
        let object = match claims.get(&claim.name).await {
            Ok(o) => o,
            Err(e) => return fail(format!("reading ResourceClaim: {e}")),
        };
        if object.metadata.uid.as_deref() != Some(claim.uid.as_str()) {
            return fail(format!("ResourceClaim {} has another UID", claim.name));
        }
        let Some(results) = object
            .status
            .and_then(|s| s.allocation)
            .and_then(|a| a.devices)
            .and_then(|d| d.results)
        else {
            return fail(format!("ResourceClaim {} is not allocated", claim.name));
        };
        let devices = results
            .into_iter()
            .filter(|r| &r.driver == driver)
            .map(|r| Device {
                cdi_device_ids: vec![cdi(&r.device)],
                request_names: vec![r.request],
                pool_name: r.pool,
                device_name: r.device,
                share_id: r.share_id,
            })
            .collect();
        NodePrepareResourceResponse {
            devices,
            error: String::new(),
        }
    }
}

struct RegistrationService(Arc<Inner>);

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        self.0.behaviour().calls.get_info += 1;
        self.0.changed();
        let c = &self.0.config;
        Ok(Response::new(PluginInfo {
            r#type: c.plugin_type.clone(),
            name: c.driver.clone(),
            endpoint: c
                .advertised_endpoint
                .clone()
                .unwrap_or_else(|| self.0.endpoint.to_string_lossy().into_owned()),
            supported_versions: c.supported_versions.clone(),
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        self.0
            .behaviour()
            .calls
            .notifications
            .push(request.into_inner());
        self.0.changed();
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

struct DraService(Arc<Inner>);

#[tonic::async_trait]
impl DraPlugin for DraService {
    async fn node_prepare_resources(
        &self,
        request: Request<NodePrepareResourcesRequest>,
    ) -> Result<Response<NodePrepareResourcesResponse>, Status> {
        let claims = request.into_inner().claims;
        let (fail, scripted) = {
            let mut b = self.0.behaviour();
            b.calls.prepare.push(claims.clone());
            (
                b.fail_prepare.clone(),
                (b.fail_claims.clone(), b.devices.clone()),
            )
        };
        self.0.changed();
        if let Some(message) = fail {
            return Err(Status::internal(message));
        }
        let (errors, devices) = scripted;
        let mut out = std::collections::HashMap::new();
        for claim in &claims {
            let answer = if let Some(error) = errors.get(&claim.name) {
                NodePrepareResourceResponse {
                    devices: vec![],
                    error: error.clone(),
                }
            } else if let Some(devices) = devices.get(&claim.name) {
                NodePrepareResourceResponse {
                    devices: devices.clone(),
                    error: String::new(),
                }
            } else {
                self.0.default_answer(claim).await
            };
            if answer.error.is_empty() {
                self.0.behaviour().prepared.insert(claim.uid.clone());
            }
            out.insert(claim.uid.clone(), answer);
        }
        self.0.changed();
        Ok(Response::new(NodePrepareResourcesResponse { claims: out }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<NodeUnprepareResourcesRequest>,
    ) -> Result<Response<NodeUnprepareResourcesResponse>, Status> {
        let claims = request.into_inner().claims;
        let mut b = self.0.behaviour();
        b.calls.unprepare.push(claims.clone());
        let mut out = std::collections::HashMap::new();
        for claim in &claims {
            let error = b
                .fail_unprepare
                .get(&claim.name)
                .cloned()
                .unwrap_or_default();
            if error.is_empty() {
                b.prepared.remove(&claim.uid);
            }
            out.insert(claim.uid.clone(), NodeUnprepareResourceResponse { error });
        }
        drop(b);
        self.0.changed();
        Ok(Response::new(NodeUnprepareResourcesResponse {
            claims: out,
        }))
    }
}

/// A running test DRA plugin.
pub struct TestDraPlugin {
    inner: Arc<Inner>,
    registration_socket: PathBuf,
    servers: Vec<(oneshot::Sender<()>, JoinHandle<()>)>,
}

fn bind(path: &Path) -> Result<tokio::net::UnixListener, Error> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io(path, e)),
    }
    tokio::net::UnixListener::bind(path).map_err(|e| Error::io(path, e))
}

fn spawn(
    listener: tokio::net::UnixListener,
    router: tonic::transport::server::Router,
) -> (oneshot::Sender<()>, JoinHandle<()>) {
    let (tx, rx) = oneshot::channel::<()>();
    let server = router.serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
        let _ = rx.await;
    });
    let task = tokio::spawn(async move {
        if let Err(e) = server.await {
            tracing::error!(error = %e, "test DRA plugin server failed");
        }
    });
    (tx, task)
}

impl TestDraPlugin {
    /// Serves the DRA service on `<plugins_dir>/<driver>/dra.sock`, then the
    /// registration service on `<registry_dir>/<registration_name>`.
    pub async fn serve(
        registry_dir: &Path,
        plugins_dir: &Path,
        config: TestDraPluginConfig,
    ) -> Result<TestDraPlugin, Error> {
        let own_dir = plugins_dir.join(&config.driver);
        std::fs::create_dir_all(&own_dir).map_err(|e| Error::io(&own_dir, e))?;
        let endpoint = own_dir.join(&config.socket_name);
        let registration_socket = registry_dir.join(&config.registration_name);
        let (changes, _) = watch::channel(0);
        let inner = Arc::new(Inner {
            config,
            endpoint: endpoint.clone(),
            behaviour: Mutex::new(Behaviour::default()),
            changes,
        });
        let dra = spawn(
            bind(&endpoint)?,
            Server::builder().add_service(DraPluginServer::new(DraService(inner.clone()))),
        );
        let reg = spawn(
            bind(&registration_socket)?,
            Server::builder()
                .add_service(RegistrationServer::new(RegistrationService(inner.clone()))),
        );
        Ok(TestDraPlugin {
            inner,
            registration_socket,
            servers: vec![dra, reg],
        })
    }

    /// The registration socket in `plugins_registry`.
    pub fn registration_socket(&self) -> &Path {
        &self.registration_socket
    }

    /// The DRA service socket.
    pub fn endpoint(&self) -> &Path {
        &self.inner.endpoint
    }

    /// The calls received so far.
    pub fn calls(&self) -> DraCalls {
        self.inner.behaviour().calls.clone()
    }

    /// UIDs of the claims prepared and not unprepared since.
    pub fn prepared(&self) -> BTreeSet<String> {
        self.inner.behaviour().prepared.clone()
    }

    /// Makes NodePrepareResources answer this error for claim `name`
    /// (`None`: succeed again).
    pub fn fail_claim(&self, name: &str, error: Option<&str>) {
        let mut b = self.inner.behaviour();
        match error {
            Some(e) => b.fail_claims.insert(name.to_string(), e.to_string()),
            None => b.fail_claims.remove(name),
        };
    }

    /// Makes NodeUnprepareResources answer this error for claim `name`
    /// (`None`: succeed again).
    pub fn fail_unprepare_claim(&self, name: &str, error: Option<&str>) {
        let mut b = self.inner.behaviour();
        match error {
            Some(e) => b.fail_unprepare.insert(name.to_string(), e.to_string()),
            None => b.fail_unprepare.remove(name),
        };
    }

    /// Makes NodePrepareResources fail as a whole (gRPC `Internal`).
    pub fn fail_prepare(&self, message: Option<&str>) {
        self.inner.behaviour().fail_prepare = message.map(str::to_string);
    }

    /// Answers NodePrepareResources for claim `name` with these devices.
    pub fn set_devices(&self, name: &str, devices: Vec<Device>) {
        self.inner
            .behaviour()
            .devices
            .insert(name.to_string(), devices);
    }

    /// Waits until at least `n` registration statuses were received; returns
    /// them all.
    pub async fn wait_for_notifications(
        &self,
        n: usize,
        timeout: Duration,
    ) -> Result<Vec<RegistrationStatus>, Error> {
        let mut rx = self.inner.changes.subscribe();
        let got = tokio::time::timeout(
            timeout,
            rx.wait_for(|_| self.inner.behaviour().calls.notifications.len() >= n),
        )
        .await;
        match got {
            Ok(Ok(_)) => Ok(self.calls().notifications),
            Ok(Err(_)) => Err(Error::Plugin("plugin state dropped".to_string())),
            Err(_) => Err(Error::Timeout(
                timeout,
                format!(
                    "{n} registration statuses; got {:?}",
                    self.calls().notifications
                ),
            )),
        }
    }

    /// Stops serving and removes both sockets (kubelet deregisters the plugin).
    pub async fn stop(&mut self) {
        for (tx, task) in self.servers.drain(..) {
            let _ = tx.send(());
            let abort = task.abort_handle();
            if tokio::time::timeout(Duration::from_secs(2), task)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
        for p in [&self.registration_socket, &self.inner.endpoint] {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Drop for TestDraPlugin {
    fn drop(&mut self) {
        for (_, task) in self.servers.drain(..) {
            task.abort();
        }
    }
}
