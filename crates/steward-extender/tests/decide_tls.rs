//! The direct path over HTTPS: the leader serves `/v1/decide` with a
//! certificate (the controller's `--decide-tls-cert-file`), the extender
//! verifies it against a CA and a fixed name (`--decide-ca-file`,
//! `--decide-server-name`), with the API server stand-in and the real
//! controller, and the certificates of `steward-reservations/tests/fixtures/tls` (README.md
//! there): `decide.crt` is signed by `ca` for [`NAME`].
//!
//! A leader whose certificate verifies is asked; one signed by another CA
//! or for another name is not (a transport error: the extender asks
//! through the API, and the leader sees no ask); a Lease naming a plain
//! `http://` endpoint is refused without connecting; a rotated CA file is
//! trusted without a restart.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};
use steward_api::{PodRef, ReservationSpec};
use steward_extender::ExtenderConfig;
use steward_leader::direct::server::DecideTls;
use steward_leader::metrics::{ASK_OUTCOMES, AskLabels};
use steward_nodeio::bounded::TlsFiles;
use steward_reservations::direct::client::{Answer, DirectError, Leader};
use steward_reservations::direct::transport::DecideTrust;
use steward_reservations::direct::wire::DecideRequest;
use steward_testing_apiserver::ApiServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod common;

use common::{NS, Stand, direct, stand_full};

/// The name `decide.crt` carries (its CN and only SAN).
const NAME: &str = "steward-controller-decide.steward-system.svc";

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(format!("../steward-reservations/tests/fixtures/tls/{name}"))
}

fn trust(ca: &Path, name: &str) -> DecideTrust {
    DecideTrust::new(ca, name).unwrap()
}

/// The stand (8 camera slots), its controller serving `/v1/decide` over
/// HTTPS with `decide.crt`, the extender configured with `ext_cfg`.
async fn tls_stand(ext_cfg: ExtenderConfig) -> Stand {
    let files =
        TlsFiles::new(fixture("decide.crt"), fixture("decide.key"), None, "decide").unwrap();
    stand_full(8, &[], true, ext_cfg, |c| {
        c.decide_tls = Some(DecideTls {
            source: Arc::new(files),
        });
    })
    .await
}

/// Every ask the stand's leader answered, whatever the outcome.
fn asks_answered(s: &Stand) -> u64 {
    ASK_OUTCOMES
        .iter()
        .map(|outcome| {
            s.metrics
                .direct_asks
                .get_or_create(&AskLabels { outcome })
                .get()
        })
        .sum()
}

async fn pending_pod(api: &ApiServer, name: &str) -> Pod {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS},
        "spec": {"containers": [{"name": "main", "image": "busybox",
            "resources": {"limits": {"steward.dev/cam": "1"}}}]},
    }))
    .unwrap();
    Api::<Pod>::namespaced(api.client(), NS)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap()
}

/// Pod `name`'s ask for one camera slot on n1..n3.
async fn ask_of(api: &ApiServer, name: &str) -> DecideRequest {
    let pod = pending_pod(api, name).await;
    DecideRequest {
        spec: ReservationSpec {
            pod: PodRef {
                namespace: NS.into(),
                name: name.into(),
                uid: pod.metadata.uid.unwrap(),
            },
            slots: [("cam".to_owned(), 1)].into(),
            exclusive_cpus: 0,
            candidates: vec!["n1".into(), "n2".into(), "n3".into()],
            cancel: None,
        },
        timeout_ms: 2_000,
    }
}

/// A [`Leader`] following the stand's Lease with `trust`, once it knows
/// where the leader decides.
async fn follow(api: &ApiServer, lease: &str, trust: Option<DecideTrust>) -> Leader {
    let leader = Leader::follow(api.client(), "steward-system", lease).with_trust(trust);
    common::until("the Lease says where the leader decides", || {
        leader.endpoint().is_some()
    })
    .await;
    leader
}

/// `leader`'s answer to `ask`, asked again while the replica the Lease
/// names is still taking up its lead (421, 503).
async fn decide(leader: &Leader, ask: &DecideRequest) -> Result<Answer, DirectError> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        match leader.decide(ask).await {
            Err(DirectError::NotLeading(_) | DirectError::Unavailable(..))
                if tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => return other,
        }
    }
}

