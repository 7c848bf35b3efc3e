//! Every filesystem location the node side (agent, plugin, installer) uses by default, in one
//! place (the proxy injector keeps its own in `linkerd_injector::paths`).
//!
//! bpffs layout under [`PIN_ROOT`]:
//!
//! ```text
//! /sys/fs/bpf/linkerd-cni/
//!   maps/<map name>            the maps (names in `names`), shared by every program generation
//!   maps/l5d_meta              the layout version of the pinned state
//!   next/<map name>            during an upgrade only: the new maps, before they replace the old
//!   progs/<program name>       the programs new pods are attached to
//!   pods/<pod id>/<program>    one pinned cgroup link per program, per pod (per-pod attach)
//!   shared/<program>           links on the shared ancestor cgroup (fallback attach)
//! ```

/// bpffs mount point.
pub const BPFFS: &str = "/sys/fs/bpf";
/// Root of everything this project pins.
pub const PIN_ROOT: &str = "/sys/fs/bpf/linkerd-cni";
/// Under the pin root: maps.
pub const PIN_MAPS: &str = "maps";
/// Under the pin root: programs.
pub const PIN_PROGS: &str = "progs";
/// Under the pin root: the maps of a layout migration in progress.
pub const PIN_NEXT: &str = "next";
/// Under the pin root: per-pod link directories.
pub const PIN_PODS: &str = "pods";
/// Under the pin root: links of the shared (fallback) attachment.
pub const PIN_SHARED: &str = "shared";
/// The subdirectories of the pin root that always exist once the agent has loaded
/// ([`PIN_NEXT`] exists only during a migration).
pub const PIN_DIRS: [&str; 4] = [PIN_MAPS, PIN_PROGS, PIN_PODS, PIN_SHARED];

/// The agent's registration socket (root-only).
pub const AGENT_SOCKET: &str = "/run/linkerd-cni/agent.sock";
/// The agent's registry of pods (one JSON file per pod). Lives in /run like the pins: both
/// vanish at reboot, when every pod netns is gone too.
pub const STATE_DIR: &str = "/run/linkerd-cni/pods";
/// The file in the agent's state directory that says which mode the node runs and why (a
/// `probe::Choice`, written at every start): read by `inspect` and `linkerd check --node`.
/// Not a pod record (those end in `.json`).
pub const MODE_FILE: &str = "mode";

/// Host directory of CNI network configs (Linkerd's `DEST_CNI_NET_DIR` default).
pub const CNI_NET_DIR: &str = "/etc/cni/net.d";
/// Host directory of CNI plugin binaries (Linkerd's `DEST_CNI_BIN_DIR` default).
pub const CNI_BIN_DIR: &str = "/opt/cni/bin";
/// Where the installer container sees the host's root (Linkerd's `CONTAINER_MOUNT_PREFIX`).
pub const CONTAINER_MOUNT_PREFIX: &str = "/host";
/// Directory inside the installer image holding the plugin binary (`CONTAINER_CNI_BIN_DIR`).
pub const CONTAINER_CNI_BIN_DIR: &str = "/opt/cni/bin";
/// File name of the plugin's kubeconfig, written into the CNI net dir (`KUBECONFIG_FILE_NAME`).
pub const KUBECONFIG_FILE_NAME: &str = "ZZZ-linkerd-cni-kubeconfig";
/// The pod's projected service-account volume (token, `ca.crt`, `namespace`).
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// Host directories where container runtimes pin pods' network namespaces (`CNI_NETNS`):
/// containerd's and CRI-O's `/var/run/netns/<name>`, `ip netns`'s and podman's `/run/netns`.
/// A netns path a peer of the agent's socket names must lie below one of these (or be a
/// process's `/proc/<pid>/ns/net`).
pub const NETNS_DIRS: [&str; 2] = ["/run/netns", "/var/run/netns"];
/// Kubelet's pod cgroup trees, relative to the cgroup2 root: `kubepods` (cgroupfs driver) and
/// `kubepods.slice` (systemd driver). A pod cgroup a peer of the agent's socket names must
/// be a pod's cgroup inside one of these.
pub const POD_CGROUP_TREES: [&str; 2] = ["kubepods", "kubepods.slice"];

