//! The chart through the real `helm` binary: `helm lint`, and `helm template -n <namespace>`
//! compared object by object with what `linkerd install-cni` renders, in the default namespace
//! and in another one, for the default values, every value set and an operator's values file
//! written for Linkerd's own linkerd2-cni chart.

mod support;

use std::{collections::BTreeMap, path::PathBuf};

use serde_json::{Value as Json, json};
use support::*;

const OTHER_NS: &str = "other-ns";

/// The value sets: (name, `-f` files).
fn value_sets() -> Vec<(&'static str, Vec<PathBuf>)> {
    vec![
        ("default", vec![]),
        (
            "full",
            vec![
                fixture("full-values.yaml"),
                fixture("full-flags-as-values.yaml"),
            ],
        ),
        (
            "Linkerd's values",
            vec![fixture("linkerd2-cni-values.yaml")],
        ),
    ]
}

fn cli_render(files: &[PathBuf]) -> String {
    let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    let mut args = Vec::new();
    for f in &names {
        args.extend(["-f", f.as_str()]);
    }
    install_cni(&args, &[])
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
        if let Some(n) = obj.pointer_mut("/metadata/namespace") {
            *n = json!(ns);
        }
        if let Some(Json::Array(subjects)) = obj.get_mut("subjects") {
            for s in subjects {
                s["namespace"] = json!(ns);
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
    assert_eq!(
        want.keys().collect::<Vec<_>>(),
        got.keys().collect::<Vec<_>>(),
        "{what}: the same objects"
    );
    for (k, obj) in want {
        assert_eq!(obj, &got[k], "{what}: {k} differs between helm and the CLI");
    }
}

#[test]
fn helm_lint_passes() {
    let chart = chart_dir().display().to_string();
    for (what, files) in value_sets() {
        let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
        let mut args = vec!["lint", chart.as_str(), "--strict"];
        for f in &names {
            args.extend(["-f", f.as_str()]);
        }
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
    for (what, files) in value_sets() {
        let cli = cli_render(&files);
        let refs: Vec<&std::path::Path> = files.iter().map(PathBuf::as_path).collect();
        let got = objects(&helm_template("linkerd-cni", &refs));
        assert!(
            !got.keys().any(|k| k.starts_with("Namespace/")),
            "{what}: helm must not render a Namespace (it would clash with --create-namespace)"
        );
        assert_same(what, &expected_in(&cli, "linkerd-cni"), &got);
    }
}

/// `helm template -n other-ns`: every object, the ServiceAccount the ClusterRoleBinding grants,
/// and the namespace the plugin leaves alone are in other-ns; nothing refers to linkerd-cni as a
/// namespace any more. And the render passes kubernetes-validate --strict.
#[test]
fn helm_in_another_namespace_puts_everything_there() {
    for (what, files) in value_sets() {
        let cli = cli_render(&files);
        let refs: Vec<&std::path::Path> = files.iter().map(PathBuf::as_path).collect();
        let yaml = helm_template(OTHER_NS, &refs);
        let got = objects(&yaml);
        assert_same(what, &expected_in(&cli, OTHER_NS), &got);

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
        ] {
            assert_eq!(all.get(path), Some(&json!(want)), "{what}: {path}");
        }

        let file = temp_file(
            &format!("helm-{OTHER_NS}-{}.yaml", what.replace([' ', '\''], "-")),
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

/// Helm refuses the iptables mode with the chart's explanation, as the CLI does.
#[test]
fn helm_refuses_iptables_mode() {
    let file = temp_file("helm-iptables.yaml", "mode: iptables\n");
    let chart = chart_dir().display().to_string();
    let f = file.display().to_string();
    let out = helm(&["template", "linkerd2-cni", &chart, "-n", OTHER_NS, "-f", &f]);
    assert!(!out.status.success(), "helm rendered mode iptables");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("\"iptables\" is planned as the fallback for kernels without cgroup BPF"),
        "{stderr}"
    );
}
