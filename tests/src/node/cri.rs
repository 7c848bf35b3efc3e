//! A node run by a real container runtime: Debian's containerd (CRI plugin) and runc, driven
//! over the CRI v1 gRPC API as kubelet drives it, with `linkerd-cni` in the conflist the node
//! installer patched, and the agent run as the DaemonSet runs it (`linkerd-cni-agent run` with
//! the installer on and the DaemonSet's environment).
//!
//! Everything is the node's own: containerd's config, root, state, socket, runc root, CNI bin
//! and conf dirs, the netns mounts (`netns_mounts_under_state_dir`) live in a scratch
//! directory; containerd runs inside the node network namespace (`nsenter --net`, which unlike
//! `ip netns exec` keeps the host's `/sys` and so its cgroups), so the bridge stays inside.
//! Images are built here from Debian's busybox-static (an OCI archive imported with `ctr`).
//!
//! Dropping a [`CriNode`] stops and removes every sandbox through CRI, kills containerd, then
//! (by PID) every shim it left and every process left in the pods' cgroups, unmounts whatever
//! is still mounted below the scratch directory, removes the cgroups it made, and then the
//! agent, API server, pins, node netns and scratch directory go as in [`super::SimNode`].

use std::{
    collections::BTreeSet,
    fs,
    net::{Ipv4Addr, SocketAddr},
    os::unix::{ffi::OsStrExt, fs::PermissionsExt},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::Mutex,
    time::{Duration, Instant},
};

use hyper_util::rt::TokioIo;
use k8s_cri::v1::{
    self as cri, image_service_client::ImageServiceClient,
    runtime_service_client::RuntimeServiceClient,
};
use serde_json::{Value, json};
use tonic::transport::{Channel, Endpoint, Uri};

use linkerd_cni_common::paths;
use linkerd_cni_fake_apiserver::FakeApiServer;

use super::{
    AGENT_BIN, ApiServerProcess, BRIDGE, NETWORK_NAME, NODE_NAME, PLUGIN_BIN, POD_SUBNET, PodSpec,
    apifront::ApiFront, free_port, http_get, noderoot::NodeRoot, read_state, sim::PinRoot,
    sim::write_manifest, start_timeout, wait_until, workspace_bin,
};
use crate::{
    bins,
    child::ChildGuard,
    error::{Error, IoContext, Result},
    hostfs,
    names::{self, TempDir},
    netns::NetnsGuard,
    proxy::{self, PROXY_UID},
};

/// The image the pods' containers run (busybox-static).
pub const BUSYBOX_IMAGE: &str = "l5d.test/busybox:1";
/// The sandbox ("pause") image: the same rootfs, `sleep` as its process.
pub const PAUSE_IMAGE: &str = "l5d.test/pause:1";
/// Where the test binaries (proxy, client) are mounted in containers.
pub const BIN_MOUNT: &str = "/l5d";
/// Where a pod's log directory is mounted in its containers.
pub const LOG_MOUNT: &str = "/l5dlog";
/// The cgroup v1 and v2 hierarchies live below this.
const CGROUP_FS: &str = "/sys/fs/cgroup";
/// How long one CRI call may take.
const CRI_TIMEOUT: Duration = Duration::from_secs(60);
/// The kubelet's QoS class of the test pods (no resources).
const QOS: &str = "besteffort";
/// The `kubernetes` Service (`KUBERNETES_SERVICE_HOST`, `_PORT`) on a node with its own root:
/// the TLS front of the API server listens there, in the node netns.
pub const KUBERNETES_SERVICE: ([u8; 4], u16) = ([10, 96, 0, 1], 443);
/// The cluster DNS Service's address (kubelet's `clusterDNS`; nothing answers there).
pub const CLUSTER_DNS: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
/// The node's own address (`status.hostIP`), on the node netns's loopback.
pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(172, 31, 0, 2);
/// The containerd conflist's file name.
const CONFLIST: &str = "10-containerd-net.conflist";

/// How a [`CriNode`] is set up.
#[derive(Clone, Copy, Debug, Default)]
pub struct CriNodeOptions {
    /// Run the agent as a process on the host, configured as the DaemonSet configures it
    /// (the containerd tests); without it the conflist stays the primary CNI alone until
    /// something (a DaemonSet's pod) patches it.
    pub host_agent: bool,
    /// Give the node a root of its own ([`NodeRoot`]: containerd and its containers see the
    /// node's `/etc/cni/net.d`, `/opt/cni/bin`, `/run`, `/sys/fs/bpf`, all made shared), the
    /// node's address [`NODE_IP`], and the `kubernetes` Service at [`KUBERNETES_SERVICE`]: an
    /// HTTPS front of an in-process fake API server (which also serves objects of other API
    /// groups, such as a DaemonSet). What a DaemonSet's pod needs to run as rendered.
    pub own_root: bool,
}

/// The node's API server.
enum Api {
    /// The fake API server process, serving a manifest directory (`--kubeconfig` clients).
    Process(ApiServerProcess),
    /// The fake API server in this process, reached through its HTTPS front in the node
    /// netns (in-cluster clients).
    InProcess {
        front: ApiFront,
        server: FakeApiServer,
    },
}

/// A sandbox this node ran.
#[derive(Clone, Debug)]
pub struct Sandbox {
    /// The sandbox id (`CNI_CONTAINERID`).
    pub id: String,
    /// The pod as the API server serves it.
    pub spec: PodSpec,
    /// The IP containerd reports for it.
    pub ip: Ipv4Addr,
    /// How long `RunPodSandbox` took (CNI ADD included).
    pub run_time: Duration,
    /// The config it was run with (`CreateContainer` repeats it).
    config: cri::PodSandboxConfig,
}

/// A container to create in a sandbox.
#[derive(Clone, Debug)]
pub struct ContainerSpec {
    /// Its name (as in the Pod object).
    pub name: String,
    /// `securityContext.runAsUser`.
    pub run_as_user: i64,
    /// Its command.
    pub command: Vec<String>,
}

/// The node: containerd, the agent, the fake API server, the node netns.
pub struct CriNode {
    containerd: Option<ChildGuard>,
    agent: Option<ChildGuard>,
    agent_health: SocketAddr,
    api: Api,
    pub(super) rt: tokio::runtime::Runtime,
    runtime: Option<RuntimeServiceClient<Channel>>,
    /// Sandboxes run and not removed yet.
    sandboxes: Mutex<BTreeSet<String>>,
    /// Pod cgroups (relative to each hierarchy) this node created or told runc to create.
    cgroups: Mutex<BTreeSet<PathBuf>>,
    pins: PinRoot,
    /// The node's own root (after containerd, before the scratch directory that holds its
    /// overlays).
    root: Option<NodeRoot>,
    netns: NetnsGuard,
    dir: TempDir,
}

impl std::fmt::Debug for CriNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CriNode")
            .field("dir", &self.dir.path())
            .field("netns", &self.netns.name())
            .finish_non_exhaustive()
    }
}

impl CriNode {
    /// Starts the API server (serving `objects`), the agent with the installer (which patches
    /// the node's conflist), then containerd in the node netns, and imports the images.
    pub fn start(objects: &[Value]) -> Result<Self> {
        Self::start_with(objects, true)
    }

