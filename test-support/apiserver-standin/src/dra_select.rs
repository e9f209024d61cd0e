//! Which devices of the published ResourceSlices a node can use, and what a
//! selector sees of each: the part of kube-scheduler's structured allocator
//! that gathers pools and candidate devices.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement};
use k8s_openapi::api::resource::v1::{
    DeviceAttribute, DeviceTaint, DeviceToleration, ResourceSlice,
};

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
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
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
}
