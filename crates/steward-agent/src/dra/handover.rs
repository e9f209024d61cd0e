//! Two agents on one node during a roll: how the DRA kubelet plugin hands
//! over with no refused call.
//!
//! A DaemonSet rolling with `maxSurge` starts the new agent's pod beside the
//! old one. kubelet (1.33+) keeps both plugins registered when their
//! sockets are named per pod (`steward.dev-<pod uid>-reg.sock`,
//! `dra-<pod uid>.sock`, as upstream's kubelet plugin helper names them)
//! and calls the newest connected one. Only one agent may hold the node's
//! store, so the new agent starts as a **successor**:
//!
//! 1. it serves its kubelet plugin at once, before it holds the store;
//! 2. a call that reaches it before it holds the store is relayed, bytes
//!    unchanged, to the agent before it ([`Peers`]: the other live DRA
//!    socket in the driver's directory), which prepares on its own ledger;
//! 3. it is ready once kubelet registered it, so the DaemonSet stops the
//!    old pod; the old agent answers Unavailable from the moment it stops
//!    ([`CoreReader::now`]), keeps its ResourceSlices for its successor and
//!    frees the store;
//! 4. a call the old agent could not answer waits for the new agent's own
//!    ledger ([`CoreReader::wait`]), which has every claim the old one
//!    prepared (the store is the node's). Prepare and unprepare are
//!    idempotent, so a call relayed whose answer was lost is simply served
//!    again.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::watch;
use tonic::Status;
use tonic::transport::Channel;

use crate::slot_keeper::SlotKeeper;

/// Where this agent's slot ledger is, once it holds the node's store.
pub(crate) struct CoreSlot<L, C> {
    tx: watch::Sender<Option<Weak<SlotKeeper<L, C>>>>,
}

impl<L, C> CoreSlot<L, C> {
    pub(crate) fn new() -> Self {
        Self {
            tx: watch::Sender::new(None),
        }
    }

    /// The ledger is up: calls are served on it from now on.
    pub(crate) fn set(&self, core: Weak<SlotKeeper<L, C>>) {
        self.tx.send_replace(Some(core));
    }

    pub(crate) fn reader(&self) -> CoreReader<L, C> {
        CoreReader {
            rx: self.tx.subscribe(),
        }
    }
}

/// What a call reads the ledger through.
pub(crate) struct CoreReader<L, C> {
    rx: watch::Receiver<Option<Weak<SlotKeeper<L, C>>>>,
}

impl<L, C> Clone for CoreReader<L, C> {
    fn clone(&self) -> Self {
        Self {
            rx: self.rx.clone(),
        }
    }
}

fn shutting_down() -> Status {
    Status::unavailable("steward agent is shutting down")
}

impl<L, C> CoreReader<L, C> {
    /// `None` while this agent does not hold the store yet; the ledger once
    /// it does; Unavailable once it is stopping.
    pub(crate) fn now(&self) -> Option<Result<Arc<SlotKeeper<L, C>>, Status>> {
        let core = self.rx.borrow().clone()?;
        Some(core.upgrade().ok_or_else(shutting_down))
    }

    /// The ledger, waiting up to `hold` for this agent to hold the store.
    pub(crate) async fn wait(&self, hold: Duration) -> Result<Arc<SlotKeeper<L, C>>, Status> {
        let mut rx = self.rx.clone();
        match tokio::time::timeout(hold, rx.wait_for(Option::is_some)).await {
            Ok(Ok(core)) => core
                .as_ref()
                .and_then(Weak::upgrade)
                .ok_or_else(shutting_down),
            Ok(Err(_)) => Err(shutting_down()),
            Err(_) => Err(Status::unavailable(format!(
                "steward agent does not hold the node's store yet (waited {hold:?}); the agent before it is still stopping"
            ))),
        }
    }
}

/// The other instances of this driver's kubelet plugin on the node: the
/// agent before this one during a roll (or after it, seen from the old
/// one).
#[derive(Debug, Clone)]
pub(crate) struct Peers {
    dir: PathBuf,
    own: PathBuf,
    connect_timeout: Duration,
}

impl Peers {
    /// The plugins whose DRA sockets are in `dir`, other than `own`.
    pub(crate) fn new(dir: &Path, own: &Path) -> Self {
        Self {
            dir: dir.to_owned(),
            own: own.to_owned(),
            connect_timeout: Duration::from_secs(3),
        }
    }

