//! The node itself: its netns, pin root, scratch directory, conflist, the processes, and the
//! CNI operations on its pods.

use std::{
    fs,
    net::SocketAddr,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    time::Duration,
};

use serde_json::{Value, json};

use super::{
    AGENT_BIN, AgentCommand, AgentProcess, AgentState, ApiForward, ApiServerProcess, BPFFS, BRIDGE,
    CNI_TIMEOUT, CNI_VERSION, IFNAME, NETWORK_NAME, NODE_NAME, NodeOptions, PLUGIN_BIN, POD_SUBNET,
    PluginOutcome, PodSpec, SimPod, free_port, http_get, read_state, run_plugin, start_timeout,
    wait_until, workspace_bin,
};
use crate::{
    EchoServer,
    child::ChildGuard,
    cniruntime::{self, Invocation, Verb},
    error::{Error, IoContext, Result},
    names::{self, TempDir},
    netns::NetnsGuard,
    proxy::{self, PROXY_UID},
};

/// A pin root below bpffs (`l5dt-<pid>-<n>`), removed (with everything pinned in it) on drop.
#[derive(Debug)]
pub struct PinRoot {
    path: PathBuf,
}

impl PinRoot {
    /// A fresh pin root (not created: the agent makes it); first removes the pin roots of
    /// test processes that died without cleaning up.
    pub fn new() -> Self {
        // Pin roots of test processes that died without cleaning up.
        if let Ok(entries) = fs::read_dir(BPFFS) {
            for e in entries.flatten() {
                if e.file_name().to_str().is_some_and(names::is_stale) {
                    let _ = remove_pin_root(&e.path());
                }
            }
        }
        Self {
            path: Path::new(BPFFS).join(names::unique_name()),
        }
    }
}

