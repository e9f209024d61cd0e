//! Response negotiation (`Accept`) and server-side printing: the `meta.k8s.io/v1`
//! `Table` kube-apiserver answers `kubectl get` with.
//!
//! Columns: a CRD version's `additionalPrinterColumns` after NAME (defaulted to an `Age`
//! column, as kube-apiserver defaults CRDs); for the built-in kinds a port of the
//! kube-apiserver printers (`pkg/printers/internalversion`) for pods, nodes, namespaces,
//! configmaps, secrets, events and leases; anything else gets kube-apiserver's default
//! table (NAME, CREATED AT). The server always generates the `-o wide` columns
//! (priority 1); kubectl hides them unless asked.

use std::collections::{BTreeSet, HashMap};

use http::{HeaderMap, header};
use jiff::Timestamp;
use serde_json::{Map, Value, json};

use crate::error::ApiError;
use crate::types::{PrinterColumn, ResourceType};

/// What the client accepts back for get / list / watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// The objects themselves (JSON).
    Full,
    /// `PartialObjectMetadata` (`as=PartialObjectMetadata[List]`).
    Metadata,
    /// A `Table` (`as=Table;g=meta.k8s.io;v=v1|v1beta1`).
    Table(TableOpts),
}

/// Table flavour requested.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableOpts {
    /// `v1` or `v1beta1` (`meta.k8s.io`).
    pub version: &'static str,
    /// What each row's `object` carries (`includeObject`).
    pub include: IncludeObject,
}

/// `includeObject` of a Table request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IncludeObject {
    /// `object` is null.
    None,
    /// `object` is a `PartialObjectMetadata` (the default).
    Metadata,
    /// `object` is the full object.
    Object,
}

fn not_acceptable(accept: &str) -> ApiError {
    ApiError {
        code: 406,
        reason: "NotAcceptable".into(),
        message: format!(
            "only the following media types are accepted: application/json, application/json;as=Table;v=v1;g=meta.k8s.io, application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io (Accept: {accept})"
        ),
        details: None,
    }
}

/// Picks the response form from `Accept` (first acceptable clause wins, as in
/// kube-apiserver) and the `includeObject` query parameter.
pub fn negotiate(headers: &HeaderMap, q: &HashMap<String, String>) -> Result<Output, ApiError> {
    let accept: Vec<&str> = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    let accept = accept.join(",");
    let include = match q.get("includeObject").map(String::as_str) {
        None | Some("") | Some("Metadata") => IncludeObject::Metadata,
        Some("None") => IncludeObject::None,
        Some("Object") => IncludeObject::Object,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "includeObject: Unsupported value: {other:?}: supported values: \"Metadata\", \"None\", \"Object\""
            )));
        }
    };
    // clauses the stand-in knows it cannot serve (protobuf, CBOR, other `as=` targets)
    let mut refused = 0usize;
    let mut clauses = 0usize;
    for clause in accept.split(',').map(str::trim).filter(|c| !c.is_empty()) {
        clauses += 1;
        let mut parts = clause.split(';').map(str::trim);
        let media = parts.next().unwrap_or_default().to_ascii_lowercase();
        let params: HashMap<String, &str> = parts
            .filter_map(|p| p.split_once('='))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().trim_matches('"')))
            .collect();
        match media.as_str() {
            "application/json" | "*/*" | "application/*" => {}
            "application/vnd.kubernetes.protobuf" | "application/cbor" => {
                refused += 1;
                continue;
            }
            _ => continue,
        }
        let meta_gv = |versions: &[&'static str]| -> Option<&'static str> {
            let g = params.get("g").copied().unwrap_or("meta.k8s.io");
            let v = params.get("v").copied().unwrap_or("v1");
            if g != "meta.k8s.io" {
                return None;
            }
            versions.iter().copied().find(|x| *x == v)
        };
        match params.get("as").copied() {
            None => return Ok(Output::Full),
            Some("Table") => match meta_gv(&["v1", "v1beta1"]) {
                Some(version) => return Ok(Output::Table(TableOpts { version, include })),
                None => refused += 1,
            },
            Some("PartialObjectMetadata" | "PartialObjectMetadataList") => {
                if meta_gv(&["v1", "v1beta1"]).is_some() {
                    return Ok(Output::Metadata);
                }
                refused += 1;
            }
            Some(_) => refused += 1,
        }
    }
    if clauses > 0 && refused == clauses {
        return Err(not_acceptable(&accept));
    }
    Ok(Output::Full)
}

