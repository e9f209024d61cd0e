//! The resource manager's own pod annotations (the `resmgr.steward.dev`
//! domain): their keys, their validation when a sandbox or container is
//! created, the per-container resources annotation parsed, and the block
//! I/O and RDT classes they pick. What a request makes of the QoS and
//! resources annotations (they only narrow the pod spec) is
//! [`super::derive`]'s.

use std::collections::{BTreeMap, HashMap};

use serde::Deserialize;
use steward_core::cpu::{Hints, Qos};

use super::{MAX_MEMORY, MAX_MILLI, QuantityError, parse_cpu_quantity, parse_memory_quantity};
use crate::error::ResmgrError;

/// Annotation domain owned by the resource manager. Unknown keys in this
/// domain are rejected; they are never shown to the policy, which validates
/// the other `*.steward.dev` keys itself.
pub const DOMAIN: &str = "resmgr.steward.dev";
/// Pod annotation: QoS class hint (`Guaranteed`, `Burstable`, `BestEffort`).
pub const QOS_ANNOTATION: &str = "qos.resmgr.steward.dev/class";
/// Pod annotation prefix: per-container requests and limits as JSON
/// (`{"requests":{"cpu":"500m","memory":"64Mi"},"limits":{..}}`), key
/// `resources.resmgr.steward.dev/spec.container.<name>`.
pub const RESOURCES_PREFIX: &str = "resources.resmgr.steward.dev/spec.container.";
/// Pod annotation: block I/O class for every container of the pod.
pub const BLOCKIO_POD: &str = "blockio.resmgr.steward.dev/class";
/// Pod annotation prefix: block I/O class for one container.
pub const BLOCKIO_PREFIX: &str = "blockio.resmgr.steward.dev/class.container.";
/// Pod annotation: RDT class for every container of the pod.
pub const RDT_POD: &str = "rdt.resmgr.steward.dev/class";
/// Pod annotation prefix: RDT class for one container.
pub const RDT_PREFIX: &str = "rdt.resmgr.steward.dev/class.container.";

/// Whether an annotation key is in our own domain.
pub fn is_resmgr_annotation(key: &str) -> bool {
    key.split_once('/')
        .is_some_and(|(d, _)| d == DOMAIN || d.ends_with(&format!(".{DOMAIN}")))
}

/// Per-container resources annotation (Kubernetes quantity strings).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResourcesAnnotation {
    #[serde(default)]
    requests: QuantityPair,
    #[serde(default)]
    limits: QuantityPair,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct QuantityPair {
    #[serde(default)]
    cpu: Option<String>,
    #[serde(default)]
    memory: Option<String>,
}

/// Classes an annotation picks, resolved for one container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Classes {
    /// Block I/O class.
    pub blockio: Option<String>,
    /// RDT class.
    pub rdt: Option<String>,
}

