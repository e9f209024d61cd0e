//! Built-in discovery handlers, usable embedded in the agent or served as
//! external processes with [`crate::server::run_external`].

use std::sync::Arc;

use crate::{DiscoveryError, DiscoveryHandler};

pub mod debug_echo;
pub mod network;
pub mod udev;

/// Names of the built-in handlers, in the order [`embedded`] returns them.
pub const NAMES: [&str; 3] = [debug_echo::NAME, udev::NAME, network::NAME];

/// One instance of each built-in handler, as the agent embeds them:
/// `debug-echo` (unshared), `udev` (unshared), `tcp-probe` (shared).
pub fn embedded() -> Vec<Arc<dyn DiscoveryHandler>> {
    NAMES.iter().filter_map(|name| by_name(name)).collect()
}

/// A new instance of the built-in handler called `name`.
pub fn by_name(name: &str) -> Option<Arc<dyn DiscoveryHandler>> {
    match name {
        debug_echo::NAME => Some(Arc::new(debug_echo::DebugEcho::new(false))),
        udev::NAME => Some(Arc::new(udev::Udev::new())),
        network::NAME => Some(Arc::new(network::TcpProbe::new())),
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
        let names: Vec<String> = embedded().iter().map(|h| h.name().to_string()).collect();
        assert_eq!(names, ["debug-echo", "udev", "tcp-probe"]);
        for name in NAMES {
            assert_eq!(
                by_name(name).map(|h| h.name().to_string()).as_deref(),
                Some(name)
            );
        }
        assert!(by_name("onvif").is_none());
        assert!(!by_name("debug-echo").map(|h| h.shared()).unwrap_or(true));
        assert!(by_name("tcp-probe").map(|h| h.shared()).unwrap_or(false));
    }
}
