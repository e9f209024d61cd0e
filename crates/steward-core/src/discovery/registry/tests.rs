use std::collections::BTreeSet;

use proptest::prelude::*;

use super::*;
use crate::discovery::Endpoint;

fn uds(name: &str, path: &str) -> HandlerKey {
    HandlerKey {
        name: name.to_owned(),
        endpoint: Endpoint::Uds(path.to_owned()),
    }
}

fn embedded(name: &str) -> HandlerKey {
    HandlerKey {
        name: name.to_owned(),
        endpoint: Endpoint::Embedded,
    }
}

fn cfg(name: &str) -> ConfigKey {
    ConfigKey::new("ns", name)
}

fn registry() -> Registry {
    Registry::new(RegistryConfig::default())
}

fn register(r: &mut Registry, key: &HandlerKey, at: u64) -> Vec<Effect> {
    r.apply(RegistryEvent::Registered {
        key: key.clone(),
        shared: false,
        at: Millis(at),
    })
}

fn apply_config(r: &mut Registry, config: &ConfigKey, name: &str, at: u64) -> Vec<Effect> {
    r.apply(RegistryEvent::ConfigurationApplied {
        config: config.clone(),
        handler_name: name.to_owned(),
        at: Millis(at),
    })
}

fn connected(r: &mut Registry, key: &HandlerKey, config: &ConfigKey, at: u64) -> Vec<Effect> {
    r.apply(RegistryEvent::Connected {
        key: key.clone(),
        config: config.clone(),
        at: Millis(at),
    })
}

fn lost(r: &mut Registry, key: &HandlerKey, config: &ConfigKey, at: u64) -> Vec<Effect> {
    r.apply(RegistryEvent::ConnectionLost {
        key: key.clone(),
        config: config.clone(),
        at: Millis(at),
    })
}

fn tick(r: &mut Registry, now: u64) -> Vec<Effect> {
    r.apply(RegistryEvent::Tick { now: Millis(now) })
}

fn connect(key: &HandlerKey, config: &ConfigKey) -> Effect {
    Effect::Connect {
        key: key.clone(),
        config: config.clone(),
    }
}

fn disconnect(key: &HandlerKey, config: &ConfigKey) -> Effect {
    Effect::Disconnect {
        key: key.clone(),
        config: config.clone(),
    }
}

fn state(r: &Registry, key: &HandlerKey) -> Option<HandlerState> {
    r.get(key).map(|h| h.state)
}

/// A registry with `udev@unix:a` connected for `ns/c1`.
fn active_udev() -> (Registry, HandlerKey, ConfigKey) {
    let mut r = registry();
    let key = uds("udev", "a");
    let c1 = cfg("c1");
    register(&mut r, &key, 0);
    apply_config(&mut r, &c1, "udev", 0);
    connected(&mut r, &key, &c1, 0);
    (r, key, c1)
}

#[test]
fn registered_handler_is_waiting() {
    let mut r = registry();
    let key = uds("udev", "a");
    let fx = register(&mut r, &key, 10);
    assert!(fx.is_empty());
    let info = r.get(&key).cloned();
    assert_eq!(
        info,
        Some(HandlerInfo {
            key: key.clone(),
            shared: false,
            state: HandlerState::Waiting,
            configurations: BTreeSet::new(),
        })
    );
    assert_eq!(r.registrations(), vec![(key, false)]);
}

#[test]
fn registration_connects_for_configurations_asking_for_its_name() {
    let mut r = registry();
    let (c1, c2, c3) = (cfg("c1"), cfg("c2"), cfg("c3"));
    assert!(apply_config(&mut r, &c1, "udev", 0).is_empty());
    assert!(apply_config(&mut r, &c2, "onvif", 0).is_empty());
    assert!(apply_config(&mut r, &c3, "udev", 0).is_empty());
    let key = uds("udev", "a");
    let fx = register(&mut r, &key, 1);
    assert_eq!(fx, vec![connect(&key, &c1), connect(&key, &c3)]);
    assert_eq!(state(&r, &key), Some(HandlerState::Waiting));
}

#[test]
fn connected_makes_handler_active() {
    let (r, key, c1) = active_udev();
    let info = r.get(&key).cloned();
    assert_eq!(info.as_ref().map(|h| h.state), Some(HandlerState::Active));
    assert_eq!(
        info.map(|h| h.configurations),
        Some(BTreeSet::from([c1.clone()]))
    );
    assert_eq!(r.connected_for(&c1).count(), 1);
}

