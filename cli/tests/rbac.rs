//! The chart's RBAC against the API requests the code makes (issue 36): the agent's and the
//! plugin's request paths run against the fake API server through their production clients,
//! every request recorded is held against the rules `linkerd install-cni` renders for the
//! linkerd-cni ServiceAccount (the API server's authorizer, [`Rbac`]), and:
//! - every request is allowed (nothing the code reads is missing from the chart);
//! - every rule of the chart allows some request (nothing is granted that the code does not
//!   use: the token is copied to every node for the plugin).
//!
//! The paths run: the agent's watch caches (this node's pods, every namespace's metadata), an
//! ADD decision for a pod the cache lacks (a pod GET), for a pod in a namespace the cache lacks
//! (a namespace GET), for a control-plane pod (the `default/kubernetes` Service), the agent's
//! SIGTERM question (its DaemonSet, its namespace), an Event on a pod and its repeat (a create
//! and a patch of `events.k8s.io` events), the removal of the node's startup taint (a patch of
//! the node), the repair's DELETE of a pod, and the plugin's lookup while the agent is down (a
//! pod GET with the kubeconfig the installer writes).

mod support;

use std::{sync::atomic::Ordering, time::Duration};

use linkerd_cni_fake_apiserver::{
    FakeApiServer, RecordedRequest,
    rbac::{Attributes, Rbac},
};
use linkerd_cni_k8s::{
    PodSource, client,
    events::{EventRecorder, Limits, PodRef, Reason},
    termination::{Termination, termination},
};
use linkerd_cni_proto::config::LinkerdConfig;
use serde_json::{Value, json};
use support::*;

const NODE: &str = "node-a";
const NS: &str = "linkerd-cni";
const WAIT: Duration = Duration::from_secs(10);

fn pod(namespace: &str, name: &str, labels: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": format!("uid-{name}"),
                     "labels": labels},
        "spec": {"nodeName": NODE, "containers": [{"name": "app"}, {"name": "linkerd-proxy"}]},
    })
}

fn namespace(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
}

/// Runs every request path of the agent and the plugin against `server`; returns what it
/// recorded.
fn exercise(server: &FakeApiServer, kubeconfig: &std::path::Path) -> Vec<RecordedRequest> {
    for ns in [NS, "shop", "linkerd"] {
        server.apply(&namespace(ns)).expect("namespace");
    }
    server.apply(&pod("shop", "web", json!({}))).expect("pod");
    server
        .apply(&json!({
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE},
            "spec": {"taints": [{"key": linkerd_cni_k8s::taint::STARTUP_TAINT_KEY, "effect": "NoSchedule"}]},
        }))
        .expect("node");
    server
        .apply(&pod(
            "linkerd",
            "destination",
            json!({"linkerd.io/control-plane-component": "destination"}),
        ))
        .expect("control-plane pod");
    server
        .apply(&json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "kubernetes", "namespace": "default"},
            "spec": {"ports": [{"port": 443, "targetPort": 6443}]},
        }))
        .expect("service");
    server.route(
        &format!("/apis/apps/v1/namespaces/{NS}/daemonsets/linkerd-cni"),
        json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
               "metadata": {"name": "linkerd-cni", "namespace": NS}}),
    );
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let client = client::client(Some(kubeconfig)).await.expect("client");
        let source = PodSource::new(client.clone(), NODE);
        source.wait_synced(WAIT).await.expect("caches synced");
        let base = LinkerdConfig::default();
        // In the cache: no request.
        source
            .decide("shop", "web", None, &base)
            .await
            .expect("web");
        // Created after the sync and asked for at once: a GET if the watch has not brought it.
        server.apply(&pod("shop", "late", json!({}))).expect("pod");
        let _ = source.pod("shop", "late", Some("uid-other")).await;
        // A namespace the cache does not hold.
        server.apply(&pod("unlisted", "p", json!({}))).expect("pod");
        let _ = source.namespace("unlisted").await;
        // The control plane's pod: the default/kubernetes Service.
        source
            .decide("linkerd", "destination", None, &base)
            .await
            .expect("control-plane pod");
        // The repair (repairController.enabled, the default): a pod deleted, with its UID as
        // the precondition.
        let deleted = source
            .delete_pod("shop", "late", "uid-late")
            .await
            .expect("the repair's DELETE");
        assert!(deleted, "the pod was deleted");
        // SIGTERM: a rollout (the DaemonSet stands; its namespace is asked too).
        let t = termination(client.clone(), NS, "linkerd-cni", WAIT).await;
        assert!(matches!(t, Termination::Rollout), "{t:?}");
        // An Event on a pod, and its repeat counted into the Event's series (a patch).
        let limits = Limits {
            patch_interval: Duration::from_millis(1),
            ..Limits::default()
        };
        let client_for_taint = client.clone();
        let recorder = EventRecorder::spawn_with(client, NODE, limits);
        let web = PodRef::new("shop", "web", Some("uid-web".into()));
        recorder.record(&web, Reason::Redirected, "attached");
        let start = std::time::Instant::now();
        while recorder.stats().created.load(Ordering::Relaxed) == 0 {
            assert!(start.elapsed() < WAIT, "the Event was not created");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        recorder.record(&web, Reason::Redirected, "attached");
        while !server.requests().iter().any(|r| r.method == "PATCH") {
            assert!(start.elapsed() < WAIT, "the Event's series was not patched");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(recorder.stats().failed.load(Ordering::Relaxed), 0);
        // Ready: the node's startup taint removed (one patch of the node, no read).
        linkerd_cni_k8s::taint::remove_startup_taint(&client_for_taint, NODE)
            .await
            .expect("the startup taint removed");
    });
    // The plugin while the agent is down.
    let target = linkerd_cni_plugin::apiserver::Target::load(&kubeconfig.display().to_string())
        .expect("plugin kubeconfig");
    target.get_pod("shop", "web").expect("the plugin's GET");
    server.requests()
}

