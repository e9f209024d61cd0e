//! The vendored protos keep upstream's names and field numbers.
//!
//! The tables below were written from containerd/nri v0.8.0
//! (`pkg/api/api.proto`, revision 6d486acd3f7190d39f3b22490b59f7b7bb937b22,
//! the NRI containerd 2.1.9 ships) and containerd/ttrpc v1.2.6
//! (`request.proto`, revision bcc40a4d692214bd62f70bb4ce06f59530fd952c). An
//! edit of a vendored file that renumbers or renames what steward uses, or a
//! re-vendoring from another revision, fails here.

const NRI_REV: &str = "6d486acd3f7190d39f3b22490b59f7b7bb937b22";
const TTRPC_REV: &str = "bcc40a4d692214bd62f70bb4ce06f59530fd952c";

/// (message, [(field, number)]) as upstream.
const NRI_MESSAGES: &[(&str, &[(&str, i32)])] = &[
    (
        "RegisterPluginRequest",
        &[("plugin_name", 1), ("plugin_idx", 2)],
    ),
    ("UpdateContainersRequest", &[("update", 1), ("evict", 2)]),
    ("UpdateContainersResponse", &[("failed", 1)]),
    (
        "ConfigureRequest",
        &[
            ("config", 1),
            ("runtime_name", 2),
            ("runtime_version", 3),
            ("registration_timeout", 4),
            ("request_timeout", 5),
        ],
    ),
    ("ConfigureResponse", &[("events", 2)]),
    (
        "SynchronizeRequest",
        &[("pods", 1), ("containers", 2), ("more", 3)],
    ),
    ("SynchronizeResponse", &[("update", 1), ("more", 2)]),
    ("CreateContainerRequest", &[("pod", 1), ("container", 2)]),
    (
        "CreateContainerResponse",
        &[("adjust", 1), ("update", 2), ("evict", 3)],
    ),
    (
        "UpdateContainerRequest",
        &[("pod", 1), ("container", 2), ("linux_resources", 3)],
    ),
    ("UpdateContainerResponse", &[("update", 1), ("evict", 2)]),
    ("StopContainerRequest", &[("pod", 1), ("container", 2)]),
    ("StopContainerResponse", &[("update", 1)]),
    (
        "StateChangeEvent",
        &[("event", 1), ("pod", 2), ("container", 3)],
    ),
    ("Empty", &[]),
    (
        "PodSandbox",
        &[
            ("id", 1),
            ("name", 2),
            ("uid", 3),
            ("namespace", 4),
            ("labels", 5),
            ("annotations", 6),
            ("runtime_handler", 7),
            ("linux", 8),
            ("pid", 9),
            ("ips", 10),
        ],
    ),
    (
        "LinuxPodSandbox",
        &[
            ("pod_overhead", 1),
            ("pod_resources", 2),
            ("cgroup_parent", 3),
            ("cgroups_path", 4),
            ("namespaces", 5),
            ("resources", 6),
        ],
    ),
    (
        "Container",
        &[
            ("id", 1),
            ("pod_sandbox_id", 2),
            ("name", 3),
            ("state", 4),
            ("labels", 5),
            ("annotations", 6),
            ("args", 7),
            ("env", 8),
            ("mounts", 9),
            ("hooks", 10),
            ("linux", 11),
            ("pid", 12),
            ("rlimits", 13),
        ],
    ),
    (
        "LinuxContainer",
        &[
            ("namespaces", 1),
            ("devices", 2),
            ("resources", 3),
            ("oom_score_adj", 4),
            ("cgroups_path", 5),
        ],
    ),
    (
        "LinuxResources",
        &[
            ("memory", 1),
            ("cpu", 2),
            ("hugepage_limits", 3),
            ("blockio_class", 4),
            ("rdt_class", 5),
            ("unified", 6),
            ("devices", 7),
            ("pids", 8),
        ],
    ),
    (
        "LinuxCPU",
        &[
            ("shares", 1),
            ("quota", 2),
            ("period", 3),
            ("realtime_runtime", 4),
            ("realtime_period", 5),
            ("cpus", 6),
            ("mems", 7),
        ],
    ),
    (
        "LinuxMemory",
        &[
            ("limit", 1),
            ("reservation", 2),
            ("swap", 3),
            ("kernel", 4),
            ("kernel_tcp", 5),
            ("swappiness", 6),
            ("disable_oom_killer", 7),
            ("use_hierarchy", 8),
        ],
    ),
    ("HugepageLimit", &[("page_size", 1), ("limit", 2)]),
    (
        "ContainerAdjustment",
        &[
            ("annotations", 2),
            ("mounts", 3),
            ("env", 4),
            ("hooks", 5),
            ("linux", 6),
            ("rlimits", 7),
            ("CDI_devices", 8),
        ],
    ),
    (
        "LinuxContainerAdjustment",
        &[
            ("devices", 1),
            ("resources", 2),
            ("cgroups_path", 3),
            ("oom_score_adj", 4),
        ],
    ),
    (
        "ContainerUpdate",
        &[("container_id", 1), ("linux", 2), ("ignore_failure", 3)],
    ),
    ("LinuxContainerUpdate", &[("resources", 1)]),
    ("ContainerEviction", &[("container_id", 1), ("reason", 2)]),
    ("CDIDevice", &[("name", 1)]),
    ("OptionalString", &[("value", 1)]),
    ("OptionalInt64", &[("value", 1)]),
    ("OptionalUInt64", &[("value", 1)]),
];

