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

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    io::{BufRead, BufReader, Read, Write},
    net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{ExitStatus, Stdio},
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

use linkerd_cni_agent::maps::{Maps, cidr_of};
use linkerd_cni_common::paths;
use nix::{sys::signal::Signal, unistd::Pid};
use serde_json::{Value, json};

use crate::{
    bins,
    cgroup::CgroupGuard,
    child::{ChildGuard, Placement},
    client::fnv1a64,
    cniruntime::{self, Invocation, Verb},
    error::{Error, IoContext, Result},
    names::{self, TempDir},
    netns::NetnsGuard,
    proxy::{self, PROXY_UID, TestProxy},
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
/// How long the agent and the API server may take to come up.
const START_TIMEOUT: Duration = Duration::from_secs(30);

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
}

impl Default for NodeOptions {
    fn default() -> Self {
        Self {
            reap_interval: Duration::from_secs(10),
            agent_timeout_ms: 10_000,
            plugin_log_level: "debug".into(),
            agent_log_level: "info,linkerd_cni_agent=debug".into(),
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

// --- pods and their manifests ------------------------------------------------------------------

static POD_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A pod as the API server knows it.
#[derive(Clone, Debug)]
pub struct PodSpec {
    pub namespace: String,
    pub name: String,
    /// `metadata.uid` (also sent as `K8S_POD_UID`).
    pub uid: String,
    /// Container names.
    pub containers: Vec<String>,
    /// Init container names.
    pub init_containers: Vec<String>,
    pub annotations: BTreeMap<String, String>,
    pub labels: BTreeMap<String, String>,
}

impl PodSpec {
    /// A pod with these containers and no init containers.
    pub fn new(namespace: &str, name: &str, containers: &[&str]) -> Self {
        let n = POD_COUNTER.fetch_add(1, Ordering::Relaxed);
        Self {
            namespace: namespace.into(),
            name: name.into(),
            uid: format!("{:08x}-0000-4000-8000-{:012x}", std::process::id(), n),
            containers: containers.iter().map(|c| c.to_string()).collect(),
            init_containers: Vec::new(),
            annotations: BTreeMap::new(),
            labels: BTreeMap::new(),
        }
    }

    /// An injected pod in CNI mode: `app` plus the `linkerd-proxy` sidecar.
    pub fn meshed(namespace: &str, name: &str) -> Self {
        Self::new(namespace, name, &["app", "linkerd-proxy"])
    }

    /// A pod without a proxy.
    pub fn unmeshed(namespace: &str, name: &str) -> Self {
        Self::new(namespace, name, &["app"])
    }

    /// An injected pod in iptables mode: it has `linkerd-init`, so the CNI plugin leaves it be.
    pub fn with_linkerd_init(namespace: &str, name: &str) -> Self {
        let mut s = Self::meshed(namespace, name);
        s.init_containers.push("linkerd-init".into());
        s
    }

    /// Adds an annotation.
    #[must_use]
    pub fn annotate(mut self, key: &str, value: &str) -> Self {
        self.annotations.insert(key.into(), value.into());
        self
    }

    /// The Pod object, bound to `node`.
    pub fn manifest(&self, node: &str) -> Value {
        let containers = |names: &[String]| -> Vec<Value> {
            names
                .iter()
                .map(|n| json!({"name": n, "image": format!("example.test/{n}:1")}))
                .collect()
        };
        let mut spec = json!({
            "nodeName": node,
            "containers": containers(&self.containers),
        });
        if !self.init_containers.is_empty() {
            spec["initContainers"] = json!(containers(&self.init_containers));
        }
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "uid": self.uid,
                "annotations": self.annotations,
                "labels": self.labels,
            },
            "spec": spec,
        })
    }

    /// `CNI_ARGS` as containerd sends them (the runtime tool shuffles their order).
    pub fn cni_args(&self, container_id: &str) -> Vec<(String, String)> {
        vec![
            ("IgnoreUnknown".into(), "1".into()),
            ("K8S_POD_NAMESPACE".into(), self.namespace.clone()),
            ("K8S_POD_NAME".into(), self.name.clone()),
            ("K8S_POD_INFRA_CONTAINER_ID".into(), container_id.into()),
            ("K8S_POD_UID".into(), self.uid.clone()),
        ]
    }
}

/// A Namespace object with these annotations.
pub fn namespace_manifest(name: &str, annotations: &[(&str, &str)]) -> Value {
    let annotations: BTreeMap<&str, &str> = annotations.iter().copied().collect();
    json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": name,
            "uid": format!("ns-{name}"),
            "annotations": annotations,
        },
    })
}

