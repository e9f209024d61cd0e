//! Starts and stops the pieces: API server and kubelet stand-ins, the real
//! agent and, when containerd can be had, the real resource manager on it:
//! the NRI plugin attached to a private containerd 2.1.9 (the default), or
//! the CRI proxy in front of containerd 1.6.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{ListParams, PostParams};
use steward_agent::deviceplugin::DevicePluginConfig;
use steward_agent::pod_resources::PodResourcesConfig;
use steward_agent::{AgentConfig, AgentError, AgentTimings, Mode};
use steward_api::{Configuration, ConfigurationSpec, Instance};
use steward_resmgr::nri::{NriConfig, NriPlugin};
use steward_resmgr::{ManagerConfig, Proxy, ProxyConfig};
use steward_testing_apiserver::ApiServer;
use steward_testing_containerd::{CONTAINERD2_BIN_ENV, Containerd, Containerd2, runtime_version};
use steward_testing_kubelet::{Kubelet, KubeletConfig};
use tokio::task::JoinHandle;

use crate::{Narrator, Options, Runtime};

pub(crate) const NODE: &str = "demo-node";
pub(crate) const NS: &str = "default";
const WAIT: Duration = Duration::from_secs(60);

/// The CRI side: containerd and the resource manager on it.
pub(crate) struct Cri {
    /// Where the kubelet stand-in's CRI calls go: containerd's own socket
    /// (NRI) or the proxy's.
    pub socket: PathBuf,
    /// The cgroup parent the pods go under (private to that containerd).
    pub cgroup_parent: String,
    /// The runtime, as its CRI `Version` names it: "containerd 2.1.9".
    pub runtime: String,
    /// Who pins, on what: "the NRI plugin on containerd 2.1.9".
    pub pinned_by: String,
    /// How the containers reach containerd, for the narration.
    pub route: &'static str,
    /// The PID of a containerd this run started (and stops).
    pub own_containerd_pid: Option<u32>,
    backend: Backend,
}

enum Backend {
    /// `steward nri-plugin` attached to a private containerd 2.x.
    Nri {
        plugin: NriPlugin,
        containerd: Containerd2,
    },
    /// `steward cri-proxy` in front of containerd 1.6.
    Proxy {
        proxy: Proxy,
        containerd: Arc<Containerd>,
    },
}

pub(crate) struct Stage {
    pub dir: tempfile::TempDir,
    pub api: ApiServer,
    pub kubelet: Kubelet,
    pub cri: Option<Cri>,
    /// Why the CRI part was skipped, when it was.
    pub cri_skipped: Option<String>,
    /// The agent's pod resources socket (the live view).
    pub view_socket: PathBuf,
    /// The camera Instances' extended resource names.
    pub resources: Vec<String>,
    agent: JoinHandle<Result<(), AgentError>>,
    stop_agent: tokio::sync::oneshot::Sender<()>,
}

impl Stage {
    pub async fn start(opts: &Options, say: &Narrator) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("steward-demo-")
            .tempdir()
            .context("creating a temporary directory")?;
        let (cri, cri_skipped) = if opts.cri {
            let started = match opts.runtime {
                Runtime::Nri => start_nri(&dir, say).await,
                Runtime::CriProxy => start_proxy(&dir, say).await,
            };
            match started {
                Ok(c) => (Some(c), None),
                Err(e) => (None, Some(format!("{e:#}"))),
            }
        } else {
            (None, Some("not asked for (--no-cri)".to_owned()))
        };
        if let Some(why) = &cri_skipped {
            say.say(format!(
                "SKIPPED the CRI part (containers, CPU pinning): {why}"
            ));
        }