/// One column definition (`TableColumnDefinition`).
#[derive(Debug, Clone)]
struct ColDef {
    name: &'static str,
    ty: &'static str,
    format: &'static str,
    description: &'static str,
    priority: i64,
}

const fn col(name: &'static str, ty: &'static str, description: &'static str) -> ColDef {
    ColDef {
        name,
        ty,
        format: "",
        description,
        priority: 0,
    }
}

const fn wide(name: &'static str, description: &'static str) -> ColDef {
    ColDef {
        name,
        ty: "string",
        format: "",
        description,
        priority: 1,
    }
}

const NAME_DESC: &str = "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names";
const CREATED_DESC: &str = "CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null for lists. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata";

const NAME: ColDef = ColDef {
    name: "Name",
    ty: "string",
    format: "name",
    description: NAME_DESC,
    priority: 0,
};
const AGE: ColDef = col("Age", "string", CREATED_DESC);

type RowFn = fn(&Value, Timestamp) -> Vec<Value>;

/// How a kind is printed.
enum Printer {
    /// Built-in kind: fixed columns, cells computed from the object.
    Builtin(Vec<ColDef>, RowFn),
    /// CRD kind: NAME + `additionalPrinterColumns`.
    Custom(Vec<PrinterColumn>),
    /// kube-apiserver's default table: NAME, CREATED AT.
    Default,
}

fn printer(rt: &ResourceType) -> Printer {
    if !rt.printer_columns.is_empty() {
        return Printer::Custom(rt.printer_columns.clone());
    }
    match (rt.group.as_str(), rt.plural.as_str()) {
        ("", "pods") => Printer::Builtin(
            vec![
                NAME,
                col(
                    "Ready",
                    "string",
                    "The aggregate readiness state of this pod for accepting traffic.",
                ),
                col(
                    "Status",
                    "string",
                    "The aggregate status of the containers in this pod.",
                ),
                col(
                    "Restarts",
                    "string",
                    "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted.",
                ),
                AGE,
                wide("IP", "podIP address allocated to the pod."),
                wide(
                    "Node",
                    "NodeName indicates in which node this pod is scheduled.",
                ),
                wide(
                    "Nominated Node",
                    "nominatedNodeName is set only when this pod preempts other pods on the node.",
                ),
                wide(
                    "Readiness Gates",
                    "If specified, all readiness gates will be evaluated for pod readiness.",
                ),
            ],
            pod_row,
        ),
        ("", "nodes") => Printer::Builtin(
            vec![
                NAME,
                col("Status", "string", "The status of the node"),
                col("Roles", "string", "The roles of the node"),
                AGE,
                col("Version", "string", "Kubelet Version reported by the node."),
                wide("Internal-IP", "List of addresses reachable to the node."),
                wide("External-IP", "List of addresses reachable to the node."),
                wide("OS-Image", "OS Image reported by the node."),
                wide("Kernel-Version", "Kernel Version reported by the node."),
                wide(
                    "Container-Runtime",
                    "ContainerRuntime Version reported by the node.",
                ),
            ],
            node_row,
        ),
        ("", "namespaces") => Printer::Builtin(
            vec![
                NAME,
                col(
                    "Status",
                    "string",
                    "The status of the namespace (Active or Terminating).",
                ),
                AGE,
            ],
            namespace_row,
        ),
        ("", "configmaps") => Printer::Builtin(
            vec![
                NAME,
                col(
                    "Data",
                    "string",
                    "Data contains the configuration data (number of entries).",
                ),
                AGE,
            ],
            configmap_row,
        ),
        ("", "secrets") => Printer::Builtin(
            vec![
                NAME,
                col(
                    "Type",
                    "string",
                    "Used to facilitate programmatic handling of secret data.",
                ),
                col(
                    "Data",
                    "string",
                    "Data contains the secret data (number of entries).",
                ),
                AGE,
            ],
            secret_row,
        ),
        ("" | "events.k8s.io", "events") => Printer::Builtin(
            vec![
                col(
                    "Last Seen",
                    "string",
                    "The time at which the most recent occurrence of this event was recorded.",
                ),
                col("Type", "string", "Type of this event (Normal, Warning)."),
                col(
                    "Reason",
                    "string",
                    "This should be a short, machine understandable string that gives the reason for the transition into the object's current status.",
                ),
                col("Object", "string", "The object that this event is about."),
                wide(
                    "Subobject",
                    "If referring to a piece of an object instead of an entire object, this string should contain a valid JSON/Go field access statement.",
                ),
                wide("Source", "The component reporting this event."),
                col(
                    "Message",
                    "string",
                    "A human-readable description of the status of this operation.",
                ),
                wide(
                    "First Seen",
                    "The time at which the event was first recorded.",
                ),
                wide("Count", "The number of times this event has occurred."),
                ColDef {
                    priority: 1,
                    ..NAME
                },
            ],
            event_row,
        ),
        ("coordination.k8s.io", "leases") => Printer::Builtin(
            vec![
                NAME,
                col("Holder", "string", "The holder of the lease."),
                AGE,
            ],
            lease_row,
        ),
        _ => Printer::Default,
    }
}

