//! The shipped binaries for each architecture of the release (linux/amd64, linux/arm64): all
//! static, so the image holds nothing but them, and all built on one machine of either
//! architecture.
//!
//! | binary | C library | why |
//! |---|---|---|
//! | agent (`linkerd-cni-agent`, also the installer) | glibc, static-pie | its allocator tuning is glibc's (`mallopt`, `malloc_trim`, `mallinfo2`: its RSS at 10,000 pods); it resolves no host name (the API address is the IP in `KUBERNETES_SERVICE_HOST`), so static glibc's need for the host's NSS libraries never arises |
//! | plugin (`linkerd-cni`) | musl, static, not PIE | spawned for every pod: see `musl.rs` and `dist.rs` |
//! | CLI (`linkerd`) | musl, static, not PIE (see `release.rs`) | it resolves the kubeconfig's server names: musl's resolver is built in, static glibc's would load the host's NSS libraries |
//!
//! Where std for a target comes from: a rustup toolchain that has the target
//! (`rustup target add aarch64-unknown-linux-gnu`, ...) builds with its prebuilt std. Otherwise
//! (rustup cannot fetch targets on these machines) Debian's `rustc-web` builds std from
//! `rust-web-src` (`-Zbuild-std`), as for the plugin's musl std. The C side comes from Debian
//! either way: `gcc-aarch64-linux-gnu` (with `libc6-dev-arm64-cross`: glibc's static libraries)
//! links the arm64 glibc binaries; musl for arm64 is built from Debian's musl sources with that
//! compiler (see `musl.rs`). The eBPF object is one, built once and embedded in both agents.

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::bail;

use crate::{
    build::{
        ebpf::build_ebpf,
        musl,
        target::{Arch, Libc, StdSource, Target},
    },
    exec::{cargo, run, workspace},
};

/// One static binary to build.
pub struct Build<'a> {
    pub target: Target,
    pub package: &'a str,
    pub bin: &'a str,
    pub release: bool,
    /// Flags for the final crate only (`cargo rustc -- ...`): every dependency is built as for
    /// the other binaries of the same target.
    pub rustc_flags: &'a [&'a str],
    /// Extra environment of the build (e.g. `LINKERD_CNI_EBPF_OBJECT`).
    pub envs: Vec<(&'a str, OsString)>,
}

/// Builds `b` and returns the binary's path.
pub fn build(b: &Build) -> anyhow::Result<PathBuf> {
    let triple = b.target.triple();
    let mut cmd = cargo_for(b.target)?;
    cmd.arg("rustc");
    if b.release {
        cmd.arg("--release");
    }
    cmd.args(["-p", b.package, "--bin", b.bin, "--target", &triple]);
    for (k, v) in &b.envs {
        cmd.env(k, v);
    }
    // Every crate: no path of this machine in the binary (reproducible from any checkout).
    cmd.env("CARGO_ENCODED_RUSTFLAGS", remap_flags().join("\u{1f}"));
    if b.target.std_source() == StdSource::DebianBuildStd {
        cmd.arg("-Zbuild-std=std,panic_unwind");
    }
    cmd.arg("--")
        .args(b.rustc_flags)
        .args(link_flags(b.target)?);
    run(&mut cmd)?;
    Ok(b.target
        .target_dir()
        .join(&triple)
        .join(if b.release { "release" } else { "debug" })
        .join(b.bin))
}

/// Runs the unit tests of `packages` built for `target` (`--lib`: not the binaries, whose
/// code is tested through their libraries, nor the integration tests), under `qemu-<cpu>-static` when `target` is not this machine's
/// architecture; the agent embeds `ebpf_object`. `test_args` go to the test binaries
/// (`--skip NAME`, ...).
pub fn test(
    target: Target,
    packages: &[&str],
    ebpf_object: &Path,
    test_args: &[&str],
) -> anyhow::Result<()> {
    // Every crate of the test binaries is linked here, not only a final one: the flags go to
    // all of them (`-C linker=` and `-L` change no code).
    let mut cmd = cargo_all_static(target, "test")?;
    cmd.env("LINKERD_CNI_EBPF_OBJECT", ebpf_object);
    for p in packages {
        cmd.args(["-p", p]);
    }
    cmd.args(["--no-fail-fast", "--lib"]);
    if !target.arch.is_host() {
        let qemu = qemu(target.arch);
        if !Path::new(&qemu).exists() {
            bail!(
                "{qemu} is missing: install Debian's qemu-user-static (`cargo xtask setup` does)"
            );
        }
        // A glibc test binary is dynamically linked: the emulator finds its loader and
        // libraries in the cross toolchain's sysroot.
        let runner = match target.libc {
            Libc::Gnu => format!("{qemu} -L /usr/{}-linux-gnu", target.arch.cpu()),
            Libc::Musl => qemu,
        };
        cmd.env(
            format!("CARGO_TARGET_{}_RUNNER", target.env_name().to_uppercase()),
            runner,
        );
    }
    cmd.arg("--").args(test_args);
    run(&mut cmd)
}

