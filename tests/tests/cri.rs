//! Pods run by a real container runtime (root required): Debian's containerd with its CRI
//! plugin and runc, driven over the CRI v1 API as kubelet drives it ([`CriNode`]). The conflist
//! is the one our installer patched in containerd's conf dir, the agent runs as the DaemonSet
//! runs it, and the fake API server serves each pod under the sandbox's name, namespace and
//! uid. containerd 1.6 sends no `runtimeConfig` (so no `cgroupPath`) and calls ADD before the
//! sandbox's cgroup exists: the agent finds the pod cgroup by UID when kubelet created it.
//!
//! Run: `cargo test -p linkerd-cni-tests --test cri -- --test-threads=1`

use std::{net::SocketAddr, time::Duration};

use linkerd_cni_tests::{
    EchoServer, Placement,
    client::{Options, Report, run_client},
    node::{ContainerSpec, CriNode, PodSpec, Sandbox, namespace_manifest},
    proxy::{self, Event, PROXY_UID},
};
use serde_json::Value;

const APP_UID: u32 = 1000;
/// The echo server on the node (the bridge's gateway).
const GATEWAY: [u8; 4] = [10, 244, 0, 1];
const SERVER_PORT: u16 = 8080;
/// The app containers' own server (busybox `nc` echoing with `cat`).
const APP_PORT: u16 = 8080;
const CLIENT_TIMEOUT: Duration = Duration::from_secs(15);

fn start_node() -> CriNode {
    CriNode::start(&[namespace_manifest("shop", &[])])
        .unwrap_or_else(|e| panic!("starting containerd's node: {e}"))
}

fn ok<T>(node: &CriNode, what: &str, r: linkerd_cni_tests::Result<T>) -> T {
    r.unwrap_or_else(|e| panic!("{what}: {e}\n{}", node.diagnostics()))
}

