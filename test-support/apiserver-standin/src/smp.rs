//! Strategic merge patch for built-in kinds, driven by a table of the list merge
//! keys Kubernetes declares (`patchMergeKey`) for the fields steward touches.
//! Lists not in the table are replaced, as Kubernetes does for lists without a
//! patch strategy.

use serde_json::{Map, Value};

use crate::error::ApiError;

/// List fields merged by key (`patchStrategy: merge`, `patchMergeKey`).
fn merge_key(field: &str) -> Option<&'static str> {
    Some(match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets"
        | "resourceClaims"
        | "schedulingGates" => "name",
        "volumeMounts" => "mountPath",
        "volumeDevices" => "devicePath",
        "ports" => "containerPort",
        "conditions" | "addresses" => "type",
        "ownerReferences" => "uid",
        "hostAliases" | "podIPs" | "hostIPs" => "ip",
        "topologySpreadConstraints" => "topologyKey",
        _ => return None,
    })
}

/// Primitive lists merged as sets.
fn primitive_merge(field: &str) -> bool {
    matches!(field, "finalizers")
}

/// Applies a strategic merge patch `patch` onto `target`.
pub fn apply(target: &mut Value, patch: &Value, field: &str) -> Result<(), ApiError> {
    let Some(pm) = patch.as_object() else {
        *target = patch.clone();
        return Ok(());
    };
    match pm.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            let mut m = pm.clone();
            m.remove("$patch");
            *target = Value::Object(m);
            return Ok(());
        }
        Some("delete") => {
            *target = Value::Object(Map::new());
            return Ok(());
        }
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "unknown patch type: {other:?} in map at {field:?}"
            )));
        }
        None => {}
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(tm) = target else {
        return Ok(());
    };
    for (k, v) in pm {
        if let Some(list_field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(list)), Some(del)) = (tm.get_mut(list_field), v.as_array()) {
                list.retain(|x| !del.contains(x));
            }
            continue;
        }
        if k == "$retainKeys" {
            if let Some(keep) = v.as_array() {
                let keep: Vec<&str> = keep.iter().filter_map(Value::as_str).collect();
                tm.retain(|key, _| keep.contains(&key.as_str()) || pm.contains_key(key));
            }
            continue;
        }
        if k.starts_with("$setElementOrder/") {
            continue;
        }
        if k.starts_with('$') {
            return Err(ApiError::not_implemented(&format!(
                "strategic merge patch directive {k:?}"
            )));
        }
        match v {
            Value::Null => {
                tm.remove(k);
            }
            Value::Object(_) => {
                let entry = tm.entry(k.clone()).or_insert(Value::Null);
                apply(entry, v, k)?;
            }
            Value::Array(items) => {
                if let Some(key) = merge_key(k) {
                    let entry = tm.entry(k.clone()).or_insert_with(|| Value::Array(vec![]));
                    merge_list(entry, items, key, k)?;
                } else if primitive_merge(k) {
                    let entry = tm.entry(k.clone()).or_insert_with(|| Value::Array(vec![]));
                    if let Value::Array(list) = entry {
                        for i in items {
                            if !list.contains(i) {
                                list.push(i.clone());
                            }
                        }
                    } else {
                        *entry = v.clone();
                    }
                } else {
                    tm.insert(k.clone(), v.clone());
                }
            }
            _ => {
                tm.insert(k.clone(), v.clone());
            }
        }
    }
    Ok(())
}

fn merge_list(target: &mut Value, items: &[Value], key: &str, field: &str) -> Result<(), ApiError> {
    if !target.is_array() {
        *target = Value::Array(vec![]);
    }
    let Value::Array(list) = target else {
        return Ok(());
    };
    for item in items {
        let Some(im) = item.as_object() else {
            return Err(ApiError::bad_request(format!(
                "strategic merge patch: list {field:?} must contain objects"
            )));
        };
        if im.get("$patch").and_then(Value::as_str) == Some("replace") {
            let mut m = im.clone();
            m.remove("$patch");
            *list = vec![Value::Object(m)];
            continue;
        }
        let Some(kv) = im.get(key) else {
            return Err(ApiError::bad_request(format!(
                "map: {item} does not contain declared merge key: {key}"
            )));
        };
        let pos = list.iter().position(|t| t.get(key) == Some(kv));
        if im.get("$patch").and_then(Value::as_str) == Some("delete") {
            if let Some(p) = pos {
                list.remove(p);
            }
            continue;
        }
        match pos {
            Some(p) => apply(&mut list[p], item, field)?,
            None => {
                let mut fresh = Value::Object(Map::new());
                apply(&mut fresh, item, field)?;
                list.push(fresh);
            }
        }
    }
    Ok(())
}

/// Standard base64 with padding.
pub fn base64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        out.push(char::from(T[(n >> 18) as usize & 63]));
        out.push(char::from(T[(n >> 12) as usize & 63]));
        out.push(if chunk.len() > 1 {
            char::from(T[(n >> 6) as usize & 63])
        } else {
            '='
        });
        out.push(if chunk.len() > 2 {
            char::from(T[n as usize & 63])
        } else {
            '='
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merges_lists_by_key() {
        let mut pod = json!({"metadata": {"finalizers": ["a"]}, "status": {"conditions": [
            {"type": "Ready", "status": "False"}, {"type": "Initialized", "status": "True"}]}});
        apply(
            &mut pod,
            &json!({"metadata": {"finalizers": ["b"]}, "status": {"conditions": [
            {"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}]}}),
            "",
        )
        .unwrap();
        assert_eq!(pod["metadata"]["finalizers"], json!(["a", "b"]));
        let c = pod["status"]["conditions"].as_array().unwrap();
        assert_eq!(c.len(), 3);
        assert_eq!(c[0], json!({"type": "Ready", "status": "True"}));
        apply(
            &mut pod,
            &json!({"status": {"conditions": [{"type": "Ready", "$patch": "delete"}]}}),
            "",
        )
        .unwrap();
        assert_eq!(pod["status"]["conditions"].as_array().unwrap().len(), 2);
        assert!(
            apply(
                &mut pod,
                &json!({"status": {"conditions": [{"status": "x"}]}}),
                ""
            )
            .is_err()
        );
    }

    #[test]
    fn base64_known_vectors() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    }
}
