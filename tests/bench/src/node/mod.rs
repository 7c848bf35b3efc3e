//! The simulated node: a fake API server, the real agent process, the real CNI plugin binary,
//! and child processes (proxy, server, load) placed in pods.
//!
//! Everything here is torn down on drop: processes killed by PID, pins and scratch
//! directories removed.

pub mod fastns;

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{Ipv4Addr, SocketAddr},
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use linkerd_cni_proto::{
    config,
    wire::{self, Envelope, Request, Response},
};
use linkerd_cni_tests::{
    CgroupGuard, ChildGuard, NetnsGuard, Placement,
    fake_apiserver::FakeApiServer,
    names::TempDir,
    node::{AgentCommand, AgentProcess, PinRoot},
};
use serde_json::json;

use crate::workload::{
    load::{LoadArgs, LoadResult, MARK},
    proxy::ProxyCounters,
};

/// The Kubernetes namespace of every benchmark pod.
pub const K8S_NAMESPACE: &str = "bench";
/// The node name the agent watches pods of.
pub const NODE_NAME: &str = "bench-node";
/// The UID of application containers and clients (anything but the proxy's).
pub const APP_UID: u32 = 1000;

/// The binaries the benchmark drives.
#[derive(Debug, Clone)]
pub struct Bins {
    /// This binary (for `load`, `proxy`, `server`, `probe`).
    pub me: PathBuf,
    pub agent: PathBuf,
    pub plugin: PathBuf,
}

impl Bins {
    /// All of them next to this executable (`target/release`).
    pub fn find() -> anyhow::Result<Self> {
        let me = std::env::current_exe().context("locating the benchmark binary")?;
        let dir = me.parent().map(Path::to_path_buf).unwrap_or_default();
        let find = |name: &str| {
            let p = dir.join(name);
            if p.is_file() {
                Ok(p)
            } else {
                bail!(
                    "{} not found: build it (`cargo xtask bench` builds everything)",
                    p.display()
                )
            }
        };
        Ok(Self {
            agent: find("linkerd-cni-agent")?,
            plugin: find("linkerd-cni")?,
            me,
        })
    }
}

/// Writes `value` to `/proc/sys/<key>` inside `ns` (per-netns sysctls).
pub fn sysctl(ns: &NetnsGuard, key: &str, value: &str) -> anyhow::Result<()> {
    let path = format!("/proc/sys/{}", key.replace('.', "/"));
    ns.run_in(|| std::fs::write(&path, value))?
        .with_context(|| format!("sysctl {key}={value}"))
}

/// The sysctls every benchmark netns gets, so that hundreds of thousands of short connections
/// do not run out of ephemeral ports (same in every mode).
pub fn tune(ns: &NetnsGuard) -> anyhow::Result<()> {
    sysctl(ns, "net.ipv4.ip_local_port_range", "1024 65000")?;
    sysctl(ns, "net.ipv4.tcp_tw_reuse", "1")?;
    Ok(())
}

/// The fake API server with the benchmark's namespace.
pub struct Api {
    pub server: FakeApiServer,
    pub kubeconfig: PathBuf,
    _dir: TempDir,
}

impl Api {
    pub fn start() -> anyhow::Result<Self> {
        let server = FakeApiServer::start()?;
        let dir = TempDir::new()?;
        let kubeconfig = dir.path().join("kubeconfig");
        server.write_kubeconfig(&kubeconfig)?;
        server.apply(
            &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": K8S_NAMESPACE}}),
        )?;
        Ok(Self {
            server,
            kubeconfig,
            _dir: dir,
        })
    }

    /// Adds a meshed pod (it has a `linkerd-proxy` container) scheduled on the node.
    pub fn add_pod(&self, name: &str, uid: &str) -> anyhow::Result<()> {
        self.add_pod_on(name, uid, NODE_NAME)
    }

    /// Adds a meshed pod scheduled on the node `node` (the baseline agent watches a node of
    /// its own).
    pub fn add_pod_on(&self, name: &str, uid: &str, node: &str) -> anyhow::Result<()> {
        self.server.apply(&json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": K8S_NAMESPACE, "uid": uid},
            "spec": {"nodeName": node, "containers": [
                {"name": "app", "image": "app"},
                {"name": "linkerd-proxy", "image": "cr.l5d.io/linkerd/proxy"}
            ]}
        }))?;
        Ok(())
    }

    pub fn delete_pod(&self, name: &str) -> anyhow::Result<()> {
        self.server.delete_pod(K8S_NAMESPACE, name)?;
        Ok(())
    }
}

