//! `linkerd-cni-agent uninstall`'s node clean-up against the real kernel (root required), for a
//! pod on the shared attachment (a test cgroup stands for the cgroup ancestor): with the agent
//! gone (SIGKILL), a pass leaves the running pod its redirection (real traffic through its
//! proxy) and names it; once the pod's network namespace is gone, a pass detaches the shared
//! links, unpins everything and removes the registry: `bpftool cgroup show` lists no program on
//! the cgroup and `bpftool prog/map/link show` none of what was pinned. (The DaemonSet's path,
//! per-pod cgroups and the files of a node: `daemonset.rs`.)
//!
//! Run: `cargo test -p linkerd-cni-tests --test uninstall -- --test-threads=1`

use std::{
    net::SocketAddr,
    path::Path,
    time::{Duration, Instant},
};

use linkerd_cni_agent::service::uninstall::{self, Outcome};
use linkerd_cni_proto::config::LinkerdConfig;
use linkerd_cni_tests::{
    AgentHarness, EchoServer, PodAndPeer,
    client::{Options as ClientOptions, run_client},
    layout,
    names::TempDir,
    proxy,
};

const TIMEOUT: Duration = Duration::from_secs(20);
const APP_UID: u32 = 1000;

/// `bpftool cgroup show <cgroup>`: the programs attached to it, as bpftool prints them.
fn attached(cgroup: &Path) -> Vec<serde_json::Value> {
    let out = std::process::Command::new("bpftool")
        .args(["-j", "cgroup", "show"])
        .arg(cgroup)
        .output()
        .expect("run bpftool");
    assert!(out.status.success(), "bpftool cgroup show: {out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    match text.trim() {
        "" => Vec::new(),
        json => serde_json::from_str(json).expect("bpftool json"),
    }
}

#[test]
fn the_shared_attachment_stays_while_its_pod_runs_and_nothing_is_left_once_it_ended() {
    let net = PodAndPeer::new().expect("create pod, peer netns and veth");
    let server = EchoServer::bind_in(
        &net.peer,
        SocketAddr::new(net.peer_v4().into(), 8080),
        "server",
    )
    .expect("start a server in the peer");
    let cgroup = net.pod.cgroup.path().to_path_buf();
    // The pod's cgroup stands for the shared ancestor: the programs attach to it once.
    let mut h = AgentHarness::new(Some(&cgroup));
    let record = h.register(&net.pod, LinkerdConfig::default(), false);
    assert!(
        matches!(
            record.attachment,
            linkerd_cni_agent::agent::registry::Attachment::Shared { .. }
        ),
        "{record:?}"
    );
    let proxy = net
        .pod
        .start_proxy(&proxy::Options::new())
        .expect("start the forwarding proxy as UID 2102");
    let redirected = |when: &str| {
        let before = proxy::accepted(&proxy.events().expect("proxy log")).len();
        let r = run_client(
            &net.pod.container(APP_UID),
            &ClientOptions::new(server.addr()).send("hello\n"),
            TIMEOUT,
        )
        .expect("run the test client");
        assert_eq!(r.succeeded, 1, "{when}: {r:?}");
        let accepted = proxy::accepted(&proxy.events().expect("proxy log"));
        assert_eq!(accepted.len(), before + 1, "{when}: through the proxy");
        assert_eq!(accepted[before].1, server.addr(), "{when}");
    };
    redirected("registered");
    let config = h.config().clone();
    let ours = layout::pinned_objects(&config.pin_root).expect("the pinned objects");
    assert_eq!(
        layout::still_loaded(&ours).expect("bpftool").len(),
        ours.values().map(|ids| ids.len()).sum::<usize>(),
        "bpftool lists each pinned object now: {ours:?}"
    );
    assert!(
        !attached(&cgroup).is_empty(),
        "the shared links are on the cgroup"
    );

    // The agent is SIGKILLed (its fds closed, nothing cleaned up); the clean-up's passes.
    h.kill();
    let scratch = TempDir::new().expect("scratch directory");
    let opts = uninstall::Options {
        pin_root: config.pin_root.clone(),
        state_dir: config.state_dir.clone(),
        socket: scratch.path().join("agent.sock"),
        bpffs: config.pin_root.parent().expect("the bpffs").to_path_buf(),
        host_root: None,
        installer: None,
    };
    // Another tenant's directory in our pin root: it stays, and the pin root with it.
    let theirs = config.pin_root.join("theirs");
    std::fs::create_dir(&theirs).expect("a foreign directory in the pin root");
    assert_eq!(
        uninstall::pass(&opts).expect("a pass"),
        Outcome::PodsRunning(vec![record.id.clone()]),
        "the running pod is named and kept"
    );
    assert!(!attached(&cgroup).is_empty(), "the shared links stay");
    redirected("while the clean-up waits");

    // The pod ends: its processes gone, its network namespace with them.
    drop(proxy);
    let PodAndPeer { veth, peer, pod } = net;
    let linkerd_cni_tests::Pod {
        cgroup: cgroup_guard,
        netns,
    } = pod;
    drop((veth, peer, netns));
    let deadline = Instant::now() + TIMEOUT;
    let removal = loop {
        match uninstall::pass_report(&opts).expect("a pass") {
            (Outcome::Clean, removal) => break removal,
            other => assert!(
                Instant::now() < deadline,
                "the pod's netns is gone, yet: {other:?}"
            ),
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(attached(&cgroup), Vec::<serde_json::Value>::new());
    assert!(!config.state_dir.exists());
    let mut left: Vec<String> = std::fs::read_dir(&config.pin_root)
        .expect("the pin root stays")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(
        left,
        ["linkerd-cni-owned", "theirs"],
        "only the foreign entry and our marker"
    );
    let said = removal.left_lines().join("\n");
    assert!(
        said.contains(&format!(
            "{}: holds what linkerd-cni did not put there: theirs",
            config.pin_root.display()
        )),
        "{said}"
    );
    std::fs::remove_dir(&theirs).expect("remove the foreign directory");
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let left = layout::still_loaded(&ours).expect("bpftool");
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "still loaded: {left:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(cgroup_guard);
}
