//! Process-level discovery tests: `steward agent` and `steward
//! discovery-handler debug-echo` run as separate child processes; the agent
//! reaches the API server stand-in through a kubeconfig file and the handler
//! registers over the agent's real unix socket.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use common::*;
use steward_discovery::handlers::debug_echo::DESCRIPTION_PROPERTY;

fn ids(instances: &[steward_api::Instance]) -> Vec<String> {
    instances.iter().map(|i| i.spec.device_id.clone()).collect()
}

fn uid(i: &steward_api::Instance) -> Option<String> {
    i.metadata.uid.clone()
}

/// SIGKILLs the handler process and waits until the status says Offline;
/// returns when it was killed.
async fn kill_until_offline(cluster: &Cluster, dh: &mut Proc) -> anyhow::Result<Instant> {
    let killed_at = Instant::now();
    dh.sigkill()?;
    eventually("status: handler Offline", WAIT, || async {
        let (state, _, _) = handler_state(cluster, "cams", "node-a").await?;
        (state == "Offline").then_some(())
    })
    .await?;
    Ok(killed_at)
}

/// Handler entry of `node` in a Configuration's status: (state, endpoint).
async fn handler_state(
    cluster: &Cluster,
    config: &str,
    node: &str,
) -> Option<(String, String, u32)> {
    let s = cluster.config_status(config).await.ok()??;
    s.handlers
        .iter()
        .find(|h| h.node == node && h.name == "debug-echo")
        .map(|h| (h.state.clone(), h.endpoint.clone(), s.instances))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_handler_process_goes_offline_is_removed_and_comes_back() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let cluster = Cluster::start(dir.path()).await?;
    let node = NodeDirs::new(dir.path(), "node-a");
    let grace = Duration::from_secs(6);
    let _agent = node.spawn_agent(&cluster, &format!("{}s", grace.as_secs()))?;
    let listen = dir.path().join("echo.sock");
    let dh_log = dir.path().join("echo.log");
    let mut dh = spawn_echo_handler("debug-echo", &node.socket, &listen, None, dh_log.clone())?;
    let avail = dir.path().join("avail");
    set_available(&avail, true)?;

    let mut cfg = configuration(
        "cams",
        "debug-echo",
        &echo_details(&["foo0", "foo1"], Some(&avail)),
    );
    cfg.spec.capacity = 2;
    let cfg = cluster.create_configuration(&cfg).await?;
    let cfg_uid = cfg.metadata.uid.clone().context("configuration uid")?;

    let found = eventually("two Instances from the handler process", WAIT, || async {
        let i = cluster.instances_of("cams").await.ok()?;
        (i.len() == 2).then_some(i)
    })
    .await?;
    ensure!(ids(&found) == ["foo0", "foo1"], "ids {:?}", ids(&found));
    for inst in &found {
        ensure!(inst.spec.nodes == ["node-a"], "nodes {:?}", inst.spec.nodes);
        ensure!(!inst.spec.shared, "debug-echo defaults to unshared");
        ensure!(inst.spec.capacity == 2);
        ensure!(
            inst.spec.properties.get(DESCRIPTION_PROPERTY) == Some(&inst.spec.device_id),
            "properties {:?}",
            inst.spec.properties
        );
        let owners = inst.metadata.owner_references.clone().unwrap_or_default();
        ensure!(
            owners.len() == 1 && owners[0].uid == cfg_uid,
            "owner references {owners:?}"
        );
    }
    let endpoint = format!("unix://{}", listen.display());
    eventually("status: handler process Active", WAIT, || async {
        let (state, ep, n) = handler_state(&cluster, "cams", "node-a").await?;
        (state == "Active" && ep == endpoint && n == 2).then_some(())
    })
    .await?;

    // Steady state writes nothing.
    tokio::time::sleep(Duration::from_millis(300)).await;
    cluster.server.reset_stats();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stats = cluster.server.stats();
    ensure!(
        stats.total_writes() == 0,
        "writes in steady state: {stats:?}"
    );

    // The device disappears: its Instances are deleted; it comes back: recreated.
    set_available(&avail, false)?;
    eventually("Instances deleted with the device", WAIT, || async {
        cluster
            .instances_of("cams")
            .await
            .ok()?
            .is_empty()
            .then_some(())
    })
    .await?;
    set_available(&avail, true)?;
    eventually("Instances back with the device", WAIT, || async {
        (cluster.instances_of("cams").await.ok()?.len() == 2).then_some(())
    })
    .await?;

    // SIGKILL the handler: Offline, Instances kept during the grace period.
    let killed_at = kill_until_offline(&cluster, &mut dh).await?;
    let during_grace = cluster.instances_of("cams").await?;
    ensure!(
        killed_at.elapsed() < grace,
        "Offline was seen too late to check the grace period"
    );
    ensure!(
        during_grace.len() == 2,
        "Instances must stay while the handler is Offline within the grace: {:?}",
        ids(&during_grace)
    );

    // After the grace the handler is removed, and its Instances with it.
    eventually("Instances removed after the grace", WAIT, || async {
        cluster
            .instances_of("cams")
            .await
            .ok()?
            .is_empty()
            .then_some(())
    })
    .await?;
    ensure!(
        killed_at.elapsed() >= grace,
        "Instances removed {:?} after the kill, before the {grace:?} grace",
        killed_at.elapsed()
    );
    eventually("handler gone from the status", WAIT, || async {
        handler_state(&cluster, "cams", "node-a")
            .await
            .is_none()
            .then_some(())
    })
    .await?;

    // The handler process comes back on the same socket path: Active, Instances back.
    let restarted_at = Instant::now();
    let mut dh = spawn_echo_handler(
        "debug-echo (restarted)",
        &node.socket,
        &listen,
        None,
        dh_log.clone(),
    )?;
    eventually(
        "Instances back from the restarted handler",
        WAIT,
        || async { (cluster.instances_of("cams").await.ok()?.len() == 2).then_some(()) },
    )
    .await?;
    let back_after_removal = restarted_at.elapsed();
    eventually("status: restarted handler Active", WAIT, || async {
        let (state, ep, n) = handler_state(&cluster, "cams", "node-a").await?;
        (state == "Active" && ep == endpoint && n == 2).then_some(())
    })
    .await?;

    // Crash and return within the grace: the Instances are kept (same
    // objects, no churn for the pods using them) and the handler is Active
    // again. Timed: kill → Offline in the status, restart → Active.
    let rounds: usize = std::env::var("STEWARD_FAULT_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let before: BTreeSet<_> = cluster
        .instances_of("cams")
        .await?
        .iter()
        .filter_map(uid)
        .collect();
    let (mut offline, mut active) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let killed_at = kill_until_offline(&cluster, &mut dh).await?;
        offline.push(killed_at.elapsed());
        let restarted_at = Instant::now();
        dh = spawn_echo_handler(
            &format!("debug-echo (return {round})"),
            &node.socket,
            &listen,
            None,
            dh_log.clone(),
        )?;
        eventually("status: returned handler Active", WAIT, || async {
            let (state, ep, n) = handler_state(&cluster, "cams", "node-a").await?;
            (state == "Active" && ep == endpoint && n == 2).then_some(())
        })
        .await?;
        active.push(restarted_at.elapsed());
        ensure!(
            killed_at.elapsed() < grace,
            "round {round}: the return took longer than the grace"
        );
        let after: BTreeSet<_> = cluster
            .instances_of("cams")
            .await?
            .iter()
            .filter_map(uid)
            .collect();
        ensure!(
            after == before,
            "round {round}: Instances replaced across a crash within the grace: {before:?} → {after:?}"
        );
    }
    offline.sort();
    active.sort();
    eprintln!(
        "handler crash: rounds={rounds} kill→Offline p50={:?} max={:?}; restart→Active p50={:?} max={:?}; \
         restart after removal→Instances back {back_after_removal:?}",
        offline[offline.len() / 2],
        offline[offline.len() - 1],
        active[active.len() / 2],
        active[active.len() - 1],
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_agent_restarts_with_the_registration_of_a_handler_that_never_registers_again()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let cluster = Cluster::start(dir.path()).await?;
    let node = NodeDirs::new(dir.path(), "node-a");
    let mut agent = node.spawn_agent(&cluster, "5m")?;

    // The handler registers through a symlink to the agent's socket; once the
    // link is gone it can never register again (it only re-registers when
    // the socket it was given re-appears).
    let link = dir.path().join("agent-link.sock");
    std::os::unix::fs::symlink(&node.socket, &link)?;
    let listen = dir.path().join("echo.sock");
    let mut dh = spawn_echo_handler(
        "debug-echo",
        &link,
        &listen,
        None,
        dir.path().join("echo.log"),
    )?;
    let dh_pid = dh.pid()?;
    cluster
        .create_configuration(&configuration(
            "cams",
            "debug-echo",
            &echo_details(&["foo0"], None),
        ))
        .await?;
    let first = eventually("Instance through the registered handler", WAIT, || async {
        let i = cluster.instances_of("cams").await.ok()?;
        (i.len() == 1).then_some(i)
    })
    .await?;
    eventually("handler logged its registration", WAIT, || async {
        (dh.log_count(REGISTERED) == 1).then_some(())
    })
    .await?;
    std::fs::remove_file(&link)?;

    // SIGKILL the agent; change the Configuration while it is down.
    agent.sigkill()?;
    cluster
        .set_details("cams", &echo_details(&["foo0", "foo1"], None))
        .await?;
    let _agent = node.spawn_agent(&cluster, "5m")?;
    let found = eventually(
        "restarted agent discovers the changed Configuration",
        WAIT,
        || async {
            let i = cluster.instances_of("cams").await.ok()?;
            (i.len() == 2).then_some(i)
        },
    )
    .await?;
    ensure!(ids(&found) == ["foo0", "foo1"], "ids {:?}", ids(&found));
    ensure!(
        uid(&found[0]) == uid(&first[0]),
        "the surviving device's Instance must not be recreated"
    );

    // And a change made while the restarted agent runs is discovered too.
    cluster
        .set_details("cams", &echo_details(&["foo0", "foo1", "foo2"], None))
        .await?;
    let found = eventually("third device after a live change", WAIT, || async {
        let i = cluster.instances_of("cams").await.ok()?;
        (i.len() == 3).then_some(i)
    })
    .await?;
    ensure!(ids(&found) == ["foo0", "foo1", "foo2"]);
    let endpoint = format!("unix://{}", listen.display());
    eventually("status: restored handler Active", WAIT, || async {
        let (state, ep, _) = handler_state(&cluster, "cams", "node-a").await?;
        (state == "Active" && ep == endpoint).then_some(())
    })
    .await?;

    // The handler was neither restarted nor registered again: give it a few
    // of its agent-socket polls to do so (an absence needs a window).
    tokio::time::sleep(steward_discovery::server::AGENT_SOCKET_POLL * 3).await;
    ensure!(dh.is_running(), "the handler process must still run");
    ensure!(dh.pid()? == dh_pid);
    ensure!(
        dh.log_count(REGISTERED) == 1,
        "the handler registered again:\n{}",
        dh.log()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_handler_processes_on_two_nodes_share_one_instance() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let cluster = Cluster::start(dir.path()).await?;
    cluster.create_node("node-a").await?;
    cluster.create_node("node-b").await?;
    let a = NodeDirs::new(dir.path(), "node-a");
    let b = NodeDirs::new(dir.path(), "node-b");
    let _agent_a = a.spawn_agent(&cluster, "3s")?;
    let _agent_b = b.spawn_agent(&cluster, "3s")?;
    let _dh_a = spawn_echo_handler(
        "debug-echo a",
        &a.socket,
        &dir.path().join("a.sock"),
        Some(true),
        dir.path().join("echo-a.log"),
    )?;
    let b_listen = dir.path().join("b.sock");
    let b_log = dir.path().join("echo-b.log");
    let mut dh_b = spawn_echo_handler(
        "debug-echo b",
        &b.socket,
        &b_listen,
        Some(true),
        b_log.clone(),
    )?;
    let avail = dir.path().join("avail");
    set_available(&avail, true)?;
    cluster
        .create_configuration(&configuration(
            "cams",
            "debug-echo",
            &echo_details(&["cam0"], Some(&avail)),
        ))
        .await?;

    let on_nodes = |want: &'static [&'static str]| {
        let cluster = &cluster;
        move || async move {
            let i = cluster.instances_of("cams").await.ok()?;
            (i.len() == 1 && i[0].spec.nodes == want).then_some(i)
        }
    };
    let both = eventually(
        "one shared Instance listing both nodes",
        WAIT,
        on_nodes(&["node-a", "node-b"]),
    )
    .await?;
    ensure!(
        both[0].spec.shared,
        "a shared handler yields shared Instances"
    );
    ensure!(both[0].spec.device_id == "cam0");
    let shared_uid = uid(&both[0]);

    // node-b's handler dies: after the grace only node-b leaves the Instance.
    dh_b.sigkill()?;
    let one = eventually(
        "node-b dropped after its handler's grace",
        WAIT,
        on_nodes(&["node-a"]),
    )
    .await?;
    ensure!(
        uid(&one[0]) == shared_uid,
        "the shared Instance is kept, not recreated"
    );

    // It comes back.
    let _dh_b = spawn_echo_handler(
        "debug-echo b (restarted)",
        &b.socket,
        &b_listen,
        Some(true),
        b_log,
    )?;
    let back = eventually("node-b back", WAIT, on_nodes(&["node-a", "node-b"])).await?;
    ensure!(uid(&back[0]) == shared_uid);

    // The device disappears for everybody: the Instance is deleted.
    set_available(&avail, false)?;
    eventually("shared Instance deleted", WAIT, || async {
        cluster
            .instances_of("cams")
            .await
            .ok()?
            .is_empty()
            .then_some(())
    })
    .await?;
    let names: BTreeSet<String> = cluster
        .instance_api()
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter_map(|i| i.metadata.name)
        .collect();
    ensure!(names.is_empty(), "leftover Instances {names:?}");
    Ok(())
}
