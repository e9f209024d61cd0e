//! The one CPU ledger from both sides: CPUs prepared for a DRA claim and
//! CPUs the policy pins, on a 4-CPU machine.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;

use steward_core::cpu::{CLAIM_POOL, ContainerKey, CpuSet, devices};
use steward_proto::cri::runtime::v1 as cri;

use super::CpuClaim;
use crate::cache::PodRecord;
use crate::error::ResmgrError;
use crate::manager::ResourceManager;
use crate::manager::testing::{manager, manager_in, pod, shared};

fn claim(uid: &str, cpus: &str, pods: &[&str]) -> CpuClaim {
    CpuClaim {
        uid: uid.into(),
        namespace: "default".into(),
        name: format!("claim-{uid}"),
        cpus: CpuSet::parse(cpus).unwrap(),
        pods: pods.iter().map(|p| format!("uid-{p}")).collect(),
    }
}

fn guaranteed_pod(id: &str) -> PodRecord {
    let mut p = pod(id);
    p.cgroup_parent = format!("/kubepods/poduid-{id}");
    p
}

fn one_cpu() -> cri::LinuxContainerResources {
    cri::LinuxContainerResources {
        cpu_shares: 1024,
        cpu_quota: 100_000,
        cpu_period: 100_000,
        memory_limit_in_bytes: 64 << 20,
        ..Default::default()
    }
}

async fn cpus_of(m: &ResourceManager, pod_id: &str, id: &str) -> CpuSet {
    let key = ContainerKey::new(format!("uid-{pod_id}"), format!("name-{id}"));
    m.assignments().await[&key].cpus.clone()
}

/// Creates container `id` of `p`, its environment naming `claims`.
async fn create_on(
    m: &ResourceManager,
    p: PodRecord,
    id: &str,
    claims: &[&str],
    resources: cri::LinuxContainerResources,
) -> Result<cri::LinuxContainerResources, ResmgrError> {
    m.pod_created(p.clone()).await.unwrap();
    let env: Vec<String> = claims
        .iter()
        .map(|uid| {
            let (k, v) = devices::claim_env(uid);
            format!("{k}={v}")
        })
        .collect();
    let named = devices::claims_in_env(env.iter().map(String::as_str));
    let (decided, _) = m
        .container_creating_on_claims(p, id, format!("name-{id}"), resources, named)
        .await?;
    m.container_started(id, None).await;
    Ok(decided)
}

#[tokio::test]
async fn a_prepared_claims_cpus_leave_the_shared_pool_and_go_to_its_container() {
    let f = manager().await;
    let m = &f.manager;
    create_on(m, pod("p1"), "c1", &[], shared()).await.unwrap();
    assert_eq!(cpus_of(m, "p1", "c1").await, CpuSet::parse("0-3").unwrap());

    m.prepare_cpu_claim(claim("u1", "2-3", &["p2"]))
        .await
        .unwrap();
    assert_eq!(
        cpus_of(m, "p1", "c1").await,
        CpuSet::parse("0-1").unwrap(),
        "the shared container moved off the claim's CPUs"
    );
    let decided = create_on(m, pod("p2"), "c2", &["u1"], shared())
        .await
        .unwrap();
    assert_eq!(decided.cpuset_cpus, "2-3");
    let key = ContainerKey::new("uid-p2", "name-c2");
    let a = m.assignments().await[&key].clone();
    assert!(a.exclusive && a.pool == CLAIM_POOL, "{a:?}");
    // the claim's CPUs stay published (allocated); nothing else is taken
    assert_eq!(m.cpu_devices().await.cpus, CpuSet::parse("0-3").unwrap());

    m.unprepare_cpu_claim("u1").await.unwrap();
    assert_eq!(cpus_of(m, "p1", "c1").await, CpuSet::parse("0-3").unwrap());
    assert!(m.cpu_claims().await.is_empty());
}

#[tokio::test]
async fn a_pod_naming_a_claim_not_reserved_for_it_is_refused() {
    let f = manager().await;
    let m = &f.manager;
    m.prepare_cpu_claim(claim("u1", "3", &["p2"]))
        .await
        .unwrap();
    let e = create_on(m, pod("p3"), "c3", &["u1"], shared())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("not reserved for its pod"), "{e}");
    let e = create_on(m, pod("p3"), "c4", &["nobody"], shared())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("not prepared on this node"), "{e}");
    assert!(m.assignments().await.values().all(|a| a.pool != CLAIM_POOL));
}

