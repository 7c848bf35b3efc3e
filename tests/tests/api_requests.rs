//! Kubernetes API load of a node (root required): the node agent as a real process, the fake API
//! server process counting every request, CNI ADD and DEL through libcni. Once the agent's
//! watch caches (this node's pods, every namespace) are synced, an ADD makes no API request:
//! neither for the pod nor for its namespace, meshed or not, and a namespace annotation is still
//! honoured (it came through the namespace watch). The test waits for the agent to have cached
//! what it created (the agent's debug line for each object its watches put in the cache), not
//! for a while.
//!
//! Run: `cargo build --bins && cargo test -p linkerd-cni-tests --test api_requests -- --test-threads=1`

use std::time::Duration;

use linkerd_cni_tests::{
    cniruntime::Verb,
    node::{ApiStats, NodeOptions, PodSpec, SimNode, SimPod, namespace_manifest, wait_until},
};

const SKIP_OUTBOUND: &str = "config.linkerd.io/skip-outbound-ports";

fn stats(node: &SimNode) -> ApiStats {
    node.apiserver()
        .stats()
        .unwrap_or_else(|e| panic!("reading the fake API server's stats: {e}"))
}

/// Waits until the agent watches both pods and namespaces: kube's watcher lists first and
/// watches from the list's resourceVersion, so a watch request means the list (the cache's
/// first sync) is complete.
fn wait_caches_synced(node: &SimNode) {
    wait_until(
        "the agent watching pods and namespaces",
        Duration::from_secs(20),
        || {
            let st = stats(node);
            let watching = |path: &str| st.requests.iter().any(|r| r.is_watch() && r.path == path);
            (watching("/api/v1/pods") && watching("/api/v1/namespaces")).then_some(())
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", node.diagnostics()));
}

/// Waits until the agent's caches hold every object of `cached` (`pod cached: <ns>/<name>`,
/// `namespace cached: <name>`): the agent logs each at debug level once its cache holds it.
fn wait_cached(node: &SimNode, cached: &[String]) {
    wait_until(
        "the agent caching what the test created",
        Duration::from_secs(20),
        || {
            let log = node.agent_log();
            cached
                .iter()
                .all(|c| log.contains(c.as_str()))
                .then_some(())
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", node.diagnostics()));
}

fn pod_cached(pod: &SimPod) -> String {
    format!("pod cached: {}/{}", pod.spec.namespace, pod.spec.name)
}

fn registered_skip_outbound(node: &SimNode, pod: &SimPod) -> serde_json::Value {
    let st = node
        .state()
        .unwrap_or_else(|e| panic!("reading the agent's state: {e}"));
    st.record(&pod.container_id)
        .unwrap_or_else(|| panic!("{} not registered", pod.spec.name))["config"]["outbound-ports-to-ignore"]
        .clone()
}

#[test]
fn steady_state_adds_and_dels_make_no_api_request() {
    let defaults = NodeOptions::default();
    let node = SimNode::start(
        NodeOptions {
            agent_log_level: format!("{},linkerd_cni_k8s=debug", defaults.agent_log_level),
            ..defaults
        },
        &[
            namespace_manifest("shop", &[(SKIP_OUTBOUND, "9090")]),
            namespace_manifest("plain", &[]),
        ],
    )
    .unwrap_or_else(|e| panic!("starting the simulated node: {e}"));
    wait_caches_synced(&node);

    // The pods exist (bound to this node) before their ADD, as when the kubelet creates the
    // sandbox of a pod the scheduler bound a moment ago.
    let specs = [
        PodSpec::meshed("shop", "meshed-ns-annotated"),
        PodSpec::meshed("shop", "meshed-pod-annotated").annotate(SKIP_OUTBOUND, "8080"),
        PodSpec::meshed("plain", "meshed"),
        PodSpec::meshed("plain", "meshed-2"),
        PodSpec::unmeshed("plain", "unmeshed"),
        PodSpec::with_linkerd_init("shop", "iptables-mode"),
    ];
    let mut pods: Vec<SimPod> = specs
        .into_iter()
        .map(|s| {
            node.new_pod(s)
                .unwrap_or_else(|e| panic!("creating a pod: {e}"))
        })
        .collect();
    wait_cached(&node, &pods.iter().map(pod_cached).collect::<Vec<_>>());

    let before = stats(&node);
    let watches_before = before.watches_started;
    for pod in &mut pods {
        if let Err(e) = node.add(pod) {
            panic!("ADD of {}: {e}\n{}", pod.spec.name, node.diagnostics());
        }
    }
    let after = stats(&node);
    let reads = after.reads_since(before.requests.len());
    assert!(
        reads.is_empty(),
        "{} API requests for {} ADDs after the caches synced (want 0): {reads:#?}",
        reads.len(),
        pods.len()
    );
    assert_eq!(after.watches_started, watches_before, "ADDs opened watches");
    // The only writes: at most one Event per meshed pod (`LinkerdCNIRedirected`, written in the
    // background; the unmeshed and `linkerd-init` pods get none).
    let meshed = pods
        .iter()
        .filter(|p| {
            p.spec.containers.iter().any(|c| c == "linkerd-proxy")
                && !p.spec.init_containers.iter().any(|c| c == "linkerd-init")
        })
        .count();
    assert_eq!(meshed, 4, "the meshed pods of this test");
    let events = after.event_writes_since(before.requests.len());
    assert!(
        events.len() <= meshed,
        "{} Event writes for {meshed} meshed pods: {events:#?}",
        events.len()
    );
    // The namespace's annotation came from the namespace cache, and the pod's wins over it.
    assert_eq!(
        registered_skip_outbound(&node, &pods[0]),
        serde_json::json!(["9090"])
    );
    assert_eq!(
        registered_skip_outbound(&node, &pods[1]),
        serde_json::json!(["8080"])
    );

    // A namespace created (and annotated) while the agent runs reaches the cache too.
    node.apply(&[namespace_manifest("late", &[(SKIP_OUTBOUND, "5432")])])
        .unwrap_or_else(|e| panic!("applying a namespace: {e}"));
    let mut late = node
        .new_pod(PodSpec::meshed("late", "web"))
        .unwrap_or_else(|e| panic!("creating a pod: {e}"));
    wait_cached(&node, &["namespace cached: late".into(), pod_cached(&late)]);
    let before = stats(&node);
    node.add(&mut late)
        .unwrap_or_else(|e| panic!("ADD late/web: {e}\n{}", node.diagnostics()));
    let reads = stats(&node).reads_since(before.requests.len()).len();
    assert_eq!(reads, 0, "API requests for an ADD in a new namespace");
    assert_eq!(
        registered_skip_outbound(&node, &late),
        serde_json::json!(["5432"])
    );
    pods.push(late);

    let before = stats(&node);
    for pod in &pods {
        node.cni(Verb::Del, pod)
            .and_then(|o| o.expect_ok())
            .unwrap_or_else(|e| panic!("DEL of {}: {e}", pod.spec.name));
    }
    let after = stats(&node);
    assert!(
        after.reads_since(before.requests.len()).is_empty(),
        "DELs made API requests"
    );
    // One watch of this node's pods and one of namespaces, nothing else, for the whole run.
    assert_eq!(after.watches_open, 2, "open watches: {:#?}", after.requests);
}
