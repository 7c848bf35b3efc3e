//! `linkerd check`: the cluster checks against a fake API server (with the production client,
//! through a kubeconfig), and the node checks for real on this machine.

mod support;

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use serde_json::{Value as Json, json};
use support::{fake_api::FakeApi, *};

const NS: &str = "/api/v1/namespaces/linkerd-cni";

fn meta(kind: &str, api_version: &str, name: &str, namespaced: bool) -> Json {
    let mut m = json!({"name": name, "labels": {"linkerd.io/cni-resource": "true"}});
    if namespaced {
        m["namespace"] = json!("linkerd-cni");
    }
    json!({"kind": kind, "apiVersion": api_version, "metadata": m})
}

fn daemonset(desired: i32, ready: i32) -> Json {
    let mut ds = meta("DaemonSet", "apps/v1", "linkerd-cni", true);
    ds["spec"] = json!({"selector": {"matchLabels": {"k8s-app": "linkerd-cni"}}, "template": {"spec": {"containers": []}}});
    ds["status"] = json!({
        "currentNumberScheduled": desired, "desiredNumberScheduled": desired,
        "numberMisscheduled": 0, "numberReady": ready
    });
    ds
}

/// A healthy installation, by API path.
fn healthy() -> BTreeMap<String, Json> {
    let mut cm = meta("ConfigMap", "v1", "linkerd-cni-config", true);
    cm["data"] = json!({"dest_cni_net_dir": "/etc/cni/net.d"});
    [
        (format!("{NS}/configmaps/linkerd-cni-config"), cm),
        (format!("{NS}/serviceaccounts/linkerd-cni"), meta("ServiceAccount", "v1", "linkerd-cni", true)),
        (
            "/apis/rbac.authorization.k8s.io/v1/clusterroles/linkerd-cni".to_string(),
            meta("ClusterRole", "rbac.authorization.k8s.io/v1", "linkerd-cni", false),
        ),
        ("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/linkerd-cni".to_string(), {
            let mut b = meta("ClusterRoleBinding", "rbac.authorization.k8s.io/v1", "linkerd-cni", false);
            b["roleRef"] = json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "linkerd-cni"});
            b
        }),
        ("/apis/apps/v1/namespaces/linkerd-cni/daemonsets/linkerd-cni".to_string(), daemonset(3, 3)),
        (NS.to_string(), cni_namespace(Some("privileged"))),
    ]
    .into_iter()
    .collect()
}

const CHECKS: [&str; 8] = [
    "cni plugin ConfigMap exists",
    "cni plugin ClusterRole exists",
    "cni plugin ClusterRoleBinding exists",
    "cni plugin ServiceAccount exists",
    "cni plugin DaemonSet exists",
    "cni plugin namespace allows privileged pods",
    "cni plugin pod is running on all nodes",
    // This project's own: no agent's Event says a meshed pod runs without redirection.
    "no meshed pod runs without redirection",
];

/// The CNI namespace, with its Pod Security label (`None`: no label).
fn cni_namespace(enforce: Option<&str>) -> Json {
    let mut ns = meta("Namespace", "v1", "linkerd-cni", false);
    if let Some(level) = enforce {
        ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] = json!(level);
    }
    ns
}

/// The mark (√ or ×) printed for each check, by name.
fn marks(stdout: &str) -> BTreeMap<String, char> {
    stdout
        .lines()
        .filter_map(|l| {
            let mut chars = l.chars();
            let mark = chars.next()?;
            (mark == '√' || mark == '×').then(|| {
                let rest = chars.as_str().trim();
                let name = rest.split(" (").next().unwrap_or(rest);
                (name.to_string(), mark)
            })
        })
        .collect()
}

