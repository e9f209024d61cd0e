//! The discovery handlers' side: the registry fed one event at a time and
//! its effects carried out (discovery streams opened and closed), and what
//! the streams report, validated before it reaches the Instances.

use std::collections::BTreeSet;

use steward_core::discovery::registry::{Effect, HandlerState, RegistryEvent};
use steward_core::discovery::validate::{RejectReason, validate};
use steward_core::discovery::{ConfigKey, Device, Endpoint, HandlerKey};

use super::{DiscoveryLoop, endpoint_text};
use crate::discovery::{self, DiscoveryMsg, Target, TaskReport};
use crate::error::InvalidDetails;
use crate::store::InstanceStore;

fn reason_label(r: &RejectReason) -> &'static str {
    match r {
        RejectReason::EmptyId => "empty_id",
        RejectReason::DuplicateId => "duplicate_id",
        RejectReason::InvalidPropertyName(_) => "invalid_property_name",
        RejectReason::HostPathNotAllowed(_) => "host_path_not_allowed",
        RejectReason::OverLimit { .. } => "over_limit",
    }
}

impl<S: InstanceStore> DiscoveryLoop<S> {
    pub(super) async fn on_task(&mut self, report: TaskReport) {
        let TaskReport {
            task,
            key,
            config,
            msg,
        } = report;
        let pair = (key.clone(), config.clone());
        if self.tasks.get(&pair).map(|t| t.0) != Some(task) {
            return; // a stream that was already closed or replaced
        }
        match msg {
            DiscoveryMsg::Connected => {
                if let Some(cs) = self.configs.get_mut(&config) {
                    cs.details = Some(Ok(()));
                    cs.warned = None;
                }
                let at = self.now();
                self.feed(RegistryEvent::Connected { key, config, at })
                    .await;
            }
            DiscoveryMsg::Devices(devices) => {
                self.on_devices(&key, &config, devices).await;
                self.publish(&config).await;
            }
            DiscoveryMsg::InvalidDetails(message) => {
                self.tasks.remove(&pair);
                tracing::error!(configuration = %config, handler = %key.name, error = %message, "discovery handler refused the discovery details");
                if let Some(cs) = self.configs.get_mut(&config) {
                    cs.details = Some(Err(InvalidDetails::Refused(message)));
                }
                self.warn_invalid(&config).await;
                self.publish(&config).await;
            }
            DiscoveryMsg::Withheld(why) => {
                self.tasks.remove(&pair);
                tracing::error!(configuration = %config, handler = %key.name, error = %why, "discovery details withheld from the handler");
                if let Some(cs) = self.configs.get_mut(&config) {
                    cs.details = Some(Err(why));
                }
                self.warn_invalid(&config).await;
                self.publish(&config).await;
            }
            DiscoveryMsg::Lost(message) => {
                self.tasks.remove(&pair);
                self.metrics.lost(&key.name);
                tracing::warn!(configuration = %config, handler = %key.name, endpoint = %endpoint_text(&key.endpoint), error = %message, "discovery stream lost");
                let at = self.now();
                self.feed(RegistryEvent::ConnectionLost { key, config, at })
                    .await;
            }
        }
    }

    async fn on_devices(&mut self, key: &HandlerKey, config: &ConfigKey, devices: Vec<Device>) {
        let Some(cs) = self.configs.get_mut(config) else {
            return;
        };
        let policy = cs.snap.configuration.spec.device_policy();
        let (accepted, rejected) = validate(devices, &policy);
        for r in &rejected {
            tracing::warn!(configuration = %config, handler = %key.name, device = %r.device_id, reason = %r.reason, "rejected device reported by discovery handler");
            self.metrics
                .rejected(&config.to_string(), reason_label(&r.reason));
        }
        if cs.reports.get(key) == Some(&accepted) {
            return;
        }
        cs.reports.insert(key.clone(), accepted);
        self.reconcile(config).await;
    }

    /// Apply a registry event and everything it leads to.
    pub(super) async fn feed(&mut self, ev: RegistryEvent) {
        self.deferred.push(ev);
        let mut dirty = BTreeSet::new();
        while !self.deferred.is_empty() {
            for ev in std::mem::take(&mut self.deferred) {
                let fx = self.registry.apply(ev);
                dirty.extend(self.carry_out(fx));
            }
        }
        self.update_handler_metrics();
        for key in dirty {
            self.reconcile(&key).await;
        }
        let keys: Vec<ConfigKey> = self.configs.keys().cloned().collect();
        for key in keys {
            self.publish(&key).await;
        }
    }

