//! Structural openAPIV3Schema handling for kinds that carry a schema (CRDs):
//! pruning of unknown fields, defaulting, and validation.

use serde_json::{Map, Value, json};

use crate::error::FieldError;

/// Fields of `ObjectMeta` kept on write; anything else in `metadata` is unknown.
const OBJECT_META_FIELDS: &[&str] = &[
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
];

/// Outcome of pruning + validating one object.
#[derive(Debug, Default)]
pub struct SchemaOutcome {
    /// Paths of the unknown fields that were pruned (`spec.foo`).
    pub unknown: Vec<String>,
    /// Validation failures.
    pub errors: Vec<FieldError>,
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// Prunes unknown metadata fields (always, for every kind).
pub fn prune_metadata(obj: &mut Value, unknown: &mut Vec<String>) {
    if let Some(Value::Object(meta)) = obj.get_mut("metadata") {
        let extra: Vec<String> = meta
            .keys()
            .filter(|k| !OBJECT_META_FIELDS.contains(&k.as_str()))
            .cloned()
            .collect();
        for k in extra {
            meta.remove(&k);
            unknown.push(format!("metadata.{k}"));
        }
    }
}

/// Prunes, defaults and validates a whole object against its root schema.
pub fn process(obj: &mut Value, schema: &Value) -> SchemaOutcome {
    let mut out = SchemaOutcome::default();
    prune_metadata(obj, &mut out.unknown);
    if let Value::Object(map) = obj {
        let props = schema.get("properties").and_then(Value::as_object);
        let preserve = flag(schema, "x-kubernetes-preserve-unknown-fields");
        let keys: Vec<String> = map.keys().cloned().collect();
        for key in keys {
            if matches!(key.as_str(), "apiVersion" | "kind" | "metadata") {
                continue;
            }
            match props.and_then(|p| p.get(&key)) {
                Some(child_schema) => {
                    if map.get(&key).is_some_and(Value::is_null) && !flag(child_schema, "nullable")
                    {
                        map.remove(&key);
                    } else if let Some(child) = map.get_mut(&key) {
                        prune(child, child_schema, &key, &mut out.unknown);
                    }
                }
                None if preserve => {}
                None => {
                    map.remove(&key);
                    out.unknown.push(key);
                }
            }
        }
        apply_defaults(map, schema);
        if let Some(props) = props {
            for (key, child_schema) in props {
                if matches!(key.as_str(), "apiVersion" | "kind" | "metadata") {
                    continue;
                }
                if let Some(child) = map.get(key) {
                    validate(child, child_schema, key, &mut out.errors);
                }
            }
        }
        if let Some(req) = schema.get("required").and_then(Value::as_array) {
            for r in req.iter().filter_map(Value::as_str) {
                if !map.contains_key(r) {
                    out.errors.push(FieldError::required(r, ""));
                }
            }
        }
    }
    out
}

fn flag(schema: &Value, name: &str) -> bool {
    schema.get(name).and_then(Value::as_bool).unwrap_or(false)
}

fn apply_defaults(map: &mut Map<String, Value>, schema: &Value) {
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (key, child_schema) in props {
            if !map.contains_key(key)
                && let Some(d) = child_schema.get("default")
            {
                map.insert(key.clone(), d.clone());
            }
        }
    }
}

fn prune(value: &mut Value, schema: &Value, path: &str, unknown: &mut Vec<String>) {
    if flag(schema, "x-kubernetes-int-or-string") {
        return;
    }
    match value {
        Value::Object(map) => {
            let preserve = flag(schema, "x-kubernetes-preserve-unknown-fields");
            let embedded = flag(schema, "x-kubernetes-embedded-resource");
            let props = schema.get("properties").and_then(Value::as_object);
            let addl = schema.get("additionalProperties");
            let keys: Vec<String> = map.keys().cloned().collect();
            for key in keys {
                let child_path = join(path, &key);
                if embedded && matches!(key.as_str(), "apiVersion" | "kind") {
                    continue;
                }
                if embedded && key == "metadata" {
                    if let Some(Value::Object(meta)) = map.get_mut("metadata") {
                        let extra: Vec<String> = meta
                            .keys()
                            .filter(|k| !OBJECT_META_FIELDS.contains(&k.as_str()))
                            .cloned()
                            .collect();
                        for k in extra {
                            meta.remove(&k);
                            unknown.push(join(&child_path, &k));
                        }
                    }
                    continue;
                }
                let child_schema = match (props.and_then(|p| p.get(&key)), addl) {
                    (Some(s), _) => Some(s),
                    (None, Some(s)) if s.is_object() => Some(s),
                    _ => None,
                };
                match child_schema {
                    Some(cs) => {
                        if map.get(&key).is_some_and(Value::is_null) && !flag(cs, "nullable") {
                            map.remove(&key);
                        } else if let Some(child) = map.get_mut(&key) {
                            prune(child, cs, &child_path, unknown);
                        }
                    }
                    None => {
                        let keep = preserve || addl.and_then(Value::as_bool).unwrap_or(false);
                        if !keep {
                            map.remove(&key);
                            unknown.push(child_path);
                        }
                    }
                }
            }
            apply_defaults(map, schema);
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter_mut().enumerate() {
                    prune(item, item_schema, &format!("{path}[{i}]"), unknown);
                }
            }
        }
        _ => {}
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn type_ok(v: &Value, t: &str) -> bool {
    match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        _ => true,
    }
}

