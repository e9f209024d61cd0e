//! Shared by the process-level tests and the discovery benchmark: the API
//! server stand-in with steward's CRDs, a kubeconfig pointing at it, and
//! `steward` child processes (agent, discovery handler) that are killed by
//! PID when their guard is dropped.
//!
//! Everything returns `anyhow::Result` (no panics) so the benchmark can
//! include this module too.
#![allow(dead_code)]

use std::ffi::OsString;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{ListParams, ObjectMeta, PostParams};
use steward_api::{Configuration, ConfigurationSpec, ConfigurationStatus, Instance};
use steward_testing_apiserver::ApiServer;
use steward_testing_apiserver::client::replace_with_retry;

/// The binary under test (built by cargo for this package's tests and benches).
pub const STEWARD: &str = env!("CARGO_BIN_EXE_steward");
/// Namespace the tests' Configurations live in.
pub const NS: &str = "default";
/// How long a wait-for may take before the test fails.
pub const WAIT: Duration = Duration::from_secs(30);
/// Poll interval of [`eventually`].
const POLL: Duration = Duration::from_millis(50);
/// Poll interval of [`Proc::wait_exit`] (a `waitpid` with `WNOHANG`).
const EXIT_POLL: Duration = Duration::from_millis(1);

/// The API server stand-in with steward's CRDs and a kubeconfig file for it.
pub struct Cluster {
    pub server: ApiServer,
    pub kubeconfig: PathBuf,
}

impl Cluster {
    /// Starts the stand-in, creates steward's CRDs and writes `dir/kubeconfig`
    /// (plain HTTP, no credentials).
    pub async fn start(dir: &Path) -> anyhow::Result<Self> {
        let server = ApiServer::start()
            .await
            .context("starting the API server stand-in")?;
        let crds: Api<CustomResourceDefinition> = Api::all(server.client());
        for crd in steward_api::crds() {
            crds.create(&PostParams::default(), &crd)
                .await
                .with_context(|| format!("creating CRD {:?}", crd.metadata.name))?;
        }
        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(&kubeconfig, kubeconfig_yaml(&server.url()))
            .with_context(|| format!("writing {}", kubeconfig.display()))?;
        Ok(Self { server, kubeconfig })
    }

    pub fn client(&self) -> kube::Client {
        self.server.client()
    }

    pub async fn create_node(&self, name: &str) -> anyhow::Result<()> {
        let nodes: Api<Node> = Api::all(self.client());
        let node = Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        nodes
            .create(&PostParams::default(), &node)
            .await
            .with_context(|| format!("creating Node {name}"))?;
        Ok(())
    }

    pub fn configurations(&self) -> Api<Configuration> {
        Api::namespaced(self.client(), NS)
    }

    pub fn instance_api(&self) -> Api<Instance> {
        Api::namespaced(self.client(), NS)
    }

    pub async fn create_configuration(&self, c: &Configuration) -> anyhow::Result<Configuration> {
        self.configurations()
            .create(&PostParams::default(), c)
            .await
            .with_context(|| format!("creating Configuration {:?}", c.metadata.name))
    }

    /// Replaces the details of Configuration `name`, retrying on 409: an
    /// agent (or one just killed, whose last request the server is still
    /// handling) may write the status between our read and our write.
    pub async fn set_details(&self, name: &str, details: &str) -> anyhow::Result<()> {
        replace_with_retry(&self.configurations(), name, |c| {
            c.spec.discovery_handler.details = details.to_string();
        })
        .await
        .with_context(|| format!("replacing Configuration {name}"))?;
        Ok(())
    }

    /// Instances of Configuration `config`, sorted by device id.
    pub async fn instances_of(&self, config: &str) -> anyhow::Result<Vec<Instance>> {
        let mut items: Vec<Instance> = self
            .instance_api()
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|i| i.spec.configuration_name == config)
            .collect();
        items.sort_by(|a, b| a.spec.device_id.cmp(&b.spec.device_id));
        Ok(items)
    }

    pub async fn config_status(&self, name: &str) -> anyhow::Result<Option<ConfigurationStatus>> {
        Ok(self
            .configurations()
            .get_opt(name)
            .await?
            .and_then(|c| c.status))
    }
}

fn kubeconfig_yaml(server_url: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: standin
  cluster:
    server: {server_url}
users:
- name: standin
  user: {{}}
contexts:
- name: standin
  context:
    cluster: standin
    user: standin
    namespace: {NS}
current-context: standin
"
    )
}

/// A Configuration in [`NS`] for `handler` with `details`.
pub fn configuration(name: &str, handler: &str, details: &str) -> Configuration {
    let mut c = Configuration::new(name, ConfigurationSpec::new(handler, details));
    c.metadata.namespace = Some(NS.into());
    c
}

