//! A kubelet DRA plugin's sockets, whatever the driver: what every steward
//! DRA driver (the agent's `steward.dev`, the resource manager's
//! `cpu.steward.dev`) serves to kubelet's plugin watcher and DRA manager.
//!
//! * **Registration** on `<registry_dir>/<driver>-reg.sock`
//!   (`<driver>-<instance>-reg.sock` for an instance named per pod, so two
//!   pods of a rolling DaemonSet can be registered side by side, as
//!   upstream's kubelet plugin helper names them)
//!   (`pluginregistration.Registration`): GetInfo answers type
//!   [`PLUGIN_TYPE`], the driver name, the DRA socket and the services the
//!   driver serves there; NotifyRegistrationStatus marks the plugin ready
//!   (or logs kubelet's refusal) under the driver's readiness condition.
//! * **The DRA socket** `<plugin_dir>/dra.sock` (`dra-<instance>.sock`): the services the driver
//!   hands in ([`Routes`]: its `v1.DRAPlugin` and whatever else it lists).
//!
//! The DRA socket is bound before the registration socket, so kubelet never
//! finds a plugin it cannot call; both are served again if either
//! disappears (kubelet's plugin watcher removes stale sockets, and a
//! kubelet restart may wipe the directories).

use std::path::{Path, PathBuf};
use std::time::Duration;

use steward_proto::pluginregistration::v1::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
    registration_server::{Registration, RegistrationServer},
};
use tokio_util::task::AbortOnDropHandle;
use tonic::service::Routes;
use tonic::transport::Server;
use tonic::{Request, Response, Status};

use crate::{BindOptions, Readiness, SocketGuard, UnixIncoming};

/// The plugin type kubelet's plugin watcher routes to its DRA manager.
pub use steward_proto::dra::v1::PLUGIN_TYPE;

/// File name of the DRA socket in the driver's plugin directory (an
/// instance named per pod adds `-<instance>`).
pub const PLUGIN_SOCKET: &str = "dra.sock";

/// Only kubelet (root) connects.
const SOCKET_MODE: u32 = 0o600;

/// One driver's kubelet plugin: where its sockets live and what GetInfo
/// answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletPlugin {
    /// The driver name (GetInfo's `name`, the registration socket's prefix).
    pub driver: String,
    /// kubelet's plugin watcher directory (`<kubelet>/plugins_registry`).
    pub registry_dir: PathBuf,
    /// This driver's directory (`<kubelet>/plugins/<driver>`).
    pub plugin_dir: PathBuf,
    /// `PluginInfo.supported_versions`: every gRPC service on the DRA
    /// socket, as `<package>.<service>`, the DRAPlugin version first.
    pub supported_versions: Vec<String>,
    /// The readiness condition: registered with kubelet.
    pub readiness: String,
    /// How often the sockets are checked for removal.
    pub poll: Duration,
    /// The pod this instance of the plugin runs in (its UID), when two may
    /// run side by side during a roll: both sockets are named after it.
    pub instance: Option<String>,
}

impl KubeletPlugin {
    /// `driver`'s plugin under a kubelet rooted at `kubelet_root`, serving
    /// `supported_versions`, ready as `readiness` once registered.
    pub fn new(
        kubelet_root: &Path,
        driver: &str,
        supported_versions: &[&str],
        readiness: &str,
    ) -> Self {
        Self {
            driver: driver.to_owned(),
            registry_dir: kubelet_root.join("plugins_registry"),
            plugin_dir: kubelet_root.join("plugins").join(driver),
            supported_versions: supported_versions.iter().map(|s| (*s).to_owned()).collect(),
            readiness: readiness.to_owned(),
            poll: Duration::from_millis(200),
            instance: None,
        }
    }

    /// The same plugin, its sockets named after `instance` (the pod UID).
    pub fn with_instance(mut self, instance: Option<String>) -> Self {
        self.instance = instance.filter(|i| !i.is_empty());
        self
    }

    /// `-<instance>`, or nothing.
    fn instance_part(&self) -> String {
        self.instance
            .as_deref()
            .map(|i| format!("-{i}"))
            .unwrap_or_default()
    }

    /// File name of the registration socket: `<driver>[-<instance>]-reg.sock`.
    pub fn registration_socket_name(&self) -> String {
        format!("{}{}-reg.sock", self.driver, self.instance_part())
    }

    /// File name of the DRA socket: `dra[-<instance>].sock`.
    pub fn plugin_socket_name(&self) -> String {
        format!("dra{}.sock", self.instance_part())
    }

    pub fn registration_socket(&self) -> PathBuf {
        self.registry_dir.join(self.registration_socket_name())
    }

    pub fn plugin_socket(&self) -> PathBuf {
        self.plugin_dir.join(self.plugin_socket_name())
    }
}

struct Registrar {
    driver: String,
    endpoint: String,
    versions: Vec<String>,
    condition: String,
    readiness: Readiness,
}