/// The time from an agent process's start to its readiness.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
pub struct StartToReady {
    /// Pods in its registry when it started (and adopted).
    pub registered: usize,
    /// Spawn to its registration socket answering a status request, ms.
    pub socket_ms: f64,
    /// Spawn to `/ready` answering 200, ms.
    pub ready_ms: f64,
}

/// The real agent process (the support library's [`AgentProcess`]), with its own pin root,
/// state dir and socket, restarted at will.
pub struct AgentProc {
    agent: Option<AgentProcess>,
    command: AgentCommand,
    /// The tmpfs holding the state dir and the socket.
    run_dir: PathBuf,
    _pins: PinRoot,
    _dir: TempDir,
}

impl AgentProc {
    /// Starts an agent for the node `node_name` (the API-load scenario runs several) and waits
    /// until it answers on its socket.
    pub fn start_on(
        bin: &Path,
        kubeconfig: &Path,
        shared_cgroup: &Path,
        node_name: &str,
        max_pods: u32,
    ) -> anyhow::Result<Self> {
        let mut me = Self::stopped(bin, kubeconfig, shared_cgroup, node_name, max_pods)?;
        me.spawn()?;
        Ok(me)
    }

    /// Its pin root, state dir and socket, without starting it (to put pinned state there
    /// first: the upgrade scenario's previous agent version).
    pub fn stopped(
        bin: &Path,
        kubeconfig: &Path,
        shared_cgroup: &Path,
        node_name: &str,
        max_pods: u32,
    ) -> anyhow::Result<Self> {
        let dir = TempDir::new()?;
        let pins = PinRoot::new();
        // The agent keeps its registry and socket in /run, a tmpfs on Kubernetes nodes (not
        // on this VM): give it one.
        let run_dir = dir.path().join("run");
        std::fs::create_dir(&run_dir)?;
        nix::mount::mount(
            Some("tmpfs"),
            &run_dir,
            Some("tmpfs"),
            nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
            Some("size=64m,mode=0700"),
        )
        .context("mounting a tmpfs for the agent's state")?;
        let command = AgentCommand {
            bin: bin.into(),
            pin_root: pins.path().into(),
            state_dir: run_dir.join("pods"),
            socket: run_dir.join("agent.sock"),
            kubeconfig: kubeconfig.into(),
            node_name: node_name.into(),
            // The agent logs each ADD's and DEL's phases (debug): the pod-setup scenario reads
            // its own handling time from them. LINKERD_CNI_BENCH_AGENT_LOG=<file> keeps the log.
            log_level: "warn,linkerd_cni_agent::agent=debug".into(),
            reap_interval: None,
            reconcile_interval: None,
            bpffs: None,
            // A port of its own, known beforehand: the start-to-ready figure polls /ready.
            health: SocketAddr::from((
                [127, 0, 0, 1],
                std::net::TcpListener::bind("127.0.0.1:0")?
                    .local_addr()?
                    .port(),
            )),
            shared_cgroup: Some(shared_cgroup.into()),
            log: std::env::var_os("LINKERD_CNI_BENCH_AGENT_LOG")
                .map_or_else(|| dir.path().join("agent.log"), PathBuf::from),
            // The benchmark's pods live in test cgroups below the cgroup2 root, not in
            // kubelet's trees: any cgroup but the root (the check has its own tests).
            extra_args: vec![
                "--max-pods".into(),
                max_pods.to_string(),
                "--pod-cgroup-tree".into(),
                "/".into(),
            ],
        };
        Ok(Self {
            agent: None,
            command,
            run_dir,
            _pins: pins,
            _dir: dir,
        })
    }

