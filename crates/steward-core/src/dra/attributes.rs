//! Device attributes from discovery properties, typed as DRA wants them,
//! within the API's limits.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Most attributes (and capacities) a device may carry.
pub const MAX_ATTRIBUTES: usize = 32;
/// Longest attribute name (a C identifier).
const MAX_NAME: usize = 32;
/// Longest string or version value.
const MAX_VALUE: usize = 64;

/// One attribute value: exactly one of the API's four kinds (serialized as
/// `resource.k8s.io/v1` DeviceAttribute: `{"int": 3}`, `{"version": "1.2.3"}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Attribute {
    String(String),
    Int(i64),
    Bool(bool),
    /// A semantic version (`1.2.3`, optional pre-release and build).
    Version(String),
}

/// The typed value of a discovery property: `true`/`false` → bool, an
/// integer → int, a semantic version → version, anything else a string.
/// `None` when it fits none (a string longer than 64 bytes).
pub fn typed(value: &str) -> Option<Attribute> {
    match value {
        "true" => return Some(Attribute::Bool(true)),
        "false" => return Some(Attribute::Bool(false)),
        _ => {}
    }
    if let Ok(n) = value.parse::<i64>()
        && n.to_string() == value
    {
        return Some(Attribute::Int(n));
    }
    if value.len() > MAX_VALUE {
        return None;
    }
    if is_semver(value) {
        return Some(Attribute::Version(value.to_owned()));
    }
    Some(Attribute::String(value.to_owned()))
}

/// `MAJOR.MINOR.PATCH[-pre][+build]`, numbers without leading zeros.
fn is_semver(v: &str) -> bool {
    let (rest, build) = match v.split_once('+') {
        Some((r, b)) => (r, Some(b)),
        None => (v, None),
    };
    let (core, pre) = match rest.split_once('-') {
        Some((c, p)) => (c, Some(p)),
        None => (rest, None),
    };
    let number = |p: &str| {
        !p.is_empty()
            && p.bytes().all(|b| b.is_ascii_digit())
            && (p.len() == 1 || !p.starts_with('0'))
    };
    let identifiers = |s: &str| {
        s.split('.')
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
    };
    let parts: Vec<&str> = core.split('.').collect();
    parts.len() == 3
        && parts.iter().all(|p| number(p))
        && pre.is_none_or(identifiers)
        && build.is_none_or(identifiers)
}

/// A property name as a DRA attribute name: a C identifier of at most 32
/// characters (`UDEV_DEVNODE` stays; `a.b` is not one).
fn attribute_name(name: &str) -> Option<String> {
    let mut chars = name.chars();
    let first = chars.next()?;
    ((first.is_ascii_alphabetic() || first == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && name.len() <= MAX_NAME)
        .then(|| name.to_owned())
}

/// The attributes of a device: `fixed` first (steward's own, always kept),
/// then the discovery `properties` that make valid attributes, in name
/// order, up to [`MAX_ATTRIBUTES`] in all. Returns them and the property
/// names left out, each with why.
pub fn attributes_of(
    fixed: BTreeMap<String, Attribute>,
    properties: &BTreeMap<String, String>,
) -> (BTreeMap<String, Attribute>, Vec<(String, &'static str)>) {
    let mut out = fixed;
    let mut skipped = Vec::new();
    for (k, v) in properties {
        let Some(name) = attribute_name(k) else {
            skipped.push((k.clone(), "not a C identifier of at most 32 characters"));
            continue;
        };
        if out.contains_key(&name) {
            skipped.push((k.clone(), "the name of one of steward's own attributes"));
            continue;
        }
        let Some(value) = typed(v) else {
            skipped.push((k.clone(), "a value longer than 64 bytes"));
            continue;
        };
        if out.len() >= MAX_ATTRIBUTES {
            skipped.push((k.clone(), "more than 32 attributes"));
            continue;
        }
        out.insert(name, value);
    }
    (out, skipped)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_typed_the_way_a_cel_selector_compares_them() {
        assert_eq!(typed("true"), Some(Attribute::Bool(true)));
        assert_eq!(typed("42"), Some(Attribute::Int(42)));
        assert_eq!(typed("-7"), Some(Attribute::Int(-7)));
        assert_eq!(typed("007"), Some(Attribute::String("007".into())));
        assert_eq!(typed("1.2.3"), Some(Attribute::Version("1.2.3".into())));
        assert_eq!(
            typed("1.2.3-rc.1+b5"),
            Some(Attribute::Version("1.2.3-rc.1+b5".into()))
        );
        assert_eq!(typed("1.2"), Some(Attribute::String("1.2".into())));
        assert_eq!(typed("01.2.3"), Some(Attribute::String("01.2.3".into())));
        assert_eq!(
            typed("/dev/video0"),
            Some(Attribute::String("/dev/video0".into()))
        );
        assert_eq!(typed(&"x".repeat(65)), None);
        assert_eq!(typed(""), Some(Attribute::String(String::new())));
        assert_eq!(
            serde_json::to_string(&typed("1.2.3")).unwrap(),
            r#"{"version":"1.2.3"}"#
        );
        assert_eq!(serde_json::to_string(&typed("3")).unwrap(), r#"{"int":3}"#);
    }

    #[test]
    fn properties_that_cannot_be_attributes_are_named_and_left_out() {
        let fixed = BTreeMap::from([("instance".to_owned(), Attribute::String("cam".into()))]);
        let props: BTreeMap<String, String> = [
            ("UDEV_DEVNODE", "/dev/video0"),
            ("bad.name", "x"),
            ("instance", "spoof"),
            ("LONG", &"y".repeat(80)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let (attrs, skipped) = attributes_of(fixed, &props);
        assert_eq!(attrs.len(), 2);
        assert_eq!(attrs["instance"], Attribute::String("cam".into()));
        let names: Vec<&str> = skipped.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["LONG", "bad.name", "instance"]);
        let many: BTreeMap<String, String> = (0..40)
            .map(|i| (format!("P{i:02}"), i.to_string()))
            .collect();
        let (attrs, skipped) = attributes_of(BTreeMap::new(), &many);
        assert_eq!((attrs.len(), skipped.len()), (32, 8));
    }
}