/// Cargo for `target` with the static link flags on every crate it builds (not only a final
/// one, as [`build`] does): the test binaries and helper binaries that `cargo xtask vmtest
/// --arch` runs on another architecture's kernel. `subcommand` (`build`, `test`) is given with
/// `--target` and, where std comes from Debian, `-Zbuild-std`.
pub fn cargo_all_static(target: Target, subcommand: &str) -> anyhow::Result<Command> {
    let mut cmd = cargo_for(target)?;
    cmd.args([subcommand, "--target", &target.triple()]);
    if target.std_source() == StdSource::DebianBuildStd {
        cmd.arg("-Zbuild-std=std,panic_unwind");
    }
    let mut flags = remap_flags();
    flags.extend(
        link_flags(target)?
            .into_iter()
            .map(|f| f.to_string_lossy().into_owned()),
    );
    cmd.env("CARGO_ENCODED_RUSTFLAGS", flags.join("\u{1f}"));
    Ok(cmd)
}

/// The node-side crates whose unit tests `cargo xtask cross-test` runs for another
/// architecture, each with the C library of the binary it ships in: the plugin's (musl) and
/// the agent's (glibc, with the installer it runs); proto and the kernel's raw interface (sys)
/// are in both.
pub const CROSS_TESTED: &[(Libc, &[&str])] = &[
    (
        Libc::Musl,
        &["linkerd-cni-proto", "linkerd-cni-sys", "linkerd-cni-plugin"],
    ),
    (
        Libc::Gnu,
        &[
            "linkerd-cni-proto",
            "linkerd-cni-common",
            "linkerd-cni-sys",
            "linkerd-cni-installer",
            "linkerd-cni-agent",
        ],
    ),
];

/// `cargo xtask cross-test --arch ARCH`: the unit tests of [`CROSS_TESTED`] built for `arch`
/// and run there (under qemu-user from another architecture).
pub fn test_node_crates(arch: Arch) -> anyhow::Result<()> {
    let object = build_ebpf()?;
    let mut args = Vec::new();
    if !arch.is_host() {
        for (test, why) in NOT_UNDER_QEMU {
            eprintln!("skipping {test} under qemu-user: {why}");
            args.extend(["--skip", test]);
        }
    }
    let mut failed = Vec::new();
    for (libc, packages) in CROSS_TESTED {
        let target = Target::new(arch, *libc);
        if let Err(e) = test(target, packages, &object, &args) {
            eprintln!("{}: {e:#}", target.triple());
            failed.push(target.triple());
        }
    }
    if !failed.is_empty() {
        bail!("unit tests failed for {}", failed.join(", "));
    }
    Ok(())
}

/// Unit tests that cannot pass under qemu-user, and why; they run on the host's architecture
/// with the rest of the suite. Debian's qemu-user (7.2) forwards only the ioctls it knows and
/// knows none of nsfs's: `NS_GET_NSTYPE`, with which the plugin checks that `CNI_NETNS` is a
/// network namespace, and `NS_GET_USERNS`, with which the agent finds a pod's user namespace,
/// answer ENOSYS there.
pub const NOT_UNDER_QEMU: &[(&str, &str)] = &[
    ("netns::tests::classifies_paths", NSFS_IOCTL),
    (
        "host::userns::tests::own_user_namespace_needs_no_translation",
        NSFS_IOCTL,
    ),
    (
        "cmd::tests::add_sends_the_pod_and_converts_the_result",
        NSFS_IOCTL,
    ),
    (
        "cmd::tests::add_without_prev_result_prints_a_minimal_result",
        NSFS_IOCTL,
    ),
    (
        "cmd::tests::add_without_the_agent_and_rejected_credentials_says_how_to_uninstall",
        NSFS_IOCTL,
    ),
    ("cmd::tests::add_without_the_agent_asks_the_api", NSFS_IOCTL),
    (
        "cmd::tests::agent_failures_map_to_codes_for_every_verb",
        NSFS_IOCTL,
    ),
    ("cmd::tests::every_verb_in_every_version", NSFS_IOCTL),
    (
        "cmd::tests::excluded_namespaces_never_reach_the_agent",
        NSFS_IOCTL,
    ),
    ("cmd::tests::local_error_paths", NSFS_IOCTL),
    (
        "cmd::tests::pods_without_identity_and_simulate_contact_nobody",
        NSFS_IOCTL,
    ),
];
const NSFS_IOCTL: &str = "qemu-user answers ENOSYS to nsfs's ioctls (NS_GET_NSTYPE, NS_GET_USERNS)";

