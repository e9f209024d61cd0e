//! NRI's view of pods, containers and resources as the resource manager's
//! (the CRI shapes its policies read), and its updates back as NRI's.

use steward_nri::proto::nri;
use steward_proto::cri::runtime::v1 as cri;

use crate::cache::{PodRecord, PodState, ResourcesRecord};
use crate::cgroups::normalize_cgroups_path;
use crate::error::ResmgrError;
use crate::manager::GivenStatus;
use crate::manager::RuntimeListing;

/// A pod as the cache records it.
pub fn pod_record(p: &nri::PodSandbox) -> PodRecord {
    PodRecord {
        id: p.id.clone(),
        uid: p.uid.clone(),
        name: p.name.clone(),
        namespace: p.namespace.clone(),
        cgroup_parent: p
            .linux
            .as_ref()
            .map(|l| l.cgroup_parent.clone())
            .unwrap_or_default(),
        annotations: p
            .annotations
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        labels: p
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        state: PodState::Ready,
    }
}

/// The DRA CPU claims (UIDs) a container names: the variables the claims'
/// CDI devices put into its environment (`devices::claims_in_env`). What
/// CreateContainer and Synchronize's adoption both read; whether the
/// container may use them is the manager's (`claimed_by`).
pub fn named_claims(c: &nri::Container) -> Vec<String> {
    steward_core::cpu::devices::claims_in_env(c.env.iter().map(String::as_str))
}

/// The resources the kubelet asked for, in CRI's shape.
pub fn kubelet_resources(c: &nri::Container) -> cri::LinuxContainerResources {
    let linux = c.linux.as_ref();
    let mut r = linux
        .and_then(|l| l.resources.as_ref())
        .map(to_cri)
        .unwrap_or_default();
    if let Some(adj) = linux.and_then(|l| l.oom_score_adj.as_ref()) {
        r.oom_score_adj = adj.value;
    }
    r
}

/// NRI's Linux resources in CRI's shape.
pub fn to_cri(r: &nri::LinuxResources) -> cri::LinuxContainerResources {
    let mut out = cri::LinuxContainerResources::default();
    if let Some(cpu) = &r.cpu {
        out.cpu_period = cpu
            .period
            .as_ref()
            .map_or(0, |v| i64::try_from(v.value).unwrap_or(i64::MAX));
        out.cpu_quota = cpu.quota.as_ref().map_or(0, |v| v.value);
        out.cpu_shares = cpu
            .shares
            .as_ref()
            .map_or(0, |v| i64::try_from(v.value).unwrap_or(i64::MAX));
        out.cpuset_cpus = cpu.cpus.clone();
        out.cpuset_mems = cpu.mems.clone();
    }
    if let Some(m) = &r.memory {
        out.memory_limit_in_bytes = m.limit.as_ref().map_or(0, |v| v.value);
        out.memory_swap_limit_in_bytes = m.swap.as_ref().map_or(0, |v| v.value);
    }
    out.hugepage_limits = r
        .hugepage_limits
        .iter()
        .map(|h| cri::HugepageLimit {
            page_size: h.page_size.clone(),
            limit: h.limit,
        })
        .collect();
    out.unified = r.unified.clone().into_iter().collect();
    out
}

