//! A real kubectl 1.35 and 1.37 against the stand-in: server-side printing (`get`,
//! `get -o wide`, `get -w`), `/openapi/v3` (`apply` with the default client-side
//! validation setting, `explain`) and protobuf request bodies
//! (`create namespace|configmap|secret`).
//!
//! Each test runs once with each kubectl of `steward_testing_apiserver::kube_tools`
//! (`STEWARD_KUBECTL_135` and `STEWARD_KUBECTL_137`, set by scripts/test through
//! scripts/kube-tools.sh), on a fresh stand-in each time; a failure names the kubectl.
// Test-only code: panicking on unexpected output is the point.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use serde_json::{Value, json};
use steward_testing_apiserver::kube_tools::{self, KubeTools};
use steward_testing_apiserver::kubectl::Kubectl;
use tokio::io::{AsyncBufReadExt, BufReader};

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A CRD with printer columns (one of them `-o wide` only) and a described schema.
fn gadget_crd() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "gadgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget", "shortNames": ["gd"]},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "additionalPrinterColumns": [
                    {"name": "Capacity", "type": "integer", "jsonPath": ".spec.capacity", "description": "slots"},
                    {"name": "Color", "type": "string", "jsonPath": ".spec.color"},
                    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                    {"name": "Nodes", "type": "string", "jsonPath": ".spec.nodes", "priority": 1},
                    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
                ],
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "description": "A gadget of the kubectl test.",
                    "properties": {
                        "spec": {
                            "type": "object",
                            "description": "What the gadget should be.",
                            "required": ["capacity"],
                            "properties": {
                                "capacity": {"type": "integer", "minimum": 1, "description": "Slots per gadget."},
                                "color": {"type": "string", "enum": ["red", "blue"], "description": "Paint colour."},
                                "nodes": {"type": "array", "items": {"type": "string"}}
                            }
                        },
                        "status": {"type": "object", "properties": {"phase": {"type": "string"}}}
                    }
                }}
            }]
        }
    })
}

fn gadget(name: &str, capacity: i64, color: &str) -> Value {
    json!({
        "apiVersion": "example.com/v1", "kind": "Gadget",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"capacity": capacity, "color": color, "nodes": ["node-a", "node-b"]}
    })
}

fn gadgets(s: &ApiServer) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.com", "v1", "Gadget"),
        "gadgets",
    );
    Api::namespaced_with(s.client(), "default", &ar)
}

/// Installs the gadget CRD with `kubectl apply` (default validation: a built-in kind
/// checked against `/openapi/v3/apis/apiextensions.k8s.io/v1`).
async fn install_crd(k: &Kubectl) {
    let crd = k.write("crd.json", &gadget_crd());
    let out = k.ok(&["apply", "-f", path(&crd)]).await;
    assert!(
        out.contains("customresourcedefinition.apiextensions.k8s.io/gadgets.example.com created"),
        "{out}"
    );
}

/// Lines of a `kubectl get` table, each split on whitespace.
fn rows(out: &str) -> Vec<Vec<&str>> {
    out.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.split_whitespace().collect())
        .collect()
}

fn row<'a>(out: &'a str, name: &str) -> Vec<&'a str> {
    rows(out)
        .into_iter()
        .find(|r| r.first() == Some(&name))
        .unwrap_or_else(|| panic!("no row {name:?} in:\n{out}"))
}

#[tokio::test]
async fn create_namespace_configmap_and_secret_send_protobuf() {
    kube_tools::each(create_namespace_configmap_and_secret_send_protobuf_with).await;
}

async fn create_namespace_configmap_and_secret_send_protobuf_with(t: KubeTools) {
    let s = ApiServer::start().await.unwrap();
    let k = Kubectl::of(&s, &t).await;
    let out = k.ok(&["create", "namespace", "x"]).await;
    assert_eq!(out.trim(), "namespace/x created");
    let out = k
        .ok(&[
            "create",
            "configmap",
            "c",
            "--from-literal=a=b",
            "--from-literal=c=d",
            "-n",
            "x",
        ])
        .await;
    assert_eq!(out.trim(), "configmap/c created");
    let out = k
        .ok(&[
            "create",
            "secret",
            "generic",
            "s",
            "--from-literal=k=v",
            "-n",
            "x",
        ])
        .await;
    assert_eq!(out.trim(), "secret/s created");
    // what the protobuf bodies decoded to
    let cm = Api::<ConfigMap>::namespaced(s.client(), "x")
        .get("c")
        .await
        .unwrap();
    let data = cm.data.unwrap_or_default();
    assert_eq!(data.get("a").map(String::as_str), Some("b"));
    assert_eq!(data.get("c").map(String::as_str), Some("d"));
    let secret = Api::<Secret>::namespaced(s.client(), "x")
        .get("s")
        .await
        .unwrap();
    assert_eq!(secret.data.unwrap()["k"].0, b"v".to_vec());
    assert_eq!(secret.type_.as_deref(), Some("Opaque"));
    let ns = k.ok(&["get", "namespace", "x"]).await;
    assert_eq!(row(&ns, "NAME"), ["NAME", "STATUS", "AGE"], "{ns}");
    assert_eq!(row(&ns, "x")[1], "Active", "{ns}");
    let out = k.ok(&["get", "configmaps", "-n", "x"]).await;
    assert_eq!(row(&out, "NAME"), ["NAME", "DATA", "AGE"], "{out}");
    assert_eq!(row(&out, "c")[1], "2", "{out}");
    let out = k.ok(&["get", "secrets", "-n", "x"]).await;
    assert_eq!(row(&out, "NAME"), ["NAME", "TYPE", "DATA", "AGE"], "{out}");
    assert_eq!(row(&out, "s")[1..3], ["Opaque", "1"], "{out}");
    s.shutdown().await;
}

