//! The resource manager follows only the Reservations held on its node:
//! against the API server stand-in, a decision on another node is never
//! delivered to it, and one that leaves its node (canceled, or its node
//! changed) arrives as a deletion that drops the hold.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::PostParams;
use steward_api::{PodRef, Reservation, ReservationSpec, ReservationStatus};
use steward_resmgr::reservations::{Holds, watch_holds};
use steward_testing_apiserver::ApiServer;

const NS: &str = "default";

fn reservation(pod: &str) -> Reservation {
    let mut r = Reservation::new(
        pod,
        ReservationSpec {
            pod: PodRef {
                namespace: NS.into(),
                name: pod.into(),
                uid: format!("uid-{pod}"),
            },
            slots: Default::default(),
            exclusive_cpus: 2,
            candidates: vec!["n1".into(), "n2".into()],
            cancel: None,
        },
    );
    r.metadata.namespace = Some(NS.into());
    r
}

/// Writes `pod`'s Reservation decided Reserved on `node` with 2 CPUs on
/// NUMA node 0 (`None`: Canceled, no node).
async fn decide(api: &Api<Reservation>, pod: &str, node: Option<&str>) {
    let mut r = match api.get_opt(pod).await.unwrap() {
        Some(r) => r,
        None => api
            .create(&PostParams::default(), &reservation(pod))
            .await
            .unwrap(),
    };
    r.status = Some(ReservationStatus {
        phase: if node.is_some() {
            "Reserved"
        } else {
            "Canceled"
        }
        .into(),
        node: node.map(Into::into),
        cpus: 2,
        numa_node: node.map(|_| 0),
        observed_generation: r.metadata.generation,
        ..ReservationStatus::default()
    });
    api.replace_status(pod, &PostParams::default(), &r)
        .await
        .unwrap();
}

async fn next(holds: &mut (impl futures::Stream<Item = Holds> + Unpin)) -> Holds {
    tokio::time::timeout(Duration::from_secs(20), holds.next())
        .await
        .expect("the holds never changed")
        .expect("the holds stream ended")
}

/// Waits for holds equal to `want`.
async fn until(holds: &mut (impl futures::Stream<Item = Holds> + Unpin), want: &[&str]) {
    loop {
        let h = next(holds).await;
        let pods: Vec<&str> = h.keys().map(|k| k.trim_start_matches("uid-")).collect();
        if pods == want {
            return;
        }
    }
}

#[tokio::test]
async fn only_reservations_held_on_this_node_are_followed() {
    let api = ApiServer::start().await.unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(api.client());
    for crd in steward_api::crds() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    let writer: Api<Reservation> = Api::namespaced(api.client(), NS);
    decide(&writer, "here", Some("n1")).await;
    decide(&writer, "there", Some("n2")).await;
    let client = api
        .client_with_user_agent("steward-cri-proxy/test (n1)")
        .unwrap();
    let mut holds = Box::pin(watch_holds(client, "n1".into()));
    until(&mut holds, &["here"]).await;
    // Decisions on another node: nothing reaches this node.
    let before = api.stats();
    for p in ["a", "b", "c"] {
        decide(&writer, p, Some("n2")).await;
    }
    // One here moves in; one here leaves (canceled), one moves to n2.
    decide(&writer, "in", Some("n1")).await;
    until(&mut holds, &["here", "in"]).await;
    decide(&writer, "here", None).await;
    until(&mut holds, &["in"]).await;
    decide(&writer, "in", Some("n2")).await;
    until(&mut holds, &[]).await;
    let after = api.stats();
    let delivered = |s: &steward_testing_apiserver::Stats| -> u64 {
        s.watch_events
            .iter()
            .filter(|(k, _)| {
                k.component == "steward-cri-proxy"
                    && k.resource == "reservations.steward.dev"
                    && k.event_type != "BOOKMARK"
            })
            .map(|(_, v)| v.events)
            .sum()
    };
    // "in" added, "here" and "in" gone: 3 events for 7 writes, none of
    // the 3 decisions elsewhere.
    assert_eq!(delivered(&after) - delivered(&before), 3);
}

/// CRDs older than the node (no selectable `status.node`): the API server
/// refuses the field selector, and the holds come from every Reservation,
/// as before.
#[tokio::test]
async fn with_older_crds_every_reservation_is_followed() {
    let api = ApiServer::start().await.unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(api.client());
    for mut crd in steward_api::crds() {
        for v in &mut crd.spec.versions {
            v.selectable_fields = None;
        }
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    let writer: Api<Reservation> = Api::namespaced(api.client(), NS);
    let refused = writer
        .list(&kube::api::ListParams::default().fields("status.node=n1"))
        .await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(e)) if e.code == 400),
        "{refused:?}"
    );
    decide(&writer, "here", Some("n1")).await;
    decide(&writer, "there", Some("n2")).await;
    let mut holds = Box::pin(watch_holds(api.client(), "n1".into()));
    until(&mut holds, &["here"]).await;
    decide(&writer, "in", Some("n1")).await;
    until(&mut holds, &["here", "in"]).await;
}
