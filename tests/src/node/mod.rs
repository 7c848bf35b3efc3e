//! A simulated Kubernetes node for the end-to-end tests and the demo: a node network
//! namespace whose pods are wired by a real CNI chain (bridge + host-local + `linkerd-cni`)
//! that libcni runs ([`crate::cniruntime`]), the node agent (`linkerd-cni-agent run`) as a real
//! process with its own pin root, registry and socket, and the fake Kubernetes API server
//! process serving the pods' manifests.
//!
//! Nothing here touches a real installation: the agent's pins live under
//! `/sys/fs/bpf/l5dt-<pid>-<n>`, its registry, socket and every CNI file in a scratch directory,
//! the bridge inside the node's own netns (no route out). Dropping a [`SimNode`] kills its
//! processes (by PID), then removes the pin tree (which detaches any link left), the node netns
//! and the scratch directory; [`SimPod`]s remove their netns and cgroup.

mod apifront;
mod cri;
mod forward;
pub mod image;
pub mod kubelet;
mod noderoot;
mod plugin;
mod pods;
mod process;
pub mod render;
mod sim;
mod state;

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    path::PathBuf,
    time::{Duration, Instant},
};

use linkerd_cni_common::paths;
use nix::{sys::signal::Signal, unistd::Pid};

pub use self::{
    apifront::ApiFront,
    cri::{
        CLUSTER_DNS, ContainerSpec, CriNode, CriNodeOptions, KUBERNETES_SERVICE, NODE_IP, Sandbox,
        build_image_archive, group_object_path,
    },
    forward::ApiForward,
    noderoot::NodeRoot,
    plugin::{PluginOutcome, run_plugin},
    pods::{
        PodSpec, STARTUP_TAINT, SimPod, namespace_manifest, startup_tainted, tainted_node_manifest,
    },
    process::{AgentCommand, AgentProcess, ApiServerProcess, ApiStats},
    sim::{PinRoot, SimNode, remove_pin_root},
    state::{AgentState, read_state},
};
use crate::{
    bins,
    error::{Error, IoContext, Result},
};

/// The node name the agent watches pods for (`spec.nodeName`).
pub const NODE_NAME: &str = "l5d-e2e-node";
/// The conflist's network name.
pub const NETWORK_NAME: &str = "k8s-pod-network";
/// The bridge the bridge plugin creates in the node netns.
pub const BRIDGE: &str = "cni0";
/// The pod subnet host-local allocates from.
pub const POD_SUBNET: &str = "10.244.0.0/24";
/// The conflist's CNI version (the newest libcni 1.1.2 and the Debian plugins speak).
pub const CNI_VERSION: &str = "1.0.0";
/// The pod interface name.
pub const IFNAME: &str = "eth0";
/// The agent binary.
pub const AGENT_BIN: &str = "linkerd-cni-agent";
/// The plugin binary.
pub const PLUGIN_BIN: &str = "linkerd-cni";
/// The fake API server binary.
pub const APISERVER_BIN: &str = "linkerd-cni-fake-apiserver";
/// bpffs mount point; the test pin roots live right below it.
pub const BPFFS: &str = paths::BPFFS;

