//! HTTP layer: URL routing, query/header parsing and response rendering. Every
//! request goes through [`handle`]; the logic lives in [`crate::store`].

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::response::Response;
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use serde_json::{Value, json};
use tokio::sync::Notify;

use crate::error::{ApiError, qualified};
use crate::selector::{FieldSelector, LabelSelector, Selectors};
use crate::stats::{Meter, RequestRecord, WatchMeter, user_agent};
use crate::store::{
    DeleteOpts, FieldValidation, PatchType, Store, Sub, WriteOpts, WriteResult, meta_str,
};
use crate::table::{Output, negotiate, render_one, table};
use crate::types::ResourceType;
use crate::watch::{self, WatchFilter, WatchParams};

/// State shared by the handlers, the GC task and the public handle.
pub(crate) struct Shared {
    pub store: Arc<Mutex<Store>>,
    pub gc: Notify,
    pub bookmark_interval: Duration,
    pub addr: SocketAddr,
    /// Per-client counters (their own lock, not the store's).
    pub meter: Arc<Meter>,
}

impl Shared {
    pub fn lock(&self) -> Result<MutexGuard<'_, Store>, ApiError> {
        self.store.lock().map_err(|_| ApiError {
            code: 500,
            reason: "InternalError".into(),
            message: "the API server stand-in store lock is poisoned (a previous request panicked)"
                .into(),
            details: None,
        })
    }
}

const MAX_BODY: usize = 16 * 1024 * 1024;

enum Route {
    Version,
    Health,
    ApiVersions,
    GroupList,
    Group(String),
    /// `/openapi/v3`
    OpenApiIndex,
    /// `/openapi/v3/api/<v>`, `/openapi/v3/apis/<g>/<v>`
    OpenApiDoc(String, String),
    ResourceList(String, String),
    Resource {
        rt: Box<ResourceType>,
        ns: Option<String>,
        name: Option<String>,
        sub: Option<String>,
    },
}

fn route(store: &Store, path: &str) -> Result<Route, ApiError> {
    let segs: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let (group, version, rest): (&str, &str, &[&str]) = match segs.as_slice() {
        ["version"] => return Ok(Route::Version),
        ["healthz" | "readyz" | "livez"] => return Ok(Route::Health),
        ["api"] => return Ok(Route::ApiVersions),
        ["apis"] => return Ok(Route::GroupList),
        ["openapi", "v3"] => return Ok(Route::OpenApiIndex),
        ["openapi", "v3", "api", v] => {
            return Ok(Route::OpenApiDoc(String::new(), (*v).to_string()));
        }
        ["openapi", "v3", "apis", g, v] => {
            return Ok(Route::OpenApiDoc((*g).to_string(), (*v).to_string()));
        }
        ["apis", g] => return Ok(Route::Group((*g).to_string())),
        ["api", v] => return Ok(Route::ResourceList(String::new(), (*v).to_string())),
        ["apis", g, v] => return Ok(Route::ResourceList((*g).to_string(), (*v).to_string())),
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Err(ApiError::no_route(path)),
    };
    if rest.first() == Some(&"watch") {
        return Err(ApiError::not_implemented(
            "the deprecated /watch/ URL prefix (use ?watch=true)",
        ));
    }
    let namespaced_path = rest.len() >= 3
        && rest[0] == "namespaces"
        && !(group.is_empty() && matches!(rest[2], "status" | "finalize"));
    let (ns, plural, tail) = if namespaced_path {
        (Some(rest[1].to_string()), rest[2], &rest[3..])
    } else {
        (None, rest[0], &rest[1..])
    };
    let Some(rt) = store.resolve(group, version, plural) else {
        return Err(ApiError::no_route(path));
    };
    if ns.is_some() && !rt.namespaced {
        return Err(ApiError::no_route(path));
    }
    let (name, sub) = match tail {
        [] => (None, None),
        [n] => (Some((*n).to_string()), None),
        [n, s] => (Some((*n).to_string()), Some((*s).to_string())),
        _ => return Err(ApiError::no_route(path)),
    };
    if rt.namespaced && ns.is_none() && name.is_some() {
        return Err(ApiError::no_route(path));
    }
    Ok(Route::Resource {
        rt: Box::new(rt),
        ns,
        name,
        sub,
    })
}

