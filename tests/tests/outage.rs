//! What happens to pods while the node agent is down (root required): libcni runs the chain
//! bridge + host-local + `linkerd-cni` on a simulated node with the real agent process and the
//! fake Kubernetes API server. Pods of excluded namespaces and unmeshed pods start without the
//! agent, meshed pods fail closed until it is back, DEL always reaches host-local, and an ADD
//! the plugin stopped waiting for leaves nothing registered.
//!
//! Run: `cargo build --bins && cargo test -p linkerd-cni-tests --test outage -- --test-threads=1`

use std::time::Duration;

use linkerd_cni_tests::{
    cniruntime::{CniError, Verb},
    node::{AgentState, NodeOptions, PodSpec, SimNode, SimPod, namespace_manifest, wait_until},
};
use nix::sys::signal::Signal;
use serde_json::Value;

fn start_node(opts: NodeOptions, objects: &[Value]) -> SimNode {
    SimNode::start(opts, objects).unwrap_or_else(|e| panic!("starting the simulated node: {e}"))
}

fn new_pod(node: &SimNode, spec: PodSpec) -> SimPod {
    let name = format!("{}/{}", spec.namespace, spec.name);
    node.new_pod(spec)
        .unwrap_or_else(|e| panic!("creating pod {name}: {e}"))
}

fn state(node: &SimNode) -> AgentState {
    node.state()
        .unwrap_or_else(|e| panic!("reading the agent's state: {e}"))
}

/// CNI ADD through libcni that must succeed; keeps the result in `pod`.
fn add_ok(node: &SimNode, pod: &mut SimPod) {
    if let Err(e) = node.add(pod) {
        panic!("CNI ADD of {}: {e}\n{}", pod.spec.name, node.diagnostics());
    }
    assert!(pod.ip().is_some(), "{} got an address", pod.spec.name);
}

/// CNI ADD through libcni that must fail; the runtime's error.
fn add_fails(node: &SimNode, pod: &SimPod) -> CniError {
    let out = node
        .cni(Verb::Add, pod)
        .unwrap_or_else(|e| panic!("running CNI ADD for {}: {e}", pod.spec.name));
    assert!(
        !out.ok(),
        "ADD of {} must fail: {}",
        pod.spec.name,
        out.stdout
    );
    out.error()
        .unwrap_or_else(|| panic!("no CNI error object: {} {}", out.stdout, out.stderr))
}

/// DEL as containerd does it (with the netns, then with an empty `CNI_NETNS`), both must
/// succeed.
fn del_twice(node: &SimNode, pod: &SimPod) {
    for netns in [Some(pod.netns_path()), None] {
        let out = node
            .cni_netns(Verb::Del, pod, netns)
            .unwrap_or_else(|e| panic!("running CNI DEL for {}: {e}", pod.spec.name));
        assert!(
            out.ok(),
            "DEL of {} (netns {netns:?}) must succeed: {}\nplugin logs:\n{}",
            pod.spec.name,
            out.stdout,
            out.stderr
        );
    }
}

fn ip_of(pod: &SimPod) -> String {
    pod.ip().expect("pod has an address").to_string()
}