fn invalid(path: &str, value: &Value, detail: String, errs: &mut Vec<FieldError>) {
    errs.push(FieldError::invalid(path, value.clone(), detail));
}

/// Validates `value` at `path` against `schema`, appending failures to `errs`.
pub fn validate(value: &Value, schema: &Value, path: &str, errs: &mut Vec<FieldError>) {
    if value.is_null() {
        if !flag(schema, "nullable") && schema.get("type").is_some() {
            let t = schema.get("type").and_then(Value::as_str).unwrap_or("");
            invalid(
                path,
                &json!("null"),
                format!("{path} in body must be of type {t}: \"null\""),
                errs,
            );
        }
        return;
    }
    let int_or_string = flag(schema, "x-kubernetes-int-or-string");
    if int_or_string {
        if !(value.is_string() || value.is_i64() || value.is_u64()) {
            invalid(
                path,
                value,
                format!("{path} in body must be of type integer or string"),
                errs,
            );
            return;
        }
    } else if let Some(t) = schema.get("type").and_then(Value::as_str)
        && !type_ok(value, t)
    {
        let actual = type_name(value);
        invalid(
            path,
            &json!(actual),
            format!("{path} in body must be of type {t}: {actual:?}"),
            errs,
        );
        return;
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(value)
    {
        errs.push(FieldError::not_supported(path, value.clone(), allowed));
    }
    if let Some(n) = value.as_f64() {
        validate_number(value, n, schema, path, errs);
    }
    if let Some(s) = value.as_str() {
        validate_string(value, s, schema, path, errs);
    }
    if let Some(items) = value.as_array() {
        let len = items.len() as u64;
        if let Some(min) = schema.get("minItems").and_then(Value::as_u64)
            && len < min
        {
            invalid(
                path,
                &json!(len),
                format!("{path} in body should have at least {min} items"),
                errs,
            );
        }
        if let Some(max) = schema.get("maxItems").and_then(Value::as_u64)
            && len > max
        {
            errs.push(FieldError {
                field: path.to_string(),
                kind: crate::error::FieldErrorKind::TooMany,
                value: Some(json!(len)),
                detail: format!("must have at most {max} items"),
            });
        }
        if let Some(item_schema) = schema.get("items") {
            for (i, item) in items.iter().enumerate() {
                validate(item, item_schema, &format!("{path}[{i}]"), errs);
            }
        }
    }
    if let Some(map) = value.as_object() {
        validate_object(map, schema, path, errs);
    }
    validate_combinators(value, schema, path, errs);
}

fn validate_number(value: &Value, n: f64, schema: &Value, path: &str, errs: &mut Vec<FieldError>) {
    if let Some(min) = schema.get("minimum").and_then(Value::as_f64) {
        let excl = flag(schema, "exclusiveMinimum");
        if (excl && n <= min) || (!excl && n < min) {
            let op = if excl {
                "greater than"
            } else {
                "greater than or equal to"
            };
            invalid(
                path,
                value,
                format!("{path} in body should be {op} {min}"),
                errs,
            );
        }
    }
    if let Some(max) = schema.get("maximum").and_then(Value::as_f64) {
        let excl = flag(schema, "exclusiveMaximum");
        if (excl && n >= max) || (!excl && n > max) {
            let op = if excl {
                "less than"
            } else {
                "less than or equal to"
            };
            invalid(
                path,
                value,
                format!("{path} in body should be {op} {max}"),
                errs,
            );
        }
    }
    if let Some(m) = schema.get("multipleOf").and_then(Value::as_f64)
        && m > 0.0
        && (n / m).fract() != 0.0
    {
        invalid(
            path,
            value,
            format!("{path} in body should be a multiple of {m}"),
            errs,
        );
    }
}

fn validate_string(value: &Value, s: &str, schema: &Value, path: &str, errs: &mut Vec<FieldError>) {
    let len = s.chars().count() as u64;
    if let Some(min) = schema.get("minLength").and_then(Value::as_u64)
        && len < min
    {
        invalid(
            path,
            value,
            format!("{path} in body should be at least {min} chars long"),
            errs,
        );
    }
    if let Some(max) = schema.get("maxLength").and_then(Value::as_u64)
        && len > max
    {
        errs.push(FieldError {
            field: path.to_string(),
            kind: crate::error::FieldErrorKind::TooLong,
            value: None,
            detail: format!("may not be more than {max} bytes"),
        });
    }
    if let Some(p) = schema.get("pattern").and_then(Value::as_str) {
        match regex::Regex::new(p) {
            Ok(re) if !re.is_match(s) => {
                invalid(
                    path,
                    value,
                    format!("{path} in body should match '{p}'"),
                    errs,
                );
            }
            Ok(_) => {}
            Err(e) => invalid(
                path,
                value,
                format!("schema pattern {p:?} is not a supported regular expression: {e}"),
                errs,
            ),
        }
    }
}

fn validate_object(
    map: &Map<String, Value>,
    schema: &Value,
    path: &str,
    errs: &mut Vec<FieldError>,
) {
    if let Some(req) = schema.get("required").and_then(Value::as_array) {
        for r in req.iter().filter_map(Value::as_str) {
            if !map.contains_key(r) {
                errs.push(FieldError::required(join(path, r), ""));
            }
        }
    }
    let props = schema.get("properties").and_then(Value::as_object);
    let addl = schema.get("additionalProperties").filter(|a| a.is_object());
    for (k, v) in map {
        let child = join(path, k);
        match (props.and_then(|p| p.get(k)), addl) {
            (Some(s), _) | (None, Some(s)) => validate(v, s, &child, errs),
            _ => {}
        }
    }
    let n = map.len() as u64;
    if let Some(min) = schema.get("minProperties").and_then(Value::as_u64)
        && n < min
    {
        invalid(
            path,
            &json!(n),
            format!("{path} in body should have at least {min} properties"),
            errs,
        );
    }
    if let Some(max) = schema.get("maxProperties").and_then(Value::as_u64)
        && n > max
    {
        invalid(
            path,
            &json!(n),
            format!("{path} in body should have at most {max} properties"),
            errs,
        );
    }
}

fn passes(value: &Value, schema: &Value, path: &str) -> bool {
    let mut e = Vec::new();
    validate(value, schema, path, &mut e);
    e.is_empty()
}

fn validate_combinators(value: &Value, schema: &Value, path: &str, errs: &mut Vec<FieldError>) {
    if let Some(all) = schema.get("allOf").and_then(Value::as_array) {
        for s in all {
            validate(value, s, path, errs);
        }
    }
    if let Some(any) = schema.get("anyOf").and_then(Value::as_array)
        && !any.iter().any(|s| passes(value, s, path))
    {
        invalid(
            path,
            value,
            format!("{path} in body must validate at least one schema (anyOf)"),
            errs,
        );
    }
    if let Some(one) = schema.get("oneOf").and_then(Value::as_array) {
        let n = one.iter().filter(|s| passes(value, s, path)).count();
        if n != 1 {
            invalid(
                path,
                value,
                format!("{path} in body must validate one and only one schema (oneOf)"),
                errs,
            );
        }
    }
    if let Some(not) = schema.get("not")
        && passes(value, not, path)
    {
        invalid(
            path,
            value,
            format!("{path} in body must not validate the schema (not)"),
            errs,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "required": ["size"],
                    "properties": {
                        "size": {"type": "integer", "minimum": 1, "maximum": 10},
                        "mode": {"type": "string", "enum": ["a", "b"], "default": "a"},
                        "name": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 5},
                        "tags": {"type": "object", "additionalProperties": {"type": "string"}},
                        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                        "list": {"type": "array", "items": {"type": "object", "properties": {"x": {"type": "integer"}}}},
                        "opt": {"type": "string", "nullable": true}
                    }
                },
                "status": {"type": "object", "properties": {"ok": {"type": "boolean"}}}
            }
        })
    }

    #[test]
    fn prunes_defaults_and_validates() {
        let mut obj = json!({
            "apiVersion": "x/v1", "kind": "X", "metadata": {"name": "a", "bogus": 1},
            "spec": {"size": 3, "extra": true, "tags": {"k": "v"}, "free": {"any": {"thing": 1}},
                     "list": [{"x": 1, "y": 2}], "opt": null, "name": null},
            "top": 1
        });
        let out = process(&mut obj, &schema());
        assert!(out.errors.is_empty(), "{:?}", out.errors);
        let mut unknown = out.unknown.clone();
        unknown.sort();
        assert_eq!(
            unknown,
            vec!["metadata.bogus", "spec.extra", "spec.list[0].y", "top"]
        );
        assert_eq!(obj["spec"]["mode"], "a");
        assert_eq!(obj["spec"]["free"]["any"]["thing"], 1);
        assert!(obj["spec"].get("opt").is_some());
        assert!(obj["spec"].get("name").is_none());
    }

    #[test]
    fn reports_errors_with_paths() {
        let mut obj =
            json!({"spec": {"size": "x", "mode": "c", "name": "ABCDEFG", "tags": {"k": 1}}});
        let out = process(&mut obj, &schema());
        let fields: Vec<&str> = out.errors.iter().map(|e| e.field.as_str()).collect();
        assert!(fields.contains(&"spec.size"));
        assert!(fields.contains(&"spec.mode"));
        assert!(fields.contains(&"spec.name"));
        assert!(fields.contains(&"spec.tags.k"));
        let mut obj = json!({"spec": {"size": 11}});
        let out = process(&mut obj, &schema());
        assert_eq!(out.errors.len(), 1);
        assert!(
            out.errors[0]
                .to_string()
                .contains("less than or equal to 10")
        );
        let mut obj = json!({"spec": {}});
        let out = process(&mut obj, &schema());
        assert_eq!(out.errors[0].to_string(), "spec.size: Required value");
    }
}
