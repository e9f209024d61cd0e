//! Device-plugin slot allocator: which slot of which Instance this
//! node holds, for which pod, and what kubelet may be told.
//!
//! Each Instance is served as one device plugin with `capacity` devices, the
//! slots `<instance>-<n>`. kubelet's Allocate names device IDs only (no pod)
//! and there is no Deallocate, so [`SlotAllocator`] infers the slot↔pod map
//! ⟨slot, pod UID, since⟩ from kubelet pod resources and the pod watch, and
//! reclaims on the pod's own events. It is a pure state machine: the agent
//! feeds it inputs (with the time as [`Millis`](crate::Millis)), carries out
//! the returned [`Effect`]s in order, and answers kubelet from its queries.
//!
//! # Durability contract
//!
//! Two stores hold a node's claims: its local durable ledger and the cluster
//! (a record per slot with the claiming node, optimistic concurrency).
//!
//! * **Allocate** — [`SlotAllocator::allocate`] returns an [`AllocatePlan`]
//!   (or an [`AllocateError`], nothing changed). The adapter writes every
//!   claim of the plan to the local ledger, then, for [`Target::Both`], to
//!   the cluster as *create, or replace a record of this node* (never a
//!   record of another node). Then exactly one of:
//!   [`SlotAllocator::commit`] → answer Allocate OK;
//!   [`SlotAllocator::claim_conflict`] (another node holds a slot) or
//!   [`SlotAllocator::abort`] (any other failure) → answer with an error and
//!   carry out the returned effects (they undo the plan). **Allocate is
//!   never answered OK before `commit` returned `Ok`**, and `commit` is
//!   given the time of the answer. A plan still
//!   outstanding after `pending_timeout_ms` is rolled back on
//!   [`SlotAllocator::tick`]; its `commit` then fails.
//! * Right after answering OK the adapter queries kubelet pod resources
//!   (`List` or `Get`) and feeds [`SlotAllocator::podresources_listed`] /
//!   [`SlotAllocator::podresources_got`]: this binds the slots to the pod.
//!   While claims await attribution it keeps listing (backing off), and
//!   lists at [`SlotAllocator::next_settle`] so that a pending claim whose pod
//!   is already gone is released promptly (settle rule below).
//! * **Other effects** — [`Effect::WriteClaim`] and [`Effect::DeleteClaim`]
//!   are carried out in order, per slot in the order given; deletes are
//!   conditional on the epoch so a late delete never removes a newer claim.
//!   When the cluster part fails, call [`SlotAllocator::cluster_write_failed`];
//!   it is retried on the next tick or reconnect.
//! * **API server back** — list the cluster's claims and feed
//!   [`SlotAllocator::cluster_claims_listed`], then
//!   [`SlotAllocator::cluster_reachability`]`(true)`: queued writes come out as
//!   [`Target::Cluster`] effects, with epochs above any record listed.
//! * [`Effect::HealthChanged`] — send [`SlotAllocator::health`] of that
//!   Instance on its ListAndWatch stream.
//!
//! # Health
//!
//! A slot is Healthy iff its device is present and usable by this node and
//! no other node is known to claim it. Free slots and slots held here are
//! both Healthy: kubelet decides between them itself.
//!
//! # Allocate rules
//!
//! Each device ID must be a slot (`<instance>-<n>`, `n < capacity`) of a
//! known Instance ([`AllocateError::UnknownDevice`]) whose device is
//! available ([`AllocateError::DeviceGone`]) and that no other node holds
//! ([`AllocateError::HeldByOtherNode`]). While the API server is
//! unreachable the plan is [`Target::Local`]: unshared devices still
//! allocate from the local ledger and their claims are queued for the
//! cluster; shared devices fail closed
//! ([`AllocateError::ClusterUnreachable`]) unless this node already holds
//! the slot in the cluster (re-allocating it cannot take it from anyone).
//!
//! A slot this node already holds is allocated again without question:
//! kubelet only offers a device when it considers it free or reusable by the
//! same pod, so this is the same pod (kubelet retry, init then main
//! container — akri#843) or a pod kubelet already knows is gone. Every
//! allocated slot is marked *awaiting* (at the Allocate time) until a
//! pod-resources snapshot taken at or after that time shows which pod uses
//! it.
//!
//! # Reclaim rules
//!
//! Reclaim acts on the pod of the event only, at once, with no grace
//! period: other pods' states never delay it.
//!
//! * A pod **Deleted** or in a **terminal phase** (Succeeded/Failed), both
//!   handled: each slot it holds is freed ([`Effect::DeleteClaim`]), unless
//!   the slot is awaiting (it was allocated again after this pod was bound,
//!   possibly to the next pod): then the pod is dropped from the claim and
//!   the slot stays claimed, pending.
//! * A **pending** claim (no holder) still awaiting after
//!   `pending_timeout_ms` is freed; an awaiting claim with a (live) holder
//!   just stops awaiting.
//! * **Settle**: a pending claim (awaiting, no holder, Allocate answered) is
//!   freed at once by a full pod-resources `List` taken at least
//!   `settle_ms` after the Allocate was answered that mentions the slot
//!   nowhere. kubelet records a pod's devices when it receives the Allocate
//!   response and keeps them until the pod is removed, so such a list
//!   proves no pod on this node holds the slot (the pod was deleted before
//!   any snapshot attributed the slot to it). Any mention of the slot, by
//!   any pod in any state, keeps the claim: an entry naming a pod the watch
//!   has not delivered, or has seen terminate, may be a new pod of the same
//!   name, so it waits for the pod's events or the pending timeout as
//!   before. A `Get` (one pod) never releases anything.
//! * Pod resources bind: a snapshot taken at `t` naming a live pod for a
//!   slot makes that pod the holder if the claim is pending or was bound
//!   before `t` (older snapshots never override newer bindings), clears
//!   awaiting when `t` is not before it, and adopts slots kubelet has in use
//!   that this node has no claim for. Entries naming a pod the watch has not
//!   delivered yet wait for it (up to `pending_timeout_ms`).
//!
//! # The three allocate/delete orderings
//!
//! 1. *Allocate after the delete completed*: the slot is free, Allocate
//!    claims it anew.
//! 2. *Allocate while the delete is being processed*: calls are serialized
//!    (`&mut self`), so the delete has been applied in memory even if its
//!    [`Effect::DeleteClaim`] is not durable yet; Allocate claims the slot
//!    under a higher epoch and the late delete leaves the new claim alone.
//! 3. *Allocate before the delete* (akri#849: the last slot, pod A deleted,
//!    pod B scheduled onto it): the slot is still held by A, Allocate
//!    succeeds (B is admitted), the slot awaits attribution; pod resources
//!    then bind it to B, and A's later Deleted event finds the slot either
//!    bound to B or awaiting, and does not free it.
//!
//! # DRA ResourceClaims
//!
//! A slot is also a DRA device ([`crate::dra::device_name`]).
//! [`SlotAllocator::prepare`] claims slots for a ResourceClaim (kubelet's
//! NodePrepareResources) under the same plan/commit protocol as Allocate
//! and the same records, the hold naming the claim instead of a pod;
//! [`SlotAllocator::unprepare`] frees exactly those slots. A slot held on
//! either path is refused on the other, and a prepared slot reports
//! Unhealthy to the device plugins so kubelet's device manager never picks
//! it. Pod rules (events, pod resources, settle, timeouts) never touch a
//! prepared slot: it is held until kubelet unprepares the claim, which it
//! does after a restart too (it checkpoints a claim before preparing it).
//!
//! # Restart
//!
//! [`SlotAllocator::recover`] rebuilds the ledger from the local ledger, the
//! cluster's claims, pod resources and the pods listed now; see there.

mod model;
mod recover;
mod state;

pub use model::{
    AllocateError, AllocatePlan, Claim, ContainerDevices, ContainerResources, Effect, Health,
    InstanceInfo, PlanError, PlanId, PodInfo, PodPhase, PodResources, SlotConfig, Target,
    parse_slot_id, slot_id,
};
pub use recover::RecoveryInput;
pub use state::SlotAllocator;

#[cfg(test)]
mod dra_tests;
#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;
