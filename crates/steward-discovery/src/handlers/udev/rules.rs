//! A udev-rule-like match language.
//!
//! A rule is a comma-separated list of `KEY=="pattern"` / `KEY!="pattern"`
//! matches, all of which must hold. Patterns are shell globs (see
//! [`super::glob`]), `|` separates alternatives, `\"` is a literal quote.
//!
//! Keys on the device itself: `SUBSYSTEM`, `KERNEL`, `DEVPATH`, `DRIVER`,
//! `DEVTYPE`, `ATTR{name}`, `ENV{name}` (= `PROPERTY{name}`), `TAG`.
//! Keys on the device or any ancestor: `SUBSYSTEMS`, `KERNELS`, `DRIVERS`,
//! `ATTRS{name}` — as in udev, all of a rule's ancestor matches must hold on
//! the same device. A missing value matches as the empty string; attribute
//! values are compared without trailing whitespace.

use std::fmt;

use super::glob::Glob;

/// Which value a match looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Key {
    Subsystem,
    Kernel,
    Devpath,
    Driver,
    Devtype,
    Attr(String),
    Property(String),
    Tag,
    Subsystems,
    Kernels,
    Drivers,
    Attrs(String),
}

impl Key {
    fn is_ancestor_key(&self) -> bool {
        matches!(
            self,
            Key::Subsystems | Key::Kernels | Key::Drivers | Key::Attrs(_)
        )
    }
}

/// Supported keys, for error messages.
pub const SUPPORTED_KEYS: &str = "SUBSYSTEM, KERNEL, DEVPATH, DRIVER, DEVTYPE, ATTR{name}, ENV{name}, PROPERTY{name}, TAG, SUBSYSTEMS, KERNELS, DRIVERS, ATTRS{name}";

/// One `KEY==pattern` or `KEY!=pattern`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Match {
    pub key: Key,
    pub negated: bool,
    pub pattern: Glob,
}

/// A parsed rule: matches on the device, and matches on one of its ancestors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub own: Vec<Match>,
    pub ancestor: Vec<Match>,
}

/// A syntax error, with the 1-based character column where it was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleError {
    pub column: usize,
    pub message: String,
}

impl fmt::Display for RuleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "column {}: {}", self.column, self.message)
    }
}

/// What rule matching needs to know about a device.
pub trait DeviceView: Sized {
    fn subsystem(&self) -> Option<String>;
    fn sysname(&self) -> String;
    fn devpath(&self) -> String;
    fn driver(&self) -> Option<String>;
    fn devtype(&self) -> Option<String>;
    fn attribute(&self, name: &str) -> Option<String>;
    fn property(&self, name: &str) -> Option<String>;
    fn parent(&self) -> Option<Self>;
}

/// Deepest ancestor chain walked for ancestor matches.
const MAX_DEPTH: usize = 64;

fn err(column: usize, message: impl Into<String>) -> RuleError {
    RuleError {
        column: column + 1,
        message: message.into(),
    }
}

fn skip_ws(chars: &[char], i: &mut usize) {
    while chars.get(*i).is_some_and(|c| c.is_whitespace()) {
        *i += 1;
    }
}

fn describe(c: Option<&char>) -> String {
    match c {
        Some(c) => format!("{c:?}"),
        None => "the end of the rule".into(),
    }
}

/// Parses one rule.
pub fn parse_rule(text: &str) -> Result<Rule, RuleError> {
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    let mut rule = Rule {
        own: Vec::new(),
        ancestor: Vec::new(),
    };
    loop {
        skip_ws(&chars, &mut i);
        if i >= chars.len() {
            if rule.own.is_empty() && rule.ancestor.is_empty() {
                return Err(err(i, "empty rule: expected KEY==\"value\""));
            }
            return Err(err(i, "expected a match after ','"));
        }
        let m = parse_match(&chars, &mut i)?;
        if m.key.is_ancestor_key() {
            rule.ancestor.push(m);
        } else {
            rule.own.push(m);
        }
        skip_ws(&chars, &mut i);
        match chars.get(i) {
            None => return Ok(rule),
            Some(',') => i += 1,
            other => {
                return Err(err(
                    i,
                    format!("expected ',' between matches, found {}", describe(other)),
                ));
            }
        }
    }
}

