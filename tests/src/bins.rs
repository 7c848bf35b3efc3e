//! Locating this crate's helper binaries (the test proxy and the test client) from integration
//! tests, benchmarks and demos.

use std::path::PathBuf;

use crate::error::{Error, Result};

/// The forwarding test proxy.
pub const PROXY: &str = "linkerd-cni-test-proxy";
/// The test client.
pub const CLIENT: &str = "linkerd-cni-test-client";
/// Overrides the directory the binaries are looked up in.
pub const BIN_DIR_ENV: &str = "LINKERD_CNI_TEST_BIN_DIR";

/// The path of helper binary `name`: in `$LINKERD_CNI_TEST_BIN_DIR` if set, else next to the
/// running executable (a binary in `target/<profile>/`) or one level up (an integration test
/// in `target/<profile>/deps/`). Cargo builds a package's binaries before its integration
/// tests, so `cargo test -p linkerd-cni-tests` always finds them.
pub fn bin_path(name: &str) -> Result<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(dir) = std::env::var_os(BIN_DIR_ENV) {
        dirs.push(PathBuf::from(dir));
    }
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(PathBuf::from))
    {
        if let Some(up) = dir.parent().filter(|_| dir.ends_with("deps")) {
            dirs.push(up.to_path_buf());
        }
        dirs.push(dir);
    }
    dirs.iter()
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            Error::Missing(format!(
                "{name} not found in {dirs:?}: run `cargo build -p linkerd-cni-tests --bins` \
                 or set {BIN_DIR_ENV}"
            ))
        })
}