#[test]
fn cluster_checks_against_a_fake_api_server() {
    let without = |path: &str| {
        let mut r = healthy();
        assert!(r.remove(path).is_some(), "no route {path}");
        r
    };
    let with_ns = |enforce| {
        let mut r = healthy();
        r.insert(NS.into(), cni_namespace(enforce));
        r
    };
    let with_ds = |desired, ready| {
        let mut r = healthy();
        r.insert(
            "/apis/apps/v1/namespaces/linkerd-cni/daemonsets/linkerd-cni".into(),
            daemonset(desired, ready),
        );
        r
    };
    // (case, routes, the checks expected to fail)
    let cases: Vec<(&str, BTreeMap<String, Json>, Vec<&str>)> = vec![
        ("healthy", healthy(), vec![]),
        (
            "no ConfigMap",
            without(&format!("{NS}/configmaps/linkerd-cni-config")),
            vec![CHECKS[0]],
        ),
        (
            "no ClusterRole",
            without("/apis/rbac.authorization.k8s.io/v1/clusterroles/linkerd-cni"),
            vec![CHECKS[1]],
        ),
        (
            "no ClusterRoleBinding",
            without("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/linkerd-cni"),
            vec![CHECKS[2]],
        ),
        (
            "no ServiceAccount",
            without(&format!("{NS}/serviceaccounts/linkerd-cni")),
            vec![CHECKS[3]],
        ),
        (
            "no DaemonSet",
            without("/apis/apps/v1/namespaces/linkerd-cni/daemonsets/linkerd-cni"),
            vec![CHECKS[4], CHECKS[6]],
        ),
        ("one pod not ready", with_ds(3, 2), vec![CHECKS[6]]),
        // Issue 36: a namespace that refuses the DaemonSet's pod fails, naming the label.
        (
            "namespace enforces baseline",
            with_ns(Some("baseline")),
            vec![CHECKS[5]],
        ),
        ("no namespace", without(NS), vec![CHECKS[5]]),
        // No label: the cluster's default applies; a warning, not a failure.
        ("namespace without a level", with_ns(None), vec![]),
        // Scheduled on no node (no node matches): nothing to wait for, as in Linkerd.
        ("not scheduled anywhere", with_ds(0, 0), vec![]),
        // Nothing installed: no agent, so no Event says a pod runs unredirected.
        ("nothing installed", BTreeMap::new(), CHECKS[..7].to_vec()),
    ];
    for (case, routes, failing) in cases {
        let api = FakeApi::start(routes);
        let kubeconfig = api.kubeconfig(&format!("kubeconfig-{}", case.replace(' ', "-")));
        let out = linkerd(
            &[
                "check",
                "--pre",
                "--linkerd-cni-enabled",
                "--wait=0s",
                "--kubeconfig",
                &kubeconfig.display().to_string(),
            ],
            &[],
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let got = marks(&stdout);
        let want: BTreeMap<String, char> = CHECKS
            .iter()
            .map(|c| (c.to_string(), if failing.contains(c) { '×' } else { '√' }))
            .collect();
        assert_eq!(
            got,
            want,
            "{case}: output\n{stdout}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            out.status.success(),
            failing.is_empty(),
            "{case}: exit status {:?}",
            out.status
        );
        let summary = if failing.is_empty() {
            "Status check results are √"
        } else {
            "Status check results are ×"
        };
        assert!(stdout.contains(summary), "{case}: {stdout}");
        // The client really asked the server for each object.
        let asked = api.requested();
        for path in healthy().keys() {
            assert!(
                asked.contains(path),
                "{case}: never requested {path}; asked {asked:?}"
            );
        }
    }
}

#[test]
fn readiness_detail_and_kubeconfig_env() {
    let mut routes = healthy();
    routes.insert(
        "/apis/apps/v1/namespaces/linkerd-cni/daemonsets/linkerd-cni".into(),
        daemonset(3, 1),
    );
    let api = FakeApi::start(routes);
    let kubeconfig = api.kubeconfig("kubeconfig-env");
    // KUBECONFIG from the environment, as kubectl reads it.
    let out = linkerd(
        &["check", "--pre", "--linkerd-cni-enabled"],
        &[
            ("KUBECONFIG", &kubeconfig.display().to_string()),
            ("LINKERD_CHECK_WAIT", "0"),
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("× cni plugin pod is running on all nodes"),
        "{stdout}"
    );
    assert!(
        stdout.contains("1 of 3 linkerd-cni pods are ready"),
        "{stdout}"
    );
    assert!(!out.status.success());
}

#[test]
fn unreachable_api_fails_every_check() {
    // A port nobody listens on: take one and close it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let kubeconfig = temp_file(
        "kubeconfig-dead",
        &format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:{port}\n\
             contexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\nusers:\n- name: u\n  user: {{}}\n"
        ),
    );
    let out = linkerd(
        &[
            "check",
            "--pre",
            "--linkerd-cni-enabled",
            "--api-timeout=2",
            "--kubeconfig",
            &kubeconfig.display().to_string(),
        ],
        &[],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        marks(&stdout).values().all(|m| *m == '×') && marks(&stdout).len() == CHECKS.len(),
        "{stdout}"
    );
    assert!(!out.status.success());
}

