//! `/openapi/v3`: the discovery index and one OpenAPI 3.0 document per group-version.
//!
//! What kubectl reads from them:
//! - `kubectl apply|create -f` (default `--validate=strict`) asks whether the PATCH
//!   operation of the object's GVK (matched through `x-kubernetes-group-version-kind`)
//!   takes the `fieldValidation` query parameter; it does, so kubectl leaves validation
//!   to the server (`fieldValidation=Strict`, which the stand-in implements).
//! - `kubectl apply` on an existing object computes a strategic merge patch from the
//!   document only when the PATCH operation lists `application/strategic-merge-patch+json`;
//!   it is not listed, so kubectl uses its compiled-in types for built-in kinds and a
//!   JSON merge patch for custom resources.
//! - `kubectl explain` finds the kind's path, takes its GVK, and renders the schema in
//!   `components.schemas` carrying the same GVK.
//!
//! Custom resources get their CRD's `openAPIV3Schema`; built-in kinds get a minimal
//! schema (apiVersion, kind, metadata and a few top-level fields).

use std::hash::{DefaultHasher, Hash, Hasher};

use serde_json::{Map, Value, json};

use crate::types::ResourceType;

const META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1";

fn meta_ref(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{META}.{name}")})
}

/// `api/v1` or `apis/<group>/<version>`: the index key of a group-version.
fn gv_key(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// Schema name prefix: `io.k8s.api.core.v1`, `io.k8s.api.coordination.v1`,
/// `dev.steward.v1alpha1` (reversed group, as kube-apiserver names CRD schemas).
fn schema_prefix(group: &str, version: &str) -> String {
    if group.is_empty() {
        return format!("io.k8s.api.core.{version}");
    }
    if group == "apiextensions.k8s.io" {
        return format!("io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.{version}");
    }
    if let Some(first) = group.strip_suffix(".k8s.io") {
        return format!("io.k8s.api.{first}.{version}");
    }
    let mut parts: Vec<&str> = group.split('.').collect();
    parts.reverse();
    format!("{}.{version}", parts.join("."))
}

fn group_versions(types: &[ResourceType]) -> Vec<(String, String)> {
    let mut gvs: Vec<(String, String)> = types
        .iter()
        .map(|t| (t.group.clone(), t.version.clone()))
        .collect();
    gvs.sort();
    gvs.dedup();
    gvs
}

fn hash(doc: &Value) -> String {
    let mut h = DefaultHasher::new();
    doc.to_string().hash(&mut h);
    format!("{:016X}", h.finish())
}

/// The `/openapi/v3` index: every served group-version with a hashed URL.
pub fn index(types: &[ResourceType]) -> Value {
    let mut paths = Map::new();
    for (g, v) in group_versions(types) {
        if let Some(doc) = document(types, &g, &v) {
            let key = gv_key(&g, &v);
            paths.insert(
                key.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{key}?hash={}", hash(&doc))}),
            );
        }
    }
    json!({ "paths": paths })
}

fn gvk(rt: &ResourceType) -> Value {
    json!({"group": rt.group, "version": rt.version, "kind": rt.kind})
}

fn param(name: &str, location: &str, ty: &str, description: &str) -> Value {
    let mut p = json!({"name": name, "in": location, "description": description,
                       "schema": {"type": ty, "uniqueItems": true}});
    if location == "path" {
        p["required"] = json!(true);
    }
    p
}

fn write_params() -> Vec<Value> {
    vec![
        param(
            "dryRun",
            "query",
            "string",
            "When present, indicates that modifications should not be persisted. Valid value: All",
        ),
        param(
            "fieldManager",
            "query",
            "string",
            "fieldManager is a name associated with the actor or entity that is making these changes.",
        ),
        param(
            "fieldValidation",
            "query",
            "string",
            "fieldValidation instructs the server on how to handle objects in the request containing unknown or duplicate fields. Valid values are: Ignore, Warn (default), Strict.",
        ),
    ]
}

fn list_params() -> Vec<Value> {
    [
        ("labelSelector", "A selector to restrict the list of returned objects by their labels."),
        ("fieldSelector", "A selector to restrict the list of returned objects by their fields."),
        ("resourceVersion", "resourceVersion sets a constraint on what resource versions a request may be served from."),
        ("resourceVersionMatch", "resourceVersionMatch determines how resourceVersion is applied to list calls."),
        ("watch", "Watch for changes to the described resources and return them as a stream of add, update, and remove notifications."),
        ("allowWatchBookmarks", "allowWatchBookmarks requests watch events with type \"BOOKMARK\"."),
        ("sendInitialEvents", "`sendInitialEvents=true` may be set together with `watch=true`."),
        ("timeoutSeconds", "Timeout for the list/watch call."),
        ("limit", "limit is a maximum number of responses to return for a list call."),
    ]
    .iter()
    .map(|(n, d)| param(n, "query", "string", d))
    .collect()
}

fn body(content_types: &[&str], schema: &Value) -> Value {
    let content: Map<String, Value> = content_types
        .iter()
        .map(|c| ((*c).to_string(), json!({"schema": schema})))
        .collect();
    json!({"content": content, "required": true})
}

fn ok(schema: &Value, code: &str) -> Value {
    json!({code: {"description": "OK", "content": {
        "application/json": {"schema": schema},
        "application/yaml": {"schema": schema}
    }}})
}

/// Path of a kind: `/api/v1/namespaces/{namespace}/pods` / `/apis/g/v/nodes`.
fn base_path(rt: &ResourceType) -> String {
    let root = if rt.group.is_empty() {
        format!("/api/{}", rt.version)
    } else {
        format!("/apis/{}/{}", rt.group, rt.version)
    };
    if rt.namespaced {
        format!("{root}/namespaces/{{namespace}}/{}", rt.plural)
    } else {
        format!("{root}/{}", rt.plural)
    }
}

fn op(
    rt: &ResourceType,
    action: &str,
    op_id: &str,
    description: String,
    params: Vec<Value>,
    request: Option<Value>,
    responses: Value,
) -> Value {
    let mut o = json!({
        "tags": [rt.api_version()],
        "description": description,
        "operationId": op_id,
        "parameters": params,
        "responses": responses,
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": gvk(rt),
    });
    if let Some(r) = request {
        o["requestBody"] = r;
    }
    o
}

fn paths_of(rt: &ResourceType, prefix: &str, paths: &mut Map<String, Value>) {
    let obj = json!({"$ref": format!("#/components/schemas/{prefix}.{}", rt.kind)});
    let list = json!({"$ref": format!("#/components/schemas/{prefix}.{}List", rt.kind)});
    let status = meta_ref("Status");
    let scope = if rt.namespaced { "Namespaced" } else { "" };
    let k = &rt.kind;
    let ns_param = param(
        "namespace",
        "path",
        "string",
        "object name and auth scope, such as for teams and projects",
    );
    let name_param = param("name", "path", "string", &format!("name of the {k}"));
    let patch_types = [
        "application/json-patch+json",
        "application/merge-patch+json",
    ];
    let base = base_path(rt);
    let mut scoped = Vec::new();
    if rt.namespaced {
        scoped.push(ns_param.clone());
    }

    let mut collection = Map::new();
    collection.insert(
        "get".into(),
        op(
            rt,
            "list",
            &format!("list{scope}{k}"),
            format!("list or watch objects of kind {k}"),
            list_params(),
            None,
            ok(&list, "200"),
        ),
    );
    collection.insert(
        "post".into(),
        op(
            rt,
            "post",
            &format!("create{scope}{k}"),
            format!("create a {k}"),
            write_params(),
            Some(body(&["application/json", "application/yaml"], &obj)),
            ok(&obj, "201"),
        ),
    );
    collection.insert(
        "delete".into(),
        op(
            rt,
            "deletecollection",
            &format!("deleteCollection{scope}{k}"),
            format!("delete collection of {k}"),
            list_params(),
            None,
            ok(&status, "200"),
        ),
    );
    collection.insert("parameters".into(), json!(scoped));
    paths.insert(base.clone(), Value::Object(collection));

    let mut item_params = scoped.clone();
    item_params.push(name_param);
    let mut item = Map::new();
    item.insert(
        "get".into(),
        op(
            rt,
            "get",
            &format!("read{scope}{k}"),
            format!("read the specified {k}"),
            Vec::new(),
            None,
            ok(&obj, "200"),
        ),
    );
    item.insert(
        "put".into(),
        op(
            rt,
            "put",
            &format!("replace{scope}{k}"),
            format!("replace the specified {k}"),
            write_params(),
            Some(body(&["application/json", "application/yaml"], &obj)),
            ok(&obj, "200"),
        ),
    );
    item.insert(
        "patch".into(),
        op(
            rt,
            "patch",
            &format!("patch{scope}{k}"),
            format!("partially update the specified {k}"),
            write_params(),
            Some(body(&patch_types, &meta_ref("Patch"))),
            ok(&obj, "200"),
        ),
    );
    item.insert(
        "delete".into(),
        op(
            rt,
            "delete",
            &format!("delete{scope}{k}"),
            format!("delete a {k}"),
            vec![
                param(
                    "gracePeriodSeconds",
                    "query",
                    "integer",
                    "The duration in seconds before the object should be deleted.",
                ),
                param(
                    "propagationPolicy",
                    "query",
                    "string",
                    "Whether and how garbage collection will be performed.",
                ),
            ],
            None,
            ok(&status, "200"),
        ),
    );
    item.insert("parameters".into(), json!(item_params));
    paths.insert(format!("{base}/{{name}}"), Value::Object(item));

    if rt.status_subresource {
        let mut st = Map::new();
        st.insert(
            "get".into(),
            op(
                rt,
                "get",
                &format!("read{scope}{k}Status"),
                format!("read status of the specified {k}"),
                Vec::new(),
                None,
                ok(&obj, "200"),
            ),
        );
        st.insert(
            "put".into(),
            op(
                rt,
                "put",
                &format!("replace{scope}{k}Status"),
                format!("replace status of the specified {k}"),
                write_params(),
                Some(body(&["application/json", "application/yaml"], &obj)),
                ok(&obj, "200"),
            ),
        );
        st.insert(
            "patch".into(),
            op(
                rt,
                "patch",
                &format!("patch{scope}{k}Status"),
                format!("partially update status of the specified {k}"),
                write_params(),
                Some(body(&patch_types, &meta_ref("Patch"))),
                ok(&obj, "200"),
            ),
        );
        st.insert("parameters".into(), json!(item_params));
        paths.insert(format!("{base}/{{name}}/status"), Value::Object(st));
    }
}

fn string(description: &str) -> Value {
    json!({"type": "string", "description": description})
}

fn string_map(description: &str) -> Value {
    json!({"type": "object", "description": description,
           "additionalProperties": {"type": "string", "default": ""}})
}

fn open_object(description: &str) -> Value {
    json!({"type": "object", "description": description,
           "x-kubernetes-preserve-unknown-fields": true})
}

/// Top-level fields of the minimal built-in schemas (besides apiVersion/kind/metadata).
fn builtin_fields(rt: &ResourceType) -> Vec<(&'static str, Value)> {
    match (rt.group.as_str(), rt.kind.as_str()) {
        ("", "ConfigMap") => vec![
            ("data", string_map("Data contains the configuration data.")),
            (
                "binaryData",
                json!({"type": "object", "description": "BinaryData contains the binary data.",
                       "additionalProperties": {"type": "string", "format": "byte"}}),
            ),
            (
                "immutable",
                json!({"type": "boolean", "description": "Immutable, if set to true, ensures that data stored in the ConfigMap cannot be updated."}),
            ),
        ],
        ("", "Secret") => vec![
            (
                "data",
                json!({"type": "object", "description": "Data contains the secret data (base64).",
                       "additionalProperties": {"type": "string", "format": "byte"}}),
            ),
            (
                "stringData",
                string_map("stringData allows specifying non-binary secret data in string form."),
            ),
            (
                "type",
                string("Used to facilitate programmatic handling of secret data."),
            ),
            (
                "immutable",
                json!({"type": "boolean", "description": "Immutable, if set to true, ensures that data stored in the Secret cannot be updated."}),
            ),
        ],
        ("", "Pod") => vec![
            (
                "spec",
                json!({"type": "object", "description": "Specification of the desired behavior of the pod.",
                       "x-kubernetes-preserve-unknown-fields": true,
                       "properties": {
                           "containers": {"type": "array", "description": "List of containers belonging to the pod.",
                                          "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                                                    "properties": {"name": string("Name of the container."),
                                                                   "image": string("Container image name.")},
                                                    "required": ["name"]}},
                           "nodeName": string("NodeName indicates in which node this pod is scheduled.")
                       },
                       "required": ["containers"]}),
            ),
            (
                "status",
                open_object("Most recently observed status of the pod."),
            ),
        ],
        ("" | "events.k8s.io", "Event") => vec![
            ("reason", string("Short, machine understandable reason.")),
            ("type", string("Type of this event (Normal, Warning).")),
        ],
        _ => vec![
            (
                "spec",
                open_object(&format!("Desired state of the {}.", rt.kind)),
            ),
            (
                "status",
                open_object(&format!("Observed state of the {}.", rt.kind)),
            ),
        ],
    }
}

