//! The node's embedded store (a redb file in the state directory): persisted
//! handler registrations, in standalone mode the Instances, and the node's
//! slot claims (the claim table).
//!
//! The store carries its format in a meta table ([`FORMAT`]). A store from
//! before the marker (steward 0.1.0) holds format 1 and is stamped when
//! opened; a store of a newer format is refused untouched, since an older
//! agent skipping records it cannot decode would drop held slots.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition, TableHandle};
use steward_api::Instance;
use steward_core::discovery::HandlerKey;
use steward_core::slots::Claim;

use crate::error::StateError;

/// File name of the store inside the state directory.
pub const STATE_FILE: &str = "steward.redb";

/// Registrations: JSON-encoded [`HandlerKey`] → shared flag.
const REGISTRATIONS: TableDefinition<&str, bool> = TableDefinition::new("discovery_registrations");
/// Standalone Instances: `namespace/name` → JSON-encoded [`Instance`].
const INSTANCES: TableDefinition<&str, &str> = TableDefinition::new("instances");
/// The claim table, this node's slot claims: slot id → JSON-encoded
/// [`Claim`]. Created by the first claim write (read as empty before that).
const SLOT_CLAIMS: TableDefinition<&str, &str> = TableDefinition::new("slot_claims");

/// Meta table: `"format"` → the store's format.
const META: TableDefinition<&str, u64> = TableDefinition::new("steward_meta");
/// Key of the format in [`META`].
const FORMAT_KEY: &str = "format";

/// The format this build writes and reads. Bump it when a table or the
/// encoding of a record changes, add a fixture written by the release
/// before (tests/fixtures/node-store) and a migration step to [`migrate`].
pub const FORMAT: u64 = 1;

/// Outcome of [`NodeStore::put_claim`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimPut {
    /// The claim was stored (or a newer record of the same node was kept).
    Stored,
    /// A record of another node holds the slot; nothing was written.
    OtherNode(String),
}

/// Handle to the node store; clones share one open database.
#[derive(Clone, Debug)]
pub struct NodeStore {
    db: Arc<Database>,
    path: PathBuf,
}

