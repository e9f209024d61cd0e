//! The in-band CRI controller.

use steward_core::cpu::Assignment;
use steward_proto::cri::runtime::v1 as cri;

use crate::cache::ResourcesRecord;
use crate::config::CriControlConfig;

/// The resources a container should run with: the kubelet's (already
/// validated) values with the policy's decision applied: `cpuset.cpus`,
/// `cpuset.mems` (unless memory pinning is off or no nodes were chosen),
/// and for exclusive CPUs optionally no CFS quota and a fixed OOM score
/// adjustment. Shares, period, memory limit, swap and hugepage limits are
/// carried through unchanged.
pub fn resources_for(
    kubelet: &cri::LinuxContainerResources,
    assignment: &Assignment,
    cfg: &CriControlConfig,
) -> cri::LinuxContainerResources {
    let mut r = kubelet.clone();
    r.cpuset_cpus = assignment.cpus.to_string();
    if !cfg.skip_memory_pinning && !assignment.mems.is_empty() {
        r.cpuset_mems = assignment.mems.to_string();
    }
    if assignment.exclusive {
        if cfg.disable_quota_for_exclusive {
            r.cpu_quota = -1;
        }
        if let Some(adj) = cfg.exclusive_oom_score_adj {
            r.oom_score_adj = adj;
        }
    }
    r
}

/// Put `resources` into a `CreateContainer` request (creating the
/// `linux.resources` sections when the kubelet sent none).
pub fn edit_create(req: &mut cri::CreateContainerRequest, resources: cri::LinuxContainerResources) {
    let config = req.config.get_or_insert_with(Default::default);
    let linux = config.linux.get_or_insert_with(Default::default);
    linux.resources = Some(resources);
}

/// The unsolicited update sent to a container whose assignment changed.
pub fn update_request(
    container_id: &str,
    resources: &ResourcesRecord,
) -> cri::UpdateContainerResourcesRequest {
    cri::UpdateContainerResourcesRequest {
        container_id: container_id.to_owned(),
        linux: Some(resources.to_cri()),
        windows: None,
        annotations: Default::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use steward_core::cpu::CpuSet;

    fn assignment(cpus: &str, exclusive: bool) -> Assignment {
        Assignment {
            cpus: CpuSet::parse(cpus).unwrap(),
            mems: CpuSet::parse("0").unwrap(),
            exclusive,
            pool: "p".into(),
        }
    }

    fn kubelet() -> cri::LinuxContainerResources {
        cri::LinuxContainerResources {
            cpu_period: 100_000,
            cpu_quota: 200_000,
            cpu_shares: 2048,
            memory_limit_in_bytes: 1 << 26,
            oom_score_adj: -997,
            cpuset_cpus: "0-7".into(),
            hugepage_limits: vec![cri::HugepageLimit {
                page_size: "2MB".into(),
                limit: 1 << 22,
            }],
            ..Default::default()
        }
    }

    #[test]
    fn shared_assignment_only_sets_cpusets() {
        let r = resources_for(
            &kubelet(),
            &assignment("2-3,6", false),
            &CriControlConfig::default(),
        );
        assert_eq!(r.cpuset_cpus, "2-3,6");
        assert_eq!(r.cpuset_mems, "0");
        assert_eq!(r.cpu_quota, 200_000);
        assert_eq!(r.cpu_shares, 2048);
        assert_eq!(r.memory_limit_in_bytes, 1 << 26);
        assert_eq!(r.oom_score_adj, -997);
        assert_eq!(r.hugepage_limits, kubelet().hugepage_limits);
    }

    #[test]
    fn exclusive_assignment_follows_controller_config() {
        let cfg = CriControlConfig {
            disable_quota_for_exclusive: true,
            skip_memory_pinning: true,
            exclusive_oom_score_adj: Some(-999),
        };
        let r = resources_for(&kubelet(), &assignment("4", true), &cfg);
        assert_eq!(r.cpuset_cpus, "4");
        assert_eq!(r.cpuset_mems, "");
        assert_eq!(r.cpu_quota, -1);
        assert_eq!(r.oom_score_adj, -999);
        // ... but not for shared ones.
        let s = resources_for(&kubelet(), &assignment("0-3", false), &cfg);
        assert_eq!(s.cpu_quota, 200_000);
        assert_eq!(s.oom_score_adj, -997);
    }

    #[test]
    fn edit_create_fills_missing_sections() {
        let mut req = cri::CreateContainerRequest::default();
        edit_create(
            &mut req,
            resources_for(
                &kubelet(),
                &assignment("1", true),
                &CriControlConfig::default(),
            ),
        );
        let res = req.config.unwrap().linux.unwrap().resources.unwrap();
        assert_eq!(res.cpuset_cpus, "1");
        let up = update_request("c1", &ResourcesRecord::from_cri(&res));
        assert_eq!(up.container_id, "c1");
        assert_eq!(up.linux.unwrap().cpuset_cpus, "1");
    }
}
