//! One `resource.k8s.io/v1` DeviceClass per Configuration, written by the
//! leading `steward controller` when `--dra-device-classes` is on
//! ([`crate::ControllerConfig::device_classes`]).
//!
//! With `spec.draExtendedResources` on, each Instance of the Configuration
//! also gets a class with `extendedResourceName` ([`extended`]).
//!
//! A Configuration `<name>` in `<namespace>` gets the cluster-scoped class
//! `<name>.<namespace>.steward.dev` ([`class_name`]) with one CEL selector,
//! `device.driver == "steward.dev" && device.attributes["steward.dev"].namespace == "<namespace>" && device.attributes["steward.dev"].configuration == "<name>"`
//! ([`selector`]): the devices the agents publish for that Configuration
//! (`steward_core::dra`). Classes steward writes carry the label
//! `app.kubernetes.io/managed-by: steward` and the annotation
//! `steward.dev/configuration: <namespace>/<name>`; only classes with that
//! label are followed, updated or deleted — any other class, even one with
//! the name steward would use, is left alone, and a Warning Event
//! ([`DEVICE_CLASS_TAKEN`]) on the Configuration says why.
//!
//! Level-triggered like the reservation decisions: after each batch of
//! changes to Configurations or owned classes, the wanted classes are
//! compared with the owned ones and only differences are written — create,
//! replace conditional on the resourceVersion read, delete conditional on
//! it. A write that loses (409) is decided again from what the watch
//! brings; any other failure is retried after [`RETRY`]. On a cluster that
//! does not serve `resource.k8s.io/v1` DeviceClasses, one warning says so
//! and nothing is written (the reservation decisions go on).

mod extended;
mod names;
mod plan;

use std::collections::BTreeSet;
use std::time::Duration;

use futures::{FutureExt as _, StreamExt};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::resource::v1::DeviceClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};
use steward_api::{
    CONDITION_DRA_EXTENDED_RESOURCES, Configuration, REASON_CLASSES_WRITTEN, REASON_FEATURE_OFF,
    set_condition,
};
use steward_kube::{Change, EventSink, ObjectKey};

use crate::leader_watches::LeaderWatches;

pub use extended::{
    ExtendedInstance, INSTANCE_ANNOTATION, add_desired, instance_class_for, instance_class_name,
};
pub use plan::{
    Action, CONFIGURATION_ANNOTATION, Classes, ConfigurationInfo, MANAGED_BY, MANAGED_BY_LABEL,
    OWNED_SELECTOR, actions, class_for, class_name, desired, selector,
};

/// Event reason when a class steward wants is taken by someone else's.
pub const DEVICE_CLASS_TAKEN: &str = "DeviceClassNameTaken";

/// How long a failed write waits before the classes are compared again.
pub const RETRY: Duration = Duration::from_secs(1);

/// What one write came to.
enum Outcome {
    /// Stored: the object as the server returned it.
    Written(Box<DeviceClass>),
    /// Deleted, or found already gone.
    Gone(String),
    /// Lost to a newer version (the watch brings it) or refused for a
    /// reason a retry does not change.
    Skipped,
    /// Failed for a reason a retry may change.
    Failed,
}

/// Keeps the DeviceClasses what the Configurations say; never returns (the
/// caller drops it when no longer leading), except at once, after one
/// warning, on a cluster that does not serve `resource.k8s.io/v1`
/// DeviceClasses (Kubernetes before 1.34).
pub async fn maintain(client: kube::Client, events: EventSink) {
    let watches = LeaderWatches::new(client.clone());
    maintain_with(client, events, &watches).await;
}

