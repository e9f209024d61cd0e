//! kubelet's pod resources v1 API, as the slot ledger reads it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use steward_core::slots::{ContainerDevices, ContainerResources, PodResources};
use steward_proto::podresources::v1::{
    GetPodResourcesRequest, ListPodResourcesRequest, PodResources as WirePod,
    pod_resources_lister_client::PodResourcesListerClient,
};
use tonic::transport::Channel;

/// Errors talking to kubelet over a unix socket.
#[derive(Debug, thiserror::Error)]
pub enum KubeletError {
    #[error("connecting to {path}: {message}")]
    Connect { path: PathBuf, message: String },
    #[error("{call} on {path}: {status}")]
    Call {
        call: &'static str,
        path: PathBuf,
        status: Box<tonic::Status>,
    },
    #[error("{call} on {path} timed out after {timeout:?}")]
    Timeout {
        call: &'static str,
        path: PathBuf,
        timeout: Duration,
    },
}

impl KubeletError {
    /// The call was answered NotFound.
    pub fn is_not_found(&self) -> bool {
        matches!(self, KubeletError::Call { status, .. } if status.code() == tonic::Code::NotFound)
    }
}

/// A gRPC channel over the unix socket at `path`.
pub async fn connect_unix(path: &Path, timeout: Duration) -> Result<Channel, KubeletError> {
    steward_proto::uds::endpoint()
        .connect_timeout(timeout)
        .connect_with_connector(steward_proto::uds::UnixConnector::new(path))
        .await
        .map_err(|e| KubeletError::Connect {
            path: path.to_path_buf(),
            message: e.to_string(),
        })
}

/// The pod resources client of one node.
#[derive(Debug, Clone)]
pub struct PodResourcesClient {
    socket: PathBuf,
    timeout: Duration,
}

fn convert(pod: WirePod) -> PodResources {
    PodResources {
        namespace: pod.namespace,
        name: pod.name,
        containers: pod
            .containers
            .into_iter()
            .map(|c| ContainerResources {
                name: c.name,
                devices: c
                    .devices
                    .into_iter()
                    .map(|d| ContainerDevices {
                        resource_name: d.resource_name,
                        device_ids: d.device_ids,
                    })
                    .collect(),
            })
            .collect(),
    }
}

impl PodResourcesClient {
    pub fn new(socket: impl Into<PathBuf>, timeout: Duration) -> Self {
        Self {
            socket: socket.into(),
            timeout,
        }
    }

    async fn client(&self) -> Result<PodResourcesListerClient<Channel>, KubeletError> {
        Ok(PodResourcesListerClient::new(
            connect_unix(&self.socket, self.timeout).await?,
        ))
    }

    /// `List`: every live pod's resources.
    pub async fn list(&self) -> Result<Vec<PodResources>, KubeletError> {
        let mut client = self.client().await?;
        let answer = tokio::time::timeout(self.timeout, client.list(ListPodResourcesRequest {}))
            .await
            .map_err(|_| KubeletError::Timeout {
                call: "List",
                path: self.socket.clone(),
                timeout: self.timeout,
            })?
            .map_err(|status| KubeletError::Call {
                call: "List",
                path: self.socket.clone(),
                status: Box::new(status),
            })?;
        Ok(answer
            .into_inner()
            .pod_resources
            .into_iter()
            .map(convert)
            .collect())
    }

    /// `Get` for one pod.
    pub async fn get(&self, namespace: &str, name: &str) -> Result<PodResources, KubeletError> {
        let mut client = self.client().await?;
        let request = GetPodResourcesRequest {
            pod_name: name.to_owned(),
            pod_namespace: namespace.to_owned(),
        };
        let answer = tokio::time::timeout(self.timeout, client.get(request))
            .await
            .map_err(|_| KubeletError::Timeout {
                call: "Get",
                path: self.socket.clone(),
                timeout: self.timeout,
            })?
            .map_err(|status| KubeletError::Call {
                call: "Get",
                path: self.socket.clone(),
                status: Box::new(status),
            })?;
        Ok(answer
            .into_inner()
            .pod_resources
            .map(convert)
            .unwrap_or_else(|| PodResources {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                containers: Vec::new(),
            }))
    }
}
