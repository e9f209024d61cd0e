//! This node's CPUs as `resource.k8s.io/v1` ResourceSlices of driver
//! `cpu.steward.dev`: pool = the node, `nodeName` set, one device per CPU
//! the manager says a claim may take or holds
//! ([`ResourceManager::cpu_devices`]), with the standard
//! `resource.kubernetes.io/numaNode` attribute among their attributes
//! (`steward_core::cpu::devices`).
//!
//! At most [`MAX_DEVICES_PER_SLICE`] devices per slice; every slice of the
//! pool carries the pool's generation and slice count, and the generation
//! moves only when the pool's content does. Written after every cache save
//! that changed the set, and only then: a slice whose content did not
//! change is not written; slices no longer wanted are deleted (with the
//! resourceVersion last seen as a precondition). The slices this node
//! wrote are found by the writer label (the agent's, `steward.dev/writer`)
//! and the driver; slices of other drivers are never touched.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::resource::v1::{
    Device, DeviceAttribute, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use kube::Api;
use kube::api::{DeleteParams, ListParams, ObjectMeta, PostParams, Preconditions};
use steward_core::cpu::CpuSet;
use steward_core::cpu::devices::{CPU_DRIVER, CpuDevice, devices};
use steward_core::dra::{Attribute, next_generation};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::manager::ResourceManager;

pub use steward_core::dra::{WRITER_LABEL, writer_label};

/// Devices per slice (the API's limit for devices without taints).
pub const MAX_DEVICES_PER_SLICE: usize = 128;
/// How often what was written is listed again (a slice removed behind the
/// publisher's back, e.g. by kubelet when the plugin was away, is written
/// again).
const RELIST: Duration = Duration::from_secs(300);

/// 64-bit FNV-1a: slice names that depend only on the node.
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The object name of slice `index` of `node`'s CPU pool.
pub fn slice_name(node: &str, index: usize) -> String {
    format!("steward-cpu-{:016x}-{index}", fnv1a64(node.as_bytes()))
}

fn attribute(a: &Attribute) -> DeviceAttribute {
    let mut out = DeviceAttribute::default();
    match a {
        Attribute::String(s) => out.string = Some(s.clone()),
        Attribute::Int(n) => out.int = Some(*n),
        Attribute::Bool(b) => out.bool = Some(*b),
        Attribute::Version(v) => out.version = Some(v.clone()),
    }
    out
}

fn device(d: &CpuDevice) -> Device {
    Device {
        name: d.name.clone(),
        attributes: Some(
            d.attributes
                .iter()
                .map(|(k, v)| (k.clone(), attribute(v)))
                .collect(),
        ),
        ..Device::default()
    }
}

/// The slices of `node`'s pool holding `devices`, by name, at generation 0
/// (the publisher sets it): none when there is no device.
pub fn plan(node: &str, devices: &[CpuDevice]) -> BTreeMap<String, ResourceSliceSpec> {
    let chunks: Vec<&[CpuDevice]> = devices.chunks(MAX_DEVICES_PER_SLICE).collect();
    let count = i64::try_from(chunks.len()).unwrap_or(i64::MAX);
    chunks
        .iter()
        .enumerate()
        .map(|(i, chunk)| {
            (
                slice_name(node, i),
                ResourceSliceSpec {
                    driver: CPU_DRIVER.into(),
                    pool: ResourcePool {
                        name: node.to_owned(),
                        generation: 0,
                        resource_slice_count: count,
                    },
                    node_name: Some(node.to_owned()),
                    devices: Some(chunk.iter().map(device).collect()),
                    ..ResourceSliceSpec::default()
                },
            )
        })
        .collect()
}

/// The spec with the pool generation zeroed: what comparisons look at.
fn content(s: &ResourceSliceSpec) -> ResourceSliceSpec {
    let mut s = s.clone();
    s.pool.generation = 0;
    s
}

