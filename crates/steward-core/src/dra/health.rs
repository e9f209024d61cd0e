//! A device's own health as its discovery handler reports it, and the
//! device taints steward publishes for it and for held slots.
//!
//! A discovery handler speaks Akri's discovery protocol, whose `Device`
//! has an id, properties, mounts and device specs — no health. So health
//! travels as one property, [`HEALTH_PROPERTY`]: absent (every Akri
//! handler), empty or `healthy` is healthy; `transient[: reason]` and
//! `fatal[: reason]` are faults; any other value is a fatal fault with
//! that value as its reason (a handler that says something is wrong in a
//! way steward does not know is not trusted with new work). The property
//! reaches the Instance like every other, so the node publishing a
//! device's slices and the nodes reporting its health read the same value.
//!
//! * **Fatal** — the device is still there but broken (an ECC error, a
//!   firmware fault): it needs a person or a reset, so new claims must not
//!   get it. Tainted [`UNHEALTHY_TAINT_KEY`] with effect `NoSchedule`.
//! * **Transient** — the device is degraded and expected to recover by
//!   itself (a link flapping, a sensor warming up): claims may still get
//!   it, the taint (effect `None`) only says so to whoever looks.
//!
//! A device that is *missing* (discovery no longer lists it on a node) is
//! not a fault here: its Instance stops listing the node and the node
//! stops publishing it, so there is nothing to taint; the agent's health
//! stream reports it unhealthy to kubelet for the pods that still hold it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The discovery property carrying a device's health (see the module).
pub const HEALTH_PROPERTY: &str = "STEWARD_HEALTH";

/// The taint key on a device whose discovery reports a fault; the value is
/// the reason as a label value ([`DeviceFault::taint_value`]), the effect
/// the fault's kind ([`FaultKind::effect`]).
pub const UNHEALTHY_TAINT_KEY: &str = "steward.dev/unhealthy";

/// The taint key (effect `NoSchedule`) on a device whose slot is held
/// through a device plugin: the scheduler does not allocate it to a claim
/// until the slot is free (DRADeviceTaints, on by default from 1.36).
pub const HELD_TAINT_KEY: &str = "steward.dev/held";

/// The value of the [`HELD_TAINT_KEY`] taint.
pub const HELD_TAINT_VALUE: &str = "device-plugin";

/// Longest taint value the API accepts (a label value).
const MAX_TAINT_VALUE: usize = 63;
/// Longest message kubelet keeps in a device's health.
const MAX_MESSAGE: usize = 1024;

/// How bad a reported fault is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum FaultKind {
    /// Expected to clear by itself: informational taint.
    Transient,
    /// Needs attention: no new claims.
    Fatal,
}

/// A device taint's effect (`resource.k8s.io/v1` DeviceTaint `effect`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum TaintEffect {
    /// Informational: the scheduler ignores it.
    None,
    /// Not allocated to a claim that does not tolerate it.
    NoSchedule,
}

impl TaintEffect {
    /// The API's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "None",
            Self::NoSchedule => "NoSchedule",
        }
    }
}

impl FaultKind {
    /// The effect of the [`UNHEALTHY_TAINT_KEY`] taint for this kind.
    pub fn effect(self) -> TaintEffect {
        match self {
            Self::Transient => TaintEffect::None,
            Self::Fatal => TaintEffect::NoSchedule,
        }
    }

    fn word(self) -> &'static str {
        match self {
            Self::Transient => "transient",
            Self::Fatal => "fatal",
        }
    }
}

/// A fault a discovery handler reports for a device.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct DeviceFault {
    pub kind: FaultKind,
    /// The handler's words (may be empty).
    pub reason: String,
}

impl DeviceFault {
    /// The fault a [`HEALTH_PROPERTY`] value states; `None` when healthy.
    pub fn parse(value: &str) -> Option<Self> {
        let value = value.trim();
        if value.is_empty() || value.eq_ignore_ascii_case("healthy") {
            return None;
        }
        let split = value
            .find(|c: char| c == ':' || c.is_whitespace())
            .unwrap_or(value.len());
        let (word, rest) = value.split_at(split);
        let rest = rest.trim_start_matches(':').trim();
        let kind = if word.eq_ignore_ascii_case("transient") {
            FaultKind::Transient
        } else if word.eq_ignore_ascii_case("fatal") {
            FaultKind::Fatal
        } else {
            return Some(Self {
                kind: FaultKind::Fatal,
                reason: value.to_owned(),
            });
        };
        Some(Self {
            kind,
            reason: rest.to_owned(),
        })
    }

