//! Test support: an in-process Kubernetes API server stand-in speaking real REST + watch.
//!
//! ```no_run
//! # async fn demo() -> Result<(), steward_testing_apiserver::Error> {
//! let server = steward_testing_apiserver::ApiServer::start().await?;
//! let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::default_namespaced(server.client());
//! # let _ = pods;
//! server.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! See the crate README for the implemented semantics and the explicit gaps.

pub mod client;
pub mod dra;
pub mod dra_alloc;
pub mod dra_cel;
pub mod dra_extended;
mod dra_select;
mod error;
pub mod kube_tools;
pub mod kubectl;
mod openapi;
mod protobuf;
mod schema;
mod selector;
mod server;
mod smp;
mod stats;
mod store;
mod table;
mod types;
mod validation;
mod watch;
mod workloads;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// Log target of the warning that CEL rules are not evaluated, apart so a
/// front end (the one-machine run) can lower it alone.
pub const CEL_NOT_EVALUATED: &str = "steward_testing_apiserver::store::cel";

pub use error::{ApiError, Error, FieldError, FieldErrorKind, NOT_IMPLEMENTED};
pub use selector::{FieldSelector, LabelSelector};
pub use stats::{
    Access, ClientCounters, ClientKey, ClientResource, EventCounters, ListCounters, Stats,
    WatchKey, client_component,
};
pub use types::{KindHooks, PrinterColumn, ResourceType};

use server::Shared;
use store::Store;

/// Tunables of a stand-in instance.
#[derive(Debug, Clone)]
pub struct Options {
    /// Period of BOOKMARK events on watches with `allowWatchBookmarks=true`
    /// (one is always sent right after the initial events).
    pub bookmark_interval: Duration,
    /// Period of the garbage collector's safety sweep (it also runs after every write).
    pub gc_interval: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            bookmark_interval: Duration::from_secs(1),
            gc_interval: Duration::from_millis(100),
        }
    }
}

struct Tasks {
    stop: tokio::sync::watch::Sender<bool>,
    server: JoinHandle<()>,
    gc: JoinHandle<()>,
}

struct Inner {
    shared: Arc<Shared>,
    url: String,
    client: kube::Client,
    tasks: Mutex<Option<Tasks>>,
}

/// Handle to a running stand-in; cheap to clone.
#[derive(Clone)]
pub struct ApiServer {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServer")
            .field("url", &self.inner.url)
            .finish()
    }
}

impl ApiServer {
    /// Starts a stand-in on `127.0.0.1:0` with the built-in kinds registered.
    pub async fn start() -> Result<ApiServer, Error> {
        Self::start_with(Options::default()).await
    }