fn parse_match(chars: &[char], i: &mut usize) -> Result<Match, RuleError> {
    let start = *i;
    while chars
        .get(*i)
        .is_some_and(|c| c.is_ascii_alphanumeric() || *c == '_')
    {
        *i += 1;
    }
    let name: String = chars[start..*i].iter().collect();
    if name.is_empty() {
        return Err(err(
            start,
            format!(
                "expected a key ({SUPPORTED_KEYS}), found {}",
                describe(chars.get(start))
            ),
        ));
    }
    let mut attr = None;
    if chars.get(*i) == Some(&'{') {
        let open = *i;
        *i += 1;
        let attr_start = *i;
        while chars.get(*i).is_some_and(|c| *c != '}') {
            *i += 1;
        }
        if chars.get(*i) != Some(&'}') {
            return Err(err(open, "unterminated '{' in key"));
        }
        let a: String = chars[attr_start..*i].iter().collect();
        *i += 1;
        if a.is_empty() || a.chars().any(|c| c.is_whitespace() || c == '"' || c == ',') {
            return Err(err(
                attr_start,
                format!("invalid attribute name {a:?} in {name}{{...}}"),
            ));
        }
        attr = Some(a);
    }
    let key = match (name.as_str(), attr) {
        ("SUBSYSTEM", None) => Key::Subsystem,
        ("KERNEL", None) => Key::Kernel,
        ("DEVPATH", None) => Key::Devpath,
        ("DRIVER", None) => Key::Driver,
        ("DEVTYPE", None) => Key::Devtype,
        ("TAG", None) => Key::Tag,
        ("SUBSYSTEMS", None) => Key::Subsystems,
        ("KERNELS", None) => Key::Kernels,
        ("DRIVERS", None) => Key::Drivers,
        ("ATTR", Some(a)) => Key::Attr(a),
        ("ENV" | "PROPERTY", Some(a)) => Key::Property(a),
        ("ATTRS", Some(a)) => Key::Attrs(a),
        ("ATTR" | "ENV" | "PROPERTY" | "ATTRS", None) => {
            return Err(err(start, format!("{name} needs a name: {name}{{name}}")));
        }
        (
            "SUBSYSTEM" | "KERNEL" | "DEVPATH" | "DRIVER" | "DEVTYPE" | "TAG" | "SUBSYSTEMS"
            | "KERNELS" | "DRIVERS",
            Some(_),
        ) => {
            return Err(err(start, format!("{name} does not take a {{name}}")));
        }
        _ => {
            return Err(err(
                start,
                format!("unknown key {name:?} (supported: {SUPPORTED_KEYS})"),
            ));
        }
    };
    skip_ws(chars, i);
    let op_at = *i;
    let negated = match (chars.get(*i), chars.get(*i + 1)) {
        (Some('='), Some('=')) => false,
        (Some('!'), Some('=')) => true,
        (Some('=' | '+' | '-' | ':'), _) => {
            return Err(err(
                op_at,
                format!("assignments are not supported in {name}: use == or !="),
            ));
        }
        (other, _) => {
            return Err(err(
                op_at,
                format!("expected == or != after {name}, found {}", describe(other)),
            ));
        }
    };
    *i += 2;
    skip_ws(chars, i);
    if chars.get(*i) != Some(&'"') {
        return Err(err(
            *i,
            format!(
                "expected a double-quoted value, found {}",
                describe(chars.get(*i))
            ),
        ));
    }
    let open = *i;
    *i += 1;
    let value_start = *i;
    let mut value = String::new();
    // Column of each value char, to place glob errors.
    let mut columns = Vec::new();
    loop {
        match chars.get(*i) {
            None => return Err(err(open, "unterminated quoted value")),
            Some('"') => {
                *i += 1;
                break;
            }
            Some('\\') if chars.get(*i + 1) == Some(&'"') => {
                value.push('"');
                columns.push(*i);
                *i += 2;
            }
            Some(&c) => {
                value.push(c);
                columns.push(*i);
                *i += 1;
            }
        }
    }
    let pattern = Glob::new(&value).map_err(|e| {
        let col = columns.get(e.offset).copied().unwrap_or(value_start);
        err(col, format!("invalid pattern {value:?}: {}", e.message))
    })?;
    Ok(Match {
        key,
        negated,
        pattern,
    })
}

fn attr_value(v: Option<String>) -> String {
    v.map(|s| s.trim_end().to_string()).unwrap_or_default()
}

fn tags<D: DeviceView>(dev: &D) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for prop in ["TAGS", "CURRENT_TAGS"] {
        for t in dev.property(prop).unwrap_or_default().split(':') {
            if !t.is_empty() && !out.iter().any(|o| o == t) {
                out.push(t.to_string());
            }
        }
    }
    out
}