#[test]
fn connection_lost_makes_handler_offline_since_the_loss() {
    let (mut r, key, c1) = active_udev();
    assert!(lost(&mut r, &key, &c1, 1_000).is_empty());
    assert_eq!(
        state(&r, &key),
        Some(HandlerState::Offline {
            since: Millis(1_000)
        })
    );
    assert_eq!(r.get(&key).map(|h| h.configurations.len()), Some(0));
    // A later failure does not move `since`.
    lost(&mut r, &key, &c1, 2_000);
    assert_eq!(
        state(&r, &key),
        Some(HandlerState::Offline {
            since: Millis(1_000)
        })
    );
}

#[test]
fn unreachable_on_first_connect_is_offline() {
    let mut r = registry();
    let key = uds("udev", "a");
    let c1 = cfg("c1");
    register(&mut r, &key, 0);
    assert_eq!(
        apply_config(&mut r, &c1, "udev", 5),
        vec![connect(&key, &c1)]
    );
    lost(&mut r, &key, &c1, 7);
    assert_eq!(
        state(&r, &key),
        Some(HandlerState::Offline { since: Millis(7) })
    );
}

#[test]
fn offline_handler_is_retried_every_retry_interval() {
    let (mut r, key, c1) = active_udev();
    lost(&mut r, &key, &c1, 1_000);
    assert!(tick(&mut r, 5_999).is_empty());
    assert_eq!(tick(&mut r, 6_000), vec![connect(&key, &c1)]);
    // The retry is in flight: no second Connect.
    assert!(tick(&mut r, 20_000).is_empty());
    lost(&mut r, &key, &c1, 20_100);
    assert!(tick(&mut r, 25_099).is_empty());
    assert_eq!(tick(&mut r, 25_100), vec![connect(&key, &c1)]);
    assert_eq!(
        state(&r, &key),
        Some(HandlerState::Offline {
            since: Millis(1_000)
        })
    );
    connected(&mut r, &key, &c1, 25_200);
    assert_eq!(state(&r, &key), Some(HandlerState::Active));
}

#[test]
fn offline_handler_is_removed_after_five_minutes() {
    let mut r = registry();
    let key = uds("udev", "a");
    let (c1, c2) = (cfg("c1"), cfg("c2"));
    register(&mut r, &key, 0);
    apply_config(&mut r, &c1, "udev", 0);
    apply_config(&mut r, &c2, "udev", 0);
    connected(&mut r, &key, &c1, 0);
    connected(&mut r, &key, &c2, 0);
    lost(&mut r, &key, &c1, 1_000);
    // Offline for exactly the grace period: kept.
    let fx = tick(&mut r, 301_000);
    assert!(!fx.contains(&Effect::Removed { key: key.clone() }));
    assert!(r.get(&key).is_some());
    // One millisecond more: removed, with its connections closed first.
    let fx = tick(&mut r, 301_001);
    assert_eq!(fx.last(), Some(&Effect::Removed { key: key.clone() }));
    assert!(fx.contains(&disconnect(&key, &c2)));
    assert!(!fx.iter().any(|e| matches!(e, Effect::Connect { .. })));
    assert!(r.get(&key).is_none());
    assert_eq!(r.handlers().count(), 0);
    assert!(r.registrations().is_empty());
    // The Configurations still ask for udev: a new registration connects.
    assert_eq!(
        register(&mut r, &key, 400_000),
        vec![connect(&key, &c1), connect(&key, &c2)]
    );
}

#[test]
fn reconnect_within_grace_cancels_removal() {
    let (mut r, key, c1) = active_udev();
    lost(&mut r, &key, &c1, 0);
    connected(&mut r, &key, &c1, 10_000);
    let fx = tick(&mut r, 1_000_000);
    assert!(fx.is_empty());
    assert_eq!(state(&r, &key), Some(HandlerState::Active));
}

#[test]
fn configuration_deleted_drops_connections_and_returns_to_waiting() {
    let mut r = registry();
    let (a, b) = (uds("udev", "a"), uds("udev", "b"));
    let c1 = cfg("c1");
    register(&mut r, &a, 0);
    register(&mut r, &b, 0);
    apply_config(&mut r, &c1, "udev", 0);
    connected(&mut r, &a, &c1, 1);
    connected(&mut r, &b, &c1, 1);
    let fx = r.apply(RegistryEvent::ConfigurationDeleted {
        config: c1.clone(),
        at: Millis(2),
    });
    assert_eq!(fx, vec![disconnect(&a, &c1), disconnect(&b, &c1)]);
    for key in [&a, &b] {
        assert_eq!(state(&r, key), Some(HandlerState::Waiting));
        assert_eq!(r.get(key).map(|h| h.configurations.len()), Some(0));
    }
    assert_eq!(r.wanted_name(&c1), None);
    // Nothing asks for udev any more: registration stays, nothing expires.
    assert!(tick(&mut r, 10_000_000).is_empty());
    assert_eq!(r.handlers().count(), 2);
}