    /// The other DRA sockets in the directory (`dra.sock`, `dra-<uid>.sock`),
    /// in name order; a socket left by a killed pod is among them.
    pub(crate) fn sockets(&self) -> Vec<PathBuf> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut found: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .filter(|e| {
                e.file_name()
                    .to_str()
                    .is_some_and(|n| n.starts_with("dra") && n.ends_with(".sock"))
            })
            .map(|e| e.path())
            .filter(|p| *p != self.own)
            .collect();
        found.sort();
        found
    }

    /// A channel to the first other plugin that accepts a connection; a
    /// stale socket refuses one.
    pub(crate) async fn connect(&self) -> Option<(PathBuf, Channel)> {
        for socket in self.sockets() {
            let channel = steward_proto::uds::endpoint()
                .connect_timeout(self.connect_timeout)
                .connect_with_connector(steward_proto::uds::UnixConnector::new(&socket))
                .await;
            if let Ok(channel) = channel {
                return Some((socket, channel));
            }
        }
        None
    }

    /// Whether another plugin of the driver is serving on the node.
    pub(crate) async fn any_serving(&self) -> bool {
        self.connect().await.is_some()
    }

    /// Removes what plugin instances that no longer serve left behind (a
    /// pod killed before it could remove its sockets): each other DRA
    /// socket nothing listens on (the connection refused, not merely slow)
    /// and its registration socket in `registry_dir`, so kubelet's plugin
    /// watcher stops dialling it and the directory does not fill up with
    /// one pair per pod ever run.
    pub(crate) async fn remove_stale(&self, registry_dir: &Path, driver: &str) -> Vec<PathBuf> {
        let mut removed = Vec::new();
        for socket in self.sockets() {
            match tokio::net::UnixStream::connect(&socket).await {
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {}
                _ => continue,
            }
            let Some(instance) = socket
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_prefix("dra"))
                .and_then(|n| n.strip_suffix(".sock"))
            else {
                continue;
            };
            let registration = registry_dir.join(format!("{driver}{instance}-reg.sock"));
            for path in [socket.clone(), registration] {
                match std::fs::remove_file(&path) {
                    Ok(()) => removed.push(path),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        tracing::warn!(path = %path.display(), error = %e, "cannot remove a stale DRA plugin socket");
                    }
                }
            }
        }
        removed
    }
}

/// Whether a relayed call's failure means the peer did not (or may not
/// have) served it, so this agent serves it itself: the peer is stopping
/// or gone. A call the peer answered with its own verdict is returned as
/// it is.
pub(crate) fn peer_gone(status: &Status) -> bool {
    matches!(
        status.code(),
        tonic::Code::Unavailable | tonic::Code::Cancelled | tonic::Code::Unknown
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_are_the_other_dra_sockets_of_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            "dra.sock",
            "dra-a.sock",
            "dra-b.sock",
            "serialize.lock",
            "other.sock",
        ] {
            std::fs::write(dir.path().join(name), b"").unwrap();
        }
        let peers = Peers::new(dir.path(), &dir.path().join("dra-b.sock"));
        assert_eq!(
            peers.sockets(),
            vec![dir.path().join("dra-a.sock"), dir.path().join("dra.sock")]
        );
    }

    #[tokio::test]
    async fn a_socket_nobody_serves_is_no_peer() {
        let dir = tempfile::tempdir().unwrap();
        let stale = dir.path().join("dra-old.sock");
        drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
        let peers = Peers::new(dir.path(), &dir.path().join("dra-new.sock"));
        assert_eq!(peers.sockets(), vec![stale]);
        assert!(!peers.any_serving().await);
    }

    #[tokio::test]
    async fn stale_sockets_go_with_their_registration_and_live_ones_stay() {
        let dir = tempfile::tempdir().unwrap();
        let (plugins, registry) = (dir.path().join("plugins"), dir.path().join("registry"));
        std::fs::create_dir_all(&plugins).unwrap();
        std::fs::create_dir_all(&registry).unwrap();
        // A pod killed: both its sockets left, nothing listening.
        drop(std::os::unix::net::UnixListener::bind(plugins.join("dra-old.sock")).unwrap());
        drop(std::os::unix::net::UnixListener::bind(registry.join("d-old-reg.sock")).unwrap());
        // The agent before this one, still serving.
        let _live = std::os::unix::net::UnixListener::bind(plugins.join("dra-live.sock")).unwrap();
        let _live_reg =
            std::os::unix::net::UnixListener::bind(registry.join("d-live-reg.sock")).unwrap();
        let peers = Peers::new(&plugins, &plugins.join("dra-new.sock"));
        let removed = peers.remove_stale(&registry, "d").await;
        assert_eq!(
            removed,
            vec![
                plugins.join("dra-old.sock"),
                registry.join("d-old-reg.sock")
            ]
        );
        assert!(plugins.join("dra-live.sock").exists());
        assert!(registry.join("d-live-reg.sock").exists());
    }

    #[tokio::test]
    async fn a_reader_waits_for_the_ledger_and_says_when_it_is_gone() {
        let slot: CoreSlot<(), ()> = CoreSlot::new();
        let reader = slot.reader();
        assert!(reader.now().is_none());
        let err = reader.wait(Duration::from_millis(20)).await.err().unwrap();
        assert_eq!(err.code(), tonic::Code::Unavailable);
        assert!(err.message().contains("does not hold the node's store yet"));
        // A ledger that has gone (the agent stopping): Unavailable at once.
        slot.set(Weak::new());
        let err = reader.now().unwrap().err().unwrap();
        assert!(err.message().contains("shutting down"));
        assert!(peer_gone(&err));
    }
}
