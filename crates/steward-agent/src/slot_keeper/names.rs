//! Names the device plugins derive from an Instance: the extended resource,
//! the plugin socket, environment variable names.

pub use steward_core::extended_resource::resource_name;

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
    fn env_names_are_sanitized() {
        assert_eq!(env_name("DEBUG_ECHO_DESCRIPTION"), "DEBUG_ECHO_DESCRIPTION");
        assert_eq!(env_name("my.prop-name"), "my_prop_name");
        assert_eq!(env_name("9lives"), "_9lives");
        assert_eq!(env_name("caf\u{e9}"), "caf_");
        assert_eq!(env_name(""), "");
    }
}