#[test]
fn configuration_deleted_keeps_other_connections_active() {
    let (mut r, key, c1) = active_udev();
    let c2 = cfg("c2");
    apply_config(&mut r, &c2, "udev", 1);
    connected(&mut r, &key, &c2, 2);
    r.apply(RegistryEvent::ConfigurationDeleted {
        config: c1,
        at: Millis(3),
    });
    assert_eq!(state(&r, &key), Some(HandlerState::Active));
    assert_eq!(
        r.get(&key).map(|h| h.configurations.clone()),
        Some(BTreeSet::from([c2]))
    );
}

#[test]
fn offline_handler_with_nothing_wanted_goes_back_to_waiting() {
    let (mut r, key, c1) = active_udev();
    lost(&mut r, &key, &c1, 100);
    let fx = r.apply(RegistryEvent::ConfigurationDeleted {
        config: c1,
        at: Millis(200),
    });
    // The pair was lost, not connected: nothing to close.
    assert!(fx.is_empty());
    assert_eq!(state(&r, &key), Some(HandlerState::Waiting));
    assert!(tick(&mut r, 1_000_000).is_empty());
    assert!(r.get(&key).is_some());
}

#[test]
fn offline_handler_stays_offline_while_other_configurations_fail() {
    let mut r = registry();
    let key = uds("udev", "a");
    let (c1, c2) = (cfg("c1"), cfg("c2"));
    register(&mut r, &key, 0);
    apply_config(&mut r, &c1, "udev", 0);
    apply_config(&mut r, &c2, "udev", 0);
    lost(&mut r, &key, &c1, 10);
    lost(&mut r, &key, &c2, 20);
    r.apply(RegistryEvent::ConfigurationDeleted {
        config: c1,
        at: Millis(30),
    });
    assert_eq!(
        state(&r, &key),
        Some(HandlerState::Offline { since: Millis(10) })
    );
    assert_eq!(tick(&mut r, 5_020), vec![connect(&key, &c2)]);
}

#[test]
fn two_handlers_with_one_name_are_both_used() {
    let mut r = registry();
    let (a, b, e) = (uds("udev", "a"), uds("udev", "b"), embedded("udev"));
    let other = uds("onvif", "o");
    for key in [&a, &b, &e, &other] {
        register(&mut r, key, 0);
    }
    let c1 = cfg("c1");
    let fx = apply_config(&mut r, &c1, "udev", 1);
    let mut expected = vec![connect(&a, &c1), connect(&b, &c1), connect(&e, &c1)];
    expected.sort_by(|x, y| format!("{x:?}").cmp(&format!("{y:?}")));
    let mut got = fx.clone();
    got.sort_by(|x, y| format!("{x:?}").cmp(&format!("{y:?}")));
    assert_eq!(got, expected);
    for key in [&a, &b, &e] {
        connected(&mut r, key, &c1, 2);
        assert_eq!(state(&r, key), Some(HandlerState::Active));
    }
    assert_eq!(state(&r, &other), Some(HandlerState::Waiting));
    assert_eq!(r.connected_for(&c1).count(), 3);
}

#[test]
fn re_registration_of_a_connected_handler_changes_nothing() {
    let (mut r, key, c1) = active_udev();
    let c2 = cfg("c2");
    let c3 = cfg("c3");
    apply_config(&mut r, &c2, "udev", 1);
    connected(&mut r, &key, &c2, 2);
    apply_config(&mut r, &c3, "udev", 3); // pending
    let before = r.get(&key).cloned();
    assert_eq!(register(&mut r, &key, 10), vec![]);
    assert_eq!(r.get(&key).cloned(), before);
    assert_eq!(state(&r, &key), Some(HandlerState::Active));
    // The pending attempt is still the one in flight.
    connected(&mut r, &key, &c3, 11);
    assert_eq!(r.connected_for(&c1).count(), 1);
    assert_eq!(r.get(&key).map(|h| h.configurations.len()), Some(3));
}

#[test]
fn re_registration_connects_only_lost_pairs_at_once() {
    let (mut r, key, c1) = active_udev();
    let c2 = cfg("c2");
    apply_config(&mut r, &c2, "udev", 1);
    connected(&mut r, &key, &c2, 2);
    lost(&mut r, &key, &c2, 3);
    assert_eq!(
        state(&r, &key),
        Some(HandlerState::Offline { since: Millis(3) })
    );
    // Well within the retry interval: the registration itself retries.
    assert_eq!(register(&mut r, &key, 4), vec![connect(&key, &c2)]);
    assert_eq!(state(&r, &key), Some(HandlerState::Active));
    assert_eq!(tick(&mut r, 4 + 5_000), vec![], "nothing left to retry");
    connected(&mut r, &key, &c2, 5);
    assert_eq!(r.connected_for(&c1).count(), 1);
    assert_eq!(r.connected_for(&c2).count(), 1);
}

