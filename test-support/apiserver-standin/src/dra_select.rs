//! Which devices of the published ResourceSlices a node can use, and what a
//! selector sees of each: the part of kube-scheduler's structured allocator
//! that gathers pools and candidate devices, with their consumable
//! capacities parsed ([`crate::dra_alloc::capacity`] consumes them).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement};
use k8s_openapi::api::resource::v1::{
    DeviceAttribute, DeviceCapacity, DeviceTaint, DeviceToleration, ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::dra_cel::{CelDevice, Value};

/// Label kubelet puts on every Node with its hostname.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// What node selectors are evaluated against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// `metadata.name`
    pub name: String,
    /// `metadata.labels`
    pub labels: BTreeMap<String, String>,
}

impl NodeInfo {
    /// A node known only by name: its hostname label is its name (what
    /// kubelet sets).
    pub fn named(name: &str) -> Self {
        NodeInfo {
            name: name.to_string(),
            labels: [(HOSTNAME_LABEL.to_string(), name.to_string())]
                .into_iter()
                .collect(),
        }
    }
}

/// (driver, pool, device): a device's identity across the cluster.
pub type DeviceId = (String, String, String);

/// One device a claim on this node could get.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// Driver, pool and device name.
    pub id: DeviceId,
    /// What CEL selectors see of it.
    pub cel: CelDevice,
    /// `devices[].taints` (DRADeviceTaints).
    pub taints: Vec<DeviceTaint>,
    /// `devices[].allowMultipleAllocations` (DRAConsumableCapacity).
    pub allow_multiple_allocations: bool,
    /// `devices[].capacity`: values and request policies, by name.
    pub capacity: BTreeMap<String, Capacity>,
}

/// A quantity in milli-units (`"1"` is 1000, `"500m"` 500).
pub type Milli = i128;

/// `requestPolicy.validRange`, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidRange {
    pub min: Milli,
    pub max: Option<Milli>,
    pub step: Option<Milli>,
}

/// `requestPolicy`, parsed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestPolicy {
    pub default: Option<Milli>,
    pub valid_range: Option<ValidRange>,
    /// Ascending (the API validates the order).
    pub valid_values: Vec<Milli>,
}

/// One `devices[].capacity` entry, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capacity {
    pub value: Milli,
    pub policy: Option<RequestPolicy>,
}

const MILLI_PER_UNIT: [(&str, Milli); 14] = [
    ("m", 1),
    ("", 1_000),
    ("k", 1_000_000),
    ("M", 1_000_000_000),
    ("G", 1_000_000_000_000),
    ("T", 1_000_000_000_000_000),
    ("P", 1_000_000_000_000_000_000),
    ("E", 1_000_000_000_000_000_000_000),
    ("Ki", 1_000 << 10),
    ("Mi", 1_000 << 20),
    ("Gi", 1_000 << 30),
    ("Ti", 1_000 << 40),
    ("Pi", 1_000 << 50),
    ("Ei", 1_000 << 60),
];

