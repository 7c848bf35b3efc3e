//! `linkerd install`, `linkerd inject`/`uninject` and the post-install `linkerd check`, run as
//! the built binary: renders validated with `kubernetes-validate --strict`, `inject --manual`
//! and `check` reading the cluster from a fake API server (through a kubeconfig, with the
//! production client).

mod support;

use std::{
    collections::BTreeMap,
    io::Write,
    process::{Command, Stdio},
};

use serde_json::{Value as Json, json};
use support::{docs, fake_api::FakeApi, kubernetes_validate, temp_file};

const WORKLOADS: &str = "\
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: emojivoto}
spec:
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: web, image: 'web:1', ports: [{containerPort: 8080}]}]
---
apiVersion: v1
kind: Pod
metadata: {name: tool, namespace: emojivoto, annotations: {config.linkerd.io/skip-outbound-ports: '5432'}}
spec:
  containers: [{name: tool, image: 'tool:1'}]
";

fn run(args: &[&str], stdin: &str) -> (bool, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_linkerd"));
    cmd.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, _) in std::env::vars() {
        if k.starts_with("LINKERD_") || k == "KUBECONFIG" {
            cmd.env_remove(k);
        }
    }
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("running linkerd {args:?}: {e}"));
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("writing stdin");
    let out = child.wait_with_output().expect("waiting for linkerd");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

fn ok(args: &[&str], stdin: &str) -> String {
    let (success, stdout, stderr) = run(args, stdin);
    assert!(success, "linkerd {args:?} failed: {stderr}");
    stdout
}

