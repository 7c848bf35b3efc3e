//! Unique names for everything the support code creates, scratch directories, external
//! commands, and the removal of leftovers from test processes that died without cleaning up.
//!
//! Every netns, cgroup and scratch directory is named `l5dt-<pid>-<n>`: the PID says which
//! process owns it, so a later run can remove what a killed run left behind without touching
//! anything else.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    sync::{
        Once,
        atomic::{AtomicU64, Ordering},
    },
};

use crate::{
    error::{Error, IoContext, Result},
    hostfs::{NETNS_RUN_DIR, cgroup2_root, remove_tree},
};

/// Prefix of every object name this library creates.
pub const PREFIX: &str = "l5dt-";

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A fresh number, unique in this process.
pub(crate) fn next() -> u64 {
    COUNTER.fetch_add(1, Ordering::Relaxed)
}

/// A fresh `l5dt-<pid>-<n>` name, unique on this machine while this process lives.
pub fn unique_name() -> String {
    format!("{PREFIX}{}-{}", std::process::id(), next())
}

/// The owner PID encoded in a name made by [`unique_name`], if it is one.
pub(crate) fn owner_pid(name: &str) -> Option<u32> {
    name.strip_prefix(PREFIX)?.split('-').next()?.parse().ok()
}

/// True when `name` was made by [`unique_name`] in a process that no longer exists.
pub(crate) fn is_stale(name: &str) -> bool {
    match owner_pid(name) {
        Some(pid) => pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists(),
        None => false,
    }
}

/// Runs a command to completion; fails with its stderr when it exits unsuccessfully.
pub fn run(cmd: &mut Command) -> Result<String> {
    let line = format!("{cmd:?}");
    let out = cmd.output().ctx(|| format!("running {line}"))?;
    if !out.status.success() {
        return Err(Error::Command {
            command: line,
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Removes, once per process, the netns, cgroups and scratch directories that earlier test
/// processes (now dead) left behind. Called by the guards' constructors.
pub fn reap_stale() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if let Ok(entries) = fs::read_dir(NETNS_RUN_DIR) {
            for name in entries
                .flatten()
                .filter_map(|e| e.file_name().into_string().ok())
            {
                if is_stale(&name) {
                    let _ = run(Command::new("ip").args(["netns", "del", &name]));
                }
            }
        }
        if let Ok(root) = cgroup2_root()
            && let Ok(entries) = fs::read_dir(&root)
        {
            for e in entries.flatten() {
                if e.file_name().to_str().is_some_and(is_stale) {
                    remove_tree(&e.path());
                }
            }
        }
        if let Ok(entries) = fs::read_dir(std::env::temp_dir()) {
            for e in entries.flatten() {
                if e.file_name().to_str().is_some_and(is_stale) {
                    let _ = fs::remove_dir_all(e.path());
                }
            }
        }
    });
}

/// A scratch directory under the system temp dir, removed with its contents on drop.
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Creates a fresh, empty directory (mode 0700).
    pub fn new() -> Result<Self> {
        reap_stale();
        let path = std::env::temp_dir().join(unique_name());
        fs::create_dir(&path).ctx(|| format!("creating {}", path.display()))?;
        Ok(TempDir { path })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Hands the directory to `uid`/`gid`, so a child that dropped privileges can write to it.
    pub fn chown(&self, uid: u32, gid: u32) -> Result<()> {
        std::os::unix::fs::chown(&self.path, Some(uid), Some(gid))
            .ctx(|| format!("chown {} to {uid}:{gid}", self.path.display()))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_pid_parses_only_our_names() {
        let cases = [
            ("l5dt-123-4", Some(123)),
            ("l5dt-7-0", Some(7)),
            ("l5dt-x-0", None),
            ("cni-1234", None),
            ("l5dt", None),
        ];
        for (name, want) in cases {
            assert_eq!(owner_pid(name), want, "owner of {name:?}");
        }
    }

    #[test]
    fn unique_names_carry_our_pid_and_differ() {
        let (a, b) = (unique_name(), unique_name());
        assert_ne!(a, b, "two names must differ");
        assert_eq!(
            owner_pid(&a),
            Some(std::process::id()),
            "{a} must carry our pid"
        );
        assert!(!is_stale(&a), "our own names are never stale");
    }
}
