//! kubelet's plugin watcher for DRA drivers: registration sockets in
//! `<root>/plugins_registry/` are discovered, dialed as
//! `pluginregistration.Registration` clients, asked `GetInfo`, validated
//! and told the outcome with `NotifyRegistrationStatus`, as kubelet's
//! pluginmanager (operation generator + DRA plugin manager) does.
//!
//! The directory is polled ([`POLL`]) instead of watched with inotify.
//! Sockets whose name starts with `.` are ignored, subdirectories are not
//! walked. A socket that disappears (or is re-created) deregisters its
//! plugin. A failed registration (dial, GetInfo, wrong type, validation) is
//! retried with kubelet's exponential backoff (500 ms doubling up to 2m2s),
//! each round telling the plugin again.
//!
//! The registry keeps every instance per driver, newest last; calls go to
//! the newest, like kubelet's `GetPlugin`.

use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use steward_proto::dra::v1::dra_plugin_client::DraPluginClient;
use steward_proto::dra::v1::{PLUGIN_TYPE, SERVICE_VERSION};
use steward_proto::pluginregistration::v1::registration_client::RegistrationClient;
use steward_proto::pluginregistration::v1::{InfoRequest, PluginInfo, RegistrationStatus};
use tokio::sync::oneshot;
use tokio::time::Instant;
use tonic::transport::Channel;
use tracing::{debug, info, warn};

use crate::endpoint::{DIAL_TIMEOUT, connect_unix};
use crate::error::go_status_text;
use crate::plugin_registry::{DraPlugin, PluginEntry};
use crate::shared::Shared;

/// How often the registry directory is scanned.
pub const POLL: Duration = Duration::from_millis(100);
/// kubelet's timeout for `GetInfo`.
const GET_INFO_TIMEOUT: Duration = Duration::from_secs(1);
/// kubelet's timeout for `NotifyRegistrationStatus`.
const NOTIFY_TIMEOUT: Duration = Duration::from_secs(5);
/// kubelet's backoff for failed plugin operations.
const BACKOFF_INITIAL: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(122);
/// gRPC services the stand-in speaks to DRA plugins.
pub const SUPPORTED_SERVICES: &[&str] = &[SERVICE_VERSION];

/// A socket file's identity: a re-created socket is a new plugin.
type Identity = (u64, u64, i64, i64);

struct Known {
    identity: Identity,
    /// (driver, endpoint) once in kubelet's actual state of the world.
    registered: Option<(String, PathBuf)>,
    /// When a failed registration is tried again.
    retry_at: Option<Instant>,
    backoff: Duration,
}

fn scan(dir: &Path) -> BTreeMap<PathBuf, Identity> {
    let mut out = BTreeMap::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) => {
            warn!(dir = %dir.display(), error = %e, "cannot read the plugin registry directory");
            return out;
        }
    };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let path = entry.path();
        if let Ok(m) = std::fs::symlink_metadata(&path)
            && m.file_type().is_socket()
        {
            out.insert(path, (m.dev(), m.ino(), m.ctime(), m.ctime_nsec()));
        }
    }
    out
}

