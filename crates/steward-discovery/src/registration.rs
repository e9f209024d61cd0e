//! The v0 `Registration` service: the agent serves it on a unix socket
//! (mode 0600) and each discovery handler calls it once per agent start.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use steward_proto::discovery::v0 as proto;
use steward_proto::discovery::v0::register_discovery_handler_request::EndpointType;
use steward_proto::discovery::v0::registration_client::RegistrationClient;
use steward_proto::discovery::v0::registration_server::{self, RegistrationServer};
use tokio::sync::mpsc;
use tonic::{Code, Request, Response, Status};

use crate::policy::RegistrationPolicy;
use crate::{DiscoveryError, Endpoint, HandlerKey, uds};

/// Mode of the agent's registration socket: only root (the agent's user) may register.
pub const SOCKET_MODE: u32 = 0o600;
/// Longest handler name accepted.
pub const MAX_NAME_LEN: usize = 253;
/// Longest unix socket path (`sun_path` holds 108 bytes with the NUL).
pub const MAX_UDS_PATH_LEN: usize = 107;
/// Longest network endpoint URL accepted.
pub const MAX_URL_LEN: usize = 2048;
/// How long [`register`] waits for the agent.
pub const REGISTER_TIMEOUT: Duration = Duration::from_secs(5);

/// One accepted registration, as forwarded to the agent.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Registration {
    pub key: HandlerKey,
    pub shared: bool,
}

/// Why a registration was refused (the message is sent back to the
/// handler as `INVALID_ARGUMENT`).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct RegistrationError {
    /// What is wrong, naming the offending value.
    pub message: String,
    /// The URL parser's own error, for a NETWORK endpoint that is no URL.
    #[source]
    pub source: Option<http::uri::InvalidUri>,
}

impl From<String> for RegistrationError {
    fn from(message: String) -> Self {
        Self {
            message,
            source: None,
        }
    }
}

impl From<&str> for RegistrationError {
    fn from(message: &str) -> Self {
        message.to_owned().into()
    }
}

/// Checks a wire registration: a non-empty printable name, and an absolute
/// unix socket path (UDS) or an `http(s)://host[:port]` URL (NETWORK).
pub fn validate(
    req: &proto::RegisterDiscoveryHandlerRequest,
) -> Result<Registration, RegistrationError> {
    let name = req.name.as_str();
    if name.is_empty() {
        return Err(RegistrationError::from(
            "discovery handler name must not be empty",
        ));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(RegistrationError::from(format!(
            "discovery handler name is {} bytes long, the limit is {MAX_NAME_LEN}",
            name.len()
        )));
    }
    if let Some(c) = name.chars().find(|c| c.is_control() || c.is_whitespace()) {
        return Err(RegistrationError::from(format!(
            "discovery handler name {name:?} contains the character {c:?}"
        )));
    }
    let endpoint = match EndpointType::try_from(req.endpoint_type) {
        Ok(EndpointType::Uds) => Endpoint::Uds(validate_uds_path(&req.endpoint)?),
        Ok(EndpointType::Network) => Endpoint::Network(validate_url(&req.endpoint)?),
        Err(_) => {
            return Err(RegistrationError::from(format!(
                "unknown endpoint type {} (0 = UDS, 1 = NETWORK)",
                req.endpoint_type
            )));
        }
    };
    Ok(Registration {
        key: HandlerKey {
            name: name.to_string(),
            endpoint,
        },
        shared: req.shared,
    })
}

fn validate_uds_path(path: &str) -> Result<String, RegistrationError> {
    if path.is_empty() {
        return Err(
            "UDS endpoint must be an absolute unix socket path, got an empty string".into(),
        );
    }
    if !path.starts_with('/') {
        return Err(RegistrationError::from(format!(
            "UDS endpoint must be an absolute unix socket path, got {path:?}"
        )));
    }
    if path.contains('\0') {
        return Err(RegistrationError::from("UDS endpoint contains a NUL byte"));
    }
    if path.ends_with('/') {
        return Err(RegistrationError::from(format!(
            "UDS endpoint {path:?} names a directory, not a socket"
        )));
    }
    if path.len() > MAX_UDS_PATH_LEN {
        return Err(RegistrationError::from(format!(
            "UDS endpoint {path:?} is {} bytes long, unix sockets allow {MAX_UDS_PATH_LEN}",
            path.len()
        )));
    }
    Ok(path.to_string())
}

