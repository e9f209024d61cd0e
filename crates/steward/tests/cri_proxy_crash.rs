//! Crash safety of the CRI proxy: the real `steward cri-proxy` process is
//! killed with SIGKILL at a random moment of a create/remove storm against
//! real containerd, then started again on the same state directory. After
//! each restart, what the runtime really applied is checked:
//!
//! * no exclusive CPU is held twice: an exclusive container's CPU is in no
//!   other container's cpuset;
//! * no container the runtime runs has lost its assignment: the restarted
//!   proxy shows each one on its pod resources socket with its CPUs;
//! * none is duplicated there.
//!
//! It runs its own containerd (a kill can leave a container half-started in
//! the runtime), and every runtime call is bounded.
//!
//! Rounds: `STEWARD_FAULT_ROUNDS` (default 8 in the suite; RELIABILITY.md
//! has a longer run).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use steward_core::cpu::CpuSet;
use steward_proto::cri::runtime::v1 as cri;
use steward_proto::podresources::v1 as wire;
use steward_proto::podresources::v1::pod_resources_lister_client::PodResourcesListerClient;
use steward_testing_containerd::{ContainerSpec, Containerd, PodNetwork, cleanup_pod, cri_client};
use tokio::process::{Child, Command};

const STEWARD: &str = env!("CARGO_BIN_EXE_steward");

/// Every runtime call is bounded: a call cut by the kill can leave a
/// container half-started in containerd, and a later call on it must not
/// hang the test.
const CALL: Duration = Duration::from_secs(15);

async fn bounded<T, E>(f: impl std::future::Future<Output = Result<T, E>>) -> Option<T> {
    match tokio::time::timeout(CALL, f).await {
        Ok(Ok(v)) => Some(v),
        _ => None,
    }
}

struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n.max(1)
    }
}

fn start(dir: &Path, runtime: &Path) -> Child {
    Command::new(STEWARD)
        .args(["cri-proxy", "--log", "warn"])
        .arg("--listen")
        .arg(dir.join("cri.sock"))
        .arg("--runtime")
        .arg(runtime)
        .arg("--state-dir")
        .arg(dir.join("state"))
        .arg("--config")
        .arg(dir.join("config.yaml"))
        .arg("--pod-resources-socket")
        .arg(dir.join("pr.sock"))
        .args(["--verify-interval", "0s"])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

async fn wait_for(path: &Path) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !path.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn container(sandbox: &cri::PodSandboxConfig, name: &str, exclusive: bool) -> cri::ContainerConfig {
    let mut c = ContainerSpec::new(name).build(sandbox);
    c.linux.get_or_insert_with(Default::default).resources = Some(cri::LinuxContainerResources {
        cpu_shares: if exclusive { 1024 } else { 256 },
        cpu_quota: if exclusive { 100_000 } else { 0 },
        cpu_period: if exclusive { 100_000 } else { 0 },
        memory_limit_in_bytes: 32 << 20,
        ..Default::default()
    });
    c
}

/// Creates, starts and removes pods through the proxy until it dies.
/// Returns the sandboxes it created (to clean up) — whatever happened.
async fn storm(
    sock: PathBuf,
    ctd_prefix: String,
    seed: u64,
    sandboxes: &tokio::sync::Mutex<Vec<(String, bool)>>,
    make: impl Fn(&str) -> cri::PodSandboxConfig,
) {
    let Ok((mut rt, _)) = cri_client(&sock).await else {
        return;
    };
    let mut rng = Lcg(seed);
    for i in 0.. {
        let live: Vec<String> = sandboxes
            .lock()
            .await
            .iter()
            .map(|(s, _)| s.clone())
            .collect();
        if !live.is_empty() && rng.next(3) == 0 {
            let sid = live[rng.next(live.len() as u64) as usize].clone();
            if bounded(cleanup_pod(&mut rt, &sid)).await.is_none() {
                return;
            }
            sandboxes.lock().await.retain(|(s, _)| s != &sid);
            continue;
        }
        let exclusive = rng.next(2) == 0;
        let sb = make(&format!("{ctd_prefix}-{i}"));
        let Some(r) = bounded(rt.run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(sb.clone()),
            runtime_handler: String::new(),
        }))
        .await
        else {
            return;
        };
        let sid = r.into_inner().pod_sandbox_id;
        sandboxes.lock().await.push((sid.clone(), exclusive));
        let created = tokio::time::timeout(
            CALL,
            rt.create_container(cri::CreateContainerRequest {
                pod_sandbox_id: sid.clone(),
                config: Some(container(&sb, "c", exclusive)),
                sandbox_config: Some(sb),
            }),
        )
        .await;
        match created {
            Ok(Ok(c)) => {
                let id = c.into_inner().container_id;
                if bounded(rt.start_container(cri::StartContainerRequest { container_id: id }))
                    .await
                    .is_none()
                {
                    return;
                }
            }
            // A second exclusive container does not fit on a small machine.
            Ok(Err(s)) if s.code() == tonic::Code::ResourceExhausted => {}
            _ => return,
        }
    }
}

