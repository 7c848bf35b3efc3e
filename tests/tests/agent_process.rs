//! The node agent as the DaemonSet runs it (root required): `linkerd-cni-agent run` with the
//! node installer on, against a fake Kubernetes API and a temporary host CNI layout. It becomes
//! ready only once the plugin is in every conflist, serves metrics, re-patches a conflist
//! another CNI rewrites. SIGTERM reads the agent's DaemonSet: a rollout (it stands) keeps the
//! plugin in the conflists, so no pod starts unmeshed in between, as do SIGKILL, a crash, or an
//! API that cannot confirm a deletion; an uninstall (DaemonSet deleting or gone, the agent's
//! ServiceAccount or binding gone) removes it, as do `linkerd-cni-agent uninstall` and
//! `--cleanup-on-sigterm`. Its endpoints survive fd exhaustion and
//! idle connections, and the registration socket serves root peers only.
//!
//! Run: `cargo test -p linkerd-cni-tests --test agent_process -- --test-threads=1`

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    os::unix::fs::PermissionsExt,
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use linkerd_cni_agent::service::health::{IDLE_TIMEOUT, MAX_LIFETIME};
use linkerd_cni_common::paths;
use linkerd_cni_proto::wire;
use linkerd_cni_tests::{
    ChildGuard, Placement, bins,
    fake_apiserver::FakeApiServer,
    node::{STARTUP_TAINT, startup_tainted, tainted_node_manifest},
};
use serde_json::Value;

const FLANNEL: &str = r#"{
  "name": "cbr0",
  "cniVersion": "0.3.1",
  "plugins": [
    {"type": "flannel", "delegate": {"hairpinMode": true, "isDefaultGateway": true}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}"#;

const TEMPLATE: &str = r#"{"name":"linkerd-cni","type":"linkerd-cni","log_level":"info",
  "kubernetes":{"kubeconfig":"__KUBECONFIG_FILEPATH__"},
  "linkerd":{"incoming-proxy-port":4143,"outgoing-proxy-port":4140,"proxy-uid":2102}}"#;

/// Where the agent reads its own DaemonSet (`POD_NAMESPACE`, the default name).
const DAEMONSET_PATH: &str = "/apis/apps/v1/namespaces/linkerd-cni/daemonsets/linkerd-cni";

fn daemonset(deleting: bool) -> Value {
    let mut ds = serde_json::json!({
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "linkerd-cni", "namespace": "linkerd-cni", "uid": "ds-uid-1"},
        "spec": {
            "selector": {"matchLabels": {"k8s-app": "linkerd-cni"}},
            "template": {"metadata": {"labels": {"k8s-app": "linkerd-cni"}}}
        }
    });
    if deleting {
        ds["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z".into();
        ds["metadata"]["finalizers"] = serde_json::json!(["foregroundDeletion"]);
    }
    ds
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// GET `path` on the health endpoint: (status, body).
fn get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let status = out.split_whitespace().nth(1)?.parse().ok()?;
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((status, body))
}

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn plugin_types(conflist: &Path) -> Vec<String> {
    let v: Value =
        serde_json::from_slice(&std::fs::read(conflist).expect("read conflist")).expect("json");
    v["plugins"]
        .as_array()
        .expect("plugins")
        .iter()
        .map(|p| p["type"].as_str().unwrap_or("").to_string())
        .collect()
}

struct Dirs {
    root: PathBuf,
}

impl Drop for Dirs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// An agent run as the DaemonSet runs it, with its host layout. Dropping it kills the agent
/// (by PID), removes its pins and its directories.
struct Installed {
    agent: ChildGuard,
    health: SocketAddr,
    socket: PathBuf,
    conflist: PathBuf,
    net_dir: PathBuf,
    bin_dir: PathBuf,
    pin_root: PathBuf,
    env: Vec<(&'static str, PathBuf)>,
    agent_bin: PathBuf,
    api: FakeApiServer,
    _dirs: Dirs,
}

impl Drop for Installed {
    fn drop(&mut self) {
        self.agent.kill();
        let _ = std::fs::remove_dir_all(&self.pin_root);
    }
}

impl Installed {
    /// Starts `linkerd-cni-agent run --install` (plus `extra` arguments) and waits until ready.
    fn start(name: &str, extra: &[&str]) -> Self {
        let me = Self::spawn(name, extra, true);
        wait_until("the agent to be ready", Duration::from_secs(30), || {
            matches!(get(me.health, "/ready"), Some((200, _)))
        });
        me
    }