/// A pod of the simulated node: its sandbox netns (named, like containerd's
/// `/var/run/netns/cni-<uuid>`), its cgroup, and what CNI ADD returned.
#[derive(Debug)]
pub struct SimPod {
    pub spec: PodSpec,
    /// `CNI_CONTAINERID` of the sandbox (64 hex digits, like containerd's).
    pub container_id: String,
    /// The ADD result, once added.
    pub result: Option<Value>,
    netns_path: PathBuf,
    netns: Option<NetnsGuard>,
    /// The pod's cgroup (sent as `runtimeConfig.cgroupPath`).
    pub cgroup: CgroupGuard,
}

impl SimPod {
    /// A fresh sandbox (netns with `lo` up, cgroup) for `spec`.
    pub fn new(spec: PodSpec) -> Result<Self> {
        let netns = NetnsGuard::new()?;
        let cgroup = CgroupGuard::new()?;
        let seed = format!("{}/{}/{}", spec.uid, netns.name(), names::unique_name());
        let container_id = (0..4)
            .map(|i| fnv1a64(format!("{i}{seed}").as_bytes()))
            .collect::<String>();
        Ok(Self {
            spec,
            container_id,
            result: None,
            netns_path: netns.path().to_path_buf(),
            netns: Some(netns),
            cgroup,
        })
    }

    /// The netns path (still the path after [`SimPod::delete_netns`]).
    pub fn netns_path(&self) -> &Path {
        &self.netns_path
    }

    /// The netns guard; fails once the netns was deleted.
    pub fn netns(&self) -> Result<&NetnsGuard> {
        self.netns.as_ref().ok_or_else(|| {
            Error::Missing(format!("the netns of pod {} was deleted", self.spec.name))
        })
    }

    /// Deletes the sandbox netns now (as when a runtime tears a sandbox down or crashes).
    pub fn delete_netns(&mut self) {
        self.netns = None;
    }

    /// The cgroup as the runtime names it: relative to the cgroup2 root.
    pub fn cgroup_path(&self) -> Result<String> {
        self.cgroup.relative_path()
    }

    /// The netns cookie (the key of the pod's map entries).
    pub fn cookie(&self) -> Result<u64> {
        self.netns()?.cookie()
    }

    /// The IPv4 address host-local gave the pod (from the ADD result).
    pub fn ip(&self) -> Option<Ipv4Addr> {
        let ips = self.result.as_ref()?.get("ips")?.as_array()?;
        ips.iter().find_map(|ip| {
            let addr = ip.get("address")?.as_str()?;
            addr.split('/').next()?.parse().ok()
        })
    }

    /// A container of this pod running as `uid`.
    pub fn container(&self, uid: u32) -> Placement {
        Placement::new()
            .netns_path(&self.netns_path)
            .cgroup(&self.cgroup)
            .uid(uid)
    }

    /// Starts the forwarding test proxy as this pod's `linkerd-proxy` (UID 2102).
    pub fn start_proxy(&self) -> Result<TestProxy> {
        TestProxy::start(&self.container(PROXY_UID), &proxy::Options::new())
    }
}

// --- processes -------------------------------------------------------------------------------

/// The fake API server process.
#[derive(Debug)]
pub struct ApiServerProcess {
    child: ChildGuard,
    addr: SocketAddr,
    log: PathBuf,
}