fn validate(name: &str, yaml: &str) {
    let file = temp_file(name, yaml);
    let out = kubernetes_validate("1.34.0", &file);
    assert!(
        out.status.success(),
        "{name} fails kubernetes-validate --strict:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn find<'a>(objs: &'a [Json], kind: &str) -> &'a Json {
    objs.iter()
        .find(|o| o["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in the render"))
}

/// Names of the pod template's init containers and containers, per workload.
fn containers(yaml: &str) -> Vec<Vec<String>> {
    docs(yaml)
        .iter()
        .map(|d| {
            let spec = if d["kind"] == "Pod" {
                &d["spec"]
            } else {
                &d["spec"]["template"]["spec"]
            };
            ["initContainers", "containers"]
                .iter()
                .flat_map(|f| spec[f].as_array().cloned().unwrap_or_default())
                .map(|c| c["name"].as_str().expect("container name").to_string())
                .collect()
        })
        .collect()
}

#[test]
fn install_renders_the_cni_enabled_control_plane() {
    for (flags, cni, psa) in [
        (&[][..], false, "privileged"),
        (&["--linkerd-cni-enabled"][..], true, "restricted"),
    ] {
        let mut args = vec!["install", "--ignore-cluster"];
        args.extend_from_slice(flags);
        let yaml = ok(&args, "");
        let objs = docs(&yaml);
        assert_eq!(
            find(&objs, "Namespace")["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
            psa,
            "{flags:?}"
        );
        let values: Json = serde_yaml_ng::from_str(
            find(&objs, "ConfigMap")["data"]["values"]
                .as_str()
                .expect("values"),
        )
        .expect("values YAML");
        assert_eq!(values["cniEnabled"], cni, "{flags:?}");
        assert_eq!(values["proxy"]["uid"], 2102);
        assert_eq!(
            values["proxy"]["ports"],
            json!({"admin": 4191, "control": 4190, "inbound": 4143, "outbound": 4140})
        );
        let mwc = find(&objs, "MutatingWebhookConfiguration");
        assert_eq!(
            mwc["metadata"]["name"],
            "linkerd-proxy-injector-webhook-config"
        );
        let wh = &mwc["webhooks"][0];
        assert_eq!(wh["failurePolicy"], "Ignore");
        assert_eq!(
            wh["namespaceSelector"],
            json!({"matchExpressions": [
                {"key": "config.linkerd.io/admission-webhooks", "operator": "NotIn", "values": ["disabled"]},
                {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", "cert-manager"]},
            ]})
        );
        assert_eq!(wh["rules"][0]["operations"], json!(["CREATE"]));
        assert_eq!(wh["rules"][0]["resources"], json!(["pods"]));
        let ca = wh["clientConfig"]["caBundle"].as_str().expect("caBundle");
        assert_eq!(
            ca,
            find(&objs, "Secret")["data"]["ca.crt"],
            "caBundle is the Secret's CA"
        );
        assert_eq!(
            find(&objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["command"],
            json!(["linkerd-proxy-injector"])
        );
        validate(&format!("install-cni-{cni}.yaml"), &yaml);
    }
    // Two renders generate two different CAs.
    let a = docs(&ok(&["install", "--ignore-cluster"], ""));
    let b = docs(&ok(&["install", "--ignore-cluster"], ""));
    assert_ne!(
        find(&a, "Secret")["data"]["ca.crt"],
        find(&b, "Secret")["data"]["ca.crt"]
    );

    let yaml = ok(
        &[
            "install",
            "--ignore-cluster",
            "--linkerd-cni-enabled",
            "--cert-manager-issuer",
            "webhook-ca",
            "--cert-manager-issuer-kind",
            "ClusterIssuer",
            "--webhook-failure-policy",
            "Fail",
        ],
        "",
    );
    let objs = docs(&yaml);
    assert!(
        objs.iter().all(|o| o["kind"] != "Secret"),
        "cert-manager issues the Secret"
    );
    let mwc = find(&objs, "MutatingWebhookConfiguration");
    assert_eq!(
        mwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        "linkerd/linkerd-proxy-injector"
    );
    assert_eq!(mwc["webhooks"][0]["failurePolicy"], "Fail");
    assert_eq!(
        find(&objs, "Certificate")["spec"]["issuerRef"],
        json!({"name": "webhook-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"})
    );
    // The Certificate is a CRD the validator has no schema for; everything else must pass.
    let builtin: Vec<Json> = objs
        .into_iter()
        .filter(|o| o["kind"] != "Certificate")
        .collect();
    let stream: String = builtin
        .iter()
        .map(|o| format!("---\n{}", serde_yaml_ng::to_string(o).expect("YAML")))
        .collect();
    validate("install-cert-manager.yaml", &stream);
}

fn config_map(cni: bool) -> Json {
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "linkerd-config", "namespace": "linkerd"},
        "data": {"values": format!("cniEnabled: {cni}\nproxy:\n  uid: 2102\n")},
    })
}

#[test]
fn inject_annotates_or_injects_following_cni_enabled() {
    // Annotation only: nothing else changes, no cluster needed.
    let out = ok(&["inject", "-"], WORKLOADS);
    let annotated = docs(&out);
    assert_eq!(
        annotated[0]["spec"]["template"]["metadata"]["annotations"]["linkerd.io/inject"],
        "enabled"
    );
    assert_eq!(
        annotated[1]["metadata"]["annotations"]["linkerd.io/inject"],
        "enabled"
    );
    assert_eq!(containers(&out), [vec!["web"], vec!["tool"]]);

    // --manual with the cluster's linkerd-config, the flag, or the defaults.
    let file = temp_file("workloads.yaml", WORKLOADS);
    let file = file.to_str().expect("path");
    for cluster_cni in [false, true] {
        let api = FakeApi::start(BTreeMap::from([(
            "/api/v1/namespaces/linkerd/configmaps/linkerd-config".to_string(),
            config_map(cluster_cni),
        )]));
        let kubeconfig = api.kubeconfig(&format!("kubeconfig-inject-{cluster_cni}"));
        let kubeconfig = kubeconfig.to_str().expect("path");
        let cases: Vec<(Vec<&str>, bool)> = vec![
            (
                vec!["inject", "--manual", "--kubeconfig", kubeconfig, file],
                cluster_cni,
            ),
            (
                vec![
                    "inject",
                    "--manual",
                    "--linkerd-cni-enabled",
                    "--kubeconfig",
                    kubeconfig,
                    file,
                ],
                true,
            ),
            (vec!["inject", "--manual", "--ignore-cluster", file], false),
            (
                vec![
                    "inject",
                    "--manual",
                    "--ignore-cluster",
                    "--linkerd-cni-enabled",
                    file,
                ],
                true,
            ),
        ];
        for (args, cni) in cases {
            let out = ok(&args, "");
            let first = if cni {
                "linkerd-network-validator"
            } else {
                "linkerd-init"
            };
            assert_eq!(
                containers(&out),
                [
                    vec![first, "linkerd-proxy", "web"],
                    vec![first, "linkerd-proxy", "tool"]
                ],
                "{args:?} (cluster cniEnabled: {cluster_cni})"
            );
            assert_eq!(out.contains("NET_ADMIN"), !cni, "{args:?}");
            validate("injected.yaml", &out);
            // uninject gives the original objects back.
            assert_eq!(
                docs(&ok(&["uninject", "-"], &out)),
                docs(WORKLOADS),
                "{args:?}"
            );
        }
        assert!(
            api.requested()
                .iter()
                .any(|p| p == "/api/v1/namespaces/linkerd/configmaps/linkerd-config"),
            "linkerd-config was read from the cluster: {:?}",
            api.requested()
        );
    }
    // The skip annotation reached linkerd-init.
    let out = ok(&["inject", "--manual", "--ignore-cluster", file], "");
    let pod = &docs(&out)[1];
    let args = pod["spec"]["initContainers"][0]["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().unwrap_or_default())
        .collect::<Vec<_>>();
    let i = args
        .iter()
        .position(|a| *a == "--outbound-ports-to-ignore")
        .expect("outbound ignore flag");
    assert_eq!(args[i + 1], "5432");

    // No cluster and no --ignore-cluster: a clear error.
    let (success, _, stderr) = run(
        &[
            "inject",
            "--manual",
            "--kubeconfig",
            "/nonexistent/kubeconfig",
            file,
        ],
        "",
    );
    assert!(!success && stderr.contains("--ignore-cluster"), "{stderr}");
}

#[test]
fn inject_reads_directories_and_reports_per_workload() {
    let dir = temp_file("inject-dir-marker", "")
        .parent()
        .expect("temp dir")
        .join("inject-dir");
    std::fs::create_dir_all(dir.join("nested")).expect("create dir");
    std::fs::write(dir.join("a.yaml"), WORKLOADS).expect("write a");
    std::fs::write(dir.join("nested/b.json"), r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"host"},"spec":{"hostNetwork":true,"containers":[{"name":"h","image":"h"}]}}"#).expect("write b");
    std::fs::write(dir.join("notes.txt"), "not a manifest").expect("write notes");
    let (success, stdout, stderr) = run(&["inject", dir.to_str().expect("path")], "");
    assert!(success, "{stderr}");
    assert_eq!(
        docs(&stdout).len(),
        3,
        "two documents from a.yaml, one from nested/b.json, notes.txt ignored"
    );
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines[..2], ["deployment/web injected", "pod/tool injected"]);
    assert!(
        lines[2].starts_with("pod/host skipped: pods with hostNetwork"),
        "{stderr}"
    );
}

