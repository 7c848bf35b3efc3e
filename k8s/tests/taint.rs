//! The startup taint against the fake Kubernetes API server over real HTTP, through the
//! production client path: the taint stays while the agent is not ready and goes once it is,
//! the node's other taints stay, a failing API is retried, and only `patch` on the node is
//! asked for.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use linkerd_cni_fake_apiserver::{FakeApiServer, TempKubeconfig};
use linkerd_cni_k8s::{
    client,
    taint::{STARTUP_TAINT_KEY, remove_when_ready},
};
use serde_json::{Value, json};

const NODE: &str = "node-a";
const WAIT: Duration = Duration::from_secs(10);

fn tainted_node(server: &FakeApiServer) {
    server
        .apply(&json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": NODE},
            "spec": {"taints": [
                {"key": "example.com/other", "effect": "NoSchedule"},
                {"key": STARTUP_TAINT_KEY, "effect": "NoSchedule"},
            ]},
        }))
        .expect("node");
}

fn taint_keys(server: &FakeApiServer) -> Vec<String> {
    let node = server.get("Node", None, NODE).expect("get").expect("node");
    node.pointer("/spec/taints")
        .and_then(Value::as_array)
        .map(|t| {
            t.iter()
                .filter_map(|t| t["key"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn the_taint_goes_once_ready_and_not_before() {
    let server = FakeApiServer::start().expect("fake API server");
    tainted_node(&server);
    let kubeconfig = TempKubeconfig::new(&server.url());
    let client = client::client(Some(kubeconfig.path()))
        .await
        .expect("client");
    let ready = Arc::new(AtomicBool::new(false));
    let r = ready.clone();
    let task = tokio::spawn(remove_when_ready(client, NODE.into(), move || {
        (!r.load(Ordering::SeqCst)).then(|| "plugin not in every conflist".to_string())
    }));
    // Not ready: several readiness polls pass and the taint stays, untouched.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        taint_keys(&server),
        ["example.com/other", STARTUP_TAINT_KEY]
    );
    assert!(
        !server.requests().iter().any(|r| r.method == "PATCH"),
        "no patch before ready"
    );
    ready.store(true, Ordering::SeqCst);
    tokio::time::timeout(WAIT, task)
        .await
        .expect("removed within the bound")
        .expect("task");
    assert_eq!(taint_keys(&server), ["example.com/other"]);
    let asked: Vec<(String, String)> = server
        .requests()
        .iter()
        .map(|r| (r.method.clone(), r.path.clone()))
        .collect();
    assert_eq!(
        asked,
        [("PATCH".to_string(), format!("/api/v1/nodes/{NODE}"))],
        "one patch of its own node, nothing else"
    );
}

#[tokio::test]
async fn a_failing_api_is_retried_with_backoff() {
    let server = FakeApiServer::start().expect("fake API server");
    tainted_node(&server);
    let path = format!("/api/v1/nodes/{NODE}");
    // Forbidden, as while the RBAC or the admission policy is not in force yet.
    server.fail_path_times(&path, 403, 3);
    let kubeconfig = TempKubeconfig::new(&server.url());
    let client = client::client(Some(kubeconfig.path()))
        .await
        .expect("client");
    let start = Instant::now();
    tokio::time::timeout(
        Duration::from_secs(30),
        remove_when_ready(client, NODE.into(), || None),
    )
    .await
    .expect("removed once the API answers");
    assert_eq!(taint_keys(&server), ["example.com/other"]);
    assert_eq!(server.hits(&path), 4, "three refusals and the success");
    // Backoff 0.5 s + 1 s + 2 s between the four attempts (a lower bound the code sleeps).
    assert!(
        start.elapsed() >= Duration::from_millis(3500),
        "{:?}",
        start.elapsed()
    );
}
