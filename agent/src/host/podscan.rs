//! A running pod as the host sees it, for adopting pods that started before the CNI plugin
//! was in their node's chain: its cgroup (v2, or any v1 hierarchy on a hybrid host) found by
//! pod UID, and its network namespace found among the runtime's netns pins by the pod's
//! address ([`crate::host::podnetns`]).
//!
//! Nothing here reads another process's `/proc` entries: the agent needs neither the host's
//! PID namespace nor any access to the pod's processes.

use std::{
    fs,
    net::IpAddr,
    path::{Path, PathBuf},
    sync::{Mutex, OnceLock},
};

use crate::host::{
    cgroup,
    podnetns::{Found, NetnsIndex},
};

/// Why a running pod cannot be adopted (now, or safely at all).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ScanError {
    /// No cgroup of the pod UID exists under any hierarchy.
    #[error("no cgroup found for the pod")]
    NoCgroup,
    /// The pod's cgroup holds no process (not started yet, or every container exited).
    #[error("no process in the pod's cgroup {0}")]
    NoProcess(PathBuf),
    /// The API reports no address for the pod yet.
    #[error("the pod has no address yet")]
    NoAddress,
    /// No network namespace pinned by the runtime holds the pod's address (its sandbox is not
    /// set up yet, or the runtime pins its namespaces elsewhere).
    #[error("no network namespace under {0} holds the pod's address")]
    NoNetns(String),
    /// Several network namespaces hold the pod's address: which one is the pod's is unknown.
    #[error("{0} network namespaces hold the pod's address")]
    AmbiguousNetns(usize),
    /// The pod's address is the agent's own network namespace's (the host's).
    #[error("the pod's address is in the host network namespace")]
    HostNetns,
    /// The filesystem could not be read.
    #[error("{0}")]
    Io(String),
}

/// What was found of a running pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunningPod {
    /// The pod's cgroup v2 directory, when there is one (programs attach there); `None` when
    /// only v1 hierarchies hold the pod (the shared attachment applies).
    pub cgroup_v2: Option<PathBuf>,
    /// The runtime's pin of the pod's network namespace, as the agent sees it.
    pub netns_path: PathBuf,
    /// Its inode.
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

/// One scan of the node's pods: the cgroup v1 hierarchies, read at most once, and whether the
/// netns index (kept across scans) was brought up to date yet: at most once a scan, the first
/// time a pod needs it.
#[derive(Debug)]
pub struct PodScan {
    pub v1: V1Hierarchies,
    refreshed: OnceLock<()>,
}

impl PodScan {
    /// A scan with the cgroup v1 hierarchies `v1`.
    pub fn new(v1: V1Hierarchies) -> Self {
        Self {
            v1,
            refreshed: OnceLock::new(),
        }
    }

    /// The netns among those of `index` that holds `ips`, refreshing the index first if this
    /// scan has not yet.
    pub fn netns_of(&self, index: &Mutex<NetnsIndex>, ips: &[IpAddr]) -> Found {
        let mut index = index.lock().unwrap_or_else(|p| p.into_inner());
        self.refreshed.get_or_init(|| {
            let stats = index.refresh();
            tracing::debug!(
                pins = stats.pins,
                entered = stats.entered,
                "netns index refreshed"
            );
        });
        index.find(ips)
    }
}

/// The pod with UID `uid` and addresses `ips`: its cgroup under the cgroup2 root
/// `cgroup_root` (or, without one, under the v1 hierarchies of `scan`, read only then), and
/// the runtime's pin of its network namespace, from `index`.
pub fn find(
    cgroup_root: &Path,
    scan: &PodScan,
    index: &Mutex<NetnsIndex>,
    uid: &str,
    ips: &[IpAddr],
) -> Result<RunningPod, ScanError> {
    let v2 = cgroup::resolve(cgroup_root, None, Some(uid));
    match &v2 {
        Some(dir) => {
            // `populated` counts the processes of the whole subtree, whatever PID namespace
            // they are in (`cgroup.procs` would show 0 for every PID the agent cannot see).
            if !populated(dir) {
                return Err(ScanError::NoProcess(dir.clone()));
            }
        }
        None => {
            let found = scan
                .v1
                .roots()?
                .iter()
                .any(|root| cgroup::resolve(root, None, Some(uid)).is_some());
            if !found {
                return Err(ScanError::NoCgroup);
            }
        }
    }
    if ips.is_empty() {
        return Err(ScanError::NoAddress);
    }
    match scan.netns_of(index, ips) {
        Found::One { path, ino } => Ok(RunningPod {
            cgroup_v2: v2,
            netns_path: path,
            netns_ino: ino,
        }),
        Found::Own => Err(ScanError::HostNetns),
        Found::None { searched } => Err(ScanError::NoNetns(searched)),
        Found::Several(n) => Err(ScanError::AmbiguousNetns(n)),
    }
}

/// Whether the cgroup v2 directory `dir` or a descendant holds a process (`cgroup.events`).
fn populated(dir: &Path) -> bool {
    fs::read_to_string(dir.join("cgroup.events"))
        .is_ok_and(|text| text.lines().any(|l| l.trim() == "populated 1"))
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

#[cfg(test)]
mod tests {
    use super::*;

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

        let index = Mutex::new(NetnsIndex::new(vec![dir.join("netns")]));
        // No mount table at all: a pod found in cgroup v2 never needs it.
        let scan = PodScan::new(V1Hierarchies::new(&mountinfo, "/"));
        let found = find(&v2_root, &scan, &index, "v2pod", &[]);
        assert!(
            matches!(&found, Err(ScanError::NoProcess(d)) if d.ends_with("podv2pod")),
            "{found:?}"
        );
        assert!(matches!(scan.v1.roots(), Err(ScanError::Io(_))));

        // Read on first need, then kept: the table is gone by the second pod.
        fs::write(
            &mountinfo,
            format!(
                "42 31 0:39 / {} rw,relatime - cgroup cgroup rw,pids\n",
                v1_root.display()
            ),
        )
        .expect("mountinfo");
        let scan = PodScan::new(V1Hierarchies::new(&mountinfo, "/"));
        // Found under v1; then the pod has no address yet.
        let found = find(&v2_root, &scan, &index, "v1pod", &[]);
        assert_eq!(found, Err(ScanError::NoAddress));
        fs::remove_file(&mountinfo).expect("rm mountinfo");
        assert_eq!(
            scan.v1.roots().expect("kept"),
            std::slice::from_ref(&v1_root)
        );
        let ip: IpAddr = [192, 0, 2, 7].into();
        let found = find(&v2_root, &scan, &index, "v1pod", &[ip]);
        assert!(matches!(&found, Err(ScanError::NoNetns(_))), "{found:?}");
        assert_eq!(
            find(&v2_root, &scan, &index, "nowhere", &[ip]),
            Err(ScanError::NoCgroup)
        );
        fs::remove_dir_all(&dir).expect("cleanup");
    }
}