fn validate_url(url: &str) -> Result<String, RegistrationError> {
    if url.len() > MAX_URL_LEN {
        return Err(RegistrationError::from(format!(
            "NETWORK endpoint is {} bytes long, the limit is {MAX_URL_LEN}",
            url.len()
        )));
    }
    let uri: http::Uri = url.parse().map_err(|e| RegistrationError {
        message: format!("NETWORK endpoint {url:?} is not a URL: {e}"),
        source: Some(e),
    })?;
    match uri.scheme_str() {
        Some("http") | Some("https") => {}
        Some(other) => {
            return Err(RegistrationError::from(format!(
                "NETWORK endpoint {url:?} has scheme {other:?}, expected http or https"
            )));
        }
        None => {
            return Err(RegistrationError::from(format!(
                "NETWORK endpoint {url:?} is not a URL (expected http://host:port)"
            )));
        }
    }
    match uri.host() {
        Some(host) if !host.is_empty() => {}
        _ => {
            return Err(RegistrationError::from(format!(
                "NETWORK endpoint {url:?} has no host"
            )));
        }
    }
    if uri.query().is_some() || !matches!(uri.path(), "" | "/") {
        return Err(RegistrationError::from(format!(
            "NETWORK endpoint {url:?} must be http(s)://host[:port] without a path or query"
        )));
    }
    Ok(url.to_string())
}

struct RegistrationService {
    tx: mpsc::Sender<Registration>,
    policy: Arc<RegistrationPolicy>,
}

#[tonic::async_trait]
impl registration_server::Registration for RegistrationService {
    async fn register_discovery_handler(
        &self,
        request: Request<proto::RegisterDiscoveryHandlerRequest>,
    ) -> Result<Response<proto::Empty>, Status> {
        let req = request.into_inner();
        let registration = match validate(&req) {
            Ok(r) => r,
            Err(reason) => {
                tracing::warn!(name = %req.name, endpoint = %req.endpoint, %reason, "rejected discovery handler registration");
                return Err(Status::invalid_argument(reason.to_string()));
            }
        };
        if let Err(status) = self.policy.admit(&registration.key) {
            tracing::warn!(name = %req.name, endpoint = %req.endpoint, reason = %status.message(), "refused discovery handler registration");
            return Err(status);
        }
        tracing::info!(name = %registration.key.name, endpoint = ?registration.key.endpoint, shared = registration.shared, "discovery handler registered");
        self.tx
            .send(registration)
            .await
            .map_err(|_| Status::unavailable("the agent is not accepting registrations"))?;
        Ok(Response::new(proto::Empty {}))
    }
}