fn defs(p: &Printer) -> Vec<Value> {
    let def = |c: &ColDef| {
        json!({"name": c.name, "type": c.ty, "format": c.format,
               "description": c.description, "priority": c.priority})
    };
    match p {
        Printer::Builtin(cols, _) => cols.iter().map(def).collect(),
        Printer::Custom(cols) => std::iter::once(def(&NAME))
            .chain(cols.iter().map(|c| {
                json!({"name": c.name, "type": c.column_type, "format": c.format,
                       "description": c.description, "priority": c.priority})
            }))
            .collect(),
        Printer::Default => vec![
            def(&NAME),
            def(&ColDef {
                name: "Created At",
                ty: "date",
                format: "",
                description: CREATED_DESC,
                priority: 0,
            }),
        ],
    }
}

fn cells(p: &Printer, obj: &Value, now: Timestamp) -> Vec<Value> {
    let name = json!(str_at(obj, &["metadata", "name"]));
    match p {
        Printer::Builtin(_, row) => row(obj, now),
        Printer::Custom(cols) => std::iter::once(name)
            .chain(cols.iter().map(|c| match eval_path(obj, &c.json_path) {
                Some(v) => typed_cell(&c.column_type, v, now),
                None => Value::Null,
            }))
            .collect(),
        Printer::Default => {
            let created = str_at(obj, &["metadata", "creationTimestamp"])
                .parse::<Timestamp>()
                .ok()
                .and_then(|t| Timestamp::from_second(t.as_second()).ok())
                .map(|t| t.to_string())
                .unwrap_or_else(|| "0001-01-01T00:00:00Z".to_string());
            vec![name, json!(created)]
        }
    }
}

/// A `Table` of `objects` (already presented in the requested version). Without
/// `headers` the column definitions are null: kube-apiserver sends them with the first
/// event of a watch only.
pub fn table(
    rt: &ResourceType,
    objects: &[Value],
    opts: TableOpts,
    headers: bool,
    resource_version: Option<String>,
) -> Value {
    let p = printer(rt);
    let now = Timestamp::now();
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            let object = match opts.include {
                IncludeObject::None => Value::Null,
                IncludeObject::Metadata => render(o, true),
                IncludeObject::Object => o.clone(),
            };
            json!({"cells": cells(&p, o, now), "object": object})
        })
        .collect();
    let mut meta = Map::new();
    if let Some(rv) = resource_version {
        meta.insert("resourceVersion".into(), json!(rv));
    }
    json!({
        "kind": "Table",
        "apiVersion": format!("meta.k8s.io/{}", opts.version),
        "metadata": meta,
        "columnDefinitions": if headers { Value::Array(defs(&p)) } else { Value::Null },
        "rows": rows,
    })
}

/// Renders an object for the response (full, or `PartialObjectMetadata`).
pub fn render(obj: &Value, metadata_only: bool) -> Value {
    if metadata_only {
        json!({
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({})),
        })
    } else {
        obj.clone()
    }
}

/// Renders a get / list / watch object in the negotiated form (tables are built by
/// [`table`]; here a Table output renders the object alone as a one-row table).
pub fn render_one(rt: &ResourceType, obj: &Value, output: Output, headers: bool) -> Value {
    match output {
        Output::Full => obj.clone(),
        Output::Metadata => render(obj, true),
        Output::Table(opts) => table(
            rt,
            std::slice::from_ref(obj),
            opts,
            headers,
            obj.get("metadata")
                .and_then(|m| m.get("resourceVersion"))
                .and_then(Value::as_str)
                .map(String::from),
        ),
    }
}

// ---------------------------------------------------------------------------------
// value helpers

fn at<'a>(obj: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(obj, |v, k| v.get(*k))
}

fn str_at<'a>(obj: &'a Value, path: &[&str]) -> &'a str {
    at(obj, path).and_then(Value::as_str).unwrap_or_default()
}

