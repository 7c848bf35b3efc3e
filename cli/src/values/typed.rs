//! The typed view of the merged values ([`Values`]), as the templates read them: built and
//! checked by [`validate`](super::validate).

use std::collections::BTreeMap;

use serde_json::{Map, Value as Json};

/// The typed view of the chart's values, for validation. Field names are the chart's.
#[derive(Clone, Debug)]
pub struct Values {
    pub mode: String,
    pub inbound_proxy_port: u16,
    pub outbound_proxy_port: u16,
    pub proxy_admin_port: u16,
    pub proxy_control_port: u16,
    pub ignore_inbound_ports: String,
    pub ignore_outbound_ports: String,
    pub ports_to_redirect: String,
    pub proxy_uid: i64,
    pub proxy_gid: i64,
    pub log_level: String,
    pub dest_cni_net_dir: String,
    pub dest_cni_bin_dir: String,
    pub use_wait_flag: bool,
    pub iptables_mode: String,
    pub disable_ipv6: bool,
    pub priority_class_name: String,
    pub install_namespace: bool,
    pub excluded_namespaces: Vec<String>,
    pub image: Image,
    pub tolerations: Vec<Json>,
    pub resources: Resources,
    pub agent: Agent,
    pub common_labels: BTreeMap<String, String>,
    pub pod_labels: BTreeMap<String, String>,
    pub image_pull_secrets: Vec<Json>,
    pub node_affinity: Map<String, Json>,
    pub extra_init_containers: Vec<Json>,
    pub update_strategy: Map<String, Json>,
    pub revision_history_limit: u32,
    pub cli_version: String,
    /// Accepted (Linkerd's chart has it) with a warning when true: the agent container is never
    /// privileged (only the `mount-bpffs` init container is, see [`Agent::mount_bpffs`]); on
    /// SELinux-enforcing nodes [`Agent::se_linux_options`] is what to set.
    pub privileged: bool,
    /// Accepted (Linkerd's chart has it); no PodSecurityPolicy is rendered.
    pub enable_psp: bool,
    /// Linkerd's repair controller: no controller is deployed, `enabled` turns the agent's
    /// repair (deleting meshed pods that run without redirection) on or off.
    pub repair_controller: RepairController,
}

/// `repairController`, in Linkerd's shape: `enabled` is the agent's `--repair-pods` (and
/// `delete` on pods in its RBAC); the other keys are validated and have no effect.
#[derive(Clone, Debug)]
pub struct RepairController {
    pub enabled: bool,
    pub log_level: String,
    pub log_format: String,
    pub enable_security_context: bool,
    pub resources: Resources,
}

/// `image`.
#[derive(Clone, Debug)]
pub struct Image {
    pub name: String,
    pub version: String,
    pub pull_policy: String,
}

/// `resources`, in Linkerd's shape (`cpu.limit`, `memory.request`, ...).
#[derive(Clone, Debug)]
pub struct Resources {
    pub cpu: Resource,
    pub memory: Resource,
    pub ephemeral_storage: Resource,
}

/// One resource's request and limit; empty leaves it unset.
#[derive(Clone, Debug)]
pub struct Resource {
    pub limit: String,
    pub request: String,
}

/// `agent`: the node agent's settings (eBPF mode).
#[derive(Clone, Debug)]
pub struct Agent {
    pub log_level: String,
    /// `plain` or `json`.
    pub log_format: String,
    pub socket_path: String,
    pub bpffs_path: String,
    pub pin_root: String,
    pub health_port: u16,
    pub host_cgroup_root: String,
    pub host_netns_dir: String,
    /// Whether the privileged `mount-bpffs` init container runs (false: the host mounts bpffs
    /// and no container is privileged).
    pub mount_bpffs: bool,
    /// Whether the runtime passes `/proc/<pid>/ns/net` as CNI_NETNS (host `/proc` mounted,
    /// CAP_SYS_PTRACE added).
    pub cni_netns_from_proc: bool,
    /// The agent's and mount-bpffs's `securityContext.seLinuxOptions` (empty: the runtime's
    /// default label); only the keys of Kubernetes' SELinuxOptions, each a string.
    pub se_linux_options: Map<String, Json>,
    /// Whether the agent's container gets CAP_SYS_ADMIN (adoption, user-namespaced pods).
    pub sys_admin: bool,
    pub metrics: Metrics,
    pub startup_taint: StartupTaint,
}

/// `agent.startupTaint`: the node's startup taint, removed by the agent once ready.
#[derive(Clone, Debug)]
pub struct StartupTaint {
    pub enabled: bool,
    /// Render the ValidatingAdmissionPolicy that narrows the nodes patch (Kubernetes 1.30+).
    pub admission_policy: bool,
}

/// `agent.metrics`: `/metrics` on an address of the node, for Prometheus.
#[derive(Clone, Debug)]
pub struct Metrics {
    pub enabled: bool,
    /// An IP address (the template brackets an IPv6 one).
    pub bind_address: std::net::IpAddr,
    pub port: u16,
    /// `agent.metrics.podMonitor`: a Prometheus Operator PodMonitor.
    pub pod_monitor: PodMonitor,
}

/// `agent.metrics.podMonitor`.
#[derive(Clone, Debug)]
pub struct PodMonitor {
    pub enabled: bool,
    pub labels: BTreeMap<String, String>,
    pub interval: String,
}
