//! Debian's kernel packages, fetched by name and unpacked into a cache (never installed on
//! the host): the suite each kernel line comes from, a private apt configuration per suite (its
//! own sources, lists and status, so the host's apt state is neither read nor changed), and
//! `depmod` over the unpacked tree so the guest's `modprobe` finds every module.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, bail};

use crate::{
    build::target::Arch,
    exec::{output, run},
};

/// The kernel lines `--kernel` names, the Debian suites that carry them, and the package whose
/// dependency is the current kernel of that line.
pub const LINES: &[Line] = &[
    Line {
        name: "6.1",
        what: "Debian 12 (bookworm)",
        sources: &[
            ("http://deb.debian.org/debian", "bookworm"),
            ("http://deb.debian.org/debian", "bookworm-updates"),
            ("http://deb.debian.org/debian-security", "bookworm-security"),
        ],
    },
    Line {
        name: "6.12",
        what: "Debian 12 backports (bookworm-backports)",
        sources: &[("http://deb.debian.org/debian", "bookworm-backports")],
    },
    Line {
        name: "5.10",
        what: "Debian 11 (bullseye)",
        sources: &[
            ("http://deb.debian.org/debian", "bullseye"),
            ("http://deb.debian.org/debian-security", "bullseye-security"),
        ],
    },
];

/// Debian's meta package that depends on the suite's current kernel for `arch`
/// (`linux-image-amd64`, `linux-image-arm64`).
fn meta(arch: Arch) -> String {
    format!("linux-image-{}", arch.oci())
}

/// One kernel line.
pub struct Line {
    /// What `--kernel` says.
    pub name: &'static str,
    /// Where it comes from, for humans.
    pub what: &'static str,
    /// (archive, suite) pairs, component `main`.
    pub sources: &'static [(&'static str, &'static str)],
}

/// An unpacked kernel: its image and, when it has modules, their tree.
pub struct Kernel {
    /// The kernel image (a bzImage on amd64, a compressed `Image` on arm64).
    pub image: PathBuf,
    /// `lib/modules/<release>` with `modules.dep`, if the kernel has loadable modules.
    pub modules: Option<PathBuf>,
    /// `uname -r` as the package says (the guest reports its own).
    pub release: String,
    /// The Debian package and version it came from (`package version`), if any.
    pub package: Option<String>,
}

/// Where downloaded kernels are kept across runs and checkouts: `$LINKERD_CNI_VM_CACHE`, else
/// `$XDG_CACHE_HOME/linkerd-cni/vm`, else `~/.cache/linkerd-cni/vm`.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("LINKERD_CNI_VM_CACHE") {
        return PathBuf::from(dir);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| crate::exec::workspace().join("target"));
    base.join("linkerd-cni").join("vm")
}

/// The kernel `spec` names for `arch`: a line in [`LINES`] (fetched), or the path of a kernel
/// image.
pub fn resolve(spec: &str, arch: Arch) -> anyhow::Result<Kernel> {
    if let Some(line) = LINES.iter().find(|l| l.name == spec) {
        return fetch(line, arch);
    }
    let image = PathBuf::from(spec);
    if !image.is_file() {
        let names: Vec<&str> = LINES.iter().map(|l| l.name).collect();
        bail!(
            "--kernel {spec}: neither one of {} nor a kernel image file",
            names.join(", ")
        );
    }
    let image = fs::canonicalize(&image)?;
    // An unpacked package tree: <root>/boot/vmlinuz-<release> beside <root>/lib/modules/<release>.
    let release = image
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("vmlinuz-"))
        .map(str::to_string);
    let modules = match (&release, image.parent().and_then(Path::parent)) {
        (Some(release), Some(root)) => modules_tree(root, release),
        _ => None,
    };
    if let (Some(release), Some(modules)) = (&release, &modules) {
        depmod(modules, release)?;
    }
    Ok(Kernel {
        image,
        modules,
        release: release.unwrap_or_else(|| "(from the image)".into()),
        package: None,
    })
}

/// `lib/modules/<release>` (or `usr/lib/modules/...`) under an unpacked root, if present.
fn modules_tree(root: &Path, release: &str) -> Option<PathBuf> {
    ["lib/modules", "usr/lib/modules"]
        .iter()
        .map(|d| root.join(d).join(release))
        .find(|p| p.is_dir())
}

/// `apt-get`/`apt-cache` with a private configuration under `dir`, for packages of `arch`
/// (the host's own architecture is not assumed: an amd64 host fetches arm64 packages).
pub fn apt(tool: &str, dir: &Path, arch: Arch) -> Command {
    let mut cmd = Command::new(tool);
    let opt = |k: &str, v: &Path| format!("{k}={}", v.display());
    cmd.args(["-q", "-o"])
        .arg(opt("Dir::Etc::SourceList", &dir.join("sources.list")))
        .args(["-o", "Dir::Etc::SourceParts=/dev/null"])
        .args(["-o", "Dir::Etc::Preferences=/dev/null"])
        .args(["-o", "Dir::Etc::PreferencesParts=/dev/null"])
        .arg("-o")
        .arg(opt("Dir::State::Lists", &dir.join("lists")))
        .arg("-o")
        .arg(opt("Dir::State::status", &dir.join("status")))
        .arg("-o")
        .arg(opt("Dir::Cache", &dir.join("cache")))
        .args(["-o", "Debug::NoLocking=1"])
        // The cache is root's: apt's download user could not write it.
        .args(["-o", "APT::Sandbox::User=root"])
        .args(["-o", "APT::Get::List-Cleanup=0"])
        .arg("-o")
        .arg(format!("APT::Architecture={arch}"))
        .arg("-o")
        .arg(format!("APT::Architectures={arch}"));
    cmd
}

