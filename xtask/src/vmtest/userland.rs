//! The root filesystem of a guest of another architecture: an amd64 guest shares the host's
//! root, an arm64 guest cannot run its programs, so it gets a userland unpacked from Debian's
//! packages for its architecture (bookworm, as the host): the shell and tools the run script
//! and the privileged tests execute ([`PACKAGES`] and what they depend on, resolved by apt with
//! an empty package status), `dpkg-deb -x`'d into one tree, kept in the cache and reused while
//! the package list is the same. No maintainer script runs: the few things they would do that
//! the tests rely on (the `iptables` alternative, `/bin/sh`, the account files) are done here.

use std::{
    fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, bail};

use super::kernel::{apt, apt_dir, cache_dir};
use crate::{build::target::Arch, exec::run};

/// What the guest runs besides the test binaries: the run script (bash, coreutils' `timeout`,
/// util-linux's `dmesg`), the initramfs (busybox-static), the tests' own commands (`ip`,
/// `bpftool`, `nsenter`, `unshare`, `setpriv`, `prlimit`, `iptables` for the init-container
/// pods, `python3` for the app that reads its socket's storage, `modprobe`, the `bridge` and
/// `host-local` CNI plugins of the end-to-end chain) and the CA certificates the agent's
/// Kubernetes client loads when its kubeconfig names no CA of its own (the simulated node's);
/// `gdb` for the backtraces of a binary that runs past its limit.
pub const PACKAGES: &[&str] = &[
    "bash",
    "busybox-static",
    "bpftool",
    "ca-certificates",
    "containernetworking-plugins",
    "coreutils",
    "dash",
    "findutils",
    "gdb-minimal",
    "grep",
    "iproute2",
    "iptables",
    "kmod",
    "mount",
    "procps",
    "python3",
    "sed",
    "tar",
    "util-linux",
];

/// Where the packages come from (the host's Debian release).
const SOURCES: &[(&str, &str)] = &[
    ("http://deb.debian.org/debian", "bookworm"),
    ("http://deb.debian.org/debian", "bookworm-updates"),
    ("http://deb.debian.org/debian-security", "bookworm-security"),
];

/// Directories the guest's `/init` mounts on, which no package ships.
const MOUNT_POINTS: &[&str] = &["proc", "sys", "dev", "run", "tmp", "root"];

/// Bumped whenever [`finish`] changes what it does to the unpacked tree.
const FINISH_VERSION: u32 = 3;

/// The unpacked userland for `arch`, built on first use and again when [`PACKAGES`] or
/// [`finish`] changed (what it was made from is kept in its `.complete`).
pub fn root(arch: Arch) -> anyhow::Result<PathBuf> {
    let cache = cache_dir();
    let name = format!("bookworm-{arch}");
    let root = cache.join("userlands").join(&name);
    let list = format!("finish {FINISH_VERSION}\n{}\n", PACKAGES.join("\n"));
    if fs::read_to_string(root.join(".complete")).is_ok_and(|l| l == list) {
        return Ok(root);
    }
    eprintln!(
        "vmtest: unpacking an {arch} userland from Debian's packages into {}",
        root.display()
    );
    let dir = cache.join("apt").join(format!("userland-{arch}"));
    apt_dir(&dir, SOURCES)?;
    run(apt("apt-get", &dir, arch).arg("update"))?;
    let archives = dir.join("archives");
    fs::create_dir_all(archives.join("partial"))?;
    run(apt("apt-get", &dir, arch)
        .args([
            "install",
            "--download-only",
            "--yes",
            "--no-install-recommends",
        ])
        .arg("-o")
        .arg(format!("Dir::Cache::archives={}", archives.display()))
        .args(PACKAGES))?;
    let partial = cache.join("userlands").join(format!("{name}.partial"));
    let _ = fs::remove_dir_all(&partial);
    fs::create_dir_all(&partial)?;
    let mut debs: Vec<PathBuf> = fs::read_dir(&archives)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "deb"))
        .collect();
    debs.sort();
    if debs.is_empty() {
        bail!("apt-get downloaded no package into {}", archives.display());
    }
    for deb in &debs {
        run(Command::new("dpkg-deb").arg("-x").arg(deb).arg(&partial))?;
    }
    finish(&partial)?;
    fs::write(partial.join(".complete"), list)?;
    let _ = fs::remove_dir_all(&root);
    fs::rename(&partial, &root)?;
    for deb in debs {
        let _ = fs::remove_file(deb);
    }
    Ok(root)
}

/// What the packages' maintainer scripts would have done that the guest needs.
fn finish(root: &Path) -> anyhow::Result<()> {
    for dir in MOUNT_POINTS {
        fs::create_dir_all(root.join(dir))?;
    }
    // base-passwd's and the tests' identities (the tests drop to numeric UIDs; `ip netns`,
    // `bpftool` and the C library look names up).
    fs::create_dir_all(root.join("etc"))?;
    fs::write(
        root.join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/bash\n\
         nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    )?;
    fs::write(root.join("etc/group"), "root:x:0:\nnogroup:x:65534:\n")?;
    // dash's postinst makes /bin/sh; update-alternatives makes iptables (nft, as the host).
    // base-files makes /var/run a link to /run (`ip netns` keeps its names there).
    fs::create_dir_all(root.join("var"))?;
    let links: &[(&str, &str)] = &[
        ("var/run", "../run"),
        ("var/lock", "../run/lock"),
        ("bin/sh", "dash"),
        ("usr/sbin/iptables", "xtables-nft-multi"),
        ("usr/sbin/iptables-save", "xtables-nft-multi"),
        ("usr/sbin/iptables-restore", "xtables-nft-multi"),
        ("usr/sbin/ip6tables", "xtables-nft-multi"),
        ("usr/sbin/ip6tables-save", "xtables-nft-multi"),
        ("usr/sbin/ip6tables-restore", "xtables-nft-multi"),
    ];
    for (link, target) in links {
        let path = root.join(link);
        // base-files ships /var/run and /var/lock as empty directories; its postinst links them.
        if path.is_dir() && !path.is_symlink() {
            fs::remove_dir(&path).with_context(|| format!("replacing {}", path.display()))?;
        }
        if path.symlink_metadata().is_err() {
            symlink(target, &path).with_context(|| format!("linking {}", path.display()))?;
        }
    }
    // ca-certificates' postinst (update-ca-certificates) writes the bundle TLS clients read.
    let mut bundle = Vec::new();
    let mozilla = root.join("usr/share/ca-certificates/mozilla");
    let mut certs: Vec<PathBuf> = fs::read_dir(&mozilla)
        .with_context(|| format!("listing {}", mozilla.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    certs.sort();
    for cert in certs {
        bundle.extend(fs::read(&cert)?);
    }
    fs::create_dir_all(root.join("etc/ssl/certs"))?;
    fs::write(root.join("etc/ssl/certs/ca-certificates.crt"), bundle)?;
    for needed in [
        "bin/bash",
        "bin/busybox",
        "usr/bin/python3",
        "usr/sbin/xtables-nft-multi",
    ] {
        let path = root.join(needed);
        if fs::metadata(&path).is_err() {
            bail!("the unpacked userland has no {needed}");
        }
    }
    Ok(())
}
