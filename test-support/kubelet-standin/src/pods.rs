//! Pods as the test hands them to the stand-in, and the stand-in's record of them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A container's use of one of the pod's resource claims
/// (`container.resources.claims[]`).
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ContainerClaim {
    /// Name of an entry of the pod's resource claims.
    pub name: String,
    /// Only the devices allocated for this request of the claim (all when `None`).
    pub request: Option<String>,
}

/// A container of a test pod: its name, its extended resource limits and
/// the resource claims it uses.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerSpec {
    pub name: String,
    /// Extended resource limits (resource name → count).
    pub resources: BTreeMap<String, i64>,
    /// Pod resource claims this container uses.
    #[serde(default)]
    pub claims: Vec<ContainerClaim>,
}

impl ContainerSpec {
    /// A container without resource limits.
    pub fn new(name: impl Into<String>) -> Self {
        ContainerSpec {
            name: name.into(),
            ..Default::default()
        }
    }

    /// Adds (or replaces) a limit for an extended resource.
    pub fn limit(mut self, resource: impl Into<String>, count: i64) -> Self {
        self.resources.insert(resource.into(), count);
        self
    }

    /// Uses the pod resource claim `name` (all of its devices).
    pub fn claim(mut self, name: impl Into<String>) -> Self {
        self.claims.push(ContainerClaim {
            name: name.into(),
            request: None,
        });
        self
    }

    /// Uses the devices of one request of the pod resource claim `name`.
    pub fn claim_request(mut self, name: impl Into<String>, request: impl Into<String>) -> Self {
        self.claims.push(ContainerClaim {
            name: name.into(),
            request: Some(request.into()),
        });
        self
    }
}

/// A pod-level resource claim (`pod.spec.resourceClaims[]` with
/// `resourceClaimName`): the name containers refer to, and the
/// ResourceClaim in the pod's namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodResourceClaim {
    pub name: String,
    pub resource_claim_name: String,
}

/// The name under which the stand-in lists the scheduler's claim for a
/// pod's extended resources among the pod's claims.
pub const EXTENDED_RESOURCE_CLAIM: &str = "extended-resources";

/// One (container, extended resource) the scheduler backed by a request of
/// the pod's extended-resource claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtendedRequest {
    pub container: String,
    pub resource: String,
    pub request: String,
}

/// A pod's `status.extendedResourceClaimStatus`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtendedResourceClaim {
    pub resource_claim_name: String,
    pub mappings: Vec<ExtendedRequest>,
}

/// A pod to admit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodSpec {
    pub namespace: String,
    pub name: String,
    /// UID to use; generated when absent. Ignored when the pod is mirrored into
    /// an API server, which assigns the UID.
    pub uid: Option<String>,
    pub init_containers: Vec<ContainerSpec>,
    pub containers: Vec<ContainerSpec>,
    /// DRA resource claims of the pod (need an API client: kubelet reads
    /// the ResourceClaims).
    #[serde(default)]
    pub resource_claims: Vec<PodResourceClaim>,
}

