//! `cargo xtask bench [--quick] [--baseline-bins DIR]`: builds the eBPF object and the release
//! binaries the benchmark drives (agent, CNI plugin, stand-in API server, benchmark), then runs
//! `linkerd-cni-bench run`, which writes `BENCHMARKS.md`, `tests/bench/results.json` and
//! `tests/bench/chart.svg` at the workspace root. With `--baseline-bins`, DIR holds an earlier build's
//! agent and plugin, measured beside ours (mode `ebpf-baseline`). Before the run it builds the
//! DaemonSet's image (`cargo xtask image` into `target/image`: every architecture, this
//! machine's only with `--quick`), whose archives' sizes the report gives (every per-architecture
//! archive found there); a failed image build is reported, not fatal. Needs root
//! (netns, cgroups, BPF).

use std::path::Path;

use anyhow::bail;

use crate::{
    build::{dist, ebpf::build_ebpf, image, target::Arch},
    exec::{cargo, nix_is_root, run, workspace},
};

/// Builds and runs the benchmark; with `baseline_bins`, against that earlier build's agent and
/// plugin too (`linkerd-cni-bench run --baseline-bins`).
pub fn bench(quick: bool, baseline_bins: Option<&Path>) -> anyhow::Result<()> {
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
    // The plugin exactly as shipped (see build/dist.rs).
    dist::build_plugin(true)?;
    // The image's archives, whose sizes the report gives (the bench reads them): every
    // architecture, or with --quick this machine's only (a cross build of the agent takes
    // minutes whenever its sources changed).
    let image_dir = workspace().join("target/image");
    let archs = match (quick, Arch::host()) {
        (true, Some(host)) => vec![host],
        _ => Arch::ALL.to_vec(),
    };
    if let Err(e) = image::image(&image_dir, &archs) {
        eprintln!("xtask bench: the image was not built, its sizes will be missing: {e:#}");
    }
    let mut command = String::from("cargo xtask bench");
    if quick {
        command.push_str(" --quick");
    }
    // The report names no machine path.
    if baseline_bins.is_some() {
        command.push_str(" --baseline-bins <an earlier build's target/release>");
    }
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
        &command,
        "--out-dir",
    ])
    .arg(workspace())
    .arg("--image-dir")
    .arg(&image_dir);
    if quick {
        cmd.arg("--quick");
    }
    if let Some(dir) = baseline_bins {
        // `cargo run` starts in the workspace: a relative directory means the caller's.
        cmd.arg("--baseline-bins").arg(std::path::absolute(dir)?);
    }
    run(&mut cmd)
}
