//! The live view: follows the agent's pod resources watch (one stream over
//! every device slot and every CPU and memory assignment on the node),
//! prints one line per event and keeps what the summary needs.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use steward_proto::podresources::v1 as wire;
use steward_proto::podresources::v1::pod_resources_lister_client::PodResourcesListerClient;
use tokio::sync::Notify;

use crate::Narrator;

/// What one pod showed on the watch.
#[derive(Debug, Clone, Default)]
pub(crate) struct PodSeen {
    pub devices: Vec<String>,
    pub cpus: Vec<i64>,
    pub memory: u64,
    /// Devices and CPUs in one event (the same pod, one view).
    pub both_at_once: bool,
    /// When the watch first showed its device slots released.
    pub released_at: Option<Instant>,
}

#[derive(Debug, Default)]
pub(crate) struct ViewState {
    pub pods: BTreeMap<String, PodSeen>,
    /// device id → uid of the pod holding it now.
    holders: BTreeMap<String, String>,
    pub events: u64,
    /// A device shown held by two live pods at once.
    pub double_grants: u64,
}

pub(crate) struct View {
    pub state: Arc<Mutex<ViewState>>,
    pub changed: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for View {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl View {
    pub async fn follow(socket: &Path, say: &Narrator) -> anyhow::Result<View> {
        let channel = steward_proto::uds::endpoint()
            .connect_timeout(Duration::from_secs(5))
            .connect_with_connector(steward_proto::uds::UnixConnector::new(socket))
            .await
            .with_context(|| format!("connecting to {}", socket.display()))?;
        let mut stream = PodResourcesListerClient::new(channel)
            .list_and_watch(wire::ListAndWatchPodResourcesRequest {})
            .await
            .context("ListAndWatch")?
            .into_inner();
        let state = Arc::new(Mutex::new(ViewState::default()));
        let changed = Arc::new(Notify::new());
        let (st, ch, narrator) = (state.clone(), changed.clone(), say.clone());
        let task = tokio::spawn(async move {
            while let Some(Ok(event)) = stream.next().await {
                let line = match st.lock() {
                    Ok(mut s) => s.apply(&event),
                    Err(_) => return,
                };
                narrator.say(line);
                ch.notify_waiters();
            }
        });
        say.say(format!("live view: following {}", socket.display()));
        Ok(View {
            state,
            changed,
            task,
        })
    }

    /// Waits until `f` holds on the view, up to `timeout`.
    pub async fn wait<F: Fn(&ViewState) -> bool>(
        &self,
        what: &str,
        timeout: Duration,
        f: F,
    ) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.changed.notified();
            {
                let s = self
                    .state
                    .lock()
                    .map_err(|_| anyhow::anyhow!("view state poisoned"))?;
                if f(&s) {
                    return Ok(());
                }
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                anyhow::bail!("{what}: not seen on the watch within {timeout:?}");
            }
        }
    }
}

impl ViewState {
    fn apply(&mut self, e: &wire::ListAndWatchPodResourcesResponse) -> String {
        self.events += 1;
        let action = match wire::WatchPodAction::try_from(e.action) {
            Ok(wire::WatchPodAction::Added) => "ADDED  ",
            Ok(wire::WatchPodAction::Updated) => "UPDATED",
            Ok(wire::WatchPodAction::Deleted) => "DELETED",
            Err(_) => "?      ",
        };
        let Some(pod) = e.pod_resources.first() else {
            return format!("{action} {} (no pod state)", e.uid);
        };
        let mut devices = Vec::new();
        let mut cpus = Vec::new();
        let mut memory = 0;
        for c in &pod.containers {
            for d in &c.devices {
                devices.extend(d.device_ids.iter().cloned());
            }
            cpus.extend(c.cpu_ids.iter().copied());
            memory += c.memory.iter().map(|m| m.size).sum::<u64>();
        }
        let deleted = action == "DELETED";
        // Holders: release what this pod no longer holds, then acquire.
        self.holders.retain(|_, uid| *uid != e.uid);
        if !deleted {
            for d in &devices {
                if let Some(other) = self.holders.insert(d.clone(), e.uid.clone())
                    && other != e.uid
                {
                    self.double_grants += 1;
                }
            }
        }
        let seen = self.pods.entry(e.uid.clone()).or_default();
        if (deleted || devices.is_empty()) && !seen.devices.is_empty() && seen.released_at.is_none()
        {
            seen.released_at = Some(Instant::now());
        }
        if !deleted {
            if !devices.is_empty() {
                seen.devices = devices.clone();
            }
            if !cpus.is_empty() {
                seen.cpus = cpus.clone();
                seen.memory = memory;
            }
            seen.both_at_once |= !devices.is_empty() && !cpus.is_empty();
        }
        let cpus_text = if cpus.is_empty() {
            "-".to_owned()
        } else {
            format!("{cpus:?}")
        };
        let mem_text = if memory == 0 {
            String::new()
        } else {
            format!(" memory={}Mi", memory >> 20)
        };
        format!(
            "view {action} {}/{}  devices={devices:?} cpus={cpus_text}{mem_text}",
            pod.namespace, pod.name
        )
    }
}
