//! The kubelet side of one plugin connection: dialing the plugin's socket and
//! following its ListAndWatch stream.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use steward_proto::deviceplugin::v1beta1::{Empty, device_plugin_client::DevicePluginClient};
use tonic::transport::Channel;
use tracing::{debug, info, warn};

use crate::shared::Shared;

/// How long kubelet waits to dial a plugin.
pub(crate) const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
/// Timeout for unary calls to plugins.
pub(crate) const RPC_TIMEOUT: Duration = Duration::from_secs(30);

/// Opens a gRPC channel over a unix socket.
pub async fn connect_unix(path: &Path) -> Result<Channel, tonic::transport::Error> {
    steward_proto::uds::endpoint()
        .connect_timeout(DIAL_TIMEOUT)
        .connect_with_connector(steward_proto::uds::UnixConnector::new(path))
        .await
}

/// Follows the plugin's ListAndWatch stream until it ends, then marks the
/// resource's devices unhealthy (unless a newer registration replaced this
/// endpoint in the meantime).
pub(crate) async fn run_list_and_watch(
    shared: Arc<Shared>,
    resource: String,
    generation: u64,
    mut client: DevicePluginClient<Channel>,
) {
    match client.list_and_watch(Empty {}).await {
        Ok(response) => {
            let mut stream = response.into_inner();
            loop {
                match stream.message().await {
                    Ok(Some(update)) => {
                        let mut st = shared.lock();
                        let current = st
                            .resources
                            .get(&resource)
                            .and_then(|e| e.endpoint.as_ref())
                            .is_some_and(|ep| ep.generation == generation);
                        if !current {
                            debug!(%resource, "dropping update of a replaced endpoint");
                            return;
                        }
                        debug!(%resource, devices = update.devices.len(), "ListAndWatch update");
                        st.update_devices(&resource, &update.devices);
                        shared.write_checkpoint_logged(&st);
                        drop(st);
                        shared.notify();
                    }
                    Ok(None) => {
                        info!(%resource, "ListAndWatch stream ended");
                        break;
                    }
                    Err(status) => {
                        warn!(%resource, %status, "ListAndWatch stream failed");
                        break;
                    }
                }
            }
        }
        Err(status) => warn!(%resource, %status, "ListAndWatch call failed"),
    }
    let mut st = shared.lock();
    let current = st
        .resources
        .get(&resource)
        .and_then(|e| e.endpoint.as_ref())
        .is_some_and(|ep| ep.generation == generation);
    if current {
        info!(%resource, "device plugin endpoint stopped; marking its devices unhealthy");
        st.mark_resource_unhealthy(&resource);
        shared.write_checkpoint_logged(&st);
        drop(st);
        shared.notify();
    }
}
