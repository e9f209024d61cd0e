//! A test that panics with a pod running in the shared containerd leaves
//! nothing behind: dropping its `Containerd` while unwinding removes every
//! pod it created, so the next test does not adopt it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::mpsc;

use steward_testing_containerd::{
    ContainerSpec, Containerd, PodNetwork, cri_client, own_pods, run_pod_with_container,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_test_leaves_no_pod_behind() {
    let ctd = Containerd::shared().expect("containerd (needs root and its packages)");
    let (sock, parent) = (ctd.sock().to_path_buf(), ctd.cgroup_parent().to_owned());
    let owner = std::process::id().to_string();
    let (tx, rx) = mpsc::channel();

    // The "test" that fails: starts a pod, reports it, panics.
    let failing = std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async move {
            let ctd = Containerd::attach(sock, parent);
            let (mut runtime, _) = ctd.client().await.unwrap();
            let sandbox = ctd.pod_config("sweep", PodNetwork::Host);
            let container = ContainerSpec::new("sleeper").command(["sleep", "300"]);
            let (sandbox_id, _) = run_pod_with_container(&mut runtime, &sandbox, &container)
                .await
                .unwrap();
            tx.send(sandbox_id).unwrap();
            panic!("the test fails with its pod running");
        })
    });
    assert!(failing.join().is_err(), "the inner test panicked");
    let sandbox_id = rx.recv().unwrap();

    let (mut runtime, _) = cri_client(ctd.sock()).await.unwrap();
    let left = own_pods(&mut runtime, &owner).await.unwrap();
    assert!(
        !left.contains(&sandbox_id),
        "pod {sandbox_id} of the panicked test is still there: {left:?}"
    );
    assert!(left.is_empty(), "{left:?}");
}