fn json_response(code: u16, body: &Value, warnings: &[String]) -> Response {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    let mut resp = Response::new(Body::from(bytes));
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    for w in warnings {
        let v = format!("299 - {}", serde_json::to_string(w).unwrap_or_default());
        if let Ok(hv) = HeaderValue::from_str(&v) {
            resp.headers_mut().append(header::WARNING, hv);
        }
    }
    resp
}

fn error_response(e: &ApiError) -> Response {
    tracing::debug!(code = e.code, reason = %e.reason, message = %e.message, "request failed");
    json_response(e.code, &e.to_status(), &[])
}

/// Entry point of every request.
pub(crate) async fn handle(State(sh): State<Arc<Shared>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    tracing::debug!(
        method = %parts.method,
        uri = %parts.uri,
        accept = ?parts.headers.get(header::ACCEPT),
        content_type = ?parts.headers.get(header::CONTENT_TYPE),
        user_agent = ?parts.headers.get(header::USER_AGENT),
        "request"
    );
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(e) => {
            return error_response(&ApiError::bad_request(format!(
                "reading the request body: {e}"
            )));
        }
    };
    let delay = sh.lock().map(|s| s.delay).unwrap_or_default();
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let mut rec = RequestRecord::default();
    let resp = match dispatch(
        &sh,
        &parts.method,
        &parts.uri,
        &parts.headers,
        body,
        &mut rec,
    ) {
        Ok(resp) => resp,
        Err(e) => error_response(&e),
    };
    // exact for every body but a watch stream's
    let bytes = axum::body::HttpBody::size_hint(resp.body()).exact();
    sh.meter.request(user_agent(&parts.headers), &rec, bytes);
    resp
}

fn query_map(uri: &http::Uri) -> Result<HashMap<String, String>, ApiError> {
    match axum::extract::Query::<HashMap<String, String>>::try_from_uri(uri) {
        Ok(q) => Ok(q.0),
        Err(e) => Err(ApiError::bad_request(format!("invalid query string: {e}"))),
    }
}

fn flag(q: &HashMap<String, String>, k: &str) -> bool {
    matches!(q.get(k).map(String::as_str), Some("true" | "1"))
}

fn parse_rv(q: &HashMap<String, String>) -> Result<Option<u64>, ApiError> {
    match q.get("resourceVersion").map(String::as_str) {
        None | Some("") => Ok(None),
        Some(s) => s.parse::<u64>().map(Some).map_err(|_| {
            ApiError::bad_request(format!(
                "resourceVersion: Invalid value: {s:?}: must be a decimal resourceVersion issued by this server"
            ))
        }),
    }
}

fn selectors(rt: &ResourceType, q: &HashMap<String, String>) -> Result<Selectors, ApiError> {
    Ok(Selectors {
        labels: LabelSelector::parse(q.get("labelSelector").map_or("", String::as_str))?,
        fields: FieldSelector::parse(
            q.get("fieldSelector").map_or("", String::as_str),
            &rt.supported_fields(),
        )?,
    })
}

fn write_opts(q: &HashMap<String, String>) -> Result<WriteOpts, ApiError> {
    let dry_run = match q.get("dryRun").map(String::as_str) {
        None | Some("") => false,
        Some("All") => true,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "dryRun: Unsupported value: {other:?}: supported values: \"All\""
            )));
        }
    };
    let validation = match q.get("fieldValidation").map(String::as_str) {
        None | Some("") | Some("Warn") => FieldValidation::Warn,
        Some("Ignore") => FieldValidation::Ignore,
        Some("Strict") => FieldValidation::Strict,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "fieldValidation: Unsupported value: {other:?}: supported values: \"Ignore\", \"Strict\", \"Warn\""
            )));
        }
    };
    Ok(WriteOpts {
        dry_run,
        validation,
    })
}

fn media_type(headers: &HeaderMap) -> String {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

fn json_body(headers: &HeaderMap, body: &Bytes) -> Result<Value, ApiError> {
    match media_type(headers).as_str() {
        "" | "application/json" | "*/*" => {}
        // what client-go's generated clientsets (kubectl create namespace|configmap|secret)
        // send for built-in kinds; nothing the server answers makes them send JSON
        "application/vnd.kubernetes.protobuf" => return crate::protobuf::decode(body),
        "application/yaml" => {
            return Err(ApiError::unsupported_media_type(format!(
                "{}: request bodies in {} (the stand-in accepts application/json, and application/vnd.kubernetes.protobuf for v1 Namespace, ConfigMap and Secret)",
                crate::error::NOT_IMPLEMENTED,
                media_type(headers)
            )));
        }
        other => {
            return Err(ApiError::unsupported_media_type(format!(
                "the body of the request was in an unknown format ({other}) - accepted media types include: application/json, application/vnd.kubernetes.protobuf"
            )));
        }
    }
    parse_json(body)
}

fn parse_json(body: &Bytes) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!("couldn't get version/kind; json parse error: {e}"))
    })
}

