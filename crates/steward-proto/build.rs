//! Compiles the vendored protos with protox (no `protoc` needed).
//!
//! Upstream reuses bare package names: pod resources and DRA resource health
//! v1 are both `package v1`. prost writes one file per package, so each such
//! proto is compiled on its own into a subdirectory of `OUT_DIR` (see
//! [`SEPARATE`]) and included from there, keeping the Rust modules apart
//! while the wire names stay upstream's.
use std::path::{Path, PathBuf};

/// Protos compiled on their own, and the `OUT_DIR` subdirectory each goes to.
const SEPARATE: &[(&str, &str)] = &[("dra-health/v1/api.proto", "dra_health_v1")];

fn collect(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "proto") {
            out.push(path);
        }
    }
    Ok(())
}

fn compile(files: &[PathBuf], root: &Path, out: &Path) -> Result<(), Box<dyn std::error::Error>> {
    std::fs::create_dir_all(out)?;
    let fds = protox::compile(files, [root])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .out_dir(out)
        .compile_fds(fds)?;
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from("proto");
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let mut files = Vec::new();
    collect(&root, &mut files)?;
    files.sort();
    println!("cargo:rerun-if-changed=proto");
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    let separate: Vec<PathBuf> = SEPARATE.iter().map(|(f, _)| root.join(f)).collect();
    let shared: Vec<PathBuf> = files
        .iter()
        .filter(|f| !separate.contains(f))
        .cloned()
        .collect();
    compile(&shared, &root, &out)?;
    for ((_, dir), file) in SEPARATE.iter().zip(&separate) {
        compile(std::slice::from_ref(file), &root, &out.join(dir))?;
    }
    Ok(())
}