fn kind_schema(rt: &ResourceType) -> Value {
    let type_meta = [
        (
            "apiVersion",
            string("APIVersion defines the versioned schema of this representation of an object."),
        ),
        (
            "kind",
            string("Kind is a string value representing the REST resource this object represents."),
        ),
        (
            "metadata",
            json!({"description": "Standard object's metadata.", "allOf": [meta_ref("ObjectMeta")], "default": {}}),
        ),
    ];
    let mut schema = match &rt.schema {
        Some(s) => s.clone(),
        None => {
            let props: Map<String, Value> = builtin_fields(rt)
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect();
            json!({
                "type": "object",
                "description": format!("{} (minimal schema served by the steward API server stand-in)", rt.kind),
                "properties": props,
                "x-kubernetes-preserve-unknown-fields": rt.group.is_empty() && rt.kind == "Event",
            })
        }
    };
    if let Value::Object(m) = &mut schema {
        m.entry("type").or_insert(json!("object"));
        let props = m.entry("properties").or_insert_with(|| json!({}));
        if let Value::Object(p) = props {
            for (k, v) in type_meta {
                // metadata is always ObjectMeta, as kube-apiserver publishes it
                if k == "metadata" || !p.contains_key(k) {
                    p.insert(k.to_string(), v);
                }
            }
        }
        m.insert("x-kubernetes-group-version-kind".into(), json!([gvk(rt)]));
    }
    schema
}