fn verb_of(method: &Method, name: bool, watch: bool) -> &'static str {
    match (method.as_str(), name) {
        ("GET", false) if watch => "watch",
        ("GET", false) => "list",
        ("GET", true) => "get",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => "other",
    }
}

/// Answers a request; `rec` learns how it was counted (for [`Meter::request`]).
fn dispatch(
    sh: &Arc<Shared>,
    method: &Method,
    uri: &http::Uri,
    headers: &HeaderMap,
    body: Bytes,
    rec: &mut RequestRecord,
) -> Result<Response, ApiError> {
    let q = query_map(uri)?;
    let route = {
        let mut store = sh.lock()?;
        let user = headers
            .get("impersonate-user")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        if !store.available && !store.reachable_by.contains(user) {
            store.stats.request("unavailable");
            rec.verb = "unavailable";
            return Err(ApiError::unavailable());
        }
        match route(&store, uri.path()) {
            Ok(r) => r,
            Err(e) => {
                store.stats.request("other");
                rec.verb = "other";
                return Err(e);
            }
        }
    };
    let Route::Resource { rt, ns, name, sub } = route else {
        sh.lock()?.stats.request("discovery");
        rec.verb = "discovery";
        if method != Method::GET {
            return Err(ApiError::method_not_allowed(format!(
                "{method} is not supported on {}",
                uri.path()
            )));
        }
        return discovery(sh, route);
    };
    let watch = flag(&q, "watch");
    let verb = verb_of(method, name.is_some(), watch);
    if sub.as_deref() == Some("binding")
        && rt.plural == "pods"
        && rt.group.is_empty()
        && method == Method::POST
        && let (Some(n), Some(ns)) = (name.as_deref(), ns.as_deref())
    {
        let mut store = sh.lock()?;
        store.stats.request("create");
        rec.verb = "create";
        rec.resource = "pods/binding".into();
        store.stats.access(crate::stats::Access {
            user: headers
                .get("impersonate-user")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned(),
            verb: "create".into(),
            group: String::new(),
            resource: "pods/binding".into(),
            namespace: Some(ns.to_owned()),
        });
        store.stats.write("pods/binding".into());
        let binding = json_body(headers, &body)?;
        store.bind_pod(&rt, ns, n, &binding)?;
        return Ok(json_response(
            201,
            &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
            &[],
        ));
    }
    let sub_kind = match sub.as_deref() {
        None => Sub::Main,
        Some("status") if rt.status_subresource => Sub::Status,
        Some(s) => {
            sh.lock()?.stats.request("other");
            rec.verb = "other";
            rec.resource = format!("{}/{s}", qualified(&rt.group, &rt.plural));
            return Err(unsupported_sub(&rt, s));
        }
    };
    {
        let mut store = sh.lock()?;
        store.stats.request(verb);
        let resource = match sub_kind {
            Sub::Status => format!("{}/status", rt.plural),
            Sub::Main => rt.plural.clone(),
        };
        store.stats.access(crate::stats::Access {
            user: headers
                .get("impersonate-user")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned(),
            verb: verb.to_owned(),
            group: rt.group.clone(),
            resource,
            namespace: ns.clone(),
        });
        let mut key = qualified(&rt.group, &rt.plural);
        if sub_kind == Sub::Status {
            key.push_str("/status");
        }
        if matches!(
            verb,
            "create" | "update" | "patch" | "delete" | "deletecollection"
        ) {
            store.stats.write(key.clone());
        }
        rec.verb = verb;
        rec.resource = key;
    }
    let ns_ref = ns.as_deref();
    match (verb, name.as_deref()) {
        ("list", None) => {
            let (resp, objects) = list(sh, &rt, ns_ref, &q, headers)?;
            rec.listed = Some(objects);
            Ok(resp)
        }
        ("watch", None) => start_watch(sh, &rt, ns_ref, &q, headers),
        ("create", None) => {
            if rt.namespaced && ns.is_none() {
                return Err(ApiError::method_not_allowed(format!(
                    "create of namespaced {} needs a namespace in the URL",
                    rt.plural
                )));
            }
            let obj = json_body(headers, &body)?;
            let opts = write_opts(&q)?;
            let r = sh.lock()?.create(&rt, ns_ref, obj, &opts)?;
            Ok(write_response(r))
        }
        ("deletecollection", None) => {
            let sel = selectors(&rt, &q)?;
            let opts = delete_opts(&q, &body)?;
            let items = sh.lock()?.delete_collection(&rt, ns_ref, &sel, &opts)?;
            sh.gc.notify_one();
            Ok(json_response(
                200,
                &json!({"kind": format!("{}List", rt.kind), "apiVersion": rt.api_version(),
                        "metadata": {}, "items": items}),
                &[],
            ))
        }
        ("get", Some(n)) => {
            let output = negotiate(headers, &q)?;
            let obj = sh.lock()?.get(&rt, ns_ref.unwrap_or(""), n)?;
            Ok(json_response(
                200,
                &render_one(&rt, &obj, output, true),
                &[],
            ))
        }
        ("update", Some(n)) => {
            let obj = json_body(headers, &body)?;
            let opts = write_opts(&q)?;
            let r = sh
                .lock()?
                .update(&rt, ns_ref.unwrap_or(""), n, obj, sub_kind, &opts)?;
            notify_gc(sh, sub_kind);
            Ok(write_response(r))
        }
        ("patch", Some(n)) => {
            let ptype = patch_type(&rt, headers)?;
            let patch = parse_json(&body)?;
            let opts = write_opts(&q)?;
            let r = sh.lock()?.patch(
                &rt,
                ns_ref.unwrap_or(""),
                n,
                (ptype, &patch),
                sub_kind,
                &opts,
            )?;
            notify_gc(sh, sub_kind);
            Ok(write_response(r))
        }
        ("delete", Some(n)) if sub_kind == Sub::Main => {
            let opts = delete_opts(&q, &body)?;
            let r = sh.lock()?.delete(&rt, ns_ref.unwrap_or(""), n, &opts)?;
            sh.gc.notify_one();
            if r.removed && !rt.return_deleted_object {
                Ok(json_response(
                    200,
                    &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                            "details": {"name": n, "group": rt.group, "kind": rt.plural,
                                        "uid": meta_str(&r.object, "uid")}}),
                    &[],
                ))
            } else {
                Ok(json_response(200, &r.object, &[]))
            }
        }
        _ => Err(ApiError::method_not_allowed(format!(
            "{method} is not supported on {}",
            uri.path()
        ))),
    }
}