/// The generation every wanted slice gets: kept while the pool is what
/// was written, else one more than the highest written.
pub fn generation(
    written: &BTreeMap<String, ResourceSlice>,
    wanted: &BTreeMap<String, ResourceSliceSpec>,
) -> i64 {
    let highest = written.values().map(|s| s.spec.pool.generation).max();
    let unchanged = written.len() == wanted.len()
        && wanted.iter().all(|(name, spec)| {
            written
                .get(name)
                .is_some_and(|s| content(&s.spec) == content(spec))
        });
    next_generation(highest, unchanged)
}

/// The CPU slices one node has written, as last seen.
pub struct CpuSlicePublisher {
    api: Api<ResourceSlice>,
    node: String,
    label: String,
    /// slice name → the object as written (its resourceVersion).
    written: Option<BTreeMap<String, ResourceSlice>>,
}

impl CpuSlicePublisher {
    pub fn new(client: kube::Client, node: &str) -> Self {
        Self {
            api: Api::all(client),
            node: node.to_owned(),
            label: writer_label(node),
            written: None,
        }
    }

    /// Forgets what was written: the next sync lists it again.
    pub fn relist(&mut self) {
        self.written = None;
    }

    async fn load(&mut self) -> Result<&mut BTreeMap<String, ResourceSlice>, kube::Error> {
        if self.written.is_none() {
            let lp = ListParams::default().labels(&format!("{WRITER_LABEL}={}", self.label));
            let mine = self
                .api
                .list(&lp)
                .await?
                .items
                .into_iter()
                .filter(|s| s.spec.driver == CPU_DRIVER)
                .filter_map(|s| Some((s.metadata.name.clone()?, s)))
                .collect();
            self.written = Some(mine);
        }
        Ok(self.written.get_or_insert_with(BTreeMap::new))
    }

    /// Makes this node's CPU slices hold `devices`; returns how many
    /// objects were written or deleted.
    pub async fn sync(&mut self, devices: &[CpuDevice]) -> Result<usize, kube::Error> {
        let api = self.api.clone();
        let label = self.label.clone();
        let mut wanted = plan(&self.node, devices);
        let written = self.load().await?;
        let generation = generation(written, &wanted);
        for spec in wanted.values_mut() {
            spec.pool.generation = generation;
        }
        let mut writes = 0;
        for (name, spec) in &wanted {
            if written.get(name).is_some_and(|s| &s.spec == spec) {
                continue;
            }
            let mut obj = ResourceSlice {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    labels: Some(BTreeMap::from([(WRITER_LABEL.to_owned(), label.clone())])),
                    ..ObjectMeta::default()
                },
                spec: spec.clone(),
            };
            let stored = match written.get(name) {
                Some(old) => {
                    obj.metadata.resource_version = old.metadata.resource_version.clone();
                    api.replace(name, &PostParams::default(), &obj).await
                }
                None => api.create(&PostParams::default(), &obj).await,
            };
            match stored {
                Ok(s) => {
                    written.insert(name.clone(), s);
                    writes += 1;
                }
                Err(e) => {
                    // Read again next time: someone else changed it.
                    self.written = None;
                    return Err(e);
                }
            }
        }
        let stale: Vec<(String, Option<String>)> = written
            .iter()
            .filter(|(n, _)| !wanted.contains_key(*n))
            .map(|(n, s)| (n.clone(), s.metadata.resource_version.clone()))
            .collect();
        for (name, rv) in stale {
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: None,
                    resource_version: rv,
                }),
                ..DeleteParams::default()
            };
            match api.delete(&name, &dp).await {
                Ok(_) => writes += 1,
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                Err(e) => {
                    self.written = None;
                    return Err(e);
                }
            }
            written.remove(&name);
        }
        if writes > 0 {
            debug!(node = %self.node, writes, generation, "CPU ResourceSlices synced");
        }
        Ok(writes)
    }
}

