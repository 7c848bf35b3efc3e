//! Project tasks, run as `cargo xtask <task>`: this file parses the command line and hands
//! each task to its module. The modules are layered, each using only those below it (the layers
//! test, `xtask/tests/layers.rs`, keeps it so): `tasks/`, `setup.rs`, `release.rs` → `vmtest.rs`,
//! `privileged.rs` → `build/` (image → dist → cross → musl → target, elf, ebpf) → `exec.rs`,
//! `phases.rs`.
//!
//! - `setup`: installs what builds and tests need on Debian/Ubuntu (idempotent).
//! - `build-ebpf`: builds the eBPF object.
//! - `demo`: setup, build, then the demo on a simulated node (root; see `tasks/demo.rs`).
//! - `bench [--quick] [--baseline-bins DIR]`: the benchmarks (see `tasks/bench.rs`).
//! - `dist [--out DIR] [--arch ARCH]`: the static agent and the static plugin, laid out as the
//!   DaemonSet's image holds them (see `build/dist.rs`, the one place the plugin's link flags
//!   are defined; `build/cross.rs` for the other architecture).
//! - `image [--out DIR] [--arch ARCH]`: the DaemonSet's image, OCI archives for linux/amd64 and
//!   linux/arm64, reproducible (see `build/image.rs`).
//! - `release [--out DIR] [--chart-url URL] [--without-arm64-run]`: `dist/` with the image archives, the packaged
//!   chart and its repository index, the static CLI for both architectures, SHA256SUMS (see
//!   `release.rs`); only for a commit with a recorded arm64 guest pass (`vmtest --arch arm64`).
//! - `cross-test [--arch arm64]`: the node-side crates' unit tests built for another
//!   architecture, run under qemu-user (see `build/cross.rs`).
//! - `vmtest [--arch arm64] --kernel 6.1|6.12|5.10|<image>`: the privileged tests in a QEMU guest
//!   on that kernel (arm64: the data-plane binaries built for aarch64, see `vmtest.rs`).
//! - `lint`: `cargo fmt --check` and clippy with warnings denied, host crates and the eBPF crate.
//! - `fuzz [--secs N] [--target NAME]`: every cargo-fuzz target of `fuzz/` for N seconds (60),
//!   one after another (see `tasks/fuzz.rs` and docs/developing/fuzzing.md).
//! - `test` (alias `ci`): setup, build, lint, then every test (unit in parallel, privileged one at a
//!   time, each binary under a time limit: see `privileged.rs`), then the privileged binaries
//!   again on Debian's 6.1 and 6.12 kernels in QEMU guests (`vmtest.rs`), then a table of each
//!   phase's wall time (see `tasks/test.rs`). This is the README's test command and what
//!   `.ci/run` runs.

mod build;
mod exec;
mod phases;
mod privileged;
mod release;
mod setup;
mod tasks;
mod vmtest;

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};

use crate::{
    build::{cross, dist, ebpf::build_ebpf, image, target::Arch},
    exec::workspace,
    tasks::{bench, demo, fuzz, lint::lint},
};