#[test]
fn waiting_handler_registering_again_stays_waiting() {
    let mut r = registry();
    let key = uds("udev", "a");
    register(&mut r, &key, 0);
    apply_config(&mut r, &cfg("c1"), "onvif", 0);
    assert_eq!(register(&mut r, &key, 1), vec![]);
    assert_eq!(state(&r, &key), Some(HandlerState::Waiting));
}

#[test]
fn changed_registration_resets_to_waiting_and_connects_again() {
    let (mut r, key, c1) = active_udev();
    let fx = r.apply(RegistryEvent::Registered {
        key: key.clone(),
        shared: true,
        at: Millis(50),
    });
    assert_eq!(fx, vec![disconnect(&key, &c1), connect(&key, &c1)]);
    let info = r.get(&key).cloned();
    assert_eq!(info.as_ref().map(|h| h.state), Some(HandlerState::Waiting));
    assert_eq!(info.as_ref().map(|h| h.shared), Some(true));
    assert_eq!(info.map(|h| h.configurations.len()), Some(0));
    assert_eq!(r.registrations(), vec![(key.clone(), true)]);
    connected(&mut r, &key, &c1, 60);
    assert_eq!(state(&r, &key), Some(HandlerState::Active));
}

#[test]
fn re_registration_clears_offline() {
    let (mut r, key, c1) = active_udev();
    lost(&mut r, &key, &c1, 100);
    let fx = register(&mut r, &key, 200);
    assert_eq!(fx, vec![connect(&key, &c1)]);
    assert_eq!(state(&r, &key), Some(HandlerState::Waiting));
    // The old Offline period no longer counts.
    assert!(
        !tick(&mut r, 300_150)
            .iter()
            .any(|e| matches!(e, Effect::Removed { .. }))
    );
}

#[test]
fn configuration_switch_disconnects_old_handler_and_connects_new() {
    let (mut r, udev, c1) = active_udev();
    let onvif = uds("onvif", "o");
    register(&mut r, &onvif, 0);
    let fx = apply_config(&mut r, &c1, "onvif", 10);
    assert_eq!(fx, vec![disconnect(&udev, &c1), connect(&onvif, &c1)]);
    assert_eq!(state(&r, &udev), Some(HandlerState::Waiting));
    assert_eq!(r.wanted_name(&c1), Some("onvif"));
    // A late success of the old handler is refused.
    assert_eq!(
        connected(&mut r, &udev, &c1, 11),
        vec![disconnect(&udev, &c1)]
    );
    assert_eq!(state(&r, &udev), Some(HandlerState::Waiting));
}

#[test]
fn configuration_reapplied_with_same_name_restarts_discovery() {
    let (mut r, key, c1) = active_udev();
    let fx = apply_config(&mut r, &c1, "udev", 10);
    assert_eq!(fx, vec![disconnect(&key, &c1), connect(&key, &c1)]);
    assert_eq!(state(&r, &key), Some(HandlerState::Waiting));
    connected(&mut r, &key, &c1, 11);
    assert_eq!(state(&r, &key), Some(HandlerState::Active));
}

#[test]
fn configuration_reapplied_keeps_offline_since() {
    let (mut r, key, c1) = active_udev();
    lost(&mut r, &key, &c1, 1_000);
    let fx = apply_config(&mut r, &c1, "udev", 2_000);
    // The pair was lost (nothing to close); the new details are tried now.
    assert_eq!(fx, vec![connect(&key, &c1)]);
    assert_eq!(
        state(&r, &key),
        Some(HandlerState::Offline {
            since: Millis(1_000)
        })
    );
}

#[test]
fn stale_outcomes_do_not_change_state() {
    let (mut r, key, c1) = active_udev();
    let stranger = uds("udev", "zzz");
    assert_eq!(
        connected(&mut r, &stranger, &c1, 1),
        vec![disconnect(&stranger, &c1)]
    );
    assert!(r.get(&stranger).is_none());
    let c9 = cfg("c9");
    assert_eq!(connected(&mut r, &key, &c9, 1), vec![disconnect(&key, &c9)]);
    assert!(lost(&mut r, &key, &c9, 2).is_empty());
    assert_eq!(state(&r, &key), Some(HandlerState::Active));
    assert_eq!(
        r.get(&key).map(|h| h.configurations.clone()),
        Some(BTreeSet::from([c1]))
    );
}