fn arr_at<'a>(obj: &'a Value, path: &[&str]) -> &'a [Value] {
    at(obj, path)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

fn int_at(obj: &Value, path: &[&str]) -> i64 {
    at(obj, path).and_then(Value::as_i64).unwrap_or(0)
}

fn or_none(s: &str) -> String {
    if s.is_empty() {
        "<none>".into()
    } else {
        s.into()
    }
}

/// kube's `duration.HumanDuration`.
pub fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".into();
    }
    if seconds < 0 {
        return "0s".into();
    }
    if seconds < 60 * 2 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = seconds / 3600;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let dy = (hours / 24) % 365;
        return if dy == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{dy}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

/// kube's `translateTimestampSince`: the age of an RFC 3339 timestamp, `<unknown>`
/// when unset.
fn age(ts: &str, now: Timestamp) -> String {
    if ts.is_empty() {
        return "<unknown>".into();
    }
    match ts.parse::<Timestamp>() {
        Ok(t) => human_duration(now.duration_since(t).as_secs()),
        Err(_) => "<invalid>".into(),
    }
}

fn created_age(obj: &Value, now: Timestamp) -> Value {
    json!(age(str_at(obj, &["metadata", "creationTimestamp"]), now))
}

// ---------------------------------------------------------------------------------
// CRD columns: simple JSONPath and typed cells

enum Seg {
    Key(String),
    Index(i64),
    /// `[?(@.key=="value")]`: the first element of a list whose string field
    /// `key` is `value` (the table convertor prints a path's first result).
    Filter(String, String),
}

/// `?(@.key=="value")` or `?(@.key=='value')`.
fn parse_filter(inner: &str) -> Option<Seg> {
    let body = inner.strip_prefix("?(")?.strip_suffix(')')?.trim();
    let (lhs, rhs) = body.split_once("==")?;
    let key = lhs.trim().strip_prefix("@.")?;
    let rhs = rhs.trim();
    let value = rhs
        .strip_prefix('"')
        .and_then(|r| r.strip_suffix('"'))
        .or_else(|| rhs.strip_prefix('\'').and_then(|r| r.strip_suffix('\'')))?;
    if key.is_empty() || key.contains(['.', '[']) {
        return None;
    }
    Some(Seg::Filter(key.to_string(), value.to_string()))
}

fn parse_path(path: &str) -> Option<Vec<Seg>> {
    let p = path.trim();
    let p = p.strip_prefix('{').unwrap_or(p);
    let p = p.strip_suffix('}').unwrap_or(p);
    let p = p.strip_prefix('$').unwrap_or(p);
    let chars: Vec<char> = p.chars().collect();
    let mut segs = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '.' => i += 1,
            '[' => {
                let end = chars[i..].iter().position(|c| *c == ']')? + i;
                let inner: String = chars[i + 1..end].iter().collect();
                let inner = inner.trim();
                if inner.starts_with('?') {
                    segs.push(parse_filter(inner)?);
                } else if let Some(q) = inner
                    .strip_prefix('\'')
                    .and_then(|s| s.strip_suffix('\''))
                    .or_else(|| inner.strip_prefix('"').and_then(|s| s.strip_suffix('"')))
                {
                    segs.push(Seg::Key(q.to_string()));
                } else {
                    segs.push(Seg::Index(inner.parse().ok()?));
                }
                i = end + 1;
            }
            _ => {
                let start = i;
                while i < chars.len() && chars[i] != '.' && chars[i] != '[' {
                    i += 1;
                }
                let key: String = chars[start..i].iter().collect();
                if key.contains(['*', '?', '@', '(']) {
                    return None;
                }
                segs.push(Seg::Key(key));
            }
        }
    }
    Some(segs)
}

/// Evaluates a simple JSONPath (`.spec.a.b`, `.status.list[0]`, `.metadata.labels['x/y']`).
/// `None`: no result (kubectl shows `<none>`), or a path the stand-in does not evaluate.
fn eval_path<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    let segs = parse_path(path)?;
    segs.iter().try_fold(obj, |v, s| match s {
        Seg::Key(k) => v.get(k.as_str()),
        Seg::Index(i) => {
            let a = v.as_array()?;
            let idx = if *i < 0 {
                a.len()
                    .checked_sub(usize::try_from(i.unsigned_abs()).ok()?)?
            } else {
                usize::try_from(*i).ok()?
            };
            a.get(idx)
        }
        Seg::Filter(k, want) => v
            .as_array()?
            .iter()
            .find(|e| e.get(k.as_str()).and_then(Value::as_str) == Some(want.as_str())),
    })
}