    /// Starts the agent without waiting; with `conflist` false the CNI directory holds no
    /// conflist yet (the primary CNI has not written one: the agent is not ready).
    fn spawn(name: &str, extra: &[&str], with_conflist: bool) -> Self {
        let tag = format!("l5dt-agent-{name}-{}", std::process::id());
        let dirs = Dirs {
            root: std::env::temp_dir().join(&tag),
        };
        let _ = std::fs::remove_dir_all(&dirs.root);
        let (net_dir, bin_dir, sa_dir, state) = (
            dirs.root.join("net.d"),
            dirs.root.join("bin"),
            dirs.root.join("sa"),
            dirs.root.join("state"),
        );
        for d in [&net_dir, &bin_dir, &sa_dir] {
            std::fs::create_dir_all(d).expect("mkdir");
        }
        std::fs::write(sa_dir.join("token"), "test-token").expect("token");
        std::fs::write(
            sa_dir.join("ca.crt"),
            "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
        )
        .expect("ca");
        let conflist = net_dir.join("10-flannel.conflist");
        if with_conflist {
            std::fs::write(&conflist, FLANNEL).expect("conflist");
        }
        let pin_root = Path::new(paths::BPFFS).join(&tag);

        let api = FakeApiServer::start().expect("fake API server");
        // The agent's DaemonSet stands (a rollout's SIGTERM); tests change it before SIGTERM.
        api.route(DAEMONSET_PATH, daemonset(false));
        let kubeconfig = dirs.root.join("kubeconfig");
        api.write_kubeconfig(&kubeconfig).expect("kubeconfig");
        let health: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
        let agent_bin = bins::bin_path("linkerd-cni-agent").expect("agent binary");
        let plugin_dir = agent_bin.parent().expect("bin dir").to_path_buf();
        let socket = dirs.root.join("run").join("agent.sock");
        let env: Vec<(&'static str, PathBuf)> = vec![
            ("DEST_CNI_NET_DIR", net_dir.clone()),
            ("DEST_CNI_BIN_DIR", bin_dir.clone()),
            ("CONTAINER_MOUNT_PREFIX", PathBuf::new()),
            ("CONTAINER_CNI_BIN_DIR", plugin_dir),
            ("SERVICEACCOUNT_PATH", sa_dir),
            ("KUBERNETES_SERVICE_HOST", "10.96.0.1".into()),
            ("KUBERNETES_SERVICE_PORT", "443".into()),
            ("CNI_NETWORK_CONFIG", TEMPLATE.into()),
        ];
        let mut cmd = Command::new(&agent_bin);
        cmd.arg("run")
            .args(["--pin-root".as_ref(), pin_root.as_os_str()])
            .args(["--state-dir".as_ref(), state.as_os_str()])
            .args(["--socket".as_ref(), socket.as_os_str()])
            .args(["--kubeconfig".as_ref(), kubeconfig.as_os_str()])
            .args([
                "--node-name",
                "node-1",
                "--health-addr",
                &health.to_string(),
                "--install",
            ])
            .args(extra)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .env_remove("LINKERD_CNI_AGENT_CLEANUP_ON_SIGTERM")
            .env_remove("LINKERD_CNI_AGENT_DAEMONSET")
            .env("POD_NAMESPACE", "linkerd-cni")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let agent = ChildGuard::spawn(&mut cmd).expect("start the agent");
        Self {
            agent,
            health,
            socket,
            conflist,
            net_dir,
            bin_dir,
            pin_root,
            env,
            agent_bin,
            api,
            _dirs: dirs,
        }
    }

    fn pid(&self) -> i32 {
        self.agent.pid() as i32
    }

    fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), sig).expect("kill");
    }

    fn kubeconfig_file(&self) -> PathBuf {
        self.net_dir.join("ZZZ-linkerd-cni-kubeconfig")
    }

    fn installed_binary(&self) -> PathBuf {
        self.bin_dir.join("linkerd-cni")
    }

    fn running(&mut self) -> bool {
        matches!(self.agent.try_wait(), Ok(None))
    }

    /// One request on the registration socket as root: the response frame's JSON.
    fn request(&self, frame: &[u8]) -> Value {
        self.try_request(frame)
            .unwrap_or_else(|| panic!("no response on {}", self.socket.display()))
    }

    fn try_request(&self, frame: &[u8]) -> Option<Value> {
        let mut s = UnixStream::connect(&self.socket).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        s.write_all(frame).ok()?;
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        serde_json::from_slice(out.get(4..)?).ok()
    }
}

fn frame(body: &[u8]) -> Vec<u8> {
    let mut out = (body.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(body);
    out
}

fn status_request() -> Vec<u8> {
    frame(
        serde_json::json!({"version": wire::PROTOCOL_VERSION, "request": {"op": "status"}})
            .to_string()
            .as_bytes(),
    )
}

/// (type, label names) of every metric, by name.
type MetricShapes =
    std::collections::BTreeMap<String, (String, std::collections::BTreeSet<String>)>;

/// What `/metrics` serves: each metric's `# TYPE` and the label names of its samples.
fn served_metrics(text: &str) -> MetricShapes {
    let mut out = MetricShapes::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("# TYPE name type");
            out.entry(name.to_string()).or_default().0 = kind.to_string();
        } else if !line.starts_with('#') && !line.is_empty() {
            let name = line.split(['{', ' ']).next().expect("sample name");
            let labels = line
                .split_once('{')
                .and_then(|(_, rest)| rest.split_once('}'))
                .map(|(labels, _)| labels)
                .unwrap_or("");
            let entry = out.entry(name.to_string()).or_default();
            for pair in labels.split(',').filter(|p| !p.is_empty()) {
                entry
                    .1
                    .insert(pair.split('=').next().expect("label").to_string());
            }
        }
    }
    out
}

/// What docs/operating/metrics.md lists: its table's rows `| `name` | type | labels | meaning |`.
fn documented_metrics() -> MetricShapes {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/operating/metrics.md");
    let doc = std::fs::read_to_string(&path).expect("docs/operating/metrics.md");
    doc.lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let labels = cells[3]
                .split(',')
                .map(|c| c.trim().trim_matches('`'))
                .filter(|c| !c.is_empty() && *c != "-")
                .map(str::to_string)
                .collect();
            (
                cells[1].trim_matches('`').to_string(),
                (cells[2].to_string(), labels),
            )
        })
        .collect()
}

/// docs/operating/metrics.md lists exactly the metrics the agent serves, with their types and labels
/// (issue 37).
fn assert_metrics_documented(text: &str) {
    let (served, documented) = (served_metrics(text), documented_metrics());
    assert_eq!(
        served.keys().collect::<Vec<_>>(),
        documented.keys().collect::<Vec<_>>(),
        "docs/operating/metrics.md and /metrics list different metrics\n{text}"
    );
    for (name, shape) in &served {
        assert_eq!(
            shape, &documented[name],
            "{name}: (type, labels) served vs documented in docs/operating/metrics.md"
        );
    }
}

