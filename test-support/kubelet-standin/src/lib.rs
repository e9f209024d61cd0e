//! Test support: a kubelet stand-in (device manager, checkpoint, podresources v1).
//!
//! kubelet cannot run in the test environment, so steward's device plugins
//! are verified against this stand-in, which speaks the real device plugin
//! `v1beta1` protocol (Registration server, DevicePlugin client) and serves
//! the real podresources `v1` API, both over unix sockets. It is modelled on
//! kubelet's devicemanager: an endpoint per registered plugin
//! (`endpoint` module), the allocation bookkeeping and device selection
//! (`manager` module), and the checkpoint ([`checkpoint`] module).
//!
//! Pods are handed to it by the test ([`Kubelet::add_pod`]) and admitted
//! container by container like kubelet does. Their lifecycle is driven by the
//! test ([`Kubelet::terminate_pod`], [`Kubelet::delete_pod`]). When an API
//! client is configured, pods and the node are mirrored into the API server.
//!
//! DRA: a plugin watcher (`plugins` module) registers DRA drivers from
//! `<root>/plugins_registry`, and the DRA manager (`dra` module) prepares
//! and unprepares pods' ResourceClaims over the `v1.DRAPlugin` service;
//! [`cdi`] resolves the CDI device IDs it hands out for runtimes without CDI.

mod admission;
pub mod cdi;
pub mod checkpoint;
mod dra;
mod dra_api;
mod dra_state;
mod endpoint;
mod error;
mod manager;
mod mirror;
mod names;
mod plugin_registry;
mod plugins;
mod podresources;
mod pods;
mod registration;
mod shared;
#[cfg(feature = "test-plugin")]
pub mod testing;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use steward_proto::deviceplugin::v1beta1::registration_server::RegistrationServer;
use steward_proto::podresources::v1::pod_resources_lister_server::PodResourcesListerServer;
use tokio::net::UnixListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Server;
use tracing::{error, info, warn};

pub use admission::{AdmittedPod, CREATE_CONTAINER_CONFIG_ERROR, UNEXPECTED_ADMISSION_ERROR};
pub use dra::FAILED_PREPARE_DYNAMIC_RESOURCES;
pub use dra_state::{ClaimInfo, DRA_CHECKPOINT_FILE, DriverState, PreparedDevice};
pub use endpoint::connect_unix;
pub use error::{Error, go_status_text};
pub use manager::{ContainerDevices, ResourceState};
pub use names::is_extended_resource_name;
pub use plugin_registry::DraPlugin;
pub use pods::{
    ContainerClaim, ContainerSpec, EXTENDED_RESOURCE_CLAIM, ExtendedRequest, ExtendedResourceClaim,
    Phase, PodResourceClaim, PodSpec, PodStatus,
};
pub use shared::{CHECKPOINT_FILE, PODS_FILE, Paths};

use manager::State;
use shared::Shared;

/// How the stand-in is set up.
#[derive(Clone)]
pub struct KubeletConfig {
    /// kubelet's root directory; sockets live in `device-plugins/` and
    /// `pod-resources/` below it.
    pub root_dir: PathBuf,
    /// Name of the node this kubelet runs on (used when mirroring).
    pub node_name: String,
    /// When set, pods (and, on request, the node) are mirrored into this API server.
    pub api: Option<kube::Client>,
}

impl KubeletConfig {
    /// A configuration without an API server.
    pub fn new(root_dir: impl Into<PathBuf>, node_name: impl Into<String>) -> Self {
        KubeletConfig {
            root_dir: root_dir.into(),
            node_name: node_name.into(),
            api: None,
        }
    }
}

struct Servers {
    shutdown: Vec<oneshot::Sender<()>>,
    tasks: Vec<JoinHandle<()>>,
}

/// The running stand-in. Dropping it stops its servers and plugin connections.
pub struct Kubelet {
    shared: Arc<Shared>,
    servers: tokio::sync::Mutex<Option<Servers>>,
    node_mirror: std::sync::Mutex<Option<tokio::task::AbortHandle>>,
}

