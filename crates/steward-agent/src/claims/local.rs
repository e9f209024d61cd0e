//! The node-local claim table: this node's slot claims in the node store
//! (redb).

use steward_core::slots::Claim;

use super::{ClaimError, ClaimStore, ClaimWrite};
use crate::node_store::{ClaimPut, NodeStore};

/// Claims in the node's embedded store. Every write or delete is one redb
/// write transaction, durable (fsync'd) when it returns; the check of the
/// existing record (other node, higher epoch) and the write happen in that
/// same transaction. Blocking I/O runs on the blocking pool.
#[derive(Debug, Clone)]
pub struct LocalClaimStore {
    store: NodeStore,
}

impl LocalClaimStore {
    pub fn new(store: NodeStore) -> Self {
        Self { store }
    }

    async fn blocking<T: Send + 'static>(
        &self,
        what: &'static str,
        f: impl FnOnce(&NodeStore) -> Result<T, crate::StateError> + Send + 'static,
    ) -> Result<T, ClaimError> {
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || f(&store))
            .await
            .map_err(|e| ClaimError::Failed(format!("{what}: task failed: {e}")))?
            .map_err(|e| ClaimError::Failed(format!("{what}: {e}")))
    }
}

impl ClaimStore for LocalClaimStore {
    async fn write(&self, claim: &Claim) -> Result<ClaimWrite, ClaimError> {
        let claim = claim.clone();
        match self
            .blocking("storing slot claim", move |s| s.put_claim(&claim))
            .await?
        {
            ClaimPut::Stored => Ok(ClaimWrite::Written),
            ClaimPut::OtherNode(node) => Ok(ClaimWrite::HeldByOtherNode { node }),
        }
    }

    async fn delete(&self, slot: &str, node: &str, epoch: u64) -> Result<(), ClaimError> {
        let (slot, node) = (slot.to_owned(), node.to_owned());
        self.blocking("removing slot claim", move |s| {
            s.remove_claim(&slot, &node, epoch)
        })
        .await
        .map(|_| ())
    }

    async fn list(&self) -> Result<Vec<Claim>, ClaimError> {
        self.blocking("listing slot claims", NodeStore::claims)
            .await
    }
}
