//! What kubectl relies on, checked at the HTTP level (no kubectl needed): `as=Table`
//! responses for get / list / watch, `/openapi/v3`, and protobuf request bodies.

// fixture helpers outside #[test] functions panic on broken fixtures on purpose
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";

fn cm(name: &str, entries: usize) -> ConfigMap {
    let mut c = ConfigMap::default();
    c.metadata.name = Some(name.into());
    c.data = Some(
        (0..entries)
            .map(|i| (format!("k{i}"), "v".to_string()))
            .collect(),
    );
    c
}

fn column_names(table: &Value) -> Vec<&str> {
    table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect()
}

#[tokio::test]
async fn list_and_get_answer_tables() {
    let s = ApiServer::start().await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    cms.create(&PostParams::default(), &cm("a", 2))
        .await
        .unwrap();
    let path = "/api/v1/namespaces/default/configmaps";
    let r = raw_with(&s, "GET", path, &[("Accept", TABLE)], b"").await;
    assert_eq!(r.status, 200, "{}", r.body);
    let t = r.json();
    assert_eq!(t["kind"], "Table");
    assert_eq!(t["apiVersion"], "meta.k8s.io/v1");
    assert_eq!(
        t["metadata"]["resourceVersion"],
        s.resource_version().to_string()
    );
    assert_eq!(column_names(&t), ["Name", "Data", "Age"]);
    assert_eq!(t["columnDefinitions"][0]["format"], "name");
    let cells = &t["rows"][0]["cells"];
    assert_eq!(cells[0], "a");
    assert_eq!(cells[1], 2);
    assert!(cells[2].as_str().unwrap().ends_with('s'), "{cells}");
    // includeObject: Metadata (default), Object, None
    let obj = &t["rows"][0]["object"];
    assert_eq!(obj["kind"], "PartialObjectMetadata");
    assert_eq!(obj["metadata"]["name"], "a");
    assert!(obj.get("data").is_none());
    let r = raw_with(
        &s,
        "GET",
        &format!("{path}?includeObject=Object"),
        &[("Accept", TABLE)],
        b"",
    )
    .await;
    assert_eq!(r.json()["rows"][0]["object"]["data"]["k1"], "v");
    let r = raw_with(
        &s,
        "GET",
        &format!("{path}?includeObject=None"),
        &[("Accept", TABLE)],
        b"",
    )
    .await;
    assert!(r.json()["rows"][0]["object"].is_null());
    // v1beta1 when asked first
    let r = raw_with(
        &s,
        "GET",
        &format!("{path}/a"),
        &[(
            "Accept",
            "application/json;as=Table;v=v1beta1;g=meta.k8s.io",
        )],
        b"",
    )
    .await;
    let t = r.json();
    assert_eq!(t["apiVersion"], "meta.k8s.io/v1beta1");
    assert_eq!(t["rows"].as_array().unwrap().len(), 1);
    // protobuf only, or a Table version that does not exist: 406
    for accept in [
        "application/vnd.kubernetes.protobuf",
        "application/json;as=Table;v=v9;g=meta.k8s.io",
    ] {
        let r = raw_with(&s, "GET", path, &[("Accept", accept)], b"").await;
        assert_eq!(r.status, 406, "{accept}: {}", r.body);
        assert_eq!(r.json()["reason"], "NotAcceptable");
    }
    s.shutdown().await;
}