impl ApiServerProcess {
    /// Starts `linkerd-cni-fake-apiserver` serving `manifests` (rescanned every 100 ms) and
    /// writing `kubeconfig`; waits for its `listening on` line.
    pub fn start(manifests: &Path, kubeconfig: &Path, log: &Path) -> Result<Self> {
        let bin = workspace_bin(APISERVER_BIN)?;
        let log_file = fs::File::create(log).ctx(|| format!("creating {}", log.display()))?;
        let mut cmd = std::process::Command::new(bin);
        cmd.arg("--manifests")
            .arg(manifests)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--listen", "127.0.0.1:0", "--rescan-ms", "100"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log_file);
        let mut child = ChildGuard::spawn(&mut cmd)?;
        let stdout = child
            .child_mut()
            .stdout
            .take()
            .ok_or_else(|| Error::Missing("the API server's stdout".into()))?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(START_TIMEOUT).map_err(|_| Error::Timeout {
            what: "the fake API server's start".into(),
            timeout: START_TIMEOUT,
            detail: fs::read_to_string(log).unwrap_or_default(),
        })?;
        let addr = line
            .trim()
            .strip_prefix("listening on http://")
            .and_then(|a| a.parse().ok())
            .ok_or_else(|| Error::Parse {
                what: "the fake API server's first line".into(),
                detail: format!(
                    "{line:?}; log: {}",
                    fs::read_to_string(log).unwrap_or_default()
                ),
            })?;
        Ok(Self {
            child,
            addr,
            log: log.into(),
        })
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its PID.
    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// GET `path`.
    pub fn get(&self, path: &str) -> Result<(u16, String)> {
        http_get(self.addr, path, Duration::from_secs(5))
    }

    /// What it logged.
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM (it removes the kubeconfig it wrote), then wait for the exit.
    pub fn terminate(&mut self, timeout: Duration) -> Result<ExitStatus> {
        signal(self.pid(), Signal::SIGTERM)?;
        self.child.wait_timeout(timeout)
    }
}

/// The node agent process (`linkerd-cni-agent run`).
#[derive(Debug)]
pub struct AgentProcess {
    child: ChildGuard,
    health: SocketAddr,
    log: PathBuf,
}

impl AgentProcess {
    /// Its PID.
    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// The health and metrics endpoint.
    pub fn health_addr(&self) -> SocketAddr {
        self.health
    }

    /// A counter or gauge from `/metrics`.
    pub fn metric(&self, name: &str) -> Result<u64> {
        let (status, body) = http_get(self.health, "/metrics", Duration::from_secs(5))?;
        body.lines()
            .filter(|l| !l.starts_with('#'))
            .find_map(|l| {
                let (n, v) = l.split_once(' ')?;
                (n == name).then(|| v.trim().parse().ok()).flatten()
            })
            .ok_or_else(|| Error::Parse {
                what: format!("metric {name}"),
                detail: format!("status {status}: {body}"),
            })
    }

    /// Everything it logged.
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGKILL (the process cannot clean anything up), and reap.
    pub fn kill(&mut self) {
        self.child.kill();
    }

    /// SIGTERM, then wait for a clean exit.
    pub fn terminate(&mut self, timeout: Duration) -> Result<ExitStatus> {
        signal(self.pid(), Signal::SIGTERM)?;
        self.child.wait_timeout(timeout)
    }
}

// --- the agent's observable state --------------------------------------------------------------

/// Everything the agent keeps, read from outside: registry files, pinned links, map entries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AgentState {
    /// Registry file name → its content.
    pub registry: BTreeMap<String, String>,
    /// Paths under the pin root's `pods/` and `shared/` (link directories and links).
    pub links: BTreeSet<String>,
    /// `l5d_pod_config`: netns cookie → config (debug form).
    pub pod_config: BTreeMap<u64, String>,
    /// `l5d_port_sets` keys: `cookie:set:block`.
    pub port_sets: BTreeSet<String>,
    /// `l5d_addrs` keys: `cookie:set:cidr`.
    pub addrs: BTreeSet<String>,
    /// `l5d_pod_stats` keys.
    pub pod_stats: BTreeSet<u64>,
    /// `l5d_conn_dst` keys: `cookie:port`.
    pub conn_dst: BTreeSet<String>,
    /// `l5d_pod_by_ip`: `cookie:address words`.
    pub pod_by_ip: BTreeSet<String>,
    /// `l5d_listeners` keys: `cookie:family`.
    pub listeners: BTreeSet<String>,
}

impl AgentState {
    /// The registered container ids.
    pub fn registered(&self) -> BTreeSet<String> {
        self.registry
            .keys()
            .filter_map(|f| f.strip_suffix(".json"))
            .map(str::to_string)
            .collect()
    }

    /// The parsed registry record of `id`.
    pub fn record(&self, id: &str) -> Option<Value> {
        serde_json::from_str(self.registry.get(&format!("{id}.json"))?).ok()
    }

    /// The pinned link paths of `id` (under `pods/<id>`).
    pub fn links_of(&self, id: &str) -> Vec<&String> {
        let prefix = format!("{}/{id}", paths::PIN_PODS);
        self.links
            .iter()
            .filter(|l| l.starts_with(&prefix))
            .collect()
    }

    /// Every map entry keyed by netns cookie `cookie`, described.
    pub fn entries_for(&self, cookie: u64) -> Vec<String> {
        let prefix = format!("{cookie}:");
        let mut out = Vec::new();
        if let Some(c) = self.pod_config.get(&cookie) {
            out.push(format!("pod_config {c}"));
        }
        if self.pod_stats.contains(&cookie) {
            out.push("pod_stats".into());
        }
        for (name, set) in [
            ("port_sets", &self.port_sets),
            ("addrs", &self.addrs),
            ("conn_dst", &self.conn_dst),
            ("pod_by_ip", &self.pod_by_ip),
            ("listeners", &self.listeners),
        ] {
            out.extend(
                set.iter()
                    .filter(|k| k.starts_with(&prefix))
                    .map(|k| format!("{name} {k}")),
            );
        }
        out
    }