/// Runs the watcher until `stop` fires (or is dropped).
pub(crate) async fn run(shared: Arc<Shared>, mut stop: oneshot::Receiver<()>) {
    let dir = shared.paths.plugins_registry.clone();
    let mut known: BTreeMap<PathBuf, Known> = BTreeMap::new();
    loop {
        let found = scan(&dir);
        let gone: Vec<PathBuf> = known
            .iter()
            .filter(|(p, k)| found.get(*p) != Some(&k.identity))
            .map(|(p, _)| p.clone())
            .collect();
        for path in gone {
            if let Some(Known {
                registered: Some((driver, endpoint)),
                ..
            }) = known.remove(&path)
            {
                info!(%driver, socket = %path.display(), "DRA plugin registration socket removed; deregistering");
                shared.lock().dra_plugins.remove(&driver, &endpoint);
                shared.notify();
            }
        }
        let now = Instant::now();
        for (path, identity) in found {
            let due = match known.get(&path) {
                None => true,
                Some(k) => k.registered.is_none() && k.retry_at.is_some_and(|t| t <= now),
            };
            if !due {
                continue;
            }
            let backoff = known.get(&path).map_or(BACKOFF_INITIAL, |k| k.backoff);
            let entry = match register(&shared, &path).await {
                Ok(registered) => Known {
                    identity,
                    registered,
                    retry_at: None,
                    backoff: BACKOFF_INITIAL,
                },
                Err(e) => {
                    warn!(socket = %path.display(), error = %e, retry_in = ?backoff, "plugin registration failed");
                    Known {
                        identity,
                        registered: None,
                        retry_at: Some(Instant::now() + backoff),
                        backoff: (backoff * 2).min(BACKOFF_MAX),
                    }
                }
            };
            known.insert(path, entry);
        }
        tokio::select! {
            _ = tokio::time::sleep(POLL) => {}
            _ = &mut stop => break,
        }
    }
    debug!("plugin watcher stopped");
}

async fn notify(client: &mut RegistrationClient<Channel>, registered: bool, error: &str) {
    let status = RegistrationStatus {
        plugin_registered: registered,
        error: error.to_string(),
    };
    match tokio::time::timeout(NOTIFY_TIMEOUT, client.notify_registration_status(status)).await {
        Ok(Ok(_)) => {}
        Ok(Err(s)) => warn!(status = %go_status_text(&s), "NotifyRegistrationStatus failed"),
        Err(_) => warn!("NotifyRegistrationStatus timed out"),
    }
}

/// Go's `%q` of a string slice: `["a" "b"]`.
fn go_quoted(list: &[impl AsRef<str>]) -> String {
    let items: Vec<String> = list.iter().map(|s| format!("{:?}", s.as_ref())).collect();
    format!("[{}]", items.join(" "))
}

/// `ValidatePlugin` of the DRA handler, plus the stand-in's own checks (a
/// non-empty name; an endpoint that is an existing unix socket — kubelet
/// connects lazily and would only fail on first use).
fn validate(info: &PluginInfo, endpoint: &Path) -> Result<String, String> {
    if info.name.is_empty() {
        return Err("DRA driver name is empty".to_string());
    }
    let prefix = format!(
        "invalid supported gRPC versions of DRA driver plugin {} at endpoint {}",
        info.name,
        endpoint.display()
    );
    if info.supported_versions.is_empty() {
        return Err(format!(
            "{prefix}: empty list of supported gRPC services (aka supported versions)"
        ));
    }
    let Some(service) = info
        .supported_versions
        .iter()
        .find(|v| SUPPORTED_SERVICES.contains(&v.as_str()))
    else {
        return Err(format!(
            "{prefix}: none of services supported by the plugin ({}) are supported by the kubelet ({})",
            go_quoted(&info.supported_versions),
            go_quoted(SUPPORTED_SERVICES)
        ));
    };
    let is_socket = std::fs::symlink_metadata(endpoint)
        .map_err(|e| e.to_string())
        .and_then(|m| {
            if m.file_type().is_socket() {
                Ok(())
            } else {
                Err("not a socket".to_string())
            }
        });
    if !endpoint.is_absolute() || is_socket.is_err() {
        let why = is_socket
            .err()
            .unwrap_or_else(|| "not an absolute path".to_string());
        return Err(format!(
            "endpoint {} of DRA driver plugin {} is not a unix socket: {why}",
            endpoint.display(),
            info.name
        ));
    }
    Ok(service.clone())
}