/// debug-echo details: the given descriptions, an optional availability file
/// (polled every 50 ms).
pub fn echo_details(descriptions: &[&str], availability: Option<&Path>) -> String {
    let quoted: Vec<String> = descriptions.iter().map(|d| format!("{d:?}")).collect();
    let mut s = format!(
        "descriptions: [{}]\npollInterval: 50ms\n",
        quoted.join(", ")
    );
    if let Some(p) = availability {
        s.push_str(&format!(
            "availabilityFile: {:?}\n",
            p.display().to_string()
        ));
    }
    s
}

/// Sets a debug-echo availability file atomically (write + rename), so the
/// handler never reads a half-written word.
pub fn set_available(file: &Path, available: bool) -> anyhow::Result<()> {
    let tmp = file.with_extension("tmp");
    std::fs::write(&tmp, if available { "ONLINE" } else { "OFFLINE" })
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, file).with_context(|| format!("renaming to {}", file.display()))?;
    Ok(())
}

/// Polls `f` until it yields `Some`, failing after `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return Ok(v);
        }
        if tokio::time::Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for: {what}");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// A `steward` child process, killed (SIGKILL, by PID) when dropped. Its
/// stdout and stderr go to a log file whose tail is printed on drop (the
/// test harness shows it only for failing tests).
pub struct Proc {
    name: String,
    child: Option<Child>,
    log: PathBuf,
    show_log_on_drop: bool,
}

impl Proc {
    /// Starts `steward ARGS` with `envs`, logging to `log`.
    pub fn spawn(
        name: &str,
        args: &[OsString],
        envs: &[(&str, OsString)],
        log: PathBuf,
    ) -> anyhow::Result<Self> {
        Self::spawn_binary(name, Path::new(STEWARD), args, envs, log)
    }

    /// Starts `binary ARGS` (a copy of steward, e.g. one release of an
    /// upgrade) with `envs`, logging to `log`.
    pub fn spawn_binary(
        name: &str,
        binary: &Path,
        args: &[OsString],
        envs: &[(&str, OsString)],
        log: PathBuf,
    ) -> anyhow::Result<Self> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .with_context(|| format!("opening {}", log.display()))?;
        let err = out.try_clone()?;
        let mut cmd = Command::new(binary);
        cmd.args(args)
            .env_remove("KUBECONFIG")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("KUBERNETES_SERVICE_PORT")
            .env_remove("NODE_NAME")
            .env_remove("STEWARD_STATE_DIR")
            .env_remove("STEWARD_REGISTRATION_SOCKET")
            .env("NO_COLOR", "1")
            .env(
                "STEWARD_LOG",
                std::env::var("STEWARD_TEST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {name}: {} {args:?}", binary.display()))?;
        Ok(Self {
            name: name.to_string(),
            child: Some(child),
            log,
            show_log_on_drop: true,
        })
    }

    /// Do not print the log tail on drop (benchmarks).
    pub fn quiet(mut self) -> Self {
        self.show_log_on_drop = false;
        self
    }

    pub fn pid(&self) -> anyhow::Result<u32> {
        match &self.child {
            Some(c) => Ok(c.id()),
            None => bail!("{} already reaped", self.name),
        }
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        match &mut self.child {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// SIGKILL and reap.
    pub fn sigkill(&mut self) -> anyhow::Result<()> {
        if let Some(mut c) = self.child.take() {
            c.kill()
                .with_context(|| format!("killing {} ({})", self.name, c.id()))?;
            c.wait()?;
        }
        Ok(())
    }

    /// Sends SIGTERM (through `kill -TERM PID`).
    pub fn sigterm(&self) -> anyhow::Result<()> {
        let pid = self.pid()?;
        let status = Command::new("kill")
            .arg("-TERM")
            .arg(pid.to_string())
            .status()
            .context("running kill -TERM")?;
        if !status.success() {
            bail!("kill -TERM {pid} failed: {status}");
        }
        Ok(())
    }

    /// Waits for the process to exit on its own and reaps it.
    pub async fn wait_exit(&mut self, timeout: Duration) -> anyhow::Result<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            let Some(c) = &mut self.child else {
                bail!("{} already reaped", self.name)
            };
            if let Some(status) = c.try_wait()? {
                self.child = None;
                return Ok(status);
            }
            if Instant::now() > deadline {
                bail!("{} did not exit within {timeout:?}", self.name);
            }
            // Fine-grained: the rolling update bench times the exit.
            tokio::time::sleep(EXIT_POLL).await;
        }
    }

    /// Everything the process logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Number of log lines containing `needle`.
    pub fn log_count(&self, needle: &str) -> usize {
        self.log().lines().filter(|l| l.contains(needle)).count()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if self.show_log_on_drop {
            let log = self.log();
            let lines: Vec<&str> = log.lines().collect();
            let tail = &lines[lines.len().saturating_sub(60)..];
            eprintln!("----- {} log (last {} lines) -----", self.name, tail.len());
            for l in tail {
                eprintln!("{l}");
            }
        }
    }
}