    /// Carry out effects; returns the Configurations whose reports changed.
    fn carry_out(&mut self, fx: Vec<Effect>) -> BTreeSet<ConfigKey> {
        let reconnecting: BTreeSet<(HandlerKey, ConfigKey)> = fx
            .iter()
            .filter_map(|e| match e {
                Effect::Connect { key, config } => Some((key.clone(), config.clone())),
                _ => None,
            })
            .collect();
        let mut dirty = BTreeSet::new();
        for e in fx {
            match e {
                Effect::Connect { key, config } => self.spawn(key, config),
                Effect::Disconnect { key, config } => {
                    tracing::info!(configuration = %config, handler = %key.name, endpoint = %endpoint_text(&key.endpoint), "closing discovery stream");
                    let pair = (key, config);
                    if let Some((_, handle)) = self.tasks.remove(&pair) {
                        handle.abort();
                    }
                    // A stream re-opened in the same breath keeps the old
                    // report until the new one arrives: no churn.
                    if !reconnecting.contains(&pair)
                        && let Some(cs) = self.configs.get_mut(&pair.1)
                        && cs.reports.remove(&pair.0).is_some()
                    {
                        dirty.insert(pair.1);
                    }
                }
                Effect::Removed { key } => {
                    tracing::warn!(handler = %key.name, endpoint = %endpoint_text(&key.endpoint), "discovery handler removed after staying offline too long");
                    if key.endpoint == Endpoint::Embedded {
                        // Compiled in: it "registers" again at once and
                        // is retried like a freshly registered handler.
                        if let Some(h) = self.embedded.get(&key.name) {
                            self.deferred.push(RegistryEvent::Registered {
                                key: key.clone(),
                                shared: h.shared(),
                                at: self.now(),
                            });
                        }
                    } else if let Err(e) = self.state.remove_registration(&key) {
                        tracing::error!(error = %e, "could not forget persisted registration");
                    }
                    for (ckey, cs) in &mut self.configs {
                        let had = cs.reports.remove(&key).is_some();
                        if had || cs.snap.configuration.spec.discovery_handler.name == key.name {
                            dirty.insert(ckey.clone());
                        }
                    }
                }
            }
        }
        dirty
    }

    fn spawn(&mut self, key: HandlerKey, config: ConfigKey) {
        let pair = (key.clone(), config.clone());
        if let Some((_, handle)) = self.tasks.remove(&pair) {
            handle.abort();
        }
        let Some(cs) = self.configs.get(&config) else {
            return;
        };
        let req = match &cs.snap.request {
            Ok(r) => r.clone(),
            Err(why) => {
                tracing::error!(configuration = %config, error = %why, "not starting discovery: discovery properties unresolved");
                return;
            }
        };
        if let (Endpoint::Network(url), Some(property)) =
            (&key.endpoint, secret_property(&cs.snap.configuration))
        {
            // Never over plaintext: the task reports it at once, as a
            // refusal retrying cannot mend (nothing is connected).
            let why = InvalidDetails::SecretWithheld {
                property,
                handler: key.name.clone(),
                endpoint: url.clone(),
            };
            let task = self.next_task;
            self.next_task += 1;
            let report = TaskReport {
                task,
                key,
                config,
                msg: DiscoveryMsg::Withheld(why),
            };
            let tx = self.task_tx.clone();
            let handle = tokio::spawn(async move {
                let _ = tx.send(report).await;
            });
            self.tasks.insert(pair, (task, handle.abort_handle()));
            return;
        }
        let target = match &key.endpoint {
            Endpoint::Embedded => match self.embedded.get(&key.name) {
                Some(h) => Target::Embedded(h.clone()),
                None => {
                    self.deferred.push(RegistryEvent::ConnectionLost {
                        key,
                        config,
                        at: self.now(),
                    });
                    return;
                }
            },
            other => Target::Remote(other.clone()),
        };
        tracing::info!(configuration = %config, handler = %key.name, endpoint = %endpoint_text(&key.endpoint), "opening discovery stream");
        let task = self.next_task;
        self.next_task += 1;
        let handle = tokio::spawn(discovery::run(
            task,
            key,
            config,
            target,
            req,
            self.client_opts.clone(),
            self.task_tx.clone(),
        ));
        self.tasks.insert(pair, (task, handle.abort_handle()));
    }

    fn update_handler_metrics(&self) {
        let (mut w, mut a, mut o) = (0, 0, 0);
        for h in self.registry.handlers() {
            match h.state {
                HandlerState::Waiting => w += 1,
                HandlerState::Active => a += 1,
                HandlerState::Offline { .. } => o += 1,
            }
        }
        self.metrics.set_handlers(w, a, o);
    }
}

/// The first discovery property of `c` read from a Secret, if any.
fn secret_property(c: &steward_api::Configuration) -> Option<String> {
    c.spec
        .discovery_handler
        .discovery_properties
        .iter()
        .find(|p| {
            p.value_from
                .as_ref()
                .is_some_and(|f| f.secret_key_ref.is_some())
        })
        .map(|p| p.name.clone())
}