fn holds<D: DeviceView>(m: &Match, dev: &D) -> bool {
    let hit = match &m.key {
        Key::Tag => tags(dev).iter().any(|t| m.pattern.matches(t)),
        Key::Subsystem | Key::Subsystems => m.pattern.matches(&dev.subsystem().unwrap_or_default()),
        Key::Kernel | Key::Kernels => m.pattern.matches(&dev.sysname()),
        Key::Devpath => m.pattern.matches(&dev.devpath()),
        Key::Driver | Key::Drivers => m.pattern.matches(&dev.driver().unwrap_or_default()),
        Key::Devtype => m.pattern.matches(&dev.devtype().unwrap_or_default()),
        Key::Attr(a) | Key::Attrs(a) => m.pattern.matches(&attr_value(dev.attribute(a))),
        Key::Property(p) => m.pattern.matches(&dev.property(p).unwrap_or_default()),
    };
    hit != m.negated
}

impl Rule {
    /// Whether `dev` satisfies every match of this rule.
    pub fn matches<D: DeviceView>(&self, dev: &D) -> bool {
        if !self.own.iter().all(|m| holds(m, dev)) {
            return false;
        }
        if self.ancestor.is_empty() {
            return true;
        }
        if self.ancestor.iter().all(|m| holds(m, dev)) {
            return true;
        }
        let mut current = dev.parent();
        let mut depth = 0;
        while let Some(d) = current {
            if self.ancestor.iter().all(|m| holds(m, &d)) {
                return true;
            }
            depth += 1;
            if depth >= MAX_DEPTH {
                break;
            }
            current = d.parent();
        }
        false
    }

