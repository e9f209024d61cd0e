//! `steward nri-plugin`: the resource manager attached to the runtime's NRI
//! socket. One session at a time; when the runtime closes it (a restart, a
//! late answer) the plugin reconnects and the runtime's Synchronize
//! reconciles. Updates the event pipeline or a lifecycle event collected
//! are sent with `UpdateContainers` on the current session.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use steward_nri::{NriError, RuntimeClient, Session, SessionConfig};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use super::convert;
use super::handler::ResmgrHandler;
use crate::assemble::{Assembled, assemble};
use crate::config::{ManagerConfig, RUNTIME_TIMEOUT_DEFAULT};
use crate::error::ResmgrError;
use crate::manager::{Event, ResourceManager, Updates};
use crate::relay;

/// Where the plugin attaches and as what, plus the resource manager (NRI
/// mode serves and calls nothing over CRI).
#[derive(Debug)]
pub struct NriConfig {
    /// The resource manager.
    pub manager: ManagerConfig,
    /// The runtime's NRI socket.
    pub socket: PathBuf,
    /// Plugin name.
    pub name: String,
    /// Plugin index (two digits; the runtime calls plugins in index order).
    pub index: String,
    /// Wait between connection attempts.
    pub reconnect: Duration,
    /// Also be the DRA driver `cpu.steward.dev` (`--dra-cpus`).
    pub dra: Option<crate::dra::DraCpuConfig>,
}

impl NriConfig {
    /// The upstream defaults: `/var/run/nri/nri.sock`, `steward`, `10`.
    pub fn new(manager: ManagerConfig) -> Self {
        Self {
            manager,
            socket: PathBuf::from("/var/run/nri/nri.sock"),
            name: "steward".into(),
            index: "10".into(),
            reconnect: Duration::from_secs(1),
            dra: None,
        }
    }
}

/// The current session's handle for calling the runtime.
type Current = Arc<Mutex<Option<RuntimeClient>>>;

/// A running NRI plugin.
pub struct NriPlugin {
    manager: Arc<ResourceManager>,
    handler: ResmgrHandler,
    stop: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    connected: watch::Receiver<u64>,
    _socket_guards: Vec<steward_nodeio::SocketGuard>,
}

impl std::fmt::Debug for NriPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NriPlugin").finish_non_exhaustive()
    }
}

fn check_index(index: &str) -> Result<(), ResmgrError> {
    let b = index.as_bytes();
    if b.len() == 2 && b.iter().all(u8::is_ascii_digit) {
        Ok(())
    } else {
        Err(ResmgrError::InvalidRequest(format!(
            "invalid NRI plugin index {index:?}: must be two digits (00-99)"
        )))
    }
}

impl NriPlugin {
    /// Start the resource manager (restored from its cache) and keep a
    /// session with the runtime: connect, register, be synchronised,
    /// reconnect whenever it ends.
    pub async fn start(cfg: NriConfig) -> Result<Self, ResmgrError> {
        check_index(&cfg.index)?;
        // Never dialled: every update goes over NRI.
        let upstream = relay::Upstream::new(&cfg.socket, RUNTIME_TIMEOUT_DEFAULT)?;
        let Assembled {
            manager,
            stop,
            mut tasks,
            socket_guards,
            saves,
        } = assemble(&cfg.manager, upstream, true).await?;
        if let Some(dra) = cfg.dra.clone() {
            tasks.extend(crate::dra::start(manager.clone(), dra, saves, stop.clone()));
        }
        let (updates_tx, updates_rx) = mpsc::unbounded_channel();
        manager.send_updates_to(updates_tx.clone());
        let handler = ResmgrHandler::new(manager.clone(), updates_tx);
        let current: Current = Arc::new(Mutex::new(None));
        tasks.push(tokio::spawn(send_updates(updates_rx, current.clone())));
        let (connected_tx, connected) = watch::channel(0);
        tasks.push(tokio::spawn(sessions(
            SessionConfig::new(cfg.socket.clone(), cfg.name.clone(), cfg.index.clone()),
            handler.clone(),
            current,
            cfg.reconnect,
            connected_tx,
            stop.clone(),
        )));
        let verify = cfg.manager.verify_interval;
        if !verify.is_zero() {
            let m = manager.clone();
            tasks.push(tokio::spawn(async move {
                let mut tick = tokio::time::interval(verify);
                tick.tick().await;
                loop {
                    tick.tick().await;
                    m.post(Event::Rebalance);
                    m.post(Event::Verify);
                }
            }));
        }
        Ok(Self {
            manager,
            handler,
            stop,
            tasks,
            connected,
            _socket_guards: socket_guards,
        })
    }

