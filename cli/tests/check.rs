//! `linkerd check`: the cluster checks against a fake API server (with the production client,
//! through a kubeconfig), and the node checks for real on this machine.

mod support;

use std::collections::BTreeMap;

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
    ]
    .into_iter()
    .collect()
}

const CHECKS: [&str; 6] = [
    "cni plugin ConfigMap exists",
    "cni plugin ClusterRole exists",
    "cni plugin ClusterRoleBinding exists",
    "cni plugin ServiceAccount exists",
    "cni plugin DaemonSet exists",
    "cni plugin pod is running on all nodes",
];

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
            vec![CHECKS[4], CHECKS[5]],
        ),
        ("one pod not ready", with_ds(3, 2), vec![CHECKS[5]]),
        ("not scheduled anywhere", with_ds(0, 0), vec![CHECKS[5]]),
        ("nothing installed", BTreeMap::new(), CHECKS.to_vec()),
    ];
    for (case, routes, failing) in cases {
        let api = FakeApi::start(routes);
        let kubeconfig = api.kubeconfig(&format!("kubeconfig-{}", case.replace(' ', "-")));
        let out = linkerd(
            &[
                "check",
                "--pre",
                "--linkerd-cni-enabled",
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
        &[("KUBECONFIG", &kubeconfig.display().to_string())],
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

#[test]
fn nothing_to_check_is_an_error() {
    let out = linkerd(&["check", "--pre"], &[]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("nothing to check"));
}

fn statfs_type(path: &str) -> i64 {
    let c = std::ffi::CString::new(path).expect("path without NUL");
    // SAFETY: `c` is a valid C string and `buf` a valid statfs buffer for the call.
    let mut buf: libc::statfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statfs(c.as_ptr(), &mut buf) };
    assert_eq!(rc, 0, "statfs {path}: {}", std::io::Error::last_os_error());
    #[allow(clippy::unnecessary_cast)]
    let t = buf.f_type as i64;
    t
}

/// The node checks on this machine: the kernel version printed is uname's, and the cgroup2
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
    let version =
        linkerd_cli::check::node::KernelVersion::parse(&release).expect("uname release parses");
    assert!(
        stdout.contains(&format!("(kernel {version})")),
        "kernel {version} not reported:\n{stdout}"
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
    // This machine's kernel (6.18) is above every floor, so the whole check passes.
    assert!(
        version >= linkerd_cli::check::node::KernelVersion(5, 9, 0),
        "kernel {version} older than the test machines'"
    );
    assert!(out.status.success(), "{stdout}");
}
