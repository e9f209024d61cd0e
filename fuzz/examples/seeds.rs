//! Writes the hand-made seed inputs of every fuzz target into
//! `corpus/<target>/seed-*` (`cargo run --example seeds` from `fuzz/`).
//! Seeds are well-formed, realistic inputs the fuzzer mutates from; the
//! rest of each corpus is what libFuzzer found and `cargo fuzz cmin` kept.

use std::collections::HashMap;
use std::path::Path;

use prost::Message;
use steward_proto::cri::runtime::v1 as cri;
use steward_proto::discovery::v0 as disc;

fn write(target: &str, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target);
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join(format!("seed-{name}")), bytes)
}

/// One selector byte, then the input (targets that cover several parsers).
fn tagged(tag: u8, rest: &[u8]) -> Vec<u8> {
    let mut v = vec![tag];
    v.extend_from_slice(rest);
    v
}

fn sandbox(annotations: &[(&str, &str)]) -> cri::PodSandboxConfig {
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: "web-0".into(),
            uid: "7d3f0c7e-1f9a-4b1e-9c1d-000000000001".into(),
            namespace: "default".into(),
            attempt: 0,
        }),
        annotations: annotations
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect::<HashMap<_, _>>(),
        linux: Some(cri::LinuxPodSandboxConfig {
            cgroup_parent: "/kubepods/pod7d3f0c7e-1f9a-4b1e-9c1d-000000000001".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn create(cpus_millis: i64, annotations: &[(&str, &str)]) -> cri::CreateContainerRequest {
    cri::CreateContainerRequest {
        pod_sandbox_id: "0123456789abcdef".into(),
        config: Some(cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: "app".into(),
                attempt: 0,
            }),
            linux: Some(cri::LinuxContainerConfig {
                resources: Some(cri::LinuxContainerResources {
                    cpu_period: 100_000,
                    cpu_quota: cpus_millis * 100,
                    cpu_shares: cpus_millis * 1024 / 1000,
                    memory_limit_in_bytes: 256 << 20,
                    cpuset_cpus: "0-3".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        sandbox_config: Some(sandbox(annotations)),
    }
}

fn main() -> std::io::Result<()> {
    // cpuset
    for (i, s) in ["0-3,8,10-11", "", "0\n", " 1 , 4-5 ", "0-1023"]
        .iter()
        .enumerate()
    {
        write("cpuset", &i.to_string(), s.as_bytes())?;
    }
    // quantities
    for (i, s) in [
        "250m", "1.5", "2", "128Mi", "1G", "1e3", "1h30m", "200ms", "cam-7", "a-b-0",
    ]
    .iter()
    .enumerate()
    {
        write("quantities", &i.to_string(), s.as_bytes())?;
    }
    // resmgr_config
    let full = "policy:\n  active: topology-aware\n  config:\n    reserved_cpus: \"0\"\n    reserved_namespaces: [kube-system]\ncri:\n  disable_quota_for_exclusive: true\nblockio:\n  classes:\n    slow:\n      weight: 100\n      devices:\n        - { device: \"254:0\", read_bps: 1048576 }\nrdt:\n  classes:\n    gold: { schemata: [\"L3:0=ff\"] }\n";
    write("resmgr_config", "full", full.as_bytes())?;
    write("resmgr_config", "static", b"policy: { active: static }\n")?;
    write("resmgr_config", "empty", b"")?;
    // cri_request
    let guaranteed = create(2000, &[("cpu.steward.dev/prefer-isolated", "true")]);
    write(
        "cri_request",
        "create",
        &tagged(1, &guaranteed.encode_to_vec()),
    )?;
    let annotated = create(
        500,
        &[
            (
                "resources.resmgr.steward.dev/spec.container.app",
                r#"{"requests":{"cpu":"500m","memory":"64Mi"},"limits":{"cpu":"1","memory":"128Mi"}}"#,
            ),
            ("qos.resmgr.steward.dev/class", "Burstable"),
            ("blockio.resmgr.steward.dev/class", "slow"),
        ],
    );
    write(
        "cri_request",
        "create-annotated",
        &tagged(1, &annotated.encode_to_vec()),
    )?;
    let run = cri::RunPodSandboxRequest {
        config: Some(sandbox(&[(
            "rdt.resmgr.steward.dev/class.container.app",
            "gold",
        )])),
        runtime_handler: String::new(),
    };
    write("cri_request", "run", &tagged(0, &run.encode_to_vec()))?;
    let update = cri::UpdateContainerResourcesRequest {
        container_id: "c1".into(),
        linux: guaranteed
            .config
            .and_then(|c| c.linux)
            .and_then(|l| l.resources),
        ..Default::default()
    };
    write("cri_request", "update", &tagged(2, &update.encode_to_vec()))?;
    // resmgr_annotations
    write(
        "resmgr_annotations",
        "all",
        b"resources.resmgr.steward.dev/spec.container.c={\"requests\":{\"cpu\":\"2\",\"memory\":\"1Gi\"},\"limits\":{\"cpu\":\"2\",\"memory\":\"1Gi\"}}\nqos.resmgr.steward.dev/class=Guaranteed\nblockio.resmgr.steward.dev/class.container.c=slow\nrdt.resmgr.steward.dev/class=gold\ncpu.steward.dev/prefer-isolated.container.c=true\nmemory.steward.dev/tier=DRAM,PMEM\nballoon.steward.dev/name=db\n",
    )?;
    // discovery_details
    write(
        "discovery_details",
        "debug-echo",
        &tagged(
            0,
            b"descriptions: [\"camera-0\", \"camera-1\"]\npollInterval: 1s\nshared: true\n",
        ),
    )?;
    write(
        "discovery_details",
        "network",
        &tagged(1, b"{targets: ['127.0.0.0/29', 127.0.0.3], ports: [80, 554], interval: 2s, timeout: 200ms, expect: RTSP}"),
    )?;
    write(
        "discovery_details",
        "udev",
        &tagged(2, b"udevRules:\n  - 'SUBSYSTEM==\"video4linux\", ATTR{index}==\"0\"'\n  - 'SUBSYSTEM==\"block\", KERNEL!=\"loop*\", ENV{ID_BUS}==\"usb\"'\n"),
    )?;
    // handler_device
    let report = disc::DiscoverResponse {
        devices: vec![
            disc::Device {
                id: "/dev/video0".into(),
                properties: [("UDEV_DEVNODE".to_owned(), "/dev/video0".to_owned())].into(),
                mounts: vec![disc::Mount {
                    container_path: "/dev/video0".into(),
                    host_path: "/dev/video0".into(),
                    read_only: true,
                }],
                device_specs: vec![disc::DeviceSpec {
                    container_path: "/dev/video0".into(),
                    host_path: "/dev/./video0".into(),
                    permissions: "rw".into(),
                }],
            },
            disc::Device {
                id: "sensor-1".into(),
                properties: [("LOCATION".to_owned(), "lab".to_owned())].into(),
                ..Default::default()
            },
        ],
    };
    write("handler_device", "report", &report.encode_to_vec())?;
    // configurations_file
    write(
        "configurations_file",
        "standalone",
        include_bytes!("../../deploy/examples/standalone.yaml"),
    )?;
    // extender_args
    let args = r#"{"pod":{"metadata":{"name":"cam","namespace":"default","uid":"u1"},"spec":{"containers":[{"name":"a","resources":{"limits":{"steward.dev/cams-1a2b3c4d5e":"1","cpu":"1"}}},{"name":"b","resources":{"requests":{"steward.dev/cams-1a2b3c4d5e":"2"}}}],"initContainers":[{"name":"i","resources":{"limits":{"steward.dev/cams-1a2b3c4d5e":"1"}}}]}},"nodenames":["node-a","node-b"]}"#;
    write("extender_args", "nodenames", args.as_bytes())?;
    let nodes = r#"{"pod":{"metadata":{"name":"p"},"spec":{"containers":[{"name":"a"}]}},"nodes":{"items":[{"metadata":{"name":"node-a"}}]}}"#;
    write("extender_args", "nodes", nodes.as_bytes())?;
    // crd_objects
    let instance = r#"{"apiVersion":"steward.dev/v1alpha1","kind":"Instance","metadata":{"name":"cams-1a2b3c4d5e","namespace":"default","uid":"i1"},"spec":{"configurationName":"cams","deviceId":"/dev/video0","shared":true,"nodes":["node-a","node-b"],"capacity":2,"properties":{"LOCATION":"lab"}}}"#;
    write("crd_objects", "instance", &tagged(0, instance.as_bytes()))?;
    let claim = r#"{"apiVersion":"steward.dev/v1alpha1","kind":"SlotClaim","metadata":{"name":"cams-1a2b3c4d5e-0","namespace":"default"},"spec":{"instance":"cams-1a2b3c4d5e","slot":0,"node":"node-a","epoch":3,"pod":{"namespace":"default","name":"cam","uid":"u1"},"container":"a"}}"#;
    write("crd_objects", "slotclaim", &tagged(1, claim.as_bytes()))?;
    let reservation = r#"{"apiVersion":"steward.dev/v1alpha1","kind":"Reservation","metadata":{"name":"default.cam","namespace":"default","generation":2},"spec":{"pod":{"namespace":"default","name":"cam","uid":"u1"},"slots":{"cams-1a2b3c4d5e":1},"exclusiveCpus":2,"candidates":["node-a","node-b"]},"status":{"phase":"Reserved","node":"node-a","slots":["cams-1a2b3c4d5e-0"],"decidedAt":1700000000000,"observedGeneration":2}}"#;
    write(
        "crd_objects",
        "reservation",
        &tagged(2, reservation.as_bytes()),
    )?;
    let canceled = r#"{"metadata":{"name":"r","namespace":"ns"},"spec":{"pod":{"namespace":"ns","name":"p","uid":"u2"},"slots":{},"candidates":[],"cancel":"unreserved"},"status":{"phase":"Bogus"}}"#;
    write(
        "crd_objects",
        "reservation-odd",
        &tagged(2, canceled.as_bytes()),
    )?;
    h2_authority_seeds()
}

/// HPACK integer with an `n`-bit prefix (RFC 7541 §5.1).
fn hpack_int(out: &mut Vec<u8>, first: u8, n: u8, mut v: usize) {
    let max = (1usize << n) - 1;
    if v < max {
        out.push(first | v as u8);
        return;
    }
    out.push(first | max as u8);
    v -= max;
    while v >= 128 {
        out.push((v % 128) as u8 | 0x80);
        v /= 128;
    }
    out.push(v as u8);
}

/// A Huffman-coded HPACK string.
fn hpack_huff(out: &mut Vec<u8>, s: &str) {
    let h = steward_h2_authority::hpack::huffman_encode(s.as_bytes());
    hpack_int(out, 0x80, 7, h.len());
    out.extend_from_slice(&h);
}

/// Literal with incremental indexing: static name `name` (0: a new name).
fn hpack_lit(out: &mut Vec<u8>, name: usize, new_name: &str, value: &str) {
    hpack_int(out, 0x40, 6, name);
    if name == 0 {
        hpack_huff(out, new_name);
    }
    hpack_huff(out, value);
}

/// grpcio's first request on a unix socket: the socket path as authority.
fn grpcio_first() -> Vec<u8> {
    let mut b = vec![0x83, 0x86]; // :method POST, :scheme http
    hpack_lit(&mut b, 4, "", "/v1.PodResourcesLister/List");
    hpack_lit(
        &mut b,
        1,
        "",
        "%2Fvar%2Flib%2Fkubelet%2Fpod-resources%2Fkubelet.sock",
    );
    hpack_lit(&mut b, 0, "te", "trailers");
    hpack_lit(&mut b, 31, "", "application/grpc");
    hpack_lit(
        &mut b,
        58,
        "",
        "grpc-python/1.76.0 grpc-c/51.0.0 (linux; chttp2)",
    );
    hpack_lit(&mut b, 0, "grpc-accept-encoding", "identity, deflate, gzip");
    b
}

/// grpcio's next request: indices into the table the first one filled.
fn grpcio_later() -> Vec<u8> {
    let mut b = vec![0x83, 0x86];
    for i in [67, 66, 65, 64, 63, 62] {
        hpack_int(&mut b, 0x80, 7, i);
    }
    b
}

/// grpc-go's request (kubelet, crictl): authority `localhost`.
fn grpc_go() -> Vec<u8> {
    let mut b = vec![0x83, 0x86];
    hpack_lit(&mut b, 4, "", "/runtime.v1.RuntimeService/Version");
    hpack_lit(&mut b, 1, "", "localhost");
    hpack_lit(&mut b, 31, "", "application/grpc");
    hpack_lit(&mut b, 58, "", "grpc-go/1.72.0");
    hpack_lit(&mut b, 0, "te", "trailers");
    b
}

/// h2_authority: tag 0, blocks each after a one-byte length (decoders
/// compared); tag 1, a connection described frame by frame (see the target).
fn h2_authority_seeds() -> std::io::Result<()> {
    let blocks = |bs: &[Vec<u8>]| {
        let mut v = Vec::new();
        for b in bs {
            v.push(b.len() as u8);
            v.extend_from_slice(b);
        }
        v
    };
    write(
        "h2_authority",
        "decode-grpcio",
        &tagged(0, &blocks(&[grpcio_first(), grpcio_later()])),
    )?;
    write(
        "h2_authority",
        "decode-grpc-go",
        &tagged(0, &blocks(&[grpc_go()])),
    )?;
    // A HEADERS frame: what (2: one piece; +4 per CONTINUATION, 0x10 padded,
    // 0x20 priority, 0x40 END_STREAM), stream, length (low, high), fragment,
    // then the pad length when padded.
    let headers = |out: &mut Vec<u8>, what: u8, stream: u8, b: &[u8], pad: Option<u8>| {
        out.extend_from_slice(&[what, stream, b.len() as u8, (b.len() >> 8) as u8]);
        out.extend_from_slice(b);
        out.extend(pad);
    };
    // grpcio: two requests on streams 1 and 3 with a DATA frame between,
    // fed in 1-byte and 8-byte chunks.
    let mut c = vec![2];
    headers(&mut c, 2, 0, &grpcio_first(), None);
    c.extend_from_slice(&[0, 0, 5, 0, 0, 0, 0, 1]);
    headers(&mut c, 2, 1, &grpcio_later(), None);
    c.extend_from_slice(&[0, 1, 0, 1]);
    write("h2_authority", "rewrite-grpcio", &tagged(1, &c))?;
    // grpc-go: one request, left alone.
    let mut c = vec![0];
    headers(&mut c, 2, 0, &grpc_go(), None);
    c.push(0xff);
    write("h2_authority", "rewrite-grpc-go", &tagged(1, &c))?;
    // grpcio split over a CONTINUATION, padded, with priority, END_STREAM.
    let mut c = vec![0];
    headers(&mut c, 0x76, 0, &grpcio_first(), Some(7));
    c.push(3);
    write(
        "h2_authority",
        "rewrite-grpcio-continuation",
        &tagged(1, &c),
    )?;
    // nri_wire: one read size, then the runtime's stream (Configure and a
    // CreateContainer on connection 1, RegisterPlugin's answer on 2, a
    // frame for a connection nobody opened).
    {
        use steward_nri::proto::nri;
        let mut stream = Vec::new();
        let configure = nri::ConfigureRequest {
            runtime_name: "containerd".into(),
            runtime_version: "2.1.9".into(),
            registration_timeout: 5000,
            request_timeout: 2000,
            ..Default::default()
        };
        let create = nri::CreateContainerRequest {
            pod: Some(nri::PodSandbox {
                id: "0123456789abcdef".into(),
                name: "web-0".into(),
                namespace: "default".into(),
                ..Default::default()
            }),
            container: Some(nri::Container {
                id: "fedcba9876543210".into(),
                name: "app".into(),
                env: vec!["A=".repeat(3000)],
                ..Default::default()
            }),
        };
        let msgs = [
            (1, "Configure", configure.encode_to_vec()),
            (3, "CreateContainer", create.encode_to_vec()),
        ];
        for (id, method, payload) in msgs {
            if let Ok(m) = steward_nri::ttrpc::encode_request(
                id,
                nri::PLUGIN_SERVICE,
                method,
                payload,
                2_000_000_000,
            ) {
                steward_nri::mux::encode(1, &m, &mut stream);
            }
        }
        if let Ok(m) = steward_nri::ttrpc::encode_response(1, None, Vec::new()) {
            steward_nri::mux::encode(2, &m, &mut stream);
        }
        steward_nri::mux::encode(7, b"ignored", &mut stream);
        write("nri_wire", "session", &tagged(200, &stream))?;
        write("nri_wire", "one-byte-reads", &tagged(1, &stream))?;
    }
    Ok(())
}
