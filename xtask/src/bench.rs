//! `cargo xtask bench [--quick]`: builds the eBPF object and the release binaries the
//! benchmark drives (agent, CNI plugin, stand-in API server, benchmark), then runs `linkerd-cni-bench run`, which
//! writes `BENCHMARKS.md`, `bench/results.json` and `bench/chart.svg` at the workspace root.
//! Needs root (netns, cgroups, BPF).

use anyhow::bail;

use crate::{build_ebpf, cargo, nix_is_root, run, workspace};

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
    // The plugin exactly as shipped (see dist.rs).
    crate::dist::build_plugin(true)?;
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