    /// Leaves out of the command line the flags of `extra_args` (with their values) that are
    /// not in `known` (an older agent binary does not know every flag of ours); fails if one
    /// of the flags every agent gets is unknown. Returns the flags left out.
    pub fn keep_known_flags(
        &mut self,
        known: &std::collections::BTreeSet<String>,
    ) -> anyhow::Result<Vec<String>> {
        let c = &self.command;
        let mut required = vec![
            "--pin-root",
            "--state-dir",
            "--log-level",
            "--socket",
            "--kubeconfig",
            "--node-name",
            "--health-addr",
        ];
        required.extend(c.shared_cgroup.is_some().then_some("--shared-cgroup"));
        required.extend(c.bpffs.is_some().then_some("--bpffs"));
        required.extend(c.reap_interval.is_some().then_some("--reap-interval"));
        required.extend(
            c.reconcile_interval
                .is_some()
                .then_some("--reconcile-interval"),
        );
        let missing: Vec<&str> = required
            .into_iter()
            .filter(|f| !known.contains(*f))
            .collect();
        if !missing.is_empty() {
            bail!(
                "{} does not know {missing:?}: the benchmark cannot start it",
                c.bin.display()
            );
        }
        let (kept, dropped) = split_known_flags(&c.extra_args, known);
        self.command.extra_args = kept;
        Ok(dropped)
    }

    /// Its registration socket.
    pub fn socket(&self) -> &Path {
        &self.command.socket
    }

    /// Its pin root.
    pub fn pin_root(&self) -> &Path {
        &self.command.pin_root
    }

    /// Its registry.
    pub fn state_dir(&self) -> &Path {
        &self.command.state_dir
    }

    /// Starts the process and waits until it answers a status request.
    pub fn spawn(&mut self) -> anyhow::Result<Duration> {
        let t0 = Instant::now();
        let mut agent = AgentProcess::spawn(&self.command)?;
        // Its error carries the agent's log.
        agent.wait_ready(Duration::from_secs(30), Duration::from_millis(2), |_| {
            status(&self.command.socket).is_ok()
        })?;
        if std::env::var_os("LINKERD_CNI_BENCH_VERBOSE").is_some() {
            eprintln!("bench: agent ready, PID {}", agent.pid());
        }
        self.agent = Some(agent);
        Ok(t0.elapsed())
    }

    /// Starts the process and waits until its health endpoint's `/ready` answers 200 (and
    /// its registration socket answers), polling both every 2 ms: the time from the process's
    /// start to readiness, as kubelet's readiness probe sees it (at a finer period).
    pub fn spawn_until_ready(&mut self) -> anyhow::Result<StartToReady> {
        let t0 = Instant::now();
        let mut agent = AgentProcess::spawn(&self.command)?;
        let health = self.command.health;
        let (mut socket_at, mut ready_at) = (None, None);
        agent.wait_ready(Duration::from_secs(60), Duration::from_millis(2), |_| {
            if socket_at.is_none() && status(&self.command.socket).is_ok() {
                socket_at = Some(t0.elapsed());
            }
            if ready_at.is_none()
                && matches!(
                    linkerd_cni_tests::node::http_get(health, "/ready", Duration::from_secs(1)),
                    Ok((200, _))
                )
            {
                ready_at = Some(t0.elapsed());
            }
            socket_at.is_some() && ready_at.is_some()
        })?;
        self.agent = Some(agent);
        let registered = self.status()?;
        Ok(StartToReady {
            registered,
            socket_ms: socket_at.unwrap_or_default().as_secs_f64() * 1e3,
            ready_ms: ready_at.unwrap_or_default().as_secs_f64() * 1e3,
        })
    }

    /// The agent's log file.
    pub fn log_path(&self) -> &Path {
        &self.command.log
    }