/// Parses a Kubernetes quantity: digits with an optional decimal point and
/// at most one suffix of `m`, `k`, `M`, `G`, `T`, `P`, `E`, `Ki` … `Ei`.
/// Signs, exponents (`1e3`) and amounts finer than `1m` are refused.
pub fn parse_quantity(q: &Quantity) -> Result<Milli, String> {
    let s = q.0.as_str();
    let unknown = || {
        format!(
            "quantity {s:?}: the stand-in reads only digits with an optional decimal point and \
             one suffix of m, k, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei"
        )
    };
    let split = s
        .find(|ch: char| !(ch.is_ascii_digit() || ch == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    let per_unit = MILLI_PER_UNIT
        .iter()
        .find(|(sfx, _)| *sfx == suffix)
        .map(|(_, m)| *m)
        .ok_or_else(unknown)?;
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    let digits = format!("{int}{frac}");
    if digits.is_empty() || frac.contains('.') || digits.len() > 36 {
        return Err(unknown());
    }
    let mantissa: Milli = digits.parse().map_err(|_| unknown())?;
    let scale = u32::try_from(frac.len())
        .ok()
        .and_then(|n| 10_i128.checked_pow(n))
        .ok_or_else(unknown)?;
    let too_large = || format!("quantity {s:?} is too large");
    let total = mantissa.checked_mul(per_unit).ok_or_else(too_large)?;
    if total % scale != 0 {
        return Err(format!("quantity {s:?} is finer than 1m"));
    }
    // Far above any real capacity, and sums of amounts stay far from
    // overflowing.
    Some(total / scale)
        .filter(|m| *m <= 10_i128.pow(30))
        .ok_or_else(too_large)
}

fn parse_opt(q: Option<&Quantity>) -> Result<Option<Milli>, String> {
    q.map(parse_quantity).transpose()
}

/// A device's `capacity`, parsed.
pub fn parse_capacities(
    capacity: &BTreeMap<String, DeviceCapacity>,
) -> Result<BTreeMap<String, Capacity>, String> {
    let mut out = BTreeMap::new();
    for (name, c) in capacity {
        let at = |e: String| format!("capacity {name}: {e}");
        let policy = match &c.request_policy {
            None => None,
            Some(p) => Some(RequestPolicy {
                default: parse_opt(p.default.as_ref()).map_err(at)?,
                valid_range: match &p.valid_range {
                    None => None,
                    Some(r) => Some(ValidRange {
                        min: parse_quantity(&r.min).map_err(at)?,
                        max: parse_opt(r.max.as_ref()).map_err(at)?,
                        step: parse_opt(r.step.as_ref()).map_err(at)?,
                    }),
                },
                valid_values: p
                    .valid_values
                    .as_deref()
                    .unwrap_or_default()
                    .iter()
                    .map(parse_quantity)
                    .collect::<Result<_, _>>()
                    .map_err(at)?,
            }),
        };
        let value = parse_quantity(&c.value).map_err(at)?;
        out.insert(name.clone(), Capacity { value, policy });
    }
    Ok(out)
}

fn requirement_matches(r: &NodeSelectorRequirement, value: Option<&str>) -> Result<bool, String> {
    let values = r.values.as_deref().unwrap_or_default();
    let int = |s: &str| s.parse::<i64>().ok();
    Ok(match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => !value.is_some_and(|v| values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), Some(bound)) = (value.and_then(int), values.first().and_then(|b| int(b)))
            else {
                return Ok(false);
            };
            if r.operator == "Gt" {
                v > bound
            } else {
                v < bound
            }
        }
        other => return Err(format!("unsupported node selector operator {other:?}")),
    })
}

/// Whether `node` matches `selector` (terms are ORed, requirements of one
/// term ANDed, a term without requirements matches nothing). `matchFields`
/// only knows `metadata.name`, like kube-apiserver.
pub fn node_matches(selector: &NodeSelector, node: &NodeInfo) -> Result<bool, String> {
    for term in &selector.node_selector_terms {
        let exprs = term.match_expressions.as_deref().unwrap_or_default();
        let fields = term.match_fields.as_deref().unwrap_or_default();
        if exprs.is_empty() && fields.is_empty() {
            continue;
        }
        let mut all = true;
        for r in exprs {
            all &= requirement_matches(r, node.labels.get(&r.key).map(String::as_str))?;
        }
        for r in fields {
            if r.key != "metadata.name" {
                return Err(format!("unsupported node selector field {:?}", r.key));
            }
            all &= requirement_matches(r, Some(&node.name))?;
        }
        if all {
            return Ok(true);
        }
    }
    Ok(false)
}

fn scope_matches(
    node_name: Option<&str>,
    selector: Option<&NodeSelector>,
    all_nodes: Option<bool>,
    node: &NodeInfo,
) -> Result<bool, String> {
    if let Some(n) = node_name {
        return Ok(n == node.name);
    }
    if let Some(sel) = selector {
        return node_matches(sel, node);
    }
    Ok(all_nodes == Some(true))
}

fn value_of(a: &DeviceAttribute) -> Option<Value> {
    if let Some(s) = &a.string {
        return Some(Value::String(s.clone()));
    }
    if let Some(i) = a.int {
        return Some(Value::Int(i));
    }
    if let Some(b) = a.bool {
        return Some(Value::Bool(b));
    }
    a.version.as_ref().map(|v| Value::Version(v.clone()))
}

/// Attributes by (domain, name): `domain/name` keys are split, plain names
/// belong to the driver's domain.
pub fn cel_attributes(
    driver: &str,
    attributes: &BTreeMap<String, DeviceAttribute>,
) -> BTreeMap<(String, String), Value> {
    attributes
        .iter()
        .filter_map(|(key, attr)| {
            let (domain, name) = match key.split_once('/') {
                Some((d, n)) => (d.to_string(), n.to_string()),
                None => (driver.to_string(), key.clone()),
            };
            value_of(attr).map(|v| ((domain, name), v))
        })
        .collect()
}