fn api_path(o: &Json) -> String {
    let kind = o["kind"].as_str().expect("kind");
    let name = o["metadata"]["name"].as_str().expect("name");
    let ns = o["metadata"]["namespace"].as_str().unwrap_or("");
    match kind {
        "Namespace" => format!("/api/v1/namespaces/{name}"),
        "ConfigMap" | "Secret" | "ServiceAccount" | "Service" => {
            format!("/api/v1/namespaces/{ns}/{}s/{name}", kind.to_lowercase())
        }
        "Deployment" | "DaemonSet" => format!(
            "/apis/apps/v1/namespaces/{ns}/{}s/{name}",
            kind.to_lowercase()
        ),
        "ClusterRole" | "ClusterRoleBinding" => format!(
            "/apis/rbac.authorization.k8s.io/v1/{}s/{name}",
            kind.to_lowercase()
        ),
        "Role" | "RoleBinding" => format!(
            "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/{}s/{name}",
            kind.to_lowercase()
        ),
        "MutatingWebhookConfiguration"
        | "ValidatingAdmissionPolicy"
        | "ValidatingAdmissionPolicyBinding" => format!(
            "/apis/admissionregistration.k8s.io/v1/{}s/{name}",
            kind.to_lowercase()
        ),
        other => panic!("no path for {other}"),
    }
}

