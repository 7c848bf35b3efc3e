//! `PodSource` against the fake Kubernetes API server over real HTTP, through the production
//! client path (a kubeconfig file, `client::client`, kube's watcher and reflector): what is
//! cached, what is fetched, what fails; plus the fake server's own list/watch semantics that
//! those tests rely on.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api,
    api::{ListParams, WatchEvent, WatchParams},
};
use linkerd_cni_fake_apiserver::{
    self as fake_apiserver, FakeApiServer, RecordedRequest, TempKubeconfig,
};
use linkerd_cni_k8s::{
    K8sError, NamespaceOrigin, PodOrigin, PodSource,
    client::{self, ClientError},
    names,
};
use linkerd_cni_proto::config::{LinkerdConfig, parse_port_list};
use serde_json::{Value, json};

const NODE: &str = "node-a";
const NS: &str = "emojivoto";
/// A namespace with no Namespace object: never in the namespace cache.
const UNCACHED_NS: &str = "no-such-namespace";
const WAIT: Duration = Duration::from_secs(10);

fn pod(name: &str, node: &str, containers: &[&str], annotations: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "annotations": annotations},
        "spec": {
            "nodeName": node,
            "containers": containers.iter().map(|c| json!({"name": c, "image": "x"})).collect::<Vec<_>>(),
        },
    })
}

const MESHED: &[&str] = &["app", "linkerd-proxy"];
const PLAIN: &[&str] = &["app"];

/// A server holding the namespace (annotated: skip-inbound-ports 22) and the
/// `default/kubernetes` Service, a client to it and a synced `PodSource` for `NODE`.
struct Fixture {
    server: FakeApiServer,
    _kubeconfig: TempKubeconfig,
    source: PodSource,
}

async fn fixture() -> Fixture {
    let server = FakeApiServer::start().expect("start fake API server");
    server
        .apply(&json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": NS, "annotations": {names::SKIP_INBOUND_PORTS_ANNOTATION: "22"}}}))
        .expect("apply namespace");
    server
        .apply(&json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "kubernetes", "namespace": "default"},
            "spec": {"ports": [{"name": "https", "port": 443, "targetPort": 8443}]}}))
        .expect("apply service");
    let kubeconfig = TempKubeconfig::new(&server.url());
    let client = client::client(Some(kubeconfig.path()))
        .await
        .expect("client from kubeconfig");
    let source = PodSource::new(client, NODE).with_timeout(Duration::from_secs(2));
    source.wait_synced(WAIT).await.expect("pod cache synced");
    Fixture {
        server,
        _kubeconfig: kubeconfig,
        source,
    }
}

async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < WAIT, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn gets_of(requests: &[RecordedRequest], path: &str) -> usize {
    requests
        .iter()
        .filter(|r| r.method == "GET" && r.path == path && !r.is_watch())
        .count()
}

fn pod_path(name: &str) -> String {
    format!("/api/v1/namespaces/{NS}/pods/{name}")
}

fn ports(list: &str) -> Vec<linkerd_cni_proto::config::PortRange> {
    parse_port_list(list).expect("test port list is valid")
}

