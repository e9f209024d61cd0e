//! The agent against a discovery handler that behaves as Akri's do
//! (test-support/akri-like-handler, Python grpcio): it registers again
//! whenever a stream it serves closes, sends nothing while nothing matches
//! and polls its devices on an interval. After a Configuration edit, a
//! deletion, an agent restart, with many Configurations, and with nothing to
//! report, the agent must come to rest: no registrations, no Discover calls,
//! no writes.
//!
//! Needs python3 with grpcio and grpcio-tools; without them the test is
//! skipped with a message, except in CI (`CI=true`), where it fails.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use kube::Api;
use kube::api::DeleteParams;
use steward_agent::{AgentConfig, Mode};
use steward_api::Configuration;
use steward_testing_apiserver::ApiServer;

const WAIT: Duration = Duration::from_secs(30);
/// The handler's device poll interval (Akri's is 10 s).
const POLL: Duration = Duration::from_millis(250);
/// How long "nothing happens" is watched, after the steady state is reached.
const WINDOW: Duration = Duration::from_secs(3);
const NAME: &str = "akri-udev";

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Whether python3 with grpcio and grpcio-tools can run the peer. Missing
/// tools skip the test loudly, or fail it in CI.
fn peer_available() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import grpc, grpc_tools"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
        assert!(
            !ci,
            "python3 with grpcio and grpcio-tools is required in CI (scripts/test installs them)"
        );
        eprintln!(
            "\n*** SKIPPED: python3 with grpcio and grpcio-tools not found; \
             the Akri-like handler tests did not run ***\n"
        );
    }
    ok
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
struct Counters {
    registrations: u64,
    register_attempts: u64,
    discover_calls: u64,
    invalid_details: u64,
    streams_closed: u64,
    open_streams: i64,
    responses_sent: u64,
}

/// The Python peer; killed when dropped, even when the test panics.
struct Peer {
    child: Child,
    counters: PathBuf,
    devices: PathBuf,
}

impl Peer {
    fn start(dir: &Path, agent_socket: &Path, devices: &[&str]) -> Self {
        let counters = dir.join("akri-like-counters.json");
        let devices_file = dir.join("akri-like-devices");
        std::fs::write(&devices_file, devices.join("\n")).unwrap();
        let child = Command::new("python3")
            .arg(workspace().join("test-support/akri-like-handler/akri_like_handler.py"))
            .arg("--registration-socket")
            .arg(agent_socket)
            .args(["--name", NAME])
            .arg("--socket")
            .arg(dir.join("akri-like.sock"))
            .arg("--devices")
            .arg(&devices_file)
            .args(["--interval", &POLL.as_secs_f64().to_string()])
            .args(["--retry", "0.1"])
            .arg("--counters")
            .arg(&counters)
            .arg("--proto")
            .arg(workspace().join("crates/steward-proto/proto/discovery/v0/discovery.proto"))
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        Self {
            child,
            counters,
            devices: devices_file,
        }
    }

    fn counters(&mut self) -> Counters {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("the Akri-like handler exited: {status}");
        }
        std::fs::read(&self.counters)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    fn set_devices(&self, devices: &[&str]) {
        let tmp = self.devices.with_extension("tmp");
        std::fs::write(&tmp, devices.join("\n")).unwrap();
        std::fs::rename(&tmp, &self.devices).unwrap();
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn config_status(server: &ApiServer, name: &str) -> Option<steward_api::ConfigurationStatus> {
    let api: Api<Configuration> = Api::namespaced(server.client(), NS);
    api.get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|c| c.status)
}

/// Every Configuration in `names` shows the handler Active.
async fn all_active(server: &ApiServer, names: &[String]) -> bool {
    for name in names {
        let Some(s) = config_status(server, name).await else {
            return false;
        };
        if !s
            .handlers
            .iter()
            .any(|h| h.name == NAME && h.state == "Active")
        {
            return false;
        }
    }
    true
}

/// Waits until the handler serves exactly `streams` open streams, every
/// Configuration shows it Active and its counters have not moved for a few
/// poll intervals (each closed stream it had to notice has been noticed).
/// Gives up after `WAIT` and returns what it saw: the window then tells.
async fn settle(peer: &mut Peer, server: &ApiServer, names: &[String], streams: i64) -> Counters {
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut last = peer.counters();
    let mut still_since = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(POLL / 2).await;
        let now = peer.counters();
        if now != last {
            last = now;
            still_since = tokio::time::Instant::now();
        }
        let quiet = still_since.elapsed() >= POLL * 4;
        if quiet && now.open_streams == streams && all_active(server, names).await {
            return now;
        }
        if tokio::time::Instant::now() > deadline {
            eprintln!("no steady state within {WAIT:?}: {now:?}");
            return now;
        }
    }
}

