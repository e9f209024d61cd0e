//! A resource manager over a synthetic 4-CPU topology and a private cache,
//! driven as the NRI transport drives it; for the manager's unit tests.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use steward_core::cpu::{PolicyConfig, PolicyKind, SyntheticSpec, Topology, new_policy};
use steward_proto::cri::runtime::v1 as cri;

use super::ResourceManager;
use crate::cache::{Cache, PodRecord, PodState};
use crate::config::FileConfig;
use crate::metrics::Metrics;
use crate::relay::Upstream;

pub(crate) struct Fixture {
    pub manager: ResourceManager,
    pub _dir: tempfile::TempDir,
}

pub(crate) async fn manager() -> Fixture {
    manager_in(tempfile::tempdir().unwrap()).await
}

/// A manager on the state `dir` holds (an earlier one's, after a restart).
pub(crate) async fn manager_in(dir: tempfile::TempDir) -> Fixture {
    let topology = Topology::synthetic(&SyntheticSpec {
        cores_per_node: 4,
        ..SyntheticSpec::default()
    })
    .unwrap();
    let policy = new_policy(PolicyKind::Static, &topology, &PolicyConfig::default()).unwrap();
    let (cache, _) = Cache::open(&dir.path().join("state")).unwrap();
    let cgroups = dir.path().join("cgroup");
    std::fs::create_dir_all(&cgroups).unwrap();
    let (events, _rx) = tokio::sync::mpsc::channel(16);
    let manager = ResourceManager::new(
        cache,
        policy,
        topology,
        FileConfig::default(),
        // Never dialled: NRI answers and collects updates.
        Upstream::new(&dir.path().join("runtime.sock"), Duration::from_secs(1)).unwrap(),
        events,
        Metrics::default(),
        Arc::from(crate::cgroups::detect(&cgroups)),
        &dir.path().join("resctrl"),
        false,
    );
    manager.collect_updates().await;
    manager.startup_from_cache().await;
    Fixture { manager, _dir: dir }
}

pub(crate) fn pod(id: &str) -> PodRecord {
    PodRecord {
        id: id.into(),
        uid: format!("uid-{id}"),
        name: format!("name-{id}"),
        namespace: "default".into(),
        cgroup_parent: String::new(),
        annotations: BTreeMap::new(),
        labels: BTreeMap::new(),
        state: PodState::Ready,
    }
}

pub(crate) fn shared() -> cri::LinuxContainerResources {
    cri::LinuxContainerResources {
        cpu_shares: 256,
        memory_limit_in_bytes: 32 << 20,
        ..Default::default()
    }
}
