//! Validation of extended resource names, following the API machinery rules
//! kubelet applies when a device plugin registers.

/// Prefix of resource names reserved for resources native to Kubernetes.
const NATIVE_PREFIX: &str = "kubernetes.io/";
/// Prefix quota uses for request names; an extended resource name must still be
/// a qualified name once this is put in front of it.
const REQUESTS_PREFIX: &str = "requests.";

/// Whether `name` is a valid extended resource name (`domain/name`, the domain
/// not reserved for Kubernetes itself).
pub fn is_extended_resource_name(name: &str) -> bool {
    if !name.contains('/') || name.contains(NATIVE_PREFIX) || name.starts_with(REQUESTS_PREFIX) {
        return false;
    }
    is_qualified_name(&format!("{REQUESTS_PREFIX}{name}"))
}

/// `IsQualifiedName`: optional DNS-1123 subdomain prefix, a slash, and a name
/// part of at most 63 characters.
fn is_qualified_name(value: &str) -> bool {
    let parts: Vec<&str> = value.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() || !is_dns1123_subdomain(prefix) {
                return false;
            }
            *name
        }
        _ => return false,
    };
    if name.is_empty() || name.len() > 63 {
        return false;
    }
    let bytes = name.as_bytes();
    let alnum = |b: u8| b.is_ascii_alphanumeric();
    let first_ok = bytes.first().copied().is_some_and(alnum);
    let last_ok = bytes.last().copied().is_some_and(alnum);
    let middle_ok = bytes
        .iter()
        .all(|&b| alnum(b) || b == b'-' || b == b'_' || b == b'.');
    first_ok && last_ok && middle_ok
}

fn is_dns1123_subdomain(value: &str) -> bool {
    if value.len() > 253 {
        return false;
    }
    value.split('.').all(is_dns1123_label_chars)
}

fn is_dns1123_label_chars(label: &str) -> bool {
    let bytes = label.as_bytes();
    let lower_alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    match (bytes.first(), bytes.last()) {
        (Some(&first), Some(&last)) => {
            lower_alnum(first)
                && lower_alnum(last)
                && bytes.iter().all(|&b| lower_alnum(b) || b == b'-')
        }
        _ => false,
    }
}

/// Whether a registration endpoint is a plain file name, so that it resolves
/// to a socket directly inside the device plugin directory.
pub fn is_plain_socket_name(endpoint: &str) -> bool {
    !endpoint.is_empty()
        && endpoint != "."
        && endpoint != ".."
        && !endpoint.contains('/')
        && !endpoint.contains('\0')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_extended_names() {
        for ok in [
            "example.com/gpu",
            "steward.dev/usb-serial",
            "a.b-c.d/X_y.z9",
            "vendor1.io/fpga",
        ] {
            assert!(is_extended_resource_name(ok), "{ok} should be valid");
        }
    }

    #[test]
    fn rejects_native_and_malformed_names() {
        for bad in [
            "gpu",
            "cpu",
            "kubernetes.io/gpu",
            "requests.example.com/gpu",
            "Example.com/gpu",
            "example.com/",
            "/gpu",
            "example.com/a/b",
            "example.com/-gpu",
            "example..com/gpu",
            "example.com/gpu!",
        ] {
            assert!(!is_extended_resource_name(bad), "{bad} should be invalid");
        }
        let long = format!("example.com/{}", "a".repeat(64));
        assert!(!is_extended_resource_name(&long));
    }

    #[test]
    fn socket_names() {
        assert!(is_plain_socket_name("plugin.sock"));
        assert!(!is_plain_socket_name(""));
        assert!(!is_plain_socket_name("../kubelet.sock"));
        assert!(!is_plain_socket_name("sub/plugin.sock"));
        assert!(!is_plain_socket_name(".."));
    }
}
