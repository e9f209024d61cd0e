//! CDI resolution: spec files to the container edits a CDI-capable runtime
//! applies, into a CRI ContainerConfig; the CDI IDs a DRA driver hands out
//! through the stand-in resolve against the driver's spec.
// Test helpers: panicking on an unexpected answer is the point.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;

use common::dra::dra_env;
use serde_json::json;
use steward_proto::cri::runtime::v1 as cri;
use steward_testing_kubelet::cdi::{CdiError, CdiSpecs, Injection, pass_devices, resolve};
use steward_testing_kubelet::{ContainerSpec, PodSpec};

fn write_spec(dir: &Path, file: &str, spec: serde_json::Value) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join(file), spec.to_string()).unwrap();
}

fn camera_spec() -> serde_json::Value {
    json!({
        "cdiVersion": "0.6.0",
        "kind": "steward.dev/test",
        "containerEdits": {
            "env": ["STEWARD=1"],
            "hooks": [{"hookName": "createContainer", "path": "/bin/true"}]
        },
        "devices": [
            {
                "name": "d0",
                "containerEdits": {
                    "env": ["DEVICE=d0"],
                    "deviceNodes": [{"path": "/dev/video0"}],
                    "mounts": [{"hostPath": "/run/cam0", "containerPath": "/cam", "options": ["ro", "bind"]}]
                }
            },
            {
                "name": "d1",
                "containerEdits": {
                    "env": ["DEVICE=d1"],
                    "deviceNodes": [{"path": "/dev/cam1", "hostPath": "/dev/video1", "permissions": "rw"}]
                }
            }
        ]
    })
}

#[test]
fn spec_files_resolve_to_container_edits() {
    let dir = tempfile::tempdir().unwrap();
    let static_dir = dir.path().join("etc-cdi");
    let dynamic_dir = dir.path().join("var-run-cdi");
    write_spec(&static_dir, "steward.json", camera_spec());
    write_spec(&static_dir, "notes.txt", json!("ignored"));

    let edits = resolve(
        &[&static_dir, &dynamic_dir],
        &["steward.dev/test=d0", "steward.dev/test=d1"],
    )
    .unwrap();
    // Spec-wide edits once, then each device's.
    assert_eq!(edits.env, ["STEWARD=1", "DEVICE=d0", "DEVICE=d1"]);
    assert!(
        edits.unsupported.contains("hooks"),
        "{:?}",
        edits.unsupported
    );
    let mut config = cri::ContainerConfig {
        envs: vec![cri::KeyValue {
            key: "DEVICE".into(),
            value: b"from-image".to_vec(),
        }],
        ..Default::default()
    };
    edits.apply_to(&mut config);
    let envs: Vec<(String, String)> = config
        .envs
        .iter()
        .map(|e| (e.key.clone(), String::from_utf8(e.value.clone()).unwrap()))
        .collect();
    assert_eq!(
        envs,
        [
            ("DEVICE".to_string(), "d1".to_string()),
            ("STEWARD".to_string(), "1".to_string())
        ]
    );
    let devices: Vec<(&str, &str, &str)> = config
        .devices
        .iter()
        .map(|d| {
            (
                d.container_path.as_str(),
                d.host_path.as_str(),
                d.permissions.as_str(),
            )
        })
        .collect();
    assert_eq!(
        devices,
        [
            ("/dev/video0", "/dev/video0", "rwm"),
            ("/dev/cam1", "/dev/video1", "rw")
        ]
    );
    assert_eq!(config.mounts.len(), 1);
    assert_eq!(
        (
            config.mounts[0].host_path.as_str(),
            config.mounts[0].container_path.as_str()
        ),
        ("/run/cam0", "/cam")
    );
    assert!(config.mounts[0].readonly);

    // A later directory overrides an earlier one.
    write_spec(
        &dynamic_dir,
        "claim.json",
        json!({"cdiVersion": "0.6.0", "kind": "steward.dev/test",
               "devices": [{"name": "d0", "containerEdits": {"env": ["DEVICE=override"]}}]}),
    );
    let edits = resolve(&[&static_dir, &dynamic_dir], &["steward.dev/test=d0"]).unwrap();
    assert_eq!(edits.env, ["DEVICE=override"]);
    assert!(edits.device_nodes.is_empty());
}

