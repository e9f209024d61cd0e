//! An in-place upgrade of a node with running pods and held slots: the
//! agent and the CRI resource manager (`steward agent`, `steward cri-proxy`,
//! real processes) of one release are stopped the way a DaemonSet rollout
//! stops them (SIGTERM) and the next release's binaries start on the same
//! state directories. The kubelet stand-in holds two pods with a slot each
//! (Allocate over the device plugin wire), the real containerd runs a
//! Guaranteed container with an exclusive CPU and a Burstable one, both
//! created through the proxy.
//!
//! The node store is left as 0.1.0 wrote it (no format marker) before the
//! new agent starts, so the upgrade also crosses the format step. Both
//! releases are this build, copied to two paths: what differs between
//! releases on disk is the format, which the fixture tests
//! (`node_store_format`, `cache_format`, the CDI spec test) cover with files
//! the previous release wrote.
//!
//! After the upgrade: every SlotClaim is the same object (0 claims lost),
//! kubelet still sees both slots as held by their pods, every container has
//! the same CPUs in what the runtime applied and in the new proxy's view
//! (0 exclusive CPUs moved), and the node admits a new pod into the slot a
//! deleted pod freed.

mod common;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use common::*;
use kube::Api;
use kube::api::ListParams;
use steward_api::SlotClaim;
use steward_proto::cri::runtime::v1 as cri;
use steward_proto::podresources::v1 as wire;
use steward_proto::podresources::v1::pod_resources_lister_client::PodResourcesListerClient;
use steward_testing_containerd::{ContainerSpec, Containerd, PodNetwork, cleanup_pod, cri_client};
use steward_testing_kubelet::{ContainerSpec as KubeletContainer, Kubelet, KubeletConfig, PodSpec};

const NODE: &str = "node-up";

/// One release's binary: a copy of the build under test at its own path.
fn release(dir: &Path, name: &str) -> anyhow::Result<PathBuf> {
    let to = dir.join(name).join("steward");
    std::fs::create_dir_all(to.parent().context("release dir")?)?;
    std::fs::copy(STEWARD, &to).with_context(|| format!("copying {STEWARD}"))?;
    Ok(to)
}

struct Node {
    dir: PathBuf,
    kubeconfig: PathBuf,
    kubelet_dir: PathBuf,
    runtime: PathBuf,
}

impl Node {
    fn proxy(&self, binary: &Path, label: &str) -> anyhow::Result<Proc> {
        let d = &self.dir;
        let args: Vec<OsString> = vec![
            "cri-proxy".into(),
            "--listen".into(),
            d.join("cri.sock").into(),
            "--runtime".into(),
            self.runtime.clone().into(),
            "--state-dir".into(),
            d.join("resmgr-state").into(),
            "--config".into(),
            d.join("resmgr.yaml").into(),
            "--pod-resources-socket".into(),
            d.join("cri-pr.sock").into(),
            "--verify-interval".into(),
            "0s".into(),
        ];
        Proc::spawn_binary(label, binary, &args, &[], d.join(format!("{label}.log")))
    }

    fn agent(&self, binary: &Path, label: &str) -> anyhow::Result<Proc> {
        let d = &self.dir;
        let args: Vec<OsString> = vec![
            "agent".into(),
            "--node-name".into(),
            NODE.into(),
            "--state-dir".into(),
            d.join("agent-state").into(),
            "--registration-socket".into(),
            d.join("registration.sock").into(),
            "--embedded".into(),
            "debug-echo".into(),
            "--kubelet-dir".into(),
            self.kubelet_dir.clone().into(),
            "--cdi-dir".into(),
            d.join("cdi").into(),
            "--pod-resources-socket".into(),
            d.join("pr.sock").into(),
            "--cri-pod-resources-socket".into(),
            d.join("cri-pr.sock").into(),
        ];
        Proc::spawn_binary(
            label,
            binary,
            &args,
            &[("KUBECONFIG", self.kubeconfig.clone().into())],
            d.join(format!("{label}.log")),
        )
    }
}