#[tokio::test]
async fn cpus_pinned_by_the_policy_are_neither_published_nor_prepared() {
    let f = manager().await;
    let m = &f.manager;
    create_on(m, guaranteed_pod("g"), "cg", &[], one_cpu())
        .await
        .unwrap();
    let pinned = cpus_of(m, "g", "cg").await;
    assert_eq!(pinned.len(), 1);
    let published = m.cpu_devices().await.cpus;
    assert!(published.is_disjoint(&pinned), "{published} vs {pinned}");

    let e = m
        .prepare_cpu_claim(claim("u1", &pinned.to_string(), &["p2"]))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("pinned exclusively"), "{e}");
    assert!(m.cpu_claims().await.is_empty(), "a refused claim was kept");

    // and the other way: a claim's CPUs are not given to a Guaranteed pod
    let free = published.first().unwrap();
    m.prepare_cpu_claim(claim("u2", &free.to_string(), &["p2"]))
        .await
        .unwrap();
    create_on(m, guaranteed_pod("h"), "ch", &[], one_cpu())
        .await
        .unwrap();
    assert!(!cpus_of(m, "h", "ch").await.contains(free));
}

#[tokio::test]
async fn preparing_again_is_idempotent_and_other_cpus_are_refused() {
    let f = manager().await;
    let m = &f.manager;
    m.prepare_cpu_claim(claim("u1", "3", &["p2"]))
        .await
        .unwrap();
    m.prepare_cpu_claim(claim("u1", "3", &["p2"]))
        .await
        .unwrap();
    let e = m
        .prepare_cpu_claim(claim("u1", "2", &["p2"]))
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("is prepared here with CPUs 3"),
        "{e}"
    );
    let e = m
        .prepare_cpu_claim(claim("u2", "3", &["p4"]))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("another claim"), "{e}");
    let pods: BTreeSet<String> = m.cpu_claims().await["u1"].pods.clone();
    assert_eq!(pods, BTreeSet::from(["uid-p2".to_owned()]));
}

#[tokio::test]
async fn a_restart_keeps_the_claims_and_their_containers() {
    let f = manager().await;
    create_on(&f.manager, pod("p1"), "c1", &[], shared())
        .await
        .unwrap();
    f.manager
        .prepare_cpu_claim(claim("u1", "2-3", &["p2"]))
        .await
        .unwrap();
    create_on(&f.manager, pod("p2"), "c2", &["u1"], shared())
        .await
        .unwrap();
    let dir = f._dir;
    drop(f.manager);

    let g = manager_in(dir).await;
    let m = &g.manager;
    assert_eq!(
        m.cpu_claims().await["u1"].cpus,
        CpuSet::parse("2-3").unwrap()
    );
    assert_eq!(cpus_of(m, "p2", "c2").await, CpuSet::parse("2-3").unwrap());
    assert_eq!(cpus_of(m, "p1", "c1").await, CpuSet::parse("0-1").unwrap());
}

/// A pod as Synchronize lists it: its id and its containers, each with the
/// claims its environment names.
type Listed<'a> = (&'a str, &'a [(&'a str, &'a [&'a str])]);