    /// Like [`CriNode::start`]; with `linkerd` false no agent runs and the conflist stays
    /// the primary CNI alone (bridge + host-local), the baseline of the benchmark.
    pub fn start_with(objects: &[Value], linkerd: bool) -> Result<Self> {
        Self::start_opts(
            objects,
            CriNodeOptions {
                host_agent: linkerd,
                own_root: false,
            },
        )
    }

    /// Starts a node as `opts` say: the API server serving `objects`, the agent (if asked
    /// for), containerd in the node netns, the images imported.
    pub fn start_opts(objects: &[Value], opts: CriNodeOptions) -> Result<Self> {
        reap_stale_nodes();
        if opts.own_root && opts.host_agent {
            return Err(Error::Missing(
                "a node with its own root runs the agent as a pod, not on the host".into(),
            ));
        }
        let dir = TempDir::new()?;
        let d = dir.path().to_path_buf();
        for sub in [
            "manifests",
            "cni/bin",
            "cni/net.d",
            "ipam",
            "state",
            "run",
            "logs",
            "sa",
            "containerd/root",
            "containerd/state",
            "containerd/opt",
            "runc",
            "pods",
            "kubelet/pods",
            "kubelet/logs",
        ] {
            fs::create_dir_all(d.join(sub)).ctx(|| format!("creating {sub}"))?;
        }
        let root = if opts.own_root {
            Some(NodeRoot::new(&d.join("root"))?)
        } else {
            None
        };
        let node_path = |p: &str| match &root {
            Some(r) => r.path(p),
            None => d.join(p.trim_start_matches('/')),
        };
        let (cni_bin, cni_conf) = if root.is_some() {
            (node_path(paths::CNI_BIN_DIR), node_path(paths::CNI_NET_DIR))
        } else {
            (d.join("cni/bin"), d.join("cni/net.d"))
        };
        // The primary CNI: bridge + host-local, the conflist our installer patches.
        for p in ["bridge", "host-local", "loopback"] {
            let src = Path::new(crate::cniruntime::SYSTEM_PLUGIN_DIR).join(p);
            if !src.is_file() {
                return Err(Error::Missing(format!(
                    "{} not found: install containernetworking-plugins (`cargo xtask setup`)",
                    src.display()
                )));
            }
            std::os::unix::fs::symlink(&src, cni_bin.join(p)).ctx(|| format!("linking {p}"))?;
        }
        let conflist = json!({
            "cniVersion": "1.0.0",
            "name": NETWORK_NAME,
            "plugins": [{
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
            }],
        });
        fs::write(cni_conf.join(CONFLIST), conflist.to_string()).ctx(|| "writing the conflist")?;
        let netns = NetnsGuard::new()?;
        let api = if root.is_some() {
            netns.exec("ip", ["addr", "add", &format!("{NODE_IP}/32"), "dev", "lo"])?;
            let server = FakeApiServer::start()
                .map_err(|e| Error::Missing(format!("starting the fake API server: {e}")))?;
            let front =
                ApiFront::start(&netns, SocketAddr::from(KUBERNETES_SERVICE), server.addr())?;
            Api::InProcess { front, server }
        } else {
            for object in objects {
                write_manifest(&d.join("manifests"), object)?;
            }
            Api::Process(ApiServerProcess::start(
                &d.join("manifests"),
                &d.join("kubeconfig"),
                &d.join("logs/apiserver.log"),
            )?)
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .ctx(|| "building the CRI client's runtime")?;
        let mut node = Self {
            containerd: None,
            agent: None,
            agent_health: SocketAddr::from(([127, 0, 0, 1], free_port()?)),
            api,
            rt,
            runtime: None,
            sandboxes: Mutex::new(BTreeSet::new()),
            cgroups: Mutex::new(BTreeSet::new()),
            pins: PinRoot::new(),
            root,
            netns,
            dir,
        };
        if matches!(node.api, Api::InProcess { .. }) {
            node.apply(objects)?;
        }
        if opts.host_agent {
            node.start_agent()?;
        }
        node.start_containerd()?;
        node.import_images()?;
        Ok(node)
    }

    /// The scratch directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The node's network namespace (containerd's, the bridge's).
    pub fn netns(&self) -> &NetnsGuard {
        &self.netns
    }

    /// A command that runs inside the node: in its network namespace and, when it has its own
    /// root, in its mount namespace (where containerd runs its CNI plugins).
    pub fn node_command(&self, program: impl AsRef<std::ffi::OsStr>) -> Result<Command> {
        use std::os::{
            fd::{AsRawFd, OwnedFd},
            unix::process::CommandExt,
        };
        let net = OwnedFd::from(self.netns.open()?);
        let mnt = match &self.root {
            Some(r) => Some(OwnedFd::from(
                fs::File::open(r.ns_file()).ctx(|| "opening the node's mount namespace")?,
            )),
            None => None,
        };
        let mut cmd = Command::new(program);
        // SAFETY: the closure only calls setns(2), which is async-signal-safe, on fds that the
        // closure owns and that stay open until the Command is dropped.
        unsafe {
            cmd.pre_exec(move || {
                if let Some(m) = &mnt
                    && libc::setns(m.as_raw_fd(), libc::CLONE_NEWNS) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::setns(net.as_raw_fd(), libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        Ok(cmd)
    }

    /// The node's own root, when it has one.
    pub fn root(&self) -> Option<&NodeRoot> {
        self.root.as_ref()
    }

    /// Where this process reaches the node's `node_path`: through the node's own root when
    /// it has one, else the path itself.
    pub fn node_path(&self, node_path: impl AsRef<Path>) -> PathBuf {
        match &self.root {
            Some(r) => r.path(node_path),
            None => node_path.as_ref().to_path_buf(),
        }
    }

    /// The node's CNI configuration directory (as this process reaches it).
    pub fn cni_conf_dir(&self) -> PathBuf {
        match &self.root {
            Some(r) => r.path(paths::CNI_NET_DIR),
            None => self.dir().join("cni/net.d"),
        }
    }

    /// The node's CNI plugin directory (as this process reaches it).
    pub fn cni_bin_dir(&self) -> PathBuf {
        match &self.root {
            Some(r) => r.path(paths::CNI_BIN_DIR),
            None => self.dir().join("cni/bin"),
        }
    }

    /// The conflist containerd reads (as the installer left it).
    pub fn conflist(&self) -> PathBuf {
        self.cni_conf_dir().join(CONFLIST)
    }

    /// The agent's pin root: the default one of the node's own bpffs when the node has its
    /// own root (the DaemonSet's agent pins there), else the host agent's.
    pub fn pin_root(&self) -> PathBuf {
        match &self.root {
            Some(r) => r.path(paths::PIN_ROOT),
            None => self.pins.path().to_path_buf(),
        }
    }

    /// The agent's registry.
    pub fn state_dir(&self) -> PathBuf {
        match &self.root {
            Some(r) => r.path(paths::STATE_DIR),
            None => self.dir().join("state"),
        }
    }

    /// The agent's registration socket.
    pub fn socket(&self) -> PathBuf {
        match &self.root {
            Some(r) => r.path(paths::AGENT_SOCKET),
            None => self.dir().join("run/agent.sock"),
        }
    }

    /// The in-process fake API server of a node with its own root.
    pub fn api_server(&self) -> Option<&FakeApiServer> {
        match &self.api {
            Api::InProcess { server, .. } => Some(server),
            Api::Process(_) => None,
        }
    }

    /// The HTTPS front of the API server of a node with its own root.
    pub fn api_front(&self) -> Option<&ApiFront> {
        match &self.api {
            Api::InProcess { front, .. } => Some(front),
            Api::Process(_) => None,
        }
    }

    /// The agent's registry, links and map entries now.
    pub fn state(&self) -> Result<super::AgentState> {
        read_state(&self.pin_root(), &self.state_dir())
    }

    /// `linkerd-cni-agent inspect` for this node.
    pub fn inspect(&self) -> Result<String> {
        names::run(
            Command::new(workspace_bin(AGENT_BIN)?)
                .arg("--pin-root")
                .arg(self.pin_root())
                .arg("--state-dir")
                .arg(self.state_dir())
                .arg("inspect"),
        )
    }

    /// The addresses host-local holds.
    pub fn allocated_ips(&self) -> Vec<String> {
        super::sim::host_local_ips(self.dir())
    }

    /// Network namespaces containerd has mounted (below its state directory, or in the
    /// node's own root).
    pub fn netns_mounts(&self) -> Vec<PathBuf> {
        match &self.root {
            Some(r) => mounts_in(&r.mountinfo(), Path::new("/"))
                .into_iter()
                .filter(|(p, fstype)| fstype == "nsfs" && p.starts_with("/run/netns"))
                .map(|(p, _)| p)
                .collect(),
            None => mounts_below(self.dir())
                .into_iter()
                .filter(|(_, fstype)| fstype == "nsfs")
                .map(|(p, _)| p)
                .collect(),
        }
    }

    /// containerd's log (the CNI plugins' stderr included).
    pub fn containerd_log(&self) -> String {
        fs::read_to_string(self.dir().join("logs/containerd.log")).unwrap_or_default()
    }

    /// The agent's, the API server's and containerd's logs, for failure messages.
    pub fn diagnostics(&self) -> String {
        let read = |p: &str| fs::read_to_string(self.dir().join(p)).unwrap_or_default();
        let tail = |s: String| {
            let lines: Vec<&str> = s.lines().collect();
            lines[lines.len().saturating_sub(60)..].join("\n")
        };
        let api = match &self.api {
            Api::Process(p) => tail(p.log()),
            Api::InProcess { server, .. } => {
                let reqs = server.requests();
                let lines: Vec<String> = reqs[reqs.len().saturating_sub(30)..]
                    .iter()
                    .map(|r| format!("{} {} {:?}", r.method, r.path, r.query))
                    .collect();
                lines.join("\n")
            }
        };
        format!(
            "--- agent log ---\n{}\n--- containerd log (tail) ---\n{}\n--- API server (tail) ---\n{}",
            tail(read("logs/agent.log")),
            tail(read("logs/containerd.log")),
            api
        )
    }

    /// The agent as the DaemonSet runs it: `linkerd-cni-agent run` with the installer on
    /// (`LINKERD_CNI_AGENT_INSTALL`), the installer's variables and the chart's default
    /// `cni_network_config` (with this node's agent socket); it is ready once the plugin is
    /// in the conflist.
    fn start_agent(&mut self) -> Result<()> {
        let d = self.dir().to_path_buf();
        fs::write(d.join("sa/token"), "test-token").ctx(|| "writing the token")?;
        fs::write(
            d.join("sa/ca.crt"),
            "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
        )
        .ctx(|| "writing the CA")?;
        let template = super::chart_network_config(&self.socket());
        let plugin = workspace_bin(PLUGIN_BIN)?;
        let plugin_dir = plugin
            .parent()
            .ok_or_else(|| Error::Missing("the plugin's directory".into()))?;
        let log = fs::File::create(d.join("logs/agent.log")).ctx(|| "creating the agent log")?;
        let mut cmd = Command::new(workspace_bin(AGENT_BIN)?);
        cmd.arg("run")
            .arg("--kubeconfig")
            .arg(d.join("kubeconfig"))
            .arg("--state-dir")
            .arg(self.state_dir())
            .env("LINKERD_CNI_AGENT_INSTALL", "true")
            .env("LINKERD_CNI_AGENT_NODE_NAME", NODE_NAME)
            .env(
                "LINKERD_CNI_AGENT_LOG_LEVEL",
                "info,linkerd_cni_agent=debug",
            )
            .env("LINKERD_CNI_AGENT_SOCKET", self.socket())
            .env("LINKERD_CNI_AGENT_PIN_ROOT", self.pin_root())
            // containerd pins pod netns below its state directory here
            // (`netns_mounts_under_state_dir`): CNI_NETNS elsewhere is refused.
            .env("LINKERD_CNI_AGENT_NETNS_DIRS", d.join("containerd/state"))
            .env(
                "LINKERD_CNI_AGENT_HEALTH_ADDR",
                self.agent_health.to_string(),
            )
            .env("DEST_CNI_NET_DIR", d.join("cni/net.d"))
            .env("DEST_CNI_BIN_DIR", d.join("cni/bin"))
            .env("CNI_NETWORK_CONFIG", template.to_string())
            .env("CONTAINER_MOUNT_PREFIX", "")
            .env("CONTAINER_CNI_BIN_DIR", plugin_dir)
            .env("SERVICEACCOUNT_PATH", d.join("sa"))
            .env("KUBERNETES_SERVICE_HOST", "10.96.0.1")
            .env("KUBERNETES_SERVICE_PORT", "443")
            .env("POD_NAMESPACE", "linkerd-cni")
            .env_remove("LINKERD_CNI_AGENT_DAEMONSET")
            .env_remove("LINKERD_CNI_AGENT_CLEANUP_ON_SIGTERM")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        let mut agent = ChildGuard::spawn(&mut cmd)?;
        let deadline = Instant::now() + start_timeout();
        loop {
            if let Some(status) = agent.try_wait()? {
                return Err(Error::Missing(format!(
                    "the agent exited with {status} during start-up:\n{}",
                    self.diagnostics()
                )));
            }
            if matches!(
                http_get(self.agent_health, "/ready", Duration::from_secs(1)),
                Ok((200, _))
            ) {
                break;
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout {
                    what: "the agent's readiness (plugin in the conflist)".into(),
                    timeout: start_timeout(),
                    detail: self.diagnostics(),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.agent = Some(agent);
        Ok(())
    }

    /// SIGKILLs the agent.
    pub fn kill_agent(&mut self) {
        if let Some(mut a) = self.agent.take() {
            a.kill();
        }
    }

    pub(super) fn containerd_socket(&self) -> PathBuf {
        self.dir().join("run/containerd.sock")
    }

    fn start_containerd(&mut self) -> Result<()> {
        let d = self.dir().to_path_buf();
        let s = |p: &str| d.join(p).display().to_string();
        // With its own root the node keeps CNI files and pod netns where real nodes do.
        let (cni_bin, cni_conf, netns_under_state) = if self.root.is_some() {
            (
                paths::CNI_BIN_DIR.to_string(),
                paths::CNI_NET_DIR.to_string(),
                false,
            )
        } else {
            (s("cni/bin"), s("cni/net.d"), true)
        };
        let config = format!(
            r#"version = 2
root = "{root}"
state = "{state}"
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = {netns_under_state}
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni_bin}"
    conf_dir = "{cni_conf}"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = "{runc}"
        SystemdCgroup = false
"#,
            root = s("containerd/root"),
            state = s("containerd/state"),
            sock = self.containerd_socket().display(),
            opt = s("containerd/opt"),
            runc = s("runc"),
        );
        fs::write(d.join("containerd.toml"), config).ctx(|| "writing containerd's config")?;
        let log =
            fs::File::create(d.join("logs/containerd.log")).ctx(|| "creating containerd's log")?;
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", self.netns.path().display()));
        if let Some(root) = &self.root {
            cmd.arg(format!("--mount={}", root.ns_file().display()));
        }
        cmd.arg("containerd")
            .arg("--config")
            .arg(d.join("containerd.toml"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        let child = ChildGuard::spawn(&mut cmd).map_err(|e| {
            Error::Missing(format!(
                "{e}\n(containerd and runc come from `cargo xtask setup`)"
            ))
        })?;
        self.containerd = Some(child);
        let sock = self.containerd_socket();
        let deadline = Instant::now() + start_timeout();
        let channel = loop {
            if let Some(c) = self.containerd.as_mut()
                && let Some(status) = c.try_wait()?
            {
                return Err(Error::Missing(format!(
                    "containerd exited with {status}:\n{}",
                    self.diagnostics()
                )));
            }
            if sock.exists() {
                let connected = self.rt.block_on(connect_unix(sock.clone()));
                if let Ok(channel) = connected {
                    break channel;
                }
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout {
                    what: "containerd's start".into(),
                    timeout: start_timeout(),
                    detail: self.diagnostics(),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut client = RuntimeServiceClient::new(channel.clone());
        // CRI answers once its plugin is up; its network is ready once it loaded our conflist.
        wait_until(
            "containerd's CRI to report its network ready",
            start_timeout(),
            || {
                let status = self
                    .rt
                    .block_on(client.status(cri::StatusRequest { verbose: false }))
                    .ok()?
                    .into_inner();
                let ready = status.status?.conditions.iter().all(|c| c.status);
                ready.then_some(())
            },
        )
        .map_err(|e| Error::Missing(format!("{e}\n{}", self.diagnostics())))?;
        self.runtime = Some(client);
        Ok(())
    }

    /// Builds the busybox and pause images (an OCI archive) and imports them with `ctr`.
    fn import_images(&self) -> Result<()> {
        let archive = build_image_archive(&self.dir().join("image"))?;
        names::run(
            Command::new("ctr")
                .arg("--address")
                .arg(self.containerd_socket())
                .args(["-n", "k8s.io", "images", "import"])
                .arg(&archive),
        )?;
        let channel = self.channel()?;
        let mut images = ImageServiceClient::new(channel);
        for image in [BUSYBOX_IMAGE, PAUSE_IMAGE] {
            wait_until(
                &format!("CRI to list image {image}"),
                Duration::from_secs(20),
                || {
                    let resp = self
                        .rt
                        .block_on(images.image_status(cri::ImageStatusRequest {
                            image: Some(cri::ImageSpec {
                                image: image.into(),
                                ..Default::default()
                            }),
                            verbose: false,
                        }))
                        .ok()?
                        .into_inner();
                    resp.image.map(|_| ())
                },
            )?;
        }
        Ok(())
    }

    pub(super) fn channel(&self) -> Result<Channel> {
        // `RuntimeServiceClient` holds a cheap-to-clone channel; reach it through a clone.
        self.rt
            .block_on(connect_unix(self.containerd_socket()))
            .map_err(|e| Error::Missing(format!("connecting to containerd: {e}")))
    }

    pub(super) fn client(&self) -> Result<RuntimeServiceClient<Channel>> {
        self.runtime
            .clone()
            .ok_or_else(|| Error::Missing("containerd is not running".into()))
    }

    /// Runs one CRI call with a deadline.
    pub(super) fn call<T>(
        &self,
        what: &str,
        fut: impl std::future::Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T> {
        match self
            .rt
            .block_on(async { tokio::time::timeout(CRI_TIMEOUT, fut).await })
        {
            Ok(Ok(r)) => Ok(r.into_inner()),
            Ok(Err(status)) => Err(Error::Missing(format!(
                "CRI {what}: {} ({:?})",
                status.message(),
                status.code()
            ))),
            Err(_) => Err(Error::Timeout {
                what: format!("CRI {what}"),
                timeout: CRI_TIMEOUT,
                detail: String::new(),
            }),
        }
    }

    /// Serves `objects` (Pods, Namespaces) from the API server and waits until it does. The
    /// in-process server of a node with its own root serves objects of other API groups
    /// (a DaemonSet, RBAC) at their paths too.
    pub fn apply(&self, objects: &[Value]) -> Result<()> {
        if let Api::InProcess { server, .. } = &self.api {
            for object in objects {
                if object["apiVersion"] == "v1" {
                    server.apply(object).map_err(|e| {
                        Error::Missing(format!("the fake API server refused an object: {e}"))
                    })?;
                } else {
                    server.route(&group_object_path(object)?, object.clone());
                }
            }
            return Ok(());
        }
        let dir = self.dir().join("manifests");
        for object in objects {
            write_manifest(&dir, object)?;
        }
        for object in objects {
            let path = super::sim::api_path(object)?;
            let want = object.pointer("/metadata/uid").cloned();
            wait_until(
                &format!("the API server serving {path}"),
                Duration::from_secs(10),
                || {
                    let Api::Process(apiserver) = &self.api else {
                        return Some(());
                    };
                    let (status, body) = apiserver.get(&path).ok()?;
                    let served: Value = serde_json::from_str(&body).ok()?;
                    (status == 200 && served.pointer("/metadata/uid") == want.as_ref())
                        .then_some(())
                },
            )?;
        }
        Ok(())
    }

    /// The pod cgroup kubelet would use for `spec`, relative to each hierarchy.
    pub fn pod_cgroup(spec: &PodSpec) -> PathBuf {
        PathBuf::from(format!("kubepods/{QOS}/pod{}", spec.uid))
    }

    /// Creates `spec`'s pod cgroup in every hierarchy (v1 controllers and the unified v2
    /// one), as kubelet does before `RunPodSandbox`.
    pub fn create_pod_cgroup(&self, spec: &PodSpec) -> Result<()> {
        self.create_cgroup(&Self::pod_cgroup(spec))
    }

    /// Creates the cgroup `rel` in every hierarchy, removed when the node is dropped.
    pub(super) fn create_cgroup(&self, rel: &Path) -> Result<()> {
        self.track_cgroup(rel);
        for h in hierarchies() {
            let p = h.join(rel);
            fs::create_dir_all(&p).ctx(|| format!("creating {}", p.display()))?;
        }
        Ok(())
    }

    /// Remembers sandbox `id` (stopped and removed when the node is dropped) or forgets it.
    pub(super) fn track_sandbox(&self, id: &str, running: bool) {
        let mut s = self.sandboxes.lock().unwrap_or_else(|p| p.into_inner());
        if running {
            s.insert(id.to_string());
        } else {
            s.remove(id);
        }
    }

    pub(super) fn track_cgroup(&self, rel: &Path) {
        self.cgroups
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(rel.to_path_buf());
    }

    /// Serves `spec` from the API server and runs its sandbox with `linux.cgroup_parent` set
    /// to the kubelet's pod cgroup (created beforehand or not, see
    /// [`CriNode::create_pod_cgroup`]).
    pub fn run_pod(&self, spec: &PodSpec) -> Result<Sandbox> {
        self.run_pod_userns(spec, None)
    }

    /// [`CriNode::run_pod`], asking for a user namespace of the pod's own with these
    /// mappings (`(container ID, host ID, length)`, UIDs and GIDs alike) as kubelet asks for a
    /// `hostUsers: false` pod (`linux.security_context.namespace_options.userns_options`, mode
    /// POD); `None` as for any other pod. Whether the runtime honours it is
    /// [`CriNode::sandbox_uid_map`]'s to say.
    pub fn run_pod_userns(
        &self,
        spec: &PodSpec,
        userns: Option<(u32, u32, u32)>,
    ) -> Result<Sandbox> {
        self.apply(&[spec.manifest(NODE_NAME)])?;
        let rel = Self::pod_cgroup(spec);
        // runc creates it when the kubelet did not: remove it afterwards either way.
        self.track_cgroup(&rel);
        let log_dir = self.dir().join("pods").join(&spec.uid);
        fs::create_dir_all(&log_dir).ctx(|| format!("creating {}", log_dir.display()))?;
        fs::set_permissions(&log_dir, fs::Permissions::from_mode(0o777))
            .ctx(|| format!("chmod {}", log_dir.display()))?;
        let config = cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: spec.name.clone(),
                uid: spec.uid.clone(),
                namespace: spec.namespace.clone(),
                attempt: 0,
            }),
            hostname: spec.name.clone(),
            log_directory: log_dir.display().to_string(),
            linux: Some(cri::LinuxPodSandboxConfig {
                cgroup_parent: format!("/{}", rel.display()),
                security_context: userns.map(|(container_id, host_id, length)| {
                    let ids = vec![cri::IdMapping {
                        host_id,
                        container_id,
                        length,
                    }];
                    cri::LinuxSandboxSecurityContext {
                        namespace_options: Some(cri::NamespaceOption {
                            userns_options: Some(cri::UserNamespace {
                                mode: cri::NamespaceMode::Pod as i32,
                                uids: ids.clone(),
                                gids: ids,
                            }),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut client = self.client()?;
        let started = Instant::now();
        let resp = self.call(
            "RunPodSandbox",
            client.run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(config.clone()),
                runtime_handler: String::new(),
            }),
        );
        let id = resp
            .map_err(|e| Error::Missing(format!("{e}\n{}", self.diagnostics())))?
            .pod_sandbox_id;
        let run_time = started.elapsed();
        self.sandboxes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.clone());
        let status = self.call(
            "PodSandboxStatus",
            client.pod_sandbox_status(cri::PodSandboxStatusRequest {
                pod_sandbox_id: id.clone(),
                verbose: false,
            }),
        )?;
        let ip = status
            .status
            .and_then(|s| s.network)
            .and_then(|n| n.ip.parse().ok())
            .ok_or_else(|| Error::Missing(format!("no IPv4 address for sandbox {id}")))?;
        Ok(Sandbox {
            id,
            spec: spec.clone(),
            ip,
            run_time,
            config,
        })
    }

    /// Creates and starts a container of `sandbox` from the busybox image, with the test
    /// binaries at [`BIN_MOUNT`], the host's libraries (they are dynamically linked) and the
    /// pod's log directory at [`LOG_MOUNT`]; returns its id.
    pub fn start_container(&self, sandbox: &Sandbox, c: &ContainerSpec) -> Result<String> {
        let mut mounts = vec![
            cri::Mount {
                container_path: BIN_MOUNT.into(),
                host_path: self.bin_dir()?.display().to_string(),
                readonly: true,
                ..Default::default()
            },
            cri::Mount {
                container_path: LOG_MOUNT.into(),
                host_path: self.log_dir(sandbox).display().to_string(),
                readonly: false,
                ..Default::default()
            },
        ];
        for lib in ["/lib", "/lib64"] {
            if Path::new(lib).is_dir() {
                mounts.push(cri::Mount {
                    container_path: lib.into(),
                    host_path: lib.into(),
                    readonly: true,
                    ..Default::default()
                });
            }
        }
        let config = cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: c.name.clone(),
                attempt: 0,
            }),
            image: Some(cri::ImageSpec {
                image: BUSYBOX_IMAGE.into(),
                ..Default::default()
            }),
            command: c.command.clone(),
            mounts,
            log_path: format!("{}.log", c.name),
            linux: Some(cri::LinuxContainerConfig {
                security_context: Some(cri::LinuxContainerSecurityContext {
                    run_as_user: Some(cri::Int64Value {
                        value: c.run_as_user,
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut client = self.client()?;
        let id = self
            .call(
                "CreateContainer",
                client.create_container(cri::CreateContainerRequest {
                    pod_sandbox_id: sandbox.id.clone(),
                    config: Some(config),
                    sandbox_config: Some(sandbox.config.clone()),
                }),
            )?
            .container_id;
        self.call(
            "StartContainer",
            client.start_container(cri::StartContainerRequest {
                container_id: id.clone(),
            }),
        )?;
        Ok(id)
    }

    /// Starts the forwarding test proxy as `sandbox`'s `linkerd-proxy` container (UID 2102)
    /// and waits until it listens; its log is [`CriNode::proxy_log`].
    pub fn start_proxy(&self, sandbox: &Sandbox) -> Result<String> {
        let mut command = vec![
            format!("{BIN_MOUNT}/{}", bins::PROXY),
            "--log".into(),
            format!("{LOG_MOUNT}/proxy.jsonl"),
            "--ready-file".into(),
            format!("{LOG_MOUNT}/proxy.ready"),
        ];
        command.extend(proxy::Options::new().to_args());
        let id = self.start_container(
            sandbox,
            &ContainerSpec {
                name: "linkerd-proxy".into(),
                run_as_user: i64::from(PROXY_UID),
                command,
            },
        )?;
        let ready = self.log_dir(sandbox).join("proxy.ready");
        wait_until("the proxy container to listen", start_timeout(), || {
            ready.exists().then_some(())
        })
        .map_err(|e| Error::Missing(format!("{e}\n{}", self.diagnostics())))?;
        Ok(id)
    }

    /// Runs Linkerd's network validator as `sandbox`'s `linkerd-network-validator` init
    /// container (the test client in validator mode, UID 65534, dialling an address nothing
    /// on the node answers) until it exits; returns its exit code (0 passed, 95 failed).
    pub fn run_validator(&self, sandbox: &Sandbox) -> Result<i32> {
        let timeout = Duration::from_secs(3);
        let mut command = vec![format!("{BIN_MOUNT}/{}", bins::CLIENT)];
        command.extend(
            crate::client::Options::validator(SocketAddr::from(([192, 0, 2, 2], 20001)), timeout)
                .to_args(),
        );
        let id = self.start_container(
            sandbox,
            &ContainerSpec {
                name: "linkerd-network-validator".into(),
                run_as_user: 65534,
                command,
            },
        )?;
        let exited = cri::ContainerState::ContainerExited as i32;
        let status = wait_until(
            "the validator container to exit",
            start_timeout() + timeout * 2,
            || {
                self.container_status(&id)
                    .ok()
                    .filter(|s| s.state == exited)
            },
        )
        .map_err(|e| Error::Missing(format!("{e}\n{}", self.diagnostics())))?;
        Ok(status.exit_code)
    }

    /// The first line of the `uid_map` of `sandbox`'s pause process: `0 0 4294967295` when it
    /// runs in the host's user namespace.
    pub fn sandbox_uid_map(&self, sandbox: &Sandbox) -> Result<String> {
        let mut client = self.client()?;
        let resp = self.call(
            "PodSandboxStatus",
            client.pod_sandbox_status(cri::PodSandboxStatusRequest {
                pod_sandbox_id: sandbox.id.clone(),
                verbose: true,
            }),
        )?;
        let info: Value = resp
            .info
            .get("info")
            .and_then(|i| serde_json::from_str(i).ok())
            .unwrap_or_default();
        let pid = info["pid"]
            .as_u64()
            .filter(|p| *p > 0)
            .ok_or_else(|| Error::Missing(format!("no pid for sandbox {}: {info}", sandbox.id)))?;
        let path = format!("/proc/{pid}/uid_map");
        let map = fs::read_to_string(&path).ctx(|| format!("reading {path}"))?;
        Ok(map
            .lines()
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" "))
    }

    /// The CNI configuration containerd has loaded (CRI `Status`, verbose: its
    /// `cniconfig`), as text: what the next `RunPodSandbox` runs.
    pub fn loaded_cni_config(&self) -> Result<String> {
        let mut client = self.client()?;
        let resp = self.call(
            "Status",
            client.status(cri::StatusRequest { verbose: true }),
        )?;
        resp.info.get("cniconfig").cloned().ok_or_else(|| {
            Error::Missing(format!(
                "no cniconfig in containerd's status: {:?}",
                resp.info.keys()
            ))
        })
    }

    /// The proxy container's event log.
    pub fn proxy_log(&self, sandbox: &Sandbox) -> proxy::ProxyLog {
        proxy::ProxyLog::new(self.log_dir(sandbox).join("proxy.jsonl"))
    }

    /// Runs `cmd` in container `id` (CRI `ExecSync`, as the container's user, in its cgroup):
    /// exit code, stdout, stderr.
    pub fn exec(&self, id: &str, cmd: &[String]) -> Result<(i32, String, String)> {
        let mut client = self.client()?;
        let r = self.call(
            "ExecSync",
            client.exec_sync(cri::ExecSyncRequest {
                container_id: id.into(),
                cmd: cmd.to_vec(),
                timeout: 30,
            }),
        )?;
        Ok((
            r.exit_code,
            String::from_utf8_lossy(&r.stdout).into_owned(),
            String::from_utf8_lossy(&r.stderr).into_owned(),
        ))
    }

    /// Runs the test client in container `id` with `opts` and returns its report.
    pub fn run_client(
        &self,
        id: &str,
        opts: &crate::client::Options,
    ) -> Result<crate::client::Report> {
        let mut cmd = vec![format!("{BIN_MOUNT}/{}", bins::CLIENT)];
        cmd.extend(opts.to_args());
        let (code, stdout, stderr) = self.exec(id, &cmd)?;
        if code != 0 {
            return Err(Error::Missing(format!(
                "the test client exited with {code} in container {id}: {stderr}"
            )));
        }
        serde_json::from_str(stdout.trim()).map_err(|e| Error::Parse {
            what: "the test client's report".into(),
            detail: format!("{e}: {stdout} {stderr}"),
        })
    }

    /// `StopPodSandbox` (CNI DEL with the netns, the netns removed).
    pub fn stop_pod(&self, sandbox: &Sandbox) -> Result<()> {
        let mut client = self.client()?;
        self.call(
            "StopPodSandbox",
            client.stop_pod_sandbox(cri::StopPodSandboxRequest {
                pod_sandbox_id: sandbox.id.clone(),
            }),
        )
        .map(|_| ())
    }

    /// `RemovePodSandbox` (containerd's second DEL).
    pub fn remove_pod(&self, sandbox: &Sandbox) -> Result<()> {
        let mut client = self.client()?;
        self.call(
            "RemovePodSandbox",
            client.remove_pod_sandbox(cri::RemovePodSandboxRequest {
                pod_sandbox_id: sandbox.id.clone(),
            }),
        )?;
        self.sandboxes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&sandbox.id);
        Ok(())
    }

    /// The sandboxes containerd lists.
    pub fn list_pods(&self) -> Result<Vec<String>> {
        let mut client = self.client()?;
        Ok(self
            .call(
                "ListPodSandbox",
                client.list_pod_sandbox(cri::ListPodSandboxRequest { filter: None }),
            )?
            .items
            .into_iter()
            .map(|s| s.id)
            .collect())
    }

    fn log_dir(&self, sandbox: &Sandbox) -> PathBuf {
        self.dir().join("pods").join(&sandbox.spec.uid)
    }

    /// A world-readable directory with copies of the test proxy and client (the checkout may
    /// be unreadable to the containers' UIDs).
    fn bin_dir(&self) -> Result<PathBuf> {
        let dir = self.dir().join("l5dbin");
        if !dir.join(bins::CLIENT).exists() {
            fs::create_dir_all(&dir).ctx(|| format!("creating {}", dir.display()))?;
            fs::set_permissions(&dir, fs::Permissions::from_mode(0o755))
                .ctx(|| format!("chmod {}", dir.display()))?;
            for name in [bins::PROXY, bins::CLIENT] {
                let to = dir.join(name);
                fs::copy(bins::bin_path(name)?, &to).ctx(|| format!("copying {name}"))?;
                fs::set_permissions(&to, fs::Permissions::from_mode(0o755))
                    .ctx(|| format!("chmod {}", to.display()))?;
            }
        }
        Ok(dir)
    }

    /// Tears everything down that the field destructors do not: sandboxes, containerd, its
    /// shims and containers, mounts, cgroups.
    fn teardown(&mut self) {
        let ids: Vec<String> = self
            .sandboxes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect();
        if let Some(mut client) = self.runtime.clone() {
            for id in ids {
                let short = Duration::from_secs(20);
                let stop = client.stop_pod_sandbox(cri::StopPodSandboxRequest {
                    pod_sandbox_id: id.clone(),
                });
                let _ = self
                    .rt
                    .block_on(async { tokio::time::timeout(short, stop).await });
                let remove =
                    client.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: id });
                let _ = self
                    .rt
                    .block_on(async { tokio::time::timeout(short, remove).await });
            }
        }
        self.runtime = None;
        if let Some(mut c) = self.containerd.take() {
            c.kill();
        }
        // Shims outlive containerd (they are re-parented): ours name our socket.
        let sock = self.containerd_socket().display().to_string();
        for pid in processes_with_arg(&sock) {
            kill_and_unlink_sockets(pid);
        }
        // containerd 1.6's shims always make `/run/containerd/s`, whatever the state dir: remove
        // it (and its parent) when nothing else left a socket there (`remove_dir` only takes
        // empty directories, so another containerd's sockets keep them).
        let _ = fs::remove_dir("/run/containerd/s");
        let _ = fs::remove_dir("/run/containerd");
        // Whatever still runs in the pods' cgroups (containers of a killed shim).
        let cgroups: Vec<PathBuf> = self
            .cgroups
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect();
        let v2 =
            crate::cgroup::cgroup2_root().unwrap_or_else(|_| Path::new(CGROUP_FS).join("unified"));
        for rel in &cgroups {
            let kill = v2.join(rel).join("cgroup.kill");
            if kill.exists() {
                let _ = fs::write(&kill, "1");
            }
        }
        // Mounts below the scratch directory (rootfs overlays, netns, shm), deepest first.
        let mut mounts: Vec<PathBuf> = mounts_below(self.dir())
            .into_iter()
            .map(|(p, _)| p)
            .collect();
        mounts.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for m in mounts {
            let _ = nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH);
        }
        // The pod cgroups in every hierarchy, then their parents when empty.
        for rel in &cgroups {
            remove_pod_cgroup(rel, Duration::from_secs(5));
        }
    }
}

impl Drop for CriNode {
    fn drop(&mut self) {
        self.teardown();
        if let Some(mut a) = self.agent.take() {
            a.kill();
        }
    }
}

/// The GET path of an object of a named API group (`apps/v1` DaemonSet, RBAC objects):
/// `/apis/<group>/<version>[/namespaces/<ns>]/<lowercase kind>s/<name>`.
pub fn group_object_path(object: &Value) -> Result<String> {
    let s = |p: &str| object.pointer(p).and_then(Value::as_str);
    match (
        s("/apiVersion"),
        s("/kind"),
        s("/metadata/namespace"),
        s("/metadata/name"),
    ) {
        (Some(version), Some(kind), ns, Some(name)) if version.contains('/') => {
            let plural = format!("{}s", kind.to_ascii_lowercase());
            Ok(match ns {
                Some(ns) => format!("/apis/{version}/namespaces/{ns}/{plural}/{name}"),
                None => format!("/apis/{version}/{plural}/{name}"),
            })
        }
        _ => Err(Error::Missing(format!(
            "not an object of a named API group: {object}"
        ))),
    }
}

/// A gRPC channel to the CRI server listening on the unix socket `sock`.
async fn connect_unix(sock: PathBuf) -> std::result::Result<Channel, String> {
    Endpoint::try_from("http://[::]")
        .map_err(|e| e.to_string())?
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let sock = sock.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(sock).await?))
            }
        }))
        .await
        .map_err(|e| e.to_string())
}

/// Removes, once per process, what nodes of test processes that died without cleaning up
/// (SIGKILLed, interrupted) left: their containerd and shims (found by the config or socket
/// path in their scratch directory), the processes left in their pod cgroups (the pod UID
/// starts with the owner's PID), those cgroups, and the mounts below their scratch
/// directories, so that the scratch directories themselves can go.
fn reap_stale_nodes() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let tmp = std::env::temp_dir();
        let stale_dir = |p: &Path| -> Option<PathBuf> {
            let rel = p.strip_prefix(&tmp).ok()?;
            let first = rel.components().next()?.as_os_str().to_str()?;
            names::is_stale(first).then(|| tmp.join(first))
        };
        let mut killed = false;
        if let Ok(entries) = fs::read_dir("/proc") {
            for pid in entries
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            {
                let Ok(cmdline) = fs::read(format!("/proc/{pid}/cmdline")) else {
                    continue;
                };
                let ours = cmdline.split(|b| *b == 0).any(|a| {
                    let a = Path::new(std::ffi::OsStr::from_bytes(a));
                    (a.ends_with("containerd.toml") || a.ends_with("run/containerd.sock"))
                        && stale_dir(a).is_some()
                });
                // A node root's holder names its scratch directory in its environment.
                let holder = fs::read(format!("/proc/{pid}/environ"))
                    .unwrap_or_default()
                    .split(|b| *b == 0)
                    .any(|kv| {
                        kv.strip_prefix(super::noderoot::HOLDER_ENV.as_bytes())
                            .and_then(|r| r.strip_prefix(b"="))
                            .is_some_and(|d| {
                                stale_dir(Path::new(std::ffi::OsStr::from_bytes(d))).is_some()
                            })
                    });
                if holder {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                    killed = true;
                }
                if ours {
                    kill_and_unlink_sockets(pid);
                    killed = true;
                }
            }
        }
        let qos_dir = crate::cgroup::cgroup2_root()
            .unwrap_or_else(|_| Path::new(CGROUP_FS).join("unified"))
            .join("kubepods")
            .join(QOS);
        let stale_pods: Vec<String> = fs::read_dir(&qos_dir)
            .map(|entries| {
                entries
                    .flatten()
                    .filter_map(|e| e.file_name().into_string().ok())
                    .filter(|n| {
                        n.strip_prefix("pod")
                            .and_then(|uid| uid.get(..8))
                            .and_then(|hex| u32::from_str_radix(hex, 16).ok())
                            .is_some_and(|pid| {
                                pid != std::process::id()
                                    && !Path::new(&format!("/proc/{pid}")).exists()
                            })
                    })
                    .collect()
            })
            .unwrap_or_default();
        for pod in &stale_pods {
            let _ = fs::write(qos_dir.join(pod).join("cgroup.kill"), "1");
        }
        if killed || !stale_pods.is_empty() {
            std::thread::sleep(Duration::from_millis(200));
        }
        for pod in &stale_pods {
            remove_pod_cgroup(
                &Path::new("kubepods").join(QOS).join(pod),
                Duration::from_secs(2),
            );
        }
        let mut mounts: Vec<PathBuf> = mounts_below(&tmp)
            .into_iter()
            .map(|(p, _)| p)
            .filter(|p| stale_dir(p).is_some())
            .collect();
        mounts.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for m in mounts {
            let _ = nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH);
        }
    });
}

/// Every cgroup hierarchy mounted below `/sys/fs/cgroup` (v1 controllers and the unified v2
/// one, or the v2 root alone on a pure v2 host).
fn hierarchies() -> Vec<PathBuf> {
    let root = Path::new(CGROUP_FS);
    if root.join("cgroup.controllers").exists() {
        return vec![root.to_path_buf()];
    }
    let mut out: Vec<PathBuf> = fs::read_dir(root)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// Removes a cgroup and its descendants (deepest first), retrying while processes leave.
/// Removes the cgroup `rel` (relative to each hierarchy) in every hierarchy, then each of its
/// parents that is left empty (`kubepods/besteffort`, `kubepods`: a busy one stays, as for
/// kubelet's), so neither a node's teardown nor the reaping of a dead test's node leaves them.
fn remove_pod_cgroup(rel: &Path, timeout: Duration) {
    for h in hierarchies() {
        remove_cgroup_tree(&h.join(rel), timeout);
        for parent in rel.ancestors().skip(1) {
            if parent.as_os_str().is_empty() {
                break;
            }
            let _ = fs::remove_dir(h.join(parent));
        }
    }
}

fn remove_cgroup_tree(path: &Path, timeout: Duration) {
    if !path.is_dir() {
        return;
    }
    if let Ok(entries) = fs::read_dir(path) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&e.path(), timeout);
            }
        }
    }
    let deadline = Instant::now() + timeout;
    while fs::remove_dir(path).is_err() && path.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    if path.exists() {
        eprintln!("linkerd-cni-tests: cannot remove cgroup {}", path.display());
    }
}

/// Mount points (and their filesystem types) at or below `dir`, from this process's
/// mountinfo.
fn mounts_below(dir: &Path) -> Vec<(PathBuf, String)> {
    let Ok(text) = fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    mounts_in(&text, dir)
}

/// Mount points (and their filesystem types) at or below `dir` in a mountinfo text.
fn mounts_in(text: &str, dir: &Path) -> Vec<(PathBuf, String)> {
    text.lines()
        .filter_map(|l| {
            let fields: Vec<&str> = l.split(' ').collect();
            let mount_point = PathBuf::from(hostfs::unescape_octal(fields.get(4)?));
            let sep = fields.iter().position(|f| *f == "-")?;
            let fstype = fields.get(sep + 1)?.to_string();
            mount_point
                .starts_with(dir)
                .then_some((mount_point, fstype))
        })
        .collect()
}

/// PIDs of processes with `arg` as one of their command-line arguments.
fn processes_with_arg(arg: &str) -> Vec<i32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|b| *b == 0).any(|a| a == arg.as_bytes()))
        })
        .collect()
}