    /// Nothing registered, pinned or in the per-pod maps.
    pub fn is_empty(&self) -> bool {
        self.registry.is_empty()
            && self.links.is_empty()
            && self.pod_config.is_empty()
            && self.port_sets.is_empty()
            && self.addrs.is_empty()
            && self.pod_stats.is_empty()
            && self.conn_dst.is_empty()
            && self.pod_by_ip.is_empty()
            && self.listeners.is_empty()
    }
}

/// Lists every path below `dir`, relative to `base`.
fn walk(base: &Path, dir: &Path, out: &mut BTreeSet<String>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        if let Ok(rel) = path.strip_prefix(base) {
            out.insert(rel.display().to_string());
        }
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            walk(base, &path, out);
        }
    }
}

/// Reads the state of the agent whose pins are under `pin_root` and registry in `state_dir`.
pub fn read_state(pin_root: &Path, state_dir: &Path) -> Result<AgentState> {
    let mut state = AgentState::default();
    if let Ok(entries) = fs::read_dir(state_dir) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let content = fs::read_to_string(e.path()).unwrap_or_default();
            state.registry.insert(name, content);
        }
    }
    for sub in [paths::PIN_PODS, paths::PIN_SHARED] {
        walk(pin_root, &pin_root.join(sub), &mut state.links);
    }
    let maps_dir = pin_root.join(paths::PIN_MAPS);
    let maps = Maps::open(&maps_dir)
        .map_err(|e| Error::Missing(format!("opening the maps in {}: {e}", maps_dir.display())))?;
    for cookie in maps.pod_config.keys().filter_map(|k| k.ok()) {
        let cfg = maps.pod_config(cookie);
        state.pod_config.insert(cookie, format!("{cfg:?}"));
    }
    for k in maps.port_sets.keys().filter_map(|k| k.ok()) {
        state
            .port_sets
            .insert(format!("{}:{}:{}", k.netns_cookie, k.set, k.block));
    }
    for k in maps.addrs.keys().filter_map(|k| k.ok()) {
        let set = u32::from_be(k.data().set_be);
        state
            .addrs
            .insert(format!("{}:{set}:{}", k.data().netns_cookie, cidr_of(&k)));
    }
    state
        .pod_stats
        .extend(maps.pod_stats.keys().filter_map(|k| k.ok()));
    for k in maps.conn_dst.keys().filter_map(|k| k.ok()) {
        state
            .conn_dst
            .insert(format!("{}:{}", k.netns_cookie, k.port));
    }
    for (ip, cookie) in maps.pod_by_ip.iter().filter_map(|e| e.ok()) {
        state.pod_by_ip.insert(format!("{cookie}:{ip:08x?}"));
    }
    for k in maps.listeners.keys().filter_map(|k| k.ok()) {
        state
            .listeners
            .insert(format!("{}:{}", k.netns_cookie, k.family));
    }
    Ok(state)
}

// --- direct plugin invocations ---------------------------------------------------------------

/// What one direct run of the plugin printed and how it ended.
#[derive(Clone, Debug)]
pub struct PluginOutcome {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl PluginOutcome {
    /// stdout as JSON, if it is.
    pub fn json(&self) -> Option<Value> {
        serde_json::from_str(self.stdout.trim()).ok()
    }

    /// The CNI error code, when the plugin failed with a CNI error object.
    pub fn code(&self) -> Option<u64> {
        if self.status.success() {
            return None;
        }
        self.json()?.get("code")?.as_u64()
    }