/// What Synchronize reports for `pods` (id, each with its running
/// containers and the claims each one's environment names), through the
/// NRI conversion CreateContainer's reading shares
/// (`nri::convert::named_claims`); each container runs on the CPUs
/// `running` updated it to, else with no cpuset (created unadjusted).
fn synchronize_listing(
    pods: &[Listed<'_>],
    running: &crate::manager::Updates,
) -> crate::manager::RuntimeListing {
    use steward_nri::proto::nri;
    let mut nri_pods = Vec::new();
    let mut nri_containers = Vec::new();
    for (p, containers) in pods {
        nri_pods.push(nri::PodSandbox {
            id: (*p).into(),
            uid: format!("uid-{p}"),
            name: format!("name-{p}"),
            namespace: "default".into(),
            ..Default::default()
        });
        for (c, claims) in *containers {
            let mut env = vec!["PATH=/bin".to_owned()];
            env.extend(claims.iter().map(|uid| {
                let (k, v) = devices::claim_env(uid);
                format!("{k}={v}")
            }));
            nri_containers.push(nri::Container {
                id: (*c).into(),
                pod_sandbox_id: (*p).into(),
                name: format!("name-{c}"),
                state: nri::ContainerState::ContainerRunning as i32,
                env,
                linux: Some(nri::LinuxContainer {
                    resources: Some(nri::LinuxResources {
                        cpu: Some(nri::LinuxCpu {
                            shares: Some(nri::OptionalUInt64 { value: 256 }),
                            cpus: running
                                .iter()
                                .find(|(id, _)| id == c)
                                .map(|(_, r)| r.cpuset_cpus.clone())
                                .unwrap_or_default(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            });
        }
    }
    crate::nri::convert::listing(&nri_pods, &nri_containers)
}

/// Containers created while the NRI plugin was away (the runtime creates
/// them unadjusted) are adopted at the next Synchronize: the one whose
/// environment names a claim reserved for its pod runs on the claim's
/// CPUs; one naming a claim not reserved for its pod, or not prepared
/// here, is placed without it (it runs already: it cannot be refused), off
/// the claim's CPUs. The shared pool keeps off them, and a restart keeps
/// the adopted container on its claim.
#[tokio::test]
async fn a_claims_container_created_while_away_is_adopted_onto_the_claim() {
    let f = manager().await;
    let m = &f.manager;
    create_on(m, pod("p1"), "c1", &[], shared()).await.unwrap();
    m.prepare_cpu_claim(claim("u1", "2-3", &["p2"]))
        .await
        .unwrap();
    assert_eq!(cpus_of(m, "p1", "c1").await, CpuSet::parse("0-1").unwrap());

    let pods: &[Listed<'_>] = &[
        ("p1", &[("c1", &[])]),
        ("p2", &[("c2", &["u1"])]),
        ("p3", &[("c3", &["u1"])]),
        ("p4", &[("c4", &["nobody"])]),
        ("p5", &[("c5", &[])]),
    ];
    let s = m
        .synchronize(synchronize_listing(pods, &Vec::new()))
        .await
        .unwrap();
    assert_eq!(s.report.containers_adopted, ["c2", "c3", "c4", "c5"]);

    let claim_cpus = CpuSet::parse("2-3").unwrap();
    let a = m.assignments().await[&ContainerKey::new("uid-p2", "name-c2")].clone();
    assert_eq!(a.cpus, claim_cpus, "{a:?}");
    assert!(a.exclusive && a.pool == CLAIM_POOL, "{a:?}");
    let update = |id: &str| {
        s.updates
            .iter()
            .find(|(c, _)| c == id)
            .map(|(_, r)| CpuSet::parse(&r.cpuset_cpus).unwrap())
    };
    assert_eq!(
        update("c2"),
        Some(claim_cpus.clone()),
        "Synchronize's answer moves it: {:?}",
        s.updates
    );
    for (p, c) in [("p1", "c1"), ("p3", "c3"), ("p4", "c4"), ("p5", "c5")] {
        let cpus = cpus_of(m, p, c).await;
        assert!(cpus.is_disjoint(&claim_cpus), "{c} on {cpus}");
        assert!(!cpus.is_empty(), "{c}");
    }
    for c in ["c3", "c4", "c5"] {
        let u = update(c).unwrap_or_else(|| panic!("{c} updated: {:?}", s.updates));
        assert!(u.is_disjoint(&claim_cpus), "{c} moved to {u}");
    }
    let snap = m.snapshot().await;
    assert_eq!(snap.containers["c2"].request.cpu_claims, ["u1"]);
    for c in ["c3", "c4"] {
        assert!(snap.containers[c].request.cpu_claims.is_empty(), "{c}");
    }
    assert_eq!(m.metrics().drift_count("cpu-claim-refused"), 2);

    // Once the runtime applied the answer, a Synchronize again changes
    // nothing; a restart keeps the container on its claim.
    let again = m
        .synchronize(synchronize_listing(pods, &s.updates))
        .await
        .unwrap();
    assert!(again.report.is_clean(), "{again:?}");
    assert!(again.updates.is_empty(), "{again:?}");
    let dir = f._dir;
    drop(f.manager);
    let g = manager_in(dir).await;
    assert_eq!(cpus_of(&g.manager, "p2", "c2").await, claim_cpus);
}
