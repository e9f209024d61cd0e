//! steward-nri against a real containerd 2.1.9: the plugin registers, is
//! synchronised, sees a pod and its container created through CRI (a CRI
//! client of the test's own, not the plugin), and the cpuset its
//! CreateContainer answer sets is what the container runs with (cgroup v1
//! `cpuset.cpus` and the process's `Cpus_allowed_list`); an unsolicited
//! UpdateContainers re-pins it, and a plugin that reconnects is synchronised
//! with the pod and the container's current cpuset. A plugin slower than the
//! runtime's 2 s request timeout is disconnected and the container created
//! without its adjustment (fail-open).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

use std::sync::Mutex;
use std::time::{Duration, Instant};

use steward_nri::proto::nri::{
    ConfigureRequest, Container, ContainerAdjustment, ContainerUpdate, CreateContainerRequest,
    CreateContainerResponse, Event, LinuxContainerAdjustment, LinuxContainerUpdate, LinuxCpu,
    LinuxResources, PodSandbox, StateChangeEvent,
};
use steward_nri::{EventMask, Handler, RpcStatus, Session, SessionConfig};
use steward_testing_containerd as harness;
use tokio::sync::mpsc;

/// What the handler saw, in order.
#[derive(Debug, Clone, PartialEq)]
enum Seen {
    Configure {
        runtime: String,
        version: String,
        request_timeout_ms: i64,
    },
    Synchronize {
        pods: usize,
        /// Each container's name and cpuset, as the runtime reports them.
        containers: Vec<(String, String)>,
    },
    State(Event, String),
    Create(String, Duration),
}

struct Recorder {
    tx: mpsc::UnboundedSender<Seen>,
    seen: Mutex<Vec<Seen>>,
    /// How long CreateContainer takes to answer (the timeout path).
    delay: Duration,
}

impl Recorder {
    fn note(&self, s: Seen) {
        if let Ok(mut v) = self.seen.lock() {
            v.push(s.clone());
        }
        let _ = self.tx.send(s);
    }
}

impl Handler for Recorder {
    async fn configure(&self, req: ConfigureRequest) -> Result<EventMask, RpcStatus> {
        self.note(Seen::Configure {
            runtime: req.runtime_name,
            version: req.runtime_version,
            request_timeout_ms: req.request_timeout,
        });
        Ok(EventMask::of(&[
            Event::RunPodSandbox,
            Event::CreateContainer,
            Event::StartContainer,
            Event::RemoveContainer,
            Event::RemovePodSandbox,
        ]))
    }

    async fn synchronize(
        &self,
        pods: Vec<PodSandbox>,
        containers: Vec<Container>,
    ) -> Result<Vec<ContainerUpdate>, RpcStatus> {
        let containers = containers
            .iter()
            .map(|c| {
                let cpus = c
                    .linux
                    .as_ref()
                    .and_then(|l| l.resources.as_ref())
                    .and_then(|r| r.cpu.as_ref())
                    .map(|c| c.cpus.clone())
                    .unwrap_or_default();
                (c.name.clone(), cpus)
            })
            .collect();
        self.note(Seen::Synchronize {
            pods: pods.len(),
            containers,
        });
        Ok(Vec::new())
    }

