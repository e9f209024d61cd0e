//! Compiles the vendored NRI and ttrpc protos with protox (no `protoc`).
//! Messages only: the services are served and called by hand over the
//! multiplexed ttrpc wire, not over gRPC.
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        PathBuf::from("proto/nri/api.proto"),
        PathBuf::from("proto/ttrpc/request.proto"),
    ];
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(&files, ["proto/nri", "proto/ttrpc"])?;
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(false)
        .compile_fds(fds)?;
    Ok(())
}
