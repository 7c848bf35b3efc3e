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

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, bail};

use crate::{run, workspace};

/// The plugin's target.
pub const TARGET: &str = "x86_64-unknown-linux-musl";
/// Debian's compiler and cargo (`rustc-web`, `cargo-web`), whose version `rust-web-src` matches.
const RUSTC: &str = linkerd_cni_ebpf_build::BPF_RUSTC;
const CARGO: &str = linkerd_cni_ebpf_build::BPF_CARGO;
/// Where `rust-web-src` puts std's sources for `/usr/bin/rustc` (sysroot `/usr`).
const STD_SOURCES: &str = "/usr/lib/rustlib/src/rust/library/std";
/// The C compiler wrapper of `musl-tools`.
const MUSL_GCC: &str = "/usr/bin/musl-gcc";

/// LLVM's sources as Debian ships them for bookworm (libunwind is 0.7 MB of the 137 MB).
const LLVM_SOURCE_URL: &str = "http://deb.debian.org/debian/pool/main/l/llvm-toolchain-15/llvm-toolchain-15_15.0.6.orig.tar.xz";
/// Its SHA-256, as in the Debian source package's `.dsc`.
const LLVM_SOURCE_SHA256: &str = "076ac9fe372b3141b4fcbee80abfae34f9574fdb959cd8d14a7fd3f39ff89399";

/// Checks what the musl build needs, naming the first missing piece.
pub fn check_toolchain() -> anyhow::Result<()> {
    for (path, what) in [
        (RUSTC, "Debian's rustc-web"),
        (CARGO, "Debian's cargo-web"),
        (
            STD_SOURCES,
            "Debian's rust-web-src (std's sources for -Zbuild-std)",
        ),
        (MUSL_GCC, "Debian's musl-tools"),
    ] {
        if !Path::new(path).exists() {
            bail!("{path} is missing: install {what} (`cargo xtask setup` does)");
        }
    }
    Ok(())
}

/// Builds the plugin for [`TARGET`] in the release or the debug profile with `rustc_flags`
/// (its own target directory, `target/musl`, so the host builds' artifacts of the other
/// compiler are never invalidated); returns the binary.
pub fn build_plugin(
    package: &str,
    bin: &str,
    release: bool,
    rustc_flags: &[&str],
) -> anyhow::Result<PathBuf> {
    check_toolchain()?;
    let unwind = libunwind()?;
    let target_dir = workspace().join("target/musl");
    // Debian's cargo and rustc, `RUSTC_BOOTSTRAP` for -Zbuild-std, a clean environment.
    let mut cmd = linkerd_cni_ebpf_build::debian_cargo(&workspace(), CARGO);
    let target_env = TARGET.replace('-', "_");
    cmd.env("CARGO_TARGET_DIR", &target_dir)
        // C code of dependencies (ring) for the target.
        .env(format!("CC_{target_env}"), MUSL_GCC)
        .env(format!("AR_{target_env}"), "ar")
        .arg("rustc");
    if release {
        cmd.arg("--release");
    }
    cmd.args(["-p", package, "--bin", bin, "--target", TARGET])
        .arg("-Zbuild-std=std,panic_unwind")
        .arg("--")
        .args(rustc_flags)
        .args([
            "-C",
            &format!("linker={MUSL_GCC}"),
            "-C",
            "link-self-contained=no",
        ])
        .arg("-L")
        .arg(format!("native={}", unwind.display()));
    run(&mut cmd)?;
    Ok(target_dir
        .join(TARGET)
        .join(if release { "release" } else { "debug" })
        .join(bin))
}

/// The directory holding `libunwind.a` built for musl (`target/musl/libunwind`), built on
/// first use from LLVM's sources (downloaded from Debian's archive and checked).
fn libunwind() -> anyhow::Result<PathBuf> {
    let dir = workspace().join("target/musl/libunwind");
    let lib = dir.join("libunwind.a");
    let stamp = dir.join("source.sha256");
    if lib.exists() && std::fs::read_to_string(&stamp).is_ok_and(|s| s.trim() == LLVM_SOURCE_SHA256)
    {
        return Ok(dir);
    }
    eprintln!("+ building LLVM's libunwind for musl (sources from Debian's archive, 137 MB)");
    let work = workspace().join("target/musl/libunwind-build");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let tarball = work.join("llvm.tar.xz");
    run(Command::new("curl")
        .args(["-sSfL", "--retry", "3", "-o"])
        .arg(&tarball)
        .arg(LLVM_SOURCE_URL))?;
    let out = Command::new("sha256sum").arg(&tarball).output()?;
    let digest = String::from_utf8_lossy(&out.stdout);
    if !digest.starts_with(LLVM_SOURCE_SHA256) {
        bail!("{LLVM_SOURCE_URL} has digest {digest}, expected {LLVM_SOURCE_SHA256}");
    }
    run(Command::new("tar")
        .arg("xJf")
        .arg(&tarball)
        .args([
            "--strip-components=1",
            "--wildcards",
            "*/libunwind/src/*",
            "*/libunwind/include/*",
        ])
        .current_dir(&work))?;
    let _ = std::fs::remove_file(&tarball);
    let src = work.join("libunwind/src");
    let include = work.join("libunwind/include");
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
        run(Command::new(MUSL_GCC)
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
    run(Command::new("ar").arg("rcs").arg(&lib).args(&objects))?;
    std::fs::write(&stamp, LLVM_SOURCE_SHA256)?;
    let _ = std::fs::remove_dir_all(&work);
    Ok(dir)
}
