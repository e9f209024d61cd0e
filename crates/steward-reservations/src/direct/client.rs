//! The extender's side of the direct path: where the leader answers
//! (followed on the election Lease, one object), and the call: over plain
//! HTTP, or over HTTPS with the leader's certificate verified
//! ([`Leader::with_trust`], [`super::transport`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use http_body_util::{BodyExt, Full};
use hyper::StatusCode;
use hyper::body::Bytes;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::runtime::watcher;
use steward_api::Reservation;
use steward_kube::{Change, SharedWatch};
use tokio::sync::watch;
use tokio_util::task::AbortOnDropHandle;

use super::token::DecideToken;
use super::transport::{self, DecideTrust, Mismatch, Transport};
use super::wire::{DECIDE_PATH, DecideRequest, ENDPOINT_ANNOTATION};

/// Largest answer read (one Reservation object).
const MAX_ANSWER: usize = 4 << 20;

/// What the leader answered.
#[derive(Debug)]
pub enum Answer {
    /// The pod's Reservation, decided for the ask.
    Decided(Box<Reservation>),
    /// The ask is written, the decision did not come in time.
    Undecided,
    /// The ask is refused (the reason in full): out of bounds, another
    /// existing pod's Reservation, or the API server's validation.
    Refused(String),
}

/// Why the leader gave no answer: the extender asks through the API
/// instead.
#[derive(Debug, thiserror::Error)]
pub enum DirectError {
    #[error("no leader says where it decides")]
    NoLeader,
    #[error("{0} does not lead")]
    NotLeading(String),
    #[error("the leader at {0} cannot decide now: {1}")]
    Unavailable(String, String),
    #[error("reaching the leader at {0}: {1}")]
    Transport(String, String),
    #[error(
        "the leader's endpoint {0} is plain HTTP, but the extender authenticates the leader (--decide-ca-file): refused without connecting"
    )]
    Plaintext(String),
    #[error(
        "the leader's endpoint {0} is HTTPS, but the extender has no CA to verify its certificate with (--decide-ca-file, --decide-server-name)"
    )]
    NoTrust(String),
    #[error("the leader's endpoint {0} is neither an http:// nor an https:// URL")]
    BadEndpoint(String),
    #[error("the leader at {0} failed: {1}")]
    Failed(String, String),
    #[error("no token to send the leader: {0}")]
    Token(#[from] super::token::TokenError),
    #[error("the leader at {0} does not take the extender's credentials ({1}): {2}")]
    Refused(String, StatusCode, String),
}

/// Who holds the election Lease and where it decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The holder's identity in the Lease.
    pub identity: String,
    /// Its decide endpoint.
    pub endpoint: String,
}

/// The leader's endpoint, as the election Lease says, and a kept-alive
/// connection pool to it.
pub struct Leader {
    holder: watch::Receiver<Option<Holder>>,
    transport: Transport,
    /// Sent as `Authorization: Bearer` (`None`: no credentials).
    token: Option<DecideToken>,
    /// The leader refused the credentials last time (warned once until
    /// it takes them again).
    refused: AtomicBool,
    /// The endpoint is not one this transport dials, or the leader's
    /// certificate failed verification, last time (warned once until an
    /// ask goes through again).
    untrusted: AtomicBool,
    _follow: AbortOnDropHandle<()>,
}

impl std::fmt::Debug for Leader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leader")
            .field("holder", &*self.holder.borrow())
            .finish_non_exhaustive()
    }
}

/// The holder a Lease names, with its endpoint annotation.
pub fn holder_of(lease: &Lease) -> Option<Holder> {
    let identity = lease
        .spec
        .as_ref()?
        .holder_identity
        .clone()
        .filter(|h| !h.is_empty())?;
    let endpoint = lease
        .metadata
        .annotations
        .as_ref()?
        .get(ENDPOINT_ANNOTATION)?
        .clone();
    Some(Holder { identity, endpoint })
}

impl Leader {
    /// Follows Lease `namespace`/`name` (on the current tokio runtime).
    pub fn follow(client: kube::Client, namespace: &str, name: &str) -> Self {
        let (tx, rx) = watch::channel(None);
        let api = Api::<Lease>::namespaced(client, namespace);
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let name = name.to_owned();
        let task = tokio::spawn(async move {
            let mut changes = SharedWatch::start(api, config).subscribe();
            while let Some(c) = changes.next().await {
                let now = match c {
                    Change::Relisted(all) => all.iter().find_map(holder_of),
                    Change::Applied(l) => holder_of(&l),
                    Change::Deleted(_) => None,
                    Change::Interrupted(_) => continue,
                };
                tx.send_if_modified(|e| {
                    let changed = *e != now;
                    if changed {
                        tracing::info!(lease = %name, holder = ?now, "the decision leader moved");
                    }
                    *e = now;
                    changed
                });
            }
        });
        Self {
            holder: rx,
            transport: Transport::Plain(Box::new(transport::plain())),
            token: None,
            refused: AtomicBool::new(false),
            untrusted: AtomicBool::new(false),
            _follow: AbortOnDropHandle::new(task),
        }
    }

    /// The same, authenticating with `token` (`None`: no credentials).
    #[must_use]
    pub fn with_token(mut self, token: Option<DecideToken>) -> Self {
        self.token = token;
        self
    }

