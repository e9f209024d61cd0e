//! Container configs, exec and pod lifecycle helpers over a CRI client.

use steward_proto::cri::runtime::v1 as cri;
use steward_proto::cri::runtime::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::Channel;
use tracing::{debug, warn};

use crate::{BUSYBOX_IMAGE, HarnessError};

/// Builder for a busybox container config.
#[derive(Debug, Clone)]
pub struct ContainerSpec {
    name: String,
    image: String,
    command: Vec<String>,
    args: Vec<String>,
    cpuset_cpus: Option<String>,
    memory_limit_bytes: Option<i64>,
}

impl ContainerSpec {
    /// A container named `name` running `sleep 3600` in [`BUSYBOX_IMAGE`].
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            image: BUSYBOX_IMAGE.to_owned(),
            command: vec!["sleep".to_owned(), "3600".to_owned()],
            args: Vec::new(),
            cpuset_cpus: None,
            memory_limit_bytes: None,
        }
    }

    /// Replace the command.
    pub fn command<I, S>(mut self, command: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.command = command.into_iter().map(Into::into).collect();
        self
    }

    /// Run the image's own entrypoint with `args` (no command override).
    pub fn entrypoint_args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.command.clear();
        self.args = args.into_iter().map(Into::into).collect();
        self
    }

    /// Replace the image.
    pub fn image(mut self, image: impl Into<String>) -> Self {
        self.image = image.into();
        self
    }

    /// Pin to CPUs (cpuset list form, e.g. `"0-1"`).
    pub fn cpuset(mut self, cpus: impl Into<String>) -> Self {
        self.cpuset_cpus = Some(cpus.into());
        self
    }

    /// Limit memory to `bytes`.
    pub fn memory_limit(mut self, bytes: i64) -> Self {
        self.memory_limit_bytes = Some(bytes);
        self
    }

    /// The resources this spec asks for.
    pub fn resources(&self) -> cri::LinuxContainerResources {
        cri::LinuxContainerResources {
            cpuset_cpus: self.cpuset_cpus.clone().unwrap_or_default(),
            memory_limit_in_bytes: self.memory_limit_bytes.unwrap_or_default(),
            ..Default::default()
        }
    }

    /// The CRI container config, with namespace options matching `sandbox`.
    pub fn build(&self, sandbox: &cri::PodSandboxConfig) -> cri::ContainerConfig {
        let namespaces = sandbox
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref())
            .and_then(|s| s.namespace_options.clone());
        cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: self.name.clone(),
                attempt: 0,
            }),
            image: Some(cri::ImageSpec {
                image: self.image.clone(),
                ..Default::default()
            }),
            command: self.command.clone(),
            args: self.args.clone(),
            linux: Some(cri::LinuxContainerConfig {
                resources: Some(self.resources()),
                security_context: Some(cri::LinuxContainerSecurityContext {
                    namespace_options: namespaces,
                    ..Default::default()
                }),
            }),
            ..Default::default()
        }
    }
}

/// Output of a successful [`exec_sync`].
#[derive(Debug, Clone)]
pub struct ExecOutput {
    /// Standard output, lossily decoded.
    pub stdout: String,
    /// Standard error, lossily decoded.
    pub stderr: String,
}

/// Run `cmd` in a container (10 s timeout); error unless it exits 0.
pub async fn exec_sync(
    runtime: &mut RuntimeServiceClient<Channel>,
    container_id: &str,
    cmd: &[&str],
) -> Result<ExecOutput, HarnessError> {
    let cmd: Vec<String> = cmd.iter().map(|s| (*s).to_owned()).collect();
    let resp = runtime
        .exec_sync(cri::ExecSyncRequest {
            container_id: container_id.to_owned(),
            cmd: cmd.clone(),
            timeout: 10,
        })
        .await
        .map_err(HarnessError::cri("ExecSync"))?
        .into_inner();
    let stdout = String::from_utf8_lossy(&resp.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&resp.stderr).into_owned();
    if resp.exit_code != 0 {
        return Err(HarnessError::ExecFailed {
            container_id: container_id.to_owned(),
            cmd,
            exit_code: resp.exit_code,
            stderr,
        });
    }
    Ok(ExecOutput { stdout, stderr })
}

/// Run a sandbox, then create and start one container in it. Returns
/// `(sandbox_id, container_id)`.
pub async fn run_pod_with_container(
    runtime: &mut RuntimeServiceClient<Channel>,
    sandbox: &cri::PodSandboxConfig,
    container: &ContainerSpec,
) -> Result<(String, String), HarnessError> {
    let sandbox_id = runtime
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(sandbox.clone()),
            runtime_handler: String::new(),
        })
        .await
        .map_err(HarnessError::cri("RunPodSandbox"))?
        .into_inner()
        .pod_sandbox_id;
    let created = runtime
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.clone(),
            config: Some(container.build(sandbox)),
            sandbox_config: Some(sandbox.clone()),
        })
        .await;
    let container_id = match created {
        Ok(resp) => resp.into_inner().container_id,
        Err(status) => {
            cleanup_logged(runtime, &sandbox_id).await;
            return Err(HarnessError::cri("CreateContainer")(status));
        }
    };
    if let Err(status) = runtime
        .start_container(cri::StartContainerRequest {
            container_id: container_id.clone(),
        })
        .await
    {
        cleanup_logged(runtime, &sandbox_id).await;
        return Err(HarnessError::cri("StartContainer")(status));
    }
    Ok((sandbox_id, container_id))
}

async fn cleanup_logged(runtime: &mut RuntimeServiceClient<Channel>, sandbox_id: &str) {
    if let Err(e) = cleanup_pod(runtime, sandbox_id).await {
        warn!(%sandbox_id, error = %e, "cleaning up pod failed");
    }
}

/// Stop and remove every container of a sandbox, then the sandbox itself.
/// Succeeds if the sandbox is already gone.
pub async fn cleanup_pod(
    runtime: &mut RuntimeServiceClient<Channel>,
    sandbox_id: &str,
) -> Result<(), HarnessError> {
    let containers = runtime
        .list_containers(cri::ListContainersRequest {
            filter: Some(cri::ContainerFilter {
                pod_sandbox_id: sandbox_id.to_owned(),
                ..Default::default()
            }),
        })
        .await
        .map_err(HarnessError::cri("ListContainers"))?
        .into_inner()
        .containers;
    for c in containers {
        debug!(container_id = %c.id, "removing container");
        runtime
            .stop_container(cri::StopContainerRequest {
                container_id: c.id.clone(),
                timeout: 0,
            })
            .await
            .map_err(HarnessError::cri("StopContainer"))?;
        runtime
            .remove_container(cri::RemoveContainerRequest { container_id: c.id })
            .await
            .map_err(HarnessError::cri("RemoveContainer"))?;
    }
    runtime
        .stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: sandbox_id.to_owned(),
        })
        .await
        .map_err(HarnessError::cri("StopPodSandbox"))?;
    runtime
        .remove_pod_sandbox(cri::RemovePodSandboxRequest {
            pod_sandbox_id: sandbox_id.to_owned(),
        })
        .await
        .map_err(HarnessError::cri("RemovePodSandbox"))?;
    Ok(())
}
