//! The node agent as the DaemonSet runs it (root required): `linkerd-cni-agent run` with the
//! node installer on, against a fake Kubernetes API and a temporary host CNI layout. It becomes
//! ready only once the plugin is in every conflist, serves metrics, re-patches a conflist
//! another CNI rewrites, and on SIGTERM removes its entry, kubeconfig and binary (the uninstall
//! path: `kubectl delete` of the DaemonSet sends exactly that signal).
//!
//! Run: `cargo test -p linkerd-cni-tests --test agent_process -- --test-threads=1`

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use linkerd_cni_common::paths;
use linkerd_cni_tests::{ChildGuard, bins, fake_apiserver::FakeApiServer};
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

#[test]
fn run_with_installer_becomes_ready_and_cleans_up_on_sigterm() {
    let tag = format!("l5dt-agent-{}", std::process::id());
    let dirs = Dirs {
        root: std::env::temp_dir().join(&tag),
    };
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
    std::fs::write(&conflist, FLANNEL).expect("conflist");
    let pin_root = Path::new(paths::BPFFS).join(&tag);

    let api = FakeApiServer::start().expect("fake API server");
    let kubeconfig = dirs.root.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    let health: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let agent_bin = bins::bin_path("linkerd-cni-agent").expect("agent binary");
    let plugin_dir = agent_bin.parent().expect("bin dir").to_path_buf();
    let socket = dirs.root.join("agent.sock");
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
        .env("DEST_CNI_NET_DIR", &net_dir)
        .env("DEST_CNI_BIN_DIR", &bin_dir)
        .env("CONTAINER_MOUNT_PREFIX", "")
        .env("CONTAINER_CNI_BIN_DIR", &plugin_dir)
        .env("SERVICEACCOUNT_PATH", &sa_dir)
        .env("KUBERNETES_SERVICE_HOST", "10.96.0.1")
        .env("KUBERNETES_SERVICE_PORT", "443")
        .env("CNI_NETWORK_CONFIG", TEMPLATE)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut agent = ChildGuard::spawn(&mut cmd).expect("start the agent");

    wait_until("the agent to be ready", Duration::from_secs(30), || {
        matches!(get(health, "/ready"), Some((200, _)))
    });
    assert_eq!(get(health, "/live").map(|r| r.0), Some(200));
    assert_eq!(
        plugin_types(&conflist),
        vec!["flannel", "portmap", "linkerd-cni"],
        "appended last"
    );
    let installed = bin_dir.join("linkerd-cni");
    assert!(
        installed
            .metadata()
            .expect("plugin installed")
            .permissions()
            .mode()
            & 0o111
            != 0
    );
    let kc = net_dir.join("ZZZ-linkerd-cni-kubeconfig");
    assert_eq!(
        kc.metadata()
            .expect("kubeconfig written")
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
    assert!(socket.exists(), "registration socket");
    let (_, metrics) = get(health, "/metrics").expect("metrics");
    assert!(metrics.contains("linkerd_cni_agent_pods 0"), "{metrics}");

    // Another CNI rewrites its file without us: we are back within a second.
    std::fs::write(&conflist, FLANNEL).expect("rewrite");
    wait_until("the entry to be re-added", Duration::from_secs(1), || {
        plugin_types(&conflist).last().map(String::as_str) == Some("linkerd-cni")
    });

    // SIGTERM: the entry, kubeconfig and binary go; the original plugin list is back.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(agent.pid() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
    let status = agent
        .wait_timeout(Duration::from_secs(20))
        .expect("agent exits");
    assert!(status.success(), "agent exit status {status}");
    assert_eq!(plugin_types(&conflist), vec!["flannel", "portmap"]);
    assert!(
        !kc.exists() && !installed.exists() && !socket.exists(),
        "installer left files behind"
    );
    // The programs stay pinned (redirection outlives the agent); remove them for the test.
    assert!(
        pin_root
            .join(paths::PIN_PROGS)
            .join(linkerd_cni_common::names::PROG_CONNECT4)
            .exists()
    );
    std::fs::remove_dir_all(&pin_root).expect("remove pins");
}