#[tokio::test]
async fn crd_tables_use_additional_printer_columns() {
    let s = ApiServer::start().await.unwrap();
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "things.example.com"},
        "spec": {"group": "example.com", "scope": "Cluster",
                 "names": {"plural": "things", "kind": "Thing"},
                 "versions": [
                    {"name": "v1", "served": true, "storage": true,
                     "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
                     "additionalPrinterColumns": [
                        {"name": "Size", "type": "integer", "jsonPath": ".spec.size"},
                        {"name": "Tags", "type": "string", "jsonPath": ".spec.tags"},
                        {"name": "First", "type": "string", "jsonPath": ".spec.tags[0]", "priority": 1},
                        {"name": "On", "type": "boolean", "jsonPath": ".spec.on"},
                        {"name": "Missing", "type": "string", "jsonPath": ".status.nothing"},
                        {"name": "Born", "type": "date", "jsonPath": ".metadata.creationTimestamp"}]},
                    {"name": "v2", "served": true, "storage": false,
                     "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
    });
    let r = raw(
        &s,
        "POST",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        Some("application/json"),
        &crd.to_string(),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let thing = json!({"apiVersion": "example.com/v1", "kind": "Thing", "metadata": {"name": "t"},
                       "spec": {"size": 3, "tags": ["x", "y"], "on": true}});
    let r = raw(
        &s,
        "POST",
        "/apis/example.com/v1/things",
        Some("application/json"),
        &thing.to_string(),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let r = raw_with(
        &s,
        "GET",
        "/apis/example.com/v1/things",
        &[("Accept", TABLE)],
        b"",
    )
    .await;
    let t = r.json();
    assert_eq!(
        column_names(&t),
        ["Name", "Size", "Tags", "First", "On", "Missing", "Born"]
    );
    assert_eq!(t["columnDefinitions"][3]["priority"], 1);
    assert_eq!(t["columnDefinitions"][6]["type"], "date");
    let cells = t["rows"][0]["cells"].as_array().unwrap().clone();
    assert_eq!(
        cells[..6],
        [
            json!("t"),
            json!(3),
            json!("[x y]"),
            json!("x"),
            json!(true),
            Value::Null
        ]
    );
    assert!(cells[6].as_str().unwrap().ends_with('s'), "{cells:?}");
    // a version without columns gets the CRD default: Age
    let r = raw_with(
        &s,
        "GET",
        "/apis/example.com/v2/things/t",
        &[("Accept", TABLE)],
        b"",
    )
    .await;
    assert_eq!(column_names(&r.json()), ["Name", "Age"]);
    s.shutdown().await;
}

#[tokio::test]
async fn table_watch_sends_column_definitions_once() {
    let s = ApiServer::start().await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    let start = s.resource_version();
    cms.create(&PostParams::default(), &cm("a", 1))
        .await
        .unwrap();
    cms.create(&PostParams::default(), &cm("b", 3))
        .await
        .unwrap();
    let r = raw_with(
        &s,
        "GET",
        &format!(
            "/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={start}&timeoutSeconds=1"
        ),
        &[("Accept", TABLE)],
        b"",
    )
    .await;
    assert_eq!(r.status, 200);
    let evs = r.events();
    assert_eq!(evs.len(), 2, "{evs:?}");
    for (e, (name, n)) in evs.iter().zip([("a", 1), ("b", 3)]) {
        assert_eq!(e["type"], "ADDED");
        assert_eq!(e["object"]["kind"], "Table");
        let rows = e["object"]["rows"].as_array().unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0]["cells"][0], name);
        assert_eq!(rows[0]["cells"][1], n);
        assert_eq!(rows[0]["object"]["kind"], "PartialObjectMetadata");
    }
    assert_eq!(column_names(&evs[0]["object"]), ["Name", "Data", "Age"]);
    assert!(evs[1]["object"]["columnDefinitions"].is_null(), "{evs:?}");
    s.shutdown().await;
}