/// Validate a pod's annotations when its sandbox is created: those in our
/// domain ([`validate_own_annotations`]) and the policies' hints.
pub fn validate_annotations(annotations: &HashMap<String, String>) -> Result<(), ResmgrError> {
    validate_own_annotations(annotations)?;
    // The policies' own annotations (`*.steward.dev` outside our domain)
    // are checked now too: a sandbox whose pod carries a malformed hint
    // would be created, then every one of its containers refused.
    let policy: BTreeMap<String, String> = annotations
        .iter()
        .filter(|(k, _)| !is_resmgr_annotation(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Hints::of_container(&policy, "").map_err(|e| ResmgrError::Annotation {
        key: "policy annotations".into(),
        reason: e.to_string(),
    })?;
    Ok(())
}

/// Validate the annotations in our domain; anything unknown or malformed
/// there is an error. `CreateContainer` checks only these: [`derive_request`](super::derive_request)
/// checks the policies' hints itself.
pub fn validate_own_annotations<'a>(
    annotations: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> Result<(), ResmgrError> {
    for (key, value) in annotations {
        if !is_resmgr_annotation(key) {
            continue;
        }
        let err = |reason: String| ResmgrError::Annotation {
            key: key.clone(),
            reason,
        };
        if key == QOS_ANNOTATION {
            parse_qos(value).ok_or_else(|| {
                err(format!(
                    "{value:?} is not Guaranteed, Burstable or BestEffort"
                ))
            })?;
        } else if let Some(name) = key.strip_prefix(RESOURCES_PREFIX) {
            if name.is_empty() {
                return Err(err("no container name after the prefix".into()));
            }
            parse_resources_annotation(value).map_err(|e| err(e.to_string()))?;
        } else if key == BLOCKIO_POD
            || key == RDT_POD
            || key
                .strip_prefix(BLOCKIO_PREFIX)
                .is_some_and(|n| !n.is_empty())
            || key.strip_prefix(RDT_PREFIX).is_some_and(|n| !n.is_empty())
        {
            if value.is_empty()
                || !value
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
            {
                return Err(err(format!("{value:?} is not a class name")));
            }
        } else {
            return Err(err(format!("unknown annotation in the {DOMAIN} domain")));
        }
    }
    Ok(())
}

pub(super) fn parse_qos(s: &str) -> Option<Qos> {
    match s {
        "Guaranteed" => Some(Qos::Guaranteed),
        "Burstable" => Some(Qos::Burstable),
        "BestEffort" => Some(Qos::BestEffort),
        _ => None,
    }
}

pub(super) type Parsed = (Option<u64>, Option<u64>, Option<u64>, Option<u64>);

/// Why the resources annotation was refused.
#[derive(Debug, thiserror::Error)]
pub enum ResourcesAnnotationError {
    /// Not the JSON object the annotation carries.
    #[error("not a resources object: {0}")]
    NotAnObject(#[source] serde_json::Error),
    /// A quantity that does not parse.
    #[error("{resource} quantity: {source}")]
    Quantity {
        /// `cpu` or `memory`.
        resource: &'static str,
        /// Why.
        #[source]
        source: QuantityError,
    },
    /// A quantity beyond what a container can hold.
    #[error("{resource} quantity {value:?} is absurd (more than {max})")]
    Absurd {
        /// `cpu` or `memory`.
        resource: &'static str,
        /// The text.
        value: String,
        /// The largest accepted, in millicores or bytes.
        max: u64,
    },
    /// The request is above the limit.
    #[error("{resource} request {request} exceeds limit {limit}")]
    RequestAboveLimit {
        /// `cpu` (millicores) or `memory` (bytes).
        resource: &'static str,
        /// Request.
        request: u64,
        /// Limit.
        limit: u64,
    },
}

pub(super) fn parse_resources_annotation(value: &str) -> Result<Parsed, ResourcesAnnotationError> {
    use ResourcesAnnotationError as E;
    let a: ResourcesAnnotation = serde_json::from_str(value).map_err(E::NotAnObject)?;
    let quantity = |resource: &'static str,
                    parse: fn(&str) -> Result<u64, QuantityError>,
                    max: u64,
                    q: &Option<String>|
     -> Result<Option<u64>, E> {
        let Some(s) = q.as_deref() else {
            return Ok(None);
        };
        let v = parse(s).map_err(|source| E::Quantity { resource, source })?;
        if v > max {
            return Err(E::Absurd {
                resource,
                value: s.to_owned(),
                max,
            });
        }
        Ok(Some(v))
    };
    let max_memory = MAX_MEMORY as u64;
    let parsed = (
        quantity("cpu", parse_cpu_quantity, MAX_MILLI, &a.requests.cpu)?,
        quantity("cpu", parse_cpu_quantity, MAX_MILLI, &a.limits.cpu)?,
        quantity(
            "memory",
            parse_memory_quantity,
            max_memory,
            &a.requests.memory,
        )?,
        quantity(
            "memory",
            parse_memory_quantity,
            max_memory,
            &a.limits.memory,
        )?,
    );
    for (resource, request, limit) in [("cpu", parsed.0, parsed.1), ("memory", parsed.2, parsed.3)]
    {
        if let (Some(request), Some(limit)) = (request, limit)
            && request > limit
        {
            return Err(E::RequestAboveLimit {
                resource,
                request,
                limit,
            });
        }
    }
    Ok(parsed)
}

/// The block I/O and RDT classes annotated for a container (container
/// annotation wins over the pod one).
pub fn classes_for(annotations: &BTreeMap<String, String>, container: &str) -> Classes {
    let pick = |pod_key: &str, prefix: &str| {
        annotations
            .get(&format!("{prefix}{container}"))
            .or_else(|| annotations.get(pod_key))
            .cloned()
    };
    Classes {
        blockio: pick(BLOCKIO_POD, BLOCKIO_PREFIX),
        rdt: pick(RDT_POD, RDT_PREFIX),
    }
}