/// Whether `toleration` tolerates `taint` (core/v1 taint semantics:
/// `Exists` with no key tolerates everything; an empty effect any effect).
fn tolerates(toleration: &DeviceToleration, taint: &DeviceTaint) -> bool {
    let key = toleration.key.as_deref().unwrap_or_default();
    if !key.is_empty() && key != taint.key {
        return false;
    }
    let effect = toleration.effect.as_deref().unwrap_or_default();
    if !effect.is_empty() && effect != taint.effect {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        _ => !key.is_empty() && toleration.value.as_deref() == taint.value.as_deref(),
    }
}

/// The first taint of `candidate` that keeps a request with `tolerations`
/// from allocating it: effect `NoSchedule` or `NoExecute`, not tolerated.
pub fn blocking_taint<'a>(
    candidate: &'a Candidate,
    tolerations: &[DeviceToleration],
) -> Option<&'a DeviceTaint> {
    candidate.taints.iter().find(|t| {
        matches!(t.effect.as_str(), "NoSchedule" | "NoExecute")
            && !tolerations.iter().any(|tol| tolerates(tol, t))
    })
}

/// The devices `node` can use: devices of slices (or, with
/// `perDeviceNodeSelection`, single devices) for this node by `nodeName`,
/// `nodeSelector` or `allNodes`, taken only from the newest generation of
/// each (driver, pool), ordered by driver, pool, slice name and position.
pub fn candidates(slices: &[ResourceSlice], node: &NodeInfo) -> Result<Vec<Candidate>, String> {
    let mut newest: BTreeMap<(&str, &str), i64> = BTreeMap::new();
    for s in slices {
        let key = (s.spec.driver.as_str(), s.spec.pool.name.as_str());
        let g = newest.entry(key).or_insert(s.spec.pool.generation);
        *g = (*g).max(s.spec.pool.generation);
    }
    let mut current: Vec<&ResourceSlice> = slices
        .iter()
        .filter(|s| {
            newest.get(&(s.spec.driver.as_str(), s.spec.pool.name.as_str()))
                == Some(&s.spec.pool.generation)
        })
        .collect();
    current.sort_by(|a, b| {
        (&a.spec.driver, &a.spec.pool.name, &a.metadata.name).cmp(&(
            &b.spec.driver,
            &b.spec.pool.name,
            &b.metadata.name,
        ))
    });
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    for s in current {
        let spec = &s.spec;
        let per_device = spec.per_device_node_selection == Some(true);
        if !per_device
            && !scope_matches(
                spec.node_name.as_deref(),
                spec.node_selector.as_ref(),
                spec.all_nodes,
                node,
            )?
        {
            continue;
        }
        for d in spec.devices.as_deref().unwrap_or_default() {
            if per_device
                && !scope_matches(
                    d.node_name.as_deref(),
                    d.node_selector.as_ref(),
                    d.all_nodes,
                    node,
                )?
            {
                continue;
            }
            let id = (spec.driver.clone(), spec.pool.name.clone(), d.name.clone());
            if !seen.insert(id.clone()) {
                // kube-scheduler treats a pool listing a device twice as invalid.
                return Err(format!(
                    "pool {}/{} lists device {} more than once",
                    id.0, id.1, id.2
                ));
            }
            let capacity = d
                .capacity
                .as_ref()
                .map(parse_capacities)
                .transpose()
                .map_err(|e| format!("pool {}/{} device {}: {e}", id.0, id.1, id.2))?
                .unwrap_or_default();
            let attributes = d
                .attributes
                .as_ref()
                .map(|a| cel_attributes(&spec.driver, a))
                .unwrap_or_default();
            out.push(Candidate {
                id,
                cel: CelDevice {
                    driver: spec.driver.clone(),
                    attributes,
                },
                taints: d.taints.clone().unwrap_or_default(),
                allow_multiple_allocations: d.allow_multiple_allocations == Some(true),
                capacity,
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dra_alloc::capacity::format_quantity;
    use k8s_openapi::api::core::v1::NodeSelectorTerm;
    use k8s_openapi::api::resource::v1::{Device, ResourcePool, ResourceSliceSpec};
    use kube::api::ObjectMeta;

    fn req(key: &str, op: &str, values: &[&str]) -> NodeSelectorRequirement {
        NodeSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: Some(values.iter().map(|v| v.to_string()).collect()),
        }
    }

    fn slice(
        name: &str,
        pool: &str,
        generation: i64,
        node: Option<&str>,
        devs: &[&str],
    ) -> ResourceSlice {
        ResourceSlice {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: ResourceSliceSpec {
                driver: "steward.dev".into(),
                pool: ResourcePool {
                    name: pool.into(),
                    generation,
                    resource_slice_count: 1,
                },
                node_name: node.map(str::to_string),
                all_nodes: node.is_none().then_some(true),
                devices: Some(
                    devs.iter()
                        .map(|d| Device {
                            name: d.to_string(),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            },
        }
    }

    #[test]
    fn node_selectors() {
        let node = NodeInfo::named("n1");
        let term = |exprs: Vec<NodeSelectorRequirement>, fields: Vec<NodeSelectorRequirement>| {
            NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_expressions: Some(exprs),
                    match_fields: Some(fields),
                }],
            }
        };
        let by_name = term(vec![], vec![req("metadata.name", "In", &["n0", "n1"])]);
        assert_eq!(node_matches(&by_name, &node), Ok(true));
        let other = term(vec![], vec![req("metadata.name", "In", &["n2"])]);
        assert_eq!(node_matches(&other, &node), Ok(false));
        let host = term(vec![req(HOSTNAME_LABEL, "In", &["n1"])], vec![]);
        assert_eq!(node_matches(&host, &node), Ok(true));
        let both = term(
            vec![req(HOSTNAME_LABEL, "In", &["n1"])],
            vec![req("metadata.name", "NotIn", &["n1"])],
        );
        assert_eq!(node_matches(&both, &node), Ok(false));
        assert_eq!(node_matches(&term(vec![], vec![]), &node), Ok(false));
        let bad = term(vec![], vec![req("spec.x", "In", &["n1"])]);
        assert!(node_matches(&bad, &node).is_err());
    }

    #[test]
    fn newest_generation_and_node_scope() {
        let slices = vec![
            slice("old", "p1", 1, Some("n1"), &["stale"]),
            slice("new", "p1", 2, Some("n1"), &["a", "b"]),
            slice("elsewhere", "p2", 1, Some("n2"), &["c"]),
            slice("shared", "p3", 1, None, &["d"]),
        ];
        let got: Vec<String> = candidates(&slices, &NodeInfo::named("n1"))
            .unwrap()
            .into_iter()
            .map(|c| c.id.2)
            .collect();
        assert_eq!(got, ["a", "b", "d"]);
    }

    #[test]
    fn attribute_domains() {
        let attrs: BTreeMap<String, DeviceAttribute> = [
            (
                "configuration".to_string(),
                DeviceAttribute {
                    string: Some("cam".into()),
                    ..Default::default()
                },
            ),
            (
                "other.io/n".to_string(),
                DeviceAttribute {
                    int: Some(2),
                    ..Default::default()
                },
            ),
        ]
        .into_iter()
        .collect();
        let got = cel_attributes("steward.dev", &attrs);
        assert_eq!(
            got.get(&("steward.dev".to_string(), "configuration".to_string())),
            Some(&Value::String("cam".into()))
        );
        assert_eq!(
            got.get(&("other.io".to_string(), "n".to_string())),
            Some(&Value::Int(2))
        );
    }

    #[test]
    fn quantities_are_milli_units() {
        let ok = [
            ("3", 3000),
            ("500m", 500),
            ("2Ki", 2_048_000),
            ("1.5", 1500),
            (".5k", 500_000),
            ("1G", 10_i128.pow(12)),
        ];
        for (s, m) in ok {
            assert_eq!(parse_quantity(&Quantity(s.into())), Ok(m), "{s}");
        }
        for bad in [
            "",
            "1e3",
            "-1",
            "+1",
            "1x",
            "0.0001",
            "1.2.3",
            "Ki",
            "10000000000E",
        ] {
            assert!(parse_quantity(&Quantity(bad.into())).is_err(), "{bad}");
        }
        // What allocation results carry.
        assert_eq!(format_quantity(3000).0, "3");
        assert_eq!(format_quantity(1500).0, "1500m");
    }
}