    /// Starts a stand-in with explicit [`Options`].
    pub async fn start_with(options: Options) -> Result<ApiServer, Error> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(Error::Bind)?;
        let addr: SocketAddr = listener.local_addr().map_err(Error::LocalAddr)?;
        let url = format!("http://{addr}");
        let shared = Arc::new(Shared {
            store: Arc::new(Mutex::new(Store::new())),
            gc: Notify::new(),
            bookmark_interval: options.bookmark_interval,
            addr,
            meter: Arc::default(),
        });
        let uri: http::Uri = url.parse().map_err(|e: http::uri::InvalidUri| Error::Url {
            url: url.clone(),
            message: e.to_string(),
        })?;
        let client = plain_http_client(uri, None, None).map_err(|e| Error::Client {
            url: url.clone(),
            source: Box::new(e),
        })?;
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let router = axum::Router::new()
            .fallback(server::handle)
            .with_state(shared.clone());
        let mut srv_stop = stop_rx.clone();
        let server = tokio::spawn(async move {
            let res = axum::serve(listener, router)
                .with_graceful_shutdown(async move {
                    let _ = srv_stop.wait_for(|s| *s).await;
                })
                .await;
            if let Err(e) = res {
                tracing::error!(%e, "API server stand-in stopped with an error");
            }
        });
        let gc = tokio::spawn(gc_loop(shared.clone(), options.gc_interval, stop_rx));
        tracing::info!(%url, "API server stand-in listening");
        Ok(ApiServer {
            inner: Arc::new(Inner {
                shared,
                url,
                client,
                tasks: Mutex::new(Some(Tasks { stop, server, gc })),
            }),
        })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        self.inner.url.clone()
    }

    /// A real kube client pointed at the stand-in (default namespace `default`).
    pub fn client(&self) -> kube::Client {
        self.inner.client.clone()
    }

    /// A client acting as `user` (e.g. `system:serviceaccount:ns:name`):
    /// its requests carry `Impersonate-User`, and [`Stats::access`] records
    /// what it did under that user, to check against RBAC rules.
    pub fn client_as(&self, user: &str) -> Result<kube::Client, Error> {
        self.plain_client(Some(user), None)
    }

    /// A client whose requests carry `User-Agent: <user_agent>`: the
    /// stand-in attributes them to the component before the first `/`
    /// ([`client_component`], [`Stats::by_client`]). [`ApiServer::client`]
    /// sends no `User-Agent` (component `""`).
    pub fn client_with_user_agent(&self, user_agent: &str) -> Result<kube::Client, Error> {
        self.plain_client(None, Some(user_agent))
    }

    /// A plain-HTTP client to this server, impersonating `user` and naming
    /// itself `user_agent` when given.
    fn plain_client(
        &self,
        user: Option<&str>,
        user_agent: Option<&str>,
    ) -> Result<kube::Client, Error> {
        let uri: http::Uri =
            self.inner
                .url
                .parse()
                .map_err(|e: http::uri::InvalidUri| Error::Url {
                    url: self.inner.url.clone(),
                    message: e.to_string(),
                })?;
        plain_http_client(uri, user, user_agent).map_err(|e| Error::Client {
            url: self.inner.url.clone(),
            source: Box::new(e),
        })
    }

    fn with_store<R>(&self, f: impl FnOnce(&mut Store) -> R) -> Option<R> {
        match self.inner.shared.store.lock() {
            Ok(mut s) => Some(f(&mut s)),
            Err(_) => {
                tracing::error!("API server stand-in store lock is poisoned");
                None
            }
        }
    }

    /// Serves the kinds a Helm chart installs besides CRDs (ServiceAccount,
    /// Service, DaemonSet, Deployment, ClusterRole(Binding), Role(Binding)),
    /// with schemas from k8s-openapi's types: unknown fields are refused
    /// under strict validation. Opt-in: generating the schemas costs most of
    /// a second per process, which tests that never install a chart skip.
    pub fn serve_workloads(&self) {
        for rt in workloads::kinds() {
            self.register(rt);
        }
    }

    /// Also serves `resource.k8s.io/v1` ResourceSlices, DeviceClasses and
    /// ResourceClaims ([`dra`]).
    pub fn serve_dra(&self) {
        self.serve_dra_with(dra::DraFeatures::default());
    }

    /// [`ApiServer::serve_dra`] with some DRA feature gates off (their
    /// fields dropped on write, as on a Kubernetes 1.35 cluster).
    pub fn serve_dra_with(&self, features: dra::DraFeatures) {
        for rt in dra::kinds_with(features) {
            self.register(rt);
        }
    }

    /// Registers (or replaces) a kind programmatically.
    pub fn register(&self, rt: ResourceType) {
        self.with_store(|s| s.register(rt));
    }

    /// `false`: every request answers 503 and open watches are closed.
    /// `true` also ends a [`ApiServer::partition`].
    pub fn set_available(&self, up: bool) {
        self.with_store(|s| {
            s.available = up;
            s.reachable_by.clear();
            if !up {
                s.close_watches();
            }
        });
    }

    /// A partition: every client but those impersonating one of `users`
    /// ([`ApiServer::client_as`]) gets 503, and open watches are closed;
    /// the cluster goes on for the others (a node cut off from the API
    /// while an operator still edits objects). Ended by `set_available(true)`.
    pub fn partition(&self, users: &[&str]) {
        self.with_store(|s| {
            s.available = false;
            s.reachable_by = users.iter().map(|u| (*u).to_owned()).collect();
            s.close_watches();
        });
    }

    /// Delays every answer by `delay` (a slow or overloaded API server);
    /// `Duration::ZERO` ends it. Watches already open are not slowed.
    pub fn set_delay(&self, delay: std::time::Duration) {
        self.with_store(|s| s.delay = delay);
    }

    /// Closes every open watch (clients see the stream end and re-watch).
    pub fn close_watches(&self) {
        self.with_store(Store::close_watches);
    }

    /// Drops the event history up to now: watches from older resourceVersions get
    /// an ERROR event with a 410 Expired status.
    pub fn compact(&self) {
        self.with_store(Store::compact);
    }

    /// The store's current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.with_store(|s| s.rv()).unwrap_or(0)
    }

    /// Request and write counters, with the per-client ones and the
    /// open-watch gauge ([`Stats::open_watches`]).
    pub fn stats(&self) -> Stats {
        let mut stats = self.with_store(|s| s.stats.clone()).unwrap_or_default();
        self.inner.shared.meter.fill(&mut stats);
        stats
    }

    /// Zeroes the counters; the open-watch gauge, live state, stays.
    pub fn reset_stats(&self) {
        self.with_store(|s| s.stats = Stats::default());
        self.inner.shared.meter.reset();
    }

    /// Watch streams open now, per client component and resource (the
    /// gauge of [`Stats::open_watches`], without copying the counters).
    pub fn open_watches(&self) -> BTreeMap<ClientResource, u64> {
        self.inner.shared.meter.open_watches()
    }

    /// Watch streams open now, per full `User-Agent` (one client: a node's
    /// agent, a controller replica) and resource.
    pub fn open_watches_by_agent(&self) -> BTreeMap<(String, String), u64> {
        self.inner.shared.meter.open_watches_by_agent()
    }

    /// Stored objects per resource (group-qualified plural, as in
    /// [`Stats::writes`]): `(objects, bytes)`, bytes being the length of
    /// each object's JSON serialization as stored (storage version, with
    /// its metadata). Resources without objects are left out. Scans the
    /// whole store under its lock: for reports, not hot loops.
    pub fn stored(&self) -> BTreeMap<String, (u64, u64)> {
        self.with_store(|s| stats::stored_sizes(s.objects_by_resource()))
            .unwrap_or_default()
    }

    /// Stops serving: closes watches, stops the listener and the garbage collector.
    pub async fn shutdown(self) {
        self.close_watches();
        let tasks = match self.inner.tasks.lock() {
            Ok(mut t) => t.take(),
            Err(_) => None,
        };
        let Some(Tasks { stop, server, gc }) = tasks else {
            return;
        };
        let _ = stop.send(true);
        let abort = server.abort_handle();
        if tokio::time::timeout(Duration::from_secs(2), server)
            .await
            .is_err()
        {
            abort.abort();
        }
        let _ = gc.await;
    }
}