    /// The error message, when the plugin failed.
    pub fn msg(&self) -> String {
        self.json()
            .and_then(|v| {
                let msg = v.get("msg")?.as_str()?.to_string();
                let details = v.get("details").and_then(Value::as_str).unwrap_or("");
                Some(format!("{msg}: {details}"))
            })
            .unwrap_or_default()
    }
}

/// Runs the plugin binary with exactly `env` (nothing inherited) and `stdin`, in `netns`.
pub fn run_plugin(
    netns: Option<&NetnsGuard>,
    env: &[(String, String)],
    stdin: &[u8],
    timeout: Duration,
) -> Result<PluginOutcome> {
    let bin = workspace_bin(PLUGIN_BIN)?;
    let mut cmd = match netns {
        Some(ns) => ns.command(&bin)?,
        None => std::process::Command::new(&bin),
    };
    cmd.env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = ChildGuard::spawn(&mut cmd)?;
    if let Some(mut pipe) = child.child_mut().stdin.take() {
        let data = stdin.to_vec();
        // The plugin may stop reading early (oversized input): a broken pipe is expected then.
        std::thread::spawn(move || {
            let _ = pipe.write_all(&data);
        });
    }
    let out = child.wait_output(timeout)?;
    Ok(PluginOutcome {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

// --- the node --------------------------------------------------------------------------------

/// A pin root below bpffs, removed (with everything pinned in it) on drop.
#[derive(Debug)]
struct PinRoot {
    path: PathBuf,
}

impl PinRoot {
    fn new() -> Self {
        // Pin roots of test processes that died without cleaning up.
        if let Ok(entries) = fs::read_dir(BPFFS) {
            for e in entries.flatten() {
                if e.file_name().to_str().is_some_and(names::is_stale) {
                    let _ = fs::remove_dir_all(e.path());
                }
            }
        }
        Self {
            path: Path::new(BPFFS).join(names::unique_name()),
        }
    }
}

impl Drop for PinRoot {
    fn drop(&mut self) {
        // Unpinning the links (no process holds them any more) detaches the programs.
        match fs::remove_dir_all(&self.path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => eprintln!(
                "linkerd-cni-tests: cannot remove pin root {}: {e}",
                self.path.display()
            ),
        }
    }
}

/// A simulated node. Fields drop in declaration order: processes first, then pins, the node
/// netns and the scratch directory.
#[derive(Debug)]
pub struct SimNode {
    agent: Option<AgentProcess>,
    apiserver: ApiServerProcess,
    pins: PinRoot,
    netns: NetnsGuard,
    opts: NodeOptions,
    plugin_dirs: Vec<PathBuf>,
    dir: TempDir,
}

impl SimNode {
    /// Creates the node netns, writes the conflist, starts the fake API server (serving the
    /// `objects` given, more can be applied later) and the agent.
    pub fn start(opts: NodeOptions, objects: &[Value]) -> Result<Self> {
        let dir = TempDir::new()?;
        for sub in [
            "manifests",
            "bin",
            "cni-cache",
            "ipam",
            "state",
            "run",
            "logs",
        ] {
            fs::create_dir(dir.path().join(sub)).ctx(|| format!("creating {sub}"))?;
        }
        let plugin = workspace_bin(PLUGIN_BIN)?;
        let link = dir.path().join("bin").join(PLUGIN_BIN);
        std::os::unix::fs::symlink(&plugin, &link).ctx(|| format!("linking {}", link.display()))?;
        let plugin_dirs = vec![
            PathBuf::from(cniruntime::SYSTEM_PLUGIN_DIR),
            dir.path().join("bin"),
        ];
        for p in ["bridge", "host-local"] {
            let path = Path::new(cniruntime::SYSTEM_PLUGIN_DIR).join(p);
            if !path.is_file() {
                return Err(Error::Missing(format!(
                    "{} not found: install containernetworking-plugins (`cargo xtask setup`)",
                    path.display()
                )));
            }
        }
        // Build (or find) the runtime now, so its first use is not timed.
        cniruntime::tool()?;
        let netns = NetnsGuard::new()?;
        let pins = PinRoot::new();
        for object in objects {
            write_manifest(&dir.path().join("manifests"), object)?;
        }
        let apiserver = ApiServerProcess::start(
            &dir.path().join("manifests"),
            &dir.path().join("kubeconfig"),
            &dir.path().join("logs").join("apiserver.log"),
        )?;
        let mut node = Self {
            agent: None,
            apiserver,
            pins,
            netns,
            opts,
            plugin_dirs,
            dir,
        };
        node.write_conflist()?;
        node.start_agent()?;
        Ok(node)
    }

    fn write_conflist(&self) -> Result<()> {
        let d = self.dir.path();
        let conflist = json!({
            "cniVersion": CNI_VERSION,
            "name": NETWORK_NAME,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": true,
                    "ipMasq": false,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_SUBNET}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": d.join("ipam"),
                    },
                },
                self.linkerd_entry(),
            ],
        });
        let text = serde_json::to_string_pretty(&conflist)
            .map_err(|e| Error::Missing(format!("serialising the conflist: {e}")))?;
        fs::write(self.conflist(), text).ctx(|| "writing the conflist")
    }

