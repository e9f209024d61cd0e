//! What kube-scheduler's DynamicResources plugin does for a pod that asks
//! for an extended resource backed by DRA (KEP-5004, `DRAExtendedResource`,
//! beta in 1.36): on a node whose `status.allocatable` does not have the
//! resource, a DeviceClass whose `extendedResourceName` is that resource
//! (or whose implicit name `deviceclass.resource.kubernetes.io/<class>` is)
//! serves it. The scheduler makes one ResourceClaim for the pod, annotated
//! `resource.kubernetes.io/extended-resource-claim: "true"` and owned by the
//! pod, with one request per (container, resource), allocates it, and
//! records the mapping in the pod's `status.extendedResourceClaimStatus`,
//! which kubelet reads to prepare the claim and hand each container its
//! devices.
//!
//! Stand-in only: the claim is made and allocated in one call for the node
//! the test names (kube-scheduler does it in Reserve/PreBind for the node
//! it picked); request names are `c<container>-e<resource>` in the order
//! of init containers then containers, resources sorted by name (the names
//! are the scheduler's own choice; kubelet reads them from the mapping);
//! requests only, and a quantity must be a whole number. The claim is
//! owned by the pod, so the stand-in's garbage collector deletes it with
//! the pod; [`release_extended_resources`] deletes it at once (a pod that
//! never ran).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Container, Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::dra_alloc::{AllocError, allocate_claim};

/// The annotation on the claim the scheduler makes.
pub const EXTENDED_RESOURCE_CLAIM_ANNOTATION: &str =
    "resource.kubernetes.io/extended-resource-claim";
/// The prefix of a DeviceClass's implicit extended resource name.
pub const IMPLICIT_PREFIX: &str = "deviceclass.resource.kubernetes.io/";

/// One (container, resource) served by a request of the claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestMapping {
    pub container: String,
    pub resource: String,
    pub request: String,
    pub class: String,
    pub count: i64,
}

fn invalid(who: &str, message: impl Into<String>) -> AllocError {
    AllocError::Invalid {
        claim: who.to_owned(),
        message: message.into(),
    }
}

/// Native resources and `kubernetes.io/`-prefixed names are never extended
/// resources.
fn is_extended(name: &str) -> bool {
    name.contains('/') && !name.starts_with("kubernetes.io/") && !name.starts_with("requests.")
}

/// Extended resource name → class name. Two classes naming one resource:
/// the one created later wins; at the same time, the name sorted first.
fn classes_by_resource(classes: Vec<DeviceClass>) -> BTreeMap<String, String> {
    let mut sorted = classes;
    sorted.sort_by(|a, b| {
        let t = |c: &DeviceClass| c.metadata.creation_timestamp.clone().map(|t| t.0);
        t(b).cmp(&t(a))
            .then_with(|| a.name_any().cmp(&b.name_any()))
    });
    let mut out = BTreeMap::new();
    for c in sorted {
        let name = c.name_any();
        if let Some(r) = &c.spec.extended_resource_name {
            out.entry(r.clone()).or_insert_with(|| name.clone());
        }
        out.entry(format!("{IMPLICIT_PREFIX}{name}"))
            .or_insert(name);
    }
    out
}

/// The requests the pod's extended resources need on a node with
/// `allocatable`, or why the pod does not fit there.
pub fn mappings(
    pod: &Pod,
    allocatable: &BTreeSet<String>,
    classes: &BTreeMap<String, String>,
) -> Result<Vec<RequestMapping>, String> {
    let Some(spec) = &pod.spec else {
        return Ok(Vec::new());
    };
    let containers: Vec<&Container> = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .collect();
    let mut out = Vec::new();
    for (ci, c) in containers.iter().enumerate() {
        let requests = c
            .resources
            .as_ref()
            .and_then(|r| r.requests.clone().or_else(|| r.limits.clone()))
            .unwrap_or_default();
        let mut ei = 0;
        for (resource, quantity) in requests {
            if !is_extended(&resource) || allocatable.contains(&resource) {
                continue;
            }
            let Some(class) = classes.get(&resource) else {
                return Err(format!("Insufficient {resource}"));
            };
            let count: i64 = quantity.0.parse().map_err(|_| {
                format!("{resource}: quantity {} is not a whole number", quantity.0)
            })?;
            if count <= 0 {
                continue;
            }
            out.push(RequestMapping {
                container: c.name.clone(),
                resource,
                request: format!("c{ci}-e{ei}"),
                class: class.clone(),
                count,
            });
            ei += 1;
        }
    }
    Ok(out)
}