/// Go's `fmt.Print` of a decoded JSON value (what kube's JSONPath printer writes).
fn go_print(v: &Value) -> String {
    match v {
        Value::Null => "<nil>".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.clone(),
        Value::Array(a) => format!("[{}]", a.iter().map(go_print).collect::<Vec<_>>().join(" ")),
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let parts: Vec<String> = keys
                .iter()
                .map(|k| format!("{k}:{}", go_print(&m[k.as_str()])))
                .collect();
            format!("map[{}]", parts.join(" "))
        }
    }
}

/// The apiextensions-apiserver table convertor's `cellForJSONValue`.
fn typed_cell(ty: &str, v: &Value, now: Timestamp) -> Value {
    if v.is_null() {
        return Value::Null;
    }
    match ty {
        "integer" => v
            .as_i64()
            .or_else(|| v.as_f64().map(|f| f.trunc() as i64))
            .map_or(Value::Null, |i| json!(i)),
        "number" => v.as_f64().map_or(Value::Null, |f| json!(f)),
        "boolean" => v.as_bool().map_or(Value::Null, |b| json!(b)),
        "date" => match v.as_str() {
            Some(s) => match s.parse::<Timestamp>() {
                Ok(_) => json!(age(s, now)),
                Err(_) => json!("<invalid>"),
            },
            None => Value::Null,
        },
        // "string" and anything else: the JSONPath text
        _ => json!(go_print(v)),
    }
}

// ---------------------------------------------------------------------------------
// built-in printers

