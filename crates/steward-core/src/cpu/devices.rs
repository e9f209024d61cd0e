//! A node's CPUs as DRA devices: what the resource manager publishes under
//! its own driver, [`CPU_DRIVER`], so kube-scheduler can place a claim's
//! CPUs itself and align them with other drivers' devices through the
//! standard `resource.kubernetes.io/numaNode` attribute.
//!
//! One device per logical CPU, named [`device_name`] (`cpu-<id>`); the
//! name is the only link from an allocation back to a CPU
//! ([`cpu_of_device`]). Published are the CPUs a claim may take: online,
//! not reserved for the system, not isolated, not pinned exclusively to a
//! container by a policy ([`publishable`]); a CPU already prepared for a
//! claim stays published (the scheduler counts it allocated).
//!
//! Pure: the adapter (`steward-resmgr`'s `dra`) turns [`CpuDevice`]s into
//! ResourceSlices.

use std::collections::BTreeMap;

use crate::cpu::{CpuSet, Topology};
use crate::dra::{Attribute, NUMA_NODE_ATTRIBUTE};

/// The DRA driver name of the resource manager's CPU devices (and of its
/// DeviceClass).
pub const CPU_DRIVER: &str = "cpu.steward.dev";
/// Attribute: the CPU's physical package.
pub const SOCKET_ATTRIBUTE: &str = "cpu.steward.dev/socket";
/// Attribute: the CPU's core id within its socket and die.
pub const CORE_ATTRIBUTE: &str = "cpu.steward.dev/core";
/// Attribute: the CPU's logical id (`cpuN`).
pub const CPU_ID_ATTRIBUTE: &str = "cpu.steward.dev/id";
/// Attribute: the CPU's index among its core's SMT siblings (0 for the
/// first thread of a core).
pub const SMT_ATTRIBUTE: &str = "cpu.steward.dev/smtIndex";

const DEVICE_PREFIX: &str = "cpu-";

/// Prefix of the environment variable a prepared claim's CDI device puts
/// into each container that uses the claim ([`claim_env`]). The resource
/// manager reads it at the container's creation to find the claim; it
/// believes it only for pods the claim is reserved for, so a pod that sets
/// it itself gains nothing.
pub const CLAIM_ENV_PREFIX: &str = "STEWARD_CPU_CLAIM_";

/// The environment variable (name, value) naming claim `uid`: one name per
/// claim, so a container using two claims carries both.
pub fn claim_env(uid: &str) -> (String, String) {
    let suffix: String = uid
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    (format!("{CLAIM_ENV_PREFIX}{suffix}"), uid.to_owned())
}

/// The claim UIDs named in a container's environment (`NAME=value`
/// entries, as the runtime carries them), in order, without repeats.
pub fn claims_in_env<'a>(env: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for entry in env {
        if let Some((name, value)) = entry.split_once('=')
            && name.starts_with(CLAIM_ENV_PREFIX)
            && !value.is_empty()
            && !out.iter().any(|v| v == value)
        {
            out.push(value.to_owned());
        }
    }
    out
}

/// One CPU as a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuDevice {
    /// `cpu-<id>`.
    pub name: String,
    pub cpu: u32,
    /// Attribute name → value; always the NUMA node, socket, core, id and
    /// SMT index.
    pub attributes: BTreeMap<String, Attribute>,
}

/// The device name of CPU `id`.
pub fn device_name(id: u32) -> String {
    format!("{DEVICE_PREFIX}{id}")
}

/// The CPU a device name names; `None` for anything not written by
/// [`device_name`] (leading zeros, signs and spaces included).
pub fn cpu_of_device(name: &str) -> Option<u32> {
    let digits = name.strip_prefix(DEVICE_PREFIX)?;
    if digits.is_empty()
        || !digits.bytes().all(|b| b.is_ascii_digit())
        || (digits.len() > 1 && digits.starts_with('0'))
    {
        return None;
    }
    let id: u32 = digits.parse().ok()?;
    (id <= crate::cpu::MAX_ID).then_some(id)
}

/// The CPUs a claim may be given: online, neither reserved nor isolated,
/// nor pinned exclusively by a policy.
pub fn publishable(topology: &Topology, reserved: &CpuSet, pinned: &CpuSet) -> CpuSet {
    topology
        .online_cpus()
        .difference(reserved)
        .difference(topology.isolated_cpus())
        .difference(pinned)
}