/// Watches `WINDOW` after the steady state: nothing may happen. Returns the
/// counters at rest.
async fn assert_quiet(
    what: &str,
    peer: &mut Peer,
    server: &ApiServer,
    names: &[String],
    streams: i64,
) -> Counters {
    let before = settle(peer, server, names, streams).await;
    server.reset_stats();
    let started = tokio::time::Instant::now();
    tokio::time::sleep(WINDOW).await;
    let after = peer.counters();
    let stats = server.stats();
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "{what}: over {secs:.1}s: {} registrations, {} Discover calls, {} streams closed, \
         {} Configuration writes, {} Instance writes (totals {after:?})",
        after.registrations - before.registrations,
        after.discover_calls - before.discover_calls,
        after.streams_closed - before.streams_closed,
        stats.writes_for("configurations.steward.dev/status")
            + stats.writes_for("configurations.steward.dev"),
        stats.writes_for("instances.steward.dev"),
    );
    assert_eq!(
        after.registrations, before.registrations,
        "{what}: registrations in steady state ({before:?} -> {after:?})"
    );
    assert_eq!(
        after.discover_calls, before.discover_calls,
        "{what}: Discover calls in steady state ({before:?} -> {after:?})"
    );
    assert_eq!(
        after.open_streams, streams,
        "{what}: open streams {after:?}"
    );
    assert_eq!(
        stats.total_writes(),
        0,
        "{what}: writes in steady state: {stats:?}"
    );
    after
}

/// What an event cost the handler between two resting states: one
/// registration per stream it saw closed, and `discover_calls` new streams.
fn assert_cost(what: &str, before: Counters, after: Counters, closed: u64, discover_calls: u64) {
    eprintln!(
        "{what}: {} registrations, {} Discover calls, {} streams closed",
        after.registrations - before.registrations,
        after.discover_calls - before.discover_calls,
        after.streams_closed - before.streams_closed,
    );
    assert_eq!(
        (
            after.streams_closed - before.streams_closed,
            after.registrations - before.registrations,
            after.discover_calls - before.discover_calls,
        ),
        (closed, closed, discover_calls),
        "{what}: (streams closed, registrations, Discover calls) from {before:?} to {after:?}"
    );
}

fn details(prefix: &str) -> String {
    format!("prefix: {prefix:?}\n")
}

async fn create_all(server: &ApiServer, names: &[String]) {
    for name in names {
        create_configuration(server, &configuration(name, NAME, &details("dev"))).await;
    }
}

async fn wait_instances(server: &ApiServer, name: &str, n: usize) {
    eventually(&format!("{n} instances of {name}"), WAIT, || async {
        (instances_of(server, name).await.len() == n).then_some(())
    })
    .await;
}

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("akri-{i}")).collect()
}

/// The agent on an API server stand-in, the Akri-like handler reporting
/// `devices`, and `n` Configurations of that handler, each with its
/// Instances written.
struct Scene {
    server: ApiServer,
    cfg: AgentConfig,
    agent: Agent,
    peer: Peer,
    names: Vec<String>,
    _dir: tempfile::TempDir,
}

