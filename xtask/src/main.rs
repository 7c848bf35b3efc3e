//! Project tasks, run as `cargo xtask <task>`:
//!
//! - `setup`: installs what builds and tests need on Debian/Ubuntu (idempotent).
//! - `build-ebpf`: builds the eBPF object.
//! - `demo`: setup, build, then the demo on a simulated node (root; see `demo.rs`).
//! - `bench [--quick] [--baseline-bins DIR]`: the benchmarks (see `bench.rs`).
//! - `dist [--out DIR] [--arch ARCH]`: the static agent and the static plugin, laid out as the
//!   DaemonSet's image holds them (see `dist.rs`, the one place the plugin's link flags are
//!   defined; `cross.rs` for the other architecture).
//! - `image [--out DIR] [--arch ARCH]`: the DaemonSet's image, OCI archives for linux/amd64 and
//!   linux/arm64, reproducible (see `image.rs`).
//! - `release [--out DIR] [--chart-url URL]`: `dist/` with the image archives, the packaged
//!   chart and its repository index, the static CLI for both architectures, SHA256SUMS (see
//!   `release.rs`).
//! - `cross-test [--arch arm64]`: the node-side crates' unit tests built for another
//!   architecture, run under qemu-user (see `cross.rs`).
//! - `vmtest --kernel 6.1|6.12|5.10|<image>`: the privileged tests in a QEMU guest on that kernel.
//! - `lint`: `cargo fmt --check` and clippy with warnings denied, host crates and the eBPF crate.
//! - `fuzz [--secs N] [--target NAME]`: every cargo-fuzz target of `fuzz/` for N seconds (60),
//!   one after another (see `fuzz.rs` and docs/developing/fuzzing.md).
//! - `test` (alias `ci`): setup, build, lint, then every test (unit in parallel, privileged one at a
//!   time, each binary under a time limit: see `privileged.rs`), then the privileged binaries
//!   again on Debian's 6.1 and 6.12 kernels in QEMU guests (`vmtest.rs`). This is the README's
//!   test command and what `.ci/run` runs.

mod bench;
mod cross;
mod demo;
mod dist;
mod fuzz;
mod image;
mod musl;
mod privileged;
mod release;
mod setup;
mod vmtest;

use std::{path::PathBuf, process::Command};

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};

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
        arch: Option<cross::Arch>,
    },
    /// Build the DaemonSet's image (linux/amd64 and linux/arm64) as OCI archives.
    Image {
        /// Where to write the archives.
        #[arg(long, default_value = "target/image")]
        out: PathBuf,
        /// Only these architectures (repeatable) [default: amd64 and arm64].
        #[arg(long, value_enum)]
        arch: Vec<cross::Arch>,
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
    },
    /// Build the unit tests of the node-side crates for another architecture and run them
    /// under qemu-user (not the privileged tests).
    CrossTest {
        /// The architecture to build and run them for.
        #[arg(long, value_enum, default_value = "arm64")]
        arch: cross::Arch,
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
        /// Only this test binary (`tests/tests/<name>.rs`); repeatable.
        #[arg(long = "test")]
        only: Vec<String>,
        /// Extra arguments for each test binary (e.g. a test name filter).
        #[arg(trailing_var_arg = true)]
        args: Vec<String>,
    },
}

/// The workspace root (xtask lives one level below it).
pub fn workspace() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(PathBuf::from).unwrap_or(manifest)
}

/// Runs a command, failing with its command line when it fails.
pub fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let line = format!("{cmd:?}");
    eprintln!("+ {line}");
    let status = cmd.status().with_context(|| format!("starting {line}"))?;
    if !status.success() {
        bail!("{line} failed: {status}");
    }
    Ok(())
}

fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(workspace());
    cmd
}

fn build_ebpf() -> anyhow::Result<PathBuf> {
    linkerd_cni_ebpf_build::build(&workspace()).map_err(|e| anyhow::anyhow!("{e}"))
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().task {
        Task::Setup { build_only } => setup::setup(build_only),
        Task::Demo => demo::demo(),
        Task::Bench {
            quick,
            baseline_bins,
        } => bench::bench(quick, baseline_bins.as_deref()),
        Task::Vmtest { kernel, only, args } => vmtest::vmtest(&kernel, &only, &args),
        Task::Dist { out, arch } => dist::dist(&workspace().join(out), arch),
        Task::CrossTest { arch } => cross::test_node_crates(arch),
        Task::Image { out, arch } => {
            let archs = if arch.is_empty() {
                cross::Arch::ALL.to_vec()
            } else {
                arch
            };
            image::image(&workspace().join(out), &archs).map(drop)
        }
        Task::Release { out, chart_url } => {
            release::release(&workspace().join(out), chart_url.as_deref())
        }
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
        Task::Test { args } => {
            let started = std::time::Instant::now();
            setup::setup(false)?;
            build_ebpf()?;
            lint()?;
            if !nix_is_root() {
                bail!(
                    "the test suite exercises BPF, network namespaces and cgroups: run it as root"
                );
            }
            // Binaries the integration tests execute.
            run(cargo().args(["build", "--bins"]))?;
            // The plugin as shipped (replaces the one just built).
            dist::build_plugin(false)?;
            // Unprivileged and self-contained tests, in parallel.
            // (The default members: the eBPF crate only builds for the BPF target.)
            run(cargo()
                .args([
                    "test",
                    "--no-fail-fast",
                    "--workspace",
                    "--exclude",
                    "linkerd-cni-ebpf",
                    "--exclude",
                    "linkerd-cni-tests",
                ])
                .args(&args))?;
            // Privileged tests: real kernel state, one at a time, each binary time-limited;
            // then the same binaries on Debian's kernels in QEMU guests (`vmtest.rs`).
            let host = privileged::test(&args);
            host.and(vmtest::ci(&args, started))
        }
    }
}

/// One formatting style and no lint warnings, checked before any test runs.
fn lint() -> anyhow::Result<()> {
    run(cargo().args(["fmt", "--all", "--check"]))?;
    // Every host crate; the eBPF crate only builds for the BPF target (below).
    run(cargo().args([
        "clippy",
        "--workspace",
        "--exclude",
        "linkerd-cni-ebpf",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    // The eBPF crate, with Debian's clippy for the BPF target.
    eprintln!("+ clippy for the eBPF crate (bpfel-unknown-none)");
    linkerd_cni_ebpf_build::clippy(&workspace()).map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}

fn nix_is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc_geteuid() == 0 }
}

unsafe extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}
