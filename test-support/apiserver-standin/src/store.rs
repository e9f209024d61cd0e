//! The in-memory object store: one generic code path for every kind, with the
//! per-kind hooks Kubernetes has (pods, namespaces, secrets, CRDs).
//!
//! All methods are synchronous and run under the server's mutex; handlers are thin
//! adapters around them.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;

use serde_json::{Map, Value, json};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use crate::error::{ApiError, FieldError};
use crate::schema;
use crate::selector::Selectors;
use crate::stats::Stats;
use crate::types::{KindHooks, PrinterColumn, ResourceType, StorageKey, builtins};
use crate::validation::{LABEL_MSG, SUBDOMAIN_MSG, is_dns1123_label, is_dns1123_subdomain};

/// Kind of a stored change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Object created.
    Added,
    /// Object changed.
    Modified,
    /// Object removed.
    Deleted,
}

/// One entry of the event history.
#[derive(Debug, Clone)]
pub struct StoredEvent {
    /// resourceVersion of the change.
    pub rv: u64,
    /// Resource the object belongs to.
    pub key: StorageKey,
    /// Change type.
    pub etype: EventType,
    /// Object after the change (for deletions: the last state, with the deletion RV).
    pub object: Value,
    /// Object before the change (None for additions).
    pub prev: Option<Value>,
}

/// `fieldValidation` directive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FieldValidation {
    /// Drop unknown fields silently.
    Ignore,
    /// Drop unknown fields, answer with `Warning` headers (kube-apiserver default).
    #[default]
    Warn,
    /// Reject unknown fields with 400.
    Strict,
}

/// Options of create / update / patch.
#[derive(Debug, Clone, Copy, Default)]
pub struct WriteOpts {
    /// `dryRun=All`: validate and answer, but persist nothing.
    pub dry_run: bool,
    /// Unknown field handling.
    pub validation: FieldValidation,
}

/// Result of a write.
#[derive(Debug, Clone)]
pub struct WriteResult {
    /// Object as stored (or as it would be, for dry runs).
    pub object: Value,
    /// Warnings for the `Warning` header.
    pub warnings: Vec<String>,
    /// Whether the object was created (201) rather than updated.
    pub created: bool,
}

/// Main resource or `/status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sub {
    /// The object itself.
    Main,
    /// The status subresource.
    Status,
}

/// Patch flavours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    /// RFC 6902.
    Json,
    /// RFC 7386.
    Merge,
    /// Kubernetes strategic merge patch (built-in kinds only).
    Strategic,
}

/// `DeleteOptions` the stand-in honours.
#[derive(Debug, Clone, Default)]
pub struct DeleteOpts {
    /// `gracePeriodSeconds`.
    pub grace: Option<i64>,
    /// `propagationPolicy` (or `orphanDependents=true` mapped to `Orphan`).
    pub propagation: Option<String>,
    /// `preconditions.uid`.
    pub uid: Option<String>,
    /// `preconditions.resourceVersion`.
    pub resource_version: Option<String>,
}

/// Result of a delete.
#[derive(Debug, Clone)]
pub struct DeleteResult {
    /// The object (last state, or the pending one).
    pub object: Value,
    /// true when the object is gone; false when it waits for finalizers / grace.
    pub removed: bool,
}

/// Start of a watch: synthetic initial objects, events to replay, live receiver.
pub struct WatchStart {
    /// Current objects to send as ADDED first (already filtered and presented).
    pub initial: Vec<Value>,
    /// History entries after the requested resourceVersion.
    pub replay: Vec<Arc<StoredEvent>>,
    /// Live events.
    pub rx: UnboundedReceiver<Arc<StoredEvent>>,
    /// Store resourceVersion at subscription time.
    pub start_rv: u64,
}

type Objects = BTreeMap<(String, String), Value>;

/// The store.
pub struct Store {
    rv: u64,
    compacted: u64,
    types: Vec<ResourceType>,
    objects: BTreeMap<StorageKey, Objects>,
    history: VecDeque<Arc<StoredEvent>>,
    watchers: Vec<UnboundedSender<Arc<StoredEvent>>>,
    name_seq: u64,
    /// Request / write counters.
    pub stats: Stats,
    /// false: every request answers 503 (but those of `reachable_by`).
    pub available: bool,
    /// While unavailable, the users (`Impersonate-User`) still answered:
    /// a partition between some clients and the server, not an outage.
    pub reachable_by: BTreeSet<String>,
    /// Added before every answer (slow API server).
    pub delay: std::time::Duration,
}

pub(crate) fn now_ts(offset_secs: i64) -> String {
    let now = jiff::Timestamp::now()
        .as_second()
        .saturating_add(offset_secs);
    jiff::Timestamp::from_second(now)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| jiff::Timestamp::UNIX_EPOCH.to_string())
}

pub(crate) fn meta(obj: &Value) -> Option<&Map<String, Value>> {
    obj.get("metadata").and_then(Value::as_object)
}

pub(crate) fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    meta(obj).and_then(|m| m.get(field)).and_then(Value::as_str)
}

fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.is_object() {
        *obj = json!({});
    }
    let Value::Object(root) = obj else {
        unreachable!("just made an object")
    };
    let m = root
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if !m.is_object() {
        *m = Value::Object(Map::new());
    }
    match m {
        Value::Object(m) => m,
        _ => unreachable!("just made an object"),
    }
}

