//! Builds the eBPF object (`ebpf/`, target `bpfel-unknown-none`), and beside it the stand-in
//! tenant's object the coexistence tests load (`tests/tenant-ebpf/`, never shipped).
//!
//! Used by `cargo xtask build-ebpf` and by the agent's build script, so `cargo build` of the
//! agent builds the object it embeds, or fails with one line naming the command to run.
//!
//! The rustup toolchains here have no `rust-src`, so the object is built with Debian's
//! `rustc-web` (`/usr/bin/rustc`, which ships a prebuilt `core` for the BPF targets in
//! `libstd-rust-web-dev-bpf`) and linked by `bpf-linker` built against the same LLVM.
//!
//! [`clippy`] lints the eBPF crate for the same target with the same compiler: rustup's clippy
//! cannot (no `core` for BPF, and a different compiler version), Debian's `rust-web-clippy`,
//! built from the same sources as `rustc-web`, can.

#![forbid(unsafe_code)]

use std::{
    env, fmt,
    path::{Path, PathBuf},
    process::Command,
};

/// Package name of the eBPF crate.
pub const EBPF_PACKAGE: &str = "linkerd-cni-ebpf";
/// The stand-in tenant's package and object (a socket load balancer for the coexistence
/// tests, `tests/tenant-ebpf/`), built next to the agent's object by the same command; never
/// embedded in the agent nor shipped.
pub const TENANT_OBJECT: &str = "linkerd-cni-ebpf-tenant";
/// The BPF target (little endian: x86_64 and arm64 nodes).
pub const TARGET: &str = "bpfel-unknown-none";
/// Cargo profile for the object (see the workspace `Cargo.toml`).
pub const PROFILE: &str = "bpf";
/// Debian's rustc that can target BPF.
pub const BPF_RUSTC: &str = "/usr/bin/rustc";
/// Debian's cargo that goes with it.
pub const BPF_CARGO: &str = "/usr/bin/cargo";
/// Debian's `cargo clippy` for that rustc (package `rust-web-clippy`).
pub const BPF_CARGO_CLIPPY: &str = "/usr/bin/cargo-clippy";
/// Where Debian's prebuilt `core` for the target lives.
pub const BPF_SYSROOT_LIB: &str = "/usr/lib/rustlib/bpfel-unknown-none/lib";

/// The one-line fix printed whenever the toolchain is incomplete.
pub const SETUP_HINT: &str = "run `cargo xtask setup` (installs the eBPF toolchain), then retry";

/// Why the object could not be built.
#[derive(Debug)]
pub enum BuildError {
    /// A piece of the toolchain is not installed.
    ToolchainMissing { what: String },
    /// The compiler ran and failed (its output went to stderr).
    CompileFailed { status: String },
    /// Clippy ran and found something (its output went to stderr).
    LintFailed { status: String },
    /// The compiler could not be started.
    Spawn {
        program: String,
        error: std::io::Error,
    },
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ToolchainMissing { what } => {
                write!(
                    f,
                    "eBPF toolchain incomplete: {what} is missing; {SETUP_HINT}"
                )
            }
            Self::CompileFailed { status } => {
                write!(
                    f,
                    "building the eBPF object failed ({status}); see the compiler output above"
                )
            }
            Self::LintFailed { status } => {
                write!(
                    f,
                    "clippy on the eBPF crate failed ({status}); see its output above"
                )
            }
            Self::Spawn { program, error } => {
                write!(f, "cannot run {program}: {error}; {SETUP_HINT}")
            }
        }
    }
}

impl std::error::Error for BuildError {}

/// Where the object lands for a workspace rooted at `workspace`.
pub fn object_path(workspace: &Path) -> PathBuf {
    target_dir(workspace)
        .join(TARGET)
        .join(PROFILE)
        .join(EBPF_PACKAGE)
}

/// A target directory of its own, so this build never waits on the lock of the build that
/// runs the agent's build script.
fn target_dir(workspace: &Path) -> PathBuf {
    workspace.join("target").join("ebpf")
}

/// Finds `bpf-linker` on `PATH` or in cargo's bin directory.
pub fn find_bpf_linker() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = env::var_os("PATH")
        .map(|p| env::split_paths(&p).collect())
        .unwrap_or_default();
    if let Some(home) = env::var_os("CARGO_HOME") {
        dirs.push(PathBuf::from(home).join("bin"));
    }
    if let Some(home) = env::var_os("HOME") {
        dirs.push(PathBuf::from(home).join(".cargo/bin"));
    }
    dirs.into_iter()
        .map(|d| d.join("bpf-linker"))
        .find(|p| p.is_file())
}

/// Checks every piece of the toolchain, naming the first one missing.
pub fn check_toolchain() -> Result<PathBuf, BuildError> {
    for (path, what) in [
        (BPF_RUSTC, "Debian's rustc-web (/usr/bin/rustc)"),
        (BPF_CARGO, "Debian's cargo-web (/usr/bin/cargo)"),
        (
            BPF_SYSROOT_LIB,
            "Debian's libstd-rust-web-dev-bpf (core for bpfel-unknown-none)",
        ),
    ] {
        if !Path::new(path).exists() {
            return Err(BuildError::ToolchainMissing { what: what.into() });
        }
    }
    find_bpf_linker().ok_or_else(|| BuildError::ToolchainMissing {
        what: "bpf-linker".into(),
    })
}

