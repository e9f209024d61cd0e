//! kubelet's own CRI client against containerd 2.1.9 with the resource
//! manager attached as an NRI plugin: the Go peer `cri-client`
//! (k8s.io/cri-client's RemoteRuntimeService, as kubelet dials its
//! runtime) talks straight to a private containerd 2.1.9 (NRI mode changes
//! nothing on kubelet's side: no proxy in between) to which the real
//! `steward nri-plugin` process is attached, and runs one exclusive-CPU pod
//! through its life, holding once its container runs.
//!
//! While the peer holds, the test checks from outside that the exclusive
//! container runs on one CPU that is the one it saw inside
//! (`Cpus_allowed_list`), the one in its cgroup `cpuset.cpus` and the one
//! the plugin publishes on its pod resources socket, and that a shared
//! (Burstable) container created before it lost that CPU. Then, the peer
//! still holding, the plugin is killed (SIGKILL) and started again on the
//! same state, and containerd is killed and started again (its shims live
//! on; the plugin reconnects and is synchronised): after each, the same
//! checks. The peer then goes on over its reconnected connection (kubelet's
//! update, streaming URLs, stats, stop, removal); at the end the shared pool
//! has grown back and nothing of the peer's pod is left.
//!
//! Needs the built peer (`STEWARD_GO_PEERS`), containerd 2.1.9 and root;
//! outside CI a missing one is a loud skip, under CI a failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod go_cri;

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Instant;

use common::{Proc, eventually};
use go_cri::{CALLS, POD_UID_LABEL, Peer, WAIT, cpuset, cpuset_of, field, published, published_is};
use serde_json::Value;
use steward_core::cpu::CpuSet;
use steward_proto::cri::runtime::v1 as cri;
use steward_testing_containerd::{
    Containerd2, PodNetwork, bin_dir_or_skip, cleanup_pod, cri_client, exec_sync, own_pods,
    pod_sandbox_config, unique_name,
};

type Rt = cri::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>;

/// The plugin's line after each Synchronize (at every connect).
const SYNCED: &str = "synchronized with the runtime";
/// The plugin's line when Synchronize finds an exclusive container
/// unpinned (fail-open): none is expected here.
const FAIL_OPEN: &str = "an exclusive container runs without its CPUs";

/// `steward nri-plugin` on `nri`, its state and configuration in `dir`,
/// serving pod resources on `pr_sock`; killed by PID when dropped.
fn start_plugin(dir: &Path, nri: &Path, pr_sock: &Path, log: PathBuf) -> Proc {
    let args: Vec<OsString> = vec![
        "nri-plugin".into(),
        "--nri-socket".into(),
        nri.into(),
        "--nri-name".into(),
        "steward-gocri".into(),
        "--state-dir".into(),
        dir.join("state").into(),
        "--config".into(),
        dir.join("config.yaml").into(),
        "--pod-resources-socket".into(),
        pr_sock.into(),
        "--verify-interval".into(),
        "0s".into(),
    ];
    Proc::spawn("nri-plugin", &args, &[], log).unwrap()
}

/// Waits until the plugin has logged [`SYNCED`] more than `before` times.
async fn synchronized(plugin: &Proc, before: usize) {
    eventually("the plugin synchronized with the runtime", WAIT, || async {
        (plugin.log_count(SYNCED) > before).then_some(())
    })
    .await
    .unwrap();
}

/// `Cpus_allowed_list` of the container's first process, through ExecSync.
async fn inside(rt: &mut Rt, cid: &str) -> CpuSet {
    let out = exec_sync(rt, cid, &["cat", "/proc/1/status"])
        .await
        .unwrap();
    let list = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap_or_else(|| panic!("no Cpus_allowed_list in {:?}", out.stdout));
    cpuset(list.trim())
}

/// What must hold while the exclusive pod runs.
struct Expected<'a> {
    pr_sock: &'a Path,
    /// The exclusive container: pod name, cgroup parent, id, its CPU.
    name: &'a str,
    parent: &'a str,
    cid: &'a str,
    excl: &'a CpuSet,
    /// The shared container: pod name, cgroup parent, id, its shrunk pool.
    shared_name: &'a str,
    shared_parent: &'a str,
    shared_cid: &'a str,
    shrunk: &'a CpuSet,
}