    /// The `linkerd-cni` entry of the conflist: Linkerd's keys plus the agent socket.
    pub fn linkerd_entry(&self) -> Value {
        json!({
            "type": "linkerd-cni",
            "name": "linkerd-cni",
            "log_level": self.opts.plugin_log_level,
            "capabilities": {"cgroupPath": true},
            "kubernetes": {"kubeconfig": self.kubeconfig()},
            "linkerd": {
                "incoming-proxy-port": proxy::INBOUND_PORT,
                "outgoing-proxy-port": proxy::OUTBOUND_PORT,
                "proxy-uid": PROXY_UID,
                "ports-to-redirect": [],
                "inbound-ports-to-ignore": ["4191", "4190"],
                "simulate": false,
                "use-wait-flag": false,
                "iptables-mode": "nft",
                "ipv6": false,
                "agent-socket": self.socket(),
                "agent-timeout-ms": self.opts.agent_timeout_ms,
            },
        })
    }

    /// The scratch directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The conflist file.
    pub fn conflist(&self) -> PathBuf {
        self.dir.path().join("10-pods.conflist")
    }

    /// The kubeconfig the API server wrote.
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    /// The agent's registration socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("run").join("agent.sock")
    }

    /// The agent's registry.
    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// The agent's pin root.
    pub fn pin_root(&self) -> &Path {
        &self.pins.path
    }

    /// The node's network namespace (where the bridge is).
    pub fn netns(&self) -> &NetnsGuard {
        &self.netns
    }

    /// The fake API server.
    pub fn apiserver(&self) -> &ApiServerProcess {
        &self.apiserver
    }

    /// The fake API server (mutable, to stop it).
    pub fn apiserver_mut(&mut self) -> &mut ApiServerProcess {
        &mut self.apiserver
    }

    /// The agent, while running.
    pub fn agent(&self) -> Option<&AgentProcess> {
        self.agent.as_ref()
    }

    /// The agent, while running (mutable).
    pub fn agent_mut(&mut self) -> Option<&mut AgentProcess> {
        self.agent.as_mut()
    }

    /// The agent's log so far (empty when it is not running).
    pub fn agent_log(&self) -> String {
        fs::read_to_string(self.dir.path().join("logs").join("agent.log")).unwrap_or_default()
    }

    /// Starts the agent (again), with the same pin root, registry and socket, and waits until
    /// its registration socket serves.
    pub fn start_agent(&mut self) -> Result<()> {
        if let Some(mut old) = self.agent.take() {
            old.kill();
        }
        let bin = workspace_bin(AGENT_BIN)?;
        let health = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let log = self.dir.path().join("logs").join("agent.log");
        let log_file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .ctx(|| format!("opening {}", log.display()))?;
        let reap = format!("{}ms", self.opts.reap_interval.as_millis());
        let mut cmd = std::process::Command::new(bin);
        cmd.arg("--pin-root")
            .arg(self.pin_root())
            .arg("--state-dir")
            .arg(self.state_dir())
            .args(["--log-level", &self.opts.agent_log_level, "run", "--socket"])
            .arg(self.socket())
            .arg("--kubeconfig")
            .arg(self.kubeconfig())
            .args(["--node-name", NODE_NAME, "--reap-interval", &reap])
            .args(["--health-addr", &health.to_string()])
            .env_remove("LINKERD_CNI_AGENT_INSTALL")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file);
        let child = ChildGuard::spawn(&mut cmd)?;
        let mut agent = AgentProcess { child, health, log };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = agent.child.try_wait()? {
                return Err(Error::Missing(format!(
                    "the agent exited with {status} during start-up:\n{}",
                    agent.log()
                )));
            }
            // /live answers once the registration socket is bound.
            if matches!(
                http_get(health, "/live", Duration::from_secs(1)),
                Ok((200, _))
            ) {
                break;
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout {
                    what: "agent start-up".into(),
                    timeout: START_TIMEOUT,
                    detail: agent.log(),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.agent = Some(agent);
        Ok(())
    }

    /// SIGKILLs the agent (no clean-up of any kind, like a crash or an OOM kill).
    pub fn kill_agent(&mut self) {
        if let Some(mut a) = self.agent.take() {
            a.kill();
        }
    }

    /// Writes `objects` to the API server's manifests and waits until it serves them.
    pub fn apply(&self, objects: &[Value]) -> Result<()> {
        let dir = self.dir.path().join("manifests");
        for object in objects {
            write_manifest(&dir, object)?;
        }
        for object in objects {
            let path = api_path(object)?;
            let want_uid = object.pointer("/metadata/uid").cloned();
            let want_annotations = object.pointer("/metadata/annotations").cloned();
            wait_until(
                &format!("the API server serving {path}"),
                Duration::from_secs(10),
                || {
                    let (status, body) = self.apiserver.get(&path).ok()?;
                    let served: Value = serde_json::from_str(&body).ok()?;
                    let same = status == 200
                        && (want_uid.is_none()
                            || served.pointer("/metadata/uid") == want_uid.as_ref())
                        && served
                            .pointer("/metadata/annotations")
                            .filter(|a| !is_empty_object(a))
                            == want_annotations.as_ref().filter(|a| !is_empty_object(a));
                    same.then_some(())
                },
            )?;
        }
        Ok(())
    }

    /// Creates a pod: its manifest served by the API server, its sandbox netns and cgroup.
    pub fn new_pod(&self, spec: PodSpec) -> Result<SimPod> {
        self.apply(&[spec.manifest(NODE_NAME)])?;
        SimPod::new(spec)
    }

    /// The libcni invocation for `pod`, with `netns` as `CNI_NETNS` (`None`: empty).
    pub fn invocation(&self, pod: &SimPod, netns: Option<&Path>) -> Result<Invocation> {
        Ok(Invocation {
            conflist: self.conflist(),
            plugin_dirs: self.plugin_dirs.clone(),
            cache_dir: self.dir.path().join("cni-cache"),
            container_id: pod.container_id.clone(),
            netns: netns.map(Path::to_path_buf),
            ifname: IFNAME.into(),
            args: pod.spec.cni_args(&pod.container_id),
            cgroup_path: Some(pod.cgroup_path()?),
        })
    }

    /// Runs `verb` for `pod` through libcni, in the node netns, with the pod's netns path.
    pub fn cni(&self, verb: Verb, pod: &SimPod) -> Result<cniruntime::Outcome> {
        self.cni_netns(verb, pod, Some(pod.netns_path()))
    }

    /// Like [`SimNode::cni`] with an explicit `CNI_NETNS` (`None`: empty, as containerd's
    /// second DEL).
    pub fn cni_netns(
        &self,
        verb: Verb,
        pod: &SimPod,
        netns: Option<&Path>,
    ) -> Result<cniruntime::Outcome> {
        let inv = self.invocation(pod, netns)?;
        cniruntime::run(Some(&self.netns), verb, &inv, CNI_TIMEOUT)
    }

    /// CNI ADD through libcni; keeps the result (and so the pod IP) in `pod`.
    pub fn add(&self, pod: &mut SimPod) -> Result<()> {
        let out = self.cni(Verb::Add, pod)?.expect_ok()?;
        let result = out.result().ok_or_else(|| Error::Parse {
            what: "the ADD result".into(),
            detail: out.stdout.clone(),
        })?;
        pod.result = Some(result);
        Ok(())
    }

    /// The environment a runtime gives the plugin for `command` on `pod`.
    pub fn plugin_env(&self, command: &str, pod: &SimPod) -> Vec<(String, String)> {
        let args: Vec<String> = pod
            .spec
            .cni_args(&pod.container_id)
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        vec![
            ("CNI_COMMAND".into(), command.into()),
            ("CNI_CONTAINERID".into(), pod.container_id.clone()),
            ("CNI_NETNS".into(), pod.netns_path().display().to_string()),
            ("CNI_IFNAME".into(), IFNAME.into()),
            ("CNI_ARGS".into(), args.join(";")),
            (
                "CNI_PATH".into(),
                self.plugin_dirs
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(":"),
            ),
        ]
    }

    /// The plugin's stdin for `pod` as libcni builds it: the conflist entry with the list's
    /// version and name, `runtimeConfig.cgroupPath` and `prevResult`.
    pub fn plugin_stdin(&self, pod: &SimPod, prev_result: Option<Value>) -> Result<Value> {
        let mut conf = self.linkerd_entry();
        conf["cniVersion"] = json!(CNI_VERSION);
        conf["name"] = json!(NETWORK_NAME);
        if let Some(obj) = conf.as_object_mut() {
            obj.remove("capabilities");
        }
        conf["runtimeConfig"] = json!({"cgroupPath": pod.cgroup_path()?});
        if let Some(prev) = prev_result {
            conf["prevResult"] = prev;
        }
        Ok(conf)
    }

    /// Runs the plugin directly (no libcni), in the node netns.
    pub fn run_plugin(&self, env: &[(String, String)], stdin: &[u8]) -> Result<PluginOutcome> {
        run_plugin(Some(&self.netns), env, stdin, CNI_TIMEOUT)
    }

    /// The agent's registry, links and map entries now.
    pub fn state(&self) -> Result<AgentState> {
        read_state(self.pin_root(), &self.state_dir())
    }

    /// `linkerd-cni-agent inspect` for this node.
    pub fn inspect(&self) -> Result<String> {
        let bin = workspace_bin(AGENT_BIN)?;
        names::run(
            std::process::Command::new(bin)
                .arg("--pin-root")
                .arg(self.pin_root())
                .arg("--state-dir")
                .arg(self.state_dir())
                .arg("inspect"),
        )
    }

    /// Everything the node wrote, for failure messages.
    pub fn diagnostics(&self) -> String {
        format!(
            "--- agent log ---\n{}\n--- API server log ---\n{}",
            self.agent_log(),
            self.apiserver.log()
        )
    }
}

