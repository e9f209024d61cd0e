//! Kubernetes mode: Configurations watched in every namespace; discovery
//! properties resolved from Secret and ConfigMap keys when the Configuration
//! is applied, and again whenever a referenced Secret or ConfigMap changes:
//! each referenced object is watched by name (`metadata.name` field
//! selector, the way kubelet watches the Secrets its pods mount), so the
//! agent needs `get`/`list`/`watch` only on the objects it is pointed at.

use std::collections::{BTreeMap, BTreeSet};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::runtime::watcher;
use steward_api::{Configuration, ConfigurationSpec, DiscoveryProperty, KeyRef, config_key};
use steward_core::discovery::ConfigKey;
use steward_discovery::DiscoverRequest;
use steward_kube::{Mirror, SharedWatch};
use tokio::sync::mpsc;

use super::{ConfigEvent, ConfigSnapshot};
use crate::error::{SourceError, Unresolved};

/// Resolve every discovery property of a Configuration in `namespace`.
pub async fn resolve_properties(
    client: &kube::Client,
    namespace: &str,
    props: &[DiscoveryProperty],
) -> Result<BTreeMap<String, Vec<u8>>, SourceError> {
    let mut out = BTreeMap::new();
    for p in props {
        let err = |message: String| SourceError::Property {
            property: p.name.clone(),
            message,
        };
        if let Some(v) = &p.value {
            out.insert(p.name.clone(), v.clone().into_bytes());
            continue;
        }
        let Some(from) = &p.value_from else {
            return Err(err("neither value nor valueFrom is set".into()));
        };
        if let Some(other) = foreign_namespace(namespace, from) {
            return Err(err(format!(
                "refers to namespace {other}: a Configuration may read Secrets and ConfigMaps \
                 of its own namespace ({namespace}) only"
            )));
        }
        let value = match (&from.secret_key_ref, &from.config_map_key_ref) {
            (Some(r), None) => secret_key(client, namespace, r)
                .await
                .map_err(|e| read_err(&p.name, "Secret", namespace, r, e))?,
            (None, Some(r)) => config_map_key(client, namespace, r)
                .await
                .map_err(|e| read_err(&p.name, "ConfigMap", namespace, r, e))?,
            _ => {
                return Err(err(
                    "exactly one of secretKeyRef or configMapKeyRef must be set".into(),
                ));
            }
        };
        match value {
            Some(v) => {
                out.insert(p.name.clone(), v);
            }
            None if p_optional(from) => {}
            None => return Err(err("referenced key not found".into())),
        }
    }
    Ok(out)
}

/// The namespace a reference names when it is not the Configuration's own:
/// such a reference is refused, so whoever may create a Configuration in a
/// namespace can have the agent read only what that namespace holds.
fn foreign_namespace<'a>(
    namespace: &str,
    from: &'a steward_api::DiscoveryPropertySource,
) -> Option<&'a str> {
    [&from.secret_key_ref, &from.config_map_key_ref]
        .into_iter()
        .flatten()
        .filter_map(|r| r.namespace.as_deref())
        .find(|ns| *ns != namespace)
}

fn p_optional(from: &steward_api::DiscoveryPropertySource) -> bool {
    from.secret_key_ref
        .as_ref()
        .or(from.config_map_key_ref.as_ref())
        .and_then(|r| r.optional)
        .unwrap_or(false)
}

fn read_err(
    property: &str,
    kind: &'static str,
    namespace: &str,
    r: &KeyRef,
    source: kube::Error,
) -> SourceError {
    SourceError::PropertySource {
        property: property.to_owned(),
        kind,
        namespace: namespace.to_owned(),
        name: r.name.clone(),
        source: Box::new(source),
    }
}

async fn secret_key(
    client: &kube::Client,
    namespace: &str,
    r: &KeyRef,
) -> Result<Option<Vec<u8>>, kube::Error> {
    let secret = Api::<Secret>::namespaced(client.clone(), namespace)
        .get_opt(&r.name)
        .await?;
    Ok(secret.and_then(|s| {
        s.data
            .and_then(|d| d.get(&r.key).map(|v| v.0.clone()))
            .or_else(|| {
                s.string_data
                    .and_then(|d| d.get(&r.key).map(|v| v.clone().into_bytes()))
            })
    }))
}