/// cpuset of every running or created container of `sandboxes`, read from
/// the runtime itself.
async fn applied(
    direct: &mut cri::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>,
    sandboxes: &[(String, bool)],
) -> BTreeMap<String, (CpuSet, bool)> {
    let mut out = BTreeMap::new();
    for (sid, exclusive) in sandboxes {
        let Some(list) = bounded(direct.list_containers(cri::ListContainersRequest {
            filter: Some(cri::ContainerFilter {
                pod_sandbox_id: sid.clone(),
                ..Default::default()
            }),
        }))
        .await
        else {
            continue;
        };
        let list = list.into_inner().containers;
        for c in list {
            if c.state == cri::ContainerState::ContainerExited as i32 {
                continue;
            }
            let Some(status) = bounded(direct.container_status(cri::ContainerStatusRequest {
                container_id: c.id.clone(),
                verbose: false,
            }))
            .await
            else {
                continue;
            };
            let status = status.into_inner();
            let cpus = status
                .status
                .and_then(|s| s.resources)
                .and_then(|r| r.linux)
                .map(|l| l.cpuset_cpus)
                .unwrap_or_default();
            out.insert(c.id, (CpuSet::parse(&cpus).unwrap_or_default(), *exclusive));
        }
    }
    out
}

/// Removes every pod this test made (its sandboxes are named `crash…`).
async fn remove_crash_pods(
    rt: &mut cri::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>,
) {
    let Some(boxes) =
        bounded(rt.list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })).await
    else {
        return;
    };
    for b in boxes.into_inner().items {
        if b.metadata
            .as_ref()
            .is_some_and(|m| m.name.starts_with("crash"))
        {
            let _ = bounded(cleanup_pod(rt, &b.id)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_proxy_loses_and_duplicates_nothing_and_never_shares_an_exclusive_cpu() {
    let rounds: u64 = std::env::var("STEWARD_FAULT_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8);
    // A private containerd: a container left half-started by a kill stays
    // in this runtime, which goes away with the test.
    let ctd =
        std::sync::Arc::new(Containerd::start().expect("containerd (needs root and its packages)"));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.yaml"),
        "policy: { active: static }\n",
    )
    .unwrap();
    let (mut direct, _) = ctd.client().await.unwrap();
    let sandboxes = std::sync::Arc::new(tokio::sync::Mutex::new(Vec::<(String, bool)>::new()));
    let mut rng = Lcg(0x5eed_0c41);
    let (mut checked, mut exclusive_seen) = (0usize, 0usize);
    for round in 0..rounds {
        let mut child = start(dir.path(), ctd.sock());
        wait_for(&dir.path().join("cri.sock")).await;
        let sock = dir.path().join("cri.sock");
        let boxes = sandboxes.clone();
        let ctd2 = ctd.clone();
        let task = tokio::spawn(async move {
            storm(
                sock,
                format!("crash{round}"),
                round * 7919 + 1,
                &boxes,
                |p| ctd2.pod_config(p, PodNetwork::Host),
            )
            .await;
        });
        // Killed at a random moment of the storm (SIGKILL: no shutdown path).
        tokio::time::sleep(Duration::from_millis(50 + rng.next(400))).await;
        child.kill().await.unwrap();
        let _ = task.await;
        let _ = std::fs::remove_file(dir.path().join("cri.sock"));
        let _ = std::fs::remove_file(dir.path().join("pr.sock"));

        // Restarted on the same state: it re-syncs with the runtime.
        let mut child = start(dir.path(), ctd.sock());
        wait_for(&dir.path().join("pr.sock")).await;
        wait_for(&dir.path().join("cri.sock")).await;
        let live = sandboxes.lock().await.clone();
        let cpusets = applied(&mut direct, &live).await;
        // No exclusive CPU held twice, in what the runtime applied.
        for (id, (cpus, exclusive)) in &cpusets {
            if !*exclusive || cpus.len() != 1 {
                continue;
            }
            exclusive_seen += 1;
            for (other, (ocpus, _)) in &cpusets {
                if other != id {
                    assert!(
                        cpus.intersection(ocpus).is_empty(),
                        "round {round}: exclusive CPU {cpus} of {id} also in {other}'s {ocpus}"
                    );
                }
            }
        }
        // No assignment lost, none duplicated: the restarted proxy shows
        // every container the runtime runs, once, with its CPUs.
        let channel = steward_proto::uds::endpoint()
            .connect_with_connector(steward_proto::uds::UnixConnector::new(
                &dir.path().join("pr.sock"),
            ))
            .await
            .unwrap();
        let mut pr = PodResourcesListerClient::new(channel);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let pods = bounded(pr.list(wire::ListPodResourcesRequest {}))
                .await
                .expect("the restarted proxy answers List")
                .into_inner()
                .pod_resources;
            let mut shown: BTreeMap<String, usize> = BTreeMap::new();
            // Every container the proxy holds is listed once; only an
            // exclusive one carries CPUs (a container on the shared pool
            // is listed with none, as kubelet lists one).
            for p in &pods {
                for c in &p.containers {
                    *shown
                        .entry(format!("{}/{}/{}", p.namespace, p.name, c.name))
                        .or_default() += 1;
                }
            }
            assert!(
                shown.values().all(|n| *n == 1),
                "round {round}: duplicated: {shown:?}"
            );
            let running = cpusets.len();
            let listed = shown.len();
            if listed >= running {
                checked += running;
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "round {round}: the runtime runs {running} containers, the restarted proxy lists {listed}: {pods:#?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Clean this round's pods up through the restarted proxy, including
        // any created while it died before the storm recorded them.
        if let Ok((mut rt, _)) = cri_client(dir.path().join("cri.sock")).await {
            remove_crash_pods(&mut rt).await;
        }
        sandboxes.lock().await.clear();
        child.kill().await.unwrap();
        let _ = std::fs::remove_file(dir.path().join("cri.sock"));
        let _ = std::fs::remove_file(dir.path().join("pr.sock"));
    }
    remove_crash_pods(&mut direct).await;
    eprintln!(
        "cri-proxy crash storm: {rounds} rounds, {checked} containers checked after restarts ({exclusive_seen} exclusive), 0 lost, 0 duplicated, 0 exclusive CPUs shared"
    );
    assert!(checked > 0, "the storm never got a container running");
}
