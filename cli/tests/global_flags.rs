//! The flags Linkerd's CLI takes on every command (`-L/--linkerd-namespace`,
//! `--cni-namespace`, `--as`, `--as-group`) and `linkerd version`, against the fake API server
//! (the production kube client, through a kubeconfig).

mod support;

use std::collections::BTreeMap;

use serde_json::{Value as Json, json};
use support::{fake_api::FakeApi, *};

fn linkerd_config(ns: &str, version: &str) -> (String, Json) {
    (
        format!("/api/v1/namespaces/{ns}/configmaps/linkerd-config"),
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "linkerd-config", "namespace": ns},
            "data": {"values": format!("cniEnabled: true\nlinkerdVersion: {version}\n")},
        }),
    )
}

fn run(args: &[&str]) -> (bool, String, String) {
    let out = linkerd(args, &[]);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const CLIENT: &str = concat!("v", env!("CARGO_PKG_VERSION"));

/// `linkerd version`: the client's version, and the control plane's from linkerd-config in
/// the `-L` namespace ("unavailable" when it cannot be read), `--short`, `--client`, and
/// `--proxy` (the proxy image tags of the meshed pods).
#[test]
fn version_reads_the_control_plane_of_the_linkerd_namespace() {
    let (ok, out, err) = run(&["version", "--client"]);
    assert!(ok, "{err}");
    assert_eq!(out, format!("Client version: {CLIENT}\n"));
    let (ok, out, _) = run(&["version", "--client", "--short"]);
    assert!(ok);
    assert_eq!(out, format!("{CLIENT}\n"));

    let pod = |name: &str, image: &str| {
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "app", "labels": {"linkerd.io/control-plane-ns": "linkerd"}},
            "spec": {"containers": [{"name": "app", "image": "app:1"}, {"name": "linkerd-proxy", "image": image}]}})
    };
    let api = FakeApi::start(BTreeMap::from([
        linkerd_config("linkerd", "stable-2.14.10"),
        linkerd_config("mesh", "edge-25.1.1"),
        (
            "/api/v1/pods".to_string(),
            json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1"}, "items": [
                pod("a", "cr.l5d.io/linkerd/proxy:stable-2.14.10"),
                pod("b", "cr.l5d.io/linkerd/proxy:stable-2.14.10"),
                pod("c", "localhost:5000/proxy:dev"),
            ]}),
        ),
    ]));
    let kubeconfig = api.kubeconfig("kubeconfig-version");
    let k = kubeconfig.to_str().expect("path");
    let (ok, out, err) = run(&["version", "--kubeconfig", k]);
    assert!(ok, "{err}");
    assert_eq!(
        out,
        format!("Client version: {CLIENT}\nServer version: stable-2.14.10\n")
    );
    let (_, out, _) = run(&["-L", "mesh", "version", "--short", "--kubeconfig", k]);
    assert_eq!(out, format!("{CLIENT}\nedge-25.1.1\n"));
    assert!(
        api.requested()
            .contains(&"/api/v1/namespaces/mesh/configmaps/linkerd-config".to_string()),
        "{:?}",
        api.requested()
    );
    let (_, out, _) = run(&["version", "--proxy", "--kubeconfig", k]);
    assert_eq!(
        out,
        format!(
            "Client version: {CLIENT}\nServer version: stable-2.14.10\nProxy versions:\n\
             \tdev (1 pods)\n\tstable-2.14.10 (2 pods)\n"
        )
    );
    // No linkerd-config there: unavailable, and still a success, as in Linkerd.
    let (ok, out, _) = run(&["version", "--linkerd-namespace=nothing", "--kubeconfig", k]);
    assert!(ok);
    assert_eq!(
        out,
        format!("Client version: {CLIENT}\nServer version: unavailable\n")
    );
    // No cluster at all.
    let (ok, out, _) = run(&["version", "--kubeconfig", "/nonexistent/kubeconfig"]);
    assert!(ok);
    assert_eq!(
        out,
        format!("Client version: {CLIENT}\nServer version: unavailable\n")
    );
}

/// `-L` and `--cni-namespace` go before or after the subcommand, and the checks read there;
/// `LINKERD_NAMESPACE` stands for `-L`, as in Linkerd; a namespace that is not one is refused
/// with Linkerd's message.
#[test]
fn namespaces_are_global_flags() {
    let api = FakeApi::start(BTreeMap::new());
    let kubeconfig = api.kubeconfig("kubeconfig-namespaces");
    let k = kubeconfig.to_str().expect("path");
    let _ = run(&["-L", "mesh", "check", "--wait=0s", "--kubeconfig", k]);
    let _ = run(&[
        "check",
        "--pre",
        "--linkerd-cni-enabled",
        "--wait=0s",
        "--cni-namespace",
        "cni-system",
        "--kubeconfig",
        k,
    ]);
    let out = linkerd(
        &["version", "--kubeconfig", k],
        &[("LINKERD_NAMESPACE", "from-env")],
    );
    assert!(out.status.success());
    let asked = api.requested();
    for path in [
        "/api/v1/namespaces/mesh/configmaps/linkerd-config",
        "/api/v1/namespaces/cni-system/configmaps/linkerd-cni-config",
        "/apis/apps/v1/namespaces/cni-system/daemonsets/linkerd-cni",
        "/api/v1/namespaces/from-env/configmaps/linkerd-config",
    ] {
        assert!(
            asked.iter().any(|p| p == path),
            "never asked {path}: {asked:?}"
        );
    }
    let (ok, _, err) = run(&["-L", "not a namespace", "version", "--client"]);
    assert!(!ok);
    assert!(
        err.contains("not a namespace is not a valid namespace"),
        "{err}"
    );
}

