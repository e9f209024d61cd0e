//! What kube-scheduler's DynamicResources plugin (and, for deallocation,
//! the resourceclaim controller) do to a `resource.k8s.io/v1`
//! ResourceClaim, for a subset of the API, over a real `kube::Client`.
//!
//! [`allocate_claim`] picks devices for every request of the claim from the
//! ResourceSlices the node can use ([`crate::dra_select`]), checks them
//! against the DeviceClass's and the request's CEL selectors
//! ([`crate::dra_cel`]), never hands out a device another claim has (but
//! shares devices that allow multiple allocations while their capacity
//! lasts, [`capacity`]), and writes `status.allocation` and
//! `status.reservedFor` through the status subresource with the
//! resourceVersion it read (a 409 makes it read and decide again). A
//! claim that is already allocated only gets the pod added to
//! `reservedFor`.
//!
//! Subset: requests must be `exactly` (`firstAvailable` is refused) with
//! `allocationMode` `ExactCount` (default, `count` default 1) or `All`;
//! `constraints` only `matchAttribute` ([`constraints`]); capacity requests
//! and `allowMultipleAllocations` (KEP-5075, [`capacity`]); no
//! `adminAccess`, shared counters or binding conditions. Device taints
//! with effect `NoSchedule` or `NoExecute` keep a device from requests
//! that do not tolerate them (`exactly.tolerations`); the tolerations are
//! not copied into the allocation result, and `NoExecute` evicts nothing. CEL run-time errors (a missing attribute)
//! fail the allocation like kube-scheduler's "CEL runtime error"; use
//! `device.driver == "…" && …` so other drivers' devices are rejected first.
//! `allocation.nodeSelector` always names the node (kube-scheduler leaves it
//! out for devices of `allNodes` pools).
//!
//! Allocations within one process are serialized by a mutex; kube-scheduler
//! instead keeps in-flight allocations in its in-memory assume cache. Two
//! processes allocating at once could hand out the same device.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;

use k8s_openapi::api::core::v1::{Node, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationConfiguration, DeviceAllocationResult, DeviceClass,
    DeviceRequest, ResourceClaim, ResourceClaimConsumerReference, ResourceClaimSpec, ResourceSlice,
};
use kube::api::{ListParams, PostParams};
use kube::{Api, ResourceExt};
use tracing::{debug, info};

use crate::client::CONFLICT_ATTEMPTS;
use crate::dra_cel::{self, CelDevice, Program};
use crate::dra_select::{self, Candidate, DeviceId, NodeInfo};

pub(crate) mod capacity;
mod constraints;

use self::capacity::{Amounts, Ledger};
use self::constraints::Pick;

/// Most consumers a claim can be reserved for (the API's limit).
pub const RESERVED_FOR_MAX: usize = 256;

/// Why a claim could not be allocated, reserved or released.
#[derive(Debug, thiserror::Error)]
pub enum AllocError {
    /// A call to the API server failed (also a 409 in the last round).
    #[error("API server: {0}")]
    Api(#[source] Box<kube::Error>),
    /// The claim uses a part of the API this allocator does not implement.
    #[error("ResourceClaim {claim}: not supported by the stand-in allocator: {message}")]
    Unsupported { claim: String, message: String },
    /// The claim cannot be allocated as written: a missing DeviceClass, a
    /// CEL compile or run-time error, an invalid pool, an allocation for
    /// another node, a full `reservedFor`.
    #[error("ResourceClaim {claim}: {message}")]
    Invalid { claim: String, message: String },
    /// Not enough matching free devices for one request.
    #[error("ResourceClaim {claim}: cannot allocate request {request:?}: {message}")]
    Unsatisfiable {
        claim: String,
        request: String,
        message: String,
    },
}

impl From<kube::Error> for AllocError {
    fn from(e: kube::Error) -> Self {
        AllocError::Api(Box::new(e))
    }
}

fn serial() -> &'static tokio::sync::Mutex<()> {
    static LOCK: OnceLock<tokio::sync::Mutex<()>> = OnceLock::new();
    LOCK.get_or_init(|| tokio::sync::Mutex::new(()))
}

