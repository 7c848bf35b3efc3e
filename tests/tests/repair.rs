//! Repair without `CAP_SYS_ADMIN` (root required): on a simulated node (libcni, the agent as
//! a real process holding exactly the capabilities the DaemonSet gives it, the fake Kubernetes
//! API), meshed pods are started through the node's chain as it was before linkerd-cni was
//! installed (bridge + host-local only), so no CNI ADD ever reaches the agent, and kubelet's
//! view of them (`Running`, their address) is served by the API. The agent cannot enter their
//! network namespaces to adopt them, so:
//!
//! - it deletes a meshed pod that runs without a registration (a `DELETE` of that pod at the
//!   API, with its UID as the precondition; the pod is gone from the API), counted in
//!   `linkerd_cni_agent_pod_repairs_total{action="deleted"}`, with a `LinkerdCNIRepaired` Event
//!   on it, within a grace period and a pass of its repair loop after it became ready;
//! - its node's token bucket (burst 1 here) holds the second such pod back (counted once as
//!   `rate_limited`, a `LinkerdCNIUnredirected` Event on it, not deleted);
//! - it never deletes an unmeshed pod, a `hostNetwork` pod, a pod meshed by `linkerd-init`
//!   (Linkerd's iptables), nor a meshed pod whose ADD went through the plugin;
//! - with `--repair-pods=false` (the chart's `repairController.enabled=false`) it deletes
//!   nothing (negative control).
//!
//! Run: `cargo build --bins && cargo test -p linkerd-cni-tests --test repair -- --test-threads=1`

use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

use linkerd_cni_agent::host::capabilities::required_names;
use linkerd_cni_tests::{
    ChildGuard,
    node::{
        self, NODE_NAME, NodeOptions, PodSpec, SimNode, SimPod, namespace_manifest, wait_until,
    },
};

const APP_UID: u32 = 1000;
/// The agent's `--repair-grace` here.
const GRACE: Duration = Duration::from_secs(2);
/// Only turns a repair loop whose passes stopped into a failure.
const HANG: Duration = Duration::from_secs(120);

fn options(repair: bool) -> NodeOptions {
    NodeOptions {
        agent_args: [
            "--adopt-interval=500ms".to_string(),
            format!("--repair-grace={}ms", GRACE.as_millis()),
            "--repair-burst=1".into(),
            "--repair-per-minute=1".into(),
            format!("--repair-pods={repair}"),
        ]
        .into(),
        ..NodeOptions::default()
    }
}

/// A pod that started through the chain without linkerd-cni ([`SimNode::early_pod`]).
fn early_pod(node: &SimNode, spec: PodSpec) -> (SimPod, ChildGuard) {
    node.early_pod(spec, APP_UID)
        .unwrap_or_else(|e| panic!("a pod started before the plugin: {e}"))
}

/// A meshed `hostNetwork` pod as the API shows it (the node's address).
fn host_network_pod(node: &SimNode) -> PodSpec {
    let spec = PodSpec::meshed("shop", "host");
    let mut manifest = spec.manifest_running(NODE_NAME, &[IpAddr::from([192, 0, 2, 10])]);
    manifest["spec"]["hostNetwork"] = true.into();
    node.apply(&[manifest])
        .unwrap_or_else(|e| panic!("serving the hostNetwork pod: {e}"));
    spec
}

/// The paths of the pods the agent asked the API to delete.
fn deletes(node: &SimNode) -> Vec<String> {
    node.apiserver()
        .stats()
        .unwrap_or_else(|e| panic!("API stats: {e}"))
        .requests
        .into_iter()
        .filter(|r| r.method == "DELETE")
        .map(|r| r.path)
        .collect()
}

/// The `reason`s of the Events on pod `name` in namespace `shop`, as the API holds them.
fn event_reasons(node: &SimNode, name: &str) -> Vec<String> {
    node.apiserver()
        .event_reasons("shop", name)
        .unwrap_or_else(|e| panic!("listing Events: {e}"))
}

fn pod_path(spec: &PodSpec) -> String {
    format!("/api/v1/namespaces/{}/pods/{}", spec.namespace, spec.name)
}

fn metric(node: &SimNode, name: &str) -> u64 {
    node.agent()
        .expect("agent")
        .metric(name)
        .unwrap_or_else(|e| panic!("{e}"))
}

fn repair_passes(node: &SimNode) -> u64 {
    metric(node, "linkerd_cni_agent_pod_repair_passes_total")
}

fn repairs(node: &SimNode, action: &str) -> u64 {
    metric(
        node,
        &format!(
            "linkerd_cni_agent_pod_repairs_total{{action=\"{action}\",reason=\"unregistered\"}}"
        ),
    )
}