/// Wakes the garbage collector after a write that can orphan an object or
/// finish a deletion. A status write cannot (the status subresource keeps
/// metadata as it was), and the collector's pass reads every object under
/// the store's lock: waking it for each status write made a thousand status
/// writes cost a thousand whole-store scans, slowing every other request.
fn notify_gc(sh: &Shared, sub: Sub) {
    if sub == Sub::Main {
        sh.gc.notify_one();
    }
}

fn unsupported_sub(rt: &ResourceType, sub: &str) -> ApiError {
    let known_pod = [
        "log",
        "exec",
        "attach",
        "portforward",
        "proxy",
        "binding",
        "eviction",
        "ephemeralcontainers",
        "resize",
    ];
    if (rt.plural == "pods" && rt.group.is_empty() && known_pod.contains(&sub))
        || (rt.plural == "namespaces" && sub == "finalize")
        || sub == "scale"
    {
        ApiError::not_implemented(&format!("the {}/{sub} subresource", rt.plural))
    } else {
        ApiError::no_route(&format!("{}/{sub}", rt.plural))
    }
}

fn write_response(r: WriteResult) -> Response {
    json_response(if r.created { 201 } else { 200 }, &r.object, &r.warnings)
}

fn patch_type(rt: &ResourceType, headers: &HeaderMap) -> Result<PatchType, ApiError> {
    match media_type(headers).as_str() {
        "application/json-patch+json" => Ok(PatchType::Json),
        "application/merge-patch+json" => Ok(PatchType::Merge),
        "application/strategic-merge-patch+json" if rt.strategic_merge => Ok(PatchType::Strategic),
        "application/apply-patch+yaml" | "application/apply-patch+cbor" => {
            Err(ApiError::unsupported_media_type(format!(
                "{}: server-side apply ({})",
                crate::error::NOT_IMPLEMENTED,
                media_type(headers)
            )))
        }
        _ => Err(ApiError::unsupported_media_type(
            "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
        )),
    }
}