async fn config_map_key(
    client: &kube::Client,
    namespace: &str,
    r: &KeyRef,
) -> Result<Option<Vec<u8>>, kube::Error> {
    let cm = Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .get_opt(&r.name)
        .await?;
    Ok(cm.and_then(|c| {
        c.data
            .as_ref()
            .and_then(|d| d.get(&r.key).map(|v| v.clone().into_bytes()))
            .or_else(|| {
                c.binary_data
                    .as_ref()
                    .and_then(|d| d.get(&r.key).map(|v| v.0.clone()))
            })
    }))
}

async fn snapshot(client: &kube::Client, c: Configuration) -> Option<ConfigSnapshot> {
    let key = match config_key(&c) {
        Ok(k) => k,
        Err(e) => {
            tracing::warn!(error = %e, "ignoring Configuration");
            return None;
        }
    };
    let request = resolve_properties(
        client,
        &key.namespace,
        &c.spec.discovery_handler.discovery_properties,
    )
    .await
    .map(|properties| DiscoverRequest {
        details: c.spec.discovery_handler.details.clone(),
        properties,
    })
    .map_err(|e| Unresolved::Source(e.to_string()));
    Some(ConfigSnapshot {
        key,
        configuration: c,
        request,
    })
}

/// A Secret or ConfigMap that discovery properties read.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum PropertySource {
    Secret { namespace: String, name: String },
    ConfigMap { namespace: String, name: String },
}

impl std::fmt::Display for PropertySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Secret { namespace, name } => write!(f, "Secret {namespace}/{name}"),
            Self::ConfigMap { namespace, name } => write!(f, "ConfigMap {namespace}/{name}"),
        }
    }
}

/// The Secrets and ConfigMaps the discovery properties of a Configuration
/// in `namespace` refer to.
fn property_sources(namespace: &str, spec: &ConfigurationSpec) -> BTreeSet<PropertySource> {
    let mut out = BTreeSet::new();
    for p in &spec.discovery_handler.discovery_properties {
        let Some(from) = &p.value_from else { continue };
        // A reference to another namespace is refused when resolving: it
        // is not watched either.
        if foreign_namespace(namespace, from).is_some() {
            continue;
        }
        let ns = |_: &KeyRef| namespace.to_owned();
        if let Some(r) = &from.secret_key_ref {
            out.insert(PropertySource::Secret {
                namespace: ns(r),
                name: r.name.clone(),
            });
        }
        if let Some(r) = &from.config_map_key_ref {
            out.insert(PropertySource::ConfigMap {
                namespace: ns(r),
                name: r.name.clone(),
            });
        }
    }
    out
}

/// A by-name watch of `api`'s object `name` (one shared watch per object
/// referenced): an item each time it changes, appears or goes away, or the
/// watch was (re-)established.
fn changes_of<K>(api: Api<K>, name: &str) -> futures::stream::BoxStream<'static, ()>
where
    K: kube::Resource
        + kube::ResourceExt
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default,
{
    let by_name = watcher::Config::default().fields(&format!("metadata.name={name}"));
    SharedWatch::start(api, by_name)
        .subscribe()
        .map(|_| ())
        .boxed()
}

/// Watch one object by name; report to `tx` each time it changes, appears
/// or goes away (and once the watch is first established).
async fn watch_source(
    client: kube::Client,
    source: PropertySource,
    tx: mpsc::Sender<PropertySource>,
) {
    let mut events = match &source {
        PropertySource::Secret { namespace, name } => {
            changes_of(Api::<Secret>::namespaced(client, namespace), name)
        }
        PropertySource::ConfigMap { namespace, name } => {
            changes_of(Api::<ConfigMap>::namespaced(client, namespace), name)
        }
    };
    while events.next().await.is_some() {
        if tx.send(source.clone()).await.is_err() {
            return;
        }
    }
}

/// What the source last sent for a Configuration.
struct Known {
    configuration: Configuration,
    request: Result<DiscoverRequest, Unresolved>,
    sources: BTreeSet<PropertySource>,
}

/// Watches of the referenced Secrets and ConfigMaps, one per object.
struct SourceWatches {
    client: kube::Client,
    tx: mpsc::Sender<PropertySource>,
    tasks: BTreeMap<PropertySource, tokio::task::AbortHandle>,
}

