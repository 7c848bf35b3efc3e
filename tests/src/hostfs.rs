//! The host's filesystems that the guards create in and the reaper of leftovers
//! ([`crate::names::reap_stale`]) clears: the cgroup v2 hierarchy (its mount point, a cgroup's
//! processes, removing a cgroup tree) and the directory of `ip netns`'s bind mounts. Below
//! [`crate::names`], [`crate::cgroup`] and [`crate::netns`], which all use it.
//!
//! The cgroup2 mount is found in `/proc/self/mountinfo` (hybrid hosts mount it at
//! `/sys/fs/cgroup/unified`, unified ones at `/sys/fs/cgroup`).

use std::{
    fs,
    io::Write,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use crate::error::{Error, IoContext, Result};

/// Where `ip netns` keeps its bind mounts.
pub const NETNS_RUN_DIR: &str = "/run/netns";

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

/// Undoes mountinfo's `\040`-style escaping of spaces and friends (three octal digits of a
/// byte; anything else is kept as it is).
pub(crate) fn unescape_octal(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = (bytes[i] == b'\\' && i + 3 < bytes.len())
            .then(|| &bytes[i + 1..i + 4])
            .filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)))
            .and_then(|d| {
                let v = d.iter().fold(0u16, |v, b| v * 8 + u16::from(b - b'0'));
                u8::try_from(v).ok()
            });
        match escaped {
            Some(v) => {
                out.push(v);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_undone_and_nothing_else() {
        assert_eq!(unescape_octal(r"/a\040b\011c\134d"), "/a b\tc\\d");
        // Not an escape: too short, not octal, over a byte; bytes around non-ASCII kept.
        assert_eq!(unescape_octal(r"/x\04"), r"/x\04");
        assert_eq!(unescape_octal(r"/x\089y"), r"/x\089y");
        assert_eq!(unescape_octal(r"/x\777y"), r"/x\777y");
        assert_eq!(unescape_octal(r"/é\040é"), "/é é");
    }

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