    /// The fault a device's properties state.
    pub fn of_properties(properties: &BTreeMap<String, String>) -> Option<Self> {
        properties.get(HEALTH_PROPERTY).and_then(|v| Self::parse(v))
    }

    /// The reason as a taint value (a label value: at most 63 of
    /// `[A-Za-z0-9-_.]`, alphanumeric at both ends): other characters
    /// become `-`, runs of them one; the kind's word when nothing is left.
    pub fn taint_value(&self) -> String {
        let mut out = String::new();
        for c in self.reason.chars() {
            let c = if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            };
            if c == '-' && out.ends_with('-') {
                continue;
            }
            out.push(c);
        }
        out.truncate(MAX_TAINT_VALUE);
        let trimmed = out.trim_matches(|c: char| !c.is_ascii_alphanumeric());
        if trimmed.is_empty() {
            self.kind.word().to_owned()
        } else {
            trimmed.to_owned()
        }
    }

    /// The message kubelet shows in the pod's status: the kind and the
    /// handler's reason, within kubelet's 1024 characters.
    pub fn message(&self) -> String {
        let head = format!("the device reports a {} fault", self.kind.word());
        let text = if self.reason.is_empty() {
            head
        } else {
            format!("{head}: {}", self.reason)
        };
        text.chars().take(MAX_MESSAGE).collect()
    }
}

/// One taint a published device carries.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PlannedTaint {
    pub key: String,
    pub value: String,
    pub effect: TaintEffect,
}

/// The taints of a device: [`HELD_TAINT_KEY`] when its slot (for a
/// consumable device: every slot) is held through a device plugin, and
/// [`UNHEALTHY_TAINT_KEY`] when discovery reports a fault; in key order.
pub fn device_taints(held: bool, fault: Option<&DeviceFault>) -> Vec<PlannedTaint> {
    let mut out = Vec::new();
    if held {
        out.push(PlannedTaint {
            key: HELD_TAINT_KEY.to_owned(),
            value: HELD_TAINT_VALUE.to_owned(),
            effect: TaintEffect::NoSchedule,
        });
    }
    if let Some(f) = fault {
        out.push(PlannedTaint {
            key: UNHEALTHY_TAINT_KEY.to_owned(),
            value: f.taint_value(),
            effect: f.kind.effect(),
        });
    }
    out
}

