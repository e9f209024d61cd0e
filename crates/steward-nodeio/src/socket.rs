//! Binding a unix socket with its mode and group set before anyone can
//! reach it, replacing a stale socket file safely, and removing it on drop
//! only while it is still ours.

use std::ffi::OsString;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::net::UnixListener;

use crate::NodeIoError;
use crate::identity::FileIdentity;

/// How a socket is bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BindOptions {
    /// Permission bits of the socket file (e.g. `0o600`).
    pub mode: u32,
    /// Group the socket file is given, if any (the owner stays the caller).
    pub group: Option<u32>,
}

impl BindOptions {
    /// Owner and `mode` only, no group change.
    pub const fn mode(mode: u32) -> Self {
        Self { mode, group: None }
    }

    /// Also give the socket file to group `gid`.
    pub const fn with_group(self, gid: u32) -> Self {
        Self {
            group: Some(gid),
            ..self
        }
    }
}

/// A bound socket's file: removed when dropped, if the path still names the
/// socket we bound (a successor's socket is never removed).
#[derive(Debug)]
pub struct SocketGuard {
    path: PathBuf,
    id: Option<FileIdentity>,
}

impl SocketGuard {
    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the path still names the socket we bound (false once it was
    /// removed or replaced, e.g. when kubelet wipes its plugin directory).
    pub fn is_in_place(&self) -> bool {
        self.id.is_some_and(|id| id.is_at(&self.path))
    }

    /// Removes the socket file now, if it is still ours.
    pub fn remove(&mut self) {
        if self.is_in_place()
            && let Err(e) = std::fs::remove_file(&self.path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::debug!(path = %self.path.display(), error = %e, "cannot remove socket file");
        }
        self.id = None;
    }
}

impl Drop for SocketGuard {
    fn drop(&mut self) {
        self.remove();
    }
}

/// Distinguishes the temporary names of concurrent binds in one process.
static TEMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// Binds a unix socket at `path` (absolute) with `opts`. The parent directory
/// is created if missing. A stale socket file (nobody listens on it) is
/// replaced; a live socket or any other kind of file is refused. The socket
/// is bound under a temporary name in the same directory, given its mode and
/// group, then renamed into place, so it never appears at `path` with a wider
/// mode. Must be called within a tokio runtime.
pub fn bind(path: &Path, opts: BindOptions) -> Result<(UnixListener, SocketGuard), NodeIoError> {
    let invalid = |reason| NodeIoError::InvalidPath {
        path: path.to_path_buf(),
        reason,
    };
    if !path.is_absolute() {
        return Err(invalid("socket path is not absolute"));
    }
    let dir = path
        .parent()
        .ok_or_else(|| invalid("socket path has no parent directory"))?;
    if path.file_name().is_none() {
        return Err(invalid("socket path has no file name"));
    }
    std::fs::create_dir_all(dir).map_err(|e| NodeIoError::io("create directory", dir, e))?;
    remove_stale(path)?;

    // Short on purpose: a unix socket path holds at most 107 bytes.
    let mut tmp_name = OsString::from(format!(
        ".s{}-{}",
        std::process::id(),
        TEMP_SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    tmp_name.push(".tmp");
    let tmp = dir.join(tmp_name);
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(NodeIoError::io("remove", &tmp, e));
        }
        _ => {}
    }
    let listener = UnixListener::bind(&tmp).map_err(|e| NodeIoError::io("bind", &tmp, e))?;
    if let Err(e) = place(&tmp, path, opts) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    let guard = SocketGuard {
        path: path.to_path_buf(),
        id: FileIdentity::of(path),
    };
    tracing::debug!(path = %path.display(), mode = format_args!("{:o}", opts.mode), "socket bound");
    Ok((listener, guard))
}

fn place(tmp: &Path, path: &Path, opts: BindOptions) -> Result<(), NodeIoError> {
    std::fs::set_permissions(tmp, std::fs::Permissions::from_mode(opts.mode))
        .map_err(|e| NodeIoError::io("chmod", tmp, e))?;
    if let Some(gid) = opts.group {
        std::os::unix::fs::chown(tmp, None, Some(gid))
            .map_err(|e| NodeIoError::io("chgrp", tmp, e))?;
    }
    std::fs::rename(tmp, path).map_err(|e| NodeIoError::io("rename into", path, e))
}

/// Removes a socket file nobody listens on; refuses a live socket and any
/// other kind of file.
fn remove_stale(path: &Path) -> Result<(), NodeIoError> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(NodeIoError::InUse {
                    path: path.to_path_buf(),
                });
            }
            match std::fs::remove_file(path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(NodeIoError::io("remove stale socket", path, e))
                }
                _ => Ok(()),
            }
        }
        Ok(_) => Err(NodeIoError::NotASocket {
            path: path.to_path_buf(),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(NodeIoError::io("inspect", path, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[tokio::test]
    async fn binds_with_mode_and_leaves_no_temporary_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join("a.sock");
        let (_l, guard) = bind(&path, BindOptions::mode(0o600)).unwrap();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.mode() & 0o777, 0o600);
        assert!(guard.is_in_place());
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![OsString::from("a.sock")]);
    }

    #[tokio::test]
    async fn sets_the_group() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("g.sock");
        // Our own primary group is always allowed.
        let gid = std::fs::metadata(dir.path()).unwrap().gid();
        let (_l, _g) = bind(&path, BindOptions::mode(0o660).with_group(gid)).unwrap();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert_eq!(meta.gid(), gid);
        assert_eq!(meta.mode() & 0o777, 0o660);
    }

    #[tokio::test]
    async fn replaces_a_stale_socket_refuses_a_live_one_and_other_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        {
            let _stale = std::os::unix::net::UnixListener::bind(&path).unwrap();
        }
        let (live, _guard) = bind(&path, BindOptions::mode(0o600)).unwrap();
        let err = bind(&path, BindOptions::mode(0o600)).unwrap_err();
        assert!(matches!(err, NodeIoError::InUse { .. }), "{err}");
        drop(live);

        let file = dir.path().join("plain");
        std::fs::write(&file, b"keep").unwrap();
        let err = bind(&file, BindOptions::mode(0o600)).unwrap_err();
        assert!(matches!(err, NodeIoError::NotASocket { .. }), "{err}");
        assert_eq!(std::fs::read(&file).unwrap(), b"keep");

        let err = bind(Path::new("rel.sock"), BindOptions::mode(0o600)).unwrap_err();
        assert!(matches!(err, NodeIoError::InvalidPath { .. }), "{err}");
    }

    #[tokio::test]
    async fn drop_removes_only_our_own_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.sock");
        let (l, guard) = bind(&path, BindOptions::mode(0o600)).unwrap();
        drop(l);
        drop(guard);
        assert!(std::fs::symlink_metadata(&path).is_err(), "ours: removed");

        let (l, guard) = bind(&path, BindOptions::mode(0o600)).unwrap();
        drop(l);
        // A successor replaced it: dropping the old guard must leave it.
        std::fs::remove_file(&path).unwrap();
        let _successor = std::os::unix::net::UnixListener::bind(&path).unwrap();
        assert!(!guard.is_in_place());
        drop(guard);
        assert!(
            std::fs::symlink_metadata(&path).is_ok(),
            "successor's socket kept"
        );
    }
}
