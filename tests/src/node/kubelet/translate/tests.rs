//! The translation on hand-written pods: what each field becomes in CRI terms, and what is
//! refused.

use serde_json::json;

use super::*;

fn node() -> NodeInfo {
    NodeInfo {
        name: "n1".into(),
        ip: Ipv4Addr::new(172, 31, 0, 2),
        labels: [("kubernetes.io/os".to_string(), "linux".to_string())].into(),
        cluster_dns: Ipv4Addr::new(10, 96, 0, 10),
        cluster_domain: "cluster.local".into(),
        api_service: SocketAddrV4::new(Ipv4Addr::new(10, 96, 0, 1), 443),
        resolv_conf: "search example.test\nnameserver 192.0.2.53\noptions edns0\n".into(),
        etc_hosts: "127.0.0.1 localhost\n".into(),
        pods_dir: "/var/lib/kubelet/pods".into(),
        logs_dir: "/var/log/pods".into(),
        memory_bytes: 8 << 30,
    }
}

fn objects() -> Vec<Value> {
    vec![json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "cfg", "namespace": "ns1"},
        "data": {"dir": "/etc/cni/net.d", "conf": "{}"},
    })]
}

/// A pod with one container `c` whose fields are `container`, bound to node `n1`.
fn pod(spec: Value, container: Value) -> Value {
    let mut c = json!({"name": "c", "image": "example.test/agent:1"});
    if let (Some(c), Some(extra)) = (c.as_object_mut(), container.as_object()) {
        c.extend(extra.clone());
    }
    let mut p = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p1", "namespace": "ns1", "uid": "u1"},
        "spec": {"nodeName": "n1", "containers": [c]},
    });
    if let (Some(s), Some(extra)) = (p["spec"].as_object_mut(), spec.as_object()) {
        s.extend(extra.clone());
    }
    p
}

fn run(p: &Value) -> Result<PodPlan> {
    let objects = objects();
    translate(
        p,
        &node(),
        &ClusterView {
            objects: &objects,
            ca_pem: "CA",
        },
    )
}

fn sc(plan: &PodPlan) -> cri::LinuxContainerSecurityContext {
    plan.containers[0]
        .config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.clone())
        .unwrap()
}

