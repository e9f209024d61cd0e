//! SECURITY.md, "a node": the token of one node's agent (or resource
//! manager) writes nothing of another node, whatever the kind, on the real
//! kube-apiserver. The agents share one ServiceAccount, so RBAC alone cannot
//! tell them apart: the chart's ValidatingAdmissionPolicies key each write on
//! the node name the API server puts in a pod-bound token's user info.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Secret};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, Resource};
use serde_json::json;
use steward_api::{Configuration, Instance, SlotClaim};
use steward_real_cluster::{Cluster, busybox_pod, debug_echo_configuration, eventually};

/// A Running pod of `component` in the release namespace (on `node` when
/// given), and its ServiceAccount.
fn pod_on(cluster: &Cluster, component: &str, node: Option<&str>) -> (String, String) {
    let fields = match node {
        Some(n) => format!("spec.nodeName={n},status.phase=Running"),
        None => "status.phase=Running".to_owned(),
    };
    let out = cluster.kubectl(&[
        "get",
        "pods",
        "-n",
        &cluster.release_namespace,
        "-l",
        &format!("app.kubernetes.io/component={component}"),
        "--field-selector",
        &fields,
        "-o",
        "jsonpath={.items[0].metadata.name} {.items[0].spec.serviceAccountName}",
    ]);
    let mut it = out.split_whitespace();
    match (it.next(), it.next()) {
        (Some(p), Some(sa)) => (p.to_owned(), sa.to_owned()),
        _ => panic!("no Running {component} pod (node {node:?}): {out:?}"),
    }
}

/// A client with a token of `sa`, bound to `pod` when given (the token a
/// pod's kubelet hands it: the API server adds the pod's node to the user
/// info), or bound to nothing.
async fn client_as(cluster: &Cluster, sa: &str, pod: Option<&str>) -> Client {
    let mut args = vec![
        "create",
        "token",
        sa,
        "-n",
        &cluster.release_namespace,
        "--duration",
        "600s",
    ];
    if let Some(p) = pod {
        args.extend(["--bound-object-kind", "Pod", "--bound-object-name", p]);
    }
    let token = cluster.kubectl(&args).trim().to_owned();
    let mut config = kube::Config::infer().await.unwrap();
    config.auth_info = kube::config::AuthInfo {
        token: Some(token.into()),
        ..Default::default()
    };
    Client::try_from(config).unwrap()
}

/// Tally of attacks: each must be refused by the API server.
#[derive(Default)]
struct Attacks {
    tried: Vec<String>,
    allowed: Vec<String>,
}

impl Attacks {
    /// Performs `attack` (read-modify-write: it reads what it changes), and
    /// again when another writer got there first (409); records `what`,
    /// allowed when it succeeds. A refusal must be the API server's (403/422
    /// from the policy or RBAC), not a transport error.
    async fn check<T, F, Fut>(&mut self, what: &str, mut attack: F)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, kube::Error>>,
    {
        self.tried.push(what.to_owned());
        let mut result = attack().await;
        for _ in 0..5 {
            match &result {
                Err(kube::Error::Api(s)) if s.code == 409 => result = attack().await,
                _ => break,
            }
        }
        match result {
            Ok(_) => self.allowed.push(what.to_owned()),
            Err(kube::Error::Api(s)) if s.code == 403 || s.code == 422 => {
                // Refused by a rule that says why, not by a rule that failed
                // to evaluate (which would refuse the node's own writes too).
                assert!(
                    !s.message.contains("resulted in error"),
                    "{what}: refused by a policy expression that failed: {}",
                    s.message
                );
                eprintln!("refused as it should be: {what}: {}", s.message);
            }
            Err(e) => panic!("{what}: not a refusal by the API server: {e}"),
        }
    }

    fn verdict(self) {
        eprintln!(
            "{} attacks, {} allowed",
            self.tried.len(),
            self.allowed.len()
        );
        assert!(
            self.allowed.is_empty(),
            "allowed: {:?} (of {:?})",
            self.allowed,
            self.tried
        );
    }
}