    /// The resource manager (for inspection).
    pub fn manager(&self) -> &Arc<ResourceManager> {
        &self.manager
    }

    /// How long CreateContainer answers took, oldest first (at most 1,024).
    pub fn create_times(&self) -> Vec<Duration> {
        self.handler.create_times()
    }

    /// Exclusive containers found unpinned at a Synchronize and re-pinned.
    pub fn fail_open_repinned(&self) -> usize {
        self.handler.fail_open_repinned()
    }

    /// Waits until the plugin has registered `n` times in all (1: the
    /// first session; 2: it reconnected once); false after `limit`.
    pub async fn registered(&self, n: u64, limit: Duration) -> bool {
        let mut rx = self.connected.clone();
        tokio::time::timeout(limit, rx.wait_for(|c| *c >= n))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Stop, persist the cache.
    pub async fn shutdown(mut self) {
        self.stop.cancel();
        for t in self.tasks.drain(..) {
            t.abort();
        }
        let _ = self.manager.snapshot().await;
        info!("NRI plugin stopped");
    }
}

impl Drop for NriPlugin {
    fn drop(&mut self) {
        self.stop.cancel();
        for t in self.tasks.drain(..) {
            t.abort();
        }
    }
}

/// Connect, register, serve until the runtime closes the session; again.
async fn sessions(
    cfg: SessionConfig,
    handler: ResmgrHandler,
    current: Current,
    reconnect: Duration,
    connected: watch::Sender<u64>,
    stop: CancellationToken,
) {
    let mut said_no_socket = false;
    loop {
        match Session::start(cfg.clone(), handler.clone()).await {
            Ok(mut session) => {
                said_no_socket = false;
                set(&current, Some(session.runtime()));
                connected.send_modify(|n| *n += 1);
                let reason = tokio::select! {
                    r = session.closed() => r,
                    () = stop.cancelled() => return,
                };
                set(&current, None);
                warn!(%reason, "the NRI session ended; reconnecting");
            }
            Err(e @ NriError::NoSocket { .. }) => {
                if !said_no_socket {
                    error!("{e}");
                    said_no_socket = true;
                } else {
                    debug!("{e}");
                }
            }
            Err(e @ NriError::Registration { .. }) => {
                error!(error = %e, "registration refused (is another plugin registered with this index and name?); retrying");
            }
            Err(e) => warn!(error = %e, "connecting to the runtime's NRI socket failed; retrying"),
        }
        tokio::select! {
            () = tokio::time::sleep(reconnect) => {}
            () = stop.cancelled() => return,
        }
    }
}

fn set(current: &Current, c: Option<RuntimeClient>) {
    if let Ok(mut g) = current.lock() {
        *g = c;
    }
}

/// Send collected updates with `UpdateContainers` on the current session;
/// with none, they wait for the next Synchronize (which re-checks every
/// container).
async fn send_updates(mut rx: mpsc::UnboundedReceiver<Updates>, current: Current) {
    while let Some(batch) = rx.recv().await {
        let client = current.lock().ok().and_then(|g| g.clone());
        let Some(client) = client else {
            debug!(
                updates = batch.len(),
                "no NRI session; the next Synchronize re-checks them"
            );
            continue;
        };
        match client
            .update_containers(convert::updates(&batch), Vec::new())
            .await
        {
            Ok(failed) if failed.is_empty() => {
                debug!(updates = batch.len(), "containers updated");
            }
            Ok(failed) => warn!(
                failed = failed.len(),
                "the runtime could not update some containers"
            ),
            Err(e) => warn!(error = %e, "UpdateContainers failed"),
        }
    }
}