/// What a container is created with: only what the decision changes
/// against the kubelet's request (its CPUs and memory nodes; for exclusive
/// CPUs optionally the CFS quota and the OOM score adjustment).
pub fn adjustment(
    kubelet: &cri::LinuxContainerResources,
    decided: &cri::LinuxContainerResources,
) -> nri::ContainerAdjustment {
    let mut cpu = nri::LinuxCpu {
        cpus: decided.cpuset_cpus.clone(),
        mems: decided.cpuset_mems.clone(),
        ..Default::default()
    };
    if decided.cpu_quota != kubelet.cpu_quota {
        cpu.quota = Some(nri::OptionalInt64 {
            value: decided.cpu_quota,
        });
    }
    let oom_score_adj =
        (decided.oom_score_adj != kubelet.oom_score_adj).then_some(nri::OptionalInt {
            value: decided.oom_score_adj,
        });
    nri::ContainerAdjustment {
        linux: Some(nri::LinuxContainerAdjustment {
            resources: Some(nri::LinuxResources {
                cpu: Some(cpu),
                ..Default::default()
            }),
            oom_score_adj,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// An update of a running container to `r`: its CPUs, memory nodes and
/// CFS quota (what a decision changes); the rest stays as the runtime has it.
pub fn update(id: &str, r: &ResourcesRecord) -> nri::ContainerUpdate {
    let mut cpu = nri::LinuxCpu {
        cpus: r.cpuset_cpus.clone(),
        mems: r.cpuset_mems.clone(),
        ..Default::default()
    };
    if r.cpu_quota != 0 {
        cpu.quota = Some(nri::OptionalInt64 { value: r.cpu_quota });
    }
    nri::ContainerUpdate {
        container_id: id.to_owned(),
        linux: Some(nri::LinuxContainerUpdate {
            resources: Some(nri::LinuxResources {
                cpu: Some(cpu),
                ..Default::default()
            }),
        }),
        ignore_failure: false,
    }
}

/// Every update as NRI's.
pub fn updates(u: &[(String, ResourcesRecord)]) -> Vec<nri::ContainerUpdate> {
    u.iter().map(|(id, r)| update(id, r)).collect()
}

/// What Synchronize reports, as a re-sync reads it.
pub(crate) fn listing(pods: &[nri::PodSandbox], containers: &[nri::Container]) -> RuntimeListing {
    let mut given = GivenStatus::default();
    let cri_pods = pods
        .iter()
        .map(|p| {
            given.pod_cgroup_parents.insert(
                p.id.clone(),
                p.linux
                    .as_ref()
                    .map(|l| l.cgroup_parent.clone())
                    .unwrap_or_default(),
            );
            cri::PodSandbox {
                id: p.id.clone(),
                metadata: Some(cri::PodSandboxMetadata {
                    name: p.name.clone(),
                    uid: p.uid.clone(),
                    namespace: p.namespace.clone(),
                    attempt: 0,
                }),
                state: cri::PodSandboxState::SandboxReady as i32,
                labels: p.labels.clone().into_iter().collect(),
                annotations: p.annotations.clone().into_iter().collect(),
                ..Default::default()
            }
        })
        .collect();
    let cri_containers = containers
        .iter()
        .map(|c| {
            let cgroup = c
                .linux
                .as_ref()
                .map(|l| l.cgroups_path.clone())
                .filter(|p| !p.is_empty())
                .map(|p| normalize_cgroups_path(&p));
            given
                .containers
                .insert(c.id.clone(), (Some(kubelet_resources(c)), cgroup));
            let claims = named_claims(c);
            if !claims.is_empty() {
                given.named_claims.insert(c.id.clone(), claims);
            }
            cri::Container {
                id: c.id.clone(),
                pod_sandbox_id: c.pod_sandbox_id.clone(),
                metadata: Some(cri::ContainerMetadata {
                    name: c.name.clone(),
                    attempt: 0,
                }),
                state: container_state(c.state()) as i32,
                labels: c.labels.clone().into_iter().collect(),
                annotations: c.annotations.clone().into_iter().collect(),
                ..Default::default()
            }
        })
        .collect();
    RuntimeListing {
        pods: cri_pods,
        containers: cri_containers,
        given: Some(given),
    }
}

fn container_state(s: nri::ContainerState) -> cri::ContainerState {
    match s {
        nri::ContainerState::ContainerCreated => cri::ContainerState::ContainerCreated,
        nri::ContainerState::ContainerRunning | nri::ContainerState::ContainerPaused => {
            cri::ContainerState::ContainerRunning
        }
        nri::ContainerState::ContainerStopped => cri::ContainerState::ContainerExited,
        nri::ContainerState::ContainerUnknown => cri::ContainerState::ContainerUnknown,
    }
}

/// The status a refusal or failure answers the runtime with: the runtime
/// fails the CRI call with its code and message.
pub fn status(e: &ResmgrError) -> steward_nri::RpcStatus {
    let s = e.to_status();
    steward_nri::RpcStatus::new(
        steward_nri::Code::from_i32(s.code() as i32),
        s.message().to_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nri_resources() -> nri::LinuxResources {
        nri::LinuxResources {
            cpu: Some(nri::LinuxCpu {
                shares: Some(nri::OptionalUInt64 { value: 1024 }),
                quota: Some(nri::OptionalInt64 { value: 100_000 }),
                period: Some(nri::OptionalUInt64 { value: 100_000 }),
                cpus: "0-1".into(),
                ..Default::default()
            }),
            memory: Some(nri::LinuxMemory {
                limit: Some(nri::OptionalInt64 { value: 32 << 20 }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn nri_resources_read_as_the_kubelet_sent_them() {
        let r = to_cri(&nri_resources());
        assert_eq!(
            (
                r.cpu_shares,
                r.cpu_quota,
                r.cpu_period,
                r.memory_limit_in_bytes
            ),
            (1024, 100_000, 100_000, 32 << 20)
        );
        assert_eq!(r.cpuset_cpus, "0-1");
    }

    #[test]
    fn the_adjustment_carries_only_what_the_decision_changed() {
        let kubelet = to_cri(&nri_resources());
        let mut decided = kubelet.clone();
        decided.cpuset_cpus = "1".into();
        decided.cpuset_mems = "0".into();
        let adj = adjustment(&kubelet, &decided);
        let linux = adj.linux.unwrap();
        let cpu = linux.resources.unwrap().cpu.unwrap();
        assert_eq!((cpu.cpus.as_str(), cpu.mems.as_str()), ("1", "0"));
        assert!(cpu.quota.is_none() && cpu.shares.is_none());
        assert!(linux.oom_score_adj.is_none());
        // No CFS quota for exclusive CPUs: the quota is adjusted too.
        decided.cpu_quota = -1;
        decided.oom_score_adj = -999;
        let linux = adjustment(&kubelet, &decided).linux.unwrap();
        assert_eq!(
            linux.resources.unwrap().cpu.unwrap().quota.unwrap().value,
            -1
        );
        assert_eq!(linux.oom_score_adj.unwrap().value, -999);
    }

    #[test]
    fn synchronize_lists_pods_containers_and_their_cpusets() {
        let pod = nri::PodSandbox {
            id: "p".into(),
            name: "n".into(),
            linux: Some(nri::LinuxPodSandbox {
                cgroup_parent: "/kubepods/pod1".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let c = nri::Container {
            id: "c".into(),
            pod_sandbox_id: "p".into(),
            name: "x".into(),
            state: nri::ContainerState::ContainerStopped as i32,
            linux: Some(nri::LinuxContainer {
                resources: Some(nri_resources()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let (k, v) = steward_core::cpu::devices::claim_env("u-1");
        let with_claim = nri::Container {
            id: "d".into(),
            pod_sandbox_id: "p".into(),
            env: vec!["A=b".into(), format!("{k}={v}")],
            ..Default::default()
        };
        let l = listing(&[pod], &[c, with_claim.clone()]);
        assert_eq!(l.pods[0].id, "p");
        assert_eq!(
            l.containers[0].state,
            cri::ContainerState::ContainerExited as i32
        );
        let given = l.given.unwrap();
        assert_eq!(given.pod_cgroup_parents["p"], "/kubepods/pod1");
        let (res, cgroup) = &given.containers["c"];
        assert_eq!(res.as_ref().unwrap().cpuset_cpus, "0-1");
        assert!(cgroup.is_none());
        // the claims each names, read as CreateContainer reads them
        assert_eq!(named_claims(&with_claim), ["u-1"]);
        assert_eq!(given.named_claims["d"], named_claims(&with_claim));
        assert!(!given.named_claims.contains_key("c"));
    }
}