    /// The last lines of the agent's log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.command.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    pub fn pid(&self) -> Option<u32> {
        self.agent.as_ref().map(AgentProcess::pid)
    }

    /// SIGHUP, by PID: the agent runs a reconcile pass at once.
    pub fn hangup(&self) -> anyhow::Result<()> {
        let pid = self.pid().context("agent not running")?;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGHUP,
        )?;
        Ok(())
    }

    /// SIGKILL, by PID.
    pub fn kill(&mut self) {
        if let Some(mut a) = self.agent.take() {
            a.kill();
        }
    }

    /// SIGTERM, by PID, and wait for it to exit (as a DaemonSet rollout stops the old pod).
    pub fn terminate(&mut self) -> anyhow::Result<()> {
        if let Some(mut a) = self.agent.take() {
            let status = a.terminate(Duration::from_secs(10))?;
            if !status.success() {
                bail!("the agent exited with {status} on SIGTERM");
            }
        }
        Ok(())
    }

    /// A status request over the registration socket: the number of registered pods.
    pub fn status(&self) -> anyhow::Result<usize> {
        status(&self.command.socket)
    }

    /// Memory of the process, from `/proc/<pid>/status`.
    pub fn rss(&self) -> anyhow::Result<Rss> {
        let pid = self.pid().context("agent not running")?;
        let text = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
                .unwrap_or(0)
        };
        Ok(Rss {
            rss: field("VmRSS:"),
            hwm: field("VmHWM:"),
            anon: field("RssAnon:"),
            file: field("RssFile:"),
        })
    }
}

impl Drop for AgentProc {
    fn drop(&mut self) {
        self.kill();
        let _ = nix::mount::umount2(&self.run_dir, nix::mount::MntFlags::MNT_DETACH);
        // Then the pin root goes (unpinning links detaches them; unpinning maps and programs
        // frees them), then the scratch directory.
    }
}

/// `args` (flags, each followed by its values) split into those whose flag is in `known`, in
/// order, and the flags that are not (their values left out of both).
pub fn split_known_flags(
    args: &[String],
    known: &std::collections::BTreeSet<String>,
) -> (Vec<String>, Vec<String>) {
    let (mut kept, mut dropped) = (Vec::new(), Vec::new());
    let mut keeping = true;
    for a in args {
        if a.starts_with("--") {
            let flag = a.split('=').next().unwrap_or(a);
            keeping = known.contains(flag);
            if !keeping {
                dropped.push(flag.to_string());
            }
        }
        if keeping {
            kept.push(a.clone());
        }
    }
    (kept, dropped)
}

/// The long flags (`--name`) a `--help` text lists.
pub fn help_flags(help: &str) -> std::collections::BTreeSet<String> {
    help.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|w| w.len() > 2 && w.starts_with("--") && !w.starts_with("---"))
        .map(str::to_string)
        .collect()
}

/// The flags an agent binary knows: those of its `--help` and of `run --help`.
fn agent_flags(bin: &Path) -> anyhow::Result<std::collections::BTreeSet<String>> {
    let mut flags = std::collections::BTreeSet::new();
    for args in [&["--help"][..], &["run", "--help"][..]] {
        let out = Command::new(bin)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running {} {args:?}", bin.display()))?;
        if !out.status.success() {
            bail!("{} {args:?} failed ({})", bin.display(), out.status);
        }
        flags.extend(help_flags(&String::from_utf8_lossy(&out.stdout)));
    }
    Ok(flags)
}

/// The node the baseline agent watches (its pods are scheduled there), so that neither agent
/// sees the other's pods in its cache.
pub const BASELINE_NODE_NAME: &str = "bench-node-baseline";

/// A second agent process beside the measured one, with its own pin root, registry, socket,
/// shared cgroup, health port and node name, and the plugin that registers pods with it.
/// Killed, unpinned and removed on drop.
pub struct SideAgent {
    pub agent: AgentProc,
    pub cni: Cni,
    _shared_cgroup: CgroupGuard,
}

impl SideAgent {
    /// Starts `agent_bin` for `node_name`, after `adjust` has changed its command line, and
    /// waits until it answers on its socket; `what` names it in an error.
    fn start(
        what: &str,
        agent_bin: &Path,
        plugin: &Path,
        kubeconfig: &Path,
        node_name: &str,
        max_pods: u32,
        adjust: impl FnOnce(&mut AgentProc) -> anyhow::Result<()>,
    ) -> anyhow::Result<Self> {
        let shared_cgroup = CgroupGuard::new()?;
        let mut agent = AgentProc::stopped(
            agent_bin,
            kubeconfig,
            shared_cgroup.path(),
            node_name,
            max_pods,
        )?;
        adjust(&mut agent)?;
        agent
            .spawn()
            .with_context(|| format!("starting the {what}"))?;
        Ok(Self {
            cni: Cni {
                plugin: plugin.into(),
                socket: agent.socket().to_path_buf(),
            },
            agent,
            _shared_cgroup: shared_cgroup,
        })
    }
}

