//! Regenerates the sysfs fixture trees under `fixtures/` (or under the
//! directory given as the first argument):
//!
//! `cargo run -p steward-topology --example gen_fixtures`
//!
//! The `fixtures_match_generator` test fails when the committed trees drift
//! from what this writes.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures"));
    for (name, topo) in steward_topology::fixture::fixture_specs()? {
        let dir = out.join(name);
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        steward_topology::fixture::write_sysfs(&dir, &topo)?;
        println!("wrote {}", dir.display());
    }
    Ok(())
}
