//! Consumable capacity (KEP-5075, `DRAConsumableCapacity`), as
//! kube-scheduler's structured allocator applies it.
//!
//! A device with `allowMultipleAllocations: true` can be allocated many
//! times, by several claims and by several requests of one claim (never
//! twice for one request); every allocation consumes an amount of each of
//! the device's `capacity` entries, and the amounts consumed by all
//! allocations must fit in the capacity's `value`. What one allocation
//! consumes of a capacity: the request's `exactly.capacity.requests[name]`,
//! else the capacity's `requestPolicy.default`, else its whole `value`;
//! with `requestPolicy.validRange` a request below `min` is raised to `min`
//! and one between steps rounded up to `min + k*step`, and must then not
//! exceed `max`; with `validValues` it is raised to the smallest valid value
//! not below it, and must be one of them. A request naming a capacity the
//! device does not have cannot use the device. Such an allocation's result
//! carries a fresh `shareID` and the amounts in `consumedCapacity`.
//!
//! A device without `allowMultipleAllocations` is checked the same way (the
//! amounts must fit in the values) but is taken whole: no `shareID`, no
//! `consumedCapacity`.
//!
//! Amounts are milli-units (an `i128`), so fractional quantities are exact
//! down to `1m` (upstream rounds to whole units unless
//! `DRAFractionalCapacityRange` is on).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::{CapacityRequirements, DeviceRequestAllocationResult};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::dra_select::{Candidate, DeviceId};
use crate::dra_select::{Capacity, Milli, RequestPolicy, parse_quantity};

/// Amounts per capacity name.
pub type Amounts = BTreeMap<String, Milli>;

/// `amount` as a quantity: a whole number (`"1"`) when it is one, else
/// milli-units (`"500m"`).
pub fn format_quantity(amount: Milli) -> Quantity {
    if amount % 1000 == 0 {
        Quantity((amount / 1000).to_string())
    } else {
        Quantity(format!("{amount}m"))
    }
}

/// A request's `exactly.capacity.requests`, parsed.
pub(crate) fn parse_requests(capacity: Option<&CapacityRequirements>) -> Result<Amounts, String> {
    capacity
        .and_then(|c| c.requests.as_ref())
        .into_iter()
        .flatten()
        .map(|(name, q)| {
            parse_quantity(q)
                .map(|m| (name.clone(), m))
                .map_err(|e| format!("capacity.requests[{name}]: {e}"))
        })
        .collect()
}

/// Rounds `requested` up as the policy says (upstream's
/// `calculateConsumedCapacity`).
fn round_up(requested: Milli, policy: &RequestPolicy) -> Milli {
    if let Some(r) = &policy.valid_range {
        if requested < r.min {
            return r.min;
        }
        return match r.step.filter(|s| *s > 0) {
            Some(step) => {
                let above = requested - r.min;
                r.min + (above + step - 1) / step * step
            }
            None => requested,
        };
    }
    policy
        .valid_values
        .iter()
        .copied()
        .find(|v| requested <= *v)
        .unwrap_or(requested)
}

/// Whether `amount` breaks the policy (upstream's `violatesPolicy`).
fn violates(amount: Milli, policy: &RequestPolicy) -> bool {
    if policy.default == Some(amount) {
        return false;
    }
    if let Some(r) = &policy.valid_range {
        let off_step = r
            .step
            .filter(|s| *s > 0)
            .is_some_and(|step| (amount - r.min) % step != 0);
        return r.max.is_some_and(|max| amount > max) || off_step;
    }
    !policy.valid_values.is_empty() && !policy.valid_values.contains(&amount)
}

/// What one allocation of a device with `capacity` for a request with
/// `requests` consumes of each capacity; `Err` says why the device cannot
/// serve the request at all (a capacity it lacks, a policy the amount
/// breaks, more than the capacity's value).
pub(crate) fn consumption(
    requests: &Amounts,
    capacity: &BTreeMap<String, Capacity>,
) -> Result<Amounts, String> {
    if let Some(name) = requests.keys().find(|n| !capacity.contains_key(*n)) {
        return Err(format!("no capacity {name}"));
    }
    let mut out = Amounts::new();
    for (name, cap) in capacity {
        let default = cap.policy.as_ref().and_then(|p| p.default);
        let amount = match (requests.get(name), &cap.policy) {
            (None, _) => default.unwrap_or(cap.value),
            (Some(r), None) => *r,
            (Some(r), Some(p)) => round_up(*r, p),
        };
        let shown = format_quantity(amount).0;
        if cap.policy.as_ref().is_some_and(|p| violates(amount, p)) {
            return Err(format!("{name}: {shown} breaks the request policy"));
        }
        if amount > cap.value {
            let value = format_quantity(cap.value).0;
            return Err(format!("{name}: {shown} is more than the value {value}"));
        }
        out.insert(name.clone(), amount);
    }
    Ok(out)
}