fn delete_opts(q: &HashMap<String, String>, body: &Bytes) -> Result<DeleteOpts, ApiError> {
    let mut o = DeleteOpts::default();
    if !body.is_empty() {
        let b = parse_json(body)?;
        if !b.is_object() {
            return Err(ApiError::bad_request("DeleteOptions must be a JSON object"));
        }
        o.grace = b.get("gracePeriodSeconds").and_then(Value::as_i64);
        o.propagation = b
            .get("propagationPolicy")
            .and_then(Value::as_str)
            .map(String::from);
        if b.get("orphanDependents").and_then(Value::as_bool) == Some(true) {
            o.propagation.get_or_insert_with(|| "Orphan".into());
        }
        let pre = b.get("preconditions");
        o.uid = pre
            .and_then(|p| p.get("uid"))
            .and_then(Value::as_str)
            .map(String::from);
        o.resource_version = pre
            .and_then(|p| p.get("resourceVersion"))
            .and_then(Value::as_str)
            .map(String::from);
        if b.get("dryRun")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty())
        {
            return Err(ApiError::not_implemented("dryRun on delete"));
        }
    }
    if let Some(g) = q.get("gracePeriodSeconds") {
        o.grace = Some(g.parse().map_err(|_| {
            ApiError::bad_request(format!("gracePeriodSeconds: invalid integer {g:?}"))
        })?);
    }
    if let Some(p) = q.get("propagationPolicy") {
        o.propagation = Some(p.clone());
    }
    if flag(q, "orphanDependents") {
        o.propagation.get_or_insert_with(|| "Orphan".into());
    }
    if q.get("dryRun").is_some_and(|d| !d.is_empty()) {
        return Err(ApiError::not_implemented("dryRun on delete"));
    }
    Ok(o)
}

fn check_list_params(q: &HashMap<String, String>) -> Result<bool, ApiError> {
    if q.get("continue").is_some_and(|c| !c.is_empty()) {
        return Err(ApiError::bad_request(
            "continue: the stand-in never issues continue tokens (lists are always complete)",
        ));
    }
    match q.get("resourceVersionMatch").map(String::as_str) {
        None | Some("") | Some("NotOlderThan") => Ok(false),
        Some("Exact") => Ok(true),
        Some(other) => Err(ApiError::bad_request(format!(
            "resourceVersionMatch: Unsupported value: {other:?}: supported values: \"Exact\", \"NotOlderThan\""
        ))),
    }
}

/// Answers a list, with the number of objects (or Table rows) it returned.
fn list(
    sh: &Arc<Shared>,
    rt: &ResourceType,
    ns: Option<&str>,
    q: &HashMap<String, String>,
    headers: &HeaderMap,
) -> Result<(Response, u64), ApiError> {
    let output = negotiate(headers, q)?;
    let exact = check_list_params(q)?;
    let rv = parse_rv(q)?;
    if q.get("resourceVersionMatch").is_some_and(|m| !m.is_empty()) && rv.is_none() {
        return Err(ApiError::bad_request(
            "resourceVersionMatch is forbidden unless resourceVersion is provided",
        ));
    }
    let sel = selectors(rt, q)?;
    let (items, list_rv) = sh.lock()?.list(rt, ns, &sel, rv, exact)?;
    let objects = u64::try_from(items.len()).unwrap_or(u64::MAX);
    let (kind, api_version) = match output {
        Output::Table(opts) => {
            return Ok((
                json_response(
                    200,
                    &table(rt, &items, opts, true, Some(list_rv.to_string())),
                    &[],
                ),
                objects,
            ));
        }
        Output::Metadata => (
            "PartialObjectMetadataList".to_string(),
            "meta.k8s.io/v1".to_string(),
        ),
        Output::Full => (format!("{}List", rt.kind), rt.api_version()),
    };
    let items: Vec<Value> = items
        .iter()
        .map(|o| render_one(rt, o, output, true))
        .collect();
    Ok((
        json_response(
            200,
            &json!({"kind": kind, "apiVersion": api_version,
                    "metadata": {"resourceVersion": list_rv.to_string()}, "items": items}),
            &[],
        ),
        objects,
    ))
}

