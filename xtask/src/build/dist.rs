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

use linkerd_cni_common::paths;

use crate::{
    build::{
        cross,
        ebpf::build_ebpf,
        elf::{check_static, check_static_for},
        target::{Arch, Libc, Target},
    },
    exec::workspace,
};

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
    let Some(host) = Arch::host() else {
        bail!("the plugin is built for amd64 and arm64 machines only");
    };
    let built = build_plugin_for(host, release)?;
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

/// Builds the plugin as shipped for `arch` (cross-built on another architecture: see
/// `cross.rs`), checked to be static and not PIE; returns the binary in its target directory.
pub fn build_plugin_for(arch: Arch, release: bool) -> anyhow::Result<PathBuf> {
    // Its own target directory (`target/musl`), so the host builds' artifacts of the other
    // compiler are never invalidated.
    let built = cross::build(&cross::Build {
        target: Target::new(arch, Libc::Musl),
        package: "linkerd-cni-plugin",
        bin: PLUGIN_BIN,
        release,
        rustc_flags: &PLUGIN_RUSTC_FLAGS,
        envs: Vec::new(),
    })?;
    check_static(&built)?;
    check_static_for(&built, arch)?;
    Ok(built)
}

/// The agent's binary name: the DaemonSet's commands are `linkerd-cni-agent run` and
/// `linkerd-cni-agent mount-bpffs`, found through the image's `PATH`.
pub const AGENT_BIN: &str = "linkerd-cni-agent";
/// Where the image holds the agent (a directory on the image's `PATH`).
pub const AGENT_IN_IMAGE: &str = "usr/local/bin/linkerd-cni-agent";

/// Where the image holds the plugin: where the installer copies it from
/// (`CONTAINER_CNI_BIN_DIR`'s default).
pub fn plugin_in_image() -> String {
    format!(
        "{}/{PLUGIN_BIN}",
        paths::CONTAINER_CNI_BIN_DIR.trim_matches('/')
    )
}

/// Builds the agent as shipped for `arch`: release, static glibc (see `cross.rs`), embedding
/// `ebpf_object`; returns the binary, checked to be static.
pub fn build_agent_for(arch: Arch, ebpf_object: &Path) -> anyhow::Result<PathBuf> {
    let agent = cross::build(&cross::Build {
        target: Target::new(arch, Libc::Gnu),
        package: "linkerd-cni-agent",
        bin: AGENT_BIN,
        release: true,
        rustc_flags: &[],
        envs: vec![("LINKERD_CNI_EBPF_OBJECT", ebpf_object.into())],
    })?;
    check_static_for(&agent, arch)?;
    Ok(agent)
}

/// Builds every file the image of `arch` holds: (path in the image, built file), in the
/// image's order. One eBPF object for every architecture (BPF bytecode is the same).
pub fn build_image_files(arch: Arch) -> anyhow::Result<Vec<(String, PathBuf)>> {
    let plugin = build_plugin_for(arch, true)?;
    let object = build_ebpf()?;
    let agent = build_agent_for(arch, &object)?;
    Ok(vec![
        (AGENT_IN_IMAGE.to_string(), agent),
        (plugin_in_image(), plugin),
    ])
}

/// `cargo xtask dist [--out DIR] [--arch ARCH]`: builds the agent and the plugin as shipped
/// (both static) and lays them out under `out` as the image's root filesystem holds them: the
/// agent on `PATH` (`usr/local/bin/linkerd-cni-agent`: `run`, `mount-bpffs`, and the installer
/// it runs) and the plugin where the installer copies it from (`opt/cni/bin/linkerd-cni`, the
/// default `CONTAINER_CNI_BIN_DIR`). The image (`cargo xtask image`) is these files and
/// nothing else.
pub fn dist(out: &Path, arch: Option<Arch>) -> anyhow::Result<()> {
    let Some(arch) = arch.or_else(Arch::host) else {
        bail!("name the architecture to build for: --arch amd64 or --arch arm64");
    };
    for (to, from) in build_image_files(arch)? {
        let to = out.join(to);
        if let Some(dir) = to.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let _ = std::fs::remove_file(&to);
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
    fn the_plugin_is_where_the_installer_copies_it_from() {
        assert_eq!(plugin_in_image(), "opt/cni/bin/linkerd-cni");
        assert!(AGENT_IN_IMAGE.ends_with(&format!("/{AGENT_BIN}")));
    }
}
