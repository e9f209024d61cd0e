//! The extender's race (crates/steward-reservations/benches/extender.rs)
//! on the DRA path of KEP-5004: pods that ask for `steward.dev/<instance>:
//! 1`, unchanged, with shared Instances published as ResourceSlices (one
//! device per slot, each Instance one pool its three nodes select) and one
//! DeviceClass per Instance with `extendedResourceName`, as steward's agent
//! and controller write them. Two "schedulers" take every other pod; for
//! each, the stand-in scheduler's extended-resource step
//! (`dra_extended::schedule_extended_resources`) tries the Instance's nodes
//! in turn and the pod is bound where it succeeds. A shared Instance is one
//! pool, so its slots are counted once cluster-wide by the allocator itself.
//!
//! Runs twice in one process: one device per slot, then each Instance as
//! one device with consumable capacity (KEP-5075, `Layout::Consumable`).
//!
//! Counts over-commit (a device in more claims than it has room for: one
//! per slot device, its slots for a consumable one), stuck claims
//! (allocated for a pod that was not bound), pods placed per second, and
//! what the slices cost (devices, bytes stored).
//!
//! The stand-in allocator is serial (a process-wide lock, as kube-scheduler
//! is one active process with its in-memory assume cache), and it reads the
//! classes, slices and claims from the API for every pod: the rate is the
//! stand-in's, not kube-scheduler's.
//!
//! `STEWARD_BENCH_SMOKE=1` runs 20 pods on 2 Instances.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::{Value, json};
use steward_agent::dra::SlicePublisher;
use steward_core::dra::{DraInstance, Layout, consumable_device_name, device_name, plan_with};
use steward_leader::deviceclass::{ExtendedInstance, instance_class_for};
use steward_testing_apiserver::ApiServer;
use steward_testing_apiserver::dra_alloc::AllocError;
use steward_testing_apiserver::dra_extended::schedule_extended_resources;

const NS: &str = "default";

