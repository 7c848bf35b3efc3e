//! Locating this crate's helper binaries (the test proxy and the test client) from integration
//! tests, benchmarks and demos, and making any binary runnable by the UIDs the tests drop to
//! wherever the checkout lives ([`runnable_as`]).

use std::{
    collections::BTreeMap,
    fs,
    os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
    process::Command,
    sync::{Mutex, OnceLock},
    time::SystemTime,
};

use crate::error::{Error, IoContext, Result};

/// The forwarding test proxy.
pub const PROXY: &str = "linkerd-cni-test-proxy";
/// The test client.
pub const CLIENT: &str = "linkerd-cni-test-client";
/// Runs a program under a seccomp filter refusing `setns(2)`, as the runtime's default profile
/// does for a container without `CAP_SYS_ADMIN`.
pub const SECCOMP: &str = "linkerd-cni-test-seccomp";
/// Overrides the directory the binaries are looked up in.
pub const BIN_DIR_ENV: &str = "LINKERD_CNI_TEST_BIN_DIR";

/// The path of helper binary `name`: in `$LINKERD_CNI_TEST_BIN_DIR` if set, else next to the
/// running executable (a binary in `target/<profile>/`) or one level up (an integration test
/// in `target/<profile>/deps/`). Cargo builds a package's binaries before its integration
/// tests, so `cargo test -p linkerd-cni-tests` always finds them.
pub fn bin_path(name: &str) -> Result<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(dir) = std::env::var_os(BIN_DIR_ENV) {
        dirs.push(PathBuf::from(dir));
    }
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(PathBuf::from))
    {
        if let Some(up) = dir.parent().filter(|_| dir.ends_with("deps")) {
            dirs.push(up.to_path_buf());
        }
        dirs.push(dir);
    }
    dirs.iter()
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            Error::Missing(format!(
                "{name} not found in {dirs:?}: run `cargo build -p linkerd-cni-tests --bins` \
                 or set {BIN_DIR_ENV}"
            ))
        })
}

/// Where this library keeps copies of the binaries it runs as another UID: root-owned,
/// world-readable, writable by root only, and outside any checkout. A checkout in a home
/// directory (mode 0700, as `/root` is) cannot be traversed by UID 2102, 1000 or 65534, so its
/// `target/` is no place to exec them from.
pub const SHARED_DIR: &str = "/run/linkerd-cni-tests";

/// `program` as a path that a process with `uid`, `gid` and supplementary `groups` can execute:
/// `program` itself when every directory on the way and the file let that identity through,
/// else a copy in this process's own directory below [`SHARED_DIR`] (made once per program and
/// process, removed at exit; those of dead processes are removed by the next one).
pub fn runnable_as(program: &Path, uid: u32, gid: u32, groups: &[u32]) -> Result<PathBuf> {
    let real = fs::canonicalize(program).ctx(|| format!("resolving {}", program.display()))?;
    // The kernel walks the path as given (symlinked directories included), then the target.
    let given = std::path::absolute(program).ctx(|| format!("resolving {}", program.display()))?;
    if uid == 0 || (reachable(&given, uid, gid, groups) && reachable(&real, uid, gid, groups)) {
        return Ok(program.to_path_buf());
    }
    shared_copy(&real)
}

/// Whether `uid`/`gid`/`groups` may search every ancestor of `path` and execute `path` (mode
/// bits only, symlinks followed).
fn reachable(path: &Path, uid: u32, gid: u32, groups: &[u32]) -> bool {
    path.ancestors().all(|p| {
        fs::metadata(p).is_ok_and(|m| {
            let (owner, group) = (MetadataExt::uid(&m), m.gid());
            may_execute(m.mode(), owner, group, uid, gid, groups)
        })
    })
}

/// The execute (for directories: search) permission of `mode`, owned by `owner`:`group`, for
/// `uid`/`gid`/`groups`, as the kernel checks it: the owner's bits, else the group's, else
/// the others'.
fn may_execute(mode: u32, owner: u32, group: u32, uid: u32, gid: u32, groups: &[u32]) -> bool {
    let shift = if owner == uid {
        6
    } else if group == gid || groups.contains(&group) {
        3
    } else {
        0
    };
    (mode >> shift) & 0o1 != 0
}

/// This process's copies: its directory below [`SHARED_DIR`] and what was copied there.
struct Copies {
    dir: Option<PathBuf>,
    /// (source, its mtime and size) → the copy.
    made: BTreeMap<(PathBuf, SystemTime, u64), PathBuf>,
}

static COPIES: Mutex<Copies> = Mutex::new(Copies {
    dir: None,
    made: BTreeMap::new(),
});