/// `program` (Debian's cargo, or its clippy) in `workspace` with Debian's rustc, unstable
/// features allowed (`RUSTC_BOOTSTRAP`), and nothing else of the caller's environment but
/// `PATH`, `HOME`, `CARGO_HOME`, `TERM` and `TMPDIR`: a build script or `cargo xtask` inherits
/// the outer cargo's variables (RUSTC, RUSTFLAGS, CARGO_*), which would point this build at
/// the other compiler. Also used for the plugin's musl build (std built from source).
pub fn debian_cargo(workspace: &Path, program: &str) -> Command {
    let mut cmd = Command::new(program);
    cmd.env_clear();
    for keep in ["PATH", "HOME", "CARGO_HOME", "TERM", "TMPDIR"] {
        if let Some(v) = env::var_os(keep) {
            cmd.env(keep, v);
        }
    }
    cmd.current_dir(workspace)
        .env("RUSTC", BPF_RUSTC)
        .env("RUSTC_BOOTSTRAP", "1");
    cmd
}

/// `program` (Debian's cargo, or its clippy) running `subcommand` on the eBPF crate and the
/// tenant's for [`TARGET`] with [`PROFILE`], with Debian's rustc (aya-ebpf enables
/// `asm_experimental_arch`, hence `RUSTC_BOOTSTRAP`).
fn bpf_cargo(workspace: &Path, program: &str, subcommand: &str, linker: &Path) -> Command {
    let mut cmd = debian_cargo(workspace, program);
    cmd.env("CARGO_TARGET_BPFEL_UNKNOWN_NONE_LINKER", linker)
        .args([
            subcommand,
            "--package",
            EBPF_PACKAGE,
            "--package",
            TENANT_OBJECT,
            "--target",
            TARGET,
            "--profile",
            PROFILE,
        ]);
    cmd
}

/// Builds the object (incrementally: a no-op when nothing changed) and returns its path.
pub fn build(workspace: &Path) -> Result<PathBuf, BuildError> {
    let linker = check_toolchain()?;
    let mut cmd = bpf_cargo(workspace, BPF_CARGO, "build", &linker);
    // BTF in the object: verifier logs with source lines, typed `bpftool` dumps. Its debug
    // info names source files relative to the workspace, so the object (and the agent that
    // embeds it) is the same from any checkout.
    let mut flags = vec!["-Clink-arg=--btf".to_string()];
    flags.extend(remap_path_flags(workspace));
    cmd.env("CARGO_ENCODED_RUSTFLAGS", flags.join("\u{1f}"))
        .arg("--target-dir")
        .arg(target_dir(workspace));
    let status = cmd.status().map_err(|error| BuildError::Spawn {
        program: BPF_CARGO.into(),
        error,
    })?;
    if !status.success() {
        return Err(BuildError::CompileFailed {
            status: status.to_string(),
        });
    }
    Ok(object_path(workspace))
}

/// `--remap-path-prefix` flags that keep this machine's paths out of what is built: the
/// workspace becomes `.` and cargo's home (the crates' sources) `/cargo`, so two checkouts of
/// one commit build the same bytes (debug info and panic locations name sources by path).
pub fn remap_path_flags(workspace: &Path) -> Vec<String> {
    let mut flags = vec![format!("--remap-path-prefix={}=.", workspace.display())];
    let cargo_home = env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    if let Some(home) = cargo_home {
        flags.push(format!("--remap-path-prefix={}=/cargo", home.display()));
    }
    flags
}

/// Runs clippy on the eBPF crate as it is built (for [`TARGET`], with [`PROFILE`]), with the
/// workspace lints and every warning an error, like `cargo clippy -- -D warnings` on the
/// userspace crates. The workspace crates it depends on (`common`) are linted for BPF too.
///
/// It is Debian's `cargo-clippy` run directly (`cargo clippy` would find rustup's), told to
/// drive Debian's cargo; it wraps Debian's rustc in Debian's `clippy-driver`. Output goes to
/// stderr. It uses a target directory of its own, so it never invalidates the object.
pub fn clippy(workspace: &Path) -> Result<(), BuildError> {
    let linker = check_toolchain()?;
    if !Path::new(BPF_CARGO_CLIPPY).exists() {
        return Err(BuildError::ToolchainMissing {
            what: "Debian's rust-web-clippy (/usr/bin/cargo-clippy)".into(),
        });
    }
    let mut cmd = bpf_cargo(workspace, BPF_CARGO_CLIPPY, "clippy", &linker);
    cmd.env("CARGO", BPF_CARGO)
        .arg("--target-dir")
        .arg(workspace.join("target").join("ebpf-clippy"))
        .args(["--", "-D", "warnings"]);
    let status = cmd.status().map_err(|error| BuildError::Spawn {
        program: BPF_CARGO_CLIPPY.into(),
        error,
    })?;
    if !status.success() {
        return Err(BuildError::LintFailed {
            status: status.to_string(),
        });
    }
    Ok(())
}

/// The sources whose change must rebuild the object (for `cargo:rerun-if-changed`).
pub fn source_paths(workspace: &Path) -> Vec<PathBuf> {
    [
        "ebpf/src",
        "ebpf/Cargo.toml",
        "tests/tenant-ebpf/src",
        "tests/tenant-ebpf/Cargo.toml",
        "common/src",
        "common/Cargo.toml",
        "Cargo.lock",
    ]
    .iter()
    .map(|p| workspace.join(p))
    .collect()
}