/// Polls `f` until it gives a value; an error counts as "not yet" and the
/// last one is in the timeout's message.
async fn until<T, F, Fut>(what: &str, mut f: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = Instant::now() + WAIT;
    let mut last = None;
    loop {
        match f().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last = Some(e),
        }
        if Instant::now() > deadline {
            bail!("timed out after {WAIT:?} waiting for {what} (last error: {last:?})");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// SIGTERM, as the kubelet stops a pod of a rolled DaemonSet, then the exit.
async fn stop(p: &mut Proc) -> anyhow::Result<()> {
    p.sigterm()?;
    let status = p.wait_exit(Duration::from_secs(30)).await?;
    ensure!(status.success(), "stopped with {status}");
    Ok(())
}

/// Back to the shape steward 0.1.0 left: no format marker.
fn as_written_by_0_1_0(state_dir: &Path) -> anyhow::Result<()> {
    use redb::TableHandle;
    let db = redb::Database::open(state_dir.join(steward_agent::node_store::STATE_FILE))?;
    let txn = db.begin_write()?;
    let meta = txn
        .list_tables()?
        .find(|t| t.name() == "steward_meta")
        .context("the running agent marked its store")?;
    txn.delete_table(meta)?;
    txn.commit()?;
    Ok(())
}

/// SlotClaims of the node: name → (holder pod uid, epoch, resourceVersion).
async fn slot_claims(
    cluster: &Cluster,
) -> anyhow::Result<BTreeMap<String, (Option<String>, u64, Option<String>)>> {
    let api: Api<SlotClaim> = Api::namespaced(cluster.client(), NS);
    Ok(api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|c| c.spec.node == NODE)
        .map(|c| {
            (
                c.metadata.name.clone().unwrap_or_default(),
                (
                    c.spec.pod.as_ref().map(|p| p.uid.clone()),
                    c.spec.epoch,
                    c.metadata.resource_version.clone(),
                ),
            )
        })
        .collect())
}

/// The CPUs the runtime applied to `container`.
async fn applied_cpus(
    rt: &mut cri::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>,
    container: &str,
) -> anyhow::Result<String> {
    let status = rt
        .container_status(cri::ContainerStatusRequest {
            container_id: container.to_owned(),
            verbose: false,
        })
        .await?
        .into_inner();
    Ok(status
        .status
        .and_then(|s| s.resources)
        .and_then(|r| r.linux)
        .map(|l| l.cpuset_cpus)
        .unwrap_or_default())
}

/// The resource manager's view: pod name → CPUs of its container.
async fn proxy_view(sock: &Path) -> anyhow::Result<BTreeMap<String, Vec<i64>>> {
    let channel = steward_proto::uds::endpoint()
        .connect_with_connector(steward_proto::uds::UnixConnector::new(sock))
        .await?;
    let pods = PodResourcesListerClient::new(channel)
        .list(wire::ListPodResourcesRequest {})
        .await?
        .into_inner()
        .pod_resources;
    Ok(pods
        .into_iter()
        .filter_map(|p| {
            // A container on the shared pool is listed with no CPUs (as
            // kubelet lists one); the pinned one with its exclusive CPU.
            let c = p.containers.into_iter().next()?;
            let mut cpus = c.cpu_ids;
            cpus.sort();
            Some((p.name, cpus))
        })
        .collect())
}

/// Runs one container through the proxy; returns (sandbox, container).
async fn run_pod(
    rt: &mut cri::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>,
    sandbox: &cri::PodSandboxConfig,
    exclusive: bool,
) -> anyhow::Result<(String, String)> {
    let mut c = ContainerSpec::new("main").build(sandbox);
    c.linux.get_or_insert_with(Default::default).resources = Some(cri::LinuxContainerResources {
        cpu_shares: if exclusive { 1024 } else { 256 },
        cpu_quota: if exclusive { 100_000 } else { 0 },
        cpu_period: 100_000,
        memory_limit_in_bytes: 32 << 20,
        ..Default::default()
    });
    let sid = rt
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(sandbox.clone()),
            runtime_handler: String::new(),
        })
        .await?
        .into_inner()
        .pod_sandbox_id;
    let cid = rt
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sid.clone(),
            config: Some(c),
            sandbox_config: Some(sandbox.clone()),
        })
        .await?
        .into_inner()
        .container_id;
    rt.start_container(cri::StartContainerRequest {
        container_id: cid.clone(),
    })
    .await?;
    Ok((sid, cid))
}

/// Removes the test's sandboxes through containerd itself, even after a
/// failure half way.
struct Sandboxes {
    runtime: PathBuf,
    ids: Vec<String>,
}

