//! The names steward gives the DeviceClasses it owns, and the label and
//! annotations that mark them. Pure; a leaf of [`super`].

use steward_core::dra::DRIVER;

pub use steward_core::dra::{MANAGED_BY, MANAGED_BY_LABEL, OWNED_SELECTOR};

/// The annotation naming the class's Configuration, `<namespace>/<name>`.
pub const CONFIGURATION_ANNOTATION: &str = "steward.dev/configuration";

/// Longest object name (a DNS subdomain).
const MAX_NAME: usize = 253;
/// Longest namespace name (a DNS label).
const MAX_LABEL: usize = 63;

/// The DeviceClass name of Configuration `name` in `namespace`:
/// `<name>.<namespace>.steward.dev`. The namespace is a DNS label (no dot),
/// so the last label before `.steward.dev` is always the namespace and two
/// Configurations never share a name. When that is longer
/// than 253 characters, the Configuration name is cut and a hash of
/// `<namespace>/<name>` appended: `<head>-<16 hex digits>.<namespace>.steward.dev`
/// (a Configuration name of 190 characters or more).
pub fn class_name(namespace: &str, name: &str) -> String {
    subdomain(name, namespace)
}

/// `<name>.<middle>.steward.dev`, or, past 253 characters,
/// `<head>-<16 hex digits>.<middle>.steward.dev` with a hash of
/// `<middle>/<name>` (namespaces in `middle` have no `/`).
pub(super) fn subdomain(name: &str, middle: &str) -> String {
    let suffix = format!(".{middle}.{DRIVER}");
    if name.len() + suffix.len() <= MAX_NAME {
        return format!("{name}{suffix}");
    }
    let hash = fnv1a64(format!("{middle}/{name}").as_bytes());
    let tail = format!("-{hash:016x}{suffix}");
    let head: String = name
        .chars()
        .take(MAX_NAME.saturating_sub(tail.len()))
        .collect();
    let head = head.trim_end_matches(['-', '.']);
    if head.is_empty() {
        format!("c{tail}")
    } else {
        format!("{head}{tail}")
    }
}

/// The CEL selector of the devices of Configuration `name` in `namespace`:
/// `device.driver == "steward.dev" && device.attributes["steward.dev"].namespace == "<namespace>" && device.attributes["steward.dev"].configuration == "<name>"`
/// (names longer than 64 bytes as the agent publishes them:
/// [`steward_core::dra::attribute_value`]).
pub fn selector(namespace: &str, name: &str) -> String {
    steward_core::dra::configuration_selector(namespace, name)
}

/// FNV-1a, 64 bits: stable across builds and platforms.
fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// A namespace name: a DNS label.
pub(super) fn is_namespace(s: &str) -> bool {
    s.len() <= MAX_LABEL && !s.contains('.') && is_dns_subdomain(s)
}

/// A DNS subdomain as Kubernetes checks object names: at most 253
/// characters, dot-separated labels of lowercase letters, digits and `-`,
/// each starting and ending with a letter or digit.
pub(super) fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= MAX_NAME
        && s.split('.').all(|l| {
            let b = l.as_bytes();
            !b.is_empty()
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        })
}
