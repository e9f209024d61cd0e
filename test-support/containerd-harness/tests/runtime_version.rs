//! The harness says which runtime a test talks to: containerd 1.6 (no CDI)
//! or 2.x (injects CDI devices from the spec directory the harness names).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use steward_testing_containerd::Containerd;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runtime_version_and_its_cdi_spec_dir_agree() {
    let ctd = Containerd::shared().expect("containerd (needs root and its packages)");
    let v = ctd.runtime_version().await.expect("CRI Version");
    assert_eq!(v.name, "containerd", "{v:?}");
    let major = v.major().expect("a numeric major version");
    assert!(major == 1 || major == 2, "{v:?}");
    if v.injects_cdi() {
        let dir = ctd
            .cdi_spec_dir()
            .expect("a CDI-injecting runtime names its spec directory");
        assert!(dir.is_dir(), "{} exists", dir.display());
    } else {
        assert!(ctd.cdi_spec_dir().is_none(), "1.6 reads no CDI specs");
    }
}
