//! DRA release against device-plugin reclaim, in one run, through the real
//! wires: two agents (`--dra`) with their kubelet stand-ins, the API server
//! stand-in, one device both nodes see with one slot, used on node-a
//! alternately by a device-plugin pod and by a pod with a ResourceClaim.
//! "Free again" is the same signal for both: the slot turns Healthy on
//! node-b's ListAndWatch, as node-b's kubelet sees it (node-a's claim is
//! gone from the cluster).
//!
//! * `release/device-plugin`: kubelet removes the device-plugin pod (its
//!   object deleted) → free on node-b (node-a's agent learns of the end
//!   from the pod watch: the device plugin API has no Deallocate).
//! * `release/dra`: the claim's pod ends → kubelet's NodeUnprepareResources
//!   → free on node-b (kubelet tells the driver directly).
//! * `prepare`: the kubelet stand-in's admission of the claim's pod
//!   (NodePrepareResources: claim read from the API, slot claimed locally
//!   and in the cluster; plus the stand-in's own checkpoint and API writes).
//!
//! Both releases are timed from kubelet's action to the slot Healthy again,
//! concurrently with whatever kubelet does after (checkpoint, status).
//!
//! `STEWARD_BENCH_SMOKE=1` runs 10 rounds instead of 500.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/dp/mod.rs"]
mod dp;

use std::time::{Duration, Instant};

use dp::*;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use kube::api::DeleteParams;
use steward_testing_apiserver::dra_alloc::{allocate_claim, unreserve_claim};
use steward_testing_kubelet::{ContainerSpec, Phase, PodSpec};

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * (sorted.len() as f64 - 1.0)).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn summary(name: &str, v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let p50 = percentile(v, 50.0);
    println!(
        "{name:<28} p50={p50:.3}ms p99={:.3}ms max={:.3}ms n={}",
        percentile(v, 99.0),
        v.last().copied().unwrap_or(f64::NAN),
        v.len()
    );
    p50
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let smoke = std::env::var_os("STEWARD_BENCH_SMOKE").is_some();
    let rounds = std::env::var("STEWARD_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if smoke { 10 } else { 500 });
    let server = api_server().await;
    server.serve_dra();
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), "node-a", Some(server.client())).await;
    let other = Node::start(dir.path(), "node-b", Some(server.client())).await;
    let mut agents = Vec::new();
    for n in [&node, &other] {
        agents.push(Agent::start(dra_agent_config(
            n,
            dir.path(),
            server.client(),
            echo(true),
        )));
    }
    create_configuration(
        &server,
        &configuration("cams", "debug-echo", &echo_details(&["cam"]), 1),
    )
    .await;
    let inst = instance_of(&server, "cams", &["node-a", "node-b"]).await;
    let res = resource(&inst);
    let slot = format!("{}-0", inst.metadata.name.clone().unwrap());
    for n in [&node, &other] {
        n.kubelet
            .wait_for_resource(&res, |s| s.healthy.contains(&slot), WAIT)
            .await
            .unwrap();
    }
    node.kubelet
        .wait_for_dra_driver("steward.dev", WAIT)
        .await
        .unwrap();
    create_device_class(&server, "cams").await;
    wait_for_devices(&server, 1).await;
    let claims: Api<ResourceClaim> = Api::namespaced(server.client(), NS);

    let mut dp_release = Vec::new();
    let mut dra_release = Vec::new();
    let mut prepare = Vec::new();
    for i in 0..rounds {
        // Device plugin: admitted, attributed, then removed.
        let p = node
            .kubelet
            .add_pod(
                PodSpec::new(NS, format!("dp-{i}"))
                    .container(ContainerSpec::new("main").limit(&res, 1)),
            )
            .await
            .unwrap();
        wait_bound(&server, &slot, &p.uid).await;
        other
            .kubelet
            .wait_for_resource(&res, |s| s.unhealthy.contains(&slot), WAIT)
            .await
            .unwrap();
        // Timed to the slot being free on node-b, whatever kubelet still
        // does after (checkpoint, API writes).
        let t0 = Instant::now();
        let freed = async {
            other
                .kubelet
                .wait_for_resource(&res, |s| s.healthy.contains(&slot), WAIT)
                .await
                .unwrap();
            t0.elapsed()
        };
        let (deleted, freed) = tokio::join!(node.kubelet.delete_pod(&p.uid), freed);
        deleted.unwrap();
        dp_release.push(ms(freed));
        wait_released(&server, &slot).await;

        // DRA: claimed, scheduled, prepared at admission, then the pod ends.
        let name = format!("claim-{i}");
        create_claim(&server.client(), &name, "cams.default.steward.dev").await;
        let pod = format!("dra-{i}");
        let spec = PodSpec::new(NS, &pod)
            .resource_claim("cam", &name)
            .container(ContainerSpec::new("main").claim("cam"));
        let uid = node.kubelet.create_pod_object(&spec).await.unwrap();
        allocate_claim(&server.client(), NS, &name, &pod, &uid, "node-a")
            .await
            .unwrap();
        let t = Instant::now();
        node.kubelet.add_pod(spec.uid(&uid)).await.unwrap();
        prepare.push(ms(t.elapsed()));
        other
            .kubelet
            .wait_for_resource(&res, |s| s.unhealthy.contains(&slot), WAIT)
            .await
            .unwrap();
        let t0 = Instant::now();
        let freed = async {
            other
                .kubelet
                .wait_for_resource(&res, |s| s.healthy.contains(&slot), WAIT)
                .await
                .unwrap();
            t0.elapsed()
        };
        let (ended, freed) =
            tokio::join!(node.kubelet.terminate_pod(&uid, Phase::Succeeded), freed);
        ended.unwrap();
        dra_release.push(ms(freed));
        unreserve_claim(&server.client(), NS, &name, &uid)
            .await
            .unwrap();
        claims
            .delete(&name, &DeleteParams::default())
            .await
            .unwrap();
        node.kubelet.delete_pod(&uid).await.unwrap();
        wait_released(&server, &slot).await;
    }
    let dp = summary("release/device-plugin", &mut dp_release);
    let dra = summary("release/dra", &mut dra_release);
    summary("prepare", &mut prepare);
    println!(
        "release/dra vs release/device-plugin: p50 ratio {:.2}x",
        dra / dp
    );
    for a in agents {
        a.stop().await.unwrap();
    }
}
