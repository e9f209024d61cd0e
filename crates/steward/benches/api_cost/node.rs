//! One simulated node: the real `steward agent` and the resource manager's
//! cluster side, each with its own client naming itself as the binaries do
//! (`steward-agent/<version> (<node>)`, `steward-resmgr/<version> (<node>)`).
//!
//! * The agent is `steward_agent::run` configured as `steward agent` with
//!   the chart's defaults (Kubernetes mode, device plugins, CDI, pod
//!   resources with watch; no DRA), its embedded discovery handlers
//!   replaced by two that report this node's devices. There is no kubelet:
//!   the device plugins bind their sockets in a private directory and never
//!   register (kubelet.sock is absent), kubelet's pod resources socket is
//!   absent, so Allocate is never called; the kubelet simulator writes the
//!   claims through a claim store on the agent's client (see [`SimNode::hold`]).
//!   With `STEWARD_BENCH_DRA=1` the agent also publishes ResourceSlices
//!   (`--dra`), without the DRA kubelet plugin (nothing to register with).
//! * The resource manager is `NriPlugin::start` configured as `steward
//!   nri-plugin --cluster` (a synthetic 16-CPU sysfs, an empty cgroupfs):
//!   ConfigMap and Node watches, the Node publication, the Reservation holds
//!   and its Events. No runtime is attached (the NRI socket is absent), so
//!   no container is ever placed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use steward_agent::claims::{ClaimStore, InstanceDirectory, InstanceRef, KubeClaimStore};
use steward_agent::deviceplugin::DevicePluginConfig;
use steward_agent::pod_resources::PodResourcesConfig;
use steward_agent::{AgentConfig, Mode};
use steward_core::Millis;
use steward_core::ledger::{Holder, Holding, PodRef};
use steward_core::slots::Claim;
use steward_discovery::{Device, DeviceStream, DiscoverRequest, DiscoveryError, DiscoveryHandler};
use steward_resmgr::nri::{NriConfig, NriPlugin};
use steward_resmgr::{ClusterConfig, ManagerConfig};
use steward_testing_apiserver::ApiServer;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::stand::{self, LOCAL, SHARED};

/// An embedded discovery handler reporting a fixed list once (a node's
/// devices as udev would find them) and nothing more.
struct NodeDevices {
    name: &'static str,
    shared: bool,
    ids: Vec<String>,
}

impl DiscoveryHandler for NodeDevices {
    fn name(&self) -> &str {
        self.name
    }

    fn shared(&self) -> bool {
        self.shared
    }

    fn discover(&self, _req: DiscoverRequest) -> Result<DeviceStream, DiscoveryError> {
        let devices: Vec<Device> = self
            .ids
            .iter()
            .map(|id| Device {
                id: id.clone(),
                properties: BTreeMap::from([("BENCH_DEVICE".to_owned(), id.clone())]),
                mounts: Vec::new(),
                device_specs: Vec::new(),
            })
            .collect();
        Ok(Box::pin(
            futures::stream::once(async move { Ok(devices) }).chain(futures::stream::pending()),
        ))
    }
}

pub struct SimNode {
    pub name: String,
    /// A claim store on the agent's client: what the agent's slot ledger
    /// writes through after Allocate and after the pod is seen.
    claims: KubeClaimStore,
    epoch: AtomicU64,
    stop: CancellationToken,
    agent: JoinHandle<()>,
    resmgr: Option<NriPlugin>,
}

