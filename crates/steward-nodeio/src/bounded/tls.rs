//! TLS in front of the gate: the server configuration a listener takes for
//! each new connection ([`TlsSource`]), one read from files and read again
//! when they change ([`TlsFiles`]), and what a client proved
//! ([`PeerCertificates`]).
//!
//! The handshake is under the header deadline ([`Limits::header_timeout`]
//! from the accept): a peer that opens TCP and never completes it is cut
//! off then, and its connection slot freed. After the handshake the gate
//! reads requests as on a plain connection.
//!
//! [`Limits::header_timeout`]: super::Limits::header_timeout

use crate::identity::FileIdentity;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use super::x509;

/// Where a listener takes the TLS configuration of each new connection.
pub trait TlsSource: Send + Sync + 'static {
    /// The configuration for the next connection.
    fn server_config(&self) -> Arc<ServerConfig>;
}

impl TlsSource for Arc<ServerConfig> {
    fn server_config(&self) -> Arc<ServerConfig> {
        self.clone()
    }
}

/// The certificate chain a TLS client presented and the server verified
/// (end entity first), put in the extensions of every request of a TLS
/// connection; empty when the client presented none (only possible with
/// [`ClientAuth::optional`]). Plain connections' requests carry none.
#[derive(Debug, Clone, Default)]
pub struct PeerCertificates(pub Arc<Vec<CertificateDer<'static>>>);

impl PeerCertificates {
    /// Whether the client presented a (verified) certificate.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The names of the client's certificate: its subject's common names,
    /// then its DNS and URI subject alternative names. Empty without a
    /// certificate, or when it cannot be read.
    pub fn names(&self) -> Vec<String> {
        self.0.first().map_or_else(Vec::new, |c| x509::names(c))
    }
}

/// How client certificates are verified.
#[derive(Debug, Clone)]
pub struct ClientAuth {
    /// PEM file of the CAs a client certificate must chain to.
    pub ca_file: PathBuf,
    /// A client may present no certificate (the handshake succeeds and the
    /// requests carry an empty [`PeerCertificates`]: the handler decides);
    /// one it presents must still chain to the CAs, or the handshake fails.
    pub optional: bool,
}

/// Why a TLS configuration could not be made.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} holds no usable {what}: {reason}")]
    Pem {
        path: PathBuf,
        what: &'static str,
        reason: String,
    },
    #[error("the client CAs of {path}: {source}")]
    ClientCa {
        path: PathBuf,
        #[source]
        source: rustls::server::VerifierBuilderError,
    },
    #[error("the certificate and key ({cert}, {key}): {source}")]
    Config {
        cert: PathBuf,
        key: PathBuf,
        #[source]
        source: rustls::Error,
    },
}

/// A file as last seen: which file the path names (device, inode, change
/// time). A Kubernetes Secret volume replaces files by renaming a directory
/// symlink, which changes the file the path resolves to; a write in place
/// changes its change time.
type Stamp = Option<FileIdentity>;

fn stamp(path: &Path) -> Stamp {
    FileIdentity::of(path)
}

struct Loaded {
    stamps: Vec<Stamp>,
    config: Arc<ServerConfig>,
    /// The stamps whose files failed to load (logged once).
    failed: Option<Vec<Stamp>>,
}

/// The files a [`TlsFiles`] reads.
#[derive(Debug)]
struct Paths {
    cert: PathBuf,
    key: PathBuf,
    client: Option<ClientAuth>,
}

/// A serving certificate and key (and the client CAs) read from PEM files,
/// read again for a new connection whenever one of the files changed
/// (identity, size or modification time: one `stat` each per connection),
/// so a rotated certificate is served without a restart. Files that
/// cannot be read or do not fit are logged once and the last good
/// configuration kept.
pub struct TlsFiles {
    paths: Paths,
    what: &'static str,
    loaded: Mutex<Loaded>,
}

impl std::fmt::Debug for TlsFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsFiles")
            .field("paths", &self.paths)
            .finish_non_exhaustive()
    }
}

impl TlsFiles {
    /// Reads the files now; `what` names the endpoint in logs.
    pub fn new(
        cert: PathBuf,
        key: PathBuf,
        client: Option<ClientAuth>,
        what: &'static str,
    ) -> Result<Self, TlsError> {
        let paths = Paths { cert, key, client };
        let stamps = paths.stamps();
        let config = paths.load()?;
        Ok(Self {
            paths,
            what,
            loaded: Mutex::new(Loaded {
                stamps,
                config,
                failed: None,
            }),
        })
    }
}

impl Paths {
    fn stamps(&self) -> Vec<Stamp> {
        let mut stamps = vec![stamp(&self.cert), stamp(&self.key)];
        if let Some(c) = &self.client {
            stamps.push(stamp(&c.ca_file));
        }
        stamps
    }

