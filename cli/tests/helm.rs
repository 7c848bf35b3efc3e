//! The chart through the real `helm` binary: `helm lint`, and `helm template -n <namespace>`
//! compared object by object with what `linkerd install-cni` renders, in the default namespace
//! and in another one, for the default values, every value set and an operator's values file
//! written for Linkerd's own linkerd2-cni chart.

mod support;

use std::collections::BTreeMap;

use serde_json::{Value as Json, json};
use support::*;

const OTHER_NS: &str = "other-ns";

/// The value sets, each as the arguments given alike to `linkerd install-cni` and to
/// `helm template`: every values file of the test fixtures on its own, the full pair, and
/// `--set`/`--set-string` as Helm types them.
fn value_sets() -> Vec<(String, Vec<String>)> {
    let f = |name: &str| vec!["-f".to_string(), fixture(name).display().to_string()];
    let mut sets = vec![("default".to_string(), vec![])];
    let mut fixtures: Vec<String> = std::fs::read_dir(fixture(""))
        .expect("the fixtures directory")
        .map(|e| {
            e.expect("a fixture")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    fixtures.sort();
    for name in fixtures {
        sets.push((name.clone(), f(&name)));
    }
    let mut full = f("full-values.yaml");
    full.extend(f("full-flags-as-values.yaml"));
    sets.push(("full".into(), full));
    for set in [
        ["--set-string", "proxyUID=2102"],
        ["--set-string", "proxyAdminPort=4191"],
        ["--set-string", "inboundProxyPort=5143,proxyGID=7"],
        ["--set", "proxyUID=4294967295,revisionHistoryLimit=3"],
        [
            "--set",
            "destCNIBinDir=/etc/kubernetes/cni/net.d,destCNINetDir=/etc/kubernetes/cni/net.d",
        ],
        // The uninstall's clean-up DaemonSet, privileged or not, with one CNI dir or two.
        ["--set", "uninstall.enabled=true"],
        [
            "--set",
            "uninstall.enabled=true,uninstall.keepPlugin=true,agent.mountBpffs=false,\
             destCNIBinDir=/etc/kubernetes/cni/net.d,destCNINetDir=/etc/kubernetes/cni/net.d",
        ],
    ] {
        sets.push((set.join(" "), set.iter().map(|s| s.to_string()).collect()));
    }
    sets
}

fn cli_render(args: &[String]) -> String {
    install_cni(&args.iter().map(String::as_str).collect::<Vec<_>>(), &[])
}

/// What Helm must render in `ns`: the CLI's objects without the Namespace (Helm users create it
/// with `--create-namespace`), with every reference to the release namespace pointing at `ns`.
fn expected_in(cli: &str, ns: &str) -> BTreeMap<String, Json> {
    let mut objs = objects(cli);
    assert!(
        objs.remove("Namespace/linkerd-cni").is_some(),
        "the CLI renders the namespace"
    );
    for obj in objs.values_mut() {
        // The release's objects move; the Role and RoleBinding in `default` (for the
        // default/kubernetes Service) stay there.
        if let Some(n) = obj.pointer_mut("/metadata/namespace")
            && n == "linkerd-cni"
        {
            *n = json!(ns);
        }
        if let Some(Json::Array(names)) = obj.pointer_mut("/spec/namespaceSelector/matchNames") {
            for n in names {
                *n = json!(ns);
            }
        }
        if let Some(Json::Array(subjects)) = obj.get_mut("subjects") {
            for s in subjects {
                s["namespace"] = json!(ns);
            }
        }
        // The startup taint's admission policy names the release's ServiceAccount.
        if let Some(Json::Array(conditions)) = obj.pointer_mut("/spec/matchConditions") {
            for c in conditions {
                if let Some(e) = c["expression"].as_str() {
                    c["expression"] = json!(e.replace(
                        "system:serviceaccount:linkerd-cni:",
                        &format!("system:serviceaccount:{ns}:")
                    ));
                }
            }
        }
        if let Some(Json::Array(excluded)) =
            obj.pointer_mut("/data/cni_network_config/linkerd/excluded-namespaces")
        {
            assert_eq!(
                excluded[0], "linkerd-cni",
                "the release namespace comes first"
            );
            excluded[0] = json!(ns);
        }
    }
    objs
}

fn assert_same(what: &str, want: &BTreeMap<String, Json>, got: &BTreeMap<String, Json>) {
    let (mut want, mut got) = (want.clone(), got.clone());
    normalize_created_by(&mut want);
    normalize_created_by(&mut got);
    assert_eq!(
        want.keys().collect::<Vec<_>>(),
        got.keys().collect::<Vec<_>>(),
        "{what}: the same objects"
    );
    for (k, obj) in &want {
        assert_eq!(obj, &got[k], "{what}: {k} differs between helm and the CLI");
    }
}

#[test]
fn helm_lint_passes() {
    let chart = chart_dir().display().to_string();
    for (what, set) in value_sets() {
        let mut args = vec!["lint", chart.as_str(), "--strict"];
        args.extend(set.iter().map(String::as_str));
        let out = helm(&args);
        assert!(
            out.status.success(),
            "{what}: helm lint --strict failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// `helm template -n linkerd-cni` is the CLI's render without the Namespace, object for object,
/// so `helm install linkerd2-cni -n linkerd-cni --create-namespace` installs what
/// `linkerd install-cni` prints.
#[test]
fn helm_renders_what_the_cli_renders() {
    for (what, set) in value_sets() {
        let cli = cli_render(&set);
        let got = objects(&helm_template_args("linkerd-cni", &set));
        assert!(
            !got.keys().any(|k| k.starts_with("Namespace/")),
            "{what}: helm must not render a Namespace (it would clash with --create-namespace)"
        );
        assert_same(&what, &expected_in(&cli, "linkerd-cni"), &got);
        // The API server's own rules, which a schema does not check.
        for (k, obj) in &got {
            assert_pod_spec_admissible(&format!("{what}: {k}"), obj);
        }
    }
}

/// `helm template -n other-ns`: every object, the ServiceAccount the ClusterRoleBinding grants,
/// and the namespace the plugin leaves alone are in other-ns; nothing refers to linkerd-cni as a
/// namespace any more. And the render passes kubernetes-validate --strict.
#[test]
fn helm_in_another_namespace_puts_everything_there() {
    for (what, set) in value_sets() {
        let what = what.as_str();
        let cli = cli_render(&set);
        let yaml = helm_template_args(OTHER_NS, &set);
        let got = objects(&yaml);
        assert_same(what, &expected_in(&cli, OTHER_NS), &got);
        // `linkerd --cni-namespace other-ns install-cni` renders what helm -n other-ns does
        // (plus the Namespace).
        let mut in_other = vec!["--cni-namespace".to_string(), OTHER_NS.to_string()];
        in_other.extend(set.iter().cloned());
        let mut cli_other = objects(&cli_render(&in_other));
        assert!(
            cli_other.remove(&format!("Namespace/{OTHER_NS}")).is_some(),
            "{what}: --cni-namespace renders its Namespace"
        );
        assert_same(what, &cli_other, &got);

        let mut all = BTreeMap::new();
        for (k, o) in &got {
            leaves(k, o, &mut all);
        }
        for (path, value) in &all {
            let about_namespace =
                path.ends_with("/namespace") || path.contains("excluded-namespaces");
            assert!(
                !(about_namespace && value == "linkerd-cni"),
                "{what}: {path} still names linkerd-cni"
            );
        }
        for (path, want) in [
            ("ServiceAccount/linkerd-cni/metadata/namespace", OTHER_NS),
            ("ConfigMap/linkerd-cni-config/metadata/namespace", OTHER_NS),
            ("DaemonSet/linkerd-cni/metadata/namespace", OTHER_NS),
            (
                "ClusterRoleBinding/linkerd-cni/subjects/0/namespace",
                OTHER_NS,
            ),
            ("Role/linkerd-cni/metadata/namespace", OTHER_NS),
            ("RoleBinding/linkerd-cni/subjects/0/namespace", OTHER_NS),
            (
                "RoleBinding/linkerd-cni-kubernetes-service/subjects/0/namespace",
                OTHER_NS,
            ),
            (
                "RoleBinding/linkerd-cni-kubernetes-service/metadata/namespace",
                "default",
            ),
            (
                "ConfigMap/linkerd-cni-config/data/cni_network_config/linkerd/excluded-namespaces/0",
                OTHER_NS,
            ),
            // The agent finds its DaemonSet through the downward API, whatever the namespace.
            (
                "DaemonSet/linkerd-cni/spec/template/spec/containers/0/env/12/valueFrom/fieldRef/fieldPath",
                "metadata.namespace",
            ),
            (
                "DaemonSet/linkerd-cni/spec/template/spec/serviceAccountName",
                "linkerd-cni",
            ),
            (
                "DaemonSet/linkerd-cni-uninstall/metadata/namespace",
                OTHER_NS,
            ),
        ] {
            // `uninstall.enabled` renders the clean-up DaemonSet instead of the agent's.
            let uninstall = what.contains("uninstall.enabled=true");
            if path.starts_with("DaemonSet/") && uninstall != path.contains("-uninstall/") {
                continue;
            }
            assert_eq!(all.get(path), Some(&json!(want)), "{what}: {path}");
        }

        let file = temp_file(
            &format!(
                "helm-{OTHER_NS}-{}.yaml",
                what.replace(|c: char| !c.is_ascii_alphanumeric(), "-")
            ),
            &yaml,
        );
        for version in ["1.30.0", "1.34.0"] {
            let out = kubernetes_validate(version, &file);
            assert!(
                out.status.success(),
                "{what}: helm's render fails kubernetes-validate --strict for {version}:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// Helm refuses a mode that does not exist with the chart's explanation, as the CLI does.
#[test]
fn helm_refuses_unknown_mode() {
    let file = temp_file("helm-nft.yaml", "mode: nft\n");
    let chart = chart_dir().display().to_string();
    let f = file.display().to_string();
    let out = helm(&["template", "linkerd2-cni", &chart, "-n", OTHER_NS, "-f", &f]);
    assert!(!out.status.success(), "helm rendered mode nft");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("use mode \"auto\", \"ebpf\" or \"iptables\""),
        "{stderr}"
    );
}

/// Path values that would leave something the agent writes on the container's read-only root,
/// or expose a host directory of other uses, fail `helm template` with the chart's message, as
/// they fail the CLI.
#[test]
fn helm_refuses_unsafe_path_values() {
    let chart = chart_dir().display().to_string();
    for (set, want) in [
        (
            "agent.socketPath=/run/agent.sock",
            "put the socket in a directory of its own",
        ),
        (
            "agent.socketPath=/proc/l5d/agent.sock",
            "put the socket in a directory of its own",
        ),
        ("agent.pinRoot=/run/l5d", "must be inside agent.bpffsPath"),
        (
            "agent.socketPath=/var/lib/kubelet/agent.sock",
            "lies inside /var/lib/kubelet (owned by kubelet)",
        ),
        (
            "agent.pinRoot=/sys/fs/bpf/tc",
            "lies inside /sys/fs/bpf/tc (owned by another eBPF tenant)",
        ),
        (
            "agent.pinRoot=/sys/fs/bpf/",
            "lies inside /sys/fs/bpf (owned by every eBPF tenant",
        ),
    ] {
        let out = helm(&[
            "template",
            "linkerd2-cni",
            &chart,
            "-n",
            OTHER_NS,
            "--set",
            set,
        ]);
        assert!(!out.status.success(), "helm rendered {set}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(want), "{set}: {stderr}");
        let cli = linkerd(&["install-cni", "--set", set], &[]);
        assert!(!cli.status.success(), "the CLI rendered {set}");
    }
    // A socket two levels down renders, with the registry next to it.
    let yaml = helm_template_args(
        OTHER_NS,
        &[
            "--set".into(),
            "agent.socketPath=/var/run/l5d/agent.sock".into(),
        ],
    );
    let objs = objects(&yaml);
    let env = objs["DaemonSet/linkerd-cni"]["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .expect("env")
        .clone();
    assert!(
        env.iter().any(
            |e| e["name"] == "LINKERD_CNI_AGENT_STATE_DIR" && e["value"] == "/var/run/l5d/pods"
        ),
        "{env:?}"
    );
}

/// Helm users get the CLI's `privileged` warning in the release notes, word for word.
#[test]
fn helm_notes_warn_about_privileged() {
    let chart = chart_dir().display().to_string();
    let notes = |set: &str| {
        let out = helm(&[
            "install",
            "linkerd2-cni",
            &chart,
            "-n",
            OTHER_NS,
            "--dry-run=client",
            "--set",
            set,
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(notes("privileged=true").contains(linkerd_cli::install_cni::PRIVILEGED_WARNING));
    assert!(!notes("privileged=false").contains("privileged has no effect"));
}

/// Every tree of `paths::FOREIGN_TREES` and every bpffs directory of `FOREIGN_BPFFS_DIRS` is
/// refused by the chart, in the agent's DaemonSet and in the clean-up's, as by the CLI (one
/// list in `common/src/paths.rs`; the templates carry a copy, this keeps them equal).
#[test]
fn helm_refuses_paths_inside_other_components_trees() {
    let chart = chart_dir().display().to_string();
    let mut sets: Vec<(String, String)> = linkerd_cni_common::paths::FOREIGN_TREES
        .iter()
        .map(|(tree, owner)| {
            (
                format!("agent.socketPath={tree}/l5d/agent.sock"),
                format!("lies inside {tree} (owned by {owner})"),
            )
        })
        .collect();
    sets.extend(
        linkerd_cni_common::paths::FOREIGN_BPFFS_DIRS
            .iter()
            .map(|d| {
                (
                    format!("agent.pinRoot=/sys/fs/bpf/{d}/l5d"),
                    format!("lies inside /sys/fs/bpf/{d} (owned by another eBPF tenant)"),
                )
            }),
    );
    for (set, want) in &sets {
        for uninstall in ["false", "true"] {
            let out = helm(&[
                "template",
                "linkerd2-cni",
                &chart,
                "-n",
                OTHER_NS,
                "--set",
                set,
                "--set",
                &format!("uninstall.enabled={uninstall}"),
            ]);
            assert!(
                !out.status.success(),
                "helm rendered {set} (uninstall {uninstall})"
            );
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(stderr.contains(want.as_str()), "{set}: {stderr}");
        }
        let cli = linkerd(&["install-cni", "--set", set], &[]);
        let stderr = String::from_utf8_lossy(&cli.stderr);
        assert!(!cli.status.success(), "the CLI rendered {set}");
        assert!(stderr.contains(want.as_str()), "{set}: {stderr}");
    }
}
