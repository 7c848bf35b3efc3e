//! A running pod as the host sees it, for adopting pods that started before the CNI plugin
//! was in their node's chain: the processes in the pod's cgroup (v2, or any v1 hierarchy on a
//! hybrid host), the one network namespace they share, and the sockets listening in it (the
//! proxy's), read from `/proc`.
//!
//! [`take_socket`] duplicates a socket another process owns into the agent
//! (`pidfd_open` + `pidfd_getfd`), so that a listener the proxy opened before the programs
//! were attached can still be registered in the listener SOCKHASH.
//!
//! # Minimum kernel version
//! 5.6 (`pidfd_getfd`).

use std::{
    collections::BTreeSet,
    fs, io,
    os::{
        fd::{FromRawFd, OwnedFd},
        unix::fs::MetadataExt,
    },
    path::{Path, PathBuf},
    sync::OnceLock,
};

use crate::host::cgroup;

/// Why a running pod cannot be adopted safely (now or ever).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ScanError {
    /// No cgroup of the pod UID exists under any hierarchy.
    #[error("no cgroup found for the pod")]
    NoCgroup,
    /// The pod's cgroup holds no process (not started yet, or every container exited).
    #[error("no process in the pod's cgroup {0}")]
    NoProcess(PathBuf),
    /// The pod's processes are not all in one network namespace.
    #[error("the pod's processes are in {0} different network namespaces")]
    AmbiguousNetns(usize),
    /// The processes run in the host's (or the agent's) network namespace.
    #[error("the pod's processes run in the host network namespace")]
    HostNetns,
    /// `/proc` could not be read.
    #[error("{0}")]
    Io(String),
}

/// What was found of a running pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunningPod {
    /// The pod's cgroup v2 directory, when there is one (programs attach there); `None` when
    /// only v1 hierarchies hold the pod (the shared attachment applies).
    pub cgroup_v2: Option<PathBuf>,
    /// Every process of the pod (all containers).
    pub pids: Vec<u32>,
    /// Inode of the network namespace they share.
    pub netns_ino: u64,
}

/// The mount points of the host's cgroup v1 hierarchies, read from `/proc/self/mountinfo` on
/// first use and then kept: one value serves one scan of the node's pods. The mount table of a
/// node holds several mounts per pod (its netns pin, its volumes): at 10,000 pods reading it
/// costs milliseconds of kernel time (every line formatted anew), so it is read at most once a
/// scan, and not at all when every pod looked at has a cgroup v2 directory.
#[derive(Debug)]
pub struct V1Hierarchies {
    mountinfo: PathBuf,
    within: PathBuf,
    roots: OnceLock<Result<Vec<PathBuf>, ScanError>>,
}

impl V1Hierarchies {
    /// The hierarchies mounted under `within` (the host's root as the agent sees it), listed
    /// in the mount table `mountinfo` (`/proc/self/mountinfo`).
    pub fn new(mountinfo: impl Into<PathBuf>, within: impl Into<PathBuf>) -> Self {
        Self {
            mountinfo: mountinfo.into(),
            within: within.into(),
            roots: OnceLock::new(),
        }
    }

    /// The mount points, reading the mount table the first time only.
    pub fn roots(&self) -> Result<&[PathBuf], ScanError> {
        self.roots
            .get_or_init(|| {
                let text = fs::read_to_string(&self.mountinfo)
                    .map_err(|e| ScanError::Io(format!("{}: {e}", self.mountinfo.display())))?;
                Ok(v1_roots(&text, &self.within))
            })
            .as_ref()
            .map(Vec::as_slice)
            .map_err(Clone::clone)
    }
}

/// The pod with UID `uid`: its cgroup under the cgroup2 root `cgroup_root` (or, without one,
/// under the v1 hierarchies `v1`, read only then), its processes and their netns. `proc_root`
/// is the host's `/proc` as the agent sees it.
pub fn find(
    cgroup_root: &Path,
    v1: &V1Hierarchies,
    proc_root: &Path,
    uid: &str,
) -> Result<RunningPod, ScanError> {
    let v2 = cgroup::resolve(cgroup_root, None, Some(uid));
    let dirs: Vec<PathBuf> = match &v2 {
        Some(dir) => vec![dir.clone()],
        None => v1
            .roots()?
            .iter()
            .filter_map(|root| cgroup::resolve(root, None, Some(uid)))
            .collect(),
    };
    if dirs.is_empty() {
        return Err(ScanError::NoCgroup);
    }
    let mut pids = BTreeSet::new();
    for dir in &dirs {
        collect_pids(dir, 0, &mut pids);
    }
    if pids.is_empty() {
        return Err(ScanError::NoProcess(dirs[0].clone()));
    }
    let mut namespaces = BTreeSet::new();
    for pid in &pids {
        // A process that exited since the listing has no namespace left to look at.
        if let Ok(meta) = fs::metadata(proc_root.join(pid.to_string()).join("ns/net")) {
            namespaces.insert(meta.ino());
        }
    }
    let netns_ino = match namespaces.len() {
        0 => return Err(ScanError::NoProcess(dirs[0].clone())),
        1 => *namespaces.first().unwrap_or(&0),
        n => return Err(ScanError::AmbiguousNetns(n)),
    };
    let host = [
        proc_root.join("1/ns/net"),
        PathBuf::from("/proc/self/ns/net"),
    ];
    if host
        .iter()
        .any(|p| fs::metadata(p).is_ok_and(|m| m.ino() == netns_ino))
    {
        return Err(ScanError::HostNetns);
    }
    Ok(RunningPod {
        cgroup_v2: v2,
        pids: pids.into_iter().collect(),
        netns_ino,
    })
}