#[test]
fn a_non_privileged_container_gets_its_capabilities_seccomp_and_no_new_privs() {
    let plan = run(&pod(
        json!({"hostNetwork": true}),
        json!({"securityContext": {
            "runAsUser": 0,
            "readOnlyRootFilesystem": true,
            "allowPrivilegeEscalation": false,
            "capabilities": {"drop": ["ALL"], "add": ["BPF", "NET_ADMIN", "SYS_PTRACE"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        }}),
    ))
    .unwrap();
    let s = sc(&plan);
    assert!(!s.privileged);
    let caps = s.capabilities.unwrap();
    assert_eq!(caps.add_capabilities, ["BPF", "NET_ADMIN", "SYS_PTRACE"]);
    assert_eq!(caps.drop_capabilities, ["ALL"]);
    assert!(s.no_new_privs && s.readonly_rootfs);
    assert_eq!(s.run_as_user.unwrap().value, 0);
    assert_eq!(
        s.seccomp.unwrap().profile_type,
        cri::security_profile::ProfileType::RuntimeDefault as i32
    );
    assert_eq!(s.masked_paths.len(), MASKED_PATHS.len());
    assert!(
        !plan
            .sandbox
            .linux
            .unwrap()
            .security_context
            .unwrap()
            .privileged
    );
}

/// The API's rule, as it is written: `allowPrivilegeEscalation: false` is refused with
/// `privileged: true` and with an added capability spelled `CAP_SYS_ADMIN`; spelled
/// `SYS_ADMIN` it is admitted and kubelet sets no_new_privs.
#[test]
fn no_escalation_is_refused_with_privileged_or_cap_sys_admin_as_written() {
    let with = |sc: serde_json::Value| run(&pod(json!({}), json!({ "securityContext": sc })));
    for refused in [
        json!({"allowPrivilegeEscalation": false, "privileged": true}),
        json!({"allowPrivilegeEscalation": false, "capabilities": {"add": ["CAP_SYS_ADMIN"]}}),
    ] {
        let err = with(refused.clone()).unwrap_err();
        assert!(
            err.to_string().contains("allowPrivilegeEscalation"),
            "{refused}: {err}"
        );
    }
    let plan =
        with(json!({"allowPrivilegeEscalation": false, "capabilities": {"add": ["SYS_ADMIN"]}}))
            .unwrap();
    assert!(sc(&plan).no_new_privs);
}

#[test]
fn bidirectional_propagation_needs_a_privileged_container() {
    let volume = json!({"volumes": [{"name": "b", "hostPath": {"path": "/sys/fs/bpf"}}]});
    let mount = |privileged: bool, propagation: &str| {
        json!({
            "securityContext": {"privileged": privileged},
            "volumeMounts": [{"name": "b", "mountPath": "/sys/fs/bpf", "mountPropagation": propagation}],
        })
    };
    let err = run(&pod(volume.clone(), mount(false, "Bidirectional"))).unwrap_err();
    assert!(err.to_string().contains("only to privileged"), "{err}");
    for (privileged, propagation, want) in [
        (
            true,
            "Bidirectional",
            cri::MountPropagation::PropagationBidirectional,
        ),
        (
            false,
            "HostToContainer",
            cri::MountPropagation::PropagationHostToContainer,
        ),
        (false, "None", cri::MountPropagation::PropagationPrivate),
    ] {
        let plan = run(&pod(volume.clone(), mount(privileged, propagation))).unwrap();
        let m = &plan.containers[0].config.mounts[0];
        assert_eq!(m.propagation, want as i32, "{propagation}");
        assert_eq!(m.host_path, "/sys/fs/bpf");
    }
}

#[test]
fn the_environment_takes_downward_api_config_map_and_service_values() {
    let plan = run(&pod(
        json!({"hostNetwork": true}),
        json!({
            "command": ["run", "$(DIR)", "$$(DIR)", "$(NOPE)"],
            "env": [
                {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                {"name": "HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
                {"name": "DIR", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "dir"}}},
                {"name": "GONE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "x", "optional": true}}},
                {"name": "PATHS", "value": "$(DIR):$(NODE)"},
            ],
        }),
    ))
    .unwrap();
    let c = &plan.containers[0].config;
    let env: BTreeMap<&str, &str> = c
        .envs
        .iter()
        .map(|kv| (kv.key.as_str(), kv.value.as_str()))
        .collect();
    assert_eq!(env["NS"], "ns1");
    assert_eq!(env["NODE"], "n1");
    assert_eq!(env["HOST_IP"], "172.31.0.2");
    assert_eq!(env["DIR"], "/etc/cni/net.d");
    assert_eq!(env["PATHS"], "/etc/cni/net.d:n1");
    assert!(!env.contains_key("GONE"));
    assert_eq!(env["KUBERNETES_SERVICE_HOST"], "10.96.0.1");
    assert_eq!(env["KUBERNETES_SERVICE_PORT"], "443");
    assert_eq!(c.command, ["run", "/etc/cni/net.d", "$(DIR)", "$(NOPE)"]);
    let err = run(&pod(
        json!({}),
        json!({"env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "x"}}}]}),
    ))
    .unwrap_err();
    assert!(err.to_string().contains("has no key x"), "{err}");
}

#[test]
fn probes_resolve_named_ports_on_the_pod_address_with_kubelet_defaults() {
    let plan = run(&pod(
        json!({"hostNetwork": true}),
        json!({
            "ports": [{"name": "admin", "containerPort": 9990}],
            "readinessProbe": {"httpGet": {"path": "/ready", "port": "admin"}, "periodSeconds": 5},
            "livenessProbe": {"httpGet": {"path": "/live", "port": 9991, "host": "127.0.0.1"}},
        }),
    ))
    .unwrap();
    let c = &plan.containers[0];
    let r = c.readiness.as_ref().unwrap();
    assert_eq!(r.addr, "172.31.0.2:9990".parse().unwrap());
    assert_eq!(
        (
            r.period,
            r.timeout,
            r.failure_threshold,
            r.success_threshold
        ),
        (Duration::from_secs(5), Duration::from_secs(1), 3, 1)
    );
    let l = c.liveness.as_ref().unwrap();
    assert_eq!(l.addr, "127.0.0.1:9991".parse().unwrap());
    assert_eq!(l.period, Duration::from_secs(10));
    // hostNetwork: the port is the node's.
    assert_eq!(plan.sandbox.port_mappings[0].host_port, 9990);
    let tcp = run(&pod(
        json!({}),
        json!({"readinessProbe": {"tcpSocket": {"port": 1}}}),
    ))
    .unwrap_err();
    assert!(tcp.to_string().contains("tcpSocket"), "{tcp}");
}

#[test]
fn dns_follows_the_policy_and_host_network() {
    let dns = |spec: Value| {
        run(&pod(spec, json!({})))
            .unwrap()
            .sandbox
            .dns_config
            .unwrap()
    };
    let cluster = dns(json!({"hostNetwork": true, "dnsPolicy": "ClusterFirstWithHostNet"}));
    assert_eq!(cluster.servers, ["10.96.0.10"]);
    assert_eq!(
        cluster.searches,
        [
            "ns1.svc.cluster.local",
            "svc.cluster.local",
            "cluster.local",
            "example.test"
        ]
    );
    assert_eq!(cluster.options, ["ndots:5"]);
    let host = dns(json!({"hostNetwork": true, "dnsPolicy": "ClusterFirst"}));
    assert_eq!(host.servers, ["192.0.2.53"]);
    assert_eq!(host.options, ["edns0"]);
    assert_eq!(dns(json!({})).servers, ["10.96.0.10"]);
}

#[test]
fn resources_decide_the_qos_class_cgroup_and_cpu() {
    let res = |r: Value| run(&pod(json!({}), json!({"resources": r}))).unwrap();
    let best = res(json!({}));
    assert_eq!(best.qos, Qos::BestEffort);
    assert_eq!(best.cgroup, Path::new("kubepods/besteffort/podu1"));
    let burst = res(json!({"requests": {"cpu": "100m", "memory": "64Mi"}}));
    assert_eq!(burst.qos, Qos::Burstable);
    assert_eq!(burst.cgroup, Path::new("kubepods/burstable/podu1"));
    let r = burst.containers[0]
        .config
        .linux
        .clone()
        .unwrap()
        .resources
        .unwrap();
    assert_eq!((r.cpu_shares, r.cpu_quota), (102, 0));
    let guaranteed = res(json!({"limits": {"cpu": "1", "memory": "1Gi"}}));
    assert_eq!(guaranteed.qos, Qos::Guaranteed);
    assert_eq!(guaranteed.cgroup, Path::new("kubepods/podu1"));
    let r = guaranteed.containers[0]
        .config
        .linux
        .clone()
        .unwrap()
        .resources
        .unwrap();
    assert_eq!(
        (
            r.cpu_shares,
            r.cpu_quota,
            r.cpu_period,
            r.memory_limit_in_bytes,
            r.oom_score_adj
        ),
        (1024, 100_000, 100_000, 1 << 30, -997)
    );
}

#[test]
fn volumes_become_node_files_host_path_checks_and_read_only_mounts() {
    let plan = run(&pod(
        json!({"volumes": [
            {"name": "h", "hostPath": {"path": "/run/x", "type": "DirectoryOrCreate"}},
            {"name": "e", "emptyDir": {}},
            {"name": "c", "configMap": {"name": "cfg", "items": [{"key": "conf", "path": "c.json"}]}},
        ]}),
        json!({"volumeMounts": [
            {"name": "h", "mountPath": "/x"},
            {"name": "e", "mountPath": "/e"},
            {"name": "c", "mountPath": "/c"},
        ]}),
    ))
    .unwrap();
    assert!(plan.files.contains(&NodeFile::HostPath {
        path: "/run/x".into(),
        ty: HostPathType::DirectoryOrCreate
    }));
    let cm = Path::new("/var/lib/kubelet/pods/u1/volumes/kubernetes.io~configmap/c");
    assert!(plan.files.contains(&NodeFile::File {
        path: cm.join("c.json"),
        contents: b"{}".to_vec(),
        mode: 0o644
    }));
    let mounts = &plan.containers[0].config.mounts;
    let ro: Vec<(&str, bool)> = mounts
        .iter()
        .map(|m| (m.container_path.as_str(), m.readonly))
        .collect();
    assert_eq!(
        ro,
        [
            ("/x", false),
            ("/e", false),
            ("/c", true),
            ("/etc/hosts", false),
            ("/dev/termination-log", false)
        ]
    );
    // An unknown volume source is a field nobody read.
    let err = run(&pod(
        json!({"volumes": [{"name": "s", "secret": {"secretName": "x"}}]}),
        json!({}),
    ))
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("/spec/volumes/0/secret/secretName"),
        "{err}"
    );
}

#[test]
fn the_daemonset_pod_is_pinned_to_the_node_and_admitted_there() {
    let ds = json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "d", "namespace": "ns1"},
        "spec": {"template": {
            "metadata": {"labels": {"app": "d"}},
            "spec": {
                "nodeSelector": {"kubernetes.io/os": "linux"},
                "serviceAccountName": "sa",
                "tolerations": [{"operator": "Exists"}],
                "containers": [{"name": "c", "image": "example.test/agent:1"}],
            },
        }},
    });
    let sa = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "sa", "namespace": "ns1"}});
    let mut p = daemonset_pod(&ds, "n1", "u1", "x").unwrap();
    assert_eq!(p["metadata"]["name"], "d-x");
    let err = admit_service_account(&mut p.clone(), &[], "x").unwrap_err();
    assert!(err.to_string().contains("does not exist"), "{err}");
    admit_service_account(&mut p, std::slice::from_ref(&sa), "x").unwrap();
    let plan = run(&p).unwrap();
    assert!(plan.token.is_some(), "the projected token");
    let mounts: Vec<&str> = plan.containers[0]
        .config
        .mounts
        .iter()
        .map(|m| m.container_path.as_str())
        .collect();
    assert!(mounts.contains(&SERVICE_ACCOUNT_MOUNT));
    // Pinned to another node, or selecting other labels: kubelet refuses it.
    let elsewhere = daemonset_pod(&ds, "n2", "u1", "x").unwrap();
    assert!(run(&elsewhere).is_err());
    let mut other_os = p.clone();
    other_os["spec"]["nodeSelector"]["kubernetes.io/os"] = json!("windows");
    assert!(
        run(&other_os)
            .unwrap_err()
            .to_string()
            .contains("nodeSelector")
    );
    // automountServiceAccountToken: false on the account: no token.
    let mut quiet = daemonset_pod(&ds, "n1", "u1", "x").unwrap();
    let mut sa_off = sa.clone();
    sa_off["automountServiceAccountToken"] = json!(false);
    admit_service_account(&mut quiet, &[sa_off], "x").unwrap();
    assert!(run(&quiet).unwrap().token.is_none());
}

#[test]
fn expansion_follows_kubernetes_rules() {
    let env = [("A".to_string(), "1".to_string())];
    assert_eq!(
        expand("$(A)-$(B)-$$(A)-$-$(", &env, &[]),
        "1-$(B)-$(A)-$-$("
    );
}

#[test]
fn capability_numbers_are_the_kernels() {
    // The agent's table carries each bit from the kernel's header: the two tables agree.
    for cap in linkerd_cni_agent::host::capabilities::CAPABILITIES {
        assert_eq!(capability_number(cap.name), Some(cap.bit), "{}", cap.name);
        assert_eq!(
            capability_number(&format!("CAP_{}", cap.name)),
            Some(cap.bit)
        );
    }
    assert_eq!(capability_number("CHOWN"), Some(0));
    assert_eq!(capability_number("CHECKPOINT_RESTORE"), Some(40));
    assert_eq!(capability_number("NOT_A_CAPABILITY"), None);
}