impl NodeStore {
    /// Open (or create) the store in `dir`.
    pub fn open(dir: &Path) -> Result<Self, StateError> {
        let path = dir.join(STATE_FILE);
        let db = Database::create(&path).map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => StateError::Busy { path: path.clone() },
            e => StateError::Open {
                path: path.clone(),
                message: e.to_string(),
            },
        })?;
        let txn = db
            .begin_write()
            .map_err(|e| StateError::db("begin write", e))?;
        // Dropping `txn` on an error aborts it: a refused store is untouched.
        migrate(&txn, &path)?;
        txn.open_table(REGISTRATIONS)
            .map_err(|e| StateError::db("open registrations table", e))?;
        txn.open_table(INSTANCES)
            .map_err(|e| StateError::db("open instances table", e))?;
        txn.commit().map_err(|e| StateError::db("commit", e))?;
        Ok(Self {
            db: Arc::new(db),
            path,
        })
    }

    /// Like [`NodeStore::open`], but while another handle holds the store
    /// (a previous agent still stopping) waits, up to `max_wait`, instead of
    /// failing at once.
    pub async fn open_waiting(
        dir: &Path,
        max_wait: std::time::Duration,
    ) -> Result<Self, StateError> {
        let deadline = tokio::time::Instant::now() + max_wait;
        let mut pause = std::time::Duration::from_millis(20);
        let mut warned = false;
        loop {
            match Self::open(dir) {
                Err(StateError::Busy { path }) if tokio::time::Instant::now() < deadline => {
                    if !warned {
                        tracing::warn!(path = %path.display(), ?max_wait, "the node store is held by another steward agent; waiting for it to stop");
                        warned = true;
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(std::time::Duration::from_secs(1));
                }
                other => return other,
            }
        }
    }

    /// The format recorded in the store ([`FORMAT`] once opened).
    pub fn format(&self) -> Result<Option<u64>, StateError> {
        let txn = self
            .db
            .begin_read()
            .map_err(|e| StateError::db("begin read", e))?;
        let meta = match txn.open_table(META) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(StateError::db("open meta table", e)),
        };
        Ok(meta
            .get(FORMAT_KEY)
            .map_err(|e| StateError::db("read format", e))?
            .map(|g| g.value()))
    }

    /// Path of the store file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Persisted registrations, in key order. Undecodable entries are skipped with a warning.
    pub fn registrations(&self) -> Result<Vec<(HandlerKey, bool)>, StateError> {
        let txn = self
            .db
            .begin_read()
            .map_err(|e| StateError::db("begin read", e))?;
        let table = txn
            .open_table(REGISTRATIONS)
            .map_err(|e| StateError::db("open registrations table", e))?;
        let mut out = Vec::new();
        for entry in table
            .iter()
            .map_err(|e| StateError::db("iterate registrations", e))?
        {
            let (k, v) = entry.map_err(|e| StateError::db("read registration", e))?;
            match serde_json::from_str::<HandlerKey>(k.value()) {
                Ok(key) => out.push((key, v.value())),
                Err(e) => {
                    tracing::warn!(entry = k.value(), error = %e, "skipping undecodable persisted registration")
                }
            }
        }
        Ok(out)
    }

    /// Persist a registration (replacing an earlier one for the same key).
    pub fn put_registration(&self, key: &HandlerKey, shared: bool) -> Result<(), StateError> {
        let k = encode_key(key)?;
        self.write(|txn| {
            let mut t = txn.open_table(REGISTRATIONS)?;
            t.insert(k.as_str(), shared)?;
            Ok(())
        })
    }

    /// Forget a registration.
    pub fn remove_registration(&self, key: &HandlerKey) -> Result<(), StateError> {
        let k = encode_key(key)?;
        self.write(|txn| {
            let mut t = txn.open_table(REGISTRATIONS)?;
            t.remove(k.as_str())?;
            Ok(())
        })
    }

    /// Every stored Instance, in `namespace/name` order.
    pub fn instances(&self) -> Result<Vec<Instance>, StateError> {
        let txn = self
            .db
            .begin_read()
            .map_err(|e| StateError::db("begin read", e))?;
        let table = txn
            .open_table(INSTANCES)
            .map_err(|e| StateError::db("open instances table", e))?;
        let mut out = Vec::new();
        for entry in table
            .iter()
            .map_err(|e| StateError::db("iterate instances", e))?
        {
            let (k, v) = entry.map_err(|e| StateError::db("read instance", e))?;
            match serde_json::from_str::<Instance>(v.value()) {
                Ok(inst) => out.push(inst),
                Err(e) => {
                    tracing::warn!(entry = k.value(), error = %e, "skipping undecodable stored instance")
                }
            }
        }
        Ok(out)
    }

    /// Store (create or replace) an Instance.
    pub fn put_instance(&self, instance: &Instance) -> Result<(), StateError> {
        let k = instance_key(
            instance.metadata.namespace.as_deref().unwrap_or_default(),
            instance.metadata.name.as_deref().unwrap_or_default(),
        );
        let v = serde_json::to_string(instance).map_err(|source| StateError::Encode {
            what: "instance",
            source,
        })?;
        self.write(|txn| {
            let mut t = txn.open_table(INSTANCES)?;
            t.insert(k.as_str(), v.as_str())?;
            Ok(())
        })
    }

    /// Remove an Instance; no-op if absent.
    pub fn remove_instance(&self, namespace: &str, name: &str) -> Result<(), StateError> {
        let k = instance_key(namespace, name);
        self.write(|txn| {
            let mut t = txn.open_table(INSTANCES)?;
            t.remove(k.as_str())?;
            Ok(())
        })
    }

    /// Every stored slot claim, in slot order. Undecodable entries are
    /// skipped with a warning.
    pub fn claims(&self) -> Result<Vec<Claim>, StateError> {
        let txn = self
            .db
            .begin_read()
            .map_err(|e| StateError::db("begin read", e))?;
        let table = match txn.open_table(SLOT_CLAIMS) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(StateError::db("open slot claims table", e)),
        };
        let mut out = Vec::new();
        for entry in table
            .iter()
            .map_err(|e| StateError::db("iterate slot claims", e))?
        {
            let (k, v) = entry.map_err(|e| StateError::db("read slot claim", e))?;
            match serde_json::from_str::<Claim>(v.value()) {
                Ok(claim) => out.push(claim),
                Err(e) => {
                    tracing::warn!(entry = k.value(), error = %e, "skipping undecodable stored slot claim")
                }
            }
        }
        Ok(out)
    }

    /// Store `claim` in one durable transaction, unless the slot is held by
    /// another node ([`ClaimPut::OtherNode`]) or by a record of the same
    /// node with a higher epoch (kept; [`ClaimPut::Stored`]).
    pub fn put_claim(&self, claim: &Claim) -> Result<ClaimPut, StateError> {
        let v = serde_json::to_string(claim).map_err(|source| StateError::Encode {
            what: "slot claim",
            source,
        })?;
        let mut outcome = ClaimPut::Stored;
        self.write(|txn| {
            let mut t = txn.open_table(SLOT_CLAIMS)?;
            let existing = t
                .get(claim.slot())?
                .and_then(|g| serde_json::from_str::<Claim>(g.value()).ok());
            match existing {
                Some(old) if old.node != claim.node => outcome = ClaimPut::OtherNode(old.node),
                Some(old) if old.epoch > claim.epoch => {}
                _ => {
                    t.insert(claim.slot(), v.as_str())?;
                }
            }
            Ok(())
        })?;
        Ok(outcome)
    }

    /// Remove `node`'s claim on `slot` if its epoch is at most `epoch`, in
    /// one durable transaction. Returns whether a record was removed.
    pub fn remove_claim(&self, slot: &str, node: &str, epoch: u64) -> Result<bool, StateError> {
        let mut removed = false;
        self.write(|txn| {
            let mut t = txn.open_table(SLOT_CLAIMS)?;
            let existing = t
                .get(slot)?
                .map(|g| serde_json::from_str::<Claim>(g.value()));
            let remove = match existing {
                None => false,
                Some(Ok(old)) => old.node == node && old.epoch <= epoch,
                // an undecodable record cannot be checked; it is dropped so a
                // corrupt entry never pins a slot
                Some(Err(_)) => true,
            };
            if remove {
                t.remove(slot)?;
                removed = true;
            }
            Ok(())
        })?;
        Ok(removed)
    }

    fn write(
        &self,
        f: impl FnOnce(&redb::WriteTransaction) -> Result<(), redb::Error>,
    ) -> Result<(), StateError> {
        let txn = self
            .db
            .begin_write()
            .map_err(|e| StateError::db("begin write", e))?;
        f(&txn).map_err(|e| StateError::db("write", e))?;
        txn.commit().map_err(|e| StateError::db("commit", e))
    }
}

