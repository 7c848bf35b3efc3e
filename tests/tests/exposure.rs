//! What the agent exposes on its node (issue 25 item 3; root required). The agent runs as the
//! DaemonSet runs it, in the node's network namespace (here a netns the test makes, standing for
//! the host's), with its listening addresses taken from the chart as `linkerd install-cni`
//! renders it (`LINKERD_CNI_AGENT_HEALTH_ADDR`, `LINKERD_CNI_AGENT_METRICS_ADDR`, the probes).
//! A pod's netns is linked to the node's by a veth, as a CNI links pods to their node.
//!
//! - By default a process in the pod (an ordinary UID) reaches the node's address (a control
//!   listener answers there) but not the agent: the health port and the metrics port are
//!   refused on the node's IPv4 and IPv6 addresses, and every socket the agent listens on is
//!   on loopback; kubelet's probes, as rendered (`host: 127.0.0.1`), pass from the node's
//!   netns, and `/metrics` answers there too.
//! - With `agent.metrics.enabled=true` (what the values file warns about) the pod reads
//!   `/metrics` on the node's address, and nothing else: `/ready` and `/live` are not served
//!   there, and the health port stays refused.
//! - A negative control: with the wildcard health address the chart rendered before, the pod
//!   reads `/ready` on the node's address.
//!
//! Run: `cargo build --bins && cargo test -p linkerd-cni-tests --test exposure -- --test-threads=1`

use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use linkerd_cni_tests::{
    ChildGuard, EchoServer, NetnsGuard, Placement,
    client::{Options, Report, run_client},
    fake_apiserver::FakeApiServer,
    link::VethPair,
    names::TempDir,
    node::{
        NODE_NAME, PinRoot,
        kubelet::http_status,
        render::{self, Renderer},
        workspace_bin,
    },
};

/// An ordinary UID for the pod's process.
const POD_UID: u32 = 1000;
/// The control listener on the node's addresses (a port nothing else uses there).
const CONTROL_PORT: u16 = 8080;
/// Hang guard for the agent's start; never a performance bound.
const START_GUARD: Duration = Duration::from_secs(60);
/// The client's connect/read timeout.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);
/// ECONNREFUSED: nothing listens at that address and port.
const ECONNREFUSED: i32 = 111;

/// The agent container's environment and probes as rendered by `linkerd install-cni -f values`.
struct Rendered {
    env: BTreeMap<String, String>,
    /// (path, host, port) of the liveness and readiness probes.
    probes: Vec<(String, String, u16)>,
}

fn render(values: &str, work: &Path) -> Rendered {
    let objects = render::render(Renderer::Cli, values, work)
        .unwrap_or_else(|e| panic!("rendering the chart: {e}"));
    let ds = render::find(&objects, "DaemonSet", "linkerd-cni")
        .unwrap_or_else(|e| panic!("{e}"))
        .clone();
    let agent = ds
        .pointer("/spec/template/spec/containers/0")
        .cloned()
        .expect("the agent container");
    let env = agent["env"]
        .as_array()
        .expect("env")
        .iter()
        .filter_map(|e| {
            Some((
                e["name"].as_str()?.to_string(),
                e["value"].as_str()?.to_string(),
            ))
        })
        .collect();
    let probes = ["livenessProbe", "readinessProbe"]
        .iter()
        .map(|p| {
            let get = &agent[*p]["httpGet"];
            (
                get["path"].as_str().expect("probe path").to_string(),
                get["host"].as_str().expect("probe host").to_string(),
                get["port"]
                    .as_u64()
                    .and_then(|p| u16::try_from(p).ok())
                    .expect("probe port (a number: no named port, no containerPort)"),
            )
        })
        .collect();
    assert_eq!(agent.get("ports"), None, "no containerPort");
    Rendered { env, probes }
}

/// The node: its netns, a pod linked to it, a fake API server on the node's loopback, and a
/// control listener on the node's addresses.
struct Scene {
    // Dropped in this order: the agent first (see `Agent`), then the listeners, the link,
    // the netns.
    control: EchoServer,
    api: FakeApiServer,
    veth: VethPair,
    pod: NetnsGuard,
    node: NetnsGuard,
    work: TempDir,
}

