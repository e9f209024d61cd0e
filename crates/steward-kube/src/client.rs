//! Connecting to the API server as a named steward component.
//!
//! Every request carries `User-Agent: steward-<component>/<version>
//! (<instance>)`, as client-go's components name themselves (`kubelet/v1.35.0
//! (linux/amd64) ...`): the API server's audit log and its per-client
//! metrics (`apiserver_request_total` has no client label, but API Priority
//! and Fairness and audit policies match on it) can then tell the agent
//! from the controller, and a node's agent from another's.

use http::HeaderValue;
use http::header::USER_AGENT;

/// Why the client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("no Kubernetes configuration found (in-cluster or kubeconfig)")]
    Infer(#[from] kube::config::InferConfigError),
    #[error("building the Kubernetes client")]
    Client(#[from] kube::Error),
}

/// The User-Agent of `component` (`agent`, `controller`, ...) running as
/// `instance` (its node or identity), if that is a valid header value.
pub fn user_agent(component: &str, instance: Option<&str>) -> String {
    let base = format!("steward-{component}/{}", env!("CARGO_PKG_VERSION"));
    match instance {
        Some(i) if !i.is_empty() && HeaderValue::from_str(i).is_ok() => format!("{base} ({i})"),
        _ => base,
    }
}

/// A client from the usual configuration (in-cluster, else kubeconfig)
/// whose requests name `component` and `instance` ([`user_agent`]).
pub async fn connect(
    component: &str,
    instance: Option<&str>,
) -> Result<kube::Client, ConnectError> {
    let mut config = kube::Config::infer().await?;
    if let Ok(ua) = HeaderValue::from_str(&user_agent(component, instance)) {
        config.headers.push((USER_AGENT, ua));
    }
    Ok(kube::Client::try_from(config)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_component_names_itself_and_its_instance_when_it_can() {
        let v = env!("CARGO_PKG_VERSION");
        assert_eq!(
            user_agent("agent", Some("node-7")),
            format!("steward-agent/{v} (node-7)")
        );
        assert_eq!(
            user_agent("extender", None),
            format!("steward-extender/{v}")
        );
        // Not a header value: left out rather than failing the connection.
        assert_eq!(
            user_agent("controller", Some("bad\nname")),
            format!("steward-controller/{v}")
        );
    }
}
