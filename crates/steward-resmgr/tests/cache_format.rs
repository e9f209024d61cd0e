//! The resource manager cache across releases: the cache each earlier
//! release wrote (tests/fixtures/cache, written by that release's
//! `Cache::save`) is restored by today's code with every assignment intact,
//! and today's code writes the same document back (a change of shape
//! without a version bump fails here).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use steward_resmgr::cache::{CACHE_FILE, Cache, ContainerState, LoadOutcome, SCHEMA_VERSION};

fn fixture(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/cache")
        .join(name)
}

#[test]
fn the_cache_written_by_0_1_0_is_restored_with_every_assignment() {
    let dir = tempfile::tempdir().unwrap();
    let written = std::fs::read(fixture("v0.1.0.json")).unwrap();
    std::fs::write(dir.path().join(CACHE_FILE), &written).unwrap();

    let (cache, outcome) = Cache::open(dir.path()).unwrap();
    assert_eq!(outcome, LoadOutcome::Restored);
    let data = cache.data();
    assert_eq!(data.version, SCHEMA_VERSION);
    assert_eq!((data.policy.as_str(), data.next_seq), ("static", 3));
    assert_eq!(data.pods.len(), 2);

    // What the re-sync starts from: the allocated containers with their
    // requests and assignments, exclusive CPU 1 included.
    let mut allocated: Vec<(String, String, bool, String)> = cache
        .allocated()
        .into_iter()
        .map(|(id, req, a)| {
            (
                id,
                a.cpus.to_string(),
                a.exclusive,
                format!("{:?}", req.qos),
            )
        })
        .collect();
    allocated.sort();
    assert_eq!(
        allocated,
        vec![
            ("c-excl".into(), "1".into(), true, "Guaranteed".into()),
            ("c-shared".into(), "0".into(), false, "Burstable".into()),
        ]
    );
    assert_eq!(data.containers["c-done"].state, ContainerState::Exited);
    assert_eq!(
        data.containers["c-excl"].resources.cpuset_cpus, "1",
        "what the runtime was told"
    );
    assert_eq!(
        data.containers["c-shared"].blockio_class.as_deref(),
        Some("slow")
    );

    // Saved again by today's code: the same document, byte for byte.
    cache.save().unwrap();
    let saved = std::fs::read(dir.path().join(CACHE_FILE)).unwrap();
    assert!(
        saved == written,
        "today's code writes a different document than 0.1.0 did: bump SCHEMA_VERSION and add a fixture\n{}",
        String::from_utf8_lossy(&saved)
    );
}