fn start_watch(
    sh: &Arc<Shared>,
    rt: &ResourceType,
    ns: Option<&str>,
    q: &HashMap<String, String>,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    let output = negotiate(headers, q)?;
    let rv = parse_rv(q)?;
    let sel = selectors(rt, q)?;
    let send_initial = flag(q, "sendInitialEvents");
    let timeout = match q.get("timeoutSeconds") {
        Some(t) => Some(Duration::from_secs(t.parse().map_err(|_| {
            ApiError::bad_request(format!("timeoutSeconds: invalid integer {t:?}"))
        })?)),
        None => None,
    };
    let params = WatchParams {
        bookmarks: flag(q, "allowWatchBookmarks"),
        send_initial,
        timeout,
        bookmark_interval: sh.bookmark_interval,
    };
    let start = match sh.lock()?.watch(rt, ns, &sel, rv, send_initial) {
        Ok(s) => s,
        Err(e) if e.code == 410 => {
            // kube-apiserver answers 200 and a single ERROR event
            let mut resp = Response::new(watch::error_body(&e.to_status()));
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            return Ok(resp);
        }
        Err(e) => return Err(e),
    };
    let filter = WatchFilter {
        rt: rt.clone(),
        ns: ns.map(String::from),
        sel,
        output,
    };
    let meter = WatchMeter::open(
        sh.meter.clone(),
        user_agent(headers),
        qualified(&rt.group, &rt.plural),
    );
    let body = watch::spawn(sh.store.clone(), start, filter, params, meter);
    let mut resp = Response::new(body);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}

fn discovery(sh: &Arc<Shared>, route: Route) -> Result<Response, ApiError> {
    let types: Vec<ResourceType> = sh.lock()?.types().to_vec();
    let body = match route {
        Route::Version => json!({
            "major": "1", "minor": "34", "gitVersion": "v1.34.0-steward-standin",
            "gitCommit": "", "gitTreeState": "clean", "buildDate": "1970-01-01T00:00:00Z",
            "goVersion": "", "compiler": "", "platform": "linux/amd64"
        }),
        Route::Health => {
            let mut r = Response::new(Body::from("ok"));
            r.headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
            return Ok(r);
        }
        Route::ApiVersions => json!({
            "kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": sh.addr.to_string()}]
        }),
        Route::GroupList => {
            let mut groups: Vec<String> = types
                .iter()
                .filter(|t| !t.group.is_empty())
                .map(|t| t.group.clone())
                .collect();
            groups.sort();
            groups.dedup();
            let gs: Vec<Value> = groups.iter().map(|g| api_group(&types, g)).collect();
            json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": gs})
        }
        Route::Group(g) => {
            if !types.iter().any(|t| t.group == g) {
                return Err(ApiError::no_route(&format!("/apis/{g}")));
            }
            api_group(&types, &g)
        }
        Route::ResourceList(g, v) => {
            let mine: Vec<&ResourceType> = types
                .iter()
                .filter(|t| t.group == g && t.version == v)
                .collect();
            if mine.is_empty() {
                return Err(ApiError::no_route(&format!("{g}/{v}")));
            }
            let mut resources = Vec::new();
            for t in mine {
                resources.push(json!({
                    "name": t.plural, "singularName": t.singular, "namespaced": t.namespaced,
                    "kind": t.kind, "shortNames": t.short_names,
                    "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
                }));
                if t.status_subresource {
                    resources.push(json!({
                        "name": format!("{}/status", t.plural), "singularName": "",
                        "namespaced": t.namespaced, "kind": t.kind, "verbs": ["get", "patch", "update"]
                    }));
                }
            }
            let gv = if g.is_empty() { v } else { format!("{g}/{v}") };
            json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources})
        }
        Route::OpenApiIndex => crate::openapi::index(&types),
        Route::OpenApiDoc(g, v) => match crate::openapi::document(&types, &g, &v) {
            Some(doc) => doc,
            None => return Err(ApiError::no_route(&format!("/openapi/v3/{g}/{v}"))),
        },
        Route::Resource { .. } => return Err(ApiError::no_route("resource")),
    };
    Ok(json_response(200, &body, &[]))
}

fn api_group(types: &[ResourceType], g: &str) -> Value {
    let mut versions: Vec<String> = types
        .iter()
        .filter(|t| t.group == g)
        .map(|t| t.version.clone())
        .collect();
    versions.sort();
    versions.dedup();
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{g}/{v}"), "version": v}))
        .collect();
    let preferred = vs.first().cloned().unwrap_or(Value::Null);
    json!({"kind": "APIGroup", "apiVersion": "v1", "name": g, "versions": vs, "preferredVersion": preferred})
}