/// The app container: an echo server on [`APP_PORT`], as UID 1000.
fn start_app(node: &CriNode, sandbox: &Sandbox) -> String {
    let command = [
        "/bin/nc",
        "-ll",
        "-p",
        &APP_PORT.to_string(),
        "-e",
        "/bin/cat",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    ok(
        node,
        "starting the app container",
        node.start_container(
            sandbox,
            &ContainerSpec {
                name: "app".into(),
                run_as_user: i64::from(APP_UID),
                command,
            },
        ),
    )
}

/// The registry record of `sandbox`.
fn record(node: &CriNode, sandbox: &Sandbox) -> Value {
    let st = ok(node, "reading the agent's state", node.state());
    st.record(&sandbox.id).unwrap_or_else(|| {
        panic!(
            "no registry record for sandbox {}: {:?}\n{}",
            sandbox.id,
            st.registered(),
            node.diagnostics()
        )
    })
}

fn gateway() -> SocketAddr {
    SocketAddr::from((GATEWAY, SERVER_PORT))
}

/// The app connects out (`ExecSync` in the app container, as UID 1000) to the node's echo
/// server; returns the client's report.
fn connect_out(node: &CriNode, app: &str, payload: &str) -> Report {
    let report = ok(
        node,
        "the app's outbound connection",
        node.run_client(app, &Options::new(gateway()).send(payload)),
    );
    assert_eq!(
        report.uid, APP_UID,
        "the client ran as the container's user"
    );
    report
}

/// Meshed pod, outbound and inbound, and StopPodSandbox + RemovePodSandbox afterwards.
fn meshed_pod_is_redirected(kubelet_cgroup: bool) {
    let node = start_node();
    let server = ok(
        &node,
        "echo server on the node",
        EchoServer::bind_in(
            node.netns(),
            SocketAddr::from(([0, 0, 0, 0], SERVER_PORT)),
            "node",
        ),
    );
    let spec = PodSpec::meshed("shop", if kubelet_cgroup { "web" } else { "web-late" });
    if kubelet_cgroup {
        ok(&node, "pod cgroup", node.create_pod_cgroup(&spec));
    }
    let sandbox = ok(&node, "RunPodSandbox", node.run_pod(&spec));

    // (d) kubelet's pod cgroup exists at ADD: programs on it; otherwise (containerd 1.6 sends
    // no cgroupPath and runc creates the cgroup only after ADD) the shared attachment.
    let rec = record(&node, &sandbox);
    let attachment = &rec["attachment"];
    if kubelet_cgroup {
        assert_eq!(attachment["mode"], "per_pod", "record: {rec}");
        let want = CriNode::pod_cgroup(&spec);
        assert!(
            attachment["cgroup"]
                .as_str()
                .is_some_and(|c| c.ends_with(&want.display().to_string())),
            "attached to {} (want .../{}): {rec}",
            attachment["cgroup"],
            want.display()
        );
    } else {
        assert_eq!(attachment["mode"], "shared", "record: {rec}");
    }
    let cookie = rec["netns_cookie"]
        .as_u64()
        .unwrap_or_else(|| panic!("no netns cookie in {rec}"));

    ok(&node, "proxy container", node.start_proxy(&sandbox));
    let app = start_app(&node, &sandbox);
    let log = node.proxy_log(&sandbox);

    // Outbound: the app dials the node; the proxy (UID 2102) accepts it on 127.0.0.1:4140,
    // reads the dialled address with SO_ORIGINAL_DST and forwards it there.
    let report = connect_out(&node, &app, "hello\n");
    assert!(
        report.received_matches(&server.expected_reply(b"hello\n")),
        "outbound reply: {report:?}\n{}",
        node.diagnostics()
    );
    assert_eq!(
        report.peer,
        Some(gateway()),
        "the app sees its original destination as its peer"
    );
    let events = ok(
        &node,
        "proxy events",
        log.wait_for_accepted(1, CLIENT_TIMEOUT),
    );
    let accepted: Vec<(SocketAddr, SocketAddr, SocketAddr)> = events
        .iter()
        .filter_map(|e| match e {
            Event::Accepted {
                listener,
                peer,
                orig_dst,
                ..
            } => Some((*listener, *peer, *orig_dst)),
            _ => None,
        })
        .collect();
    assert!(
        accepted.iter().any(|(listener, peer, orig_dst)| {
            listener.port() == proxy::OUTBOUND_PORT
                && *orig_dst == gateway()
                && peer.ip().is_loopback()
        }),
        "the proxy accepted the app's connection on {} with SO_ORIGINAL_DST {}: {events:?}",
        proxy::OUTBOUND_PORT,
        gateway()
    );
    let received = ok(&node, "server", server.wait_for(1, CLIENT_TIMEOUT));
    assert_eq!(
        received[0].peer.ip(),
        std::net::IpAddr::V4(sandbox.ip),
        "the proxy's upstream (UID {PROXY_UID}, exempt) comes from the pod"
    );

    // Inbound: the node dials the pod's app port; the proxy's inbound listener takes it with
    // the dialled address as SO_ORIGINAL_DST and hands it to the app.
    let target = SocketAddr::from((sandbox.ip, APP_PORT));
    let inbound = ok(
        &node,
        "inbound client",
        run_client(
            &Placement::new().netns(node.netns()),
            &Options::new(target).send("inbound\n"),
            CLIENT_TIMEOUT,
        ),
    );
    assert!(
        inbound.connect.ok && inbound.received == "inbound\n",
        "the app echoed the inbound request: {inbound:?}\n{}",
        node.diagnostics()
    );
    let events = ok(
        &node,
        "proxy events",
        log.wait_for(CLIENT_TIMEOUT, |events| {
            events.iter().any(|e| {
                matches!(e, Event::Accepted { listener, orig_dst, .. }
                    if listener.port() == proxy::INBOUND_PORT && *orig_dst == target)
            })
        }),
    );
    assert!(!events.is_empty());

    // (c) StopPodSandbox (DEL with the netns, which containerd then removes) and
    // RemovePodSandbox (DEL again): nothing of the pod is left.
    ok(&node, "StopPodSandbox", node.stop_pod(&sandbox));
    ok(&node, "RemovePodSandbox", node.remove_pod(&sandbox));
    assert_nothing_left(&node, &sandbox, cookie);
}

/// No record, link, map entry, netns or address of `sandbox` left, and containerd forgot it.
fn assert_nothing_left(node: &CriNode, sandbox: &Sandbox, cookie: u64) {
    let st = ok(node, "reading the agent's state", node.state());
    assert!(
        !st.registered().contains(&sandbox.id),
        "still registered: {:?}",
        st.registered()
    );
    assert!(
        st.links_of(&sandbox.id).is_empty(),
        "links left: {:?}",
        st.links_of(&sandbox.id)
    );
    assert!(
        st.entries_for(cookie).is_empty(),
        "map entries left for cookie {cookie}: {:?}",
        st.entries_for(cookie)
    );
    let inspect = ok(node, "inspect", node.inspect());
    assert!(
        !inspect.contains(&sandbox.id),
        "inspect still lists the sandbox: {inspect}"
    );
    assert!(
        node.netns_mounts().is_empty(),
        "netns left: {:?}",
        node.netns_mounts()
    );
    assert!(
        !node.allocated_ips().contains(&sandbox.ip.to_string()),
        "address still allocated: {:?}",
        node.allocated_ips()
    );
    // StopPodSandbox's DEL (with the netns) and RemovePodSandbox's (netns empty): both
    // reached the plugin and both succeeded.
    let dels = node
        .containerd_log()
        .lines()
        .filter(|l| {
            l.contains(&format!("container={}", sandbox.id))
                && l.contains("unregistered (was registered:")
        })
        .count();
    assert_eq!(dels, 2, "two DELs for the sandbox\n{}", node.diagnostics());
    let listed = ok(node, "ListPodSandbox", node.list_pods());
    assert!(
        !listed.contains(&sandbox.id),
        "containerd still lists it: {listed:?}"
    );
}

#[test]
fn meshed_pod_with_kubelet_cgroup_is_redirected_per_pod_and_leaves_nothing() {
    meshed_pod_is_redirected(true);
}

#[test]
fn meshed_pod_without_pod_cgroup_at_add_uses_the_shared_attachment() {
    meshed_pod_is_redirected(false);
}

#[test]
fn unmeshed_pod_is_untouched() {
    let node = start_node();
    let server = ok(
        &node,
        "echo server on the node",
        EchoServer::bind_in(
            node.netns(),
            SocketAddr::from(([0, 0, 0, 0], SERVER_PORT)),
            "node",
        ),
    );
    let spec = PodSpec::unmeshed("shop", "plain");
    ok(&node, "pod cgroup", node.create_pod_cgroup(&spec));
    let sandbox = ok(&node, "RunPodSandbox", node.run_pod(&spec));
    let rec = record(&node, &sandbox);
    assert_eq!(rec["attachment"]["mode"], "none", "record: {rec}");
    let cookie = rec["netns_cookie"].as_u64().expect("cookie");
    let st = ok(&node, "state", node.state());
    assert!(
        st.entries_for(cookie).is_empty() && st.links_of(&sandbox.id).is_empty(),
        "an unmeshed pod gets no entries or links: {:?} {:?}",
        st.entries_for(cookie),
        st.links_of(&sandbox.id)
    );
    let app = start_app(&node, &sandbox);
    // Out: straight to the server (nothing listens on 4140 in this pod).
    let report = connect_out(&node, &app, "plain\n");
    assert!(
        report.received_matches(&server.expected_reply(b"plain\n")),
        "{report:?}"
    );
    let received = ok(&node, "server", server.wait_for(1, CLIENT_TIMEOUT));
    assert_eq!(received[0].peer.ip(), std::net::IpAddr::V4(sandbox.ip));
    // In: straight to the app.
    let inbound = ok(
        &node,
        "inbound client",
        run_client(
            &Placement::new().netns(node.netns()),
            &Options::new(SocketAddr::from((sandbox.ip, APP_PORT))).send("in\n"),
            CLIENT_TIMEOUT,
        ),
    );
    assert_eq!(inbound.received, "in\n", "{inbound:?}");
    ok(&node, "StopPodSandbox", node.stop_pod(&sandbox));
    ok(&node, "RemovePodSandbox", node.remove_pod(&sandbox));
    assert_nothing_left(&node, &sandbox, cookie);
}
