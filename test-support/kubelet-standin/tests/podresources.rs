//! The podresources v1 API over its real socket with a real tonic client.

mod common;

use common::{RESOURCE, plugin, start};
use steward_proto::podresources::v1::{
    AllocatableResourcesRequest, ContainerDevices, GetPodResourcesRequest, ListPodResourcesRequest,
    NumaNode, TopologyInfo, pod_resources_lister_client::PodResourcesListerClient,
};
use steward_testing_kubelet::testing::{TestPluginConfig, device};
use steward_testing_kubelet::{ContainerSpec, Phase, PodSpec, connect_unix};

fn dev(id: &str, numa: Option<i64>) -> ContainerDevices {
    ContainerDevices {
        resource_name: RESOURCE.to_string(),
        device_ids: vec![id.to_string()],
        topology: numa.map(|id| TopologyInfo {
            nodes: vec![NumaNode { id }],
        }),
    }
}

#[tokio::test]
async fn list_get_and_allocatable_over_the_socket() {
    let env = start().await;
    let mut config = TestPluginConfig::new(RESOURCE, "p.sock", &[]);
    config.devices = vec![
        device("a", true, &[0]),
        device("b", true, &[1]),
        device("c", true, &[]),
        device("d", false, &[0]),
        device("e", true, &[0, 1]),
    ];
    let _p = plugin(&env.kubelet, config).await;
    let channel = connect_unix(env.kubelet.pod_resources_socket())
        .await
        .unwrap();
    let mut client = PodResourcesListerClient::new(channel);

    // Allocatable: healthy devices only, one row per device and NUMA node.
    let alloc = client
        .get_allocatable_resources(AllocatableResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        alloc.devices,
        vec![
            dev("a", Some(0)),
            dev("b", Some(1)),
            dev("c", None),
            dev("e", Some(0)),
            dev("e", Some(1))
        ]
    );
    assert!(alloc.cpu_ids.is_empty());
    assert!(alloc.memory.is_empty());

    // Nothing runs yet.
    let list = client
        .list(ListPodResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(list.pod_resources.is_empty());

    let spec = PodSpec::new("team", "worker")
        .init_container(ContainerSpec::new("setup").limit(RESOURCE, 1))
        .container(ContainerSpec::new("main").limit(RESOURCE, 3))
        .container(ContainerSpec::new("logger"));
    let admitted = env.kubelet.add_pod(spec).await.unwrap();
    let main = admitted.devices["main"][RESOURCE].clone();
    assert_eq!(main.len(), 3);

    let list = client
        .list(ListPodResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(list.pod_resources.len(), 1);
    let pr = &list.pod_resources[0];
    assert_eq!(
        (pr.namespace.as_str(), pr.name.as_str()),
        ("team", "worker")
    );
    // App containers only (plain init containers are not reported), in spec order.
    let names: Vec<&str> = pr.containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["main", "logger"]);
    assert!(pr.containers[1].devices.is_empty());
    let listed: std::collections::BTreeSet<String> = pr.containers[0]
        .devices
        .iter()
        .flat_map(|d| d.device_ids.clone())
        .collect();
    assert_eq!(listed, main);
    for row in &pr.containers[0].devices {
        assert_eq!(row.resource_name, RESOURCE);
        let expected = match row.device_ids[0].as_str() {
            "a" => vec![Some(0)],
            "b" => vec![Some(1)],
            "c" => vec![None],
            "e" => vec![Some(0), Some(1)],
            other => panic!("unexpected device {other}"),
        };
        let got = row.topology.as_ref().map(|t| t.nodes[0].id);
        assert!(expected.contains(&got), "{row:?}");
    }

    let got = client
        .get(GetPodResourcesRequest {
            pod_name: "worker".to_string(),
            pod_namespace: "team".to_string(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.pod_resources.as_ref(), Some(pr));

    let missing = client
        .get(GetPodResourcesRequest {
            pod_name: "worker".to_string(),
            pod_namespace: "elsewhere".to_string(),
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound);
    assert_eq!(
        missing.message(),
        "pod worker in namespace elsewhere not found"
    );

    // Terminated pods drop out of List.
    env.kubelet
        .terminate_pod(&admitted.uid, Phase::Succeeded)
        .await
        .unwrap();
    let list = client
        .list(ListPodResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(list.pod_resources.is_empty());
}
