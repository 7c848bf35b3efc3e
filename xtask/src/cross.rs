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

use anyhow::{Context, bail};

use crate::{cargo, run, workspace};

/// A CPU architecture of the release, named as OCI and Kubernetes name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Arch {
    Amd64,
    Arm64,
}

impl Arch {
    /// Every architecture the release ships, in the image index's order.
    pub const ALL: [Arch; 2] = [Arch::Amd64, Arch::Arm64];

    /// The architecture this program runs on, if the release ships it.
    pub fn host() -> Option<Arch> {
        match std::env::consts::ARCH {
            "x86_64" => Some(Arch::Amd64),
            "aarch64" => Some(Arch::Arm64),
            _ => None,
        }
    }

    /// The OCI (GOARCH) name: `amd64`, `arm64`.
    pub fn oci(self) -> &'static str {
        match self {
            Arch::Amd64 => "amd64",
            Arch::Arm64 => "arm64",
        }
    }

    /// The CPU name of target triples and GNU tools: `x86_64`, `aarch64`.
    pub fn cpu(self) -> &'static str {
        match self {
            Arch::Amd64 => "x86_64",
            Arch::Arm64 => "aarch64",
        }
    }

    /// Whether this is the machine's own architecture (no cross compiler, no emulator).
    pub fn is_host(self) -> bool {
        Arch::host() == Some(self)
    }

    /// Debian's GNU tool for this architecture: the native one (`gcc`, `ar`) on the host's
    /// architecture, else the cross one (`aarch64-linux-gnu-gcc`, from `gcc-aarch64-linux-gnu`).
    pub fn gnu_tool(self, tool: &str) -> String {
        if self.is_host() {
            tool.to_string()
        } else {
            format!("{}-linux-gnu-{tool}", self.cpu())
        }
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.oci())
    }
}

/// The C library a binary is linked against (statically).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Libc {
    Gnu,
    Musl,
}

/// A Rust target: an architecture and a C library.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    pub arch: Arch,
    pub libc: Libc,
}

impl Target {
    pub fn new(arch: Arch, libc: Libc) -> Self {
        Self { arch, libc }
    }

    /// `aarch64-unknown-linux-musl`, ...
    pub fn triple(self) -> String {
        let libc = match self.libc {
            Libc::Gnu => "gnu",
            Libc::Musl => "musl",
        };
        format!("{}-unknown-linux-{libc}", self.arch.cpu())
    }

    /// The triple as cargo's and the `cc` crate's environment variables spell it
    /// (`CC_aarch64_unknown_linux_gnu`, `CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER`).
    pub fn env_name(self) -> String {
        self.triple().replace('-', "_")
    }

    /// The target directory of static builds for this C library (one per compiler inside, by
    /// cargo's fingerprints): `target/musl` (the plugin's, shared with `dist`, `test`, `bench`)
    /// or `target/gnu-static`.
    pub fn target_dir(self) -> PathBuf {
        workspace().join("target").join(match self.libc {
            Libc::Musl => "musl",
            Libc::Gnu => "gnu-static",
        })
    }

    /// Where std for this target comes from on this machine.
    pub fn std_source(self) -> StdSource {
        if rustup_has_std(&self.triple()) {
            StdSource::Rustup
        } else {
            StdSource::DebianBuildStd
        }
    }
}

/// Where a target's std comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StdSource {
    /// The rustup toolchain has it (`rustup target add`).
    Rustup,
    /// Debian's `rustc-web` builds it from `rust-web-src` (`-Zbuild-std`).
    DebianBuildStd,
}

/// Whether the rustup toolchain running this task has a prebuilt std for `triple`.
fn rustup_has_std(triple: &str) -> bool {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let Ok(out) = Command::new(rustc).args(["--print", "sysroot"]).output() else {
        return false;
    };
    let sysroot = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let lib = sysroot.join("lib/rustlib").join(triple).join("lib");
    std::fs::read_dir(lib).is_ok_and(|entries| {
        entries
            .filter_map(Result::ok)
            .any(|e| e.file_name().to_string_lossy().starts_with("libstd-"))
    })
}

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
    let triple = target.triple();
    let mut cmd = cargo_for(target)?;
    cmd.arg("test").env("LINKERD_CNI_EBPF_OBJECT", ebpf_object);
    for p in packages {
        cmd.args(["-p", p]);
    }
    cmd.args(["--no-fail-fast", "--lib", "--target", &triple]);
    if target.std_source() == StdSource::DebianBuildStd {
        cmd.arg("-Zbuild-std=std,panic_unwind");
    }
    let mut flags = remap_flags();
    flags.extend(
        link_flags(target)?
            .into_iter()
            .map(|f| f.to_string_lossy().into_owned()),
    );
    // Every crate of the test binaries is linked here, not only a final one: the flags go to
    // all of them (`-C linker=` and `-L` change no code).
    cmd.env("CARGO_ENCODED_RUSTFLAGS", flags.join("\u{1f}"));
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
/// the agent's (glibc, with the installer it runs); proto is in both.
pub const CROSS_TESTED: &[(Libc, &[&str])] = &[
    (Libc::Musl, &["linkerd-cni-proto", "linkerd-cni-plugin"]),
    (
        Libc::Gnu,
        &[
            "linkerd-cni-proto",
            "linkerd-cni-common",
            "linkerd-cni-installer",
            "linkerd-cni-agent",
        ],
    ),
];

