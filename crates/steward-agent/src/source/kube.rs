//! Kubernetes mode: Configurations watched in every namespace; discovery
//! properties resolved from Secret and ConfigMap keys when the Configuration
//! is applied (a later change of the referenced Secret or ConfigMap is picked
//! up at the next change of the Configuration).

use std::collections::{BTreeMap, BTreeSet};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use steward_api::{Configuration, ConfigurationSpec, DiscoveryProperty, KeyRef, config_key};
use steward_core::discovery::ConfigKey;
use steward_discovery::DiscoverRequest;
use tokio::sync::mpsc;

use super::{ConfigEvent, ConfigSnapshot};
use crate::error::SourceError;

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
        let value = match (&from.secret_key_ref, &from.config_map_key_ref) {
            (Some(r), None) => secret_key(client, namespace, r).await.map_err(err)?,
            (None, Some(r)) => config_map_key(client, namespace, r).await.map_err(err)?,
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

fn p_optional(from: &steward_api::DiscoveryPropertySource) -> bool {
    from.secret_key_ref
        .as_ref()
        .or(from.config_map_key_ref.as_ref())
        .and_then(|r| r.optional)
        .unwrap_or(false)
}

async fn secret_key(
    client: &kube::Client,
    namespace: &str,
    r: &KeyRef,
) -> Result<Option<Vec<u8>>, String> {
    let ns = r.namespace.as_deref().unwrap_or(namespace);
    let secret = Api::<Secret>::namespaced(client.clone(), ns)
        .get_opt(&r.name)
        .await
        .map_err(|e| format!("reading Secret {ns}/{}: {e}", r.name))?;
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
) -> Result<Option<Vec<u8>>, String> {
    let ns = r.namespace.as_deref().unwrap_or(namespace);
    let cm = Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get_opt(&r.name)
        .await
        .map_err(|e| format!("reading ConfigMap {ns}/{}: {e}", r.name))?;
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
    .map_err(|e| e.to_string());
    Some(ConfigSnapshot {
        key,
        configuration: c,
        request,
    })
}

/// Watch Configurations in every namespace and send spec changes to `tx`.
/// Ends when `tx` closes.
pub async fn kube_source(client: kube::Client, tx: mpsc::Sender<ConfigEvent>) {
    let api = Api::<Configuration>::all(client.clone());
    let mut stream = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut known: BTreeMap<ConfigKey, ConfigurationSpec> = BTreeMap::new();
    let mut relist: Option<BTreeSet<ConfigKey>> = None;
    while let Some(ev) = stream.next().await {
        let event = match ev {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(error = %e, "Configuration watch failed; retrying");
                continue;
            }
        };
        let out = match event {
            Event::Init => {
                relist = Some(BTreeSet::new());
                Vec::new()
            }
            Event::InitApply(c) | Event::Apply(c) => {
                let Ok(key) = config_key(&c) else { continue };
                if let Some(seen) = relist.as_mut() {
                    seen.insert(key.clone());
                }
                if known.get(&key) == Some(&c.spec) {
                    continue;
                }
                known.insert(key, c.spec.clone());
                match snapshot(&client, c).await {
                    Some(s) => vec![ConfigEvent::Applied(Box::new(s))],
                    None => Vec::new(),
                }
            }
            Event::InitDone => {
                let seen = relist.take().unwrap_or_default();
                let gone: Vec<ConfigKey> = known
                    .keys()
                    .filter(|k| !seen.contains(*k))
                    .cloned()
                    .collect();
                let mut out: Vec<ConfigEvent> = gone
                    .into_iter()
                    .map(|k| {
                        known.remove(&k);
                        ConfigEvent::Deleted(k)
                    })
                    .collect();
                out.push(ConfigEvent::Synced(known.keys().cloned().collect()));
                out
            }
            Event::Delete(c) => {
                let Ok(key) = config_key(&c) else { continue };
                known.remove(&key);
                vec![ConfigEvent::Deleted(key)]
            }
        };
        for e in out {
            if tx.send(e).await.is_err() {
                return;
            }
        }
    }
}