impl Scene {
    fn new() -> Self {
        let work = TempDir::new().expect("scratch directory");
        let node = NetnsGuard::new().expect("node netns");
        let pod = NetnsGuard::new().expect("pod netns");
        // Pod side 10.200.<n>.1 / fd00:200:0:<n>::1, node side .2 / ::2.
        let veth = VethPair::connect(&pod, &node).expect("veth between the pod and the node");
        let control = EchoServer::bind_in(
            &node,
            // Dual-stack: the node's IPv4 and IPv6 addresses.
            SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, CONTROL_PORT)),
            "control",
        )
        .expect("control listener on the node");
        // The API server on the node's loopback: the agent reaches it from the node's netns.
        let api = node
            .run_in(FakeApiServer::start)
            .expect("joining the node netns")
            .expect("fake API server");
        Scene {
            control,
            api,
            veth,
            pod,
            node,
            work,
        }
    }

    fn node_addrs(&self) -> [IpAddr; 2] {
        [
            IpAddr::V4(self.veth.b_v4().expect("node IPv4")),
            IpAddr::V6(self.veth.b_v6().expect("node IPv6")),
        ]
    }

    /// A process in the pod (UID 1000) connects to `addr` and sends `send`.
    fn pod_client(&self, addr: SocketAddr, send: &str) -> Report {
        let mut opts = Options::new(addr).send(send);
        opts.timeout_ms = CLIENT_TIMEOUT.as_millis() as u64;
        // As an HTTP client: no half-close after the request (the server would take it for
        // the end of the connection), the answer read until the server closes.
        opts.no_shutdown = true;
        run_client(
            &Placement::new().netns(&self.pod).uid(POD_UID),
            &opts,
            CLIENT_TIMEOUT * 3,
        )
        .unwrap_or_else(|e| panic!("client in the pod to {addr}: {e}"))
    }
}

/// The agent, started in the node's netns with the rendered listening addresses; SIGKILLed
/// and its pin root removed on drop.
struct Agent {
    child: ChildGuard,
    // After the process: removing the pins once it is gone.
    _pins: PinRoot,
    log: std::path::PathBuf,
}

impl Agent {
    fn start(scene: &Scene, rendered: &Rendered, name: &str) -> Self {
        let dir = scene.work.path().join(name);
        std::fs::create_dir_all(dir.join("state")).expect("state dir");
        let kubeconfig = dir.join("kubeconfig");
        scene.api.write_kubeconfig(&kubeconfig).expect("kubeconfig");
        let pins = PinRoot::new();
        let log = dir.join("agent.log");
        let mut cmd: Command = scene
            .node
            .command(workspace_bin("linkerd-cni-agent").expect("agent binary"))
            .expect("command in the node netns");
        cmd.arg("--pin-root")
            .arg(pins.path())
            .arg("--state-dir")
            .arg(dir.join("state"))
            .arg("run")
            .arg("--socket")
            .arg(dir.join("agent.sock"))
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["--node-name", NODE_NAME])
            // Exactly what the chart renders for the container.
            .env_remove("LINKERD_CNI_AGENT_METRICS_ADDR")
            .env_remove("LINKERD_CNI_AGENT_INSTALL")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("agent log"));
        for key in [
            "LINKERD_CNI_AGENT_HEALTH_ADDR",
            "LINKERD_CNI_AGENT_METRICS_ADDR",
        ] {
            if let Some(v) = rendered.env.get(key) {
                cmd.env(key, v);
            }
        }
        let child = ChildGuard::spawn(&mut cmd).expect("starting the agent");
        let agent = Agent {
            child,
            _pins: pins,
            log,
        };
        // Started: /live answers on the rendered probe's address, from the node's netns.
        let (path, host, port) = rendered
            .probes
            .iter()
            .find(|(p, _, _)| p == "/live")
            .cloned()
            .expect("liveness probe");
        let addr = SocketAddr::new(host.parse().expect("probe host is an IP"), port);
        let deadline = Instant::now() + START_GUARD;
        loop {
            let status = scene
                .node
                .run_in(|| kubelet_get(addr, &path))
                .expect("joining the node netns");
            if status == Ok(200) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the agent never answered {addr}{path}: {status:?}\n{}",
                agent.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        agent
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The TCP sockets the agent's process listens on: (address, port), from its fds and its
    /// netns's socket tables.
    fn listening(&self) -> Vec<SocketAddr> {
        let pid = self.child.pid();
        let mut inodes = std::collections::BTreeSet::new();
        for fd in std::fs::read_dir(format!("/proc/{pid}/fd"))
            .expect("fds")
            .flatten()
        {
            if let Ok(target) = std::fs::read_link(fd.path())
                && let Some(ino) = target
                    .to_str()
                    .and_then(|t| t.strip_prefix("socket:["))
                    .and_then(|t| t.strip_suffix(']'))
            {
                inodes.insert(ino.to_string());
            }
        }
        let mut out = Vec::new();
        for (table, v6) in [("tcp", false), ("tcp6", true)] {
            let text =
                std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
            for line in text.lines().skip(1) {
                let f: Vec<&str> = line.split_whitespace().collect();
                // local_address, st == 0A (LISTEN), inode.
                if f.len() > 9 && f[3] == "0A" && inodes.contains(f[9]) {
                    out.push(parse_proc_addr(f[1], v6));
                }
            }
        }
        out
    }
}

