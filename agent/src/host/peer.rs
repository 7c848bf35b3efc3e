//! What a peer on the registration socket names, checked before the agent acts on it.
//!
//! A root peer could otherwise send any path: a netns path with `..` or a symbolic link that
//! leads to the node's own network namespace (whose inbound TCP the pod's `sk_lookup` program
//! would then steer), or a cgroup hint naming the cgroup2 root (whose every socket the pod's
//! connect hooks would then see). So, for a request from a peer:
//!
//! - the netns path is absolute and plain (no `.` or `..` part), and either lies below one of
//!   the directories runtimes pin network namespaces in ([`PeerPlaces::netns_dirs`]), opened
//!   from that directory with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` (no symbolic
//!   link, no way out), or is a process's `/proc/<pid>/ns/net`;
//! - what it opens is a network namespace, and not the agent's own (the DaemonSet's pod has
//!   the host's network) nor that of the host's PID 1;
//! - the pod cgroup it resolves to lies strictly inside one of kubelet's pod cgroup trees
//!   ([`PeerPlaces::pod_cgroup_trees`]), and is not a QoS cgroup: never the root, a tree, a
//!   cgroup outside the trees or a cgroup that holds a whole class of pods.
//!
//! A request that fails any of these is refused with [`PeerError`] before anything is opened
//! further or written. Paths the agent finds itself (adoption) and the registry's own
//! records do not come from a peer and are not checked here.

use std::{
    fs::File,
    io,
    net::IpAddr,
    os::{fd::OwnedFd, unix::fs::MetadataExt},
    path::{Component, Path, PathBuf},
};

use nix::{
    errno::Errno,
    fcntl::{OFlag, OpenHow, ResolveFlag, open, openat2},
    sys::stat::Mode,
};

use crate::host::netns::{self, Netns, NetnsError};

/// Where a peer's paths may lead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerPlaces {
    /// Host directories where runtimes pin pods' network namespaces.
    pub netns_dirs: Vec<PathBuf>,
    /// Kubelet's pod cgroup trees, relative to the cgroup2 root.
    pub pod_cgroup_trees: Vec<PathBuf>,
}

impl Default for PeerPlaces {
    fn default() -> Self {
        use linkerd_cni_common::paths;
        Self {
            netns_dirs: paths::NETNS_DIRS.iter().map(PathBuf::from).collect(),
            pod_cgroup_trees: paths::POD_CGROUP_TREES.iter().map(PathBuf::from).collect(),
        }
    }
}

/// Why a peer's path was refused.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// The netns path is relative or has `.` or `..` parts.
    #[error("netns path {path} is not a plain absolute path (no `.` or `..` parts)")]
    NotPlain { path: String },
    /// The netns path is in none of the places runtimes put pods' network namespaces.
    #[error(
        "netns path {path} is neither below a runtime's netns directory ({dirs}) nor a \
         /proc/<pid>/ns/net"
    )]
    NetnsOutside { path: String, dirs: String },
    /// Below a netns directory, the path goes through a symbolic link or out of it.
    #[error("netns path {path} resolves through a symbolic link or out of {dir}")]
    NetnsEscapes { path: String, dir: String },
    /// The path leads to the node's own network namespace.
    #[error("netns path {path} is the node's own network namespace")]
    HostNetns { path: String },
    /// The cgroup is not a pod's cgroup inside kubelet's pod trees.
    #[error(
        "cgroup {cgroup} is not a pod's cgroup inside the pod cgroup trees ({trees}) of the \
         cgroup2 root {root}"
    )]
    CgroupOutside {
        cgroup: String,
        trees: String,
        root: String,
    },
    /// The socket the plugin passed is not of the namespace the path names.
    #[error(
        "the socket passed for netns {path} belongs to another network namespace (inode {socket_ino}, \
         the path's {path_ino})"
    )]
    SocketElsewhere {
        path: String,
        socket_ino: u64,
        path_ino: u64,
    },
    /// Reading the passed socket's namespace or cookie failed.
    #[error("the socket passed for netns {path}: {source}")]
    Socket { path: String, source: io::Error },
    /// No socket came with the ADD (a plugin older than the agent), and entering the
    /// namespace instead needs a capability the agent does not hold.
    #[error(
        "no socket from inside netns {path} came with the ADD (a linkerd-cni plugin older than \
         the agent?), and entering it needs CAP_SYS_ADMIN, which this agent does not hold: \
         retry once the agent has installed its plugin"
    )]
    NoSocket { path: String },
    /// What the path leads to is not a network namespace, or could not be opened.
    #[error(transparent)]
    Netns(#[from] NetnsError),
}

