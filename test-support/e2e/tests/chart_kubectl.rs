//! The chart as an operator installs it: rendered with a real helm 4 and
//! applied with a real kubectl 1.35 and 1.37, each with the helm shipped beside it
//! (default, strict field validation) to
//! the API server stand-in, which serves the built-in kinds the chart uses
//! with schemas from k8s-openapi's types. Every object under every value set
//! is accepted, stored as rendered and visible to `kubectl get`; applying
//! again changes nothing; a field Kubernetes does not have is refused.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;

use serde_json::Value;
use steward_e2e::chart::{NAMESPACE, documents, template_with};
use steward_testing_apiserver::ApiServer;
use steward_testing_apiserver::kube_tools::{self, KubeTools};
use steward_testing_apiserver::kubectl::Kubectl;

/// Value sets applied: default, the resource manager as an NRI plugin and
/// as the CRI proxy, the reservation controller and extender (with the
/// direct path's NetworkPolicy, and without the direct path), handlers as
/// their own DaemonSets, no RBAC, the agent standalone, and DRA
/// (ResourceSlices and the kubelet plugin in the agent, DeviceClasses in the
/// controller).
const VALUE_SETS: &[&[&str]] = &[
    &[],
    &[
        "resourceManager.enabled=true",
        "agent.podResources.groupId=472",
    ],
    &[
        "resourceManager.enabled=true",
        "resourceManager.transport=cri-proxy",
    ],
    &[
        "controller.enabled=true",
        "extender.enabled=true",
        "controller.decide.networkPolicy.enabled=true",
    ],
    &[
        "controller.enabled=true",
        "controller.decide.enabled=false",
        "extender.enabled=true",
    ],
    &[
        "agent.embeddedHandlers={debug-echo}",
        "discoveryHandlers.udev.enabled=true",
        "discoveryHandlers.tcpProbe.enabled=true",
        "agent.networkHandlerCidrs={10.0.0.0/8}",
    ],
    &["rbac.create=false", "logFormat=json"],
    &[
        "agent.standalone.enabled=true",
        "agent.standalone.configurations=kind: Configuration",
    ],
    &["dra.enabled=true", "controller.enabled=true"],
];

/// `helm template --include-crds` of the chart with `sets` by the helm of
/// `t`: the text.
fn render(t: &KubeTools, sets: &[&str]) -> String {
    // The API server stand-in serves no admissionregistration.k8s.io: the
    // chart's admission policies are applied, and proven, on the real
    // cluster (test-support/real-cluster).
    let mut sets = sets.to_vec();
    sets.push("rbac.admissionPolicies=false");
    template_with(&t.helm, &sets, true)
}

/// kubectl's `-o name` of an object: `daemonset.apps/NAME`, `serviceaccount/NAME`.
fn kubectl_name(o: &Value) -> String {
    let kind = o["kind"].as_str().unwrap().to_lowercase();
    let api = o["apiVersion"].as_str().unwrap();
    let name = o["metadata"]["name"].as_str().unwrap();
    match api.rsplit_once('/') {
        Some((group, _)) => format!("{kind}.{group}/{name}"),
        None => format!("{kind}/{name}"),
    }
}

