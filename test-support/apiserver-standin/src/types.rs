//! Resource type registry entries and the built-in kinds.

use serde_json::Value;

/// Per-kind behaviour that Kubernetes implements specially.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KindHooks {
    /// No special behaviour.
    #[default]
    Generic,
    /// core/v1 Pod: defaulting, graceful deletion, immutable spec.
    Pod,
    /// core/v1 Namespace: `kubernetes` finalizer, phase, content cleanup.
    Namespace,
    /// core/v1 Secret: `stringData` folded into `data`.
    Secret,
    /// apiextensions.k8s.io/v1 CustomResourceDefinition: registers kinds.
    Crd,
}

/// A served kind: group/version/kind, URL plural, scope and behaviour flags.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceType {
    /// API group ("" for core).
    pub group: String,
    /// Version (`v1`, `v1alpha1`).
    pub version: String,
    /// Kind (`Pod`).
    pub kind: String,
    /// URL plural (`pods`).
    pub plural: String,
    /// Singular name for discovery (lowercase kind when empty).
    pub singular: String,
    /// Short names for discovery.
    pub short_names: Vec<String>,
    /// Namespaced (true) or cluster-scoped (false).
    pub namespaced: bool,
    /// Whether `/status` exists (and the main resource ignores status).
    pub status_subresource: bool,
    /// openAPIV3Schema (CRDs): prune, default and validate on write.
    pub schema: Option<Value>,
    /// Extra field-selector labels (label, dotted JSON path) besides
    /// `metadata.name` / `metadata.namespace`.
    pub field_selectors: Vec<(String, String)>,
    /// PUT to a missing object creates it (Lease, Event).
    pub allow_create_on_update: bool,
    /// DELETE answers with the deleted object instead of a `Status`.
    pub return_deleted_object: bool,
    /// Whether create drops a client-supplied `status` (status-subresource kinds except Node).
    pub create_resets_status: bool,
    /// Accepts `application/strategic-merge-patch+json` (built-in kinds only, as in
    /// Kubernetes; custom resources answer 415).
    pub strategic_merge: bool,
    /// Special per-kind behaviour.
    pub hooks: KindHooks,
    /// Server-side printing columns (`kubectl get`) after NAME: a CRD version's
    /// `additionalPrinterColumns` (defaulted to an `Age` column, as kube-apiserver does).
    /// Empty for built-in kinds (their columns are built in) and for kinds registered
    /// without columns (kube-apiserver's default table: NAME, CREATED AT).
    pub printer_columns: Vec<PrinterColumn>,
}

/// One `additionalPrinterColumns` entry of a CRD version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrinterColumn {
    /// Column header (`Capacity`); kubectl prints it upper-cased.
    pub name: String,
    /// OpenAPI type: `integer`, `number`, `string`, `boolean` or `date` (rendered as an
    /// age such as `5m`).
    pub column_type: String,
    /// OpenAPI format (`name` marks the name column).
    pub format: String,
    /// Description.
    pub description: String,
    /// 0: shown by `kubectl get`; above 0: only by `kubectl get -o wide`.
    pub priority: i64,
    /// Simple JSONPath into the object (`.spec.capacity`, `.status.nodes[0]`).
    pub json_path: String,
}

impl PrinterColumn {
    /// A priority-0 column without format or description.
    pub fn new(
        name: impl Into<String>,
        column_type: impl Into<String>,
        json_path: impl Into<String>,
    ) -> Self {
        Self {
            name: name.into(),
            column_type: column_type.into(),
            format: String::new(),
            description: String::new(),
            priority: 0,
            json_path: json_path.into(),
        }
    }

    /// Parses one `additionalPrinterColumns` entry of a CRD (`None` without name or path).
    pub fn from_crd(v: &Value) -> Option<Self> {
        let s = |k: &str| {
            v.get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let (name, json_path) = (s("name"), s("jsonPath"));
        if name.is_empty() || json_path.is_empty() {
            return None;
        }
        Some(Self {
            name,
            column_type: s("type"),
            format: s("format"),
            description: s("description"),
            priority: v.get("priority").and_then(Value::as_i64).unwrap_or(0),
            json_path,
        })
    }
}

impl ResourceType {
    /// A generic kind; `plural` and `singular` are given explicitly.
    pub fn new(
        group: impl Into<String>,
        version: impl Into<String>,
        kind: impl Into<String>,
        plural: impl Into<String>,
        namespaced: bool,
    ) -> Self {
        let kind = kind.into();
        Self {
            group: group.into(),
            version: version.into(),
            singular: kind.to_lowercase(),
            kind,
            plural: plural.into(),
            short_names: Vec::new(),
            namespaced,
            status_subresource: false,
            schema: None,
            field_selectors: Vec::new(),
            allow_create_on_update: false,
            return_deleted_object: false,
            create_resets_status: false,
            strategic_merge: false,
            hooks: KindHooks::Generic,
            printer_columns: Vec::new(),
        }
    }

