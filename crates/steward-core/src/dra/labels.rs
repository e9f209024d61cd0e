//! DNS labels for device names.

/// Longest DNS label (a device name).
pub(super) const MAX_LABEL: usize = 63;

/// Whether `s` is a DNS label (RFC 1123).
pub(super) fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_LABEL
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

/// A DNS label for a name that is not one: a prefix of `name` (dots become
/// dashes) ending in `tail`, which carries a hash of the whole name.
pub(super) fn hashed_label(name: &str, tail: &str) -> String {
    let head: String = name
        .chars()
        .map(|c| if c == '.' { '-' } else { c })
        .take(MAX_LABEL - tail.len())
        .collect();
    let head = head.trim_end_matches('-');
    if head.is_empty() {
        format!("d{tail}")
    } else {
        format!("{head}{tail}")
    }
}
