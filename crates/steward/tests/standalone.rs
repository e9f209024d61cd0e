//! `steward agent --standalone` as a process (what `scripts/local-run` does):
//! Configurations from a file, Instances in the embedded store, read while it
//! runs with `steward get instances --state-dir` (its read API) and after
//! SIGTERM from the store.

mod common;

use std::ffi::OsString;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn configurations_yaml(descriptions: &[&str]) -> String {
    let quoted: Vec<String> = descriptions.iter().map(|d| format!("{d:?}")).collect();
    format!(
        "apiVersion: steward.dev/v1alpha1
kind: Configuration
metadata:
  name: debug-echo
  namespace: default
spec:
  discoveryHandler:
    name: debug-echo
    details: |
      descriptions: [{}]
  capacity: 2
  brokerProperties:
    LOCATION: lab
",
        quoted.join(", ")
    )
}

/// Replaces `path` atomically so the agent never reads a partial file.
fn write_atomically(path: &Path, content: &str) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, content)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// `GET /metrics` with a bare HTTP/1.0 request.
async fn metrics(addr: std::net::SocketAddr) -> anyhow::Result<String> {
    let out = http_get(addr, "/metrics").await?;
    ensure!(
        out.starts_with("HTTP/1.0 200") || out.starts_with("HTTP/1.1 200"),
        "{out}"
    );
    Ok(out)
}

/// The whole HTTP/1.0 answer to `GET path`.
async fn http_get(addr: std::net::SocketAddr, path: &str) -> anyhow::Result<String> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
        .await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    Ok(out)
}

/// Value of the sample whose name ends with `name_suffix` (the registry's
/// prefix is not this test's business) and whose labels are `labels`.
fn sample(text: &str, name_suffix: &str, labels: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        let (series, value) = l.rsplit_once(' ')?;
        let (name, rest) = series.split_once('{').unwrap_or((series, ""));
        let ok = name.ends_with(name_suffix) && rest.trim_end_matches('}') == labels;
        if ok { value.parse().ok() } else { None }
    })
}