/// SIGKILLs process `pid` (a containerd or a shim of ours), then removes the socket files it
/// was listening on below `/run/containerd/s` (a shim's, which containerd 1.6 always puts
/// there and which only a clean shim exit removes).
fn kill_and_unlink_sockets(pid: i32) {
    let inodes: BTreeSet<String> = fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| fs::read_link(e.path()).ok())
                .filter_map(|l| {
                    let l = l.to_str()?;
                    Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
                })
                .collect()
        })
        .unwrap_or_default();
    // `Num RefCount Protocol Flags Type St Inode Path`
    let sockets: Vec<PathBuf> = fs::read_to_string(format!("/proc/{pid}/net/unix"))
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let path = Path::new(f.get(7)?);
            (inodes.contains(*f.get(6)?) && path.starts_with("/run/containerd/s/"))
                .then(|| path.to_path_buf())
        })
        .collect();
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
    for s in sockets {
        let _ = fs::remove_file(s);
    }
}

/// The image architecture name of this machine.
pub(super) fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// sha256 of a file, as `sha256sum` prints it.
pub(super) fn sha256_file(path: &Path) -> Result<String> {
    let out = names::run(Command::new("sha256sum").arg(path))?;
    out.split_whitespace()
        .next()
        .map(str::to_string)
        .ok_or_else(|| Error::Parse {
            what: "sha256sum's output".into(),
            detail: out.clone(),
        })
}