impl SourceWatches {
    /// Watch exactly the objects `known` refers to.
    fn sync(&mut self, known: &BTreeMap<ConfigKey, Known>) {
        let wanted: BTreeSet<PropertySource> = known
            .values()
            .flat_map(|k| k.sources.iter().cloned())
            .collect();
        self.tasks.retain(|s, handle| {
            let keep = wanted.contains(s);
            if !keep {
                handle.abort();
            }
            keep
        });
        for s in wanted {
            if !self.tasks.contains_key(&s) {
                tracing::debug!(source = %s, "watching discovery property source");
                let task = tokio::spawn(watch_source(
                    self.client.clone(),
                    s.clone(),
                    self.tx.clone(),
                ));
                self.tasks.insert(s, task.abort_handle());
            }
        }
    }
}

impl Drop for SourceWatches {
    fn drop(&mut self) {
        for handle in self.tasks.values() {
            handle.abort();
        }
    }
}

/// Watch Configurations in every namespace, and the Secrets and ConfigMaps
/// their discovery properties read; send spec changes, and changes of the
/// resolved properties, to `tx`. Ends when `tx` closes. `configurations`
/// is the agent's shared watch of them.
pub async fn kube_source(
    client: kube::Client,
    configurations: SharedWatch<Configuration>,
    tx: mpsc::Sender<ConfigEvent>,
) {
    let mut changes = configurations.subscribe();
    let (source_tx, mut source_rx) = mpsc::channel(64);
    let mut watches = SourceWatches {
        client: client.clone(),
        tx: source_tx,
        tasks: BTreeMap::new(),
    };
    // The Configurations as watched, and those of them resolved (what was
    // last reported): a Configuration whose properties cannot be read yet
    // is watched but not known.
    let mut watched = Mirror::keyed(|c: &Configuration| config_key(c).ok(), Some);
    let mut known: BTreeMap<ConfigKey, Known> = BTreeMap::new();
    loop {
        let change = tokio::select! {
            change = changes.next() => match change {
                Some(change) => change,
                None => return,
            },
            Some(changed) = source_rx.recv() => {
                let out = re_resolve(&client, &mut known, &changed).await;
                for e in out {
                    if tx.send(e).await.is_err() {
                        return;
                    }
                }
                continue;
            }
        };
        let delta = match watched.apply(change) {
            Ok(delta) => delta,
            Err(e) => {
                tracing::warn!(error = %e, "Configuration watch failed; retrying");
                continue;
            }
        };
        let mut out = Vec::new();
        for key in &delta.applied {
            if let Some(c) = watched.get(key) {
                out.extend(applied(&client, &mut known, c.clone()).await);
            }
        }
        for (key, _) in delta.removed {
            // Gone from a relist: reported only if it was known; deleted:
            // always.
            if known.remove(&key).is_some() || !delta.relisted {
                out.push(ConfigEvent::Deleted(key));
            }
        }
        if delta.relisted {
            out.push(ConfigEvent::Synced(known.keys().cloned().collect()));
        }
        watches.sync(&known);
        for e in out {
            if tx.send(e).await.is_err() {
                return;
            }
        }
    }
}

/// A Configuration created or changed: resolved and recorded in `known`,
/// reported unless its spec is what was last reported. `None` for an
/// unchanged spec, a Configuration without a valid key, or one whose
/// properties cannot be read yet.
async fn applied(
    client: &kube::Client,
    known: &mut BTreeMap<ConfigKey, Known>,
    c: Configuration,
) -> Option<ConfigEvent> {
    let key = config_key(&c).ok()?;
    if known.get(&key).map(|k| &k.configuration.spec) == Some(&c.spec) {
        return None;
    }
    let s = snapshot(client, c).await?;
    known.insert(
        key.clone(),
        Known {
            sources: property_sources(&key.namespace, &s.configuration.spec),
            configuration: s.configuration.clone(),
            request: s.request.clone(),
        },
    );
    Some(ConfigEvent::Applied(Box::new(s)))
}

/// `changed` changed: resolve again the properties of every Configuration
/// that reads it, and report those whose resolved request differs.
async fn re_resolve(
    client: &kube::Client,
    known: &mut BTreeMap<ConfigKey, Known>,
    changed: &PropertySource,
) -> Vec<ConfigEvent> {
    let mut out = Vec::new();
    for (key, k) in known.iter_mut() {
        if !k.sources.contains(changed) {
            continue;
        }
        let Some(s) = snapshot(client, k.configuration.clone()).await else {
            continue;
        };
        if s.request == k.request {
            continue;
        }
        tracing::info!(configuration = %key, source = %changed, "discovery properties changed with their source");
        k.request = s.request.clone();
        out.push(ConfigEvent::Applied(Box::new(s)));
    }
    out
}