/// stdout of `steward ARGS DIR`; fails with stderr when it fails.
fn steward_out(args: &[&str], dir: &Path) -> anyhow::Result<String> {
    let out = Command::new(STEWARD)
        .args(args)
        .arg(dir)
        .env("NO_COLOR", "1")
        .output()
        .with_context(|| format!("running steward {args:?}"))?;
    ensure!(
        out.status.success(),
        "steward {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

fn free_local_addr() -> anyhow::Result<std::net::SocketAddr> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_agent_process_keeps_instances_that_steward_instances_prints()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let state = dir.path().join("state");
    let file = dir.path().join("configurations.yaml");
    write_atomically(
        &file,
        &configurations_yaml(&["camera-0", "camera-1", "sensor-0"]),
    )?;
    let addr = free_local_addr()?;
    let args: Vec<OsString> = vec![
        "agent".into(),
        "--standalone".into(),
        "--configurations".into(),
        file.clone().into(),
        "--node-name".into(),
        "local-node".into(),
        "--state-dir".into(),
        state.clone().into(),
        "--registration-socket".into(),
        dir.path().join("registration.sock").into(),
        "--embedded".into(),
        "debug-echo".into(),
        "--metrics-address".into(),
        addr.to_string().into(),
        "--log-format".into(),
        "json".into(),
    ];
    let log = dir.path().join("agent.log");
    let mut agent = Proc::spawn("standalone agent", &args, &[], log.clone())?;

    let count = || async {
        let text = metrics(addr).await.ok()?;
        sample(
            &text,
            "discovery_instances",
            "configuration=\"default/debug-echo\"",
        )
    };
    eventually("three Instances in the embedded store", WAIT, || async {
        (count().await? == 3.0).then_some(())
    })
    .await?;

    // The file is reloaded while the agent runs.
    write_atomically(
        &file,
        &configurations_yaml(&["camera-0", "camera-1", "sensor-0", "camera-2"]),
    )?;
    eventually("fourth Instance after the file changed", WAIT, || async {
        (count().await? == 4.0).then_some(())
    })
    .await?;
    let text = metrics(addr).await?;
    ensure!(
        sample(&text, "discovery_handlers", "state=\"Active\"") == Some(1.0),
        "{text}"
    );
    // Ready: the Configurations file has been read and applied.
    let ready = http_get(addr, "/readyz").await?;
    ensure!(
        ready.starts_with("HTTP/1.0 200") || ready.starts_with("HTTP/1.1 200"),
        "{ready}"
    );
    ensure!(ready.ends_with("ok\n"), "{ready}");

    // While it runs, its store is its own: `get instances --state-dir`
    // reads the agent's read API, in the table a cluster gets.
    let live = steward_out(&["get", "instances", "--state-dir"], &state)?;
    let rows: Vec<Vec<&str>> = live
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    ensure!(
        rows.first().map(|r| &r[..7])
            == Some(
                &[
                    "NAMESPACE",
                    "NAME",
                    "CONFIGURATION",
                    "CAPACITY",
                    "HELD",
                    "NODES",
                    "READY"
                ][..]
            ),
        "{live}"
    );
    ensure!(rows.len() == 5, "four Instances:\n{live}");
    for r in &rows[1..] {
        ensure!(
            r[0] == "default"
                && r[1].starts_with("debug-echo-")
                && r[2..6] == ["debug-echo", "2", "0", "local-node"],
            "row {r:?} in:\n{live}"
        );
    }
    let json = steward_out(&["get", "instances", "-o", "json", "--state-dir"], &state)?;
    let list: serde_json::Value = serde_json::from_str(&json)?;
    let items = list["items"].as_array().map(Vec::len);
    ensure!(items == Some(4), "{json}");
    ensure!(state.join("agent.sock").exists());
    // The handler serving the Configuration, as `get handlers` shows it in
    // a cluster (only a running agent knows handler states).
    let handlers = steward_out(&["get", "handlers", "--state-dir"], &state)?;
    let rows: Vec<Vec<&str>> = handlers
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    ensure!(
        rows == [
            vec!["NAMESPACE", "CONFIGURATION", "NODE", "HANDLER", "STATE"],
            vec![
                "default",
                "debug-echo",
                "local-node",
                "debug-echo",
                "Active"
            ],
        ],
        "{handlers}"
    );
    // Not a cluster flag at the same time.
    let both = Command::new(STEWARD)
        .args(["get", "instances", "-A", "--state-dir"])
        .arg(&state)
        .output()?;
    ensure!(!both.status.success(), "-A with --state-dir was accepted");

    agent.sigterm()?;
    let status = agent.wait_exit(Duration::from_secs(15)).await?;
    ensure!(status.success(), "agent exited with {status}");
    ensure!(
        !state.join("agent.sock").exists(),
        "the read API socket is left behind"
    );
    // Stopped: the same Instances, read from the store.
    let stopped = steward_out(&["get", "instances", "--state-dir"], &state)?;
    ensure!(stopped.lines().count() == 5, "{stopped}");
    // Handler states died with the agent: one clear line, non-zero.
    let gone = Command::new(STEWARD)
        .args(["get", "handlers", "--state-dir"])
        .arg(&state)
        .output()?;
    let err = String::from_utf8_lossy(&gone.stderr);
    ensure!(
        !gone.status.success() && err.contains("no standalone agent runs"),
        "{err}"
    );

    // --log-format json: every line a JSON object a log collector can read.
    let logged = std::fs::read_to_string(&log)?;
    let lines: Vec<&str> = logged.lines().filter(|l| !l.trim().is_empty()).collect();
    ensure!(lines.len() >= 3, "too few log lines:\n{logged}");
    for line in &lines {
        let v: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("not a JSON log line: {line}"))?;
        ensure!(
            line.starts_with('{') && v["level"].as_str().is_some() && v["fields"].is_object(),
            "not a JSON log object: {line}"
        );
    }

    let out = Command::new(STEWARD)
        .args(["instances", "--state-dir"])
        .arg(&state)
        .env("NO_COLOR", "1")
        .output()
        .context("running steward instances")?;
    let stdout = String::from_utf8(out.stdout)?;
    ensure!(
        out.status.success(),
        "steward instances failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("debug-echo-"))
        .collect();
    ensure!(rows.len() == 4, "rows:\n{stdout}");
    for device in ["camera-0", "camera-1", "camera-2", "sensor-0"] {
        let Some(row) = rows.iter().find(|r| {
            r.split_whitespace()
                .any(|w| w == format!("DEBUG_ECHO_DESCRIPTION={device}"))
        }) else {
            bail!("no row for {device}:\n{stdout}");
        };
        let cols: Vec<&str> = row.split_whitespace().collect();
        // NAME CONFIGURATION SHARED NODES DEVICE PROPERTIES...
        ensure!(
            cols.get(1..5) == Some(&["debug-echo", "false", "local-node", device][..]),
            "row {row:?}"
        );
    }
    ensure!(
        stdout.lines().last() == Some("4 instance(s)"),
        "summary:\n{stdout}"
    );
    Ok(())
}