async fn race(
    layout: Layout,
    pods: usize,
    instances: usize,
    capacity: u32,
    nodes: usize,
    seen_by: usize,
) {
    let api = ApiServer::start().await.unwrap();
    api.serve_dra();
    let client = api.client();
    let names: Vec<String> = (0..nodes).map(|i| format!("n{i}")).collect();
    for n in &names {
        let node: Node = serde_json::from_value(json!({"metadata": {"name": n}})).unwrap();
        Api::<Node>::all(client.clone())
            .create(&PostParams::default(), &node)
            .await
            .unwrap();
    }
    let insts: Vec<DraInstance> = (0..instances)
        .map(|i| DraInstance {
            name: format!("cam{i}"),
            namespace: NS.into(),
            configuration: "cams".into(),
            capacity,
            nodes: (0..seen_by)
                .map(|k| names[(i * seen_by + k) % nodes].clone())
                .collect(),
            properties: BTreeMap::new(),
            held: BTreeSet::new(),
        })
        .collect();
    // What each node's agent publishes, and the controller's classes.
    for n in &names {
        let (plans, _) = plan_with(n, &insts, layout);
        SlicePublisher::new(client.clone(), n)
            .with_layout(layout)
            .sync(&plans)
            .await
            .unwrap();
    }
    for i in &insts {
        let class = instance_class_for(&ExtendedInstance {
            namespace: NS,
            name: &i.name,
            configuration: "cams",
        })
        .unwrap();
        Api::<DeviceClass>::all(client.clone())
            .create(&PostParams::default(), &class)
            .await
            .unwrap();
    }
    let mut all = Vec::new();
    for p in 0..pods {
        let inst = &insts[p % instances];
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": format!("r{p}"), "namespace": NS},
            "spec": {"containers": [{"name": "main", "image": "pause", "resources": {
                "requests": {format!("steward.dev/{}", inst.name): "1"},
                "limits": {format!("steward.dev/{}", inst.name): "1"},
            }}]},
        }))
        .unwrap();
        Api::<Pod>::namespaced(client.clone(), NS)
            .create(&PostParams::default(), &pod)
            .await
            .unwrap();
        all.push((
            format!("r{p}"),
            inst.nodes.iter().cloned().collect::<Vec<_>>(),
        ));
    }
    let advertised: u64 = insts
        .iter()
        .map(|i| u64::from(i.capacity) * i.nodes.len() as u64)
        .sum();
    let real: u64 = insts.iter().map(|i| u64::from(i.capacity)).sum();
    // What the slices cost: devices and bytes stored.
    let slices = Api::<ResourceSlice>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let devices: usize = slices
        .iter()
        .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
        .sum();
    let slice_bytes: usize = slices
        .iter()
        .map(|s| serde_json::to_vec(s).unwrap().len())
        .sum();
    // How many allocations each published device can take.
    let room: BTreeMap<String, usize> = insts
        .iter()
        .flat_map(|i| {
            if layout.one_device(i.capacity) {
                vec![(consumable_device_name(&i.name), i.capacity as usize)]
            } else {
                (0..i.capacity)
                    .map(|n| (device_name(&i.name, n), 1))
                    .collect()
            }
        })
        .collect();

    let started = Instant::now();
    let mut tasks = Vec::new();
    for sched in 0..2 {
        let client = client.clone();
        let mine: Vec<(String, Vec<String>)> = all.iter().skip(sched).step_by(2).cloned().collect();
        tasks.push(tokio::spawn(async move {
            let mut placed = 0usize;
            for (pod, nodes) in mine {
                for node in &nodes {
                    match schedule_extended_resources(&client, NS, &pod, node).await {
                        Ok(Some(_)) => {
                            let binding = json!({"apiVersion": "v1", "kind": "Binding",
                                "metadata": {"name": pod}, "target": {"kind": "Node", "name": node}});
                            let _: Value = Api::<Pod>::namespaced(client.clone(), NS)
                                .create_subresource("binding", &pod, &PostParams::default(), &binding)
                                .await
                                .unwrap();
                            placed += 1;
                            break;
                        }
                        Ok(None) => panic!("{pod}: nothing to allocate on {node}"),
                        Err(AllocError::Unsatisfiable { .. }) => {}
                        Err(e) => panic!("{pod} on {node}: {e}"),
                    }
                }
            }
            placed
        }));
    }
    let mut placed = 0;
    for t in tasks {
        placed += t.await.unwrap();
    }
    let elapsed = started.elapsed();

    // Over-commit and stuck claims, from what is stored.
    let claims = Api::<ResourceClaim>::namespaced(client.clone(), NS)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let bound: BTreeMap<String, bool> = Api::<Pod>::namespaced(client.clone(), NS)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|p| {
            (
                p.metadata.name.clone().unwrap_or_default(),
                p.spec.and_then(|s| s.node_name).is_some(),
            )
        })
        .collect();
    let mut per_device: BTreeMap<String, usize> = BTreeMap::new();
    let mut stuck = 0;
    for c in &claims {
        let results = c
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.clone())
            .unwrap_or_default();
        for r in &results {
            *per_device.entry(r.device.clone()).or_default() += 1;
        }
        let owner = c
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.kind == "Pod")
            .map(|o| o.name.clone())
            .unwrap_or_default();
        if !results.is_empty() && !bound.get(&owner).copied().unwrap_or(false) {
            stuck += 1;
        }
    }
    let over_commit: usize = per_device
        .iter()
        .map(|(d, n)| n.saturating_sub(room.get(d).copied().unwrap_or(0)))
        .sum();
    let bound_count = bound.values().filter(|b| **b).count();
    println!(
        "race-dra {layout:?} pods={pods} instances={instances}x{capacity} slots seen by {seen_by} of {nodes} nodes (advertised {advertised}, real {real}): placed {placed} (bound {bound_count}) in {:.2?} = {:.0} pods/s; over-commit {over_commit}; stuck {stuck}; claims {}; slices {} with {devices} devices, {slice_bytes} bytes",
        elapsed,
        placed as f64 / elapsed.as_secs_f64(),
        claims.len(),
        slices.len(),
    );
    assert_eq!(over_commit, 0, "a device allocated twice");
    assert_eq!(stuck, 0, "a claim allocated for a pod never bound");
    assert_eq!(
        placed as u64,
        real.min(pods as u64),
        "every real slot used once"
    );
    api.shutdown().await;
}

fn main() {
    let smoke = std::env::var_os("STEWARD_BENCH_SMOKE").is_some();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // One device per slot, then one consumable device per Instance
        // (KEP-5075), in the same run.
        for layout in [Layout::PerSlot, Layout::Consumable] {
            if smoke {
                race(layout, 20, 2, 2, 6, 3).await;
            } else {
                race(layout, 1000, 50, 2, 50, 3).await;
            }
        }
    });
}