#[test]
fn run_with_installer_becomes_ready_and_keeps_the_plugin_on_sigterm() {
    let mut node = Installed::start("term", &[]);
    let health = node.health;
    assert_eq!(get(health, "/live").map(|r| r.0), Some(200));
    assert_eq!(
        plugin_types(&node.conflist),
        vec!["flannel", "portmap", "linkerd-cni"],
        "appended last"
    );
    let installed = node.installed_binary();
    assert!(
        installed
            .metadata()
            .expect("plugin installed")
            .permissions()
            .mode()
            & 0o111
            != 0
    );
    let kc = node.kubeconfig_file();
    assert_eq!(
        kc.metadata()
            .expect("kubeconfig written")
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
    assert!(node.socket.exists(), "registration socket");
    let (_, metrics) = get(health, "/metrics").expect("metrics");
    assert!(metrics.contains("linkerd_cni_agent_pods 0"), "{metrics}");
    assert_metrics_documented(&metrics);

    // Another CNI rewrites its file without us: we are back (within a second on an idle
    // machine: the watcher flushes at most 300 ms after the first event; the bound here only
    // turns a watcher that never reacts into a failure).
    std::fs::write(&node.conflist, FLANNEL).expect("rewrite");
    wait_until("the entry to be re-added", Duration::from_secs(30), || {
        plugin_types(&node.conflist).last().map(String::as_str) == Some("linkerd-cni")
    });

    // SIGTERM (a rolling update): the plugin stays, so new pods wait for the next agent
    // instead of starting unmeshed.
    node.signal(nix::sys::signal::Signal::SIGTERM);
    let status = node
        .agent
        .wait_timeout(Duration::from_secs(20))
        .expect("agent exits");
    assert!(status.success(), "agent exit status {status}");
    assert_eq!(
        plugin_types(&node.conflist),
        vec!["flannel", "portmap", "linkerd-cni"],
        "SIGTERM keeps the plugin in the conflist"
    );
    assert!(
        kc.exists() && installed.exists(),
        "SIGTERM keeps the installation"
    );
    assert!(!node.socket.exists(), "the socket is removed");
    // The programs stay pinned (redirection outlives the agent).
    assert!(
        node.pin_root
            .join(paths::PIN_PROGS)
            .join(linkerd_cni_common::names::PROG_CONNECT4)
            .exists()
    );

    // Uninstall: the entry, kubeconfig and binary go; the original plugin list is back; with
    // no pod registered, the pins and the registry go too. (This node's own paths, the flags
    // `run` had: the defaults are the real node's; the bpffs is the default, as for `run`,
    // and the pin root is below it, as the uninstall requires.)
    let state = node._dirs.root.join("state");
    assert!(state.is_dir(), "the registry exists before the uninstall");
    let out = Command::new(&node.agent_bin)
        .arg("uninstall")
        .args(["--pin-root".as_ref(), node.pin_root.as_os_str()])
        .args(["--state-dir".as_ref(), state.as_os_str()])
        .args(["--socket".as_ref(), node.socket.as_os_str()])
        .envs(node.env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("linkerd-cni-agent uninstall");
    assert!(
        out.status.success(),
        "uninstall: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(plugin_types(&node.conflist), vec!["flannel", "portmap"]);
    assert!(
        !kc.exists() && !installed.exists(),
        "uninstall left files behind"
    );
    assert!(
        !node.pin_root.exists() && !state.exists(),
        "uninstall left the pins or the registry"
    );
}

#[test]
fn cleanup_on_sigterm_flag_removes_the_plugin() {
    // The DaemonSet stands (a rollout), yet the flag forces the removal.
    let mut node = Installed::start("cleanup", &["--cleanup-on-sigterm"]);
    node.signal(nix::sys::signal::Signal::SIGTERM);
    let status = node
        .agent
        .wait_timeout(Duration::from_secs(20))
        .expect("agent exits");
    assert!(status.success(), "agent exit status {status}");
    assert_eq!(plugin_types(&node.conflist), vec!["flannel", "portmap"]);
    assert!(!node.kubeconfig_file().exists() && !node.installed_binary().exists());
}

impl Installed {
    /// SIGTERM, wait for a clean exit; whether the installation stayed (conflist entry,
    /// kubeconfig and binary all there) or went (all gone, the original plugin list back).
    /// Panics on anything in between.
    fn sigterm_keeps_the_plugin(&mut self) -> bool {
        self.api.clear_requests();
        self.signal(nix::sys::signal::Signal::SIGTERM);
        let status = self
            .agent
            .wait_timeout(Duration::from_secs(20))
            .expect("agent exits");
        assert!(status.success(), "agent exit status {status}");
        let types = plugin_types(&self.conflist);
        let types: Vec<&str> = types.iter().map(String::as_str).collect();
        let files = (
            self.kubeconfig_file().exists(),
            self.installed_binary().exists(),
        );
        match (types.as_slice(), files) {
            (["flannel", "portmap", "linkerd-cni"], (true, true)) => true,
            (["flannel", "portmap"], (false, false)) => false,
            _ => panic!("half an uninstall: {types:?}, kubeconfig/binary present: {files:?}"),
        }
    }
}

/// Uninstall (`kubectl delete`, `helm uninstall`): the DaemonSet carries a deletionTimestamp
/// while its pods terminate (foreground deletion) -> the plugin goes.
#[test]
fn sigterm_removes_the_plugin_when_the_daemonset_is_being_deleted() {
    let mut node = Installed::start("ds-deleting", &[]);
    node.api.route(DAEMONSET_PATH, daemonset(true));
    assert!(!node.sigterm_keeps_the_plugin());
}

/// Uninstall with background deletion: the DaemonSet is already gone (404) -> the plugin goes.
#[test]
fn sigterm_removes_the_plugin_when_the_daemonset_is_gone() {
    let mut node = Installed::start("ds-gone", &[]);
    node.api.remove_route(DAEMONSET_PATH);
    assert!(!node.sigterm_keeps_the_plugin());
    let ask = node
        .api
        .requests()
        .into_iter()
        .filter(|r| r.path == DAEMONSET_PATH)
        .count();
    assert!(ask >= 1, "the agent read its DaemonSet");
}

/// `helm uninstall` / `kubectl delete -f` delete the ServiceAccount and the ClusterRoleBinding
/// right after the DaemonSet, before its pods get SIGTERM: 401 (the token's ServiceAccount is
/// gone), or 403 on every read (the binding is gone) -> the plugin goes.
#[test]
fn sigterm_removes_the_plugin_when_the_agent_identity_is_gone() {
    let mut node = Installed::start("sa-gone", &[]);
    node.api.fail_path(DAEMONSET_PATH, Some(401));
    assert!(!node.sigterm_keeps_the_plugin(), "401");
    drop(node);

    let mut node = Installed::start("crb-gone", &[]);
    node.api.fail_path(DAEMONSET_PATH, Some(403));
    node.api
        .fail_path("/api/v1/namespaces/linkerd-cni", Some(403));
    assert!(!node.sigterm_keeps_the_plugin(), "403 on everything");
}

/// When the API cannot confirm a deletion, the plugin stays (fail closed): a server error, a
/// ClusterRole that lacks `get` on DaemonSets while other reads work, an unreachable server.
#[test]
fn sigterm_keeps_the_plugin_when_the_api_cannot_say() {
    let mut node = Installed::start("api-500", &[]);
    node.api.fail_path(DAEMONSET_PATH, Some(500));
    assert!(node.sigterm_keeps_the_plugin(), "500");
    drop(node);

    let mut node = Installed::start("rbac-partial", &[]);
    node.api.fail_path(DAEMONSET_PATH, Some(403));
    assert!(node.sigterm_keeps_the_plugin(), "403 on DaemonSets only");
    drop(node);

    let mut node = Installed::start("api-down", &[]);
    node.api.fail_requests(Some(503));
    let started = Instant::now();
    assert!(node.sigterm_keeps_the_plugin(), "API answering 503");
    // The agent's question is bounded (2 s, retries of the 503 included); what this guards
    // against is an exit that waits for the API for ever (the helper gives up at 20 s), so
    // the margin is wide enough for any busy machine.
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "SIGTERM took {:?}",
        started.elapsed()
    );
}

#[test]
fn sigkill_leaves_the_conflists_patched() {
    let mut node = Installed::start("kill", &[]);
    node.agent.kill();
    assert_eq!(
        plugin_types(&node.conflist),
        vec!["flannel", "portmap", "linkerd-cni"],
        "a killed agent fails closed"
    );
}

/// 300 idle connections to the health port and 200 to the registration socket under a 256-fd
/// limit: the agent keeps running and serving (/ready, the registration socket), closes idle
/// connections, and the conflists stay patched.
#[test]
fn idle_connections_and_fd_exhaustion_do_not_stop_the_agent() {
    let mut node = Installed::start("fds", &[]);
    let out = Command::new("prlimit")
        .arg(format!("--pid={}", node.pid()))
        .arg("--nofile=256:256")
        .output()
        .expect("prlimit");
    assert!(
        out.status.success(),
        "prlimit: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let started = Instant::now();
    let mut idle: Vec<TcpStream> = (0..300)
        .filter_map(|_| TcpStream::connect_timeout(&node.health, Duration::from_secs(2)).ok())
        .collect();
    assert!(
        idle.len() >= 200,
        "the kernel queued the connections: {}",
        idle.len()
    );
    // The registration socket is reached too (held open, nothing sent).
    let held: Vec<UnixStream> = (0..200)
        .filter_map(|_| UnixStream::connect(&node.socket).ok())
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    assert!(node.running(), "the agent survives");
    // Probes get through while the idle connections are open: checked by looking at the
    // newest of them once a probe got through, not by assuming how fast this machine is.
    wait_until("/ready under load", Duration::from_secs(60), || {
        matches!(get(node.health, "/ready"), Some((200, _)))
    });
    let open = idle
        .iter()
        .rev()
        .take(20)
        .filter(|conn| {
            conn.set_nonblocking(true).expect("non-blocking");
            let open = matches!(
                (&**conn).read(&mut [0u8; 1]),
                Err(ref e) if e.kind() == std::io::ErrorKind::WouldBlock
            );
            conn.set_nonblocking(false).expect("blocking");
            open
        })
        .count();
    assert!(
        open > 0,
        "a probe got through only once every idle connection had been closed"
    );

    // The newest idle health connections (the oldest were closed to make room; too few
    // connections came after these to close them that way) are closed by the agent after its
    // idle timeout (EOF): before the lifetime cap, which would close them too, could have.
    // (A generous read timeout: it only turns an agent that never closes them into a failure.)
    for conn in idle.iter_mut().rev().take(20) {
        conn.set_read_timeout(Some(MAX_LIFETIME * 4))
            .expect("timeout");
        let mut buf = [0u8; 16];
        match conn.read(&mut buf) {
            Ok(0) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            other => panic!("an idle connection must be closed by the agent: {other:?}"),
        }
    }
    assert!(
        started.elapsed() < MAX_LIFETIME,
        "closed by the idle timeout ({IDLE_TIMEOUT:?}), not the lifetime cap \
         ({MAX_LIFETIME:?}): {:?}",
        started.elapsed()
    );
    drop(held);
    drop(idle);
    // The registration socket serves again once the held connections are gone.
    wait_until(
        "a registration request served",
        Duration::from_secs(25),
        || {
            node.try_request(&status_request())
                .is_some_and(|r| r["result"] == "status")
        },
    );
    assert!(node.running(), "the agent is still running");
    assert_eq!(
        plugin_types(&node.conflist),
        vec!["flannel", "portmap", "linkerd-cni"],
        "the conflist stays patched"
    );
    assert!(matches!(get(node.health, "/ready"), Some((200, _))));
}

/// A peer that is not root is refused even when the socket's mode would let it in.
#[test]
fn registration_socket_refuses_non_root_peers() {
    let node = Installed::start("peer", &[]);
    // As if the socket's directory and mode were loosened (a hostPath mounted elsewhere).
    std::fs::set_permissions(
        node.socket.parent().expect("dir"),
        std::fs::Permissions::from_mode(0o755),
    )
    .expect("chmod dir");
    std::fs::set_permissions(&node.socket, std::fs::Permissions::from_mode(0o666))
        .expect("chmod socket");
    let script = r#"
import socket, struct, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
body = sys.argv[2].encode()
try:
    s.sendall(struct.pack(">I", len(body)) + body)
except (BrokenPipeError, ConnectionResetError):
    pass  # refused before the request was read
data = b""
while True:
    try:
        chunk = s.recv(65536)
    except ConnectionResetError:
        break
    if not chunk:
        break
    data += chunk
print(data[4:].decode())
"#;
    let body = String::from_utf8(status_request()[4..].to_vec()).expect("utf8");
    let mut cmd = Placement::new()
        .uid(1000)
        .command("/usr/bin/python3")
        .expect("command");
    cmd.arg("-c")
        .arg(script)
        .arg(&node.socket)
        .arg(&body)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = ChildGuard::spawn(&mut cmd)
        .expect("spawn as uid 1000")
        .wait_output(Duration::from_secs(20))
        .expect("output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the client ran: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let response: Value = serde_json::from_str(stdout.trim()).expect("response JSON");
    assert_eq!(response["result"], "error", "refused: {response}");
    assert!(
        response["message"]
            .as_str()
            .is_some_and(|m| m.contains("only root")),
        "{response}"
    );
    // Root is still served.
    assert_eq!(node.request(&status_request())["result"], "status");
    let (_, metrics) = get(node.health, "/metrics").expect("metrics");
    assert!(
        metrics.contains("linkerd_cni_agent_refused_total 1"),
        "{metrics}"
    );
}

/// Oversized frames and a GC with an empty list are refused.
#[test]
fn oversized_requests_and_empty_gc_are_refused() {
    let node = Installed::start("limits", &[]);
    let header = ((wire::MAX_FRAME + 1) as u32).to_be_bytes();
    let response = node.request(&header);
    assert_eq!(response["result"], "error", "{response}");
    assert!(
        response["message"]
            .as_str()
            .is_some_and(|m| m.contains("exceeds")),
        "{response}"
    );
    let gc = serde_json::json!({
        "version": wire::PROTOCOL_VERSION,
        "request": {"op": "gc", "valid": []},
    });
    let response = node.request(&frame(gc.to_string().as_bytes()));
    assert_eq!(response["result"], "error", "{response}");
    assert!(
        response["message"]
            .as_str()
            .is_some_and(|m| m.contains("empty list")),
        "{response}"
    );
}

/// A node registered with another taint and the startup taint, for the taint tests.
fn tainted_node() -> Value {
    tainted_node_manifest("node-1", &["example.com/other", STARTUP_TAINT])
}

fn tainted(api: &FakeApiServer) -> bool {
    startup_tainted(api, "node-1")
}

/// Issue 44 item 1: the agent removes its node's startup taint once ready (here: once the
/// primary CNI's conflist exists and the plugin is in it), and not before; the node's other
/// taints stay.
#[test]
fn the_startup_taint_goes_once_the_agent_is_ready() {
    let node = Installed::spawn("taint", &["--remove-startup-taint", "true"], false);
    node.api.apply(&tainted_node()).expect("node");
    // Programs loaded and the socket serving, but no conflist to be in: not ready.
    wait_until("the agent to serve /live", Duration::from_secs(30), || {
        matches!(get(node.health, "/live"), Some((200, _)))
    });
    std::thread::sleep(Duration::from_secs(2));
    assert_ne!(get(node.health, "/ready").map(|r| r.0), Some(200));
    assert!(tainted(&node.api), "removed before the agent was ready");
    assert!(
        !node.api.requests().iter().any(|r| r.method == "PATCH"),
        "no node patch before ready"
    );
    // The primary CNI writes its conflist: the plugin joins it, the agent is ready, the taint
    // goes.
    std::fs::write(&node.conflist, FLANNEL).expect("conflist");
    wait_until("the agent to be ready", Duration::from_secs(30), || {
        matches!(get(node.health, "/ready"), Some((200, _)))
    });
    let start = Instant::now();
    while tainted(&node.api) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the taint stayed; the agent asked: {:?}",
            node.api.requests()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let n = node
        .api
        .get("Node", None, "node-1")
        .expect("get")
        .expect("node");
    assert_eq!(
        n["spec"]["taints"],
        serde_json::json!([{"key": "example.com/other", "effect": "NoSchedule"}])
    );
}

/// The negative control: without `--remove-startup-taint` the taint stays on a ready node.
#[test]
fn without_the_flag_the_startup_taint_stays() {
    let node = Installed::spawn("notaint", &[], true);
    node.api.apply(&tainted_node()).expect("node");
    wait_until("the agent to be ready", Duration::from_secs(30), || {
        matches!(get(node.health, "/ready"), Some((200, _)))
    });
    std::thread::sleep(Duration::from_secs(2));
    assert!(tainted(&node.api));
    assert!(!node.api.requests().iter().any(|r| r.method == "PATCH"));
}