#[tokio::test]
async fn openapi_v3_index_and_documents() {
    let s = ApiServer::start().await.unwrap();
    let r = raw(&s, "GET", "/openapi/v3", None, "").await;
    assert_eq!(r.status, 200);
    let index = r.json();
    let url = index["paths"]["api/v1"]["serverRelativeURL"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(url.starts_with("/openapi/v3/api/v1?hash="), "{url}");
    assert!(index["paths"]["apis/coordination.k8s.io/v1"].is_object());
    let doc = raw(&s, "GET", &url, None, "").await.json();
    assert_eq!(doc["openapi"], "3.0.0");
    let patch = &doc["paths"]["/api/v1/namespaces/{namespace}/configmaps/{name}"]["patch"];
    assert_eq!(
        patch["x-kubernetes-group-version-kind"],
        json!({"group": "", "version": "v1", "kind": "ConfigMap"})
    );
    assert!(
        patch["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "fieldValidation" && p["in"] == "query")
    );
    let cm_schema = &doc["components"]["schemas"]["io.k8s.api.core.v1.ConfigMap"];
    assert_eq!(
        cm_schema["x-kubernetes-group-version-kind"],
        json!([{"group": "", "version": "v1", "kind": "ConfigMap"}])
    );
    assert!(cm_schema["properties"]["data"].is_object());
    // a CRD appears with its schema and changes the hash of its group-version only
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "things.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced",
                 "names": {"plural": "things", "kind": "Thing"},
                 "versions": [{"name": "v1", "served": true, "storage": true,
                     "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                         "spec": {"type": "object", "description": "the spec",
                                  "properties": {"size": {"type": "integer"}}}}}}}]}
    });
    let r = raw(
        &s,
        "POST",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        Some("application/json"),
        &crd.to_string(),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let index2 = raw(&s, "GET", "/openapi/v3", None, "").await.json();
    assert_eq!(index2["paths"]["api/v1"], index["paths"]["api/v1"]);
    let url = index2["paths"]["apis/example.com/v1"]["serverRelativeURL"]
        .as_str()
        .unwrap()
        .to_string();
    let doc = raw(&s, "GET", &url, None, "").await.json();
    let schema = &doc["components"]["schemas"]["com.example.v1.Thing"];
    assert_eq!(schema["properties"]["spec"]["description"], "the spec");
    assert!(schema["properties"]["metadata"].is_object());
    assert_eq!(
        schema["x-kubernetes-group-version-kind"],
        json!([{"group": "example.com", "version": "v1", "kind": "Thing"}])
    );
    assert!(doc["paths"]["/apis/example.com/v1/namespaces/{namespace}/things"]["post"].is_object());
    let r = raw(&s, "GET", "/openapi/v3/apis/nope.example.com/v1", None, "").await;
    assert_eq!(r.status, 404);
    s.shutdown().await;
}

/// `kubectl create namespace x` (kubectl 1.34.5), as captured with `-v=8`.
const NAMESPACE_PB: &[u8] = &[
    0x6b, 0x38, 0x73, 0x00, 0x0a, 0x0f, 0x0a, 0x02, 0x76, 0x31, 0x12, 0x09, 0x4e, 0x61, 0x6d, 0x65,
    0x73, 0x70, 0x61, 0x63, 0x65, 0x12, 0x19, 0x0a, 0x11, 0x0a, 0x01, 0x78, 0x12, 0x00, 0x1a, 0x00,
    0x22, 0x00, 0x2a, 0x00, 0x32, 0x00, 0x38, 0x00, 0x42, 0x00, 0x12, 0x00, 0x1a, 0x02, 0x0a, 0x00,
    0x1a, 0x00, 0x22, 0x00,
];

#[tokio::test]
async fn protobuf_bodies_of_built_in_kinds_are_decoded() {
    let s = ApiServer::start().await.unwrap();
    let pb = "application/vnd.kubernetes.protobuf";
    let r = raw_with(
        &s,
        "POST",
        "/api/v1/namespaces?fieldValidation=Strict",
        &[
            ("Content-Type", pb),
            (
                "Accept",
                "application/vnd.kubernetes.protobuf,application/json",
            ),
        ],
        NAMESPACE_PB,
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.header("content-type"), ["application/json"]);
    let ns = r.json();
    assert_eq!(ns["metadata"]["name"], "x");
    assert_eq!(ns["status"]["phase"], "Active");
    // a kind the decoder does not know: 415 naming the kind
    let mut body = b"k8s\x00\x0a\x09\x0a\x02v1\x12\x03Pod\x12\x00".to_vec();
    body.extend_from_slice(b"\x1a\x00\x22\x00");
    let r = raw_with(
        &s,
        "POST",
        "/api/v1/namespaces/default/pods",
        &[("Content-Type", pb)],
        &body,
    )
    .await;
    assert_eq!(r.status, 415, "{}", r.body);
    assert!(r.json()["message"].as_str().unwrap().contains("v1/Pod"));
    let r = raw_with(
        &s,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        &[("Content-Type", pb)],
        b"not protobuf",
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.body);
    s.shutdown().await;
}