    async fn create_container(
        &self,
        req: CreateContainerRequest,
    ) -> Result<CreateContainerResponse, RpcStatus> {
        let started = Instant::now();
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        let name = req.container.map(|c| c.name).unwrap_or_default();
        let resp = CreateContainerResponse {
            adjust: Some(ContainerAdjustment {
                linux: Some(LinuxContainerAdjustment {
                    resources: Some(LinuxResources {
                        cpu: Some(LinuxCpu {
                            cpus: "0".into(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        self.note(Seen::Create(name, started.elapsed()));
        Ok(resp)
    }

    async fn state_change(&self, ev: StateChangeEvent) -> Result<(), RpcStatus> {
        let who = match (&ev.container, &ev.pod) {
            (Some(c), _) => c.name.clone(),
            (None, Some(p)) => p.name.clone(),
            _ => String::new(),
        };
        self.note(Seen::State(ev.event(), who));
        Ok(())
    }
}

async fn next(rx: &mut mpsc::UnboundedReceiver<Seen>, what: &str) -> Seen {
    match tokio::time::timeout(Duration::from_secs(20), rx.recv()).await {
        Ok(Some(s)) => s,
        _ => panic!("no {what} reached the handler"),
    }
}

async fn wait_for(
    rx: &mut mpsc::UnboundedReceiver<Seen>,
    what: &str,
    f: impl Fn(&Seen) -> bool,
) -> Seen {
    loop {
        let s = next(rx, what).await;
        if f(&s) {
            return s;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cpuset_answered_on_create_container_is_what_the_container_runs_with() {
    let Some(bin) = harness::bin_dir_or_skip("real_containerd") else {
        return;
    };
    let ctrd = harness::Containerd2::start(bin);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let recorder = Recorder {
        tx,
        seen: Mutex::new(Vec::new()),
        delay: Duration::ZERO,
    };
    let session = Session::start(
        SessionConfig::new(ctrd.nri_sock(), "steward-test", "10"),
        recorder,
    )
    .await
    .unwrap_or_else(|e| panic!("register: {e}\n{}", ctrd.log()));

    match next(&mut rx, "Configure").await {
        Seen::Configure {
            runtime,
            version,
            request_timeout_ms,
        } => {
            assert_eq!(runtime, "containerd");
            assert!(version.starts_with("2.1.9"), "{version}");
            assert_eq!(request_timeout_ms, 2000);
        }
        other => panic!("expected Configure first, got {other:?}"),
    }
    assert_eq!(
        next(&mut rx, "Synchronize").await,
        Seen::Synchronize {
            pods: 0,
            containers: Vec::new()
        }
    );

    let (mut cri, _images) = harness::cri_client(ctrd.sock()).await.expect("CRI client");
    let sandbox =
        harness::pod_sandbox_config(&ctrd.cgroup_parent, "nri", harness::PodNetwork::Host);
    let pod_name = sandbox
        .metadata
        .as_ref()
        .map(|m| m.name.clone())
        .unwrap_or_default();
    let spec = harness::ContainerSpec::new("pinned");
    let t0 = Instant::now();
    let (sandbox_id, container_id) = harness::run_pod_with_container(&mut cri, &sandbox, &spec)
        .await
        .unwrap_or_else(|e| panic!("run pod: {e}\n{}", ctrd.log()));
    let pod_and_container_ms = t0.elapsed().as_millis();

    wait_for(&mut rx, "RunPodSandbox", |s| {
        *s == Seen::State(Event::RunPodSandbox, pod_name.clone())
    })
    .await;
    let took = match wait_for(&mut rx, "CreateContainer", |s| {
        matches!(s, Seen::Create(..))
    })
    .await
    {
        Seen::Create(name, took) => {
            assert_eq!(name, "pinned");
            took
        }
        _ => unreachable!(),
    };
    wait_for(&mut rx, "StartContainer", |s| {
        *s == Seen::State(Event::StartContainer, "pinned".into())
    })
    .await;
    eprintln!(
        "handler answered CreateContainer in {} µs; RunPodSandbox+CreateContainer+StartContainer through CRI took {pod_and_container_ms} ms",
        took.as_micros()
    );

    let parent = sandbox
        .linux
        .as_ref()
        .map(|l| l.cgroup_parent.clone())
        .unwrap_or_default();
    let cpuset = harness::host_cgroup_dir("cpuset", &parent, &container_id).join("cpuset.cpus");
    let cpus =
        std::fs::read_to_string(&cpuset).unwrap_or_else(|e| panic!("{}: {e}", cpuset.display()));
    assert_eq!(cpus.trim(), "0", "{}", cpuset.display());
    let status = harness::exec_sync(&mut cri, &container_id, &["cat", "/proc/1/status"])
        .await
        .expect("exec");
    let allowed = status
        .stdout
        .lines()
        .find(|l| l.starts_with("Cpus_allowed_list:"))
        .unwrap_or_default();
    assert_eq!(allowed.split_whitespace().nth(1), Some("0"), "{allowed}");

    // UpdateContainers, unsolicited: re-pin to CPU 1.
    let update = ContainerUpdate {
        container_id: container_id.clone(),
        linux: Some(LinuxContainerUpdate {
            resources: Some(LinuxResources {
                cpu: Some(LinuxCpu {
                    cpus: "1".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        }),
        ignore_failure: false,
    };
    let failed = session
        .runtime()
        .update_containers(vec![update], Vec::new())
        .await
        .unwrap_or_else(|e| panic!("UpdateContainers: {e}\n{}", ctrd.log()));
    assert!(failed.is_empty(), "{failed:?}");
    let cpus = std::fs::read_to_string(&cpuset).unwrap_or_default();
    assert_eq!(cpus.trim(), "1", "{}", cpuset.display());

    // A new session (the plugin restarted) is synchronised with the pod and
    // the container as they run now.
    drop(session);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let recorder = Recorder {
        tx,
        seen: Mutex::new(Vec::new()),
        delay: Duration::ZERO,
    };
    let session = Session::start(
        SessionConfig::new(ctrd.nri_sock(), "steward-test", "10"),
        recorder,
    )
    .await
    .unwrap_or_else(|e| panic!("register again: {e}\n{}", ctrd.log()));
    let sync = wait_for(&mut rx, "Synchronize after reconnecting", |s| {
        matches!(s, Seen::Synchronize { .. })
    })
    .await;
    assert_eq!(
        sync,
        Seen::Synchronize {
            pods: 1,
            containers: vec![("pinned".into(), "1".into())]
        }
    );

    harness::cleanup_pod(&mut cri, &sandbox_id)
        .await
        .expect("cleanup");
    wait_for(&mut rx, "RemoveContainer", |s| {
        *s == Seen::State(Event::RemoveContainer, "pinned".into())
    })
    .await;
    wait_for(&mut rx, "RemovePodSandbox", |s| {
        *s == Seen::State(Event::RemovePodSandbox, pod_name.clone())
    })
    .await;
    drop(session);
}

/// The runtime's request timeout (2 s): a plugin that answers later is
/// disconnected and the container is created without its adjustment
/// (fail-open) -- what the resource manager must detect and repair.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_answer_is_dropped_and_the_container_runs_unpinned() {
    let Some(bin) = harness::bin_dir_or_skip("real_containerd") else {
        return;
    };
    let ctrd = harness::Containerd2::start(bin);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let recorder = Recorder {
        tx,
        seen: Mutex::new(Vec::new()),
        delay: Duration::from_millis(2500),
    };
    let mut session = Session::start(
        SessionConfig::new(ctrd.nri_sock(), "steward-test", "10"),
        recorder,
    )
    .await
    .unwrap_or_else(|e| panic!("register: {e}\n{}", ctrd.log()));
    wait_for(&mut rx, "Synchronize", |s| {
        matches!(s, Seen::Synchronize { .. })
    })
    .await;

    let (mut cri, _images) = harness::cri_client(ctrd.sock()).await.expect("CRI client");
    let sandbox =
        harness::pod_sandbox_config(&ctrd.cgroup_parent, "slow", harness::PodNetwork::Host);
    let t0 = Instant::now();
    let (sandbox_id, container_id) =
        harness::run_pod_with_container(&mut cri, &sandbox, &harness::ContainerSpec::new("slow"))
            .await
            .unwrap_or_else(|e| panic!("run pod: {e}\n{}", ctrd.log()));
    let took = t0.elapsed();
    let reason = tokio::time::timeout(Duration::from_secs(10), session.closed())
        .await
        .expect("the runtime keeps a plugin that missed its timeout");
    eprintln!(
        "pod + container started in {} ms with a 2.5 s plugin; session ended: {reason}",
        took.as_millis()
    );
    assert!(took >= Duration::from_secs(2), "{took:?}");
    assert_eq!(reason, "the runtime closed the connection");

    let parent = sandbox
        .linux
        .as_ref()
        .map(|l| l.cgroup_parent.clone())
        .unwrap_or_default();
    let cpuset = harness::host_cgroup_dir("cpuset", &parent, &container_id).join("cpuset.cpus");
    let cpus = std::fs::read_to_string(&cpuset).unwrap_or_default();
    eprintln!("the container runs with cpuset.cpus {}", cpus.trim());
    assert_ne!(
        cpus.trim(),
        "0",
        "the late adjustment must not have been applied"
    );
    assert!(!cpus.trim().is_empty(), "{}", cpuset.display());
    harness::cleanup_pod(&mut cri, &sandbox_id)
        .await
        .expect("cleanup");
}
