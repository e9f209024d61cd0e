//! CustomResourceDefinitions: registration, typed access, schema validation,
//! pruning, fieldValidation, status subresource, discovery, removal.
// fixture helpers outside #[test] functions panic on broken fixtures on purpose
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use kube::{CustomResource, CustomResourceExt, Discovery};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// A stand-in for steward's own kind, generated the way steward generates its CRD.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, JsonSchema)]
#[kube(
    group = "steward.dev",
    version = "v1alpha1",
    kind = "Configuration",
    namespaced,
    status = "ConfigurationStatus"
)]
pub struct ConfigurationSpec {
    pub capacity: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, JsonSchema, Default)]
pub struct ConfigurationStatus {
    pub ready: bool,
}

fn widget_crd() -> serde_json::Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wd"]},
            "scope": "Namespaced",
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "selectableFields": [{"jsonPath": ".spec.color"}],
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": {
                            "type": "object",
                            "required": ["size"],
                            "properties": {
                                "size": {"type": "integer", "minimum": 1, "maximum": 10},
                                "color": {"type": "string", "enum": ["red", "blue"]},
                                "name": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 8},
                                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                                "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                                "items": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
                                "comment": {"type": "string", "nullable": true}
                            }
                        },
                        "status": {"type": "object", "properties": {"phase": {"type": "string"}}}
                    }
                }}
            }]
        }
    })
}

fn widgets(s: &ApiServer) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.com", "v1", "Widget"),
        "widgets",
    );
    Api::namespaced_with(s.client(), "default", &ar)
}

