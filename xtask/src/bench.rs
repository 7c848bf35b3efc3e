//! `cargo xtask bench [--quick]`: builds the eBPF object and the release binaries the
//! benchmark drives (agent, CNI plugin, stand-in API server, benchmark), then runs `linkerd-cni-bench run`, which
//! writes `BENCHMARKS.md`, `bench/results.json` and `bench/chart.svg` at the workspace root.
//! Needs root (netns, cgroups, BPF).

use anyhow::bail;

use crate::{build_ebpf, cargo, nix_is_root, run, workspace};

/// The CNI plugin as it is shipped: statically linked, not position-independent. A runtime
/// spawns it for every pod, and on a VM each page fault at start-up costs microseconds: the
/// dynamic loader's work and a PIE's relocations doubled its spawn-to-exit time. (Static,
/// not PIE: the flags apply to the final link only, so every dependency is built as for the
/// rest of the workspace.)
pub fn build_plugin_release() -> anyhow::Result<()> {
    run(cargo().args([
        "rustc",
        "--release",
        "-p",
        "linkerd-cni-plugin",
        "--bin",
        "linkerd-cni",
        "--",
        "-C",
        "target-feature=+crt-static",
        "-C",
        "relocation-model=static",
    ]))
}

/// Builds and runs the benchmark.
pub fn bench(quick: bool) -> anyhow::Result<()> {
    if !nix_is_root() {
        bail!("the benchmark creates netns, cgroups and BPF programs: run it as root");
    }
    build_ebpf()?;
    run(cargo().args([
        "build",
        "--release",
        "-p",
        "linkerd-cni-agent",
        "-p",
        "linkerd-cni-bench",
        // Scenario 8's containerd node serves its pods from the stand-in API server process.
        "-p",
        "linkerd-cni-fake-apiserver",
        "--bins",
    ]))?;
    build_plugin_release()?;
    let command = if quick {
        "cargo xtask bench --quick"
    } else {
        "cargo xtask bench"
    };
    let mut cmd = cargo();
    cmd.args([
        "run",
        "--release",
        "-q",
        "-p",
        "linkerd-cni-bench",
        "--",
        "run",
        "--command",
        command,
        "--out-dir",
    ])
    .arg(workspace());
    if quick {
        cmd.arg("--quick");
    }
    run(&mut cmd)
}
