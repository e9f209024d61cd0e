//! A standalone agent's Instances and Configurations, for `steward get
//! instances|handlers --state-dir` and `steward instances`: from the
//! running agent's read API (`<state-dir>/agent.sock`), or, for Instances
//! when no agent runs, from its embedded store directly (one process may
//! open the store: the running agent's).

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use serde::Deserialize;
use steward_agent::NodeStore;
use steward_agent::StateError;
use steward_agent::local_api::SOCKET;
use steward_api::{Configuration, Instance};

/// Where the Instances were read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The running agent answered.
    Agent,
    /// No agent runs; its store was read.
    Store,
}

#[derive(Deserialize)]
struct ListOf<T> {
    items: Vec<T>,
}

/// The running standalone agent's Configurations in `state_dir`, each with
/// the status it would write in a cluster (its handlers and their state).
/// Only a running agent knows them: its store keeps no handler states.
pub async fn configurations(
    state_dir: &Path,
    timeout: Duration,
) -> anyhow::Result<Vec<Configuration>> {
    let socket = state_dir.join(SOCKET);
    let stream = match tokio::net::UnixStream::connect(&socket).await {
        Ok(s) => s,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            bail!(
                "no standalone agent runs with state in {} ({} is not served); handler states exist only while it runs",
                state_dir.display(),
                socket.display()
            );
        }
        Err(e) => return Err(e).with_context(|| format!("connecting to {}", socket.display())),
    };
    ask_within(stream, "/configurations", &socket, timeout).await
}

/// The standalone agent's Instances in `state_dir`, sorted by namespace and
/// name. Each answer of the agent is awaited at most `timeout`.
pub async fn instances(
    state_dir: &Path,
    timeout: Duration,
) -> anyhow::Result<(Vec<Instance>, Source)> {
    let socket = state_dir.join(SOCKET);
    match tokio::net::UnixStream::connect(&socket).await {
        Ok(stream) => {
            let items = ask_within(stream, "/instances", &socket, timeout).await?;
            Ok((items, Source::Agent))
        }
        // No socket, or a stale one: no agent runs here. Its store says
        // what it left.
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            if !state_dir
                .join(steward_agent::node_store::STATE_FILE)
                .exists()
            {
                bail!(
                    "no standalone agent state in {}: neither {SOCKET} nor {} (is it the agent's --state-dir?)",
                    state_dir.display(),
                    steward_agent::node_store::STATE_FILE
                );
            }
            let store = match NodeStore::open(state_dir) {
                Ok(s) => s,
                Err(e @ StateError::Busy { .. }) => {
                    bail!("{e}; an agent holds the store but does not serve {SOCKET}")
                }
                Err(e) => {
                    return Err(e).with_context(|| {
                        format!("opening the embedded store in {}", state_dir.display())
                    });
                }
            };
            let mut items = store.instances().context("reading Instances")?;
            items.sort_by(|a, b| {
                (&a.metadata.namespace, &a.metadata.name)
                    .cmp(&(&b.metadata.namespace, &b.metadata.name))
            });
            Ok((items, Source::Store))
        }
        Err(e) => Err(e).with_context(|| format!("connecting to {}", socket.display())),
    }
}

/// [`ask`], bounded by `timeout`.
async fn ask_within<T: serde::de::DeserializeOwned>(
    stream: tokio::net::UnixStream,
    path: &str,
    socket: &Path,
    timeout: Duration,
) -> anyhow::Result<Vec<T>> {
    tokio::time::timeout(timeout, ask(stream, path))
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "the agent at {} did not answer within {timeout:?}",
                socket.display()
            )
        })?
}

/// `GET path` on a connected socket: the items of the List it answers.
async fn ask<T: serde::de::DeserializeOwned>(
    stream: tokio::net::UnixStream,
    path: &str,
) -> anyhow::Result<Vec<T>> {
    let io = hyper_util::rt::TokioIo::new(stream);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .context("talking to the agent")?;
    let conn = tokio::spawn(conn);
    let req = hyper::Request::get(path)
        .header(hyper::header::HOST, "agent")
        .body(Empty::<Bytes>::new())
        .context("building the request")?;
    let resp = sender
        .send_request(req)
        .await
        .with_context(|| format!("asking the agent for {path}"))?;
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .context("reading the agent's answer")?
        .to_bytes();
    conn.abort();
    if !status.is_success() {
        let why = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["error"].as_str().map(str::to_owned))
            .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
        bail!("the agent answered {status}: {why}");
    }
    let list: ListOf<T> = serde_json::from_slice(&body)
        .with_context(|| format!("the agent's answer to {path} is not the list it should be"))?;
    Ok(list.items)
}
