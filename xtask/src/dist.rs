//! The CNI plugin as it is shipped, and `cargo xtask dist`: the files the DaemonSet's image
//! carries.
//!
//! Every task that builds the plugin (`dist`, `bench`, `demo`, `test`) builds it through
//! [`build_plugin`], so the binary the installer copies onto a node is the binary the benchmark
//! measured: statically linked against musl (see `musl.rs`: glibc's static start-up was most
//! of the plugin's cost over a bare `exec`) and not position-independent. A runtime spawns the
//! plugin for every pod, and on a VM each page fault at start-up costs microseconds: the
//! dynamic loader's work and a PIE's relocations doubled its spawn-to-exit time. (The flags
//! apply to the final link only, so every dependency is built as for the rest of the
//! workspace.)

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use crate::{build_ebpf, cargo, run, workspace};

/// The plugin's binary name: the `type` in a CNI configuration.
pub const PLUGIN_BIN: &str = "linkerd-cni";

/// The only place the plugin's link flags are defined.
const PLUGIN_RUSTC_FLAGS: [&str; 4] = [
    "-C",
    "target-feature=+crt-static",
    "-C",
    "relocation-model=static",
];

/// Builds the plugin, static musl and not PIE, in the release or the debug profile, and puts
/// it where the other binaries are (`target/release` or `target/debug`); returns that path,
/// checked to be what it must be.
pub fn build_plugin(release: bool) -> anyhow::Result<PathBuf> {
    let built = crate::musl::build_plugin(
        "linkerd-cni-plugin",
        PLUGIN_BIN,
        release,
        &PLUGIN_RUSTC_FLAGS,
    )?;
    check_static(&built)?;
    let bin = workspace()
        .join("target")
        .join(if release { "release" } else { "debug" })
        .join(PLUGIN_BIN);
    if let Some(dir) = bin.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    // A new file, not an overwrite: a plugin being run keeps its own (ETXTBSY otherwise).
    let _ = std::fs::remove_file(&bin);
    std::fs::copy(&built, &bin)
        .with_context(|| format!("copying {} to {}", built.display(), bin.display()))?;
    Ok(bin)
}

/// Fails unless `path` is an ELF executable that is not position-independent (`ET_EXEC`) and
/// asks for no dynamic loader (no `PT_INTERP`).
pub fn check_static(path: &Path) -> anyhow::Result<()> {
    let elf = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let u16_at = |o: usize| elf.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u32_at = |o: usize| {
        elf.get(o..o + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let u64_at = |o: usize| {
        elf.get(o..o + 8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()))
    };
    // 64-bit little-endian ELF only (the targets this project builds for).
    if elf.get(..6) != Some(&[0x7f, b'E', b'L', b'F', 2, 1][..]) {
        bail!("{} is not a 64-bit little-endian ELF file", path.display());
    }
    const ET_EXEC: u16 = 2;
    const PT_INTERP: u32 = 3;
    if u16_at(16) != Some(ET_EXEC) {
        bail!(
            "{} is position-independent: build it with `cargo xtask dist`",
            path.display()
        );
    }
    let (phoff, phentsize, phnum) = (
        u64_at(32).unwrap_or(0) as usize,
        u16_at(54).unwrap_or(0) as usize,
        u16_at(56).unwrap_or(0) as usize,
    );
    for i in 0..phnum {
        if u32_at(phoff + i * phentsize) == Some(PT_INTERP) {
            bail!(
                "{} is dynamically linked: build it with `cargo xtask dist`",
                path.display()
            );
        }
    }
    Ok(())
}

/// `cargo xtask dist [--out DIR]`: builds the release agent and the static plugin and lays
/// them out under `out` as the image's root filesystem holds them: the agent on `PATH`
/// (`usr/local/bin/linkerd-cni-agent`: `run`, `mount-bpffs`, and the installer it runs) and
/// the plugin where the installer copies it from (`opt/cni/bin/linkerd-cni`, the default
/// `CONTAINER_CNI_BIN_DIR`). An image is these files on a base with nothing else needed.
pub fn dist(out: &Path) -> anyhow::Result<()> {
    build_ebpf()?;
    run(cargo().args([
        "build",
        "--release",
        "-p",
        "linkerd-cni-agent",
        "--bin",
        "linkerd-cni-agent",
    ]))?;
    let plugin = build_plugin(true)?;
    let agent = workspace().join("target/release/linkerd-cni-agent");
    for (from, to) in [
        (agent, out.join("usr/local/bin/linkerd-cni-agent")),
        (plugin, out.join("opt/cni/bin").join(PLUGIN_BIN)),
    ] {
        if let Some(dir) = to.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        std::fs::copy(&from, &to)
            .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
        eprintln!("{}", to.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_test_binary_is_not_static() {
        // Test binaries are built PIE and dynamically linked: the check must say so.
        let me = std::env::current_exe().unwrap();
        assert!(check_static(&me).is_err());
    }
}