fn widget(name: &str, spec: serde_json::Value) -> DynamicObject {
    serde_json::from_value(json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": name}, "spec": spec})).unwrap()
}

async fn install(s: &ApiServer) -> CustomResourceDefinition {
    let crds: Api<CustomResourceDefinition> = Api::all(s.client());
    let crd: CustomResourceDefinition = serde_json::from_value(widget_crd()).unwrap();
    crds.create(&PostParams::default(), &crd).await.unwrap()
}

#[tokio::test]
async fn typed_custom_resource_round_trip() {
    let s = ApiServer::start().await.unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(s.client());
    let created = crds
        .create(&PostParams::default(), &Configuration::crd())
        .await
        .unwrap();
    let conds = created.status.unwrap().conditions.unwrap();
    assert!(
        conds
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True")
    );
    let api: Api<Configuration> = Api::default_namespaced(s.client());
    let c = Configuration::new(
        "c1",
        ConfigurationSpec {
            capacity: 3,
            note: None,
        },
    );
    let made = api.create(&PostParams::default(), &c).await.unwrap();
    assert_eq!(made.spec.capacity, 3);
    assert!(
        made.status.is_none(),
        "create drops status with a status subresource"
    );
    let st = api
        .patch_status(
            "c1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"ready": true}})),
        )
        .await
        .unwrap();
    assert!(st.status.unwrap().ready);
    assert_eq!(
        st.metadata.generation,
        Some(1),
        "status writes do not bump generation"
    );
    let sp = api
        .patch(
            "c1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"capacity": 4}})),
        )
        .await
        .unwrap();
    assert_eq!(sp.metadata.generation, Some(2));
    assert_eq!(
        api.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );
    // the schema kube generated is enforced
    let bad = api
        .patch(
            "c1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"capacity": "lots"}})),
        )
        .await
        .unwrap_err();
    let e = api_err(bad);
    assert_eq!(e.code, 422);
    assert!(e.message.contains("spec.capacity"), "{}", e.message);
    s.shutdown().await;
}

#[tokio::test]
async fn schema_validation_reports_field_paths() {
    let s = ApiServer::start().await.unwrap();
    install(&s).await;
    let api = widgets(&s);
    let e = api_err(
        api.create(&PostParams::default(), &widget("w", json!({"size": 11, "color": "green", "name": "ABC", "items": ["a", "b", "c"], "labels": {"k": 1}})))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    assert!(
        e.message
            .starts_with("Widget.example.com \"w\" is invalid: ["),
        "{}",
        e.message
    );
    let fields: Vec<String> = e
        .details
        .unwrap()
        .causes
        .into_iter()
        .map(|c| c.field)
        .collect();
    for f in [
        "spec.size",
        "spec.color",
        "spec.name",
        "spec.items",
        "spec.labels.k",
    ] {
        assert!(
            fields.contains(&f.to_string()),
            "{f} missing from {fields:?}"
        );
    }
    let e = api_err(
        api.create(&PostParams::default(), &widget("w", json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    assert!(
        e.message.contains("spec.size: Required value"),
        "{}",
        e.message
    );
    // nothing was stored
    assert!(api.get_opt("w").await.unwrap().is_none());
    s.shutdown().await;
}

#[tokio::test]
async fn unknown_fields_pruned_strict_and_warn() {
    let s = ApiServer::start().await.unwrap();
    install(&s).await;
    let api = widgets(&s);
    let made = api
        .create(
            &PostParams::default(),
            &widget(
                "p",
                json!({"size": 1, "bogus": 1, "extra": {"free": {"form": true}}, "comment": null}),
            ),
        )
        .await
        .unwrap();
    assert!(
        made.data["spec"].get("bogus").is_none(),
        "unknown fields are pruned"
    );
    assert_eq!(
        made.data["spec"]["extra"]["free"]["form"], true,
        "preserve-unknown-fields keeps data"
    );
    assert!(
        made.data["spec"].get("comment").is_some(),
        "nullable keeps null"
    );
    let body = json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "strict"}, "spec": {"size": 1, "foo": 2}}).to_string();
    let r = raw(
        &s,
        "POST",
        "/apis/example.com/v1/namespaces/default/widgets?fieldValidation=Strict",
        Some("application/json"),
        &body,
    )
    .await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["message"],
        "strict decoding error: unknown field \"spec.foo\""
    );
    let r = raw(
        &s,
        "POST",
        "/apis/example.com/v1/namespaces/default/widgets?fieldValidation=Warn",
        Some("application/json"),
        &body,
    )
    .await;
    assert_eq!(r.status, 201);
    let warnings = r.header("warning");
    assert_eq!(warnings.len(), 1);
    assert!(
        warnings[0].starts_with("299 - ") && warnings[0].contains("unknown field \\\"spec.foo\\\""),
        "{warnings:?}"
    );
    assert!(r.json()["spec"].get("foo").is_none());
    // the typed client path: a Strict merge patch with an unknown field
    let e = api_err(
        api.patch(
            "p",
            &PatchParams::default().validation_strict(),
            &Patch::Merge(json!({"spec": {"nope": 1}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code, 400);
    assert!(
        e.message.contains("unknown field \"spec.nope\""),
        "{}",
        e.message
    );
    s.shutdown().await;
}

#[tokio::test]
async fn custom_resources_reject_strategic_merge_and_support_selectable_fields() {
    let s = ApiServer::start().await.unwrap();
    install(&s).await;
    let api = widgets(&s);
    api.create(
        &PostParams::default(),
        &widget("r", json!({"size": 1, "color": "red"})),
    )
    .await
    .unwrap();
    api.create(
        &PostParams::default(),
        &widget("b", json!({"size": 1, "color": "blue"})),
    )
    .await
    .unwrap();
    let e = api_err(
        api.patch(
            "r",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"size": 2}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code, 415);
    let reds = api
        .list(&ListParams::default().fields("spec.color=red"))
        .await
        .unwrap();
    assert_eq!(reds.items.len(), 1);
    assert_eq!(reds.items[0].metadata.name.as_deref(), Some("r"));
    let e = api_err(
        api.list(&ListParams::default().fields("spec.size=1"))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 400);
    s.shutdown().await;
}

#[tokio::test]
async fn discovery_and_crd_removal() {
    let s = ApiServer::start().await.unwrap();
    install(&s).await;
    let discovery = Discovery::new(s.client()).run().await.unwrap();
    let (ar, caps) = discovery
        .groups()
        .flat_map(|g| g.recommended_resources())
        .find(|(ar, _)| ar.kind == "Widget")
        .expect("Widget discovered");
    assert_eq!(ar.plural, "widgets");
    assert_eq!(caps.scope, kube::discovery::Scope::Namespaced);
    assert!(
        discovery
            .groups()
            .any(|g| g.name() == "coordination.k8s.io")
    );
    let core = s.client().list_core_api_resources("v1").await.unwrap();
    assert!(core.resources.iter().any(|r| r.name == "pods/status"));
    // deleting the CRD removes the kind and its objects
    let api = widgets(&s);
    api.create(&PostParams::default(), &widget("gone", json!({"size": 1})))
        .await
        .unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(s.client());
    crds.delete("widgets.example.com", &Default::default())
        .await
        .unwrap();
    let e = api_err(api.list(&ListParams::default()).await.unwrap_err());
    assert_eq!(e.code, 404);
    // invalid CRDs are refused
    let mut bad = widget_crd();
    bad["metadata"]["name"] = json!("wrong.example.com");
    let crd: CustomResourceDefinition = serde_json::from_value(bad).unwrap();
    let e = api_err(crds.create(&PostParams::default(), &crd).await.unwrap_err());
    assert_eq!(e.code, 422);
    s.shutdown().await;
}
