//! How the extender reaches the leader: plain HTTP, or HTTPS with the
//! leader authenticated ([`DecideTrust`]).
//!
//! Over HTTPS the leader's certificate must chain to the CAs of one PEM
//! file (`--decide-ca-file`) and carry one fixed DNS name
//! (`--decide-server-name`): the extender dials the pod IP the Lease
//! names, but pod IPs change with every restart, so the certificate is
//! checked against the name it was issued for (such as
//! `<release>-controller-decide.<namespace>.svc`), not the address. Only
//! `https://` endpoints are dialed then: a Lease naming a plain `http://`
//! one cannot make the extender send its token in clear to whoever
//! answers there ([`Transport::admits`]).
//!
//! The CA file is looked at for every ask (one `stat`, following links,
//! as [`super::token::DecideToken`] does) and read again when it is
//! another file or changed, as a rotated Secret volume makes it: the
//! asks that follow verify against the new CAs, on new connections (the
//! pool of the old ones is dropped). A changed file that cannot be used
//! is logged once and the last good CAs kept.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper_rustls::{FixedServerNameResolver, HttpsConnector};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use steward_nodeio::FileIdentity;
use steward_nodeio::bounded::rustls::{self, ClientConfig, RootCertStore};
use steward_nodeio::bounded::rustls_pki_types::pem::PemObject;
use steward_nodeio::bounded::rustls_pki_types::{CertificateDer, ServerName};

/// Longest a TCP connect to the leader may take.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// How long an idle connection to the leader is kept.
const POOL_IDLE: Duration = Duration::from_secs(30);

/// A client over plain HTTP.
pub(crate) type PlainClient = HttpClient<HttpConnector, Full<Bytes>>;
/// A client over HTTPS only.
pub(crate) type HttpsClient = HttpClient<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// Why the leader's certificate could not be made verifiable.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error("reading the decide CA file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the decide CA file {path} holds no usable CA certificate: {reason}")]
    Pem { path: PathBuf, reason: String },
    #[error("the TLS client configuration: {0}")]
    Config(#[from] rustls::Error),
    #[error("{name:?} is not a name a server certificate can be checked for: {reason}")]
    ServerName { name: String, reason: String },
}

/// The TCP connector both transports dial with.
fn tcp() -> HttpConnector {
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    http.set_connect_timeout(Some(CONNECT_TIMEOUT));
    http
}

/// A kept-alive client over plain HTTP.
pub(crate) fn plain() -> PlainClient {
    HttpClient::builder(TokioExecutor::new())
        .pool_idle_timeout(POOL_IDLE)
        .build(tcp())
}

/// The CAs of `path`.
fn roots(path: &Path) -> Result<RootCertStore, TrustError> {
    let pem = std::fs::read(path).map_err(|source| TrustError::Read {
        path: path.to_owned(),
        source,
    })?;
    let pem_error = |reason: String| TrustError::Pem {
        path: path.to_owned(),
        reason,
    };
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(e.to_string()))?;
    if certs.is_empty() {
        return Err(pem_error("no CERTIFICATE section".into()));
    }
    let mut roots = RootCertStore::empty();
    for c in certs {
        roots.add(c).map_err(|e| pem_error(e.to_string()))?;
    }
    Ok(roots)
}

