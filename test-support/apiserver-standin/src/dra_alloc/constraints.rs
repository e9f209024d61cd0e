//! `spec.devices.constraints` of a claim: `matchAttribute`, as
//! kube-scheduler's structured allocator applies it. Every device allocated
//! for the constraint's requests (all requests when it names none) must
//! have the attribute, all with the same value; a device without it cannot
//! be picked for those requests. The choice is a backtracking search over
//! the requests in order and, within one, over the devices in candidate
//! order, so the first fitting combination wins (kube-scheduler's order).
//! A device that allows multiple allocations may serve several requests
//! while its capacity lasts ([`super::capacity`]).
//! `distinctAttribute` is not reproduced.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::DeviceConstraint;

use super::capacity::{Amounts, Ledger};
use super::{AllocError, invalid, unsupported};
use crate::dra_cel::Value;
use crate::dra_select::{Candidate, DeviceId};

/// Most devices tried before the search gives up (kube-scheduler bounds
/// its search by time instead).
const BUDGET: usize = 100_000;

/// One `matchAttribute` constraint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MatchAttribute {
    /// The fully qualified attribute name, as (domain, name).
    attribute: (String, String),
    /// The requests it applies to; `None`: all of them.
    requests: Option<BTreeSet<String>>,
}

impl MatchAttribute {
    fn applies(&self, request: &str) -> bool {
        self.requests.as_ref().is_none_or(|r| r.contains(request))
    }

    /// `domain/name`, for messages.
    pub(crate) fn name(&self) -> String {
        format!("{}/{}", self.attribute.0, self.attribute.1)
    }
}

/// The claim's constraints, checked against its request names.
pub(crate) fn parse(
    claim: &str,
    constraints: &[DeviceConstraint],
    request_names: &BTreeSet<String>,
) -> Result<Vec<MatchAttribute>, AllocError> {
    let mut out = Vec::new();
    for (i, c) in constraints.iter().enumerate() {
        if c.distinct_attribute.is_some() {
            return Err(unsupported(
                claim,
                format!("spec.devices.constraints[{i}].distinctAttribute"),
            ));
        }
        let Some(name) = &c.match_attribute else {
            return Err(invalid(
                claim,
                format!("spec.devices.constraints[{i}]: matchAttribute is required"),
            ));
        };
        let Some((domain, attr)) = name
            .split_once('/')
            .filter(|(d, a)| !d.is_empty() && !a.is_empty() && !a.contains('/'))
        else {
            return Err(invalid(
                claim,
                format!(
                    "spec.devices.constraints[{i}].matchAttribute {name:?} must be a fully qualified name (<domain>/<name>)"
                ),
            ));
        };
        let requests = match c.requests.as_deref() {
            None | Some([]) => None,
            Some(names) => {
                if let Some(unknown) = names.iter().find(|n| !request_names.contains(*n)) {
                    return Err(invalid(
                        claim,
                        format!(
                            "spec.devices.constraints[{i}].requests: no request named {unknown:?}"
                        ),
                    ));
                }
                Some(names.iter().cloned().collect())
            }
        };
        out.push(MatchAttribute {
            attribute: (domain.to_string(), attr.to_string()),
            requests,
        });
    }
    Ok(out)
}

/// The devices one request may get, and how many it takes.
pub(crate) struct Pick<'a> {
    pub request: &'a str,
    /// Free devices that match the request's selectors, in candidate order.
    pub options: Vec<&'a Candidate>,
    pub want: usize,
    /// What the request consumes of each option that allows multiple
    /// allocations (the others it takes whole).
    pub shares: BTreeMap<DeviceId, Amounts>,
}

/// Why no devices were chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NoFit {
    /// No combination satisfies the constraints.
    Unsatisfiable,
    /// The search tried [`BUDGET`] devices.
    GaveUp,
}

struct Search<'p, 'a> {
    picks: &'p [Pick<'a>],
    constraints: &'p [MatchAttribute],
    /// Per constraint: the value every device must share, once one is picked.
    values: Vec<Option<&'a Value>>,
    used: BTreeSet<&'a DeviceId>,
    /// What is left of the shared devices.
    room: Ledger,
    chosen: Vec<Vec<&'a DeviceId>>,
    steps: usize,
}

