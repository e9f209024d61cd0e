//! Standalone mode: Configurations from a multi-document YAML file, reloaded
//! when its content changes. A file that fails to parse is reported and the
//! previous set kept.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use steward_api::{Configuration, config_key};
use steward_core::discovery::ConfigKey;
use steward_discovery::DiscoverRequest;
use tokio::sync::mpsc;

use super::{ConfigEvent, ConfigSnapshot, inline_properties};
use crate::error::{SourceError, Unresolved};

/// Namespace given to Configurations in the file that name none.
pub const DEFAULT_NAMESPACE: &str = "default";

/// Parse a multi-document YAML stream of Configurations (empty documents are
/// skipped and not counted).
pub fn parse_configurations(path: &Path, text: &str) -> Result<Vec<Configuration>, SourceError> {
    let docs: Vec<Configuration> =
        serde_saphyr::from_multiple(text).map_err(|e| SourceError::Parse {
            path: path.to_owned(),
            message: e.without_snippet().to_string(),
        })?;
    let mut out = Vec::new();
    for (i, mut c) in docs.into_iter().enumerate() {
        if c.metadata.name.as_deref().unwrap_or_default().is_empty() {
            return Err(SourceError::Parse {
                path: path.to_owned(),
                message: format!("document {}: metadata.name is required", i + 1),
            });
        }
        c.metadata
            .namespace
            .get_or_insert_with(|| DEFAULT_NAMESPACE.to_owned());
        out.push(c);
    }
    Ok(out)
}

fn snapshot(c: Configuration) -> Option<ConfigSnapshot> {
    let key = config_key(&c).ok()?;
    let unresolvable: Vec<String> = c
        .spec
        .discovery_handler
        .discovery_properties
        .iter()
        .filter(|p| p.value.is_none())
        .map(|p| p.name.clone())
        .collect();
    let request = if unresolvable.is_empty() {
        Ok(DiscoverRequest {
            details: c.spec.discovery_handler.details.clone(),
            properties: inline_properties(&c),
        })
    } else {
        Err(Unresolved::Standalone(unresolvable))
    };
    Some(ConfigSnapshot {
        key,
        configuration: c,
        request,
    })
}

/// Poll `path` every `interval`, sending the differences to `tx`. Ends when `tx` closes.
pub async fn file_source(path: PathBuf, interval: Duration, tx: mpsc::Sender<ConfigEvent>) {
    let mut known: BTreeMap<ConfigKey, ConfigSnapshot> = BTreeMap::new();
    let mut last_text: Option<String> = None;
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let text = match tokio::fs::read_to_string(&path).await {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => {
                tracing::warn!(error = %SourceError::Read { path: path.clone(), source: e }, "keeping previous configurations");
                continue;
            }
        };
        if last_text.as_deref() == Some(text.as_str()) {
            continue;
        }
        let configs = match parse_configurations(&path, &text) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "keeping previous configurations");
                last_text = Some(text);
                continue;
            }
        };
        last_text = Some(text);
        let mut next: BTreeMap<ConfigKey, ConfigSnapshot> = BTreeMap::new();
        for c in configs {
            if let Some(s) = snapshot(c) {
                next.insert(s.key.clone(), s);
            }
        }
        for key in known.keys() {
            if !next.contains_key(key) && tx.send(ConfigEvent::Deleted(key.clone())).await.is_err()
            {
                return;
            }
        }
        for (key, snap) in &next {
            let changed = known
                .get(key)
                .is_none_or(|old| old.configuration.spec != snap.configuration.spec);
            if changed
                && tx
                    .send(ConfigEvent::Applied(Box::new(snap.clone())))
                    .await
                    .is_err()
            {
                return;
            }
        }
        tracing::info!(path = %path.display(), configurations = next.len(), "configurations file loaded");
        if tx
            .send(ConfigEvent::Synced(next.keys().cloned().collect()))
            .await
            .is_err()
        {
            return;
        }
        known = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_multi_doc_with_defaults() {
        let text = "---\napiVersion: steward.dev/v1alpha1\nkind: Configuration\nmetadata: {name: a}\nspec:\n  discoveryHandler: {name: debug-echo, details: 'x'}\n---\n---\napiVersion: steward.dev/v1alpha1\nkind: Configuration\nmetadata: {name: b, namespace: n}\nspec:\n  capacity: 4\n  discoveryHandler: {name: udev}\n";
        let c = parse_configurations(Path::new("f"), text).unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].metadata.namespace.as_deref(), Some(DEFAULT_NAMESPACE));
        assert_eq!(c[1].spec.capacity, 4);
        assert!(parse_configurations(Path::new("f"), "metadata: {name: a}\nspec: 3\n").is_err());
    }
}