/// Publishes `node`'s CPUs until `stop`: now, and whenever `saves` moves
/// (a cache save) and the set of CPUs to publish changed; a failed write
/// is tried again after `retry`.
pub async fn publish(
    manager: Arc<ResourceManager>,
    client: kube::Client,
    node: String,
    retry: Duration,
    mut saves: watch::Receiver<u64>,
    stop: CancellationToken,
) {
    let topology = manager.topology().await;
    let mut publisher = CpuSlicePublisher::new(client, &node);
    let mut published: Option<CpuSet> = None;
    let mut retry_at: Option<tokio::time::Instant> = None;
    let mut relist_at = tokio::time::Instant::now() + RELIST;
    let mut saves_open = true;
    loop {
        let cpus = manager.cpu_devices().await.cpus;
        if published.as_ref() != Some(&cpus) || retry_at.is_some() {
            let devs = devices(&topology, &cpus);
            match publisher.sync(&devs).await {
                Ok(writes) => {
                    if writes > 0 {
                        info!(node = %node, cpus = %cpus, devices = devs.len(), "CPU devices published");
                    }
                    published = Some(cpus);
                    retry_at = None;
                }
                Err(e) => {
                    warn!(error = %e, "writing the CPU ResourceSlices failed; retrying");
                    retry_at = Some(tokio::time::Instant::now() + retry);
                }
            }
        }
        let retry = async {
            match retry_at {
                Some(t) => tokio::time::sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        let saved = async {
            if saves_open {
                saves.changed().await.is_ok()
            } else {
                std::future::pending().await
            }
        };
        tokio::select! {
            () = stop.cancelled() => return,
            open = saved => saves_open = open,
            () = retry => {}
            () = tokio::time::sleep_until(relist_at) => {
                relist_at = tokio::time::Instant::now() + RELIST;
                publisher.relist();
                published = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use steward_core::cpu::{SyntheticSpec, Topology};

    fn devs(n: u32) -> Vec<CpuDevice> {
        let t = Topology::synthetic(&SyntheticSpec {
            sockets: 1,
            dies_per_socket: 1,
            nodes_per_die: 2,
            cores_per_node: n / 2,
            threads_per_core: 1,
            ..SyntheticSpec::default()
        })
        .unwrap();
        devices(&t, t.online_cpus())
    }

    #[test]
    fn a_pool_is_split_at_128_devices_each_slice_counting_them_all() {
        let plans = plan("n1", &devs(300));
        assert_eq!(plans.len(), 3);
        let sizes: Vec<usize> = plans
            .values()
            .map(|s| s.devices.as_ref().unwrap().len())
            .collect();
        assert_eq!(sizes.iter().sum::<usize>(), 300);
        assert!(sizes.iter().all(|n| *n <= MAX_DEVICES_PER_SLICE));
        for s in plans.values() {
            assert_eq!(s.pool.resource_slice_count, 3);
            assert_eq!(s.pool.name, "n1");
            assert_eq!(s.node_name.as_deref(), Some("n1"));
            assert_eq!(s.driver, "cpu.steward.dev");
        }
        assert!(plan("n1", &[]).is_empty());
    }

    #[test]
    fn the_generation_moves_only_when_the_pool_changes() {
        let wanted = plan("n1", &devs(4));
        assert_eq!(generation(&BTreeMap::new(), &wanted), 1);
        let written: BTreeMap<String, ResourceSlice> = wanted
            .iter()
            .map(|(n, s)| {
                let mut s = s.clone();
                s.pool.generation = 1;
                (
                    n.clone(),
                    ResourceSlice {
                        metadata: ObjectMeta::default(),
                        spec: s,
                    },
                )
            })
            .collect();
        assert_eq!(generation(&written, &wanted), 1);
        assert_eq!(generation(&written, &plan("n1", &devs(2))), 2);
    }

    #[test]
    fn slice_names_differ_per_node_and_never_clash_with_the_agents() {
        assert_ne!(slice_name("n1", 0), slice_name("n2", 0));
        assert!(slice_name("n1", 0).starts_with("steward-cpu-"));
    }
}