/// A kube client over plain HTTP: base URI + extra headers layers on a hyper client,
/// without kube's TLS connector (whose rustls needs a process-level crypto provider).
/// With `user`, every request carries `Impersonate-User: <user>` (kube's
/// impersonation), which the stand-in records accesses under; with
/// `user_agent`, a `User-Agent` header.
fn plain_http_client(
    uri: http::Uri,
    user: Option<&str>,
    user_agent: Option<&str>,
) -> Result<kube::Client, kube::Error> {
    use kube::client::ConfigExt;
    let mut config = kube::Config::new(uri);
    config.auth_info.impersonate = user.map(str::to_owned);
    if let Some(ua) = user_agent {
        let value = http::HeaderValue::from_str(ua)
            .map_err(|e| kube::Error::HttpError(http::Error::from(e)))?;
        config.headers.push((http::header::USER_AGENT, value));
    }
    let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
    connector.set_connect_timeout(config.connect_timeout);
    let http: hyper_util::client::legacy::Client<_, kube::client::Body> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build(connector);
    let service = tower::ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .layer(config.extra_headers_layer()?)
        .service(http);
    Ok(kube::Client::new(service, config.default_namespace))
}

async fn gc_loop(
    shared: Arc<Shared>,
    every: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = shared.gc.notified() => {}
            _ = tokio::time::sleep(every) => {}
            _ = stop.wait_for(|s| *s) => break,
        }
        for _ in 0..32 {
            let changed = match shared.store.lock() {
                Ok(mut s) => s.gc_pass(),
                Err(_) => return,
            };
            if changed == 0 {
                break;
            }
        }
    }
}
