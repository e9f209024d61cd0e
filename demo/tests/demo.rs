//! The one-machine run in its short mode, as CI runs it, on both of the
//! resource manager's transports: the summary says every pod got a slot and
//! ran pinned (by the NRI plugin on a private containerd 2.1.9, the default;
//! by the CRI proxy on containerd 1.6 with `--cri-proxy`), every slot came
//! back, nothing was granted twice, and nothing is left running.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use steward_demo::{Options, Runtime, Summary};
use steward_testing_containerd::{Containerd, bin_dir_or_skip, cri_client, own_pods};

fn short(runtime: Runtime) -> Options {
    Options {
        rounds: 2,
        devices: 2,
        capacity: 2,
        live: false,
        cri: true,
        runtime,
    }
}

/// What both transports must show.
fn check(s: &Summary) {
    assert_eq!(s.cri_skipped, None);
    assert_eq!(s.camera_devices, 2);
    assert_eq!(s.slots, 4);
    assert_eq!(s.pods_admitted, 8);
    assert_eq!(s.containers_run, 8);
    assert_eq!(s.pods_pinned, 2, "one exclusive-CPU pod per round");
    assert!(s.pods_in_one_view >= 2, "{s}");
    assert_eq!(s.reclaims, 8);
    assert!(s.allocate_p50 > std::time::Duration::ZERO);
    assert!(s.reclaim_p99 > std::time::Duration::ZERO);
    assert!(s.watch_events >= 16, "{s}");
    assert_eq!(s.double_grants, 0);
    assert_eq!(s.claims_left, 0);
    assert!(s.to_string().contains("double grants        0"));
}

/// The default path: the NRI plugin attached to a private containerd 2.1.9
/// (found as the resource manager's NRI tests find it; skipped outside CI
/// when it or root is missing), containers created on containerd's own
/// socket. The containerd it started is gone when the run returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_short_run_tells_the_whole_story_with_the_nri_plugin() {
    let Some(_bin) = bin_dir_or_skip("demo nri") else {
        return;
    };
    let s = steward_demo::run(short(Runtime::Nri)).await.unwrap();
    println!("{s}");
    check(&s);
    let by = s.pinned_by.as_deref().unwrap();
    assert!(by.starts_with("the NRI plugin on containerd 2."), "{by}");
    assert!(
        s.to_string()
            .contains("pinned by the NRI plugin on containerd 2."),
        "{s}"
    );

    // Its private containerd (and with it shims and containers) is gone.
    let pid = s
        .own_containerd_pid
        .expect("the run started its containerd");
    let running = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|st| !st.rsplit(") ").next().unwrap_or("").starts_with('Z'));
    assert!(!running, "containerd {pid} left running");
}

/// `--cri-proxy`: the CRI proxy in front of containerd 1.6.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_short_run_tells_the_whole_story_through_the_cri_proxy() {
    // Held for the check at the end; the run shares it.
    let ctd = Containerd::shared().expect("containerd (needs root and its packages)");
    let s = steward_demo::run(short(Runtime::CriProxy)).await.unwrap();
    println!("{s}");
    check(&s);
    let by = s.pinned_by.as_deref().unwrap();
    assert!(by.starts_with("the CRI proxy on containerd"), "{by}");

    // Nothing of the run is left in containerd.
    let (mut rt, _) = cri_client(ctd.sock()).await.unwrap();
    let left = own_pods(&mut rt, &std::process::id().to_string())
        .await
        .unwrap();
    assert!(left.is_empty(), "pods left behind: {left:?}");
}
