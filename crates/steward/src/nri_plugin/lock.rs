//! One `steward nri-plugin` per state directory: an exclusive advisory lock
//! (`flock`) on a file in it, taken before anything else (before the cache
//! is read or the runtime dialled) and held for the life of the process.
//! The kernel drops it when the process dies, however it dies, so a plugin
//! killed with SIGKILL never blocks the next one. The file names its holder
//! (PID, host, plugin index and name, NRI socket) for the refusal's message;
//! it is never removed (removing a lock file races with the next locker).

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The lock file's name in the state directory.
pub const LOCK_FILE: &str = "nri-plugin.lock";

/// How long a held lock is waited for before refusing: a holder that was
/// just killed is gone within it (its files close as it exits).
const GRACE: Duration = Duration::from_secs(2);
const POLL: Duration = Duration::from_millis(100);

/// Why the plugin may not start on this state directory.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another live process holds the lock.
    #[error(
        "another steward nri-plugin already runs on state directory {} (holder: {holder}; lock {}): two would decide for the same containers. Stop that one first, or give this one its own --state-dir, --nri-index and --nri-name",
        dir.display(),
        path.display()
    )]
    Held {
        /// The state directory.
        dir: PathBuf,
        /// The lock file.
        path: PathBuf,
        /// What the holder wrote in it.
        holder: String,
    },
    /// The lock file could not be created, locked or written.
    #[error("taking the NRI plugin lock {}: {source}", path.display())]
    Io {
        /// The lock file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Who is taking the lock, written into the file for the next one to read.
#[derive(Debug, Clone)]
pub struct Holder<'a> {
    /// The plugin's index.
    pub index: &'a str,
    /// The plugin's name.
    pub name: &'a str,
    /// The runtime's NRI socket.
    pub socket: &'a Path,
}

impl Holder<'_> {
    fn describe(&self) -> String {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_default();
        format!(
            "pid {} on host {host:?}, NRI plugin {}-{} at {}",
            std::process::id(),
            self.index,
            self.name,
            self.socket.display()
        )
    }
}

/// The held lock; dropping it (or the process ending) releases it.
#[derive(Debug)]
pub struct PluginLock {
    _file: File,
    path: PathBuf,
}

impl PluginLock {
    /// Takes the lock on `dir` (created if missing), waiting at most a
    /// short grace for a holder that is exiting; refuses, naming the
    /// holder, if it is still held after that.
    pub async fn acquire(dir: &Path, holder: &Holder<'_>) -> Result<Self, LockError> {
        Self::acquire_within(dir, holder, GRACE).await
    }

    async fn acquire_within(
        dir: &Path,
        holder: &Holder<'_>,
        grace: Duration,
    ) -> Result<Self, LockError> {
        let path = dir.join(LOCK_FILE);
        let io = |source| LockError::Io {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        // Not truncated on open: until it is ours, the holder's line stays.
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        let deadline = tokio::time::Instant::now() + grace;
        loop {
            match file.try_lock() {
                Ok(()) => break,
                Err(TryLockError::WouldBlock) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(POLL).await;
                }
                Err(TryLockError::WouldBlock) => {
                    return Err(LockError::Held {
                        dir: dir.to_path_buf(),
                        holder: read_holder(&mut file),
                        path,
                    });
                }
                Err(TryLockError::Error(e)) => return Err(io(e)),
            }
        }
        file.set_len(0).map_err(io)?;
        file.rewind().map_err(io)?;
        writeln!(file, "{}", holder.describe()).map_err(io)?;
        file.sync_all().map_err(io)?;
        Ok(Self { _file: file, path })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn read_holder(file: &mut File) -> String {
    let mut text = String::new();
    if file.rewind().is_ok() {
        let _ = file.read_to_string(&mut text);
    }
    let text = text.trim();
    if text.is_empty() {
        "unknown: it has not written its name yet".to_owned()
    } else {
        text.to_owned()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn holder(index: &str) -> Holder<'_> {
        Holder {
            index,
            name: "steward",
            socket: Path::new("/nonexistent/nri.sock"),
        }
    }

    #[tokio::test]
    async fn a_second_lock_on_the_same_directory_is_refused_naming_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let first = PluginLock::acquire_within(&state, &holder("10"), Duration::ZERO)
            .await
            .unwrap();
        assert_eq!(first.path(), state.join(LOCK_FILE));
        let err = PluginLock::acquire_within(&state, &holder("11"), Duration::from_millis(250))
            .await
            .unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, LockError::Held { .. }), "{msg}");
        assert!(
            msg.contains(&format!("pid {}", std::process::id())),
            "{msg}"
        );
        assert!(msg.contains("NRI plugin 10-steward"), "{msg}");
        assert!(msg.contains("Stop that one first"), "{msg}");
        // Released on drop (as on exit): the next one gets it and says so.
        drop(first);
        let _second = PluginLock::acquire_within(&state, &holder("11"), Duration::ZERO)
            .await
            .unwrap();
        let text = std::fs::read_to_string(state.join(LOCK_FILE)).unwrap();
        assert!(text.contains("NRI plugin 11-steward"), "{text}");
        assert_eq!(text.lines().count(), 1, "{text}");
    }

    #[tokio::test]
    async fn a_holder_that_exits_within_the_grace_is_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let first = PluginLock::acquire_within(dir.path(), &holder("10"), Duration::ZERO)
            .await
            .unwrap();
        let release = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            drop(first);
        });
        PluginLock::acquire_within(dir.path(), &holder("10"), Duration::from_secs(5))
            .await
            .unwrap();
        release.await.unwrap();
    }
}