/// Agent side: serves v0 Registration on a unix socket (mode 0600),
/// forwards each valid registration `policy` admits to `tx`; malformed ones
/// get `INVALID_ARGUMENT`, those the policy refuses `PERMISSION_DENIED` or
/// `ALREADY_EXISTS` (see [`RegistrationPolicy`]). A stale socket file at
/// `socket` is replaced; the file is removed again when serving stops.
/// Runs until `shutdown` completes.
pub async fn serve(
    socket: PathBuf,
    tx: mpsc::Sender<Registration>,
    policy: RegistrationPolicy,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), DiscoveryError> {
    let (listener, guard) = uds::bind(&socket, SOCKET_MODE)?;
    tracing::info!(socket = %socket.display(), "serving discovery handler registration");
    let result = tonic::transport::Server::builder()
        .add_service(
            RegistrationServer::new(RegistrationService {
                tx,
                policy: Arc::new(policy),
            })
            .max_decoding_message_size(crate::client::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(crate::client::MAX_MESSAGE_BYTES),
        )
        .serve_with_incoming_shutdown(listener, shutdown)
        .await;
    drop(guard);
    result.map_err(|e| {
        DiscoveryError::Io(std::io::Error::other(format!(
            "registration server on {} failed: {}",
            socket.display(),
            uds::error_chain(&e)
        )))
    })
}

/// DH side: registers once with the agent listening on `agent_socket`.
pub async fn register(
    agent_socket: &Path,
    name: &str,
    endpoint: &Endpoint,
    shared: bool,
) -> Result<(), DiscoveryError> {
    let (endpoint_type, endpoint_text) = match endpoint {
        Endpoint::Uds(path) => (EndpointType::Uds, path.clone()),
        Endpoint::Network(url) => (EndpointType::Network, url.clone()),
        Endpoint::Embedded => {
            return Err(DiscoveryError::Registration(
                "an embedded handler cannot register over the wire".into(),
            ));
        }
    };
    let channel = uds::connect_uds(agent_socket, REGISTER_TIMEOUT).await?;
    let mut client = RegistrationClient::new(channel);
    let req = proto::RegisterDiscoveryHandlerRequest {
        name: name.to_string(),
        endpoint: endpoint_text,
        endpoint_type: endpoint_type as i32,
        shared,
    };
    match tokio::time::timeout(REGISTER_TIMEOUT, client.register_discovery_handler(req)).await {
        Err(_) => Err(DiscoveryError::Timeout(format!(
            "agent at {} did not answer the registration within {REGISTER_TIMEOUT:?}",
            agent_socket.display()
        ))),
        Ok(Ok(_)) => Ok(()),
        Ok(Err(status)) => Err(match status.code() {
            Code::InvalidArgument
            | Code::FailedPrecondition
            | Code::PermissionDenied
            | Code::AlreadyExists => DiscoveryError::Registration(status.message().to_string()),
            _ => DiscoveryError::Connect(format!(
                "registration with {} failed: {:?}: {}",
                agent_socket.display(),
                status.code(),
                status.message()
            )),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(
        name: &str,
        endpoint: &str,
        endpoint_type: i32,
    ) -> proto::RegisterDiscoveryHandlerRequest {
        proto::RegisterDiscoveryHandlerRequest {
            name: name.into(),
            endpoint: endpoint.into(),
            endpoint_type,
            shared: true,
        }
    }

    #[test]
    fn accepts_valid_registrations() {
        let r = validate(&req("udev", "/run/x/udev.sock", 0)).unwrap();
        assert_eq!(r.key.endpoint, Endpoint::Uds("/run/x/udev.sock".into()));
        assert!(r.shared);
        let r = validate(&req("onvif", "http://10.0.0.1:8080", 1)).unwrap();
        assert_eq!(
            r.key.endpoint,
            Endpoint::Network("http://10.0.0.1:8080".into())
        );
        assert!(validate(&req("onvif", "https://dh.example/", 1)).is_ok());
    }

    #[test]
    fn rejects_invalid_registrations() {
        let cases = [
            req("", "/a.sock", 0),
            req("bad name", "/a.sock", 0),
            req("udev", "relative.sock", 0),
            req("udev", "", 0),
            req("udev", "/dir/", 0),
            req("udev", &format!("/{}", "a".repeat(200)), 0),
            req("net", "not a url", 1),
            req("net", "/a.sock", 1),
            req("net", "ftp://h:1", 1),
            req("net", "http://h:1/path", 1),
            req("udev", "/a.sock", 7),
        ];
        for case in cases {
            assert!(validate(&case).is_err(), "accepted {case:?}");
        }
        let msg = validate(&req("", "/a.sock", 0)).unwrap_err().to_string();
        assert!(msg.contains("name must not be empty"), "{msg}");
        // A URL that does not parse keeps the parser's error as its source.
        let e = validate(&req("net", "http://[::1", 1)).unwrap_err();
        assert!(std::error::Error::source(&e).is_some(), "{e}");
    }
}
