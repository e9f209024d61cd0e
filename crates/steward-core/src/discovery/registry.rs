//! The discovery-handler registry: which handlers are registered, whether
//! they are reachable, and which Configurations they are connected for.
//!
//! The registry is a pure state machine. The agent feeds it
//! [`RegistryEvent`]s (registrations, Configuration changes, connection
//! outcomes, clock ticks) and carries out the [`Effect`]s it returns
//! (open or close a discovery stream, forget a handler). Time is supplied by
//! the caller in every event; the registry never reads a clock.
//!
//! # States
//!
//! * `Waiting`: registered, connected for no Configuration.
//! * `Active`: connected for at least one Configuration.
//! * `Offline { since }`: a connection to the handler failed or was lost
//!   at `since`. Failed connections are retried with a fresh `Connect` every
//!   `retry_interval_ms` (on [`RegistryEvent::Tick`]); a handler that stays
//!   Offline for more than `offline_grace_ms` (strictly more) is removed.
//!
//! # Rules
//!
//! For every registered handler and every live Configuration asking for the
//! handler's name, the pair is in exactly one of three conditions: connected
//! (listed in [`HandlerInfo::configurations`]), pending (a `Connect` was
//! emitted and no outcome is known yet) or lost (failed; retried on a tick).
//! Pairs for Configurations that do not ask for the handler are never kept.
//!
//! * `Registered` for a new key: `Waiting`, and `Connect` for every
//!   Configuration asking for the handler's name.
//! * `Registered` for a known key with the same `shared` flag changes no
//!   connection: Akri's handlers register again whenever a stream they serve
//!   closes (a Configuration edited or deleted, an agent restart), so
//!   closing and reopening streams here would make them register again, for
//!   ever. Only lost pairs get a `Connect` at once (the handler just proved
//!   it is up); connected and pending pairs are left alone. A registration
//!   is proof of life: an `Offline` handler becomes `Active` or `Waiting`
//!   according to its connections, and its removal clock stops.
//! * `Registered` for a known key with a different `shared` flag (a changed
//!   registration): `Disconnect` for every connection and attempt, then the
//!   handler starts over as `Waiting` with `Connect` for every Configuration
//!   asking for its name.
//! * `ConfigurationApplied`: `Disconnect` for every handler connected (or
//!   being connected) for the Configuration, whatever name it asked for
//!   before, then `Connect` for every handler with the requested name. The
//!   rule is the same whether the name changed or not: an applied
//!   Configuration always restarts discovery with its new details, so the
//!   agent should send this event only when discovery details changed.
//! * `ConfigurationDeleted`: `Disconnect` for every handler connected (or
//!   being connected) for it.
//! * After either Configuration event a handler with no connection left is
//!   `Waiting`, unless it is `Offline` with failed or pending attempts for
//!   other Configurations (it stays `Offline`, keeps its `since` and keeps
//!   being retried). An `Offline` handler with nothing outstanding any more
//!   becomes `Active` or `Waiting` according to its connections.
//! * `Connected` for a pair that is wanted: the pair is connected and the
//!   handler is `Active` (also when it was `Offline`). `Connected` for an
//!   unknown handler, or for a Configuration that does not ask for the
//!   handler (a stale attempt), yields `Disconnect` for that pair.
//! * `ConnectionLost` for a wanted pair: the pair is lost and the handler is
//!   `Offline { since: at }` (an already Offline handler keeps its `since`).
//!   Reports for unknown handlers or unwanted pairs are ignored.
//! * `Tick { now }`: first every handler Offline with `now - since >
//!   offline_grace_ms` is dropped (`Disconnect` for its connections and
//!   pending attempts, then `Removed`); then every remaining handler with lost
//!   pairs whose last attempt is at least `retry_interval_ms` old gets a
//!   `Connect` for each lost pair.
//!
//! `Disconnect` is meant to be idempotent for the agent: it closes a stream
//! or cancels an attempt in flight, and is a no-op if neither exists.
//! Several handlers may share one name (e.g. two udev handlers on different
//! sockets): every one of them gets a `Connect`. Embedded handlers are
//! registered like any other, with [`Endpoint::Embedded`](super::Endpoint).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

use super::{ConfigKey, HandlerKey};
use crate::Millis;

/// Timing of the registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RegistryConfig {
    /// How long a handler may stay Offline before it is removed.
    pub offline_grace_ms: u64,
    /// How often failed connections are retried (on ticks).
    pub retry_interval_ms: u64,
}