async fn scene(n: usize, devices: &[&str], instances: usize) -> Scene {
    let server = api_server().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = test_config("node-a", dir.path(), Mode::Kubernetes(server.client()));
    let agent = start_agent(cfg.clone());
    let peer = Peer::start(dir.path(), &agent.socket, devices);
    let names = names(n);
    create_all(&server, &names).await;
    for name in &names {
        wait_instances(&server, name, instances).await;
    }
    Scene {
        server,
        cfg,
        agent,
        peer,
        names,
        _dir: dir,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configuration_edit_then_quiet() {
    if !peer_available() {
        return;
    }
    let Scene {
        server,
        agent,
        mut peer,
        names,
        cfg: _,
        _dir,
    } = scene(1, &["dev0", "dev1", "other"], 2).await;
    let before = assert_quiet("initial", &mut peer, &server, &names, 1).await;

    // Edit the details: one stream closed and reopened, then quiet.
    set_details(&server, &names[0], &details("dev0")).await;
    wait_instances(&server, &names[0], 1).await;
    let after = assert_quiet("after a details edit", &mut peer, &server, &names, 1).await;
    assert_cost("a details edit", before, after, 1, 1);
    agent.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_configuration_deleted_then_quiet() {
    if !peer_available() {
        return;
    }
    let Scene {
        server,
        agent,
        mut peer,
        names,
        cfg: _,
        _dir,
    } = scene(2, &["dev0", "dev1"], 2).await;
    let before = assert_quiet("two configurations", &mut peer, &server, &names, 2).await;

    let api: Api<Configuration> = Api::namespaced(server.client(), NS);
    api.delete(&names[1], &DeleteParams::default())
        .await
        .unwrap();
    wait_instances(&server, &names[1], 0).await;
    let after = assert_quiet(
        "after deleting the second",
        &mut peer,
        &server,
        &names[..1],
        1,
    )
    .await;
    assert_cost("deleting the second configuration", before, after, 1, 0);
    agent.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_restart_then_quiet() {
    if !peer_available() {
        return;
    }
    let Scene {
        server,
        cfg,
        agent,
        mut peer,
        names,
        _dir,
    } = scene(2, &["dev0", "dev1"], 2).await;
    let before = assert_quiet("before the restart", &mut peer, &server, &names, 2).await;

    agent.stop().await.unwrap();
    let streams_closed = before.streams_closed;
    let agent = start_agent(cfg);
    // The restarted agent reconnects from its persisted registration; the
    // handler notices its two old streams closed and registers twice.
    eventually("the handler noticed both old streams closed", WAIT, || {
        let c = peer.counters();
        async move { (c.streams_closed >= streams_closed + 2).then_some(()) }
    })
    .await;
    let after = assert_quiet("after an agent restart", &mut peer, &server, &names, 2).await;
    assert_cost("an agent restart", before, after, 2, 2);
    for name in &names {
        assert_eq!(instances_of(&server, name).await.len(), 2);
    }
    agent.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_configurations_one_edit_then_quiet() {
    if !peer_available() {
        return;
    }
    let Scene {
        server,
        agent,
        mut peer,
        names,
        cfg: _,
        _dir,
    } = scene(4, &["dev0", "dev1"], 2).await;
    let before = assert_quiet("four configurations", &mut peer, &server, &names, 4).await;

    set_details(&server, &names[2], &details("dev1")).await;
    wait_instances(&server, &names[2], 1).await;
    let after = assert_quiet(
        "four configurations after one edit",
        &mut peer,
        &server,
        &names,
        4,
    )
    .await;
    assert_cost("one edit among four configurations", before, after, 1, 1);
    for name in [&names[0], &names[1], &names[3]] {
        assert_eq!(instances_of(&server, name).await.len(), 2);
    }
    agent.stop().await.unwrap();
}

/// Nothing matches for longer than the agent's old limit on a first device
/// list (2 s in the tests' agent configuration): the stream stays open and
/// the handler Active; a device appearing later comes through that stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handler_with_nothing_to_report_stays_connected() {
    if !peer_available() {
        return;
    }
    let server = api_server().await;
    let dir = tempfile::tempdir().unwrap();
    let agent = start_agent(test_config(
        "node-a",
        dir.path(),
        Mode::Kubernetes(server.client()),
    ));
    let mut peer = Peer::start(dir.path(), &agent.socket, &[]);
    let names = names(1);
    create_all(&server, &names).await;
    eventually("the handler is asked to discover", WAIT, || {
        let c = peer.counters();
        async move { (c.discover_calls >= 1).then_some(()) }
    })
    .await;
    // The window (3 s) is longer than the old limit (2 s).
    assert_quiet("nothing matches", &mut peer, &server, &names, 1).await;
    let c = peer.counters();
    assert_eq!(
        (c.registrations, c.discover_calls, c.responses_sent),
        (1, 1, 0),
        "{c:?}"
    );
    assert!(instances_of(&server, &names[0]).await.is_empty());

    peer.set_devices(&["dev0"]);
    wait_instances(&server, &names[0], 1).await;
    let c = peer.counters();
    assert_eq!(
        (c.registrations, c.discover_calls),
        (1, 1),
        "the same stream carried it: {c:?}"
    );
    agent.stop().await.unwrap();
}
