//! The plugin's C library: static musl instead of static glibc.
//!
//! A runtime spawns the plugin for every pod, and on a VM glibc's static start-up is most of
//! what the plugin costs over a bare `exec`: it runs about 43 `CPUID` instructions (CPU
//! features, cache sizes), each a VM exit of 5–7 µs here. musl's start-up runs none. Measured
//! spawn to exit, interleaved (VERSION, 3,000 runs each): glibc +0.29 ms over the exec floor,
//! musl +0.11 ms; an ADD with `simulate` +0.35 vs +0.19 ms (musl's slower allocator costs 25 µs of
//! the parsing).
//!
//! The rustup toolchains here have no musl target, so the plugin is built with Debian's
//! `rustc-web` and its sources (`rust-web-src`, the same version: [`crate::setup`] pins it),
//! building std for `x86_64-unknown-linux-musl` (`-Zbuild-std`), linked by Debian's
//! `musl-gcc`. Static musl std links LLVM's libunwind (panics unwind: the plugin's `main`
//! catches them); Debian ships none built for musl, so [`libunwind`] compiles it with
//! `musl-gcc` from Debian's LLVM 15 source tarball, as Rust's own musl target does.
//!
//! For another architecture (arm64 from an amd64 machine: the release's), Debian's `musl-gcc`
//! is the host's, so [`musl_gcc`] builds musl itself from Debian's musl source tarball with
//! Debian's cross compiler (`aarch64-linux-gnu-gcc`): its `libc.a`, start files and the
//! `musl-gcc` wrapper that points that compiler at them, in `target/musl/<cpu>-linux-musl`.
//! The build itself goes through `cross.rs`, which also serves a rustup toolchain that has the
//! musl target (`rustup target add`): then none of this is needed.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, bail};

use crate::{
    build::target::Arch,
    exec::{run, workspace},
};

/// Where `rust-web-src` puts std's sources for `/usr/bin/rustc` (sysroot `/usr`).
const STD_SOURCES: &str = "/usr/lib/rustlib/src/rust/library/std";
/// The C compiler wrapper of `musl-tools` (for the host's architecture).
const MUSL_GCC: &str = "/usr/bin/musl-gcc";

/// LLVM's sources as Debian ships them for bookworm (libunwind is 0.7 MB of the 137 MB).
const LLVM_SOURCE_URL: &str = "http://deb.debian.org/debian/pool/main/l/llvm-toolchain-15/llvm-toolchain-15_15.0.6.orig.tar.xz";
/// Its SHA-256, as in the Debian source package's `.dsc`.
const LLVM_SOURCE_SHA256: &str = "076ac9fe372b3141b4fcbee80abfae34f9574fdb959cd8d14a7fd3f39ff89399";

/// musl's sources as Debian ships them for bookworm (the version of its `musl-dev`).
const MUSL_SOURCE_URL: &str =
    "http://deb.debian.org/debian/pool/main/m/musl/musl_1.2.3.orig.tar.gz";
/// Its SHA-256, as in the Debian source package's `.dsc` (`musl_1.2.3-1.dsc`).
const MUSL_SOURCE_SHA256: &str = "7d5b0b6062521e4627e099e4c9dc8248d32a30285e959b7eecaa780cf8cfd4a4";

/// Checks that Debian's compiler, cargo and std's sources (for `-Zbuild-std`) are installed.
pub fn check_std_sources() -> anyhow::Result<()> {
    for (path, what) in [
        (linkerd_cni_ebpf_build::BPF_RUSTC, "Debian's rustc-web"),
        (linkerd_cni_ebpf_build::BPF_CARGO, "Debian's cargo-web"),
        (
            STD_SOURCES,
            "Debian's rust-web-src (std's sources for -Zbuild-std)",
        ),
    ] {
        if !Path::new(path).exists() {
            bail!("{path} is missing: install {what} (`cargo xtask setup` does)");
        }
    }
    Ok(())
}

/// Checks what the host's musl build needs, naming the first missing piece.
pub fn check_toolchain() -> anyhow::Result<()> {
    check_std_sources()?;
    if !Path::new(MUSL_GCC).exists() {
        bail!("{MUSL_GCC} is missing: install Debian's musl-tools (`cargo xtask setup` does)");
    }
    Ok(())
}

/// The `musl-gcc` wrapper for `arch`: Debian's for the host's architecture, else one built
/// from Debian's musl sources with Debian's cross compiler (on first use).
pub fn musl_gcc(arch: Arch) -> anyhow::Result<PathBuf> {
    if arch.is_host() {
        check_toolchain()?;
        return Ok(PathBuf::from(MUSL_GCC));
    }
    let prefix = workspace()
        .join("target/musl")
        .join(format!("{}-linux-musl", arch.cpu()));
    let wrapper = prefix.join("bin/musl-gcc");
    let stamp = prefix.join("source.sha256");
    if wrapper.exists()
        && std::fs::read_to_string(&stamp).is_ok_and(|s| s.trim() == MUSL_SOURCE_SHA256)
    {
        return Ok(wrapper);
    }
    let cc = arch.gnu_tool("gcc");
    eprintln!("+ building musl for {arch} with {cc} (sources from Debian's archive, 1 MB)");
    let work = workspace()
        .join("target/musl")
        .join(format!("{}-musl-build", arch.cpu()));
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&prefix);
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let tarball = work.join("musl.tar.gz");
    download(MUSL_SOURCE_URL, MUSL_SOURCE_SHA256, &tarball)?;
    run(Command::new("tar")
        .arg("xzf")
        .arg(&tarball)
        .arg("--strip-components=1")
        .current_dir(&work))?;
    run(Command::new("./configure")
        .env("CC", &cc)
        .env("CROSS_COMPILE", arch.gnu_tool(""))
        .arg(format!("--target={}-linux-musl", arch.cpu()))
        .arg(format!("--prefix={}", prefix.display()))
        .arg("--disable-shared")
        .current_dir(&work))?;
    let jobs = std::thread::available_parallelism().map_or(1, usize::from);
    run(Command::new("make")
        .arg(format!("-j{jobs}"))
        .arg("-s")
        .current_dir(&work))?;
    run(Command::new("make")
        .args(["-s", "install"])
        .current_dir(&work))?;
    if !wrapper.exists() {
        bail!("musl's build installed no {}", wrapper.display());
    }
    std::fs::write(&stamp, MUSL_SOURCE_SHA256)?;
    let _ = std::fs::remove_dir_all(&work);
    Ok(wrapper)
}

