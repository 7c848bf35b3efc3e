//! The eBPF object, built by `linkerd-cni-ebpf-build` (Debian's rustc for `bpfel-unknown-none`
//! and bpf-linker): one object for every architecture, embedded in every agent.

use std::path::PathBuf;

use crate::exec::workspace;

/// Builds the eBPF object and returns its path.
pub fn build_ebpf() -> anyhow::Result<PathBuf> {
    linkerd_cni_ebpf_build::build(&workspace()).map_err(|e| anyhow::anyhow!("{e}"))
}
