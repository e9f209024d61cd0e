//! Agent side of the v0 `DiscoveryHandler` service.

use std::time::Duration;

use futures::StreamExt;
use steward_proto::discovery::v0 as proto;
use steward_proto::discovery::v0::discovery_handler_client::DiscoveryHandlerClient;
use tonic::transport::Channel;
use tonic::{Code, Status, Streaming};

use crate::convert::{device_from_proto, request_to_proto};
use crate::{Device, DeviceStream, DiscoverRequest, DiscoveryError, Endpoint, uds};

/// Largest v0 message accepted from a handler.
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// Time limits of [`discover`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientOptions {
    /// Limit for establishing the connection to the handler.
    pub connect_timeout: Duration,
    /// Limit for the handler to answer the `Discover` call (its response
    /// headers; a tonic handler, as Akri's and steward's are, answers at
    /// once). Never a limit on the first device list: a handler may send
    /// none while nothing matches.
    pub open_timeout: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(5),
            open_timeout: Duration::from_secs(30),
        }
    }
}

/// Agent side: connects to a DH (UDS or network), calls Discover, maps proto
/// devices to core Devices.
///
/// Returns once the stream is open: the handler answered the call. It does
/// not wait for a device list: a handler sends none while nothing matches
/// (Akri's udev handler), and an empty world is a valid answer that may
/// never be sent. A handler that does not answer the call within
/// `open_timeout` gives [`DiscoveryError::Timeout`]. Errors:
/// [`DiscoveryError::Connect`] (cannot reach the handler),
/// [`DiscoveryError::InvalidDetails`] (the handler refused the details with
/// `INVALID_ARGUMENT`), [`DiscoveryError::Handler`] (the handler reported its
/// own failure), [`DiscoveryError::Stream`] (broken or undecodable stream).
/// Stream items carry the same errors; the stream ends after its first
/// error, or when the handler closes it. Devices are passed through
/// unvalidated.
pub async fn discover(
    endpoint: &Endpoint,
    req: DiscoverRequest,
    opts: &ClientOptions,
) -> Result<DeviceStream, DiscoveryError> {
    let channel = uds::connect(endpoint, opts.connect_timeout).await?;
    let where_ = describe(endpoint);
    let mut client = DiscoveryHandlerClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let wire_req = request_to_proto(&req);
    let stream = match tokio::time::timeout(opts.open_timeout, client.discover(wire_req)).await {
        Err(_) => {
            return Err(DiscoveryError::Timeout(format!(
                "{where_} did not answer the Discover call within {:?}",
                opts.open_timeout
            )));
        }
        Ok(Err(status)) => return Err(map_status(&where_, status)),
        Ok(Ok(response)) => response.into_inner(),
    };
    tracing::debug!(endpoint = %where_, "discovery stream open");
    let state = Rest {
        client: Some(client),
        stream,
        where_,
    };
    Ok(futures::stream::unfold(state, |mut st| async move {
        st.client.as_ref()?;
        match st.stream.message().await {
            Ok(Some(msg)) => Some((Ok(to_devices(msg)), st)),
            Ok(None) => {
                tracing::debug!(endpoint = %st.where_, "discovery handler closed the stream");
                None
            }
            Err(status) => {
                let err = map_status(&st.where_, status);
                tracing::warn!(error = %err, "discovery stream ended with an error");
                st.client = None;
                Some((Err(err), st))
            }
        }
    })
    .boxed())
}

struct Rest {
    /// Held so the channel outlives the stream; `None` once an error was yielded.
    client: Option<DiscoveryHandlerClient<Channel>>,
    stream: Streaming<proto::DiscoverResponse>,
    where_: String,
}

fn to_devices(msg: proto::DiscoverResponse) -> Vec<Device> {
    msg.devices.into_iter().map(device_from_proto).collect()
}

fn describe(endpoint: &Endpoint) -> String {
    match endpoint {
        Endpoint::Embedded => "embedded handler".into(),
        Endpoint::Uds(path) => format!("discovery handler at unix:{path}"),
        Endpoint::Network(url) => format!("discovery handler at {url}"),
    }
}

fn map_status(where_: &str, status: Status) -> DiscoveryError {
    let msg = format!("{where_}: {}", status.message());
    match status.code() {
        Code::InvalidArgument => DiscoveryError::InvalidDetails(status.message().to_string()),
        Code::DeadlineExceeded => DiscoveryError::Timeout(msg),
        Code::Aborted | Code::FailedPrecondition => DiscoveryError::Handler(msg),
        Code::Unimplemented => DiscoveryError::Handler(format!(
            "{where_} does not implement v0 DiscoveryHandler.Discover: {}",
            status.message()
        )),
        code => {
            let mut text = format!("{where_}: {code:?}: {}", status.message());
            if let Some(source) = std::error::Error::source(&status) {
                let detail = uds::error_chain(source);
                if !text.contains(&detail) {
                    text.push_str(": ");
                    text.push_str(&detail);
                }
            }
            DiscoveryError::Stream(text)
        }
    }
}
