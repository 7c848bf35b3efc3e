//! Child cgroups (v2) for test pods, removed on drop.
//!
//! The cgroup2 mount is found in `/proc/self/mountinfo` (hybrid hosts mount it at
//! `/sys/fs/cgroup/unified`, unified ones at `/sys/fs/cgroup`). A guard's cgroup is a child of
//! that root named `l5dt-<pid>-<n>`; processes still inside when it is dropped are moved back to
//! the parent first.

use std::{
    fs,
    io::Write,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use crate::{
    error::{Error, IoContext, Result},
    names,
};

/// The mount point of the cgroup v2 hierarchy, from `/proc/self/mountinfo`.
pub fn cgroup2_root() -> Result<PathBuf> {
    let info = fs::read_to_string("/proc/self/mountinfo").ctx(|| "reading /proc/self/mountinfo")?;
    parse_cgroup2_root(&info)
        .ok_or_else(|| Error::Missing("no cgroup2 mount in /proc/self/mountinfo".into()))
}

/// The first cgroup2 mount point in a mountinfo text.
fn parse_cgroup2_root(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        // `<id> <parent> <maj:min> <root> <mount point> <options> [optional...] - <fstype> ...`
        let (left, right) = line.split_once(" - ")?;
        if right.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        left.split_whitespace()
            .nth(4)
            .map(|p| PathBuf::from(unescape_octal(p)))
    })
}

/// Undoes mountinfo's `\040`-style escaping of spaces and friends.
fn unescape_octal(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let v = (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The PIDs listed in a cgroup's `cgroup.procs`.
pub fn processes_of(cgroup: &Path) -> Result<Vec<u32>> {
    let file = cgroup.join("cgroup.procs");
    let text = fs::read_to_string(&file).ctx(|| format!("reading {}", file.display()))?;
    Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect())
}

/// Moves process `pid` (all its threads) into `cgroup`.
pub fn move_process(cgroup: &Path, pid: u32) -> Result<()> {
    let file = cgroup.join("cgroup.procs");
    let mut f = fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .ctx(|| format!("opening {}", file.display()))?;
    f.write_all(format!("{pid}\n").as_bytes())
        .ctx(|| format!("moving pid {pid} into {}", cgroup.display()))
}

/// Removes a cgroup and its descendants, moving their processes to the cgroup's parent.
/// Best effort: used on drop and to reap leftovers.
pub(crate) fn remove_tree(cgroup: &Path) {
    if let Ok(entries) = fs::read_dir(cgroup) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&e.path());
            }
        }
    }
    let parent = cgroup.parent().map(Path::to_path_buf);
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        if let Some(parent) = &parent {
            for pid in processes_of(cgroup).unwrap_or_default() {
                // The process may have exited meanwhile (ESRCH): nothing to move then.
                let _ = move_process(parent, pid);
            }
        }
        match fs::remove_dir(cgroup) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            // EBUSY while exiting tasks are still being released.
            Err(e) if Instant::now() >= deadline => {
                eprintln!(
                    "linkerd-cni-tests: cannot remove cgroup {}: {e}",
                    cgroup.display()
                );
                return;
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// A child cgroup (v2) for one test pod, removed on drop.
#[derive(Debug)]
pub struct CgroupGuard {
    path: PathBuf,
    /// Ancestors [`CgroupGuard::at`] created, removed on drop when left empty (innermost first).
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
    /// cgroup2 root, such as kubelet's `kubepods/besteffort/pod<uid>`. The ancestors it created
    /// are removed on drop if nothing else is in them.
    pub fn at(relative: &Path) -> Result<Self> {
        let root = cgroup2_root()?;
        let path = root.join(relative);
        let mut created_parents = Vec::new();
        let mut missing = Vec::new();
        let mut up = path.parent();
        while let Some(dir) = up.filter(|d| *d != root && !d.exists()) {
            missing.push(dir.to_path_buf());
            up = dir.parent();
        }
        for dir in missing.iter().rev() {
            match fs::create_dir(dir) {
                Ok(()) => created_parents.insert(0, dir.clone()),
                // Another test made it meanwhile: not ours to remove.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(Error::io(format!("creating cgroup {}", dir.display()), e)),
            }
        }
        let guard = CgroupGuard {
            path: path.clone(),
            created_parents,
        };
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
        for dir in &self.created_parents {
            // Busy (another test's cgroup inside): left for it.
            let _ = fs::remove_dir(dir);
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_cgroup2_in_mountinfo() {
        let cases = [
            (
                "25 30 0:23 / /sys/fs/cgroup rw,nosuid - tmpfs tmpfs rw\n\
                 41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n",
                Some("/sys/fs/cgroup/unified"),
            ),
            (
                "30 1 0:26 / /sys/fs/cgroup rw shared:4 - cgroup2 cgroup2 rw,nsdelegate\n",
                Some("/sys/fs/cgroup"),
            ),
            (
                "30 1 0:26 / /mnt/cg\\040v2 rw - cgroup2 none rw\n",
                Some("/mnt/cg v2"),
            ),
            (
                "25 30 0:23 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n",
                None,
            ),
        ];
        for (text, want) in cases {
            assert_eq!(
                parse_cgroup2_root(text),
                want.map(PathBuf::from),
                "mountinfo {text:?}"
            );
        }
    }
}