/// An address of `/proc/net/tcp{,6}` (`0100007F:2706`: the address in the kernel's byte
/// order, 32-bit words in host order).
fn parse_proc_addr(s: &str, v6: bool) -> SocketAddr {
    let (addr, port) = s.split_once(':').expect("addr:port");
    let port = u16::from_str_radix(port, 16).expect("port");
    let words: Vec<u32> = (0..addr.len() / 8)
        .map(|i| u32::from_str_radix(&addr[i * 8..i * 8 + 8], 16).expect("hex"))
        .collect();
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let ip = if v6 {
        let b: [u8; 16] = bytes.try_into().expect("16 bytes");
        IpAddr::from(b)
    } else {
        let b: [u8; 4] = bytes.try_into().expect("4 bytes");
        IpAddr::from(b)
    };
    SocketAddr::new(ip, port)
}

/// A GET as kubelet's HTTP prober makes it (`Host: <host>:<port>`, its User-Agent): the status.
fn kubelet_get(addr: SocketAddr, path: &str) -> Result<u16, String> {
    http_status(
        addr,
        path,
        &addr.to_string(),
        &[("User-Agent".into(), "kube-probe/1.32".into())],
        Duration::from_secs(2),
    )
}

fn http_request(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n")
}

/// The rendered value of `key` as a list of addresses.
fn addrs(rendered: &Rendered, key: &str) -> Vec<SocketAddr> {
    rendered
        .env
        .get(key)
        .map(|v| {
            v.split(',')
                .map(|a| a.parse().unwrap_or_else(|_| panic!("{key}: {a:?}")))
                .collect()
        })
        .unwrap_or_default()
}

fn assert_refused(report: &Report, what: &str) {
    assert!(
        !report.connect.ok && report.connect.errno == Some(ECONNREFUSED),
        "{what}: refused (nothing listens there for the pod): {report:?}"
    );
}