/// The marker linkerd-cni leaves in every directory it creates (the socket's, the registry's,
/// the pin root and its subdirectories): an empty directory, because bpffs holds no regular
/// files and refuses names that start with a dot. The uninstall removes a directory only when
/// it carries this marker, and then only what linkerd-cni put there.
pub const OWNED_MARKER: &str = "linkerd-cni-owned";

/// Directory trees of other components of a node. No path linkerd-cni writes (its socket's
/// directory, its registry, its pin root) may lie inside one: its clean-up would remove what
/// it put there, and the other component's files next to it would be at its mercy. The
/// agent (`run`, `load`, `uninstall`) and the render (`linkerd install-cni`, the chart)
/// refuse such paths with [`check_node_paths`].
pub const FOREIGN_TREES: [(&str, &str); 18] = [
    ("/var/lib/kubelet", "kubelet"),
    ("/etc/kubernetes", "kubelet and the control plane"),
    (CNI_NET_DIR, "the CNI network configurations"),
    (CNI_BIN_DIR, "the CNI plugin binaries"),
    ("/run/containerd", "containerd"),
    ("/var/run/containerd", "containerd"),
    ("/var/lib/containerd", "containerd"),
    ("/run/crio", "CRI-O"),
    ("/var/run/crio", "CRI-O"),
    ("/var/lib/containers", "CRI-O and podman"),
    ("/run/containers", "CRI-O and podman"),
    ("/run/docker", "Docker"),
    ("/var/run/docker", "Docker"),
    ("/var/lib/docker", "Docker"),
    ("/run/netns", "the runtime's network namespaces"),
    ("/var/run/netns", "the runtime's network namespaces"),
    ("/run/cilium", "Cilium"),
    ("/run/calico", "Calico"),
];

/// Top-level bpffs directories of other tenants (iproute2's `tc`, `xdp` and `ip`, Cilium's,
/// Calico's): a pin root must be a directory of our own below the bpffs, never the bpffs
/// itself nor inside one of these.
pub const FOREIGN_BPFFS_DIRS: [&str; 6] = ["tc", "xdp", "ip", "cilium", "calico", "globals"];

#[cfg(feature = "std")]
pub use check::{NodePaths, PathConflict, check_node_paths, foreign_tree, kubepods, normalize};

/// The checks of [`FOREIGN_TREES`] and [`FOREIGN_BPFFS_DIRS`] (std only).
#[cfg(feature = "std")]
mod check {
    extern crate std;

    use std::{
        fmt,
        path::{Component, Path, PathBuf},
    };

    use super::{FOREIGN_BPFFS_DIRS, FOREIGN_TREES};

    /// `path` without `.`, `..` (taken lexically), repeated or trailing slashes: what it names,
    /// as far as its spelling says (`/sys/fs/bpf/` and `/sys/fs/bpf/./x/..` are `/sys/fs/bpf`).
    pub fn normalize(path: &Path) -> PathBuf {
        let mut out = PathBuf::new();
        for c in path.components() {
            match c {
                Component::CurDir => {}
                Component::ParentDir => {
                    out.pop();
                }
                other => out.push(other),
            }
        }
        out
    }

    /// kubelet's cgroup of every pod under `root` (the cgroup2 mount): `kubepods.slice`
    /// (systemd driver) or `kubepods` (cgroupfs driver), whichever exists; `None` when neither
    /// or both do.
    pub fn kubepods(root: &Path) -> Option<PathBuf> {
        let found: std::vec::Vec<PathBuf> = super::POD_CGROUP_TREES
            .iter()
            .rev()
            .map(|d| root.join(d))
            .filter(|p| p.is_dir())
            .collect();
        match found.as_slice() {
            [one] => Some(one.clone()),
            _ => None,
        }
    }