impl RegistryConfig {
    /// Five minutes: long enough for a handler to restart or be rolled out
    /// without being removed.
    pub const DEFAULT_OFFLINE_GRACE_MS: u64 = 300_000;
    pub const DEFAULT_RETRY_INTERVAL_MS: u64 = 5_000;
}

impl Default for RegistryConfig {
    fn default() -> Self {
        Self {
            offline_grace_ms: Self::DEFAULT_OFFLINE_GRACE_MS,
            retry_interval_ms: Self::DEFAULT_RETRY_INTERVAL_MS,
        }
    }
}

/// Connectivity of one registered handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum HandlerState {
    Waiting,
    Active,
    Offline { since: Millis },
}

impl fmt::Display for HandlerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HandlerState::Waiting => f.write_str("Waiting"),
            HandlerState::Active => f.write_str("Active"),
            HandlerState::Offline { since } => write!(f, "Offline(since {}ms)", since.0),
        }
    }
}

/// What the registry knows about one handler.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HandlerInfo {
    pub key: HandlerKey,
    /// Whether the devices it discovers are visible from several nodes.
    pub shared: bool,
    pub state: HandlerState,
    /// Configurations the handler is currently connected for.
    pub configurations: BTreeSet<ConfigKey>,
}

/// Input to [`Registry::apply`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum RegistryEvent {
    /// A handler registered (or registered again after a restart).
    Registered {
        key: HandlerKey,
        shared: bool,
        at: Millis,
    },
    /// A Configuration (new or changed) asks for handlers named `handler_name`.
    ConfigurationApplied {
        config: ConfigKey,
        handler_name: String,
        at: Millis,
    },
    ConfigurationDeleted {
        config: ConfigKey,
        at: Millis,
    },
    /// A discovery stream for `config` was established with `key`.
    Connected {
        key: HandlerKey,
        config: ConfigKey,
        at: Millis,
    },
    /// Connecting failed, or the stream broke, hung or sent garbage.
    ConnectionLost {
        key: HandlerKey,
        config: ConfigKey,
        at: Millis,
    },
    /// Time passed; expires Offline handlers and retries failed connections.
    Tick {
        now: Millis,
    },
}

impl RegistryEvent {
    /// The time the event carries.
    pub fn at(&self) -> Millis {
        match self {
            RegistryEvent::Registered { at, .. }
            | RegistryEvent::ConfigurationApplied { at, .. }
            | RegistryEvent::ConfigurationDeleted { at, .. }
            | RegistryEvent::Connected { at, .. }
            | RegistryEvent::ConnectionLost { at, .. } => *at,
            RegistryEvent::Tick { now } => *now,
        }
    }
}

/// What the agent must do after an event, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Effect {
    /// Open a discovery stream with the handler for the Configuration.
    Connect { key: HandlerKey, config: ConfigKey },
    /// Close the stream (or cancel the attempt) for the pair; no-op if none.
    Disconnect { key: HandlerKey, config: ConfigKey },
    /// The handler was dropped from the registry (and from persisted
    /// registrations).
    Removed { key: HandlerKey },
}

#[derive(Debug, Clone)]
struct Slot {
    info: HandlerInfo,
    /// `Connect` emitted, outcome unknown.
    pending: BTreeSet<ConfigKey>,
    /// Failed or lost, to be retried on a tick.
    lost: BTreeSet<ConfigKey>,
    /// Time of the last `Connect` emitted or the last failure reported.
    last_attempt: Millis,
}

impl Slot {
    fn new(key: HandlerKey, shared: bool, at: Millis) -> Self {
        Self {
            info: HandlerInfo {
                key,
                shared,
                state: HandlerState::Waiting,
                configurations: BTreeSet::new(),
            },
            pending: BTreeSet::new(),
            lost: BTreeSet::new(),
            last_attempt: at,
        }
    }

    /// Recompute the state after connections were released.
    fn settle(&mut self) {
        let outstanding = !self.lost.is_empty() || !self.pending.is_empty();
        if matches!(self.info.state, HandlerState::Offline { .. }) && outstanding {
            return;
        }
        self.info.state = if self.info.configurations.is_empty() {
            HandlerState::Waiting
        } else {
            HandlerState::Active
        };
    }

    fn connect(&mut self, config: &ConfigKey, at: Millis, fx: &mut Vec<Effect>) {
        self.lost.remove(config);
        self.info.configurations.remove(config);
        self.pending.insert(config.clone());
        self.last_attempt = self.last_attempt.max(at);
        fx.push(Effect::Connect {
            key: self.info.key.clone(),
            config: config.clone(),
        });
    }

