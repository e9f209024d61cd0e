//! One `resource.k8s.io/v1` DeviceClass per Configuration, written by the
//! leading `steward controller` when `--dra-device-classes` is on
//! ([`crate::ControllerConfig::device_classes`]).
//!
//! A Configuration `<name>` in `<namespace>` gets the cluster-scoped class
//! `<name>.<namespace>.steward.dev` ([`class_name`]) with one CEL selector,
//! `device.driver == "steward.dev" && device.attributes["steward.dev"].namespace == "<namespace>" && device.attributes["steward.dev"].configuration == "<name>"`
//! ([`selector`]): the devices the agents publish for that Configuration
//! (`steward_core::dra`). Classes steward writes carry the label
//! `app.kubernetes.io/managed-by: steward` and the annotation
//! `steward.dev/configuration: <namespace>/<name>`; only classes with that
//! label are followed, updated or deleted — any other class, even one with
//! the name steward would use, is left alone.
//!
//! Level-triggered like the reservation decisions: after each batch of
//! changes to Configurations or owned classes, the wanted classes are
//! compared with the owned ones and only differences are written — create,
//! replace conditional on the resourceVersion read, delete conditional on
//! it. A write that loses (409) is decided again from what the watch
//! brings; any other failure is retried after [`RETRY`]. On a cluster that
//! does not serve `resource.k8s.io/v1` DeviceClasses, one warning says so
//! and nothing is written (the reservation decisions go on).

mod plan;

use std::collections::BTreeSet;
use std::time::Duration;

use futures::{FutureExt as _, StreamExt};
use k8s_openapi::api::resource::v1::DeviceClass;
use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use steward_api::Configuration;
use steward_kube::{Change, follow};

pub use plan::{
    Action, CONFIGURATION_ANNOTATION, Classes, MANAGED_BY, MANAGED_BY_LABEL, OWNED_SELECTOR,
    actions, class_for, class_name, desired, selector,
};

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
pub async fn maintain(client: kube::Client) {
    if !steward_kube::dra_served(&client, "deviceclasses", "writing DeviceClasses").await {
        return;
    }
    let api = Api::<DeviceClass>::all(client.clone());
    let mut configurations = follow(
        Api::<Configuration>::all(client),
        watcher::Config::default(),
    )
    .boxed();
    let mut classes = follow(
        api.clone(),
        watcher::Config::default().labels(OWNED_SELECTOR),
    )
    .boxed();
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
            Some(c) = classes.next() => state.classes(c),
            () = retry => {}
        }
        // Take everything already waiting: a burst is one comparison.
        while let Some(Some(c)) = configurations.next().now_or_never() {
            state.configurations(c);
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
            match write(&api, action, &mut foreign).await {
                Outcome::Written(c) => state.classes(Change::Applied(*c)),
                Outcome::Gone(name) => state.forget(&name),
                Outcome::Skipped => {}
                Outcome::Failed => {
                    retry_at = Some(tokio::time::Instant::now() + RETRY);
                }
            }
        }
    }
}

/// One write, conditional on what was read.
async fn write(api: &Api<DeviceClass>, action: Action, foreign: &mut BTreeSet<String>) -> Outcome {
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