#[test]
fn the_chart_grants_exactly_what_the_code_requests() {
    for (what, args) in [
        ("default", vec![]),
        ("another namespace", vec!["--cni-namespace", "l5d-cni"]),
    ] {
        let ns = if args.is_empty() { NS } else { "l5d-cni" };
        let objects = docs(&install_cni(&args, &[]));
        let rbac = Rbac::for_service_account(&objects, ns, "linkerd-cni");
        let server = FakeApiServer::start().expect("fake API server");
        let kubeconfig = temp_file(&format!("rbac-{ns}.kubeconfig"), "");
        server.write_kubeconfig(&kubeconfig).expect("kubeconfig");
        // Only the DaemonSet's namespace differs with --cni-namespace.
        let requests: Vec<RecordedRequest> = exercise(&server, &kubeconfig)
            .into_iter()
            .map(|mut r| {
                r.path = r
                    .path
                    .replace(&format!("/namespaces/{NS}"), &format!("/namespaces/{ns}"));
                r
            })
            .collect();
        let mut used = vec![false; rbac.grants.len()];
        let mut denied = Vec::new();
        for r in &requests {
            let Some(a) = Attributes::of(r) else { continue };
            let allowing = rbac.allowing(&a);
            if allowing.is_empty() {
                denied.push(format!("{} {} ({a:?})", r.method, r.path));
            }
            for g in allowing {
                if let Some(i) = rbac.grants.iter().position(|x| x == g) {
                    used[i] = true;
                }
            }
        }
        assert!(
            denied.is_empty(),
            "{what}: the chart's RBAC denies requests the code makes:\n{}",
            denied.join("\n")
        );
        let unused: Vec<String> = rbac
            .grants
            .iter()
            .zip(&used)
            .filter(|(_, u)| !**u)
            .map(|(g, _)| g.describe())
            .collect();
        assert!(
            unused.is_empty(),
            "{what}: the chart grants what no request uses:\n{}",
            unused.join("\n")
        );
        // Each verb on each resource of a rule too: one no request used is granted for nothing.
        for g in &rbac.grants {
            for verb in &g.verbs {
                for resource in &g.resources {
                    let one = linkerd_cni_fake_apiserver::rbac::Grant {
                        verbs: vec![verb.clone()],
                        resources: vec![resource.clone()],
                        ..g.clone()
                    };
                    assert!(
                        requests
                            .iter()
                            .filter_map(Attributes::of)
                            .any(|a| one.allows(&a)),
                        "{what}: no request uses {verb:?} on {resource:?} of {}",
                        g.describe()
                    );
                }
            }
        }
        // And the node's token reads no Node: of nodes it may only patch (the startup taint,
        // narrowed to that taint on its own node by the chart's admission policy).
        for g in &rbac.grants {
            if g.resources.iter().any(|r| r == "nodes" || r == "*") {
                assert_eq!(
                    g.verbs,
                    ["patch"],
                    "{what}: nodes granted: {}",
                    g.describe()
                );
            }
        }
    }
}
