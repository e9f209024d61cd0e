//! Mirroring of the stand-in's pods and node into a Kubernetes API server,
//! the way kubelet reports them: pods are created by the test through the API
//! (so the API server assigns the UID), kubelet only writes their status.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, Event, EventSource, Node, ObjectReference, Pod, PodResourceClaim,
    PodSpec as K8sPodSpec, ResourceClaim as ContainerResourceClaim, ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tracing::debug;

use crate::dra::FAILED_PREPARE_DYNAMIC_RESOURCES;
use crate::error::Error;
use crate::pods::{
    ContainerSpec, ExtendedRequest, ExtendedResourceClaim, Phase, PodSpec, PodStatus,
};

/// Image name put in mirrored containers (nothing is pulled or run).
const PLACEHOLDER_IMAGE: &str = "pause";

fn k8s_container(c: &ContainerSpec) -> Container {
    let limits: BTreeMap<String, Quantity> = c
        .resources
        .iter()
        .map(|(r, n)| (r.clone(), Quantity(n.to_string())))
        .collect();
    Container {
        name: c.name.clone(),
        image: Some(PLACEHOLDER_IMAGE.to_string()),
        resources: Some(ResourceRequirements {
            // Extended resources must have requests equal to limits.
            requests: Some(limits.clone()),
            limits: Some(limits),
            claims: (!c.claims.is_empty()).then(|| {
                c.claims
                    .iter()
                    .map(|cl| ContainerResourceClaim {
                        name: cl.name.clone(),
                        request: cl.request.clone(),
                    })
                    .collect()
            }),
        }),
        ..Default::default()
    }
}

/// Creates the Pod object bound to `node_name` and returns its UID.
pub(crate) async fn create_pod(
    client: &kube::Client,
    node_name: &str,
    spec: &PodSpec,
) -> Result<String, Error> {
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some(spec.name.clone()),
            namespace: Some(spec.namespace.clone()),
            ..Default::default()
        },
        spec: Some(K8sPodSpec {
            node_name: Some(node_name.to_string()),
            restart_policy: Some("Never".to_string()),
            init_containers: (!spec.init_containers.is_empty())
                .then(|| spec.init_containers.iter().map(k8s_container).collect()),
            containers: spec.containers.iter().map(k8s_container).collect(),
            resource_claims: (!spec.resource_claims.is_empty()).then(|| {
                spec.resource_claims
                    .iter()
                    .map(|c| PodResourceClaim {
                        name: c.name.clone(),
                        resource_claim_name: Some(c.resource_claim_name.clone()),
                        resource_claim_template_name: None,
                    })
                    .collect()
            }),
            ..Default::default()
        }),
        status: None,
    };
    let api: Api<Pod> = Api::namespaced(client.clone(), &spec.namespace);
    let created = api.create(&PostParams::default(), &pod).await?;
    created
        .metadata
        .uid
        .filter(|u| !u.is_empty())
        .ok_or_else(|| Error::ApiObject(format!("pod {}/{} has no uid", spec.namespace, spec.name)))
}

/// The UID of the Pod object named like `spec`, if there is one.
pub(crate) async fn existing_pod_uid(
    client: &kube::Client,
    spec: &PodSpec,
) -> Result<Option<String>, Error> {
    let api: Api<Pod> = Api::namespaced(client.clone(), &spec.namespace);
    Ok(api.get_opt(&spec.name).await?.and_then(|p| p.metadata.uid))
}

/// The pod's `status.extendedResourceClaimStatus`, if the scheduler wrote
/// one.
pub(crate) async fn extended_resource_claim(
    client: &kube::Client,
    spec: &PodSpec,
) -> Result<Option<ExtendedResourceClaim>, Error> {
    let api: Api<Pod> = Api::namespaced(client.clone(), &spec.namespace);
    let status = api
        .get_opt(&spec.name)
        .await?
        .and_then(|p| p.status)
        .and_then(|s| s.extended_resource_claim_status);
    Ok(status.map(|s| ExtendedResourceClaim {
        resource_claim_name: s.resource_claim_name,
        mappings: s
            .request_mappings
            .into_iter()
            .map(|m| ExtendedRequest {
                container: m.container_name,
                resource: m.resource_name,
                request: m.request_name,
            })
            .collect(),
    }))
}

