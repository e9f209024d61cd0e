//! What the cluster commands (`get instances|claims|slots`, `describe
//! instance`) share: the kube client built like kubectl's (`--kubeconfig`,
//! `--context`, else `KUBECONFIG`, in-cluster, `~/.kube/config`), the
//! namespace scope, one-line errors, and the objects read in one pass.
//!
//! Every request is bounded (connect and read timeouts) and made once: a
//! script gets an answer or one line naming the cause, never a retry loop.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, anyhow};
use kube::api::ListParams;
use kube::config::{Config, KubeConfigOptions, Kubeconfig};
use kube::{Api, Resource};
use serde::Serialize;
use steward_api::{Instance, SlotClaim};

/// How long connecting to the API server may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one response may take once connected, by default.
pub const DEFAULT_REQUEST_TIMEOUT: &str = "30s";

/// How to reach the cluster.
#[derive(Debug, clap::Args)]
pub struct ClusterArgs {
    /// Path to the kubeconfig file (default: $KUBECONFIG, else in-cluster, else ~/.kube/config).
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
    /// How long to wait for each answer of the API server (`30s`, `2m`, `500ms`; a bare number is seconds).
    #[arg(long, value_name = "DURATION", default_value = DEFAULT_REQUEST_TIMEOUT, value_parser = parse_duration)]
    pub request_timeout: Duration,
}

/// Why a `--request-timeout` was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum TimeoutError {
    /// Not a duration.
    #[error(transparent)]
    Duration(#[from] steward_discovery::duration::DurationError),
    /// Zero would mean "no timeout"; the CLI always bounds its calls.
    #[error("the timeout must be more than zero")]
    Zero,
}

/// A duration as the rest of steward reads them (`500ms`, `30s`, `1m30s`),
/// or a bare number of seconds as kubectl's `--request-timeout` takes it;
/// more than zero.
fn parse_duration(s: &str) -> Result<Duration, TimeoutError> {
    let s = s.trim();
    let d = match s.parse::<u64>() {
        Ok(secs) => Duration::from_secs(secs),
        Err(_) => steward_discovery::duration::parse_duration(s)?,
    };
    if d.is_zero() {
        return Err(TimeoutError::Zero);
    }
    Ok(d)
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
            cluster.namespace(scope)
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

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// An object's creation time in Unix milliseconds, when the server set it.
pub fn created_ms<K: Resource>(obj: &K) -> Option<i64> {
    obj.meta()
        .creation_timestamp
        .as_ref()
        .map(|t| t.0.as_millisecond())
}

/// kubectl's AGE: `42s`, `3m12s`, `15m`, `2h5m`, `3d4h`, `400d`, `2y30d`
/// (k8s.io/apimachinery's `HumanDuration`). `<unknown>` without a time.
pub fn age(since_ms: Option<i64>, now_ms: i64) -> String {
    let Some(since) = since_ms else {
        return "<unknown>".into();
    };
    human_duration(now_ms.saturating_sub(since) / 1000)
}

fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".into();
    }
    if seconds < 0 {
        return "0s".into();
    }
    if seconds < 120 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = minutes / 60;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    let days = hours / 24;
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{days}d")
        } else {
            format!("{days}d{h}h")
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{days}d");
    }
    let years = days / 365;
    if hours < 24 * 365 * 8 {
        let d = days % 365;
        return if d == 0 {
            format!("{years}y")
        } else {
            format!("{years}y{d}d")
        };
    }
    format!("{years}y")
}

/// Unix milliseconds as RFC 3339 in UTC, to the second: `2025-01-31T08:00:05Z`.
pub fn rfc3339(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// `2025-01-31T08:00:05Z (3m ago)`, or `<unknown>`.
pub fn when(ms: Option<i64>, now_ms: i64) -> String {
    match ms {
        Some(ms) => format!("{} ({} ago)", rfc3339(ms), age(Some(ms), now_ms)),
        None => "<unknown>".into(),
    }
}

/// A SlotClaim's state: `Held` (by a known pod), `Awaiting` (an Allocate
/// awaits attribution to a pod; the pod shown may be stale) or `Pending`
/// (claimed by a node, no pod known yet).
pub fn claim_state(claim: &SlotClaim) -> &'static str {
    if claim.spec.resource_claim.is_some() {
        "Prepared"
    } else if claim.spec.awaiting.is_some() {
        "Awaiting"
    } else if claim.spec.pod.is_some() {
        "Held"
    } else {
        "Pending"
    }
}

/// `namespace/name` of a claim's pod, or `<none>`.
pub fn claim_pod(claim: &SlotClaim) -> String {
    match &claim.spec.pod {
        Some(p) => format!("{}/{}", p.namespace, p.name),
        None => "<none>".into(),
    }
}