/// Whether `value` is a label value (as the API checks a taint's value).
pub fn is_label_value(value: &str) -> bool {
    let b = value.as_bytes();
    b.len() <= MAX_TAINT_VALUE
        && (b.is_empty()
            || (b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::super::{DraInstance, Layout, plan, plan_with};
    use super::*;

    fn fault(kind: FaultKind, reason: &str) -> Option<DeviceFault> {
        Some(DeviceFault {
            kind,
            reason: reason.to_owned(),
        })
    }

    #[test]
    fn the_health_property_reads_as_a_kind_and_a_reason() {
        assert_eq!(DeviceFault::parse(""), None);
        assert_eq!(DeviceFault::parse("  Healthy "), None);
        assert_eq!(
            DeviceFault::parse("FATAL ecc errors"),
            fault(FaultKind::Fatal, "ecc errors")
        );
        assert_eq!(
            DeviceFault::parse("transient: link down"),
            fault(FaultKind::Transient, "link down")
        );
        assert_eq!(
            DeviceFault::parse("Transient"),
            fault(FaultKind::Transient, "")
        );
        // Unknown words are fatal, the whole value the reason.
        assert_eq!(
            DeviceFault::parse("on fire"),
            fault(FaultKind::Fatal, "on fire")
        );
        let props = BTreeMap::from([(HEALTH_PROPERTY.to_owned(), "fatal: x".to_owned())]);
        assert_eq!(
            DeviceFault::of_properties(&props),
            fault(FaultKind::Fatal, "x")
        );
        assert_eq!(DeviceFault::of_properties(&BTreeMap::new()), None);
    }

    #[test]
    fn fatal_faults_block_scheduling_and_transient_ones_only_say_so() {
        let fatal = DeviceFault::parse("fatal: ECC error (uncorrectable)").unwrap();
        let transient = DeviceFault::parse("transient").unwrap();
        let t = device_taints(true, Some(&fatal));
        assert_eq!(
            t,
            [
                PlannedTaint {
                    key: HELD_TAINT_KEY.into(),
                    value: HELD_TAINT_VALUE.into(),
                    effect: TaintEffect::NoSchedule
                },
                PlannedTaint {
                    key: UNHEALTHY_TAINT_KEY.into(),
                    value: "ECC-error-uncorrectable".into(),
                    effect: TaintEffect::NoSchedule
                }
            ]
        );
        let t = device_taints(false, Some(&transient));
        assert_eq!(t.len(), 1);
        assert_eq!(
            (t[0].value.as_str(), t[0].effect),
            ("transient", TaintEffect::None)
        );
        assert!(device_taints(false, None).is_empty());
        assert_eq!(TaintEffect::None.as_str(), "None");
        assert_eq!(
            fatal.message(),
            "the device reports a fatal fault: ECC error (uncorrectable)"
        );
        assert_eq!(transient.message(), "the device reports a transient fault");
    }

    #[test]
    fn taint_values_are_label_values() {
        for reason in ["", "---", "é", &"x".repeat(200), "a b", "-a-", "a.-_b"] {
            let f = DeviceFault {
                kind: FaultKind::Fatal,
                reason: reason.to_owned(),
            };
            let v = f.taint_value();
            assert!(is_label_value(&v) && !v.is_empty(), "{reason:?} → {v:?}");
        }
        assert!(!is_label_value("-a"));
        assert!(!is_label_value(&"a".repeat(64)));
    }

    fn inst(name: &str, capacity: u32) -> DraInstance {
        DraInstance {
            name: name.into(),
            namespace: "default".into(),
            configuration: "cams".into(),
            capacity,
            nodes: BTreeSet::from(["n1".to_owned()]),
            properties: BTreeMap::from([("DEVNODE".into(), "/dev/video0".into())]),
            held: BTreeSet::new(),
        }
    }

    #[test]
    fn a_reported_fault_taints_every_device_of_its_instance_and_is_no_attribute() {
        let mut cams = inst("cams", 2);
        cams.held = BTreeSet::from([1]);
        cams.properties
            .insert(HEALTH_PROPERTY.into(), "fatal: ecc".into());
        let mut flaky = inst("flaky", 3);
        flaky
            .properties
            .insert(HEALTH_PROPERTY.into(), "transient".into());
        let ok = inst("ok", 1);
        let (slices, _) = plan("n1", &[cams.clone(), flaky.clone(), ok]);
        type Taints<'a> = Vec<(&'a str, &'a str, TaintEffect)>;
        let taints: Vec<(&str, Taints)> = slices[0]
            .devices
            .iter()
            .map(|d| {
                assert!(!d.attributes.contains_key(HEALTH_PROPERTY));
                (
                    d.name.as_str(),
                    d.taints
                        .iter()
                        .map(|t| (t.key.as_str(), t.value.as_str(), t.effect))
                        .collect(),
                )
            })
            .collect();
        let unhealthy = |v, e| (UNHEALTHY_TAINT_KEY, v, e);
        let held = (HELD_TAINT_KEY, "device-plugin", TaintEffect::NoSchedule);
        assert_eq!(
            taints,
            [
                ("cams-0", vec![unhealthy("ecc", TaintEffect::NoSchedule)]),
                (
                    "cams-1",
                    vec![held, unhealthy("ecc", TaintEffect::NoSchedule)]
                ),
                ("flaky-0", vec![unhealthy("transient", TaintEffect::None)]),
                ("flaky-1", vec![unhealthy("transient", TaintEffect::None)]),
                ("flaky-2", vec![unhealthy("transient", TaintEffect::None)]),
                ("ok-0", vec![]),
            ]
        );
        // A consumable device carries its Instance's fault too.
        let (slices, _) = plan_with("n1", &[flaky.clone()], Layout::Consumable);
        assert_eq!(slices[0].devices[0].taints[0].effect, TaintEffect::None);
        // Healthy again: no taint, and the rest of the plan as before.
        cams.properties
            .insert(HEALTH_PROPERTY.into(), "healthy".into());
        flaky.properties.remove(HEALTH_PROPERTY);
        let (again, _) = plan("n1", &[cams.clone(), flaky.clone()]);
        let (plain, _) = plan("n1", &[cams, flaky]);
        assert_eq!(again, plain);
        let left: Vec<usize> = again[0].devices.iter().map(|d| d.taints.len()).collect();
        assert_eq!(left, [0, 1, 0, 0, 0], "only the held slot keeps a taint");
    }
}