fn pod_row(p: &Value, now: Timestamp) -> Vec<Value> {
    let init_specs = arr_at(p, &["spec", "initContainers"]);
    let restartable = |name: &str| {
        init_specs.iter().any(|c| {
            c.get("name").and_then(Value::as_str) == Some(name)
                && c.get("restartPolicy").and_then(Value::as_str) == Some("Always")
        })
    };
    let mut total = arr_at(p, &["spec", "containers"]).len();
    total += init_specs
        .iter()
        .filter(|c| c.get("restartPolicy").and_then(Value::as_str) == Some("Always"))
        .count();
    let mut ready = 0usize;
    let mut restarts = 0i64;
    let mut sidecar_restarts = 0i64;
    let mut last_restart: Option<Timestamp> = None;
    let mut sidecar_last_restart: Option<Timestamp> = None;
    let finished = |c: &Value| {
        at(c, &["lastState", "terminated", "finishedAt"])
            .and_then(Value::as_str)
            .and_then(|s| s.parse::<Timestamp>().ok())
    };
    let phase = str_at(p, &["status", "phase"]);
    let mut reason = phase.to_string();
    let status_reason = str_at(p, &["status", "reason"]);
    if !status_reason.is_empty() {
        reason = status_reason.to_string();
    }
    let conditions = arr_at(p, &["status", "conditions"]);
    if conditions.iter().any(|c| {
        c.get("type").and_then(Value::as_str) == Some("PodScheduled")
            && c.get("reason").and_then(Value::as_str) == Some("SchedulingGated")
    }) {
        reason = "SchedulingGated".into();
    }
    let mut initializing = false;
    for (i, c) in arr_at(p, &["status", "initContainerStatuses"])
        .iter()
        .enumerate()
    {
        let count = int_at(c, &["restartCount"]);
        restarts += count;
        if let Some(t) = finished(c) {
            last_restart = last_restart.max(Some(t));
        }
        let name = str_at(c, &["name"]);
        if restartable(name) {
            sidecar_restarts += count;
            if let Some(t) = finished(c) {
                sidecar_last_restart = sidecar_last_restart.max(Some(t));
            }
        }
        let terminated = at(c, &["state", "terminated"]);
        let waiting_reason = str_at(c, &["state", "waiting", "reason"]);
        if terminated.is_some_and(|t| int_at(t, &["exitCode"]) == 0) {
            continue;
        }
        if restartable(name) && c.get("started").and_then(Value::as_bool) == Some(true) {
            if c.get("ready").and_then(Value::as_bool) == Some(true) {
                ready += 1;
            }
            continue;
        }
        if let Some(t) = terminated {
            let r = str_at(t, &["reason"]);
            reason = if !r.is_empty() {
                format!("Init:{r}")
            } else if int_at(t, &["signal"]) != 0 {
                format!("Init:Signal:{}", int_at(t, &["signal"]))
            } else {
                format!("Init:ExitCode:{}", int_at(t, &["exitCode"]))
            };
        } else if !waiting_reason.is_empty() && waiting_reason != "PodInitializing" {
            reason = format!("Init:{waiting_reason}");
        } else {
            reason = format!("Init:{i}/{}", init_specs.len());
        }
        initializing = true;
        break;
    }
    let initialized = conditions.iter().any(|c| {
        c.get("type").and_then(Value::as_str) == Some("Initialized")
            && c.get("status").and_then(Value::as_str) == Some("True")
    });
    if !initializing || initialized {
        restarts = sidecar_restarts;
        last_restart = sidecar_last_restart;
        let mut has_running = false;
        for c in arr_at(p, &["status", "containerStatuses"]).iter().rev() {
            restarts += int_at(c, &["restartCount"]);
            if let Some(t) = finished(c) {
                last_restart = last_restart.max(Some(t));
            }
            let waiting = str_at(c, &["state", "waiting", "reason"]);
            let terminated = at(c, &["state", "terminated"]);
            if !waiting.is_empty() {
                reason = waiting.to_string();
            } else if let Some(t) = terminated {
                let r = str_at(t, &["reason"]);
                reason = if !r.is_empty() {
                    r.to_string()
                } else if int_at(t, &["signal"]) != 0 {
                    format!("Signal:{}", int_at(t, &["signal"]))
                } else {
                    format!("ExitCode:{}", int_at(t, &["exitCode"]))
                };
            } else if c.get("ready").and_then(Value::as_bool) == Some(true)
                && at(c, &["state", "running"]).is_some()
            {
                has_running = true;
                ready += 1;
            }
        }
        if reason == "Completed" && has_running {
            let pod_ready = conditions.iter().any(|c| {
                c.get("type").and_then(Value::as_str) == Some("Ready")
                    && c.get("status").and_then(Value::as_str) == Some("True")
            });
            reason = if pod_ready { "Running" } else { "NotReady" }.into();
        }
    }
    let deleting = at(p, &["metadata", "deletionTimestamp"]).is_some_and(|d| !d.is_null());
    if deleting && status_reason == "NodeLost" {
        reason = "Unknown".into();
    } else if deleting && phase != "Succeeded" && phase != "Failed" {
        reason = "Terminating".into();
    }
    let restarts = match last_restart {
        Some(t) => format!(
            "{restarts} ({} ago)",
            human_duration(now.duration_since(t).as_secs())
        ),
        None => restarts.to_string(),
    };
    let ip = arr_at(p, &["status", "podIPs"])
        .first()
        .and_then(|i| i.get("ip"))
        .and_then(Value::as_str)
        .unwrap_or_else(|| str_at(p, &["status", "podIP"]));
    let gates = arr_at(p, &["spec", "readinessGates"]);
    let gates = if gates.is_empty() {
        "<none>".to_string()
    } else {
        let ok = gates
            .iter()
            .filter(|g| {
                let t = str_at(g, &["conditionType"]);
                conditions.iter().any(|c| {
                    c.get("type").and_then(Value::as_str) == Some(t)
                        && c.get("status").and_then(Value::as_str) == Some("True")
                })
            })
            .count();
        format!("{ok}/{}", gates.len())
    };
    vec![
        json!(str_at(p, &["metadata", "name"])),
        json!(format!("{ready}/{total}")),
        json!(reason),
        json!(restarts),
        created_age(p, now),
        json!(or_none(ip)),
        json!(or_none(str_at(p, &["spec", "nodeName"]))),
        json!(or_none(str_at(p, &["status", "nominatedNodeName"]))),
        json!(gates),
    ]
}