impl Drop for Sandboxes {
    fn drop(&mut self) {
        let ids = std::mem::take(&mut self.ids);
        if ids.is_empty() {
            return;
        }
        let runtime = self.runtime.clone();
        // Drop runs inside the test's runtime: clean up on a thread of its own.
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                if let Ok((mut c, _)) = cri_client(&runtime).await {
                    for id in ids {
                        let _ =
                            tokio::time::timeout(Duration::from_secs(20), cleanup_pod(&mut c, &id))
                                .await;
                    }
                }
            });
        })
        .join();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_and_resource_manager_upgraded_in_place_lose_no_claim_and_move_no_cpu()
-> anyhow::Result<()> {
    let ctd = Containerd::shared().context("containerd (needs root and its packages)")?;
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().to_path_buf();
    std::fs::write(dir.join("resmgr.yaml"), "policy: { active: static }\n")?;
    let cluster = Cluster::start(&dir).await?;
    cluster.create_node(NODE).await?;
    let kubelet_dir = dir.join("kubelet");
    let kubelet = Kubelet::start(KubeletConfig {
        root_dir: kubelet_dir.clone(),
        node_name: NODE.into(),
        api: Some(cluster.client()),
    })
    .await?;
    let node = Node {
        dir: dir.clone(),
        kubeconfig: cluster.kubeconfig.clone(),
        kubelet_dir,
        runtime: ctd.sock().to_path_buf(),
    };
    let (old, new) = (release(&dir, "release-a")?, release(&dir, "release-b")?);

    // Release A: the proxy in front of containerd, the agent serving one
    // Instance of two slots.
    let mut proxy = node.proxy(&old, "cri-proxy-a")?;
    let mut agent = node.agent(&old, "agent-a")?;
    let mut conf = configuration("cams", "debug-echo", &echo_details(&["cam"], None));
    conf.spec.capacity = 2;
    cluster.create_configuration(&conf).await?;
    let inst = until("the Instance", || async {
        Ok(cluster.instances_of("cams").await?.into_iter().next())
    })
    .await?;
    let instance = inst.metadata.name.clone().context("instance name")?;
    let res = format!("steward.dev/{instance}");
    kubelet
        .wait_for_resource(&res, |s| s.healthy.len() == 2 && s.connected, WAIT)
        .await
        .context("release A serves the Instance")?;

    // Two pods hold the two slots.
    let mut holders = BTreeMap::new();
    for name in ["holder-a", "holder-b"] {
        let pod = kubelet
            .add_pod(PodSpec::new(NS, name).container(KubeletContainer::new("main").limit(&res, 1)))
            .await?;
        holders.insert(name, pod.uid);
    }
    let claims_before = until("both slots claimed with their holders", || async {
        let claims = slot_claims(&cluster).await?;
        Ok((claims.len() == 2 && claims.values().all(|(pod, ..)| pod.is_some())).then_some(claims))
    })
    .await?;

    // Two containers through the proxy: one with an exclusive CPU.
    let (mut rt, _) = until("the proxy's socket", || async {
        Ok(Some(cri_client(dir.join("cri.sock")).await?))
    })
    .await?;
    let mut sandboxes = Sandboxes {
        runtime: node.runtime.clone(),
        ids: Vec::new(),
    };
    let pinned = ctd.pod_config("upgrade-pinned", PodNetwork::Host);
    let (sid, pinned_c) = run_pod(&mut rt, &pinned, true).await?;
    sandboxes.ids.push(sid);
    let shared = ctd.pod_config("upgrade-shared", PodNetwork::Host);
    let (sid, shared_c) = run_pod(&mut rt, &shared, false).await?;
    sandboxes.ids.push(sid);
    let (mut direct, _) = cri_client(&node.runtime).await?;
    let cpus_before = (
        applied_cpus(&mut direct, &pinned_c).await?,
        applied_cpus(&mut direct, &shared_c).await?,
    );
    let view_before = until("both containers in the proxy's view", || async {
        let v = proxy_view(&dir.join("cri-pr.sock")).await?;
        Ok((v.len() >= 2).then_some(v))
    })
    .await?;
    let pinned_name = pinned.metadata.as_ref().context("meta")?.name.clone();
    ensure!(
        view_before.get(&pinned_name).map(Vec::len) == Some(1),
        "one exclusive CPU for the pinned container: {view_before:?}"
    );

    // The upgrade: release A stops, release B starts on the same state.
    let registrations = kubelet
        .resource(&res)
        .context("kubelet knows the resource")?
        .registrations;
    let started = Instant::now();
    stop(&mut agent).await.context("stopping agent A")?;
    stop(&mut proxy).await.context("stopping cri-proxy A")?;
    as_written_by_0_1_0(&dir.join("agent-state"))?;
    let _proxy = node.proxy(&new, "cri-proxy-b")?;
    let agent = node.agent(&new, "agent-b")?;
    let after = kubelet
        .wait_for_resource(
            &res,
            |s| s.registrations > registrations && s.connected && s.healthy.len() == 2,
            WAIT,
        )
        .await
        .context("release B registers with kubelet")?;
    let window = started.elapsed();
    ensure!(
        agent.log_count("node store from before format markers") == 1,
        "the new agent read 0.1.0's store"
    );

    // 0 claims lost: the same SlotClaim objects, the same holders, not
    // rewritten.
    ensure!(
        slot_claims(&cluster).await? == claims_before,
        "claims changed across the upgrade"
    );
    // kubelet still sees both slots held by their pods: nothing to admit.
    ensure!(after.healthy.len() == 2, "{after:?}");
    for uid in holders.values() {
        ensure!(
            kubelet.allocated(uid).is_some(),
            "pod {uid} lost its devices in kubelet"
        );
    }
    // The new agent answers for the held slots on its pod resources socket.
    let held = until("the new agent's view of the held slots", || async {
        let channel = steward_proto::uds::endpoint()
            .connect_with_connector(steward_proto::uds::UnixConnector::new(&dir.join("pr.sock")))
            .await?;
        let pods = PodResourcesListerClient::new(channel)
            .list(wire::ListPodResourcesRequest {})
            .await?
            .into_inner()
            .pod_resources;
        let with_slot: Vec<String> = pods
            .iter()
            .filter(|p| {
                p.containers
                    .iter()
                    .flat_map(|c| &c.devices)
                    .any(|d| d.resource_name == res)
            })
            .map(|p| p.name.clone())
            .collect();
        Ok((with_slot.len() == 2).then_some(with_slot))
    })
    .await?;
    ensure!(held.len() == 2);

    // 0 exclusive CPUs moved: what the runtime applied and the new proxy's
    // view are what they were.
    let view_after = until("both containers in the new proxy's view", || async {
        let v = proxy_view(&dir.join("cri-pr.sock")).await?;
        Ok((v.len() >= 2).then_some(v))
    })
    .await?;
    ensure!(
        view_after == view_before,
        "CPUs moved: {view_before:?} → {view_after:?}"
    );
    let cpus_after = (
        applied_cpus(&mut direct, &pinned_c).await?,
        applied_cpus(&mut direct, &shared_c).await?,
    );
    ensure!(
        cpus_after == cpus_before,
        "applied cpusets moved: {cpus_before:?} → {cpus_after:?}"
    );
    let exclusive = steward_core::cpu::CpuSet::parse(&cpus_after.0)?;
    let pool = steward_core::cpu::CpuSet::parse(&cpus_after.1)?;
    ensure!(
        exclusive.len() == 1 && exclusive.intersection(&pool).is_empty(),
        "the exclusive CPU {exclusive} is shared with {pool}"
    );

    // The upgraded node admits: a deleted holder's slot goes to a new pod,
    // and a new container runs through the new proxy.
    kubelet.delete_pod(&holders["holder-b"]).await?;
    let gone = holders["holder-b"].clone();
    until(
        "the deleted holder's claim released by the new agent",
        || async {
            let claims = slot_claims(&cluster).await?;
            Ok((claims.len() == 1
                && claims
                    .values()
                    .all(|(pod, ..)| pod.as_deref() != Some(gone.as_str())))
            .then_some(()))
        },
    )
    .await?;
    let newcomer = kubelet
        .add_pod(
            PodSpec::new(NS, "newcomer").container(KubeletContainer::new("main").limit(&res, 1)),
        )
        .await?;
    ensure!(!newcomer.devices.is_empty(), "the newcomer got no device");
    let (mut rt, _) = cri_client(dir.join("cri.sock")).await?;
    let late = ctd.pod_config("upgrade-late", PodNetwork::Host);
    let (sid, _) = run_pod(&mut rt, &late, false).await?;
    sandboxes.ids.push(sid);
    if applied_cpus(&mut direct, &pinned_c).await? != cpus_before.0 {
        bail!("the pinned container's CPUs moved when a new pod started");
    }
    eprintln!(
        "in-place upgrade: 2 claims kept, 0 lost; CPUs unchanged (CPU {} exclusive to the pinned container); node re-served to kubelet {:.0} ms after the old agent was told to stop",
        cpus_before.0,
        window.as_secs_f64() * 1e3
    );
    drop(sandboxes);
    Ok(())
}