#[tokio::test]
async fn configmap_from_one_literal_shows_data_1() {
    kube_tools::each(configmap_from_one_literal_shows_data_1_with).await;
}

async fn configmap_from_one_literal_shows_data_1_with(t: KubeTools) {
    let s = ApiServer::start().await.unwrap();
    let k = Kubectl::of(&s, &t).await;
    k.ok(&["create", "namespace", "x"]).await;
    k.ok(&["create", "configmap", "c", "--from-literal=a=b", "-n", "x"])
        .await;
    let out = k.ok(&["get", "configmaps", "-n", "x"]).await;
    let header = row(&out, "NAME");
    let c = row(&out, "c");
    assert_eq!(header[1], "DATA", "{out}");
    assert_eq!(c[1], "1", "{out}");
    assert!(
        c[2].ends_with('s') || c[2].ends_with('m'),
        "AGE {:?}\n{out}",
        c[2]
    );
    s.shutdown().await;
}

#[tokio::test]
async fn apply_custom_resource_with_default_validation() {
    kube_tools::each(apply_custom_resource_with_default_validation_with).await;
}

async fn apply_custom_resource_with_default_validation_with(t: KubeTools) {
    let s = ApiServer::start().await.unwrap();
    let k = Kubectl::of(&s, &t).await;
    install_crd(&k).await;
    let file = k.write("g1.json", &gadget("g1", 3, "red"));
    let out = k.ok(&["apply", "-f", path(&file)]).await;
    assert_eq!(out.trim(), "gadget.example.com/g1 created");
    let g = gadgets(&s).get("g1").await.unwrap();
    assert_eq!(g.data["spec"]["capacity"], 3);
    // a second apply patches (JSON merge patch for a custom resource)
    let file = k.write("g1.json", &gadget("g1", 5, "red"));
    let out = k.ok(&["apply", "-f", path(&file)]).await;
    assert_eq!(out.trim(), "gadget.example.com/g1 configured");
    let g = gadgets(&s).get("g1").await.unwrap();
    assert_eq!(g.data["spec"]["capacity"], 5);
    // the openapi document tells kubectl the server validates (fieldValidation=Strict):
    // unknown fields and schema violations come back from the stand-in
    let mut bad = gadget("g2", 3, "red");
    bad["spec"]["bogus"] = json!(1);
    let file = k.write("g2.json", &bad);
    let out = k.output(&["apply", "-f", path(&file)]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(r#"strict decoding error: unknown field "spec.bogus""#),
        "{stderr}"
    );
    let file = k.write("g3.json", &gadget("g3", 0, "red"));
    let out = k.output(&["apply", "-f", path(&file)]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("spec.capacity"), "{stderr}");
    // built-in kinds apply through the same path
    let pod = k.write(
        "pod.json",
        &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p1", "labels": {"app": "a"}},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]}}),
    );
    assert_eq!(
        k.ok(&["apply", "-f", path(&pod)]).await.trim(),
        "pod/p1 created"
    );
    let pod = k.write(
        "pod.json",
        &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p1", "labels": {"app": "b"}},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]}}),
    );
    assert_eq!(
        k.ok(&["apply", "-f", path(&pod)]).await.trim(),
        "pod/p1 configured"
    );
    let p = Api::<Pod>::default_namespaced(s.client())
        .get("p1")
        .await
        .unwrap();
    assert_eq!(p.metadata.labels.unwrap()["app"], "b");
    s.shutdown().await;
}

#[tokio::test]
async fn get_prints_the_crd_printer_columns() {
    kube_tools::each(get_prints_the_crd_printer_columns_with).await;
}

async fn get_prints_the_crd_printer_columns_with(t: KubeTools) {
    let s = ApiServer::start().await.unwrap();
    let k = Kubectl::of(&s, &t).await;
    install_crd(&k).await;
    let file = k.write("g1.json", &gadget("g1", 3, "red"));
    k.ok(&["apply", "-f", path(&file)]).await;
    gadgets(&s)
        .patch_status(
            "g1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Ready"}})),
        )
        .await
        .unwrap();
    let out = k.ok(&["get", "gadgets"]).await;
    assert_eq!(
        row(&out, "NAME"),
        ["NAME", "CAPACITY", "COLOR", "PHASE", "AGE"],
        "{out}"
    );
    let g1 = row(&out, "g1");
    assert_eq!(g1[1..4], ["3", "red", "Ready"], "{out}");
    assert!(
        g1[4].ends_with('s') || g1[4].ends_with('m'),
        "AGE {:?}\n{out}",
        g1[4]
    );
    // priority-1 columns only with -o wide
    let out = k.ok(&["get", "gd", "-o", "wide"]).await;
    assert_eq!(
        row(&out, "NAME"),
        ["NAME", "CAPACITY", "COLOR", "PHASE", "NODES", "AGE"],
        "{out}"
    );
    assert_eq!(row(&out, "g1")[4], "[node-a", "{out}");
    assert!(out.contains("[node-a node-b]"), "{out}");
    // a single object, and across namespaces (NAMESPACE from the row metadata)
    let out = k.ok(&["get", "gadget", "g1"]).await;
    assert_eq!(row(&out, "g1")[1], "3", "{out}");
    let out = k.ok(&["get", "gadgets", "-A", "--show-labels"]).await;
    assert_eq!(row(&out, "default")[1], "g1", "{out}");
    assert_eq!(row(&out, "NAMESPACE").last(), Some(&"LABELS"), "{out}");
    // sorting asks for full objects (includeObject=Object)
    let file = k.write("g0.json", &gadget("g0", 9, "blue"));
    k.ok(&["apply", "-f", path(&file)]).await;
    let out = k.ok(&["get", "gadgets", "--sort-by=.spec.capacity"]).await;
    let names: Vec<&str> = rows(&out).iter().skip(1).map(|r| r[0]).collect();
    assert_eq!(names, ["g1", "g0"], "{out}");
    // kinds without columns of their own: kube-apiserver's default table
    let out = k.ok(&["get", "crd"]).await;
    assert_eq!(row(&out, "NAME"), ["NAME", "CREATED", "AT"], "{out}");
    assert_eq!(rows(&out)[1][0], "gadgets.example.com", "{out}");
    s.shutdown().await;
}