impl PodSpec {
    /// An empty pod.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        PodSpec {
            namespace: namespace.into(),
            name: name.into(),
            ..Default::default()
        }
    }

    /// Sets the UID.
    pub fn uid(mut self, uid: impl Into<String>) -> Self {
        self.uid = Some(uid.into());
        self
    }

    /// Appends an init container.
    pub fn init_container(mut self, c: ContainerSpec) -> Self {
        self.init_containers.push(c);
        self
    }

    /// Appends an app container.
    pub fn container(mut self, c: ContainerSpec) -> Self {
        self.containers.push(c);
        self
    }

    /// Adds a resource claim `name` referring to the ResourceClaim
    /// `claim_name` in the pod's namespace.
    pub fn resource_claim(
        mut self,
        name: impl Into<String>,
        claim_name: impl Into<String>,
    ) -> Self {
        self.resource_claims.push(PodResourceClaim {
            name: name.into(),
            resource_claim_name: claim_name.into(),
        });
        self
    }

    /// The pod as kubelet serves it once the scheduler backed some of its
    /// extended resources by DRA (`status.extendedResourceClaimStatus`,
    /// KEP-5004): the claim joins the pod's claims as
    /// [`EXTENDED_RESOURCE_CLAIM`], and each mapped container uses its
    /// request instead of asking a device plugin for the resource.
    pub(crate) fn with_extended_claim(
        mut self,
        claim: &ExtendedResourceClaim,
    ) -> Result<Self, String> {
        for m in &claim.mappings {
            let Some(c) = self
                .init_containers
                .iter_mut()
                .chain(self.containers.iter_mut())
                .find(|c| c.name == m.container)
            else {
                return Err(format!(
                    "extendedResourceClaimStatus maps container {:?}, which the pod does not have",
                    m.container
                ));
            };
            c.resources.remove(&m.resource);
            c.claims.push(ContainerClaim {
                name: EXTENDED_RESOURCE_CLAIM.to_owned(),
                request: Some(m.request.clone()),
            });
        }
        self.resource_claims.push(PodResourceClaim {
            name: EXTENDED_RESOURCE_CLAIM.to_owned(),
            resource_claim_name: claim.resource_claim_name.clone(),
        });
        Ok(self)
    }

    /// The ResourceClaim name behind the pod claim `name`.
    pub(crate) fn claim_name(&self, name: &str) -> Option<&str> {
        self.resource_claims
            .iter()
            .find(|c| c.name == name)
            .map(|c| c.resource_claim_name.as_str())
    }

    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.name.is_empty() || self.namespace.is_empty() {
            return Err("namespace and name are required".to_string());
        }
        if self.containers.is_empty() {
            return Err("a pod needs at least one container".to_string());
        }
        let mut seen = std::collections::BTreeSet::new();
        for c in self.init_containers.iter().chain(&self.containers) {
            if c.name.is_empty() {
                return Err("container names must not be empty".to_string());
            }
            if !seen.insert(c.name.as_str()) {
                return Err(format!("duplicate container name {:?}", c.name));
            }
            if let Some((r, n)) = c.resources.iter().find(|(_, n)| **n < 0) {
                return Err(format!(
                    "container {:?}: negative quantity {n} for {r}",
                    c.name
                ));
            }
            let mut used = std::collections::BTreeSet::new();
            for claim in &c.claims {
                if self.claim_name(&claim.name).is_none() {
                    return Err(format!(
                        "container {:?}: claim {:?} must be one of the pod's resource claims",
                        c.name, claim.name
                    ));
                }
                if !used.insert(claim) {
                    return Err(format!(
                        "container {:?}: claim {:?} listed twice",
                        c.name, claim.name
                    ));
                }
            }
        }
        let mut claims = std::collections::BTreeSet::new();
        for claim in &self.resource_claims {
            if claim.name.is_empty() || claim.resource_claim_name.is_empty() {
                return Err("resource claims need a name and a resourceClaimName".to_string());
            }
            if !claims.insert(claim.name.as_str()) {
                return Err(format!("duplicate resource claim name {:?}", claim.name));
            }
        }
        Ok(())
    }
}

/// Pod phase, as in `PodStatus.phase`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    Pending,
    Running,
    Succeeded,
    Failed,
}

impl Phase {
    /// Whether a pod in this phase is done (its devices are free again).
    pub fn is_terminal(self) -> bool {
        matches!(self, Phase::Succeeded | Phase::Failed)
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Running => "Running",
            Phase::Succeeded => "Succeeded",
            Phase::Failed => "Failed",
        }
    }
}

/// What the stand-in knows about a pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodStatus {
    pub uid: String,
    pub spec: PodSpec,
    pub phase: Phase,
    /// Set on rejection (`UnexpectedAdmissionError`, `OutOf<resource>`) or
    /// container start failure.
    pub reason: Option<String>,
    pub message: Option<String>,
}