/// Where a netns path lies, as written (nothing opened yet).
#[derive(Debug, PartialEq, Eq)]
pub enum NetnsPlace<'a> {
    /// Below the netns directory `dir`, at `rest` (relative).
    Pinned { dir: &'a Path, rest: PathBuf },
    /// A process's `/proc/<pid>/ns/net`.
    Process,
}

fn plain(path: &Path) -> bool {
    let mut parts = path.components();
    parts.next() == Some(Component::RootDir) && parts.all(|c| matches!(c, Component::Normal(_)))
}

/// Classifies `path` without opening anything: refused when it is not plain or lies in none
/// of `dirs` nor `/proc/<pid>/ns/net`.
pub fn netns_place<'a>(path: &Path, dirs: &'a [PathBuf]) -> Result<NetnsPlace<'a>, PeerError> {
    let shown = || path.display().to_string();
    // `Path::components` skips `.` parts: look at the bytes for them.
    let dotted = path
        .as_os_str()
        .as_encoded_bytes()
        .split(|b| *b == b'/')
        .any(|part| part == b"." || part == b"..");
    if !plain(path) || dotted {
        return Err(PeerError::NotPlain { path: shown() });
    }
    let parts: Vec<_> = path.components().skip(1).collect();
    if let [proc, pid, ns, net] = parts.as_slice()
        && proc.as_os_str() == "proc"
        && ns.as_os_str() == "ns"
        && net.as_os_str() == "net"
        && pid
            .as_os_str()
            .to_str()
            .is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
    {
        return Ok(NetnsPlace::Process);
    }
    for dir in dirs {
        if let Ok(rest) = path.strip_prefix(dir)
            && rest.components().next().is_some()
        {
            return Ok(NetnsPlace::Pinned {
                dir,
                rest: rest.into(),
            });
        }
    }
    Err(PeerError::NetnsOutside {
        path: shown(),
        dirs: dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
    })
}

/// Opens the network namespace a peer named at the host path `path`, checked as the module
/// says; `host` maps a host path to this process's view (the DaemonSet's `/host`).
pub fn open_netns(
    path: &Path,
    places: &PeerPlaces,
    host: impl Fn(&Path) -> PathBuf,
) -> Result<Netns, PeerError> {
    let seen = host(path);
    let file = match netns_place(path, &places.netns_dirs)? {
        NetnsPlace::Process => {
            netns::open_nonblocking(&seen).map_err(|e| NetnsError::from_io(&seen, e))?
        }
        NetnsPlace::Pinned { dir, rest } => {
            let dir_seen = host(dir);
            let dirfd = open(
                &dir_seen,
                OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| NetnsError::from_io(&seen, e.into()))?;
            let how = OpenHow::new()
                // Non-blocking: a FIFO at the path must not hold the thread (see
                // `netns::open_nonblocking`); the type is checked before any use.
                .flags(OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK | OFlag::O_NOCTTY)
                .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS);
            match openat2(&dirfd, &rest, how) {
                Ok(fd) => File::from(fd),
                Err(Errno::ELOOP | Errno::EXDEV) => {
                    return Err(PeerError::NetnsEscapes {
                        path: path.display().to_string(),
                        dir: dir.display().to_string(),
                    });
                }
                Err(e) => return Err(NetnsError::from_io(&seen, e.into()).into()),
            }
        }
    };
    let ns = Netns::from_file(&seen, file)?;
    let opened = ns
        .file()
        .metadata()
        .map_err(|e| NetnsError::from_io(&seen, e))?;
    let same = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.dev() == opened.dev() && m.ino() == opened.ino())
    };
    // The agent's own (the DaemonSet's pod has the host's network), and PID 1's as the host's
    // /proc shows it (the DaemonSet mounts it under /host) or as ours does.
    let host_init = host(Path::new("/proc/1/ns/net"));
    if same(Path::new("/proc/self/ns/net")) || same(&host_init) || same(Path::new("/proc/1/ns/net"))
    {
        return Err(PeerError::HostNetns {
            path: path.display().to_string(),
        });
    }
    Ok(ns)
}

