//! Untrusted handlers: invalid devices are rejected (and counted), garbage
//! and hangs make a handler Offline, never crash the agent.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use futures::StreamExt;
use kube::Api;
use steward_agent::Mode;
use steward_api::Configuration;
use steward_core::discovery::{Device, DeviceSpec, Endpoint, Mount};
use steward_discovery::{DeviceStream, DiscoverRequest, DiscoveryError, DiscoveryHandler};
use tokio::io::AsyncWriteExt;

const WAIT: Duration = Duration::from_secs(15);

/// Reports a fixed list of devices once, then stays quiet.
struct Fixed(Vec<Device>);

impl DiscoveryHandler for Fixed {
    fn name(&self) -> &str {
        "fixed"
    }
    fn shared(&self) -> bool {
        false
    }
    fn discover(&self, _req: DiscoverRequest) -> Result<DeviceStream, DiscoveryError> {
        Ok(futures::stream::iter(vec![Ok(self.0.clone())])
            .chain(futures::stream::pending())
            .boxed())
    }
}

fn dev(id: &str) -> Device {
    Device {
        id: id.into(),
        properties: BTreeMap::from([("GOOD_NAME".to_string(), "v".to_string())]),
        mounts: vec![],
        device_specs: vec![DeviceSpec {
            container_path: "/dev/x".into(),
            host_path: format!("/dev/{id}"),
            permissions: "rw".into(),
        }],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_devices_are_rejected_and_the_rest_kept() {
    let server = api_server().await;
    let dir = tempfile::tempdir().unwrap();
    let mut bad_prop = dev("bad-prop");
    bad_prop
        .properties
        .insert("not-an-env-name".into(), "x".into());
    let mut bad_path = dev("bad-path");
    bad_path.mounts.push(Mount {
        container_path: "/etc/shadow".into(),
        host_path: "/etc/shadow".into(),
        read_only: true,
    });
    let mut escape = dev("escape");
    escape.device_specs[0].host_path = "/dev/../etc/passwd".into();
    let devices = vec![
        dev("good0"),
        dev(""),
        bad_prop,
        bad_path,
        escape,
        dev("good0"),
        dev("good1"),
    ];
    let mut cfg = test_config("node-a", dir.path(), Mode::Kubernetes(server.client()));
    cfg.embedded_handlers = vec![Arc::new(Fixed(devices))];
    let agent = start_agent(cfg);
    create_configuration(&server, &configuration("fx", "fixed", "")).await;
    let found = eventually("valid instances", WAIT, || async {
        let i = instances_of(&server, "fx").await;
        (i.len() == 2).then_some(i)
    })
    .await;
    let ids: Vec<&str> = found.iter().map(|i| i.spec.device_id.as_str()).collect();
    assert_eq!(ids, ["good0", "good1"]);
    // Nothing else shows up later.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(instances_of(&server, "fx").await.len(), 2);
    let text = agent.metrics_text();
    for (reason, n) in [
        ("empty_id", 1),
        ("duplicate_id", 1),
        ("invalid_property_name", 1),
        ("host_path_not_allowed", 2),
    ] {
        let line = format!(
            "steward_discovery_rejected_devices_total{{configuration=\"default/fx\",reason=\"{reason}\"}} {n}"
        );
        assert!(text.contains(&line), "missing {line:?} in:\n{text}");
    }
    agent.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maxdevices_limits_what_is_exposed() {
    let server = api_server().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = test_config("node-a", dir.path(), Mode::Kubernetes(server.client()));
    cfg.embedded_handlers =
        steward_agent::embedded_handlers(&["debug-echo"], &Default::default()).unwrap();
    let agent = start_agent(cfg);
    let mut c = configuration(
        "many",
        "debug-echo",
        &echo_details(&["d0", "d1", "d2", "d3"], None),
    );
    c.spec.max_devices = 3;
    create_configuration(&server, &c).await;
    eventually("three instances", WAIT, || async {
        (instances_of(&server, "many").await.len() == 3).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(instances_of(&server, "many").await.len(), 3);
    assert!(agent.metrics_text().contains(
        "steward_discovery_rejected_devices_total{configuration=\"default/many\",reason=\"over_limit\"} 1"
    ));
    agent.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_speaking_handler_goes_offline_and_the_agent_lives_on() {
    let server = api_server().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = test_config("node-a", dir.path(), Mode::Kubernetes(server.client()));
    cfg.embedded_handlers =
        steward_agent::embedded_handlers(&["debug-echo"], &Default::default()).unwrap();
    let agent = start_agent(cfg);
    // A "handler" that answers every connection with junk bytes.
    let junk_sock = dir.path().join("junk.sock");
    let listener = tokio::net::UnixListener::bind(&junk_sock).unwrap();
    let junk = tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let _ = conn
                    .write_all(b"\x00\x01garbage that is not HTTP/2 at all\xff\xfe")
                    .await;
                let _ = conn.shutdown().await;
            });
        }
    });
    // A "handler" that accepts and never answers.
    let hang_sock = dir.path().join("hang.sock");
    let hang_listener = tokio::net::UnixListener::bind(&hang_sock).unwrap();
    let hang = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = hang_listener.accept().await {
            held.push(conn);
        }
    });
    eventually("agent socket", WAIT, || async {
        agent.socket.exists().then_some(())
    })
    .await;
    for (name, sock) in [("junk", &junk_sock), ("hang", &hang_sock)] {
        steward_discovery::registration::register(
            &agent.socket,
            name,
            &Endpoint::Uds(sock.display().to_string()),
            false,
        )
        .await
        .unwrap();
        create_configuration(&server, &configuration(name, name, "")).await;
    }
    create_configuration(
        &server,
        &configuration("fine", "debug-echo", &echo_details(&["ok"], None)),
    )
    .await;
    let api: Api<Configuration> = Api::namespaced(server.client(), NS);
    for name in ["junk", "hang"] {
        eventually("hostile handler offline", WAIT, || async {
            let s = api.get(name).await.unwrap().status?;
            s.handlers
                .iter()
                .any(|h| h.state == "Offline")
                .then_some(())
        })
        .await;
    }
    eventually("the other configuration works", WAIT, || async {
        (instances_of(&server, "fine").await.len() == 1).then_some(())
    })
    .await;
    assert!(instances_of(&server, "junk").await.is_empty());
    assert!(instances_of(&server, "hang").await.is_empty());
    assert!(
        agent
            .metrics_text()
            .contains("steward_discovery_handler_connections_lost_total{handler=\"junk\"}")
    );
    junk.abort();
    hang.abort();
    // Still running: stops cleanly.
    agent.stop().await.unwrap();
}