/// How long `restart`/`shutdown` wait for servers to drain before aborting them.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

impl Kubelet {
    /// Starts the stand-in: restores the checkpoint, removes stale sockets
    /// from the plugin directory and serves Registration and podresources.
    pub async fn start(config: KubeletConfig) -> Result<Kubelet, Error> {
        let paths = Paths::new(&config.root_dir);
        for dir in [
            &paths.plugin_dir,
            &paths.pod_resources_dir,
            &paths.plugins_registry,
            &paths.plugins_dir,
        ] {
            std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        }
        let mut state = State {
            pods: Shared::read_pods(&paths.pods_file),
            ..Default::default()
        };
        load_checkpoint(&paths, &mut state);
        dra_api::load_dra_checkpoint(&paths, &mut state)?;
        let shared = Arc::new(Shared::new(paths, config.node_name, config.api, state));
        let servers = serve(&shared)?;
        info!(root = %shared.paths.root.display(), "kubelet stand-in started");
        Ok(Kubelet {
            shared,
            servers: tokio::sync::Mutex::new(Some(servers)),
            node_mirror: std::sync::Mutex::new(None),
        })
    }

    /// Socket and file locations.
    pub fn paths(&self) -> &Paths {
        &self.shared.paths
    }

    /// `<root>/device-plugins`.
    pub fn plugin_dir(&self) -> &Path {
        &self.shared.paths.plugin_dir
    }

    /// `<root>/device-plugins/kubelet.sock`.
    pub fn kubelet_socket(&self) -> &Path {
        &self.shared.paths.kubelet_socket
    }

    /// `<root>/pod-resources/kubelet.sock`.
    pub fn pod_resources_socket(&self) -> &Path {
        &self.shared.paths.pod_resources_socket
    }

    /// `<root>/device-plugins/kubelet_internal_checkpoint`.
    pub fn checkpoint_path(&self) -> &Path {
        &self.shared.paths.checkpoint
    }

    /// Registered resources and their devices.
    pub fn resources(&self) -> BTreeMap<String, ResourceState> {
        self.shared.lock().resource_states()
    }

    /// One resource, if registered.
    pub fn resource(&self, name: &str) -> Option<ResourceState> {
        self.shared
            .lock()
            .resources
            .get(name)
            .map(|e| e.state.clone())
    }

    /// Devices allocated to a pod: container → resource → device IDs. Entries
    /// of terminated pods remain until the next admission frees them.
    pub fn allocated(&self, uid: &str) -> Option<ContainerDevices> {
        self.shared.lock().container_devices(uid)
    }

    /// How long each successful Allocate rpc to `resource`'s plugin took, in
    /// call order (what kubelet's `device_plugin_alloc_duration_seconds`
    /// histogram observes).
    pub fn allocate_durations(&self, resource: &str) -> Vec<Duration> {
        self.shared
            .lock()
            .alloc_durations
            .get(resource)
            .cloned()
            .unwrap_or_default()
    }

    /// The plugin's allocate response recorded for one container and resource.
    pub fn allocate_response(
        &self,
        uid: &str,
        container: &str,
        resource: &str,
    ) -> Option<steward_proto::deviceplugin::v1beta1::ContainerAllocateResponse> {
        self.shared
            .lock()
            .pod_devices
            .get(uid)
            .and_then(|c| c.get(container))
            .and_then(|r| r.get(resource))
            .and_then(|a| a.response.clone())
    }

    /// A pod's record (spec, phase, reason, message).
    pub fn pod(&self, uid: &str) -> Option<PodStatus> {
        self.shared.lock().pods.get(uid).cloned()
    }

    /// All pods that have not been deleted.
    pub fn pods(&self) -> Vec<PodStatus> {
        self.shared.lock().pods.values().cloned().collect()
    }