/// `cargo xtask cross-test --arch ARCH`: the unit tests of [`CROSS_TESTED`] built for `arch`
/// and run there (under qemu-user from another architecture).
pub fn test_node_crates(arch: Arch) -> anyhow::Result<()> {
    let object = crate::build_ebpf()?;
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
fn cargo_for(target: Target) -> anyhow::Result<Command> {
    let mut cmd = match target.std_source() {
        StdSource::Rustup => cargo(),
        StdSource::DebianBuildStd => {
            crate::musl::check_std_sources()?;
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
        (Libc::Musl, StdSource::DebianBuildStd) => {
            crate::musl::musl_gcc(target.arch)?.into_os_string()
        }
        // rustup's musl targets link with their own (self-contained) musl start files and
        // libc: a plain GNU compiler for the architecture drives the link.
        (Libc::Musl, StdSource::Rustup) | (Libc::Gnu, _) => target.arch.gnu_tool("gcc").into(),
    })
}

/// The flags that make the final link static for `target`, with its linker.
fn link_flags(target: Target) -> anyhow::Result<Vec<OsString>> {
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
        native.push(crate::musl::libunwind(target.arch)?);
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

/// Fails unless `path` is an ELF file for `arch` that asks for no dynamic loader (no
/// `PT_INTERP`): a static executable, position-independent or not.
pub fn check_static_for(path: &Path, arch: Arch) -> anyhow::Result<()> {
    let elf = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let machine = elf.get(18..20).map(|b| u16::from_le_bytes([b[0], b[1]]));
    const EM_X86_64: u16 = 62;
    const EM_AARCH64: u16 = 183;
    let want = match arch {
        Arch::Amd64 => EM_X86_64,
        Arch::Arm64 => EM_AARCH64,
    };
    if elf.get(..6) != Some(&[0x7f, b'E', b'L', b'F', 2, 1][..]) || machine != Some(want) {
        bail!("{} is not a 64-bit ELF file for {arch}", path.display());
    }
    if crate::dist::has_interp(&elf) {
        bail!("{} is dynamically linked", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn triples_and_names() {
        let t = Target::new(Arch::Arm64, Libc::Musl);
        assert_eq!(t.triple(), "aarch64-unknown-linux-musl");
        assert_eq!(t.env_name(), "aarch64_unknown_linux_musl");
        assert_eq!(
            Target::new(Arch::Amd64, Libc::Gnu).triple(),
            "x86_64-unknown-linux-gnu"
        );
        assert_eq!(Arch::Arm64.oci(), "arm64");
        assert_eq!(Arch::Amd64.oci(), "amd64");
    }

    #[test]
    fn cross_tools_are_named_for_their_architecture() {
        let other = if Arch::host() == Some(Arch::Amd64) {
            Arch::Arm64
        } else {
            Arch::Amd64
        };
        assert_eq!(
            other.gnu_tool("gcc"),
            format!("{}-linux-gnu-gcc", other.cpu())
        );
        if let Some(host) = Arch::host() {
            assert_eq!(host.gnu_tool("ar"), "ar");
        }
    }

    #[test]
    fn this_test_binary_is_not_static() {
        // Test binaries are dynamically linked: the check must say so.
        let me = std::env::current_exe().unwrap();
        let host = Arch::host().unwrap();
        let err = check_static_for(&me, host).unwrap_err();
        assert!(err.to_string().contains("dynamically linked"), "{err}");
        // And the architecture is checked.
        let other = if host == Arch::Amd64 {
            Arch::Arm64
        } else {
            Arch::Amd64
        };
        let err = check_static_for(&me, other).unwrap_err();
        assert!(err.to_string().contains("not a 64-bit ELF"), "{err}");
    }
}
