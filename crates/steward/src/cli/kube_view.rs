//! The CLI's view of the cluster, shared by the cluster commands (`get
//! instances|claims|slots|handlers`, `describe instance`, `explain pod`): the
//! kube client built like kubectl's (`--kubeconfig`, `--context`, else
//! `KUBECONFIG`, in-cluster, `~/.kube/config`), the namespace scope, one-line
//! errors, and the objects read in one pass.
//!
//! Every request is bounded (connect and read timeouts) and made once: a
//! script gets an answer or one line naming the cause, never a retry loop.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, anyhow};
use kube::api::ListParams;
use kube::config::{Config, KubeConfigOptions, Kubeconfig};
use kube::{Api, Resource};
use serde::Serialize;
use steward_api::{Instance, SlotClaim};

use super::times::{DEFAULT_REQUEST_TIMEOUT, parse_request_timeout};

/// How long connecting to the API server may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How to reach the cluster.
#[derive(Debug, clap::Args)]
pub struct ClusterArgs {
    /// Path to the kubeconfig file (default: $KUBECONFIG, else in-cluster, else ~/.kube/config).
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
    /// How long to wait for each answer of the API server (`30s`, `2m`, `500ms`, `1m30s`, `PT30S`; a bare number is seconds).
    #[arg(long, value_name = "DURATION", default_value = DEFAULT_REQUEST_TIMEOUT, value_parser = parse_request_timeout)]
    pub request_timeout: Duration,
}

/// Which namespace(s) a listing covers.
#[derive(Debug, clap::Args)]
pub struct ScopeArgs {
    /// Namespace (default: the context's namespace, else "default").
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// List across all namespaces (adds a NAMESPACE column).
    #[arg(short = 'A', long, conflicts_with = "namespace")]
    pub all_namespaces: bool,
}

/// A connected client and where it points.
pub struct Cluster {
    pub client: kube::Client,
    /// The API server URL, for error messages.
    pub server: String,
    /// `--request-timeout`, for error messages.
    pub request_timeout: Duration,
    /// The context's default namespace ("default" when it names none).
    pub default_namespace: String,
}

impl Cluster {
    /// Builds the client from the flags, like kubectl: an explicit
    /// `--kubeconfig` (which must exist), else `KUBECONFIG` or
    /// `~/.kube/config` when `--context` or `KUBECONFIG` is given, else
    /// kube's inference (kubeconfig, then in-cluster).
    pub async fn connect(args: &ClusterArgs) -> anyhow::Result<Self> {
        let options = KubeConfigOptions {
            context: args.context.clone(),
            ..KubeConfigOptions::default()
        };
        let kubeconfig_env = std::env::var_os("KUBECONFIG").filter(|v| !v.is_empty());
        let mut config = if let Some(path) = &args.kubeconfig {
            std::fs::metadata(path)
                .map_err(|e| anyhow!("cannot read kubeconfig {}: {e}", path.display()))?;
            let kubeconfig = Kubeconfig::read_from(path)
                .map_err(|e| anyhow!("kubeconfig {}: {}", path.display(), chain(&e)))?;
            Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .map_err(|e| anyhow!("kubeconfig {}: {}", path.display(), chain(&e)))?
        } else if args.context.is_some() || kubeconfig_env.is_some() {
            let source = match &kubeconfig_env {
                Some(v) => format!("kubeconfig $KUBECONFIG={}", v.to_string_lossy()),
                None => "kubeconfig ~/.kube/config".to_string(),
            };
            Config::from_kubeconfig(&options)
                .await
                .map_err(|e| anyhow!("{source}: {}", chain(&e)))?
        } else {
            Config::infer().await.map_err(|e| {
                anyhow!(
                    "no cluster configured (set --kubeconfig or KUBECONFIG, or run in a pod): {}",
                    chain(&e)
                )
            })?
        };
        config.connect_timeout = Some(CONNECT_TIMEOUT);
        config.read_timeout = Some(args.request_timeout);
        config.default_retry = false;
        let server = config.cluster_url.to_string();
        let server = server.trim_end_matches('/').to_string();
        let default_namespace = config.default_namespace.clone();
        let client = kube::Client::try_from(config)
            .map_err(|e| anyhow!("building a client for {server}: {}", chain(&e)))?;
        Ok(Self {
            client,
            server,
            request_timeout: args.request_timeout,
            default_namespace,
        })
    }