impl PinRoot {
    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Default for PinRoot {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for PinRoot {
    fn drop(&mut self) {
        // Unpinning the links (no process holds them any more) detaches the programs.
        match remove_pin_root(&self.path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => eprintln!(
                "linkerd-cni-tests: cannot remove pin root {}: {e}",
                self.path.display()
            ),
        }
    }
}

/// Removes a pin root and everything pinned in it, one pod's links at a time as the agent
/// detaches them ([`linkerd_cni_agent::dataplane::detach`], which paces the program frees): each
/// pod's inbound link holds the pod's own `sk_lookup` stub, and unpinning thousands at once (a
/// node of 10,000 pods in the benchmark) queues thousands of JIT frees on the kernel's
/// workqueue, which deadlocked program loads on 6.18 when the next node loaded its programs.
pub fn remove_pin_root(path: &Path) -> std::io::Result<()> {
    if let Ok(pods) = fs::read_dir(path.join(linkerd_cni_common::paths::PIN_PODS)) {
        for pod in pods.flatten() {
            // Whatever detach leaves goes with the whole root below.
            let _ = linkerd_cni_agent::dataplane::detach(&pod.path());
        }
    }
    fs::remove_dir_all(path)
}

/// A bpffs mounted for one node (see [`NodeOptions::private_bpffs`]), unmounted on drop.
#[derive(Debug)]
struct BpffsMount {
    path: PathBuf,
}

impl BpffsMount {
    fn new(path: PathBuf) -> Result<Self> {
        fs::create_dir_all(&path).ctx(|| format!("creating {}", path.display()))?;
        nix::mount::mount(
            Some("bpf"),
            &path,
            Some("bpf"),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        )
        .map_err(|e| Error::io(format!("mounting bpffs at {}", path.display()), e.into()))?;
        Ok(Self { path })
    }
}

impl Drop for BpffsMount {
    fn drop(&mut self) {
        // The test may have unmounted it already (or mounted it again): unmount every layer.
        while nix::mount::umount2(&self.path, nix::mount::MntFlags::MNT_DETACH).is_ok() {}
    }
}

/// A simulated node. Fields drop in declaration order: processes first, then pins, the node
/// netns and the scratch directory.
#[derive(Debug)]
pub struct SimNode {
    agent: Option<AgentProcess>,
    apiserver: ApiServerProcess,
    /// Held for its `Drop`, which stops the forwarder.
    _api_forward: ApiForward,
    pins: PinRoot,
    bpffs: Option<BpffsMount>,
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
        let (pins, bpffs) = if opts.private_bpffs {
            let mount = BpffsMount::new(dir.path().join("bpffs"))?;
            let pins = PinRoot {
                path: mount.path.join("linkerd-cni"),
            };
            (pins, Some(mount))
        } else {
            (PinRoot::new(), None)
        };
        for object in objects {
            write_manifest(&dir.path().join("manifests"), object)?;
        }
        let apiserver = ApiServerProcess::start(
            &dir.path().join("manifests"),
            &dir.path().join("kubeconfig"),
            &dir.path().join("logs").join("apiserver.log"),
        )?;
        let api_forward = ApiForward::start(&netns, apiserver.addr())?;
        linkerd_cni_fake_apiserver::write_kubeconfig(
            &dir.path().join("plugin-kubeconfig"),
            &format!("http://{}", api_forward.addr()),
        )
        .ctx(|| "writing the plugin's kubeconfig")?;
        let mut node = Self {
            agent: None,
            apiserver,
            _api_forward: api_forward,
            pins,
            bpffs,
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
        let text = serde_json::to_string_pretty(&self.conflist_value(true))
            .map_err(|e| Error::Missing(format!("serialising the conflist: {e}")))?;
        fs::write(self.conflist(), text).ctx(|| "writing the conflist")
    }

    /// The node's conflist, with or without the `linkerd-cni` entry.
    fn conflist_value(&self, with_plugin: bool) -> Value {
        let d = self.dir.path();
        let mut conflist = json!({
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
        if !with_plugin && let Some(plugins) = conflist["plugins"].as_array_mut() {
            plugins.pop();
        }
        conflist
    }

    /// The `linkerd-cni` entry of the conflist: Linkerd's keys plus the agent socket.
    pub fn linkerd_entry(&self) -> Value {
        json!({
            "type": "linkerd-cni",
            "name": "linkerd-cni",
            "log_level": self.opts.plugin_log_level,
            "capabilities": {"cgroupPath": true},
            "kubernetes": {"kubeconfig": self.plugin_kubeconfig()},
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

    /// The plugin's kubeconfig: the same API server, through a forwarder on the node netns's
    /// loopback (libcni runs the plugin in the node netns; see [`ApiForward`]).
    pub fn plugin_kubeconfig(&self) -> PathBuf {
        self.dir.path().join("plugin-kubeconfig")
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

    /// The node's own bpffs mount point, with [`NodeOptions::private_bpffs`].
    pub fn bpffs(&self) -> Option<&Path> {
        self.bpffs.as_ref().map(|b| b.path.as_path())
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
        self.start_agent_bin(workspace_bin(AGENT_BIN)?)
    }

    /// [`Self::start_agent`], with the agent in a PID namespace (and mount namespace, with
    /// its own `/proc`) of its own, as in a pod without `hostPID`: it sees none of the node's
    /// processes. `unshare` stays the agent's parent (its PID is [`AgentProcess::pid`]); when
    /// it is killed, the agent gets SIGTERM (`--kill-child`). Mounts made on the host later
    /// (new netns pins) still reach the agent (`--propagation slave`).
    pub fn start_agent_in_own_pid_namespace(&mut self) -> Result<()> {
        let wrapper = self.dir.path().join("agent-own-pid-namespace");
        let script = format!(
            "#!/bin/sh\nexec unshare --pid --fork --mount-proc --propagation slave \
             --kill-child=SIGTERM '{}' \"$@\"\n",
            workspace_bin(AGENT_BIN)?.display()
        );
        fs::write(&wrapper, script).ctx(|| format!("writing {}", wrapper.display()))?;
        fs::set_permissions(&wrapper, fs::Permissions::from_mode(0o755))
            .ctx(|| format!("chmod {}", wrapper.display()))?;
        self.start_agent_bin(wrapper)
    }

    /// [`Self::start_agent`], with the agent holding exactly `caps` (their names without
    /// `CAP_`, as `setpriv --bounding-set` takes them: as root, its effective set then), as
    /// the DaemonSet's unprivileged container runs it.
    pub fn start_agent_with_capabilities(&mut self, caps: &[&str]) -> Result<()> {
        let wrapper = self.dir.path().join("agent-with-capabilities");
        let bounding = std::iter::once("-all".to_string())
            .chain(caps.iter().map(|c| format!("+{}", c.to_lowercase())))
            .collect::<Vec<_>>()
            .join(",");
        let script = format!(
            "#!/bin/sh\nexec setpriv --bounding-set {bounding} '{}' \"$@\"\n",
            workspace_bin(AGENT_BIN)?.display()
        );
        fs::write(&wrapper, script).ctx(|| format!("writing {}", wrapper.display()))?;
        fs::set_permissions(&wrapper, fs::Permissions::from_mode(0o755))
            .ctx(|| format!("chmod {}", wrapper.display()))?;
        self.start_agent_bin(wrapper)
    }

    /// [`Self::start_agent_with_capabilities`] with the DaemonSet's capabilities, under a
    /// seccomp filter standing in for the runtime's default profile for a container without
    /// `CAP_SYS_ADMIN`: `setns(2)` fails with `EPERM` (`linkerd-cni-test-seccomp`), as the
    /// agent's container runs it by default.
    pub fn start_agent_confined(&mut self, caps: &[&str]) -> Result<()> {
        let wrapper = self.dir.path().join("agent-confined");
        let bounding = std::iter::once("-all".to_string())
            .chain(caps.iter().map(|c| format!("+{}", c.to_lowercase())))
            .collect::<Vec<_>>()
            .join(",");
        let script = format!(
            "#!/bin/sh\nexec setpriv --bounding-set {bounding} '{}' '{}' \"$@\"\n",
            crate::bins::bin_path(crate::bins::SECCOMP)?.display(),
            workspace_bin(AGENT_BIN)?.display()
        );
        fs::write(&wrapper, script).ctx(|| format!("writing {}", wrapper.display()))?;
        fs::set_permissions(&wrapper, fs::Permissions::from_mode(0o755))
            .ctx(|| format!("chmod {}", wrapper.display()))?;
        self.start_agent_bin(wrapper)
    }

    fn start_agent_bin(&mut self, bin: PathBuf) -> Result<()> {
        if let Some(mut old) = self.agent.take() {
            old.kill();
        }
        let command = AgentCommand {
            bin,
            pin_root: self.pin_root().to_path_buf(),
            state_dir: self.state_dir(),
            socket: self.socket(),
            kubeconfig: self.kubeconfig(),
            node_name: NODE_NAME.into(),
            log_level: self.opts.agent_log_level.clone(),
            reap_interval: Some(self.opts.reap_interval),
            reconcile_interval: self.opts.reconcile_interval,
            bpffs: self.bpffs.as_ref().map(|b| b.path.clone()),
            health: SocketAddr::from(([127, 0, 0, 1], free_port()?)),
            shared_cgroup: None,
            log: self.dir.path().join("logs").join("agent.log"),
            extra_args: self
                .opts
                .bpffs_from_host
                .then(|| "--bpffs-from-host".to_string())
                .into_iter()
                .chain(
                    [
                        "--pod-cgroup-tree".into(),
                        self.opts.pod_cgroup_trees.join(","),
                    ]
                    .into_iter()
                    .filter(|_| !self.opts.pod_cgroup_trees.is_empty()),
                )
                .chain(self.opts.agent_args.iter().cloned())
                .collect(),
        };
        let mut agent = AgentProcess::spawn(&command)?;
        // /live answers once the registration socket is bound.
        agent.wait_ready(start_timeout(), Duration::from_millis(20), |a| {
            matches!(
                http_get(a.health_addr(), "/live", Duration::from_secs(1)),
                Ok((200, _))
            )
        })?;
        self.agent = Some(agent);
        Ok(())
    }

    /// The agent's own arguments from its next start on (`NodeOptions::agent_args`): an agent
    /// upgraded or reconfigured in place, e.g. another `--mode`.
    pub fn set_agent_args(&mut self, args: Vec<String>) {
        self.opts.agent_args = args;
    }

    /// SIGKILLs the agent (no clean-up of any kind, like a crash or an OOM kill).
    pub fn kill_agent(&mut self) {
        if let Some(mut a) = self.agent.take() {
            a.kill();
        }
    }

    /// A node reboot as the agent sees it: the agent SIGKILLed, bpffs empty (the pin root
    /// removed, which detaches every link), the agent's `/run` state (registry, socket) gone.
    /// The conflist, the plugin binary, the kubeconfig and the API server stay, as on a host
    /// whose installer had patched `/etc/cni/net.d` before the reboot.
    pub fn simulate_reboot(&mut self) -> Result<()> {
        self.kill_agent();
        for dir in [self.pin_root().to_path_buf(), self.state_dir()] {
            match fs::remove_dir_all(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io(format!("removing {}", dir.display()), e)),
            }
        }
        fs::create_dir(self.state_dir()).ctx(|| "recreating the empty state dir")?;
        match fs::remove_file(self.socket()) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io("removing the agent socket", e)),
        }
    }

    /// The addresses host-local holds for this node's network (one file per address).
    pub fn allocated_ips(&self) -> Vec<String> {
        host_local_ips(self.dir.path())
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

    /// Creates `spec`'s pod and runs its CNI ADD; a test's set-up: panics on failure, with
    /// the node's diagnostics, or when the result gives the pod no IPv4 address.
    pub fn added_pod(&self, spec: PodSpec) -> SimPod {
        let name = format!("{}/{}", spec.namespace, spec.name);
        let mut pod = self
            .new_pod(spec)
            .unwrap_or_else(|e| panic!("creating pod {name}: {e}"));
        if let Err(e) = self.add(&mut pod) {
            panic!("CNI ADD of {name}: {e}\n{}", self.diagnostics());
        }
        assert!(
            pod.ip().is_some(),
            "ADD result of {name} has an IPv4 address: {:?}",
            pod.result
        );
        pod
    }

    /// An unmeshed pod `namespace/name` ([`SimNode::added_pod`]) with an echo server on its
    /// address at `port`: the destination a test's meshed client connects to.
    pub fn echo_pod(&self, namespace: &str, name: &str, port: u16) -> (SimPod, EchoServer) {
        let pod = self.added_pod(PodSpec::unmeshed(namespace, name));
        let addr = SocketAddr::from((pod.ip().expect("checked by added_pod"), port));
        let netns = pod
            .netns()
            .unwrap_or_else(|e| panic!("netns of {namespace}/{name}: {e}"));
        let server = EchoServer::bind_in(netns, addr, name)
            .unwrap_or_else(|e| panic!("echo server on {addr} in {namespace}/{name}: {e}"));
        (pod, server)
    }

    /// CNI ADD through libcni; keeps the result (and so the pod IP) in `pod`.
    pub fn add(&self, pod: &mut SimPod) -> Result<()> {
        let inv = self.invocation(pod, Some(pod.netns_path()))?;
        self.add_with(pod, &inv)
    }

    /// [`Self::add`] with `cgroup_path` (relative to the cgroup2 root) sent as the runtime's
    /// `cgroupPath` instead of the pod's own cgroup: one that does not exist yet stands for a
    /// sandbox whose cgroup the runtime makes after ADD (containerd 1.6), and the agent puts
    /// the pod on the shared attachment.
    pub fn add_naming_cgroup(&self, pod: &mut SimPod, cgroup_path: &str) -> Result<()> {
        let mut inv = self.invocation(pod, Some(pod.netns_path()))?;
        inv.cgroup_path = Some(cgroup_path.into());
        self.add_with(pod, &inv)
    }

    fn add_with(&self, pod: &mut SimPod, inv: &Invocation) -> Result<()> {
        let out = cniruntime::run(Some(&self.netns), Verb::Add, inv, CNI_TIMEOUT)?.expect_ok()?;
        let result = out.result().ok_or_else(|| Error::Parse {
            what: "the ADD result".into(),
            detail: out.stdout.clone(),
        })?;
        pod.result = Some(result);
        Ok(())
    }

    /// CNI ADD through libcni with the node's chain as it was before linkerd-cni was installed
    /// (bridge + host-local only, same network and address pool): the pod gets its address
    /// and never reaches the agent, like a pod that started before the CNI was ready.
    pub fn add_before_plugin(&self, pod: &mut SimPod) -> Result<()> {
        let path = self.dir.path().join("05-pods-before-linkerd.conflist");
        let text = serde_json::to_string_pretty(&self.conflist_value(false))
            .map_err(|e| Error::Missing(format!("serialising the conflist: {e}")))?;
        fs::write(&path, text).ctx(|| format!("writing {}", path.display()))?;
        let mut inv = self.invocation(pod, Some(pod.netns_path()))?;
        inv.conflist = path;
        let out = cniruntime::run(Some(&self.netns), Verb::Add, &inv, CNI_TIMEOUT)?.expect_ok()?;
        let result = out.result().ok_or_else(|| Error::Parse {
            what: "the ADD result".into(),
            detail: out.stdout.clone(),
        })?;
        pod.result = Some(result);
        Ok(())
    }

    /// A pod that started through the chain without linkerd-cni (in a kubelet-style cgroup,
    /// [`Self::add_before_plugin`]), with an app process (`sleep`, as `app_uid`) running in its
    /// cgroup and netns, and its address in the API as kubelet reports it: what adoption and
    /// the repair look for.
    pub fn early_pod(&self, spec: PodSpec, app_uid: u32) -> Result<(SimPod, ChildGuard)> {
        self.apply(&[spec.manifest(NODE_NAME)])?;
        let mut pod = SimPod::new_kubelet_cgroup(spec)?;
        self.add_before_plugin(&mut pod)?;
        let ip = pod.ip().ok_or_else(|| Error::Parse {
            what: "the ADD result's IPv4 address".into(),
            detail: format!("{:?}", pod.result),
        })?;
        self.apply(&[pod
            .spec
            .manifest_running(NODE_NAME, &[std::net::IpAddr::V4(ip)])])?;
        let app = pod
            .container(app_uid)
            .spawn(std::process::Command::new("sleep").arg("300"))?;
        Ok((pod, app))
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
pub(super) fn api_path(object: &Value) -> Result<String> {
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
pub(super) fn write_manifest(dir: &Path, object: &Value) -> Result<()> {
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

/// The addresses host-local holds for the node network below `node_dir` (its data dir is
/// `<node_dir>/ipam`, one file per address), sorted.
pub(super) fn host_local_ips(node_dir: &Path) -> Vec<String> {
    let mut ips: Vec<String> = fs::read_dir(node_dir.join("ipam").join(NETWORK_NAME))
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.file_name().to_str().map(str::to_string))
                .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
                .collect()
        })
        .unwrap_or_default();
    ips.sort();
    ips
}