/// Proves: with node A's agent token (a pod-bound ServiceAccount token, as
/// kubelet gives the agent's pod), every write of node B's objects is
/// refused by the real API server — an Instance of node B updated with a
/// `hostPath: /` mount (also after listing node A in it), deleted, created in
/// B's name, its status entry of B rewritten; a SlotClaim of B created,
/// moved or deleted; a ResourceSlice of B created, updated or deleted, and a
/// slice of another driver; B's handler entry in a Configuration's status;
/// with node A's resource manager token, node B's `cpu.steward.dev`
/// ResourceSlice emptied, deleted or forged, a slice of the agent's driver,
/// and Node B's labels and status; and
/// a Secret outside the namespaces the agent may read. A token bound to no
/// pod writes nothing. The same tokens still write their own node's
/// objects (so the policies refuse what they must, not everything).
#[tokio::test(flavor = "multi_thread")]
async fn one_nodes_token_writes_nothing_of_another_node() {
    let cluster = Cluster::connect().await;
    assert!(cluster.nodes.len() >= 2, "needs two nodes");
    let (a, b) = (cluster.nodes[0].clone(), cluster.nodes[1].clone());
    let ns = cluster.namespace("sec-nodes").await;
    cluster
        .create_configuration(&ns.name, &debug_echo_configuration("cams", &["cam-0"], 2))
        .await;
    let inst_a = cluster.instance_on(&ns.name, "cams", &a).await;
    let inst_b = cluster.instance_on(&ns.name, "cams", &b).await;
    let name_b = inst_b.metadata.name.clone().unwrap();
    let name_a = inst_a.metadata.name.clone().unwrap();

    // Node B holds a slot: its SlotClaim exists.
    let holder = busybox_pod(
        "holder",
        "sleep 3600",
        json!({ format!("steward.dev/{name_b}"): "1" }),
    );
    cluster.create_pod(&ns.name, holder).await;
    cluster
        .running(&ns.name, "holder", Duration::from_secs(120))
        .await;
    let admin_claims: Api<SlotClaim> = Api::namespaced(cluster.client.clone(), &ns.name);
    let claim_b = eventually(
        "node B's SlotClaim of the holder",
        Duration::from_secs(60),
        || async {
            admin_claims
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .into_iter()
                .find(|c| c.spec.node == b && c.spec.instance == name_b)
        },
    )
    .await;
    // Node B's own entry in its Instance's status (written by B's agent
    // after the Instance, so read again until it is there).
    let inst_b = eventually(
        "node B's entry in its Instance's status",
        Duration::from_secs(60),
        || async {
            let i = Api::<Instance>::namespaced(cluster.client.clone(), &ns.name)
                .get(&name_b)
                .await
                .ok()?;
            i.status
                .as_ref()?
                .nodes
                .iter()
                .any(|e| e.node == b)
                .then_some(i)
        },
    )
    .await;
    // Both nodes' handler entries in the Configuration's status.
    let admin_confs: Api<Configuration> = Api::namespaced(cluster.client.clone(), &ns.name);
    eventually(
        "both nodes' handler entries in the Configuration's status",
        Duration::from_secs(60),
        || async {
            let c = admin_confs.get("cams").await.ok()?;
            let s = c.status?;
            (s.handlers.iter().any(|h| h.node == a) && s.handlers.iter().any(|h| h.node == b))
                .then_some(())
        },
    )
    .await;

    let (agent_pod, agent_sa) = pod_on(&cluster, "agent", Some(&a));
    let agent_a = client_as(&cluster, &agent_sa, Some(&agent_pod)).await;
    let insts: Api<Instance> = Api::namespaced(agent_a.clone(), &ns.name);
    let claims: Api<SlotClaim> = Api::namespaced(agent_a.clone(), &ns.name);
    let confs: Api<Configuration> = Api::namespaced(agent_a.clone(), &ns.name);
    let slices: Api<ResourceSlice> = Api::all(agent_a.clone());
    let pp = PostParams::default();
    let mut attacks = Attacks::default();

    // The agent's token still writes its own node's Instance.
    let mut own = insts.get(&name_a).await.unwrap();
    own.metadata
        .annotations
        .get_or_insert_default()
        .insert("steward.dev/test".into(), "own node".into());
    insts
        .replace(&name_a, &pp, &own)
        .await
        .unwrap_or_else(|e| panic!("node A's agent updating node A's Instance: {e}"));

    // Instances of node B: each attack reads the object it changes.
    let root_mount = steward_api::InstanceMount {
        container_path: "/host".into(),
        host_path: "/".into(),
        read_only: false,
    };
    let forge = |change: fn(&mut Instance, &str, &steward_api::InstanceMount)| {
        let (insts, name_b, a, mount) =
            (insts.clone(), name_b.clone(), a.clone(), root_mount.clone());
        move || {
            let (insts, name_b, a, mount) =
                (insts.clone(), name_b.clone(), a.clone(), mount.clone());
            async move {
                let mut i = insts.get(&name_b).await?;
                change(&mut i, &a, &mount);
                insts.replace(&name_b, &PostParams::default(), &i).await
            }
        }
    };
    attacks
        .check(
            "update node B's Instance with a hostPath / mount",
            forge(|i, _, m| i.spec.mounts.push(m.clone())),
        )
        .await;
    attacks
        .check(
            "list node A in node B's Instance and add a hostPath / mount",
            forge(|i, a, m| {
                i.spec.nodes.push(a.to_owned());
                i.spec.nodes.sort();
                i.spec.mounts.push(m.clone());
            }),
        )
        .await;
    attacks
        .check(
            "replace node B by node A in node B's Instance",
            forge(|i, a, _| i.spec.nodes = vec![a.to_owned()]),
        )
        .await;
    attacks
        .check("delete node B's Instance", || async {
            insts.delete(&name_b, &DeleteParams::default()).await
        })
        .await;
    let mut fake = inst_b.clone();
    fake.metadata = kube::api::ObjectMeta {
        name: Some("forged-on-b".into()),
        owner_references: inst_b.metadata.owner_references.clone(),
        ..Default::default()
    };
    fake.status = None;
    attacks
        .check("create an Instance naming node B", || {
            insts.create(&pp, &fake)
        })
        .await;
    let had_entry = inst_b
        .status
        .as_ref()
        .is_some_and(|s| s.nodes.iter().any(|e| e.node == b));
    assert!(
        had_entry,
        "node B's Instance has B's status entry: {inst_b:?}"
    );
    attacks
        .check(
            "remove node B's entry from its Instance's status",
            || async {
                let mut i = insts.get(&name_b).await?;
                if let Some(s) = i.status.as_mut() {
                    s.nodes.retain(|e| e.node != b);
                }
                insts.replace_status(&name_b, &pp, &i).await
            },
        )
        .await;

    // SlotClaims of node B.
    let claim_name = claim_b.metadata.name.clone().unwrap();
    attacks
        .check("delete node B's SlotClaim", || async {
            claims.delete(&claim_name, &DeleteParams::default()).await
        })
        .await;
    attacks
        .check("move node B's SlotClaim to node A", || async {
            let mut c = claims.get(&claim_name).await?;
            c.spec.node = a.clone();
            claims.replace(&claim_name, &pp, &c).await
        })
        .await;
    let mut new_claim = claim_b.clone();
    new_claim.metadata = kube::api::ObjectMeta {
        name: Some("forged-claim-b".into()),
        ..Default::default()
    };
    attacks
        .check("create a SlotClaim of node B", || {
            claims.create(&pp, &new_claim)
        })
        .await;

    // ResourceSlices of node B (and of another driver).
    let admin_slices: Api<ResourceSlice> = Api::all(cluster.client.clone());
    let slice_b = eventually(
        "a ResourceSlice of node B",
        Duration::from_secs(60),
        || async {
            admin_slices
                .list(&ListParams::default().fields(&format!("spec.nodeName={b}")))
                .await
                .ok()?
                .items
                .into_iter()
                .find(|s| s.spec.driver == "steward.dev")
        },
    )
    .await;
    let slice_name = slice_b.metadata.name.clone().unwrap();
    attacks
        .check("empty node B's ResourceSlice", || async {
            let mut s = slices.get(&slice_name).await?;
            s.spec.devices = Some(Vec::new());
            slices.replace(&slice_name, &pp, &s).await
        })
        .await;
    attacks
        .check("delete node B's ResourceSlice", || async {
            slices.delete(&slice_name, &DeleteParams::default()).await
        })
        .await;
    let mut fake = slice_b.clone();
    fake.metadata = kube::api::ObjectMeta {
        name: Some(format!("forged-{b}")),
        ..Default::default()
    };
    fake.spec.pool.name = format!("forged-{b}");
    attacks
        .check("create a ResourceSlice of node B", || {
            slices.create(&pp, &fake)
        })
        .await;
    let mut other = fake.clone();
    other.metadata.name = Some(format!("forged-driver-{a}"));
    other.spec.node_name = Some(a.clone());
    other.spec.driver = "gpu.example.com".into();
    other.spec.pool.name = format!("forged-{a}");
    attacks
        .check("create a ResourceSlice of another driver on node A", || {
            slices.create(&pp, &other)
        })
        .await;

    // Node B's handler entry in the Configuration's status.
    attacks
        .check(
            "mark node B's handler Offline in the Configuration's status",
            || async {
                let mut c = confs.get("cams").await?;
                if let Some(s) = c.status.as_mut() {
                    for h in s.handlers.iter_mut().filter(|h| h.node == b) {
                        h.state = "Offline".into();
                    }
                }
                confs.replace_status("cams", &pp, &c).await
            },
        )
        .await;

    // Secrets outside the namespaces the agent may read.
    let admin_secrets: Api<Secret> = Api::namespaced(cluster.client.clone(), &ns.name);
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "creds"},
        "stringData": {"password": "hunter2"},
    }))
    .unwrap();
    admin_secrets.create(&pp, &secret).await.unwrap();
    let agent_secrets: Api<Secret> = Api::namespaced(agent_a.clone(), &ns.name);
    attacks
        .check("read a Secret of a user's namespace", || {
            agent_secrets.get("creds")
        })
        .await;
    let system_secrets: Api<Secret> = Api::namespaced(agent_a.clone(), "kube-system");
    attacks
        .check("list the Secrets of kube-system", || async {
            system_secrets.list(&ListParams::default()).await
        })
        .await;

    // A token of the agent's ServiceAccount bound to no pod: no node, no write.
    let unbound = client_as(&cluster, &agent_sa, None).await;
    let unbound_insts: Api<Instance> = Api::namespaced(unbound, &ns.name);
    attacks
        .check(
            "update node A's Instance with a token bound to no pod",
            || async {
                let i = unbound_insts.get(&name_a).await?;
                unbound_insts.replace(&name_a, &pp, &i).await
            },
        )
        .await;

    // The resource manager of node A: Node B's labels and status.
    let (rm_pod, rm_sa) = pod_on(&cluster, "nri-plugin", Some(&a));
    let rm_a = client_as(&cluster, &rm_sa, Some(&rm_pod)).await;

    // The resource manager's ResourceSlices (driver cpu.steward.dev, with
    // resourceManager.dra.enabled): node B's CPUs are not node A's to
    // change, and node A's resource manager publishes no other driver.
    let rm_slices: Api<ResourceSlice> = Api::all(rm_a.clone());
    let cpu_slice_b = eventually(
        "a cpu.steward.dev ResourceSlice of node B",
        Duration::from_secs(60),
        || async {
            admin_slices
                .list(&ListParams::default().fields(&format!("spec.nodeName={b}")))
                .await
                .ok()?
                .items
                .into_iter()
                .find(|s| s.spec.driver == "cpu.steward.dev")
        },
    )
    .await;
    let cpu_slice_name = cpu_slice_b.metadata.name.clone().unwrap();
    attacks
        .check(
            "take node B's CPUs out of its cpu.steward.dev ResourceSlice",
            || async {
                // Read with the admin's token: the resource manager may
                // not even get another node's slice; the update is its own.
                let mut s = admin_slices.get(&cpu_slice_name).await?;
                s.spec.devices = Some(Vec::new());
                rm_slices.replace(&cpu_slice_name, &pp, &s).await
            },
        )
        .await;
    attacks
        .check("delete node B's cpu.steward.dev ResourceSlice", || async {
            rm_slices
                .delete(&cpu_slice_name, &DeleteParams::default())
                .await
        })
        .await;
    let mut forged_cpus = cpu_slice_b.clone();
    forged_cpus.metadata = kube::api::ObjectMeta {
        name: Some(format!("forged-cpus-{b}")),
        ..Default::default()
    };
    forged_cpus.spec.pool.name = format!("forged-cpus-{b}");
    attacks
        .check("create a cpu.steward.dev ResourceSlice of node B", || {
            rm_slices.create(&pp, &forged_cpus)
        })
        .await;
    let mut forged_devices = forged_cpus.clone();
    forged_devices.metadata.name = Some(format!("forged-devices-{a}"));
    forged_devices.spec.node_name = Some(a.clone());
    forged_devices.spec.driver = "steward.dev".into();
    forged_devices.spec.pool.name = format!("forged-devices-{a}");
    attacks
        .check(
            "create a steward.dev (the agent's driver) ResourceSlice on node A as its resource manager",
            || rm_slices.create(&pp, &forged_devices),
        )
        .await;

    let nodes: Api<Node> = Api::all(rm_a);
    let label = |v: &str| json!({"metadata": {"labels": {"steward.dev/test-isolation": v}}});
    nodes
        .patch(&a, &PatchParams::default(), &Patch::Merge(label("own")))
        .await
        .unwrap_or_else(|e| panic!("node A's resource manager labelling Node A: {e}"));
    let forged_label = label("forged");
    attacks
        .check("label Node B", || async {
            nodes
                .patch(&b, &PatchParams::default(), &Patch::Merge(&forged_label))
                .await
        })
        .await;
    let capacity = json!({"status": {"capacity": {"steward.dev/forged": "8"}}});
    attacks
        .check("patch Node B's status capacity", || async {
            nodes
                .patch_status(&b, &PatchParams::default(), &Patch::Merge(&capacity))
                .await
        })
        .await;
    let undo = json!({"metadata": {"labels": {"steward.dev/test-isolation": null}}});
    Api::<Node>::all(cluster.client.clone())
        .patch(&a, &PatchParams::default(), &Patch::Merge(undo))
        .await
        .unwrap();

    // Nothing of node B changed.
    let now_b = Api::<Instance>::namespaced(cluster.client.clone(), &ns.name)
        .get(&name_b)
        .await
        .unwrap();
    assert_eq!(now_b.spec, inst_b.spec, "node B's Instance spec changed");
    let now_cpus = admin_slices.get(&cpu_slice_name).await.unwrap();
    assert_eq!(
        now_cpus.spec.devices, cpu_slice_b.spec.devices,
        "node B's CPUs changed in its ResourceSlice"
    );
    let now_claim = admin_claims.get(&claim_name).await.unwrap();
    assert_eq!(now_claim.spec.node, b, "node B's SlotClaim moved");
    let node_b = Api::<Node>::all(cluster.client.clone())
        .get(&b)
        .await
        .unwrap();
    assert!(
        !node_b
            .meta()
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key("steward.dev/test-isolation")),
        "Node B was labelled"
    );
    attacks.verdict();
}

