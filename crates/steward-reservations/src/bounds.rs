//! What one ask may be: the one set of bounds every way in applies — the
//! extender's Filter (from the pod), `/v1/decide` (from the wire, before
//! the leader's loop sees it), the loop itself, and the one write path
//! ([`crate::ask::write`]). The amounts are the Reservation CRD's own
//! bounds (checked against the generated CRD by a test), so nothing the
//! API server would refuse reaches the leader's ledger either.

use std::collections::BTreeMap;

use steward_api::ReservationSpec;

/// The most slots of one Instance a Reservation holds (the CRD's bound).
pub const MAX_SLOTS_PER_INSTANCE: u32 = 1024;
/// The most exclusive CPUs a Reservation holds (the CRD's bound).
pub const MAX_EXCLUSIVE_CPUS: u32 = 1024;
/// The most candidate nodes a Reservation names (the CRD's bound).
pub const MAX_CANDIDATES: usize = 5000;
/// The longest name of a node, pod or namespace (a DNS subdomain).
pub const MAX_NAME: usize = 253;
/// The most Instances one ask names (each a `steward.dev/<instance>`
/// extended resource of the pod; far more than any pod has).
pub const MAX_INSTANCES: usize = 128;

/// Why an ask is out of bounds: no Reservation can hold it, whatever is
/// preempted, so it is refused before anything is decided or written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OutOfBounds {
    #[error("{0} exclusive CPUs asked; a reservation holds at most {MAX_EXCLUSIVE_CPUS}")]
    Cpus(u32),
    #[error(
        "{asked} slots of {instance} asked; a reservation holds at most {MAX_SLOTS_PER_INSTANCE} of one Instance"
    )]
    Slots { instance: String, asked: u32 },
    #[error("0 slots of {0} asked; an ask names only what it wants")]
    NoSlots(String),
    #[error("an Instance name of {0} bytes asked; at most {MAX_NAME}")]
    InstanceName(usize),
    #[error("{0} Instances asked; an ask names at most {MAX_INSTANCES}")]
    Instances(usize),
    #[error("nothing asked: neither slots nor exclusive CPUs")]
    Nothing,
    #[error("no candidate nodes")]
    NoCandidates,
    #[error("{0} candidate nodes; a reservation names at most {MAX_CANDIDATES}")]
    Candidates(usize),
    #[error("a candidate node name is empty or longer than {MAX_NAME} bytes")]
    CandidateName,
    #[error("the pod's {0} is empty or longer than {MAX_NAME} bytes")]
    Pod(&'static str),
    #[error("an ask does not cancel (spec.cancel is set)")]
    Cancel,
}

/// Whether an amount asked fits a Reservation: slots per Instance and
/// exclusive CPUs.
pub fn check_amounts(slots: &BTreeMap<String, u32>, cpus: u32) -> Result<(), OutOfBounds> {
    if cpus > MAX_EXCLUSIVE_CPUS {
        return Err(OutOfBounds::Cpus(cpus));
    }
    if slots.len() > MAX_INSTANCES {
        return Err(OutOfBounds::Instances(slots.len()));
    }
    for (instance, &asked) in slots {
        if instance.is_empty() || instance.len() > MAX_NAME {
            return Err(OutOfBounds::InstanceName(instance.len()));
        }
        if asked == 0 {
            return Err(OutOfBounds::NoSlots(instance.clone()));
        }
        if asked > MAX_SLOTS_PER_INSTANCE {
            return Err(OutOfBounds::Slots {
                instance: instance.clone(),
                asked,
            });
        }
    }
    Ok(())
}