fn pod_consumer(pod_name: &str, pod_uid: &str) -> ResourceClaimConsumerReference {
    ResourceClaimConsumerReference {
        api_group: None,
        resource: "pods".to_string(),
        name: pod_name.to_string(),
        uid: pod_uid.to_string(),
    }
}

/// The node selector written into an allocation: exactly this node.
pub fn node_selector_for(node: &str) -> NodeSelector {
    NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_fields: Some(vec![NodeSelectorRequirement {
                key: "metadata.name".to_string(),
                operator: "In".to_string(),
                values: Some(vec![node.to_string()]),
            }]),
            match_expressions: None,
        }],
    }
}

async fn node_info(client: &kube::Client, node: &str) -> Result<NodeInfo, AllocError> {
    let nodes: Api<Node> = Api::all(client.clone());
    Ok(match nodes.get_opt(node).await? {
        Some(n) => NodeInfo {
            name: node.to_string(),
            labels: n.metadata.labels.unwrap_or_default(),
        },
        None => NodeInfo::named(node),
    })
}

/// Allocates `claim_name` for pod `pod_name`/`pod_uid` on `node_name` (or,
/// when it is allocated already, reserves it for the pod too) and returns
/// the claim as written.
pub async fn allocate_claim(
    client: &kube::Client,
    namespace: &str,
    claim_name: &str,
    pod_name: &str,
    pod_uid: &str,
    node_name: &str,
) -> Result<ResourceClaim, AllocError> {
    let _serial = serial().lock().await;
    let who = format!("{namespace}/{claim_name}");
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), namespace);
    let node = node_info(client, node_name).await?;
    let mut attempt = 1;
    loop {
        let mut claim = claims.get(claim_name).await?;
        let claim_uid = claim.metadata.uid.clone().unwrap_or_default();
        let spec = claim.spec.clone();
        let status = claim.status.get_or_insert_with(Default::default);
        if let Some(allocation) = &status.allocation {
            if let Some(sel) = &allocation.node_selector {
                let usable = dra_select::node_matches(sel, &node)
                    .map_err(|message| invalid(&who, message))?;
                if !usable {
                    return Err(invalid(
                        &who,
                        format!("allocated for other nodes, cannot be used on node {node_name}"),
                    ));
                }
            }
            let reserved = status.reserved_for.get_or_insert_with(Vec::new);
            if reserved.iter().any(|r| r.uid == pod_uid) {
                debug!(claim = %who, %pod_uid, "claim already reserved for the pod");
                return Ok(claim);
            }
            if reserved.len() >= RESERVED_FOR_MAX {
                return Err(invalid(
                    &who,
                    format!("reservedFor already has {RESERVED_FOR_MAX} consumers"),
                ));
            }
            reserved.push(pod_consumer(pod_name, pod_uid));
        } else {
            let world = World::read(client, &who, &spec, &claim_uid, &node).await?;
            let allocation = allocate(&who, &spec, &world, node_name)?;
            status.allocation = Some(allocation);
            status.reserved_for = Some(vec![pod_consumer(pod_name, pod_uid)]);
        }
        match claims
            .replace_status(claim_name, &PostParams::default(), &claim)
            .await
        {
            Ok(written) => {
                info!(claim = %who, %pod_uid, node = node_name, "claim allocated and reserved");
                return Ok(written);
            }
            Err(kube::Error::Api(s)) if s.is_conflict() && attempt < CONFLICT_ATTEMPTS => {
                debug!(claim = %who, attempt, "conflict writing the claim status; reading again");
                attempt += 1;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Clears `status.allocation` and `status.reservedFor` (what the
/// resourceclaim controller does once no consumer is left).
pub async fn deallocate_claim(
    client: &kube::Client,
    namespace: &str,
    claim_name: &str,
) -> Result<ResourceClaim, AllocError> {
    edit_status(client, namespace, claim_name, |status| {
        status.allocation = None;
        status.reserved_for = None;
    })
    .await
}

/// Removes pod `pod_uid` from `reservedFor`, and deallocates the claim when
/// nobody is left (the resourceclaim controller's reaction to a finished pod).
pub async fn unreserve_claim(
    client: &kube::Client,
    namespace: &str,
    claim_name: &str,
    pod_uid: &str,
) -> Result<ResourceClaim, AllocError> {
    edit_status(client, namespace, claim_name, |status| {
        let reserved = status.reserved_for.take().unwrap_or_default();
        let left: Vec<_> = reserved.into_iter().filter(|r| r.uid != pod_uid).collect();
        if left.is_empty() {
            status.allocation = None;
        } else {
            status.reserved_for = Some(left);
        }
    })
    .await
}

async fn edit_status(
    client: &kube::Client,
    namespace: &str,
    claim_name: &str,
    mut edit: impl FnMut(&mut k8s_openapi::api::resource::v1::ResourceClaimStatus),
) -> Result<ResourceClaim, AllocError> {
    let _serial = serial().lock().await;
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), namespace);
    let mut attempt = 1;
    loop {
        let mut claim = claims.get(claim_name).await?;
        edit(claim.status.get_or_insert_with(Default::default));
        match claims
            .replace_status(claim_name, &PostParams::default(), &claim)
            .await
        {
            Ok(written) => return Ok(written),
            Err(kube::Error::Api(s)) if s.is_conflict() && attempt < CONFLICT_ATTEMPTS => {
                attempt += 1;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

fn invalid(claim: &str, message: impl Into<String>) -> AllocError {
    AllocError::Invalid {
        claim: claim.to_string(),
        message: message.into(),
    }
}

fn unsupported(claim: &str, message: impl Into<String>) -> AllocError {
    AllocError::Unsupported {
        claim: claim.to_string(),
        message: message.into(),
    }
}

/// Everything an allocation decision reads.
pub(crate) struct World {
    pub classes: BTreeMap<String, DeviceClass>,
    pub candidates: Vec<Candidate>,
    /// Devices other claims' allocation results take whole.
    pub in_use: BTreeSet<DeviceId>,
    /// What other claims' shared allocations (with a `shareID`, or of a
    /// device that allows multiple allocations) consume, per device.
    pub consumed: BTreeMap<DeviceId, Amounts>,
}

impl World {
    async fn read(
        client: &kube::Client,
        who: &str,
        spec: &ResourceClaimSpec,
        claim_uid: &str,
        node: &NodeInfo,
    ) -> Result<World, AllocError> {
        let classes_api: Api<DeviceClass> = Api::all(client.clone());
        let mut classes = BTreeMap::new();
        let requests = spec.devices.as_ref().and_then(|d| d.requests.as_deref());
        for r in requests.unwrap_or_default() {
            if let Some(exact) = &r.exactly
                && !classes.contains_key(&exact.device_class_name)
                && let Some(class) = classes_api.get_opt(&exact.device_class_name).await?
            {
                classes.insert(exact.device_class_name.clone(), class);
            }
        }
        let slices = Api::<ResourceSlice>::all(client.clone())
            .list(&ListParams::default())
            .await?
            .items;
        let candidates =
            dra_select::candidates(&slices, node).map_err(|message| invalid(who, message))?;
        let mut in_use = BTreeSet::new();
        let mut consumed = BTreeMap::new();
        let all_claims = Api::<ResourceClaim>::all(client.clone())
            .list(&ListParams::default())
            .await?
            .items;
        for other in all_claims {
            if other.metadata.uid.as_deref() == Some(claim_uid) {
                continue;
            }
            let name = format!(
                "{}/{}",
                other.namespace().unwrap_or_default(),
                other.name_any()
            );
            let results = other
                .status
                .and_then(|s| s.allocation)
                .and_then(|a| a.devices)
                .and_then(|d| d.results)
                .unwrap_or_default();
            capacity::book(results, &candidates, &mut in_use, &mut consumed)
                .map_err(|e| invalid(who, format!("allocation of ResourceClaim {name}: {e}")))?;
        }
        Ok(World {
            classes,
            candidates,
            in_use,
            consumed,
        })
    }
}

struct Selectors {
    /// (origin for errors, program), class selectors first.
    programs: Vec<(String, Program)>,
}

impl Selectors {
    fn compile(
        claim: &str,
        class: &DeviceClass,
        request: &DeviceRequest,
    ) -> Result<Self, AllocError> {
        let class_name = class.metadata.name.clone().unwrap_or_default();
        let mut programs = Vec::new();
        let class_sel = class.spec.selectors.as_deref().unwrap_or_default();
        let req_sel = request
            .exactly
            .as_ref()
            .and_then(|e| e.selectors.as_deref())
            .unwrap_or_default();
        let tagged = class_sel
            .iter()
            .enumerate()
            .map(|(i, s)| (format!("class {class_name}: selector #{i}"), s))
            .chain(
                req_sel
                    .iter()
                    .enumerate()
                    .map(|(i, s)| (format!("claim {claim}: selector #{i}"), s)),
            );
        for (origin, sel) in tagged {
            let Some(cel) = &sel.cel else {
                return Err(unsupported(
                    claim,
                    format!("{origin}: only CEL selectors are known"),
                ));
            };
            let program = dra_cel::compile(&cel.expression)
                .map_err(|e| invalid(claim, format!("{origin}: CEL compile error: {e}")))?;
            programs.push((origin, program));
        }
        Ok(Selectors { programs })
    }

    /// Whether every selector accepts the device; the first run-time error
    /// is returned with the selector it came from.
    fn matches(&self, device: &CelDevice) -> Result<bool, (String, dra_cel::CelError)> {
        for (origin, p) in &self.programs {
            if !p.matches(device).map_err(|e| (origin.clone(), e))? {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// Decides the allocation of `spec` on `node` (pure: no API access).
pub(crate) fn allocate(
    claim: &str,
    spec: &ResourceClaimSpec,
    world: &World,
    node: &str,
) -> Result<AllocationResult, AllocError> {
    let devices = spec.devices.clone().unwrap_or_default();
    let requests = devices.requests.as_deref().unwrap_or_default();
    let request_names: BTreeSet<String> = requests.iter().map(|r| r.name.clone()).collect();
    let constraints = constraints::parse(
        claim,
        devices.constraints.as_deref().unwrap_or_default(),
        &request_names,
    )?;
    // With constraints every matching free device is an option of its
    // request and the search picks; without, the first ones are taken.
    let exhaustive = !constraints.is_empty();
    let by_id: BTreeMap<&DeviceId, &Candidate> =
        world.candidates.iter().map(|c| (&c.id, c)).collect();
    // Devices taken whole by earlier requests, and what is left of the
    // shared ones (only without constraints: with, the search decides).
    let mut taken: BTreeSet<DeviceId> = BTreeSet::new();
    let room = Ledger::new(&world.candidates, &world.consumed);
    let mut left = room.clone();
    let mut picks: Vec<Pick<'_>> = Vec::new();
    let mut config = Vec::new();
    for request in requests {
        let Some(exact) = &request.exactly else {
            return Err(unsupported(
                claim,
                format!(
                    "request {:?}: only `exactly` requests (no firstAvailable)",
                    request.name
                ),
            ));
        };
        if exact.admin_access == Some(true) {
            return Err(unsupported(
                claim,
                format!("request {:?}: adminAccess", request.name),
            ));
        }
        let wanted = capacity::parse_requests(exact.capacity.as_ref())
            .map_err(|e| invalid(claim, format!("request {:?}: {e}", request.name)))?;
        let class = world.classes.get(&exact.device_class_name).ok_or_else(|| {
            invalid(
                claim,
                format!(
                    "request {:?}: DeviceClass {} does not exist",
                    request.name, exact.device_class_name
                ),
            )
        })?;
        let selectors = Selectors::compile(claim, class, request)?;
        let mode = exact.allocation_mode.as_deref().unwrap_or("ExactCount");
        let mut free = Vec::new();
        let mut shares = BTreeMap::new();
        // Matching devices that are not free, for the messages.
        let (mut busy, mut tainted, mut full, mut unfit) = (0usize, 0usize, 0usize, 0usize);
        let tolerations = exact.tolerations.as_deref().unwrap_or_default();
        for c in &world.candidates {
            let shared = c.allow_multiple_allocations;
            if !shared && taken.contains(&c.id) {
                continue;
            }
            if dra_select::blocking_taint(c, tolerations).is_some() {
                // Diagnostics only, as for devices in use.
                tainted += usize::from(selectors.matches(&c.cel) == Ok(true));
                continue;
            }
            if world.in_use.contains(&c.id) || (!shared && world.consumed.contains_key(&c.id)) {
                // Diagnostics only: errors count as no match here.
                busy += usize::from(selectors.matches(&c.cel) == Ok(true));
                continue;
            }
            if !exhaustive
                && mode == "ExactCount"
                && free.len() == usize::try_from(exact.count.unwrap_or(1)).unwrap_or(0)
            {
                break;
            }
            let share = match capacity::consumption(&wanted, &c.capacity) {
                Err(_) => {
                    unfit += usize::from(selectors.matches(&c.cel) == Ok(true));
                    continue;
                }
                Ok(amounts) if shared && !left.fits(&c.id, &amounts) => {
                    full += usize::from(selectors.matches(&c.cel) == Ok(true));
                    continue;
                }
                Ok(amounts) => shared.then_some(amounts),
            };
            let ok = selectors.matches(&c.cel).map_err(|(origin, e)| {
                invalid(claim, format!("{origin}: CEL runtime error: {e}"))
            })?;
            if ok {
                free.push(c.id.clone());
                if let Some(amounts) = share {
                    shares.insert(c.id.clone(), amounts);
                }
            }
        }
        let rest = format!(
            "{full} at capacity, {unfit} without the requested capacity, {tainted} tainted"
        );
        let (options, want) = match mode {
            "ExactCount" => {
                let count = exact.count.unwrap_or(1);
                let want = usize::try_from(count)
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| {
                        invalid(
                            claim,
                            format!("request {:?}: count {count} must be positive", request.name),
                        )
                    })?;
                if free.len() < want {
                    return Err(AllocError::Unsatisfiable {
                        claim: claim.to_string(),
                        request: request.name.clone(),
                        message: format!(
                            "needs {want} device(s) of class {} on node {node}, {} free match the selectors ({busy} more are allocated to other claims, {rest})",
                            exact.device_class_name,
                            free.len()
                        ),
                    });
                }
                (free, want)
            }
            "All" => {
                if busy + tainted + full + unfit > 0 || free.is_empty() {
                    return Err(AllocError::Unsatisfiable {
                        claim: claim.to_string(),
                        request: request.name.clone(),
                        message: format!(
                            "asks for all devices of class {} on node {node}: {} free, {busy} allocated to other claims, {rest}",
                            exact.device_class_name,
                            free.len()
                        ),
                    });
                }
                let want = free.len();
                (free, want)
            }
            other => {
                return Err(invalid(
                    claim,
                    format!(
                        "request {:?}: unknown allocationMode {other:?}",
                        request.name
                    ),
                ));
            }
        };
        if !exhaustive {
            for id in options.iter().take(want) {
                match shares.get(id) {
                    Some(amounts) => left.take(id, amounts),
                    None => {
                        taken.insert(id.clone());
                    }
                }
            }
        }
        picks.push(Pick {
            request: &request.name,
            options: options
                .iter()
                .filter_map(|id| by_id.get(id).copied())
                .collect(),
            want,
            shares,
        });
        for c in class.spec.config.as_deref().unwrap_or_default() {
            config.push(DeviceAllocationConfiguration {
                source: "FromClass".to_string(),
                requests: Some(vec![request.name.clone()]),
                opaque: c.opaque.clone(),
            });
        }
    }
    let chosen = constraints::choose(&picks, &constraints, &room)
        .map_err(|why| constraints::unsatisfiable(claim, node, &picks, &constraints, why))?;
    let mut results = Vec::new();
    for (pick, ids) in picks.iter().zip(chosen) {
        for id in ids {
            let share = pick.shares.get(&id);
            results.push(capacity::result(pick.request, id, share));
        }
    }
    for c in devices.config.as_deref().unwrap_or_default() {
        config.push(DeviceAllocationConfiguration {
            source: "FromClaim".to_string(),
            requests: c.requests.clone(),
            opaque: c.opaque.clone(),
        });
    }
    Ok(AllocationResult {
        devices: Some(DeviceAllocationResult {
            results: Some(results),
            config: (!config.is_empty()).then_some(config),
        }),
        node_selector: Some(node_selector_for(node)),
        allocation_timestamp: None,
    })
}