    /// The same, over HTTPS with the leader's certificate verified by
    /// `trust` (only `https://` endpoints are then dialed; an `http://`
    /// one is [`DirectError::Plaintext`]); `None`: plain HTTP (only
    /// `http://` endpoints).
    #[must_use]
    pub fn with_trust(mut self, trust: Option<DecideTrust>) -> Self {
        self.transport = match trust {
            Some(t) => Transport::Tls(t),
            None => Transport::Plain(Box::new(transport::plain())),
        };
        self
    }

    /// Warns once (until an ask goes through) that the leader is not
    /// asked directly, for `why`.
    fn untrusted(&self, why: &DirectError) {
        if !self.untrusted.swap(true, Ordering::Relaxed) {
            tracing::warn!(error = %why, "not asking the leader directly: asking through the API (logged again once it is asked directly)");
        }
    }

    /// Where the leader decides, as last seen.
    pub fn endpoint(&self) -> Option<String> {
        self.holder.borrow().as_ref().map(|h| h.endpoint.clone())
    }

    /// Who leads and where, as last seen.
    pub fn holder(&self) -> Option<Holder> {
        self.holder.borrow().clone()
    }

    /// Asks the leader to decide `ask`, waiting at most `ask.timeout_ms`
    /// (and a little for the answer to travel).
    pub async fn decide(&self, ask: &DecideRequest) -> Result<Answer, DirectError> {
        let endpoint = self.endpoint().ok_or(DirectError::NoLeader)?;
        if let Err(m) = self.transport.admits(&endpoint) {
            let e = match m {
                Mismatch::Plaintext => DirectError::Plaintext(endpoint),
                Mismatch::NoTrust => DirectError::NoTrust(endpoint),
                Mismatch::Scheme => DirectError::BadEndpoint(endpoint),
            };
            self.untrusted(&e);
            return Err(e);
        }
        let transport = |e: String| DirectError::Transport(endpoint.clone(), e);
        let body = serde_json::to_vec(ask).map_err(|e| transport(e.to_string()))?;
        let mut req =
            hyper::Request::post(format!("{}{DECIDE_PATH}", endpoint.trim_end_matches('/')))
                .header(hyper::header::CONTENT_TYPE, "application/json")
                .body(Full::new(Bytes::from(body)))
                .map_err(|e| transport(e.to_string()))?;
        if let Some(token) = &self.token {
            let read = token.bearer().inspect_err(|e| {
                if !self.refused.swap(true, Ordering::Relaxed) {
                    tracing::warn!(error = %e, "no token for the leader: asking through the API");
                }
            })?;
            let mut value = hyper::header::HeaderValue::try_from(format!("Bearer {read}"))
                .map_err(|_| transport("the token is not a header value".into()))?;
            value.set_sensitive(true);
            req.headers_mut()
                .insert(hyper::header::AUTHORIZATION, value);
        }
        let within = Duration::from_millis(ask.timeout_ms) + Duration::from_millis(500);
        let resp = tokio::time::timeout(within, self.transport.request(req))
            .await
            .map_err(|_| transport(format!("no answer within {within:?}")))?
            .map_err(|e| {
                let tls = transport::is_tls_failure(&e);
                let e = transport(transport::error_chain(&e));
                if tls {
                    self.untrusted(&e);
                }
                e
            })?;
        if self.untrusted.swap(false, Ordering::Relaxed) {
            tracing::info!(%endpoint, "asking the leader directly again");
        }
        let status = resp.status();
        let body = tokio::time::timeout(
            within,
            http_body_util::Limited::new(resp.into_body(), MAX_ANSWER).collect(),
        )
        .await
        .map_err(|_| transport("the answer did not finish".into()))?
        .map_err(|e| transport(e.to_string()))?
        .to_bytes();
        let said = || String::from_utf8_lossy(&body).trim().to_owned();
        if matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) {
            if !self.refused.swap(true, Ordering::Relaxed) {
                tracing::warn!(%endpoint, %status, answer = %said(), "the leader refuses the extender's credentials (--decide-token-file, the controller's --decide-allowed-users): asking through the API");
            }
            return Err(DirectError::Refused(endpoint, status, said()));
        }
        if self.refused.swap(false, Ordering::Relaxed) {
            tracing::info!(%endpoint, "the leader takes the extender's credentials again");
        }
        match status {
            StatusCode::OK => serde_json::from_slice::<Reservation>(&body)
                .map(|r| Answer::Decided(Box::new(r)))
                .map_err(|e| {
                    DirectError::Failed(endpoint.clone(), format!("unreadable answer: {e}"))
                }),
            StatusCode::ACCEPTED => Ok(Answer::Undecided),
            StatusCode::UNPROCESSABLE_ENTITY => Ok(Answer::Refused(said())),
            StatusCode::MISDIRECTED_REQUEST => Err(DirectError::NotLeading(endpoint)),
            StatusCode::SERVICE_UNAVAILABLE => Err(DirectError::Unavailable(endpoint, said())),
            _ => Err(DirectError::Failed(
                endpoint,
                format!("{status}: {}", said()),
            )),
        }
    }
}
