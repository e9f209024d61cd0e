//! Starts and stops the pieces: API server and kubelet stand-ins, the real
//! agent and, when containerd can be had, the real CRI proxy in front of it.

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
use steward_resmgr::{Proxy, ProxyConfig};
use steward_testing_apiserver::ApiServer;
use steward_testing_containerd::Containerd;
use steward_testing_kubelet::{Kubelet, KubeletConfig};
use tokio::task::JoinHandle;

use crate::{Narrator, Options};

pub(crate) const NODE: &str = "demo-node";
pub(crate) const NS: &str = "default";
const WAIT: Duration = Duration::from_secs(60);

/// The CRI side: containerd and the proxy in front of it.
pub(crate) struct Cri {
    pub containerd: Arc<Containerd>,
    pub proxy: Proxy,
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
            match start_cri(&dir, say).await {
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

    /// Stops the agent, the proxy and containerd (if we started it); the
    /// pods this process created in an attached containerd are removed.
    pub async fn stop(self, say: &Narrator) {
        let _ = self.stop_agent.send(());
        match tokio::time::timeout(Duration::from_secs(15), self.agent).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => say.say(format!("agent stopped with an error: {e}")),
            Ok(Err(e)) => say.say(format!("agent task failed: {e}")),
            Err(_) => say.say("agent did not stop within 15 s; aborted"),
        }
        if let Some(cri) = self.cri {
            cri.proxy.shutdown().await;
            drop(cri.containerd);
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

async fn start_cri(dir: &tempfile::TempDir, say: &Narrator) -> anyhow::Result<Cri> {
    let containerd = Containerd::shared().context(
        "containerd cannot be started or reached (needs root and the containerd, runc and busybox-static packages; scripts/test installs them)",
    )?;
    say.say(format!("containerd up at {}", containerd.sock().display()));
    let config = dir.path().join("resmgr.yaml");
    std::fs::write(&config, "policy: { active: static }\n")?;
    let mut pcfg = ProxyConfig::new(
        dir.path().join("cri.sock"),
        containerd.sock(),
        dir.path().join("resmgr"),
    );
    pcfg.manager.config_file = Some(config);
    pcfg.manager.verify_interval = Duration::ZERO;
    pcfg.manager.pod_resources_socket = Some(cri_view_socket(dir));
    let proxy = Proxy::start(pcfg).await.context("starting the CRI proxy")?;
    say.say(format!(
        "steward cri-proxy up in front of containerd (policy static) at {}",
        proxy.socket().display()
    ));
    Ok(Cri { containerd, proxy })
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
