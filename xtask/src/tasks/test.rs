//! `cargo xtask test` (alias `ci`): setup, build, lint, then every test: unit tests in
//! parallel, the privileged binaries one at a time, each under a time limit (`privileged.rs`),
//! then the same binaries on Debian's 6.1 and 6.12 kernels in QEMU guests (`vmtest.rs`). This
//! is the README's test command and what `.ci/run` runs. At the end, passed or not, one table
//! of each phase's wall time (`phases.rs`).

use std::time::Instant;

use anyhow::bail;
use linkerd_cni_ebpf_build::{EBPF_PACKAGE, TENANT_OBJECT};

use crate::{
    build::{dist, ebpf::build_ebpf},
    exec::{cargo, nix_is_root, run},
    phases::Phases,
    privileged, setup,
    tasks::lint::lint,
    vmtest,
};

/// Runs the whole suite (`args` go to every `cargo test`), then prints the phases that ran.
pub fn test(args: &[String]) -> anyhow::Result<()> {
    let mut phases = Phases::default();
    let result = suite(args, &mut phases);
    eprintln!("xtask test: wall time of each phase\n{}", phases.table());
    result
}

fn suite(args: &[String], phases: &mut Phases) -> anyhow::Result<()> {
    let started = Instant::now();
    phases.run("setup", || setup::setup(false))?;
    phases.run("build-ebpf", build_ebpf)?;
    phases.run("lint", lint)?;
    if !nix_is_root() {
        bail!("the test suite exercises BPF, network namespaces and cgroups: run it as root");
    }
    phases.run("build", || {
        // Binaries the integration tests execute.
        run(cargo().args(["build", "--bins"]))?;
        // The plugin as shipped (replaces the one just built).
        dist::build_plugin(false).map(drop)
    })?;
    // Unprivileged and self-contained tests, in parallel.
    // (The eBPF crates only build for the BPF target; the privileged tests run below.)
    phases.run("unit", || {
        run(cargo()
            .args([
                "test",
                "--no-fail-fast",
                "--workspace",
                "--exclude",
                EBPF_PACKAGE,
                "--exclude",
                TENANT_OBJECT,
                "--exclude",
                "linkerd-cni-tests",
            ])
            .args(args))
    })?;
    // Privileged tests: real kernel state, one at a time, each binary time-limited;
    // then the same binaries on Debian's kernels in QEMU guests (`vmtest.rs`).
    let host = privileged::test(args, phases);
    host.and(vmtest::ci(args, started, phases))
}