/// After an unclean reboot: the conflist still names linkerd-cni, bpffs and the agent's `/run`
/// are empty, the agent is not running. kube-system and unmeshed pods come up, a meshed pod
/// fails closed (code 11 naming the socket), DEL succeeds for every pod (host-local releases
/// the address); once the agent starts, the meshed pod's retried ADD succeeds and it is
/// redirected; at the end nothing is left (registry, pins, map entries, addresses).
#[test]
fn reboot_with_the_agent_not_running_yet() {
    let mut node = start_node(
        NodeOptions::default(),
        &[
            namespace_manifest("shop", &[]),
            namespace_manifest("kube-system", &[]),
        ],
    );
    node.simulate_reboot()
        .unwrap_or_else(|e| panic!("simulating the reboot: {e}"));
    let conflist = std::fs::read_to_string(node.conflist()).expect("conflist");
    assert!(
        conflist.contains("\"linkerd-cni\""),
        "conflist still patched"
    );
    assert!(!node.pin_root().exists(), "bpffs pin root empty");
    assert!(!node.socket().exists(), "no agent socket");

    // kube-system is excluded by default: even a pod with a linkerd-proxy container there
    // never reaches the agent.
    let mut dns = new_pod(&node, PodSpec::meshed("kube-system", "coredns"));
    add_ok(&node, &mut dns);
    // Unmeshed: the plugin asks the API itself and lets it start.
    let mut plain = new_pod(&node, PodSpec::unmeshed("shop", "plain"));
    add_ok(&node, &mut plain);
    // Meshed: fails closed, saying why and where.
    let mut web = new_pod(&node, PodSpec::meshed("shop", "web"));
    let err = add_fails(&node, &web);
    assert_eq!(err.code, 11, "try again later: {err:?}");
    let socket = node.socket().display().to_string();
    assert!(
        err.msg.contains("meshed") && err.msg.contains(&socket) && err.msg.contains("retries"),
        "the message names the reason and the socket: {err:?}"
    );
    // The runtime DELs the failed sandbox; DEL succeeds although the agent is down, so
    // libcni reaches host-local's DEL.
    del_twice(&node, &web);
    // A pod deleted while the agent is down.
    let mut gone = new_pod(&node, PodSpec::unmeshed("shop", "gone"));
    add_ok(&node, &mut gone);
    let gone_ip = ip_of(&gone);
    assert!(node.allocated_ips().contains(&gone_ip));
    del_twice(&node, &gone);
    assert!(
        !node.allocated_ips().contains(&gone_ip),
        "host-local released the address: {:?}",
        node.allocated_ips()
    );
    assert_eq!(
        node.allocated_ips(),
        {
            let mut v = vec![ip_of(&dns), ip_of(&plain)];
            v.sort();
            v
        },
        "only the running pods hold addresses"
    );
    assert!(
        !node.pin_root().exists(),
        "nothing pinned while the agent was down"
    );

    // The agent starts; the runtime retries the meshed pod's ADD.
    node.start_agent()
        .unwrap_or_else(|e| panic!("starting the agent: {e}"));
    add_ok(&node, &mut web);
    let st = state(&node);
    let record = st
        .record(&web.container_id)
        .unwrap_or_else(|| panic!("web registered: {st:?}"));
    assert_eq!(record["attachment"]["mode"], "per_pod", "{record}");
    let cookie = web.cookie().expect("cookie");
    assert!(
        st.pod_config.contains_key(&cookie),
        "web's config in the maps"
    );
    assert!(
        !st.links_of(&web.container_id).is_empty(),
        "web's links pinned"
    );
    let check = node.cni(Verb::Check, &web).expect("CHECK");
    assert!(check.ok(), "CHECK: redirection in force: {}", check.stdout);
    assert_eq!(
        st.registered().len(),
        1,
        "only web is registered (the others started without the agent): {st:?}"
    );

    for pod in [&web, &plain, &dns] {
        del_twice(&node, pod);
    }
    let st = state(&node);
    assert!(st.is_empty(), "nothing left: {st:?}");
    assert!(
        node.allocated_ips().is_empty(),
        "{:?}",
        node.allocated_ips()
    );
}

