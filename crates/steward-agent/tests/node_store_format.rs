//! The node store's format across releases: a store written by each earlier
//! release (tests/fixtures/node-store, written by that release's code) opens
//! with today's code and reads back every registration, Instance and slot
//! claim unchanged; a store of a newer format is refused, untouched.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde_json::Value;
use steward_agent::StateError;
use steward_agent::node_store::{FORMAT, NodeStore, STATE_FILE};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/node-store")
        .join(name)
}

/// A copy of a fixture as the state directory's store.
fn state_dir_with(fixture_file: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(fixture(fixture_file), dir.path().join(STATE_FILE)).unwrap();
    dir
}

fn expected(json: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture(json)).unwrap()).unwrap()
}

/// Everything the store holds, in the fixture JSON's shape.
fn contents(store: &NodeStore) -> Value {
    let registrations: Vec<Value> = store
        .registrations()
        .unwrap()
        .into_iter()
        .map(|(k, shared)| serde_json::json!([k, shared]))
        .collect();
    serde_json::json!({
        "registrations": registrations,
        "instances": store.instances().unwrap(),
        "claims": store.claims().unwrap(),
    })
}

#[test]
fn a_store_written_by_0_1_0_reads_back_whole_and_is_stamped() {
    let dir = state_dir_with("v0.1.0.redb");
    let want = expected("v0.1.0.json");
    // 0.1.0 wrote no marker.
    {
        let db = Database::open(dir.path().join(STATE_FILE)).unwrap();
        let txn = db.begin_read().unwrap();
        let meta: TableDefinition<&str, u64> = TableDefinition::new("steward_meta");
        assert!(
            txn.open_table(meta).is_err(),
            "the fixture must be unmarked, as 0.1.0 wrote it"
        );
    }
    let store = NodeStore::open(dir.path()).unwrap();
    assert_eq!(contents(&store), want);
    assert_eq!(store.format().unwrap(), Some(FORMAT));
    // Claims still answer the ledger's questions after the upgrade: the
    // held slots are held.
    let slots: Vec<String> = store
        .claims()
        .unwrap()
        .iter()
        .map(|c| c.slot().to_owned())
        .collect();
    assert_eq!(
        slots,
        ["camera-5f2a1c-0", "camera-5f2a1c-1", "serial-0b9e77-0"]
    );
    drop(store);
    // Opened again (a second restart): the same, still format 1.
    let store = NodeStore::open(dir.path()).unwrap();
    assert_eq!(contents(&store), want);
    assert_eq!(store.format().unwrap(), Some(FORMAT));
}

#[test]
fn a_new_store_is_created_marked() {
    let dir = tempfile::tempdir().unwrap();
    let store = NodeStore::open(dir.path()).unwrap();
    assert_eq!(store.format().unwrap(), Some(FORMAT));
    assert_eq!(
        contents(&store),
        serde_json::json!({"registrations": [], "instances": [], "claims": []})
    );
}

/// Every record of every table, as `table key value` lines, read with redb
/// directly (not through the code under test).
fn raw(dir: &Path) -> String {
    let db = Database::open(dir.join(STATE_FILE)).unwrap();
    let txn = db.begin_read().unwrap();
    let mut out = String::new();
    let strings = ["instances", "slot_claims"];
    for name in strings {
        let t = txn
            .open_table(TableDefinition::<&str, &str>::new(name))
            .unwrap();
        for e in t.iter().unwrap() {
            let (k, v) = e.unwrap();
            out += &format!("{name} {} {}\n", k.value(), v.value());
        }
    }
    let t = txn
        .open_table(TableDefinition::<&str, bool>::new(
            "discovery_registrations",
        ))
        .unwrap();
    for e in t.iter().unwrap() {
        let (k, v) = e.unwrap();
        out += &format!("discovery_registrations {} {}\n", k.value(), v.value());
    }
    let t = txn
        .open_table(TableDefinition::<&str, u64>::new("steward_meta"))
        .unwrap();
    for e in t.iter().unwrap() {
        let (k, v) = e.unwrap();
        out += &format!("steward_meta {} {}\n", k.value(), v.value());
    }
    out
}

/// Marks the store at `dir` with `format`, as a later release would.
fn mark(dir: &Path, format: u64) {
    let db = Database::open(dir.join(STATE_FILE)).unwrap();
    let txn = db.begin_write().unwrap();
    {
        let meta: TableDefinition<&str, u64> = TableDefinition::new("steward_meta");
        let mut t = txn.open_table(meta).unwrap();
        t.insert("format", format).unwrap();
    }
    txn.commit().unwrap();
}

#[test]
fn a_store_of_a_newer_format_is_refused_and_left_untouched() {
    let dir = state_dir_with("v0.1.0.redb");
    mark(dir.path(), FORMAT + 1);
    let before = raw(dir.path());
    let err = NodeStore::open(dir.path()).unwrap_err();
    match &err {
        StateError::NewerFormat {
            found, supported, ..
        } => {
            assert_eq!((*found, *supported), (FORMAT + 1, FORMAT));
        }
        other => panic!("expected NewerFormat, got {other:?}"),
    }
    let text = err.to_string();
    assert!(
        text.contains(&format!("format {}", FORMAT + 1)) && text.contains("docs/UPGRADES.md"),
        "{text}"
    );
    let after = raw(dir.path());
    assert!(after == before, "a refused store must not be written");
    assert!(after.contains(&format!("steward_meta format {}", FORMAT + 1)));
}

#[test]
fn a_format_no_release_wrote_is_refused() {
    let dir = state_dir_with("v0.1.0.redb");
    mark(dir.path(), 0);
    let err = NodeStore::open(dir.path()).unwrap_err();
    assert!(
        matches!(err, StateError::UnknownFormat { found: 0, .. }),
        "{err:?}"
    );
}
