use super::*;

#[test]
fn parse_var_finds_exact_key() {
    let out = "noise\nCONTAINERD_SOCK_X=no\nCONTAINERD_SOCK=/a/b.sock\nCONTAINERD_PID=7\n";
    assert_eq!(parse_var(out, "CONTAINERD_SOCK"), Some("/a/b.sock"));
    assert_eq!(parse_var(out, "CONTAINERD_PID"), Some("7"));
    assert_eq!(parse_var(out, "CONTAINERD_CGROUP_PARENT"), None);
}

#[test]
fn unique_names_differ_and_are_dns_safe() {
    let a = unique_name("My_Pod");
    let b = unique_name("My_Pod");
    assert_ne!(a, b);
    assert!(a.starts_with("my-pod-"), "{a}");
    assert!(a.len() <= 63, "{a}");
    assert!(
        a.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
        "{a}"
    );
}

#[test]
fn pod_config_nests_cgroup_and_sets_namespaces() {
    let cfg = pod_sandbox_config("/steward-test/abc/", "p", PodNetwork::Host);
    let meta = cfg.metadata.clone().unwrap_or_default();
    let linux = cfg.linux.clone().unwrap_or_default();
    assert_eq!(
        linux.cgroup_parent,
        format!("/steward-test/abc/{}", meta.name)
    );
    let ns = linux
        .security_context
        .and_then(|s| s.namespace_options)
        .unwrap_or_default();
    assert_eq!(ns.network, cri::NamespaceMode::Node as i32);
    assert_eq!(ns.pid, cri::NamespaceMode::Container as i32);
    assert_eq!(cfg.labels.get(POD_LABEL), Some(&meta.name));

    let pod = pod_sandbox_config("/x", "p", PodNetwork::Pod);
    let ns = pod
        .linux
        .and_then(|l| l.security_context)
        .and_then(|s| s.namespace_options)
        .unwrap_or_default();
    assert_eq!(ns.network, cri::NamespaceMode::Pod as i32);
}

#[test]
fn container_spec_carries_resources_and_namespaces() {
    let sandbox = pod_sandbox_config("/x", "p", PodNetwork::Host);
    let cfg = ContainerSpec::new("work")
        .cpuset("0")
        .memory_limit(64 << 20)
        .build(&sandbox);
    assert_eq!(cfg.command, vec!["sleep", "3600"]);
    assert_eq!(cfg.image.clone().unwrap_or_default().image, BUSYBOX_IMAGE);
    let linux = cfg.linux.unwrap_or_default();
    let res = linux.resources.unwrap_or_default();
    assert_eq!(res.cpuset_cpus, "0");
    assert_eq!(res.memory_limit_in_bytes, 67_108_864);
    let ns = linux
        .security_context
        .and_then(|s| s.namespace_options)
        .unwrap_or_default();
    assert_eq!(ns.network, cri::NamespaceMode::Node as i32);
}

#[test]
fn host_cgroup_dir_layout() {
    assert_eq!(
        host_cgroup_dir("memory", "/steward-test/a/pod-1/", "cid"),
        PathBuf::from("/sys/fs/cgroup/memory/steward-test/a/pod-1/cid")
    );
}

#[test]
fn scripts_are_present() {
    assert!(scripts_dir().join("containerd.sh").is_file());
    assert!(scripts_dir().join("build-images.sh").is_file());
}