    /// Drop every trace of `config`; `Disconnect` if connected or pending.
    fn release(&mut self, config: &ConfigKey, fx: &mut Vec<Effect>) -> bool {
        let connected = self.info.configurations.remove(config);
        let pending = self.pending.remove(config);
        let lost = self.lost.remove(config);
        if connected || pending {
            fx.push(Effect::Disconnect {
                key: self.info.key.clone(),
                config: config.clone(),
            });
        }
        connected || pending || lost
    }
}

/// The registry of discovery handlers. See the module documentation for the
/// exact rules.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    cfg: RegistryConfig,
    slots: BTreeMap<HandlerKey, Slot>,
    /// Live Configurations and the handler name each asks for.
    wants: BTreeMap<ConfigKey, String>,
}

impl Registry {
    pub fn new(cfg: RegistryConfig) -> Self {
        Self {
            cfg,
            slots: BTreeMap::new(),
            wants: BTreeMap::new(),
        }
    }

    pub fn config(&self) -> &RegistryConfig {
        &self.cfg
    }

    /// Feed one event; returns the effects to carry out, in order.
    pub fn apply(&mut self, ev: RegistryEvent) -> Vec<Effect> {
        let mut fx = Vec::new();
        match ev {
            RegistryEvent::Registered { key, shared, at } => {
                self.on_registered(key, shared, at, &mut fx)
            }
            RegistryEvent::ConfigurationApplied {
                config,
                handler_name,
                at,
            } => self.on_applied(config, handler_name, at, &mut fx),
            RegistryEvent::ConfigurationDeleted { config, .. } => self.on_deleted(&config, &mut fx),
            RegistryEvent::Connected { key, config, .. } => self.on_connected(key, config, &mut fx),
            RegistryEvent::ConnectionLost { key, config, at } => self.on_lost(&key, &config, at),
            RegistryEvent::Tick { now } => self.on_tick(now, &mut fx),
        }
        fx
    }

    /// All registered handlers, in key order.
    pub fn handlers(&self) -> impl Iterator<Item = &HandlerInfo> {
        self.slots.values().map(|s| &s.info)
    }

    pub fn get(&self, key: &HandlerKey) -> Option<&HandlerInfo> {
        self.slots.get(key).map(|s| &s.info)
    }

    /// What to persist so registrations survive an agent restart: replay
    /// them as `Registered` events after the restart.
    pub fn registrations(&self) -> Vec<(HandlerKey, bool)> {
        self.slots
            .values()
            .map(|s| (s.info.key.clone(), s.info.shared))
            .collect()
    }

    /// The handler name a live Configuration asks for.
    pub fn wanted_name(&self, config: &ConfigKey) -> Option<&str> {
        self.wants.get(config).map(String::as_str)
    }

    /// Live Configurations and the handler name each asks for.
    pub fn configurations(&self) -> impl Iterator<Item = (&ConfigKey, &str)> {
        self.wants.iter().map(|(c, n)| (c, n.as_str()))
    }

