//! Leader election against the API server stand-in: one leader at a time,
//! hand-over on release and on expiry, and a leader that finds another
//! holder steps down at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use steward_kube::lease::{LeaseConfig, elect};
use steward_testing_apiserver::ApiServer;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const NS: &str = "steward-system";

fn config(identity: &str) -> LeaseConfig {
    let mut c = LeaseConfig::new(NS, "steward-controller", identity);
    c.lease_duration = Duration::from_secs(2);
    c.renew_deadline = Duration::from_millis(1000);
    c.retry_period = Duration::from_millis(100);
    c
}

async fn server() -> ApiServer {
    let api = ApiServer::start().await.unwrap();
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(NS.into()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    Api::<Namespace>::all(api.client())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    api
}

async fn until(rx: &mut watch::Receiver<bool>, want: bool, within: Duration) -> Duration {
    let start = Instant::now();
    tokio::time::timeout(within, rx.wait_for(|v| *v == want))
        .await
        .unwrap_or_else(|_| panic!("leadership never became {want} within {within:?}"))
        .unwrap();
    start.elapsed()
}

/// Samples both candidates until `d` passed; panics if both lead at once.
async fn never_both(a: &watch::Receiver<bool>, b: &watch::Receiver<bool>, d: Duration) -> usize {
    let end = Instant::now() + d;
    let mut leading_samples = 0;
    while Instant::now() < end {
        let (x, y) = (*a.borrow(), *b.borrow());
        assert!(!(x && y), "two leaders at once");
        leading_samples += usize::from(x || y);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    leading_samples
}

#[tokio::test]
async fn one_leader_and_a_prompt_hand_over_on_release() {
    let api = server().await;
    let stop_a = CancellationToken::new();
    let stop_b = CancellationToken::new();
    let (mut a, task_a) = elect(api.client(), config("a"), stop_a.clone());
    until(&mut a, true, Duration::from_secs(5)).await;
    let (mut b, task_b) = elect(api.client(), config("b"), stop_b.clone());
    let samples = never_both(&a, &b, Duration::from_millis(800)).await;
    assert!(samples > 0, "nobody led");
    assert!(
        *a.borrow() && !*b.borrow(),
        "the first leader keeps the lease"
    );

    // a stops: it releases the Lease, b takes it well before the duration.
    stop_a.cancel();
    task_a.await.unwrap();
    let took = until(&mut b, true, Duration::from_secs(5)).await;
    assert!(
        took < Duration::from_millis(1500),
        "hand-over took {took:?}"
    );
    let lease = Api::<Lease>::namespaced(api.client(), NS)
        .get("steward-controller")
        .await
        .unwrap();
    let spec = lease.spec.unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("b"));
    assert_eq!(spec.lease_transitions, Some(1));
    stop_b.cancel();
    task_b.await.unwrap();
}

#[tokio::test]
async fn a_vanished_leader_is_replaced_only_after_the_lease_duration() {
    let api = server().await;
    let (mut a, task_a) = elect(api.client(), config("a"), CancellationToken::new());
    until(&mut a, true, Duration::from_secs(5)).await;
    let (mut b, task_b) = elect(api.client(), config("b"), CancellationToken::new());
    tokio::time::sleep(Duration::from_millis(300)).await;
    // a dies without releasing (kill -9).
    task_a.abort();
    let _ = task_a.await;
    let last = Api::<Lease>::namespaced(api.client(), NS)
        .get("steward-controller")
        .await
        .unwrap()
        .spec
        .unwrap();
    assert_eq!(last.holder_identity.as_deref(), Some("a"));
    let last_renewal = last.renew_time.unwrap().0;
    until(&mut b, true, Duration::from_secs(6)).await;
    // b cannot have seen a's last renewal before it happened, and waits
    // out the whole duration from when it saw it (its own clock).
    let waited = k8s_openapi::jiff::Timestamp::now().duration_since(last_renewal);
    assert!(
        waited >= k8s_openapi::jiff::SignedDuration::from_millis(1990),
        "b took over {waited:?} after a's last renewal, before the lease ran out"
    );
    task_b.abort();
}

#[tokio::test]
async fn a_leader_that_finds_another_holder_steps_down_at_once() {
    let api = server().await;
    let (mut a, task_a) = elect(api.client(), config("a"), CancellationToken::new());
    until(&mut a, true, Duration::from_secs(5)).await;
    // Another writer takes the Lease (an operator, or a partitioned peer
    // that saw it expire).
    let leases = Api::<Lease>::namespaced(api.client(), NS);
    let mut lease = leases.get("steward-controller").await.unwrap();
    let spec = lease.spec.as_mut().unwrap();
    spec.holder_identity = Some("intruder".into());
    spec.renew_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        k8s_openapi::jiff::Timestamp::now(),
    ));
    leases
        .replace("steward-controller", &PostParams::default(), &lease)
        .await
        .unwrap();
    let took = until(&mut a, false, Duration::from_secs(5)).await;
    assert!(
        took < Duration::from_millis(500),
        "stepped down after {took:?}"
    );
    task_a.abort();
}