/// Paths of one node's agent.
#[derive(Debug, Clone)]
pub struct NodeDirs {
    pub name: String,
    pub state_dir: PathBuf,
    pub socket: PathBuf,
    pub dir: PathBuf,
}

impl NodeDirs {
    pub fn new(dir: &Path, name: &str) -> Self {
        Self {
            name: name.to_string(),
            state_dir: dir.join(format!("{name}-state")),
            socket: dir.join(format!("{name}-agent.sock")),
            dir: dir.to_path_buf(),
        }
    }

    /// kubelet's root directory given to this node's agent.
    pub fn kubelet_dir(&self) -> PathBuf {
        self.dir.join(format!("{}-kubelet", self.name))
    }

    /// `steward agent` in Kubernetes mode (through `cluster`'s kubeconfig),
    /// no embedded handlers, offline grace `grace` (e.g. `3s`).
    pub fn spawn_agent(&self, cluster: &Cluster, grace: &str) -> anyhow::Result<Proc> {
        self.spawn_agent_with(cluster, grace, &[])
    }

    /// [`NodeDirs::spawn_agent`] with `extra` arguments appended.
    pub fn spawn_agent_with(
        &self,
        cluster: &Cluster,
        grace: &str,
        extra: &[&str],
    ) -> anyhow::Result<Proc> {
        let mut args: Vec<OsString> = vec![
            "agent".into(),
            "--node-name".into(),
            self.name.clone().into(),
            "--state-dir".into(),
            self.state_dir.clone().into(),
            "--registration-socket".into(),
            self.socket.clone().into(),
            "--embedded".into(),
            "".into(),
            "--offline-grace".into(),
            grace.into(),
            // Never the host's: kubelet's directory and the CDI spec
            // directory of this node are the test's own.
            "--kubelet-dir".into(),
            self.kubelet_dir().into(),
            "--cdi-dir".into(),
            self.dir.join(format!("{}-cdi", self.name)).into(),
        ];
        args.extend(extra.iter().map(OsString::from));
        Proc::spawn(
            &format!("agent {}", self.name),
            &args,
            &[("KUBECONFIG", cluster.kubeconfig.clone().into())],
            self.dir.join(format!("{}-agent.log", self.name)),
        )
    }
}

/// `steward discovery-handler debug-echo` serving on `listen` and registering
/// with the agent socket `agent_socket`.
pub fn spawn_echo_handler(
    label: &str,
    agent_socket: &Path,
    listen: &Path,
    shared: Option<bool>,
    log: PathBuf,
) -> anyhow::Result<Proc> {
    let mut args: Vec<OsString> = vec![
        "discovery-handler".into(),
        "debug-echo".into(),
        "--agent-socket".into(),
        agent_socket.into(),
        "--listen".into(),
        listen.into(),
    ];
    if let Some(shared) = shared {
        args.push("--shared".into());
        args.push(shared.to_string().into());
    }
    Proc::spawn(label, &args, &[], log)
}

/// `steward nri-plugin` as the NRI plugin tests start it: on the NRI
/// socket `nri` as plugin `name`, on the state directory `dir/state` with
/// the configuration `dir/config.yaml`, no periodic verification, logging
/// at info; stdin and stdout closed, killed when dropped. Its stderr is the
/// caller's ([`spawn_logging`] sends it to a file).
pub fn nri_plugin(dir: &Path, nri: &Path, name: &str) -> tokio::process::Command {
    let mut c = tokio::process::Command::new(STEWARD);
    c.args(["nri-plugin", "--log", "info"])
        .arg("--nri-socket")
        .arg(nri)
        .args(["--nri-name", name])
        .arg("--state-dir")
        .arg(dir.join("state"))
        .arg("--config")
        .arg(dir.join("config.yaml"))
        .args(["--verify-interval", "0s"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .kill_on_drop(true);
    c
}

/// Starts `cmd` with its stderr written to the file `log` (created anew).
pub fn spawn_logging(
    mut cmd: tokio::process::Command,
    log: &Path,
) -> anyhow::Result<tokio::process::Child> {
    let file = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    cmd.stderr(file)
        .spawn()
        .with_context(|| format!("starting {cmd:?}"))
}

/// The log line `steward discovery-handler` writes after each successful registration.
pub const REGISTERED: &str = "registered with the agent";