/// [`maintain`] on the leader's shared watches.
pub async fn maintain_with(client: kube::Client, events: EventSink, watches: &LeaderWatches) {
    if !steward_kube::dra_served(&client, "deviceclasses", "writing DeviceClasses").await {
        return;
    }
    let api = Api::<DeviceClass>::all(client.clone());
    let status_client = client.clone();
    let mut configurations = watches.configurations().subscribe();
    let mut instances = watches.instances().subscribe();
    let mut classes = watches.device_classes(OWNED_SELECTOR).subscribe();
    let mut state = Classes::default();
    let mut retry_at: Option<tokio::time::Instant> = None;
    let mut noted: Vec<String> = Vec::new();
    // Names taken by a class steward does not own: warned about once.
    let mut foreign: BTreeSet<String> = BTreeSet::new();
    loop {
        let retry = async {
            match retry_at {
                Some(t) => tokio::time::sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            Some(c) = configurations.next() => state.configurations(c),
            Some(c) = instances.next() => state.instances(c),
            Some(c) = classes.next() => state.classes(c),
            () = retry => {}
        }
        // Take everything already waiting: a burst is one comparison.
        while let Some(Some(c)) = configurations.next().now_or_never() {
            state.configurations(c);
        }
        while let Some(Some(c)) = instances.next().now_or_never() {
            state.instances(c);
        }
        while let Some(Some(c)) = classes.next().now_or_never() {
            state.classes(c);
        }
        let (due, notes) = state.plan();
        if notes != noted {
            for n in &notes {
                tracing::warn!("{n}");
            }
            noted = notes;
        }
        retry_at = None;
        for action in due {
            let about = match &action {
                Action::Create(c) => state.configuration_of(c),
                _ => None,
            };
            let extended = match &action {
                Action::Create(c) | Action::Replace(c) => c.spec.extended_resource_name.is_some(),
                Action::Delete { .. } => false,
            };
            match write(&api, action, &mut foreign, &events, about).await {
                Outcome::Written(c) => {
                    let dropped = extended && c.spec.extended_resource_name.is_none();
                    state.classes(Change::Applied(*c));
                    if dropped && state.extended_unsupported() {
                        tracing::warn!(
                            "the API server dropped DeviceClass.spec.extendedResourceName: DRAExtendedResource is off (Kubernetes 1.35 has it off by default; on from 1.36). Configurations with draExtendedResources are served through their device plugins only"
                        );
                    }
                }
                Outcome::Gone(name) => state.forget(&name),
                Outcome::Skipped => {}
                Outcome::Failed => {
                    retry_at = Some(tokio::time::Instant::now() + RETRY);
                }
            }
        }
        for (key, served) in state.conditions_due() {
            if let Err(e) = write_condition(&status_client, &key, served).await {
                tracing::warn!(configuration = %format!("{}/{}", key.namespace, key.name), error = %e, "writing the DRAExtendedResources condition failed; retrying");
                retry_at = Some(tokio::time::Instant::now() + RETRY);
            }
        }
    }
}

/// Sets Configuration `key`'s `DRAExtendedResources` condition, read-modify-
/// write on its status (the agents write it too); nothing when it already
/// says so.
async fn write_condition(
    client: &kube::Client,
    key: &ObjectKey,
    served: bool,
) -> Result<(), kube::Error> {
    let api = Api::<Configuration>::namespaced(client.clone(), &key.namespace);
    let (status, reason, message) = if served {
        (
            "True",
            REASON_CLASSES_WRITTEN,
            "its Instances' DeviceClasses carry extendedResourceName: agents with --dra serve them through DRA",
        )
    } else {
        (
            "False",
            REASON_FEATURE_OFF,
            "the API server drops DeviceClass.spec.extendedResourceName (DRAExtendedResource off; Kubernetes 1.36+ has it on): its Instances are served through device plugins",
        )
    };
    let mut attempt = 0;
    loop {
        attempt += 1;
        // Read through the status subresource: the controller's grant is
        // get and update of configurations/status, not of Configurations.
        let mut c = match api.get_status(&key.name).await {
            Ok(c) => c,
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(()),
            Err(e) => return Err(e),
        };
        let mut s = c.status.take().unwrap_or_default();
        if s.conditions
            .iter()
            .any(|x| x.type_ == CONDITION_DRA_EXTENDED_RESOURCES && x.status == status)
        {
            return Ok(());
        }
        set_condition(
            &mut s.conditions,
            CONDITION_DRA_EXTENDED_RESOURCES,
            status,
            reason,
            message,
            c.metadata.generation,
            Time(Timestamp::now()),
        );
        c.status = Some(s);
        match api
            .replace_status(&key.name, &PostParams::default(), &c)
            .await
        {
            Ok(_) => {
                tracing::info!(configuration = %format!("{}/{}", key.namespace, key.name), status, "DRAExtendedResources condition set");
                return Ok(());
            }
            Err(kube::Error::Api(e)) if e.code == 409 && attempt < 5 => {}
            Err(e) => return Err(e),
        }
    }
}

/// One write, conditional on what was read.
/// A class of someone else's in the way gets one Warning Event on the
/// Configuration (`about`) that wanted the name.
async fn write(
    api: &Api<DeviceClass>,
    action: Action,
    foreign: &mut BTreeSet<String>,
    events: &EventSink,
    about: Option<ObjectReference>,
) -> Outcome {
    let pp = PostParams::default();
    match action {
        Action::Create(class) => {
            let name = class.name_any();
            match api.create(&pp, &class).await {
                Ok(c) => {
                    tracing::info!(class = %name, "DeviceClass created");
                    foreign.remove(&name);
                    Outcome::Written(Box::new(c))
                }
                // Not in the owned watch, yet there: a class of someone
                // else's (or one whose label was taken off). Left alone.
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    if foreign.insert(name.clone()) {
                        tracing::warn!(class = %name, "a DeviceClass of that name exists without the label {MANAGED_BY_LABEL}={MANAGED_BY}; left alone");
                        if let Some(reference) = about {
                            events.emit(
                                reference,
                                EventType::Warning,
                                DEVICE_CLASS_TAKEN,
                                "WriteDeviceClass",
                                format!("DeviceClass {name} exists and is not steward's (no label {MANAGED_BY_LABEL}={MANAGED_BY}); it is left alone, so this Configuration's devices have no steward class"),
                            );
                        }
                    }
                    Outcome::Skipped
                }
                Err(e) => failed(&name, "creating", &e),
            }
        }
        Action::Replace(class) => {
            let name = class.name_any();
            match api.replace(&name, &pp, &class).await {
                Ok(c) => {
                    tracing::info!(class = %name, "DeviceClass updated");
                    Outcome::Written(Box::new(c))
                }
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    tracing::debug!(class = %name, "changed since read; comparing again");
                    Outcome::Skipped
                }
                Err(kube::Error::Api(e)) if e.code == 404 => Outcome::Gone(name),
                Err(e) => failed(&name, "updating", &e),
            }
        }
        Action::Delete {
            name,
            resource_version,
        } => {
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: None,
                    resource_version,
                }),
                ..DeleteParams::default()
            };
            match api.delete(&name, &dp).await {
                Ok(_) => {
                    tracing::info!(class = %name, "DeviceClass of a deleted Configuration removed");
                    Outcome::Gone(name)
                }
                Err(kube::Error::Api(e)) if e.code == 404 => Outcome::Gone(name),
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    tracing::debug!(class = %name, "changed since read; comparing again");
                    Outcome::Skipped
                }
                Err(e) => failed(&name, "deleting", &e),
            }
        }
    }
}

fn failed(name: &str, doing: &str, e: &kube::Error) -> Outcome {
    tracing::warn!(class = %name, error = %e, "{doing} a DeviceClass failed; retrying");
    Outcome::Failed
}