#[test]
fn embedded_handler_registers_like_any_other() {
    let mut r = registry();
    let key = embedded("debug-echo");
    let c1 = cfg("c1");
    apply_config(&mut r, &c1, "debug-echo", 0);
    assert_eq!(
        r.apply(RegistryEvent::Registered {
            key: key.clone(),
            shared: true,
            at: Millis(0)
        }),
        vec![connect(&key, &c1)]
    );
    connected(&mut r, &key, &c1, 1);
    assert_eq!(state(&r, &key), Some(HandlerState::Active));
    assert_eq!(r.registrations(), vec![(key, true)]);
}

#[test]
fn registrations_replay_into_an_identical_registry() {
    let mut r = registry();
    let keys = [uds("udev", "a"), embedded("udev"), uds("onvif", "b")];
    for (i, key) in keys.iter().enumerate() {
        r.apply(RegistryEvent::Registered {
            key: key.clone(),
            shared: i % 2 == 0,
            at: Millis(0),
        });
    }
    let saved = r.registrations();
    assert_eq!(saved.len(), 3);
    let mut restarted = registry();
    for (key, shared) in saved.clone() {
        restarted.apply(RegistryEvent::Registered {
            key,
            shared,
            at: Millis(99),
        });
    }
    assert_eq!(restarted.registrations(), saved);
    assert!(
        restarted
            .handlers()
            .all(|h| h.state == HandlerState::Waiting)
    );
}

#[test]
fn next_deadline_tracks_retries_and_expiry() {
    let (mut r, key, c1) = active_udev();
    assert_eq!(r.next_deadline(), None);
    lost(&mut r, &key, &c1, 1_000);
    assert_eq!(r.next_deadline(), Some(Millis(6_000)));
    tick(&mut r, 6_000);
    // Retry in flight: only the expiry is left.
    assert_eq!(r.next_deadline(), Some(Millis(301_001)));
}

#[test]
fn custom_timing_is_honoured() {
    let mut r = Registry::new(RegistryConfig {
        offline_grace_ms: 10,
        retry_interval_ms: 3,
    });
    let key = uds("udev", "a");
    let c1 = cfg("c1");
    register(&mut r, &key, 0);
    apply_config(&mut r, &c1, "udev", 0);
    lost(&mut r, &key, &c1, 0);
    assert_eq!(tick(&mut r, 3), vec![connect(&key, &c1)]);
    assert_eq!(
        tick(&mut r, 11),
        vec![disconnect(&key, &c1), Effect::Removed { key }]
    );
}

#[test]
fn display_forms() {
    assert_eq!(cfg("c1").to_string(), "ns/c1");
    assert_eq!(uds("udev", "/s").to_string(), "udev@unix:/s");
    assert_eq!(embedded("udev").to_string(), "udev@embedded");
    assert_eq!(
        HandlerState::Offline { since: Millis(5) }.to_string(),
        "Offline(since 5ms)"
    );
    assert_eq!(RegistryConfig::default().offline_grace_ms, 300_000);
    assert_eq!(RegistryConfig::default().retry_interval_ms, 5_000);
}

// ---------------------------------------------------------------------------
// Property tests: random event sequences.

fn handler_pool() -> Vec<HandlerKey> {
    vec![
        embedded("udev"),
        uds("udev", "a"),
        uds("udev", "b"),
        uds("onvif", "c"),
        HandlerKey {
            name: "onvif".to_owned(),
            endpoint: Endpoint::Network("http://h:1".to_owned()),
        },
    ]
}

const NAMES: [&str; 3] = ["udev", "onvif", "opcua"];
const CONFIGS: usize = 3;

#[derive(Debug, Clone)]
enum Step {
    Register {
        h: usize,
        shared: bool,
    },
    Apply {
        c: usize,
        name: usize,
    },
    Delete {
        c: usize,
    },
    /// `Connected` for one of the attempts the agent has in flight.
    Ack(usize),
    /// `ConnectionLost` for one of the attempts in flight.
    Fail(usize),
    /// `ConnectionLost` for one established connection.
    Drop(usize),
    /// Outcomes nobody asked for.
    StrayConnected {
        h: usize,
        c: usize,
    },
    StrayLost {
        h: usize,
        c: usize,
    },
    Tick,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        2 => (0..5usize, any::<bool>()).prop_map(|(h, shared)| Step::Register { h, shared }),
        2 => (0..CONFIGS, 0..NAMES.len()).prop_map(|(c, name)| Step::Apply { c, name }),
        1 => (0..CONFIGS).prop_map(|c| Step::Delete { c }),
        4 => any::<usize>().prop_map(Step::Ack),
        2 => any::<usize>().prop_map(Step::Fail),
        2 => any::<usize>().prop_map(Step::Drop),
        1 => (0..5usize, 0..CONFIGS).prop_map(|(h, c)| Step::StrayConnected { h, c }),
        1 => (0..5usize, 0..CONFIGS).prop_map(|(h, c)| Step::StrayLost { h, c }),
        4 => Just(Step::Tick),
    ]
}