    /// The namespace `-n` names, else the context's.
    pub fn namespace(&self, scope: &ScopeArgs) -> String {
        scope
            .namespace
            .clone()
            .unwrap_or_else(|| self.default_namespace.clone())
    }

    /// The API for `K` in the scope: one namespace, or all with `-A`.
    pub fn api<K>(&self, scope: &ScopeArgs) -> Api<K>
    where
        K: Resource<Scope = kube::core::NamespaceResourceScope>,
        <K as Resource>::DynamicType: Default,
    {
        if scope.all_namespaces {
            Api::all(self.client.clone())
        } else {
            Api::namespaced(self.client.clone(), &self.namespace(scope))
        }
    }

    /// Every object of `K` in the scope.
    pub async fn list<K>(&self, scope: &ScopeArgs) -> anyhow::Result<Vec<K>>
    where
        K: Resource<Scope = kube::core::NamespaceResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
        <K as Resource>::DynamicType: Default,
    {
        let api: Api<K> = self.api(scope);
        let plural = plural::<K>();
        let list = api
            .list(&ListParams::default())
            .await
            .map_err(|e| self.error(&format!("listing {plural}{}", scope_text(self, scope)), e))?;
        Ok(list.items)
    }

    /// One line for a failed request: what was tried, then [`Self::cause`].
    pub fn error(&self, what: &str, err: kube::Error) -> anyhow::Error {
        anyhow!("{what}: {}", self.cause(err))
    }

    /// Why a request failed: the server's message, or why the server could
    /// not be reached.
    pub fn cause(&self, err: kube::Error) -> String {
        match err {
            kube::Error::Api(status) => {
                let mut line = one_line(&status.message);
                if !status.reason.is_empty() || status.code != 0 {
                    line.push_str(&format!(" ({} {})", status.code, status.reason));
                }
                if status.code == 404 {
                    line.push_str(" (are steward's CRDs installed?)");
                }
                line
            }
            other => {
                let why = chain(&other);
                let why = why.strip_prefix("ServiceError: ").unwrap_or(&why);
                if why.contains("timed out") || why.contains("deadline has elapsed") {
                    format!(
                        "the API server at {} did not answer in time (connect timeout {}s, request timeout {:?}): {why}",
                        self.server,
                        CONNECT_TIMEOUT.as_secs(),
                        self.request_timeout,
                    )
                } else {
                    format!("cannot reach the API server at {}: {why}", self.server)
                }
            }
        }
    }
}

/// ` in namespace "x"` or ` in all namespaces`.
fn scope_text(cluster: &Cluster, scope: &ScopeArgs) -> String {
    if scope.all_namespaces {
        " in all namespaces".to_string()
    } else {
        format!(" in namespace {:?}", cluster.namespace(scope))
    }
}

/// `instances.steward.dev`, as kubectl names a resource.
pub fn plural<K: Resource>() -> String
where
    <K as Resource>::DynamicType: Default,
{
    let dt = K::DynamicType::default();
    let group = K::group(&dt);
    if group.is_empty() {
        K::plural(&dt).into_owned()
    } else {
        format!("{}.{group}", K::plural(&dt))
    }
}

/// `kubectl get` on an empty result: a note on stderr, exit 0.
pub fn nothing_found(cluster: &Cluster, scope: &ScopeArgs) {
    if scope.all_namespaces {
        eprintln!("No resources found");
    } else {
        eprintln!(
            "No resources found in {} namespace.",
            super::escape::term(&cluster.namespace(scope))
        );
    }
}

