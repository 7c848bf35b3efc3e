//! Pods that started before the CNI was ready (root required): on a simulated node (libcni,
//! the agent as a real process, the fake Kubernetes API), pods are started through the node's
//! chain as it was before linkerd-cni was installed (bridge + host-local only), so no CNI ADD
//! ever reaches the agent, with their cgroup where kubelet puts it
//! (`kubepods/besteffort/pod<uid>`). The agent then starts and:
//!
//! - attaches redirection to the meshed pod whose proxy (UID 2102) listens on 4140 and 4143:
//!   its outbound and inbound connections then reach the proxy with the right
//!   `SO_ORIGINAL_DST`, the adoption is counted in `/metrics` and shown by `inspect`;
//! - attaches redirection to a meshed pod in its init phase (Linkerd's network validator
//!   listening on 4140, no proxy yet), so the validator's check passes, and the proxy's
//!   inbound listener is registered when it starts;
//! - leaves alone an unmeshed pod (even with a listener on 4143 owned by 2102) and a meshed
//!   pod whose proxy does not listen (its traffic is never sent to a port nothing serves),
//!   and adopts the latter once its proxy listens;
//! - refuses, and counts, a meshed pod whose address two network namespaces hold;
//! - does all of it from a PID namespace of its own (no `hostPID`): the pod's netns is found
//!   by its address among the runtime's netns pins, and the proxy's listener is registered by
//!   the `iter/tcp` program run inside that netns, never through the pod's processes.
//!
//! Run: `cargo build --bins && cargo test -p linkerd-cni-tests --test adopt -- --test-threads=1`

use std::{
    net::{IpAddr, SocketAddr},
    os::unix::fs::MetadataExt,
    time::{Duration, Instant},
};

use linkerd_cni_tests::{
    ChildGuard, EchoServer, NetnsGuard,
    client::{Options, run_client},
    node::{self, NodeOptions, PodSpec, SimNode, SimPod, namespace_manifest, wait_until},
    proxy::{self, TestProxy},
};

const APP_UID: u32 = 1000;
/// The UID of Linkerd's `linkerd-network-validator`.
const VALIDATOR_UID: u32 = 65534;
/// Only turns an adopter whose passes stopped into a failure: far beyond any pass on a busy
/// machine (the agent's default `--adopt-interval` is 5 s). The bound that matters is counted
/// in the adopter's passes (see [`within_a_pass`]).
const HANG: Duration = Duration::from_secs(120);

/// A pod that started through the chain without linkerd-cni ([`SimNode::early_pod`]).
fn early_pod(node: &SimNode, spec: PodSpec) -> (SimPod, ChildGuard) {
    node.early_pod(spec, APP_UID)
        .unwrap_or_else(|e| panic!("a pod started before the plugin: {e}"))
}

fn accepted_on(proxy: &TestProxy, port: u16) -> Vec<SocketAddr> {
    proxy::accepted_on(&proxy.events().expect("proxy events"), port)
}

/// One request from `pod` as the app UID to `dst`; panics unless the reply comes back.
fn request(pod: &SimPod, dst: SocketAddr, server: &EchoServer) {
    request_as(APP_UID, pod, dst, server)
}

fn request_as(uid: u32, pod: &SimPod, dst: SocketAddr, server: &EchoServer) {
    let report = run_client(
        &pod.container(uid),
        &Options::new(dst).send("ping\n"),
        Duration::from_secs(5),
    )
    .unwrap_or_else(|e| panic!("client: {e}"));
    assert!(
        report.received_matches(&server.expected_reply(b"ping\n")),
        "{dst} answers: {report:?}"
    );
}

/// A pinned netns (no route anywhere) holding `ip` on its loopback device.
fn decoy_holding(ip: IpAddr) -> NetnsGuard {
    let decoy = NetnsGuard::new().expect("decoy netns");
    let status = std::process::Command::new("ip")
        .args([
            "-n",
            decoy.name(),
            "addr",
            "add",
            &format!("{ip}/32"),
            "dev",
            "lo",
        ])
        .status()
        .expect("ip addr add");
    assert!(status.success(), "adding {ip} to the decoy netns");
    decoy
}

fn registered(node: &SimNode, pod: &SimPod) -> bool {
    node.state()
        .expect("agent state")
        .registered()
        .contains(&format!("adopted-{}", pod.spec.uid))
}