/// A client over HTTPS only, verifying the server's certificate against
/// the CAs of `ca_file` for `name`.
fn https(ca_file: &Path, name: &ServerName<'static>) -> Result<HttpsClient, TrustError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots(ca_file)?)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let mut tcp = tcp();
    // `https://` URIs reach the TCP connector; the TLS one refuses any other.
    tcp.enforce_http(false);
    let resolver = Arc::new(FixedServerNameResolver::new(name.clone()));
    let connector = HttpsConnector::new(tcp, config, true, resolver);
    Ok(HttpClient::builder(TokioExecutor::new())
        .pool_idle_timeout(POOL_IDLE)
        .build(connector))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp(Option<FileIdentity>);

impl Stamp {
    fn of(path: &Path) -> Self {
        Self(FileIdentity::of(path))
    }
}

struct Kept {
    stamp: Stamp,
    client: HttpsClient,
    /// The stamp of a file that failed to load (logged once).
    failed: Option<Stamp>,
}

struct Inner {
    ca_file: PathBuf,
    name: ServerName<'static>,
    kept: Mutex<Kept>,
}

/// The extender's trust in the leader: the CAs its `/v1/decide`
/// certificate must chain to, read from a PEM file (again when it
/// changes), and the DNS name it must carry.
#[derive(Clone)]
pub struct DecideTrust {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for DecideTrust {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecideTrust")
            .field("ca_file", &self.inner.ca_file)
            .field("server_name", &self.server_name())
            .finish_non_exhaustive()
    }
}

impl DecideTrust {
    /// Trusts the CAs in `ca_file` (read now: an unusable file is an
    /// error at startup) for certificates naming `server_name`.
    pub fn new(ca_file: impl Into<PathBuf>, server_name: &str) -> Result<Self, TrustError> {
        let ca_file = ca_file.into();
        let name =
            ServerName::try_from(server_name.to_owned()).map_err(|e| TrustError::ServerName {
                name: server_name.to_owned(),
                reason: e.to_string(),
            })?;
        let stamp = Stamp::of(&ca_file);
        let client = https(&ca_file, &name)?;
        Ok(Self {
            inner: Arc::new(Inner {
                ca_file,
                name,
                kept: Mutex::new(Kept {
                    stamp,
                    client,
                    failed: None,
                }),
            }),
        })
    }

    /// The CA file.
    pub fn ca_file(&self) -> &Path {
        &self.inner.ca_file
    }

    /// The name the leader's certificate must carry.
    pub fn server_name(&self) -> String {
        self.inner.name.to_str().into_owned()
    }

    /// The client for the next ask: the kept one while the CA file is
    /// unchanged, else one verifying against the CAs it holds now.
    pub(crate) fn client(&self) -> HttpsClient {
        let inner = &self.inner;
        let stamp = Stamp::of(&inner.ca_file);
        let mut kept = inner.kept.lock().unwrap_or_else(|e| e.into_inner());
        if kept.stamp == stamp || kept.failed == Some(stamp) {
            return kept.client.clone();
        }
        match https(&inner.ca_file, &inner.name) {
            Ok(client) => {
                tracing::info!(ca_file = %inner.ca_file.display(), "the decide CA file changed; verifying the leader against the new CAs");
                kept.stamp = stamp;
                kept.client = client;
                kept.failed = None;
            }
            Err(e) => {
                tracing::warn!(error = %e, "the decide CA file changed but cannot be used; verifying the leader against the previous CAs (logged again when it changes)");
                kept.failed = Some(stamp);
            }
        }
        kept.client.clone()
    }
}

/// How the extender reaches the leader.
pub(crate) enum Transport {
    /// Plain HTTP: `http://` endpoints only, the leader unauthenticated.
    Plain(Box<PlainClient>),
    /// HTTPS with the leader's certificate verified: `https://` only.
    Tls(DecideTrust),
}

/// Why an endpoint is not dialed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mismatch {
    /// Plain HTTP where the leader must be authenticated.
    Plaintext,
    /// HTTPS, with nothing to verify the leader's certificate against.
    NoTrust,
    /// Neither `http://` nor `https://`.
    Scheme,
}

/// The scheme of `endpoint`, lowercase (`None`: not a URL).
fn scheme(endpoint: &str) -> Option<String> {
    endpoint
        .split_once("://")
        .map(|(s, _)| s.to_ascii_lowercase())
}

impl Transport {
    /// Whether `endpoint` may be dialed this way; nothing is dialed when
    /// it may not.
    pub(crate) fn admits(&self, endpoint: &str) -> Result<(), Mismatch> {
        match (self, scheme(endpoint).as_deref()) {
            (Self::Plain(_), Some("http")) | (Self::Tls(_), Some("https")) => Ok(()),
            (Self::Tls(_), Some("http")) => Err(Mismatch::Plaintext),
            (Self::Plain(_), Some("https")) => Err(Mismatch::NoTrust),
            _ => Err(Mismatch::Scheme),
        }
    }

    /// Sends `req` (to an endpoint [`Self::admits`]).
    pub(crate) async fn request(
        &self,
        req: hyper::Request<Full<Bytes>>,
    ) -> Result<hyper::Response<hyper::body::Incoming>, hyper_util::client::legacy::Error> {
        match self {
            Self::Plain(c) => c.request(req).await,
            Self::Tls(t) => t.client().request(req).await,
        }
    }
}

/// `e` and its causes, `: `-separated. An `io::Error` wrapping another
/// error shows only that error's causes as its source, so wrapped
/// `io::Error`s are looked into as well.
pub(crate) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut next = e.source();
    while let Some(cause) = next {
        let text = cause.to_string();
        if parts.last() != Some(&text) {
            parts.push(text);
        }
        next = cause.source();
    }
    parts.join(": ")
}

