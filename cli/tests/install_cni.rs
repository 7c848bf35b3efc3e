//! `linkerd install-cni`: golden renders, what each flag changes, labels, values layering,
//! errors, and schema validation with `kubernetes-validate --strict` for Kubernetes 1.30-1.34.

mod support;

use std::collections::BTreeMap;

use serde_json::{Value as Json, json};
use support::*;

/// Every install-cni flag, set away from its default (with the values file for the rest).
const FULL_FLAGS: &[&str] = &[
    "--mode=ebpf",
    "--proxy-uid=2103",
    "--proxy-gid=2104",
    "--inbound-port=5143",
    "--outbound-port=5140",
    "--control-port=5190",
    "--admin-port=5191",
    "--skip-inbound-ports=25,9000-9100",
    "--skip-outbound-ports=3306",
    "--skip-outbound-ports=6379",
    "--redirect-ports=80,8080",
    "--cni-image=example.com/linkerd/agent",
    "--cni-image-version=v9.9.9",
    "--cni-log-level=debug",
    "--agent-log-format=json",
    "--dest-cni-net-dir=/var/lib/cni/net.d",
    "--dest-cni-bin-dir=/var/lib/cni/bin",
    "--priority-class-name=linkerd-cni-critical",
    "--use-wait-flag",
    "--registry=registry.example.com/mirror",
    "--set=agent.healthPort=9992",
];

fn full_args() -> Vec<String> {
    let mut args: Vec<String> = FULL_FLAGS.iter().map(|s| s.to_string()).collect();
    args.push("-f".into());
    args.push(fixture("full-values.yaml").display().to_string());
    args
}

fn full_render() -> String {
    let args = full_args();
    install_cni(&args.iter().map(String::as_str).collect::<Vec<_>>(), &[])
}

/// Compares with `deploy/golden/<name>`, or rewrites it when UPDATE_GOLDEN=1.
fn golden(name: &str, rendered: &str) {
    let path = workspace().join("deploy/golden").join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, rendered)
            .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "reading {}: {e} (UPDATE_GOLDEN=1 creates it)",
            path.display()
        )
    });
    assert!(
        want == rendered,
        "{name} differs from the golden file; review the change and rerun with UPDATE_GOLDEN=1\n--- golden\n{want}\n--- rendered\n{rendered}"
    );
}

#[test]
fn golden_default_render() {
    golden("install-cni-default.yaml", &install_cni(&[], &[]));
}

#[test]
fn golden_full_render() {
    golden("install-cni-full.yaml", &full_render());
}

fn linkerd_values_render() -> std::process::Output {
    let file = fixture("linkerd2-cni-values.yaml").display().to_string();
    linkerd(&["install-cni", "-f", &file], &[])
}

/// An operator's values file for Linkerd's linkerd2-cni chart (every key it has) renders with
/// no ignored key (this chart has them all), and warnings for Linkerd's iptables image and for
/// `privileged` (`repairController.enabled` has its effect: the agent repairs).
#[test]
fn golden_linkerd_values_render() {
    let out = linkerd_values_render();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(
        stderr.lines().collect::<Vec<_>>(),
        [
            linkerd_cli::install_cni::linkerd_image_warning("cr.example.com/linkerd/cni-plugin"),
            linkerd_cli::install_cni::PRIVILEGED_WARNING.to_string(),
        ],
        "every key of Linkerd's chart is a value of this one: warnings for the iptables image \
         and for privileged only"
    );
    golden(
        "install-cni-linkerd-values.yaml",
        &String::from_utf8(out.stdout).expect("UTF-8"),
    );
}