/// Stores `path` as a blob of the OCI layout in `oci`; returns its digest and size.
fn add_blob(oci: &Path, path: &Path) -> Result<(String, u64)> {
    let hex = sha256_file(path)?;
    let size = fs::metadata(path)
        .ctx(|| format!("stat {}", path.display()))?
        .len();
    fs::copy(path, oci.join("blobs/sha256").join(&hex)).ctx(|| format!("storing blob {hex}"))?;
    Ok((format!("sha256:{hex}"), size))
}

/// Builds an OCI image archive in `work` holding [`BUSYBOX_IMAGE`] and [`PAUSE_IMAGE`]: one
/// layer (Debian's static busybox and a few applet links), two configs, two manifests, an
/// index naming them (`io.containerd.image.name`). Returns the archive's path.
pub fn build_image_archive(work: &Path) -> Result<PathBuf> {
    let busybox = Path::new("/bin/busybox");
    if !busybox.is_file() {
        return Err(Error::Missing(
            "/bin/busybox not found: install busybox-static (`cargo xtask setup`)".into(),
        ));
    }
    let layer = work.join("layer");
    let oci = work.join("oci");
    for d in [
        layer.join("bin"),
        layer.join("etc"),
        layer.join("tmp"),
        layer.join("proc"),
        layer.join("sys"),
        layer.join("dev"),
        oci.join("blobs/sha256"),
    ] {
        fs::create_dir_all(&d).ctx(|| format!("creating {}", d.display()))?;
    }
    fs::copy(busybox, layer.join("bin/busybox")).ctx(|| "copying busybox")?;
    for applet in ["sh", "sleep", "nc", "cat", "ls", "id"] {
        std::os::unix::fs::symlink("busybox", layer.join("bin").join(applet))
            .ctx(|| format!("linking {applet}"))?;
    }
    fs::set_permissions(layer.join("tmp"), fs::Permissions::from_mode(0o1777))
        .ctx(|| "chmod tmp")?;
    let layer_tar = work.join("layer.tar");
    names::run(
        Command::new("tar")
            .args(["--numeric-owner", "--owner=0", "--group=0", "-C"])
            .arg(&layer)
            .arg("-cf")
            .arg(&layer_tar)
            .arg("."),
    )?;
    let (layer_digest, layer_size) = add_blob(&oci, &layer_tar)?;
    let mut manifests = Vec::new();
    for (name, cmd) in [
        (BUSYBOX_IMAGE, vec!["/bin/sh"]),
        (PAUSE_IMAGE, vec!["/bin/sleep", "2147483647"]),
    ] {
        let config = json!({
            "architecture": oci_arch(),
            "os": "linux",
            "config": {"Env": ["PATH=/bin"], "Cmd": cmd},
            "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        });
        let config_path = work.join("config.json");
        fs::write(&config_path, config.to_string()).ctx(|| "writing an image config")?;
        let (config_digest, config_size) = add_blob(&oci, &config_path)?;
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": config_digest,
                "size": config_size,
            },
            "layers": [{
                "mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": layer_digest,
                "size": layer_size,
            }],
        });
        let manifest_path = work.join("manifest.json");
        fs::write(&manifest_path, manifest.to_string()).ctx(|| "writing a manifest")?;
        let (digest, size) = add_blob(&oci, &manifest_path)?;
        let tag = name.rsplit(':').next().unwrap_or("latest");
        manifests.push(json!({
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": digest,
            "size": size,
            "annotations": {
                "io.containerd.image.name": name,
                "org.opencontainers.image.ref.name": tag,
            },
        }));
    }
    fs::write(
        oci.join("index.json"),
        json!({"schemaVersion": 2, "manifests": manifests}).to_string(),
    )
    .ctx(|| "writing index.json")?;
    fs::write(oci.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#)
        .ctx(|| "writing oci-layout")?;
    let archive = work.join("images.tar");
    names::run(
        Command::new("tar")
            .arg("-C")
            .arg(&oci)
            .arg("-cf")
            .arg(&archive)
            .args(["oci-layout", "index.json", "blobs"]),
    )?;
    Ok(archive)
}