impl Expected<'_> {
    /// The exclusive CPU in the container's cgroup, inside it and on the
    /// plugin's pod resources socket; the shared container's cgroup is the
    /// pool without it, and it is published with no CPUs (as kubelet
    /// reports a container on the shared pool).
    async fn holds(&self, stage: &str, rt: &mut Rt) {
        let held = eventually(&format!("{stage}: the assignments"), WAIT, || async {
            (cpuset_of(self.parent, self.cid).as_ref() == Some(self.excl)
                && cpuset_of(self.shared_parent, self.shared_cid).as_ref() == Some(self.shrunk)
                && published_is(self.pr_sock, self.name, "main", Some(self.excl)).await
                && published_is(
                    self.pr_sock,
                    self.shared_name,
                    "shared",
                    Some(&CpuSet::default()),
                )
                .await)
                .then_some(())
        })
        .await;
        if let Err(e) = held {
            panic!(
                "{e}: exclusive cgroup {:?} (want {}), shared cgroup {:?} (want {}), published {:?} / {:?}",
                cpuset_of(self.parent, self.cid),
                self.excl,
                cpuset_of(self.shared_parent, self.shared_cid),
                self.shrunk,
                published(self.pr_sock, self.name, "main").await.ok(),
                published(self.pr_sock, self.shared_name, "shared")
                    .await
                    .ok(),
            );
        }
        assert_eq!(&inside(rt, self.cid).await, self.excl, "{stage}: inside");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelets_cri_client_runs_an_exclusive_pod_on_containerd_2_with_the_nri_plugin() {
    let Some(peer) = steward_testing_gopeers::binary("cri-client") else {
        return;
    };
    let Some(bin) = bin_dir_or_skip("go_cri_client_nri") else {
        return;
    };
    // Dropped last (also on panic): containerd, its shims and its cgroups
    // stopped and removed, the peer's pod and the shared one with them.
    let mut ctrd = Containerd2::start(bin);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.yaml"),
        "policy: { active: static }\n",
    )
    .unwrap();
    let pr_sock = dir.path().join("pr.sock");
    let nri = ctrd.nri_sock();
    // Killed by PID when dropped (before containerd).
    let mut plugin = start_plugin(dir.path(), &nri, &pr_sock, dir.path().join("plugin1.log"));
    synchronized(&plugin, 0).await;
    let (mut rt, _) = cri_client(ctrd.sock()).await.unwrap();

    // A shared (Burstable, half a CPU) container, straight on containerd.
    let shared = go_cri::start_shared(
        &mut rt,
        pod_sandbox_config(&ctrd.cgroup_parent, "gocri-nri-shared", PodNetwork::Host),
    )
    .await;
    let (shared_name, shared_parent, shared_sid, shared_cid) = (
        shared.name,
        shared.parent,
        shared.sandbox_id,
        shared.container_id,
    );
    let pool = cpuset_of(&shared_parent, &shared_cid).expect("the shared container's cpuset");
    assert!(
        pool.len() >= 2,
        "the shared pool {pool} must have room for one exclusive CPU"
    );
    // A container on the shared pool is published with no CPUs, as kubelet
    // reports one; its cgroup holds the pool.
    eventually("the shared container published", WAIT, || async {
        published_is(&pr_sock, &shared_name, "shared", Some(&CpuSet::default()))
            .await
            .then_some(())
    })
    .await
    .unwrap();

    // kubelet's CRI client, straight to containerd.
    let name = unique_name("gocri-nri");
    let uid = format!("uid-{name}");
    let mut peer = Peer::spawn(&peer, &ctrd.sock(), &ctrd.cgroup_parent, &name, &uid);
    let mut seen: Vec<Value> = Vec::new();
    let mut exclusive: Option<CpuSet> = None;
    let mut parent = String::new();
    let (mut kill_resync, mut restart_resync) = (None, None);
    while let Some(line) = peer.next_line(&seen).await {
        match field(&line, "call") {
            "RunPodSandbox" => parent = field(&line, "cgroup_parent").to_owned(),
            "ContainerStatus" => eprintln!(
                "the runtime's status of the exclusive container: cpuset {:?}",
                line["cpuset_cpus"]
            ),
            "ExecSync" => {
                let cpus = cpuset(field(&line, "cpus_allowed_list"));
                assert_eq!(cpus.len(), 1, "one exclusive CPU seen inside: {line}");
                assert!(
                    pool.contains(cpus.iter().next().unwrap()),
                    "{cpus} in {pool}"
                );
                exclusive = Some(cpus);
            }
            "Hold" => {
                let cid = field(&line, "container_id").to_owned();
                let excl = exclusive.clone().expect("ExecSync before Hold");
                // The cgroup holds what the container saw.
                assert_eq!(
                    cpuset_of(&parent, &cid).as_ref(),
                    Some(&excl),
                    "{parent}/{cid}"
                );
                let shrunk = pool.difference(&excl);
                let expected = Expected {
                    pr_sock: &pr_sock,
                    name: &name,
                    parent: &parent,
                    cid: &cid,
                    excl: &excl,
                    shared_name: &shared_name,
                    shared_parent: &shared_parent,
                    shared_cid: &shared_cid,
                    shrunk: &shrunk,
                };
                expected.holds("while the peer holds", &mut rt).await;

                // SIGKILL: no goodbye, the cache as last saved; a new
                // plugin on the same state is synchronised and keeps both
                // assignments.
                plugin.sigkill().unwrap();
                let t0 = Instant::now();
                plugin = start_plugin(dir.path(), &nri, &pr_sock, dir.path().join("plugin2.log"));
                synchronized(&plugin, 0).await;
                kill_resync = Some(t0.elapsed());
                expected.holds("after the plugin's kill -9", &mut rt).await;

                // containerd killed and started again (its shims live on):
                // the plugin reconnects, is synchronised again, and the
                // assignments stay.
                let before = plugin.log_count(SYNCED);
                let t0 = Instant::now();
                tokio::task::block_in_place(|| ctrd.restart());
                synchronized(&plugin, before).await;
                restart_resync = Some(t0.elapsed());
                let (fresh, _) = cri_client(ctrd.sock()).await.unwrap();
                rt = fresh;
                expected
                    .holds("after the containerd restart", &mut rt)
                    .await;
                assert_eq!(
                    plugin.log_count(FAIL_OPEN),
                    0,
                    "nothing was created while the plugin was away: {}",
                    plugin.log()
                );
                // The peer's connection broke with the restart: grpc-go
                // dials again on its next call.
                peer.go_on().await;
            }
            "UpdateContainerResources" => assert_eq!(
                Some(cpuset(field(&line, "cpus_allowed_list"))),
                exclusive,
                "kubelet's update kept the exclusive CPU: {line}"
            ),
            "Exec" | "Attach" | "PortForward" => {
                let url = field(&line, "url");
                assert!(url.starts_with("http://"), "a streaming URL: {line}");
            }
            _ => {}
        }
        seen.push(line);
    }
    peer.exited_ok(&seen).await;
    let calls: Vec<&str> = seen.iter().map(|l| field(l, "call")).collect();
    assert_eq!(calls, CALLS, "{seen:?}");
    eprintln!(
        "kubelet's CRI client on containerd {} with the NRI plugin: {} calls, exclusive CPU {} of {pool}; \
         plugin kill -9 to synchronised {:?}, containerd restart to synchronised {:?}",
        seen[0]["runtime_version"],
        calls.len(),
        exclusive
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default(),
        kill_resync.unwrap(),
        restart_resync.unwrap(),
    );

    // Removed: the pool grows back and the pod is no longer published.
    eventually("the shared pool grew back", WAIT, || async {
        (cpuset_of(&shared_parent, &shared_cid).as_ref() == Some(&pool)
            && published_is(&pr_sock, &shared_name, "shared", Some(&CpuSet::default())).await
            && published_is(&pr_sock, &name, "main", None).await)
            .then_some(())
    })
    .await
    .unwrap();
    assert_eq!(
        inside(&mut rt, &shared_cid).await,
        pool,
        "the shared pool inside"
    );

    // Nothing of the peer's pod is left in the runtime.
    let by_uid = HashMap::from([(POD_UID_LABEL.to_owned(), uid.clone())]);
    let sandboxes = rt
        .list_pod_sandbox(cri::ListPodSandboxRequest {
            filter: Some(cri::PodSandboxFilter {
                label_selector: by_uid.clone(),
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .items;
    assert!(sandboxes.is_empty(), "left in containerd: {sandboxes:?}");
    let containers = rt
        .list_containers(cri::ListContainersRequest {
            filter: Some(cri::ContainerFilter {
                label_selector: by_uid,
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .containers;
    assert!(containers.is_empty(), "left in containerd: {containers:?}");

    cleanup_pod(&mut rt, &shared_sid).await.unwrap();
    let left = own_pods(&mut rt, &std::process::id().to_string())
        .await
        .unwrap();
    assert!(left.is_empty(), "pods of this test left: {left:?}");
    // The pod cgroup kubelet would remove (containerd leaves it).
    for controller in ["cpuset", "cpu", "cpuacct", "memory", "pids", "blkio"] {
        let _ = std::fs::remove_dir(format!("/sys/fs/cgroup/{controller}{parent}"));
    }
}