async fn standin(t: &KubeTools) -> (ApiServer, Kubectl) {
    let server = ApiServer::start().await.unwrap();
    server.serve_workloads();
    let k = Kubectl::of(&server, t).await;
    k.ok(&["create", "namespace", NAMESPACE]).await;
    (server, k)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rendered_object_is_applied_and_seen_by_kubectl() {
    kube_tools::each(every_rendered_object_is_applied_and_seen_by_kubectl_with).await;
}

async fn every_rendered_object_is_applied_and_seen_by_kubectl_with(t: KubeTools) {
    for sets in VALUE_SETS {
        let (server, k) = standin(&t).await;
        let text = render(&t, sets);
        let file = k.dir().join("rendered.yaml");
        std::fs::write(&file, &text).unwrap();
        let file = file.to_str().unwrap();
        let applied = k.ok(&["apply", "-f", file]).await;
        let docs = documents(&text);
        let want: BTreeSet<String> = docs.iter().map(kubectl_name).collect();
        assert_eq!(
            applied.lines().count(),
            want.len(),
            "{sets:?}: one line per object:\n{applied}"
        );
        for line in applied.lines() {
            assert!(line.ends_with(" created"), "{sets:?}: {line}");
        }

        // kubectl finds every object, and no other of those kinds.
        let kinds: BTreeSet<String> = want
            .iter()
            .map(|n| n.split_once('/').unwrap().0.to_owned())
            .collect();
        let kinds: Vec<String> = kinds.into_iter().collect();
        let got = k.ok(&["get", &kinds.join(","), "-A", "-o", "name"]).await;
        let got: BTreeSet<String> = got.lines().map(str::to_owned).collect();
        assert_eq!(got, want, "{sets:?}");

        // What was stored is what was rendered (nothing pruned or rewritten):
        // every container's command line, as kubectl reads it back.
        for d in docs
            .iter()
            .filter(|d| d["kind"] == "DaemonSet" || d["kind"] == "Deployment")
        {
            let name = d["metadata"]["name"].as_str().unwrap();
            let kind = d["kind"].as_str().unwrap().to_lowercase();
            let stored = k
                .ok(&["get", &kind, name, "-n", NAMESPACE, "-o", "json"])
                .await;
            let stored: serde_json::Value = serde_json::from_str(&stored).unwrap();
            let stored: Vec<Vec<String>> = stored["spec"]["template"]["spec"]["containers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| {
                    c["args"]
                        .as_array()
                        .map(|a| a.iter().map(|s| s.as_str().unwrap().to_owned()).collect())
                        .unwrap_or_default()
                })
                .collect();
            let rendered: Vec<Vec<String>> = d["spec"]["template"]["spec"]["containers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| {
                    c["args"]
                        .as_array()
                        .map(|a| a.iter().map(|s| s.as_str().unwrap().to_owned()).collect())
                        .unwrap_or_default()
                })
                .collect();
            assert_eq!(stored, rendered, "{sets:?}: {kind}/{name}");
        }

        // Applying the same manifest again changes nothing.
        // (kubectl always sends a PodDisruptionBudget's selector, whose patch
        // strategy is replace, so it says `configured` for an unchanged one.)
        let again = k.ok(&["apply", "-f", file]).await;
        for line in again.lines() {
            let pdb = line.starts_with("poddisruptionbudget.policy/");
            assert!(
                line.ends_with(" unchanged") || (pdb && line.ends_with(" configured")),
                "{sets:?}: {line}"
            );
        }
        server.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_field_kubernetes_does_not_have_is_refused() {
    kube_tools::each(a_field_kubernetes_does_not_have_is_refused_with).await;
}

async fn a_field_kubernetes_does_not_have_is_refused_with(t: KubeTools) {
    let (server, k) = standin(&t).await;
    let mut docs = documents(&render(&t, &[]));
    let agent = docs
        .iter_mut()
        .find(|d| d["kind"] == "DaemonSet")
        .expect("the agent DaemonSet");
    let container = &mut agent["spec"]["template"]["spec"]["containers"][0];
    let hardened = container["securityContext"].clone();
    container
        .as_object_mut()
        .unwrap()
        .insert("securityContex".into(), hardened);
    let name = agent["metadata"]["name"].as_str().unwrap().to_owned();
    let file = k.dir().join("typo.yaml");
    std::fs::write(&file, serde_saphyr::to_string(agent).unwrap()).unwrap();
    let out = k.output(&["apply", "-f", file.to_str().unwrap()]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the typo was accepted");
    assert!(
        stderr.contains("unknown field \"spec.template.spec.containers[0].securityContex\""),
        "{stderr}"
    );
    let get = k
        .output(&["get", "daemonset", &name, "-n", NAMESPACE])
        .await;
    assert!(!get.status.success(), "nothing was stored");
    server.shutdown().await;
}
