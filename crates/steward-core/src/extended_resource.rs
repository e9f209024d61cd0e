//! The extended resource an Instance is served as, `steward.dev/<instance>`:
//! the device plugin registers it with kubelet, and a DeviceClass can carry
//! it as `extendedResourceName` so the scheduler serves the same request
//! through DRA (KEP-5004). One rule for both paths.

use crate::dra::DRIVER;

/// Most characters of the name part of a qualified name.
const MAX_NAME_PART: usize = 63;

/// The extended resource Instance `instance` is served as:
/// `steward.dev/<instance>`. `None` when the Instance name cannot be the
/// name part of a qualified name (at most 63 characters, alphanumeric at
/// both ends, `-_.` inside): kubelet would refuse the registration, and the
/// API server a DeviceClass naming it.
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
    valid.then(|| format!("{DRIVER}/{instance}"))
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
}