/// Upstream's Event enum (the event mask's bits are `1 << (value - 1)`).
const NRI_EVENTS: &[(&str, i32)] = &[
    ("UNKNOWN", 0),
    ("RUN_POD_SANDBOX", 1),
    ("STOP_POD_SANDBOX", 2),
    ("REMOVE_POD_SANDBOX", 3),
    ("CREATE_CONTAINER", 4),
    ("POST_CREATE_CONTAINER", 5),
    ("START_CONTAINER", 6),
    ("POST_START_CONTAINER", 7),
    ("UPDATE_CONTAINER", 8),
    ("POST_UPDATE_CONTAINER", 9),
    ("STOP_CONTAINER", 10),
    ("REMOVE_CONTAINER", 11),
    ("LAST", 12),
];

/// (service, methods) as upstream: the session dispatches on these names.
const NRI_SERVICES: &[(&str, &[&str])] = &[
    ("Runtime", &["RegisterPlugin", "UpdateContainers"]),
    (
        "Plugin",
        &[
            "Configure",
            "Synchronize",
            "Shutdown",
            "CreateContainer",
            "UpdateContainer",
            "StopContainer",
            "StateChange",
        ],
    ),
];

const TTRPC_MESSAGES: &[(&str, &[(&str, i32)])] = &[
    (
        "Request",
        &[
            ("service", 1),
            ("method", 2),
            ("payload", 3),
            ("timeout_nano", 4),
            ("metadata", 5),
        ],
    ),
    ("Response", &[("status", 1), ("payload", 2)]),
    ("KeyValue", &[("key", 1), ("value", 2)]),
];

fn manifest(p: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(p)
}

fn compile() -> protox::prost_reflect::DescriptorPool {
    let files = [
        manifest("proto/nri/api.proto"),
        manifest("proto/ttrpc/request.proto"),
    ];
    let includes = [manifest("proto/nri"), manifest("proto/ttrpc")];
    let fds = match protox::compile(files, includes) {
        Ok(fds) => fds,
        Err(e) => panic!("vendored protos do not compile: {e}"),
    };
    match protox::prost_reflect::DescriptorPool::from_file_descriptor_set(fds) {
        Ok(pool) => pool,
        Err(e) => panic!("descriptor pool: {e}"),
    }
}