/// The holder's annotations are on the Lease while it holds it, replaced
/// by the successor's, and gone once the last holder releases it.
#[tokio::test]
async fn the_holder_annotates_the_lease_and_removes_it_on_release() {
    let api = server().await;
    let leases = Api::<Lease>::namespaced(api.client(), NS);
    let annotated = |id: &str| {
        let mut c = config(id);
        c.annotations
            .insert("steward.dev/endpoint".into(), format!("http://{id}:1"));
        c
    };
    let endpoint = |l: &Lease| {
        l.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("steward.dev/endpoint").cloned())
    };
    let stop_a = CancellationToken::new();
    let (mut a, task_a) = elect(api.client(), annotated("a"), stop_a.clone());
    until(&mut a, true, Duration::from_secs(5)).await;
    let held = leases.get("steward-controller").await.unwrap();
    assert_eq!(endpoint(&held).as_deref(), Some("http://a:1"));

    let stop_b = CancellationToken::new();
    let (mut b, task_b) = elect(api.client(), annotated("b"), stop_b.clone());
    stop_a.cancel();
    task_a.await.unwrap();
    until(&mut b, true, Duration::from_secs(5)).await;
    let held = leases.get("steward-controller").await.unwrap();
    assert_eq!(endpoint(&held).as_deref(), Some("http://b:1"));

    stop_b.cancel();
    task_b.await.unwrap();
    let released = leases.get("steward-controller").await.unwrap();
    assert_eq!(endpoint(&released), None, "released, yet still annotated");
    assert_eq!(released.spec.unwrap().holder_identity, None);
}

/// A holder proven dead is replaced at once, not after its record
/// expires; a proof naming another identity changes nothing.
#[tokio::test]
async fn a_holder_proven_dead_is_replaced_before_its_record_expires() {
    use steward_kube::lease::elect_with_proof;

    let api = server().await;
    let long = |id: &str| {
        let mut c = config(id);
        c.lease_duration = Duration::from_secs(30);
        c.renew_deadline = Duration::from_secs(20);
        c
    };
    let (mut a, task_a) = elect(api.client(), long("a"), CancellationToken::new());
    until(&mut a, true, Duration::from_secs(5)).await;
    let (proof, proofs) = watch::channel(None);
    let stop_b = CancellationToken::new();
    let (mut b, task_b) = elect_with_proof(api.client(), long("b"), stop_b.clone(), proofs);
    // A proof about somebody else: a stays leader.
    proof.send_replace(Some("zzz".into()));
    let samples = never_both(&a, &b, Duration::from_millis(600)).await;
    assert!(samples > 0 && *a.borrow() && !*b.borrow());

    // a dies without releasing; b is told, and takes over at once.
    task_a.abort();
    let _ = task_a.await;
    proof.send_replace(Some("a".into()));
    let took = until(&mut b, true, Duration::from_secs(5)).await;
    assert!(
        took < Duration::from_secs(2),
        "took {took:?} with a 30 s lease"
    );
    let lease = Api::<Lease>::namespaced(api.client(), NS)
        .get("steward-controller")
        .await
        .unwrap();
    assert_eq!(lease.spec.unwrap().holder_identity.as_deref(), Some("b"));
    stop_b.cancel();
    task_b.await.unwrap();
}