/// One Filter through the stand's extender (plain HTTP, as kube-scheduler
/// without `enableHTTPS`); the nodes that pass.
async fn filter(s: &Stand, pod: &Pod) -> Vec<String> {
    let args = json!({"Pod": pod, "Nodes": null, "NodeNames": ["n1", "n2", "n3", "n4"]});
    let body = serde_json::to_vec(&args).unwrap();
    let mut c = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let head = format!(
        "POST /filter HTTP/1.1\r\nHost: extender\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    c.write_all(head.as_bytes()).await.unwrap();
    c.write_all(&body).await.unwrap();
    let mut out = Vec::new();
    c.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8_lossy(&out).into_owned();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    let r: Value = serde_json::from_str(&text[text.find("\r\n\r\n").unwrap() + 4..]).unwrap();
    serde_json::from_value(r["NodeNames"].clone()).unwrap_or_else(|_| panic!("{r}"))
}

/// (a) The extender trusting the CA that signed the leader's certificate,
/// for the name it carries, asks the leader over HTTPS and gets the
/// decision: the Lease says `https://`, and the leader answered each ask.
#[tokio::test]
async fn a_leader_verified_against_its_ca_and_name_decides() {
    let ext = ExtenderConfig {
        decide_trust: Some(trust(&fixture("ca.crt"), NAME)),
        ..direct()
    };
    let s = tls_stand(ext).await;
    let endpoint = s.extender.leader_endpoint().unwrap();
    assert!(endpoint.starts_with("https://127.0.0.1:"), "{endpoint}");

    let leader = follow(
        &s.api,
        "steward-controller",
        Some(trust(&fixture("ca.crt"), NAME)),
    )
    .await;
    let ask = ask_of(&s.api, "direct").await;
    match decide(&leader, &ask).await {
        Ok(Answer::Decided(r)) => {
            assert_eq!(r.spec.pod.uid, ask.spec.pod.uid);
            assert_eq!(r.status.unwrap().phase, "Reserved");
        }
        other => panic!("{other:?}"),
    }
    let decided = |s: &Stand| {
        s.metrics
            .direct_asks
            .get_or_create(&AskLabels { outcome: "decided" })
            .get()
    };
    assert_eq!(decided(&s), 1);

    // The extender's Filter asks the leader there too.
    let pod = pending_pod(&s.api, "filtered").await;
    assert_eq!(filter(&s, &pod).await.len(), 1);
    assert_eq!(decided(&s), 2, "the Filter did not ask the leader");
}

/// (b) Another CA, (c) another name: the leader is not asked (the
/// handshake fails before a byte of the ask is sent), a transport error
/// the extender answers by asking through the API.
#[tokio::test]
async fn a_leader_not_verified_is_not_asked() {
    let ext = ExtenderConfig {
        decide_trust: Some(trust(&fixture("other-ca.crt"), NAME)),
        ..direct()
    };
    let s = tls_stand(ext).await;
    for (pod, ca, name, why) in [
        ("p-other-ca", "other-ca.crt", NAME, "UnknownIssuer"),
        (
            "p-other-name",
            "ca.crt",
            "other-controller-decide.steward-system.svc",
            "not valid for name",
        ),
    ] {
        let leader = follow(
            &s.api,
            "steward-controller",
            Some(trust(&fixture(ca), name)),
        )
        .await;
        let ask = ask_of(&s.api, pod).await;
        match decide(&leader, &ask).await {
            Err(DirectError::Transport(at, e)) => {
                assert!(at.starts_with("https://"), "{at}");
                assert!(e.contains(why), "{ca}, {name}: {e}");
            }
            other => panic!("{ca}, {name}: {other:?}"),
        }
    }
    assert_eq!(asks_answered(&s), 0, "the leader saw an ask");

    // The extender (trusting another CA) still places the pod: through
    // the API, the leader's endpoint never asked.
    let pod = pending_pod(&s.api, "fallback").await;
    assert_eq!(filter(&s, &pod).await.len(), 1);
    assert_eq!(asks_answered(&s), 0, "the leader was asked");
}

/// A Lease holder `c1` advertising `endpoint`, as Lease `name`.
async fn lease(api: &ApiServer, name: &str, endpoint: &str) {
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "namespace": "steward-system",
            "annotations": {steward_reservations::direct::ENDPOINT_ANNOTATION: endpoint},
        },
        "spec": {"holderIdentity": "c1", "leaseDurationSeconds": 15},
    }))
    .unwrap();
    Api::<Lease>::namespaced(api.client(), "steward-system")
        .create(&PostParams::default(), &lease)
        .await
        .unwrap();
}