    fn load(&self) -> Result<Arc<ServerConfig>, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let certs = read_pem::<CertificateDer<'static>>(&self.cert, "certificate")?;
        let key = PrivateKeyDer::from_pem_slice(&read(&self.key)?).map_err(|e| TlsError::Pem {
            path: self.key.clone(),
            what: "private key",
            reason: e.to_string(),
        })?;
        let config_error = |source| TlsError::Config {
            cert: self.cert.clone(),
            key: self.key.clone(),
            source,
        };
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(config_error)?;
        let builder = match &self.client {
            None => builder.with_no_client_auth(),
            Some(c) => {
                let mut roots = rustls::RootCertStore::empty();
                for ca in read_pem::<CertificateDer<'static>>(&c.ca_file, "CA certificate")? {
                    roots.add(ca).map_err(|e| TlsError::Pem {
                        path: c.ca_file.clone(),
                        what: "CA certificate",
                        reason: e.to_string(),
                    })?;
                }
                let mut v = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
                if c.optional {
                    v = v.allow_unauthenticated();
                }
                let v = v.build().map_err(|source| TlsError::ClientCa {
                    path: c.ca_file.clone(),
                    source,
                })?;
                builder.with_client_cert_verifier(v)
            }
        };
        let mut config = builder.with_single_cert(certs, key).map_err(config_error)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

impl TlsSource for TlsFiles {
    fn server_config(&self) -> Arc<ServerConfig> {
        let stamps = self.paths.stamps();
        let mut loaded = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        if loaded.stamps == stamps || loaded.failed.as_ref() == Some(&stamps) {
            return loaded.config.clone();
        }
        match self.paths.load() {
            Ok(config) => {
                tracing::info!(
                    endpoint = self.what,
                    cert = %self.paths.cert.display(),
                    "TLS certificate files changed; serving the new ones"
                );
                loaded.stamps = stamps;
                loaded.config = config;
                loaded.failed = None;
            }
            Err(e) => {
                tracing::warn!(
                    endpoint = self.what,
                    error = %e,
                    "TLS certificate files changed but cannot be used; serving the previous ones (logged again when they change)"
                );
                loaded.failed = Some(stamps);
            }
        }
        loaded.config.clone()
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

fn read_pem<T: PemObject>(path: &Path, what: &'static str) -> Result<Vec<T>, TlsError> {
    let pem = read(path)?;
    let items = T::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            path: path.to_owned(),
            what,
            reason: e.to_string(),
        })?;
    if items.is_empty() {
        return Err(TlsError::Pem {
            path: path.to_owned(),
            what,
            reason: "no PEM section of that type".into(),
        });
    }
    Ok(items)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn fixture(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../steward-reservations/tests/fixtures/tls")
            .join(name)
    }

    #[test]
    fn changed_files_are_read_again_and_unusable_ones_keep_the_last_good() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let put = |c: &str, k: &str| {
            // As a Secret volume does: new files renamed into place.
            fs::copy(fixture(c), dir.path().join("new.crt")).unwrap();
            fs::copy(fixture(k), dir.path().join("new.key")).unwrap();
            fs::rename(dir.path().join("new.crt"), &cert).unwrap();
            fs::rename(dir.path().join("new.key"), &key).unwrap();
        };
        put("server.crt", "server.key");
        let client = ClientAuth {
            ca_file: fixture("ca.crt"),
            optional: true,
        };
        let files = TlsFiles::new(cert.clone(), key.clone(), Some(client), "test").unwrap();
        let first = files.server_config();
        assert!(
            Arc::ptr_eq(&first, &files.server_config()),
            "unchanged files were read again"
        );

        put("evil.crt", "evil.key");
        let second = files.server_config();
        assert!(!Arc::ptr_eq(&first, &second), "rotated files were not read");

        // A certificate whose key does not match: the last good one stays.
        put("server.crt", "evil.key");
        assert!(Arc::ptr_eq(&second, &files.server_config()));
        fs::write(&cert, b"not PEM").unwrap();
        assert!(Arc::ptr_eq(&second, &files.server_config()));

        put("server.crt", "server.key");
        assert!(!Arc::ptr_eq(&second, &files.server_config()));
    }

    #[test]
    fn unusable_files_at_startup_are_an_error_naming_the_file() {
        let e = TlsFiles::new(fixture("server.crt"), fixture("evil.key"), None, "test")
            .err()
            .unwrap();
        assert!(matches!(e, TlsError::Config { .. }), "{e}");
        let e = TlsFiles::new(fixture("missing.crt"), fixture("server.key"), None, "test")
            .err()
            .unwrap();
        assert!(e.to_string().contains("missing.crt"), "{e}");
        let e = TlsFiles::new(fixture("server.key"), fixture("server.key"), None, "test")
            .err()
            .unwrap();
        assert!(
            matches!(
                e,
                TlsError::Pem {
                    what: "certificate",
                    ..
                }
            ),
            "{e}"
        );
    }
}