/// Waits until the repair loop has run once (the agent is ready from then on), then for the
/// grace period: every pod unregistered since is then due.
fn past_the_grace(node: &SimNode) {
    wait_until("a first repair pass", HANG, || {
        (repair_passes(node) >= 1).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", node.diagnostics()));
    std::thread::sleep(GRACE);
}

/// Waits until `done` holds, failing if a whole repair pass that began after this call ended
/// without it.
fn within_a_pass(node: &SimNode, what: &str, done: impl FnMut() -> bool) {
    node::within_a_pass(
        what,
        repair_passes(node),
        HANG,
        || repair_passes(node),
        done,
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", node.diagnostics()));
}

#[test]
fn meshed_pods_without_registration_are_deleted_at_the_default_capabilities() {
    let mut node = SimNode::start(options(true), &[namespace_manifest("shop", &[])])
        .unwrap_or_else(|e| panic!("starting the simulated node: {e}"));
    // Through the plugin, redirected: registered, never repaired.
    let through = node.added_pod(PodSpec::meshed("shop", "through-plugin"));
    let through_ip = IpAddr::V4(through.ip().expect("ip"));
    node.apply(&[through.spec.manifest_running(NODE_NAME, &[through_ip])])
        .unwrap_or_else(|e| panic!("serving the pod's status: {e}"));

    // The agent is down while the other pods start without linkerd-cni in the chain.
    node.kill_agent();
    let (early_a, _app_a) = early_pod(&node, PodSpec::meshed("shop", "early-a"));
    let (early_b, _app_b) = early_pod(&node, PodSpec::meshed("shop", "early-b"));
    let (plain, _plain_app) = early_pod(&node, PodSpec::unmeshed("shop", "plain"));
    let (iptables, _iptables_app) =
        early_pod(&node, PodSpec::with_linkerd_init("shop", "iptables"));
    let host = host_network_pod(&node);

    let started = Instant::now();
    node.start_agent_with_capabilities(&required_names())
        .unwrap_or_else(|e| panic!("agent: {e}\n{}", node.diagnostics()));
    past_the_grace(&node);
    let early = [pod_path(&early_a.spec), pod_path(&early_b.spec)];
    within_a_pass(&node, "a meshed pod without registration deleted", || {
        deletes(&node).iter().any(|d| early.contains(d))
    });
    let took = started.elapsed();
    // The pass that deleted one has also seen the other and held it back: one more whole
    // pass, so that every pod was looked at after the first delete.
    let before = repair_passes(&node);
    within_a_pass(&node, "two more repair passes", || {
        repair_passes(&node) >= before + 2
    });

    let deleted = deletes(&node);
    assert_eq!(
        deleted.len(),
        1,
        "one DELETE (burst 1, 1 a minute): {deleted:?}\n{}",
        node.diagnostics()
    );
    assert!(early.contains(&deleted[0]), "{deleted:?}");
    println!(
        "deleted {} {:?} after the agent started (grace {GRACE:?}, a pass every 500 ms)",
        deleted[0], took
    );
    let (status, _) = node
        .apiserver()
        .get(&deleted[0])
        .unwrap_or_else(|e| panic!("GET: {e}"));
    assert_eq!(status, 404, "the deleted pod is gone from the API");
    assert_eq!(repairs(&node, "deleted"), 1, "the delete is counted");
    assert_eq!(
        repairs(&node, "rate_limited"),
        1,
        "the second pod is held back by the node's bucket, counted once"
    );
    assert_eq!(repairs(&node, "failed"), 0);
    // The Events: written in the background, a moment after the action.
    let deleted_name = deleted[0]
        .rsplit('/')
        .next()
        .expect("a pod name")
        .to_string();
    let held = if deleted_name == early_a.spec.name {
        &early_b.spec.name
    } else {
        &early_a.spec.name
    };
    wait_until("the Events on both pods", Duration::from_secs(10), || {
        (event_reasons(&node, &deleted_name).contains(&"LinkerdCNIRepaired".to_string())
            && event_reasons(&node, held).contains(&"LinkerdCNIUnredirected".to_string()))
        .then_some(())
    })
    .unwrap_or_else(|e| {
        panic!(
            "{e}: {:?} / {:?}\n{}",
            event_reasons(&node, &deleted_name),
            event_reasons(&node, held),
            node.diagnostics()
        )
    });
    for spec in [&plain.spec, &iptables.spec, &host, &through.spec] {
        assert!(
            !event_reasons(&node, &spec.name)
                .iter()
                .any(|r| r == "LinkerdCNIRepaired" || r == "LinkerdCNIUnredirected"),
            "no repair Event on {}",
            spec.name
        );
    }
    for spec in [&plain.spec, &iptables.spec, &host, &through.spec] {
        let (status, _) = node
            .apiserver()
            .get(&pod_path(spec))
            .unwrap_or_else(|e| panic!("GET: {e}"));
        assert_eq!(status, 200, "{} still served", spec.name);
    }
    assert!(
        node.state()
            .expect("agent state")
            .registered()
            .iter()
            .all(|id| !id.starts_with("adopted-")),
        "nothing adopted: the agent holds no CAP_SYS_ADMIN"
    );
}

#[test]
fn nothing_is_deleted_with_repair_off() {
    let mut node = SimNode::start(options(false), &[namespace_manifest("shop", &[])])
        .unwrap_or_else(|e| panic!("starting the simulated node: {e}"));
    node.kill_agent();
    let (early, _app) = early_pod(&node, PodSpec::meshed("shop", "early"));
    node.start_agent_with_capabilities(&required_names())
        .unwrap_or_else(|e| panic!("agent: {e}\n{}", node.diagnostics()));
    // No repair loop runs: nothing to count passes of. Three times what the repair above
    // needs (the grace and two passes) on an idle machine; a negative result, so a slow
    // machine cannot make it fail.
    std::thread::sleep(3 * (GRACE + Duration::from_secs(1)));
    assert!(deletes(&node).is_empty(), "{:?}", deletes(&node));
    assert_eq!(repair_passes(&node), 0, "no repair loop runs");
    assert_eq!(repairs(&node, "deleted"), 0);
    let (status, _) = node
        .apiserver()
        .get(&pod_path(&early.spec))
        .unwrap_or_else(|e| panic!("GET: {e}"));
    assert_eq!(status, 200, "the pod is left as it is");
}