fn delta() -> impl Strategy<Value = u64> {
    prop_oneof![4 => 0u64..7_000, 1 => 250_000u64..350_000]
}

/// What the agent would have in flight, driven by effects.
#[derive(Default)]
struct Agent {
    in_flight: Vec<(HandlerKey, ConfigKey)>,
}

impl Agent {
    fn observe(&mut self, fx: &[Effect]) {
        for e in fx {
            match e {
                Effect::Connect { key, config } => {
                    self.in_flight
                        .retain(|p| p != &(key.clone(), config.clone()));
                    self.in_flight.push((key.clone(), config.clone()));
                }
                Effect::Disconnect { key, config } => {
                    self.in_flight
                        .retain(|p| p != &(key.clone(), config.clone()));
                }
                Effect::Removed { key } => self.in_flight.retain(|p| &p.0 != key),
            }
        }
    }

    fn take(&mut self, i: usize) -> Option<(HandlerKey, ConfigKey)> {
        if self.in_flight.is_empty() {
            None
        } else {
            let n = self.in_flight.len();
            Some(self.in_flight.remove(i % n))
        }
    }
}

fn event_for(step: &Step, now: Millis, r: &Registry, agent: &mut Agent) -> Option<RegistryEvent> {
    let pool = handler_pool();
    let config = |c: usize| cfg(&format!("c{c}"));
    Some(match step {
        Step::Register { h, shared } => RegistryEvent::Registered {
            key: pool[*h].clone(),
            shared: *shared,
            at: now,
        },
        Step::Apply { c, name } => RegistryEvent::ConfigurationApplied {
            config: config(*c),
            handler_name: NAMES[*name].to_owned(),
            at: now,
        },
        Step::Delete { c } => RegistryEvent::ConfigurationDeleted {
            config: config(*c),
            at: now,
        },
        Step::Ack(i) => {
            let (key, config) = agent.take(*i)?;
            RegistryEvent::Connected {
                key,
                config,
                at: now,
            }
        }
        Step::Fail(i) => {
            let (key, config) = agent.take(*i)?;
            RegistryEvent::ConnectionLost {
                key,
                config,
                at: now,
            }
        }
        Step::Drop(i) => {
            let pairs: Vec<(HandlerKey, ConfigKey)> = r
                .handlers()
                .flat_map(|h| h.configurations.iter().map(|c| (h.key.clone(), c.clone())))
                .collect();
            if pairs.is_empty() {
                return None;
            }
            let (key, config) = pairs[i % pairs.len()].clone();
            RegistryEvent::ConnectionLost {
                key,
                config,
                at: now,
            }
        }
        Step::StrayConnected { h, c } => RegistryEvent::Connected {
            key: pool[*h].clone(),
            config: config(*c),
            at: now,
        },
        Step::StrayLost { h, c } => RegistryEvent::ConnectionLost {
            key: pool[*h].clone(),
            config: config(*c),
            at: now,
        },
        Step::Tick => RegistryEvent::Tick { now },
    })
}

