//! The window of a rolling update of the agent on one node: from the old
//! `steward agent` process being told to stop (SIGTERM, as kubelet stops a
//! pod of a rolled DaemonSet) until the next one has re-registered its
//! device plugin with kubelet and a new pod asking for the device is
//! admitted (Allocate answered over the device plugin wire of the kubelet
//! stand-in). While one pod holds a slot, every round replaces the agent on
//! the same state directory.
//!
//! Reported: the stop (SIGTERM to exit), the start (exec to the new pod
//! admitted) and the whole window, p50/p99; beside them, measured in the
//! same run, the floor of replacing a process at all: exec of
//! `steward version` to its exit. Not included (no kubelet here): the time
//! kubelet takes to start the new pod's container (image present, no pull),
//! which a real rollout adds between the stop and the start.
//!
//! `STEWARD_BENCH_SMOKE=1` runs two rounds (CI).

#[path = "../tests/common/mod.rs"]
mod common;

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use common::*;
use kube::Api;
use kube::api::ListParams;
use steward_api::SlotClaim;
use steward_testing_kubelet::{ContainerSpec as KubeletContainer, Kubelet, KubeletConfig, PodSpec};

const NODE: &str = "node-roll";

fn main() -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rolling_update bench: cannot start tokio: {e}");
            return ExitCode::FAILURE;
        }
    };
    let smoke = std::env::var("STEWARD_BENCH_SMOKE").is_ok_and(|v| v == "1");
    match runtime.block_on(run(if smoke { 2 } else { 30 })) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rolling_update bench failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn agent(dir: &std::path::Path, kubeconfig: &std::path::Path, n: usize) -> anyhow::Result<Proc> {
    let args: Vec<OsString> = vec![
        "agent".into(),
        "--node-name".into(),
        NODE.into(),
        "--state-dir".into(),
        dir.join("agent-state").into(),
        "--registration-socket".into(),
        dir.join("registration.sock").into(),
        "--embedded".into(),
        "debug-echo".into(),
        "--kubelet-dir".into(),
        dir.join("kubelet").into(),
        "--cdi-dir".into(),
        dir.join("cdi").into(),
    ];
    Ok(Proc::spawn(
        &format!("agent {n}"),
        &args,
        &[("KUBECONFIG", kubeconfig.into())],
        dir.join(format!("agent-{n}.log")),
    )?
    .quiet())
}

async fn claims(cluster: &Cluster) -> anyhow::Result<usize> {
    let api: Api<SlotClaim> = Api::namespaced(cluster.client(), NS);
    Ok(api.list(&ListParams::default()).await?.items.len())
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

async fn run(rounds: usize) -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().to_path_buf();
    let cluster = Cluster::start(&dir).await?;
    cluster.create_node(NODE).await?;
    let kubelet = Kubelet::start(KubeletConfig {
        root_dir: dir.join("kubelet"),
        node_name: NODE.into(),
        api: Some(cluster.client()),
    })
    .await?;
    let mut current = agent(&dir, &cluster.kubeconfig, 0)?;
    let mut conf = configuration("cams", "debug-echo", &echo_details(&["cam"], None));
    conf.spec.capacity = 4;
    cluster.create_configuration(&conf).await?;
    let inst = eventually("the Instance", WAIT, || async {
        cluster.instances_of("cams").await.ok()?.into_iter().next()
    })
    .await?;
    let res = format!(
        "steward.dev/{}",
        inst.metadata.name.context("instance name")?
    );
    kubelet
        .wait_for_resource(&res, |s| s.connected && s.healthy.len() == 4, WAIT)
        .await?;
    kubelet
        .add_pod(PodSpec::new(NS, "holder").container(KubeletContainer::new("main").limit(&res, 1)))
        .await?;
    eventually("the holder's claim", WAIT, || async {
        (claims(&cluster).await.ok()? == 1).then_some(())
    })
    .await?;

    // The floor: replacing a process at all.
    let mut floor = Vec::new();
    for _ in 0..rounds.max(5) {
        let t = Instant::now();
        let out = std::process::Command::new(STEWARD)
            .arg("version")
            .output()
            .context("steward version")?;
        ensure!(out.status.success(), "steward version failed");
        floor.push(t.elapsed());
    }

    let (mut stops, mut starts, mut windows) = (Vec::new(), Vec::new(), Vec::new());
    for round in 1..=rounds {
        let registrations = kubelet
            .resource(&res)
            .context("kubelet knows the resource")?
            .registrations;
        let t0 = Instant::now();
        current.sigterm()?;
        let status = current.wait_exit(Duration::from_secs(30)).await?;
        ensure!(
            status.success(),
            "round {round}: the agent stopped with {status}"
        );
        let exited = Instant::now();
        current = agent(&dir, &cluster.kubeconfig, round)?;
        kubelet
            .wait_for_resource(
                &res,
                |s| s.registrations > registrations && s.connected && s.healthy.len() == 4,
                WAIT,
            )
            .await
            .with_context(|| format!("round {round}: the new agent re-registers"))?;
        // kubelet admits as soon as the plugin is back: the pod's Allocate
        // goes to the new agent.
        let pod = loop {
            match kubelet
                .add_pod(
                    PodSpec::new(NS, format!("newcomer-{round}"))
                        .container(KubeletContainer::new("main").limit(&res, 1)),
                )
                .await
            {
                Ok(p) => break p,
                Err(e) if t0.elapsed() < WAIT => {
                    tracing::debug!(error = %e, "not admitted yet");
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                Err(e) => bail!("round {round}: never admitted: {e}"),
            }
        };
        let admitted = Instant::now();
        stops.push(exited - t0);
        starts.push(admitted - exited);
        windows.push(admitted - t0);
        kubelet.delete_pod(&pod.uid).await?;
        eventually("the newcomer's claim released", WAIT, || async {
            (claims(&cluster).await.ok()? == 1).then_some(())
        })
        .await?;
    }
    // The holder kept its slot through every round.
    ensure!(claims(&cluster).await? == 1, "the holder's claim was lost");
    for v in [&mut floor, &mut stops, &mut starts, &mut windows] {
        v.sort();
    }
    let f = pct(&floor, 0.5);
    println!(
        "rolling_update/agent-replaced: {rounds} rounds, 1 slot held throughout (kept in every round)"
    );
    for (name, v) in [("stop", &stops), ("start", &starts), ("window", &windows)] {
        println!(
            "rolling_update/{name}: p50 {:.1} ms, p99 {:.1} ms ({:.1}x / {:.1}x the floor)",
            ms(pct(v, 0.5)),
            ms(pct(v, 0.99)),
            pct(v, 0.5).as_secs_f64() / f.as_secs_f64(),
            pct(v, 0.99).as_secs_f64() / f.as_secs_f64(),
        );
    }
    println!(
        "rolling_update/floor (exec of steward version to exit): p50 {:.1} ms, p99 {:.1} ms",
        ms(f),
        ms(pct(&floor, 0.99))
    );
    drop(current);
    Ok(())
}