/// The copy of `real` (a canonical path) in this process's shared directory.
fn shared_copy(real: &Path) -> Result<PathBuf> {
    let meta = fs::metadata(real).ctx(|| format!("stat {}", real.display()))?;
    let key = (
        real.to_path_buf(),
        meta.modified()
            .ctx(|| format!("mtime of {}", real.display()))?,
        meta.len(),
    );
    let mut copies = COPIES.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(copy) = copies.made.get(&key) {
        return Ok(copy.clone());
    }
    let dir = match &copies.dir {
        Some(dir) => dir.clone(),
        None => {
            let dir = process_dir()?;
            copies.dir = Some(dir.clone());
            dir
        }
    };
    let name = real
        .file_name()
        .map_or_else(|| "program".into(), |n| n.to_string_lossy().into_owned());
    let copy = dir.join(format!("{}-{name}", copies.made.len()));
    let tmp = dir.join(format!("{}-{name}.tmp", copies.made.len()));
    // `cp` writes the copy in a process of its own: this (multithreaded) process never holds
    // the file open for writing, so no concurrently forked child can inherit such an fd and
    // make the exec fail with ETXTBSY.
    crate::names::run(Command::new("cp").arg("--").arg(real).arg(&tmp))?;
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755))
        .ctx(|| format!("chmod {}", tmp.display()))?;
    fs::rename(&tmp, &copy).ctx(|| format!("renaming to {}", copy.display()))?;
    copies.made.insert(key, copy.clone());
    Ok(copy)
}

/// This process's directory below [`SHARED_DIR`], `l5dt-<pid>-<n>`, created 0755 after the
/// directories of dead processes were removed, and removed when the process exits.
fn process_dir() -> Result<PathBuf> {
    let root = Path::new(SHARED_DIR);
    match fs::DirBuilder::new().mode(0o755).create(root) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(Error::io(format!("creating {SHARED_DIR}"), e)),
    }
    check_private_to_root(root)?;
    fs::set_permissions(root, fs::Permissions::from_mode(0o755))
        .ctx(|| format!("chmod {SHARED_DIR}"))?;
    reap_stale_copies();
    let dir = root.join(crate::names::unique_name());
    // A directory of this name can only be left by a dead process that had our PID.
    let _ = fs::remove_dir_all(&dir);
    fs::DirBuilder::new()
        .mode(0o755)
        .create(&dir)
        .ctx(|| format!("creating {}", dir.display()))?;
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755))
        .ctx(|| format!("chmod {}", dir.display()))?;
    if PROCESS_DIR.set(dir.clone()).is_ok() {
        // SAFETY: registers a plain function with no preconditions; it runs at `exit`.
        unsafe { libc::atexit(remove_process_dir) };
    }
    Ok(dir)
}

/// Set once: the directory [`remove_process_dir`] removes.
static PROCESS_DIR: OnceLock<PathBuf> = OnceLock::new();

extern "C" fn remove_process_dir() {
    if let Some(dir) = PROCESS_DIR.get() {
        let _ = fs::remove_dir_all(dir);
    }
}

/// Fails unless `dir` is a real directory (no symlink), owned by this process's effective
/// UID, that nobody else may write to: the copies in it are executed as other UIDs.
fn check_private_to_root(dir: &Path) -> Result<()> {
    let m = fs::symlink_metadata(dir).ctx(|| format!("stat {}", dir.display()))?;
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    if !m.is_dir() || MetadataExt::uid(&m) != euid || m.mode() & 0o022 != 0 {
        return Err(Error::Missing(format!(
            "{} must be a directory owned by UID {euid} that only it may write to \
             (found {:?}, owner {}, mode {:o})",
            dir.display(),
            m.file_type(),
            MetadataExt::uid(&m),
            m.mode() & 0o7777
        )));
    }
    Ok(())
}

/// Removes the directories below [`SHARED_DIR`] whose processes are gone.
pub fn reap_stale_copies() {
    if let Ok(entries) = fs::read_dir(SHARED_DIR) {
        for e in entries.flatten() {
            if e.file_name().to_str().is_some_and(crate::names::is_stale) {
                let _ = fs::remove_dir_all(e.path());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn execute_permission_follows_owner_then_group_then_others() {
        /// (mode, owner, group, uid, gid, supplementary groups, allowed)
        type Case = (u32, u32, u32, u32, u32, &'static [u32], bool);
        let cases: [Case; 8] = [
            (0o700, 0, 0, 2102, 2102, &[], false),
            (0o755, 0, 0, 2102, 2102, &[], true),
            (0o711, 0, 0, 1000, 1000, &[], true),
            (0o750, 0, 5, 1000, 5, &[], true),
            (0o750, 0, 5, 1000, 1000, &[5], true),
            (0o705, 0, 5, 1000, 5, &[], false),
            (0o070, 2102, 0, 2102, 0, &[], false),
            (0o100, 2102, 0, 2102, 2102, &[], true),
        ];
        for (mode, owner, group, uid, gid, groups, want) in cases {
            assert_eq!(
                may_execute(mode, owner, group, uid, gid, groups),
                want,
                "mode {mode:o} owner {owner}:{group} for {uid}:{gid} {groups:?}"
            );
        }
    }
}
