//! Built-in discovery handlers, usable embedded in the agent or served as
//! external processes with [`crate::server::run_external`].

use std::sync::Arc;

use crate::{DiscoveryError, DiscoveryHandler};

pub mod debug_echo;
pub mod network;
pub mod udev;

/// Names of the built-in handlers, in the order [`embedded`] returns them.
pub const NAMES: [&str; 3] = [debug_echo::NAME, udev::NAME, network::NAME];

/// The node operator's settings of the built-in handlers (never a
/// Configuration's). The default is the most restrictive.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HandlerOptions {
    /// Which node-local addresses `tcp-probe` may probe
    /// (`--tcp-probe-allow-cidr`); by default none.
    pub tcp_probe: network::ProbeScope,
}

/// One instance of each built-in handler, as the agent embeds them:
/// `debug-echo` (unshared), `udev` (unshared), `tcp-probe` (shared).
pub fn embedded(options: &HandlerOptions) -> Vec<Arc<dyn DiscoveryHandler>> {
    NAMES
        .iter()
        .filter_map(|name| by_name(name, options))
        .collect()
}

/// A new instance of the built-in handler called `name`, set up with `options`.
pub fn by_name(name: &str, options: &HandlerOptions) -> Option<Arc<dyn DiscoveryHandler>> {
    match name {
        debug_echo::NAME => Some(Arc::new(debug_echo::DebugEcho::new(false))),
        udev::NAME => Some(Arc::new(udev::Udev::new())),
        network::NAME => Some(Arc::new(network::TcpProbe::with_scope(
            options.tcp_probe.clone(),
        ))),
        _ => None,
    }
}

/// Parses YAML details into `T`; empty details count as an empty mapping.
pub(crate) fn parse_details<T: serde::de::DeserializeOwned>(
    handler: &str,
    details: &str,
) -> Result<T, DiscoveryError> {
    let text = if details.trim().is_empty() {
        "{}"
    } else {
        details
    };
    serde_saphyr::from_str(text)
        .map_err(|e| DiscoveryError::InvalidDetails(format!("{handler}: {}", e.without_snippet())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_and_by_name_agree() {
        let options = HandlerOptions::default();
        let names: Vec<String> = embedded(&options)
            .iter()
            .map(|h| h.name().to_string())
            .collect();
        assert_eq!(names, ["debug-echo", "udev", "tcp-probe"]);
        for name in NAMES {
            assert_eq!(
                by_name(name, &options)
                    .map(|h| h.name().to_string())
                    .as_deref(),
                Some(name)
            );
        }
        assert!(by_name("onvif", &options).is_none());
        assert!(
            !by_name("debug-echo", &options)
                .map(|h| h.shared())
                .unwrap_or(true)
        );
        assert!(
            by_name("tcp-probe", &options)
                .map(|h| h.shared())
                .unwrap_or(false)
        );
    }

    /// `tcp-probe` gets the operator's scope: loopback refused by default,
    /// probed when allowed.
    #[test]
    fn tcp_probe_gets_the_operators_scope() {
        use crate::DiscoverRequest;
        let details = "{targets: [127.0.0.1], ports: [9]}";
        let refused = by_name(network::NAME, &HandlerOptions::default()).unwrap();
        match refused.discover(DiscoverRequest::new(details)) {
            Err(DiscoveryError::InvalidDetails(m)) => assert!(m.contains("loopback"), "{m}"),
            Err(e) => panic!("wrong error {e}"),
            Ok(_) => panic!("loopback probed by default"),
        }
        let allowed = HandlerOptions {
            tcp_probe: network::ProbeScope::new(["127.0.0.1".parse().unwrap()]),
        };
        for handler in [
            by_name(network::NAME, &allowed).unwrap(),
            embedded(&allowed).pop().unwrap(),
        ] {
            assert_eq!(handler.name(), network::NAME);
            // Planning happens in `discover`; the stream is lazy and dropped.
            assert!(handler.discover(DiscoverRequest::new(details)).is_ok());
        }
    }
}