/// A private apt configuration under `dir` reading `sources` ((archive, suite) pairs,
/// component `main`), with an empty package status (nothing counts as installed).
pub fn apt_dir(dir: &Path, sources: &[(&str, &str)]) -> anyhow::Result<()> {
    for d in ["lists/partial", "cache/archives/partial"] {
        fs::create_dir_all(dir.join(d))
            .with_context(|| format!("creating {}", dir.join(d).display()))?;
    }
    let list: String = sources
        .iter()
        .map(|(uri, suite)| {
            format!(
                "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] {uri} {suite} main\n"
            )
        })
        .collect();
    fs::write(dir.join("sources.list"), list)?;
    fs::write(dir.join("status"), "")?;
    Ok(())
}

/// The suite's current kernel package for `arch`, downloaded and unpacked once (offline runs
/// reuse the last one unpacked).
fn fetch(line: &Line, arch: Arch) -> anyhow::Result<Kernel> {
    let cache = cache_dir();
    // amd64 keeps the names it had before other architectures were fetched (existing caches).
    let key = match arch {
        Arch::Amd64 => line.name.to_string(),
        _ => format!("{}-{arch}", line.name),
    };
    let apt_dir = cache.join("apt").join(&key);
    self::apt_dir(&apt_dir, line.sources)?;
    let last = cache.join(format!("{key}.current"));
    let meta = meta(arch);
    eprintln!(
        "vmtest: looking up the current {} {arch} kernel ({})",
        line.name, line.what
    );
    if let Err(e) = run(apt("apt-get", &apt_dir, arch).arg("update")) {
        // Offline: the kernel unpacked last time, if any.
        let name = fs::read_to_string(&last).ok();
        if let Some(kernel) = name.and_then(|n| unpacked(&cache.join("kernels").join(n.trim()))) {
            eprintln!(
                "vmtest: {e:#}: using the {} kernel fetched before",
                line.name
            );
            return Ok(kernel);
        }
        return Err(e);
    }
    let deps = output(apt("apt-cache", &apt_dir, arch).args(["depends", &meta]))?;
    let package = deps
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Depends: "))
        .map(|p| p.split_whitespace().next().unwrap_or(p))
        .find(|p| p.starts_with("linux-image-") && *p != meta)
        .with_context(|| format!("{meta} in {} depends on no kernel image", line.what))?
        .to_string();
    let policy = output(apt("apt-cache", &apt_dir, arch).args(["policy", &package]))?;
    let version = policy
        .lines()
        .find_map(|l| l.trim().strip_prefix("Candidate: "))
        .map(str::to_string)
        .with_context(|| format!("no candidate version of {package}"))?;
    let name = format!("{package}_{}", version.replace(':', "%3a"));
    let root = cache.join("kernels").join(&name);
    if let Some(kernel) = unpacked(&root) {
        fs::write(&last, &name)?;
        return Ok(kernel);
    }
    let download = cache.join("downloads");
    fs::create_dir_all(&download)?;
    eprintln!("vmtest: downloading {package} {version}");
    run(apt("apt-get", &apt_dir, arch)
        .args(["download", &format!("{package}={version}")])
        .current_dir(&download))?;
    let deb = fs::read_dir(&download)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{package}_")) && n.ends_with(".deb"))
        })
        .with_context(|| format!("apt-get download left no {package} .deb"))?;
    let partial = cache.join("kernels").join(format!("{name}.partial"));
    let _ = fs::remove_dir_all(&partial);
    fs::create_dir_all(&partial)?;
    run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&partial))?;
    fs::write(partial.join("package"), format!("{package} {version}\n"))?;
    let release = release_of(&partial)?;
    let modules = modules_tree(&partial, &release)
        .with_context(|| format!("{package} has no lib/modules/{release}"))?;
    depmod(&modules, &release)?;
    fs::rename(&partial, &root)?;
    let _ = fs::remove_file(&deb);
    fs::write(&last, &name)?;
    unpacked(&root).with_context(|| format!("{} is incomplete", root.display()))
}

/// The release of the one `boot/vmlinuz-*` in an unpacked package.
fn release_of(root: &Path) -> anyhow::Result<String> {
    let boot = root.join("boot");
    fs::read_dir(&boot)
        .with_context(|| format!("listing {}", boot.display()))?
        .filter_map(Result::ok)
        .find_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_prefix("vmlinuz-"))
                .map(str::to_string)
        })
        .with_context(|| format!("no vmlinuz in {}", boot.display()))
}

/// A kernel unpacked and prepared by [`fetch`], if `root` holds one.
fn unpacked(root: &Path) -> Option<Kernel> {
    let package = fs::read_to_string(root.join("package")).ok()?;
    let release = release_of(root).ok()?;
    let modules = modules_tree(root, &release)?;
    modules.join("modules.dep").is_file().then(|| Kernel {
        image: root.join("boot").join(format!("vmlinuz-{release}")),
        modules: Some(modules),
        release,
        package: Some(package.trim().to_string()),
    })
}

/// `depmod` for the tree at `modules` (`<root>/lib/modules/<release>`), so `modprobe` in the
/// guest resolves dependencies (Debian's package leaves that to its post-install script).
fn depmod(modules: &Path, release: &str) -> anyhow::Result<()> {
    if modules.join("modules.dep").is_file() {
        return Ok(());
    }
    // depmod -b <base> looks in <base>/lib/modules/<release>.
    let base = modules
        .parent()
        .and_then(Path::parent)
        .and_then(Path::parent)
        .context("modules tree too shallow")?;
    run(Command::new("depmod").arg("-b").arg(base).arg(release))
}