    /// Enables the status subresource (and create dropping status).
    pub fn with_status(mut self) -> Self {
        self.status_subresource = true;
        self.create_resets_status = true;
        self
    }

    /// Sets the openAPIV3Schema.
    pub fn with_schema(mut self, schema: Value) -> Self {
        self.schema = Some(schema);
        self
    }

    /// `apiVersion` string (`v1`, `steward.dev/v1alpha1`).
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Storage key shared by all versions of a group/resource.
    pub fn storage_key(&self) -> StorageKey {
        StorageKey {
            group: self.group.clone(),
            plural: self.plural.clone(),
        }
    }

    /// Every supported field-selector label with its JSON path.
    pub fn supported_fields(&self) -> Vec<(String, String)> {
        let mut v = vec![
            ("metadata.name".to_string(), "metadata.name".to_string()),
            (
                "metadata.namespace".to_string(),
                "metadata.namespace".to_string(),
            ),
        ];
        v.extend(self.field_selectors.iter().cloned());
        v
    }
}

/// Group + plural: storage identity of a resource (versions share storage).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StorageKey {
    /// API group.
    pub group: String,
    /// Plural.
    pub plural: String,
}

fn fields(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

fn same(names: &[&str]) -> Vec<(String, String)> {
    names
        .iter()
        .map(|n| (n.to_string(), n.to_string()))
        .collect()
}

/// The kinds every stand-in serves from the start.
pub fn builtins() -> Vec<ResourceType> {
    let mut pod = ResourceType::new("", "v1", "Pod", "pods", true).with_status();
    pod.short_names = vec!["po".into()];
    pod.field_selectors = same(&[
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    ]);
    pod.return_deleted_object = true;
    pod.hooks = KindHooks::Pod;

    let mut node = ResourceType::new("", "v1", "Node", "nodes", false).with_status();
    node.create_resets_status = false;
    node.short_names = vec!["no".into()];
    node.field_selectors = same(&["spec.unschedulable"]);

    let mut ns = ResourceType::new("", "v1", "Namespace", "namespaces", false).with_status();
    ns.create_resets_status = false;
    ns.short_names = vec!["ns".into()];
    ns.field_selectors = same(&["status.phase"]);
    ns.hooks = KindHooks::Namespace;

    let mut cm = ResourceType::new("", "v1", "ConfigMap", "configmaps", true);
    cm.short_names = vec!["cm".into()];

    let mut secret = ResourceType::new("", "v1", "Secret", "secrets", true);
    secret.field_selectors = same(&["type"]);
    secret.hooks = KindHooks::Secret;

    let mut event = ResourceType::new("", "v1", "Event", "events", true);
    event.short_names = vec!["ev".into()];
    event.allow_create_on_update = true;
    event.field_selectors = fields(&[
        ("involvedObject.kind", "involvedObject.kind"),
        ("involvedObject.namespace", "involvedObject.namespace"),
        ("involvedObject.name", "involvedObject.name"),
        ("involvedObject.uid", "involvedObject.uid"),
        ("involvedObject.apiVersion", "involvedObject.apiVersion"),
        (
            "involvedObject.resourceVersion",
            "involvedObject.resourceVersion",
        ),
        ("involvedObject.fieldPath", "involvedObject.fieldPath"),
        ("reason", "reason"),
        ("reportingComponent", "reportingComponent"),
        ("source", "source.component"),
        ("type", "type"),
    ]);

    let mut events_v1 = ResourceType::new("events.k8s.io", "v1", "Event", "events", true);
    events_v1.allow_create_on_update = true;
    events_v1.field_selectors = fields(&[
        ("involvedObject.kind", "regarding.kind"),
        ("involvedObject.namespace", "regarding.namespace"),
        ("involvedObject.name", "regarding.name"),
        ("involvedObject.uid", "regarding.uid"),
        ("involvedObject.apiVersion", "regarding.apiVersion"),
        (
            "involvedObject.resourceVersion",
            "regarding.resourceVersion",
        ),
        ("involvedObject.fieldPath", "regarding.fieldPath"),
        ("reason", "reason"),
        ("reportingComponent", "reportingController"),
        ("source", "deprecatedSource.component"),
        ("type", "type"),
    ]);

    let mut lease = ResourceType::new("coordination.k8s.io", "v1", "Lease", "leases", true);
    lease.allow_create_on_update = true;

    let mut crd = ResourceType::new(
        "apiextensions.k8s.io",
        "v1",
        "CustomResourceDefinition",
        "customresourcedefinitions",
        false,
    )
    .with_status();
    crd.short_names = vec!["crd".into(), "crds".into()];
    crd.hooks = KindHooks::Crd;

    let mut all = vec![pod, node, ns, cm, secret, event, events_v1, lease, crd];
    for t in &mut all {
        t.strategic_merge = true;
    }
    all
}