impl<'a> Search<'_, 'a> {
    /// Fills pick `p` from option `start` on, then the picks after it.
    fn go(&mut self, p: usize, start: usize) -> Result<bool, NoFit> {
        let Some(pick) = self.picks.get(p) else {
            return Ok(true);
        };
        if self.chosen[p].len() == pick.want {
            return self.go(p + 1, 0);
        }
        for i in start..pick.options.len() {
            if pick.options.len() - i < pick.want - self.chosen[p].len() {
                break;
            }
            let c = pick.options[i];
            let share = pick.shares.get(&c.id);
            let free = match share {
                Some(amounts) => self.room.fits(&c.id, amounts),
                None => !self.used.contains(&c.id),
            };
            if !free {
                continue;
            }
            self.steps += 1;
            if self.steps > BUDGET {
                return Err(NoFit::GaveUp);
            }
            let mut set_here = Vec::new();
            let mut fits = true;
            for (k, con) in self.constraints.iter().enumerate() {
                if !con.applies(pick.request) {
                    continue;
                }
                match (c.cel.attributes.get(&con.attribute), self.values[k]) {
                    (None, _) => fits = false,
                    (Some(v), Some(shared)) => fits = v == shared,
                    (Some(v), None) => {
                        self.values[k] = Some(v);
                        set_here.push(k);
                    }
                }
                if !fits {
                    break;
                }
            }
            if fits {
                match share {
                    Some(amounts) => self.room.take(&c.id, amounts),
                    None => {
                        self.used.insert(&c.id);
                    }
                }
                self.chosen[p].push(&c.id);
                if self.go(p, i + 1)? {
                    return Ok(true);
                }
                self.chosen[p].pop();
                match share {
                    Some(amounts) => self.room.give_back(&c.id, amounts),
                    None => {
                        self.used.remove(&c.id);
                    }
                }
            }
            for k in set_here {
                self.values[k] = None;
            }
        }
        Ok(false)
    }
}