fn cluster(cni: bool, pods: Vec<Json>) -> BTreeMap<String, Json> {
    let mut routes = BTreeMap::new();
    let install = if cni {
        ok(
            &["install", "--ignore-cluster", "--linkerd-cni-enabled"],
            "",
        )
    } else {
        ok(&["install", "--ignore-cluster"], "")
    };
    let install_cni = ok(&["install-cni"], "");
    for mut o in docs(&install).into_iter().chain(docs(&install_cni)) {
        match o["kind"].as_str() {
            Some("Deployment") => {
                o["status"] = json!({"replicas": 1, "availableReplicas": 1, "readyReplicas": 1})
            }
            Some("DaemonSet") => {
                o["status"] = json!({"desiredNumberScheduled": 2, "numberReady": 2, "currentNumberScheduled": 2, "numberMisscheduled": 0})
            }
            _ => {}
        }
        routes.insert(api_path(&o), o);
    }
    routes.insert("/api/v1/pods".into(), json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1"}, "items": pods}));
    routes
}

fn injected_pod(name: &str, cni: bool) -> Json {
    let pod = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: app}}\nspec: {{containers: [{{name: app, image: 'app:1'}}]}}\n"
    );
    let mut args = vec!["inject", "--manual", "--ignore-cluster", "-"];
    if cni {
        args.insert(3, "--linkerd-cni-enabled");
    }
    docs(&ok(&args, &pod)).remove(0)
}

fn marks(stdout: &str) -> BTreeMap<String, char> {
    stdout
        .lines()
        .filter_map(|l| {
            let mut chars = l.chars();
            let mark = chars.next()?;
            matches!(mark, '√' | '×').then(|| {
                (
                    chars
                        .as_str()
                        .trim()
                        .split(" (")
                        .next()
                        .unwrap_or("")
                        .to_string(),
                    mark,
                )
            })
        })
        .collect()
}

