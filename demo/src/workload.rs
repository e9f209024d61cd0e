//! The scripted workload, as kubelet would drive it: pods admitted through
//! the kubelet stand-in (Allocate over the device-plugin wire), their
//! containers run in containerd with what Allocate answered and the pod's
//! own uid (on containerd's CRI socket, the NRI plugin attached; or through
//! the CRI proxy), then the pods deleted.

use std::time::{Duration, Instant};

use anyhow::Context;
use steward_proto::cri::runtime::v1 as cri;
use steward_testing_containerd::{ContainerSpec, PodNetwork, cleanup_pod, cri_client};
use steward_testing_kubelet::{ContainerSpec as KubeletContainer, PodSpec};

use crate::stage::{Cri, NS, Stage};
use crate::view::View;
use crate::{Narrator, Options};

const WAIT: Duration = Duration::from_secs(60);

/// What the workload did and measured.
#[derive(Debug, Default)]
pub(crate) struct Worked {
    pub admitted: u64,
    pub containers: u64,
    pub exclusive: u64,
    pub pinned_seen: u64,
    pub one_view: u64,
    pub reclaims: Vec<Duration>,
    pub events: u64,
    pub double_grants: u64,
}

struct Admitted {
    uid: String,
    name: String,
    resource: String,
    sandbox: Option<String>,
    exclusive: bool,
}

pub(crate) async fn run(stage: &Stage, opts: &Options, say: &Narrator) -> anyhow::Result<Worked> {
    let view = View::follow(&stage.view_socket, say).await?;
    let mut runtime = match &stage.cri {
        Some(c) => Some(cri_client(&c.socket).await?.0),
        None => None,
    };
    let mut w = Worked::default();
    for round in 1..=opts.rounds {
        say.say(format!("round {round}/{}: filling every slot", opts.rounds));
        let mut pods = Vec::new();
        for (i, res) in stage
            .resources
            .iter()
            .flat_map(|r| std::iter::repeat_n(r, opts.capacity as usize))
            .enumerate()
        {
            let name = format!("cam-user-{round}-{i}");
            let admitted = stage
                .kubelet
                .add_pod(
                    PodSpec::new(NS, &name).container(KubeletContainer::new("main").limit(res, 1)),
                )
                .await
                .with_context(|| format!("kubelet admitting {name}"))?;
            let slot = admitted
                .devices
                .get("main")
                .and_then(|r| r.get(res))
                .map(|s| s.iter().cloned().collect::<Vec<_>>().join(","))
                .unwrap_or_default();
            say.say(format!(
                "kubelet admitted {NS}/{name}: Allocate gave {slot}"
            ));
            w.admitted += 1;
            let mut pod = Admitted {
                uid: admitted.uid.clone(),
                name,
                resource: res.clone(),
                sandbox: None,
                exclusive: i == 0,
            };
            if let (Some(rt), Some(c)) = (runtime.as_mut(), stage.cri.as_ref()) {
                let env = admitted
                    .responses
                    .get("main")
                    .and_then(|r| r.get(res))
                    .map(|a| a.envs.clone())
                    .unwrap_or_default();
                pod.sandbox = Some(run_container(rt, c, &pod, env).await?);
                w.containers += 1;
                w.exclusive += u64::from(pod.exclusive);
                say.say(format!(
                    "{} runs {NS}/{}, {}{}",
                    c.runtime,
                    pod.name,
                    c.route,
                    if pod.exclusive {
                        " (guaranteed: one exclusive CPU)"
                    } else {
                        " (shared CPUs)"
                    }
                ));
            }
            pods.push(pod);
        }
        for p in &pods {
            let uid = p.uid.clone();
            view.wait(&format!("{}'s slot", p.name), WAIT, |s| {
                s.pods.get(&uid).is_some_and(|x| !x.devices.is_empty())
            })
            .await?;
            if let (true, Some(_), Some(c)) = (p.exclusive, p.sandbox.as_ref(), stage.cri.as_ref())
            {
                view.wait(&format!("{}'s CPUs", p.name), WAIT, |s| {
                    s.pods.get(&uid).is_some_and(|x| x.both_at_once)
                })
                .await?;
                let cpus = view
                    .state
                    .lock()
                    .map_err(|_| anyhow::anyhow!("view state poisoned"))?
                    .pods
                    .get(&uid)
                    .map(|x| x.cpus.clone())
                    .unwrap_or_default();
                say.say(format!(
                    "{NS}/{} pinned by {} to CPU(s) {cpus:?}, with its slot in the same view entry",
                    p.name, c.pinned_by
                ));
                w.pinned_seen += 1;
            }
        }
        say.say(format!("round {round}: every slot held; deleting the pods"));
        for p in &pods {
            if let (Some(rt), Some(sid)) = (runtime.as_mut(), p.sandbox.as_ref()) {
                cleanup_pod(rt, sid)
                    .await
                    .context("removing a pod from containerd")?;
            }
            let t0 = Instant::now();
            stage
                .kubelet
                .delete_pod(&p.uid)
                .await
                .with_context(|| format!("deleting {}", p.name))?;
            let uid = p.uid.clone();
            view.wait(&format!("{}'s slot released", p.name), WAIT, |s| {
                s.pods.get(&uid).is_some_and(|x| x.released_at.is_some())
            })
            .await?;
            let released = view
                .state
                .lock()
                .map_err(|_| anyhow::anyhow!("view state poisoned"))?
                .pods
                .get(&uid)
                .and_then(|x| x.released_at);
            if let Some(at) = released {
                let took = at.saturating_duration_since(t0);
                say.say(format!(
                    "slot of {} ({}) reclaimed {:.1} ms after the pod was deleted",
                    p.name,
                    p.resource,
                    took.as_secs_f64() * 1e3
                ));
                w.reclaims.push(took);
            }
        }
    }
    let s = view
        .state
        .lock()
        .map_err(|_| anyhow::anyhow!("view state poisoned"))?;
    w.events = s.events;
    w.double_grants = s.double_grants;
    w.one_view = s.pods.values().filter(|p| p.both_at_once).count() as u64;
    Ok(w)
}

