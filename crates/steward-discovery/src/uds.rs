//! Unix-socket and channel plumbing shared by the agent and DH sides.

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::net::UnixListener;
use tonic::transport::{Channel, Endpoint as TonicEndpoint};

use crate::{DiscoveryError, Endpoint};

/// HTTP/2 keepalive: a peer that stops answering pings is dropped.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Opens a gRPC channel to a unix socket or a network URL, within `timeout`.
pub(crate) async fn connect(
    endpoint: &Endpoint,
    timeout: Duration,
) -> Result<Channel, DiscoveryError> {
    match endpoint {
        Endpoint::Embedded => Err(DiscoveryError::Connect(
            "an embedded handler has no transport endpoint".into(),
        )),
        Endpoint::Uds(path) => connect_uds(Path::new(path), timeout).await,
        Endpoint::Network(url) => {
            let ep = TonicEndpoint::from_shared(url.clone()).map_err(|e| {
                DiscoveryError::Connect(format!("invalid endpoint URL {url:?}: {e}"))
            })?;
            let ep = tune(ep, timeout);
            match tokio::time::timeout(timeout, ep.connect()).await {
                Ok(Ok(channel)) => Ok(channel),
                Ok(Err(e)) => Err(DiscoveryError::Connect(format!(
                    "{url}: {}",
                    error_chain(&e)
                ))),
                Err(_) => Err(DiscoveryError::Connect(format!(
                    "{url}: no connection within {timeout:?}"
                ))),
            }
        }
    }
}

/// Opens a gRPC channel over the unix socket at `path`, within `timeout`.
pub(crate) async fn connect_uds(path: &Path, timeout: Duration) -> Result<Channel, DiscoveryError> {
    if !path.is_absolute() {
        return Err(DiscoveryError::Connect(format!(
            "unix socket path {} is not absolute",
            path.display()
        )));
    }
    let ep = tune(steward_proto::uds::endpoint(), timeout);
    let connector = steward_proto::uds::UnixConnector::new(path);
    match tokio::time::timeout(timeout, ep.connect_with_connector(connector)).await {
        Ok(Ok(channel)) => Ok(channel),
        Ok(Err(e)) => Err(DiscoveryError::Connect(format!(
            "unix socket {}: {}",
            path.display(),
            error_chain(&e)
        ))),
        Err(_) => Err(DiscoveryError::Connect(format!(
            "unix socket {}: no connection within {timeout:?}",
            path.display()
        ))),
    }
}

fn tune(ep: TonicEndpoint, connect_timeout: Duration) -> TonicEndpoint {
    ep.connect_timeout(connect_timeout)
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true)
}

/// `e` with its sources, joined by `: ` (tonic's errors hide the cause).
pub(crate) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    text
}

/// Identity of a file, to notice that a socket was re-created. Inode
/// numbers are reused at once on tmpfs, so the change time is part of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileId {
    dev: u64,
    ino: u64,
    ctime: i64,
    ctime_nsec: i64,
}

pub(crate) fn file_id(path: &Path) -> Option<FileId> {
    std::fs::metadata(path).ok().map(|m| FileId {
        dev: m.dev(),
        ino: m.ino(),
        ctime: m.ctime(),
        ctime_nsec: m.ctime_nsec(),
    })
}

/// A listening unix socket whose file is removed when dropped (if it is
/// still the one we created).
pub(crate) struct BoundSocket {
    path: PathBuf,
    id: Option<FileId>,
}

impl Drop for BoundSocket {
    fn drop(&mut self) {
        if self.id.is_some()
            && file_id(&self.path) == self.id
            && let Err(e) = std::fs::remove_file(&self.path)
        {
            tracing::debug!(path = %self.path.display(), error = %e, "cannot remove socket file");
        }
    }
}

/// Binds a unix socket at `path` with the given mode. A stale socket file
/// (nobody accepts on it) is replaced; a live socket or any other kind of
/// file is refused. The socket is bound under a
/// temporary name, chmod-ed, then renamed into place, so it never appears at
/// `path` with a wider mode.
pub(crate) fn bind(path: &Path, mode: u32) -> Result<(UnixListener, BoundSocket), DiscoveryError> {
    if !path.is_absolute() {
        return Err(DiscoveryError::Io(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("socket path {} is not absolute", path.display()),
        )));
    }
    let dir = path.parent().ok_or_else(|| {
        DiscoveryError::Io(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("socket path {} has no parent directory", path.display()),
        ))
    })?;
    let file_name = path.file_name().ok_or_else(|| {
        DiscoveryError::Io(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("socket path {} has no file name", path.display()),
        ))
    })?;
    std::fs::create_dir_all(dir).map_err(|e| with_path(e, "create directory", dir))?;
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(DiscoveryError::Io(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("{} is in use by a running server", path.display()),
                )));
            }
            std::fs::remove_file(path).map_err(|e| with_path(e, "remove stale socket", path))?;
        }
        Ok(_) => {
            return Err(DiscoveryError::Io(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket", path.display()),
            )));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(with_path(e, "inspect", path)),
    }
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(file_name);
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp = dir.join(tmp_name);
    if std::fs::symlink_metadata(&tmp).is_ok() {
        std::fs::remove_file(&tmp).map_err(|e| with_path(e, "remove", &tmp))?;
    }
    let listener = UnixListener::bind(&tmp).map_err(|e| with_path(e, "bind", &tmp))?;
    let placed = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))
        .map_err(|e| with_path(e, "chmod", &tmp))
        .and_then(|()| std::fs::rename(&tmp, path).map_err(|e| with_path(e, "rename into", path)));
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    let guard = BoundSocket {
        path: path.to_path_buf(),
        id: file_id(path),
    };
    Ok((listener, guard))
}

fn with_path(e: io::Error, what: &str, path: &Path) -> DiscoveryError {
    DiscoveryError::Io(io::Error::new(
        e.kind(),
        format!("cannot {what} {}: {e}", path.display()),
    ))
}