const DS_PATH: &str = "/apis/apps/v1/namespaces/linkerd-cni/daemonsets/linkerd-cni";

/// A DaemonSet as the API server shows it: `generation` 1, the controller's view in `status`
/// (`observed: None` is a DaemonSet the controller has not looked at yet).
fn daemonset_at(observed: Option<i64>, desired: i32, ready: i32) -> Json {
    let mut ds = daemonset(desired, ready);
    ds["metadata"]["generation"] = json!(1);
    if let Some(g) = observed {
        ds["status"]["observedGeneration"] = json!(g);
    }
    ds
}

fn check_cni(api: &FakeApi, name: &str, extra: &[&str]) -> (std::process::Output, Duration) {
    let kubeconfig = api.kubeconfig(name);
    let kubeconfig = kubeconfig.display().to_string();
    let mut args = vec![
        "check",
        "--pre",
        "--linkerd-cni-enabled",
        "--kubeconfig",
        &kubeconfig,
    ];
    args.extend_from_slice(extra);
    let started = Instant::now();
    let out = linkerd(&args, &[]);
    (out, started.elapsed())
}

/// `kubectl apply` then `linkerd check --pre --linkerd-cni-enabled`: the DaemonSet is fresh
/// (not yet seen by its controller), then scheduled but not ready, then ready. With the
/// default --wait the readiness check is retried every 5 seconds (Linkerd's interval) and
/// the command succeeds once the DaemonSet is ready.
#[test]
fn wait_retries_until_a_fresh_daemonset_is_ready() {
    let api = FakeApi::start(healthy());
    api.server().route_sequence(
        DS_PATH,
        vec![
            daemonset_at(None, 0, 0),
            daemonset_at(Some(1), 2, 0),
            daemonset_at(Some(1), 2, 2),
        ],
    );
    let (out, took) = check_cni(&api, "kubeconfig-wait", &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(marks(&stdout).get(CHECKS[6]), Some(&'√'), "{stdout}");
    assert!(stdout.contains("(2/2 nodes)"), "{stdout}");
    // Three reads of the DaemonSet (exists + two retries), five seconds apart (at least: a
    // busy machine only adds to it; success says the last one came before the deadline).
    assert_eq!(api.server().hits(DS_PATH), 3, "{:?}", api.requested());
    assert!(took >= Duration::from_secs(10), "took {took:?}");
}

/// An API server that fails while the readiness check is retried: the failed read is one
/// more failed attempt, retried like the others.
#[test]
fn wait_retries_through_api_errors() {
    let api = FakeApi::start(healthy());
    api.server().route_sequence(
        DS_PATH,
        vec![daemonset_at(Some(1), 2, 1), daemonset_at(Some(1), 2, 2)],
    );
    let kubeconfig = api.kubeconfig("kubeconfig-api-errors");
    let mut child = linkerd_command(
        &[
            "check",
            "--pre",
            "--linkerd-cni-enabled",
            "--kubeconfig",
            &kubeconfig.display().to_string(),
        ],
        &[],
    )
    .stdout(std::process::Stdio::piped())
    .spawn()
    .expect("starting linkerd check");
    // After the first read (not ready), and during the 5 s pause before the next one, the
    // server starts failing the DaemonSet's path for one request.
    // (The minute only turns a hang into a failure; a busy machine is nowhere near it.)
    let started = Instant::now();
    while api.server().hits(DS_PATH) < 1 {
        if let Some(status) = child.try_wait().expect("linkerd check") {
            panic!("linkerd check ended ({status}) without reading the DaemonSet");
        }
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("linkerd check never read the DaemonSet");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    api.server().fail_path_times(DS_PATH, 500, 1);
    let out = child.wait_with_output().expect("linkerd check");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    // Not ready, failed, ready: three reads.
    assert_eq!(api.server().hits(DS_PATH), 3, "{stdout}");
}

/// A DaemonSet that never gets ready: retried until --wait runs out, then reported with the
/// last reason; with --wait=0s it is read once.
#[test]
fn wait_gives_up_at_its_deadline() {
    let mut routes = healthy();
    routes.insert(DS_PATH.into(), daemonset_at(Some(1), 2, 1));
    let api = FakeApi::start(routes);
    let (out, took) = check_cni(&api, "kubeconfig-deadline", &["--wait=1s"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    assert_eq!(marks(&stdout).get(CHECKS[6]), Some(&'×'), "{stdout}");
    assert!(
        stdout.contains("1 of 2 linkerd-cni pods are ready"),
        "{stdout}"
    );
    assert!(
        stdout.contains("see https://linkerd.io/2/checks/#cni-plugin-ready for hints"),
        "{stdout}"
    );
    // The deadline runs from the command's start, as Linkerd's does. Read once before it
    // (retried) and once after the 5 s pause (past it: reported), never a third time; on a
    // machine so busy that the checks before this one outlast the 1 s, the first read is
    // already past the deadline and is reported at once. Every read after the first follows
    // a whole pause.
    let hits = api.server().hits(DS_PATH);
    assert!((1..=2).contains(&hits), "{hits} reads: {stdout}");
    assert!(
        took >= Duration::from_secs(5) * (hits as u32 - 1),
        "{hits} reads in {took:?}"
    );

    // Read once: every pause is followed by a read, so one read means no pause (however long
    // a busy machine takes to run the command).
    api.server().clear_requests();
    let (out, _) = check_cni(&api, "kubeconfig-deadline", &["--wait", "0"]);
    assert!(!out.status.success());
    assert_eq!(api.server().hits(DS_PATH), 1);

    // A missing object is not waited for (Linkerd retries only the readiness), even with the
    // default --wait of five minutes.
    let mut routes = healthy();
    routes.remove(&format!("{NS}/configmaps/linkerd-cni-config"));
    routes.insert(DS_PATH.into(), daemonset_at(Some(1), 2, 1));
    let api = FakeApi::start(routes);
    let (out, _) = check_cni(&api, "kubeconfig-missing", &[]);
    assert!(!out.status.success());
    assert_eq!(api.server().hits(DS_PATH), 1);
}

/// `-o json`: Linkerd's document (success, categories with their checks' description,
/// result, error and hint), nothing else on stdout.
#[test]
fn json_output_has_linkerds_shape() {
    let mut routes = healthy();
    routes.remove("/apis/rbac.authorization.k8s.io/v1/clusterroles/linkerd-cni");
    let api = FakeApi::start(routes);
    let (out, _) = check_cni(&api, "kubeconfig-json", &["-o", "json", "--wait=0s"]);
    assert!(!out.status.success());
    let doc: Json = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not one JSON document ({e}):\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    let checks: Vec<Json> = CHECKS
        .iter()
        .map(|c| {
            if *c == CHECKS[1] {
                json!({
                    "description": c,
                    "result": "error",
                    "error": "ClusterRole \"linkerd-cni\" not found",
                    "hint": "https://linkerd.io/2/checks/#cni-plugin-cr-exists",
                })
            } else {
                json!({"description": c, "result": "success"})
            }
        })
        .collect();
    assert_eq!(
        doc,
        json!({
            "success": false,
            "categories": [{"categoryName": "linkerd-cni-plugin", "checks": checks}],
        })
    );

    let api = FakeApi::start(healthy());
    let (out, _) = check_cni(&api, "kubeconfig-json-ok", &["--output=json"]);
    assert!(out.status.success());
    let doc: Json = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(doc["success"], true);
    assert_eq!(
        doc["categories"][0]["checks"].as_array().map(Vec::len),
        Some(CHECKS.len())
    );

    // short: only what did not pass.
    let mut routes = healthy();
    routes.insert(DS_PATH.into(), daemonset(3, 2));
    let api = FakeApi::start(routes);
    let (out, _) = check_cni(&api, "kubeconfig-short", &["-o", "short", "--wait=0s"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        marks(&stdout),
        BTreeMap::from([(CHECKS[6].to_string(), '×')]),
        "{stdout}"
    );
}

/// Linkerd's flag rules: --linkerd-cni-enabled only with --pre, --pre not with --proxy; an
/// unknown output format is refused. Nothing is asked of the cluster.
#[test]
fn flag_rules_are_linkerds() {
    let api = FakeApi::start(healthy());
    let kubeconfig = api.kubeconfig("kubeconfig-rules");
    let kubeconfig = kubeconfig.display().to_string();
    for (args, want) in [
        (
            vec!["check", "--linkerd-cni-enabled"],
            "--linkerd-cni-enabled can only be used with --pre",
        ),
        (
            vec!["check", "--linkerd-cni-enabled", "--node"],
            "--linkerd-cni-enabled can only be used with --pre",
        ),
        (
            vec!["check", "--pre", "--proxy"],
            "--pre and --proxy flags are mutually exclusive",
        ),
        (vec!["check", "-o", "yaml"], "invalid value 'yaml'"),
        (vec!["check", "--wait", "5"], "invalid duration"),
    ] {
        let mut all = args.clone();
        all.extend(["--kubeconfig", &kubeconfig]);
        let out = linkerd(&all, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(stderr.contains(want), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    assert_eq!(api.requested(), Vec::<String>::new());
}

/// Issue 37: `--pre` alone runs Linkerd's pre-install checks that read the cluster, under
/// Linkerd's names (no more "nothing to check"); the control plane namespace must not exist.
#[test]
fn pre_alone_runs_linkerds_pre_install_checks() {
    const PRE: [&str; 4] = [
        "can initialize the client",
        "can query the Kubernetes API",
        "is running the minimum Kubernetes API version",
        "control plane namespace does not already exist",
    ];
    for (case, routes, failing) in [
        ("empty cluster", BTreeMap::new(), vec![]),
        (
            "linkerd installed",
            BTreeMap::from([(
                "/api/v1/namespaces/linkerd".to_string(),
                json!({"kind": "Namespace", "apiVersion": "v1", "metadata": {"name": "linkerd"}}),
            )]),
            vec![PRE[3]],
        ),
    ] {
        let api = FakeApi::start(routes);
        let kubeconfig = api.kubeconfig(&format!("kubeconfig-pre-{}", case.replace(' ', "-")));
        let out = linkerd(
            &[
                "check",
                "--pre",
                "--kubeconfig",
                &kubeconfig.display().to_string(),
            ],
            &[],
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let want: BTreeMap<String, char> = PRE
            .iter()
            .map(|c| (c.to_string(), if failing.contains(c) { '×' } else { '√' }))
            .collect();
        assert_eq!(marks(&stdout), want, "{case}:\n{stdout}");
        for category in [
            "kubernetes-api",
            "kubernetes-version",
            "pre-kubernetes-setup",
        ] {
            assert!(stdout.contains(category), "{case}: {category}\n{stdout}");
        }
        assert_eq!(out.status.success(), failing.is_empty(), "{case}");
        if !failing.is_empty() {
            assert!(
                stdout.contains("The \"linkerd\" namespace already exists"),
                "{stdout}"
            );
        }
    }
}

fn statfs_type(path: &str) -> i64 {
    let c = std::ffi::CString::new(path).expect("path without NUL");
    // SAFETY: `c` is a valid C string and `buf` a valid statfs buffer for the call.
    let mut buf: libc::statfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statfs(c.as_ptr(), &mut buf) };
    assert_eq!(rc, 0, "statfs {path}: {}", std::io::Error::last_os_error());
    #[allow(
        clippy::unnecessary_cast,
        reason = "f_type's width differs between libcs"
    )]
    let t = buf.f_type as i64;
    t
}

/// The node checks on this machine: the kernel release printed is uname's with every feature
/// present (the probes, run as root as the suite is), and the cgroup2
/// (and bpffs, when mounted) paths printed really are those filesystems.
#[test]
fn node_checks_on_this_machine() {
    const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
    const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

    let out = linkerd(&["check", "--node"], &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    // SAFETY: uname fills the zeroed struct; its fields are NUL-terminated strings.
    let mut uts: libc::utsname = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::uname(&mut uts) }, 0);
    let release = unsafe { std::ffi::CStr::from_ptr(uts.release.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    assert!(
        stdout.contains(&format!(
            "({release}: every feature present; sk_lookup program: l5d_sk_lookup ("
        )),
        "kernel {release} not reported with every feature:\n{stdout}"
    );

    let cgroup_line = stdout
        .lines()
        .find(|l| l.contains("cgroup v2 is mounted"))
        .expect("a cgroup v2 line");
    assert!(
        cgroup_line.starts_with('√'),
        "this machine has cgroup v2 (testing guide): {cgroup_line}"
    );
    let at = cgroup_line
        .rsplit_once("(at ")
        .and_then(|(_, r)| r.strip_suffix(')'))
        .expect("the mount point");
    assert_eq!(
        statfs_type(at),
        CGROUP2_SUPER_MAGIC,
        "{at} is not a cgroup2 filesystem"
    );

    let bpf_line = stdout
        .lines()
        .find(|l| l.contains("bpffs is mounted or mountable"))
        .expect("a bpffs line");
    assert!(
        bpf_line.starts_with('√'),
        "this kernel supports bpffs: {bpf_line}"
    );
    if let Some((_, r)) = bpf_line.rsplit_once("(mounted at ") {
        let at = r.strip_suffix(')').expect("closing paren");
        assert_eq!(statfs_type(at), BPF_FS_MAGIC, "{at} is not bpffs");
    }
    assert!(out.status.success(), "{stdout}");
}

/// The cluster-wide check of redirection reads the Events the node agents record (written
/// here by the agent's own recorder, `linkerd_cni_k8s::events`, to the fake API server):
/// a meshed pod whose latest Event is `LinkerdCNIUnredirected` is listed with its node and
/// reason, and the command fails; once the agent records `LinkerdCNIRedirected` on it, the
/// check passes and so does the command. A pod deleted since is not listed.
#[test]
fn unredirected_pods_are_listed_from_the_agents_events() {
    use linkerd_cni_k8s::events::{EventRecorder, PodRef, Reason};
    use std::sync::atomic::Ordering;

    const CHECK: &str = CHECKS[7];
    let api = FakeApi::start(healthy());
    let pod = |name: &str| {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": "shop", "uid": format!("uid-{name}")},
               "spec": {"nodeName": "node-1", "containers": [{"name": "app"}, {"name": "linkerd-proxy"}]},
               "status": {"phase": "Running", "podIPs": [{"ip": "10.0.0.9"}]}})
    };
    for name in ["web", "api"] {
        api.server().apply(&pod(name)).expect("pod");
    }
    let kubeconfig = api.kubeconfig("kubeconfig-redirection");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let record = |events: &[(&str, Reason, &str)]| {
        rt.block_on(async {
            let client = linkerd_cni_k8s::client::client(Some(&kubeconfig))
                .await
                .expect("client");
            let recorder = EventRecorder::spawn(client, "node-1");
            for (name, reason, note) in events {
                let pod = PodRef::new("shop", *name, Some(format!("uid-{name}")));
                recorder.record(&pod, *reason, *note);
            }
            let start = Instant::now();
            while recorder.stats().created.load(Ordering::Relaxed) < events.len() as u64 {
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "Events not created: {:?}",
                    recorder.stats()
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    let check = |case: &str| {
        let (out, _) = check_cni(&api, "kubeconfig-redirection-check", &["--wait", "0s"]);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        println!("{case}:\n{stdout}");
        (out.status.code(), stdout)
    };

    // No Event yet: nothing to list.
    let (code, stdout) = check("no Event");
    assert_eq!(
        (code, marks(&stdout).get(CHECK)),
        (Some(0), Some(&'√')),
        "{stdout}"
    );

    record(&[
        (
            "web",
            Reason::Unredirected,
            "no CNI ADD of its sandbox reached the agent",
        ),
        ("api", Reason::Redirected, "attached"),
        (
            "gone",
            Reason::Unredirected,
            "no CNI ADD of its sandbox reached the agent",
        ),
    ]);
    let (code, stdout) = check("web unredirected");
    assert_eq!(code, Some(1), "the command fails: {stdout}");
    assert_eq!(marks(&stdout).get(CHECK), Some(&'×'), "{stdout}");
    assert!(
        stdout.contains("shop/web on node node-1: no CNI ADD of its sandbox reached the agent"),
        "the pod, its node and the reason: {stdout}"
    );
    assert!(
        !stdout.contains("shop/api") && !stdout.contains("shop/gone"),
        "redirected and deleted pods are not listed: {stdout}"
    );

    // The agent says it is redirected now: the latest Event wins.
    std::thread::sleep(Duration::from_millis(5));
    record(&[(
        "web",
        Reason::Redirected,
        "redirected now (was: unregistered)",
    )]);
    let (code, stdout) = check("web redirected again");
    assert_eq!(
        (code, marks(&stdout).get(CHECK)),
        (Some(0), Some(&'√')),
        "{stdout}"
    );
}