#[test]
fn a_cdi_runtime_gets_the_ids_and_for_one_without_cdi_the_stand_in_applies_them() {
    let dir = tempfile::tempdir().unwrap();
    write_spec(dir.path(), "cam.json", camera_spec());
    let ids = ["steward.dev/test=d0"];

    // containerd 2.x: the IDs reach the runtime, nothing is applied here.
    let mut config = cri::ContainerConfig::default();
    let applied = pass_devices(&mut config, &ids, &[dir.path()], Injection::Runtime).unwrap();
    assert!(applied.is_none());
    assert_eq!(
        config.cdi_devices,
        [cri::CdiDevice {
            name: ids[0].to_string()
        }]
    );
    assert!(config.envs.is_empty() && config.devices.is_empty() && config.mounts.is_empty());
    assert!(matches!(
        pass_devices(&mut config, &["no-kind"], &[dir.path()], Injection::Runtime),
        Err(CdiError::InvalidId(_))
    ));

    // containerd 1.6: the stand-in resolves and applies the edits.
    let mut config = cri::ContainerConfig::default();
    let applied = pass_devices(&mut config, &ids, &[dir.path()], Injection::StandIn)
        .unwrap()
        .unwrap();
    assert!(config.cdi_devices.is_empty());
    assert!(applied.env.contains(&"DEVICE=d0".to_string()));
    assert!(
        config
            .envs
            .iter()
            .any(|e| e.key == "DEVICE" && e.value == b"d0")
    );
    assert_eq!(config.devices[0].container_path, "/dev/video0");
    assert_eq!(config.mounts[0].container_path, "/cam");
}

#[test]
fn unknown_invalid_and_conflicting_devices_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    write_spec(dir.path(), "a.json", camera_spec());
    write_spec(
        dir.path(),
        "b.json",
        json!({"cdiVersion": "0.6.0", "kind": "steward.dev/test", "devices": [{"name": "d1", "containerEdits": {}}]}),
    );
    std::fs::write(dir.path().join("c.yaml"), "cdiVersion: 0.6.0\n").unwrap();
    let specs = CdiSpecs::load(&[dir.path()]).unwrap();
    assert_eq!(
        specs.device_ids(),
        ["steward.dev/test=d0", "steward.dev/test=d1"]
    );

    match specs.resolve(&["steward.dev/test=d9"]) {
        Err(CdiError::Unknown { id, known, skipped }) => {
            assert_eq!(id, "steward.dev/test=d9");
            assert_eq!(known.len(), 2);
            assert_eq!(skipped, [dir.path().join("c.yaml")]);
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(matches!(
        specs.resolve(&["d0"]),
        Err(CdiError::InvalidId(_))
    ));
    assert!(matches!(
        specs.resolve(&["steward.dev/test=d1"]),
        Err(CdiError::Conflict { .. })
    ));
    assert!(specs.resolve(&["steward.dev/test=d0"]).is_ok());

    write_spec(dir.path(), "d.json", json!({"kind": "steward.dev/test"}));
    let err = CdiSpecs::load(&[dir.path()]).err().unwrap();
    assert!(err.to_string().contains("d.json"), "{err}");
}

#[tokio::test]
async fn cdi_ids_from_a_dra_driver_resolve_against_its_spec() {
    let env = dra_env(&["d0", "d1"]).await;
    env.claim("cams", 2).await;
    let spec = PodSpec::new("default", "viewer")
        .resource_claim("cams", "cams")
        .container(ContainerSpec::new("main").claim("cams"));
    let spec = env.schedule(spec).await;
    let admitted = env.kubelet.add_pod(spec).await.unwrap();
    // The driver writes its spec where the runtime looks (here: a tempdir).
    let cdi_dir = env.dir.path().join("cdi");
    write_spec(&cdi_dir, "steward.dev-test.json", camera_spec());
    let edits = resolve(&[&cdi_dir], &admitted.cdi_devices["main"]).unwrap();
    let nodes: Vec<&str> = edits.device_nodes.iter().map(|d| d.path.as_str()).collect();
    assert_eq!(nodes, ["/dev/video0", "/dev/cam1"]);
}