#[tonic::async_trait]
impl Registration for Registrar {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: PLUGIN_TYPE.to_owned(),
            name: self.driver.clone(),
            endpoint: self.endpoint.clone(),
            supported_versions: self.versions.clone(),
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            tracing::info!(
                driver = %self.driver,
                "DRA kubelet plugin registered with kubelet"
            );
            self.readiness.ready(&self.condition);
        } else {
            tracing::error!(driver = %self.driver, error = %status.error, "kubelet refused the DRA kubelet plugin");
            self.readiness.not_ready(
                &self.condition,
                format!("kubelet refused the registration: {}", status.error),
            );
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

fn bind(path: &Path) -> Option<(tokio::net::UnixListener, SocketGuard)> {
    if let Some(dir) = path.parent()
        && let Err(e) = std::fs::create_dir_all(dir)
    {
        tracing::warn!(path = %dir.display(), error = %e, "cannot create the DRA plugin directory");
        return None;
    }
    match crate::bind(path, BindOptions::mode(SOCKET_MODE)) {
        Ok(bound) => Some(bound),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot bind a DRA plugin socket; retrying");
            None
        }
    }
}

/// Serves `plugin` until the task is dropped or aborted (the sockets go
/// with it): the services `routes` builds on the DRA socket (called again
/// each time the sockets are bound anew), the registration on kubelet's
/// plugin watcher directory. Not ready under `plugin.readiness` until
/// kubelet says it registered the plugin.
pub async fn serve<F>(plugin: KubeletPlugin, mut routes: F, readiness: Readiness)
where
    F: FnMut() -> Routes,
{
    readiness.not_ready(&plugin.readiness, "not registered with kubelet yet");
    loop {
        let Some((plugin_listener, plugin_guard)) = bind(&plugin.plugin_socket()) else {
            tokio::time::sleep(plugin.poll).await;
            continue;
        };
        let services = routes();
        let driver = plugin.driver.clone();
        let served = AbortOnDropHandle::new(tokio::spawn(async move {
            let served = Server::builder()
                .add_routes(services)
                .serve_with_incoming(UnixIncoming::with_authority_fix(plugin_listener))
                .await;
            if let Err(e) = served {
                tracing::error!(driver = %driver, error = %e, "DRA plugin server failed");
            }
        }));
        let Some((reg_listener, reg_guard)) = bind(&plugin.registration_socket()) else {
            drop(served);
            drop(plugin_guard);
            tokio::time::sleep(plugin.poll).await;
            continue;
        };
        let registrar = Registrar {
            driver: plugin.driver.clone(),
            endpoint: plugin.plugin_socket().display().to_string(),
            versions: plugin.supported_versions.clone(),
            condition: plugin.readiness.clone(),
            readiness: readiness.clone(),
        };
        let driver = plugin.driver.clone();
        let registration = AbortOnDropHandle::new(tokio::spawn(async move {
            let served = Server::builder()
                .add_service(RegistrationServer::new(registrar))
                .serve_with_incoming(UnixIncoming::with_authority_fix(reg_listener))
                .await;
            if let Err(e) = served {
                tracing::error!(driver = %driver, error = %e, "DRA registration server failed");
            }
        }));
        tracing::info!(
            driver = %plugin.driver,
            registration = %plugin.registration_socket().display(),
            endpoint = %plugin.plugin_socket().display(),
            "DRA kubelet plugin serving"
        );
        while plugin_guard.is_in_place() && reg_guard.is_in_place() {
            tokio::time::sleep(plugin.poll).await;
        }
        tracing::warn!(driver = %plugin.driver, "a DRA plugin socket was removed; serving again");
        readiness.not_ready(&plugin.readiness, "re-registering with kubelet");
        drop(registration);
        drop(served);
        drop(reg_guard);
        drop(plugin_guard);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockets_are_named_per_instance_as_upstreams_helper_names_them() {
        let plugin = KubeletPlugin::new(Path::new("/k"), "steward.dev", &["v1.DRAPlugin"], "r");
        assert_eq!(
            plugin.registration_socket(),
            Path::new("/k/plugins_registry/steward.dev-reg.sock")
        );
        assert_eq!(
            plugin.plugin_socket(),
            Path::new("/k/plugins/steward.dev/dra.sock")
        );
        let pod = plugin.clone().with_instance(Some("0f9c-uid".to_owned()));
        assert_eq!(
            pod.registration_socket(),
            Path::new("/k/plugins_registry/steward.dev-0f9c-uid-reg.sock")
        );
        assert_eq!(
            pod.plugin_socket(),
            Path::new("/k/plugins/steward.dev/dra-0f9c-uid.sock")
        );
        // An empty UID (the downward API unset) is no instance.
        assert_eq!(plugin.clone().with_instance(Some(String::new())), plugin);
    }
}