/// `--remap-path-prefix` for the workspace and cargo's home, as for the eBPF object.
fn remap_flags() -> Vec<String> {
    linkerd_cni_ebpf_build::remap_path_flags(&workspace())
}

/// The emulator of Debian's `qemu-user-static` for `arch`.
pub fn qemu(arch: Arch) -> String {
    format!("/usr/bin/qemu-{}-static", arch.cpu())
}

/// Cargo for `target`, with its C compiler for dependencies' C code (`ring`) and its target
/// directory set: rustup's cargo when rustup has the target's std, else Debian's with std's
/// sources (a clean environment, `RUSTC_BOOTSTRAP` for `-Zbuild-std`).
pub fn cargo_for(target: Target) -> anyhow::Result<Command> {
    let mut cmd = match target.std_source() {
        StdSource::Rustup => cargo(),
        StdSource::DebianBuildStd => {
            musl::check_std_sources()?;
            linkerd_cni_ebpf_build::debian_cargo(&workspace(), linkerd_cni_ebpf_build::BPF_CARGO)
        }
    };
    let env = target.env_name();
    let cc = c_compiler(target)?;
    check_tool(&cc)?;
    cmd.env("CARGO_TARGET_DIR", target.target_dir())
        .env(format!("CC_{env}"), &cc)
        .env(format!("AR_{env}"), target.arch.gnu_tool("ar"));
    Ok(cmd)
}

/// The C compiler (and linker driver) for `target`.
fn c_compiler(target: Target) -> anyhow::Result<OsString> {
    Ok(match (target.libc, target.std_source()) {
        // Debian's musl-gcc, or the one built for another architecture (see musl.rs).
        (Libc::Musl, StdSource::DebianBuildStd) => musl::musl_gcc(target.arch)?.into_os_string(),
        // rustup's musl targets link with their own (self-contained) musl start files and
        // libc: a plain GNU compiler for the architecture drives the link.
        (Libc::Musl, StdSource::Rustup) | (Libc::Gnu, _) => target.arch.gnu_tool("gcc").into(),
    })
}

/// The flags that make the final link static for `target`, with its linker.
pub fn link_flags(target: Target) -> anyhow::Result<Vec<OsString>> {
    let mut flags: Vec<OsString> = vec![
        "-C".into(),
        "target-feature=+crt-static".into(),
        "-C".into(),
    ];
    let mut linker = OsString::from("linker=");
    linker.push(c_compiler(target)?);
    flags.push(linker);
    if target.libc == Libc::Musl && target.std_source() == StdSource::DebianBuildStd {
        // musl-gcc brings musl's start files and libc; std's unwinder is LLVM's libunwind,
        // built for this architecture (see musl.rs).
        flags.extend(["-C".into(), "link-self-contained=no".into(), "-L".into()]);
        let mut native = OsString::from("native=");
        native.push(musl::libunwind(target.arch)?);
        flags.push(native);
    }
    Ok(flags)
}

/// Fails unless `tool` (a command name or path) can be found.
fn check_tool(tool: &OsString) -> anyhow::Result<()> {
    let found = if Path::new(tool).is_absolute() {
        Path::new(tool).exists()
    } else {
        std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()))
    };
    if !found {
        bail!(
            "{} is missing: install Debian's gcc-aarch64-linux-gnu and libc6-dev-arm64-cross \
             (`cargo xtask setup` does)",
            tool.to_string_lossy()
        );
    }
    Ok(())
}