/// When a claim's holder was recorded (wall-clock ms of the claiming node).
pub fn claim_since_ms(claim: &SlotClaim) -> Option<i64> {
    i64::try_from(claim.spec.since).ok().filter(|ms| *ms > 0)
}

/// `-` for an empty cell.
pub fn dash(s: String) -> String {
    if s.is_empty() { "-".into() } else { s }
}

/// `a,b` or `<none>`.
pub fn list_or_none(items: &[String]) -> String {
    if items.is_empty() {
        "<none>".into()
    } else {
        items.join(",")
    }
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

/// Objects for unit tests, built through their JSON form (k8s-openapi, whose
/// `Time` the metadata uses, is not a dependency of this crate).
#[cfg(test)]
pub mod fixtures {
    use steward_api::{Instance, SlotClaim};

    /// Created at 2023-11-14T22:13:20Z (Unix ms 1_700_000_000_000).
    pub const CREATED_MS: i64 = 1_700_000_000_000;

    pub fn instance(ns: &str, name: &str, capacity: u32, nodes: &[&str]) -> Instance {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "steward.dev/v1alpha1",
            "kind": "Instance",
            "metadata": {
                "name": name,
                "namespace": ns,
                "uid": format!("uid-{name}"),
                "creationTimestamp": "2023-11-14T22:13:20Z",
            },
            "spec": {
                "configurationName": "cams",
                "deviceId": format!("dev-{name}"),
                "nodes": nodes,
                "capacity": capacity,
                "properties": {"A": "1", "B": "2"},
                "cdiName": format!("steward.dev/cams={name}"),
            }
        }))
        .unwrap()
    }

    /// Slot `slot` of `instance` claimed by node-a, held by `pod`
    /// (`ns/name`) since [`CREATED_MS`] + 10 s.
    pub fn claim(ns: &str, instance: &str, slot: u32, pod: Option<&str>) -> SlotClaim {
        let pod = pod.map(|p| {
            let (pns, name) = p.split_once('/').unwrap();
            serde_json::json!({"namespace": pns, "name": name, "uid": format!("uid-{name}")})
        });
        serde_json::from_value(serde_json::json!({
            "apiVersion": "steward.dev/v1alpha1",
            "kind": "SlotClaim",
            "metadata": {
                "name": format!("{instance}-{slot}"),
                "namespace": ns,
                "creationTimestamp": "2023-11-14T22:13:30Z",
            },
            "spec": {
                "instance": instance,
                "slot": slot,
                "node": "node-a",
                "epoch": 1,
                "pod": pod,
                "container": pod.as_ref().map(|_| "main"),
                "since": CREATED_MS + 10_000,
            }
        }))
        .unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_like_kubectl() {
        let cases = [
            (0, "0s"),
            (59, "59s"),
            (119, "119s"),
            (120, "2m"),
            (192, "3m12s"),
            (600, "10m"),
            (179 * 60, "179m"),
            (3 * 3600, "3h"),
            (3 * 3600 + 5 * 60, "3h5m"),
            (30 * 3600, "30h"),
            (3 * 86_400 + 4 * 3600, "3d4h"),
            (400 * 86_400, "400d"),
            (3 * 365 * 86_400 + 30 * 86_400, "3y30d"),
            (10 * 365 * 86_400, "10y"),
        ];
        for (secs, want) in cases {
            assert_eq!(age(Some(0), secs * 1000), want, "{secs}s");
        }
        assert_eq!(age(Some(1500), 0), "0s");
        assert_eq!(age(Some(5000), 0), "<invalid>");
        assert_eq!(age(None, 0), "<unknown>");
    }

    #[test]
    fn durations_parse_like_kubectl_timeouts() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("0"), Err(TimeoutError::Zero));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("5 min").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn rfc3339_is_utc_to_the_second() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400_999), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000_123), "2023-11-14T22:13:20Z");
        assert_eq!(rfc3339(-1000), "1969-12-31T23:59:59Z");
    }

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

    #[test]
    fn claim_states() {
        let mut c = SlotClaim::new(
            "cam-0",
            steward_api::SlotClaimSpec {
                instance: "cam".into(),
                slot: 0,
                node: "n".into(),
                epoch: 1,
                pod: None,
                container: None,
                since: 0,
                awaiting: None,
                reservation: None,
                resource_claim: None,
            },
        );
        assert_eq!(claim_state(&c), "Pending");
        assert_eq!(claim_pod(&c), "<none>");
        assert_eq!(claim_since_ms(&c), None);
        c.spec.pod = Some(steward_api::PodRef {
            namespace: "apps".into(),
            name: "web".into(),
            uid: "u".into(),
        });
        assert_eq!(claim_state(&c), "Held");
        assert_eq!(claim_pod(&c), "apps/web");
        c.spec.awaiting = Some(5);
        assert_eq!(claim_state(&c), "Awaiting");
    }
}