/// Proves: a Reservation's decision is written by the controller's identity
/// only, in every version. With the extender's token (which may create and
/// update Reservations), a v1alpha2 Reservation created already `Reserved`
/// and a status added to an undecided one through v1alpha2 (which has no
/// status subresource) are both refused by the real API server, while the
/// extender's own write (a Reservation without a status) passes.
#[tokio::test(flavor = "multi_thread")]
async fn only_the_controller_decides_a_reservation() {
    let cluster = Cluster::connect().await;
    let ns = cluster.namespace("sec-decide").await;
    let a = cluster.nodes[0].clone();
    let (pod, sa) = pod_on(&cluster, "extender", None);
    let extender = client_as(&cluster, &sa, Some(&pod)).await;
    let gvk = kube::api::GroupVersionKind::gvk("steward.dev", "v1alpha2", "Reservation");
    let ar = kube::api::ApiResource::from_gvk_with_plural(&gvk, "reservations");
    let reservations: Api<kube::api::DynamicObject> = Api::namespaced_with(extender, &ns.name, &ar);
    let pp = PostParams::default();
    let spec = |name: &str| {
        json!({
            "pod": {"namespace": ns.name, "name": name, "uid": format!("uid-{name}")},
            "candidates": [a],
            "slots": {},
            "exclusiveCpus": 1,
        })
    };
    let object = |name: &str, status: Option<serde_json::Value>| {
        let mut v = json!({
            "apiVersion": "steward.dev/v1alpha2",
            "kind": "Reservation",
            "metadata": {"name": name},
            "spec": spec(name),
        });
        if let Some(s) = status {
            v["status"] = s;
        }
        serde_json::from_value::<kube::api::DynamicObject>(v).unwrap()
    };
    let reserved = json!({"phase": "Reserved", "node": a});
    let mut attacks = Attacks::default();

    attacks
        .check("create a Reservation already Reserved", || {
            let o = object("forged-decided", Some(reserved.clone()));
            let reservations = reservations.clone();
            let pp = pp.clone();
            async move { reservations.create(&pp, &o).await }
        })
        .await;
    // The extender's own write: a Reservation without a decision.
    reservations
        .create(&pp, &object("asked", None))
        .await
        .unwrap_or_else(|e| panic!("the extender creating an undecided Reservation: {e}"));
    attacks
        .check("decide a Reservation through v1alpha2", || async {
            let mut r = reservations.get("asked").await?;
            r.data["status"] = reserved.clone();
            reservations.replace("asked", &pp, &r).await
        })
        .await;
    attacks.verdict();
}
