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

/// The request went through `proxy`: it accepted the connection on its outbound listener with
/// the original destination `dst`, and the server's new connection (after `before`) came from
/// the proxy's upstream socket.
fn assert_proxied(proxy: &TestProxy, server: &EchoServer, dst: SocketAddr, before: usize) {
    let fresh: Vec<SocketAddr> = server.received()[before..].iter().map(|r| r.peer).collect();
    proxy
        .log()
        .wait_for(Duration::from_secs(10), |ev| {
            ev.iter().any(|e| {
                matches!(e, Event::Closed { orig_dst, upstream_local, listener, .. }
                    if *orig_dst == dst
                        && listener.port() == OUTBOUND_PORT
                        && fresh.contains(upstream_local))
            })
        })
        .unwrap_or_else(|e| {
            panic!(
                "the proxy must have forwarded the server's new connection(s) {fresh:?} \
                 to {dst}: {e}"
            )
        });
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
    let (server_pod, server) = node.echo_pod("shop", "server", 8080);
    let dst = server.addr();

    let meshed = node.added_pod(PodSpec::meshed("shop", "client"));
    let unmeshed = node.added_pod(PodSpec::unmeshed("shop", "plain"));
    let with_init = node.added_pod(PodSpec::with_linkerd_init("shop", "iptables"));

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

    // Where operators look (issue 44): the meshed pod, attached to its own cgroup, has a
    // `LinkerdCNIRedirected` Event (written in the background, a moment after the ADD); the
    // pods linkerd-cni leaves alone have none of ours.
    let events = |name: &str| {
        node.apiserver()
            .event_reasons("shop", name)
            .unwrap_or_else(|e| panic!("listing Events: {e}"))
    };
    wait_until("the meshed pod's Event", Duration::from_secs(10), || {
        events("client")
            .iter()
            .any(|r| r == "LinkerdCNIRedirected")
            .then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}; Events on client: {:?}", events("client")));
    for pod in [&unmeshed, &with_init, &server_pod] {
        let ours: Vec<String> = events(&pod.spec.name)
            .into_iter()
            .filter(|r| r.starts_with("LinkerdCNI"))
            .collect();
        assert!(
            ours.is_empty(),
            "{}: no linkerd-cni Event: {ours:?}",
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

#[test]
fn skip_outbound_ports_annotations_on_pod_and_namespace_are_honoured() {
    let node = start_node(
        NodeOptions::default(),
        &[
            namespace_manifest("shop", &[]),
            namespace_manifest("batch", &[(SKIP_OUTBOUND, "9090")]),
        ],
    );
    let server_pod = node.added_pod(PodSpec::unmeshed("shop", "server"));
    let ip = server_pod.ip().expect("server ip");
    let netns = server_pod.netns().expect("server netns");
    let (a, b) = (SocketAddr::from((ip, 8080)), SocketAddr::from((ip, 9090)));
    let servers = [
        EchoServer::bind_in(netns, a, "server-8080").expect("echo 8080"),
        EchoServer::bind_in(netns, b, "server-9090").expect("echo 9090"),
    ];

    // (pod, destinations that must go direct, destinations that must go through the proxy)
    let cases = [
        (
            PodSpec::meshed("shop", "pod-annotated").annotate(SKIP_OUTBOUND, "8080"),
            vec![a],
            vec![b],
        ),
        (PodSpec::meshed("batch", "ns-annotated"), vec![b], vec![a]),
        (
            // The pod's own annotation replaces the namespace's.
            PodSpec::meshed("batch", "both").annotate(SKIP_OUTBOUND, "8080"),
            vec![a],
            vec![b],
        ),
        (PodSpec::meshed("shop", "none"), vec![], vec![a, b]),
    ];
    for (spec, direct, proxied) in cases {
        let name = spec.name.clone();
        let pod = node.added_pod(spec);
        let proxy = pod
            .start_proxy()
            .unwrap_or_else(|e| panic!("proxy in {name}: {e}"));
        for (i, dst) in [a, b].into_iter().enumerate() {
            let server = &servers[i];
            let before = server.received().len();
            let report = request(&pod, server, dst, "hi\n");
            if direct.contains(&dst) {
                assert_direct(&report, server, before);
            } else {
                assert_proxied(&proxy, server, dst, before);
            }
        }
        assert_eq!(
            accepted(&proxy),
            proxied,
            "{name}: the proxy saw exactly the non-skipped destinations"
        );
        let st = state(&node);
        let ignored =
            st.record(&pod.container_id).expect("record")["config"]["outbound-ports-to-ignore"]
                .clone();
        let want: Vec<String> = direct.iter().map(|d| d.port().to_string()).collect();
        assert_eq!(
            ignored,
            serde_json::json!(want),
            "{name}: registered ignore list"
        );
        drop(proxy);
        let c = cookie(&pod);
        del_twice(&node, &pod);
        assert_forgotten(&node, &pod, c);
    }
}

#[test]
fn del_twice_as_containerd_does_leaves_nothing() {
    let node = start_node(NodeOptions::default(), &[namespace_manifest("shop", &[])]);
    let pod = node.added_pod(PodSpec::meshed("shop", "web"));
    let c = cookie(&pod);
    let ip = pod.ip().expect("pod ip");
    let st = state(&node);
    assert!(st.registered().contains(&pod.container_id), "{st:?}");
    assert!(
        !st.entries_for(c).is_empty(),
        "map entries while registered"
    );
    let reserved = node
        .dir()
        .join("ipam")
        .join(linkerd_cni_tests::node::NETWORK_NAME)
        .join(ip.to_string());
    assert!(reserved.exists(), "host-local reserved {ip}");

    cni_ok(&node, Verb::Del, &pod, Some(pod.netns_path()));
    assert_forgotten(&node, &pod, c);
    assert!(!reserved.exists(), "host-local released {ip}");
    // containerd's RemovePodSandbox: DEL again, with an empty CNI_NETNS, no cached result.
    cni_ok(&node, Verb::Del, &pod, None);
    assert_forgotten(&node, &pod, c);
    let st = state(&node);
    assert!(st.is_empty(), "nothing left: {st:?}");
    let pods_dir = node.pin_root().join("pods");
    let left: Vec<_> = std::fs::read_dir(&pods_dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", pods_dir.display()))
        .collect();
    assert!(left.is_empty(), "no pinned link directory left: {left:?}");
}

/// Runs CHECK through libcni and returns the error it must report.
fn check_fails(node: &SimNode, pod: &SimPod) -> linkerd_cni_tests::cniruntime::CniError {
    let out = node
        .cni(Verb::Check, pod)
        .unwrap_or_else(|e| panic!("running CHECK: {e}"));
    out.error()
        .unwrap_or_else(|| panic!("CHECK must fail: {} / {}", out.stdout, out.stderr))
}

#[test]
fn check_detects_redirection_removed_behind_the_agents_back() {
    // The agent's own periodic repair (see tests/heal.rs) must not get there before CHECK.
    let opts = NodeOptions {
        reconcile_interval: Some(Duration::from_secs(3600)),
        ..NodeOptions::default()
    };
    let node = start_node(opts, &[namespace_manifest("shop", &[])]);

    // 1. A link detached with bpftool.
    let pod = node.added_pod(PodSpec::meshed("shop", "detached"));
    cni_ok(&node, Verb::Check, &pod, Some(pod.netns_path()));
    let link = node
        .pin_root()
        .join("pods")
        .join(&pod.container_id)
        .join("l5d_connect4");
    let out = std::process::Command::new("bpftool")
        .args(["link", "detach", "pinned"])
        .arg(&link)
        .output()
        .unwrap_or_else(|e| panic!("running bpftool: {e}"));
    assert!(
        out.status.success(),
        "bpftool link detach {}: {}",
        link.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let err = check_fails(&node, &pod);
    assert_eq!(
        err.code, 100,
        "plugin-specific code for 'not in force': {err:?}"
    );
    assert!(
        err.msg.contains("not in force")
            && err.msg.contains("l5d_connect4")
            && err.msg.contains("detached"),
        "the message says what is missing: {err:?}"
    );
    assert!(
        err.context.contains("linkerd-cni"),
        "libcni names the failing plugin: {err:?}"
    );
    let c = cookie(&pod);
    del_twice(&node, &pod);
    assert_forgotten(&node, &pod, c);

    // 2. The pod's config entry deleted from the map.
    let pod = node.added_pod(PodSpec::meshed("shop", "unconfigured"));
    cni_ok(&node, Verb::Check, &pod, Some(pod.netns_path()));
    let c = cookie(&pod);
    {
        let mut maps =
            linkerd_cni_agent::dataplane::maps::Maps::open(&node.pin_root().join("maps"))
                .unwrap_or_else(|e| panic!("opening the pinned maps: {e}"));
        maps.pod_config
            .remove(&c)
            .unwrap_or_else(|e| panic!("deleting the pod_config entry of {c}: {e}"));
    }
    let err = check_fails(&node, &pod);
    assert_eq!(err.code, 100, "{err:?}");
    assert!(
        err.msg.contains("not in force") && err.msg.contains("pod config entry is missing"),
        "the message says what is missing: {err:?}"
    );
    del_twice(&node, &pod);
    assert_forgotten(&node, &pod, c);
    let st = state(&node);
    assert!(st.is_empty(), "nothing left: {st:?}");
}

/// A `prevResult` as the bridge plugin would pass it (for direct plugin invocations).
fn fake_prev_result(pod: &SimPod, i: usize) -> Value {
    serde_json::json!({
        "cniVersion": linkerd_cni_tests::node::CNI_VERSION,
        "interfaces": [{"name": "eth0", "sandbox": pod.netns_path()}],
        "ips": [{"address": format!("10.99.{}.{}/16", i / 200, i % 200 + 2), "interface": 0}],
        "dns": {}
    })
}

#[test]
fn fifty_concurrent_adds_then_fifty_concurrent_dels() {
    const N: usize = 50;
    let node = start_node(NodeOptions::default(), &[namespace_manifest("load", &[])]);
    let specs: Vec<PodSpec> = (0..N)
        .map(|i| PodSpec::meshed("load", &format!("pod-{i}")))
        .collect();
    let manifests: Vec<Value> = specs
        .iter()
        .map(|s| s.manifest(linkerd_cni_tests::node::NODE_NAME))
        .collect();
    node.apply(&manifests)
        .unwrap_or_else(|e| panic!("serving the pods: {e}"));
    let pods: Vec<SimPod> = specs
        .into_iter()
        .map(|s| SimPod::new(s).unwrap_or_else(|e| panic!("pod sandbox: {e}")))
        .collect();
    let cookies: BTreeSet<u64> = pods.iter().map(cookie).collect();
    assert_eq!(cookies.len(), N, "every pod has its own netns");

    let run_all = |command: &str| {
        let started = Instant::now();
        let outcomes: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = pods
                .iter()
                .enumerate()
                .map(|(i, pod)| {
                    let node = &node;
                    s.spawn(move || {
                        let env = node.plugin_env(command, pod);
                        let prev = fake_prev_result(pod, i);
                        let stdin = node
                            .plugin_stdin(pod, Some(prev.clone()))
                            .unwrap_or_else(|e| panic!("stdin: {e}"));
                        let out = node
                            .run_plugin(&env, stdin.to_string().as_bytes())
                            .unwrap_or_else(|e| panic!("{command} of pod-{i}: {e}"));
                        (i, prev, out)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| panic!("{command} thread panicked"))
                })
                .collect()
        });
        (outcomes, started.elapsed())
    };

    let (adds, took) = run_all("ADD");
    for (i, prev, out) in &adds {
        assert!(
            out.status.success(),
            "ADD of pod-{i}: {} {}\n{}",
            out.stdout,
            out.stderr,
            node.diagnostics()
        );
        assert_eq!(
            out.json().as_ref(),
            Some(prev),
            "ADD of pod-{i} prints prevResult"
        );
    }
    eprintln!("{N} concurrent ADDs took {took:?}");
    let st = state(&node);
    let ids: BTreeSet<String> = pods.iter().map(|p| p.container_id.clone()).collect();
    assert_eq!(st.registered(), ids, "every pod registered");
    assert_eq!(
        st.pod_config.keys().copied().collect::<BTreeSet<u64>>(),
        cookies,
        "one pod_config entry per pod netns"
    );
    for pod in &pods {
        assert_eq!(mode(&st, &pod.container_id), "per_pod", "{}", pod.spec.name);
        assert!(
            !st.links_of(&pod.container_id).is_empty(),
            "{} has links",
            pod.spec.name
        );
    }

    let (dels, took) = run_all("DEL");
    for (i, _, out) in &dels {
        assert!(
            out.status.success(),
            "DEL of pod-{i}: {} {}",
            out.stdout,
            out.stderr
        );
        assert_eq!(out.stdout.trim(), "", "DEL prints nothing");
    }
    eprintln!("{N} concurrent DELs took {took:?}");
    let st = state(&node);
    assert!(st.is_empty(), "registry and maps end empty: {st:?}");
}

#[test]
fn agent_stopped_during_add_means_try_again_and_nothing_half_registered() {
    let mut node = start_node(
        NodeOptions {
            agent_timeout_ms: 20_000,
            ..NodeOptions::default()
        },
        &[namespace_manifest("shop", &[])],
    );
    // The pod is not in the agent's pod cache, as when the kubelet is quicker than the agent's
    // watch (emulated by a pod object bound to another node, which the node-scoped watch never
    // delivers): the agent's decision GETs it.
    let spec = PodSpec::meshed("shop", "web");
    node.apply(&[spec.manifest("another-node")])
        .unwrap_or_else(|e| panic!("applying the pod: {e}"));
    let pod = SimPod::new(spec).unwrap_or_else(|e| panic!("pod: {e}"));
    let c = cookie(&pod);
    let before = state(&node);
    let env = node.plugin_env("ADD", &pod);
    let stdin = node
        .plugin_stdin(&pod, Some(fake_prev_result(&pod, 0)))
        .expect("stdin")
        .to_string();

    // Freeze the API server: the agent's decision for the ADD blocks on it.
    let agent = node.agent().expect("agent running");
    let adds = agent.metric("linkerd_cni_agent_add_total").expect("metric");
    let api_pid = node.apiserver().pid();
    linkerd_cni_tests::node::signal(api_pid, nix::sys::signal::Signal::SIGSTOP).expect("SIGSTOP");
    let out = std::thread::scope(|s| {
        let add = s.spawn(|| node.run_plugin(&env, stdin.as_bytes()));
        wait_until("the agent to take the ADD", Duration::from_secs(10), || {
            (agent.metric("linkerd_cni_agent_add_total").ok()? > adds).then_some(())
        })
        .unwrap_or_else(|e| panic!("{e}\n{}", node.diagnostics()));
        // The agent dies in the middle of the ADD.
        linkerd_cni_tests::node::signal(agent.pid(), nix::sys::signal::Signal::SIGKILL)
            .expect("SIGKILL");
        let out = add
            .join()
            .unwrap_or_else(|_| panic!("plugin thread panicked"))
            .unwrap_or_else(|e| panic!("running the plugin: {e}"));
        // The agent gone, the plugin asks the (frozen) API whether the pod is meshed, bounded
        // by the plugin's API timeout (5 s), far below the 20 s agent timeout. What it says
        // shows which happened, however busy the machine: the connection broke (noticed at
        // once), not "did not answer within 20000 ms" (its timeout).
        assert!(
            out.stdout
                .contains("the connection to the linkerd-cni node agent")
                && !out.stdout.contains("did not answer within"),
            "the plugin notices the agent's death at once, not after its timeout: {} {}",
            out.stdout,
            out.stderr
        );
        out
    });
    linkerd_cni_tests::node::signal(api_pid, nix::sys::signal::Signal::SIGCONT).expect("SIGCONT");
    assert_eq!(
        out.code(),
        Some(11),
        "try again later: {} {}",
        out.stdout,
        out.stderr
    );
    node.kill_agent();
    assert_eq!(state(&node), before, "nothing half-registered");
    assert!(state(&node).entries_for(c).is_empty());

    // With no agent at all (stale socket of the killed one), the same answer.
    let out = node.run_plugin(&env, stdin.as_bytes()).expect("plugin");
    assert_eq!(out.code(), Some(11), "{} {}", out.stdout, out.stderr);
    assert!(out.msg().contains("is meshed"), "{}", out.msg());
    assert!(out.stdout.contains("cannot reach"), "{}", out.stdout);
    assert_eq!(state(&node), before, "nothing registered");

    // The runtime retries once the agent is back, and the pod is meshed.
    node.start_agent()
        .unwrap_or_else(|e| panic!("restarting the agent: {e}"));
    let out = node.run_plugin(&env, stdin.as_bytes()).expect("plugin");
    assert!(
        out.status.success(),
        "ADD after restart: {} {}",
        out.stdout,
        out.stderr
    );
    let st = state(&node);
    assert_eq!(mode(&st, &pod.container_id), "per_pod");
    assert!(st.pod_config.contains_key(&c));
    let out = node
        .run_plugin(&node.plugin_env("DEL", &pod), stdin.as_bytes())
        .expect("plugin");
    assert!(out.status.success(), "DEL: {} {}", out.stdout, out.stderr);
    assert!(state(&node).is_empty(), "{:?}", state(&node));
}

#[test]
fn registrations_whose_netns_is_deleted_are_dropped_within_30_seconds() {
    // The shipped reap interval: this checks the guarantee as deployed.
    let opts = NodeOptions::default();
    let node = start_node(opts, &[namespace_manifest("shop", &[])]);
    let mut pod = node.added_pod(PodSpec::meshed("shop", "web"));
    let keep = node.added_pod(PodSpec::meshed("shop", "kept"));
    let c = cookie(&pod);
    assert!(state(&node).registered().contains(&pod.container_id));

    pod.delete_netns();
    let gone = Instant::now();
    wait_until(
        "the registration to be reaped",
        Duration::from_secs(30),
        || (!state(&node).registered().contains(&pod.container_id)).then_some(()),
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", node.diagnostics()));
    eprintln!("reaped {:?} after the netns was deleted", gone.elapsed());
    assert_forgotten(&node, &pod, c);
    let st = state(&node);
    assert!(
        st.registered().contains(&keep.container_id),
        "a live pod is kept: {st:?}"
    );
    assert!(st.pod_config.contains_key(&cookie(&keep)));
    cni_ok(&node, Verb::Check, &keep, Some(keep.netns_path()));

    // The runtime's DELs still succeed afterwards (the netns path is gone).
    del_twice(&node, &pod);
    del_twice(&node, &keep);
    assert!(state(&node).is_empty(), "{:?}", state(&node));
}

#[test]
fn registry_survives_an_agent_restart() {
    let mut node = start_node(NodeOptions::default(), &[namespace_manifest("shop", &[])]);
    let (server_pod, server) = node.echo_pod("shop", "server", 8080);
    let dst = server.addr();
    let pod = node.added_pod(PodSpec::meshed("shop", "web"));
    let proxy = pod.start_proxy().expect("proxy");
    let before = server.received().len();
    request(&pod, &server, dst, "one\n");
    assert_proxied(&proxy, &server, dst, before);
    let registered = state(&node);

    node.kill_agent();
    // Redirection stays in force while the agent is down.
    let before = server.received().len();
    request(&pod, &server, dst, "two\n");
    assert_eq!(accepted(&proxy).len(), 2, "still proxied without the agent");
    assert!(server.received().len() > before);

    node.start_agent()
        .unwrap_or_else(|e| panic!("restarting the agent: {e}"));
    let st = state(&node);
    assert_eq!(
        st.registry, registered.registry,
        "the registry is as it was"
    );
    assert_eq!(st.links, registered.links, "the links are as they were");
    cni_ok(&node, Verb::Check, &pod, Some(pod.netns_path()));
    cni_ok(
        &node,
        Verb::Check,
        &server_pod,
        Some(server_pod.netns_path()),
    );
    let inspect = node.inspect().unwrap_or_else(|e| panic!("inspect: {e}"));
    assert!(
        inspect.contains(&pod.container_id) && inspect.contains("in force"),
        "inspect shows the adopted pod: {inspect}"
    );
    // The reason is the same words for every pod attached per pod (records share it); the
    // pod's own cgroup has a line of its own.
    let cgroup = pod.cgroup_path().expect("cgroup path");
    assert!(
        inspect.contains("redirected (programs attached to the pod's own cgroup)")
            && inspect
                .lines()
                .any(|l| l.trim_start().starts_with("cgroup: ") && l.ends_with(&cgroup)),
        "inspect names the reason and the pod's cgroup ({cgroup}): {inspect}"
    );
    let before = server.received().len();
    request(&pod, &server, dst, "three\n");
    assert_proxied(&proxy, &server, dst, before);
    assert_eq!(accepted(&proxy).len(), 3);

    drop(proxy);
    for p in [&pod, &server_pod] {
        let c = cookie(p);
        del_twice(&node, p);
        assert_forgotten(&node, p, c);
    }
    assert!(state(&node).is_empty(), "{:?}", state(&node));
}

/// `env` with `var` replaced (`Some`) or removed (`None`).
fn with(env: &[(String, String)], var: &str, value: Option<&str>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = env.iter().filter(|(k, _)| k != var).cloned().collect();
    if let Some(v) = value {
        out.push((var.to_string(), v.to_string()));
    }
    out
}

/// `conf` with the JSON pointer `at` (an existing parent object) set to `value`.
fn set(conf: &Value, at: &str, value: Value) -> Vec<u8> {
    let mut conf = conf.clone();
    let (parent, key) = at.rsplit_once('/').expect("pointer with a parent");
    conf.pointer_mut(parent)
        .and_then(Value::as_object_mut)
        .unwrap_or_else(|| panic!("{parent} must be an object"))
        .insert(key.to_string(), value);
    conf.to_string().into_bytes()
}

/// What a bad-input row gives the plugin as its environment: the good ADD environment of the
/// target pod, changed.
#[derive(Clone, Copy, Debug)]
enum Env {
    /// Unchanged.
    Good,
    /// Without this variable.
    Unset(&'static str),
    /// With this variable set to this value.
    Set(&'static str, &'static str),
    /// `CNI_NETNS` naming a regular file (the conflist).
    NetnsIsAFile,
    /// `K8S_POD_UID` not the target's.
    OtherPodUid,
    /// The ADD environment of another pod.
    Of(Other),
}

/// What a bad-input row gives the plugin on stdin.
#[derive(Clone, Copy, Debug)]
enum Stdin {
    /// The good config of the target pod.
    Good,
    /// These bytes.
    Raw(&'static [u8]),
    /// One byte more than the plugin reads (1 MiB of spaces, and one).
    Oversized,
    /// The good config with the JSON pointer set to this JSON text.
    Json(&'static str, &'static str),
    /// The good config with this `cniVersion`.
    Version(&'static str),
    /// The config of another pod (no `prevResult`).
    Of(Other),
}

/// Pods other than the target a row speaks for.
#[derive(Clone, Copy, Debug)]
enum Other {
    /// A pod the API server does not know.
    Ghost,
    /// A pod whose skip-outbound-ports annotation is not a port list.
    Malformed,
}

/// A bad-input row: case, environment, stdin, expected CNI code, text the message must hold.
struct Row(&'static str, Env, Stdin, u64, &'static str);

/// Every bad input, each rejected with its CNI code and a message naming what was wrong, none
/// changing the agent's state. One row a line: case, environment, stdin, code, message holds.
#[rustfmt::skip]
const BAD_INPUT: &[Row] = {
    use Env::{NetnsIsAFile, Of, OtherPodUid, Set, Unset};
    use Other::{Ghost, Malformed};
    use Stdin::{Json, Oversized, Raw, Version, Of as OfPod};
    const GOOD: Stdin = Stdin::Good;
    const ENV: Env = Env::Good;
    &[
        Row("no CNI_COMMAND", Unset("CNI_COMMAND"), GOOD, 4, "CNI_COMMAND"),
        Row("unknown command", Set("CNI_COMMAND", "ATTACH"), GOOD, 4, "ATTACH"),
        Row("no CNI_CONTAINERID", Unset("CNI_CONTAINERID"), GOOD, 4, "CNI_CONTAINERID"),
        Row("no CNI_NETNS on ADD", Unset("CNI_NETNS"), GOOD, 4, "CNI_NETNS"),
        Row("no CNI_IFNAME", Unset("CNI_IFNAME"), GOOD, 4, "CNI_IFNAME"),
        Row("container id with a path",
            Set("CNI_CONTAINERID", "../../etc/passwd"), GOOD, 4, "CNI_CONTAINERID"),
        Row("interface name with a slash", Set("CNI_IFNAME", "eth/0"), GOOD, 4, "CNI_IFNAME"),
        Row("unknown CNI_ARGS key",
            Set("CNI_ARGS", "K8S_POD_NAMESPACE=shop;K8S_POD_NAME=target;FOO=1"), GOOD, 4, "FOO"),
        Row("CNI_ARGS item without =",
            Set("CNI_ARGS", "IgnoreUnknown=1;K8S_POD_NAME"), GOOD, 4, "CNI_ARGS"),
        Row("broken JSON", ENV, Raw(br#"{"cniVersion":"1.0.0","linkerd":{"#), 6, "decode"),
        Row("empty stdin", ENV, Raw(b""), 6, "decode"),
        Row("oversized stdin", ENV, Oversized, 6, "exceeds"),
        Row("not an object", ENV, Raw(b"[1,2,3]"), 7, "object"),
        Row("proxy-uid as a word",
            ENV, Json("/linkerd/proxy-uid", r#""root""#), 7, "linkerd.proxy-uid"),
        Row("ports list as a string",
            ENV, Json("/linkerd/outbound-ports-to-ignore", r#""8080""#),
            7, "linkerd.outbound-ports-to-ignore"),
        Row("port list as an object",
            ENV, Json("/linkerd/inbound-ports-to-ignore", r#"{"9100":"9000"}"#),
            7, "linkerd.inbound-ports-to-ignore"),
        Row("ipv6 as a string", ENV, Json("/linkerd/ipv6", r#""yes""#), 7, "linkerd.ipv6"),
        Row("cgroupPath as a number",
            ENV, Json("/runtimeConfig/cgroupPath", "5"), 7, "runtimeConfig.cgroupPath"),
        Row("empty agent socket",
            ENV, Json("/linkerd/agent-socket", r#""""#), 7, "linkerd.agent-socket"),
        Row("version 0.2.0", ENV, Version("0.2.0"), 1, "0.2.0"),
        Row("version 2.0.0", ENV, Version("2.0.0"), 1, "2.0.0"),
        Row("version not a string", ENV, Json("/cniVersion", "1.0"), 7, "cniVersion"),
        Row("CHECK in 0.3.1", Set("CNI_COMMAND", "CHECK"), Version("0.3.1"), 1, "CHECK"),
        Row("GC in 1.0.0", Set("CNI_COMMAND", "GC"), Version("1.0.0"), 1, "GC"),
        Row("STATUS in 0.4.0", Set("CNI_COMMAND", "STATUS"), Version("0.4.0"), 1, "STATUS"),
        Row("nonexistent netns",
            Set("CNI_NETNS", "/run/netns/l5dt-no-such-netns"), GOOD, 3, "not found"),
        Row("a regular file as netns", NetnsIsAFile, GOOD, 3, "regular file"),
        Row("a directory as netns", Set("CNI_NETNS", "/run/netns"), GOOD, 3, "directory"),
        Row("a mount namespace as netns",
            Set("CNI_NETNS", "/proc/self/ns/mnt"), GOOD, 3, "mount namespace"),
        // Refused by the agent after it looked the pod up.
        Row("pod unknown to the API", Of(Ghost), OfPod(Ghost), 11, "not found"),
        Row("pod UID of another pod", OtherPodUid, GOOD, 11, "uid"),
        Row("malformed skip-outbound-ports", Of(Malformed), OfPod(Malformed), 7, SKIP_OUTBOUND),
        Row("CHECK of a pod never added", Set("CNI_COMMAND", "CHECK"), GOOD, 3, "no registration"),
    ]
};

#[test]
fn bad_input_corpus_gets_the_right_code_and_changes_nothing() {
    let node = start_node(NodeOptions::default(), &[namespace_manifest("shop", &[])]);
    // Something registered already, so "unchanged" is not trivially "empty".
    let registered = node.added_pod(PodSpec::meshed("shop", "registered"));
    let target = node
        .new_pod(PodSpec::meshed("shop", "target"))
        .expect("target pod");
    let malformed = node
        .new_pod(PodSpec::meshed("shop", "malformed").annotate(SKIP_OUTBOUND, "eighty"))
        .expect("pod with a malformed annotation");
    let ghost = SimPod::new(PodSpec::meshed("shop", "ghost")).expect("pod the API does not know");
    let baseline = state(&node);
    assert!(baseline.registered().contains(&registered.container_id));

    let env = node.plugin_env("ADD", &target);
    let conf = node
        .plugin_stdin(&target, Some(fake_prev_result(&target, 0)))
        .expect("stdin");
    let good = conf.to_string().into_bytes();
    let other = |o: Other| match o {
        Other::Ghost => &ghost,
        Other::Malformed => &malformed,
    };
    let env_of = |e: Env| match e {
        Env::Good => env.clone(),
        Env::Unset(var) => with(&env, var, None),
        Env::Set(var, value) => with(&env, var, Some(value)),
        Env::NetnsIsAFile => with(
            &env,
            "CNI_NETNS",
            Some(&node.conflist().display().to_string()),
        ),
        Env::OtherPodUid => {
            let mut e = env.clone();
            for (k, val) in e.iter_mut() {
                if k == "CNI_ARGS" {
                    *val = val.replace(&target.spec.uid, "00000000-dead-4000-8000-000000000000");
                }
            }
            e
        }
        Env::Of(o) => node.plugin_env("ADD", other(o)),
    };
    let stdin_of = |s: Stdin| match s {
        Stdin::Good => good.clone(),
        Stdin::Raw(bytes) => bytes.to_vec(),
        Stdin::Oversized => vec![b' '; 1024 * 1024 + 1],
        Stdin::Json(at, json) => set(&conf, at, serde_json::from_str(json).expect("row JSON")),
        Stdin::Version(v) => set(&conf, "/cniVersion", serde_json::json!(v)),
        Stdin::Of(o) => node
            .plugin_stdin(other(o), None)
            .expect("stdin")
            .to_string()
            .into_bytes(),
    };

    for &Row(case, env, stdin, code, needle) in BAD_INPUT {
        let (env, stdin) = (env_of(env), stdin_of(stdin));
        let out = node
            .run_plugin(&env, &stdin)
            .unwrap_or_else(|e| panic!("{case}: running the plugin: {e}"));
        assert_eq!(
            out.code(),
            Some(code),
            "{case}: exit {} stdout {:?} stderr {}",
            out.status,
            out.stdout,
            out.stderr
        );
        assert!(
            out.msg().contains(needle),
            "{case}: the message must mention {needle:?}: {}",
            out.msg()
        );
        let body = out.json().expect("error JSON");
        assert!(
            body["cniVersion"].is_string(),
            "{case}: the error names a cniVersion: {body}"
        );
        assert_eq!(
            out.stdout.trim().lines().count(),
            1,
            "{case}: one JSON object on stdout"
        );
        assert_eq!(
            state(&node),
            baseline,
            "{case}: the agent's state must not change"
        );
    }
    assert!(
        node.agent()
            .is_some_and(|a| a.metric("linkerd_cni_agent_pods").ok() == Some(1)),
        "the agent is alive and still serves the registered pod"
    );
    cni_ok(
        &node,
        Verb::Check,
        &registered,
        Some(registered.netns_path()),
    );
    // Then the same target with good input is meshed: the corpus did not wedge anything.
    let out = node.run_plugin(&env, &good).expect("plugin");
    assert!(
        out.status.success(),
        "good ADD: {} {}",
        out.stdout,
        out.stderr
    );
    assert_eq!(mode(&state(&node), &target.container_id), "per_pod");
}

#[test]
fn gc_and_status_invoked_directly() {
    let mut node = start_node(NodeOptions::default(), &[namespace_manifest("shop", &[])]);
    let pods: Vec<SimPod> = (0..3)
        .map(|i| {
            let pod = node
                .new_pod(PodSpec::meshed("shop", &format!("gc-{i}")))
                .unwrap_or_else(|e| panic!("pod: {e}"));
            let stdin = node
                .plugin_stdin(&pod, Some(fake_prev_result(&pod, i)))
                .expect("stdin");
            let out = node
                .run_plugin(&node.plugin_env("ADD", &pod), stdin.to_string().as_bytes())
                .expect("plugin");
            assert!(
                out.status.success(),
                "ADD gc-{i}: {} {}",
                out.stdout,
                out.stderr
            );
            pod
        })
        .collect();
    let cookies: Vec<u64> = pods.iter().map(cookie).collect();
    let gc_env: Vec<(String, String)> = vec![
        ("CNI_COMMAND".into(), "GC".into()),
        ("CNI_PATH".into(), "/usr/lib/cni".into()),
    ];
    let base = node.plugin_stdin(&pods[0], None).expect("stdin");
    let conf = |valid: Option<(&str, Vec<&SimPod>)>| -> Vec<u8> {
        let mut c = base.clone();
        c["cniVersion"] = serde_json::json!("1.1.0");
        if let Some(obj) = c.as_object_mut() {
            obj.remove("runtimeConfig");
        }
        if let Some((key, list)) = valid {
            c[key] = list
                .iter()
                .map(|p| serde_json::json!({"containerID": p.container_id, "ifname": "eth0"}))
                .collect();
        }
        c.to_string().into_bytes()
    };

    // No list of valid attachments: refused, nothing dropped.
    let before = state(&node);
    let out = node.run_plugin(&gc_env, &conf(None)).expect("plugin");
    assert_eq!(out.code(), Some(7), "{} {}", out.stdout, out.stderr);
    assert_eq!(state(&node), before, "GC without a list drops nothing");

    let out = node
        .run_plugin(
            &gc_env,
            &conf(Some(("cni.dev/valid-attachments", vec![&pods[0]]))),
        )
        .expect("plugin");
    assert!(out.status.success(), "GC: {} {}", out.stdout, out.stderr);
    assert_eq!(out.stdout.trim(), "", "GC prints nothing on success");
    let st = state(&node);
    assert_eq!(
        st.registered(),
        BTreeSet::from([pods[0].container_id.clone()]),
        "only the valid one is kept"
    );
    assert!(st.pod_config.contains_key(&cookies[0]));
    for (pod, c) in pods.iter().zip(&cookies).skip(1) {
        assert_forgotten(&node, pod, *c);
    }

    // An empty list (a runtime that lost its state) would unmesh every pod: the agent
    // refuses it and keeps everything.
    let before = state(&node);
    let out = node
        .run_plugin(&gc_env, &conf(Some(("cni.dev/attachments", vec![]))))
        .expect("plugin");
    assert!(
        !out.status.success() && out.stdout.contains("empty list"),
        "GC with an empty list must be refused: {} {}",
        out.stdout,
        out.stderr
    );
    assert_eq!(state(&node), before, "an empty GC drops nothing");
    // The older key, with another pod valid.
    let out = node
        .run_plugin(
            &gc_env,
            &conf(Some(("cni.dev/attachments", vec![&pods[1]]))),
        )
        .expect("plugin");
    assert!(out.status.success(), "GC: {} {}", out.stdout, out.stderr);
    assert!(state(&node).is_empty(), "{:?}", state(&node));

    let status_env: Vec<(String, String)> = vec![("CNI_COMMAND".into(), "STATUS".into())];
    let out = node.run_plugin(&status_env, &conf(None)).expect("plugin");
    assert!(
        out.status.success(),
        "STATUS with the agent up: {} {}",
        out.stdout,
        out.stderr
    );
    node.kill_agent();
    let out = node.run_plugin(&status_env, &conf(None)).expect("plugin");
    assert_eq!(
        out.code(),
        Some(50),
        "STATUS without the agent: {} {}",
        out.stdout,
        out.stderr
    );
    node.start_agent()
        .unwrap_or_else(|e| panic!("restarting the agent: {e}"));
    let out = node.run_plugin(&status_env, &conf(None)).expect("plugin");
    assert!(
        out.status.success(),
        "STATUS once the agent is back: {} {}",
        out.stdout,
        out.stderr
    );
}