/// What is left of the capacities of the devices that allow multiple
/// allocations.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Ledger {
    room: BTreeMap<DeviceId, Amounts>,
}

impl Ledger {
    /// The capacities of the multi-allocatable `candidates` minus what
    /// `consumed` (other claims) holds of them.
    pub(crate) fn new(candidates: &[Candidate], consumed: &BTreeMap<DeviceId, Amounts>) -> Self {
        let room = candidates
            .iter()
            .filter(|c| c.allow_multiple_allocations)
            .map(|c| {
                let used = consumed.get(&c.id);
                let left = c
                    .capacity
                    .iter()
                    .map(|(name, cap)| {
                        let taken = used.and_then(|u| u.get(name)).copied().unwrap_or(0);
                        (name.clone(), cap.value - taken)
                    })
                    .collect();
                (c.id.clone(), left)
            })
            .collect();
        Ledger { room }
    }

    /// Whether `amounts` of device `id` are left.
    pub(crate) fn fits(&self, id: &DeviceId, amounts: &Amounts) -> bool {
        let Some(room) = self.room.get(id) else {
            return false;
        };
        amounts
            .iter()
            .all(|(name, a)| room.get(name).is_some_and(|left| a <= left))
    }

    pub(crate) fn take(&mut self, id: &DeviceId, amounts: &Amounts) {
        self.shift(id, amounts, -1);
    }

    pub(crate) fn give_back(&mut self, id: &DeviceId, amounts: &Amounts) {
        self.shift(id, amounts, 1);
    }

    fn shift(&mut self, id: &DeviceId, amounts: &Amounts, sign: Milli) {
        if let Some(room) = self.room.get_mut(id) {
            for (name, a) in amounts {
                *room.entry(name.clone()).or_insert(0) += sign * a;
            }
        }
    }
}

/// Books the results of another claim: a shared allocation (with a
/// `shareID`, or of a candidate that allows multiple allocations) adds its
/// `consumedCapacity` to `consumed` (an entry even when it has none), any
/// other takes the device whole (`in_use`). Admin access takes nothing.
pub(crate) fn book(
    results: Vec<DeviceRequestAllocationResult>,
    candidates: &[Candidate],
    in_use: &mut BTreeSet<DeviceId>,
    consumed: &mut BTreeMap<DeviceId, Amounts>,
) -> Result<(), String> {
    for r in results.into_iter().filter(|r| r.admin_access != Some(true)) {
        let id = (r.driver, r.pool, r.device);
        let multi = || {
            candidates
                .iter()
                .any(|c| c.id == id && c.allow_multiple_allocations)
        };
        if r.share_id.is_none() && !multi() {
            in_use.insert(id);
            continue;
        }
        let sums = consumed.entry(id).or_default();
        for (name, q) in r.consumed_capacity.iter().flatten() {
            let amount = parse_quantity(q).map_err(|e| format!("consumedCapacity[{name}]: {e}"))?;
            *sums.entry(name.clone()).or_insert(0) += amount;
        }
    }
    Ok(())
}