#[test]
fn post_install_check_honours_cni_enabled() {
    // cniEnabled: true, the CNI installed and ready, one pod injected before CNI was enabled.
    let api = FakeApi::start(cluster(
        true,
        vec![injected_pod("fresh", true), injected_pod("stale", false)],
    ));
    let kubeconfig = api.kubeconfig("kubeconfig-check-cni");
    let (success, stdout, stderr) = run(
        &[
            "check",
            "--proxy",
            "--kubeconfig",
            kubeconfig.to_str().expect("path"),
        ],
        "",
    );
    let m = marks(&stdout);
    for check in [
        "control plane Namespace exists",
        "control plane MutatingWebhookConfigurations exist",
        "'linkerd-config' config map exists",
        "proxy injector webhook has a caBundle",
        "proxy injector is available",
        "cni plugin DaemonSet exists",
        "cni plugin ServiceAccount exists",
        "cni plugin pod is running on all nodes",
        "control plane namespace enforces Pod Security restricted",
        "network validators succeeded",
    ] {
        assert_eq!(m.get(check), Some(&'√'), "{check}:\n{stdout}{stderr}");
    }
    assert!(
        stdout.contains("'linkerd-config' config map exists (cniEnabled: true)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("no meshed pod carries linkerd-init (warning:")
            && stdout.contains("app/stale"),
        "{stdout}"
    );
    assert!(success, "warnings do not fail the check: {stdout}{stderr}");

    // cniEnabled: false: the CNI checks are skipped, not run.
    let api = FakeApi::start(cluster(false, vec![injected_pod("plain", false)]));
    let kubeconfig = api.kubeconfig("kubeconfig-check-plain");
    let (success, stdout, stderr) = run(
        &["check", "--kubeconfig", kubeconfig.to_str().expect("path")],
        "",
    );
    assert!(success, "{stdout}{stderr}");
    assert!(
        stdout.contains("linkerd-cni checks (skipped: cniEnabled is false"),
        "{stdout}"
    );
    assert!(!stdout.contains("cni plugin DaemonSet"), "{stdout}");
    assert!(
        !stdout.contains("linkerd-data-plane"),
        "data-plane checks only with --proxy: {stdout}"
    );
    assert!(
        !api.requested().iter().any(|p| p.contains("linkerd-cni")),
        "no CNI object read: {:?}",
        api.requested()
    );

    // Nothing installed: the check fails.
    let api = FakeApi::start(BTreeMap::new());
    let kubeconfig = api.kubeconfig("kubeconfig-check-empty");
    let (success, stdout, _) = run(
        &["check", "--kubeconfig", kubeconfig.to_str().expect("path")],
        "",
    );
    assert!(!success, "{stdout}");
    assert_eq!(
        marks(&stdout).get("'linkerd-config' config map exists"),
        Some(&'×'),
        "{stdout}"
    );
}

/// `linkerd check -o json` after install: the checks that are Linkerd's carry Linkerd's
/// category and description, so scripts written for Linkerd's output find them: the
/// linkerd-cni category holds Linkerd's six checks, in Linkerd's order, named exactly as the
/// pre-install check names them (then this project's own); with cniEnabled false the category is absent (Linkerd skips
/// its checks silently).
#[test]
fn post_install_json_uses_linkerds_names() {
    let api = FakeApi::start(cluster(true, vec![injected_pod("fresh", true)]));
    let kubeconfig = api.kubeconfig("kubeconfig-check-json");
    let (success, stdout, stderr) = run(
        &[
            "check",
            "-o",
            "json",
            "--kubeconfig",
            kubeconfig.to_str().expect("path"),
        ],
        "",
    );
    assert!(success, "{stdout}{stderr}");
    let doc: Json = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    let category = |name: &str| -> Vec<(String, String)> {
        doc["categories"]
            .as_array()
            .expect("categories")
            .iter()
            .filter(|c| c["categoryName"] == name)
            .flat_map(|c| c["checks"].as_array().cloned().unwrap_or_default())
            .map(|c| {
                (
                    c["description"].as_str().unwrap_or("").to_string(),
                    c["result"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect()
    };
    let ok = |names: &[&str]| -> Vec<(String, String)> {
        names
            .iter()
            .map(|n| (n.to_string(), "success".to_string()))
            .collect()
    };
    assert_eq!(
        category("linkerd-cni-plugin"),
        ok(&[
            "cni plugin ConfigMap exists",
            "cni plugin ClusterRole exists",
            "cni plugin ClusterRoleBinding exists",
            "cni plugin ServiceAccount exists",
            "cni plugin DaemonSet exists",
            "cni plugin namespace allows privileged pods",
            "cni plugin pod is running on all nodes",
            // This project's own, after Linkerd's: no agent's Event says a meshed pod runs
            // without redirection.
            "no meshed pod runs without redirection",
        ])
    );
    assert_eq!(
        category("linkerd-existence"),
        ok(&["'linkerd-config' config map exists"])
    );
    assert_eq!(
        category("linkerd-config")[..2],
        ok(&[
            "control plane Namespace exists",
            "control plane MutatingWebhookConfigurations exist"
        ])[..]
    );

    let api = FakeApi::start(cluster(false, vec![]));
    let kubeconfig = api.kubeconfig("kubeconfig-check-json-plain");
    let (success, stdout, stderr) = run(
        &[
            "check",
            "--output=json",
            "--kubeconfig",
            kubeconfig.to_str().expect("path"),
        ],
        "",
    );
    assert!(success, "{stdout}{stderr}");
    let doc: Json = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert!(
        doc["categories"]
            .as_array()
            .expect("categories")
            .iter()
            .all(|c| c["categoryName"] != "linkerd-cni-plugin"),
        "{doc:#}"
    );
}

/// `linkerd install | kubectl apply -f - && linkerd check`: while the injector's Deployment
/// has no available replica yet (and nothing else fails), the post-install checks are run
/// again every 5 seconds, as Linkerd's are, until it has one.
#[test]
fn post_install_check_waits_for_the_injector() {
    const INJECTOR: &str = "/apis/apps/v1/namespaces/linkerd/deployments/linkerd-proxy-injector";
    let routes = cluster(true, vec![injected_pod("fresh", true)]);
    let ready = routes[INJECTOR].clone();
    let mut starting = ready.clone();
    starting["status"] = json!({"replicas": 1, "unavailableReplicas": 1});
    let api = FakeApi::start(routes);
    api.server().route_sequence(INJECTOR, vec![starting, ready]);
    let kubeconfig = api.kubeconfig("kubeconfig-check-wait");
    let started = std::time::Instant::now();
    let (success, stdout, stderr) = run(
        &["check", "--kubeconfig", kubeconfig.to_str().expect("path")],
        "",
    );
    let took = started.elapsed();
    assert!(success, "{stdout}{stderr}");
    assert_eq!(
        marks(&stdout).get("proxy injector is available"),
        Some(&'√'),
        "{stdout}"
    );
    // Read twice, five seconds apart at least (a busy machine only adds to it; success says
    // the second read came before the deadline).
    assert_eq!(api.server().hits(INJECTOR), 2);
    assert!(took >= std::time::Duration::from_secs(5), "took {took:?}");

    // With --wait=0s it is read once and reported.
    let routes = cluster(true, vec![injected_pod("fresh", true)]);
    let mut starting = routes[INJECTOR].clone();
    starting["status"] = json!({"replicas": 1, "unavailableReplicas": 1});
    let api = FakeApi::start(routes);
    api.server().route(INJECTOR, starting);
    let kubeconfig = api.kubeconfig("kubeconfig-check-nowait");
    let (success, stdout, _) = run(
        &[
            "check",
            "--wait=0s",
            "--kubeconfig",
            kubeconfig.to_str().expect("path"),
        ],
        "",
    );
    assert!(!success, "{stdout}");
    assert_eq!(api.server().hits(INJECTOR), 1);
}

/// `linkerd install` asks the cluster first, as Linkerd's does: it refuses (printing nothing)
/// when a control plane's `linkerd-config`, injector Deployment or webhook configuration is
/// there, so it never prints what would overwrite a real Linkerd's; it renders on an empty
/// cluster, and with --ignore-cluster without asking.
#[test]
fn install_refuses_an_existing_control_plane() {
    const CONFIG: &str = "/api/v1/namespaces/linkerd/configmaps/linkerd-config";
    const INJECTOR: &str = "/apis/apps/v1/namespaces/linkerd/deployments/linkerd-proxy-injector";
    const WEBHOOK: &str = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/linkerd-proxy-injector-webhook-config";
    // Linkerd's own linkerd-config, as its CLI installs it.
    let real_config = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {
            "name": "linkerd-config", "namespace": "linkerd",
            "labels": {"linkerd.io/control-plane-component": "controller", "linkerd.io/control-plane-ns": "linkerd"},
            "annotations": {"linkerd.io/created-by": "linkerd/cli edge-25.1.1"},
        },
        "data": {"values": "cniEnabled: false\n"},
    });
    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "linkerd-proxy-injector", "namespace": "linkerd"}});
    let webhook = json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "linkerd-proxy-injector-webhook-config"}});
    let install = |api: &FakeApi, name: &str, extra: &[&str]| {
        let kubeconfig = api.kubeconfig(name).display().to_string();
        let mut args = vec![
            "install",
            "--linkerd-cni-enabled",
            "--kubeconfig",
            &kubeconfig,
        ];
        args.extend_from_slice(extra);
        run(&args, "")
    };

    type Case = (&'static str, Vec<(&'static str, Json)>, &'static str);
    let cases: Vec<Case> = vec![
        (
            "linkerd-config",
            vec![(CONFIG, real_config.clone())],
            "Reason: ConfigMap/linkerd-config already exists",
        ),
        (
            "injector",
            vec![(INJECTOR, deployment.clone())],
            "Reason: Deployment/linkerd-proxy-injector already exists",
        ),
        (
            "webhook",
            vec![(WEBHOOK, webhook.clone())],
            "Reason: MutatingWebhookConfiguration/linkerd-proxy-injector-webhook-config already exists",
        ),
        (
            "everything",
            vec![
                (CONFIG, real_config.clone()),
                (INJECTOR, deployment),
                (WEBHOOK, webhook),
            ],
            "Reason: ConfigMap/linkerd-config, Deployment/linkerd-proxy-injector, \
             MutatingWebhookConfiguration/linkerd-proxy-injector-webhook-config already exists",
        ),
    ];
    for (case, routes, want) in cases {
        let api = FakeApi::start(
            routes
                .into_iter()
                .map(|(p, b)| (p.to_string(), b))
                .collect(),
        );
        let (success, stdout, stderr) = install(&api, &format!("kubeconfig-install-{case}"), &[]);
        assert!(!success, "{case}: install must refuse");
        assert!(stdout.is_empty(), "{case}: printed manifests:\n{stdout}");
        assert!(
            stderr.contains("Can't install the Linkerd control plane in the 'linkerd' namespace.")
                && stderr.contains(want)
                && stderr.contains("linkerd upgrade --linkerd-cni-enabled"),
            "{case}: {stderr}"
        );
    }

    // An empty cluster: asked, then rendered.
    let api = FakeApi::start(BTreeMap::new());
    let (success, stdout, stderr) = install(&api, "kubeconfig-install-empty", &[]);
    assert!(success, "{stderr}");
    assert!(
        docs(&stdout)
            .iter()
            .any(|o| o["kind"] == "MutatingWebhookConfiguration")
    );
    let asked = api.requested();
    for path in [CONFIG, INJECTOR, WEBHOOK] {
        assert!(
            asked.iter().any(|p| p == path),
            "never asked {path}: {asked:?}"
        );
    }

    // --ignore-cluster renders without asking, as Linkerd's.
    let api = FakeApi::start(BTreeMap::from([(CONFIG.to_string(), real_config)]));
    let (success, stdout, _) = install(&api, "kubeconfig-install-ignore", &["--ignore-cluster"]);
    assert!(success && !stdout.is_empty());
    assert_eq!(api.requested(), Vec::<String>::new());

    // No cluster to ask: Linkerd's message, pointing at --ignore-cluster.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let dead = temp_file(
        "kubeconfig-install-dead",
        &linkerd_cni_fake_apiserver::kubeconfig(&format!("http://127.0.0.1:{port}")),
    );
    let (success, stdout, stderr) = run(
        &[
            "install",
            "--api-timeout=2",
            "--kubeconfig",
            &dead.display().to_string(),
        ],
        "",
    );
    assert!(!success && stdout.is_empty());
    assert!(
        stderr.contains("Cannot connect to the Kubernetes cluster")
            && stderr.contains("--ignore-cluster"),
        "{stderr}"
    );
}
