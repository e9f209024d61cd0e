//! Tests of both cgroup interfaces and of path normalization.

use super::*;

fn put(path: &Path, content: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, content).unwrap();
}

#[test]
fn v1_reads_cpuset_and_memory_and_treats_huge_limit_as_unlimited() {
    let t = tempfile::tempdir().unwrap();
    let cg = "/kubepods/pod1/c1";
    put(
        &t.path().join("cpuset/kubepods/pod1/c1/cpuset.cpus"),
        "0-1,4\n",
    );
    put(&t.path().join("cpuset/kubepods/pod1/c1/cpuset.mems"), "0\n");
    put(
        &t.path()
            .join("memory/kubepods/pod1/c1/memory.limit_in_bytes"),
        "67108864\n",
    );
    let v1 = CgroupV1::new(t.path());
    assert!(v1.exists(cg));
    assert!(!v1.exists("/nope"));
    assert_eq!(v1.read_cpus(cg).unwrap(), "0-1,4");
    assert_eq!(v1.read_mems(cg).unwrap(), "0");
    assert_eq!(v1.read_memory_limit(cg).unwrap(), Some(64 << 20));
    put(
        &t.path()
            .join("memory/kubepods/pod1/c1/memory.limit_in_bytes"),
        "9223372036854771712\n",
    );
    assert_eq!(v1.read_memory_limit(cg).unwrap(), None);
    put(
        &t.path()
            .join("memory/kubepods/pod1/c1/memory.limit_in_bytes"),
        "junk",
    );
    assert!(v1.read_memory_limit(cg).is_err());
    assert!(matches!(detect(t.path()).version(), CgroupVersion::V1));
    put(
        &t.path().join("cpuset/kubepods/pod1/c1/cgroup.procs"),
        "12\n345\n",
    );
    assert_eq!(v1.read_pids(cg).unwrap(), vec![12, 345]);
}

#[test]
fn v2_reads_configured_or_effective_cpuset_and_memory_max() {
    let t = tempfile::tempdir().unwrap();
    put(
        &t.path().join("cgroup.controllers"),
        "cpuset cpu io memory\n",
    );
    let dir = t.path().join("kubepods.slice/c1");
    put(&dir.join("cpuset.cpus"), "\n");
    put(&dir.join("cpuset.cpus.effective"), "0-3\n");
    put(&dir.join("cpuset.mems"), "1\n");
    put(&dir.join("memory.max"), "max\n");
    let cg = detect(t.path());
    assert_eq!(cg.version(), CgroupVersion::V2);
    assert!(cg.exists("/kubepods.slice/c1"));
    assert_eq!(cg.read_cpus("/kubepods.slice/c1").unwrap(), "0-3");
    assert_eq!(cg.read_mems("/kubepods.slice/c1").unwrap(), "1");
    assert_eq!(cg.read_memory_limit("/kubepods.slice/c1").unwrap(), None);
    put(&dir.join("cpuset.cpus"), "2\n");
    put(&dir.join("memory.max"), "1048576\n");
    assert_eq!(cg.read_cpus("/kubepods.slice/c1").unwrap(), "2");
    assert_eq!(
        cg.read_memory_limit("/kubepods.slice/c1").unwrap(),
        Some(1 << 20)
    );
}

#[test]
fn v2_blockio_writes_weight_and_io_max_and_reports_missing_files() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("pod/c1");
    put(&dir.join("io.weight"), "default 100\n");
    put(&dir.join("io.max"), "");
    let v2 = CgroupV2::new(t.path());
    let class = BlockIoClass {
        weight: Some(200),
        devices: vec![BlockIoDevice {
            device: "254:0".into(),
            read_bps: Some(1 << 20),
            write_iops: Some(100),
            ..Default::default()
        }],
    };
    let out = v2.apply_blockio("/pod/c1", &class).unwrap();
    assert!(out.skipped.is_empty(), "{out:?}");
    assert_eq!(
        std::fs::read_to_string(dir.join("io.weight")).unwrap(),
        "default 1920"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("io.max")).unwrap(),
        "254:0 rbps=1048576 wiops=100"
    );
    // No io controller files: a clean report, nothing written.
    let bare = t.path().join("pod/c2");
    std::fs::create_dir_all(&bare).unwrap();
    let out = v2.apply_blockio("/pod/c2", &class).unwrap();
    assert!(out.written.is_empty());
    assert_eq!(out.skipped.len(), 2, "{out:?}");
    assert!(v2.apply_blockio("/pod/missing", &class).is_err());
}

#[test]
fn v1_blockio_writes_throttles_and_skips_missing_weight() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("blkio/pod/c1");
    put(&dir.join("blkio.throttle.read_bps_device"), "");
    put(&dir.join("blkio.throttle.write_bps_device"), "");
    let v1 = CgroupV1::new(t.path());
    let class = BlockIoClass {
        weight: Some(300),
        devices: vec![BlockIoDevice {
            device: "8:0".into(),
            read_bps: Some(4096),
            write_bps: Some(8192),
            read_iops: Some(5),
            ..Default::default()
        }],
    };
    let out = v1.apply_blockio("/pod/c1", &class).unwrap();
    assert_eq!(out.written.len(), 2, "{out:?}");
    assert_eq!(
        std::fs::read_to_string(dir.join("blkio.throttle.write_bps_device")).unwrap(),
        "8:0 8192"
    );
    assert_eq!(out.skipped.len(), 2, "{out:?}"); // weight + read_iops file absent
    put(&dir.join("blkio.bfq.weight"), "100");
    v1.apply_blockio("/pod/c1", &class).unwrap();
    assert_eq!(
        std::fs::read_to_string(dir.join("blkio.bfq.weight")).unwrap(),
        "300"
    );
}

#[test]
fn v1_weights_convert_to_v2_as_runc_does() {
    for (v1, v2) in [
        (10, 1),
        (1000, 10_000),
        (500, 4950),
        (100, 910),
        (200, 1920),
        (11, 11),
        (999, 9989),
        (1, 1),
        (9, 1),
    ] {
        assert_eq!(v2_io_weight(v1), v2, "v1 weight {v1}");
    }
    // Monotonic and inside the v2 range over the whole v1 range.
    let all: Vec<u64> = (10..=1000).map(v2_io_weight).collect();
    assert!(all.windows(2).all(|p| p[0] < p[1]));
    assert!(all.iter().all(|w| (1..=10_000).contains(w)));
}

#[test]
fn class_validation() {
    let mut c = BlockIoClass {
        weight: Some(0),
        devices: vec![],
    };
    assert!(c.validate("x").is_err());
    c.weight = Some(500);
    assert!(c.validate("x").is_ok());
    c.devices.push(BlockIoDevice {
        device: "sda".into(),
        ..Default::default()
    });
    assert!(
        c.validate("x")
            .unwrap_err()
            .to_string()
            .contains("major:minor")
    );
}

#[test]
fn cgroups_paths_normalize() {
    assert_eq!(normalize_cgroups_path("/a/b/c"), "/a/b/c");
    assert_eq!(normalize_cgroups_path("a/b"), "/a/b");
    assert_eq!(
        normalize_cgroups_path("kubepods-burstable-pod1.slice:cri-containerd:abc"),
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/cri-containerd-abc.scope"
    );
    assert_eq!(normalize_cgroups_path("-.slice::x"), "/x.scope");
}