/// `--baseline-bins DIR`: an earlier build's agent binary, and that build's plugin, beside
/// ours (node [`BASELINE_NODE_NAME`]).
pub struct Baseline {
    pub side: SideAgent,
    /// For the report: the binary's version and the flags of ours it was started without.
    pub description: String,
}

impl Baseline {
    /// Starts the agent `linkerd-cni-agent` of `dir` (its plugin is `dir/linkerd-cni`) with
    /// the flags it knows, and waits until it answers on its socket.
    pub fn start(dir: &Path, kubeconfig: &Path, max_pods: u32) -> anyhow::Result<Self> {
        let find = |name: &str| {
            let p = dir.join(name);
            if p.is_file() {
                Ok(p)
            } else {
                bail!("--baseline-bins: {} not found", p.display())
            }
        };
        let (agent_bin, plugin) = (find("linkerd-cni-agent")?, find("linkerd-cni")?);
        let known = agent_flags(&agent_bin)?;
        let version = Command::new(&agent_bin)
            .arg("--version")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        let mut dropped = Vec::new();
        let side = SideAgent::start(
            "baseline agent",
            &agent_bin,
            &plugin,
            kubeconfig,
            BASELINE_NODE_NAME,
            max_pods,
            |agent| {
                dropped = agent.keep_known_flags(&known)?;
                Ok(())
            },
        )?;
        let description = format!(
            "{}{}",
            if version.is_empty() {
                "an agent without --version"
            } else {
                &version
            },
            if dropped.is_empty() {
                String::new()
            } else {
                format!(", started without {} (unknown to it)", dropped.join(", "))
            }
        );
        Ok(Self { side, description })
    }
}

/// The node the fallback agent watches: its pods are scheduled there.
pub const FALLBACK_NODE_NAME: &str = "bench-node-fallback";

/// A second agent of this build, forced into the per-node fallback (`--mode iptables`: the
/// plugin writes Linkerd's rules as an nftables table in the pod's netns, no program), with
/// this build's plugin: the `fallback` mode's pod is registered through it as a node below
/// the eBPF floor registers every pod.
pub fn start_fallback_agent(
    agent_bin: &Path,
    plugin: &Path,
    kubeconfig: &Path,
    max_pods: u32,
) -> anyhow::Result<SideAgent> {
    SideAgent::start(
        "fallback agent",
        agent_bin,
        plugin,
        kubeconfig,
        FALLBACK_NODE_NAME,
        max_pods,
        |agent| {
            agent
                .command
                .extra_args
                .extend(["--mode".to_string(), "iptables".to_string()]);
            Ok(())
        },
    )
}

/// A status request over the agent's registration socket `socket`: the number of registered
/// pods.
fn status(socket: &Path) -> anyhow::Result<usize> {
    let mut s = UnixStream::connect(socket)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(&wire::encode(&Envelope::new(Request::Status))?)?;
    let mut header = [0u8; 4];
    s.read_exact(&mut header)?;
    let mut body = vec![0u8; wire::frame_len(header)?];
    s.read_exact(&mut body)?;
    match serde_json::from_slice(&body)? {
        Response::Status { pods, .. } => Ok(pods),
        other => bail!("unexpected answer to a status request: {other:?}"),
    }
}

/// A process's memory, KiB.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
pub struct Rss {
    /// VmRSS.
    pub rss: u64,
    /// VmHWM (peak RSS).
    pub hwm: u64,
    /// RssAnon: heap, stacks.
    pub anon: u64,
    /// RssFile: mapped binary and libraries.
    pub file: u64,
}

/// What a CNI invocation needs to know about a pod.
pub struct CniPod<'a> {
    pub id: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
    pub netns: &'a Path,
    pub cgroup: Option<&'a Path>,
    pub ip: Ipv4Addr,
}

/// Runs the real `linkerd-cni` binary as a container runtime does.
#[derive(Debug, Clone)]
pub struct Cni {
    pub plugin: PathBuf,
    pub socket: PathBuf,
}

impl Cni {
    /// The network configuration an invocation for `pod` writes to the plugin's stdin.
    pub fn netconf_bytes(&self, pod: &CniPod<'_>) -> anyhow::Result<Vec<u8>> {
        Ok(serde_json::to_vec(&self.netconf(pod))?)
    }