    /// Handlers currently connected for `config`.
    pub fn connected_for<'a>(
        &'a self,
        config: &'a ConfigKey,
    ) -> impl Iterator<Item = &'a HandlerInfo> + 'a {
        self.handlers()
            .filter(move |h| h.configurations.contains(config))
    }

    /// The earliest time at which a `Tick` can have an effect (a retry or a
    /// removal), if any: the agent can sleep until then.
    pub fn next_deadline(&self) -> Option<Millis> {
        self.slots
            .values()
            .flat_map(|s| {
                let expiry = match s.info.state {
                    HandlerState::Offline { since } => Some(Millis(
                        since
                            .0
                            .saturating_add(self.cfg.offline_grace_ms)
                            .saturating_add(1),
                    )),
                    _ => None,
                };
                let retry = (!s.lost.is_empty())
                    .then(|| Millis(s.last_attempt.0.saturating_add(self.cfg.retry_interval_ms)));
                expiry.into_iter().chain(retry)
            })
            .min()
    }

    fn wanted(&self, key: &HandlerKey, config: &ConfigKey) -> bool {
        self.wants.get(config) == Some(&key.name)
    }

    fn on_registered(&mut self, key: HandlerKey, shared: bool, at: Millis, fx: &mut Vec<Effect>) {
        if let Some(slot) = self.slots.get_mut(&key)
            && slot.info.shared == shared
        {
            // Lost pairs, and (defensively) wanted pairs held nowhere.
            for (config, name) in &self.wants {
                if *name == key.name
                    && !slot.info.configurations.contains(config)
                    && !slot.pending.contains(config)
                {
                    slot.connect(config, at, fx);
                }
            }
            slot.info.state = if slot.info.configurations.is_empty() {
                HandlerState::Waiting
            } else {
                HandlerState::Active
            };
            return;
        }
        if let Some(old) = self.slots.remove(&key) {
            for config in old.info.configurations.iter().chain(old.pending.iter()) {
                fx.push(Effect::Disconnect {
                    key: key.clone(),
                    config: config.clone(),
                });
            }
        }
        let mut slot = Slot::new(key.clone(), shared, at);
        for (config, name) in &self.wants {
            if *name == key.name {
                slot.connect(config, at, fx);
            }
        }
        self.slots.insert(key, slot);
    }

    fn on_applied(&mut self, config: ConfigKey, name: String, at: Millis, fx: &mut Vec<Effect>) {
        let mut touched = BTreeSet::new();
        for (key, slot) in &mut self.slots {
            if slot.release(&config, fx) {
                touched.insert(key.clone());
            }
        }
        for (key, slot) in &mut self.slots {
            if key.name == name {
                slot.connect(&config, at, fx);
                touched.insert(key.clone());
            }
        }
        self.wants.insert(config, name);
        for key in &touched {
            if let Some(slot) = self.slots.get_mut(key) {
                slot.settle();
            }
        }
    }

    fn on_deleted(&mut self, config: &ConfigKey, fx: &mut Vec<Effect>) {
        self.wants.remove(config);
        for slot in self.slots.values_mut() {
            if slot.release(config, fx) {
                slot.settle();
            }
        }
    }

    fn on_connected(&mut self, key: HandlerKey, config: ConfigKey, fx: &mut Vec<Effect>) {
        let wanted = self.wanted(&key, &config);
        match self.slots.get_mut(&key) {
            Some(slot) if wanted => {
                slot.pending.remove(&config);
                slot.lost.remove(&config);
                slot.info.configurations.insert(config);
                slot.info.state = HandlerState::Active;
            }
            _ => fx.push(Effect::Disconnect { key, config }),
        }
    }

    fn on_lost(&mut self, key: &HandlerKey, config: &ConfigKey, at: Millis) {
        if !self.wanted(key, config) {
            return;
        }
        if let Some(slot) = self.slots.get_mut(key) {
            slot.info.configurations.remove(config);
            slot.pending.remove(config);
            slot.lost.insert(config.clone());
            slot.last_attempt = slot.last_attempt.max(at);
            if !matches!(slot.info.state, HandlerState::Offline { .. }) {
                slot.info.state = HandlerState::Offline { since: at };
            }
        }
    }

    fn on_tick(&mut self, now: Millis, fx: &mut Vec<Effect>) {
        let grace = self.cfg.offline_grace_ms;
        let expired: Vec<HandlerKey> = self
            .slots
            .iter()
            .filter(|(_, s)| match s.info.state {
                HandlerState::Offline { since } => now.since(since) > grace,
                _ => false,
            })
            .map(|(k, _)| k.clone())
            .collect();
        for key in expired {
            if let Some(slot) = self.slots.remove(&key) {
                for config in slot.info.configurations.iter().chain(slot.pending.iter()) {
                    fx.push(Effect::Disconnect {
                        key: key.clone(),
                        config: config.clone(),
                    });
                }
                fx.push(Effect::Removed { key });
            }
        }
        let retry = self.cfg.retry_interval_ms;
        for slot in self.slots.values_mut() {
            if !slot.lost.is_empty() && now.since(slot.last_attempt) >= retry {
                let lost = std::mem::take(&mut slot.lost);
                for config in &lost {
                    slot.connect(config, now, fx);
                }
                slot.last_attempt = now;
            }
        }
    }

    /// Check the bookkeeping invariants described in the module docs.
    #[cfg(test)]
    fn check_invariants(&self) -> Result<(), String> {
        for slot in self.slots.values() {
            let key = &slot.info.key;
            for (config, name) in &self.wants {
                let n = usize::from(slot.info.configurations.contains(config))
                    + usize::from(slot.pending.contains(config))
                    + usize::from(slot.lost.contains(config));
                let expected = usize::from(*name == key.name);
                if n != expected {
                    return Err(format!("{key}: pair with {config} held {n} times"));
                }
            }
            for config in slot
                .info
                .configurations
                .iter()
                .chain(&slot.pending)
                .chain(&slot.lost)
            {
                if !self.wanted(key, config) {
                    return Err(format!("{key}: keeps unwanted {config}"));
                }
            }
            if slot.info.state == HandlerState::Active && slot.info.configurations.is_empty() {
                return Err(format!("{key}: Active without configurations"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