/// One registration round for `socket`. `Ok(Some)`: registered; `Ok(None)`:
/// refused by the DRA handler after entering kubelet's state of the world
/// (not retried); `Err`: retried later.
async fn register(shared: &Shared, socket: &Path) -> Result<Option<(String, PathBuf)>, String> {
    let at = socket.display();
    let channel = connect_unix(socket)
        .await
        .map_err(|e| format!("RegisterPlugin error -- dial failed at socket {at}, err: {e}"))?;
    let mut client = RegistrationClient::new(channel);
    let info = match tokio::time::timeout(GET_INFO_TIMEOUT, client.get_info(InfoRequest {})).await {
        Ok(Ok(r)) => r.into_inner(),
        Ok(Err(s)) => {
            return Err(format!(
                "RegisterPlugin error -- failed to get plugin info using RPC GetInfo at socket {at}, err: {}",
                go_status_text(&s)
            ));
        }
        Err(_) => {
            return Err(format!(
                "RegisterPlugin error -- failed to get plugin info using RPC GetInfo at socket {at}, err: context deadline exceeded"
            ));
        }
    };
    if info.r#type != PLUGIN_TYPE {
        let msg = format!(
            "RegisterPlugin error -- no handler registered for plugin type: {} at socket {at}",
            info.r#type
        );
        notify(&mut client, false, &msg).await;
        return Err(msg);
    }
    let endpoint = if info.endpoint.is_empty() {
        socket.to_path_buf()
    } else {
        PathBuf::from(&info.endpoint)
    };
    let service = match validate(&info, &endpoint) {
        Ok(s) => s,
        Err(e) => {
            let msg = format!("RegisterPlugin error -- plugin validation failed with err: {e}");
            notify(&mut client, false, &msg).await;
            return Err(msg);
        }
    };
    let dra_channel = steward_proto::uds::endpoint()
        .connect_timeout(DIAL_TIMEOUT)
        .connect_with_connector_lazy(steward_proto::uds::UnixConnector::new(&endpoint));
    let entry = PluginEntry {
        info: DraPlugin {
            driver: info.name.clone(),
            endpoint: endpoint.clone(),
            registration_socket: socket.to_path_buf(),
            service,
        },
        client: DraPluginClient::new(dra_channel),
    };
    let added = shared.lock().dra_plugins.add(entry);
    if let Err(e) = added {
        let msg = format!("RegisterPlugin error -- plugin registration failed with err: {e}");
        warn!(driver = %info.name, error = %msg, "DRA plugin refused");
        notify(&mut client, false, &msg).await;
        return Ok(None);
    }
    shared.notify();
    info!(driver = %info.name, endpoint = %endpoint.display(), "DRA plugin registered");
    notify(&mut client, true, "").await;
    Ok(Some((info.name, endpoint)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_texts() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("dra.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let info = |name: &str, versions: &[&str]| PluginInfo {
            r#type: PLUGIN_TYPE.into(),
            name: name.into(),
            endpoint: String::new(),
            supported_versions: versions.iter().map(|v| v.to_string()).collect(),
        };
        assert_eq!(
            validate(&info("d", &["v1beta1.DRAPlugin", "v1.DRAPlugin"]), &sock),
            Ok("v1.DRAPlugin".to_string())
        );
        let err = validate(&info("d", &["v1beta1.DRAPlugin"]), &sock).unwrap_err();
        assert!(
            err.ends_with(r#"none of services supported by the plugin (["v1beta1.DRAPlugin"]) are supported by the kubelet (["v1.DRAPlugin"])"#),
            "{err}"
        );
        assert!(
            validate(&info("d", &[]), &sock)
                .unwrap_err()
                .contains("empty list")
        );
        assert_eq!(
            validate(&info("", &["v1.DRAPlugin"]), &sock).unwrap_err(),
            "DRA driver name is empty"
        );
        let missing = dir.path().join("missing.sock");
        let err = validate(&info("d", &["v1.DRAPlugin"]), &missing).unwrap_err();
        assert!(err.contains("is not a unix socket"), "{err}");
        let err = validate(&info("d", &["v1.DRAPlugin"]), Path::new("rel.sock")).unwrap_err();
        assert!(err.contains("is not a unix socket"), "{err}");
    }
}
