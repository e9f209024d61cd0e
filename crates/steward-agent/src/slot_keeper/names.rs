//! Names the device plugins derive from an Instance: the extended resource,
//! the plugin socket, environment variable names.

use steward_api::GROUP;

/// Most characters of the name part of a qualified name.
const MAX_NAME_PART: usize = 63;

/// The extended resource an Instance is served as: `steward.dev/<instance>`.
/// `None` when the Instance name cannot be the name part of a qualified
/// name (at most 63 characters, alphanumeric at both ends, `-_.` inside):
/// kubelet would refuse the registration.
pub fn resource_name(instance: &str) -> Option<String> {
    let bytes = instance.as_bytes();
    let alnum = |b: &u8| b.is_ascii_alphanumeric();
    let valid = !bytes.is_empty()
        && bytes.len() <= MAX_NAME_PART
        && bytes.first().is_some_and(alnum)
        && bytes.last().is_some_and(alnum)
        && bytes
            .iter()
            .all(|b| alnum(b) || matches!(b, b'-' | b'_' | b'.'));
    valid.then(|| format!("{GROUP}/{instance}"))
}

/// Socket file name of an Instance's plugin inside kubelet's plugin
/// directory.
pub fn socket_name(instance: &str) -> String {
    format!("steward-{instance}.sock")
}

/// A valid environment variable name for `name`: characters other than
/// ASCII letters, digits and `_` become `_`, and a leading digit gets a `_`
/// in front. Empty names stay empty (the caller drops them).
pub fn env_name(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_names_follow_the_qualified_name_rules() {
        assert_eq!(
            resource_name("cams-0a1b2c3d4e").as_deref(),
            Some("steward.dev/cams-0a1b2c3d4e")
        );
        assert_eq!(resource_name(""), None);
        assert_eq!(resource_name("-cam"), None);
        assert_eq!(resource_name("cam-"), None);
        assert_eq!(resource_name("ca/m"), None);
        assert_eq!(resource_name(&"a".repeat(64)), None);
        assert!(resource_name(&"a".repeat(63)).is_some());
    }

    #[test]
    fn env_names_are_sanitized() {
        assert_eq!(env_name("DEBUG_ECHO_DESCRIPTION"), "DEBUG_ECHO_DESCRIPTION");
        assert_eq!(env_name("my.prop-name"), "my_prop_name");
        assert_eq!(env_name("9lives"), "_9lives");
        assert_eq!(env_name("caf\u{e9}"), "caf_");
        assert_eq!(env_name(""), "");
    }
}