    fn netconf(&self, pod: &CniPod<'_>) -> serde_json::Value {
        let mut conf = json!({
            "cniVersion": "1.0.0",
            "name": "k8s-pod-network",
            "type": "linkerd-cni",
            "log_level": "warn",
            "linkerd": {
                "incoming-proxy-port": config::DEFAULT_INBOUND_PORT,
                "outgoing-proxy-port": config::DEFAULT_OUTBOUND_PORT,
                "proxy-uid": config::DEFAULT_PROXY_UID,
                "inbound-ports-to-ignore": config::DEFAULT_INBOUND_PORTS_TO_IGNORE,
                "agent-socket": self.socket,
            },
            "prevResult": {
                "cniVersion": "1.0.0",
                "interfaces": [{"name": "eth0", "sandbox": pod.netns}],
                "ips": [{"address": format!("{}/24", pod.ip), "interface": 0}],
            },
        });
        if let Some(cg) = pod.cgroup {
            conf["runtimeConfig"] = json!({"cgroupPath": cg});
        }
        conf
    }

    /// Spawn-to-exit of the plugin answering `VERSION` (no agent involved): the floor of
    /// every CNI call.
    pub fn version(&self) -> anyhow::Result<Duration> {
        let t0 = Instant::now();
        let out = Command::new(&self.plugin)
            .env_clear()
            .env("CNI_COMMAND", "VERSION")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()?;
        let took = t0.elapsed();
        if !out.status.success() {
            bail!(
                "CNI VERSION failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(took)
    }

    /// Runs `command` (`ADD`, `DEL`) for `pod`; returns the wall time from spawning the plugin
    /// to its exit (for ADD: the redirection is in force when it exits successfully).
    pub fn invoke(&self, command: &str, pod: &CniPod<'_>) -> anyhow::Result<Duration> {
        let conf = serde_json::to_vec(&self.netconf(pod))?;
        let t0 = Instant::now();
        let mut child = Command::new(&self.plugin)
            .env_clear()
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", pod.id)
            .env("CNI_NETNS", pod.netns)
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", "/usr/lib/cni")
            .env(
                "CNI_ARGS",
                format!(
                    "IgnoreUnknown=1;K8S_POD_NAMESPACE={K8S_NAMESPACE};K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={};K8S_POD_UID={}",
                    pod.name, pod.id, pod.uid
                ),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("spawning {}", self.plugin.display()))?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(&conf)?;
        }
        let out = child.wait_with_output()?;
        let took = t0.elapsed();
        if !out.status.success() {
            bail!(
                "CNI {command} of {} failed ({}): {} {}",
                pod.name,
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(took)
    }
}

/// A long-running child of this binary (proxy or server) whose stdout lines are kept.
pub struct Daemon {
    _child: ChildGuard,
    last_line: Arc<Mutex<String>>,
}

impl Daemon {
    /// Starts `me <args>` placed as `placement` says and waits for its first stdout line.
    pub fn start(me: &Path, placement: &Placement, args: &[String]) -> anyhow::Result<Self> {
        let mut cmd = placement.command(me)?;
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = ChildGuard::spawn(&mut cmd)?;
        let stdout = child.child_mut().stdout.take().context("no stdout pipe")?;
        let last_line = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let last_line = last_line.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    *last_line.lock().unwrap_or_else(|p| p.into_inner()) = line;
                    let _ = tx.send(());
                }
            });
        }
        if rx.recv_timeout(Duration::from_secs(10)).is_err() {
            bail!("{args:?} did not get ready");
        }
        Ok(Self {
            _child: child,
            last_line,
        })
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self._child.pid()
    }

    /// The proxy's latest counters.
    pub fn counters(&self) -> ProxyCounters {
        // Give the proxy's 50 ms reporting tick time to catch up.
        std::thread::sleep(Duration::from_millis(120));
        let line = self
            .last_line
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        serde_json::from_str(&line).unwrap_or_default()
    }
}

