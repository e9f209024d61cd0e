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