fn is_empty_object(v: &Value) -> bool {
    v.as_object().is_some_and(|o| o.is_empty())
}

/// The API path of a Pod or Namespace object.
fn api_path(object: &Value) -> Result<String> {
    let s = |p: &str| object.pointer(p).and_then(Value::as_str);
    match (s("/kind"), s("/metadata/namespace"), s("/metadata/name")) {
        (Some("Pod"), Some(ns), Some(name)) => Ok(format!("/api/v1/namespaces/{ns}/pods/{name}")),
        (Some("Namespace"), _, Some(name)) => Ok(format!("/api/v1/namespaces/{name}")),
        (Some("Service"), Some(ns), Some(name)) => {
            Ok(format!("/api/v1/namespaces/{ns}/services/{name}"))
        }
        _ => Err(Error::Missing(format!(
            "not a Pod, Namespace or Service with a name: {object}"
        ))),
    }
}

/// Writes one object as `<kind>-<namespace>-<name>.json`, atomically (the API server rescans
/// the directory and only reads `*.json`, so the temporary `.tmp` file is never half-read).
fn write_manifest(dir: &Path, object: &Value) -> Result<()> {
    let s = |p: &str| object.pointer(p).and_then(Value::as_str).unwrap_or("");
    let stem = format!(
        "{}-{}-{}",
        s("/kind").to_ascii_lowercase(),
        s("/metadata/namespace"),
        s("/metadata/name")
    );
    let path = dir.join(format!("{stem}.json"));
    let tmp = dir.join(format!("{stem}.tmp"));
    let text = serde_json::to_string_pretty(object)
        .map_err(|e| Error::Missing(format!("serialising {stem}: {e}")))?;
    fs::write(&tmp, text).ctx(|| format!("writing {}", tmp.display()))?;
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o644))
        .ctx(|| format!("chmod {}", tmp.display()))?;
    fs::rename(&tmp, &path).ctx(|| format!("renaming to {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_manifests_carry_what_the_decision_reads() {
        let spec = PodSpec::with_linkerd_init("shop", "web")
            .annotate("config.linkerd.io/skip-outbound-ports", "8080");
        let m = spec.manifest("n1");
        assert_eq!(m["spec"]["nodeName"], "n1");
        assert_eq!(m["metadata"]["uid"], json!(spec.uid));
        let names = |key: &str| -> Vec<String> {
            m["spec"][key]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|c| c["name"].as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default()
        };
        assert_eq!(names("containers"), ["app", "linkerd-proxy"]);
        assert_eq!(names("initContainers"), ["linkerd-init"]);
        assert_eq!(
            m["metadata"]["annotations"]["config.linkerd.io/skip-outbound-ports"],
            "8080"
        );
        assert_eq!(
            api_path(&m).expect("path"),
            "/api/v1/namespaces/shop/pods/web"
        );
        let args = spec.cni_args("c1");
        for key in [
            "K8S_POD_NAMESPACE",
            "K8S_POD_NAME",
            "K8S_POD_UID",
            "K8S_POD_INFRA_CONTAINER_ID",
            "IgnoreUnknown",
        ] {
            assert!(args.iter().any(|(k, _)| k == key), "{key} in {args:?}");
        }
        assert_ne!(
            PodSpec::unmeshed("a", "b").uid,
            PodSpec::unmeshed("a", "b").uid,
            "uids differ"
        );
    }

    #[test]
    fn chunked_bodies_decode() {
        assert_eq!(
            dechunk("5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"),
            "hello world"
        );
        assert_eq!(dechunk("zz\r\n"), "");
    }
}