/// Whether `e` (or a cause) is a TLS failure (the handshake, the leader's
/// certificate): what a wrong CA or server name looks like.
pub(crate) fn is_tls_failure(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(cause) = next {
        let mut inner: &(dyn std::error::Error + 'static) = cause;
        loop {
            if inner.is::<rustls::Error>() {
                return true;
            }
            match inner
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
            {
                Some(wrapped) => inner = wrapped,
                None => break,
            }
        }
        next = cause.source();
    }
    false
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn fixture(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/tls/{name}"))
    }

    const NAME: &str = "steward-controller-decide.steward-system.svc";

    #[test]
    fn only_the_expected_scheme_is_dialed() {
        let tls = Transport::Tls(DecideTrust::new(fixture("ca.crt"), NAME).unwrap());
        assert_eq!(tls.admits("https://10.0.0.1:8444"), Ok(()));
        assert_eq!(tls.admits("HTTPS://10.0.0.1:8444"), Ok(()));
        assert_eq!(tls.admits("http://10.0.0.1:8444"), Err(Mismatch::Plaintext));
        assert_eq!(tls.admits("10.0.0.1:8444"), Err(Mismatch::Scheme));
        assert_eq!(tls.admits("ftp://10.0.0.1"), Err(Mismatch::Scheme));
        let plain = Transport::Plain(Box::new(plain()));
        assert_eq!(plain.admits("http://10.0.0.1:8444"), Ok(()));
        assert_eq!(
            plain.admits("https://10.0.0.1:8444"),
            Err(Mismatch::NoTrust)
        );
    }

    #[test]
    fn unusable_trust_is_an_error_naming_what() {
        let e = DecideTrust::new(fixture("missing.crt"), NAME).unwrap_err();
        assert!(matches!(e, TrustError::Read { .. }), "{e}");
        assert!(e.to_string().contains("missing.crt"), "{e}");
        // A key is not a certificate.
        let e = DecideTrust::new(fixture("ca.key"), NAME).unwrap_err();
        assert!(matches!(e, TrustError::Pem { .. }), "{e}");
        let e = DecideTrust::new(fixture("ca.crt"), "not a name!").unwrap_err();
        assert!(matches!(e, TrustError::ServerName { .. }), "{e}");
        let t = DecideTrust::new(fixture("ca.crt"), NAME).unwrap();
        assert_eq!(t.server_name(), NAME);
        assert!(format!("{t:?}").contains(NAME));
    }

    /// As a Secret volume rotates a file: a new directory, the `..data`
    /// symlink swapped to it by a rename, the file a symlink through it.
    #[test]
    fn a_changed_ca_file_makes_a_new_client_and_an_unusable_one_keeps_the_last() {
        let d = std::env::temp_dir().join(format!("steward-decide-ca-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let put = |n: u32, content: &[u8]| {
            let data = d.join(format!("..gen{n}"));
            std::fs::create_dir(&data).unwrap();
            std::fs::write(data.join("ca.crt"), content).unwrap();
            let tmp = d.join("..data_tmp");
            std::os::unix::fs::symlink(&data, &tmp).unwrap();
            std::fs::rename(&tmp, d.join("..data")).unwrap();
        };
        put(1, &std::fs::read(fixture("other-ca.crt")).unwrap());
        std::os::unix::fs::symlink(d.join("..data/ca.crt"), d.join("ca.crt")).unwrap();
        let t = DecideTrust::new(d.join("ca.crt"), NAME).unwrap();
        let kept = |t: &DecideTrust| t.inner.kept.lock().unwrap().stamp;
        let first = kept(&t);
        let _ = t.client();
        assert_eq!(kept(&t), first, "an unchanged file was read again");
        put(2, &std::fs::read(fixture("ca.crt")).unwrap());
        let _ = t.client();
        let second = kept(&t);
        assert_ne!(second, first, "the rotated file was not read");
        put(3, b"not PEM");
        let _ = t.client();
        assert_eq!(kept(&t), second, "an unusable file replaced the CAs");
        assert!(t.inner.kept.lock().unwrap().failed.is_some());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn an_error_chain_shows_the_wrapped_tls_error() {
        let tls = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let io = std::io::Error::other(std::io::Error::new(std::io::ErrorKind::InvalidData, tls));
        assert!(is_tls_failure(&io));
        assert!(
            error_chain(&io).contains("invalid peer certificate"),
            "{}",
            error_chain(&io)
        );
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(!is_tls_failure(&refused));
    }
}
