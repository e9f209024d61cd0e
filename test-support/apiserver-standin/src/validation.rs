//! Name and label syntax checks (apimachinery's `validation` package subset).

fn is_alnum_lower(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

/// RFC 1123 label: at most 63 characters, `[a-z0-9]([-a-z0-9]*[a-z0-9])?`.
pub fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars().all(|c| is_alnum_lower(c) || c == '-')
        && s.chars().next().is_some_and(is_alnum_lower)
        && s.chars().last().is_some_and(is_alnum_lower)
}

/// RFC 1123 subdomain: at most 253 characters, dot-separated labels.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|part| {
            !part.is_empty()
                && part.chars().all(|c| is_alnum_lower(c) || c == '-')
                && part.chars().next().is_some_and(is_alnum_lower)
                && part.chars().last().is_some_and(is_alnum_lower)
        })
}

/// Message kube-apiserver attaches to an invalid subdomain name.
pub const SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

/// Message kube-apiserver attaches to an invalid label name.
pub const LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";

fn is_name_part(s: &str) -> bool {
    let ok = |c: char| c.is_ascii_alphanumeric();
    !s.is_empty()
        && s.len() <= 63
        && s.chars().all(|c| ok(c) || c == '-' || c == '_' || c == '.')
        && s.chars().next().is_some_and(ok)
        && s.chars().last().is_some_and(ok)
}

/// Qualified name (label / annotation key): optional `prefix/` (subdomain) + name part.
pub fn is_qualified_name(s: &str) -> bool {
    match s.split_once('/') {
        Some((prefix, name)) => is_dns1123_subdomain(prefix) && is_name_part(name),
        None => is_name_part(s),
    }
}

/// Label value: empty, or a name part.
pub fn is_label_value(s: &str) -> bool {
    s.is_empty() || is_name_part(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(is_dns1123_subdomain("a.b-c.d"));
        assert!(!is_dns1123_subdomain("A"));
        assert!(!is_dns1123_subdomain("a..b"));
        assert!(!is_dns1123_subdomain("-a"));
        assert!(is_dns1123_label("abc-1"));
        assert!(!is_dns1123_label("a.b"));
        assert!(!is_dns1123_label(&"a".repeat(64)));
        assert!(is_qualified_name("steward.dev/node"));
        assert!(is_qualified_name("App_1"));
        assert!(!is_qualified_name("a/b/c"));
        assert!(is_label_value(""));
        assert!(!is_label_value("a b"));
    }
}
