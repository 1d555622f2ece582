//! Compiles `proto/` with protox (a pure-Rust protobuf compiler), so building needs no `protoc`.
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let files = [
        root.join("tickwire/v1/control.proto"),
        root.join("tickwire/v1/channel.proto"),
        root.join("tickwire/v1/spatial.proto"),
    ];
    for file in &files {
        println!("cargo:rerun-if-changed={}", file.display());
    }
    let descriptors = protox::compile(&files, [&root])?;
    prost_build::Config::new().bytes(["."]).compile_fds(descriptors)?;
    Ok(())
}