fn check_step(
    r: &Registry,
    before: &[HandlerInfo],
    ev: &RegistryEvent,
    fx: &[Effect],
) -> Result<(), TestCaseError> {
    r.check_invariants().map_err(TestCaseError::fail)?;
    for h in r.handlers() {
        match h.state {
            HandlerState::Active => prop_assert!(!h.configurations.is_empty(), "{h:?}"),
            HandlerState::Waiting => prop_assert!(h.configurations.is_empty(), "{h:?}"),
            HandlerState::Offline { .. } => {}
        }
        for c in &h.configurations {
            prop_assert_eq!(r.wanted_name(c), Some(h.key.name.as_str()));
        }
    }
    let mut removed = BTreeSet::new();
    for e in fx {
        match e {
            Effect::Connect { key, config } => {
                prop_assert!(r.get(key).is_some(), "Connect for unregistered {key}");
                prop_assert_eq!(r.wanted_name(config), Some(key.name.as_str()));
                prop_assert!(!removed.contains(key), "Connect after Removed");
            }
            Effect::Disconnect { key, .. } => {
                prop_assert!(!removed.contains(key), "Disconnect after Removed");
            }
            Effect::Removed { key } => {
                prop_assert!(r.get(key).is_none(), "removed {key} still listed");
                prop_assert!(r.handlers().all(|h| &h.key != key));
                prop_assert!(r.registrations().iter().all(|(k, _)| k != key));
                removed.insert(key.clone());
            }
        }
    }
    match ev {
        RegistryEvent::Tick { now } => {
            let grace = r.config().offline_grace_ms;
            let mut expired = BTreeSet::new();
            for h in before {
                let gone = r.get(&h.key).is_none();
                match h.state {
                    HandlerState::Offline { since } => {
                        let late = now.since(since) > grace;
                        prop_assert_eq!(gone, late, "{:?} at {:?}", h, now);
                        if late {
                            expired.insert(h.key.clone());
                        }
                    }
                    _ => prop_assert!(!gone, "{:?} removed while not Offline", h),
                }
            }
            prop_assert_eq!(&removed, &expired);
            for h in r.handlers() {
                if let HandlerState::Offline { since } = h.state {
                    prop_assert!(now.since(since) <= grace);
                }
            }
        }
        RegistryEvent::ConfigurationDeleted { config, .. } => {
            prop_assert!(r.handlers().all(|h| !h.configurations.contains(config)));
            prop_assert!(r.wanted_name(config).is_none());
            prop_assert!(
                !fx.iter().any(|e| matches!(e, Effect::Connect { .. })),
                "Connect on deletion"
            );
        }
        _ => prop_assert!(removed.is_empty(), "only ticks remove handlers"),
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_event_sequences_keep_registry_invariants(
        steps in prop::collection::vec((step(), delta()), 1..80)
    ) {
        let mut r = registry();
        let mut agent = Agent::default();
        let mut now = Millis(0);
        for (step, dt) in &steps {
            now = Millis(now.0 + dt);
            let Some(ev) = event_for(step, now, &r, &mut agent) else { continue };
            let before: Vec<HandlerInfo> = r.handlers().cloned().collect();
            let fx = r.apply(ev.clone());
            agent.observe(&fx);
            check_step(&r, &before, &ev, &fx)?;
        }
    }

    #[test]
    fn every_wanted_pair_is_eventually_attempted(
        steps in prop::collection::vec((step(), delta()), 1..60)
    ) {
        // Whatever happened, one tick a retry interval later leaves every
        // wanted pair of every registered handler connected or in flight.
        let mut r = registry();
        let mut agent = Agent::default();
        let mut now = Millis(0);
        for (step, dt) in &steps {
            now = Millis(now.0 + dt);
            if let Some(ev) = event_for(step, now, &r, &mut agent) {
                let fx = r.apply(ev);
                agent.observe(&fx);
            }
        }
        let retry = r.config().retry_interval_ms;
        let fx = tick(&mut r, now.0 + retry);
        agent.observe(&fx);
        let wants: Vec<(ConfigKey, String)> = r
            .configurations()
            .map(|(c, n)| (c.clone(), n.to_owned()))
            .collect();
        for h in r.handlers() {
            for (c, n) in &wants {
                if *n == h.key.name {
                    let pair = (h.key.clone(), c.clone());
                    prop_assert!(
                        h.configurations.contains(c) || agent.in_flight.contains(&pair),
                        "{} / {} neither connected nor attempted", h.key, c
                    );
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Akri's handlers register again whenever a stream they serve closes. Fed
// back into the registry, that must come to rest: no registration may lead
// to another closed stream of a wanted pair.

/// An agent that opens every stream asked for at once, with handlers that
/// register again (same flag) once per closed open stream, run until
/// nothing moves. Returns the registrations it made, or `None` when it does
/// not come to rest within `limit` events (a registration storm).
fn run_akri_loop(r: &mut Registry, first: RegistryEvent, limit: usize) -> Option<usize> {
    let mut queue = std::collections::VecDeque::from([first]);
    let mut open: BTreeSet<(HandlerKey, ConfigKey)> = r
        .handlers()
        .flat_map(|h| h.configurations.iter().map(|c| (h.key.clone(), c.clone())))
        .collect();
    let mut registrations = 0;
    let mut events = 0;
    while let Some(ev) = queue.pop_front() {
        events += 1;
        if events > limit {
            return None;
        }
        let now = ev.at();
        for e in r.apply(ev) {
            match e {
                Effect::Connect { key, config } => {
                    // The handler answers with its headers at once.
                    queue.push_back(RegistryEvent::Connected {
                        key,
                        config,
                        at: now,
                    });
                }
                Effect::Disconnect { key, config } => {
                    if open.remove(&(key.clone(), config)) {
                        let shared = r.get(&key).is_some_and(|h| h.shared);
                        registrations += 1;
                        queue.push_back(RegistryEvent::Registered {
                            key,
                            shared,
                            at: now,
                        });
                    }
                }
                Effect::Removed { .. } => {}
            }
        }
        open = r
            .handlers()
            .flat_map(|h| h.configurations.iter().map(|c| (h.key.clone(), c.clone())))
            .chain(open.into_iter().filter(|(k, _)| r.get(k).is_none()))
            .collect();
    }
    Some(registrations)
}

#[test]
fn akri_handler_re_registering_after_an_edit_comes_to_rest() {
    // Three Configurations on one handler, one edited (issue: 4, 9, 25, 46
    // ... registrations per 10 s, for ever).
    let mut r = registry();
    let key = uds("udev", "a");
    register(&mut r, &key, 0);
    let configs: Vec<ConfigKey> = (0..3).map(|i| cfg(&format!("c{i}"))).collect();
    for c in &configs {
        apply_config(&mut r, c, "udev", 0);
        connected(&mut r, &key, c, 0);
    }
    let edit = RegistryEvent::ConfigurationApplied {
        config: configs[1].clone(),
        handler_name: "udev".into(),
        at: Millis(10),
    };
    assert_eq!(run_akri_loop(&mut r, edit, 1_000), Some(1));
    assert_eq!(r.get(&key).map(|h| h.configurations.len()), Some(3));
    // The one registration it made changed nothing more.
    assert_eq!(register(&mut r, &key, 20), vec![]);
}

#[derive(Debug, Clone)]
enum AkriStep {
    Apply {
        c: usize,
        name: usize,
    },
    Delete {
        c: usize,
    },
    /// Every stream of one handler breaks (an agent or handler restart).
    Break {
        h: usize,
    },
}

fn akri_step() -> impl Strategy<Value = AkriStep> {
    prop_oneof![
        3 => (0..4usize, 0..2usize).prop_map(|(c, name)| AkriStep::Apply { c, name }),
        1 => (0..4usize).prop_map(|c| AkriStep::Delete { c }),
        1 => (0..3usize).prop_map(|h| AkriStep::Break { h }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever Configurations do, handlers that register again on every
    /// closed stream come to rest, with one registration at most per
    /// stream closed, and every wanted pair connected.
    #[test]
    fn akri_re_registration_never_storms(
        steps in prop::collection::vec(akri_step(), 1..40)
    ) {
        let handlers = [uds("udev", "a"), uds("udev", "b"), uds("onvif", "c")];
        let names = ["udev", "onvif"];
        let mut r = registry();
        for (i, h) in handlers.iter().enumerate() {
            run_akri_loop(&mut r, RegistryEvent::Registered {
                key: h.clone(),
                shared: i == 2,
                at: Millis(0),
            }, 1_000);
        }
        for (t, step) in steps.iter().enumerate() {
            let at = Millis(t as u64 + 1);
            let open_before: usize = r.handlers().map(|h| h.configurations.len()).sum();
            let first = match step {
                AkriStep::Apply { c, name } => RegistryEvent::ConfigurationApplied {
                    config: cfg(&format!("c{c}")),
                    handler_name: names[*name].to_owned(),
                    at,
                },
                AkriStep::Delete { c } => RegistryEvent::ConfigurationDeleted {
                    config: cfg(&format!("c{c}")),
                    at,
                },
                AkriStep::Break { h } => {
                    let key = handlers[*h].clone();
                    let pairs: Vec<ConfigKey> = r
                        .get(&key)
                        .map(|i| i.configurations.iter().cloned().collect())
                        .unwrap_or_default();
                    for c in pairs {
                        r.apply(RegistryEvent::ConnectionLost { key: key.clone(), config: c, at });
                    }
                    // Each broken stream makes the handler register once.
                    RegistryEvent::Registered { key, shared: *h == 2, at }
                }
            };
            let made = run_akri_loop(&mut r, first, 1_000);
            prop_assert!(made.is_some(), "registration storm after {:?}", step);
            prop_assert!(made.unwrap_or(0) <= open_before, "{:?}: {:?} registrations for {} streams", step, made, open_before);
            r.check_invariants().map_err(TestCaseError::fail)?;
            for h in r.handlers() {
                for (c, n) in r.configurations() {
                    if n == h.key.name {
                        prop_assert!(h.configurations.contains(c), "{} / {} not connected after {:?}", h.key, c, step);
                    }
                }
            }
        }
    }
}
