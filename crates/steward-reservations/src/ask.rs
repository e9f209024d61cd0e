//! Asking for a pod's reservation: making its Reservation object carry the
//! pod's ask and candidate nodes, and knowing when an object answers it.
//!
//! One write path for both places a pod is asked for: the extender (when
//! no leader answers directly, `steward_extender`) and the leading
//! controller serving the direct path ([`crate::direct`]). Every ask is
//! first held to [`crate::bounds::check`]. A retry after Rejected or
//! Canceled, a changed ask or a reservation on a node the scheduler no
//! longer offers asks anew: the old object is deleted (precondition: its
//! UID) and a fresh one created.
//!
//! **An ask never deletes or changes another pod's Reservation.** The
//! pod's uid is what an ask says it is; a Reservation made for another
//! uid (an older pod of the same name, a StatefulSet's pod recreated) is
//! deleted only once the API shows that pod gone: no pod of its name, or
//! one with another uid (a uid is never used again, so a pod once gone
//! never comes back). While its pod exists the ask is refused
//! ([`Written::Refused`]): it cannot be that pod's, whatever uid it names.
//!
//! The leader also creates a new pod's Reservation already decided
//! ([`create_decided`]): one write for the ask and its decision.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Api;
use kube::api::{DeleteParams, ObjectMeta, PostParams, Preconditions};
use steward_api::{
    GROUP, RESERVATION_DECIDED_VERSION, Reservation, ReservationSpec, decided_reservations_path,
};

/// The Reservation object a decision is awaited for: a picture that
/// still shows an older object (deleted and created anew) or an older
/// spec (renewed) is not taken for its answer.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Target {
    uid: Option<String>,
    generation: Option<i64>,
}

impl Target {
    pub fn of(r: &Reservation) -> Self {
        Self {
            uid: r.metadata.uid.clone(),
            generation: r.metadata.generation,
        }
    }

    /// Whether `r` is the awaited object (or a later spec of it).
    pub fn matches(&self, r: &Reservation) -> bool {
        (self.uid.is_none() || r.metadata.uid == self.uid)
            && r.metadata.generation >= self.generation
    }
}

/// Whether the controller answered the Reservation's current spec.
pub fn answered(r: &Reservation) -> bool {
    r.status.as_ref().is_some_and(|s| {
        s.observed_generation.is_some()
            && s.observed_generation == r.metadata.generation
            && s.phase != "Requested"
    })
}

/// Whether `a` and `b` ask the same: the same pod, slots and CPUs, and
/// the same candidate set (kube-scheduler orders its nodes anew every
/// cycle).
pub fn same_ask(a: &ReservationSpec, b: &ReservationSpec) -> bool {
    let set = |s: &ReservationSpec| s.candidates.iter().cloned().collect::<BTreeSet<_>>();
    a.pod == b.pod && a.slots == b.slots && a.exclusive_cpus == b.exclusive_cpus && set(a) == set(b)
}

/// What is known of the pod's Reservation before writing.
#[derive(Debug)]
pub enum Current {
    /// Nothing is known: read it first.
    Unknown,
    /// A picture shows none: create without reading (a 409 says otherwise).
    Absent,
    /// As a picture shows it (a stale picture gets a 409).
    Seen(Box<Reservation>),
}

/// What one write attempt came to.
#[derive(Debug)]
pub enum Written {
    /// Already decided for this ask and these candidates.
    Answered(Box<Reservation>),
    /// Wait for the controller's answer to this object; `written` is the
    /// object as the write returned it (`None`: left as it was).
    Wait {
        target: Target,
        written: Option<Box<Reservation>>,
    },
    /// Not written, and no write can answer it: the ask is out of bounds
    /// ([`crate::bounds::check`]), or the Reservation of the pod's name is
    /// another pod's, and that pod exists. The reason.
    Refused(String),
}

/// Whether the pod Reservation `r` was made for still exists: the pod of
/// its name, in `pods`' namespace, has its uid. Read from the API, not a
/// picture (a watch that lags could show a pod just created as absent).
async fn holder_exists(pods: &Api<Pod>, r: &Reservation) -> Result<bool, kube::Error> {
    let pod = pods.get_opt(&r.spec.pod.name).await?;
    Ok(pod.is_some_and(|p| p.metadata.uid.as_deref() == Some(r.spec.pod.uid.as_str())))
}

