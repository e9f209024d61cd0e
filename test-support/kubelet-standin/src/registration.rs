//! The Registration service kubelet serves on `<plugin dir>/kubelet.sock`.

use std::sync::Arc;

use steward_proto::deviceplugin::v1beta1::{
    Empty, RegisterRequest, VERSION, device_plugin_client::DevicePluginClient,
    registration_server::Registration,
};
use tonic::{Request, Response, Status};
use tracing::{info, warn};

use crate::endpoint::{self, RPC_TIMEOUT};
use crate::error::go_status_text;
use crate::manager::{Endpoint, ResourceEntry, ResourceState};
use crate::names;
use crate::shared::Shared;

pub(crate) struct RegistrationService {
    pub shared: Arc<Shared>,
}

impl RegistrationService {
    fn validate(&self, req: &RegisterRequest) -> Result<(), Status> {
        if req.version != VERSION {
            return Err(Status::unknown(format!(
                "requested API version {:?} is not supported by kubelet. Supported versions are [{VERSION:?}]",
                req.version
            )));
        }
        if !names::is_extended_resource_name(&req.resource_name) {
            return Err(Status::unknown(format!(
                "the ResourceName {:?} is invalid",
                req.resource_name
            )));
        }
        if !names::is_plain_socket_name(&req.endpoint) {
            return Err(Status::unknown(format!(
                "the endpoint {:?} is invalid: it must be a socket file name inside the device plugin directory",
                req.endpoint
            )));
        }
        Ok(())
    }
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let req = request.into_inner();
        info!(resource = %req.resource_name, endpoint = %req.endpoint, "registration request from device plugin");
        if let Err(status) = self.validate(&req) {
            warn!(resource = %req.resource_name, error = %status.message(), "bad registration request");
            return Err(status);
        }
        let socket = self.shared.paths.plugin_dir.join(&req.endpoint);
        let channel = endpoint::connect_unix(&socket).await.map_err(|e| {
            warn!(resource = %req.resource_name, error = %e, "cannot dial device plugin");
            Status::unknown(format!("failed to dial device plugin: {e}"))
        })?;
        let mut client = DevicePluginClient::new(channel);
        let options =
            match tokio::time::timeout(RPC_TIMEOUT, client.get_device_plugin_options(Empty {}))
                .await
            {
                Ok(Ok(r)) => r.into_inner(),
                Ok(Err(status)) => {
                    return Err(Status::unknown(format!(
                        "failed to get device plugin options: {}",
                        go_status_text(&status)
                    )));
                }
                Err(_) => {
                    return Err(Status::unknown(
                        "failed to get device plugin options: context deadline exceeded",
                    ));
                }
            };

        let mut st = self.shared.lock();
        st.next_generation += 1;
        let generation = st.next_generation;
        // The task only touches the state through the lock we hold, so it
        // cannot observe the resource before its endpoint is installed.
        let task = tokio::spawn(endpoint::run_list_and_watch(
            self.shared.clone(),
            req.resource_name.clone(),
            generation,
            client.clone(),
        ))
        .abort_handle();
        let entry = st
            .resources
            .entry(req.resource_name.clone())
            .or_insert_with(|| ResourceEntry {
                state: ResourceState::default(),
                endpoint: None,
            });
        if let Some(old) = entry.endpoint.take() {
            info!(resource = %req.resource_name, "replacing the previous endpoint of this resource");
            old.task.abort();
        }
        entry.state.connected = true;
        entry.state.endpoint = req.endpoint.clone();
        entry.state.pre_start_required = options.pre_start_required;
        entry.state.get_preferred_allocation_available = options.get_preferred_allocation_available;
        entry.state.registrations += 1;
        entry.endpoint = Some(Endpoint {
            client,
            options,
            generation,
            task,
        });
        drop(st);
        self.shared.notify();
        info!(resource = %req.resource_name, "device plugin connected");
        Ok(Response::new(Empty {}))
    }
}