impl SimNode {
    pub async fn start(
        api: &ApiServer,
        i: usize,
        n: usize,
        root: &Path,
        sysfs: &Path,
        dra: bool,
    ) -> SimNode {
        let name = stand::node_name(i);
        let dir = root.join(&name);
        let kubelet = dir.join("kubelet");
        for d in [
            kubelet.join("pod-resources"),
            dir.join("cdi"),
            dir.join("cgroup"),
        ] {
            std::fs::create_dir_all(d).unwrap();
        }
        let ua = steward_kube::client::user_agent("agent", Some(&name));
        let client = api.client_with_user_agent(&ua).unwrap();
        let mut cfg = AgentConfig::new(
            &name,
            dir.join("state"),
            dir.join("registration.sock"),
            Mode::Kubernetes(client.clone()),
        );
        let (local, shared) = stand::devices_of(i, n);
        cfg.embedded_handlers = vec![
            Arc::new(NodeDevices {
                name: LOCAL,
                shared: false,
                ids: local,
            }),
            Arc::new(NodeDevices {
                name: SHARED,
                shared: true,
                ids: shared,
            }),
        ];
        cfg.device_plugins = Some(DevicePluginConfig::new(&kubelet, Some(dir.join("cdi"))));
        let mut pr = PodResourcesConfig::new(kubelet.join("pod-resources").join("steward.sock"));
        pr.kubelet_socket = Some(kubelet.join("pod-resources").join("kubelet.sock"));
        cfg.pod_resources = Some(pr);
        // `--dra` without its kubelet plugin (no kubelet to register with):
        // the ResourceSlices and their watches.
        cfg.dra_slices = dra;
        // As the chart runs it beside the controller: the controller's
        // leader follows the Node deletions and keeps the node labels the
        // agent's watches select by. STEWARD_BENCH_AGENT_WATCHES=all runs
        // the agents as before those (every object, every Node), for a
        // baseline from the same build.
        let all = std::env::var("STEWARD_BENCH_AGENT_WATCHES").is_ok_and(|v| v == "all");
        cfg.follow_node_deletions = all;
        cfg.select_by_node_labels = !all;
        let stop = CancellationToken::new();
        let agent = tokio::spawn({
            let (stop, name) = (stop.clone(), name.clone());
            async move {
                if let Err(e) = steward_agent::run(cfg, stop.cancelled_owned()).await {
                    eprintln!("api_cost: agent {name} stopped: {e}");
                }
            }
        });
        let resmgr = start_resmgr(api, &name, &dir, sysfs).await;
        SimNode {
            name,
            claims: KubeClaimStore::new(client, InstanceDirectory::new()),
            epoch: AtomicU64::new(1 << 32),
            stop,
            agent,
            resmgr,
        }
    }

    /// Makes the store resolve Instances without asking, as the agent's
    /// does from its Instance watch.
    pub fn know(&self, instances: &[InstanceRef]) {
        for r in instances {
            self.claims.directory().insert(r.clone());
        }
    }

    /// The device plugin's claims for pod `pod` on `slots`, as the agent's
    /// slot ledger makes them: at Allocate a pending claim (owned by the
    /// Instance), then, once kubelet shows the pod using the slot, the
    /// claim naming it (owned by the pod). Returns the epochs written.
    pub async fn hold(&self, pod: &PodRef, slots: &[String]) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        for slot in slots {
            let epoch = self.epoch.fetch_add(1, Ordering::Relaxed);
            let pending = Claim {
                node: self.name.clone(),
                epoch,
                holding: Holding::pending(slot, Millis(epoch)),
                awaiting: Some(Millis(epoch)),
            };
            self.claims.write(&pending).await.unwrap();
            let epoch = self.epoch.fetch_add(1, Ordering::Relaxed);
            let held = Claim {
                node: self.name.clone(),
                epoch,
                holding: Holding::held(
                    slot,
                    Holder::new(pod.clone(), Some("main".into())),
                    Millis(epoch),
                ),
                awaiting: None,
            };
            self.claims.write(&held).await.unwrap();
            out.push((slot.clone(), epoch));
        }
        out
    }

    /// The slot ledger's release when the pod is gone.
    pub async fn release(&self, held: &[(String, u64)]) {
        for (slot, epoch) in held {
            self.claims.delete(slot, &self.name, *epoch).await.unwrap();
        }
    }

    pub async fn shutdown(self) {
        self.stop.cancel();
        let abort = self.agent.abort_handle();
        if tokio::time::timeout(Duration::from_secs(10), self.agent)
            .await
            .is_err()
        {
            abort.abort();
        }
        if let Some(r) = self.resmgr {
            r.shutdown().await;
        }
    }
}

async fn start_resmgr(api: &ApiServer, name: &str, dir: &Path, sysfs: &Path) -> Option<NriPlugin> {
    let ua = steward_kube::client::user_agent("resmgr", Some(name));
    let client = api.client_with_user_agent(&ua).unwrap();
    let mut m = ManagerConfig::new(dir.join("resmgr"));
    m.sysfs_root = sysfs.to_owned();
    m.cgroup_root = dir.join("cgroup");
    m.resctrl_root = dir.join("resctrl");
    m.cluster = Some(ClusterConfig::new(client, name));
    let mut nri = NriConfig::new(m);
    nri.socket = dir.join("nri.sock");
    match NriPlugin::start(nri).await {
        Ok(p) => Some(p),
        Err(e) => {
            eprintln!("api_cost: resource manager of {name} did not start: {e}");
            None
        }
    }
}

/// A synthetic machine for the resource managers: 2 sockets, 4 NUMA nodes,
/// 16 CPUs.
pub fn write_sysfs(root: &Path) -> PathBuf {
    let (_, topo) = steward_topology::fixture::fixture_specs()
        .unwrap()
        .into_iter()
        .next()
        .unwrap();
    let sysfs = root.join("sysfs");
    steward_topology::fixture::write_sysfs(&sysfs, &topo).unwrap();
    sysfs
}
