//! The chart's PodDisruptionBudgets for the controller and the extender,
//! rendered with a real helm 4 and applied with a real kubectl 1.35 and 1.37 (strict
//! field validation) to the API server stand-in: on by default when a
//! Deployment has more than one replica, each selecting exactly its
//! Deployment's pods, `maxUnavailable` or `minAvailable` as the values say,
//! none for a single replica or when turned off, and bad budgets refused by
//! the chart's schema.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;
use steward_e2e::chart::{NAMESPACE, RELEASE, documents, refused, template, template_with};
use steward_testing_apiserver::ApiServer;
use steward_testing_apiserver::kube_tools::{self, KubeTools};
use steward_testing_apiserver::kubectl::Kubectl;

/// Both Deployments; the chart's admission policies off (the API server
/// stand-in these tests apply to serves no admissionregistration.k8s.io;
/// the real cluster proves them).
const BOTH: &[&str] = &[
    "controller.enabled=true",
    "extender.enabled=true",
    "rbac.admissionPolicies=false",
];

fn with<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    BOTH.iter().copied().chain(extra.iter().copied()).collect()
}

fn budgets(docs: &[Value]) -> Vec<&Value> {
    docs.iter()
        .filter(|d| d["kind"] == "PodDisruptionBudget")
        .collect()
}

fn named<'a>(docs: &'a [Value], kind: &str, component: &str) -> &'a Value {
    let name = format!("{RELEASE}-steward-{component}");
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name.as_str())
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

/// Applies `text` to a fresh stand-in and returns the stored budgets as
/// kubectl reads them back.
async fn apply(t: &KubeTools, text: &str) -> Vec<Value> {
    let server = ApiServer::start().await.unwrap();
    server.serve_workloads();
    let k = Kubectl::of(&server, t).await;
    k.ok(&["create", "namespace", NAMESPACE]).await;
    let file = k.dir().join("rendered.yaml");
    std::fs::write(&file, text).unwrap();
    let applied = k.ok(&["apply", "-f", file.to_str().unwrap()]).await;
    for line in applied.lines() {
        assert!(line.ends_with(" created"), "{line}");
    }
    let got = k
        .ok(&["get", "poddisruptionbudgets", "-n", NAMESPACE, "-o", "json"])
        .await;
    let got: Value = serde_json::from_str(&got).unwrap();
    let items = got["items"].as_array().unwrap().clone();
    // Applying again: kubectl says `configured` (it always sends the
    // selector, whose patch strategy is replace), but nothing changes.
    k.ok(&["apply", "-f", file.to_str().unwrap()]).await;
    let again = k
        .ok(&["get", "poddisruptionbudgets", "-n", NAMESPACE, "-o", "json"])
        .await;
    let again: Value = serde_json::from_str(&again).unwrap();
    let specs = |items: &[Value]| items.iter().map(|p| p["spec"].clone()).collect::<Vec<_>>();
    assert_eq!(specs(again["items"].as_array().unwrap()), specs(&items));
    server.shutdown().await;
    items
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_deployment_gets_a_budget_that_selects_its_pods_and_kubectl_accepts_it() {
    kube_tools::each(
        each_deployment_gets_a_budget_that_selects_its_pods_and_kubectl_accepts_it_with,
    )
    .await;
}

async fn each_deployment_gets_a_budget_that_selects_its_pods_and_kubectl_accepts_it_with(
    t: KubeTools,
) {
    let text = template_with(&t.helm, &with(&[]), false);
    let docs = documents(&text);
    assert_eq!(budgets(&docs).len(), 2, "{text}");
    for component in ["controller", "extender"] {
        let pdb = named(&docs, "PodDisruptionBudget", component);
        let deploy = named(&docs, "Deployment", component);
        assert_eq!(pdb["spec"]["maxUnavailable"], 1, "{component}");
        assert!(pdb["spec"].get("minAvailable").is_none(), "{component}");
        // The budget's selector is the Deployment's own: it counts exactly
        // that Deployment's pods.
        assert_eq!(
            pdb["spec"]["selector"], deploy["spec"]["selector"],
            "{component}"
        );
        let pod_labels = deploy["spec"]["template"]["metadata"]["labels"]
            .as_object()
            .unwrap();
        for (k, v) in pdb["spec"]["selector"]["matchLabels"].as_object().unwrap() {
            assert_eq!(pod_labels.get(k), Some(v), "{component}: {k}");
        }
    }

    let stored = apply(&t, &text).await;
    let mut names: Vec<&str> = stored
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap())
        .collect();
    names.sort_unstable();
    assert_eq!(names, ["t-steward-controller", "t-steward-extender"]);
    for p in &stored {
        assert_eq!(p["spec"]["maxUnavailable"], 1, "{p}");
        assert!(p["spec"]["selector"]["matchLabels"].is_object(), "{p}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_available_replaces_max_unavailable_and_a_percentage_stays_a_string() {
    kube_tools::each(min_available_replaces_max_unavailable_and_a_percentage_stays_a_string_with)
        .await;
}

async fn min_available_replaces_max_unavailable_and_a_percentage_stays_a_string_with(t: KubeTools) {
    let text = template_with(
        &t.helm,
        &with(&[
            "controller.podDisruptionBudget.minAvailable=50%",
            "extender.podDisruptionBudget.maxUnavailable=2",
            "extender.replicas=3",
        ]),
        false,
    );
    let docs = documents(&text);
    let controller = named(&docs, "PodDisruptionBudget", "controller");
    assert_eq!(controller["spec"]["minAvailable"], "50%");
    assert!(controller["spec"].get("maxUnavailable").is_none());
    let extender = named(&docs, "PodDisruptionBudget", "extender");
    assert_eq!(extender["spec"]["maxUnavailable"], 2);

    let stored = apply(&t, &text).await;
    let controller = stored
        .iter()
        .find(|p| p["metadata"]["name"] == "t-steward-controller")
        .unwrap();
    assert_eq!(controller["spec"]["minAvailable"], "50%");
}

#[test]
fn no_budget_for_one_replica_when_turned_off_or_when_the_component_is_off() {
    for sets in [
        vec!["controller.enabled=true", "controller.replicas=1"],
        with(&[
            "controller.replicas=1",
            "extender.podDisruptionBudget.enabled=false",
        ]),
        vec![],
    ] {
        let docs = documents(&template(&sets, false));
        assert!(budgets(&docs).is_empty(), "{sets:?}");
    }
    // One of the two keeps its budget.
    let docs = documents(&template(&with(&["controller.replicas=1"]), false));
    let left: Vec<&str> = budgets(&docs)
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(left, ["t-steward-extender"]);
}

#[test]
fn a_budget_that_is_not_a_count_or_a_percentage_is_refused_by_the_schema() {
    kube_tools::each_blocking(
        a_budget_that_is_not_a_count_or_a_percentage_is_refused_by_the_schema_with,
    );
}

fn a_budget_that_is_not_a_count_or_a_percentage_is_refused_by_the_schema_with(t: &KubeTools) {
    for bad in [
        "controller.podDisruptionBudget.maxUnavailable=half",
        "extender.podDisruptionBudget.minAvailable=-1",
        "controller.podDisruptionBudget.maxUnavaliable=1",
    ] {
        let stderr = refused(&t.helm, &["controller.enabled=true", bad]);
        assert!(stderr.contains("podDisruptionBudget"), "{bad}: {stderr}");
    }
}
