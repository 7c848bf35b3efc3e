//! Child cgroups (v2) for test pods, removed on drop.
//!
//! A guard's cgroup is a child of the cgroup2 root ([`cgroup2_root`], from
//! [`crate::hostfs`]) named `l5dt-<pid>-<n>`; processes still inside when it is dropped are
//! moved back to the parent first.

use std::{
    collections::BTreeMap,
    fs,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    sync::{Mutex, MutexGuard, PoisonError},
};

use crate::{
    error::{Error, IoContext, Result},
    hostfs::remove_tree,
    names,
};

pub use crate::hostfs::{cgroup2_root, move_process, processes_of};

/// A child cgroup (v2) for one test pod, removed on drop.
#[derive(Debug)]
pub struct CgroupGuard {
    path: PathBuf,
    /// Ancestors [`CgroupGuard::at`] created or shares (see [`scaffold`]), innermost first.
    created_parents: Vec<PathBuf>,
}

impl CgroupGuard {
    /// Creates `l5dt-<pid>-<n>` under the cgroup2 root.
    pub fn new() -> Result<Self> {
        names::reap_stale();
        Self::new_under(&cgroup2_root()?)
    }

    /// Creates a uniquely named child of `parent` (any cgroup2 directory).
    pub fn new_under(parent: &Path) -> Result<Self> {
        let path = parent.join(names::unique_name());
        fs::create_dir(&path).ctx(|| format!("creating cgroup {}", path.display()))?;
        Ok(CgroupGuard {
            path,
            created_parents: Vec::new(),
        })
    }

    /// Creates the cgroup `relative` (a new directory, with any missing ancestors) under the
    /// cgroup2 root, such as kubelet's `kubepods/besteffort/pod<uid>`. The ancestors this
    /// process's guards created are shared by them (a count per directory in [`scaffold`]) and
    /// removed when the last guard below them drops; ancestors that were there before are
    /// never removed.
    pub fn at(relative: &Path) -> Result<Self> {
        let root = cgroup2_root()?;
        let path = root.join(relative);
        let mut ancestors: Vec<PathBuf> = path
            .ancestors()
            .skip(1)
            .take_while(|d| *d != root)
            .map(Path::to_path_buf)
            .collect();
        ancestors.reverse();
        let mut guard = CgroupGuard {
            path: path.clone(),
            created_parents: Vec::new(),
        };
        let mut shared = scaffold();
        for dir in ancestors {
            if let Some(users) = shared.get_mut(&dir) {
                *users += 1;
            } else if dir.exists() {
                continue;
            } else {
                match fs::create_dir(&dir) {
                    Ok(()) => {
                        shared.insert(dir.clone(), 1);
                    }
                    // Another process made it meanwhile: not ours to remove.
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                    Err(e) => {
                        return Err(Error::io(format!("creating cgroup {}", dir.display()), e));
                    }
                }
            }
            guard.created_parents.insert(0, dir);
        }
        drop(shared);
        fs::create_dir(&path).ctx(|| format!("creating cgroup {}", path.display()))?;
        Ok(guard)
    }

    /// The cgroup directory (what the agent attaches programs to).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The cgroup id: what `bpf_get_current_cgroup_id` returns for tasks inside (the
    /// directory's inode number in cgroupfs).
    pub fn id(&self) -> Result<u64> {
        Ok(fs::metadata(&self.path)
            .ctx(|| format!("stat {}", self.path.display()))?
            .ino())
    }

    /// Moves process `pid` (all its threads) into this cgroup.
    pub fn add_process(&self, pid: u32) -> Result<()> {
        move_process(&self.path, pid)
    }

    /// The processes currently in this cgroup.
    pub fn processes(&self) -> Result<Vec<u32>> {
        processes_of(&self.path)
    }

    /// The path of this cgroup relative to the cgroup2 root, as `/proc/<pid>/cgroup` shows it
    /// (`0::/<relative>`).
    pub fn relative_path(&self) -> Result<String> {
        let root = cgroup2_root()?;
        let rel = self.path.strip_prefix(&root).map_err(|_| {
            Error::Missing(format!(
                "{} is not under {}",
                self.path.display(),
                root.display()
            ))
        })?;
        Ok(format!("/{}", rel.display()))
    }
}

impl Drop for CgroupGuard {
    fn drop(&mut self) {
        remove_tree(&self.path);
        let mut shared = scaffold();
        for dir in &self.created_parents {
            let users = shared.get_mut(dir).map(|users| {
                *users -= 1;
                *users
            });
            if users == Some(0) {
                shared.remove(dir);
                // The last guard below it: no pod of this process is inside any more. A
                // straggler moved up out of a pod cgroup (see `remove_tree`) may still be
                // exiting: the same wait and move as for the pod's own cgroup (a bare
                // `remove_dir` failed with EBUSY then, and left `kubepods/besteffort` behind
                // after `migrate`).
                remove_tree(dir);
            }
        }
    }
}

/// The ancestor cgroups [`CgroupGuard::at`] created in this process, with how many live
/// guards are below each: two tests making pods under `kubepods/besteffort` at once share it,
/// and whichever drops last removes it (with one owner, a pod of the other test kept it busy
/// when the owner dropped, and it was left behind).
fn scaffold() -> MutexGuard<'static, BTreeMap<PathBuf, usize>> {
    static SCAFFOLD: Mutex<BTreeMap<PathBuf, usize>> = Mutex::new(BTreeMap::new());
    SCAFFOLD.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The cgroup v2 path (relative to the root) of process `pid`, from `/proc/<pid>/cgroup`.
pub fn cgroup_of(pid: u32) -> Result<String> {
    let file = format!("/proc/{pid}/cgroup");
    let text = fs::read_to_string(&file).ctx(|| format!("reading {file}"))?;
    text.lines()
        .find_map(|l| l.strip_prefix("0::").map(str::to_string))
        .ok_or_else(|| Error::Parse {
            what: file,
            detail: format!("no cgroup v2 line in {text:?}"),
        })
}