    /// Admits a pod: creates it in the API server first when mirroring (the
    /// API server assigns the UID; a Pod object made by
    /// [`Kubelet::create_pod_object`] whose UID `spec.uid` names is used
    /// instead), then allocates devices container by container, then
    /// prepares its DRA claims. On success the pod is Running; on an
    /// allocation failure it is Failed with the kubelet reason and the error
    /// says why; when DRA preparation fails it stays Pending
    /// ([`Error::PrepareResources`]).
    pub async fn add_pod(&self, spec: PodSpec) -> Result<AdmittedPod, Error> {
        admission::add_pod(&self.shared, spec).await
    }

    /// Marks a pod Succeeded or Failed. Its devices become free for the next
    /// admission. Like kubelet's SyncTerminatingPod, its DRA claims are
    /// unprepared first; if that fails the pod is left as it was and the
    /// error is returned (call again to retry).
    pub async fn terminate_pod(&self, uid: &str, phase: Phase) -> Result<(), Error> {
        if !phase.is_terminal() {
            return Err(Error::NotTerminal(phase));
        }
        if !self.shared.lock().pods.contains_key(uid) {
            return Err(Error::UnknownPod(uid.to_string()));
        }
        dra::unprepare_pod(&self.shared, uid)
            .await
            .map_err(|message| Error::UnprepareResources {
                uid: uid.to_string(),
                message,
            })?;
        admission::set_status(&self.shared, uid, phase, None, None).await;
        info!(pod_uid = %uid, phase = phase.as_str(), "pod terminated");
        Ok(())
    }

    /// Removes a pod entirely (and its Pod object, with grace period 0).
    /// UIDs only known from the checkpoint are accepted too.
    pub async fn delete_pod(&self, uid: &str) -> Result<(), Error> {
        dra::unprepare_pod(&self.shared, uid)
            .await
            .map_err(|message| Error::UnprepareResources {
                uid: uid.to_string(),
                message,
            })?;
        let removed = {
            let mut st = self.shared.lock();
            let pod = st.pods.remove(uid);
            let had_devices = st.pod_devices.remove(uid).is_some();
            if pod.is_none() && !had_devices {
                return Err(Error::UnknownPod(uid.to_string()));
            }
            self.shared.write_pods(&st);
            self.shared.write_checkpoint(&st)?;
            pod
        };
        self.shared.notify();
        if let (Some(api), Some(pod)) = (&self.shared.api, &removed) {
            mirror::delete_pod(api, &pod.spec).await?;
        }
        info!(pod_uid = %uid, "pod deleted");
        Ok(())
    }

