//! Pods as the test hands them to the stand-in, and the stand-in's record of them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A container of a test pod: its name and its extended resource limits.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerSpec {
    pub name: String,
    /// Extended resource limits (resource name → count).
    pub resources: BTreeMap<String, i64>,
}

impl ContainerSpec {
    /// A container without resource limits.
    pub fn new(name: impl Into<String>) -> Self {
        ContainerSpec {
            name: name.into(),
            resources: BTreeMap::new(),
        }
    }

    /// Adds (or replaces) a limit for an extended resource.
    pub fn limit(mut self, resource: impl Into<String>, count: i64) -> Self {
        self.resources.insert(resource.into(), count);
        self
    }
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