    /// A configured path inside another component's tree.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct PathConflict {
        /// What the path is for (`the socket's directory`, `the registry`, `the pin root`).
        pub what: &'static str,
        /// The path as configured.
        pub path: PathBuf,
        /// The other component's tree it lies in (or is).
        pub tree: PathBuf,
        /// Whose tree that is.
        pub owner: &'static str,
    }

    impl fmt::Display for PathConflict {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(
                f,
                "{} {} lies inside {} (owned by {}): linkerd-cni writes and, at the uninstall, removes \
                 there, so it only uses directories of its own (defaults: socket {}, pin root {})",
                self.what,
                self.path.display(),
                self.tree.display(),
                self.owner,
                super::AGENT_SOCKET,
                super::PIN_ROOT,
            )
        }
    }

    impl std::error::Error for PathConflict {}

    /// The tree of [`FOREIGN_TREES`] that `path` lies in (or is), as `(tree, owner)`. With
    /// `host_root` (where a container sees the host's root, `/host`), a path below it is taken
    /// as the host path it names.
    pub fn foreign_tree(path: &Path, host_root: Option<&Path>) -> Option<(PathBuf, &'static str)> {
        let path = normalize(path);
        let host = host_root.map(normalize);
        let on_host = host
            .as_deref()
            .and_then(|h| path.strip_prefix(h).ok())
            .map(|p| Path::new("/").join(p));
        let path = on_host.as_deref().unwrap_or(&path);
        FOREIGN_TREES
            .iter()
            .find(|(tree, _)| path.starts_with(tree))
            .map(|(tree, owner)| (PathBuf::from(tree), *owner))
    }

    /// The node paths linkerd-cni writes, as one process sees them.
    #[derive(Clone, Copy, Debug)]
    pub struct NodePaths<'a> {
        /// The agent's registration socket (its directory is the agent's).
        pub socket: &'a Path,
        /// The pod registry's directory.
        pub state_dir: &'a Path,
        /// The bpffs directory of every pin.
        pub pin_root: &'a Path,
        /// The bpffs mount point.
        pub bpffs: &'a Path,
        /// Where this process sees the host's root, if not at `/`.
        pub host_root: Option<&'a Path>,
    }

    /// Refuses node paths that lie inside another component's tree ([`FOREIGN_TREES`]), and a
    /// pin root that is not a directory of our own below the bpffs (the bpffs itself, a path
    /// outside it, or one in another tenant's [`FOREIGN_BPFFS_DIRS`]). Paths are compared
    /// normalised: `/sys/fs/bpf/` is `/sys/fs/bpf`.
    pub fn check_node_paths(p: &NodePaths<'_>) -> Result<(), PathConflict> {
        let socket_dir = p.socket.parent().unwrap_or(p.socket);
        for (what, path) in [
            ("the socket's directory", socket_dir),
            ("the registry", p.state_dir),
            ("the pin root", p.pin_root),
        ] {
            if let Some((tree, owner)) = foreign_tree(path, p.host_root) {
                return Err(PathConflict {
                    what,
                    path: path.to_path_buf(),
                    tree,
                    owner,
                });
            }
        }
        let (bpffs, pin_root) = (normalize(p.bpffs), normalize(p.pin_root));
        let conflict = |tree: PathBuf, owner| PathConflict {
            what: "the pin root",
            path: p.pin_root.to_path_buf(),
            tree,
            owner,
        };
        match pin_root
            .strip_prefix(&bpffs)
            .ok()
            .and_then(|r| r.components().next())
        {
            None => Err(conflict(bpffs, "every eBPF tenant: the bpffs itself")),
            Some(top) if FOREIGN_BPFFS_DIRS.iter().any(|d| top.as_os_str() == *d) => {
                Err(conflict(bpffs.join(top), "another eBPF tenant"))
            }
            Some(_) => Ok(()),
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use std::string::ToString;

        fn paths<'a>(socket: &'a str, state: &'a str, pin_root: &'a str) -> NodePaths<'a> {
            NodePaths {
                socket: Path::new(socket),
                state_dir: Path::new(state),
                pin_root: Path::new(pin_root),
                bpffs: Path::new("/sys/fs/bpf"),
                host_root: None,
            }
        }

        #[test]
        fn the_defaults_pass() {
            let p = paths(
                super::super::AGENT_SOCKET,
                super::super::STATE_DIR,
                super::super::PIN_ROOT,
            );
            assert_eq!(check_node_paths(&p), Ok(()));
        }

        #[test]
        fn paths_inside_other_components_trees_are_refused() {
            for (socket, state, tree) in [
                (
                    "/var/lib/kubelet/agent.sock",
                    "/run/l5d/pods",
                    "/var/lib/kubelet",
                ),
                (
                    "/var/lib/kubelet/pods/x/agent.sock",
                    "/run/l5d/pods",
                    "/var/lib/kubelet",
                ),
                (
                    "/run/l5d/agent.sock",
                    "/etc/cni/net.d/pods",
                    "/etc/cni/net.d",
                ),
                (
                    "/opt/cni/bin/l5d/agent.sock",
                    "/run/l5d/pods",
                    "/opt/cni/bin",
                ),
                (
                    "/run/containerd/l5d/a.sock",
                    "/run/l5d/pods",
                    "/run/containerd",
                ),
                (
                    "/run/netns/../netns/x/a.sock",
                    "/run/l5d/pods",
                    "/run/netns",
                ),
                ("/run/l5d/a.sock", "/var/run/netns/", "/var/run/netns"),
                ("/run/crio/a.sock", "/run/l5d/pods", "/run/crio"),
            ] {
                let err =
                    check_node_paths(&paths(socket, state, "/sys/fs/bpf/l5d")).expect_err(socket);
                assert_eq!(err.tree, Path::new(tree), "{socket} {state}");
                assert!(err.to_string().contains(tree), "{err}");
            }
            // A neighbour whose name only starts like a tree is not in it.
            let p = paths(
                "/run/netns-l5d/a.sock",
                "/var/lib/kubelet-l5d/pods",
                "/sys/fs/bpf/l5d",
            );
            assert_eq!(check_node_paths(&p), Ok(()));
        }

        #[test]
        fn a_host_root_prefix_is_seen_through() {
            let mut p = paths(
                "/host/var/lib/kubelet/a.sock",
                "/host/run/l5d/pods",
                "/host/sys/fs/bpf/l5d",
            );
            p.bpffs = Path::new("/host/sys/fs/bpf");
            p.host_root = Some(Path::new("/host/"));
            let err = check_node_paths(&p).expect_err("kubelet's tree under /host");
            assert_eq!(err.owner, "kubelet");
        }

        #[test]
        fn a_pin_root_must_be_our_own_directory_below_the_bpffs() {
            for pin_root in [
                "/sys/fs/bpf",
                "/sys/fs/bpf/",
                "/sys/fs/bpf/.",
                "/sys/fs/bpf/l5d/..",
                "/sys/fs/bpf/tc",
                "/sys/fs/bpf/tc/",
                "/sys/fs/bpf/tc/globals/l5d",
                "/sys/fs/bpf//xdp",
                "/sys/fs/bpf/cilium/l5d",
                "/run/l5d",
            ] {
                let err = check_node_paths(&paths("/run/l5d/a.sock", "/run/l5d/pods", pin_root))
                    .expect_err(pin_root);
                assert_eq!(err.what, "the pin root");
            }
            for pin_root in [
                "/sys/fs/bpf/linkerd-cni/",
                "/sys/fs/bpf/a/b",
                "/sys/fs/bpf/tcx",
            ] {
                let p = paths("/run/l5d/a.sock", "/run/l5d/pods", pin_root);
                assert_eq!(check_node_paths(&p), Ok(()), "{pin_root}");
            }
        }
    }
}