/// The processes of `dir` and its descendants (container cgroups under the pod's), a few
/// levels deep.
fn collect_pids(dir: &Path, depth: usize, out: &mut BTreeSet<u32>) {
    if let Ok(text) = fs::read_to_string(dir.join("cgroup.procs")) {
        out.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
    }
    if depth >= 4 {
        return;
    }
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                collect_pids(&e.path(), depth + 1, out);
            }
        }
    }
}

/// The mount points of cgroup v1 hierarchies under `within`, from mountinfo text.
pub fn v1_roots(mountinfo: &str, within: &Path) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (pre, post) = line.split_once(" - ")?;
            let mount = PathBuf::from(pre.split_whitespace().nth(4)?.replace("\\040", " "));
            (post.split_whitespace().next()? == "cgroup" && mount.starts_with(within))
                .then_some(mount)
        })
        .collect()
}

/// A path of the netns with inode `ino` a runtime keeps (`<dir>/<name>` in one of `dirs`,
/// such as containerd's `/var/run/netns/cni-<uuid>`), so the registration outlives any one
/// process; `None` when no such file exists.
pub fn pinned_netns(dirs: &[PathBuf], ino: u64) -> Option<PathBuf> {
    dirs.iter().find_map(|dir| {
        fs::read_dir(dir).ok()?.flatten().find_map(|e| {
            let path = e.path();
            // Opened as a namespace file (nsfs), not just a file with the same inode number.
            crate::host::netns::Netns::open(&path)
                .is_ok_and(|ns| ns.ino == ino)
                .then_some(path)
        })
    })
}

/// A TCP socket in the `LISTEN` state, from `/proc/<pid>/net/tcp{,6}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Listening {
    /// `AF_INET` or `AF_INET6`.
    pub family: u32,
    pub port: u16,
    /// Owner (as the host sees it).
    pub uid: u32,
    /// Socket inode (what `/proc/<pid>/fd/<n>` links to as `socket:[<inode>]`).
    pub inode: u64,
}

/// `/proc/net/tcp` state of a listening socket.
const TCP_LISTEN: &str = "0A";

/// The listening TCP sockets of `pid`'s network namespace.
pub fn listening(proc_root: &Path, pid: u32) -> io::Result<Vec<Listening>> {
    let dir = proc_root.join(pid.to_string()).join("net");
    let mut out = Vec::new();
    for (file, family) in [
        ("tcp", linkerd_cni_common::AF_INET),
        ("tcp6", linkerd_cni_common::AF_INET6),
    ] {
        match fs::read_to_string(dir.join(file)) {
            Ok(text) => out.extend(parse_listening(&text, family)),
            // No IPv6 in this kernel: no tcp6 file.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// The `LISTEN` rows of a `/proc/net/tcp` or `tcp6` table.
pub fn parse_listening(text: &str, family: u32) -> Vec<Listening> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 10 || f[3] != TCP_LISTEN {
                return None;
            }
            let port = u16::from_str_radix(f[1].rsplit(':').next()?, 16).ok()?;
            Some(Listening {
                family,
                port,
                uid: f[7].parse().ok()?,
                inode: f[9].parse().ok()?,
            })
        })
        .collect()
}

/// Which of `pids` holds the socket with inode `inode`, and under which fd number.
pub fn owner_of(proc_root: &Path, pids: &[u32], inode: u64) -> Option<(u32, i32)> {
    let wanted = format!("socket:[{inode}]");
    pids.iter().find_map(|pid| {
        let dir = proc_root.join(pid.to_string()).join("fd");
        fs::read_dir(dir).ok()?.flatten().find_map(|e| {
            let target = fs::read_link(e.path()).ok()?;
            (target.as_os_str() == wanted.as_str())
                .then(|| e.file_name().to_str()?.parse().ok().map(|fd| (*pid, fd)))
                .flatten()
        })
    })
}

/// Whether the agent runs in the PID namespace of the host's `/proc` (`proc_root`):
/// [`take_socket`] needs the host's PIDs to be the agent's (`hostPID: true` in a DaemonSet).
pub fn in_host_pid_namespace(proc_root: &Path) -> io::Result<bool> {
    // `self` in a procfs names the reader's PID in that procfs's PID namespace (a process of
    // a child namespace has another PID there). `/proc/1/ns/*` may be unreadable, even to root.
    let me = fs::read_link(proc_root.join("self"))?;
    Ok(me.as_os_str() == std::process::id().to_string().as_str())
}

