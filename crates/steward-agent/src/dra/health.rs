//! Device health to kubelet over the DRA resource health stream
//! (`v1alpha1.DRAResourceHealth`, kubelet 1.34 with ResourceHealthStatus):
//! every device this node publishes, in the pool it publishes it in
//! (`steward_core::dra::pool_of`, as the slices and prepare), plus each
//! device a prepared claim holds under the pool it was allocated from;
//! HEALTHY while its Instance's device is
//! present and usable here, UNHEALTHY when discovery lost it (a device
//! that left this node entirely stays in the stream as UNHEALTHY). The
//! current state first, then each change.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Weak;
use std::time::{SystemTime, UNIX_EPOCH};

use futures::Stream;
use steward_core::dra::{device_name, pool_of};
use steward_proto::dra_health::v1alpha1::{
    DeviceHealth, DeviceIdentifier, HealthStatus, NodeWatchResourcesRequest,
    NodeWatchResourcesResponse, dra_resource_health_server::DraResourceHealth,
};
use tonic::{Request, Response, Status};

use crate::claims::ClaimStore;
use crate::slot_keeper::SlotKeeper;

/// (pool, device) → (healthy, why not).
type Snapshot = BTreeMap<(String, String), (bool, String)>;

pub(crate) struct Health<L, C> {
    pub core: Weak<SlotKeeper<L, C>>,
}

async fn snapshot<L: ClaimStore, C: ClaimStore>(core: &SlotKeeper<L, C>) -> Snapshot {
    let st = core.lock_quiet().await;
    let mut out = Snapshot::new();
    let mut health: BTreeMap<&str, (bool, &str)> = BTreeMap::new();
    for inst in st.instances.values() {
        let info = st.ledger.instance(&inst.name);
        let healthy = info.is_some_and(|i| i.available());
        let why = match info {
            Some(i) if !i.present => "the device is not present on this node",
            Some(i) if !i.usable => "this node may not use the device",
            Some(_) => "",
            None => "the device is not served on this node",
        };
        health.insert(&inst.name, (healthy, why));
        // Only the devices this node publishes, in the pool it publishes
        // them in; a device no longer published here stays in the stream
        // as gone (below).
        let Some(pool) = pool_of(&core.node, &inst.name, &inst.nodes) else {
            continue;
        };
        for n in 0..inst.capacity {
            out.insert(
                (pool.clone(), device_name(&inst.name, n)),
                (healthy, why.to_owned()),
            );
        }
    }
    // A device a claim holds under the pool it was allocated from (its
    // Instance moved pool since) keeps its slot's health under that name.
    for h in st.ledger.holders() {
        let Some(hold) = h.claim.as_deref().filter(|c| !c.pool.is_empty()) else {
            continue;
        };
        let Some(&(healthy, why)) = h
            .resource
            .rsplit_once('-')
            .and_then(|(instance, _)| health.get(instance))
        else {
            continue;
        };
        out.entry((hold.pool.clone(), hold.device.clone()))
            .or_insert_with(|| (healthy, why.to_owned()));
    }
    out
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn message(devices: &Snapshot) -> NodeWatchResourcesResponse {
    let at = unix_now();
    NodeWatchResourcesResponse {
        devices: devices
            .iter()
            .map(|((pool, device), (healthy, why))| DeviceHealth {
                device: Some(DeviceIdentifier {
                    pool_name: pool.clone(),
                    device_name: device.clone(),
                }),
                health: if *healthy {
                    HealthStatus::Healthy
                } else {
                    HealthStatus::Unhealthy
                } as i32,
                last_updated_time: at,
                health_check_timeout_seconds: 0,
                message: why.clone(),
            })
            .collect(),
    }
}

type HealthStream = Pin<Box<dyn Stream<Item = Result<NodeWatchResourcesResponse, Status>> + Send>>;

#[tonic::async_trait]
impl<L: ClaimStore, C: ClaimStore> DraResourceHealth for Health<L, C> {
    type NodeWatchResourcesStream = HealthStream;

    async fn node_watch_resources(
        &self,
        _request: Request<NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        let core = self.core.clone();
        let changes = core
            .upgrade()
            .ok_or_else(|| Status::unavailable("steward agent is shutting down"))?
            .generations();
        let stream = futures::stream::unfold(
            (core, changes, None::<Snapshot>),
            |(core, mut changes, mut last)| async move {
                loop {
                    if last.is_some() {
                        changes.changed().await.ok()?;
                    }
                    let keeper = core.upgrade()?;
                    let mut now = snapshot(&keeper).await;
                    drop(keeper);
                    // Devices that left this node stay, UNHEALTHY.
                    for key in last.iter().flat_map(|l| l.keys()) {
                        now.entry(key.clone()).or_insert_with(|| {
                            (false, "the device is gone from this node".to_owned())
                        });
                    }
                    if last.as_ref() != Some(&now) {
                        let msg = message(&now);
                        last = Some(now);
                        return Some((Ok(msg), (core, changes, last)));
                    }
                }
            },
        );
        Ok(Response::new(Box::pin(stream)))
    }
}