/// Whether `spec` is an ask a Reservation can carry: a pod, something
/// asked within [`check_amounts`], 1 to [`MAX_CANDIDATES`] named
/// candidates, no cancel. Every ask is checked here, whichever way it
/// came in.
pub fn check(spec: &ReservationSpec) -> Result<(), OutOfBounds> {
    let named = |s: &str| !s.is_empty() && s.len() <= MAX_NAME;
    if !named(&spec.pod.namespace) {
        return Err(OutOfBounds::Pod("namespace"));
    }
    if !named(&spec.pod.name) {
        return Err(OutOfBounds::Pod("name"));
    }
    if !named(&spec.pod.uid) {
        return Err(OutOfBounds::Pod("uid"));
    }
    check_amounts(&spec.slots, spec.exclusive_cpus)?;
    if spec.slots.is_empty() && spec.exclusive_cpus == 0 {
        return Err(OutOfBounds::Nothing);
    }
    if spec.candidates.is_empty() {
        return Err(OutOfBounds::NoCandidates);
    }
    if spec.candidates.len() > MAX_CANDIDATES {
        return Err(OutOfBounds::Candidates(spec.candidates.len()));
    }
    if !spec.candidates.iter().all(|c| named(c)) {
        return Err(OutOfBounds::CandidateName);
    }
    if spec.cancel.is_some() {
        return Err(OutOfBounds::Cancel);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use steward_api::PodRef;

    use super::*;

    fn spec() -> ReservationSpec {
        ReservationSpec {
            pod: PodRef {
                namespace: "ns".into(),
                name: "p".into(),
                uid: "u".into(),
            },
            slots: BTreeMap::from([("cam".to_owned(), 1)]),
            exclusive_cpus: 0,
            candidates: vec!["n1".into()],
            cancel: None,
        }
    }

    #[test]
    fn each_bound_refuses_what_is_beyond_it_and_admits_its_edge() {
        assert_eq!(check(&spec()), Ok(()));
        let edge = ReservationSpec {
            slots: BTreeMap::from([("cam".to_owned(), MAX_SLOTS_PER_INSTANCE)]),
            exclusive_cpus: MAX_EXCLUSIVE_CPUS,
            candidates: (0..MAX_CANDIDATES).map(|i| format!("n{i}")).collect(),
            ..spec()
        };
        assert_eq!(check(&edge), Ok(()));
        let cases: Vec<(ReservationSpec, OutOfBounds)> = vec![
            (
                ReservationSpec {
                    exclusive_cpus: MAX_EXCLUSIVE_CPUS + 1,
                    ..spec()
                },
                OutOfBounds::Cpus(MAX_EXCLUSIVE_CPUS + 1),
            ),
            (
                ReservationSpec {
                    slots: BTreeMap::from([("cam".to_owned(), u32::MAX)]),
                    ..spec()
                },
                OutOfBounds::Slots {
                    instance: "cam".into(),
                    asked: u32::MAX,
                },
            ),
            (
                ReservationSpec {
                    slots: BTreeMap::from([("cam".to_owned(), 0)]),
                    ..spec()
                },
                OutOfBounds::NoSlots("cam".into()),
            ),
            (
                ReservationSpec {
                    slots: (0..=MAX_INSTANCES).map(|i| (format!("i{i}"), 1)).collect(),
                    ..spec()
                },
                OutOfBounds::Instances(MAX_INSTANCES + 1),
            ),
            (
                ReservationSpec {
                    slots: BTreeMap::new(),
                    ..spec()
                },
                OutOfBounds::Nothing,
            ),
            (
                ReservationSpec {
                    candidates: Vec::new(),
                    ..spec()
                },
                OutOfBounds::NoCandidates,
            ),
            (
                ReservationSpec {
                    candidates: (0..=MAX_CANDIDATES).map(|i| format!("n{i}")).collect(),
                    ..spec()
                },
                OutOfBounds::Candidates(MAX_CANDIDATES + 1),
            ),
            (
                ReservationSpec {
                    candidates: vec!["x".repeat(MAX_NAME + 1)],
                    ..spec()
                },
                OutOfBounds::CandidateName,
            ),
            (
                ReservationSpec {
                    cancel: Some("forged".into()),
                    ..spec()
                },
                OutOfBounds::Cancel,
            ),
        ];
        for (s, want) in cases {
            assert_eq!(check(&s), Err(want));
        }
        let mut no_uid = spec();
        no_uid.pod.uid = String::new();
        assert_eq!(check(&no_uid), Err(OutOfBounds::Pod("uid")));
    }
}
