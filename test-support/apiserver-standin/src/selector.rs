//! Label selectors (full Kubernetes string syntax) and field selectors.

use serde_json::Value;

use crate::error::ApiError;
use crate::validation::{is_label_value, is_qualified_name};

/// Operator of one label requirement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelOp {
    /// `key=value` / `key==value`
    Equals,
    /// `key!=value` (also matches when the label is absent)
    NotEquals,
    /// `key in (a,b)`
    In,
    /// `key notin (a,b)` (also matches when the label is absent)
    NotIn,
    /// `key`
    Exists,
    /// `!key`
    DoesNotExist,
}

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelRequirement {
    /// Label key.
    pub key: String,
    /// Operator.
    pub op: LabelOp,
    /// Values (empty for Exists / DoesNotExist).
    pub values: Vec<String>,
}

/// A parsed label selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    /// All requirements (ANDed).
    pub requirements: Vec<LabelRequirement>,
}

fn parse_err(msg: impl std::fmt::Display) -> ApiError {
    ApiError::bad_request(format!("unable to parse requirement: {msg}"))
}

fn split_top_level(s: &str) -> Result<Vec<String>, ApiError> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' => {
                depth += 1;
                cur.push(c);
            }
            ')' => {
                depth -= 1;
                if depth < 0 {
                    return Err(parse_err(format!("unbalanced ')' in {s:?}")));
                }
                cur.push(c);
            }
            ',' if depth == 0 => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    if depth != 0 {
        return Err(parse_err(format!("unbalanced '(' in {s:?}")));
    }
    out.push(cur);
    Ok(out)
}

fn check_key(key: &str) -> Result<(), ApiError> {
    if is_qualified_name(key) {
        Ok(())
    } else {
        Err(parse_err(format!(
            "key: Invalid value: {key:?}: name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
        )))
    }
}

fn check_value(key: &str, value: &str) -> Result<(), ApiError> {
    if is_label_value(value) {
        Ok(())
    } else {
        Err(parse_err(format!(
            "values[0][{key}]: Invalid value: {value:?}: a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
        )))
    }
}

impl LabelSelector {
    /// Parses the `labelSelector` query syntax.
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let mut requirements = Vec::new();
        if s.trim().is_empty() {
            return Ok(Self { requirements });
        }
        for term in split_top_level(s)? {
            let term = term.trim();
            if term.is_empty() {
                return Err(parse_err(format!(
                    "found '', expected: identifier in {s:?}"
                )));
            }
            requirements.push(parse_requirement(term)?);
        }
        Ok(Self { requirements })
    }

    /// Whether the labels (a JSON object or null) satisfy every requirement.
    pub fn matches(&self, labels: Option<&Value>) -> bool {
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.requirements.iter().all(|r| {
            let v = get(&r.key);
            match r.op {
                LabelOp::Equals => v == r.values.first().map(String::as_str),
                LabelOp::NotEquals => v != r.values.first().map(String::as_str),
                LabelOp::In => v.is_some_and(|v| r.values.iter().any(|x| x == v)),
                LabelOp::NotIn => !v.is_some_and(|v| r.values.iter().any(|x| x == v)),
                LabelOp::Exists => v.is_some(),
                LabelOp::DoesNotExist => v.is_none(),
            }
        })
    }
}

fn parse_requirement(term: &str) -> Result<LabelRequirement, ApiError> {
    if let Some(rest) = term.strip_prefix('!') {
        let key = rest.trim();
        check_key(key)?;
        return Ok(LabelRequirement {
            key: key.to_string(),
            op: LabelOp::DoesNotExist,
            values: vec![],
        });
    }
    for (tok, op) in [
        ("!=", LabelOp::NotEquals),
        ("==", LabelOp::Equals),
        ("=", LabelOp::Equals),
    ] {
        if let Some(idx) = term.find(tok) {
            let key = term[..idx].trim();
            let value = term[idx + tok.len()..].trim();
            check_key(key)?;
            check_value(key, value)?;
            return Ok(LabelRequirement {
                key: key.to_string(),
                op,
                values: vec![value.to_string()],
            });
        }
    }
    // set based: `key in (a, b)` / `key notin (a)`
    if let Some(open) = term.find('(') {
        let head = term[..open].trim();
        let Some(inner) = term[open + 1..].strip_suffix(')') else {
            return Err(parse_err(format!("expected ')' at the end of {term:?}")));
        };
        let mut words = head.split_whitespace();
        let (Some(key), Some(opword), None) = (words.next(), words.next(), words.next()) else {
            return Err(parse_err(format!(
                "expected `<key> in|notin (...)`, found {term:?}"
            )));
        };
        let op = match opword {
            "in" => LabelOp::In,
            "notin" => LabelOp::NotIn,
            other => {
                return Err(parse_err(format!(
                    "found '{other}', expected: in, notin, =, ==, !=, gt, lt"
                )));
            }
        };
        check_key(key)?;
        let values: Vec<String> = inner
            .split(',')
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
            .collect();
        if values.is_empty() {
            return Err(parse_err(format!(
                "for 'in', 'notin' operators, values set can't be empty ({term:?})"
            )));
        }
        for v in &values {
            check_value(key, v)?;
        }
        return Ok(LabelRequirement {
            key: key.to_string(),
            op,
            values,
        });
    }
    if term.contains(char::is_whitespace) {
        return Err(parse_err(format!(
            "found {term:?}, expected: ',' or 'end of string'"
        )));
    }
    if term.contains('<') || term.contains('>') {
        return Err(ApiError::not_implemented(
            "label selector operators 'gt' / 'lt' ('<' / '>')",
        ));
    }
    check_key(term)?;
    Ok(LabelRequirement {
        key: term.to_string(),
        op: LabelOp::Exists,
        values: vec![],
    })
}

