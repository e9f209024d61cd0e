//! Faults and bad input at the NRI wire, against a real containerd 2.1.9
//! (private instance: the containerd harness's `Containerd2`), pods run by
//! a CRI client of the test's own:
//!
//! * a second plugin registering with an index and name already in use:
//!   containerd 2.1.9 accepts it and calls both (it checks nothing), so
//!   steward cannot learn of it from the runtime;
//! * an answer larger than what the runtime reads per frame (4,096 bytes):
//!   the multiplexer splits it, the runtime reassembles it and applies all
//!   of it (checked inside the container).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

use std::time::Duration;

use prost::Message;
use steward_nri::proto::nri::{
    ConfigureRequest, ContainerAdjustment, CreateContainerRequest, CreateContainerResponse, Event,
    KeyValue,
};
use steward_nri::{EventMask, Handler, RpcStatus, Session, SessionConfig};
use steward_testing_containerd as harness;
use tokio::sync::mpsc;

/// Answers CreateContainer with `env` added, and says who answered.
struct Adder {
    who: &'static str,
    env: Vec<KeyValue>,
    tx: mpsc::UnboundedSender<(&'static str, usize)>,
}

impl Handler for Adder {
    async fn configure(&self, _req: ConfigureRequest) -> Result<EventMask, RpcStatus> {
        Ok(EventMask::of(&[Event::CreateContainer]))
    }

    async fn create_container(
        &self,
        _req: CreateContainerRequest,
    ) -> Result<CreateContainerResponse, RpcStatus> {
        let resp = CreateContainerResponse {
            adjust: Some(ContainerAdjustment {
                env: self.env.clone(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let _ = self.tx.send((self.who, resp.encoded_len()));
        Ok(resp)
    }
}

fn env(prefix: &str, n: usize, value_len: usize) -> Vec<KeyValue> {
    (0..n)
        .map(|i| KeyValue {
            key: format!("{prefix}_{i:04}"),
            value: format!("{i:0>value_len$}"),
        })
        .collect()
}

/// Env of the container's process 1, as the runtime set it.
async fn env_inside(
    cri: &mut steward_proto::cri::runtime::v1::runtime_service_client::RuntimeServiceClient<
        tonic::transport::Channel,
    >,
    container_id: &str,
) -> std::collections::BTreeMap<String, String> {
    let out = harness::exec_sync(cri, container_id, &["env"])
        .await
        .expect("exec env");
    out.stdout
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// Two plugins registering as `10-steward-test`: what the runtime does
/// with the second, and that the first keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_plugin_with_the_same_index_and_name() {
    let Some(bin) = harness::bin_dir_or_skip("faults") else {
        return;
    };
    let ctrd = harness::Containerd2::start(bin);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let first = Session::start(
        SessionConfig::new(ctrd.nri_sock(), "steward-test", "10"),
        Adder {
            who: "first",
            env: env("FIRST", 1, 1),
            tx: tx.clone(),
        },
    )
    .await
    .unwrap_or_else(|e| panic!("register: {e}\n{}", ctrd.log()));
    let second = Session::start(
        SessionConfig::new(ctrd.nri_sock(), "steward-test", "10"),
        Adder {
            who: "second",
            env: env("SECOND", 1, 1),
            tx,
        },
    )
    .await;
    let second_outcome = match &second {
        Ok(_) => "registered".to_owned(),
        Err(e) => e.to_string(),
    };
    eprintln!("the second plugin with index 10 and name steward-test: {second_outcome}");

    let (mut cri, _images) = harness::cri_client(ctrd.sock()).await.expect("CRI client");
    let sandbox =
        harness::pod_sandbox_config(&ctrd.cgroup_parent, "dup", harness::PodNetwork::Host);
    let (sandbox_id, container_id) =
        harness::run_pod_with_container(&mut cri, &sandbox, &harness::ContainerSpec::new("dup"))
            .await
            .unwrap_or_else(|e| panic!("run pod: {e}\n{}", ctrd.log()));
    let mut answered = Vec::new();
    while let Ok(Some((who, _))) = tokio::time::timeout(Duration::from_secs(2), rx.recv()).await {
        answered.push(who);
    }
    let inside = env_inside(&mut cri, &container_id).await;
    eprintln!(
        "CreateContainer answered by {answered:?}; FIRST_0000 inside: {:?}, SECOND_0000 inside: {:?}",
        inside.get("FIRST_0000"),
        inside.get("SECOND_0000")
    );
    // The first registration keeps working whatever the runtime did with
    // the second.
    assert!(answered.contains(&"first"), "{answered:?}");
    assert_eq!(inside.get("FIRST_0000").map(String::as_str), Some("0"));
    match second {
        Err(steward_nri::NriError::Registration { .. }) => {
            assert!(!answered.contains(&"second"), "{answered:?}");
        }
        Err(e) => panic!("unexpected failure of the second registration: {e}"),
        Ok(s) => {
            // Accepted: both are called, the same index twice.
            assert!(answered.contains(&"second"), "{answered:?}");
            assert_eq!(inside.get("SECOND_0000").map(String::as_str), Some("0"));
            drop(s);
        }
    }
    harness::cleanup_pod(&mut cri, &sandbox_id)
        .await
        .expect("cleanup");
    drop(first);
}

/// A CreateContainer answer of about 20 kB (over four times the runtime's
/// 4,096-byte frame reads) is split into frames the runtime reads whole;
/// every variable reaches the container.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_over_the_runtimes_read_size_is_applied_whole() {
    let Some(bin) = harness::bin_dir_or_skip("faults") else {
        return;
    };
    let ctrd = harness::Containerd2::start(bin);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let big = env("STEWARD_BIG", 300, 48);
    let session = Session::start(
        SessionConfig::new(ctrd.nri_sock(), "steward-test", "10"),
        Adder {
            who: "big",
            env: big.clone(),
            tx,
        },
    )
    .await
    .unwrap_or_else(|e| panic!("register: {e}\n{}", ctrd.log()));

    let (mut cri, _images) = harness::cri_client(ctrd.sock()).await.expect("CRI client");
    let sandbox =
        harness::pod_sandbox_config(&ctrd.cgroup_parent, "big", harness::PodNetwork::Host);
    let (sandbox_id, container_id) =
        harness::run_pod_with_container(&mut cri, &sandbox, &harness::ContainerSpec::new("big"))
            .await
            .unwrap_or_else(|e| panic!("run pod: {e}\n{}", ctrd.log()));
    let (_, len) = tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("CreateContainer reached the plugin")
        .expect("answered");
    assert!(len > 4 * 4096, "the answer is {len} bytes");
    let inside = env_inside(&mut cri, &container_id).await;
    let missing: Vec<&str> = big
        .iter()
        .filter(|kv| inside.get(&kv.key) != Some(&kv.value))
        .map(|kv| kv.key.as_str())
        .collect();
    eprintln!(
        "a {len}-byte CreateContainer answer: {} of {} variables inside the container",
        big.len() - missing.len(),
        big.len()
    );
    assert!(missing.is_empty(), "missing inside: {missing:?}");
    harness::cleanup_pod(&mut cri, &sandbox_id)
        .await
        .expect("cleanup");
    drop(session);
}