/// Runs the pod's container as kubelet would (on containerd's socket with
/// NRI, through the CRI proxy otherwise): the sandbox carries the pod's
/// name, namespace and uid; the container the env Allocate answered;
/// guaranteed pods ask for one whole CPU.
async fn run_container(
    rt: &mut steward_proto::cri::runtime::v1::runtime_service_client::RuntimeServiceClient<
        tonic::transport::Channel,
    >,
    c: &Cri,
    pod: &Admitted,
    env: std::collections::HashMap<String, String>,
) -> anyhow::Result<String> {
    let mut sandbox = steward_testing_containerd::pod_sandbox_config(
        &c.cgroup_parent,
        &pod.name,
        PodNetwork::Host,
    );
    if let Some(m) = sandbox.metadata.as_mut() {
        m.name = pod.name.clone();
        m.namespace = NS.into();
        m.uid = pod.uid.clone();
    }
    let mut container = ContainerSpec::new("main")
        .command(["sleep", "3600"])
        .build(&sandbox);
    container
        .envs
        .extend(env.into_iter().map(|(key, value)| cri::KeyValue {
            key,
            value: value.into_bytes(),
        }));
    container
        .linux
        .get_or_insert_with(Default::default)
        .resources = Some(if pod.exclusive {
        cri::LinuxContainerResources {
            cpu_shares: 1024,
            cpu_quota: 100_000,
            cpu_period: 100_000,
            memory_limit_in_bytes: 32 << 20,
            ..Default::default()
        }
    } else {
        cri::LinuxContainerResources {
            cpu_shares: 256,
            cpu_period: 100_000,
            ..Default::default()
        }
    });
    let sid = rt
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(sandbox.clone()),
            runtime_handler: String::new(),
        })
        .await
        .with_context(|| format!("RunPodSandbox on {}", c.socket.display()))?
        .into_inner()
        .pod_sandbox_id;
    let cid = rt
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sid.clone(),
            config: Some(container),
            sandbox_config: Some(sandbox),
        })
        .await
        .with_context(|| format!("CreateContainer on {}", c.socket.display()))?
        .into_inner()
        .container_id;
    rt.start_container(cri::StartContainerRequest { container_id: cid })
        .await
        .with_context(|| format!("StartContainer on {}", c.socket.display()))?;
    Ok(sid)
}