        let api = ApiServer::start()
            .await
            .context("starting the API server stand-in")?;
        let crds: Api<CustomResourceDefinition> = Api::all(api.client());
        for crd in steward_api::crds() {
            crds.create(&PostParams::default(), &crd)
                .await
                .context("creating steward's CRDs")?;
        }
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": { "name": NODE, "labels": { "kubernetes.io/os": "linux" } },
        }))?;
        Api::<Node>::all(api.client())
            .create(&PostParams::default(), &node)
            .await
            .context("creating the Node")?;
        let root = dir.path().join("kubelet");
        let kubelet = Kubelet::start(KubeletConfig {
            root_dir: root.clone(),
            node_name: NODE.into(),
            api: Some(api.client()),
        })
        .await
        .context("starting the kubelet stand-in")?;
        say.say(format!(
            "kubelet stand-in up: device plugins at {}",
            kubelet.plugin_dir().display()
        ));

        let view_socket = dir.path().join("pod-resources.sock");
        let mut cfg = AgentConfig::new(
            NODE,
            dir.path().join("agent-state"),
            dir.path().join("registration.sock"),
            Mode::Kubernetes(api.client()),
        );
        cfg.embedded_handlers =
            steward_agent::embedded_handlers(&["debug-echo", "udev"], &Default::default())?;
        cfg.timings = AgentTimings {
            tick_interval: Duration::from_millis(100),
            file_poll_interval: Duration::from_millis(100),
            max_conflict_retries: 8,
        };
        let mut dp = DevicePluginConfig::new(&root, Some(dir.path().join("cdi")));
        dp.poll = Duration::from_millis(100);
        cfg.device_plugins = Some(dp);
        let mut pr = PodResourcesConfig::new(&view_socket);
        pr.cri_socket = cri.as_ref().map(|_| cri_view_socket(&dir));
        cfg.pod_resources = Some(pr);
        let (stop_agent, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let agent = tokio::spawn(steward_agent::run(cfg, async move {
            let _ = stop_rx.await;
        }));
        say.say("steward agent up: embedded handlers debug-echo and udev, device plugins, pod resources with watch");

        let resources = configure(&api, opts, say).await?;
        for res in &resources {
            let want = opts.capacity as usize;
            kubelet
                .wait_for_resource(res, |s| s.healthy.len() == want, WAIT)
                .await
                .with_context(|| format!("{res} advertised to kubelet"))?;
        }
        say.say(format!(
            "kubelet sees {} device plugin(s), {} slot(s) in all",
            resources.len(),
            resources.len() * opts.capacity as usize
        ));
        Ok(Stage {
            dir,
            api,
            kubelet,
            cri,
            cri_skipped,
            view_socket,
            resources,
            agent,
            stop_agent,
        })
    }

    /// Stops the agent, the resource manager and containerd (if we started
    /// it); the pods this process created in an attached containerd are
    /// removed.
    pub async fn stop(self, say: &Narrator) {
        let _ = self.stop_agent.send(());
        match tokio::time::timeout(Duration::from_secs(15), self.agent).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => say.say(format!("agent stopped with an error: {e}")),
            Ok(Err(e)) => say.say(format!("agent task failed: {e}")),
            Err(_) => say.say("agent did not stop within 15 s; aborted"),
        }
        if let Some(cri) = self.cri {
            match cri.backend {
                Backend::Nri { plugin, containerd } => {
                    plugin.shutdown().await;
                    // Runs `containerd.sh stop`: containerd, its shims and
                    // cgroups gone.
                    let _ = tokio::task::spawn_blocking(move || drop(containerd)).await;
                }
                Backend::Proxy { proxy, containerd } => {
                    proxy.shutdown().await;
                    let _ = tokio::task::spawn_blocking(move || drop(containerd)).await;
                }
            }
        }
        drop(self.kubelet);
        drop(self.api);
        drop(self.dir);
        say.say("everything stopped; nothing left running");
    }
}

fn cri_view_socket(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("cri-pod-resources.sock")
}

/// The resource manager's configuration, the same on both transports: the
/// static policy, no periodic verify, its pod resources socket for the
/// agent's view.
fn manager_config(dir: &tempfile::TempDir, cfg: &mut ManagerConfig) -> anyhow::Result<()> {
    let config = dir.path().join("resmgr.yaml");
    std::fs::write(&config, "policy: { active: static }\n")?;
    cfg.config_file = Some(config);
    cfg.verify_interval = Duration::ZERO;
    cfg.pod_resources_socket = Some(cri_view_socket(dir));
    Ok(())
}

/// "containerd 2.1.9" from the runtime's CRI `Version` (Debian's revision
/// suffix dropped).
async fn runtime_name(sock: &std::path::Path) -> String {
    match runtime_version(sock).await {
        Ok(v) => {
            let version = v.version.trim_start_matches('v');
            let version = version.split(['~', '+', '-']).next().unwrap_or(version);
            format!("{} {version}", v.name)
        }
        Err(_) => "containerd".to_owned(),
    }
}