    /// Waits until `predicate` holds for the set of resources.
    pub async fn wait_for_resources<F>(
        &self,
        mut predicate: F,
        timeout: Duration,
    ) -> Result<BTreeMap<String, ResourceState>, Error>
    where
        F: FnMut(&BTreeMap<String, ResourceState>) -> bool,
    {
        let mut rx = self.shared.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            rx.borrow_and_update();
            let snapshot = self.resources();
            if predicate(&snapshot) {
                return Ok(snapshot);
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err(Error::Stopped),
                Err(_) => {
                    return Err(Error::Timeout(
                        timeout,
                        format!("resources to match; last seen {snapshot:?}"),
                    ));
                }
            }
        }
    }

    /// Waits until resource `name` is registered and `predicate` holds for it.
    pub async fn wait_for_resource<F>(
        &self,
        name: &str,
        mut predicate: F,
        timeout: Duration,
    ) -> Result<ResourceState, Error>
    where
        F: FnMut(&ResourceState) -> bool,
    {
        let all = self
            .wait_for_resources(|all| all.get(name).is_some_and(&mut predicate), timeout)
            .await
            .map_err(|e| match e {
                Error::Timeout(t, what) => Error::Timeout(t, format!("resource {name}: {what}")),
                other => other,
            })?;
        all.get(name)
            .cloned()
            .ok_or_else(|| Error::Timeout(timeout, format!("resource {name}")))
    }

    /// Waits until the pod's record satisfies `predicate` (`None`: deleted).
    pub async fn wait_for_pod<F>(
        &self,
        uid: &str,
        mut predicate: F,
        timeout: Duration,
    ) -> Result<Option<PodStatus>, Error>
    where
        F: FnMut(Option<&PodStatus>) -> bool,
    {
        let mut rx = self.shared.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            rx.borrow_and_update();
            let pod = self.pod(uid);
            if predicate(pod.as_ref()) {
                return Ok(pod);
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err(Error::Stopped),
                Err(_) => {
                    return Err(Error::Timeout(
                        timeout,
                        format!("pod {uid}; last seen {pod:?}"),
                    ));
                }
            }
        }
    }

    /// Simulates a kubelet restart: stops serving, drops every plugin
    /// connection, deletes every socket in the plugin directory (plugins
    /// notice their socket vanish), reloads allocations from the checkpoint
    /// and serves again. Resources are unknown until plugins re-register.
    /// DRA plugins are forgotten too, but their registration sockets stay:
    /// the plugin watcher finds them again and re-registers them; claim
    /// infos come back from `dra_manager_state`.
    pub async fn restart(&self) -> Result<(), Error> {
        info!("restarting kubelet stand-in");
        let mut servers = self.servers.lock().await;
        if let Some(old) = servers.take() {
            stop_servers(old).await;
        }
        {
            let mut st = self.shared.lock();
            st.drop_endpoints();
            st.dra_plugins.clear();
            load_checkpoint(&self.shared.paths, &mut st);
            dra_api::load_dra_checkpoint(&self.shared.paths, &mut st)?;
        }
        *servers = Some(serve(&self.shared)?);
        drop(servers);
        self.shared.notify();
        Ok(())
    }

    /// Stops serving and drops plugin connections (sockets stay on disk, like
    /// after a kubelet crash).
    pub async fn shutdown(&self) {
        if let Some(old) = self.servers.lock().await.take() {
            stop_servers(old).await;
        }
        {
            let mut st = self.shared.lock();
            st.drop_endpoints();
            st.dra_plugins.clear();
        }
        if let Some(h) = self.node_mirror_handle().take() {
            h.abort();
        }
        self.shared.notify();
    }

    fn node_mirror_handle(&self) -> std::sync::MutexGuard<'_, Option<tokio::task::AbortHandle>> {
        self.node_mirror.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Creates the Node object for `node_name` and keeps its extended
    /// resource capacity/allocatable in sync with the registered devices.
    /// Requires an API client.
    pub async fn mirror_node(&self) -> Result<(), Error> {
        let Some(api) = self.shared.api.clone() else {
            return Err(Error::ApiObject(
                "mirror_node needs an API client".to_string(),
            ));
        };
        let node = self.shared.node_name.clone();
        mirror::ensure_node(&api, &node).await?;
        let mut published = mirror::NodeResources::default();
        let now = node_resources(&self.shared);
        mirror::patch_node_resources(&api, &node, &published, &now).await?;
        published = now;

        let shared = Arc::downgrade(&self.shared);
        let mut rx = self.shared.subscribe();
        let task = tokio::spawn(async move {
            while rx.changed().await.is_ok() {
                let Some(shared) = shared.upgrade() else {
                    return;
                };
                let now = node_resources(&shared);
                drop(shared);
                if now == published {
                    continue;
                }
                match mirror::patch_node_resources(&api, &node, &published, &now).await {
                    Ok(()) => published = now,
                    Err(e) => warn!(error = %e, "failed to mirror node resources"),
                }
            }
        });
        if let Some(old) = self.node_mirror_handle().replace(task.abort_handle()) {
            old.abort();
        }
        Ok(())
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        if let Ok(mut servers) = self.servers.try_lock()
            && let Some(s) = servers.take()
        {
            for t in &s.tasks {
                t.abort();
            }
        }
        {
            let mut st = self.shared.lock();
            st.drop_endpoints();
            st.dra_plugins.clear();
        }
        if let Some(h) = self.node_mirror_handle().take() {
            h.abort();
        }
    }
}