#[test]
fn pods_cannot_reach_the_agent_and_kubelet_probes_pass() {
    let scene = Scene::new();
    let defaults = render("{}\n", &scene.work.path().join("render-default"));
    let health = addrs(&defaults, "LINKERD_CNI_AGENT_HEALTH_ADDR");
    assert!(
        !health.is_empty() && health.iter().all(|a| a.ip().is_loopback()),
        "the chart renders loopback health addresses: {health:?}"
    );
    assert!(
        !defaults.env.contains_key("LINKERD_CNI_AGENT_METRICS_ADDR"),
        "no metrics address by default"
    );
    let health_port = health[0].port();
    // agent.metrics.port's default, served only when enabled.
    let metrics_port = {
        let on = render(
            "agent:\n  metrics:\n    enabled: true\n",
            &scene.work.path().join("render-probe-port"),
        );
        addrs(&on, "LINKERD_CNI_AGENT_METRICS_ADDR")[0].port()
    };

    let agent = Agent::start(&scene, &defaults, "default");

    // The pod reaches the node's addresses (the control listener answers)...
    for ip in scene.node_addrs() {
        let target = SocketAddr::new(ip, CONTROL_PORT);
        let report = scene.pod_client(target, "control\n");
        assert!(
            report.connect.ok
                && report.received_matches(&scene.control.expected_reply(b"control\n")),
            "the pod reaches the node at {target}: {report:?}"
        );
    }
    // ...but neither the health nor the metrics port there.
    for ip in scene.node_addrs() {
        for port in [health_port, metrics_port] {
            let target = SocketAddr::new(ip, port);
            let report = scene.pod_client(target, &http_request("/metrics"));
            assert_refused(&report, &format!("the pod to the node's {target}"));
        }
    }
    // Its own loopback is its own: the agent is not there either.
    let report = scene.pod_client(
        SocketAddr::from(([127, 0, 0, 1], health_port)),
        &http_request("/ready"),
    );
    assert_refused(&report, "the pod to its own 127.0.0.1");
    // Every socket the agent listens on is on loopback.
    let listening = agent.listening();
    assert!(
        !listening.is_empty() && listening.iter().all(|a| a.ip().is_loopback()),
        "the agent listens on loopback only: {listening:?}\n{}",
        agent.log()
    );

    // kubelet's probes as rendered, from the node's netns: both pass; /metrics is there too.
    for (path, host, port) in &defaults.probes {
        let addr = SocketAddr::new(host.parse().expect("IP"), *port);
        let status = scene
            .node
            .run_in(|| kubelet_get(addr, path))
            .expect("node netns");
        assert_eq!(status, Ok(200), "kubelet's GET http://{addr}{path}");
    }
    let status = scene
        .node
        .run_in(|| kubelet_get(health[0], "/metrics"))
        .expect("node netns");
    assert_eq!(status, Ok(200), "/metrics on the node's loopback");
    drop(agent);

    // agent.metrics.enabled: /metrics alone on the node's addresses, for Prometheus.
    let enabled = render(
        "agent:\n  metrics:\n    enabled: true\n",
        &scene.work.path().join("render-metrics"),
    );
    let metrics = addrs(&enabled, "LINKERD_CNI_AGENT_METRICS_ADDR");
    assert_eq!(
        metrics,
        [SocketAddr::from(([0, 0, 0, 0], metrics_port))],
        "metrics on every IPv4 address of the node when enabled"
    );
    let agent = Agent::start(&scene, &enabled, "metrics");
    let node_v4 = scene.node_addrs()[0];
    let target = SocketAddr::new(node_v4, metrics_port);
    let report = scene.pod_client(target, &http_request("/metrics"));
    assert!(
        report.connect.ok
            && report.received.starts_with("HTTP/1.1 200")
            && report.received.contains("linkerd_cni_agent_pods"),
        "with metrics enabled the pod reads /metrics at {target}: {report:?}\n{}",
        agent.log()
    );
    for path in ["/ready", "/live"] {
        let report = scene.pod_client(target, &http_request(path));
        assert!(
            report.connect.ok && report.received.starts_with("HTTP/1.1 404"),
            "{path} is not served on the metrics address: {report:?}"
        );
    }
    let report = scene.pod_client(
        SocketAddr::new(node_v4, health_port),
        &http_request("/ready"),
    );
    assert_refused(&report, "the health port with metrics enabled");
    let listening = agent.listening();
    assert_eq!(
        listening
            .iter()
            .filter(|a| !a.ip().is_loopback())
            .collect::<Vec<_>>(),
        [&SocketAddr::from(([0, 0, 0, 0], metrics_port))],
        "the metrics listener is the only one off loopback"
    );
    for (path, host, port) in &enabled.probes {
        let addr = SocketAddr::new(host.parse().expect("IP"), *port);
        let status = scene
            .node
            .run_in(|| kubelet_get(addr, path))
            .expect("node netns");
        assert_eq!(status, Ok(200), "kubelet's GET http://{addr}{path}");
    }
    drop(agent);

    // Negative control: the address the chart rendered before issue 25 (`0.0.0.0`) is what
    // the checks above would catch: the pod then reads the agent's health on the node's
    // address.
    let mut old = render("{}\n", &scene.work.path().join("render-old"));
    old.env.insert(
        "LINKERD_CNI_AGENT_HEALTH_ADDR".into(),
        format!("0.0.0.0:{health_port}"),
    );
    old.probes = old
        .probes
        .into_iter()
        .map(|(path, _, port)| (path, "127.0.0.1".to_string(), port))
        .collect();
    let agent = Agent::start(&scene, &old, "old-shape");
    let report = scene.pod_client(
        SocketAddr::new(node_v4, health_port),
        &http_request("/ready"),
    );
    assert!(
        report.connect.ok && report.received.starts_with("HTTP/1.1 200"),
        "with the old wildcard address the pod reaches /ready: {report:?}\n{}",
        agent.log()
    );
}
