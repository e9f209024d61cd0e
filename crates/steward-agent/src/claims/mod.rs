//! Durable slot claims: where the slot ledger's `WriteClaim` / `DeleteClaim`
//! effects are made durable, in the node's embedded store and in the cluster.
//!
//! The contract comes from `steward_core::slots::Effect`: a cluster write
//! succeeds only if the slot is unclaimed or claimed by this node, and never
//! replaces a record of this node with a higher epoch; a delete removes this
//! node's record only if its epoch is at most the one given.
//!
//! # Stores
//!
//! * [`LocalClaimStore`] — the node's claim table: a table of the node
//!   store, each write one fsync'd redb transaction.
//! * [`KubeClaimStore`] — the cluster: one `SlotClaim` object per slot,
//!   named after the slot, in the Instance's namespace (see [`kube`] for
//!   the write protocol and garbage collection; the [`InstanceDirectory`]
//!   says where each Instance lives), and [`watch_claims`] to learn other
//!   nodes' claims.
//!
//! The measured alternative — claims as usage entries in
//! `Instance.status.slots` — lives with the benchmark that compares the two
//! (`benches/support/instance_status.rs`); the agent does not ship it.

mod instances;
pub mod kube;
mod local;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};

use steward_core::slots::Claim;

pub use self::kube::{ClaimEvent, InstanceDirectory, InstanceRef, KubeClaimStore, watch_claims};
pub use local::LocalClaimStore;

/// Default bound on conflicting attempts (409 → re-read → retry) of one
/// cluster write or delete.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 16;

/// Outcome of a claim write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimWrite {
    /// The claim is durable.
    Written,
    /// Another node holds the slot; nothing was written.
    HeldByOtherNode { node: String },
}

/// Errors of a claim store.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// The store cannot be reached (API server down, ...): the caller treats
    /// the cluster as unreachable.
    #[error("claim store unreachable: {0}")]
    Unreachable(String),
    /// The claim's Instance is not in the cluster (its device is offline
    /// while the slot is still held): the record cannot be owned by it yet.
    /// The caller retries; the write succeeds once the Instance is back.
    #[error("claim store has no Instance for the claim: {0}")]
    NoInstance(String),
    /// Anything else, with context.
    #[error("claim store failed: {0}")]
    Failed(String),
}

/// A place claims are kept: the node's embedded store or the cluster.
pub trait ClaimStore: Send + Sync + 'static {
    /// Create or replace this node's claim (see the module contract).
    fn write(&self, claim: &Claim) -> impl Future<Output = Result<ClaimWrite, ClaimError>> + Send;
    /// Remove `node`'s claim on `slot` if its epoch is at most `epoch`.
    fn delete(
        &self,
        slot: &str,
        node: &str,
        epoch: u64,
    ) -> impl Future<Output = Result<(), ClaimError>> + Send;
    /// Every claim this store holds (all nodes, for the cluster).
    fn list(&self) -> impl Future<Output = Result<Vec<Claim>, ClaimError>> + Send;
}

/// Requests a cluster claim store issued and the optimistic-concurrency
/// failures it met, since it was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClaimStoreStats {
    /// GET / LIST requests.
    pub reads: u64,
    /// Create requests.
    pub creates: u64,
    /// Replace (update) requests.
    pub replaces: u64,
    /// Delete requests.
    pub deletes: u64,
    /// Creates answered 409 AlreadyExists.
    pub already_exists: u64,
    /// Replaces or deletes answered 409 Conflict (stale resourceVersion).
    pub conflicts: u64,
}

impl ClaimStoreStats {
    /// Write requests (create, replace, delete), whatever their outcome.
    pub fn writes(&self) -> u64 {
        self.creates + self.replaces + self.deletes
    }

    /// All 409 answers.
    pub fn all_conflicts(&self) -> u64 {
        self.already_exists + self.conflicts
    }
}

/// Write counters of a claim store (what [`ClaimStore::stats`] reports).
#[derive(Debug, Default)]
pub struct Counters {
    reads: AtomicU64,
    creates: AtomicU64,
    replaces: AtomicU64,
    deletes: AtomicU64,
    already_exists: AtomicU64,
    conflicts: AtomicU64,
}

/// One counted API request of a claim store.
#[derive(Debug, Clone, Copy)]
pub enum Count {
    /// A get or list.
    Read,
    /// A create.
    Create,
    /// A replace.
    Replace,
    /// A delete.
    Delete,
    /// A create answered 409 AlreadyExists.
    AlreadyExists,
    /// A replace or delete answered 409 Conflict.
    Conflict,
}

impl Counters {
    /// Counts one request.
    pub fn add(&self, what: Count) {
        let c = match what {
            Count::Read => &self.reads,
            Count::Create => &self.creates,
            Count::Replace => &self.replaces,
            Count::Delete => &self.deletes,
            Count::AlreadyExists => &self.already_exists,
            Count::Conflict => &self.conflicts,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// The counts so far.
    pub fn snapshot(&self) -> ClaimStoreStats {
        ClaimStoreStats {
            reads: self.reads.load(Ordering::Relaxed),
            creates: self.creates.load(Ordering::Relaxed),
            replaces: self.replaces.load(Ordering::Relaxed),
            deletes: self.deletes.load(Ordering::Relaxed),
            already_exists: self.already_exists.load(Ordering::Relaxed),
            conflicts: self.conflicts.load(Ordering::Relaxed),
        }
    }
}

/// Maps a Kubernetes client error: server-side unavailability (5xx, 429)
/// and transport failures are [`ClaimError::Unreachable`], everything else
/// (4xx, decoding) is [`ClaimError::Failed`].
pub fn api_error(op: &str, name: &str, e: ::kube::Error) -> ClaimError {
    let unreachable = match &e {
        ::kube::Error::Api(s) => s.code >= 500 || s.code == 429,
        ::kube::Error::HyperError(_) | ::kube::Error::Service(_) | ::kube::Error::ReadEvents(_) => {
            true
        }
        _ => false,
    };
    let message = format!("{op} {name}: {e}");
    if unreachable {
        ClaimError::Unreachable(message)
    } else {
        ClaimError::Failed(message)
    }
}