/// An unknown key changes nothing but a warning on standard error (Helm ignores it silently).
#[test]
fn unknown_values_are_ignored_with_a_warning() {
    let out = linkerd(
        &[
            "install-cni",
            "--set",
            "nope=1,image.digest=x,agent.extra.deep=1",
        ],
        &[],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(
        String::from_utf8(out.stdout).expect("UTF-8"),
        install_cni(&[], &[]),
        "unknown keys change nothing"
    );
    for key in ["agent.extra", "image.digest", "nope"] {
        assert!(
            stderr.contains(&linkerd_cli::values::unknown_key_warning(
                key,
                "--set \"nope=1,image.digest=x,agent.extra.deep=1\""
            )),
            "no warning for {key}:\n{stderr}"
        );
    }
    assert_eq!(stderr.lines().count(), 3, "{stderr}");
    // Free-form values (labels, Kubernetes objects) take any key without a warning.
    let out = linkerd(
        &[
            "install-cni",
            "--set",
            "commonLabels.x=y,updateStrategy.rollingUpdate.maxSurge=1",
        ],
        &[],
    );
    assert!(out.status.success() && out.stderr.is_empty(), "{out:?}");
}

/// The contract's objects, in an order `kubectl apply` can follow, each labelled.
#[test]
fn objects_and_labels() {
    for (what, yaml) in [("default", install_cni(&[], &[])), ("full", full_render())] {
        let keys: Vec<String> = docs(&yaml).iter().map(key).collect();
        let mut want = vec![
            "Namespace/linkerd-cni",
            "ServiceAccount/linkerd-cni",
            // agent.startupTaint: narrows the nodes patch, applied before the ClusterRole.
            "ValidatingAdmissionPolicy/linkerd-cni-startup-taint",
            "ValidatingAdmissionPolicyBinding/linkerd-cni-startup-taint",
            "ClusterRole/linkerd-cni",
            "ClusterRoleBinding/linkerd-cni",
            "Role/linkerd-cni",
            "RoleBinding/linkerd-cni",
            "Role/linkerd-cni-kubernetes-service",
            "RoleBinding/linkerd-cni-kubernetes-service",
            "ConfigMap/linkerd-cni-config",
            "DaemonSet/linkerd-cni",
        ];
        // The full values enable agent.metrics.podMonitor.
        if what == "full" {
            want.push("PodMonitor/linkerd-cni");
        }
        assert_eq!(keys, want, "{what} render");
        for obj in docs(&yaml) {
            assert_eq!(
                obj.pointer("/metadata/labels/linkerd.io~1cni-resource"),
                Some(&json!("true")),
                "{what}: {} lacks linkerd.io/cni-resource: \"true\"",
                key(&obj)
            );
            if obj["kind"] != "Namespace"
                && obj["kind"] != "ClusterRole"
                && obj["kind"] != "ClusterRoleBinding"
                && obj["kind"] != "ValidatingAdmissionPolicy"
                && obj["kind"] != "ValidatingAdmissionPolicyBinding"
            {
                let want = if key(&obj).ends_with("linkerd-cni-kubernetes-service") {
                    "default"
                } else {
                    "linkerd-cni"
                };
                assert_eq!(obj["metadata"]["namespace"], want, "{what}: {}", key(&obj));
            }
        }
        let objs = objects(&yaml);
        let ds = &objs["DaemonSet/linkerd-cni"];
        assert_eq!(
            ds.pointer("/spec/template/metadata/labels/linkerd.io~1cni-resource"),
            Some(&json!("true")),
            "{what}: pod label"
        );
        assert_eq!(
            ds.pointer("/spec/template/metadata/annotations/linkerd.io~1inject"),
            Some(&json!("disabled")),
            "{what}"
        );
        assert_eq!(
            ds.pointer("/spec/template/spec/nodeSelector/kubernetes.io~1os"),
            Some(&json!("linux")),
            "{what}"
        );
        let ns = &objs["Namespace/linkerd-cni"];
        assert_eq!(
            ns.pointer("/metadata/labels/config.linkerd.io~1admission-webhooks"),
            Some(&json!("disabled")),
            "{what}"
        );
        assert_eq!(
            ns.pointer("/metadata/labels/pod-security.kubernetes.io~1enforce"),
            Some(&json!("privileged")),
            "{what}"
        );
        let role = &objs["ClusterRole/linkerd-cni"];
        // Nodes: patch only (the startup taint, narrowed by the admission policy); `delete` on
        // pods for the repair (repairController.enabled, the default); one object each of the
        // rest (tests/rbac.rs holds these against the requests the code makes).
        assert_eq!(
            role["rules"],
            json!([
                {"apiGroups": [""], "resources": ["pods", "namespaces"], "verbs": ["get", "list", "watch"]},
                {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]},
                {"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]},
            ])
        );
        // SIGTERM: rollout (DaemonSet stands) or uninstall (deleting or gone).
        assert_eq!(
            objs["Role/linkerd-cni"]["rules"],
            json!([{"apiGroups": ["apps"], "resources": ["daemonsets"],
                    "resourceNames": ["linkerd-cni"], "verbs": ["get"]}])
        );
        assert_eq!(
            objs["Role/linkerd-cni-kubernetes-service"]["rules"],
            json!([{"apiGroups": [""], "resources": ["services"],
                    "resourceNames": ["kubernetes"], "verbs": ["get"]}])
        );
    }
}

/// The default render: the contract's conflist entry and the DaemonSet's essentials.
#[test]
fn default_render_content() {
    let objs = objects(&install_cni(&[], &[]));
    let cm = &objs["ConfigMap/linkerd-cni-config"]["data"];
    assert_eq!(cm["dest_cni_net_dir"], "/etc/cni/net.d");
    assert_eq!(cm["dest_cni_bin_dir"], "/opt/cni/bin");
    assert_eq!(
        cm["cni_network_config"],
        json!({
            "name": "linkerd-cni", "type": "linkerd-cni", "log_level": "info",
            "kubernetes": {"kubeconfig": "__KUBECONFIG_FILEPATH__"},
            "linkerd": {
                "incoming-proxy-port": 4143, "outgoing-proxy-port": 4140, "proxy-uid": 2102, "proxy-gid": -1,
                "ports-to-redirect": [], "inbound-ports-to-ignore": ["4191", "4190"], "outbound-ports-to-ignore": [],
                "simulate": false, "use-wait-flag": false, "iptables-mode": "nft", "ipv6": false,
                "agent-socket": "/run/linkerd-cni/agent.sock",
                "excluded-namespaces": ["linkerd-cni", "kube-system"]
            }
        })
    );
    // The plugin's parser accepts the entry, with Linkerd's defaults.
    let parsed: linkerd_cni_proto::config::LinkerdConfig =
        serde_json::from_value(cm["cni_network_config"]["linkerd"].clone())
            .expect("the plugin parses the linkerd section");
    let want = linkerd_cni_proto::config::LinkerdConfig {
        iptables_mode: Some("nft".into()),
        ..linkerd_cni_proto::config::LinkerdConfig::default()
    };
    assert_eq!(
        parsed, want,
        "the rendered entry means Linkerd's defaults to the plugin"
    );

    let pod = &objs["DaemonSet/linkerd-cni"]["spec"]["template"]["spec"];
    // Linkerd's default (everything), then the startup taint the agent removes (tolerated
    // whatever `tolerations` says).
    assert_eq!(
        pod["tolerations"],
        json!([
            {"operator": "Exists"},
            {"key": "cni.linkerd.io/agent-not-ready", "operator": "Exists", "effect": "NoSchedule"},
        ])
    );
    // The agent never waits for its own plugin: no pod network, cluster DNS still resolves.
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["dnsPolicy"], "ClusterFirstWithHostNet");
    let c = &pod["containers"][0];
    assert_eq!(c["command"], json!(["linkerd-cni-agent", "run"]));
    // Least privilege (issue 25): the agent container is not privileged and holds exactly the
    // agent's required capabilities; no host PIDs; the runtime's seccomp profile; a priority.
    assert_eq!(pod.get("hostPID"), None, "no hostPID");
    assert_eq!(
        pod["securityContext"],
        json!({"seccompProfile": {"type": "RuntimeDefault"}})
    );
    assert_eq!(pod["priorityClassName"], "system-node-critical");
    let sc = &c["securityContext"];
    assert_eq!(sc["privileged"], false);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(
        sc["capabilities"],
        json!({"drop": ["ALL"], "add": ["BPF", "NET_ADMIN", "PERFMON"]})
    );
    // Nothing exposed: no ports (a hostPort with hostNetwork), probes and health on loopback,
    // no Prometheus annotations while metrics are off.
    assert_eq!(
        c.get("ports"),
        None,
        "no containerPort: it would be a hostPort"
    );
    for (probe, path) in [("livenessProbe", "/live"), ("readinessProbe", "/ready")] {
        assert_eq!(
            c[probe]["httpGet"],
            json!({"host": "127.0.0.1", "path": path, "port": 9990}),
            "{probe}"
        );
    }
    let annotations = &objs["DaemonSet/linkerd-cni"]["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(annotations.get("prometheus.io/scrape"), None);
    // The bpffs mount receives the host's mounts (Bidirectional is for privileged containers
    // only).
    let bpffs = c["volumeMounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .find(|m| m["name"] == "bpffs")
        .expect("bpffs mount");
    assert_eq!(bpffs["mountPropagation"], "HostToContainer");
    // SIGTERM tells a rollout from an uninstall by reading the agent's own DaemonSet.
    let env: BTreeMap<&str, &Json> = c["env"]
        .as_array()
        .expect("env")
        .iter()
        .map(|e| (e["name"].as_str().expect("name"), e))
        .collect();
    assert_eq!(
        env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.namespace"
    );
    assert_eq!(env["LINKERD_CNI_AGENT_DAEMONSET"]["value"], "linkerd-cni");
    // The node's bpffs comes from the host: the agent never mounts one of its own.
    assert_eq!(env["LINKERD_CNI_AGENT_BPFFS_FROM_HOST"]["value"], "true");
    let mounts: BTreeMap<&str, &str> = c["volumeMounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .map(|m| {
            (
                m["name"].as_str().expect("name"),
                m["mountPath"].as_str().expect("path"),
            )
        })
        .collect();
    for (name, path) in [
        ("cni-bin-dir", "/host/opt/cni/bin"),
        ("cni-net-dir", "/host/etc/cni/net.d"),
        ("bpffs", "/sys/fs/bpf"),
        ("host-cgroup", "/host/sys/fs/cgroup"),
        ("agent-run", "/run/linkerd-cni"),
    ] {
        assert_eq!(mounts.get(name), Some(&path), "mount {name}");
    }
    assert_eq!(
        mounts.get("host-proc"),
        None,
        "the host's /proc only with agent.cniNetnsFromProc"
    );
    assert_eq!(
        env["LINKERD_CNI_AGENT_HEALTH_ADDR"]["value"],
        "127.0.0.1:9990"
    );
    assert!(!env.contains_key("LINKERD_CNI_AGENT_METRICS_ADDR"));
    let init = &pod["initContainers"][0];
    assert_eq!(init["volumeMounts"][0]["mountPropagation"], "Bidirectional");
    assert_eq!(
        init["securityContext"]["privileged"], true,
        "Bidirectional propagation requires privileged"
    );
}

/// Whether a container is privileged, by its name, in a rendered pod spec.
fn privileged_containers(pod: &Json) -> Vec<(String, bool)> {
    ["initContainers", "containers"]
        .iter()
        .flat_map(|k| pod[*k].as_array().cloned().unwrap_or_default())
        .map(|c| {
            (
                c["name"].as_str().expect("name").to_string(),
                c.pointer("/securityContext/privileged") == Some(&json!(true)),
            )
        })
        .collect()
}

/// Both shapes of the bpffs mount (issue 25 item 5): by default only the `mount-bpffs` init
/// container is privileged; with `agent.mountBpffs=false` (the host mounts bpffs) it is left
/// out and no container of the pod is privileged, nor any mount Bidirectional. Both are
/// admissible pod specs, and extraInitContainers still render without mount-bpffs.
#[test]
fn only_the_bpffs_mount_is_privileged_and_only_when_asked() {
    let pod_of = |args: &[&str]| {
        objects(&install_cni(args, &[]))["DaemonSet/linkerd-cni"]["spec"]["template"]["spec"]
            .clone()
    };
    let default = pod_of(&[]);
    assert_eq!(
        privileged_containers(&default),
        [
            ("mount-bpffs".to_string(), true),
            ("install-cni".to_string(), false)
        ]
    );
    let init = &default["initContainers"][0];
    assert_eq!(init["volumeMounts"][0]["mountPropagation"], "Bidirectional");
    assert!(
        pod_spec_violations(&default).is_empty(),
        "{:?}",
        pod_spec_violations(&default)
    );
    // Negative controls: the rules that make this the only admissible shape.
    let agent_with = |change: &dyn Fn(&mut Json)| {
        let mut pod = default.clone();
        change(&mut pod["containers"][0]);
        pod_spec_violations(&pod)
    };
    assert_eq!(
        agent_with(&|c| {
            for m in c["volumeMounts"].as_array_mut().expect("mounts") {
                if m["name"] == "bpffs" {
                    m["mountPropagation"] = json!("Bidirectional");
                }
            }
        }),
        ["install-cni: Bidirectional mount propagation is available only to privileged containers"]
    );
    assert_eq!(
        agent_with(&|c| c["securityContext"]["privileged"] = json!(true)),
        ["install-cni: cannot set allowPrivilegeEscalation to false and privileged to true"]
    );
    assert_eq!(
        agent_with(&|c| c["securityContext"]["capabilities"]["add"][1] = json!("CAP_SYS_ADMIN")),
        [
            "install-cni: cannot set allowPrivilegeEscalation to false and capabilities.add CAP_SYS_ADMIN"
        ]
    );

    let host_mounted = pod_of(&["--set", "agent.mountBpffs=false"]);
    assert_eq!(host_mounted.get("initContainers"), None);
    assert_eq!(
        privileged_containers(&host_mounted),
        [("install-cni".to_string(), false)]
    );
    let mut leaves = std::collections::BTreeMap::new();
    support::leaves("", &host_mounted, &mut leaves);
    assert!(
        !leaves.values().any(|v| v == "Bidirectional"),
        "no Bidirectional mount without mount-bpffs"
    );
    assert!(pod_spec_violations(&host_mounted).is_empty());
    // The agent's container is the same in both shapes.
    assert_eq!(host_mounted["containers"], default["containers"]);
    assert_eq!(host_mounted["volumes"], default["volumes"]);

    let extra = temp_file(
        "extra-init.yaml",
        "agent:\n  mountBpffs: false\nextraInitContainers:\n  - name: x\n    image: x\n",
    );
    let with_extra = pod_of(&["-f", &extra.display().to_string()]);
    assert_eq!(
        privileged_containers(&with_extra),
        [("x".to_string(), false), ("install-cni".to_string(), false)]
    );
}

/// `agent.cniNetnsFromProc` (runtimes that pass `/proc/<pid>/ns/net`, such as cri-dockerd)
/// adds the host's `/proc`, read-only, and CAP_SYS_PTRACE; nothing else.
#[test]
fn netns_from_proc_adds_the_host_proc_and_sys_ptrace() {
    let c = |args: &[&str]| {
        objects(&install_cni(args, &[]))["DaemonSet/linkerd-cni"]["spec"]["template"]["spec"]
            .clone()
    };
    let pod = c(&["--set", "agent.cniNetnsFromProc=true"]);
    assert_eq!(
        pod["containers"][0]["securityContext"]["capabilities"]["add"],
        json!(["BPF", "NET_ADMIN", "PERFMON", "SYS_PTRACE"])
    );
    let proc_mount = pod["containers"][0]["volumeMounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .find(|m| m["name"] == "host-proc")
        .cloned()
        .expect("host-proc mount");
    assert_eq!(
        proc_mount,
        json!({"name": "host-proc", "mountPath": "/host/proc", "readOnly": true})
    );
    assert!(pod["volumes"].as_array().expect("volumes").contains(
        &json!({"name": "host-proc", "hostPath": {"path": "/proc", "type": "Directory"}})
    ));
    assert!(pod_spec_violations(&pod).is_empty());
}

/// Each flag (or env var, values file, --set) changes exactly the fields it should.
#[test]
fn flags_change_what_they_should() {
    let conf = "ConfigMap/linkerd-cni-config/data/cni_network_config";
    let linkerd = |k: &str| format!("{conf}/linkerd/{k}");
    let ds = "DaemonSet/linkerd-cni/spec/template";
    let images = |img: &str| {
        vec![
            (format!("{ds}/spec/initContainers/0/image"), json!(img)),
            (format!("{ds}/spec/containers/0/image"), json!(img)),
        ]
    };
    let file_6000 = temp_file("inbound-6000.yaml", "inboundProxyPort: 6000\n");
    let file_6000 = file_6000.display().to_string();
    let tolerations = temp_file("tolerations.yaml", "tolerations:\n  - operator: Exists\n");
    let tolerations = tolerations.display().to_string();
    let priority = temp_file("priority.txt", "from-a-file");
    let set_file = format!("priorityClassName={}", priority.display());

    type Row<'a> = (Vec<&'a str>, Vec<(&'a str, &'a str)>, Vec<(String, Json)>);
    let rows: Vec<Row> = vec![
        (vec!["--mode=auto"], vec![], vec![]),
        (
            vec!["--proxy-uid=3000"],
            vec![],
            vec![(linkerd("proxy-uid"), json!(3000))],
        ),
        (
            vec!["--proxy-gid", "3001"],
            vec![],
            vec![(linkerd("proxy-gid"), json!(3001))],
        ),
        (
            vec!["--inbound-port=5143"],
            vec![],
            vec![(linkerd("incoming-proxy-port"), json!(5143))],
        ),
        (
            vec!["--outbound-port=5140"],
            vec![],
            vec![(linkerd("outgoing-proxy-port"), json!(5140))],
        ),
        (
            vec!["--admin-port=5191"],
            vec![],
            vec![(linkerd("inbound-ports-to-ignore/0"), json!("5191"))],
        ),
        (
            vec!["--control-port=5190"],
            vec![],
            vec![(linkerd("inbound-ports-to-ignore/1"), json!("5190"))],
        ),
        (
            vec!["--skip-inbound-ports=25,9000-9100"],
            vec![],
            vec![
                (linkerd("inbound-ports-to-ignore/2"), json!("25")),
                (linkerd("inbound-ports-to-ignore/3"), json!("9000-9100")),
            ],
        ),
        (
            vec!["--skip-outbound-ports=3306", "--skip-outbound-ports=6379"],
            vec![],
            vec![
                (linkerd("outbound-ports-to-ignore/0"), json!("3306")),
                (linkerd("outbound-ports-to-ignore/1"), json!("6379")),
            ],
        ),
        (
            vec!["--redirect-ports=80,8080"],
            vec![],
            vec![
                (linkerd("ports-to-redirect/0"), json!(80)),
                (linkerd("ports-to-redirect/1"), json!(8080)),
            ],
        ),
        (
            vec!["--cni-image=example.com/agent"],
            vec![],
            images("example.com/agent:v0.1.0"),
        ),
        (
            vec!["--cni-image-version=v9"],
            vec![],
            images("ghcr.io/linkerd/linkerd-cni-ebpf:v9"),
        ),
        (
            vec!["--registry=r.example.com"],
            vec![],
            images("r.example.com/linkerd-cni-ebpf:v0.1.0"),
        ),
        (
            vec!["--cni-image=a/b/c", "--registry=r.io"],
            vec![],
            images("r.io/c:v0.1.0"),
        ),
        (
            vec!["--cni-log-level=debug"],
            vec![],
            vec![(format!("{conf}/log_level"), json!("debug"))],
        ),
        (
            vec!["--agent-log-format=json"],
            vec![],
            vec![
                (
                    format!("{ds}/spec/containers/0/env/16/value"),
                    json!("json"),
                ),
                // mount-bpffs logs in the same format.
                (
                    format!("{ds}/spec/initContainers/0/env/1/value"),
                    json!("json"),
                ),
            ],
        ),
        // Linkerd's CLI: -v, LINKERD_DOCKER_REGISTRY, every log level it accepts.
        (vec!["-v", "stable-2.14.10"], vec![], vec![]),
        (vec!["--linkerd-version=edge-25.1.1"], vec![], vec![]),
        (
            vec!["--cni-log-level=trace"],
            vec![],
            vec![(format!("{conf}/log_level"), json!("trace"))],
        ),
        (
            vec!["--cni-log-level=WARNING"],
            vec![],
            vec![(format!("{conf}/log_level"), json!("WARNING"))],
        ),
        (
            vec![],
            vec![("LINKERD_DOCKER_REGISTRY", "my.reg:5000/mirror")],
            images("my.reg:5000/mirror/linkerd-cni-ebpf:v0.1.0"),
        ),
        // Helm's list index syntax: a list set by --set replaces the chart's list (Helm
        // coalesces lists whole), an index into a list from a values file keeps its elements.
        (
            vec!["--set", "tolerations[0].effect=NoSchedule"],
            vec![],
            vec![
                (format!("{ds}/spec/tolerations/0/operator"), Json::Null),
                (
                    format!("{ds}/spec/tolerations/0/effect"),
                    json!("NoSchedule"),
                ),
            ],
        ),
        (
            vec![
                "-f",
                &tolerations,
                "--set",
                "tolerations[1].key=node-role.kubernetes.io/control-plane,tolerations[1].operator=Exists",
            ],
            vec![],
            // The startup taint's toleration stays last, after the operator's.
            vec![
                (
                    format!("{ds}/spec/tolerations/1/key"),
                    json!("node-role.kubernetes.io/control-plane"),
                ),
                (format!("{ds}/spec/tolerations/1/effect"), Json::Null),
                (
                    format!("{ds}/spec/tolerations/2/key"),
                    json!("cni.linkerd.io/agent-not-ready"),
                ),
                (format!("{ds}/spec/tolerations/2/operator"), json!("Exists")),
                (
                    format!("{ds}/spec/tolerations/2/effect"),
                    json!("NoSchedule"),
                ),
            ],
        ),
        // --set-string keeps strings (--set would type `true` as a boolean, refused below),
        // --set-file reads the value from a file; both after --set.
        (
            vec!["--set-string", "agent.logLevel=true"],
            vec![],
            vec![(format!("{ds}/spec/containers/0/env/6/value"), json!("true"))],
        ),
        // Linkerd's values: iptablesMode plain reaches the conflist (ignored in eBPF mode);
        // privileged and enablePSP are accepted and change nothing.
        (
            vec!["--set", "iptablesMode=plain"],
            vec![],
            vec![(linkerd("iptables-mode"), json!("plain"))],
        ),
        (
            vec!["--set", "privileged=true,enablePSP=true"],
            vec![],
            vec![],
        ),
        // A class named like a YAML boolean stays a string once rendered.
        (
            vec!["--set-string", "priorityClassName=true"],
            vec![],
            vec![(format!("{ds}/spec/priorityClassName"), json!("true"))],
        ),
        (
            vec!["--set-file", &set_file, "--set", "priorityClassName=x"],
            vec![],
            vec![(format!("{ds}/spec/priorityClassName"), json!("from-a-file"))],
        ),
        (
            vec!["--dest-cni-net-dir=/x/net"],
            vec![],
            vec![
                (
                    "ConfigMap/linkerd-cni-config/data/dest_cni_net_dir".into(),
                    json!("/x/net"),
                ),
                (
                    format!("{ds}/spec/containers/0/volumeMounts/1/mountPath"),
                    json!("/host/x/net"),
                ),
                (
                    format!("{ds}/spec/volumes/1/hostPath/path"),
                    json!("/x/net"),
                ),
            ],
        ),
        (
            vec!["--dest-cni-bin-dir=/x/bin"],
            vec![],
            vec![
                (
                    "ConfigMap/linkerd-cni-config/data/dest_cni_bin_dir".into(),
                    json!("/x/bin"),
                ),
                (
                    format!("{ds}/spec/containers/0/volumeMounts/0/mountPath"),
                    json!("/host/x/bin"),
                ),
                (
                    format!("{ds}/spec/volumes/0/hostPath/path"),
                    json!("/x/bin"),
                ),
            ],
        ),
        (
            vec!["--priority-class-name=critical"],
            vec![],
            vec![(format!("{ds}/spec/priorityClassName"), json!("critical"))],
        ),
        (
            vec!["--use-wait-flag"],
            vec![],
            vec![(linkerd("use-wait-flag"), json!(true))],
        ),
        (vec!["--use-wait-flag=false"], vec![], vec![]),
        // Environment variables stand for flags.
        (
            vec![],
            vec![("LINKERD_INSTALL_CNI_PROXY_UID", "3000")],
            vec![(linkerd("proxy-uid"), json!(3000))],
        ),
        (
            vec![],
            vec![("LINKERD_INSTALL_CNI_SKIP_OUTBOUND_PORTS", "1,2")],
            vec![
                (linkerd("outbound-ports-to-ignore/0"), json!("1")),
                (linkerd("outbound-ports-to-ignore/1"), json!("2")),
            ],
        ),
        // Values files; --set over flags (the precedence of files over flags has its own test).
        (
            vec!["-f", &file_6000],
            vec![],
            vec![(linkerd("incoming-proxy-port"), json!(6000))],
        ),
        (
            vec!["--inbound-port=7000", "--set", "inboundProxyPort=8000"],
            vec![],
            vec![(linkerd("incoming-proxy-port"), json!(8000))],
        ),
        (
            vec!["--set", r"ignoreOutboundPorts=1\,2"],
            vec![],
            vec![
                (linkerd("outbound-ports-to-ignore/0"), json!("1")),
                (linkerd("outbound-ports-to-ignore/1"), json!("2")),
            ],
        ),
        (
            vec!["--set", "agent.healthPort=9999"],
            vec![],
            vec![
                (
                    format!("{ds}/spec/containers/0/env/11/value"),
                    json!("127.0.0.1:9999"),
                ),
                (
                    format!("{ds}/spec/containers/0/livenessProbe/httpGet/port"),
                    json!(9999),
                ),
                (
                    format!("{ds}/spec/containers/0/readinessProbe/httpGet/port"),
                    json!(9999),
                ),
            ],
        ),
        // Metrics: off the node's addresses unless enabled; then on their own address and
        // port, and the pods are annotated for Prometheus.
        (
            vec!["--set", "agent.metrics.enabled=true"],
            vec![],
            vec![
                (
                    format!("{ds}/metadata/annotations/prometheus.io/scrape"),
                    json!("true"),
                ),
                (
                    format!("{ds}/metadata/annotations/prometheus.io/port"),
                    json!("9991"),
                ),
                (
                    format!("{ds}/metadata/annotations/prometheus.io/path"),
                    json!("/metrics"),
                ),
                (
                    format!("{ds}/spec/containers/0/env/18/name"),
                    json!("LINKERD_CNI_AGENT_METRICS_ADDR"),
                ),
                (
                    format!("{ds}/spec/containers/0/env/18/value"),
                    json!("0.0.0.0:9991"),
                ),
                // agent.startupTaint's variable comes after it.
                (
                    format!("{ds}/spec/containers/0/env/19/name"),
                    json!("LINKERD_CNI_AGENT_REMOVE_STARTUP_TAINT"),
                ),
                (
                    format!("{ds}/spec/containers/0/env/19/value"),
                    json!("true"),
                ),
                // And the mode's, last.
                (
                    format!("{ds}/spec/containers/0/env/20/name"),
                    json!("LINKERD_CNI_AGENT_MODE"),
                ),
                (
                    format!("{ds}/spec/containers/0/env/20/value"),
                    json!("auto"),
                ),
            ],
        ),
        (
            vec![
                "--set",
                "agent.metrics.enabled=true,agent.metrics.bindAddress=fd00::1,agent.metrics.port=9100",
            ],
            vec![],
            vec![
                (
                    format!("{ds}/metadata/annotations/prometheus.io/scrape"),
                    json!("true"),
                ),
                (
                    format!("{ds}/metadata/annotations/prometheus.io/port"),
                    json!("9100"),
                ),
                (
                    format!("{ds}/metadata/annotations/prometheus.io/path"),
                    json!("/metrics"),
                ),
                (
                    format!("{ds}/spec/containers/0/env/18/name"),
                    json!("LINKERD_CNI_AGENT_METRICS_ADDR"),
                ),
                (
                    format!("{ds}/spec/containers/0/env/18/value"),
                    json!("[fd00::1]:9100"),
                ),
                // agent.startupTaint's variable comes after it.
                (
                    format!("{ds}/spec/containers/0/env/19/name"),
                    json!("LINKERD_CNI_AGENT_REMOVE_STARTUP_TAINT"),
                ),
                (
                    format!("{ds}/spec/containers/0/env/19/value"),
                    json!("true"),
                ),
                // And the mode's, last.
                (
                    format!("{ds}/spec/containers/0/env/20/name"),
                    json!("LINKERD_CNI_AGENT_MODE"),
                ),
                (
                    format!("{ds}/spec/containers/0/env/20/value"),
                    json!("auto"),
                ),
            ],
        ),
        (
            vec!["--set", "agent.metrics.bindAddress=10.0.0.1"],
            vec![],
            vec![],
        ),
        // An empty priority class unsets it.
        (
            vec!["--priority-class-name="],
            vec![],
            vec![(format!("{ds}/spec/priorityClassName"), Json::Null)],
        ),
        (
            vec!["--set", "agent.logLevel=debug"],
            vec![],
            vec![(
                format!("{ds}/spec/containers/0/env/6/value"),
                json!("debug"),
            )],
        ),
        (
            vec!["--set", "disableIPv6=false"],
            vec![],
            vec![
                (linkerd("ipv6"), json!(true)),
                (
                    format!("{ds}/spec/containers/0/env/11/value"),
                    json!("127.0.0.1:9990,[::1]:9990"),
                ),
            ],
        ),
        (
            vec!["--set", "resources.memory.limit=128Mi"],
            vec![],
            vec![(
                format!("{ds}/spec/containers/0/resources/limits/memory"),
                json!("128Mi"),
            )],
        ),
    ];

    let default = install_cni(&[], &[]);
    for (args, env, want) in rows {
        let got = changed(&default, &install_cni(&args, &env));
        let want: BTreeMap<String, Json> = want.into_iter().collect();
        assert_eq!(got, want, "install-cni {args:?} {env:?}");
    }
}

/// Values the agent container reads, by env var name (so row indexes above stay honest).
#[test]
fn agent_env_vars() {
    let objs = objects(&install_cni(
        &["--set", "agent.logLevel=debug,agent.healthPort=9999"],
        &[],
    ));
    let env = objs["DaemonSet/linkerd-cni"]
        .pointer("/spec/template/spec/containers/0/env")
        .cloned()
        .expect("env");
    let by_name: BTreeMap<String, Json> = env
        .as_array()
        .expect("list")
        .iter()
        .map(|e| (e["name"].as_str().expect("name").to_string(), e.clone()))
        .collect();
    assert_eq!(by_name["LINKERD_CNI_AGENT_LOG_LEVEL"]["value"], "debug");
    assert_eq!(
        by_name["LINKERD_CNI_AGENT_HEALTH_ADDR"]["value"],
        "127.0.0.1:9999"
    );
    assert_eq!(
        by_name["LINKERD_CNI_AGENT_SOCKET"]["value"],
        linkerd_cni_common::paths::AGENT_SOCKET
    );
    assert_eq!(
        by_name["CONTAINER_MOUNT_PREFIX"]["value"],
        linkerd_cni_common::paths::CONTAINER_MOUNT_PREFIX
    );
    assert_eq!(
        by_name["CNI_NETWORK_CONFIG"]["valueFrom"]["configMapKeyRef"]["key"],
        "cni_network_config"
    );
    assert_eq!(by_name["LINKERD_CNI_AGENT_INSTALL"]["value"], "true");
    assert_eq!(by_name["LINKERD_CNI_AGENT_HOST_ROOT"]["value"], "/host");
    assert_eq!(
        by_name["LINKERD_CNI_AGENT_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"],
        "spec.nodeName"
    );
}

/// `--mode` (flag, `--set`, values file) reaches the agent as `LINKERD_CNI_AGENT_MODE`, and
/// that is all it changes: one DaemonSet for every mode (`auto`, the default, `ebpf`,
/// `iptables`).
#[test]
fn mode_reaches_the_agent() {
    let mode_of = |rendered: &str| {
        let objs = objects(rendered);
        let env = objs["DaemonSet/linkerd-cni"]
            .pointer("/spec/template/spec/containers/0/env")
            .cloned()
            .expect("env");
        env.as_array()
            .expect("list")
            .iter()
            .find(|e| e["name"] == "LINKERD_CNI_AGENT_MODE")
            .map(|e| e["value"].clone())
            .expect("LINKERD_CNI_AGENT_MODE")
    };
    let default = install_cni(&[], &[]);
    assert_eq!(mode_of(&default), "auto");
    let ipt = temp_file("mode-iptables.yaml", "mode: iptables\n");
    let ipt = ipt.display().to_string();
    for (args, want) in [
        (&["--mode=iptables"][..], "iptables"),
        (&["--set", "mode=iptables"], "iptables"),
        (&["-f", &ipt], "iptables"),
        (&["--mode=ebpf"], "ebpf"),
    ] {
        let rendered = install_cni(args, &[]);
        assert_eq!(mode_of(&rendered), want, "{args:?}");
        let changed = changed(&default, &rendered);
        let keys: Vec<&String> = changed.keys().collect();
        assert_eq!(
            keys.len(),
            1,
            "{args:?} changes only the agent's mode: {keys:?}"
        );
    }
}

/// Bad input is refused with a message naming the problem, and nothing is printed.
#[test]
fn errors() {
    let ipt = temp_file("nft.yaml", "mode: nft\n");
    let ipt = ipt.display().to_string();
    let cases: &[(&[&str], &str)] = &[
        (&["--mode=cilium"], "not supported"),
        (&["--set", "mode=cilium"], "not supported"),
        (&["-f", &ipt], "not supported"),
        (&["--inbound-port=0"], "not a port"),
        (&["--inbound-port=65536"], "not a port"),
        (&["--skip-inbound-ports=9100-9000"], "invalid port range"),
        (&["--redirect-ports=80-90"], "not a port"),
        (&["--proxy-uid=-1"], "-1"),
        (&["--set", "a[-1]=1"], "negative list index"),
        (&["--set", "tolerations[x]=1"], "not a number"),
        (&["--set", "agent.logLevel=true"], "expected a string"),
        (
            &["--set-file", "priorityClassName=/nonexistent/f"],
            "/nonexistent/f",
        ),
        (
            &["--cni-log-level=verbose"],
            "--cni-log-level must be one of: panic, fatal, error, warn, info, debug, trace",
        ),
        (&["-v", "stable/2"], "stable/2 is not a valid version"),
        (
            &["--registry=bad reg"],
            "bad reg is not a valid Docker registry",
        ),
        (&["--set", "agent.pinRoot=/tmp/x"], "agent.pinRoot"),
        (&["--set", "agent.logFormat=text"], "expected plain or json"),
        (&["--agent-log-format=text"], "--agent-log-format"),
        (
            &["--set", "agent.seLinuxOptions.typ=spc_t"],
            "agent.seLinuxOptions.typ",
        ),
        (
            &["--set", "agent.seLinuxOptions.level=1"],
            "expected a string",
        ),
        (
            &["--set", "agent.socketPath=/run/agent.sock"],
            "agent.socketPath",
        ),
        (
            &["--set", "agent.socketPath=/sys/l5d/agent.sock"],
            "directory of its own",
        ),
        (
            &["--set", "agent.socketPath=/host/l5d/agent.sock"],
            "directory of its own",
        ),
        (
            &["--set", "agent.socketPath=/var/lib/kubelet/l5d/agent.sock"],
            "agent.socketPath (from --set \"agent.socketPath=/var/lib/kubelet/l5d/agent.sock\"): \
             the socket's directory /var/lib/kubelet/l5d lies inside /var/lib/kubelet (owned by \
             kubelet)",
        ),
        (
            &["--set", "agent.pinRoot=/sys/fs/bpf/tc"],
            "the pin root /sys/fs/bpf/tc lies inside /sys/fs/bpf/tc (owned by another eBPF tenant)",
        ),
        (
            &["--set", "agent.pinRoot=/sys/fs/bpf/tc/"],
            "lies inside /sys/fs/bpf/tc (owned by another eBPF tenant)",
        ),
        (&["--dest-cni-net-dir=relative"], "absolute"),
        (
            &["-f", "/nonexistent/values.yaml"],
            "/nonexistent/values.yaml",
        ),
    ];
    for (args, want) in cases {
        let mut all = vec!["install-cni"];
        all.extend_from_slice(args);
        let out = linkerd(&all, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(
            out.stdout.is_empty(),
            "{args:?} printed manifests on failure"
        );
        assert!(
            stderr.contains(want),
            "{args:?}: stderr should mention {want:?}:\n{stderr}"
        );
    }
    let out = linkerd(&["install-cni"], &[("LINKERD_DOCKER_REGISTRY", "bad!")]);
    assert!(!out.status.success() && out.stdout.is_empty());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("bad! is not a valid Docker registry"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
/// Every render passes the official schemas of Kubernetes 1.30-1.34, strictly.
#[test]
fn kubernetes_validate_strict() {
    let renders = [
        ("default", install_cni(&[], &[])),
        ("full", full_render()),
        (
            "no-namespace",
            install_cni(&["--set", "installNamespace=false"], &[]),
        ),
        (
            "equal-cni-dirs",
            install_cni(
                &[
                    "--dest-cni-bin-dir=/etc/kubernetes/cni/net.d",
                    "--dest-cni-net-dir=/etc/kubernetes/cni/net.d",
                ],
                &[],
            ),
        ),
        (
            "linkerd-values",
            String::from_utf8(linkerd_values_render().stdout).expect("UTF-8"),
        ),
        (
            "uninstall",
            install_cni(&["--set", "uninstall.enabled=true"], &[]),
        ),
        (
            "uninstall-unprivileged",
            install_cni(
                &["--set", "uninstall.enabled=true,agent.mountBpffs=false"],
                &[],
            ),
        ),
    ];
    for (name, yaml) in &renders {
        for (k, obj) in objects(yaml) {
            assert_pod_spec_admissible(&format!("{name}: {k}"), &obj);
        }
        let file = temp_file(&format!("validate-{name}.yaml"), yaml);
        for version in ["1.30.0", "1.31.0", "1.32.0", "1.33.0", "1.34.0"] {
            let out = kubernetes_validate(version, &file);
            assert!(
                out.status.success(),
                "{name} render fails kubernetes-validate --strict for {version}:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    // The validator does reject what it should (so a pass above means something).
    let broken = renders[0].1.replace(
        "      serviceAccountName: linkerd-cni",
        "      serviceAccountNme: linkerd-cni",
    );
    assert_ne!(
        broken, renders[0].1,
        "the negative control must change the render"
    );
    let file = temp_file("validate-broken.yaml", &broken);
    assert!(
        !kubernetes_validate("1.34.0", &file).status.success(),
        "kubernetes-validate --strict accepted an unknown field"
    );
}

/// A `--set` key 20,000 levels deep (found by fuzzing: it overflowed the stack) is refused with
/// a message that says why, as names (Helm's nested level limit) and as list indexes (the
/// CLI's bound on depth); the process exits with an error, not a signal.
#[test]
fn deep_set_keys_are_refused_not_a_crash() {
    let names = format!("{}=1", vec!["a"; 20_000].join("."));
    let indexes = format!("a{}=1", "[0]".repeat(20_000));
    for (flag, expr, why) in [
        (
            "--set",
            &names,
            "key nested level is greater than the maximum supported nested level of 30",
        ),
        (
            "--set-string",
            &indexes,
            "key has more than 64 names and list indexes",
        ),
    ] {
        let out = linkerd(&["install-cni", flag, expr], &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{flag}: {stderr}");
        assert!(out.stdout.is_empty(), "{flag}: printed manifests");
        assert!(stderr.contains(why), "{flag}: {stderr}");
        assert!(
            stderr.contains(&format!("invalid {flag}")),
            "{flag}: the message names the flag: {stderr}"
        );
        assert!(stderr.len() < 1000, "{flag}: a short message: {stderr}");
    }
}

/// A value holding a character YAML cannot carry is refused with its key path and origin,
/// instead of rendering a manifest no YAML reader accepts (the fuzzer's `cli_values` finding:
/// an `image.name` with a DEL, 0x7f), whether it comes from `--set` or a values file.
#[test]
fn control_characters_in_values_are_refused_with_the_key() {
    let file = temp_file("control-char.yaml", "image:\n  name: \"x/y\\x7fz\"\n");
    let file = file.display().to_string();
    for args in [
        vec!["install-cni", "--set", "image.name=x/y\u{7f}z"],
        vec!["install-cni", "--set-string", "podLabels.a=b\u{1b}[31m"],
        vec!["install-cni", "-f", file.as_str()],
    ] {
        let out = linkerd(&args, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}: printed manifests");
        assert!(
            stderr.contains("which a YAML manifest cannot carry")
                && (stderr.contains("image.name") || stderr.contains("podLabels.a")),
            "{args:?}: {stderr}"
        );
    }
}

/// Precedence as Linkerd's `install-cni` has it, a case each: the flags (defaults included)
/// are the base and the values files and `--set` are coalesced over them; the image comes from
/// the flags, with `LINKERD_DOCKER_REGISTRY` overriding `--registry`, and a `--registry` equal
/// to Linkerd's default registry leaving a custom `--cni-image` as it is.
#[test]
fn precedence_matches_linkerd() {
    let uid_2000 = temp_file("uid-2000.yaml", "proxyUID: 2000\n");
    let uid_2000 = uid_2000.display().to_string();
    let file_image = temp_file("file-image.yaml", "image:\n  name: file.reg/team/agent\n");
    let file_image = file_image.display().to_string();
    let uid = |objs: &BTreeMap<String, Json>| {
        objs["ConfigMap/linkerd-cni-config"]["data"]["cni_network_config"]["linkerd"]["proxy-uid"]
            .clone()
    };
    let image = |objs: &BTreeMap<String, Json>| {
        objs["DaemonSet/linkerd-cni"]
            .pointer("/spec/template/spec/containers/0/image")
            .cloned()
            .unwrap_or_default()
    };
    type Case<'a> = (
        &'a str,
        Vec<&'a str>,
        Vec<(&'a str, &'a str)>,
        &'a str,
        Json,
    );
    let cases: Vec<Case> = vec![
        (
            "a values file wins over a flag (Linkerd: 2000, not 1000)",
            vec!["--proxy-uid", "1000", "-f", &uid_2000],
            vec![],
            "uid",
            json!(2000),
        ),
        (
            "the flag's environment variable is a flag: the file still wins",
            vec!["-f", &uid_2000],
            vec![("LINKERD_INSTALL_CNI_PROXY_UID", "1000")],
            "uid",
            json!(2000),
        ),
        (
            "--set wins over the flag and the file",
            vec![
                "--proxy-uid",
                "1000",
                "-f",
                &uid_2000,
                "--set",
                "proxyUID=3000",
            ],
            vec![],
            "uid",
            json!(3000),
        ),
        (
            "a flag alone",
            vec!["--proxy-uid", "1000"],
            vec![],
            "uid",
            json!(1000),
        ),
        (
            "LINKERD_DOCKER_REGISTRY overrides --registry",
            vec!["--registry=flag.reg"],
            vec![("LINKERD_DOCKER_REGISTRY", "env.reg")],
            "image",
            json!("env.reg/linkerd-cni-ebpf:v0.1.0"),
        ),
        (
            "LINKERD_DOCKER_REGISTRY overrides --registry given by its environment variable",
            vec![],
            vec![
                ("LINKERD_INSTALL_CNI_REGISTRY", "ours.reg"),
                ("LINKERD_DOCKER_REGISTRY", "env.reg"),
            ],
            "image",
            json!("env.reg/linkerd-cni-ebpf:v0.1.0"),
        ),
        (
            "--registry equal to Linkerd's default keeps a custom --cni-image",
            vec![
                "--registry",
                "cr.l5d.io/linkerd",
                "--cni-image",
                "my.reg/custom/agent",
            ],
            vec![],
            "image",
            json!("my.reg/custom/agent:v0.1.0"),
        ),
        (
            "another --registry replaces the custom image's registry",
            vec!["--registry", "r.io/x", "--cni-image", "my.reg/custom/agent"],
            vec![],
            "image",
            json!("r.io/x/agent:v0.1.0"),
        ),
        (
            "the registry applies to the flags' image, not to a values file's",
            vec!["--registry=r.io", "-f", &file_image],
            vec![("LINKERD_DOCKER_REGISTRY", "env.reg")],
            "image",
            json!("file.reg/team/agent:v0.1.0"),
        ),
    ];
    for (what, args, env, field, want) in cases {
        let objs = objects(&install_cni(&args, &env));
        let got = match field {
            "uid" => uid(&objs),
            _ => image(&objs),
        };
        assert_eq!(got, want, "{what}: install-cni {args:?} {env:?}");
    }
}

/// One host directory for CNI binaries and configs (k3s-style, Linkerd's "equal
/// destinations" golden case) renders one mount and one volume, as Linkerd's chart does: the
/// API server refuses a container with two mounts at the same path, which the schema
/// validation alone does not see (negative control: the render with the second mount put
/// back).
#[test]
fn equal_cni_dirs_render_one_mount() {
    const DIR: &str = "/etc/kubernetes/cni/net.d";
    let yaml = install_cni(
        &[
            &format!("--dest-cni-bin-dir={DIR}"),
            &format!("--dest-cni-net-dir={DIR}"),
        ],
        &[],
    );
    let objs = objects(&yaml);
    let cm = &objs["ConfigMap/linkerd-cni-config"]["data"];
    assert_eq!(
        (&cm["dest_cni_bin_dir"], &cm["dest_cni_net_dir"]),
        (&json!(DIR), &json!(DIR))
    );
    let ds = &objs["DaemonSet/linkerd-cni"];
    let spec = &ds["spec"]["template"]["spec"];
    let cni_mounts: Vec<&Json> = spec["containers"][0]["volumeMounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .filter(|m| m["name"].as_str().is_some_and(|n| n.starts_with("cni-")))
        .collect();
    assert_eq!(
        cni_mounts,
        [&json!({"name": "cni-net-dir", "mountPath": format!("/host{DIR}")})]
    );
    let cni_volumes: Vec<&str> = spec["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .filter_map(|v| v["name"].as_str())
        .filter(|n| n.starts_with("cni-"))
        .collect();
    assert_eq!(cni_volumes, ["cni-net-dir"]);
    assert_eq!(pod_spec_violations(spec), Vec::<String>::new());

    // What was rendered before: a second mount at the same path, which the API server refuses.
    let mut twice = spec.clone();
    twice["volumes"]
        .as_array_mut()
        .expect("volumes")
        .push(json!({"name": "cni-bin-dir", "hostPath": {"path": DIR}}));
    twice["containers"][0]["volumeMounts"]
        .as_array_mut()
        .expect("mounts")
        .insert(
            0,
            json!({"name": "cni-bin-dir", "mountPath": format!("/host{DIR}")}),
        );
    assert_eq!(
        pod_spec_violations(&twice),
        [format!(
            "install-cni: volumeMounts mountPath \"/host{DIR}\": must be unique"
        )]
    );
    // Distinct directories keep both mounts.
    let objs = objects(&install_cni(&[], &[]));
    let names: Vec<&str> = objs["DaemonSet/linkerd-cni"]["spec"]["template"]["spec"]["containers"]
        [0]["volumeMounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .filter_map(|m| m["name"].as_str())
        .filter(|n| n.starts_with("cni-"))
        .collect();
    assert_eq!(names, ["cni-bin-dir", "cni-net-dir"]);
}

/// `linkerd.io/created-by` is on the DaemonSet and its pod template by default, as Linkerd's
/// CLI and chart put it: `linkerd/cli <version>` from the CLI, `linkerd/helm <image version>`
/// from Helm; a `cliVersion` value replaces both.
#[test]
fn created_by_annotations() {
    let created_by = |yaml: &str| -> Vec<Json> {
        let objs = objects(yaml);
        CREATED_BY
            .iter()
            .map(|p| {
                objs["DaemonSet/linkerd-cni"]
                    .pointer(p)
                    .cloned()
                    .unwrap_or_default()
            })
            .collect()
    };
    let version = env!("CARGO_PKG_VERSION");
    let cli = format!("linkerd/cli v{version}");
    assert_eq!(created_by(&install_cni(&[], &[])), [json!(cli), json!(cli)]);
    let set = install_cni(&["--set", "cliVersion=linkerd/cli stable-2.14.10"], &[]);
    assert_eq!(
        created_by(&set),
        [
            json!("linkerd/cli stable-2.14.10"),
            json!("linkerd/cli stable-2.14.10")
        ]
    );
    let helm = format!("linkerd/helm v{version}");
    assert_eq!(
        created_by(&helm_template_args("linkerd-cni", &[])),
        [json!(helm), json!(helm)]
    );
    let tagged = ["--set".to_string(), "image.version=v9.9.9".to_string()];
    assert_eq!(
        created_by(&helm_template_args("linkerd-cni", &tagged)),
        [json!("linkerd/helm v9.9.9"), json!("linkerd/helm v9.9.9")]
    );
}

/// Every values error names the key path and the file, flag, environment variable or `--set`
/// it came from; reading and parsing errors name the source.
#[test]
fn values_errors_name_key_and_origin() {
    let bad_uid = temp_file("bad-uid.yaml", "proxyUID: abc\n");
    let bad_uid = bad_uid.display().to_string();
    let labels = temp_file("bad-labels.yaml", "commonLabels:\n  team: 1\n");
    let labels = labels.display().to_string();
    let not_yaml = temp_file("not-yaml.yaml", "a: [\n");
    let not_yaml = not_yaml.display().to_string();
    type Case<'a> = (Vec<&'a str>, Vec<(&'a str, &'a str)>, String);
    let cases: Vec<Case> = vec![
        (
            vec!["-f", &bad_uid],
            vec![],
            format!(
                "invalid value for proxyUID (from values file {bad_uid}): expected an integer, \
                 got the string \"abc\""
            ),
        ),
        (
            vec!["-f", &bad_uid, "--set-string", "proxyUID=2000"],
            vec![],
            String::new(),
        ),
        (
            vec!["--set-string", "useWaitFlag=true"],
            vec![],
            "invalid value for useWaitFlag (from --set-string \"useWaitFlag=true\"): expected \
             true or false, got the string \"true\""
                .into(),
        ),
        (
            vec!["--set", "tolerations=x"],
            vec![],
            "invalid value for tolerations (from --set \"tolerations=x\"): expected a list, got \
             the string \"x\""
                .into(),
        ),
        (
            vec!["-f", &labels],
            vec![],
            format!(
                "invalid value for commonLabels.team (from values file {labels}): expected a string"
            ),
        ),
        (
            vec!["--dest-cni-net-dir=relative"],
            vec![],
            "invalid value for destCNINetDir (from --dest-cni-net-dir): \"relative\" is not an \
             absolute path"
                .into(),
        ),
        (
            vec![],
            vec![("LINKERD_INSTALL_CNI_DEST_CNI_BIN_DIR", "relative")],
            "invalid value for destCNIBinDir (from $LINKERD_INSTALL_CNI_DEST_CNI_BIN_DIR)".into(),
        ),
        (
            vec![
                "--set",
                "tolerations[0].operator=Exists,agent.healthPort=99999",
            ],
            vec![],
            "invalid value for agent.healthPort (from --set \"tolerations[0].operator=Exists,\
             agent.healthPort=99999\"): 99999 is out of range (1 to 65535)"
                .into(),
        ),
        (
            vec!["-f", &not_yaml],
            vec![],
            format!("parsing values from values file {not_yaml}: "),
        ),
        (
            vec!["-f", "/nonexistent/values.yaml"],
            vec![],
            "reading values file /nonexistent/values.yaml: No such file or directory".into(),
        ),
    ];
    for (args, env, want) in cases {
        let mut all = vec!["install-cni"];
        all.extend_from_slice(&args);
        let out = linkerd(&all, &env);
        let stderr = String::from_utf8_lossy(&out.stderr);
        if want.is_empty() {
            assert!(out.status.success(), "{args:?}: {stderr}");
            continue;
        }
        assert!(!out.status.success(), "{args:?} {env:?} should fail");
        assert!(
            stderr.contains(&want),
            "{args:?} {env:?}: stderr should contain {want:?}:\n{stderr}"
        );
    }
}

/// `-f` takes what Helm (and Linkerd) take: an http(s) URL (redirects followed), `-` for
/// standard input, and comma-separated lists; a URL that does not answer 200 is an error that
/// names it. `helm template -f <URL>` renders the same.
#[test]
fn values_from_urls_and_stdin() {
    let server = LocalHttp::start(vec![
        (
            "/values.yaml",
            "200 OK",
            "",
            "proxyUID: 2000\ninboundProxyPort: \"6143\"\n",
        ),
        ("/moved", "302 Found", "Location: /values.yaml", ""),
        ("/admin.yaml", "200 OK", "", "proxyAdminPort: \"5191\"\n"),
    ]);
    let linkerd_section = |yaml: &str| {
        objects(yaml)["ConfigMap/linkerd-cni-config"]["data"]["cni_network_config"]["linkerd"]
            .clone()
    };
    for url in [server.url("/values.yaml"), server.url("/moved")] {
        let l = linkerd_section(&install_cni(&["-f", &url], &[]));
        assert_eq!(
            (&l["proxy-uid"], &l["incoming-proxy-port"]),
            (&json!(2000), &json!(6143)),
            "{url}"
        );
    }
    // Comma-separated, in order, as Linkerd's StringSlice flag splits them.
    let both = format!(
        "{},{}",
        server.url("/values.yaml"),
        server.url("/admin.yaml")
    );
    let cli = install_cni(&["-f", &both], &[]);
    let l = linkerd_section(&cli);
    assert_eq!(
        (&l["proxy-uid"], &l["inbound-ports-to-ignore"][0]),
        (&json!(2000), &json!("5191"))
    );
    // Helm fetches the same URLs and renders the same objects.
    let helm_args: Vec<String> = [
        "-f",
        &server.url("/values.yaml"),
        "-f",
        &server.url("/admin.yaml"),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut want = objects(&cli);
    want.remove("Namespace/linkerd-cni");
    let mut got = objects(&helm_template_args("linkerd-cni", &helm_args));
    normalize_created_by(&mut want);
    normalize_created_by(&mut got);
    assert_eq!(
        want, got,
        "helm template -f <URL> renders what the CLI renders"
    );

    let missing = server.url("/missing.yaml");
    let out = linkerd(&["install-cni", "-f", &missing], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && out.stdout.is_empty());
    assert!(
        stderr.contains(&format!(
            "reading values URL {missing}: the server answered 404"
        )),
        "{stderr}"
    );

    // Standard input.
    let mut child = linkerd_command(&["install-cni", "-f", "-"], &[])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("running linkerd");
    {
        use std::io::Write;
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(b"proxyUID: 3000\n")
            .expect("writing stdin");
    }
    let out = child.wait_with_output().expect("linkerd");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let l = linkerd_section(&String::from_utf8(out.stdout).expect("UTF-8"));
    assert_eq!(l["proxy-uid"], json!(3000));
}

/// Values files are YAML 1.1 to Helm and YAML 1.2 to the CLI: a plain `yes`, `off`, `010` or
/// `1_000` means a boolean or an integer to Helm and a string here, so the CLI refuses it,
/// naming the key and the file, rather than render something else than `helm template`;
/// quoted, it is a string to both and both render it alike.
#[test]
fn yaml_1_1_plain_scalars_are_refused_not_misread() {
    for (text, key, helm) in [
        ("useWaitFlag: yes\n", "useWaitFlag", "the boolean true"),
        (
            "priorityClassName: off # the default\n",
            "priorityClassName",
            "the boolean false",
        ),
        (
            "commonLabels: {tier: on}\n",
            "commonLabels.tier",
            "the boolean true",
        ),
        (
            "image:\n  version: 010\n",
            "image.version",
            "an octal integer",
        ),
        (
            "tolerations:\n  - key: a\n    value: 1_000\n",
            "tolerations[0].value",
            "an integer",
        ),
    ] {
        let file = temp_file("yaml-1-1.yaml", text);
        let f = file.display().to_string();
        let out = linkerd(&["install-cni", "-f", &f], &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{text:?} rendered");
        assert!(
            stderr.contains(&format!(
                "invalid value for {key} (from values file {f}): the plain value"
            )) && stderr.contains(helm),
            "{text:?}: {stderr}"
        );
    }
    let quoted = temp_file(
        "yaml-1-1-quoted.yaml",
        "priorityClassName: \"yes\"\ncommonLabels: {tier: 'on'}\nimage:\n  version: \"010\"\n",
    );
    let args = vec!["-f".to_string(), quoted.display().to_string()];
    let mut cli = objects(&install_cni(
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
        &[],
    ));
    cli.remove("Namespace/linkerd-cni");
    let mut helm = objects(&helm_template_args("linkerd-cni", &args));
    normalize_created_by(&mut cli);
    normalize_created_by(&mut helm);
    assert_eq!(cli, helm, "quoted, both read strings");
    assert_eq!(
        cli["DaemonSet/linkerd-cni"].pointer("/spec/template/spec/priorityClassName"),
        Some(&json!("yes"))
    );
}

/// The mount of `c` that holds container path `path` (the deepest whose mountPath is a
/// component-wise prefix of it), and the host path it is mounted from.
fn mount_of<'a>(pod: &'a Json, c: &'a Json, path: &str) -> Option<(&'a Json, String)> {
    let under = |p: &str, root: &str| {
        let root = root.trim_end_matches('/');
        p == root || p.starts_with(&format!("{root}/"))
    };
    let m = c["volumeMounts"]
        .as_array()?
        .iter()
        .filter(|m| under(path, m["mountPath"].as_str().unwrap_or("-")))
        .max_by_key(|m| m["mountPath"].as_str().map_or(0, str::len))?;
    let volume = pod["volumes"]
        .as_array()?
        .iter()
        .find(|v| v["name"] == m["name"])?;
    let host_root = volume["hostPath"]["path"].as_str()?;
    let rest = &path[m["mountPath"].as_str()?.trim_end_matches('/').len()..];
    Some((m, format!("{}{rest}", host_root.trim_end_matches('/'))))
}

/// Issue 37: every path value moves everything that depends on it. For each value, rendered:
/// every path the agent writes (its socket, its pod registry, its pins, the plugin binary, the
/// kubeconfig and the conflists) is on a writable hostPath mount of the agent container, at
/// the host path the value names, and the plugin (on the host) connects to the socket's host
/// path. A path left on the container's read-only root (as the registry was with
/// `agent.socketPath` moved) fails here.
#[test]
fn every_path_the_agent_writes_is_on_a_writable_mount() {
    use linkerd_cni_common::paths;
    let cases: &[(&str, &[&str])] = &[
        ("default", &[]),
        (
            "agent.socketPath",
            &["--set", "agent.socketPath=/var/run/l5d/agent.sock"],
        ),
        (
            "agent.socketPath (deep)",
            &["--set", "agent.socketPath=/opt/l5d/run/cni/a.sock"],
        ),
        (
            "agent.pinRoot",
            &["--set", "agent.pinRoot=/sys/fs/bpf/l5d/node"],
        ),
        (
            "agent.bpffsPath",
            &[
                "--set",
                "agent.bpffsPath=/run/l5d-bpf,agent.pinRoot=/run/l5d-bpf/l5d",
            ],
        ),
        (
            "destCNINetDir",
            &["--dest-cni-net-dir=/etc/kubernetes/cni/net.d"],
        ),
        ("destCNIBinDir", &["--dest-cni-bin-dir=/usr/libexec/cni"]),
        (
            "equal CNI dirs",
            &[
                "--dest-cni-net-dir=/var/lib/rancher/k3s/data/cni",
                "--dest-cni-bin-dir=/var/lib/rancher/k3s/data/cni",
            ],
        ),
    ];
    for (what, args) in cases {
        let objs = objects(&install_cni(args, &[]));
        let pod = &objs["DaemonSet/linkerd-cni"]["spec"]["template"]["spec"];
        let c = &pod["containers"][0];
        let env: BTreeMap<&str, &Json> = c["env"]
            .as_array()
            .expect("env")
            .iter()
            .map(|e| (e["name"].as_str().expect("name"), &e["value"]))
            .collect();
        // What the agent reads, or its built-in default when the chart sets nothing.
        let var = |name: &str, default: &str| -> String {
            env.get(name)
                .and_then(|v| v.as_str())
                .unwrap_or(default)
                .to_string()
        };
        let config = &objs["ConfigMap/linkerd-cni-config"]["data"];
        let prefix = var("CONTAINER_MOUNT_PREFIX", "");
        let net_dir = config["dest_cni_net_dir"].as_str().expect("net dir");
        let bin_dir = config["dest_cni_bin_dir"].as_str().expect("bin dir");
        let socket = var("LINKERD_CNI_AGENT_SOCKET", paths::AGENT_SOCKET);
        let plugin_conf = &config["cni_network_config"];
        // (what the agent writes, where it is in the container, where the host has it)
        let written = [
            ("the registration socket", socket.clone(), socket.clone()),
            (
                "the pod registry",
                var("LINKERD_CNI_AGENT_STATE_DIR", paths::STATE_DIR),
                format!("{}/pods", socket.rsplit_once('/').expect("dir").0),
            ),
            (
                "the pins",
                var("LINKERD_CNI_AGENT_PIN_ROOT", paths::PIN_ROOT),
                var("LINKERD_CNI_AGENT_PIN_ROOT", paths::PIN_ROOT),
            ),
            (
                "the conflists and kubeconfig",
                format!("{prefix}{net_dir}"),
                net_dir.to_string(),
            ),
            (
                "the plugin binary",
                format!("{prefix}{bin_dir}/linkerd-cni"),
                format!("{bin_dir}/linkerd-cni"),
            ),
        ];
        for (thing, in_container, on_host) in written {
            let (m, host) = mount_of(pod, c, &in_container).unwrap_or_else(|| {
                panic!("{what}: {thing} ({in_container}) is on no mount: the read-only root")
            });
            assert_ne!(
                m["readOnly"], true,
                "{what}: {thing} ({in_container}) is on a read-only mount"
            );
            assert_eq!(
                host, on_host,
                "{what}: {thing} is not where the host expects it"
            );
        }
        assert_eq!(
            plugin_conf["linkerd"]["agent-socket"], socket,
            "{what}: the plugin connects to the agent's socket"
        );
        assert_eq!(
            c["securityContext"]["readOnlyRootFilesystem"], true,
            "{what}"
        );
    }
}

/// Issue 36: `agent.seLinuxOptions` labels the agent and the mount-bpffs init container (and
/// nothing else: not the operator's extraInitContainers); unset by default. `privileged`
/// changes nothing but a warning naming it.
#[test]
fn se_linux_options_and_privileged() {
    let pod_of = |args: &[&str]| {
        objects(&install_cni(args, &[]))["DaemonSet/linkerd-cni"]["spec"]["template"]["spec"]
            .clone()
    };
    let containers = |pod: &Json| -> Vec<(String, Json)> {
        ["initContainers", "containers"]
            .iter()
            .flat_map(|k| pod[*k].as_array().cloned().unwrap_or_default())
            .map(|c| {
                (
                    c["name"].as_str().expect("name").to_string(),
                    c["securityContext"]["seLinuxOptions"].clone(),
                )
            })
            .collect()
    };
    let default = pod_of(&[]);
    assert!(
        containers(&default).iter().all(|(_, o)| o.is_null()),
        "{:?}",
        containers(&default)
    );
    let extra = temp_file(
        "selinux.yaml",
        "agent:\n  seLinuxOptions:\n    type: spc_t\nextraInitContainers:\n  - name: x\n    image: x\n",
    );
    let labelled = pod_of(&["-f", &extra.display().to_string()]);
    assert_eq!(
        containers(&labelled),
        [
            ("mount-bpffs".to_string(), json!({"type": "spc_t"})),
            ("x".to_string(), Json::Null),
            ("install-cni".to_string(), json!({"type": "spc_t"})),
        ]
    );
    assert!(pod_spec_violations(&labelled).is_empty());
    let out = linkerd(&["install-cni", "--set", "privileged=true"], &[]);
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        linkerd_cli::install_cni::PRIVILEGED_WARNING
    );
    assert_eq!(
        objects(&String::from_utf8_lossy(&out.stdout)),
        objects(&install_cni(&[], &[])),
        "privileged changes no object"
    );
}

/// Issue 37: `agent.metrics.podMonitor.enabled` renders a Prometheus Operator PodMonitor for the
/// agents' /metrics (only with `agent.metrics.enabled`, refused otherwise), selecting the
/// DaemonSet's pods in the release namespace and scraping the pod IP (the node's) at
/// `agent.metrics.port`, IPv6 in brackets.
#[test]
fn pod_monitor_scrapes_the_agents_metrics_port() {
    let objs = objects(&install_cni(&[], &[]));
    assert!(!objs.keys().any(|k| k.starts_with("PodMonitor/")), "opt-in");
    let objs = objects(&install_cni(
        &[
            "--set",
            "agent.metrics.enabled=true,agent.metrics.port=9100,agent.metrics.podMonitor.enabled=true",
            "--set",
            "agent.metrics.podMonitor.labels.release=prom,agent.metrics.podMonitor.interval=15s",
        ],
        &[],
    ));
    let pm = &objs["PodMonitor/linkerd-cni"];
    assert_eq!(pm["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(pm["metadata"]["namespace"], "linkerd-cni");
    assert_eq!(pm["metadata"]["labels"]["release"], "prom");
    let pod_labels = &objs["DaemonSet/linkerd-cni"]["spec"]["template"]["metadata"]["labels"];
    for (k, v) in pm["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("selector")
    {
        assert_eq!(
            &pod_labels[k], v,
            "the selector matches the DaemonSet's pods"
        );
    }
    assert_eq!(
        pm["spec"]["namespaceSelector"]["matchNames"],
        json!(["linkerd-cni"])
    );
    let ep = &pm["spec"]["podMetricsEndpoints"][0];
    assert_eq!(
        (ep["path"].as_str(), ep["interval"].as_str()),
        (Some("/metrics"), Some("15s"))
    );
    let relabel = ep["relabelings"].as_array().expect("relabelings");
    assert_eq!(relabel[0]["regex"], "install-cni");
    assert_eq!(relabel[0]["action"], "keep");
    assert_eq!(relabel[1]["replacement"], "${1}:9100");
    assert_eq!(relabel[2]["replacement"], "[${1}]:9100");
    assert!(
        relabel
            .iter()
            .all(|r| r["action"] == "keep" || r["targetLabel"].is_string())
    );

    let out = linkerd(
        &[
            "install-cni",
            "--set",
            "agent.metrics.podMonitor.enabled=true",
        ],
        &[],
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("needs agent.metrics.enabled"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Issue 36 item 1: the agent's container holds BPF, NET_ADMIN and PERFMON only; `agent.sysAdmin`
/// (adoption of pods running before the plugin, user-namespaced pods) adds CAP_SYS_ADMIN and
/// nothing else.
#[test]
fn sys_admin_only_with_agent_sys_admin() {
    let caps = |args: &[&str]| {
        objects(&install_cni(args, &[]))["DaemonSet/linkerd-cni"]["spec"]["template"]["spec"]
            ["containers"][0]["securityContext"]["capabilities"]
            .clone()
    };
    assert_eq!(caps(&[])["add"], json!(["BPF", "NET_ADMIN", "PERFMON"]));
    let with = caps(&["--set", "agent.sysAdmin=true"]);
    assert_eq!(
        with["add"],
        json!(["BPF", "NET_ADMIN", "PERFMON", "SYS_ADMIN"])
    );
    assert_eq!(with["drop"], json!(["ALL"]));
}

/// `repairController.enabled=false`: the agent is told not to repair
/// (`LINKERD_CNI_AGENT_REPAIR_PODS=false`) and its ServiceAccount may delete nothing; by
/// default neither the variable (the agent repairs) nor the verb is missing.
#[test]
fn repair_controller_enabled_maps_to_the_agents_repair_and_its_rbac() {
    for (args, repairs) in [
        (vec![], true),
        (vec!["--set", "repairController.enabled=false"], false),
    ] {
        let objs = objects(&install_cni(&args, &[]));
        let env = objs["DaemonSet/linkerd-cni"]
            .pointer("/spec/template/spec/containers/0/env")
            .and_then(Json::as_array)
            .cloned()
            .unwrap_or_default();
        let repair_env = env
            .iter()
            .find(|e| e["name"] == "LINKERD_CNI_AGENT_REPAIR_PODS")
            .map(|e| e["value"].clone());
        assert_eq!(
            repair_env,
            (!repairs).then(|| json!("false")),
            "{args:?}: the agent's --repair-pods"
        );
        let deletes = objs["ClusterRole/linkerd-cni"]["rules"]
            .as_array()
            .expect("rules")
            .iter()
            .any(|r| {
                r["verbs"]
                    .as_array()
                    .is_some_and(|v| v.contains(&json!("delete")))
            });
        assert_eq!(deletes, repairs, "{args:?}: delete on pods granted");
    }
}

/// Issue 44 item 1: `agent.startupTaint` renders the toleration, the agent's flag, the nodes
/// patch and the admission policy together; off, none of them; `admissionPolicy=false` leaves
/// the policy out (clusters older than 1.30) and keeps the rest.
#[test]
fn startup_taint_renders_all_or_nothing() {
    let taint = json!({"key": "cni.linkerd.io/agent-not-ready", "operator": "Exists", "effect": "NoSchedule"});
    let none = temp_file("no-tolerations.yaml", "tolerations: []\n");
    let none = none.display().to_string();
    for (args, on, policy) in [
        (vec![], true, true),
        (
            vec!["--set", "agent.startupTaint.admissionPolicy=false"],
            true,
            false,
        ),
        (
            vec!["--set", "agent.startupTaint.enabled=false"],
            false,
            false,
        ),
        (
            vec!["--set", "agent.startupTaint.enabled=false", "-f", &none],
            false,
            false,
        ),
        (vec!["-f", &none], true, true),
    ] {
        let docs = docs(&install_cni(&args, &[]));
        let objs: std::collections::BTreeMap<String, Json> =
            docs.iter().map(|d| (key(d), d.clone())).collect();
        let pod = &objs["DaemonSet/linkerd-cni"]["spec"]["template"]["spec"];
        let tolerations = pod["tolerations"].as_array().cloned().unwrap_or_default();
        assert_eq!(
            tolerations.contains(&taint),
            on,
            "{args:?}: {tolerations:?}"
        );
        let env = &pod["containers"][0]["env"];
        let flag = env
            .as_array()
            .expect("env")
            .iter()
            .find(|e| e["name"] == "LINKERD_CNI_AGENT_REMOVE_STARTUP_TAINT");
        assert_eq!(
            flag.map(|e| e["value"].clone()),
            on.then(|| json!("true")),
            "{args:?}"
        );
        let rules = objs["ClusterRole/linkerd-cni"]["rules"]
            .as_array()
            .cloned()
            .expect("rules");
        let nodes = rules.iter().any(|r| r["resources"] == json!(["nodes"]));
        assert_eq!(nodes, on, "{args:?}: nodes patch granted");
        assert_eq!(
            objs.contains_key("ValidatingAdmissionPolicy/linkerd-cni-startup-taint"),
            policy,
            "{args:?}"
        );
        assert_eq!(
            objs.contains_key("ValidatingAdmissionPolicyBinding/linkerd-cni-startup-taint"),
            policy,
            "{args:?}"
        );
        if !on && args.contains(&none.as_str()) {
            assert!(pod.get("tolerations").is_none(), "{args:?}: {pod:?}");
        }
    }
    // The policy names the release's ServiceAccount and the taint's key.
    let docs = docs(&install_cni(&["--cni-namespace", "l5d-cni"], &[]));
    let vap = docs
        .iter()
        .find(|d| d["kind"] == "ValidatingAdmissionPolicy")
        .expect("policy");
    let text = vap.to_string();
    assert!(
        text.contains("system:serviceaccount:l5d-cni:linkerd-cni"),
        "{text}"
    );
    assert!(text.contains("cni.linkerd.io/agent-not-ready"), "{text}");
    assert!(
        text.contains("authentication.kubernetes.io/node-name"),
        "{text}"
    );
}
