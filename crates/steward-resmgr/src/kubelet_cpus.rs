//! Whether kubelet's own CPU manager pins containers on this node.
//!
//! steward's resource manager assigns every container's cpuset; kubelet's
//! CPU manager must then be `none`, or the two rewrite each other's
//! cpusets (kubelet reconciles its own assignment through the runtime every
//! few seconds). kubelet says which it is on its pod resources socket:
//! `GetAllocatableResources` lists the CPUs its CPU manager may assign —
//! none under policy `none` (`nonePolicy.GetAllocatableCPUs` is the empty
//! set), every CPU but the reserved ones under `static`. The check runs once,
//! at start: a kubelet whose policy changes restarts, and so does this pod.

use std::path::{Path, PathBuf};
use std::time::Duration;

use steward_proto::podresources::v1::AllocatableResourcesRequest;
use steward_proto::podresources::v1::pod_resources_lister_client::PodResourcesListerClient;

/// What kubelet's pod resources API says of its CPU manager.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubeletCpus {
    /// No CPU is kubelet's to assign: CPU manager policy `none`.
    Unpinned,
    /// kubelet's CPU manager may assign these CPUs (policy `static`).
    Pinning(Vec<i64>),
}

/// kubelet's CPU manager assigns CPUs itself.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "kubelet's CPU manager assigns CPUs itself (its pod resources API at {socket} lists {} allocatable CPUs: {}), so it and steward's resource manager would rewrite each other's cpusets; set kubelet's cpuManagerPolicy to none (and remove its cpu_manager_state file before restarting it), or run steward without the resource manager",
    cpus.len(),
    cpus.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
)]
pub struct KubeletPinsCpus {
    pub socket: PathBuf,
    pub cpus: Vec<i64>,
}

/// kubelet's pod resources API could not be asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "cannot ask kubelet's pod resources API at {socket} which CPUs its CPU manager assigns: {message}"
)]
pub struct KubeletUnreachable {
    pub socket: PathBuf,
    pub message: String,
}

impl KubeletCpus {
    /// The verdict on `cpu_ids`, GetAllocatableResources' answer.
    pub fn of(cpu_ids: &[i64]) -> Self {
        if cpu_ids.is_empty() {
            KubeletCpus::Unpinned
        } else {
            let mut cpus = cpu_ids.to_vec();
            cpus.sort_unstable();
            cpus.dedup();
            KubeletCpus::Pinning(cpus)
        }
    }

    /// `Ok` when steward may pin beside this kubelet.
    pub fn check(self, socket: &Path) -> Result<(), KubeletPinsCpus> {
        match self {
            KubeletCpus::Unpinned => Ok(()),
            KubeletCpus::Pinning(cpus) => Err(KubeletPinsCpus {
                socket: socket.to_owned(),
                cpus,
            }),
        }
    }
}

/// Asks kubelet's pod resources API at `socket`, within `timeout`.
pub async fn ask(socket: &Path, timeout: Duration) -> Result<KubeletCpus, KubeletUnreachable> {
    let unreachable = |message: String| KubeletUnreachable {
        socket: socket.to_owned(),
        message,
    };
    let channel = steward_proto::uds::endpoint()
        .connect_timeout(timeout)
        .timeout(timeout)
        .connect_with_connector(steward_proto::uds::UnixConnector::new(socket))
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    let answer = PodResourcesListerClient::new(channel)
        .get_allocatable_resources(AllocatableResourcesRequest {})
        .await
        .map_err(|s| unreachable(format!("GetAllocatableResources: {}", s.message())))?;
    Ok(KubeletCpus::of(&answer.into_inner().cpu_ids))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_allocatable_cpu_is_policy_none_and_any_is_a_refusal_naming_them() {
        let socket = Path::new("/var/lib/kubelet/pod-resources/kubelet.sock");
        assert_eq!(KubeletCpus::of(&[]), KubeletCpus::Unpinned);
        assert_eq!(KubeletCpus::of(&[]).check(socket), Ok(()));
        let err = KubeletCpus::of(&[3, 1, 2, 1]).check(socket).unwrap_err();
        assert_eq!(err.cpus, vec![1, 2, 3]);
        let text = err.to_string();
        assert!(text.contains("lists 3 allocatable CPUs: 1,2,3"), "{text}");
        assert!(text.contains("cpuManagerPolicy to none"), "{text}");
    }
}