#[derive(Parser)]
#[command(about = "linkerd-cni project tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install the toolchain and test dependencies (apt packages, bpf-linker, pip tools, helm).
    Setup {
        /// Only what building the shipped binaries needs (e.g. the Dockerfile's build stage).
        #[arg(long)]
        build_only: bool,
    },
    /// Build the eBPF object (target bpfel-unknown-none).
    BuildEbpf,
    /// Set up, build, and run the demo on a simulated node (root).
    Demo,
    /// Check formatting and lints (rustfmt, clippy with warnings denied, the eBPF crate too).
    Lint,
    /// Run every fuzz target of `fuzz/` (cargo-fuzz, libFuzzer) for a while, one at a time.
    Fuzz {
        /// Seconds per target.
        #[arg(long, default_value_t = 60)]
        secs: u64,
        /// Only this target (repeatable).
        #[arg(long = "target")]
        only: Vec<String>,
    },
    /// Set up, build, and run the whole test suite (lints first).
    #[command(alias = "ci")]
    Test {
        /// Extra arguments for `cargo test` (e.g. a test name filter).
        #[arg(trailing_var_arg = true)]
        args: Vec<String>,
    },
    /// Build the shipped binaries (static agent, static plugin) into an image's file layout.
    Dist {
        /// Where to lay them out (`usr/local/bin/linkerd-cni-agent`, `opt/cni/bin/linkerd-cni`).
        #[arg(long, default_value = "target/dist")]
        out: PathBuf,
        /// The architecture to build for [default: this machine's].
        #[arg(long, value_enum)]
        arch: Option<Arch>,
    },
    /// Build the DaemonSet's image (linux/amd64 and linux/arm64) as OCI archives.
    Image {
        /// Where to write the archives.
        #[arg(long, default_value = "target/image")]
        out: PathBuf,
        /// Only these architectures (repeatable) [default: amd64 and arm64].
        #[arg(long, value_enum)]
        arch: Vec<Arch>,
    },
    /// Build a release into dist/: image archives, the packaged chart and its repository
    /// index, the static `linkerd` CLI for amd64 and arm64, SHA256SUMS.
    Release {
        /// Where to put it (emptied first).
        #[arg(long, default_value = "dist")]
        out: PathBuf,
        /// The URL the chart repository will be served from (`helm repo index --url`);
        /// without it, the index names the chart by a relative URL.
        #[arg(long)]
        chart_url: Option<String>,
        /// Release without a recorded pass of the arm64 binaries on an arm64 kernel
        /// (`cargo xtask vmtest --arch arm64 --kernel 6.12` on this commit records one).
        #[arg(long)]
        without_arm64_run: bool,
    },
    /// Build the unit tests of the node-side crates for another architecture and run them
    /// under qemu-user (not the privileged tests).
    CrossTest {
        /// The architecture to build and run them for.
        #[arg(long, value_enum, default_value = "arm64")]
        arch: Arch,
    },
    /// Build and run the benchmarks (ebpf vs iptables vs direct); writes BENCHMARKS.md (root).
    Bench {
        /// Short run, under two minutes.
        #[arg(long)]
        quick: bool,
        /// An earlier build's `target/release` (its `linkerd-cni-agent` and `linkerd-cni`):
        /// adds the mode `ebpf-baseline` and the "no regression" goal rows against it.
        #[arg(long)]
        baseline_bins: Option<PathBuf>,
    },
    /// Run the privileged test binaries on another kernel in a QEMU guest (root; see `vmtest.rs`).
    Vmtest {
        /// `6.1`, `6.12` or `5.10` (Debian's current package of that line), or a kernel image.
        #[arg(long)]
        kernel: String,
        /// The guest's architecture [default: this machine's]; another one runs under full
        /// emulation with a userland from Debian's packages, and by default only the
        /// data-plane binaries.
        #[arg(long, value_enum)]
        arch: Option<Arch>,
        /// Only this test binary (`tests/tests/<name>.rs`); repeatable.
        #[arg(long = "test")]
        only: Vec<String>,
        /// Extra arguments for each test binary (e.g. a test name filter).
        #[arg(trailing_var_arg = true)]
        args: Vec<String>,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().task {
        Task::Setup { build_only } => setup::setup(build_only),
        Task::Demo => demo::demo(),
        Task::Bench {
            quick,
            baseline_bins,
        } => bench::bench(quick, baseline_bins.as_deref()),
        Task::Vmtest {
            kernel,
            arch,
            only,
            args,
        } => {
            let arch = arch
                .or_else(Arch::host)
                .context("this machine's architecture is not one the release ships: give --arch")?;
            vmtest::vmtest(&kernel, arch, &only, &args)
        }
        Task::Dist { out, arch } => dist::dist(&workspace().join(out), arch),
        Task::CrossTest { arch } => cross::test_node_crates(arch),
        Task::Image { out, arch } => {
            let archs = if arch.is_empty() {
                Arch::ALL.to_vec()
            } else {
                arch
            };
            image::image(&workspace().join(out), &archs).map(drop)
        }
        Task::Release {
            out,
            chart_url,
            without_arm64_run,
        } => release::release(
            &workspace().join(out),
            chart_url.as_deref(),
            !without_arm64_run,
        ),
        Task::BuildEbpf => {
            let object = build_ebpf()?;
            println!("{}", object.display());
            Ok(())
        }
        Task::Fuzz { secs, only } => {
            setup::cargo_fuzz()?;
            fuzz::fuzz(secs, &only).map(drop)
        }
        Task::Lint => {
            build_ebpf()?;
            lint()
        }
        Task::Test { args } => tasks::test::test(&args),
    }
}
