//! The discovery loop against the API server stand-in, with discovery
//! handlers served over real unix sockets.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use kube::Api;
use kube::api::DeleteParams;
use steward_agent::Mode;
use steward_api::{CONDITION_DETAILS_VALID, Configuration};
use steward_discovery::handlers::debug_echo::{DESCRIPTION_PROPERTY, DebugEcho};

const WAIT: Duration = Duration::from_secs(15);

async fn config_status(
    server: &steward_testing_apiserver::ApiServer,
    name: &str,
) -> Option<steward_api::ConfigurationStatus> {
    let api: Api<Configuration> = Api::namespaced(server.client(), NS);
    api.get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|c| c.status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_handler_yields_instances_that_follow_the_device() {
    let server = api_server().await;
    let dir = tempfile::tempdir().unwrap();
    let agent = start_agent(test_config(
        "node-a",
        dir.path(),
        Mode::Kubernetes(server.client()),
    ));
    let dh = ExternalHandler::start(
        Arc::new(DebugEcho::new(false)),
        dir.path().join("echo.sock"),
        agent.socket.clone(),
    );
    let avail = dir.path().join("avail");
    std::fs::write(&avail, "ONLINE").unwrap();
    let cfg = create_configuration(&server, &{
        let mut c = configuration(
            "cams",
            "debug-echo",
            &echo_details(&["foo0", "foo1"], Some(&avail)),
        );
        c.spec.capacity = 3;
        c
    })
    .await;
    let uid = cfg.metadata.uid.clone().unwrap();

    let found = eventually("two instances", WAIT, || async {
        let i = instances_of(&server, "cams").await;
        (i.len() == 2).then_some(i)
    })
    .await;
    for (inst, id) in found.iter().zip(["foo0", "foo1"]) {
        assert_eq!(inst.spec.device_id, id);
        assert_eq!(inst.spec.nodes, vec!["node-a".to_string()]);
        assert!(!inst.spec.shared);
        assert_eq!(inst.spec.capacity, 3);
        assert_eq!(
            inst.spec
                .properties
                .get(DESCRIPTION_PROPERTY)
                .map(String::as_str),
            Some(id)
        );
        let name = inst.metadata.name.clone().unwrap();
        assert_eq!(inst.spec.cdi_name, format!("steward.dev/cams={name}"));
        let owners = inst.metadata.owner_references.clone().unwrap();
        assert_eq!(owners.len(), 1);
        assert_eq!(owners[0].uid, uid);
        assert_eq!(owners[0].kind, "Configuration");
        assert_eq!(owners[0].controller, Some(true));
        assert!(inst.status.is_none(), "discovery must never write slots");
    }

    // Status: handler Active, details valid, two instances.
    eventually("status shows the active handler", WAIT, || async {
        let s = config_status(&server, "cams").await?;
        let ok = s.instances == 2
            && s.handlers.iter().any(|h| {
                h.node == "node-a" && h.state == "Active" && h.endpoint.starts_with("unix://")
            })
            && s.conditions
                .iter()
                .any(|c| c.type_ == CONDITION_DETAILS_VALID && c.status == "True");
        ok.then_some(())
    })
    .await;

    // Steady state: no Instance writes at all.
    tokio::time::sleep(Duration::from_millis(500)).await;
    server.reset_stats();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let stats = server.stats();
    assert_eq!(
        stats.writes_for("instances.steward.dev"),
        0,
        "instance writes in steady state: {stats:?}"
    );
    assert_eq!(stats.total_writes(), 0, "writes in steady state: {stats:?}");

    // The device goes away: its Instances are deleted.
    std::fs::write(&avail, "OFFLINE").unwrap();
    eventually("instances deleted", WAIT, || async {
        instances_of(&server, "cams").await.is_empty().then_some(())
    })
    .await;
    // And come back.
    std::fs::write(&avail, "ONLINE").unwrap();
    eventually("instances back", WAIT, || async {
        (instances_of(&server, "cams").await.len() == 2).then_some(())
    })
    .await;

    // Two creates at the start and two on the way back, no more. Counted
    // before the Configuration goes: its Instances are garbage-collected
    // at once, and an agent that has not seen the deletion yet may write
    // them again (owned by the deleted Configuration, collected again).
    let text = agent.metrics_text();
    assert!(
        text.contains("steward_discovery_instance_writes_total{op=\"create\"} 4"),
        "{text}"
    );

    // Deleting the Configuration removes its Instances.
    let api: Api<Configuration> = Api::namespaced(server.client(), NS);
    api.delete("cams", &DeleteParams::default()).await.unwrap();
    eventually("instances gone with the configuration", WAIT, || async {
        instances_of(&server, "cams").await.is_empty().then_some(())
    })
    .await;

    dh.stop().await;
    agent.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_handler_goes_offline_is_removed_and_comes_back() {
    let server = api_server().await;
    let dir = tempfile::tempdir().unwrap();
    let agent = start_agent(test_config(
        "node-a",
        dir.path(),
        Mode::Kubernetes(server.client()),
    ));
    let sock = dir.path().join("echo.sock");
    let dh = ExternalHandler::start(
        Arc::new(DebugEcho::new(false)),
        sock.clone(),
        agent.socket.clone(),
    );
    create_configuration(
        &server,
        &configuration("cams", "debug-echo", &echo_details(&["foo0"], None)),
    )
    .await;
    eventually("instance", WAIT, || async {
        (instances_of(&server, "cams").await.len() == 1).then_some(())
    })
    .await;

    // Kill the handler: Offline, but the Instance stays during the grace period.
    dh.stop().await;
    eventually("handler offline in status", WAIT, || async {
        let s = config_status(&server, "cams").await?;
        s.handlers
            .iter()
            .any(|h| h.state == "Offline")
            .then_some(())
    })
    .await;
    assert_eq!(
        instances_of(&server, "cams").await.len(),
        1,
        "instance kept during the grace period"
    );
    assert!(
        agent
            .metrics_text()
            .contains("steward_discovery_handlers{state=\"Offline\"} 1")
    );

    // After the grace period the handler is removed and its devices with it.
    eventually("instance removed after grace", WAIT, || async {
        instances_of(&server, "cams").await.is_empty().then_some(())
    })
    .await;
    eventually("handler gone from status", WAIT, || async {
        let s = config_status(&server, "cams").await?;
        s.handlers.is_empty().then_some(())
    })
    .await;

    // The handler comes back and registers again: Active, Instance back.
    let dh = ExternalHandler::start(Arc::new(DebugEcho::new(false)), sock, agent.socket.clone());
    eventually("instance back", WAIT, || async {
        (instances_of(&server, "cams").await.len() == 1).then_some(())
    })
    .await;
    eventually("handler active", WAIT, || async {
        let s = config_status(&server, "cams").await?;
        s.handlers.iter().any(|h| h.state == "Active").then_some(())
    })
    .await;
    dh.stop().await;
    agent.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_details_set_a_condition_and_an_event_while_others_go_on() {
    use k8s_openapi::api::core::v1::Event;
    let server = api_server().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = test_config("node-a", dir.path(), Mode::Kubernetes(server.client()));
    cfg.embedded_handlers =
        steward_agent::embedded_handlers(&["debug-echo"], &Default::default()).unwrap();
    let agent = start_agent(cfg);
    create_configuration(
        &server,
        &configuration("broken", "debug-echo", "descriptions: {not: [a list"),
    )
    .await;
    create_configuration(
        &server,
        &configuration("good", "debug-echo", &echo_details(&["ok0"], None)),
    )
    .await;

    eventually("good configuration's instance", WAIT, || async {
        (instances_of(&server, "good").await.len() == 1).then_some(())
    })
    .await;
    let cond = eventually(
        "DetailsValid=False on the broken configuration",
        WAIT,
        || async {
            let s = config_status(&server, "broken").await?;
            s.conditions
                .into_iter()
                .find(|c| c.type_ == CONDITION_DETAILS_VALID && c.status == "False")
        },
    )
    .await;
    assert_eq!(cond.reason, "InvalidDiscoveryDetails");
    assert!(
        cond.message.contains("debug-echo"),
        "message names the handler: {}",
        cond.message
    );
    let events: Api<Event> = Api::namespaced(server.client(), NS);
    let ev = eventually("InvalidDiscoveryDetails event", WAIT, || async {
        events
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("InvalidDiscoveryDetails"))
    })
    .await;
    assert_eq!(ev.involved_object.name.as_deref(), Some("broken"));
    assert_eq!(ev.involved_object.kind.as_deref(), Some("Configuration"));
    assert_eq!(ev.type_.as_deref(), Some("Warning"));
    assert!(instances_of(&server, "broken").await.is_empty());
    // The good configuration is valid and the agent is still alive.
    let s = config_status(&server, "good").await.unwrap();
    assert!(
        s.conditions
            .iter()
            .any(|c| c.type_ == CONDITION_DETAILS_VALID && c.status == "True")
    );

    // Fixing the details makes it work.
    set_details(&server, "broken", &echo_details(&["fixed0"], None)).await;
    eventually("fixed configuration's instance", WAIT, || async {
        (instances_of(&server, "broken").await.len() == 1).then_some(())
    })
    .await;
    eventually("DetailsValid=True after the fix", WAIT, || async {
        let s = config_status(&server, "broken").await?;
        s.conditions
            .iter()
            .any(|c| c.type_ == CONDITION_DETAILS_VALID && c.status == "True")
            .then_some(())
    })
    .await;
    agent.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_agents_share_one_instance_and_nodes_stay_exact() {
    let server = api_server().await;
    create_node(&server, "node-a").await;
    create_node(&server, "node-b").await;
    let dir = tempfile::tempdir().unwrap();
    let agent_a = start_agent(test_config(
        "node-a",
        dir.path(),
        Mode::Kubernetes(server.client()),
    ));
    let agent_b = start_agent(test_config(
        "node-b",
        dir.path(),
        Mode::Kubernetes(server.client()),
    ));
    let echo_a = DebugEcho::new(true);
    let echo_b = DebugEcho::new(true);
    let dh_a = ExternalHandler::start(
        Arc::new(echo_a.clone()),
        dir.path().join("a.sock"),
        agent_a.socket.clone(),
    );
    let dh_b = ExternalHandler::start(
        Arc::new(echo_b.clone()),
        dir.path().join("b.sock"),
        agent_b.socket.clone(),
    );
    create_configuration(
        &server,
        &configuration("cams", "debug-echo", &echo_details(&["cam0"], None)),
    )
    .await;

    let nodes = |want: &'static [&'static str]| {
        let server = server.clone();
        move || {
            let server = server.clone();
            async move {
                let i = instances_of(&server, "cams").await;
                (i.len() == 1 && i[0].spec.nodes == want).then_some(i)
            }
        }
    };
    let both = eventually(
        "one shared instance on both nodes",
        WAIT,
        nodes(&["node-a", "node-b"]),
    )
    .await;
    assert!(both[0].spec.shared);

    // node-b loses sight of the device: only node-b leaves.
    echo_b.set_available(false);
    eventually("node-b removed", WAIT, nodes(&["node-a"])).await;
    echo_b.set_available(true);
    eventually("node-b back", WAIT, nodes(&["node-a", "node-b"])).await;

    // node-b goes away for good: its agent stops, its Node is deleted, node-a's agent cleans up.
    dh_b.stop().await;
    agent_b.stop().await.unwrap();
    let node_api: Api<k8s_openapi::api::core::v1::Node> = Api::all(server.client());
    node_api
        .delete("node-b", &DeleteParams::default())
        .await
        .unwrap();
    eventually("deleted node removed from nodes", WAIT, nodes(&["node-a"])).await;

    // The last node leaving deletes the shared instance.
    echo_a.set_available(false);
    eventually("instance deleted", WAIT, || async {
        instances_of(&server, "cams").await.is_empty().then_some(())
    })
    .await;
    dh_a.stop().await;
    agent_a.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_agent_keeps_registrations() {
    let server = api_server().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = test_config("node-a", dir.path(), Mode::Kubernetes(server.client()));
    let agent = start_agent(cfg.clone());
    // Serve the handler and register it exactly once: it never re-registers.
    let sock = dir.path().join("echo.sock");
    let dh = ExternalHandler::serve_only(Arc::new(DebugEcho::new(false)), sock.clone());
    eventually("agent socket", WAIT, || async {
        agent.socket.exists().then_some(())
    })
    .await;
    steward_discovery::registration::register(
        &agent.socket,
        "debug-echo",
        &steward_core::discovery::Endpoint::Uds(sock.display().to_string()),
        false,
    )
    .await
    .unwrap();
    create_configuration(
        &server,
        &configuration("cams", "debug-echo", &echo_details(&["foo0"], None)),
    )
    .await;
    eventually("instance", WAIT, || async {
        (instances_of(&server, "cams").await.len() == 1).then_some(())
    })
    .await;
    agent.stop().await.unwrap();

    // Restart with the same state directory; the handler does not register again.
    let agent = start_agent(cfg);
    set_details(&server, "cams", &echo_details(&["foo0", "foo1"], None)).await;
    let found = eventually(
        "restored handler discovers the new device",
        WAIT,
        || async {
            let i = instances_of(&server, "cams").await;
            (i.len() == 2).then_some(i)
        },
    )
    .await;
    assert_eq!(found[1].spec.device_id, "foo1");
    dh.stop().await;
    agent.stop().await.unwrap();
}

/// A handler that reports one device whose id is built from the discovery
/// properties `PREFIX` and `ID`: what it sees is what was resolved.
struct PropertyEcho;

impl steward_discovery::DiscoveryHandler for PropertyEcho {
    fn name(&self) -> &str {
        "property-echo"
    }
    fn shared(&self) -> bool {
        false
    }
    fn discover(
        &self,
        req: steward_discovery::DiscoverRequest,
    ) -> Result<steward_discovery::DeviceStream, steward_discovery::DiscoveryError> {
        let prop = |k: &str| String::from_utf8_lossy(&req.properties[k]).into_owned();
        Ok(one_device(format!("{}-{}", prop("PREFIX"), prop("ID"))))
    }
}

/// One device `id`, then nothing more (the stream stays open).
fn one_device(id: String) -> steward_discovery::DeviceStream {
    use futures::StreamExt;
    let device = steward_core::discovery::Device {
        id,
        properties: Default::default(),
        mounts: Vec::new(),
        device_specs: Vec::new(),
    };
    futures::stream::once(async move { Ok(vec![device]) })
        .chain(futures::stream::pending())
        .boxed()
}

/// Discovery properties follow their Secret and ConfigMap: editing the
/// referenced object restarts discovery with the new value, without
/// touching the Configuration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_properties_follow_their_secret_and_config_map() {
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    use kube::api::{Patch, PatchParams};
    use steward_api::{DiscoveryProperty, DiscoveryPropertySource, KeyRef};

    let server = api_server().await;
    let dir = tempfile::tempdir().unwrap();
    let agent = start_agent(test_config(
        "node-a",
        dir.path(),
        Mode::Kubernetes(server.client()),
    ));
    let dh = ExternalHandler::start(
        Arc::new(PropertyEcho),
        dir.path().join("props.sock"),
        agent.socket.clone(),
    );
    let secrets: Api<Secret> = Api::namespaced(server.client(), NS);
    let maps: Api<ConfigMap> = Api::namespaced(server.client(), NS);
    let mut secret = Secret::default();
    secret.metadata.name = Some("creds".into());
    secret.data = Some([("id".to_string(), ByteString(b"cam-a".to_vec()))].into());
    secrets.create(&Default::default(), &secret).await.unwrap();
    let mut map = ConfigMap::default();
    map.metadata.name = Some("site".into());
    map.data = Some([("prefix".to_string(), "lab".to_string())].into());
    maps.create(&Default::default(), &map).await.unwrap();

    let key_ref = |name: &str, key: &str| KeyRef {
        name: name.into(),
        namespace: None,
        key: key.into(),
        optional: None,
    };
    let mut c = configuration("cams", "property-echo", "");
    c.spec.discovery_handler.discovery_properties = vec![
        DiscoveryProperty {
            name: "ID".into(),
            value: None,
            value_from: Some(DiscoveryPropertySource {
                secret_key_ref: Some(key_ref("creds", "id")),
                config_map_key_ref: None,
            }),
        },
        DiscoveryProperty {
            name: "PREFIX".into(),
            value: None,
            value_from: Some(DiscoveryPropertySource {
                secret_key_ref: None,
                config_map_key_ref: Some(key_ref("site", "prefix")),
            }),
        },
    ];
    let c = create_configuration(&server, &c).await;
    let device_ids = || async {
        instances_of(&server, "cams")
            .await
            .into_iter()
            .map(|i| i.spec.device_id)
            .collect::<Vec<_>>()
    };
    eventually("device from the resolved properties", WAIT, || async {
        (device_ids().await == ["lab-cam-a"]).then_some(())
    })
    .await;

    // The Secret changes: discovery restarts with the new value.
    let patch = serde_json::json!({"data": {"id": "Y2FtLWI="}}); // "cam-b"
    secrets
        .patch("creds", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    eventually("device follows the Secret", WAIT, || async {
        (device_ids().await == ["lab-cam-b"]).then_some(())
    })
    .await;

    // The ConfigMap changes too.
    let patch = serde_json::json!({"data": {"prefix": "yard"}});
    maps.patch("site", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    eventually("device follows the ConfigMap", WAIT, || async {
        (device_ids().await == ["yard-cam-b"]).then_some(())
    })
    .await;

    // Nobody touched the Configuration's spec.
    let now: Configuration = Api::namespaced(server.client(), NS)
        .get("cams")
        .await
        .unwrap();
    assert_eq!(now.spec, c.spec);
    dh.stop().await;
    agent.stop().await.unwrap();
}

/// A handler that counts its Discover calls and reports one device named
/// after the `ID` property (or `none`).
struct CountingEcho(Arc<std::sync::atomic::AtomicUsize>);

impl steward_discovery::DiscoveryHandler for CountingEcho {
    fn name(&self) -> &str {
        "net-echo"
    }
    fn shared(&self) -> bool {
        false
    }
    fn discover(
        &self,
        req: steward_discovery::DiscoverRequest,
    ) -> Result<steward_discovery::DeviceStream, steward_discovery::DiscoveryError> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let id = req
            .properties
            .get("ID")
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .unwrap_or_else(|| "none".into());
        Ok(one_device(id))
    }
}

/// SECURITY.md, "Secrets go only where no one listens": a Configuration
/// whose discovery property is read from a Secret, served by a handler
/// registered at a plaintext network endpoint. The agent sends it nothing
/// (the handler sees no Discover call) and says why in the Configuration's
/// DetailsValid condition and an Event; a Configuration of the same
/// handler with a ConfigMap property is served, so the endpoint works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_is_never_sent_to_a_plaintext_network_handler() {
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::{ConfigMap, Event, Secret};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use steward_api::{DiscoveryProperty, DiscoveryPropertySource, KeyRef};
    use steward_core::discovery::Endpoint;

    let server = api_server().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = test_config("node-a", dir.path(), Mode::Kubernetes(server.client()));
    cfg.network_handler_cidrs = vec!["127.0.0.1/32".parse().unwrap()];
    let agent = start_agent(cfg);
    let calls = Arc::new(AtomicUsize::new(0));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(steward_discovery::server::serve_tcp(
        Arc::new(CountingEcho(calls.clone())),
        listener,
        async move {
            let _ = stopped.await;
        },
    ));
    eventually("the agent's registration socket", WAIT, || async {
        steward_discovery::registration::register(
            &agent.socket,
            "net-echo",
            &Endpoint::Network(url.clone()),
            false,
        )
        .await
        .ok()
    })
    .await;

    let secrets: Api<Secret> = Api::namespaced(server.client(), NS);
    let mut secret = Secret::default();
    secret.metadata.name = Some("creds".into());
    secret.data = Some([("id".to_string(), ByteString(b"cam-secret".to_vec()))].into());
    secrets.create(&Default::default(), &secret).await.unwrap();
    let maps: Api<ConfigMap> = Api::namespaced(server.client(), NS);
    let mut map = ConfigMap::default();
    map.metadata.name = Some("site".into());
    map.data = Some([("id".to_string(), "cam-public".to_string())].into());
    maps.create(&Default::default(), &map).await.unwrap();
    let key_ref = |name: &str| KeyRef {
        name: name.into(),
        namespace: None,
        key: "id".into(),
        optional: None,
    };
    let with_property = |name: &str, source: DiscoveryPropertySource| {
        let mut c = configuration(name, "net-echo", "");
        c.spec.discovery_handler.discovery_properties = vec![DiscoveryProperty {
            name: "ID".into(),
            value: None,
            value_from: Some(source),
        }];
        c
    };
    create_configuration(
        &server,
        &with_property(
            "secret-cams",
            DiscoveryPropertySource {
                secret_key_ref: Some(key_ref("creds")),
                config_map_key_ref: None,
            },
        ),
    )
    .await;

    let cond = eventually("DetailsValid=False on secret-cams", WAIT, || async {
        let s = config_status(&server, "secret-cams").await?;
        s.conditions
            .into_iter()
            .find(|c| c.type_ == CONDITION_DETAILS_VALID && c.status == "False")
    })
    .await;
    assert!(
        cond.message.contains("Secret") && cond.message.contains(&url),
        "the condition says why and names the endpoint: {}",
        cond.message
    );
    let events: Api<Event> = Api::namespaced(server.client(), NS);
    eventually(
        "an InvalidDiscoveryDetails Event on secret-cams",
        WAIT,
        || async {
            events
                .list(&Default::default())
                .await
                .ok()?
                .items
                .into_iter()
                .find(|e| {
                    e.reason.as_deref() == Some("InvalidDiscoveryDetails")
                        && e.involved_object.name.as_deref() == Some("secret-cams")
                })
        },
    )
    .await;

    // The same handler serves a Configuration without a Secret: the
    // endpoint works, and the Secret's Configuration still got nothing.
    create_configuration(
        &server,
        &with_property(
            "public-cams",
            DiscoveryPropertySource {
                secret_key_ref: None,
                config_map_key_ref: Some(key_ref("site")),
            },
        ),
    )
    .await;
    let found = eventually("public-cams' instance", WAIT, || async {
        let list = instances_of(&server, "public-cams").await;
        (list.len() == 1).then_some(list)
    })
    .await;
    assert_eq!(found[0].spec.device_id, "cam-public");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "only public-cams' Discover reached the network handler"
    );
    assert!(instances_of(&server, "secret-cams").await.is_empty());
    let _ = stop.send(());
    let _ = serving.await;
    agent.stop().await.unwrap();
}