#[tokio::test]
async fn get_pods_wide() {
    kube_tools::each(get_pods_wide_with).await;
}

async fn get_pods_wide_with(t: KubeTools) {
    let s = ApiServer::start().await.unwrap();
    let k = Kubectl::of(&s, &t).await;
    let pods: Api<Pod> = Api::default_namespaced(s.client());
    pods.create(&Default::default(), &pod_on_node("p1", "node-1"))
        .await
        .unwrap();
    pods.patch_status(
        "p1",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {
            "phase": "Running", "podIP": "10.1.2.3", "podIPs": [{"ip": "10.1.2.3"}],
            "containerStatuses": [{"name": "c", "image": "busybox", "imageID": "", "ready": true,
                                   "restartCount": 2, "state": {"running": {}}}]
        }})),
    )
    .await
    .unwrap();
    pods.create(&Default::default(), &pod("p2")).await.unwrap();
    let out = k.ok(&["get", "pods", "-o", "wide"]).await;
    let header = out.lines().next().unwrap_or_default();
    for col in [
        "NAME",
        "READY",
        "STATUS",
        "RESTARTS",
        "AGE",
        "IP",
        "NODE",
        "NOMINATED NODE",
        "READINESS GATES",
    ] {
        assert!(header.contains(col), "{col} missing:\n{out}");
    }
    let p1 = row(&out, "p1");
    assert_eq!(p1[1..4], ["1/1", "Running", "2"], "{out}");
    assert_eq!(p1[5..], ["10.1.2.3", "node-1", "<none>", "<none>"], "{out}");
    let p2 = row(&out, "p2");
    assert_eq!(p2[1..4], ["0/1", "Pending", "0"], "{out}");
    assert_eq!(p2[5..7], ["<none>", "<none>"], "{out}");
    let out = k.ok(&["get", "pods"]).await;
    assert_eq!(
        row(&out, "NAME"),
        ["NAME", "READY", "STATUS", "RESTARTS", "AGE"],
        "{out}"
    );
    // nodes
    let node = k.write(
        "node.json",
        &json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": "node-1", "labels": {"node-role.kubernetes.io/worker": ""}},
                "status": {"conditions": [{"type": "Ready", "status": "True"}],
                           "nodeInfo": {"kubeletVersion": "v1.34.1"},
                           "addresses": [{"type": "InternalIP", "address": "192.168.0.9"}]}}),
    );
    k.ok(&["create", "-f", path(&node)]).await;
    let out = k.ok(&["get", "nodes", "-o", "wide"]).await;
    let n = row(&out, "node-1");
    assert_eq!(n[1..3], ["Ready", "worker"], "{out}");
    assert_eq!(n[4..6], ["v1.34.1", "192.168.0.9"], "{out}");
    s.shutdown().await;
}

