//! Configuration sources: the Kubernetes API (watch) or a local YAML file.

mod file;
mod kube;

use std::collections::BTreeMap;

pub use self::file::{file_source, parse_configurations};
pub use self::kube::{kube_source, resolve_properties};

use steward_api::Configuration;
use steward_core::discovery::ConfigKey;
use steward_discovery::DiscoverRequest;

use crate::error::Unresolved;

/// A Configuration as the agent acts on it.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigSnapshot {
    pub key: ConfigKey,
    /// The whole object (uid for ownerReferences, spec for policy).
    pub configuration: Configuration,
    /// Details and resolved discovery properties, or why properties could
    /// not be resolved.
    pub request: Result<DiscoverRequest, Unresolved>,
}

/// A change of the set of Configurations.
#[derive(Debug, Clone, PartialEq)]
pub enum ConfigEvent {
    /// A Configuration appeared or its spec changed.
    Applied(Box<ConfigSnapshot>),
    /// A Configuration is gone.
    Deleted(ConfigKey),
    /// The source has a complete view: these are all the Configurations
    /// that exist (sent after each full listing or file load).
    Synced(std::collections::BTreeSet<ConfigKey>),
}

/// Inline property values; `valueFrom` entries are resolved by the caller.
pub(crate) fn inline_properties(c: &Configuration) -> BTreeMap<String, Vec<u8>> {
    c.spec
        .discovery_handler
        .discovery_properties
        .iter()
        .filter_map(|p| {
            p.value
                .as_ref()
                .map(|v| (p.name.clone(), v.clone().into_bytes()))
        })
        .collect()
}
