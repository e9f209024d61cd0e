//! `resourceManager.dra.enabled`: the NRI plugin as the DRA driver
//! `cpu.steward.dev` — its flags, its three host mounts (kubelet's plugin
//! registry, its own plugin directory, the CDI directory), exactly the
//! resource.k8s.io rules its code calls, the admission policy keeping each
//! node to its own slices, and the DeviceClass; nothing of it when off.

use super::*;

/// The resource.k8s.io rules of ClusterRole `role`: (resources, verbs).
fn resource_rules(objects: &[Value], role: &str) -> Vec<(Vec<String>, Vec<String>)> {
    objects
        .iter()
        .find(|o| o["kind"] == "ClusterRole" && o["metadata"]["name"] == role)
        .unwrap_or_else(|| panic!("no ClusterRole {role}"))["rules"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| strings(&r["apiGroups"]) == ["resource.k8s.io"])
        .map(|r| (strings(&r["resources"]), strings(&r["verbs"])))
        .collect()
}

#[test]
fn dra_cpus_reach_the_nri_plugin_its_mounts_rules_policy_and_device_class() {
    kube_tools::each_blocking(dra_cpus_with);
}

fn dra_cpus_with(t: &KubeTools) {
    let objects = render(
        t,
        &[
            "resourceManager.enabled=true",
            "resourceManager.dra.enabled=true",
            "resourceManager.dra.cdiDir=/run/cdi-alt",
            "kubeletDir=/data/kubelet",
        ],
    );
    let spec = daemonset(&objects, "t-steward-nri-plugin");
    let mut args = strings(&spec["containers"][0]["args"]);
    for want in [
        "--dra-cpus",
        "--kubelet-root=/data/kubelet",
        "--cdi-dir=/run/cdi-alt",
        "--cluster",
    ] {
        assert!(args.contains(&want.to_owned()), "{want} not in {args:?}");
    }
    args.push("--node-name=node-a".to_owned());
    accepted(&args, "");
    let mounts = host_mounts(spec);
    for want in [
        [
            "plugins-registry",
            "/data/kubelet/plugins_registry",
            "/data/kubelet/plugins_registry",
            "Directory",
        ],
        [
            "dra-plugin",
            "/data/kubelet/plugins/cpu.steward.dev",
            "/data/kubelet/plugins/cpu.steward.dev",
            "DirectoryOrCreate",
        ],
        ["cdi", "/run/cdi-alt", "/run/cdi-alt", "DirectoryOrCreate"],
    ] {
        assert!(
            mounts.contains(&want.map(String::from)),
            "{want:?} not in {mounts:?}"
        );
    }
    // Only its own plugin directory: never the agent's, nor all of them.
    assert!(
        !mounts
            .iter()
            .any(|m| m[2] == "/data/kubelet/plugins" || m[2].ends_with("/steward.dev")),
        "{mounts:?}"
    );

    // Exactly what its code calls.
    assert_eq!(
        resource_rules(&objects, "t-steward-nri-plugin"),
        [
            (
                s(&["resourceslices"]),
                s(&["list", "create", "update", "delete"])
            ),
            (s(&["resourceclaims"]), s(&["get"])),
        ]
    );
    // Each node writes only its own slices of this driver.
    let policy = objects
        .iter()
        .find(|o| {
            o["kind"] == "ValidatingAdmissionPolicy"
                && o["metadata"]["name"] == "t-steward-nri-plugin-resourceslices"
        })
        .expect("the resource manager's ResourceSlice policy");
    assert_eq!(
        policy["spec"]["matchConditions"][0]["expression"],
        "request.userInfo.username == \"system:serviceaccount:steward-system:t-steward-nri-plugin\""
    );
    let checks: Vec<String> = policy["spec"]["validations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["expression"].as_str().unwrap().to_owned())
        .collect();
    assert!(
        checks
            .iter()
            .any(|c| c.contains("s.spec.driver == 'cpu.steward.dev'")),
        "{checks:?}"
    );
    assert!(
        checks
            .iter()
            .any(|c| c.contains("s.spec.?nodeName.orValue('') == variables.node")),
        "{checks:?}"
    );
    assert!(has(
        &objects,
        "ValidatingAdmissionPolicyBinding",
        "t-steward-nri-plugin-resourceslices"
    ));
    // The class claims ask for.
    let class = objects
        .iter()
        .find(|o| o["kind"] == "DeviceClass" && o["metadata"]["name"] == "cpu.steward.dev")
        .expect("the DeviceClass cpu.steward.dev");
    assert_eq!(class["apiVersion"], "resource.k8s.io/v1");
    assert_eq!(
        class["spec"]["selectors"][0]["cel"]["expression"],
        "device.driver == \"cpu.steward.dev\""
    );

    // Off (the default): nothing of it.
    let off = render(t, &["resourceManager.enabled=true"]);
    let text = serde_saphyr::to_string(&off).unwrap();
    for absent in [
        "--dra-cpus",
        "cpu.steward.dev",
        "resource.k8s.io",
        "plugins_registry",
    ] {
        assert!(!text.contains(absent), "off renders {absent}");
    }

    // It needs the NRI transport and the cluster.
    for other in [
        "resourceManager.transport=cri-proxy",
        "resourceManager.cluster=false",
    ] {
        let err = refused(
            t,
            &[
                "resourceManager.enabled=true",
                "resourceManager.dra.enabled=true",
                other,
            ],
        );
        assert!(
            err.contains("resourceManager.dra.enabled needs resourceManager.transport=nri"),
            "{other}: {err}"
        );
    }
}
