//! Device health on the real cluster (issue 40, item 3): a fault a
//! discovery handler reports reaches the pod holding the device through
//! kubelet's DRA health stream (`allocatedResourcesStatus`, KEP-4680,
//! gate ResourceHealthStatus), taints the device in steward's
//! ResourceSlice (`steward.dev/unhealthy`: `NoSchedule` when fatal, `None`
//! when transient) as the real API server stores it, keeps the real
//! kube-scheduler from allocating it while fatal, and all of it goes when
//! the device recovers — with no restart of the agent or the pod.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use serde_json::{Value, json};
use steward_real_cluster::{BUSYBOX, Cluster, eventually};

const TAINT: &str = "steward.dev/unhealthy";

fn slices(cluster: &Cluster) -> Vec<Value> {
    let v: Value = serde_json::from_str(&cluster.kubectl(&[
        "get",
        "resourceslices",
        "--field-selector",
        "spec.driver=steward.dev",
        "-o",
        "json",
    ]))
    .unwrap();
    v["items"].as_array().cloned().unwrap_or_default()
}

/// The `steward.dev/unhealthy` taint of `device` in the slices of `pool`:
/// (value, effect); `None` when the device has none; absent when the
/// device is not published.
fn unhealthy_taint(
    cluster: &Cluster,
    pool: &str,
    device: &str,
) -> Option<Option<(String, String)>> {
    slices(cluster).iter().find_map(|s| {
        if s["spec"]["pool"]["name"] != pool {
            return None;
        }
        let d = s["spec"]["devices"]
            .as_array()?
            .iter()
            .find(|d| d["name"] == device)?;
        Some(d["taints"].as_array().and_then(|ts| {
            ts.iter().find(|t| t["key"] == TAINT).map(|t| {
                (
                    t["value"].as_str().unwrap_or("").to_owned(),
                    t["effect"].as_str().unwrap_or("").to_owned(),
                )
            })
        }))
    })
}

fn claim(cluster: &Cluster, ns: &str, name: &str) -> Value {
    serde_json::from_str(&cluster.kubectl(&["get", "resourceclaim", "-n", ns, name, "-o", "json"]))
        .unwrap()
}

fn pod(cluster: &Cluster, ns: &str, name: &str) -> Value {
    serde_json::from_str(&cluster.kubectl(&["get", "pod", "-n", ns, name, "-o", "json"])).unwrap()
}

