//! Standalone mode: Configurations from a YAML file, Instances in the node's
//! embedded store.

mod common;

use std::time::Duration;

use common::*;
use steward_agent::{Mode, NodeStore};

const WAIT: Duration = Duration::from_secs(15);

fn yaml(descriptions: &[&str]) -> String {
    format!(
        "---\napiVersion: steward.dev/v1alpha1\nkind: Configuration\nmetadata:\n  name: local\nspec:\n  capacity: 2\n  discoveryHandler:\n    name: debug-echo\n    details: |\n{}\n---\napiVersion: steward.dev/v1alpha1\nkind: Configuration\nmetadata:\n  name: other\n  namespace: lab\nspec:\n  discoveryHandler:\n    name: debug-echo\n    details: 'descriptions: [x]'\n",
        echo_details(descriptions, None)
            .lines()
            .map(|l| format!("      {l}"))
            .collect::<Vec<_>>()
            .join("\n")
    )
}

fn gauge(text: &str, config: &str) -> Option<u64> {
    let prefix = format!("steward_discovery_instances{{configuration=\"{config}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_from_a_yaml_file_land_in_the_embedded_store() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("configurations.yaml");
    std::fs::write(&file, yaml(&["a0", "a1"])).unwrap();
    let mut cfg = test_config(
        "node-a",
        dir.path(),
        Mode::Standalone {
            configurations_file: file.clone(),
        },
    );
    cfg.embedded_handlers =
        steward_agent::embedded_handlers(&["debug-echo"], &Default::default()).unwrap();
    let agent = start_agent(cfg.clone());
    eventually("two local instances", WAIT, || async {
        (gauge(&agent.metrics_text(), "default/local") == Some(2)
            && gauge(&agent.metrics_text(), "lab/other") == Some(1))
        .then_some(())
    })
    .await;
    // Reload: one description fewer.
    std::fs::write(&file, yaml(&["a1"])).unwrap();
    eventually("reloaded", WAIT, || async {
        (gauge(&agent.metrics_text(), "default/local") == Some(1)).then_some(())
    })
    .await;
    // A broken file keeps the previous set.
    std::fs::write(&file, "spec: [unclosed").unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(gauge(&agent.metrics_text(), "default/local"), Some(1));
    agent.stop().await.unwrap();

    let store = NodeStore::open(&cfg.state_dir).unwrap();
    let mut stored = store.instances().unwrap();
    stored.sort_by(|a, b| a.spec.device_id.cmp(&b.spec.device_id));
    let summary: Vec<(String, String, Vec<String>, u32)> = stored
        .iter()
        .map(|i| {
            (
                i.metadata.namespace.clone().unwrap(),
                i.spec.device_id.clone(),
                i.spec.nodes.clone(),
                i.spec.capacity,
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            (
                "default".to_string(),
                "a1".to_string(),
                vec!["node-a".to_string()],
                2
            ),
            (
                "lab".to_string(),
                "x".to_string(),
                vec!["node-a".to_string()],
                1
            ),
        ]
    );
    let a1 = &stored[0];
    assert_eq!(a1.spec.configuration_name, "local");
    assert_eq!(
        a1.spec.cdi_name,
        format!("steward.dev/local={}", a1.metadata.name.clone().unwrap())
    );
    drop(store);

    // Removing a Configuration from the file removes its Instances.
    let agent = start_agent(cfg.clone());
    std::fs::write(&file, "").unwrap();
    eventually("instances removed", WAIT, || async {
        (gauge(&agent.metrics_text(), "default/local") == Some(0)
            && gauge(&agent.metrics_text(), "lab/other") == Some(0))
        .then_some(())
    })
    .await;
    agent.stop().await.unwrap();
    assert!(
        NodeStore::open(&cfg.state_dir)
            .unwrap()
            .instances()
            .unwrap()
            .is_empty()
    );
}
