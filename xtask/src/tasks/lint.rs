//! `cargo xtask lint`: one formatting style and no lint warnings, checked before any test
//! runs (`cargo xtask test` starts with it).

use linkerd_cni_ebpf_build::{EBPF_PACKAGE, TENANT_OBJECT};

use crate::exec::{cargo, run, workspace};

/// `cargo fmt --check`, then clippy with warnings denied: every host crate, then the eBPF
/// crate for its target.
pub fn lint() -> anyhow::Result<()> {
    run(cargo().args(["fmt", "--all", "--check"]))?;
    // Every host crate; the eBPF crates only build for the BPF target (below).
    run(cargo().args([
        "clippy",
        "--workspace",
        "--exclude",
        EBPF_PACKAGE,
        "--exclude",
        TENANT_OBJECT,
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    // The eBPF crates, with Debian's clippy for the BPF target.
    eprintln!("+ clippy for the eBPF crates (bpfel-unknown-none)");
    linkerd_cni_ebpf_build::clippy(&workspace()).map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}