fn node_resources(shared: &Shared) -> mirror::NodeResources {
    let st = shared.lock();
    let mut out = mirror::NodeResources::default();
    for (name, entry) in &st.resources {
        out.capacity.insert(name.clone(), entry.state.capacity());
        out.allocatable
            .insert(name.clone(), entry.state.allocatable());
    }
    out
}

fn load_checkpoint(paths: &Paths, state: &mut State) {
    match checkpoint::read(&paths.checkpoint) {
        Ok(Some(data)) => {
            state.restore_pod_devices(&data);
            info!(
                entries = data.pod_device_entries.len(),
                "restored device checkpoint"
            );
        }
        Ok(None) => {}
        Err(e) => {
            // kubelet carries on without the allocations.
            error!(error = %e, "continuing after failing to read checkpoint; device allocation info may not be up to date");
            state.pod_devices.clear();
        }
    }
}

/// Removes the sockets in the plugin directory (not the checkpoint, not
/// directories or regular files), like kubelet does before it serves.
fn cleanup_plugin_dir(dir: &Path) -> Result<(), Error> {
    use std::os::unix::fs::FileTypeExt;
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        let path = entry.path();
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.file_type().is_socket() => {
                info!(path = %path.display(), "removing socket from plugin directory");
                if let Err(e) = std::fs::remove_file(&path)
                    && e.kind() != std::io::ErrorKind::NotFound
                {
                    return Err(Error::io(&path, e));
                }
            }
            Ok(_) => {}
            Err(e) => {
                warn!(path = %path.display(), error = %e, "cannot stat plugin directory entry")
            }
        }
    }
    Ok(())
}

fn bind(path: &Path) -> Result<UnixListener, Error> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io(path, e)),
    }
    UnixListener::bind(path).map_err(|e| Error::io(path, e))
}

fn serve(shared: &Arc<Shared>) -> Result<Servers, Error> {
    cleanup_plugin_dir(&shared.paths.plugin_dir)?;
    let registration_listener = bind(&shared.paths.kubelet_socket)?;
    let podresources_listener = bind(&shared.paths.pod_resources_socket)?;

    let (reg_tx, reg_rx) = oneshot::channel::<()>();
    let reg_socket = shared.paths.kubelet_socket.clone();
    let registration = Server::builder()
        .add_service(RegistrationServer::new(registration::RegistrationService {
            shared: shared.clone(),
        }))
        .serve_with_incoming_shutdown(UnixListenerStream::new(registration_listener), async {
            let _ = reg_rx.await;
        });
    let reg_task = tokio::spawn(async move {
        if let Err(e) = registration.await {
            error!(socket = %reg_socket.display(), error = %e, "registration server failed");
        }
    });

    let (pr_tx, pr_rx) = oneshot::channel::<()>();
    let pr_socket = shared.paths.pod_resources_socket.clone();
    let podresources = Server::builder()
        .add_service(PodResourcesListerServer::new(
            podresources::PodResourcesService {
                shared: shared.clone(),
            },
        ))
        .serve_with_incoming_shutdown(UnixListenerStream::new(podresources_listener), async {
            let _ = pr_rx.await;
        });
    let pr_task = tokio::spawn(async move {
        if let Err(e) = podresources.await {
            error!(socket = %pr_socket.display(), error = %e, "podresources server failed");
        }
    });
    // The plugin watcher (kubelet's pluginmanager) for DRA drivers.
    let (pw_tx, pw_rx) = oneshot::channel::<()>();
    let pw_task = tokio::spawn(plugins::run(shared.clone(), pw_rx));
    Ok(Servers {
        shutdown: vec![reg_tx, pr_tx, pw_tx],
        tasks: vec![reg_task, pr_task, pw_task],
    })
}

async fn stop_servers(servers: Servers) {
    for tx in servers.shutdown {
        let _ = tx.send(());
    }
    for task in servers.tasks {
        let abort = task.abort_handle();
        if tokio::time::timeout(DRAIN_TIMEOUT, task).await.is_err() {
            warn!("server did not drain in time; aborting it");
            abort.abort();
        }
    }
}