/// Runs `me load ...` placed as `placement` says and returns its result.
pub fn run_load(me: &Path, placement: &Placement, args: &LoadArgs) -> anyhow::Result<LoadResult> {
    let mut cmd = load_command(me, placement, args)?;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = ChildGuard::spawn(&mut cmd)?.wait_output(load_timeout(args))?;
    parse_load(&out)
}

/// Runs `me load ... --mark` placed as `placement` says; calls `take(load pid)` at both edges
/// of its measured window. Returns the load's result and the two readings (`None` if the load
/// generator did not mark both edges).
pub fn run_load_window<T>(
    me: &Path,
    placement: &Placement,
    args: &LoadArgs,
    mut take: impl FnMut(u32) -> T,
) -> anyhow::Result<(LoadResult, Option<(T, T)>)> {
    let mut cmd = load_command(me, placement, args)?;
    cmd.arg("--mark")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = ChildGuard::spawn(&mut cmd)?;
    let pid = child.pid();
    let stderr = child.child_mut().stderr.take().context("no stderr pipe")?;
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut rest = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line == MARK {
                let _ = tx.send(());
            } else {
                rest.push_str(&line);
                rest.push('\n');
            }
        }
        rest
    });
    let timeout = load_timeout(args);
    let mut readings = Vec::new();
    while readings.len() < 2 && rx.recv_timeout(timeout).is_ok() {
        readings.push(take(pid));
    }
    let mut out = child.wait_output(timeout)?;
    out.stderr = reader.join().unwrap_or_default().into_bytes();
    let r = parse_load(&out)?;
    let mut it = readings.into_iter();
    Ok((r, it.next().zip(it.next())))
}

/// The command line of `me load ...` placed as `placement` says (no stdio set).
pub fn load_command(me: &Path, placement: &Placement, args: &LoadArgs) -> anyhow::Result<Command> {
    let mut cmd = placement.command(me)?;
    cmd.arg("load")
        .args([
            "--kind",
            match args.kind {
                crate::workload::load::Kind::Rr => "rr",
                crate::workload::load::Kind::Bulk => "bulk",
                crate::workload::load::Kind::Persistent => "persistent",
            },
        ])
        .args(["--target", &args.target.to_string()])
        .args(["--concurrency", &args.concurrency.to_string()])
        .args(["--duration-ms", &args.duration_ms.to_string()])
        .args(["--warmup-ms", &args.warmup_ms.to_string()]);
    if let Some(s) = args.series_ms {
        cmd.args(["--series-ms", &s.to_string()]);
    }
    Ok(cmd)
}

/// How long a load run may take.
pub fn load_timeout(args: &LoadArgs) -> Duration {
    Duration::from_millis(args.duration_ms + args.warmup_ms) + Duration::from_secs(30)
}

/// The result a load run printed, or why it failed.
pub fn parse_load(out: &std::process::Output) -> anyhow::Result<LoadResult> {
    if !out.status.success() {
        bail!(
            "load generator failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim()).with_context(|| format!("parsing the load result {text:?}"))
}

/// The first IPv4 address of a socket address (helper for targets).
pub fn v4(addr: Ipv4Addr, port: u16) -> SocketAddr {
    SocketAddr::from((addr, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn help_flags_are_the_long_options_listed() {
        let help = "Usage: agent [OPTIONS] <COMMAND>\n\n  --pin-root <PIN_ROOT>  bpffs dir [env: X]\n  \
                    -h, --help  Print help\n      --max-pods=<N>  capacity (see --state-dir)\n";
        let flags = help_flags(help);
        for f in ["--pin-root", "--help", "--max-pods", "--state-dir"] {
            assert!(flags.contains(f), "{f} in {flags:?}");
        }
        assert!(
            !flags.contains("-h"),
            "short flags are not listed: {flags:?}"
        );
        assert_eq!(flags.len(), 4, "{flags:?}");
    }

    #[test]
    fn unknown_flags_are_left_out_with_their_values() {
        let known: std::collections::BTreeSet<String> =
            ["--a", "--c"].iter().map(|s| s.to_string()).collect();
        let args: Vec<String> = ["--a", "1", "--max-pods", "12288", "--c=3", "--d"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let (kept, dropped) = split_known_flags(&args, &known);
        assert_eq!(kept, ["--a", "1", "--c=3"]);
        assert_eq!(dropped, ["--max-pods", "--d"]);
    }
}