/// The effective uid, read from /proc.
fn euid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// The default install: a private containerd 2.1.9 with NRI on and the NRI
/// plugin attached to it; the kubelet stand-in talks to containerd itself.
async fn start_nri(dir: &tempfile::TempDir, say: &Narrator) -> anyhow::Result<Cri> {
    anyhow::ensure!(
        euid() == Some(0),
        "containerd 2.1.9 needs root (run scripts/local-run as root)"
    );
    let Some(bin) = steward_testing_containerd::bin_dir() else {
        anyhow::bail!(
            "containerd 2.1.9 not found (scripts/local-run fetches it with scripts/containerd2.sh; or export {CONTAINERD2_BIN_ENV})"
        );
    };
    let containerd = tokio::task::spawn_blocking(move || Containerd2::try_start(bin))
        .await
        .context("starting containerd 2.1.9")?
        .context("containerd 2.1.9 did not start (needs root and the runc, busybox-static and CNI plugin packages; scripts/local-run installs them)")?;
    let name = runtime_name(&containerd.sock()).await;
    say.say(format!(
        "{name} up (NRI on) at {}",
        containerd.sock().display()
    ));
    let mut manager = ManagerConfig::new(dir.path().join("resmgr"));
    manager_config(dir, &mut manager)?;
    let mut cfg = NriConfig::new(manager);
    cfg.socket = containerd.nri_sock();
    cfg.reconnect = Duration::from_millis(100);
    let plugin = NriPlugin::start(cfg)
        .await
        .context("starting the NRI plugin")?;
    if !plugin.registered(1, Duration::from_secs(20)).await {
        plugin.shutdown().await;
        let _ = tokio::task::spawn_blocking(move || drop(containerd)).await;
        anyhow::bail!("the NRI plugin did not register with {name} within 20 s");
    }
    say.say(format!(
        "steward nri-plugin registered with {name} at {} (policy static); kubelet's CRI calls go straight to containerd",
        containerd.nri_sock().display()
    ));
    Ok(Cri {
        socket: containerd.sock(),
        cgroup_parent: containerd.cgroup_parent.clone(),
        pinned_by: format!("the NRI plugin on {name}"),
        runtime: name,
        route: "created on its own CRI socket, as kubelet does (no proxy)",
        own_containerd_pid: Some(containerd.pid),
        backend: Backend::Nri { plugin, containerd },
    })
}

/// For runtimes without NRI: containerd 1.6 with the CRI proxy in front of
/// it; the kubelet stand-in talks to the proxy.
async fn start_proxy(dir: &tempfile::TempDir, say: &Narrator) -> anyhow::Result<Cri> {
    let containerd = Containerd::shared().context(
        "containerd cannot be started or reached (needs root and the containerd, runc and busybox-static packages; scripts/local-run installs them)",
    )?;
    let name = runtime_name(containerd.sock()).await;
    say.say(format!("{name} up at {}", containerd.sock().display()));
    let mut pcfg = ProxyConfig::new(
        dir.path().join("cri.sock"),
        containerd.sock(),
        dir.path().join("resmgr"),
    );
    manager_config(dir, &mut pcfg.manager)?;
    let proxy = Proxy::start(pcfg).await.context("starting the CRI proxy")?;
    say.say(format!(
        "steward cri-proxy up in front of {name} (policy static) at {}",
        proxy.socket().display()
    ));
    Ok(Cri {
        socket: proxy.socket().to_path_buf(),
        cgroup_parent: containerd.cgroup_parent().to_owned(),
        pinned_by: format!("the CRI proxy on {name}"),
        runtime: name,
        route: "created through the CRI proxy",
        own_containerd_pid: None,
        backend: Backend::Proxy { proxy, containerd },
    })
}

/// Creates the demo's Configurations; returns the camera Instances'
/// resource names once they exist.
async fn configure(api: &ApiServer, opts: &Options, say: &Narrator) -> anyhow::Result<Vec<String>> {
    let configs: Api<Configuration> = Api::namespaced(api.client(), NS);
    let names: Vec<String> = (0..opts.devices).map(|i| format!("\"cam-{i}\"")).collect();
    let mut cams = Configuration::new(
        "cameras",
        ConfigurationSpec::new(
            "debug-echo",
            format!(
                "descriptions: [{}]\npollInterval: 100ms\n",
                names.join(", ")
            ),
        ),
    );
    cams.metadata.namespace = Some(NS.into());
    cams.spec.capacity = opts.capacity;
    configs.create(&PostParams::default(), &cams).await?;
    let mut block = Configuration::new(
        "block-devices",
        ConfigurationSpec::new(
            "udev",
            "udevRules:\n  - 'SUBSYSTEM==\"block\", KERNEL!=\"loop*\", KERNEL!=\"ram*\"'\n",
        ),
    );
    block.metadata.namespace = Some(NS.into());
    block.spec.capacity = 1;
    configs.create(&PostParams::default(), &block).await?;
    say.say(format!(
        "Configurations: cameras (debug-echo, {} devices x {} slots), block-devices (udev)",
        opts.devices, opts.capacity
    ));

    let instances: Api<Instance> = Api::namespaced(api.client(), NS);
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let list = instances.list(&ListParams::default()).await?;
        let cams: Vec<&Instance> = list
            .items
            .iter()
            .filter(|i| i.spec.configuration_name == "cameras")
            .collect();
        if cams.len() == opts.devices as usize {
            let udev = list.items.len() - cams.len();
            say.say(format!(
                "devices found: {} camera Instance(s) (debug-echo), {udev} block device Instance(s) (udev)",
                cams.len()
            ));
            let mut res: Vec<String> = cams
                .iter()
                .filter_map(|i| i.metadata.name.as_ref())
                .map(|n| format!("steward.dev/{n}"))
                .collect();
            res.sort();
            return Ok(res);
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the camera Instances did not appear within {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
