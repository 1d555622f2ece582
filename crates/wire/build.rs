//! Compiles `proto/` with protox (a pure-Rust protobuf compiler), so building needs no `protoc`.
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let file = root.join("tickwire/v1/control.proto");
    println!("cargo:rerun-if-changed={}", file.display());
    let descriptors = protox::compile([&file], [&root])?;
    prost_build::Config::new().bytes(["."]).compile_fds(descriptors)?;
    Ok(())
}