/// The devices of `cpus` (those not online in `topology` are skipped), in
/// CPU order.
pub fn devices(topology: &Topology, cpus: &CpuSet) -> Vec<CpuDevice> {
    cpus.iter()
        .filter_map(|id| {
            let cpu = topology.cpu(id)?;
            let smt = topology
                .siblings(id)
                .iter()
                .position(|s| s == id)
                .unwrap_or(0);
            let attributes = BTreeMap::from([
                (
                    NUMA_NODE_ATTRIBUTE.to_owned(),
                    Attribute::Int(i64::from(cpu.node)),
                ),
                (
                    SOCKET_ATTRIBUTE.to_owned(),
                    Attribute::Int(i64::from(cpu.socket)),
                ),
                (
                    CORE_ATTRIBUTE.to_owned(),
                    Attribute::Int(i64::from(cpu.core)),
                ),
                (CPU_ID_ATTRIBUTE.to_owned(), Attribute::Int(i64::from(id))),
                (
                    SMT_ATTRIBUTE.to_owned(),
                    Attribute::Int(i64::try_from(smt).unwrap_or(0)),
                ),
            ]);
            Some(CpuDevice {
                name: device_name(id),
                cpu: id,
                attributes,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::SyntheticSpec;
    use proptest::prelude::*;

    fn topology() -> Topology {
        Topology::synthetic(&SyntheticSpec {
            sockets: 1,
            dies_per_socket: 1,
            nodes_per_die: 2,
            cores_per_node: 2,
            threads_per_core: 2,
            ..SyntheticSpec::default()
        })
        .unwrap()
    }

    proptest! {
        #[test]
        fn every_name_reads_back_as_its_cpu(id in 0..=crate::cpu::MAX_ID) {
            prop_assert_eq!(cpu_of_device(&device_name(id)), Some(id));
        }

        #[test]
        fn no_other_string_reads_as_a_cpu(s in "\\PC{0,12}") {
            if let Some(id) = cpu_of_device(&s) {
                prop_assert_eq!(device_name(id), s);
            }
        }
    }

    #[test]
    fn a_claims_env_reads_back_as_its_uid() {
        let uid = "0b9e2c6a-1f7e-4a43-9d55-2f8d0c7a1e11";
        let (name, value) = claim_env(uid);
        assert_eq!(
            name,
            "STEWARD_CPU_CLAIM_0B9E2C6A_1F7E_4A43_9D55_2F8D0C7A1E11"
        );
        let entry = format!("{name}={value}");
        let env = [
            "PATH=/bin",
            entry.as_str(),
            entry.as_str(),
            "STEWARD_CPU_CLAIM_X=",
        ];
        assert_eq!(claims_in_env(env), vec![uid.to_owned()]);
    }

    #[test]
    fn odd_names_are_not_cpus() {
        for name in [
            "cpu-", "cpu-01", "cpu--1", "cpu-+1", "cpu- 1", "CPU-1", "cpu-1x",
        ] {
            assert_eq!(cpu_of_device(name), None, "{name}");
        }
    }

    #[test]
    fn reserved_isolated_and_pinned_cpus_are_not_published() {
        let t = topology();
        let reserved = CpuSet::parse("0").unwrap();
        let pinned = CpuSet::parse("4-5").unwrap();
        let cpus = publishable(&t, &reserved, &pinned);
        assert_eq!(cpus, CpuSet::parse("1-3,6-7").unwrap());
    }

    #[test]
    fn each_device_carries_its_numa_node_and_smt_index() {
        let t = topology();
        let all = t.online_cpus().clone();
        let devs = devices(&t, &all);
        assert_eq!(devs.len(), all.len());
        for d in &devs {
            let cpu = t.cpu(d.cpu).unwrap();
            assert_eq!(
                d.attributes[NUMA_NODE_ATTRIBUTE],
                Attribute::Int(i64::from(cpu.node))
            );
            assert_eq!(d.name, device_name(d.cpu));
        }
        let firsts = devs
            .iter()
            .filter(|d| d.attributes[SMT_ATTRIBUTE] == Attribute::Int(0))
            .count();
        assert_eq!(firsts, t.cores().len());
    }
}