/// The health kubelet shows in the pod's container statuses for the one
/// device the pod holds (`allocatedResourcesStatus[].resources[]`). kubelet
/// names it by the device's CDI id (`steward.dev/<configuration>=<instance>`,
/// as 1.37.2 showed), which names the Instance, not the slot: each pod of
/// this story holds exactly one device, so the pod's one entry is it.
fn health_in_pod(pod: &Value) -> Option<String> {
    let resources: Vec<Value> = pod["status"]["containerStatuses"]
        .as_array()?
        .iter()
        .flat_map(|c| {
            c["allocatedResourcesStatus"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .flat_map(|s| s["resources"].as_array().cloned().unwrap_or_default())
        .collect();
    match resources.as_slice() {
        [one] => one["health"].as_str().map(str::to_owned),
        _ => None,
    }
}

/// Proves, on the real kubelet and scheduler: a device whose discovery
/// reports a fatal fault shows Unhealthy in the status of the pod holding
/// it through a claim, is tainted `NoSchedule` in its slice (the held
/// device and the free one), and a new claim for it is not allocated; the
/// fault turning transient makes the taint's effect `None` and the claim is
/// allocated; the device recovering removes the taint and kubelet shows it
/// Healthy again — the first pod never restarted. The device plugin of the
/// same Instance agrees: kubelet's device manager offers no slot of the
/// device while the fault is fatal, and both once it is healthy and free.
#[tokio::test(flavor = "multi_thread")]
async fn a_faulty_device_reaches_the_pod_is_tainted_by_kind_and_recovers() {
    let cluster = Cluster::connect().await;
    let ns = cluster.namespace("drahealth").await;
    // The agent's embedded debug-echo reads the availability file inside
    // its container, where the chart mounts the node's state directory.
    let file = format!("/var/lib/steward/{}-health", ns.name);
    let conf: steward_api::Configuration = serde_json::from_value(json!({
        "apiVersion": "steward.dev/v1alpha1",
        "kind": "Configuration",
        "metadata": {"name": "sick"},
        "spec": {
            "discoveryHandler": {
                "name": "debug-echo",
                "details": serde_json::to_string(&json!({
                    "descriptions": ["sick-0"],
                    "availabilityFile": file,
                    "pollInterval": "200ms",
                }))
                .unwrap(),
            },
            "capacity": 2,
        },
    }))
    .unwrap();
    cluster.create_configuration(&ns.name, &conf).await;
    let class = cluster.device_class(&ns.name, "sick").await;
    cluster.apply(
        &ns.name,
        &json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "user-claim"},
            "spec": {"devices": {"requests": [{"name": "d", "exactly": {"deviceClassName": class}}]}},
        }),
    );
    let pod_with = |name: &str, claim: &str| {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "terminationGracePeriodSeconds": 0,
                "resourceClaims": [{"name": "d", "resourceClaimName": claim}],
                "containers": [{
                    "name": "c", "image": BUSYBOX, "imagePullPolicy": "Never",
                    "command": ["sleep", "3600"],
                    "resources": {"claims": [{"name": "d"}]},
                }],
            },
        })
    };
    cluster
        .create_pod(&ns.name, pod_with("user", "user-claim"))
        .await;
    let running = cluster
        .running(&ns.name, "user", Duration::from_secs(120))
        .await;
    let node = running.spec.and_then(|s| s.node_name).unwrap();
    let uid = running.metadata.uid.unwrap();
    let allocated = claim(&cluster, &ns.name, "user-claim");
    let result = &allocated["status"]["allocation"]["devices"]["results"][0];
    let pool = result["pool"].as_str().unwrap().to_owned();
    let held = result["device"].as_str().unwrap().to_owned();
    let inst = cluster.instance_on(&ns.name, "sick", &node).await;
    let name = inst.metadata.name.clone().unwrap();
    assert!(held.starts_with(&name), "{held} is not a slot of {name}");
    let free = [format!("{name}-0"), format!("{name}-1")]
        .into_iter()
        .find(|d| *d != held)
        .unwrap();
    eventually(
        "kubelet shows the held device Healthy",
        Duration::from_secs(60),
        || async {
            (health_in_pod(&pod(&cluster, &ns.name, "user")).as_deref() == Some("Healthy"))
                .then_some(())
        },
    )
    .await;
    assert_eq!(unhealthy_taint(&cluster, &pool, &free), Some(None));
    // The device plugin's view of the same slots: the one the claim holds
    // is not offered, the free one is.
    let resource = format!("steward.dev/{name}");
    cluster.wait_allocatable(&node, &resource, 1).await;

    // A fatal fault on the pod's node.
    let host_file = cluster
        .dir
        .join(format!("{node}/steward/{}-health", ns.name));
    std::fs::write(&host_file, "FATAL ECC error").unwrap();
    for device in [&held, &free] {
        let taint = eventually(
            &format!("{device} tainted {TAINT}"),
            Duration::from_secs(60),
            || async { unhealthy_taint(&cluster, &pool, device).flatten() },
        )
        .await;
        assert_eq!(taint, ("ECC-error".to_owned(), "NoSchedule".to_owned()));
    }
    eventually(
        "kubelet shows the held device Unhealthy in the pod's status",
        Duration::from_secs(60),
        || async {
            let p = pod(&cluster, &ns.name, "user");
            (health_in_pod(&p).as_deref() == Some("Unhealthy")).then_some(())
        },
    )
    .await;

    // The device plugin reports the free slot Unhealthy too: kubelet's
    // device manager offers none of a fatally faulty device.
    cluster.wait_allocatable(&node, &resource, 0).await;

    // A new claim for the faulty device: not allocated, its pod not placed.
    cluster.apply(
        &ns.name,
        &json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "wants-sick"},
            "spec": {"devices": {"requests": [{"name": "d", "exactly": {
                "deviceClassName": class,
                "selectors": [{"cel": {"expression": format!(
                    "device.attributes[\"steward.dev\"].instance == \"{name}\""
                )}}],
            }}]}},
        }),
    );
    cluster.apply(&ns.name, &pod_with("claimer", "wants-sick"));
    tokio::time::sleep(Duration::from_secs(8)).await;
    let c = claim(&cluster, &ns.name, "wants-sick");
    assert!(
        c["status"]["allocation"].is_null(),
        "a device tainted NoSchedule must not be allocated: {c}"
    );
    assert!(
        pod(&cluster, &ns.name, "claimer")["spec"]["nodeName"].is_null(),
        "claimer placed on a faulty device"
    );

    // The fault turns transient: effect None, and the claim is allocated.
    std::fs::write(&host_file, "TRANSIENT link flapping").unwrap();
    let taint = eventually(
        &format!("{free} tainted {TAINT} with effect None"),
        Duration::from_secs(60),
        || async {
            unhealthy_taint(&cluster, &pool, &free)
                .flatten()
                .filter(|(_, effect)| effect == "None")
        },
    )
    .await;
    assert_eq!(taint.0, "link-flapping");
    cluster
        .running(&ns.name, "claimer", Duration::from_secs(120))
        .await;
    let c = claim(&cluster, &ns.name, "wants-sick");
    assert_eq!(
        c["status"]["allocation"]["devices"]["results"][0]["device"],
        free.as_str(),
        "{c}"
    );
    assert_eq!(
        health_in_pod(&pod(&cluster, &ns.name, "user")).as_deref(),
        Some("Unhealthy"),
        "a transient fault is still a fault to kubelet"
    );

    // Recovery: no taint, Healthy in both pods' status, nothing restarted.
    std::fs::write(&host_file, "").unwrap();
    for device in [&held, &free] {
        eventually(
            &format!("{device} untainted"),
            Duration::from_secs(60),
            || async { (unhealthy_taint(&cluster, &pool, device) == Some(None)).then_some(()) },
        )
        .await;
    }
    for (who, device) in [("user", &held), ("claimer", &free)] {
        eventually(
            &format!("kubelet shows {device} Healthy again in {who}'s status"),
            Duration::from_secs(60),
            || async {
                (health_in_pod(&pod(&cluster, &ns.name, who)).as_deref() == Some("Healthy"))
                    .then_some(())
            },
        )
        .await;
    }
    let p = pod(&cluster, &ns.name, "user");
    assert_eq!(p["metadata"]["uid"], uid.as_str(), "the pod was replaced");
    assert_eq!(
        p["status"]["containerStatuses"][0]["restartCount"], 0,
        "{p}"
    );
    // Both pods gone: the healthy device's two slots are offered again
    // through the device plugin.
    cluster.kubectl(&["delete", "pods", "--all", "-n", &ns.name, "--wait=false"]);
    cluster.wait_allocatable(&node, &resource, 2).await;
    let _ = std::fs::remove_file(&host_file);
}