fn node_row(n: &Value, now: Timestamp) -> Vec<Value> {
    let mut status: Vec<String> = Vec::new();
    if let Some(c) = arr_at(n, &["status", "conditions"])
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some("Ready"))
    {
        status.push(if c.get("status").and_then(Value::as_str) == Some("True") {
            "Ready".into()
        } else {
            "NotReady".into()
        });
    }
    if status.is_empty() {
        status.push("Unknown".into());
    }
    if at(n, &["spec", "unschedulable"]).and_then(Value::as_bool) == Some(true) {
        status.push("SchedulingDisabled".into());
    }
    let mut roles = BTreeSet::new();
    if let Some(labels) = at(n, &["metadata", "labels"]).and_then(Value::as_object) {
        for (k, v) in labels {
            if let Some(role) = k.strip_prefix("node-role.kubernetes.io/") {
                if !role.is_empty() {
                    roles.insert(role.to_string());
                }
            } else if k == "kubernetes.io/role"
                && let Some(v) = v.as_str()
                && !v.is_empty()
            {
                roles.insert(v.to_string());
            }
        }
    }
    let roles = roles.into_iter().collect::<Vec<_>>().join(",");
    let addr = |ty: &str| {
        arr_at(n, &["status", "addresses"])
            .iter()
            .find(|a| a.get("type").and_then(Value::as_str) == Some(ty))
            .and_then(|a| a.get("address"))
            .and_then(Value::as_str)
            .unwrap_or("<none>")
            .to_string()
    };
    let info = |k: &str| {
        let v = str_at(n, &["status", "nodeInfo", k]);
        if v.is_empty() {
            "<unknown>".to_string()
        } else {
            v.to_string()
        }
    };
    vec![
        json!(str_at(n, &["metadata", "name"])),
        json!(status.join(",")),
        json!(or_none(&roles)),
        created_age(n, now),
        json!(str_at(n, &["status", "nodeInfo", "kubeletVersion"])),
        json!(addr("InternalIP")),
        json!(addr("ExternalIP")),
        json!(info("osImage")),
        json!(info("kernelVersion")),
        json!(info("containerRuntimeVersion")),
    ]
}

fn namespace_row(n: &Value, now: Timestamp) -> Vec<Value> {
    vec![
        json!(str_at(n, &["metadata", "name"])),
        json!(str_at(n, &["status", "phase"])),
        created_age(n, now),
    ]
}

fn entries(v: &Value, path: &[&str]) -> usize {
    at(v, path).and_then(Value::as_object).map_or(0, Map::len)
}

fn configmap_row(c: &Value, now: Timestamp) -> Vec<Value> {
    let n = entries(c, &["data"]) + entries(c, &["binaryData"]);
    vec![
        json!(str_at(c, &["metadata", "name"])),
        json!(n),
        created_age(c, now),
    ]
}

fn secret_row(s: &Value, now: Timestamp) -> Vec<Value> {
    vec![
        json!(str_at(s, &["metadata", "name"])),
        json!(str_at(s, &["type"])),
        json!(entries(s, &["data"])),
        created_age(s, now),
    ]
}

fn lease_row(l: &Value, now: Timestamp) -> Vec<Value> {
    vec![
        json!(str_at(l, &["metadata", "name"])),
        json!(str_at(l, &["spec", "holderIdentity"])),
        created_age(l, now),
    ]
}