/// A duplicate, in this process, of fd `fd` of process `pid` (`pidfd_open` + `pidfd_getfd`).
/// `pid` is a PID of the agent's own PID namespace.
pub fn take_socket(pid: u32, fd: i32) -> io::Result<OwnedFd> {
    let pid =
        libc::pid_t::try_from(pid).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: plain syscalls; on success each returns a new fd that we own.
    unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, pid, 0);
        if pidfd < 0 {
            return Err(io::Error::last_os_error());
        }
        let pidfd = OwnedFd::from_raw_fd(pidfd as i32);
        let dup = libc::syscall(
            libc::SYS_pidfd_getfd,
            std::os::fd::AsRawFd::as_raw_fd(&pidfd),
            fd,
            0,
        );
        if dup < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(OwnedFd::from_raw_fd(dup as i32))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_rows_parse() {
        let tcp = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
            0: 00000000:102F 00000000:0000 0A 00000000:00000000 00:00000000 00000000  2102        0 4242 1 0 100 0 0 10 0\n\
            1: 0100007F:102C 00000000:0000 0A 00000000:00000000 00:00000000 00000000  2102        0 4243 1 0 100 0 0 10 0\n\
            2: 0100007F:9C40 0100007F:102C 01 00000000:00000000 00:00000000 00000000  1000        0 4244 1 0 100 0 0 10 0\n";
        let rows = parse_listening(tcp, 2);
        assert_eq!(
            rows,
            vec![
                Listening {
                    family: 2,
                    port: 4143,
                    uid: 2102,
                    inode: 4242
                },
                Listening {
                    family: 2,
                    port: 4140,
                    uid: 2102,
                    inode: 4243
                },
            ]
        );
        assert!(parse_listening("header only\n", 10).is_empty());
    }

    #[test]
    fn own_procfs_is_own_pid_namespace() {
        assert!(in_host_pid_namespace(Path::new("/proc")).expect("/proc/self"));
    }

    #[test]
    fn v1_hierarchies_from_mountinfo() {
        let info = "25 30 0:23 / /sys/fs/cgroup rw,nosuid - tmpfs tmpfs rw\n\
            41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n\
            42 31 0:39 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n\
            43 31 0:40 / /host/sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n";
        assert_eq!(
            v1_roots(info, Path::new("/")),
            vec![
                PathBuf::from("/sys/fs/cgroup/pids"),
                PathBuf::from("/host/sys/fs/cgroup/cpu")
            ]
        );
        assert_eq!(
            v1_roots(info, Path::new("/host")),
            vec![PathBuf::from("/host/sys/fs/cgroup/cpu")]
        );
    }

    /// A scan reads the mount table once, and not at all while pods resolve in cgroup v2: a
    /// node's table has tens of thousands of lines, and an adoption pass looks at every pod
    /// not yet registered (each pending pod read it, ~5 ms each at 10,000 pods).
    #[test]
    fn v1_hierarchies_are_read_once_and_only_when_needed() {
        let dir = std::env::temp_dir().join(format!("l5d-podscan-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let v2_root = dir.join("unified");
        let v1_root = dir.join("pids");
        fs::create_dir_all(v2_root.join("kubepods/besteffort/podv2pod")).expect("v2 cgroup");
        fs::create_dir_all(v1_root.join("kubepods/besteffort/podv1pod")).expect("v1 cgroup");
        let mountinfo = dir.join("mountinfo");

        // No mount table at all: a pod found in cgroup v2 never needs it.
        let scan = V1Hierarchies::new(&mountinfo, "/");
        let found = find(&v2_root, &scan, Path::new("/proc"), "v2pod");
        assert!(
            matches!(&found, Err(ScanError::NoProcess(d)) if d.ends_with("podv2pod")),
            "{found:?}"
        );
        assert!(matches!(scan.roots(), Err(ScanError::Io(_))));

        // Read on first need, then kept: the table is gone by the second pod.
        fs::write(
            &mountinfo,
            format!(
                "42 31 0:39 / {} rw,relatime - cgroup cgroup rw,pids\n",
                v1_root.display()
            ),
        )
        .expect("mountinfo");
        let scan = V1Hierarchies::new(&mountinfo, "/");
        let found = find(&v2_root, &scan, Path::new("/proc"), "v1pod");
        assert!(
            matches!(&found, Err(ScanError::NoProcess(d)) if d.ends_with("podv1pod")),
            "{found:?}"
        );
        fs::remove_file(&mountinfo).expect("rm mountinfo");
        assert_eq!(scan.roots().expect("kept"), std::slice::from_ref(&v1_root));
        let found = find(&v2_root, &scan, Path::new("/proc"), "v1pod");
        assert!(matches!(&found, Err(ScanError::NoProcess(_))), "{found:?}");
        assert_eq!(
            find(&v2_root, &scan, Path::new("/proc"), "nowhere"),
            Err(ScanError::NoCgroup)
        );
        fs::remove_dir_all(&dir).expect("cleanup");
    }
}