/// What the plugin passes from inside the pod's network namespace (see
/// `linkerd_cni_proto::wire`): a socket it created there, the addresses it read there, and
/// for a user-namespaced pod its user namespace's ID maps.
#[derive(Debug)]
pub struct PeerNetns {
    pub socket: OwnedFd,
    pub addrs: Vec<IpAddr>,
    pub userns: Option<linkerd_cni_proto::wire::UsernsMaps>,
}

impl PeerNetns {
    /// The cookie of `ns` (opened from the path the peer named), read from the passed socket
    /// once the socket is shown to belong to `ns`: nothing enters the namespace.
    pub fn cookie_of(&self, ns: &Netns) -> Result<u64, PeerError> {
        self.check_inside(ns)?;
        let sock_err = |source: io::Error| PeerError::Socket {
            path: ns.path.display().to_string(),
            source,
        };
        linkerd_cni_sys::sock::netns_cookie(&self.socket).map_err(sock_err)
    }

    /// Fails unless the socket was made inside `ns` (`SIOCGSKNS`: the socket's network
    /// namespace is the same nsfs inode as `ns`), on any kernel (the fallback's check,
    /// where the cookie is not needed and may not exist).
    pub fn check_inside(&self, ns: &Netns) -> Result<(), PeerError> {
        let shown = || ns.path.display().to_string();
        let sock_err = |source: io::Error| PeerError::Socket {
            path: shown(),
            source,
        };
        let socket_ns = linkerd_cni_sys::sock::socket_netns(&self.socket).map_err(sock_err)?;
        let (a, b) = (
            socket_ns.metadata().map_err(sock_err)?,
            ns.file().metadata().map_err(sock_err)?,
        );
        if (a.dev(), a.ino()) != (b.dev(), b.ino()) {
            return Err(PeerError::SocketElsewhere {
                path: shown(),
                socket_ino: a.ino(),
                path_ino: b.ino(),
            });
        }
        Ok(())
    }
}

/// Kubelet's QoS cgroups (both drivers): each holds every pod of its class.
const QOS_CGROUPS: [&str; 4] = [
    "besteffort",
    "burstable",
    "kubepods-besteffort.slice",
    "kubepods-burstable.slice",
];

/// Checks that `cgroup` (resolved from a peer's hint or pod UID) lies strictly inside one of
/// `trees` (relative to `root`; a leading `/` as kubelet writes cgroup names is ignored, so
/// `/` stands for every cgroup but the root) and is not one of kubelet's QoS cgroups; symbolic
/// links and `..` are resolved first. Returns the resolved path (below `root` as given): the
/// path the registration records and every later open uses, never the hint as sent.
pub fn check_pod_cgroup(
    root: &Path,
    trees: &[PathBuf],
    cgroup: &Path,
) -> Result<PathBuf, PeerError> {
    let refused = || PeerError::CgroupOutside {
        cgroup: cgroup.display().to_string(),
        trees: trees
            .iter()
            .map(|t| t.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
        root: root.display().to_string(),
    };
    let rel = crate::host::cgroup::resolved_below(root, cgroup).ok_or_else(refused)?;
    let qos = rel
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| QOS_CGROUPS.contains(&n));
    if crate::host::cgroup::inside_trees(&rel, trees) && !qos {
        Ok(root.join(rel))
    } else {
        Err(refused())
    }
}

#[cfg(test)]
mod tests;
