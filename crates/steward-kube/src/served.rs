//! Whether the API server serves a kind steward wants to use, asked once
//! before a component starts on it, so that an older cluster gets one clear
//! line instead of a write failing and retried every second.

use kube::Client;

/// The DRA API steward writes: GA (and served by default) from Kubernetes 1.34.
pub const DRA_API_VERSION: &str = "resource.k8s.io/v1";
/// The first Kubernetes minor that serves [`DRA_API_VERSION`].
pub const DRA_API_SINCE: &str = "1.34";

/// Whether `api_version` (`group/version`) lists the resource `plural`:
/// `Ok(false)` when the group version is not served at all (404) or does not
/// list the resource; other failures (API server unreachable, forbidden) are
/// the caller's to judge.
pub async fn serves(client: &Client, api_version: &str, plural: &str) -> Result<bool, kube::Error> {
    match client.list_api_group_resources(api_version).await {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == plural)),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Whether the cluster serves `plural` of [`DRA_API_VERSION`]. When it does
/// not, logs one warning naming the API, the Kubernetes minor that has it
/// and that `what` is off (everything else keeps working), and returns
/// `false`. When the question cannot be answered (the API server is not
/// reachable yet), returns `true`: the caller's own writes retry as before.
pub async fn dra_served(client: &Client, plural: &str, what: &str) -> bool {
    match serves(client, DRA_API_VERSION, plural).await {
        Ok(true) => true,
        Ok(false) => {
            tracing::warn!(
                api = DRA_API_VERSION,
                resource = plural,
                "this cluster does not serve {DRA_API_VERSION} {plural} (Kubernetes {DRA_API_SINCE} and later do): {what} is off; everything else keeps working"
            );
            false
        }
        Err(e) => {
            tracing::debug!(error = %e, "could not ask whether {DRA_API_VERSION} {plural} is served; going on");
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use steward_testing_apiserver::ApiServer;

    #[tokio::test]
    async fn a_cluster_without_resource_k8s_io_v1_does_not_serve_it() {
        let server = ApiServer::start().await.unwrap();
        let client = server.client();
        assert!(
            !serves(&client, DRA_API_VERSION, "resourceslices")
                .await
                .unwrap()
        );
        assert!(!dra_served(&client, "deviceclasses", "writing DeviceClasses").await);
        server.serve_dra();
        assert!(
            serves(&client, DRA_API_VERSION, "resourceslices")
                .await
                .unwrap()
        );
        assert!(dra_served(&client, "deviceclasses", "writing DeviceClasses").await);
        server.shutdown().await;
    }
}