fn finalizers(obj: &Value) -> Vec<String> {
    meta(obj)
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

fn set_or_remove(map: &mut Map<String, Value>, key: &str, v: Option<Value>) {
    match v {
        Some(v) => {
            map.insert(key.to_string(), v);
        }
        None => {
            map.remove(key);
        }
    }
}

fn strip_for_generation(obj: &Value, status_sub: bool) -> Value {
    let mut v = obj.clone();
    if let Value::Object(m) = &mut v {
        m.remove("metadata");
        m.remove("apiVersion");
        m.remove("kind");
        if status_sub {
            m.remove("status");
        }
    }
    v
}

fn strip_rv(obj: &Value) -> Value {
    let mut v = obj.clone();
    if let Some(Value::Object(m)) = v.get_mut("metadata") {
        m.remove("resourceVersion");
        m.remove("managedFields");
    }
    v
}

const GEN_CHARS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

impl Store {
    /// A store with the built-in kinds and the default namespaces.
    pub fn new() -> Self {
        let mut s = Self {
            rv: 0,
            compacted: 0,
            types: builtins(),
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            watchers: Vec::new(),
            name_seq: 0,
            stats: Stats::default(),
            available: true,
            reachable_by: BTreeSet::new(),
            delay: std::time::Duration::ZERO,
        };
        for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            let body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
            if let Some(rt) = s.resolve("", "v1", "namespaces")
                && let Err(e) = s.create(&rt, None, body, &WriteOpts::default())
            {
                tracing::error!(%e, "creating built-in namespace");
            }
        }
        s
    }

    /// Current resourceVersion.
    pub fn rv(&self) -> u64 {
        self.rv
    }

    /// Finds a served kind by URL coordinates.
    pub fn resolve(&self, group: &str, version: &str, plural: &str) -> Option<ResourceType> {
        self.types
            .iter()
            .find(|t| t.group == group && t.version == version && t.plural == plural)
            .cloned()
    }

    /// All served kinds.
    pub fn types(&self) -> &[ResourceType] {
        &self.types
    }

    /// The stored objects, per resource (for [`crate::ApiServer::stored`]).
    pub fn objects_by_resource(
        &self,
    ) -> impl Iterator<Item = (&StorageKey, impl Iterator<Item = &Value>)> {
        self.objects.iter().map(|(k, objs)| (k, objs.values()))
    }

    fn type_for_key(&self, key: &StorageKey) -> Option<ResourceType> {
        self.types
            .iter()
            .find(|t| t.group == key.group && t.plural == key.plural)
            .cloned()
    }

    /// Registers (or replaces) a kind.
    pub fn register(&mut self, rt: ResourceType) {
        self.types
            .retain(|t| !(t.group == rt.group && t.version == rt.version && t.plural == rt.plural));
        tracing::debug!(group = %rt.group, version = %rt.version, plural = %rt.plural, "registering kind");
        self.types.push(rt);
    }

    /// Drops the event history: watches from older resourceVersions get 410.
    pub fn compact(&mut self) {
        self.compacted = self.rv;
        self.history.clear();
    }

    /// Closes every open watch.
    pub fn close_watches(&mut self) {
        self.watchers.clear();
    }

    fn lookup(&self, key: &StorageKey, ns: &str, name: &str) -> Option<&Value> {
        self.objects
            .get(key)
            .and_then(|m| m.get(&(ns.to_string(), name.to_string())))
    }

    /// Presents a stored object in the requested version.
    pub fn present(rt: &ResourceType, obj: &Value) -> Value {
        let mut o = obj.clone();
        if let Value::Object(m) = &mut o {
            m.insert("apiVersion".into(), json!(rt.api_version()));
            m.insert("kind".into(), json!(rt.kind));
        }
        o
    }

    fn emit(&mut self, key: &StorageKey, etype: EventType, object: Value, prev: Option<Value>) {
        let ev = Arc::new(StoredEvent {
            rv: self.rv,
            key: key.clone(),
            etype,
            object,
            prev,
        });
        self.history.push_back(ev.clone());
        self.watchers.retain(|w| w.send(ev.clone()).is_ok());
    }

    fn put(&mut self, key: &StorageKey, mut obj: Value, prev: Option<Value>) -> Value {
        self.rv += 1;
        let rv = self.rv.to_string();
        let m = meta_mut(&mut obj);
        m.insert("resourceVersion".into(), json!(rv));
        let ns = m
            .get("namespace")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let name = m
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        self.objects
            .entry(key.clone())
            .or_default()
            .insert((ns, name), obj.clone());
        let etype = if prev.is_some() {
            EventType::Modified
        } else {
            EventType::Added
        };
        self.emit(key, etype, obj.clone(), prev);
        obj
    }

    fn remove(&mut self, key: &StorageKey, ns: &str, name: &str) -> Option<Value> {
        let prev = self
            .objects
            .get_mut(key)?
            .remove(&(ns.to_string(), name.to_string()))?;
        self.rv += 1;
        let mut obj = prev.clone();
        meta_mut(&mut obj).insert("resourceVersion".into(), json!(self.rv.to_string()));
        self.emit(key, EventType::Deleted, obj.clone(), Some(prev));
        if key.group == "apiextensions.k8s.io" && key.plural == "customresourcedefinitions" {
            self.unregister_crd(&obj);
        }
        Some(obj)
    }

    fn check_body(&self, rt: &ResourceType, body: &Value) -> Result<(), ApiError> {
        let Some(map) = body.as_object() else {
            return Err(ApiError::bad_request(format!(
                "the body of the request must be a JSON object, got: {body}"
            )));
        };
        let Some(kind) = map
            .get("kind")
            .and_then(Value::as_str)
            .filter(|k| !k.is_empty())
        else {
            return Err(ApiError::bad_request(format!(
                "Object 'Kind' is missing in '{body}'"
            )));
        };
        let Some(av) = map
            .get("apiVersion")
            .and_then(Value::as_str)
            .filter(|k| !k.is_empty())
        else {
            return Err(ApiError::bad_request(format!(
                "Object 'apiVersion' is missing in '{body}'"
            )));
        };
        if av != rt.api_version() {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({av}) does not match the expected API version ({})",
                rt.api_version()
            )));
        }
        if kind != rt.kind {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({kind}) does not match the expected kind ({}) of {}",
                rt.kind,
                crate::error::qualified(&rt.group, &rt.plural)
            )));
        }
        if let Some(m) = map.get("metadata")
            && !m.is_object()
            && !m.is_null()
        {
            return Err(ApiError::bad_request(
                "metadata must be a JSON object".to_string(),
            ));
        }
        Ok(())
    }

    fn check_namespace_for_create(
        &self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
    ) -> Result<(), ApiError> {
        let key = StorageKey {
            group: String::new(),
            plural: "namespaces".into(),
        };
        match self.lookup(&key, "", ns) {
            None => Err(ApiError::not_found("", "namespaces", ns)),
            Some(n) if meta_str(n, "deletionTimestamp").is_some() => Err(ApiError::forbidden(
                format!(
                    "{} {name:?} is forbidden: unable to create new content in namespace {ns} because it is being terminated",
                    crate::error::qualified(&rt.group, &rt.plural)
                ),
                Some(json!({"name": name, "group": rt.group, "kind": rt.plural,
                    "causes": [{"reason": "NamespaceTerminating", "message": format!("namespace {ns} is being terminated"), "field": "metadata.namespace"}]})),
            )),
            Some(_) => Ok(()),
        }
    }

    fn gen_suffix(&mut self) -> String {
        self.name_seq += 1;
        let seed = uuid::Uuid::new_v4().as_u128() ^ u128::from(self.name_seq);
        (0..5)
            .map(|i| {
                let idx = ((seed >> (i * 8)) & 0xff) as usize % GEN_CHARS.len();
                char::from(GEN_CHARS[idx])
            })
            .collect()
    }

    fn validate_name(rt: &ResourceType, name: &str) -> Vec<FieldError> {
        let label_only = matches!(rt.hooks, KindHooks::Namespace);
        if label_only {
            if !is_dns1123_label(name) {
                return vec![FieldError::invalid("metadata.name", json!(name), LABEL_MSG)];
            }
        } else if !is_dns1123_subdomain(name) {
            return vec![FieldError::invalid(
                "metadata.name",
                json!(name),
                SUBDOMAIN_MSG,
            )];
        }
        Vec::new()
    }

    /// Applies metadata/schema pruning and validation. Returns warnings.
    fn prune_and_validate(
        rt: &ResourceType,
        obj: &mut Value,
        name: &str,
        opts: &WriteOpts,
    ) -> Result<Vec<String>, ApiError> {
        let (unknown, errors) = match &rt.schema {
            Some(s) => {
                let out = schema::process(obj, s);
                (out.unknown, out.errors)
            }
            None => {
                let mut unknown = Vec::new();
                schema::prune_metadata(obj, &mut unknown);
                (unknown, Vec::new())
            }
        };
        let mut warnings = Vec::new();
        if !unknown.is_empty() {
            match opts.validation {
                FieldValidation::Strict => {
                    let list: Vec<String> = unknown
                        .iter()
                        .map(|u| format!("unknown field {u:?}"))
                        .collect();
                    return Err(ApiError::bad_request(format!(
                        "strict decoding error: {}",
                        list.join(", ")
                    )));
                }
                FieldValidation::Warn => {
                    warnings.extend(unknown.iter().map(|u| format!("unknown field {u:?}")));
                }
                FieldValidation::Ignore => {}
            }
        }
        if !errors.is_empty() {
            return Err(ApiError::invalid(&rt.group, &rt.kind, name, &errors));
        }
        Ok(warnings)
    }

    /// POST: creates an object.
    pub fn create(
        &mut self,
        rt: &ResourceType,
        url_ns: Option<&str>,
        mut obj: Value,
        opts: &WriteOpts,
    ) -> Result<WriteResult, ApiError> {
        self.check_body(rt, &obj)?;
        let key = rt.storage_key();
        let m = meta_mut(&mut obj);
        // namespace
        let ns = if rt.namespaced {
            let url_ns = url_ns.unwrap_or_default();
            match m.get("namespace").and_then(Value::as_str) {
                Some(b) if !b.is_empty() && b != url_ns => {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ));
                }
                _ => {}
            }
            m.insert("namespace".into(), json!(url_ns));
            url_ns.to_string()
        } else {
            m.remove("namespace");
            String::new()
        };
        // system fields
        for f in [
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "resourceVersion",
            "selfLink",
            "generation",
        ] {
            m.remove(f);
        }
        let explicit = m
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let generate = m
            .get("generateName")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let name = if !explicit.is_empty() {
            explicit
        } else if !generate.is_empty() {
            let mut candidate = String::new();
            for _ in 0..16 {
                candidate = format!("{generate}{}", self.gen_suffix());
                if self.lookup(&key, &ns, &candidate).is_none() {
                    break;
                }
            }
            candidate
        } else {
            return Err(ApiError::invalid(
                &rt.group,
                &rt.kind,
                "",
                &[FieldError::required(
                    "metadata.name",
                    "name or generateName is required",
                )],
            ));
        };
        let m = meta_mut(&mut obj);
        m.insert("name".into(), json!(name));
        let errs = Self::validate_name(rt, &name);
        if !errs.is_empty() {
            return Err(ApiError::invalid(&rt.group, &rt.kind, &name, &errs));
        }
        if rt.namespaced {
            self.check_namespace_for_create(rt, &ns, &name)?;
        }
        if let Value::Object(root) = &mut obj {
            root.insert("apiVersion".into(), json!(rt.api_version()));
            if rt.create_resets_status {
                root.remove("status");
            }
        }
        let warnings = Self::prune_and_validate(rt, &mut obj, &name, opts)?;
        self.create_hook(rt, &mut obj, &name)?;
        if self.lookup(&key, &ns, &name).is_some() {
            return Err(ApiError::already_exists(&rt.group, &rt.plural, &name));
        }
        let m = meta_mut(&mut obj);
        m.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
        m.insert("creationTimestamp".into(), json!(now_ts(0)));
        m.insert("generation".into(), json!(1));
        if opts.dry_run {
            return Ok(WriteResult {
                object: Self::present(rt, &obj),
                warnings,
                created: true,
            });
        }
        if matches!(rt.hooks, KindHooks::Crd) {
            self.register_crd(&obj)?;
        }
        let stored = self.put(&key, obj, None);
        Ok(WriteResult {
            object: Self::present(rt, &stored),
            warnings,
            created: true,
        })
    }

    fn create_hook(&self, rt: &ResourceType, obj: &mut Value, name: &str) -> Result<(), ApiError> {
        match rt.hooks {
            KindHooks::Generic => Ok(()),
            KindHooks::Secret => {
                fold_string_data(obj);
                Ok(())
            }
            KindHooks::Namespace => {
                if let Value::Object(root) = obj {
                    let spec = root.entry("spec").or_insert_with(|| json!({}));
                    if let Value::Object(spec) = spec
                        && !spec.contains_key("finalizers")
                    {
                        spec.insert("finalizers".into(), json!(["kubernetes"]));
                    }
                    root.insert("status".into(), json!({"phase": "Active"}));
                }
                Ok(())
            }
            KindHooks::Pod => {
                validate_pod_spec(rt, obj, name)?;
                if let Some(Value::Object(spec)) = obj.get_mut("spec") {
                    for (k, v) in [
                        ("terminationGracePeriodSeconds", json!(30)),
                        ("restartPolicy", json!("Always")),
                        ("dnsPolicy", json!("ClusterFirst")),
                        ("schedulerName", json!("default-scheduler")),
                        ("securityContext", json!({})),
                        ("enableServiceLinks", json!(true)),
                    ] {
                        spec.entry(k).or_insert(v);
                    }
                }
                if let Value::Object(root) = obj {
                    root.insert("status".into(), json!({"phase": "Pending"}));
                }
                Ok(())
            }
            KindHooks::Crd => {
                let types = crd_types(obj, name)?;
                let accepted = obj
                    .get("spec")
                    .and_then(|s| s.get("names"))
                    .cloned()
                    .unwrap_or_else(|| json!({}));
                let storage: Vec<Value> = obj
                    .get("spec")
                    .and_then(|s| s.get("versions"))
                    .and_then(Value::as_array)
                    .map(|vs| {
                        vs.iter()
                            .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
                            .filter_map(|v| v.get("name").cloned())
                            .collect()
                    })
                    .unwrap_or_default();
                let mut accepted = accepted;
                if let (Value::Object(a), Some(first)) = (&mut accepted, types.first()) {
                    a.entry("singular").or_insert(json!(first.singular));
                    a.entry("listKind")
                        .or_insert(json!(format!("{}List", first.kind)));
                }
                let ts = now_ts(0);
                if let Value::Object(root) = obj {
                    root.insert(
                        "status".into(),
                        json!({
                            "conditions": [
                                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
                                 "message": "no conflicts found", "lastTransitionTime": ts},
                                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
                                 "message": "the initial names have been accepted", "lastTransitionTime": ts}
                            ],
                            "acceptedNames": accepted,
                            "storedVersions": storage
                        }),
                    );
                }
                Ok(())
            }
        }
    }

    fn register_crd(&mut self, crd: &Value) -> Result<(), ApiError> {
        let name = meta_str(crd, "name").unwrap_or_default().to_string();
        let types = crd_types(crd, &name)?;
        if let Some(first) = types.first() {
            let (g, p) = (first.group.clone(), first.plural.clone());
            self.types.retain(|t| !(t.group == g && t.plural == p));
        }
        for t in types {
            self.register(t);
        }
        Ok(())
    }

    fn unregister_crd(&mut self, crd: &Value) {
        let spec = crd.get("spec");
        let group = spec
            .and_then(|s| s.get("group"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let plural = spec
            .and_then(|s| s.get("names"))
            .and_then(|n| n.get("plural"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        self.types
            .retain(|t| !(t.group == group && t.plural == plural));
        let key = StorageKey { group, plural };
        if let Some(objs) = self.objects.get(&key) {
            let names: Vec<(String, String)> = objs.keys().cloned().collect();
            for (ns, n) in names {
                self.remove(&key, &ns, &n);
            }
        }
        self.objects.remove(&key);
    }

    /// GET one object.
    pub fn get(&self, rt: &ResourceType, ns: &str, name: &str) -> Result<Value, ApiError> {
        self.lookup(&rt.storage_key(), ns, name)
            .map(|o| Self::present(rt, o))
            .ok_or_else(|| ApiError::not_found(&rt.group, &rt.plural, name))
    }

    /// LIST: matching objects and the list resourceVersion.
    pub fn list(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        sel: &Selectors,
        rv: Option<u64>,
        exact: bool,
    ) -> Result<(Vec<Value>, u64), ApiError> {
        let key = rt.storage_key();
        let mut current: BTreeMap<(String, String), Value> =
            self.objects.get(&key).cloned().unwrap_or_default();
        let mut list_rv = self.rv;
        match rv {
            Some(n) if n > self.rv => return Err(ApiError::too_large_rv(n, self.rv)),
            Some(n) if exact && n > 0 && n != self.rv => {
                if n < self.compacted {
                    return Err(ApiError::expired(format!(
                        "The resourceVersion for the provided list is too old (requested {n}, oldest available {})",
                        self.compacted
                    )));
                }
                // rewind the history to reconstruct the state at n
                for ev in self.history.iter().rev().take_while(|e| e.rv > n) {
                    if ev.key != key {
                        continue;
                    }
                    let k = (
                        meta_str(&ev.object, "namespace")
                            .unwrap_or_default()
                            .to_string(),
                        meta_str(&ev.object, "name").unwrap_or_default().to_string(),
                    );
                    match (&ev.etype, &ev.prev) {
                        (EventType::Added, _) => {
                            current.remove(&k);
                        }
                        (_, Some(prev)) => {
                            current.insert(k, prev.clone());
                        }
                        (_, None) => {}
                    }
                }
                list_rv = n;
            }
            _ => {}
        }
        let items = current
            .into_iter()
            .filter(|((ons, _), _)| ns.is_none_or(|n| n == ons))
            .filter(|(_, o)| sel.matches(o))
            .map(|(_, o)| Self::present(rt, &o))
            .collect();
        Ok((items, list_rv))
    }

    /// PUT (main or status).
    pub fn update(
        &mut self,
        rt: &ResourceType,
        url_ns: &str,
        name: &str,
        body: Value,
        sub: Sub,
        opts: &WriteOpts,
    ) -> Result<WriteResult, ApiError> {
        self.check_body(rt, &body)?;
        let key = rt.storage_key();
        if let Some(bn) = meta_str(&body, "name")
            && bn != name
        {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({bn}) does not match the name on the URL ({name})"
            )));
        }
        if rt.namespaced
            && let Some(bns) = meta_str(&body, "namespace")
            && !bns.is_empty()
            && bns != url_ns
        {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        let Some(existing) = self.lookup(&key, url_ns, name).cloned() else {
            if rt.allow_create_on_update && sub == Sub::Main {
                let mut body = body;
                meta_mut(&mut body).insert("name".into(), json!(name));
                let ns = rt.namespaced.then_some(url_ns);
                return self.create(rt, ns, body, opts);
            }
            return Err(ApiError::not_found(&rt.group, &rt.plural, name));
        };
        if let Some(rv) = meta_str(&body, "resourceVersion").filter(|r| !r.is_empty())
            && Some(rv) != meta_str(&existing, "resourceVersion")
        {
            return Err(ApiError::stale(&rt.group, &rt.plural, name));
        }
        let mut cand = match sub {
            Sub::Status => {
                let mut c = existing.clone();
                if let Value::Object(m) = &mut c {
                    set_or_remove(m, "status", body.get("status").cloned());
                }
                c
            }
            Sub::Main => {
                let mut c = body;
                if rt.status_subresource
                    && let Value::Object(m) = &mut c
                {
                    set_or_remove(m, "status", existing.get("status").cloned());
                }
                c
            }
        };
        if let Value::Object(root) = &mut cand {
            root.insert("apiVersion".into(), json!(rt.api_version()));
            root.insert("kind".into(), json!(rt.kind));
        }
        {
            let em = meta(&existing).cloned().unwrap_or_default();
            let m = meta_mut(&mut cand);
            for f in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
                "namespace",
                "name",
                "generateName",
            ] {
                set_or_remove(m, f, em.get(f).cloned());
            }
            m.remove("selfLink");
            m.insert(
                "resourceVersion".into(),
                em.get("resourceVersion").cloned().unwrap_or(Value::Null),
            );
        }
        if meta_str(&existing, "deletionTimestamp").is_some() {
            let old: HashSet<String> = finalizers(&existing).into_iter().collect();
            let added: Vec<String> = finalizers(&cand)
                .into_iter()
                .filter(|f| !old.contains(f))
                .collect();
            if !added.is_empty() {
                return Err(ApiError::invalid(
                    &rt.group,
                    &rt.kind,
                    name,
                    &[FieldError::forbidden(
                        "metadata.finalizers",
                        format!(
                            "no new finalizers can be added if the object is being deleted, found new finalizers {added:?}"
                        ),
                    )],
                ));
            }
        }
        let warnings = Self::prune_and_validate(rt, &mut cand, name, opts)?;
        self.update_hook(rt, &existing, &mut cand, name)?;
        if strip_for_generation(&cand, rt.status_subresource)
            != strip_for_generation(&existing, rt.status_subresource)
        {
            let g = meta(&existing)
                .and_then(|m| m.get("generation"))
                .and_then(Value::as_i64)
                .unwrap_or(0);
            meta_mut(&mut cand).insert("generation".into(), json!(g + 1));
        }
        if strip_rv(&cand) == strip_rv(&existing) {
            return Ok(WriteResult {
                object: Self::present(rt, &existing),
                warnings,
                created: false,
            });
        }
        if opts.dry_run {
            return Ok(WriteResult {
                object: Self::present(rt, &cand),
                warnings,
                created: false,
            });
        }
        let deleting = meta_str(&cand, "deletionTimestamp").is_some()
            && finalizers(&cand).is_empty()
            && meta(&cand)
                .and_then(|m| m.get("deletionGracePeriodSeconds"))
                .and_then(Value::as_i64)
                .unwrap_or(0)
                == 0
            && !namespace_spec_finalizers_pending(rt, &cand);
        if deleting {
            // like kube-apiserver: emptied finalizers delete the object right away
            let removed = self
                .remove(&key, url_ns, name)
                .unwrap_or_else(|| existing.clone());
            return Ok(WriteResult {
                object: Self::present(rt, &removed),
                warnings,
                created: false,
            });
        }
        if matches!(rt.hooks, KindHooks::Crd) && sub == Sub::Main {
            self.register_crd(&cand)?;
        }
        let stored = self.put(&key, cand, Some(existing));
        Ok(WriteResult {
            object: Self::present(rt, &stored),
            warnings,
            created: false,
        })
    }

    /// POST `pods/<name>/binding` (what a scheduler does): sets
    /// `spec.nodeName` to the Binding's target, once. A pod already bound
    /// answers 409, as kube-apiserver does.
    pub fn bind_pod(
        &mut self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        binding: &Value,
    ) -> Result<WriteResult, ApiError> {
        let target = binding
            .get("target")
            .and_then(|t| t.get("name"))
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| ApiError::bad_request("Binding without target.name"))?;
        let key = rt.storage_key();
        let existing = self
            .lookup(&key, ns, name)
            .cloned()
            .ok_or_else(|| ApiError::not_found(&rt.group, &rt.plural, name))?;
        if let Some(node) = existing
            .get("spec")
            .and_then(|s| s.get("nodeName"))
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
        {
            return Err(ApiError::conflict(
                &rt.group,
                "pods/binding",
                name,
                &format!("pod {name} is already assigned to node \"{node}\""),
            ));
        }
        if meta_str(&existing, "deletionTimestamp").is_some() {
            return Err(ApiError::conflict(
                &rt.group,
                "pods/binding",
                name,
                "the pod is being deleted",
            ));
        }
        let mut cand = existing.clone();
        if let Some(Value::Object(spec)) = cand.get_mut("spec") {
            spec.insert("nodeName".into(), json!(target));
        }
        let stored = self.put(&key, cand, Some(existing));
        Ok(WriteResult {
            object: Self::present(rt, &stored),
            warnings: Vec::new(),
            created: true,
        })
    }

    fn update_hook(
        &self,
        rt: &ResourceType,
        existing: &Value,
        cand: &mut Value,
        name: &str,
    ) -> Result<(), ApiError> {
        match rt.hooks {
            KindHooks::Secret => {
                fold_string_data(cand);
                Ok(())
            }
            KindHooks::Pod => {
                validate_pod_spec(rt, cand, name)?;
                pod_spec_immutable(rt, existing, cand, name)
            }
            KindHooks::Namespace => {
                // spec.finalizers only changes through /finalize
                if let (Value::Object(c), Some(spec)) = (&mut *cand, existing.get("spec")) {
                    c.insert("spec".into(), spec.clone());
                }
                Ok(())
            }
            KindHooks::Crd => {
                crd_types(cand, name)?;
                if let (Value::Object(c), Some(st)) = (&mut *cand, existing.get("status")) {
                    c.insert("status".into(), st.clone());
                }
                Ok(())
            }
            KindHooks::Generic => Ok(()),
        }
    }

    /// PATCH (main or status).
    pub fn patch(
        &mut self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        (ptype, patch): (PatchType, &Value),
        sub: Sub,
        opts: &WriteOpts,
    ) -> Result<WriteResult, ApiError> {
        let Some(current) = self.lookup(&rt.storage_key(), ns, name) else {
            return Err(ApiError::not_found(&rt.group, &rt.plural, name));
        };
        let mut doc = Self::present(rt, current);
        match ptype {
            PatchType::Merge => {
                if !patch.is_object() {
                    return Err(ApiError::bad_request(
                        "Invalid JSON Patch: a merge patch must be a JSON object",
                    ));
                }
                json_patch::merge(&mut doc, patch);
            }
            PatchType::Strategic => {
                if !patch.is_object() {
                    return Err(ApiError::bad_request(
                        "a strategic merge patch must be a JSON object",
                    ));
                }
                crate::smp::apply(&mut doc, patch, "")?;
            }
            PatchType::Json => {
                let ops: json_patch::Patch = serde_json::from_value(patch.clone())
                    .map_err(|e| ApiError::bad_request(e.to_string()))?;
                json_patch::patch(&mut doc, &ops)
                    .map_err(|e| ApiError::patch_failed(&e.to_string()))?;
            }
        }
        if !doc.is_object() {
            return Err(ApiError::bad_request(
                "the patched object is not a JSON object",
            ));
        }
        self.update(rt, ns, name, doc, sub, opts)
    }

    /// DELETE one object.
    pub fn delete(
        &mut self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        opts: &DeleteOpts,
    ) -> Result<DeleteResult, ApiError> {
        let key = rt.storage_key();
        let Some(existing) = self.lookup(&key, ns, name).cloned() else {
            return Err(ApiError::not_found(&rt.group, &rt.plural, name));
        };
        if let Some(uid) = &opts.uid
            && Some(uid.as_str()) != meta_str(&existing, "uid")
        {
            return Err(ApiError::conflict(
                &rt.group,
                &rt.plural,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    meta_str(&existing, "uid").unwrap_or_default()
                ),
            ));
        }
        if let Some(rv) = &opts.resource_version
            && Some(rv.as_str()) != meta_str(&existing, "resourceVersion")
        {
            return Err(ApiError::conflict(
                &rt.group,
                &rt.plural,
                name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    meta_str(&existing, "resourceVersion").unwrap_or_default()
                ),
            ));
        }
        let foreground = match opts.propagation.as_deref() {
            None | Some("Background") => false,
            Some("Foreground") => true,
            Some("Orphan") => {
                if let Some(uid) = meta_str(&existing, "uid") {
                    self.orphan_dependents(uid);
                }
                false
            }
            Some(other) => {
                return Err(ApiError::invalid(
                    &rt.group,
                    &rt.kind,
                    name,
                    &[FieldError::not_supported(
                        "propagationPolicy",
                        json!(other),
                        &[json!("Foreground"), json!("Background"), json!("Orphan")],
                    )],
                ));
            }
        };
        let mut grace = 0i64;
        if matches!(rt.hooks, KindHooks::Pod) {
            let spec = existing.get("spec");
            grace = opts
                .grace
                .or_else(|| {
                    spec.and_then(|s| s.get("terminationGracePeriodSeconds"))
                        .and_then(Value::as_i64)
                })
                .unwrap_or(30);
            if grace < 0 {
                grace = 1;
            }
            let node = spec
                .and_then(|s| s.get("nodeName"))
                .and_then(Value::as_str)
                .unwrap_or_default();
            let phase = existing
                .get("status")
                .and_then(|s| s.get("phase"))
                .and_then(Value::as_str)
                .unwrap_or_default();
            if node.is_empty() || phase == "Succeeded" || phase == "Failed" {
                grace = 0;
            }
        }
        let mut cand = existing.clone();
        if foreground {
            let mut f = finalizers(&cand);
            if !f.iter().any(|x| x == "foregroundDeletion") {
                f.push("foregroundDeletion".into());
                meta_mut(&mut cand).insert("finalizers".into(), json!(f));
            }
        }
        let ns_pending = namespace_spec_finalizers_pending(rt, &cand);
        let pending = grace > 0 || !finalizers(&cand).is_empty() || ns_pending;
        if !pending {
            let removed = self
                .remove(&key, ns, name)
                .unwrap_or_else(|| existing.clone());
            return Ok(DeleteResult {
                object: Self::present(rt, &removed),
                removed: true,
            });
        }
        let current_grace = meta(&existing)
            .and_then(|m| m.get("deletionGracePeriodSeconds"))
            .and_then(Value::as_i64);
        let m = meta_mut(&mut cand);
        match current_grace {
            None => {
                m.insert("deletionTimestamp".into(), json!(now_ts(grace)));
                m.insert("deletionGracePeriodSeconds".into(), json!(grace));
                let g = m.get("generation").and_then(Value::as_i64).unwrap_or(0);
                m.insert("generation".into(), json!(g + 1));
            }
            Some(cur) if grace < cur => {
                m.insert("deletionTimestamp".into(), json!(now_ts(grace)));
                m.insert("deletionGracePeriodSeconds".into(), json!(grace));
            }
            Some(_) => {}
        }
        if matches!(rt.hooks, KindHooks::Namespace)
            && let Value::Object(root) = &mut cand
        {
            root.insert("status".into(), json!({"phase": "Terminating"}));
        }
        if cand == existing {
            return Ok(DeleteResult {
                object: Self::present(rt, &existing),
                removed: false,
            });
        }
        let stored = self.put(&key, cand, Some(existing));
        Ok(DeleteResult {
            object: Self::present(rt, &stored),
            removed: false,
        })
    }

    /// DELETE on a collection: deletes every matching object.
    pub fn delete_collection(
        &mut self,
        rt: &ResourceType,
        ns: Option<&str>,
        sel: &Selectors,
        opts: &DeleteOpts,
    ) -> Result<Vec<Value>, ApiError> {
        let (items, _) = self.list(rt, ns, sel, None, false)?;
        let mut out = Vec::new();
        for item in items {
            let ins = meta_str(&item, "namespace").unwrap_or_default().to_string();
            let iname = meta_str(&item, "name").unwrap_or_default().to_string();
            match self.delete(rt, &ins, &iname, opts) {
                Ok(r) => out.push(r.object),
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    fn orphan_dependents(&mut self, owner_uid: &str) {
        let mut changes = Vec::new();
        for (key, objs) in &self.objects {
            for obj in objs.values() {
                let Some(refs) = meta(obj)
                    .and_then(|m| m.get("ownerReferences"))
                    .and_then(Value::as_array)
                else {
                    continue;
                };
                if refs
                    .iter()
                    .any(|r| r.get("uid").and_then(Value::as_str) == Some(owner_uid))
                {
                    let kept: Vec<Value> = refs
                        .iter()
                        .filter(|r| r.get("uid").and_then(Value::as_str) != Some(owner_uid))
                        .cloned()
                        .collect();
                    let mut new = obj.clone();
                    let m = meta_mut(&mut new);
                    if kept.is_empty() {
                        m.remove("ownerReferences");
                    } else {
                        m.insert("ownerReferences".into(), json!(kept));
                    }
                    changes.push((key.clone(), new, obj.clone()));
                }
            }
        }
        for (key, new, old) in changes {
            self.put(&key, new, Some(old));
        }
    }

    /// Opens a watch.
    pub fn watch(
        &mut self,
        rt: &ResourceType,
        ns: Option<&str>,
        sel: &Selectors,
        rv: Option<u64>,
        send_initial: bool,
    ) -> Result<WatchStart, ApiError> {
        let key = rt.storage_key();
        let mut initial = Vec::new();
        let mut replay = Vec::new();
        match rv {
            Some(n) if n > 0 && !send_initial => {
                if n < self.compacted {
                    self.stats.request("expired");
                    return Err(ApiError::expired(format!(
                        "too old resource version: {n} ({})",
                        self.compacted
                    )));
                }
                if n > self.rv {
                    return Err(ApiError::too_large_rv(n, self.rv));
                }
                replay = self
                    .history
                    .iter()
                    .filter(|e| e.rv > n && e.key == key)
                    .cloned()
                    .collect();
            }
            _ => {
                let (items, _) = self.list(rt, ns, sel, None, false)?;
                initial = items;
            }
        }
        let (tx, rx) = unbounded_channel();
        self.watchers.push(tx);
        Ok(WatchStart {
            initial,
            replay,
            rx,
            start_rv: self.rv,
        })
    }

    /// One garbage-collection / namespace-cleanup pass; returns the number of changes.
    pub fn gc_pass(&mut self) -> usize {
        let before = self.rv;
        // uid -> (namespaced, namespace)
        let mut owners: HashMap<String, (bool, String)> = HashMap::new();
        for (key, objs) in &self.objects {
            let namespaced = self.type_for_key(key).is_some_and(|t| t.namespaced);
            for ((ns, _), obj) in objs {
                if let Some(uid) = meta_str(obj, "uid") {
                    owners.insert(uid.to_string(), (namespaced, ns.clone()));
                }
            }
        }
        let mut to_delete: Vec<(StorageKey, String, String)> = Vec::new();
        let mut fg_done: Vec<(StorageKey, String, String)> = Vec::new();
        let mut dependents_of: HashMap<String, Vec<(StorageKey, String, String, bool)>> =
            HashMap::new();
        for (key, objs) in &self.objects {
            let dep_namespaced = self.type_for_key(key).is_some_and(|t| t.namespaced);
            for ((ns, name), obj) in objs {
                let Some(refs) = meta(obj)
                    .and_then(|m| m.get("ownerReferences"))
                    .and_then(Value::as_array)
                    .filter(|r| !r.is_empty())
                else {
                    continue;
                };
                let deleting = meta_str(obj, "deletionTimestamp").is_some();
                let mut all_absent = true;
                for r in refs {
                    let uid = r.get("uid").and_then(Value::as_str).unwrap_or_default();
                    dependents_of.entry(uid.to_string()).or_default().push((
                        key.clone(),
                        ns.clone(),
                        name.clone(),
                        deleting,
                    ));
                    let present = match owners.get(uid) {
                        None => false,
                        // a cluster-scoped dependent cannot be owned by a namespaced owner:
                        // the reference is unresolvable and never collected
                        Some((true, _)) if !dep_namespaced => true,
                        Some((true, owner_ns)) => owner_ns == ns,
                        Some((false, _)) => true,
                    };
                    if present {
                        all_absent = false;
                    }
                }
                if all_absent && !deleting {
                    to_delete.push((key.clone(), ns.clone(), name.clone()));
                }
            }
        }
        // foreground deletion: delete dependents, then drop the finalizer
        for (key, objs) in &self.objects {
            for ((ns, name), obj) in objs {
                if meta_str(obj, "deletionTimestamp").is_none()
                    || !finalizers(obj).iter().any(|f| f == "foregroundDeletion")
                {
                    continue;
                }
                let uid = meta_str(obj, "uid").unwrap_or_default();
                match dependents_of.get(uid) {
                    Some(deps) if !deps.is_empty() => {
                        for (dk, dns, dn, deleting) in deps {
                            if !deleting {
                                to_delete.push((dk.clone(), dns.clone(), dn.clone()));
                            }
                        }
                    }
                    _ => fg_done.push((key.clone(), ns.clone(), name.clone())),
                }
            }
        }
        // terminating namespaces
        let ns_key = StorageKey {
            group: String::new(),
            plural: "namespaces".into(),
        };
        let terminating: Vec<String> = self
            .objects
            .get(&ns_key)
            .map(|m| {
                m.values()
                    .filter(|o| meta_str(o, "deletionTimestamp").is_some())
                    .filter_map(|o| meta_str(o, "name").map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        let mut ns_empty = Vec::new();
        for ns in &terminating {
            let mut any = false;
            for (key, objs) in &self.objects {
                for ((ons, name), obj) in objs {
                    if ons == ns && !ons.is_empty() {
                        any = true;
                        if meta_str(obj, "deletionTimestamp").is_none() {
                            to_delete.push((key.clone(), ons.clone(), name.clone()));
                        }
                    }
                }
            }
            if !any {
                ns_empty.push(ns.clone());
            }
        }
        for (key, ns, name) in to_delete {
            if let Some(rt) = self.type_for_key(&key) {
                if let Err(e) = self.delete(&rt, &ns, &name, &DeleteOpts::default()) {
                    tracing::debug!(%e, %name, "garbage collection delete");
                } else {
                    tracing::debug!(group = %key.group, plural = %key.plural, %ns, %name, "garbage collected");
                }
            }
        }
        for (key, ns, name) in fg_done {
            self.drop_finalizer(&key, &ns, &name, "foregroundDeletion");
        }
        for ns in ns_empty {
            self.finalize_namespace(&ns);
        }
        (self.rv - before) as usize
    }

    fn drop_finalizer(&mut self, key: &StorageKey, ns: &str, name: &str, fin: &str) {
        let Some(rt) = self.type_for_key(key) else {
            return;
        };
        let Some(obj) = self.lookup(key, ns, name).cloned() else {
            return;
        };
        let kept: Vec<String> = finalizers(&obj).into_iter().filter(|f| f != fin).collect();
        let mut new = obj.clone();
        meta_mut(&mut new).insert("finalizers".into(), json!(kept));
        let opts = WriteOpts {
            dry_run: false,
            validation: FieldValidation::Ignore,
        };
        if let Err(e) = self.update(&rt, ns, name, Self::present(&rt, &new), Sub::Main, &opts) {
            tracing::warn!(%e, %name, "dropping finalizer {fin}");
        }
    }

    fn finalize_namespace(&mut self, ns: &str) {
        let key = StorageKey {
            group: String::new(),
            plural: "namespaces".into(),
        };
        let Some(obj) = self.lookup(&key, "", ns).cloned() else {
            return;
        };
        let mut new = obj.clone();
        if let Some(Value::Object(spec)) = new.get_mut("spec") {
            spec.insert("finalizers".into(), json!([]));
        }
        if finalizers(&new).is_empty() {
            self.remove(&key, "", ns);
        } else if new != obj {
            self.put(&key, new, Some(obj));
        }
    }
}

fn namespace_spec_finalizers_pending(rt: &ResourceType, obj: &Value) -> bool {
    matches!(rt.hooks, KindHooks::Namespace)
        && obj
            .get("spec")
            .and_then(|s| s.get("finalizers"))
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty())
}

impl Default for Store {
    fn default() -> Self {
        Self::new()
    }
}

/// Secret defaulting and `stringData` folding: `stringData` entries are base64-encoded
/// into `data`, and `type` defaults to `Opaque` (kube-apiserver's `SetDefaults_Secret`).
fn fold_string_data(obj: &mut Value) {
    let Value::Object(root) = obj else { return };
    if root.get("type").is_none_or(|t| t.is_null() || t == "") {
        root.insert("type".into(), json!("Opaque"));
    }
    let Some(Value::Object(sd)) = root.remove("stringData") else {
        return;
    };
    let data = root.entry("data").or_insert_with(|| json!({}));
    if let Value::Object(d) = data {
        for (k, v) in sd {
            if let Some(s) = v.as_str() {
                d.insert(k, json!(crate::smp::base64(s.as_bytes())));
            }
        }
    }
}

fn validate_pod_spec(rt: &ResourceType, obj: &Value, name: &str) -> Result<(), ApiError> {
    let mut errs = Vec::new();
    match obj
        .get("spec")
        .and_then(|s| s.get("containers"))
        .and_then(Value::as_array)
    {
        Some(cs) if !cs.is_empty() => {
            for (i, c) in cs.iter().enumerate() {
                if c.get("name")
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
                {
                    errs.push(FieldError::required(
                        format!("spec.containers[{i}].name"),
                        "",
                    ));
                }
                if c.get("image")
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
                {
                    errs.push(FieldError::required(
                        format!("spec.containers[{i}].image"),
                        "",
                    ));
                }
            }
        }
        _ => errs.push(FieldError::required("spec.containers", "")),
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(&rt.group, &rt.kind, name, &errs))
    }
}

fn pod_spec_immutable(
    rt: &ResourceType,
    existing: &Value,
    cand: &Value,
    name: &str,
) -> Result<(), ApiError> {
    let norm = |v: &Value| {
        let mut s = v.get("spec").cloned().unwrap_or(Value::Null);
        if let Value::Object(m) = &mut s {
            for k in ["activeDeadlineSeconds", "tolerations", "schedulingGates"] {
                m.remove(k);
            }
            for list in ["containers", "initContainers"] {
                if let Some(Value::Array(cs)) = m.get_mut(list) {
                    for c in cs {
                        if let Value::Object(c) = c {
                            c.remove("image");
                        }
                    }
                }
            }
        }
        s
    };
    if norm(existing) == norm(cand) {
        Ok(())
    } else {
        Err(ApiError::invalid(
            &rt.group,
            &rt.kind,
            name,
            &[FieldError::forbidden(
                "spec",
                "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)",
            )],
        ))
    }
}

/// Kinds defined by a CRD object (one per served version), validating the CRD.
fn crd_types(crd: &Value, name: &str) -> Result<Vec<ResourceType>, ApiError> {
    let g = "apiextensions.k8s.io";
    let kind = "CustomResourceDefinition";
    let spec = crd.get("spec").cloned().unwrap_or(Value::Null);
    let s = |v: &Value, k: &str| {
        v.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let group = s(&spec, "group");
    let names = spec.get("names").cloned().unwrap_or(Value::Null);
    let plural = s(&names, "plural");
    let ckind = s(&names, "kind");
    let scope = s(&spec, "scope");
    let mut errs = Vec::new();
    if group.is_empty() {
        errs.push(FieldError::required("spec.group", ""));
    } else if !group.contains('.') || !is_dns1123_subdomain(&group) {
        errs.push(FieldError::invalid(
            "spec.group",
            json!(group),
            "should be a domain with at least one dot",
        ));
    }
    if plural.is_empty() {
        errs.push(FieldError::required("spec.names.plural", ""));
    } else if !is_dns1123_label(&plural) {
        errs.push(FieldError::invalid(
            "spec.names.plural",
            json!(plural),
            LABEL_MSG,
        ));
    }
    if ckind.is_empty() {
        errs.push(FieldError::required("spec.names.kind", ""));
    }
    if scope != "Namespaced" && scope != "Cluster" {
        errs.push(FieldError::not_supported(
            "spec.scope",
            json!(scope),
            &[json!("Cluster"), json!("Namespaced")],
        ));
    }
    if name != format!("{plural}.{group}") {
        errs.push(FieldError::invalid(
            "metadata.name",
            json!(name),
            "must be spec.names.plural+\".\"+spec.group",
        ));
    }
    let versions = spec
        .get("versions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if versions.is_empty() {
        errs.push(FieldError::required(
            "spec.versions",
            "must have exactly one version marked as storage version",
        ));
    }
    let storage = versions
        .iter()
        .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        .count();
    if !versions.is_empty() && storage != 1 {
        errs.push(FieldError::invalid(
            "spec.versions",
            json!(storage),
            "must have exactly one version marked as storage version",
        ));
    }
    if !errs.is_empty() {
        return Err(ApiError::invalid(g, kind, name, &errs));
    }
    let singular = {
        let s = s(&names, "singular");
        if s.is_empty() {
            ckind.to_lowercase()
        } else {
            s
        }
    };
    let short: Vec<String> = names
        .get("shortNames")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();
    let mut out = Vec::new();
    for v in versions {
        if v.get("served").and_then(Value::as_bool) != Some(true) {
            continue;
        }
        let mut rt = ResourceType::new(
            &group,
            s(&v, "name"),
            &ckind,
            &plural,
            scope == "Namespaced",
        );
        rt.singular = singular.clone();
        rt.short_names = short.clone();
        rt.return_deleted_object = true;
        let subs = v.get("subresources");
        if subs.and_then(|x| x.get("status")).is_some() {
            rt.status_subresource = true;
            rt.create_resets_status = true;
        }
        if subs.and_then(|x| x.get("scale")).is_some() {
            tracing::warn!(%name, "the scale subresource is not implemented by the API server stand-in");
        }
        rt.schema = v
            .get("schema")
            .and_then(|x| x.get("openAPIV3Schema"))
            .cloned();
        if let Some(schema) = &rt.schema
            && schema.to_string().contains("x-kubernetes-validations")
        {
            tracing::warn!(target: crate::CEL_NOT_EVALUATED, %name, "x-kubernetes-validations (CEL) rules are not evaluated by the API server stand-in");
        }
        rt.printer_columns = v
            .get("additionalPrinterColumns")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(PrinterColumn::from_crd).collect())
            .unwrap_or_default();
        if rt.printer_columns.is_empty() {
            // the CRD defaulting of kube-apiserver
            rt.printer_columns = vec![PrinterColumn::new(
                "Age",
                "date",
                ".metadata.creationTimestamp",
            )];
        }
        rt.field_selectors = v
            .get("selectableFields")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|f| f.get("jsonPath").and_then(Value::as_str))
                    .map(|p| {
                        let p = p.trim_start_matches('.').to_string();
                        (p.clone(), p)
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.push(rt);
    }
    Ok(out)
}