/// The devices of each pick, in order: `want` distinct devices per pick,
/// a device taken whole in one pick only, the shares of a device within
/// what `room` has left of it, every constraint met.
pub(crate) fn choose(
    picks: &[Pick<'_>],
    constraints: &[MatchAttribute],
    room: &Ledger,
) -> Result<Vec<Vec<DeviceId>>, NoFit> {
    let mut s = Search {
        picks,
        constraints,
        values: vec![None; constraints.len()],
        used: BTreeSet::new(),
        room: room.clone(),
        chosen: vec![Vec::new(); picks.len()],
        steps: 0,
    };
    if s.go(0, 0)? {
        Ok(s.chosen
            .into_iter()
            .map(|ids| ids.into_iter().cloned().collect())
            .collect())
    } else {
        Err(NoFit::Unsatisfiable)
    }
}

/// The error for picks [`choose`] found no devices for, naming the
/// attribute values the options have.
pub(crate) fn unsatisfiable(
    claim: &str,
    node: &str,
    picks: &[Pick<'_>],
    constraints: &[MatchAttribute],
    why: NoFit,
) -> AllocError {
    let names: Vec<String> = constraints.iter().map(|c| c.name()).collect();
    let per_request: Vec<String> = picks
        .iter()
        .map(|p| {
            let values: Vec<String> = constraints
                .iter()
                .map(|c| values_seen(c, &p.options).join(", "))
                .collect();
            format!("{} wants {} of [{}]", p.request, p.want, values.join(" | "))
        })
        .collect();
    let what = match why {
        NoFit::Unsatisfiable => "no choice of devices satisfies",
        NoFit::GaveUp => "the search gave up on",
    };
    let shared = if picks.iter().any(|p| !p.shares.is_empty()) {
        " (within the capacity left on shared devices)"
    } else {
        ""
    };
    AllocError::Unsatisfiable {
        claim: claim.to_string(),
        request: picks
            .first()
            .map(|p| p.request.to_string())
            .unwrap_or_default(),
        message: format!(
            "{what} matchAttribute {}{shared} on node {node}; values of the free matching devices: {}",
            names.join(", "),
            per_request.join("; ")
        ),
    }
}

/// The attribute values the devices of `options` have for `con`, to name
/// in a message.
pub(crate) fn values_seen(con: &MatchAttribute, options: &[&Candidate]) -> Vec<String> {
    let mut seen = BTreeSet::new();
    for c in options {
        let v = match c.cel.attributes.get(&con.attribute) {
            Some(Value::String(s) | Value::Version(s)) => s.clone(),
            Some(Value::Int(n)) => n.to_string(),
            Some(Value::Bool(b)) => b.to_string(),
            None => "(none)".to_string(),
        };
        seen.insert(v);
    }
    seen.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::dra_cel::CelDevice;

    fn dev(driver: &str, name: &str, numa: Option<i64>) -> Candidate {
        let mut attributes = BTreeMap::new();
        if let Some(n) = numa {
            attributes.insert(
                ("resource.kubernetes.io".to_string(), "numaNode".to_string()),
                Value::Int(n),
            );
        }
        Candidate {
            id: (driver.to_string(), "pool".to_string(), name.to_string()),
            cel: CelDevice {
                driver: driver.to_string(),
                attributes,
            },
            taints: Vec::new(),
            allow_multiple_allocations: false,
            capacity: BTreeMap::new(),
        }
    }

    fn numa_constraint(requests: Option<&[&str]>) -> DeviceConstraint {
        DeviceConstraint {
            match_attribute: Some("resource.kubernetes.io/numaNode".to_string()),
            requests: requests.map(|r| r.iter().map(|s| s.to_string()).collect()),
            ..Default::default()
        }
    }

    fn names(r: &[Vec<DeviceId>]) -> Vec<Vec<&str>> {
        r.iter()
            .map(|ids| ids.iter().map(|id| id.2.as_str()).collect())
            .collect()
    }

    #[test]
    fn devices_of_two_requests_share_the_attribute_value_backtracking_as_needed() {
        let cams = [
            dev("steward.dev", "cam-0", Some(0)),
            dev("steward.dev", "cam-1", Some(1)),
            dev("steward.dev", "cam-2", None),
        ];
        // The CPUs of NUMA 0 are gone: only NUMA 1 has one.
        let cpus = [dev("cpu.example", "cpu-1", Some(1))];
        let reqs: BTreeSet<String> = ["cam".to_string(), "cpu".to_string()].into();
        let cons = parse("c", &[numa_constraint(None)], &reqs).unwrap();
        let picks = [
            Pick {
                request: "cam",
                options: cams.iter().collect(),
                want: 1,
                shares: BTreeMap::new(),
            },
            Pick {
                request: "cpu",
                options: cpus.iter().collect(),
                want: 1,
                shares: BTreeMap::new(),
            },
        ];
        let got = choose(&picks, &cons, &Ledger::default()).unwrap();
        assert_eq!(names(&got), [vec!["cam-1"], vec!["cpu-1"]]);
        // Two cameras on one node: only 0 and 1 exist, on different nodes.
        let two = [Pick {
            request: "cam",
            options: cams.iter().collect(),
            want: 2,
            shares: BTreeMap::new(),
        }];
        assert_eq!(
            choose(&two, &cons, &Ledger::default()),
            Err(NoFit::Unsatisfiable)
        );
        // The constraint names only "cpu": the cameras are free to differ.
        let only_cpu = parse("c", &[numa_constraint(Some(&["cpu"]))], &reqs).unwrap();
        let got = choose(&two, &only_cpu, &Ledger::default()).unwrap();
        assert_eq!(names(&got), [vec!["cam-0", "cam-1"]]);
        // Without constraints the first devices are taken, one device once.
        let got = choose(&two, &[], &Ledger::default()).unwrap();
        assert_eq!(names(&got), [vec!["cam-0", "cam-1"]]);
    }

    #[test]
    fn constraints_are_checked_against_the_claim() {
        let reqs: BTreeSet<String> = ["cam".to_string()].into();
        let bad = |c: DeviceConstraint| parse("c", &[c], &reqs).unwrap_err().to_string();
        assert!(
            bad(numa_constraint(Some(&["gpu"]))).contains("no request named \"gpu\""),
            "{}",
            bad(numa_constraint(Some(&["gpu"])))
        );
        let unqualified = DeviceConstraint {
            match_attribute: Some("numaNode".to_string()),
            ..Default::default()
        };
        assert!(bad(unqualified).contains("fully qualified"));
        let distinct = DeviceConstraint {
            distinct_attribute: Some("steward.dev/slot".to_string()),
            ..Default::default()
        };
        assert!(bad(distinct).contains("not supported"));
        assert!(bad(DeviceConstraint::default()).contains("matchAttribute is required"));
    }
}