#[tokio::test]
async fn cached_pod_is_decided_without_fetching_it() {
    let f = fixture().await;
    f.server
        .apply(&pod("web", NODE, MESHED, json!({})))
        .expect("apply pod");
    eventually("web is cached", || f.source.cached(NS, "web").is_some()).await;
    f.server.clear_requests();

    let (_, origin) = f.source.pod(NS, "web", None).await.expect("pod");
    assert_eq!(origin, PodOrigin::Cache);
    let d = f
        .source
        .decide(NS, "web", None, &LinkerdConfig::default())
        .await
        .expect("decide");
    assert!(d.redirect, "meshed pod not redirected: {}", d.reason);
    // The namespace's annotation was read (from the namespace cache) and appended.
    assert_eq!(d.config.inbound_ports_to_ignore, ports("4191,4190,22"));

    let requests = f.server.requests();
    assert_eq!(
        gets_of(&requests, &pod_path("web")),
        0,
        "pod fetched although cached: {requests:?}"
    );
    assert_eq!(
        gets_of(&requests, &format!("/api/v1/namespaces/{NS}")),
        0,
        "namespace fetched although cached: {requests:?}"
    );
    assert!(
        requests.iter().all(RecordedRequest::is_watch),
        "a cached decision made requests: {requests:?}"
    );
    // Two watches: the pods of this node, every namespace.
    let watches: Vec<_> = f
        .server
        .requests()
        .into_iter()
        .chain(requests)
        .filter(RecordedRequest::is_watch)
        .collect();
    assert!(
        watches.iter().all(|w| (w.path == "/api/v1/pods"
            && w.param("fieldSelector") == Some("spec.nodeName=node-a"))
            || (w.path == "/api/v1/namespaces" && w.param("fieldSelector").is_none())),
        "unexpected watches: {watches:?}"
    );
    assert_eq!(f.server.watches_open(), 2, "watches: {watches:?}");
}

