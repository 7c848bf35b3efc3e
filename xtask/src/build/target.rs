//! The targets the release is built for: an architecture ([`Arch`], named as OCI names it)
//! and a C library ([`Libc`]), and where a target's std comes from on this machine
//! ([`StdSource`]). How each binary is built for one is `cross.rs`'s; see its module doc for
//! which C library each shipped binary links.

use std::{path::PathBuf, process::Command};

use crate::exec::workspace;

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
}
