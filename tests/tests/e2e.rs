//! End to end (root required): a simulated node where libcni runs the chain bridge +
//! host-local + `linkerd-cni` for pods made of network namespaces and cgroups, the node agent
//! runs as a real process with its own pin root, registry and socket, and the fake Kubernetes
//! API server process serves the pods' manifests. Every assertion is on something observed:
//! what the forwarding proxy and the servers saw, the CNI error codes, the agent's registry,
//! pinned links and map entries.
//!
//! Run: `cargo build --bins && cargo test -p linkerd-cni-tests --test e2e -- --test-threads=1`

use std::{
    collections::BTreeSet,
    net::SocketAddr,
    path::Path,
    time::{Duration, Instant},
};

use linkerd_cni_tests::{
    EchoServer,
    client::{Options, Report, run_client},
    cniruntime::Verb,
    node::{AgentState, NodeOptions, PodSpec, SimNode, SimPod, namespace_manifest, wait_until},
    proxy::{Event, OUTBOUND_PORT, TestProxy},
};
use serde_json::Value;

/// An ordinary application UID (not the proxy's).
const APP_UID: u32 = 1000;
const SKIP_OUTBOUND: &str = "config.linkerd.io/skip-outbound-ports";
const CLIENT_TIMEOUT: Duration = Duration::from_secs(15);

fn start_node(opts: NodeOptions, objects: &[Value]) -> SimNode {
    SimNode::start(opts, objects).unwrap_or_else(|e| panic!("starting the simulated node: {e}"))
}

/// Creates `spec`'s pod and runs CNI ADD for it through libcni.
fn add_pod(node: &SimNode, spec: PodSpec) -> SimPod {
    let name = format!("{}/{}", spec.namespace, spec.name);
    let mut pod = node
        .new_pod(spec)
        .unwrap_or_else(|e| panic!("creating pod {name}: {e}"));
    if let Err(e) = node.add(&mut pod) {
        panic!("CNI ADD of {name}: {e}\n{}", node.diagnostics());
    }
    assert!(
        pod.ip().is_some(),
        "ADD result of {name} has an IPv4 address: {:?}",
        pod.result
    );
    pod
}

fn state(node: &SimNode) -> AgentState {
    node.state()
        .unwrap_or_else(|e| panic!("reading the agent's state: {e}"))
}

fn cookie(pod: &SimPod) -> u64 {
    pod.cookie()
        .unwrap_or_else(|e| panic!("netns cookie of {}: {e}", pod.spec.name))
}

fn cni_ok(node: &SimNode, verb: Verb, pod: &SimPod, netns: Option<&Path>) {
    let out = node
        .cni_netns(verb, pod, netns)
        .unwrap_or_else(|e| panic!("running CNI {verb:?} for {}: {e}", pod.spec.name));
    assert!(
        out.ok(),
        "CNI {verb:?} of {} (netns {netns:?}) must succeed: {}\nplugin logs:\n{}\n{}",
        pod.spec.name,
        out.stdout,
        out.stderr,
        node.diagnostics()
    );
}

/// DEL as containerd does it: on StopPodSandbox with the netns, then on RemovePodSandbox with
/// an empty `CNI_NETNS`.
fn del_twice(node: &SimNode, pod: &SimPod) {
    cni_ok(node, Verb::Del, pod, Some(pod.netns_path()));
    cni_ok(node, Verb::Del, pod, None);
}

/// Asserts the agent holds nothing at all about `pod` (which had netns cookie `cookie`).
fn assert_forgotten(node: &SimNode, pod: &SimPod, cookie: u64) {
    let st = state(node);
    assert!(
        !st.registered().contains(&pod.container_id),
        "{}: still registered: {:?}",
        pod.spec.name,
        st.registered()
    );
    assert!(
        st.links_of(&pod.container_id).is_empty(),
        "{}: links left: {:?}",
        pod.spec.name,
        st.links_of(&pod.container_id)
    );
    assert!(
        st.entries_for(cookie).is_empty(),
        "{}: map entries left for cookie {cookie}: {:?}",
        pod.spec.name,
        st.entries_for(cookie)
    );
}

/// The registry's attachment mode for `id` (`per_pod`, `shared`, `none`).
fn mode(st: &AgentState, id: &str) -> String {
    let rec = st
        .record(id)
        .unwrap_or_else(|| panic!("no registry record for {id}: {:?}", st.registered()));
    rec["attachment"]["mode"]
        .as_str()
        .unwrap_or_else(|| panic!("record without attachment mode: {rec}"))
        .to_string()
}

/// Connects from `pod` as an application UID and checks the echo server answered.
fn request(pod: &SimPod, server: &EchoServer, port_addr: SocketAddr, payload: &str) -> Report {
    let opts = Options::new(port_addr).send(payload);
    let report = run_client(&pod.container(APP_UID), &opts, CLIENT_TIMEOUT)
        .unwrap_or_else(|e| panic!("client in {} to {port_addr}: {e}", pod.spec.name));
    assert!(
        report.received_matches(&server.expected_reply(payload.as_bytes())),
        "{} -> {port_addr}: the server's answer must come back: {report:?}",
        pod.spec.name
    );
    report
}

fn accepted(proxy: &TestProxy) -> Vec<SocketAddr> {
    proxy
        .events()
        .unwrap_or_else(|e| panic!("proxy events: {e}"))
        .into_iter()
        .filter_map(|e| match e {
            Event::Accepted { orig_dst, .. } => Some(orig_dst),
            _ => None,
        })
        .collect()
}