#[tokio::test]
async fn namespace_annotation_change_reaches_the_cache() {
    let f = fixture().await;
    f.server
        .apply(&pod("web", NODE, MESHED, json!({})))
        .expect("apply pod");
    eventually("web is cached", || f.source.cached(NS, "web").is_some()).await;
    f.server
        .apply(&json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": NS, "annotations": {
                names::SKIP_INBOUND_PORTS_ANNOTATION: "2222",
                "unrelated.example.com/big": "x".repeat(4096)}}}))
        .expect("update namespace");
    let base = LinkerdConfig::default();
    let start = Instant::now();
    loop {
        let d = f
            .source
            .decide(NS, "web", None, &base)
            .await
            .expect("decide");
        if d.config.inbound_ports_to_ignore == ports("4191,4190,2222") {
            break;
        }
        assert!(start.elapsed() < WAIT, "namespace change never seen: {d:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (ns, origin) = f.source.namespace(NS).await.expect("namespace");
    assert_eq!(origin, NamespaceOrigin::Cache);
    // Only the overrides are kept.
    let kept: Vec<_> = ns
        .metadata
        .annotations
        .unwrap_or_default()
        .into_keys()
        .collect();
    assert_eq!(kept, [names::SKIP_INBOUND_PORTS_ANNOTATION]);
    let requests = f.server.requests();
    assert_eq!(
        gets_of(&requests, &format!("/api/v1/namespaces/{NS}")),
        0,
        "namespace fetched although cached: {requests:?}"
    );
}

#[tokio::test]
async fn uncached_namespace_is_fetched_directly() {
    let f = fixture().await;
    // The watch lags: the namespace and its pod exist, the caches do not know them yet.
    f.server.pause_watches(true);
    f.server
        .apply(&json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": "late", "annotations": {names::SKIP_OUTBOUND_PORTS_ANNOTATION: "5432"}}}))
        .expect("apply namespace");
    let mut late = pod("web", NODE, MESHED, json!({}));
    late["metadata"]["namespace"] = json!("late");
    f.server.apply(&late).expect("apply pod");
    tokio::time::sleep(Duration::from_millis(200)).await;
    f.server.clear_requests();
    let d = f
        .source
        .decide("late", "web", None, &LinkerdConfig::default())
        .await
        .expect("decide");
    assert_eq!(d.config.outbound_ports_to_ignore, ports("5432"));
    assert_eq!(
        gets_of(&f.server.requests(), "/api/v1/namespaces/late"),
        1,
        "namespace not fetched by GET"
    );
    f.server.pause_watches(false);
    let start = Instant::now();
    while f.source.namespace("late").await.expect("namespace").1 != NamespaceOrigin::Cache {
        assert!(start.elapsed() < WAIT, "namespace never cached");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn failed_namespace_watch_falls_back_to_gets_until_listed_again() {
    let f = fixture().await;
    let ns_path = format!("/api/v1/namespaces/{NS}");
    assert_eq!(
        f.source.namespace(NS).await.expect("namespace").1,
        NamespaceOrigin::Cache
    );
    // The namespace watch breaks (every request fails, open watches end), and listing
    // namespaces keeps failing after the rest of the API is back.
    f.server.fail_path("/api/v1/namespaces", Some(500));
    f.server.fail_requests(Some(500));
    // Until the source has seen its watch fail, the cache answers; once it has, it GETs, which
    // fails while every request does. (Waiting for that state, not for a time that an idle
    // machine happens to need.)
    let start = Instant::now();
    while f.source.namespace(NS).await.is_ok() {
        assert!(
            start.elapsed() < WAIT,
            "the namespace watch's failure never seen"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    f.server.fail_requests(None);
    f.server.clear_requests();
    let (_, origin) = f.source.namespace(NS).await.expect("namespace by GET");
    assert_eq!(
        origin,
        NamespaceOrigin::Get,
        "a failed watch's cache answered"
    );
    assert_eq!(gets_of(&f.server.requests(), &ns_path), 1);
    // Once the watch has listed again, the cache answers.
    f.server.fail_path("/api/v1/namespaces", None);
    let start = Instant::now();
    while f.source.namespace(NS).await.expect("namespace").1 != NamespaceOrigin::Cache {
        assert!(start.elapsed() < WAIT, "namespace cache never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn uncached_new_pod_is_fetched_directly() {
    let f = fixture().await;
    // The watch lags behind the kubelet: the pod exists, the cache does not know it yet.
    f.server.pause_watches(true);
    f.server
        .apply(&pod(
            "new",
            NODE,
            MESHED,
            json!({names::SKIP_OUTBOUND_PORTS_ANNOTATION: "3306"}),
        ))
        .expect("apply pod");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        f.source.cached(NS, "new").is_none(),
        "paused watch delivered the pod"
    );
    f.server.clear_requests();

    let d = f
        .source
        .decide(NS, "new", None, &LinkerdConfig::default())
        .await
        .expect("decide");
    assert!(d.redirect, "{}", d.reason);
    assert_eq!(d.config.outbound_ports_to_ignore, ports("3306"));
    assert_eq!(
        gets_of(&f.server.requests(), &pod_path("new")),
        1,
        "pod not fetched by GET"
    );

    f.server.pause_watches(false);
    eventually("the resumed watch caches the pod", || {
        f.source.cached(NS, "new").is_some()
    })
    .await;
    let (_, origin) = f.source.pod(NS, "new", None).await.expect("pod");
    assert_eq!(origin, PodOrigin::Cache);
}

#[tokio::test]
async fn pods_of_other_nodes_are_not_cached() {
    let f = fixture().await;
    f.server
        .apply(&pod("elsewhere", "node-b", MESHED, json!({})))
        .expect("apply pod b");
    f.server
        .apply(&pod("unscheduled", "", MESHED, json!({})))
        .expect("apply pod");
    f.server
        .apply(&pod("here", NODE, PLAIN, json!({})))
        .expect("apply pod a");
    // Events arrive in order: once "here" is cached, the others have been seen and dropped.
    eventually("here is cached", || f.source.cached(NS, "here").is_some()).await;
    assert!(
        f.source.cached(NS, "elsewhere").is_none(),
        "pod of node-b cached"
    );
    assert!(
        f.source.cached(NS, "unscheduled").is_none(),
        "unscheduled pod cached"
    );

    // Scheduling the pod onto this node brings it into the cache (ADDED for the watch).
    f.server
        .apply(&pod("unscheduled", NODE, MESHED, json!({})))
        .expect("bind pod");
    eventually("bound pod is cached", || {
        f.source.cached(NS, "unscheduled").is_some()
    })
    .await;
    // Moving a pod away removes it (DELETED for the watch).
    f.server
        .apply(&pod("here", "node-b", PLAIN, json!({})))
        .expect("move pod");
    eventually("moved pod leaves the cache", || {
        f.source.cached(NS, "here").is_none()
    })
    .await;

    // Deciding a pod that is not cached still works, by GET.
    let (_, origin) = f
        .source
        .pod(NS, "elsewhere", None)
        .await
        .expect("pod of node-b");
    assert_eq!(origin, PodOrigin::Get);
}

#[tokio::test]
async fn pod_update_is_seen_through_the_watch() {
    let f = fixture().await;
    f.server
        .apply(&pod("web", NODE, MESHED, json!({})))
        .expect("apply pod");
    eventually("web is cached", || f.source.cached(NS, "web").is_some()).await;
    let base = LinkerdConfig {
        outbound_ports_to_ignore: ports("25"),
        ..LinkerdConfig::default()
    };
    let before = f
        .source
        .decide(NS, "web", None, &base)
        .await
        .expect("decide");
    assert_eq!(before.config.outbound_ports_to_ignore, ports("25"));

    f.server.clear_requests();
    f.server
        .apply(&pod(
            "web",
            NODE,
            MESHED,
            json!({names::SKIP_OUTBOUND_PORTS_ANNOTATION: "5432"}),
        ))
        .expect("update pod");
    eventually("the update reaches the cache", || {
        f.source
            .cached(NS, "web")
            .and_then(|p| p.metadata.annotations.clone())
            .is_some_and(|a| a.contains_key(names::SKIP_OUTBOUND_PORTS_ANNOTATION))
    })
    .await;
    let after = f
        .source
        .decide(NS, "web", None, &base)
        .await
        .expect("decide");
    assert_eq!(after.config.outbound_ports_to_ignore, ports("5432"));
    assert_eq!(
        gets_of(&f.server.requests(), &pod_path("web")),
        0,
        "update read by GET, not from the watch"
    );

    // Deletion too.
    f.server.delete_pod(NS, "web").expect("delete");
    eventually("deleted pod leaves the cache", || {
        f.source.cached(NS, "web").is_none()
    })
    .await;
    let err = f
        .source
        .decide(NS, "web", None, &base)
        .await
        .expect_err("deleted pod decided");
    assert!(
        matches!(err, K8sError::NotFound { .. }),
        "unexpected error {err}"
    );
}

#[tokio::test]
async fn uid_guards_against_an_older_pod_of_the_same_name() {
    let f = fixture().await;
    let stored = f
        .server
        .apply(&pod("db-0", NODE, PLAIN, json!({})))
        .expect("apply pod");
    let old_uid = stored["metadata"]["uid"]
        .as_str()
        .expect("uid assigned")
        .to_string();
    eventually("db-0 is cached", || f.source.cached(NS, "db-0").is_some()).await;

    // Recreated (a StatefulSet pod), meshed this time; the watch has not caught up yet.
    f.server.pause_watches(true);
    f.server.delete_pod(NS, "db-0").expect("delete");
    let mut recreated = pod("db-0", NODE, MESHED, json!({}));
    recreated["metadata"]["uid"] = json!("11111111-2222-4333-8444-555555555555");
    f.server.apply(&recreated).expect("recreate pod");

    let stale = f
        .source
        .decide(NS, "db-0", None, &LinkerdConfig::default())
        .await
        .expect("decide");
    assert!(
        !stale.redirect,
        "without a uid the cached (old) pod is used"
    );
    let d = f
        .source
        .decide(
            NS,
            "db-0",
            Some("11111111-2222-4333-8444-555555555555"),
            &LinkerdConfig::default(),
        )
        .await
        .expect("decide with uid");
    assert!(
        d.redirect,
        "the recreated pod must be fetched: {}",
        d.reason
    );

    // Once the watch has caught up, the old pod's sandbox is refused: that pod is gone.
    f.server.pause_watches(false);
    eventually("the recreated pod is cached", || {
        f.source
            .cached(NS, "db-0")
            .is_some_and(|p| p.metadata.uid.as_deref() != Some(old_uid.as_str()))
    })
    .await;
    let err = f
        .source
        .decide(NS, "db-0", Some(&old_uid), &LinkerdConfig::default())
        .await
        .expect_err("stale uid");
    assert!(
        matches!(err, K8sError::PodReplaced { .. }) && err.is_transient(),
        "unexpected error {err}"
    );
}

#[tokio::test]
async fn control_plane_pods_skip_the_api_server_ports() {
    let f = fixture().await;
    let mut cp = pod("destination", NODE, MESHED, json!({}));
    cp["metadata"]["labels"] = json!({names::CONTROL_PLANE_COMPONENT_LABEL: "destination"});
    f.server.apply(&cp).expect("apply pod");
    let d = f
        .source
        .decide(NS, "destination", None, &LinkerdConfig::default())
        .await
        .expect("decide");
    assert_eq!(
        d.config.outbound_ports_to_ignore,
        ports("443,8443"),
        "{}",
        d.reason
    );

    // Service unreadable: 443 and 6443, and the decision still succeeds.
    f.server
        .delete("Service", Some("default"), "kubernetes")
        .expect("delete service");
    let d = f
        .source
        .decide(NS, "destination", None, &LinkerdConfig::default())
        .await
        .expect("decide");
    assert_eq!(
        d.config.outbound_ports_to_ignore,
        ports("443,6443"),
        "{}",
        d.reason
    );
}

#[tokio::test]
async fn malformed_annotation_fails_the_decision() {
    let f = fixture().await;
    f.server
        .apply(&pod(
            "bad",
            NODE,
            MESHED,
            json!({names::SKIP_SUBNETS_ANNOTATION: "10.0.0.0/99"}),
        ))
        .expect("apply pod");
    let err = f
        .source
        .decide(NS, "bad", None, &LinkerdConfig::default())
        .await
        .expect_err("malformed accepted");
    assert!(
        matches!(&err, K8sError::Annotation(e) if e.annotation == names::SKIP_SUBNETS_ANNOTATION)
            && !err.is_transient(),
        "unexpected error {err}"
    );
    assert!(
        err.to_string().contains(names::SKIP_SUBNETS_ANNOTATION),
        "message does not name the annotation: {err}"
    );
}

#[tokio::test]
async fn api_errors_fail_the_decision() {
    let f = fixture().await;
    f.server
        .apply(&pod("meshed", NODE, MESHED, json!({})))
        .expect("apply");
    f.server
        .apply(&pod("plain", NODE, PLAIN, json!({})))
        .expect("apply");
    // A meshed pod of a namespace the namespace cache does not hold (no Namespace object):
    // deciding it needs a namespace GET. (A namespace the cache holds needs no request at all.)
    let mut elsewhere = pod("meshed", NODE, MESHED, json!({}));
    elsewhere["metadata"]["namespace"] = json!(UNCACHED_NS);
    f.server.apply(&elsewhere).expect("apply");
    eventually("pods cached", || {
        f.source.cached(NS, "meshed").is_some()
            && f.source.cached(NS, "plain").is_some()
            && f.source.cached(UNCACHED_NS, "meshed").is_some()
    })
    .await;
    let base = LinkerdConfig::default();

    // The server answers errors.
    f.server.fail_requests(Some(500));
    let err = f
        .source
        .decide(NS, "uncached", None, &base)
        .await
        .expect_err("decided with a failing API");
    assert!(
        matches!(err, K8sError::Api { .. }) && err.is_transient(),
        "unexpected error {err}"
    );
    // A cached meshed pod whose namespace is not cached needs it from the API: that failure
    // fails the decision too.
    let err = f
        .source
        .decide(UNCACHED_NS, "meshed", None, &base)
        .await
        .expect_err("decided without its namespace");
    assert!(
        err.to_string()
            .contains(&format!("namespace {UNCACHED_NS}")),
        "unexpected error {err}"
    );
    f.server.fail_requests(None);

    // The server is gone.
    let Fixture {
        server,
        _kubeconfig,
        source,
    } = f;
    drop(server);
    let err = source
        .decide(NS, "uncached", None, &base)
        .await
        .expect_err("decided with the API down");
    assert!(err.is_transient(), "unexpected error {err}");
    let err = source
        .decide(UNCACHED_NS, "meshed", None, &base)
        .await
        .expect_err("meshed pod decided with the API down");
    assert!(err.is_transient(), "unexpected error {err}");
    // An unmeshed cached pod needs nothing from the API.
    let d = source
        .decide(NS, "plain", None, &base)
        .await
        .expect("plain pod from the cache");
    assert!(!d.redirect);
}

#[tokio::test]
async fn a_silent_api_server_times_out() {
    // Accepts connections (the kernel does) and never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", silent.local_addr().expect("addr"));
    let kubeconfig = TempKubeconfig::new(&url);
    let client = client::client(Some(kubeconfig.path()))
        .await
        .expect("client");
    let source = PodSource::new(client, NODE).with_timeout(Duration::from_millis(300));
    // The server never answers: only the source's own timeout ends the decision (`WAIT`, far
    // beyond it, only turns a hang into a failure).
    let err = tokio::time::timeout(
        WAIT,
        source.decide(NS, "web", None, &LinkerdConfig::default()),
    )
    .await
    .unwrap_or_else(|_| panic!("timeout not bounded: still waiting after {WAIT:?}"))
    .expect_err("decided without answer");
    assert!(
        matches!(err, K8sError::Timeout { .. }),
        "unexpected error {err}"
    );
}

#[tokio::test]
async fn client_configuration_errors() {
    let missing = std::env::temp_dir().join("linkerd-cni-k8s-test-no-such.kubeconfig");
    let Err(err) = client::client(Some(&missing)).await else {
        panic!("client from a missing kubeconfig")
    };
    let err = K8sError::from(err);
    assert!(
        matches!(err, K8sError::Client(ClientError::Kubeconfig { .. })) && !err.is_transient(),
        "unexpected error {err}"
    );
    // Not in a cluster: no KUBERNETES_SERVICE_HOST here.
    if std::env::var_os("KUBERNETES_SERVICE_HOST").is_none() {
        let Err(err) = client::client(None).await else {
            panic!("in-cluster client outside a cluster")
        };
        let err = K8sError::from(err);
        assert!(
            matches!(err, K8sError::Client(ClientError::InCluster(_))),
            "unexpected error {err}"
        );
    }
}

/// The fake server's list and watch semantics, as kube's typed API sees them.
#[tokio::test]
async fn fake_server_lists_and_watches_like_the_real_one() {
    let server = FakeApiServer::start().expect("start");
    let kubeconfig = TempKubeconfig::new(&server.url());
    let client = client::client(Some(kubeconfig.path()))
        .await
        .expect("client");
    let pods: Api<Pod> = Api::all(client.clone());
    let mut a = pod("a", NODE, PLAIN, json!({}));
    a["metadata"]["labels"] = json!({"app": "web", "tier": "front"});
    let mut b = pod("b", "node-b", PLAIN, json!({}));
    b["metadata"]["labels"] = json!({"app": "db"});
    server.apply(&a).expect("apply a");
    server.apply(&b).expect("apply b");

    let names = |l: kube::api::ObjectList<Pod>| {
        l.items
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .collect::<Vec<_>>()
    };
    #[rustfmt::skip]
    let cases = [
        (ListParams::default(), vec!["a", "b"]),
        (ListParams::default().fields("spec.nodeName=node-a"), vec!["a"]),
        (ListParams::default().fields("spec.nodeName!=node-a"), vec!["b"]),
        (ListParams::default().labels("app=db"), vec!["b"]),
        (ListParams::default().labels("app in (web,db),tier"), vec!["a"]),
        (ListParams::default().labels("!tier"), vec!["b"]),
        (ListParams::default().labels("app notin (web)"), vec!["b"]),
    ];
    for (params, want) in cases {
        let got = names(pods.list(&params).await.expect("list"));
        assert_eq!(
            got, want,
            "list with {:?} / {:?}",
            params.field_selector, params.label_selector
        );
    }

    // Watch from the list's resourceVersion, scoped to node-a.
    let rv = pods
        .list(&ListParams::default())
        .await
        .expect("list")
        .metadata
        .resource_version
        .expect("list rv");
    let mut events = pods
        .watch(
            &WatchParams::default()
                .fields("spec.nodeName=node-a")
                .timeout(10),
            &rv,
        )
        .await
        .expect("watch")
        .boxed();
    let mut next = async || -> (String, String) {
        let ev = tokio::time::timeout(WAIT, events.try_next())
            .await
            .expect("watch event in time")
            .expect("watch stream ok")
            .expect("watch stream open");
        match ev {
            WatchEvent::Added(p) => ("ADDED".into(), p.metadata.name.unwrap_or_default()),
            WatchEvent::Modified(p) => ("MODIFIED".into(), p.metadata.name.unwrap_or_default()),
            WatchEvent::Deleted(p) => ("DELETED".into(), p.metadata.name.unwrap_or_default()),
            other => panic!("unexpected event {other:?}"),
        }
    };
    server
        .apply(&pod("b", NODE, PLAIN, json!({})))
        .expect("move b here");
    assert_eq!(next().await, ("ADDED".into(), "b".into()));
    server
        .apply(&pod("c", "node-b", PLAIN, json!({})))
        .expect("pod elsewhere");
    server
        .apply(&pod("a", NODE, PLAIN, json!({"x": "1"})))
        .expect("modify a");
    assert_eq!(
        next().await,
        ("MODIFIED".into(), "a".into()),
        "pod of node-b leaked into the watch"
    );
    server
        .apply(&pod("a", "node-b", PLAIN, json!({"x": "1"})))
        .expect("move a away");
    assert_eq!(next().await, ("DELETED".into(), "a".into()));
    server.delete_pod(NS, "b").expect("delete b");
    assert_eq!(next().await, ("DELETED".into(), "b".into()));

    // Resuming from a compacted resourceVersion: 410 Gone.
    server.compact();
    let mut stale = pods
        .watch(&WatchParams::default(), &rv)
        .await
        .expect("watch")
        .boxed();
    match tokio::time::timeout(WAIT, stale.try_next())
        .await
        .expect("event in time")
    {
        Ok(Some(WatchEvent::Error(e))) => assert_eq!(e.code, 410, "{e:?}"),
        other => panic!("expected 410 Gone, got {other:?}"),
    }
    // And a plain GET of a missing object is a 404 Status kube understands.
    let err = Api::<Pod>::namespaced(client, NS)
        .get("nope")
        .await
        .expect_err("missing pod found");
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 404),
        "unexpected error {err}"
    );
}

/// A manifests directory drives the server (and through it the watch cache): files added,
/// changed, removed; a broken file changes nothing.
#[tokio::test]
async fn manifest_dir_changes_reach_the_cache() {
    let f = fixture().await;
    let dir = std::env::temp_dir().join(format!(
        "linkerd-cni-k8s-test-manifests-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).expect("create manifests dir");
    struct RemoveDir(PathBuf);
    impl Drop for RemoveDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _cleanup = RemoveDir(dir.clone());
    let yaml = |name: &str, annotations: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {NS}\n  annotations: {annotations}\n\
             spec:\n  nodeName: {NODE}\n  containers:\n  - name: linkerd-proxy\n    image: x\n"
        )
    };
    let write =
        |file: &str, text: &str| std::fs::write(dir.join(file), text).expect("write manifest");
    // Two documents in one YAML file, a `List` in a JSON file.
    write(
        "a.yaml",
        &format!("{}---\n{}", yaml("one", "{}"), yaml("two", "{}")),
    );
    let list = json!({"apiVersion": "v1", "kind": "List", "items": [pod("three", NODE, PLAIN, json!({}))]});
    write("b.json", &list.to_string());
    let mut manifests = fake_apiserver::ManifestDir::new(&dir);
    let report = manifests.sync(&f.server).expect("sync");
    assert_eq!((report.objects, report.deleted), (3, 0));
    eventually("manifest pods cached", || {
        ["one", "two", "three"]
            .iter()
            .all(|n| f.source.cached(NS, n).is_some())
    })
    .await;

    // Unchanged directory: no new resourceVersion.
    let rv = f.server.resource_version();
    manifests.sync(&f.server).expect("resync");
    assert_eq!(
        f.server.resource_version(),
        rv,
        "an unchanged directory produced changes"
    );

    // Change one document, drop another by removing its file.
    write(
        "a.yaml",
        &yaml("one", "{config.linkerd.io/skip-outbound-ports: '7000'}"),
    );
    std::fs::remove_file(dir.join("b.json")).expect("remove manifest");
    let report = manifests.sync(&f.server).expect("sync changes");
    assert_eq!((report.objects, report.deleted), (1, 2));
    eventually("removed manifests leave the cache", || {
        f.source.cached(NS, "two").is_none() && f.source.cached(NS, "three").is_none()
    })
    .await;
    eventually("changed manifest reaches the cache", || {
        f.source
            .cached(NS, "one")
            .and_then(|p| p.metadata.annotations.clone())
            .is_some_and(|a| {
                a.get(names::SKIP_OUTBOUND_PORTS_ANNOTATION)
                    .map(String::as_str)
                    == Some("7000")
            })
    })
    .await;

    // A broken file: error, and nothing is deleted.
    write("c.yaml", "kind: Pod\nmetadata: [not, a, map\n");
    let rv = f.server.resource_version();
    let err = manifests
        .sync(&f.server)
        .expect_err("broken manifest accepted");
    assert!(
        err.to_string().contains("c.yaml"),
        "error does not name the file: {err}"
    );
    assert_eq!(
        f.server.resource_version(),
        rv,
        "a failed sync changed objects"
    );
    assert!(f.server.get("Pod", Some(NS), "one").expect("get").is_some());
}

#[tokio::test]
async fn pod_watch_failure_keeps_the_cache_until_a_relist_replaces_it() {
    let f = fixture().await;
    for name in ["stays", "goes"] {
        f.server
            .apply(&pod(name, NODE, MESHED, json!({})))
            .expect("apply pod");
    }
    eventually("both pods are cached", || {
        f.source.cached(NS, "stays").is_some() && f.source.cached(NS, "goes").is_some()
    })
    .await;
    // The watch breaks, and the history it would resume from is gone (410): it must list
    // again. Meanwhile one pod is deleted and another created.
    f.server.pause_watches(true);
    f.server.fail_requests(Some(500));
    f.server.delete_pod(NS, "goes").expect("delete pod");
    f.server
        .apply(&pod("new", NODE, MESHED, json!({})))
        .expect("apply pod");
    f.server.compact();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        f.source.cached(NS, "stays").is_some() && f.source.cached(NS, "goes").is_some(),
        "the cache keeps its last state while the watch fails"
    );
    f.server.fail_requests(None);
    f.server.pause_watches(false);
    eventually("the relist replaced the cache", || {
        f.source.cached(NS, "new").is_some() && f.source.cached(NS, "goes").is_none()
    })
    .await;
    let (pod, origin) = f.source.pod(NS, "stays", None).await.expect("pod");
    assert_eq!(origin, PodOrigin::Cache);
    assert!(linkerd_cni_k8s::decision::wants_redirect(&pod));
    let listed = f.source.cached_pods();
    let mut names: Vec<&str> = listed.iter().map(|p| &*p.name).collect();
    names.sort_unstable();
    assert_eq!(names, ["new", "stays"]);
}