    /// The subsystems this rule can match, when it has a wildcard-free
    /// `SUBSYSTEM==` match (used to narrow enumeration and monitoring).
    pub fn literal_subsystems(&self) -> Option<Vec<String>> {
        self.own
            .iter()
            .filter(|m| m.key == Key::Subsystem && !m.negated)
            .find_map(|m| m.pattern.literals())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[derive(Clone, Default)]
    struct Fake {
        subsystem: Option<String>,
        sysname: String,
        devpath: String,
        driver: Option<String>,
        attrs: BTreeMap<String, String>,
        props: BTreeMap<String, String>,
        parent: Option<Box<Fake>>,
    }

    impl DeviceView for Fake {
        fn subsystem(&self) -> Option<String> {
            self.subsystem.clone()
        }
        fn sysname(&self) -> String {
            self.sysname.clone()
        }
        fn devpath(&self) -> String {
            self.devpath.clone()
        }
        fn driver(&self) -> Option<String> {
            self.driver.clone()
        }
        fn devtype(&self) -> Option<String> {
            self.props.get("DEVTYPE").cloned()
        }
        fn attribute(&self, name: &str) -> Option<String> {
            self.attrs.get(name).cloned()
        }
        fn property(&self, name: &str) -> Option<String> {
            self.props.get(name).cloned()
        }
        fn parent(&self) -> Option<Self> {
            self.parent.as_deref().cloned()
        }
    }

    fn camera() -> Fake {
        let usb = Fake {
            subsystem: Some("usb".into()),
            sysname: "1-1".into(),
            devpath: "/devices/pci0000:00/usb1/1-1".into(),
            driver: Some("usb".into()),
            attrs: BTreeMap::from([
                ("idVendor".into(), "046d\n".into()),
                ("idProduct".into(), "0825".into()),
            ]),
            ..Default::default()
        };
        let intf = Fake {
            subsystem: Some("usb".into()),
            sysname: "1-1:1.0".into(),
            devpath: "/devices/pci0000:00/usb1/1-1/1-1:1.0".into(),
            driver: Some("uvcvideo".into()),
            parent: Some(Box::new(usb)),
            ..Default::default()
        };
        Fake {
            subsystem: Some("video4linux".into()),
            sysname: "video0".into(),
            devpath: "/devices/pci0000:00/usb1/1-1/1-1:1.0/video4linux/video0".into(),
            attrs: BTreeMap::from([("name".into(), "C270 HD WEBCAM  ".into())]),
            props: BTreeMap::from([
                ("ID_SERIAL".into(), "046d_0825".into()),
                ("TAGS".into(), ":uaccess:seat:".into()),
            ]),
            parent: Some(Box::new(intf)),
            ..Default::default()
        }
    }

    fn matches(rule: &str, dev: &Fake) -> bool {
        parse_rule(rule).unwrap().matches(dev)
    }

    #[test]
    fn own_keys() {
        let cam = camera();
        assert!(matches(r#"SUBSYSTEM=="video4linux""#, &cam));
        assert!(matches(
            r#"SUBSYSTEM=="video4linux", KERNEL=="video[0-9]*""#,
            &cam
        ));
        assert!(!matches(
            r#"SUBSYSTEM=="video4linux", KERNEL!="video*""#,
            &cam
        ));
        assert!(matches(r#"DEVPATH=="*/usb1/*""#, &cam));
        assert!(
            matches(r#"ATTR{name}=="C270 HD WEBCAM""#, &cam),
            "trailing space ignored"
        );
        assert!(matches(r#"ENV{ID_SERIAL}=="046d_*""#, &cam));
        assert!(matches(r#"PROPERTY{ID_SERIAL}=="046d_0825""#, &cam));
        assert!(matches(r#"ENV{MISSING}!="x""#, &cam));
        assert!(matches(r#"ENV{MISSING}=="""#, &cam));
        assert!(matches(r#"TAG=="uaccess""#, &cam));
        assert!(!matches(r#"TAG!="seat""#, &cam));
        assert!(matches(r#"TAG!="systemd""#, &cam));
        assert!(
            !matches(r#"DRIVER=="uvcvideo""#, &cam),
            "DRIVER is the device's own"
        );
        assert!(matches(r#"SUBSYSTEM=="block|video4linux""#, &cam));
    }

    #[test]
    fn ancestor_keys_must_hold_on_one_device() {
        let cam = camera();
        assert!(matches(r#"DRIVERS=="uvcvideo""#, &cam));
        assert!(matches(
            r#"SUBSYSTEMS=="usb", ATTRS{idVendor}=="046d", ATTRS{idProduct}=="0825""#,
            &cam
        ));
        assert!(
            matches(r#"KERNELS=="video0""#, &cam),
            "the device itself counts"
        );
        // idVendor is on 1-1, uvcvideo on 1-1:1.0: not the same device.
        assert!(!matches(
            r#"DRIVERS=="uvcvideo", ATTRS{idVendor}=="046d""#,
            &cam
        ));
        assert!(!matches(r#"ATTRS{idVendor}=="8086""#, &cam));
    }

    #[test]
    fn syntax_errors_have_columns() {
        let cases = [
            ("", 1, "empty rule"),
            ("   ", 4, "empty rule"),
            (r#"FOO=="x""#, 1, "unknown key"),
            (r#"SUBSYSTEM=="a", BAR=="x""#, 17, "unknown key"),
            (r#"SUBSYSTEM="x""#, 10, "assignments are not supported"),
            (r#"SUBSYSTEM+="x""#, 10, "assignments are not supported"),
            (r#"SUBSYSTEM=="x" KERNEL=="y""#, 16, "expected ','"),
            (r#"SUBSYSTEM==x"#, 12, "double-quoted"),
            (r#"SUBSYSTEM=="x"#, 12, "unterminated quoted value"),
            (r#"ATTR=="x""#, 1, "needs a name"),
            (r#"KERNEL{x}=="x""#, 1, "does not take"),
            (r#"ATTR{size=="x""#, 5, "unterminated '{'"),
            (r#"KERNEL=="loop[0-9""#, 14, "unterminated '['"),
            (r#"SUBSYSTEM=="a","#, 16, "expected a match after ','"),
            (r#"SUBSYSTEM"#, 10, "expected == or !="),
        ];
        for (rule, column, text) in cases {
            let e = parse_rule(rule).unwrap_err();
            assert_eq!(e.column, column, "{rule:?}: {e}");
            assert!(e.message.contains(text), "{rule:?}: {e}");
        }
    }

    #[test]
    fn escaped_quotes_and_literal_subsystems() {
        let r = parse_rule(r#"ATTR{name}=="say \"hi\"", SUBSYSTEM=="mem|block""#).unwrap();
        let dev = Fake {
            subsystem: Some("mem".into()),
            attrs: BTreeMap::from([("name".into(), "say \"hi\"".into())]),
            ..Default::default()
        };
        assert!(r.matches(&dev));
        assert_eq!(
            r.literal_subsystems(),
            Some(vec!["mem".into(), "block".into()])
        );
        assert_eq!(
            parse_rule(r#"SUBSYSTEM=="b*""#)
                .unwrap()
                .literal_subsystems(),
            None
        );
        assert_eq!(
            parse_rule(r#"KERNEL=="x""#).unwrap().literal_subsystems(),
            None
        );
    }
}