/// The request went through `proxy`: it saw the original destination, and the server saw the
/// proxy's upstream connection.
fn assert_proxied(proxy: &TestProxy, server: &EchoServer, dst: SocketAddr, before: usize) {
    let events = proxy
        .log()
        .wait_for(Duration::from_secs(10), |ev| {
            ev.iter()
                .any(|e| matches!(e, Event::Closed { orig_dst, .. } if *orig_dst == dst))
        })
        .unwrap_or_else(|e| panic!("the proxy must forward a connection to {dst}: {e}"));
    let upstream = events
        .iter()
        .find_map(|e| match e {
            Event::Closed {
                orig_dst,
                upstream_local,
                listener,
                ..
            } if *orig_dst == dst => {
                assert_eq!(
                    listener.port(),
                    OUTBOUND_PORT,
                    "accepted on the outbound listener"
                );
                Some(*upstream_local)
            }
            _ => None,
        })
        .unwrap_or_else(|| panic!("no Closed event for {dst}: {events:?}"));
    let seen = server.received();
    assert!(
        seen[before..].iter().any(|r| r.peer == upstream),
        "the server must see the proxy's upstream connection {upstream}: {seen:?}"
    );
}

/// The request went straight to the server: its peer is the client socket itself.
fn assert_direct(report: &Report, server: &EchoServer, before: usize) {
    let local = report
        .local
        .unwrap_or_else(|| panic!("client report without local address: {report:?}"));
    let seen = server.received();
    assert!(
        seen[before..].iter().any(|r| r.peer == local),
        "the server must see the client socket {local} itself: {seen:?}"
    );
}

#[test]
fn meshed_pod_is_redirected_unmeshed_and_linkerd_init_pods_are_not() {
    let node = start_node(NodeOptions::default(), &[namespace_manifest("shop", &[])]);
    let server_pod = add_pod(&node, PodSpec::unmeshed("shop", "server"));
    let server_ip = server_pod.ip().expect("server ip");
    let dst = SocketAddr::from((server_ip, 8080));
    let server = EchoServer::bind_in(server_pod.netns().expect("server netns"), dst, "server")
        .unwrap_or_else(|e| panic!("echo server in the server pod: {e}"));

    let meshed = add_pod(&node, PodSpec::meshed("shop", "client"));
    let unmeshed = add_pod(&node, PodSpec::unmeshed("shop", "plain"));
    let with_init = add_pod(&node, PodSpec::with_linkerd_init("shop", "iptables"));

    let st = state(&node);
    assert_eq!(
        mode(&st, &meshed.container_id),
        "per_pod",
        "meshed pod attached per pod"
    );
    assert_eq!(
        st.record(&meshed.container_id).expect("record")["attachment"]["cgroup"]
            .as_str()
            .map(|c| c.ends_with(&meshed.cgroup_path().expect("cgroup path"))),
        Some(true),
        "attached to the pod cgroup libcni passed as runtimeConfig.cgroupPath"
    );
    assert!(
        !st.links_of(&meshed.container_id).is_empty(),
        "meshed pod has pinned links"
    );
    assert!(
        st.pod_config.contains_key(&cookie(&meshed)),
        "meshed pod has a pod_config entry: {st:?}"
    );
    for pod in [&unmeshed, &with_init, &server_pod] {
        assert_eq!(
            mode(&st, &pod.container_id),
            "none",
            "{} is recorded, not redirected",
            pod.spec.name
        );
        assert!(
            st.links_of(&pod.container_id).is_empty(),
            "{}: no links",
            pod.spec.name
        );
        assert!(
            st.entries_for(cookie(pod)).is_empty(),
            "{}: no map entries",
            pod.spec.name
        );
    }

    // Every client pod runs a forwarding proxy as UID 2102; only the meshed one may see traffic.
    let proxies: Vec<TestProxy> = [&meshed, &unmeshed, &with_init]
        .iter()
        .map(|p| {
            p.start_proxy()
                .unwrap_or_else(|e| panic!("proxy in {}: {e}", p.spec.name))
        })
        .collect();

    let before = server.received().len();
    request(&meshed, &server, dst, "from meshed\n");
    assert_proxied(&proxies[0], &server, dst, before);
    assert_eq!(
        accepted(&proxies[0]),
        vec![dst],
        "the proxy saw the original destination"
    );

    for (pod, proxy) in [(&unmeshed, &proxies[1]), (&with_init, &proxies[2])] {
        let before = server.received().len();
        let report = request(pod, &server, dst, "direct\n");
        assert_direct(&report, &server, before);
        assert!(
            accepted(proxy).is_empty(),
            "{}: its proxy must see nothing",
            pod.spec.name
        );
    }

    // CHECK passes for all of them (libcni hands the cached ADD result as prevResult).
    for pod in [&server_pod, &meshed, &unmeshed, &with_init] {
        cni_ok(&node, Verb::Check, pod, Some(pod.netns_path()));
    }
    drop(proxies);
    for pod in [&meshed, &unmeshed, &with_init, &server_pod] {
        let c = cookie(pod);
        del_twice(&node, pod);
        assert_forgotten(&node, pod, c);
    }
    let st = state(&node);
    assert!(st.is_empty(), "nothing left after every DEL: {st:?}");
}