/// Records a Warning event about the pod, as kubelet's event recorder does.
pub(crate) async fn warning_event(
    client: &kube::Client,
    node_name: &str,
    spec: &PodSpec,
    uid: &str,
    reason: &str,
    message: &str,
) -> Result<(), Error> {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let event = Event {
        metadata: ObjectMeta {
            name: Some(format!("{}.{}", spec.name, uuid::Uuid::new_v4().simple())),
            namespace: Some(spec.namespace.clone()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".to_string()),
            kind: Some("Pod".to_string()),
            name: Some(spec.name.clone()),
            namespace: Some(spec.namespace.clone()),
            uid: Some(uid.to_string()),
            ..Default::default()
        },
        reason: Some(reason.to_string()),
        message: Some(message.to_string()),
        type_: Some("Warning".to_string()),
        count: Some(1),
        first_timestamp: Some(now.clone()),
        last_timestamp: Some(now),
        source: Some(EventSource {
            component: Some("kubelet".to_string()),
            host: Some(node_name.to_string()),
        }),
        reporting_component: Some("kubelet".to_string()),
        reporting_instance: Some(node_name.to_string()),
        ..Default::default()
    };
    let api: Api<Event> = Api::namespaced(client.clone(), &spec.namespace);
    api.create(&PostParams::default(), &event).await?;
    Ok(())
}

/// A pod whose DRA resources could not be prepared: kubelet reports it
/// through an event and leaves the containers `ContainerCreating`.
fn preparing_failed(pod: &PodStatus) -> bool {
    pod.phase == Phase::Pending && pod.reason.as_deref() == Some(FAILED_PREPARE_DYNAMIC_RESOURCES)
}

fn container_statuses(pod: &PodStatus) -> Value {
    let state = |_: &ContainerSpec| -> Value {
        match pod.phase {
            Phase::Running => json!({"running": {}}),
            Phase::Succeeded => json!({"terminated": {"exitCode": 0, "reason": "Completed"}}),
            Phase::Failed => json!({"terminated": {"exitCode": 1, "reason": "Error"}}),
            Phase::Pending if preparing_failed(pod) => {
                json!({"waiting": {"reason": "ContainerCreating"}})
            }
            Phase::Pending => json!({"waiting": {
                "reason": pod.reason.clone().unwrap_or_else(|| "ContainerCreating".to_string()),
                "message": pod.message.clone(),
            }}),
        }
    };
    let entry = |c: &ContainerSpec| {
        json!({
            "name": c.name,
            "image": PLACEHOLDER_IMAGE,
            "imageID": "",
            "ready": pod.phase == Phase::Running,
            "restartCount": 0,
            "state": state(c),
        })
    };
    Value::Array(pod.spec.containers.iter().map(entry).collect())
}

/// Writes the pod's phase (and reason/message, container states) through the
/// status subresource.
pub(crate) async fn patch_pod_status(client: &kube::Client, pod: &PodStatus) -> Result<(), Error> {
    let (reason, message) = if preparing_failed(pod) {
        (None, None)
    } else {
        (pod.reason.clone(), pod.message.clone())
    };
    let mut status = json!({
        "phase": pod.phase.as_str(),
        "reason": reason,
        "message": message,
    });
    // A rejected pod never had containers created.
    let rejected = pod.phase == Phase::Failed && pod.reason.is_some();
    if !rejected && let Some(obj) = status.as_object_mut() {
        obj.insert("containerStatuses".to_string(), container_statuses(pod));
    }
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.spec.namespace);
    api.patch_status(
        &pod.spec.name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": status })),
    )
    .await?;
    debug!(pod = %pod.spec.name, phase = pod.phase.as_str(), "mirrored pod status");
    Ok(())
}

/// Deletes the Pod object immediately (grace period 0); a missing object is fine.
pub(crate) async fn delete_pod(client: &kube::Client, spec: &PodSpec) -> Result<(), Error> {
    let api: Api<Pod> = Api::namespaced(client.clone(), &spec.namespace);
    match api
        .delete(&spec.name, &DeleteParams::default().grace_period(0))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Creates the Node object if it does not exist yet.
pub(crate) async fn ensure_node(client: &kube::Client, node_name: &str) -> Result<(), Error> {
    let node = Node {
        metadata: ObjectMeta {
            name: Some(node_name.to_string()),
            labels: Some(
                [("kubernetes.io/hostname".to_string(), node_name.to_string())]
                    .into_iter()
                    .collect(),
            ),
            ..Default::default()
        },
        ..Default::default()
    };
    let api: Api<Node> = Api::all(client.clone());
    match api.create(&PostParams::default(), &node).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Extended resource capacity and allocatable of the node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct NodeResources {
    pub capacity: BTreeMap<String, usize>,
    pub allocatable: BTreeMap<String, usize>,
}

/// Patches the node status with `now`; resources published before but no
/// longer known are reported as 0 (what kubelet shows for a resource whose
/// plugin has not re-registered yet).
pub(crate) async fn patch_node_resources(
    client: &kube::Client,
    node_name: &str,
    before: &NodeResources,
    now: &NodeResources,
) -> Result<(), Error> {
    let render = |now: &BTreeMap<String, usize>, before: &BTreeMap<String, usize>| {
        let mut m = serde_json::Map::new();
        for k in before.keys() {
            m.insert(k.clone(), json!("0"));
        }
        for (k, v) in now {
            m.insert(k.clone(), json!(v.to_string()));
        }
        Value::Object(m)
    };
    let patch = json!({
        "status": {
            "capacity": render(&now.capacity, &before.capacity),
            "allocatable": render(&now.allocatable, &before.allocatable),
            "conditions": [{
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "kubelet is posting ready status",
            }],
        }
    });
    let api: Api<Node> = Api::all(client.clone());
    api.patch_status(node_name, &PatchParams::default(), &Patch::Merge(patch))
        .await?;
    debug!(node = node_name, "mirrored node resources");
    Ok(())
}