/// DEL while the agent is down succeeds (before, it failed with 11 and host-local never ran);
/// the agent drops the stale registration once it is back, because the netns is gone.
#[test]
fn del_while_the_agent_is_down_succeeds_and_the_agent_reaps_later() {
    let mut node = start_node(
        NodeOptions {
            reap_interval: Duration::from_secs(1),
            ..NodeOptions::default()
        },
        &[namespace_manifest("shop", &[])],
    );
    let mut web = new_pod(&node, PodSpec::meshed("shop", "web"));
    add_ok(&node, &mut web);
    let cookie = web.cookie().expect("cookie");
    let ip = ip_of(&web);
    assert!(state(&node).registered().contains(&web.container_id));

    node.kill_agent();
    del_twice(&node, &web);
    assert!(
        !node.allocated_ips().contains(&ip),
        "host-local's DEL ran: {:?}",
        node.allocated_ips()
    );
    // The runtime removes the sandbox's netns; the agent never saw the DEL.
    web.delete_netns();
    assert!(state(&node).registered().contains(&web.container_id));

    node.start_agent()
        .unwrap_or_else(|e| panic!("restarting the agent: {e}"));
    wait_until(
        "the stale registration to be reaped",
        Duration::from_secs(15),
        || state(&node).is_empty().then_some(()),
    )
    .unwrap_or_else(|e| panic!("{e}: {:?}\n{}", state(&node), node.diagnostics()));
    let st = state(&node);
    assert!(st.entries_for(cookie).is_empty());
    assert!(st.links_of(&web.container_id).is_empty());
}

/// An ADD the plugin stops waiting for is abandoned by the agent: nothing is registered
/// afterwards, even when what the agent was waiting for (the API) answers later. Before, the
/// agent finished the registration after the runtime had seen the ADD fail.
#[test]
fn an_add_past_the_plugins_deadline_is_abandoned() {
    let node = start_node(
        NodeOptions {
            agent_timeout_ms: 1_500,
            ..NodeOptions::default()
        },
        &[namespace_manifest("shop", &[])],
    );
    // The pod is not in the agent's pod cache, as when the kubelet is quicker than the agent's
    // watch (emulated by a pod object bound to another node, which the node-scoped watch never
    // delivers): the decision GETs it. (The namespace comes from the namespace cache.)
    let spec = PodSpec::meshed("shop", "web");
    node.apply(&[spec.manifest("another-node")])
        .unwrap_or_else(|e| panic!("applying the pod: {e}"));
    let web = SimPod::new(spec).unwrap_or_else(|e| panic!("creating the pod's sandbox: {e}"));
    let env = node.plugin_env("ADD", &web);
    let stdin = node.plugin_stdin(&web, None).expect("stdin").to_string();
    let before = state(&node);

    // Freeze the API server: the agent's decision (it GETs the pod) waits for it.
    let api = node.apiserver().pid();
    linkerd_cni_tests::node::signal(api, Signal::SIGSTOP).expect("SIGSTOP");
    let out = node.run_plugin(&env, stdin.as_bytes());
    // Thaw it while the agent's own API timeout (5 s) still runs: the GET then succeeds.
    std::thread::sleep(Duration::from_millis(500));
    linkerd_cni_tests::node::signal(api, Signal::SIGCONT).expect("SIGCONT");
    let out = out.unwrap_or_else(|e| panic!("running the plugin: {e}"));
    assert_eq!(out.code(), Some(11), "{} {}", out.stdout, out.stderr);
    // The ADD ended at the plugin's deadline, however long the machine took to run it: the
    // agent abandoned it there (its answer says so), or the plugin stopped waiting at its own
    // timeout. (Which of the two comes first is a matter of the 250 ms margin between them.)
    assert!(
        out.stdout.contains("the plugin's deadline passed")
            || out.stdout.contains("did not answer within 1500 ms"),
        "the plugin answered within its timeout: {} {}",
        out.stdout,
        out.stderr
    );
    // Give a late registration every chance to appear.
    std::thread::sleep(Duration::from_secs(5));
    let st = state(&node);
    assert_eq!(st, before, "nothing registered for the abandoned ADD");
    assert!(st.entries_for(web.cookie().expect("cookie")).is_empty());

    // The runtime retries; with the API answering, the pod is registered.
    let out = node.run_plugin(&env, stdin.as_bytes()).expect("plugin");
    assert!(out.status.success(), "{} {}", out.stdout, out.stderr);
    assert!(state(&node).registered().contains(&web.container_id));
    let out = node
        .run_plugin(&node.plugin_env("DEL", &web), stdin.as_bytes())
        .expect("plugin");
    assert!(out.status.success(), "DEL: {} {}", out.stdout, out.stderr);
    assert!(state(&node).is_empty(), "{:?}", state(&node));
}
