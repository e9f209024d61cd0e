//! Unix-socket and channel plumbing shared by the agent and DH sides.

use std::path::Path;
use std::time::Duration;

use steward_nodeio::{BindOptions, SocketGuard, UnixIncoming};
use tonic::transport::{Channel, Endpoint as TonicEndpoint};

use crate::{DiscoveryError, Endpoint};

/// HTTP/2 keepalive: a peer that stops answering pings is dropped.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Opens a gRPC channel to a unix socket or a network URL, within `timeout`.
pub(crate) async fn connect(
    endpoint: &Endpoint,
    timeout: Duration,
) -> Result<Channel, DiscoveryError> {
    match endpoint {
        Endpoint::Embedded => Err(DiscoveryError::Connect(
            "an embedded handler has no transport endpoint".into(),
        )),
        Endpoint::Uds(path) => connect_uds(Path::new(path), timeout).await,
        Endpoint::Network(url) => {
            let ep = TonicEndpoint::from_shared(url.clone()).map_err(|e| {
                DiscoveryError::Connect(format!("invalid endpoint URL {url:?}: {e}"))
            })?;
            let ep = tune(ep, timeout);
            match tokio::time::timeout(timeout, ep.connect()).await {
                Ok(Ok(channel)) => Ok(channel),
                Ok(Err(e)) => Err(DiscoveryError::Connect(format!(
                    "{url}: {}",
                    error_chain(&e)
                ))),
                Err(_) => Err(DiscoveryError::Connect(format!(
                    "{url}: no connection within {timeout:?}"
                ))),
            }
        }
    }
}

/// Opens a gRPC channel over the unix socket at `path`, within `timeout`.
pub(crate) async fn connect_uds(path: &Path, timeout: Duration) -> Result<Channel, DiscoveryError> {
    if !path.is_absolute() {
        return Err(DiscoveryError::Connect(format!(
            "unix socket path {} is not absolute",
            path.display()
        )));
    }
    let ep = tune(steward_proto::uds::endpoint(), timeout);
    let connector = steward_proto::uds::UnixConnector::new(path);
    match tokio::time::timeout(timeout, ep.connect_with_connector(connector)).await {
        Ok(Ok(channel)) => Ok(channel),
        Ok(Err(e)) => Err(DiscoveryError::Connect(format!(
            "unix socket {}: {}",
            path.display(),
            error_chain(&e)
        ))),
        Err(_) => Err(DiscoveryError::Connect(format!(
            "unix socket {}: no connection within {timeout:?}",
            path.display()
        ))),
    }
}

fn tune(ep: TonicEndpoint, connect_timeout: Duration) -> TonicEndpoint {
    ep.connect_timeout(connect_timeout)
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true)
}

/// `e` with its sources, joined by `: ` (tonic's errors hide the cause).
pub(crate) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    text
}

/// Binds a unix socket at `path` with the given mode (see
/// [`steward_nodeio::bind`]: bound under a temporary name, chmod-ed and renamed
/// into place; a stale socket is replaced, a live one or another file
/// refused) and serves it to any gRPC client, C-core ones included (see
/// [`steward_nodeio::h2_authority`]). The guard removes the socket when
/// dropped, if it is still ours.
pub(crate) fn bind(path: &Path, mode: u32) -> Result<(UnixIncoming, SocketGuard), DiscoveryError> {
    let (listener, guard) = steward_nodeio::bind(path, BindOptions::mode(mode))
        .map_err(|e| DiscoveryError::Io(e.into()))?;
    Ok((UnixIncoming::with_authority_fix(listener), guard))
}