fn check_fields(
    pool: &protox::prost_reflect::DescriptorPool,
    pkg: &str,
    table: &[(&str, &[(&str, i32)])],
) {
    for (msg, fields) in table {
        let full = if pkg.is_empty() {
            (*msg).to_owned()
        } else {
            format!("{pkg}.{msg}")
        };
        let d = pool
            .get_message_by_name(&full)
            .unwrap_or_else(|| panic!("{full} missing from the vendored proto"));
        let got: Vec<(String, i32)> = d
            .fields()
            .map(|f| (f.name().to_owned(), f.number() as i32))
            .collect();
        let want: Vec<(String, i32)> = fields.iter().map(|(n, i)| ((*n).to_owned(), *i)).collect();
        assert_eq!(got, want, "{full}: fields differ from upstream");
    }
}

#[test]
fn vendored_files_name_their_upstream_revision() {
    let nri = std::fs::read_to_string(manifest("proto/nri/api.proto")).expect("read api.proto");
    assert!(
        nri.lines().take(3).any(|l| l.contains(NRI_REV)),
        "api.proto header must name {NRI_REV}"
    );
    let req =
        std::fs::read_to_string(manifest("proto/ttrpc/request.proto")).expect("read request.proto");
    assert!(
        req.lines().take(3).any(|l| l.contains(TTRPC_REV)),
        "request.proto header must name {TTRPC_REV}"
    );
    let status = std::fs::read_to_string(manifest("proto/ttrpc/proto/status.proto"))
        .expect("read status.proto");
    assert!(status.contains(TTRPC_REV));
}

#[test]
fn nri_messages_keep_upstream_field_numbers() {
    check_fields(&compile(), "nri.pkg.api.v1alpha1", NRI_MESSAGES);
}

#[test]
fn nri_events_and_services_keep_upstream_names() {
    let pool = compile();
    let e = pool
        .get_enum_by_name("nri.pkg.api.v1alpha1.Event")
        .expect("Event enum");
    let got: Vec<(String, i32)> = e
        .values()
        .map(|v| (v.name().to_owned(), v.number()))
        .collect();
    let want: Vec<(String, i32)> = NRI_EVENTS
        .iter()
        .map(|(n, i)| ((*n).to_owned(), *i))
        .collect();
    assert_eq!(got, want);
    for (svc, methods) in NRI_SERVICES {
        let full = format!("nri.pkg.api.v1alpha1.{svc}");
        let s = pool
            .get_service_by_name(&full)
            .unwrap_or_else(|| panic!("{full} missing"));
        let got: Vec<String> = s.methods().map(|m| m.name().to_owned()).collect();
        assert_eq!(got, *methods, "{full}: methods differ from upstream");
    }
    assert_eq!(
        steward_nri::proto::nri::PLUGIN_SERVICE,
        "nri.pkg.api.v1alpha1.Plugin"
    );
    assert_eq!(
        steward_nri::proto::nri::RUNTIME_SERVICE,
        "nri.pkg.api.v1alpha1.Runtime"
    );
}

#[test]
fn ttrpc_envelope_keeps_upstream_field_numbers() {
    let pool = compile();
    check_fields(&pool, "ttrpc", TTRPC_MESSAGES);
    // google.rpc.Status's wire shape (request.pb.go's Status).
    check_fields(
        &pool,
        "",
        &[("Status", &[("code", 1), ("message", 2), ("details", 3)])],
    );
}

/// The generated types encode what upstream's Go encodes: ConfigureResponse
/// events is field 2 (tag 0x10); LinuxCPU.cpus is field 6 (tag 0x32).
#[test]
fn generated_types_encode_upstream_tags() {
    use prost::Message;
    use steward_nri::proto::nri::{ConfigureResponse, LinuxCpu};
    assert_eq!(
        ConfigureResponse { events: 8 }.encode_to_vec(),
        [0x10, 0x08]
    );
    let cpu = LinuxCpu {
        cpus: "0".into(),
        ..Default::default()
    };
    assert_eq!(cpu.encode_to_vec(), [0x32, 0x01, b'0']);
}