/// The allocation result of `request` for device `id`; `share` is what it
/// consumes when the device allows multiple allocations.
pub(crate) fn result(
    request: &str,
    (driver, pool, device): DeviceId,
    share: Option<&Amounts>,
) -> DeviceRequestAllocationResult {
    DeviceRequestAllocationResult {
        request: request.to_string(),
        driver,
        pool,
        device,
        share_id: share.map(|_| uuid::Uuid::new_v4().to_string()),
        consumed_capacity: share.filter(|a| !a.is_empty()).map(|a| {
            a.iter()
                .map(|(name, m)| (name.clone(), format_quantity(*m)))
                .collect()
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::resource::v1::{
        CapacityRequestPolicy, CapacityRequestPolicyRange, Device, DeviceAttribute, DeviceCapacity,
        DeviceClaim, DeviceClass, DeviceConstraint, DeviceRequest, ExactDeviceRequest,
        ResourceClaimSpec, ResourcePool, ResourceSlice, ResourceSliceSpec,
    };
    use kube::api::ObjectMeta;

    use super::*;
    use crate::dra_alloc::{AllocError, World, allocate};
    use crate::dra_select::{NodeInfo, candidates};

    fn q(s: &str) -> Quantity {
        Quantity(s.to_string())
    }

    /// `min 1, step 1, default 1`: one unit per request unless it asks more.
    fn unit_policy() -> CapacityRequestPolicy {
        policy("1", "1", "1", None)
    }

    fn policy(default: &str, min: &str, step: &str, max: Option<&str>) -> CapacityRequestPolicy {
        CapacityRequestPolicy {
            default: Some(q(default)),
            valid_range: Some(CapacityRequestPolicyRange {
                min: q(min),
                step: Some(q(step)),
                max: max.map(q),
            }),
            valid_values: None,
        }
    }

    /// A device with one capacity, `slots`, and attribute `numa` (1 when
    /// its name ends in 1, else 0).
    fn device(name: &str, multi: bool, slots: &str, p: Option<CapacityRequestPolicy>) -> Device {
        let numa = DeviceAttribute {
            int: Some(i64::from(name.ends_with('1'))),
            ..Default::default()
        };
        let cap = DeviceCapacity {
            value: q(slots),
            request_policy: p,
        };
        Device {
            name: name.to_string(),
            allow_multiple_allocations: multi.then_some(true),
            attributes: Some([("numa".to_string(), numa)].into()),
            capacity: Some([("slots".to_string(), cap)].into()),
            ..Default::default()
        }
    }

    fn world(devices: Vec<Device>) -> World {
        let slice = ResourceSlice {
            metadata: ObjectMeta::default(),
            spec: ResourceSliceSpec {
                driver: "steward.dev".into(),
                pool: ResourcePool {
                    name: "n1".into(),
                    generation: 1,
                    resource_slice_count: 1,
                },
                node_name: Some("n1".into()),
                devices: Some(devices),
                ..Default::default()
            },
        };
        World {
            classes: [("gpu".to_string(), DeviceClass::default())].into(),
            candidates: candidates(&[slice], &NodeInfo::named("n1")).unwrap(),
            in_use: BTreeSet::new(),
            consumed: BTreeMap::new(),
        }
    }

    /// A claim with one request per entry: (name, slots asked (or
    /// `capacity=amount`), count).
    fn spec(requests: &[(&str, Option<&str>, i64)], numa: bool) -> ResourceClaimSpec {
        let requests = requests.iter().map(|(name, slots, count)| DeviceRequest {
            name: name.to_string(),
            exactly: Some(ExactDeviceRequest {
                device_class_name: "gpu".into(),
                count: Some(*count),
                capacity: slots.map(|s| {
                    let (name, amount) = s.split_once('=').unwrap_or(("slots", s));
                    CapacityRequirements {
                        requests: Some([(name.to_string(), q(amount))].into()),
                    }
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
        let same_numa = DeviceConstraint {
            match_attribute: Some("steward.dev/numa".into()),
            ..Default::default()
        };
        ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(requests.collect()),
                constraints: numa.then(|| vec![same_numa]),
                ..Default::default()
            }),
        }
    }

    /// A claim of one request `r` for one device.
    fn one(slots: Option<&str>) -> ResourceClaimSpec {
        spec(&[("r", slots, 1)], false)
    }

    /// Allocates and books the result as another claim's (what
    /// `World::read` does for the next claim).
    fn commit(
        w: &mut World,
        s: &ResourceClaimSpec,
    ) -> Result<Vec<DeviceRequestAllocationResult>, AllocError> {
        let results = allocate("ns/c", s, w, "n1")?
            .devices
            .and_then(|d| d.results)
            .unwrap();
        let World {
            candidates,
            in_use,
            consumed,
            ..
        } = w;
        book(results.clone(), candidates, in_use, consumed).unwrap();
        Ok(results)
    }

    fn consumed(r: &DeviceRequestAllocationResult) -> Option<&str> {
        r.consumed_capacity.as_ref().map(|c| c["slots"].0.as_str())
    }

    fn unsatisfiable(e: AllocError, what: &str) {
        assert!(
            matches!(&e, AllocError::Unsatisfiable { message, .. } if message.contains(what)),
            "{e}"
        );
    }

    #[test]
    fn three_claims_share_a_device_and_the_fourth_finds_it_at_capacity() {
        let mut w = world(vec![device("gpu-0", true, "3", Some(unit_policy()))]);
        let one = one(None);
        let mut ids = BTreeSet::new();
        for _ in 0..3 {
            let r = commit(&mut w, &one).unwrap();
            assert_eq!(
                (r.len(), r[0].device.as_str(), consumed(&r[0])),
                (1, "gpu-0", Some("1"))
            );
            let id = r[0].share_id.clone().unwrap();
            assert!(id.len() == 36 && id == id.to_lowercase() && ids.insert(id));
        }
        unsatisfiable(commit(&mut w, &one).unwrap_err(), "1 at capacity");
    }

    #[test]
    fn a_capacity_request_consumes_its_amount_rounded_up_by_the_policy() {
        let mut w = world(vec![device("gpu-0", true, "3", Some(unit_policy()))]);
        let r = commit(&mut w, &one(Some("2"))).unwrap();
        assert_eq!(consumed(&r[0]), Some("2"));
        unsatisfiable(
            commit(&mut w, &one(Some("2"))).unwrap_err(),
            "1 at capacity",
        );
        // More than the device has, or a capacity it lacks: never fits.
        let too_much = allocate(
            "c",
            &one(Some("4")),
            &world(vec![device("gpu-0", true, "3", None)]),
            "n1",
        );
        unsatisfiable(too_much.unwrap_err(), "1 without the requested capacity");
        // validRange min 1, step 2, max 5: 0 -> 1, 2 -> 3, 4 -> 5, 6 -> 7 > max.
        let odd = || {
            world(vec![device(
                "gpu-0",
                true,
                "10",
                Some(policy("1", "1", "2", Some("5"))),
            )])
        };
        for (asked, got) in [
            ("0", "1"),
            ("2", "3"),
            ("4", "5"),
            ("500m", "1"),
            ("1500m", "3"),
        ] {
            let r = commit(&mut odd(), &one(Some(asked))).unwrap();
            assert_eq!(consumed(&r[0]), Some(got), "{asked}");
        }
        unsatisfiable(commit(&mut odd(), &one(Some("6"))).unwrap_err(), "without");
        // validValues 1, 4, 8: 3 -> 4, 9 -> none.
        let values = CapacityRequestPolicy {
            default: Some(q("1")),
            valid_range: None,
            valid_values: Some(vec![q("1"), q("4"), q("8")]),
        };
        let mut w = world(vec![device("gpu-0", true, "10", Some(values))]);
        assert_eq!(
            consumed(&commit(&mut w, &one(Some("3"))).unwrap()[0]),
            Some("4")
        );
        unsatisfiable(commit(&mut w, &one(Some("9"))).unwrap_err(), "without");
        let memory = commit(&mut w, &one(Some("memory=1")));
        unsatisfiable(memory.unwrap_err(), "1 without the requested capacity");
    }

    #[test]
    fn without_a_policy_a_request_without_capacity_takes_all_of_it() {
        let mut w = world(vec![device("gpu-0", true, "4", None)]);
        let r = commit(&mut w, &one(None)).unwrap();
        assert_eq!(consumed(&r[0]), Some("4"));
        assert!(r[0].share_id.is_some());
        unsatisfiable(
            commit(&mut w, &one(Some("1"))).unwrap_err(),
            "1 at capacity",
        );
        // Asking for a part leaves the rest to others.
        let mut w = world(vec![device("gpu-0", true, "4", None)]);
        for _ in 0..4 {
            commit(&mut w, &one(Some("1"))).unwrap();
        }
        assert_eq!(w.consumed.values().next().map(|a| a["slots"]), Some(4000));
    }

    #[test]
    fn a_device_without_multiple_allocations_stays_exclusive() {
        let mut w = world(vec![device("gpu-0", false, "3", None)]);
        unsatisfiable(commit(&mut w, &one(Some("4"))).unwrap_err(), "1 without");
        let r = commit(&mut w, &one(Some("1"))).unwrap();
        assert_eq!((r[0].share_id.as_deref(), consumed(&r[0])), (None, None));
        assert_eq!(w.in_use.len(), 1);
        unsatisfiable(
            commit(&mut w, &one(Some("1"))).unwrap_err(),
            "1 more are allocated",
        );
        // One claim cannot take it twice either.
        let w = world(vec![device("gpu-0", false, "3", None)]);
        let two = allocate(
            "c",
            &spec(&[("a", Some("1"), 1), ("b", Some("1"), 1)], false),
            &w,
            "n1",
        );
        unsatisfiable(two.unwrap_err(), "0 free");
    }

    #[test]
    fn requests_of_one_claim_share_a_device_while_its_capacity_lasts() {
        let devices = || {
            vec![
                device("gpu-0", true, "3", Some(unit_policy())),
                device("gpu-1", true, "3", Some(unit_policy())),
            ]
        };
        let w = world(devices()[..1].to_vec());
        let both = allocate(
            "c",
            &spec(&[("a", None, 1), ("b", Some("2"), 1)], false),
            &w,
            "n1",
        )
        .unwrap();
        let r = both.devices.and_then(|d| d.results).unwrap();
        assert_eq!(
            r.iter()
                .map(|r| (r.device.as_str(), consumed(r)))
                .collect::<Vec<_>>(),
            [("gpu-0", Some("1")), ("gpu-0", Some("2"))]
        );
        assert_ne!(r[0].share_id, r[1].share_id);
        unsatisfiable(
            allocate(
                "c",
                &spec(&[("a", Some("2"), 1), ("b", Some("2"), 1)], false),
                &w,
                "n1",
            )
            .unwrap_err(),
            "1 at capacity",
        );
        // One request never gets a device twice.
        unsatisfiable(
            allocate("c", &spec(&[("a", None, 2)], false), &w, "n1").unwrap_err(),
            "1 free",
        );
        // Under matchAttribute the search books the shares too: 2 + 2 fit
        // no single device and the devices differ in numa.
        let w = world(devices());
        let same = |a: &str, b: &str| {
            allocate(
                "c",
                &spec(&[("a", Some(a), 1), ("b", Some(b), 1)], true),
                &w,
                "n1",
            )
        };
        unsatisfiable(
            same("2", "2").unwrap_err(),
            "capacity left on shared devices",
        );
        let r = same("2", "1")
            .unwrap()
            .devices
            .and_then(|d| d.results)
            .unwrap();
        assert!(r.iter().all(|r| r.device == "gpu-0"), "{r:?}");
    }

    #[test]
    fn other_claims_results_are_booked_by_share() {
        let w = world(vec![device("gpu-0", true, "3", None)]);
        let (mut in_use, mut consumed) = (BTreeSet::new(), BTreeMap::new());
        let r = |device: &str, share: Option<&str>, slots: Option<&str>, admin: bool| {
            DeviceRequestAllocationResult {
                driver: "steward.dev".into(),
                pool: "n1".into(),
                device: device.into(),
                share_id: share.map(str::to_string),
                consumed_capacity: slots.map(|s| [("slots".to_string(), q(s))].into()),
                admin_access: admin.then_some(true),
                ..Default::default()
            }
        };
        let results = vec![
            r("gpu-0", None, Some("500m"), false),
            r("gpu-0", Some("a"), Some("1"), false),
            r("gone", Some("b"), None, false),
            r("d", None, None, false),
            r("e", None, None, true),
        ];
        book(results, &w.candidates, &mut in_use, &mut consumed).unwrap();
        let id = |d: &str| ("steward.dev".to_string(), "n1".to_string(), d.to_string());
        assert_eq!(consumed[&id("gpu-0")]["slots"], 1500);
        assert!(consumed[&id("gone")].is_empty());
        assert_eq!(in_use, [id("d")].into());
        let bad = vec![r("gpu-0", Some("c"), Some("1e3"), false)];
        assert!(book(bad, &w.candidates, &mut in_use, &mut consumed).is_err());
    }
}