/// Deletes `rname` if it is still the object `r` (precondition: its uid);
/// gone already is as good.
async fn delete(api: &Api<Reservation>, rname: &str, r: &Reservation) -> Result<(), kube::Error> {
    let dp = DeleteParams {
        preconditions: r.metadata.uid.clone().map(|u| Preconditions {
            uid: Some(u),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(rname, &dp).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// One attempt at making the pod's Reservation `rname` ask `spec`:
/// already answered for these candidates, written (or left as it is) to
/// be waited for, or refused. A 409 means another writer got there first:
/// read again ([`Current::Unknown`]) and try again.
pub async fn write(
    api: &Api<Reservation>,
    rname: &str,
    spec: &ReservationSpec,
    current: Current,
) -> Result<Written, kube::Error> {
    if let Err(e) = crate::bounds::check(spec) {
        return Ok(Written::Refused(e.to_string()));
    }
    let wanted: BTreeSet<&str> = spec.candidates.iter().map(String::as_str).collect();
    let current = match current {
        Current::Unknown => api.get_opt(rname).await?,
        Current::Absent => None,
        Current::Seen(r) => Some(*r),
    };
    if let Some(r) = current {
        if r.spec.pod.uid != spec.pod.uid {
            // Another pod's: only its pod's going frees the name.
            let pods = Api::<Pod>::namespaced(api.clone().into_client(), &spec.pod.namespace);
            if holder_exists(&pods, &r).await? {
                tracing::warn!(
                    reservation = %rname,
                    holder = %r.spec.pod.uid,
                    asked_for = %spec.pod.uid,
                    "refused an ask for the Reservation of another pod, which exists"
                );
                return Ok(Written::Refused(format!(
                    "the Reservation {rname} is pod {}'s (uid {}), which exists; an ask for uid {} cannot replace it",
                    r.spec.pod.name, r.spec.pod.uid, spec.pod.uid
                )));
            }
            tracing::debug!(reservation = %rname, holder = %r.spec.pod.uid, "the Reservation's pod is gone; asking anew");
            delete(api, rname, &r).await?;
        } else {
            let status = r.status.as_ref();
            let phase = status.map(|s| s.phase.as_str());
            let stale = matches!(phase, Some("Rejected" | "Canceled"));
            let same_ask =
                r.spec.slots == spec.slots && r.spec.exclusive_cpus == spec.exclusive_cpus;
            let reserved_on = status
                .filter(|_| phase == Some("Reserved"))
                .and_then(|s| s.node.as_deref());
            let here = reserved_on.is_some_and(|n| wanted.contains(n));
            if here && same_ask && !stale && answered(&r) {
                return Ok(Written::Answered(Box::new(r)));
            }
            // Reserved on a node the scheduler no longer offers (its bind
            // failed, the node went unschedulable): holding it there only
            // makes the pod fail every cycle. Released and asked anew among
            // the nodes it can go to now.
            let moved = reserved_on.is_some() && !here;
            if stale || !same_ask || moved {
                delete(api, rname, &r).await?;
            } else {
                let asked: BTreeSet<&str> = r.spec.candidates.iter().map(String::as_str).collect();
                // kube-scheduler orders its nodes anew every cycle: the
                // same set is the same ask, left as it is.
                if asked == wanted || reserved_on.is_some() {
                    return Ok(Written::Wait {
                        target: Target::of(&r),
                        written: None,
                    });
                }
                let mut renewed = r;
                renewed.spec.candidates = spec.candidates.clone();
                let r = api.replace(rname, &PostParams::default(), &renewed).await?;
                return Ok(Written::Wait {
                    target: Target::of(&r),
                    written: Some(Box::new(r)),
                });
            }
        }
    }
    let mut r = Reservation::new(rname, spec.clone());
    r.metadata = ObjectMeta {
        name: Some(rname.to_owned()),
        namespace: Some(spec.pod.namespace.clone()),
        owner_references: Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Pod".into(),
            name: spec.pod.name.clone(),
            uid: spec.pod.uid.clone(),
            ..OwnerReference::default()
        }]),
        ..ObjectMeta::default()
    };
    // Another writer's create first is a 409: read it and decide again.
    let r = api.create(&PostParams::default(), &r).await?;
    Ok(Written::Wait {
        target: Target::of(&r),
        written: Some(Box::new(r)),
    })
}

/// Creates `r` (a new object: no uid, no resourceVersion) together with
/// its status, in one write: through the Reservation version without the
/// status subresource ([`RESERVATION_DECIDED_VERSION`]), since a create at
/// the stored version drops the status. The object as created (the API
/// server gives it generation 1, which the status must answer).
pub async fn create_decided(
    client: &kube::Client,
    r: &Reservation,
) -> Result<Reservation, kube::Error> {
    let ns = r.metadata.namespace.as_deref().unwrap_or_default();
    let mut body = serde_json::to_value(r).map_err(kube::Error::SerdeError)?;
    if let Some(o) = body.as_object_mut() {
        o.insert(
            "apiVersion".into(),
            format!("{GROUP}/{RESERVATION_DECIDED_VERSION}").into(),
        );
        // The server's to give.
        if let Some(meta) = o.get_mut("metadata").and_then(|m| m.as_object_mut()) {
            meta.remove("generation");
        }
    }
    let data = serde_json::to_vec(&body).map_err(kube::Error::SerdeError)?;
    let request = kube::core::Request::new(decided_reservations_path(ns))
        .create(&PostParams::default(), data)
        .map_err(kube::Error::BuildRequest)?;
    client.request::<Reservation>(request).await
}

/// The reason for a Reservation the API server refused (422).
pub fn api_refused(message: &str) -> String {
    format!("the API server refused the pod's Reservation: {message}")
}