/// How long one CNI operation may take.
pub const CNI_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the agent and the API server may take to come up, on the host (see
/// [`start_timeout`]).
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How many times slower than the host the tests run here: `$LINKERD_CNI_TEST_SLOWDOWN` (a
/// whole factor, 1 when unset). `cargo xtask vmtest` sets it for a guest of another
/// architecture, whose every instruction is emulated: an agent that loads and verifies its
/// programs in 1 s on the host took 9 to over 30 s in the arm64 guest.
pub const SLOWDOWN_ENV: &str = "LINKERD_CNI_TEST_SLOWDOWN";

/// How long the agent and the API server may take to come up here: [`START_TIMEOUT`] times
/// the slowdown ([`SLOWDOWN_ENV`]).
fn start_timeout() -> Duration {
    START_TIMEOUT * slowdown()
}

/// The slowdown factor of [`SLOWDOWN_ENV`] (at least 1).
pub fn slowdown() -> u32 {
    std::env::var(SLOWDOWN_ENV)
        .ok()
        .and_then(|s| s.parse::<u32>().ok())
        .unwrap_or(1)
        .max(1)
}

/// The chart's `cni_network_config` with its default values (`__KUBECONFIG_FILEPATH__` left
/// for the installer to replace), talking to the agent at `agent_socket`.
pub fn chart_network_config(agent_socket: &std::path::Path) -> serde_json::Value {
    use crate::proxy::{self, PROXY_UID};
    serde_json::json!({
        "name": "linkerd-cni",
        "type": "linkerd-cni",
        "log_level": "debug",
        "kubernetes": {"kubeconfig": "__KUBECONFIG_FILEPATH__"},
        "linkerd": {
            "incoming-proxy-port": proxy::INBOUND_PORT,
            "outgoing-proxy-port": proxy::OUTBOUND_PORT,
            "proxy-uid": PROXY_UID,
            "proxy-gid": -1,
            "ports-to-redirect": [],
            "inbound-ports-to-ignore": ["4191", "4190"],
            "outbound-ports-to-ignore": [],
            "simulate": false,
            "use-wait-flag": false,
            "iptables-mode": "nft",
            "ipv6": false,
            "agent-socket": agent_socket,
            "excluded-namespaces": ["linkerd-cni", "kube-system"],
        }
    })
}

/// A binary of the workspace, with a hint when it was not built.
pub fn workspace_bin(name: &str) -> Result<PathBuf> {
    bins::bin_path(name).map_err(|e| {
        Error::Missing(format!(
            "{e}\n(the end-to-end tests run the plugin, the agent and the fake API server as \
             processes: build them first with `cargo build --bins`)"
        ))
    })
}

/// Settings of a simulated node.
#[derive(Clone, Debug)]
pub struct NodeOptions {
    /// The agent's `--reap-interval`.
    pub reap_interval: Duration,
    /// `linkerd.agent-timeout-ms` in the conflist.
    pub agent_timeout_ms: u64,
    /// `log_level` of the plugin entry.
    pub plugin_log_level: String,
    /// The agent's `--log-level`.
    pub agent_log_level: String,
    /// The agent's `--reconcile-interval`, when not its default.
    pub reconcile_interval: Option<Duration>,
    /// Pin under a bpffs of the node's own, mounted in its scratch directory (so a test can
    /// unmount it without touching the host's `/sys/fs/bpf`); the agent gets `--bpffs`.
    pub private_bpffs: bool,
    /// The agent's `--bpffs-from-host` (as the DaemonSet sets it): it never mounts a bpffs
    /// of its own.
    pub bpffs_from_host: bool,
    /// The agent's `--pod-cgroup-tree`s: `/` (any cgroup but the root) by default, as
    /// simulated pods live in test cgroups right below the cgroup2 root; `kubepods` for a
    /// node whose pods are where kubelet puts them ([`SimPod::new_kubelet_cgroup`]).
    pub pod_cgroup_trees: Vec<String>,
    /// More arguments of the agent's `run` (e.g. the repair's pacing).
    pub agent_args: Vec<String>,
}

impl Default for NodeOptions {
    fn default() -> Self {
        Self {
            reap_interval: Duration::from_secs(10),
            // The plugin's wait for the agent, longer where everything runs slower.
            agent_timeout_ms: 10_000 * u64::from(slowdown()),
            plugin_log_level: "debug".into(),
            agent_log_level: "info,linkerd_cni_agent=debug".into(),
            reconcile_interval: None,
            private_bpffs: false,
            bpffs_from_host: false,
            pod_cgroup_trees: vec!["/".into()],
            agent_args: Vec::new(),
        }
    }
}

/// A minimal HTTP/1.1 GET (loopback only): status code and body.
pub fn http_get(addr: SocketAddr, path: &str, timeout: Duration) -> Result<(u16, String)> {
    let what = || format!("GET http://{addr}{path}");
    let mut conn = TcpStream::connect_timeout(&addr, timeout).ctx(what)?;
    conn.set_read_timeout(Some(timeout)).ctx(what)?;
    conn.set_write_timeout(Some(timeout)).ctx(what)?;
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: application/json\r\nConnection: close\r\n\r\n"
    )
    .ctx(what)?;
    let mut raw = Vec::new();
    conn.read_to_end(&mut raw).ctx(what)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(|| Error::Parse {
        what: what(),
        detail: format!("no header end in {text:?}"),
    })?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| Error::Parse {
            what: what(),
            detail: format!("bad status line in {head:?}"),
        })?;
    let chunked = head.lines().any(|l| {
        l.to_ascii_lowercase()
            .starts_with("transfer-encoding: chunked")
    });
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_string()
    };
    Ok((status, body))
}

/// Decodes a chunked body (best effort: stops at the first malformed size line).
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// A free TCP port on 127.0.0.1 (free when this returns; good enough for tests).
fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").ctx(|| "binding an ephemeral port")?;
    Ok(l.local_addr().ctx(|| "getsockname")?.port())
}

/// Sends `signal` to process `pid` (one process, never a group).
pub fn signal(pid: u32, signal: Signal) -> Result<()> {
    let raw = i32::try_from(pid).map_err(|_| Error::Missing(format!("pid {pid} out of range")))?;
    nix::sys::signal::kill(Pid::from_raw(raw), signal)
        .map_err(|e| Error::io(format!("kill -{signal} {pid}"), e.into()))
}

/// Waits until `f` returns `Some`, polling every 20 ms, for at most `timeout`.
pub fn wait_until<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Ok(v);
        }
        if Instant::now() >= deadline {
            return Err(Error::Timeout {
                what: what.into(),
                timeout,
                detail: String::new(),
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until `done` holds, and fails if it still does not once a whole pass of a loop
/// that began after `before` was read has ended, or after `hang` if the passes stop. `passes`
/// reads the loop's counter (the agent's reconcile or adoption passes): passes run one after
/// another and each is counted once, when it starts or when it completes, so two more than
/// `before` means one began and ended in between.
pub fn within_a_pass(
    what: &str,
    before: u64,
    hang: Duration,
    mut passes: impl FnMut() -> u64,
    mut done: impl FnMut() -> bool,
) -> Result<()> {
    let started = Instant::now();
    loop {
        // Read before checking: if the pass had ended by then, `done` must see its work.
        let now = passes();
        if done() {
            return Ok(());
        }
        if now >= before + 2 {
            return Err(Error::Missing(format!(
                "{what}: not so after a whole pass ({before} passes before, {now} now)"
            )));
        }
        if started.elapsed() >= hang {
            return Err(Error::Missing(format!(
                "{what}: no whole pass ran in {hang:?} ({before} passes before, {now} now)"
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_bodies_decode() {
        assert_eq!(
            dechunk("5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"),
            "hello world"
        );
        assert_eq!(dechunk("zz\r\n"), "");
    }
}