/// libunwind's sources (`libunwind/src`, `libunwind/include`), taken from LLVM's source
/// tarball on first use and kept for every architecture (`target/musl/libunwind/src`).
fn libunwind_sources() -> anyhow::Result<PathBuf> {
    let dir = workspace().join("target/musl/libunwind/src");
    let stamp = dir.join("source.sha256");
    if std::fs::read_to_string(&stamp).is_ok_and(|s| s.trim() == LLVM_SOURCE_SHA256) {
        return Ok(dir);
    }
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let tarball = dir.join("llvm.tar.xz");
    download(LLVM_SOURCE_URL, LLVM_SOURCE_SHA256, &tarball)?;
    run(Command::new("tar")
        .arg("xJf")
        .arg(&tarball)
        .args([
            "--strip-components=1",
            "--wildcards",
            "*/libunwind/src/*",
            "*/libunwind/include/*",
        ])
        .current_dir(&dir))?;
    std::fs::remove_file(&tarball)?;
    std::fs::write(&stamp, LLVM_SOURCE_SHA256)?;
    Ok(dir)
}

/// Downloads `url` to `to` and checks its SHA-256.
fn download(url: &str, sha256: &str, to: &Path) -> anyhow::Result<()> {
    run(Command::new("curl")
        .args(["-sSfL", "--retry", "3", "-o"])
        .arg(to)
        .arg(url))?;
    let out = Command::new("sha256sum").arg(to).output()?;
    let digest = String::from_utf8_lossy(&out.stdout);
    if !digest.starts_with(sha256) {
        bail!("{url} has digest {digest}, expected {sha256}");
    }
    Ok(())
}

/// The directory holding `libunwind.a` built for musl on `arch`
/// (`target/musl/libunwind/<cpu>`), built on first use from LLVM's sources (downloaded from
/// Debian's archive and checked).
pub fn libunwind(arch: Arch) -> anyhow::Result<PathBuf> {
    let dir = workspace().join("target/musl/libunwind").join(arch.cpu());
    let lib = dir.join("libunwind.a");
    let stamp = dir.join("source.sha256");
    if lib.exists() && std::fs::read_to_string(&stamp).is_ok_and(|s| s.trim() == LLVM_SOURCE_SHA256)
    {
        return Ok(dir);
    }
    let cc = musl_gcc(arch)?;
    eprintln!(
        "+ building LLVM's libunwind for musl on {arch} (sources from Debian's archive, 137 MB)"
    );
    let sources = libunwind_sources()?;
    let work = workspace()
        .join("target/musl")
        .join(format!("libunwind-build-{}", arch.cpu()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let src = sources.join("libunwind/src");
    let include = sources.join("libunwind/include");
    // The flags Rust's build of its musl targets compiles libunwind with.
    let common = [
        "-O2",
        "-fPIC",
        "-fstrict-aliasing",
        "-funwind-tables",
        "-fvisibility=hidden",
        "-D_LIBUNWIND_DISABLE_VISIBILITY_ANNOTATIONS",
        "-D_LIBUNWIND_IS_NATIVE_ONLY",
        "-DNDEBUG",
    ];
    let c_only: &[&str] = &["-std=c99"];
    let cxx_only: &[&str] = &[
        "-x",
        "c++",
        "-std=c++11",
        "-nostdinc++",
        "-fno-exceptions",
        "-fno-rtti",
    ];
    let sources: [(&str, &[&str]); 8] = [
        ("UnwindLevel1.c", c_only),
        ("UnwindLevel1-gcc-ext.c", c_only),
        ("Unwind-sjlj.c", c_only),
        ("UnwindRegistersRestore.S", &[]),
        ("UnwindRegistersSave.S", &[]),
        ("libunwind.cpp", cxx_only),
        ("Unwind-EHABI.cpp", cxx_only),
        ("Unwind-seh.cpp", cxx_only),
    ];
    let mut objects = Vec::new();
    for (file, extra) in sources {
        let object = work.join(format!("{file}.o"));
        run(Command::new(&cc)
            .args(extra)
            .args(common)
            .arg("-I")
            .arg(&include)
            .arg("-c")
            .arg(src.join(file))
            .arg("-o")
            .arg(&object))?;
        objects.push(object);
    }
    std::fs::create_dir_all(&dir)?;
    let _ = std::fs::remove_file(&lib);
    run(Command::new(arch.gnu_tool("ar"))
        .arg("rcs")
        .arg(&lib)
        .args(&objects))?;
    std::fs::write(&stamp, LLVM_SOURCE_SHA256)?;
    let _ = std::fs::remove_dir_all(&work);
    Ok(dir)
}
