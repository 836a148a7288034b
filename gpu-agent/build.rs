//! Compiles the kubelet's gRPC definitions in `proto/` with a pure-Rust toolchain: protox parses
//! them into a descriptor set and tonic-prost-build generates the messages, servers and clients.

use std::path::PathBuf;

const PROTOS: &[&str] = &[
    "pluginregistration/v1/api.proto",
    "dra/v1/api.proto",
    "dra/v1beta1/api.proto",
    "dra-health/v1alpha1/api.proto",
    "dra-health/v1/api.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../proto");
    let files: Vec<PathBuf> = PROTOS.iter().map(|p| dir.join(p)).collect();
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    let fds = protox::compile(&files, [&dir])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