#[tokio::test]
async fn explain_reads_the_crd_schema() {
    kube_tools::each(explain_reads_the_crd_schema_with).await;
}

async fn explain_reads_the_crd_schema_with(t: KubeTools) {
    let s = ApiServer::start().await.unwrap();
    let k = Kubectl::of(&s, &t).await;
    install_crd(&k).await;
    let out = k.ok(&["explain", "gadgets.spec"]).await;
    assert!(out.contains("KIND:       Gadget"), "{out}");
    assert!(out.contains("FIELD: spec <Object>"), "{out}");
    assert!(out.contains("What the gadget should be."), "{out}");
    assert!(out.contains("capacity\t<integer> -required-"), "{out}");
    assert!(out.contains("Slots per gadget."), "{out}");
    assert!(out.contains("enum: red, blue"), "{out}");
    let out = k.ok(&["explain", "gadgets.spec.capacity"]).await;
    assert!(out.contains("FIELD: capacity <integer>"), "{out}");
    let out = k.output(&["explain", "gadgets.spec.nope"]).await;
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(r#"field "nope" does not exist"#),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // built-in kinds have a minimal schema
    let out = k.ok(&["explain", "configmaps"]).await;
    assert!(out.contains("KIND:       ConfigMap"), "{out}");
    assert!(out.contains("data\t<map[string]string>"), "{out}");
    s.shutdown().await;
}

#[tokio::test]
async fn get_watch_shows_objects_created_after_it_started() {
    kube_tools::each(get_watch_shows_objects_created_after_it_started_with).await;
}

async fn get_watch_shows_objects_created_after_it_started_with(t: KubeTools) {
    let s = ApiServer::start().await.unwrap();
    let k = Kubectl::of(&s, &t).await;
    install_crd(&k).await;
    let file = k.write("g0.json", &gadget("g0", 1, "blue"));
    k.ok(&["apply", "-f", path(&file)]).await;
    let mut child = k
        .command(&["get", "gadgets", "-w", "--request-timeout=30s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning kubectl get -w");
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let mut seen: Vec<String> = Vec::new();
    // reads lines until one starts with `name`
    async fn until(
        lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
        seen: &mut Vec<String>,
        name: &str,
    ) -> Result<String, String> {
        let wait = async {
            while let Ok(Some(l)) = lines.next_line().await {
                seen.push(l.clone());
                if l.split_whitespace().next() == Some(name) {
                    return Some(l);
                }
            }
            None
        };
        match tokio::time::timeout(Duration::from_secs(30), wait).await {
            Ok(Some(l)) => Ok(l),
            Ok(None) => Err(format!("kubectl get -w ended before a {name:?} row")),
            Err(_) => Err(format!("no {name:?} row within 30 s")),
        }
    }
    // the initial list is printed (header + g0): the watch starts after it
    let first = until(&mut lines, &mut seen, "g0").await;
    let created = gadgets(&s)
        .create(
            &Default::default(),
            &serde_json::from_value(gadget("g1", 7, "red")).unwrap(),
        )
        .await;
    let second = until(&mut lines, &mut seen, "g1").await;
    let _ = child.kill().await;
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        use tokio::io::AsyncReadExt;
        let _ = e.read_to_string(&mut stderr).await;
    }
    created.unwrap();
    let first = first.unwrap_or_else(|e| panic!("{e}\nstdout: {seen:?}\nstderr: {stderr}"));
    let second = second.unwrap_or_else(|e| panic!("{e}\nstdout: {seen:?}\nstderr: {stderr}"));
    assert_eq!(
        seen.first()
            .map(String::as_str)
            .unwrap_or_default()
            .split_whitespace()
            .collect::<Vec<_>>(),
        ["NAME", "CAPACITY", "COLOR", "PHASE", "AGE"],
        "{seen:?}"
    );
    assert_eq!(first.split_whitespace().nth(1), Some("1"), "{seen:?}");
    assert_eq!(
        second.split_whitespace().collect::<Vec<_>>()[1..3],
        ["7", "red"],
        "{seen:?}"
    );
    // the header is printed once: later events carry no column definitions
    assert_eq!(
        seen.iter().filter(|l| l.starts_with("NAME")).count(),
        1,
        "{seen:?}"
    );
    s.shutdown().await;
}
