//! The names steward gives its CDI devices and spec files, keyed by
//! namespace and name: what the slot keeper hands kubelet (Allocate,
//! NodePrepareResources) and what the CDI writer puts on disk agree by
//! construction.

use std::path::{Path, PathBuf};

/// The CDI kind of a Configuration: `steward.dev/<configuration>`.
pub fn kind(configuration: &str) -> String {
    format!("{}/{configuration}", steward_api::GROUP)
}

/// An object's namespace; none is Kubernetes' `default` (a name must not
/// start with the `_` separator).
fn namespace_or_default(namespace: &str) -> &str {
    if namespace.is_empty() {
        "default"
    } else {
        namespace
    }
}

/// The CDI device name of Instance `instance` in `namespace` (unqualified):
/// `<namespace>_<instance>`.
pub fn device_name(namespace: &str, instance: &str) -> String {
    format!("{}_{instance}", namespace_or_default(namespace))
}

/// The fully qualified CDI name of Instance `instance` of Configuration
/// `configuration` in `namespace`, as Allocate and NodePrepareResources
/// name it: `steward.dev/<configuration>=<namespace>_<instance>`.
pub fn qualified_name(namespace: &str, configuration: &str, instance: &str) -> String {
    format!(
        "{}={}",
        kind(configuration),
        device_name(namespace, instance)
    )
}

/// Spec file of Configuration `configuration` of `namespace` inside `dir`:
/// `steward.dev-<namespace>_<configuration>.json`.
pub fn spec_path(dir: &Path, namespace: &str, configuration: &str) -> PathBuf {
    dir.join(format!(
        "{}-{}_{configuration}.json",
        steward_api::GROUP,
        namespace_or_default(namespace)
    ))
}