/// An error and its sources as one line, without the repetition of
/// wrappers that print their source too.
pub fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = next {
        let msg = one_line(&e.to_string());
        if !msg.is_empty() && !parts.last().is_some_and(|p| p.contains(&msg)) {
            parts.push(msg);
        }
        next = e.source();
    }
    parts.join(": ")
}

/// Newlines and runs of whitespace folded into single spaces.
pub fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `namespace/name` key of a namespaced object.
pub fn key<K: Resource>(obj: &K) -> (String, String) {
    let m = obj.meta();
    (
        m.namespace.clone().unwrap_or_default(),
        m.name.clone().unwrap_or_default(),
    )
}

/// Instances and the SlotClaims of their slots, read in one pass.
pub struct Snapshot {
    /// Sorted by namespace, then name.
    pub instances: Vec<Instance>,
    /// By (namespace, instance), then slot index; sorted.
    pub claims: BTreeMap<(String, String), BTreeMap<u32, SlotClaim>>,
}

impl Snapshot {
    /// Reads the Instances and SlotClaims of the scope.
    pub async fn read(cluster: &Cluster, scope: &ScopeArgs) -> anyhow::Result<Self> {
        let mut instances: Vec<Instance> = cluster.list(scope).await?;
        instances.sort_by_key(key);
        let claims = by_instance(cluster.list(scope).await?);
        Ok(Self { instances, claims })
    }

    /// The claims of `instance`'s slots, by index.
    pub fn claims_of(&self, instance: &Instance) -> Option<&BTreeMap<u32, SlotClaim>> {
        self.claims.get(&key(instance))
    }

    /// How many of `instance`'s slots are claimed.
    pub fn held(&self, instance: &Instance) -> usize {
        self.claims_of(instance)
            .map(|c| c.range(..instance.spec.capacity).count())
            .unwrap_or(0)
    }
}

/// Claims grouped by (namespace, instance) and slot index. An object whose
/// name is not its slot id is not a claim of that slot and is left out.
pub fn by_instance(claims: Vec<SlotClaim>) -> BTreeMap<(String, String), BTreeMap<u32, SlotClaim>> {
    let mut out: BTreeMap<(String, String), BTreeMap<u32, SlotClaim>> = BTreeMap::new();
    for c in claims {
        if c.to_claim().is_err() {
            tracing::debug!(name = ?c.metadata.name, "SlotClaim not named after its slot; skipped");
            continue;
        }
        let ns = c.metadata.namespace.clone().unwrap_or_default();
        out.entry((ns, c.spec.instance.clone()))
            .or_default()
            .insert(c.spec.slot, c);
    }
    out
}

/// Objects as kubectl prints a list with `-o json|yaml`.
#[derive(Serialize)]
pub struct List<'a, T: Serialize> {
    #[serde(rename = "apiVersion")]
    pub api_version: &'static str,
    pub kind: &'static str,
    pub items: &'a [T],
}

impl<'a, T: Serialize> List<'a, T> {
    pub fn new(items: &'a [T]) -> Self {
        Self {
            api_version: "v1",
            kind: "List",
            items,
        }
    }
}

/// `value` as pretty JSON (with a final newline) or YAML.
pub fn structured<T: Serialize>(value: &T, json: bool) -> anyhow::Result<String> {
    if json {
        Ok(serde_json::to_string_pretty(value).context("encoding JSON")? + "\n")
    } else {
        serde_saphyr::to_string(value).context("encoding YAML")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Outer(std::io::Error);
    impl std::fmt::Display for Outer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "outer: {}", self.0)
        }
    }
    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn a_chain_is_one_line_without_repeats() {
        let e = Outer(std::io::Error::other("refused\nnow"));
        assert_eq!(chain(&e), "outer: refused now");
    }
}
