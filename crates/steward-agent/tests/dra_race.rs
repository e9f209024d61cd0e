//! Device-plugin pods and DRA claims racing for the same slots of one
//! Instance, through the real wires: kubelet's device manager admits
//! device-plugin pods (Allocate) while the stand-in scheduler allocates
//! ResourceClaims blind to them and kubelet prepares them
//! (NodePrepareResources), each released at random. A slot is never held
//! by two consumers at once: every grant is recorded from its answer to
//! the release call, and no two such intervals of one slot overlap.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dp;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dp::*;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use kube::api::DeleteParams;
use steward_testing_apiserver::dra_alloc::{allocate_claim, unreserve_claim};
use steward_testing_kubelet::{ContainerSpec, Phase, PodSpec};

const CAPACITY: u32 = 3;
const ROUNDS: usize = 30;

#[derive(Debug, Clone)]
struct Grant {
    slot: String,
    by: String,
    from: Instant,
    to: Instant,
}

/// A small deterministic generator (no dependency): hold times.
fn hold(seed: &mut u64) -> Duration {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    Duration::from_millis(*seed % 15)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_plugin_and_dra_consumers_never_share_a_slot() {
    let server = api_server().await;
    server.serve_dra();
    let dir = tempfile::tempdir().unwrap();
    let node = Arc::new(Node::start(dir.path(), "node-a", Some(server.client())).await);
    let cfg = dra_agent_config(&node, dir.path(), server.client(), echo(false));
    let agent = Agent::start(cfg);
    create_configuration(
        &server,
        &configuration("cams", "debug-echo", &echo_details(&["cam"]), CAPACITY),
    )
    .await;
    let inst = instance_of(&server, "cams", &["node-a"]).await;
    let instance = inst.metadata.name.clone().unwrap();
    let res = resource(&inst);
    node.kubelet
        .wait_for_resource(&res, |s| s.healthy.len() == CAPACITY as usize, WAIT)
        .await
        .unwrap();
    node.kubelet
        .wait_for_dra_driver("steward.dev", WAIT)
        .await
        .unwrap();
    create_device_class(&server, "cams").await;
    // The slices are what the scheduler allocates from.
    wait_for_devices(&server, CAPACITY as usize).await;

    let grants: Arc<Mutex<Vec<Grant>>> = Arc::default();
    let counts: Arc<Mutex<BTreeMap<&'static str, usize>>> = Arc::default();
    let count = |counts: &Arc<Mutex<BTreeMap<&'static str, usize>>>, k: &'static str| {
        *counts.lock().unwrap().entry(k).or_default() += 1;
    };

    // Device-plugin consumers.
    let dp_task = {
        let (node, res, grants, counts) =
            (node.clone(), res.clone(), grants.clone(), counts.clone());
        tokio::spawn(async move {
            let mut seed = 0x9e37_79b9_7f4a_7c15u64;
            for i in 0..ROUNDS {
                let spec = PodSpec::new(NS, format!("dp-{i}"))
                    .container(ContainerSpec::new("main").limit(&res, 1));
                match node.kubelet.add_pod(spec).await {
                    Ok(p) => {
                        let from = Instant::now();
                        let slot = p.devices["main"][&res].iter().next().unwrap().clone();
                        count(&counts, "dp granted");
                        tokio::time::sleep(hold(&mut seed)).await;
                        let to = Instant::now();
                        node.kubelet.delete_pod(&p.uid).await.unwrap();
                        grants.lock().unwrap().push(Grant {
                            slot,
                            by: format!("pod dp-{i}"),
                            from,
                            to,
                        });
                    }
                    Err(_) => count(&counts, "dp refused"),
                }
            }
        })
    };

    // DRA consumers: claim, schedule (blind to the device plugins),
    // prepare at admission, unprepare at the end.
    let dra_task = {
        let (node, server_client, grants, counts) = (
            node.clone(),
            server.client(),
            grants.clone(),
            counts.clone(),
        );
        tokio::spawn(async move {
            let claims: Api<ResourceClaim> = Api::namespaced(server_client.clone(), NS);
            let mut seed = 0x2545_f491_4f6c_dd1du64;
            for i in 0..ROUNDS {
                let name = format!("claim-{i}");
                create_claim(&server_client, &name, "cams.default.steward.dev").await;
                let pod_name = format!("dra-{i}");
                let spec = PodSpec::new(NS, &pod_name)
                    .resource_claim("cam", &name)
                    .container(ContainerSpec::new("main").claim("cam"));
                let uid = node.kubelet.create_pod_object(&spec).await.unwrap();
                let Ok(allocated) =
                    allocate_claim(&server_client, NS, &name, &pod_name, &uid, "node-a").await
                else {
                    count(&counts, "dra unschedulable");
                    claims
                        .delete(&name, &DeleteParams::default())
                        .await
                        .unwrap();
                    continue;
                };
                let device = allocation_results(allocated)[0].device.clone();
                match node.kubelet.add_pod(spec.uid(&uid)).await {
                    Ok(_) => {
                        let from = Instant::now();
                        count(&counts, "dra prepared");
                        tokio::time::sleep(hold(&mut seed)).await;
                        let to = Instant::now();
                        node.kubelet
                            .terminate_pod(&uid, Phase::Succeeded)
                            .await
                            .unwrap();
                        grants.lock().unwrap().push(Grant {
                            slot: device,
                            by: format!("claim {name}"),
                            from,
                            to,
                        });
                    }
                    Err(_) => {
                        count(&counts, "dra refused at prepare");
                        node.kubelet.delete_pod(&uid).await.unwrap();
                    }
                }
                unreserve_claim(&server_client, NS, &name, &uid)
                    .await
                    .unwrap();
                claims
                    .delete(&name, &DeleteParams::default())
                    .await
                    .unwrap();
            }
        })
    };
    dp_task.await.unwrap();
    dra_task.await.unwrap();

    let grants = grants.lock().unwrap().clone();
    let mut double = Vec::new();
    for (i, a) in grants.iter().enumerate() {
        for b in &grants[i + 1..] {
            if a.slot == b.slot && a.from < b.to && b.from < a.to {
                double.push(format!("{} and {} on {}", a.by, b.by, a.slot));
            }
        }
    }
    let counts = counts.lock().unwrap().clone();
    println!(
        "dp/dra race: {} grants, double grants {}, {counts:?}",
        grants.len(),
        double.len()
    );
    assert!(double.is_empty(), "double grants: {double:?}");
    assert!(
        counts.get("dp granted").copied().unwrap_or(0) > 0,
        "{counts:?}"
    );
    assert!(
        counts.get("dra prepared").copied().unwrap_or(0) > 0,
        "{counts:?}"
    );
    // Everything released: no slot claimed, every slot healthy again.
    for n in 0..CAPACITY {
        wait_released(&server, &format!("{instance}-{n}")).await;
    }
    node.kubelet
        .wait_for_resource(&res, |s| s.healthy.len() == CAPACITY as usize, WAIT)
        .await
        .unwrap();
    agent.stop().await.unwrap();
}