/// core/v1 and events.k8s.io/v1 Events (the latter's fields mapped to the former's,
/// as kube-apiserver prints both through the internal type).
fn event_row(e: &Value, now: Timestamp) -> Vec<Value> {
    let new_api = str_at(e, &["apiVersion"]).starts_with("events.k8s.io/");
    let (regarding, note, first, last, count, source) = if new_api {
        (
            "regarding",
            "note",
            "deprecatedFirstTimestamp",
            "deprecatedLastTimestamp",
            "deprecatedCount",
            "deprecatedSource",
        )
    } else {
        (
            "involvedObject",
            "message",
            "firstTimestamp",
            "lastTimestamp",
            "count",
            "source",
        )
    };
    let event_time = str_at(e, &["eventTime"]);
    let first_seen = match str_at(e, &[first]) {
        "" if !event_time.is_empty() => age(event_time, now),
        s => age(s, now),
    };
    let mut last_seen = match str_at(e, &[last]) {
        "" => first_seen.clone(),
        s => age(s, now),
    };
    let mut n = int_at(e, &[count]);
    if let Some(series) = e.get("series").filter(|s| s.is_object()) {
        last_seen = age(str_at(series, &["lastObservedTime"]), now);
        n = int_at(series, &["count"]);
    } else if n == 0 {
        n = 1;
    }
    let kind = str_at(e, &[regarding, "kind"]).to_lowercase();
    let name = str_at(e, &[regarding, "name"]);
    let target = if name.is_empty() {
        kind
    } else {
        format!("{kind}/{name}")
    };
    let component = str_at(e, &[source, "component"]);
    let host = str_at(e, &[source, "host"]);
    let source = match (component, host) {
        ("", _) => {
            let rc = str_at(e, &["reportingController"]);
            let ri = str_at(e, &["reportingInstance"]);
            match (rc, ri) {
                ("", _) => "<none>".to_string(),
                (rc, "") => rc.to_string(),
                (rc, ri) => format!("{rc}, {ri}"),
            }
        }
        (c, "") => c.to_string(),
        (c, h) => format!("{c}, {h}"),
    };
    vec![
        json!(last_seen),
        json!(str_at(e, &["type"])),
        json!(str_at(e, &["reason"])),
        json!(target),
        json!(str_at(e, &[regarding, "fieldPath"])),
        json!(source),
        json!(str_at(e, &[note]).trim()),
        json!(first_seen),
        json!(n),
        json!(str_at(e, &["metadata", "name"])),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_durations_match_kube() {
        let cases = [
            (-5, "<invalid>"),
            (-1, "0s"),
            (0, "0s"),
            (119, "119s"),
            (120, "2m"),
            (150, "2m30s"),
            (600, "10m"),
            (3 * 3600, "3h"),
            (3 * 3600 + 60, "3h1m"),
            (10 * 3600, "10h"),
            (3 * 86400, "3d"),
            (3 * 86400 + 3600, "3d1h"),
            (30 * 86400, "30d"),
            (3 * 365 * 86400, "3y"),
            (3 * 365 * 86400 + 86400, "3y1d"),
            (10 * 365 * 86400, "10y"),
        ];
        for (secs, want) in cases {
            assert_eq!(human_duration(secs), want, "{secs}s");
        }
    }

    #[test]
    fn simple_jsonpaths() {
        let o = json!({"spec": {"a": {"b": 3}, "l": ["x", "y"], "m": {"k/x": "v"}}});
        assert_eq!(eval_path(&o, ".spec.a.b"), Some(&json!(3)));
        assert_eq!(eval_path(&o, "spec.a.b"), Some(&json!(3)));
        assert_eq!(eval_path(&o, "{.spec.l[1]}"), Some(&json!("y")));
        assert_eq!(eval_path(&o, ".spec.l[-1]"), Some(&json!("y")));
        assert_eq!(eval_path(&o, ".spec.m['k/x']"), Some(&json!("v")));
        assert_eq!(eval_path(&o, ".spec.missing"), None);
        let c = json!({"status": {"conditions": [
            {"type": "Other", "status": "False"},
            {"type": "Ready", "status": "True"}
        ]}});
        let ready = ".status.conditions[?(@.type==\"Ready\")].status";
        assert_eq!(eval_path(&c, ready), Some(&json!("True")));
        assert_eq!(
            eval_path(&c, ".status.conditions[?(@.type=='Other')].status"),
            Some(&json!("False"))
        );
        assert_eq!(
            eval_path(&c, ".status.conditions[?(@.type==\"Gone\")].status"),
            None
        );
        assert_eq!(eval_path(&c, ".status.conditions[?(@.type>1)]"), None);
        assert_eq!(eval_path(&o, ".spec.l[*]"), None);
        let now = Timestamp::now();
        assert_eq!(
            typed_cell("string", &json!(["a", "b"]), now),
            json!("[a b]")
        );
        assert_eq!(typed_cell("integer", &json!(2.0), now), json!(2));
        assert_eq!(typed_cell("boolean", &json!("x"), now), Value::Null);
        assert_eq!(typed_cell("date", &json!("nope"), now), json!("<invalid>"));
    }

    #[test]
    fn accept_negotiation() -> Result<(), ApiError> {
        let q = HashMap::new();
        let with = |a: &str| {
            let mut h = HeaderMap::new();
            if let Ok(v) = a.parse() {
                h.insert(header::ACCEPT, v);
            }
            h
        };
        let kubectl = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
        assert_eq!(
            negotiate(&with(kubectl), &q)?,
            Output::Table(TableOpts {
                version: "v1",
                include: IncludeObject::Metadata
            })
        );
        assert_eq!(negotiate(&with(""), &q)?, Output::Full);
        assert_eq!(
            negotiate(
                &with("application/vnd.kubernetes.protobuf,application/json"),
                &q
            )?,
            Output::Full
        );
        assert_eq!(
            negotiate(
                &with("application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"),
                &q
            )?,
            Output::Metadata
        );
        let e = negotiate(&with("application/vnd.kubernetes.protobuf"), &q).err();
        assert_eq!(e.map(|e| e.code), Some(406));
        let e = negotiate(&with("application/json;as=Table;v=v2;g=meta.k8s.io"), &q).err();
        assert_eq!(e.map(|e| e.code), Some(406));
        let q = HashMap::from([("includeObject".to_string(), "Bogus".to_string())]);
        assert_eq!(
            negotiate(&with(kubectl), &q).err().map(|e| e.code),
            Some(400)
        );
        Ok(())
    }
}