/// `linkerd -L mesh install` renders the control plane into `mesh`, as Linkerd's does: every
/// namespaced object, the Namespace, the control-plane-ns labels, the webhook's Service, the
/// injector's `--control-plane-namespace` and the certificate's names; and it asks the cluster
/// about a control plane in `mesh`.
#[test]
fn install_renders_into_the_linkerd_namespace() {
    for extra in [vec![], vec!["--cert-manager-issuer", "issuer"]] {
        let mut args = vec!["-L", "mesh", "install", "--ignore-cluster"];
        args.extend(extra.iter().copied());
        let (ok, out, err) = run(&args);
        assert!(ok, "{err}");
        let docs = docs(&out);
        let mut leaves_all = BTreeMap::new();
        for d in &docs {
            leaves(&key(d), d, &mut leaves_all);
        }
        for (path, value) in &leaves_all {
            let about_namespace = path.ends_with("/namespace")
                || path.ends_with("/linkerd.io~1control-plane-ns")
                || path.ends_with("/linkerd.io/control-plane-ns");
            if about_namespace {
                assert_eq!(value, &json!("mesh"), "{extra:?}: {path}");
            }
        }
        let ns = docs
            .iter()
            .find(|d| d["kind"] == "Namespace")
            .expect("Namespace");
        assert_eq!(ns["metadata"]["name"], "mesh");
        let deployment = docs
            .iter()
            .find(|d| d["kind"] == "Deployment")
            .expect("the injector");
        assert!(
            deployment
                .to_string()
                .contains("--control-plane-namespace=mesh"),
            "{deployment}"
        );
        let webhook = docs
            .iter()
            .find(|d| d["kind"] == "MutatingWebhookConfiguration")
            .expect("webhook");
        assert_eq!(
            webhook["webhooks"][0]["clientConfig"]["service"]["namespace"],
            "mesh"
        );
        if let Some(cert) = docs.iter().find(|d| d["kind"] == "Certificate") {
            assert!(
                cert["spec"]["dnsNames"]
                    .as_array()
                    .expect("dnsNames")
                    .contains(&json!("linkerd-proxy-injector.mesh.svc")),
                "{cert}"
            );
            assert_eq!(
                webhook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
                "mesh/linkerd-proxy-injector"
            );
        }
    }
    let api = FakeApi::start(BTreeMap::new());
    let kubeconfig = api.kubeconfig("kubeconfig-install-mesh");
    let (ok, _, err) = run(&[
        "install",
        "-L",
        "mesh",
        "--kubeconfig",
        kubeconfig.to_str().expect("path"),
    ]);
    assert!(ok, "{err}");
    assert!(
        api.requested()
            .contains(&"/api/v1/namespaces/mesh/configmaps/linkerd-config".to_string()),
        "{:?}",
        api.requested()
    );
}

/// `--as` and `--as-group` are refused wherever the cluster is asked, with the way to get the
/// same from the kubeconfig; and that way works: the client sends the impersonation headers
/// of the kubeconfig user's `as` and `as-groups`.
#[test]
fn impersonation_comes_from_the_kubeconfig() {
    let api = FakeApi::start(BTreeMap::from([linkerd_config(
        "linkerd",
        "stable-2.14.10",
    )]));
    let kubeconfig = api.kubeconfig("kubeconfig-as");
    let k = kubeconfig.to_str().expect("path");
    const WHY: &str = "--as and --as-group are not supported by this CLI: set the impersonation on \
                       the kubeconfig's user instead";
    for args in [
        vec!["--as", "jane", "version", "--kubeconfig", k],
        vec!["version", "--as-group", "devs", "--kubeconfig", k],
        vec!["--as", "jane", "check", "--wait=0s", "--kubeconfig", k],
        vec!["--as", "jane", "install", "--kubeconfig", k],
    ] {
        let (_, out, err) = run(&args);
        assert!(
            out.contains(WHY) || err.contains(WHY),
            "{args:?}:\n{out}\n{err}"
        );
    }
    assert_eq!(
        api.requested(),
        Vec::<String>::new(),
        "nothing is asked as someone else"
    );
    // Where nothing is asked of the cluster, the flag changes nothing.
    let (ok, out, _) = run(&["--as", "jane", "version", "--client"]);
    assert!(ok && out.starts_with("Client version:"));

    let server = LocalHttp::start(vec![]);
    let with_as = linkerd_cni_fake_apiserver::kubeconfig(&server.url("")).replace(
        "  user: {}",
        "  user:\n    as: jane\n    as-groups: [devs, ops]",
    );
    let kubeconfig = temp_file("kubeconfig-with-as", &with_as);
    let (ok, out, _) = run(&[
        "version",
        "--kubeconfig",
        kubeconfig.to_str().expect("path"),
    ]);
    assert!(
        ok && out.ends_with("Server version: unavailable\n"),
        "{out}"
    );
    let heads = server.heads.lock().expect("heads").clone();
    let head = heads
        .iter()
        .find(|h| h.contains("/configmaps/linkerd-config"))
        .unwrap_or_else(|| panic!("no request for linkerd-config: {heads:?}"))
        .to_ascii_lowercase();
    for header in [
        "impersonate-user: jane",
        "impersonate-group: devs",
        "impersonate-group: ops",
    ] {
        assert!(head.contains(header), "{header} missing:\n{head}");
    }
}