/// Whether something connected to `l` within a moment.
async fn connected(l: &tokio::net::TcpListener) -> bool {
    tokio::time::timeout(Duration::from_millis(300), l.accept())
        .await
        .is_ok()
}

/// (d) With a CA to verify the leader, a Lease naming a plain `http://`
/// endpoint is refused without connecting (a Lease cannot downgrade the
/// extender); without one, an `https://` endpoint is refused the same way.
#[tokio::test]
async fn an_endpoint_of_the_other_scheme_is_refused_without_connecting() {
    let api = ApiServer::start().await.unwrap();
    let ns: Namespace =
        serde_json::from_value(json!({"metadata": {"name": "steward-system"}})).unwrap();
    Api::<Namespace>::all(api.client())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let at = listener.local_addr().unwrap();
    lease(&api, "plain", &format!("http://{at}")).await;
    lease(&api, "tls", &format!("https://{at}")).await;
    let ask = DecideRequest {
        spec: ReservationSpec {
            pod: PodRef {
                namespace: NS.into(),
                name: "p".into(),
                uid: "u".into(),
            },
            slots: [("cam".to_owned(), 1)].into(),
            exclusive_cpus: 0,
            candidates: vec!["n1".into()],
            cancel: None,
        },
        timeout_ms: 500,
    };
    let ca = || Some(trust(&fixture("ca.crt"), NAME));

    let leader = follow(&api, "plain", ca()).await;
    match leader.decide(&ask).await {
        Err(e @ DirectError::Plaintext(_)) => {
            assert!(e.to_string().contains("--decide-ca-file"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    assert!(
        !connected(&listener).await,
        "a plaintext endpoint was dialed"
    );
    let leader = follow(&api, "tls", None).await;
    assert!(
        matches!(leader.decide(&ask).await, Err(DirectError::NoTrust(_))),
        "an https endpoint without a CA"
    );
    assert!(!connected(&listener).await, "an https endpoint was dialed");
    // The way each is dialed: the listener does see a connection.
    let leader = follow(&api, "tls", ca()).await;
    let asked = tokio::spawn(async move { leader.decide(&ask).await });
    assert!(connected(&listener).await, "the https endpoint not dialed");
    assert!(matches!(
        asked.await.unwrap(),
        Err(DirectError::Transport(..))
    ));
}

/// Writes `content` as `dir/ca.crt` the way a Secret volume rotates it: a
/// new directory, the `..data` symlink swapped to it by a rename.
fn rotate(dir: &Path, generation: u32, content: &[u8]) {
    let data = dir.join(format!("..gen{generation}"));
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("ca.crt"), content).unwrap();
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(&data, &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
    let link = dir.join("ca.crt");
    if std::fs::symlink_metadata(&link).is_err() {
        std::os::unix::fs::symlink(dir.join("..data/ca.crt"), link).unwrap();
    }
}

/// The CA file is read again when it changes: a leader not trusted under
/// the first CAs is asked once the file holds its CA, and no longer once
/// it does not (the connections made under the old CAs are not reused).
#[tokio::test]
async fn a_rotated_ca_file_is_trusted_without_a_restart() {
    let s = tls_stand(ExtenderConfig::default()).await;
    let dir = std::env::temp_dir().join(format!("steward-decide-tls-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let other = std::fs::read(fixture("other-ca.crt")).unwrap();
    let right = std::fs::read(fixture("ca.crt")).unwrap();
    rotate(&dir, 1, &other);
    let leader = follow(
        &s.api,
        "steward-controller",
        Some(trust(&dir.join("ca.crt"), NAME)),
    )
    .await;

    let ask = ask_of(&s.api, "p1").await;
    assert!(
        matches!(decide(&leader, &ask).await, Err(DirectError::Transport(..))),
        "trusted under another CA"
    );
    rotate(&dir, 2, &right);
    assert!(
        matches!(decide(&leader, &ask).await, Ok(Answer::Decided(_))),
        "the rotated CA file was not read"
    );
    rotate(&dir, 3, &other);
    let ask = ask_of(&s.api, "p2").await;
    assert!(
        matches!(decide(&leader, &ask).await, Err(DirectError::Transport(..))),
        "still trusted after its CA was rotated out"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
