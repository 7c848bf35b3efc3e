//! Running commands from the workspace: its root, cargo, git, a command that fails with its
//! command line (or gives its output), and whether this task runs as root. Every other module builds on these.

use std::{path::PathBuf, process::Command};

use anyhow::{Context, bail};

/// The workspace root (xtask lives one level below it).
pub fn workspace() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(PathBuf::from).unwrap_or(manifest)
}

/// Runs a command, failing with its command line when it fails.
pub fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let line = format!("{cmd:?}");
    eprintln!("+ {line}");
    let status = cmd.status().with_context(|| format!("starting {line}"))?;
    if !status.success() {
        bail!("{line} failed: {status}");
    }
    Ok(())
}

/// The standard output of a command, failing with its command line and standard error.
pub fn output(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd.output().with_context(|| format!("starting {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `git <args>` in the workspace: its output, trimmed.
pub fn git(args: &[&str]) -> anyhow::Result<String> {
    Ok(
        output(Command::new("git").args(args).current_dir(workspace()))?
            .trim()
            .to_string(),
    )
}

/// The cargo running this task (`CARGO`), started in the workspace root.
pub fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(workspace());
    cmd
}

/// Whether this task runs as root (effective UID 0).
pub fn nix_is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc_geteuid() == 0 }
}

unsafe extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}
