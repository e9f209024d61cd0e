//! The one-machine run in its short mode, as CI runs it: the summary says
//! every pod got a slot and ran pinned through the CRI proxy, every slot
//! came back, nothing was granted twice, and nothing is left running.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use steward_demo::Options;
use steward_testing_containerd::{Containerd, cri_client, own_pods};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_short_run_tells_the_whole_story() {
    // Held for the check at the end; the run shares it.
    let ctd = Containerd::shared().expect("containerd (needs root and its packages)");
    let opts = Options {
        rounds: 2,
        devices: 2,
        capacity: 2,
        live: false,
        cri: true,
    };
    let s = steward_demo::run(opts).await.unwrap();
    println!("{s}");
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

    // Nothing of the run is left in containerd.
    let (mut rt, _) = cri_client(ctd.sock()).await.unwrap();
    let left = own_pods(&mut rt, &std::process::id().to_string())
        .await
        .unwrap();
    assert!(left.is_empty(), "pods left behind: {left:?}");
}
