//! Configurations as they come and go: discovery restarted only when the
//! request changed, Instances resized on a capacity edit, and this node
//! removed from the Instances of Configurations deleted while it was down.

use std::collections::{BTreeMap, BTreeSet};

use steward_api::ConfigurationSpec;
use steward_core::discovery::ConfigKey;
use steward_core::discovery::registry::RegistryEvent;

use super::{ConfigState, DiscoveryLoop, READY_CONFIGURATIONS};
use crate::source::ConfigEvent;
use crate::store::{self, Desired, InstanceStore, on_node};

impl<S: InstanceStore> DiscoveryLoop<S> {
    pub(super) async fn on_config(&mut self, ev: ConfigEvent) {
        match ev {
            ConfigEvent::Applied(snap) => {
                let key = snap.key.clone();
                let handler_name = snap.configuration.spec.discovery_handler.name.clone();
                tracing::info!(configuration = %key, handler = %handler_name, "configuration applied");
                let details = snap.request.as_ref().err().map(|e| Err(e.clone().into()));
                // A capacity edit changes no discovery request: discovery is
                // not restarted, and the Instances are resized from the
                // reports already in hand, once this node has reconciled them
                // at least once (before that, an empty report would read as
                // "no devices"). Any other change, including a new value of
                // a referenced Secret or ConfigMap, restarts discovery.
                let mut resize = None;
                let mut rediscover = true;
                match self.configs.get_mut(&key) {
                    Some(cs) => {
                        let (old, new) = (&cs.snap, &*snap);
                        rediscover = old.request != new.request
                            || !same_but_capacity(&old.configuration.spec, &new.configuration.spec);
                        let capacity = new.configuration.spec.capacity;
                        resize = (cs.instances.is_some()
                            && old.configuration.spec.capacity != capacity)
                            .then_some(capacity);
                        cs.snap = *snap;
                        cs.details = details;
                        cs.warned = None;
                    }
                    None => {
                        self.configs.insert(
                            key.clone(),
                            ConfigState {
                                snap: *snap,
                                reports: BTreeMap::new(),
                                details,
                                warned: None,
                                instances: None,
                            },
                        );
                    }
                }
                if rediscover {
                    let at = self.now();
                    self.feed(RegistryEvent::ConfigurationApplied {
                        config: key.clone(),
                        handler_name,
                        at,
                    })
                    .await;
                }
                self.warn_invalid(&key).await;
                if let Some(capacity) = resize {
                    tracing::info!(configuration = %key, capacity, "capacity changed; resizing instances");
                    self.reconcile(&key).await;
                }
                self.publish(&key).await;
            }
            ConfigEvent::Synced(live) => {
                self.sweep_orphans(&live).await;
                self.readiness.ready(READY_CONFIGURATIONS);
            }
            ConfigEvent::Deleted(key) => {
                tracing::info!(configuration = %key, "configuration deleted");
                let at = self.now();
                self.feed(RegistryEvent::ConfigurationDeleted {
                    config: key.clone(),
                    at,
                })
                .await;
                if let Some(cs) = self.configs.get_mut(&key) {
                    cs.reports.clear();
                }
                self.reconcile(&key).await;
                self.configs.remove(&key);
                self.published.remove(&key);
                if let Some(view) = &self.local {
                    view.remove(&key.namespace, &key.name);
                }
                self.retry_reconcile.remove(&key);
                self.metrics.set_instances(&key.to_string(), 0);
            }
        }
    }

    /// Remove this node from Instances of Configurations that no longer
    /// exist (deleted while the agent was down).
    async fn sweep_orphans(&mut self, live: &BTreeSet<ConfigKey>) {
        let all = match self.store.list_all().await {
            Ok(all) => all,
            Err(e) => {
                tracing::warn!(error = %e, "listing instances for the orphan sweep failed");
                return;
            }
        };
        let orphans: BTreeSet<ConfigKey> = on_node(&all, &self.node)
            .map(|v| v.configuration.clone())
            .filter(|k| !live.contains(k) && !self.configs.contains_key(k))
            .collect();
        for key in orphans {
            tracing::info!(configuration = %key, "removing this node from instances of a vanished configuration");
            if let Err(e) = store::reconcile(
                &self.store,
                Desired {
                    node: &self.node,
                    key: &key,
                    owner: None,
                    shared: false,
                    // Nothing is wanted: no Instance is created or resized.
                    capacity: 0,
                    devices: &[],
                },
                self.timings.max_conflict_retries,
                &self.metrics,
            )
            .await
            {
                tracing::warn!(configuration = %key, error = %e, "orphan sweep failed");
            }
            self.metrics.set_instances(&key.to_string(), 0);
        }
    }
}

/// Whether two specs differ in nothing but `capacity`.
fn same_but_capacity(a: &ConfigurationSpec, b: &ConfigurationSpec) -> bool {
    let mut b = b.clone();
    b.capacity = a.capacity;
    *a == b
}
