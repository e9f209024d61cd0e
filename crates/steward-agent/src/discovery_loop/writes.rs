//! What the loop writes: the Instances of a Configuration planned from the
//! current reports, this node's part of the Configuration's status, and an
//! Event for discovery details a handler refused.

use std::collections::BTreeSet;

use steward_api::HandlerStatus;
use steward_core::discovery::instances::merge;
use steward_core::discovery::registry::HandlerState;
use steward_core::discovery::{ConfigKey, Device};

use super::{DiscoveryLoop, endpoint_text};
use crate::status::{NodeContribution, REASON_INVALID_DETAILS};
use crate::store::{self, Desired, InstanceStore, on_node};

impl<S: InstanceStore> DiscoveryLoop<S> {
    /// Plan and write the Instances of `key` from the current reports.
    pub(super) async fn reconcile(&mut self, key: &ConfigKey) {
        let Some(cs) = self.configs.get(key) else {
            return;
        };
        let reports: Vec<Vec<Device>> = cs.reports.values().cloned().collect();
        let devices = merge(&reports);
        let shared = cs
            .reports
            .keys()
            .any(|k| self.registry.get(k).is_some_and(|h| h.shared));
        let configuration = cs.snap.configuration.clone();
        let result = store::reconcile(
            &self.store,
            Desired {
                node: &self.node,
                key,
                owner: Some(&configuration),
                shared,
                capacity: configuration.spec.capacity,
                devices: &devices,
            },
            self.timings.max_conflict_retries,
            &self.metrics,
        )
        .await;
        match result {
            Ok(views) => {
                self.retry_reconcile.remove(key);
                let mine = on_node(&views, &self.node).count();
                self.metrics.set_instances(&key.to_string(), mine);
                if let Some(cs) = self.configs.get_mut(key) {
                    cs.instances = Some(u32::try_from(views.len()).unwrap_or(u32::MAX));
                }
            }
            Err(e) => {
                tracing::error!(configuration = %key, error = %e, "writing instances failed; will retry");
                self.retry_reconcile.insert(key.clone());
            }
        }
    }

    fn contribution(&self, key: &ConfigKey) -> Option<NodeContribution> {
        let cs = self.configs.get(key)?;
        let wanted = &cs.snap.configuration.spec.discovery_handler.name;
        let handlers = self
            .registry
            .handlers()
            .filter(|h| &h.key.name == wanted)
            .map(|h| HandlerStatus {
                node: self.node.clone(),
                name: h.key.name.clone(),
                endpoint: endpoint_text(&h.key.endpoint),
                state: if h.configurations.contains(key) {
                    "Active".into()
                } else if matches!(h.state, HandlerState::Offline { .. }) {
                    "Offline".into()
                } else {
                    "Waiting".into()
                },
            })
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        Some(NodeContribution {
            handlers,
            details: cs.details.clone(),
            instances: cs.instances,
        })
    }

    /// Write this node's contribution to the Configuration's status if it changed.
    pub(super) async fn publish(&mut self, key: &ConfigKey) {
        let Some(mine) = self.contribution(key) else {
            return;
        };
        if let (Some(view), Some(cs)) = (&self.local, self.configs.get(key)) {
            let mut c = cs.snap.configuration.clone();
            let generation = c.metadata.generation;
            c.status = Some(crate::status::merged(
                &Default::default(),
                &self.node,
                generation,
                &mine,
            ));
            view.set(c);
        }
        let Some(writer) = self.status.clone() else {
            return;
        };
        if self.published.get(key) == Some(&mine) {
            return;
        }
        match writer.write(key, &mine).await {
            Ok(_) => {
                self.published.insert(key.clone(), mine);
            }
            Err(e) => {
                tracing::warn!(configuration = %key, error = %e, "writing Configuration status failed; will retry");
            }
        }
    }

    /// Record an Event for newly invalid details (once per message).
    pub(super) async fn warn_invalid(&mut self, key: &ConfigKey) {
        let Some(writer) = self.status.clone() else {
            return;
        };
        let Some(cs) = self.configs.get(key) else {
            return;
        };
        let Some(Err(why)) = &cs.details else {
            return;
        };
        if cs.warned.as_ref() == Some(why) {
            return;
        }
        let why = why.clone();
        let configuration = cs.snap.configuration.clone();
        match writer
            .warn(&configuration, REASON_INVALID_DETAILS, &why.to_string())
            .await
        {
            Ok(()) => {
                if let Some(cs) = self.configs.get_mut(key) {
                    cs.warned = Some(why);
                }
            }
            Err(e) => tracing::warn!(configuration = %key, error = %e, "recording Event failed"),
        }
    }
}