fn list_schema(rt: &ResourceType, prefix: &str) -> Value {
    json!({
        "type": "object",
        "description": format!("{}List is a list of {}", rt.kind, rt.kind),
        "required": ["items"],
        "properties": {
            "apiVersion": string("APIVersion defines the versioned schema of this representation of an object."),
            "kind": string("Kind is a string value representing the REST resource this object represents."),
            "items": {"type": "array", "items": {"$ref": format!("#/components/schemas/{prefix}.{}", rt.kind)}},
            "metadata": {"allOf": [meta_ref("ListMeta")], "default": {}}
        },
        "x-kubernetes-group-version-kind": [{"group": rt.group, "version": rt.version, "kind": format!("{}List", rt.kind)}]
    })
}

fn meta_schemas() -> Vec<(String, Value)> {
    let s = |d: &str| string(d);
    vec![
        (
            format!("{META}.ObjectMeta"),
            json!({
                "type": "object",
                "description": "ObjectMeta is metadata that all persisted resources must have.",
                "properties": {
                    "name": s("Name must be unique within a namespace."),
                    "generateName": s("GenerateName is an optional prefix, used by the server, to generate a unique name ONLY IF the Name field has not been provided."),
                    "namespace": s("Namespace defines the space within which each name must be unique."),
                    "uid": s("UID is the unique in time and space value for this object."),
                    "resourceVersion": s("An opaque value that represents the internal version of this object."),
                    "generation": {"type": "integer", "format": "int64", "description": "A sequence number representing a specific generation of the desired state."},
                    "creationTimestamp": {"type": "string", "format": "date-time", "description": "CreationTimestamp is a timestamp representing the server time when this object was created."},
                    "deletionTimestamp": {"type": "string", "format": "date-time", "description": "DeletionTimestamp is RFC 3339 date and time at which this resource will be deleted."},
                    "deletionGracePeriodSeconds": {"type": "integer", "format": "int64", "description": "Number of seconds allowed for this object to gracefully terminate."},
                    "labels": string_map("Map of string keys and values that can be used to organize and categorize objects."),
                    "annotations": string_map("Annotations is an unstructured key value map stored with a resource."),
                    "finalizers": {"type": "array", "items": {"type": "string", "default": ""}, "description": "Must be empty before the object is deleted from the registry.", "x-kubernetes-list-type": "set"},
                    "ownerReferences": {"type": "array", "description": "List of objects depended by this object.",
                        "items": {"type": "object", "required": ["apiVersion", "kind", "name", "uid"],
                                  "properties": {"apiVersion": s("API version of the referent."), "kind": s("Kind of the referent."),
                                                 "name": s("Name of the referent."), "uid": s("UID of the referent."),
                                                 "controller": {"type": "boolean"}, "blockOwnerDeletion": {"type": "boolean"}}}},
                    "managedFields": {"type": "array", "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}
                }
            }),
        ),
        (
            format!("{META}.ListMeta"),
            json!({"type": "object", "description": "ListMeta describes metadata that synthetic resources must have.",
                   "properties": {"resourceVersion": s("String that identifies the server's internal version of this object."),
                                  "continue": s("continue may be set if the user set a limit on the number of items returned.")}}),
        ),
        (
            format!("{META}.Status"),
            json!({"type": "object", "description": "Status is a return value for calls that don't return other objects.",
                   "properties": {"apiVersion": s("APIVersion"), "kind": s("Kind"), "status": s("Status of the operation."),
                                  "message": s("A human-readable description of the status of this operation."),
                                  "reason": s("A machine-readable description of why this operation is in the \"Failure\" status."),
                                  "code": {"type": "integer", "format": "int32"},
                                  "details": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
                   "x-kubernetes-group-version-kind": [{"group": "", "kind": "Status", "version": "v1"}]}),
        ),
        (
            format!("{META}.Patch"),
            json!({"type": "object", "description": "Patch is provided to give a concrete name and type to the Kubernetes PATCH request body."}),
        ),
    ]
}

/// The OpenAPI 3.0 document of one group-version (`None` when nothing is served there).
pub fn document(types: &[ResourceType], group: &str, version: &str) -> Option<Value> {
    let mine: Vec<&ResourceType> = types
        .iter()
        .filter(|t| t.group == group && t.version == version)
        .collect();
    if mine.is_empty() {
        return None;
    }
    let prefix = schema_prefix(group, version);
    let mut paths = Map::new();
    let mut schemas: Map<String, Value> = meta_schemas().into_iter().collect();
    for rt in &mine {
        paths_of(rt, &prefix, &mut paths);
        schemas.insert(format!("{prefix}.{}", rt.kind), kind_schema(rt));
        schemas.insert(
            format!("{prefix}.{}List", rt.kind),
            list_schema(rt, &prefix),
        );
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.34.0"},
        "paths": paths,
        "components": {"schemas": schemas}
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_keys() {
        assert_eq!(gv_key("", "v1"), "api/v1");
        assert_eq!(
            gv_key("steward.dev", "v1alpha1"),
            "apis/steward.dev/v1alpha1"
        );
        assert_eq!(schema_prefix("", "v1"), "io.k8s.api.core.v1");
        assert_eq!(
            schema_prefix("coordination.k8s.io", "v1"),
            "io.k8s.api.coordination.v1"
        );
        assert_eq!(
            schema_prefix("steward.dev", "v1alpha1"),
            "dev.steward.v1alpha1"
        );
    }

    #[test]
    fn every_patch_operation_takes_field_validation() {
        let types = crate::types::builtins();
        for (g, v) in group_versions(&types) {
            let Some(doc) = document(&types, &g, &v) else {
                panic!("no document for {g}/{v}");
            };
            let Some(paths) = doc["paths"].as_object() else {
                panic!("no paths for {g}/{v}");
            };
            for (p, item) in paths {
                if let Some(patch) = item.get("patch") {
                    let params = patch["parameters"].as_array().cloned().unwrap_or_default();
                    assert!(params.iter().any(|x| x["name"] == "fieldValidation"), "{p}");
                    assert!(patch["x-kubernetes-group-version-kind"].is_object(), "{p}");
                }
            }
        }
    }
}