/// One `field=value` / `field!=value` term.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldRequirement {
    /// Field label (`metadata.name`, `spec.nodeName`).
    pub field: String,
    /// JSON path the label reads (dotted).
    pub path: String,
    /// true for `!=`.
    pub negated: bool,
    /// Expected value.
    pub value: String,
}

/// A parsed field selector.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    /// All requirements (ANDed).
    pub requirements: Vec<FieldRequirement>,
}

fn unescape_split(s: &str) -> Vec<String> {
    // splits on unescaped ',' keeping escapes for the next step
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut esc = false;
    for c in s.chars() {
        if esc {
            cur.push('\\');
            cur.push(c);
            esc = false;
        } else if c == '\\' {
            esc = true;
        } else if c == ',' {
            out.push(std::mem::take(&mut cur));
        } else {
            cur.push(c);
        }
    }
    out.push(cur);
    out
}

fn unescape(s: &str) -> String {
    let mut out = String::new();
    let mut esc = false;
    for c in s.chars() {
        if esc {
            out.push(c);
            esc = false;
        } else if c == '\\' {
            esc = true;
        } else {
            out.push(c);
        }
    }
    out
}

fn find_unescaped(s: &str, pat: &str) -> Option<usize> {
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' {
            i += 2;
            continue;
        }
        if s[i..].starts_with(pat) {
            return Some(i);
        }
        i += 1;
    }
    None
}

impl FieldSelector {
    /// Parses a `fieldSelector`; `supported` maps field labels to JSON paths.
    pub fn parse(s: &str, supported: &[(String, String)]) -> Result<Self, ApiError> {
        let mut requirements = Vec::new();
        if s.trim().is_empty() {
            return Ok(Self { requirements });
        }
        for term in unescape_split(s) {
            let term = term.trim();
            let (field, negated, value) = if let Some(i) = find_unescaped(term, "!=") {
                (&term[..i], true, &term[i + 2..])
            } else if let Some(i) = find_unescaped(term, "==") {
                (&term[..i], false, &term[i + 2..])
            } else if let Some(i) = find_unescaped(term, "=") {
                (&term[..i], false, &term[i + 1..])
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid field selector: {term:?}: expected an operator ('=', '==' or '!=')"
                )));
            };
            let field = field.trim();
            let Some((_, path)) = supported.iter().find(|(f, _)| f == field) else {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {field}"
                )));
            };
            requirements.push(FieldRequirement {
                field: field.to_string(),
                path: path.clone(),
                negated,
                value: unescape(value),
            });
        }
        Ok(Self { requirements })
    }

    /// Whether the object satisfies every requirement.
    pub fn matches(&self, obj: &Value) -> bool {
        self.requirements.iter().all(|r| {
            let actual = field_value(obj, &r.path);
            (actual == r.value) != r.negated
        })
    }
}

/// String form of the value at a dotted path (missing / null are "").
pub fn field_value(obj: &Value, path: &str) -> String {
    let mut cur = obj;
    for part in path.split('.') {
        match cur.get(part) {
            Some(v) => cur = v,
            None => return String::new(),
        }
    }
    match cur {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        other => other.to_string(),
    }
}

/// Label and field selectors of one request.
#[derive(Debug, Clone, Default)]
pub struct Selectors {
    /// Label selector.
    pub labels: LabelSelector,
    /// Field selector.
    pub fields: FieldSelector,
}

impl Selectors {
    /// Whether the object matches both selectors.
    pub fn matches(&self, obj: &Value) -> bool {
        self.labels
            .matches(obj.get("metadata").and_then(|m| m.get("labels")))
            && self.fields.matches(obj)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_syntax() {
        let l = json!({"app": "web", "tier": "fe", "env": "prod"});
        let ok = |s: &str| LabelSelector::parse(s).unwrap().matches(Some(&l));
        assert!(ok("app=web"));
        assert!(ok("app==web"));
        assert!(!ok("app!=web"));
        assert!(ok("missing!=x"));
        assert!(ok("app in (web, db)"));
        assert!(!ok("app notin (web)"));
        assert!(ok("missing notin (web)"));
        assert!(ok("tier"));
        assert!(!ok("!tier"));
        assert!(ok("!missing"));
        assert!(ok("app=web,env in (prod),!missing"));
        assert!(!ok("app=web,env in (dev)"));
        assert!(ok(""));
        assert!(LabelSelector::parse("app in ()").is_err());
        assert!(LabelSelector::parse("a b").is_err());
        assert!(LabelSelector::parse("app in (a").is_err());
        assert!(LabelSelector::parse("-bad=x").is_err());
    }

    #[test]
    fn field_syntax() {
        let sup = vec![
            ("metadata.name".to_string(), "metadata.name".to_string()),
            ("spec.nodeName".to_string(), "spec.nodeName".to_string()),
        ];
        let pod = json!({"metadata": {"name": "a"}, "spec": {}});
        let f = FieldSelector::parse("metadata.name=a,spec.nodeName=", &sup).unwrap();
        assert!(f.matches(&pod));
        let f = FieldSelector::parse("spec.nodeName!=", &sup).unwrap();
        assert!(!f.matches(&pod));
        let e = FieldSelector::parse("spec.foo=a", &sup).unwrap_err();
        assert_eq!(e.code, 400);
        assert_eq!(e.message, "field label not supported: spec.foo");
    }
}
