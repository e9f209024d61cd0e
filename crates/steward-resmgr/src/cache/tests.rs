//! Tests of the cache: records, persistence and recovery.

use super::*;

fn sample() -> CacheData {
    let mut d = CacheData::default();
    let pod = PodRecord {
        id: "s1".into(),
        uid: "u1".into(),
        name: "p".into(),
        namespace: "ns".into(),
        cgroup_parent: "/kubepods/pod1".into(),
        annotations: BTreeMap::from([("a".into(), "b".into())]),
        labels: BTreeMap::new(),
        state: PodState::Ready,
    };
    d.pods.insert("s1".into(), pod);
    d.containers.insert(
        "c1".into(),
        ContainerRecord {
            id: "c1".into(),
            pod_id: "s1".into(),
            name: "web".into(),
            request: RequestRecord {
                qos: "Guaranteed".into(),
                cpu_request_milli: 1000,
                cpu_limit_milli: Some(1000),
                memory_request_bytes: 1 << 20,
                memory_limit_bytes: Some(1 << 20),
                cpu_claims: Vec::new(),
            },
            assignment: Some(AssignmentRecord {
                cpus: "1".into(),
                mems: "0".into(),
                exclusive: true,
                pool: "exclusive".into(),
            }),
            kubelet_resources: ResourcesRecord::default(),
            resources: ResourcesRecord {
                cpuset_cpus: "1".into(),
                hugepage_limits: BTreeMap::from([("2MB".into(), 0)]),
                ..Default::default()
            },
            state: ContainerState::Running,
            cgroups_path: Some("/kubepods/pod1/c1".into()),
            blockio_class: None,
            rdt_class: None,
            seq: 0,
        },
    );
    d.next_seq = 1;
    d
}

#[test]
fn save_and_reload_roundtrip() {
    let t = tempfile::tempdir().unwrap();
    let (mut c, outcome) = Cache::open(t.path()).unwrap();
    assert_eq!(outcome, LoadOutcome::Fresh);
    *c.data_mut() = sample();
    c.save().unwrap();
    assert!(!t.path().join("resmgr-cache.json.tmp").exists());
    let (c2, outcome) = Cache::open(t.path()).unwrap();
    assert_eq!(outcome, LoadOutcome::Restored);
    assert_eq!(c2.data(), &sample());
    let key = c2.key_of("c1").unwrap();
    assert_eq!(key.pod_uid, "u1");
    assert_eq!(c2.ids_for_key(&key), vec!["c1".to_owned()]);
    let alloc = c2.allocated();
    assert_eq!(alloc.len(), 1);
    assert_eq!(alloc[0].2.cpus.to_string(), "1");
    assert_eq!(alloc[0].1.qos, Qos::Guaranteed);
    assert_eq!(
        alloc[0].1.annotations.get("a").map(String::as_str),
        Some("b")
    );
}

#[test]
fn torn_or_foreign_files_are_moved_aside() {
    for content in [
        "{\"version\": 1, \"pods\": ".to_owned(),
        "garbage".to_owned(),
        serde_json::json!({"version": 0, "whatever": true}).to_string(),
    ] {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join(CACHE_FILE), &content).unwrap();
        let (c, outcome) = Cache::open(t.path()).unwrap();
        let LoadOutcome::Discarded { moved_to, reason } = outcome else {
            panic!("{content} was accepted");
        };
        assert!(moved_to.exists(), "{reason}");
        assert_eq!(std::fs::read_to_string(&moved_to).unwrap(), content);
        assert!(c.data().containers.is_empty());
        // The next save writes a good file again.
        c.save().unwrap();
        assert_eq!(Cache::open(t.path()).unwrap().1, LoadOutcome::Restored);
    }
}

#[test]
fn a_cache_of_a_newer_version_is_refused_and_left_in_place() {
    let t = tempfile::tempdir().unwrap();
    let content = serde_json::json!({"version": SCHEMA_VERSION + 1, "pods": {"p": {}}}).to_string();
    std::fs::write(t.path().join(CACHE_FILE), &content).unwrap();
    let err = Cache::open(t.path()).unwrap_err();
    assert!(
        matches!(err, ResmgrError::CacheNewer { found, supported, .. }
            if found == SCHEMA_VERSION + 1 && supported == SCHEMA_VERSION),
        "{err:?}"
    );
    assert!(err.to_string().contains("docs/UPGRADES.md"), "{err}");
    assert_eq!(
        std::fs::read_to_string(t.path().join(CACHE_FILE)).unwrap(),
        content
    );
    assert_eq!(
        std::fs::read_dir(t.path()).unwrap().count(),
        1,
        "nothing moved aside"
    );
}

/// A crash can leave the cache at any length (a torn write on a file
/// system without rename-atomic durability, or a disk that lost the
/// tail): every strict prefix of a saved cache is refused and moved
/// aside, never half-loaded; the whole file loads exactly.
#[test]
fn every_torn_prefix_of_a_saved_cache_is_refused_never_half_loaded() {
    let t = tempfile::tempdir().unwrap();
    let (mut c, _) = Cache::open(t.path()).unwrap();
    *c.data_mut() = sample();
    c.save().unwrap();
    let path = t.path().join(CACHE_FILE);
    let whole = std::fs::read(&path).unwrap();
    let mut cuts: Vec<usize> = (0..whole.len())
        .step_by(whole.len().div_ceil(97).max(1))
        .collect();
    cuts.push(whole.len() - 1);
    for cut in cuts {
        std::fs::write(&path, &whole[..cut]).unwrap();
        let (c, outcome) = Cache::open(t.path()).unwrap();
        assert!(
            matches!(outcome, LoadOutcome::Discarded { .. }),
            "a prefix of {cut} of {} bytes was accepted: {outcome:?}",
            whole.len()
        );
        assert!(c.data().containers.is_empty() && c.data().pods.is_empty());
    }
    std::fs::write(&path, &whole).unwrap();
    let (c, outcome) = Cache::open(t.path()).unwrap();
    assert_eq!(outcome, LoadOutcome::Restored);
    assert_eq!(c.data(), &sample());
}

/// A crash between writing the temporary and renaming it leaves a stray
/// temporary beside the last good cache: it is ignored.
#[test]
fn a_temporary_left_by_a_crashed_save_is_ignored() {
    let t = tempfile::tempdir().unwrap();
    let (mut c, _) = Cache::open(t.path()).unwrap();
    *c.data_mut() = sample();
    c.save().unwrap();
    std::fs::write(
        t.path().join(format!(".{CACHE_FILE}.4242-1.tmp")),
        b"{\"version\": 1, \"pods\": {",
    )
    .unwrap();
    let (c, outcome) = Cache::open(t.path()).unwrap();
    assert_eq!(outcome, LoadOutcome::Restored);
    assert_eq!(c.data(), &sample());
}

#[test]
fn resources_roundtrip_through_cri() {
    let r = cri::LinuxContainerResources {
        cpu_period: 100_000,
        cpu_quota: 50_000,
        cpu_shares: 512,
        memory_limit_in_bytes: 1 << 26,
        oom_score_adj: -997,
        cpuset_cpus: "0-1".into(),
        cpuset_mems: "0".into(),
        hugepage_limits: vec![cri::HugepageLimit {
            page_size: "2MB".into(),
            limit: 4 << 20,
        }],
        unified: [("memory.high".to_owned(), "max".to_owned())].into(),
        memory_swap_limit_in_bytes: 1 << 26,
    };
    assert_eq!(ResourcesRecord::from_cri(&r).to_cri(), r);
}