/// Makes, allocates on `node` and records the claim for pod `pod_name`'s
/// extended resources that `node` does not offer through a device plugin.
/// `Ok(None)` when there are none. A claim that cannot be allocated is
/// deleted again (the pod does not fit the node).
pub async fn schedule_extended_resources(
    client: &kube::Client,
    namespace: &str,
    pod_name: &str,
    node: &str,
) -> Result<Option<ResourceClaim>, AllocError> {
    let who = format!("{namespace}/{pod_name}");
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let pod = pods.get(pod_name).await?;
    let pod_uid = pod
        .metadata
        .uid
        .clone()
        .ok_or_else(|| invalid(&who, "the pod has no uid"))?;
    let allocatable: BTreeSet<String> = Api::<Node>::all(client.clone())
        .get_opt(node)
        .await?
        .and_then(|n| n.status)
        .and_then(|s| s.allocatable)
        .map(|a| a.into_keys().collect())
        .unwrap_or_default();
    let classes = classes_by_resource(
        Api::<DeviceClass>::all(client.clone())
            .list(&ListParams::default())
            .await?
            .items,
    );
    let wanted = mappings(&pod, &allocatable, &classes).map_err(|m| AllocError::Unsatisfiable {
        claim: who.clone(),
        request: String::new(),
        message: m,
    })?;
    if wanted.is_empty() {
        return Ok(None);
    }
    let claim_name = format!(
        "{pod_name}-extended-resources-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..5]
    );
    let requests: Vec<serde_json::Value> = wanted
        .iter()
        .map(|m| {
            json!({"name": m.request, "exactly": {
                "deviceClassName": m.class,
                "allocationMode": "ExactCount",
                "count": m.count,
            }})
        })
        .collect();
    let claim: ResourceClaim = serde_json::from_value(json!({
        "metadata": {
            "name": claim_name,
            "namespace": namespace,
            "annotations": {EXTENDED_RESOURCE_CLAIM_ANNOTATION: "true"},
            "ownerReferences": [{
                "apiVersion": "v1", "kind": "Pod", "name": pod_name, "uid": pod_uid,
                "controller": true, "blockOwnerDeletion": true,
            }],
        },
        "spec": {"devices": {"requests": requests}},
    }))
    .map_err(|e| invalid(&who, e.to_string()))?;
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), namespace);
    claims.create(&PostParams::default(), &claim).await?;
    let allocated =
        match allocate_claim(client, namespace, &claim_name, pod_name, &pod_uid, node).await {
            Ok(c) => c,
            Err(e) => {
                let _ = claims.delete(&claim_name, &DeleteParams::default()).await;
                return Err(e);
            }
        };
    let mappings: Vec<serde_json::Value> = wanted
        .iter()
        .map(|m| {
            json!({"containerName": m.container, "resourceName": m.resource, "requestName": m.request})
        })
        .collect();
    pods.patch_status(
        pod_name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"extendedResourceClaimStatus": {
            "resourceClaimName": claim_name,
            "requestMappings": mappings,
        }}})),
    )
    .await?;
    Ok(Some(allocated))
}

/// Deletes the claim made for pod `pod_name`'s extended resources (what
/// the resourceclaim controller does for a pod that will not run).
/// `Ok(false)` when there was none.
pub async fn release_extended_resources(
    client: &kube::Client,
    namespace: &str,
    pod_name: &str,
    pod_uid: &str,
) -> Result<bool, AllocError> {
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), namespace);
    let mut released = false;
    for claim in claims.list(&ListParams::default()).await?.items {
        let ours = claim.annotations().get(EXTENDED_RESOURCE_CLAIM_ANNOTATION)
            == Some(&"true".to_owned())
            && claim
                .owner_references()
                .iter()
                .any(|o| o.kind == "Pod" && o.uid == pod_uid && o.name == pod_name);
        if ours {
            match claims
                .delete(&claim.name_any(), &DeleteParams::default())
                .await
            {
                Ok(_) => released = true,
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(released)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(name: &str, resource: Option<&str>, created: i64) -> DeviceClass {
        serde_json::from_value(json!({
            "metadata": {"name": name, "creationTimestamp": format!("2026-01-01T00:00:{created:02}Z")},
            "spec": {"extendedResourceName": resource},
        }))
        .unwrap()
    }

    fn pod(requests: &[(&str, &str, &str)]) -> Pod {
        let containers: Vec<serde_json::Value> = requests
            .iter()
            .map(|(c, r, q)| json!({"name": c, "resources": {"requests": {*r: q}, "limits": {*r: q}}}))
            .collect();
        serde_json::from_value(
            json!({"metadata": {"name": "p"}, "spec": {"containers": containers}}),
        )
        .unwrap()
    }

    #[test]
    fn the_later_class_serves_a_resource_and_implicit_names_work() {
        let m = classes_by_resource(vec![
            class("old", Some("steward.dev/cam"), 1),
            class("new", Some("steward.dev/cam"), 2),
            class("b", Some("steward.dev/mic"), 3),
            class("a", Some("steward.dev/mic"), 3),
        ]);
        assert_eq!(m["steward.dev/cam"], "new");
        assert_eq!(m["steward.dev/mic"], "a");
        assert_eq!(m["deviceclass.resource.kubernetes.io/old"], "old");
    }

    #[test]
    fn a_node_with_the_resource_allocatable_keeps_it_on_the_device_plugin() {
        let classes = classes_by_resource(vec![class("cams", Some("steward.dev/cam"), 1)]);
        let p = pod(&[("main", "steward.dev/cam", "1"), ("side", "cpu", "1")]);
        let dra = mappings(&p, &BTreeSet::new(), &classes).unwrap();
        assert_eq!(
            dra,
            [RequestMapping {
                container: "main".into(),
                resource: "steward.dev/cam".into(),
                request: "c0-e0".into(),
                class: "cams".into(),
                count: 1,
            }]
        );
        let plugin = BTreeSet::from(["steward.dev/cam".to_owned()]);
        assert_eq!(mappings(&p, &plugin, &classes).unwrap(), []);
        // Neither a plugin nor a class: the pod does not fit.
        let other = pod(&[("main", "steward.dev/mic", "1")]);
        assert_eq!(
            mappings(&other, &BTreeSet::new(), &classes),
            Err("Insufficient steward.dev/mic".into())
        );
    }
}