/// Reads the store's format and brings it to [`FORMAT`] inside `txn`.
fn migrate(txn: &redb::WriteTransaction, path: &Path) -> Result<(), StateError> {
    let mut meta = txn
        .open_table(META)
        .map_err(|e| StateError::db("open meta table", e))?;
    let found = meta
        .get(FORMAT_KEY)
        .map_err(|e| StateError::db("read format", e))?
        .map(|g| g.value());
    match found {
        Some(FORMAT) => return Ok(()),
        Some(found) if found > FORMAT => {
            return Err(StateError::NewerFormat {
                path: path.to_path_buf(),
                found,
                supported: FORMAT,
            });
        }
        Some(found) => {
            // No format before 1 was ever written with a marker.
            return Err(StateError::UnknownFormat {
                path: path.to_path_buf(),
                found,
            });
        }
        None => {}
    }
    let populated = txn
        .list_tables()
        .map_err(|e| StateError::db("list tables", e))?
        .any(|t| t.name() != META.name());
    if populated {
        // Written before the marker existed: steward 0.1.0, whose tables
        // and records are format 1.
        tracing::info!(path = %path.display(), format = FORMAT, "node store from before format markers (steward 0.1.0); stamped");
    }
    meta.insert(FORMAT_KEY, FORMAT)
        .map_err(|e| StateError::db("write format", e))?;
    Ok(())
}

fn encode_key(key: &HandlerKey) -> Result<String, StateError> {
    serde_json::to_string(key).map_err(|source| StateError::Encode {
        what: "handler key",
        source,
    })
}

fn instance_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use steward_core::discovery::Endpoint;

    #[tokio::test]
    async fn a_held_store_is_waited_for_then_opened() {
        let dir = tempfile::tempdir().unwrap();
        let held = NodeStore::open(dir.path()).unwrap();
        // Held for longer than the wait: a clear Busy error.
        let err = NodeStore::open_waiting(dir.path(), std::time::Duration::from_millis(100))
            .await
            .unwrap_err();
        assert!(matches!(err, StateError::Busy { .. }), "{err}");
        // Released while waiting: opened.
        let release = tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            drop(held);
        });
        let opened = NodeStore::open_waiting(dir.path(), std::time::Duration::from_secs(10)).await;
        release.await.unwrap();
        assert!(opened.is_ok(), "{:?}", opened.err());
    }

    #[test]
    fn registrations_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let a = HandlerKey {
            name: "debug-echo".into(),
            endpoint: Endpoint::Uds("/tmp/x.sock".into()),
        };
        let b = HandlerKey {
            name: "udev".into(),
            endpoint: Endpoint::Network("http://127.0.0.1:1".into()),
        };
        {
            let s = NodeStore::open(dir.path()).unwrap();
            s.put_registration(&a, true).unwrap();
            s.put_registration(&b, false).unwrap();
            s.remove_registration(&b).unwrap();
        }
        let s = NodeStore::open(dir.path()).unwrap();
        assert_eq!(s.registrations().unwrap(), vec![(a, true)]);
    }
}
