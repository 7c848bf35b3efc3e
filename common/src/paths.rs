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