/// Adoption passes the agent completed so far.
fn adoption_passes(node: &SimNode) -> u64 {
    node.agent()
        .expect("agent")
        .metric("linkerd_cni_agent_adoption_passes_total")
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Waits until `done` holds, and fails if it still does not once a whole adoption pass that
/// began after this call has completed (adoption passes are counted when they complete; see
/// [`node::within_a_pass`]).
fn within_a_pass(node: &SimNode, what: &str, done: impl FnMut() -> bool) {
    node::within_a_pass(
        what,
        adoption_passes(node),
        HANG,
        || adoption_passes(node),
        done,
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", node.diagnostics()));
}

fn wait_adopted(node: &SimNode, pod: &SimPod) {
    within_a_pass(node, "the pod adopted", || registered(node, pod));
}

#[test]
fn running_meshed_pod_is_adopted_without_restart() {
    let mut node = SimNode::start(NodeOptions::default(), &[namespace_manifest("shop", &[])])
        .unwrap_or_else(|e| panic!("starting the simulated node: {e}"));
    // An unmeshed server pod, through the plugin as usual.
    let (server_pod, server) = node.echo_pod("shop", "server", 8080);
    let dst = server.addr();

    // The agent is down while the other pods start without linkerd-cni in the chain.
    node.kill_agent();
    let (meshed, _meshed_app) = early_pod(&node, PodSpec::meshed("shop", "early"));
    let (plain, _plain_app) = early_pod(&node, PodSpec::unmeshed("shop", "plain"));
    let (waiting, _waiting_app) = early_pod(&node, PodSpec::meshed("shop", "no-proxy-yet"));
    // A meshed pod with its proxy listening, but its address is also held by another netns
    // pinned beside it: which netns is the pod's is ambiguous.
    let (mixed, _mixed_app) = early_pod(&node, PodSpec::meshed("shop", "mixed"));
    let _mixed_proxy = mixed.start_proxy().expect("proxy");
    let _decoy = decoy_holding(mixed.ip().expect("ip").into());
    // A meshed pod in its init phase: Linkerd's network validator listens on the outbound
    // port (as UID 65534), the proxy has not started.
    let (validating, _validating_app) = early_pod(&node, PodSpec::meshed("shop", "validating"));
    let validator_addr = SocketAddr::from(([0, 0, 0, 0], proxy::OUTBOUND_PORT));
    let validator = EchoServer::bind_in(
        validating.netns().expect("netns"),
        validator_addr,
        "validator",
    )
    .unwrap_or_else(|e| panic!("validator listener: {e}"));
    let meshed_ip = meshed.ip().expect("meshed pod ip");
    let inbound_dst = SocketAddr::from((meshed_ip, 8080));
    let meshed_app = EchoServer::bind_in(meshed.netns().expect("netns"), inbound_dst, "app")
        .unwrap_or_else(|e| panic!("app server: {e}"));
    let meshed_proxy = meshed.start_proxy().expect("proxy");
    // A listener on 4143 owned by 2102 in a pod the decision rule does not redirect.
    let plain_proxy = plain.start_proxy().expect("proxy-like listener");

    // Before the agent: the meshed pod's traffic goes past its proxy.
    request(&meshed, dst, &server);
    assert!(accepted_on(&meshed_proxy, proxy::OUTBOUND_PORT).is_empty());

    node.start_agent()
        .unwrap_or_else(|e| panic!("agent: {e}\n{}", node.diagnostics()));
    wait_adopted(&node, &meshed);

    // Outbound: the app's new connection reaches the proxy, which reads the original
    // destination.
    request(&meshed, dst, &server);
    assert_eq!(
        accepted_on(&meshed_proxy, proxy::OUTBOUND_PORT),
        vec![dst],
        "outbound through the proxy with SO_ORIGINAL_DST\n{}",
        node.diagnostics()
    );
    // Inbound: a connection from another pod to the app's port reaches the proxy's inbound
    // listener (registered by the agent, since the proxy listened before anything was
    // attached), which forwards it to the app.
    request(&server_pod, inbound_dst, &meshed_app);
    assert_eq!(
        accepted_on(&meshed_proxy, proxy::INBOUND_PORT),
        vec![inbound_dst],
        "inbound through the proxy with SO_ORIGINAL_DST\n{}",
        node.diagnostics()
    );
    wait_adopted(&node, &validating);
    let agent = node.agent().expect("agent");
    // The pass counts an adoption once the registration it made (what `wait_adopted` sees)
    // has returned to it: a moment later.
    let adoptions = || {
        agent
            .metric("linkerd_cni_agent_adoptions_total")
            .unwrap_or_else(|e| panic!("{e}"))
    };
    let _ = wait_until("both adoptions counted", Duration::from_secs(5), || {
        (adoptions() == 2).then_some(())
    });
    assert_eq!(
        adoptions(),
        2,
        "the running pod and the one in its init phase"
    );
    let inspect = node.inspect().expect("inspect");
    assert!(
        inspect.contains("pod shop/early") && inspect.contains("adopted:"),
        "inspect shows the adoption:\n{inspect}"
    );
    assert!(
        node.agent_log().contains("adopted a meshed pod"),
        "the adoption is logged"
    );

    // The validating pod is adopted: the validator's check (a connection to 1.1.1.1:20001 in
    // Linkerd; an unroutable address here) lands on its own listener.
    request_as(
        VALIDATOR_UID,
        &validating,
        SocketAddr::from(([192, 0, 2, 2], 20001)),
        &validator,
    );
    // Then the proxy starts: its inbound listener is registered when it listens.
    let validating_ip = validating.ip().expect("ip");
    let validating_dst = SocketAddr::from((validating_ip, 8080));
    let validating_app =
        EchoServer::bind_in(validating.netns().expect("netns"), validating_dst, "app2")
            .unwrap_or_else(|e| panic!("app server: {e}"));
    let mut inbound_only = proxy::Options::new();
    inbound_only.listen = vec![SocketAddr::from(([0, 0, 0, 0], proxy::INBOUND_PORT))];
    let validating_proxy =
        TestProxy::start(&validating.container(proxy::PROXY_UID), &inbound_only).expect("proxy");
    request(&server_pod, validating_dst, &validating_app);
    assert_eq!(
        accepted_on(&validating_proxy, proxy::INBOUND_PORT),
        vec![validating_dst],
        "inbound through the proxy that started after the adoption"
    );

    // Left alone: the unmeshed pod, and the meshed pod whose proxy does not listen, by a
    // whole pass of the adopter that began after all of the above.
    let before = adoption_passes(&node);
    within_a_pass(&node, "a whole adoption pass", || {
        adoption_passes(&node) >= before + 2
    });
    assert!(!registered(&node, &plain), "unmeshed pod adopted");
    assert!(
        !registered(&node, &waiting),
        "pod without a listening proxy adopted"
    );
    assert!(
        !registered(&node, &mixed),
        "pod whose address two netns hold adopted"
    );
    assert_eq!(
        node.agent()
            .expect("agent")
            .metric("linkerd_cni_agent_adoption_failures_total{reason=\"ambiguous_netns\"}")
            .unwrap_or_else(|e| panic!("{e}")),
        1,
        "the refusal is counted once"
    );
    request(&plain, dst, &server);
    assert!(
        accepted_on(&plain_proxy, proxy::OUTBOUND_PORT).is_empty(),
        "the unmeshed pod's traffic is not redirected"
    );
    // Not sent to a port nothing listens on: the connection still works, directly.
    request(&waiting, dst, &server);

    // Once its proxy listens, it is adopted too.
    let waiting_proxy = waiting.start_proxy().expect("proxy");
    let t = Instant::now();
    wait_adopted(&node, &waiting);
    request(&waiting, dst, &server);
    assert_eq!(
        accepted_on(&waiting_proxy, proxy::OUTBOUND_PORT),
        vec![dst],
        "redirected once its proxy listens (adopted after {:?})",
        t.elapsed()
    );
    assert!(!registered(&node, &plain), "still not the unmeshed pod");
}

/// The agent in a PID namespace of its own, as in a pod without `hostPID`: it cannot see, let
/// alone take a socket from, any process of the node. It adopts a running meshed pod all the
/// same: new outbound connections reach the proxy, which reads their original destination,
/// and inbound connections reach the listener the proxy opened before the agent ran.
#[test]
fn running_pod_is_adopted_by_an_agent_in_its_own_pid_namespace() {
    let mut node = SimNode::start(NodeOptions::default(), &[namespace_manifest("shop", &[])])
        .unwrap_or_else(|e| panic!("starting the simulated node: {e}"));
    let (server_pod, server) = node.echo_pod("shop", "server", 8080);
    let dst = server.addr();

    node.kill_agent();
    let (meshed, _meshed_app) = early_pod(&node, PodSpec::meshed("shop", "early"));
    let inbound_dst = SocketAddr::from((meshed.ip().expect("meshed pod ip"), 8080));
    let meshed_app = EchoServer::bind_in(meshed.netns().expect("netns"), inbound_dst, "app")
        .unwrap_or_else(|e| panic!("app server: {e}"));
    let proxy = meshed.start_proxy().expect("proxy");

    node.start_agent_in_own_pid_namespace()
        .unwrap_or_else(|e| panic!("agent: {e}\n{}", node.diagnostics()));
    // The agent (unshare's only child) is in another PID namespace than this test (the
    // host's): the pod's processes are invisible to it.
    let unshare = node.agent().expect("agent").pid();
    let children = std::fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children"))
        .expect("unshare's children");
    let agent_pid: u32 = children
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no agent under unshare: {children:?}"));
    let pid_ns = |pid: &str| {
        std::fs::metadata(format!("/proc/{pid}/ns/pid"))
            .expect("pid namespace")
            .ino()
    };
    assert_ne!(
        pid_ns(&agent_pid.to_string()),
        pid_ns("self"),
        "the agent runs in a PID namespace of its own"
    );

    wait_adopted(&node, &meshed);
    request(&meshed, dst, &server);
    assert_eq!(
        accepted_on(&proxy, proxy::OUTBOUND_PORT),
        vec![dst],
        "outbound through the proxy with SO_ORIGINAL_DST\n{}",
        node.diagnostics()
    );
    request(&server_pod, inbound_dst, &meshed_app);
    assert_eq!(
        accepted_on(&proxy, proxy::INBOUND_PORT),
        vec![inbound_dst],
        "inbound through the listener the proxy opened before the agent ran, with \
         SO_ORIGINAL_DST\n{}",
        node.diagnostics()
    );
    let log = node.agent_log();
    assert!(!log.contains("adoption of running pods is off"), "{log}");
    // What one adoption cost (its `wall_us`), for the record.
    if let Some(line) = log.lines().find(|l| l.contains("adopted a meshed pod")) {
        eprintln!("{line}");
    }
}
