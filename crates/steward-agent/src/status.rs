//! Configuration status and Kubernetes Events (Kubernetes mode only).
//!
//! Each agent owns the `handlers` entries of its node; `instances` and the
//! conditions are the same for every agent (they derive from cluster state),
//! so concurrent writers converge. Writes are read-modify-write guarded by
//! `resourceVersion`, and skipped when nothing changes.

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;
use steward_api::{
    API_VERSION, CONDITION_DETAILS_VALID, CONDITION_DISCOVERING, Configuration,
    ConfigurationStatus, HandlerStatus,
};
use steward_core::discovery::ConfigKey;

use crate::error::InvalidDetails;

/// Event reason for discovery details a handler refused.
pub const REASON_INVALID_DETAILS: &str = "InvalidDiscoveryDetails";
/// Component name in Events.
pub const COMPONENT: &str = "steward-agent";

/// What this node contributes to a Configuration's status.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeContribution {
    /// This node's handlers for the Configuration, sorted.
    pub handlers: Vec<HandlerStatus>,
    /// `Some(Ok)` once a handler accepted the details, `Some(Err)` once one
    /// refused them or their properties could not be resolved.
    pub details: Option<Result<(), InvalidDetails>>,
    /// Instances of the Configuration (cluster-wide), once known.
    pub instances: Option<u32>,
}

/// Writes Configuration status and Events.
#[derive(Clone)]
pub struct StatusWriter {
    client: kube::Client,
    node: String,
}

const MAX_ATTEMPTS: u32 = 5;

impl StatusWriter {
    pub fn new(client: kube::Client, node: impl Into<String>) -> Self {
        Self {
            client,
            node: node.into(),
        }
    }

    /// Merge `mine` into the stored status; returns whether it wrote.
    pub async fn write(
        &self,
        key: &ConfigKey,
        mine: &NodeContribution,
    ) -> Result<bool, kube::Error> {
        let api = Api::<Configuration>::namespaced(self.client.clone(), &key.namespace);
        let mut last = None;
        for _ in 0..MAX_ATTEMPTS {
            let Some(mut obj) = api.get_opt(&key.name).await? else {
                return Ok(false);
            };
            let old = obj.status.clone().unwrap_or_default();
            let new = merged(&old, &self.node, obj.metadata.generation, mine);
            if new == old {
                return Ok(false);
            }
            obj.status = Some(new);
            match api
                .replace_status(&key.name, &PostParams::default(), &obj)
                .await
            {
                Ok(_) => return Ok(true),
                Err(kube::Error::Api(s)) if s.is_conflict() => {
                    last = Some(kube::Error::Api(s));
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| kube::Error::Service("status write gave up".into())))
    }

    /// Record a Warning Event about a Configuration.
    pub async fn warn(
        &self,
        config: &Configuration,
        reason: &str,
        message: &str,
    ) -> Result<(), kube::Error> {
        let namespace = config.metadata.namespace.clone().unwrap_or_default();
        let name = config.metadata.name.clone().unwrap_or_default();
        let now = Timestamp::now();
        let event = Event {
            metadata: ObjectMeta {
                name: Some(format!("{name}.{:x}", now.as_nanosecond().unsigned_abs())),
                namespace: Some(namespace.clone()),
                ..ObjectMeta::default()
            },
            involved_object: ObjectReference {
                api_version: Some(API_VERSION.into()),
                kind: Some("Configuration".into()),
                name: Some(name),
                namespace: Some(namespace.clone()),
                uid: config.metadata.uid.clone(),
                resource_version: config.metadata.resource_version.clone(),
                ..ObjectReference::default()
            },
            reason: Some(reason.into()),
            message: Some(message.into()),
            type_: Some("Warning".into()),
            source: Some(EventSource {
                component: Some(COMPONENT.into()),
                host: Some(self.node.clone()),
            }),
            reporting_component: Some(COMPONENT.into()),
            reporting_instance: Some(self.node.clone()),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            count: Some(1),
            ..Event::default()
        };
        Api::<Event>::namespaced(self.client.clone(), &namespace)
            .create(&PostParams::default(), &event)
            .await
            .map(|_| ())
    }
}

/// The status after replacing `node`'s contribution.
pub fn merged(
    old: &ConfigurationStatus,
    node: &str,
    generation: Option<i64>,
    mine: &NodeContribution,
) -> ConfigurationStatus {
    let mut new = old.clone();
    new.handlers.retain(|h| h.node != node);
    new.handlers.extend(mine.handlers.iter().cloned());
    new.handlers.sort();
    if let Some(n) = mine.instances {
        new.instances = n;
    }
    match &mine.details {
        Some(Ok(())) => set_condition(
            &mut new.conditions,
            CONDITION_DETAILS_VALID,
            "True",
            "Accepted",
            "a discovery handler accepted the details",
            generation,
        ),
        Some(Err(why)) => set_condition(
            &mut new.conditions,
            CONDITION_DETAILS_VALID,
            "False",
            "InvalidDiscoveryDetails",
            &why.to_string(),
            generation,
        ),
        None => {}
    }
    let active = new.handlers.iter().any(|h| h.state == "Active");
    let (status, reason, message) = if active {
        (
            "True",
            "HandlerActive",
            "at least one discovery handler is active",
        )
    } else {
        ("False", "NoActiveHandler", "no discovery handler is active")
    };
    set_condition(
        &mut new.conditions,
        CONDITION_DISCOVERING,
        status,
        reason,
        message,
        generation,
    );
    new
}

/// Sets a condition at the current time (see [`steward_api::set_condition`]).
fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
    generation: Option<i64>,
) {
    steward_api::set_condition(
        conditions,
        type_,
        status,
        reason,
        message,
        generation,
        Time(Timestamp::now()),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(node: &str, state: &str) -> HandlerStatus {
        HandlerStatus {
            node: node.into(),
            name: "debug-echo".into(),
            endpoint: "embedded".into(),
            state: state.into(),
        }
    }

    #[test]
    fn merge_replaces_only_this_nodes_entries_and_is_idempotent() {
        let old = ConfigurationStatus {
            handlers: vec![h("a", "Active"), h("b", "Offline")],
            ..Default::default()
        };
        let mine = NodeContribution {
            handlers: vec![h("b", "Active")],
            details: Some(Err(InvalidDetails::Refused("bad yaml".into()))),
            instances: Some(2),
        };
        let new = merged(&old, "b", Some(3), &mine);
        assert_eq!(new.handlers, vec![h("a", "Active"), h("b", "Active")]);
        assert_eq!(new.instances, 2);
        let dv = new
            .conditions
            .iter()
            .find(|c| c.type_ == CONDITION_DETAILS_VALID)
            .unwrap();
        assert_eq!(
            (dv.status.as_str(), dv.message.as_str()),
            ("False", "bad yaml")
        );
        assert_eq!(dv.observed_generation, Some(3));
        // Applying the same contribution again changes nothing (no write).
        assert_eq!(merged(&new, "b", Some(3), &mine), new);
    }
}
