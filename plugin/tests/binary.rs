//! Runs the built `linkerd-cni` binary against a fake node agent: what the agent received,
//! and what the plugin printed and exited with. No root needed: `/proc/self/ns/net` stands
//! in for a pod's network namespace.

mod support;

use std::{net::IpAddr, time::Duration};

use linkerd_cni_proto::wire::{ErrorKind, PROTOCOL_VERSION, Request, Response};
use serde_json::{Value, json};
use support::{Behaviour, FakeAgent, PluginRun, TempDir, run_plugin};

const VERSIONS: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];
const VERBS: [&str; 6] = ["ADD", "DEL", "CHECK", "VERSION", "GC", "STATUS"];

fn legacy(version: &str) -> bool {
    version.starts_with("0.")
}

/// The first version that has `verb`.
fn since(verb: &str) -> &'static str {
    match verb {
        "CHECK" => "0.4.0",
        "GC" | "STATUS" => "1.1.0",
        _ => "0.3.0",
    }
}

fn allowed(verb: &str, version: &str) -> bool {
    let idx = |v: &str| {
        VERSIONS
            .iter()
            .position(|x| *x == v)
            .unwrap_or_else(|| panic!("unknown version {v}"))
    };
    idx(version) >= idx(since(verb))
}

fn env(verb: &str) -> Vec<(&'static str, String)> {
    vec![
        ("CNI_COMMAND", verb.into()),
        ("CNI_CONTAINERID", "3f5a7e9b21c4".into()),
        ("CNI_NETNS", "/proc/self/ns/net".into()),
        ("CNI_IFNAME", "eth0".into()),
        ("CNI_PATH", "/opt/cni/bin".into()),
        // containerd's order varies; this is one it uses.
        (
            "CNI_ARGS",
            "K8S_POD_INFRA_CONTAINER_ID=3f5a7e9b21c4;K8S_POD_UID=9d1c;IgnoreUnknown=1;K8S_POD_NAMESPACE=emojivoto;K8S_POD_NAME=web-5d8f".into(),
        ),
    ]
}

fn with_env(verb: &str, var: &'static str, value: Option<&str>) -> Vec<(&'static str, String)> {
    let mut e = env(verb);
    e.retain(|(k, _)| *k != var);
    if let Some(v) = value {
        e.push((var, v.into()));
    }
    e
}

/// A bridge + host-local result for a dual-stack pod, in `version`'s format.
fn prev_result(version: &str) -> Value {
    let mut ips = vec![
        json!({"address": "10.244.1.17/24", "gateway": "10.244.1.1", "interface": 2}),
        json!({"address": "fd00:10:244:1::11/64", "gateway": "fd00:10:244:1::1", "interface": 2}),
    ];
    if legacy(version) {
        ips[0]["version"] = json!("4");
        ips[1]["version"] = json!("6");
    }
    json!({
        "cniVersion": version,
        "interfaces": [
            {"name": "cni0", "mac": "0a:58:0a:f4:01:01"},
            {"name": "veth8c1d2e3f", "mac": "5e:1f:00:aa:bb:cc"},
            {"name": "eth0", "mac": "0a:58:0a:f4:01:11", "sandbox": "/var/run/netns/cni-5d8f"}
        ],
        "ips": ips,
        "routes": [{"dst": "0.0.0.0/0", "gw": "10.244.1.1"}, {"dst": "::/0", "gw": "fd00:10:244:1::1"}],
        "dns": {"nameservers": ["10.96.0.10"], "domains": [], "search": ["emojivoto.svc.cluster.local"]}
    })
}

fn conf(version: &str, socket: &str) -> Value {
    json!({
        "cniVersion": version,
        "name": "k8s-pod-network",
        "type": "linkerd-cni",
        "log_level": "debug",
        "kubernetes": {"kubeconfig": "/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig"},
        "linkerd": {
            "incoming-proxy-port": 4143, "outgoing-proxy-port": 4140, "proxy-uid": 2102,
            "ports-to-redirect": [], "inbound-ports-to-ignore": ["4191", "4190"],
            "outbound-ports-to-ignore": ["443"], "simulate": false, "use-wait-flag": false,
            "iptables-mode": "nft", "ipv6": true, "agent-socket": socket, "agent-timeout-ms": 2000
        },
        "runtimeConfig": {"cgroupPath": "/kubepods/besteffort/pod9d1c"},
        "prevResult": prev_result(version),
        "cni.dev/valid-attachments": [{"containerID": "3f5a7e9b21c4", "ifname": "eth0"}]
    })
}

fn run(verb: &str, conf: &Value) -> PluginRun {
    run_plugin(&env(verb), conf.to_string().as_bytes())
}

#[test]
fn every_verb_in_every_version_against_the_agent() {
    for verb in VERBS {
        for version in VERSIONS {
            let agent = FakeAgent::start(Behaviour::healthy());
            let r = run(verb, &conf(version, agent.socket()));
            let what = format!("{verb} @ {version}");
            let requests = agent.requests();
            if !allowed(verb, version) {
                assert_eq!(r.code(), 1, "{what}: {r:?}");
                assert_eq!(r.json()["cniVersion"], version, "{what}");
                assert!(requests.is_empty(), "{what}: agent received {requests:?}");
                continue;
            }
            assert_eq!(r.exit, 0, "{what}: {r:?}");
            let expected_op = match verb {
                "ADD" => {
                    assert_eq!(
                        r.json(),
                        prev_result(version),
                        "{what}: prevResult passed through"
                    );
                    Some("add")
                }
                "VERSION" => {
                    assert_eq!(
                        r.json(),
                        json!({"cniVersion": version, "supportedVersions": VERSIONS}),
                        "{what}"
                    );
                    None
                }
                "DEL" => Some("del"),
                "CHECK" => Some("check"),
                "GC" => Some("gc"),
                "STATUS" => Some("status"),
                other => panic!("unexpected verb {other}"),
            };
            if !matches!(verb, "ADD" | "VERSION") {
                assert_eq!(r.stdout, "", "{what}: nothing on stdout on success");
            }
            match expected_op {
                None => assert!(requests.is_empty(), "{what}: {requests:?}"),
                Some(op) => {
                    assert_eq!(requests.len(), 1, "{what}: {requests:?}");
                    let wire = serde_json::to_value(&requests[0]).unwrap_or_else(|e| panic!("{e}"));
                    assert_eq!(wire["request"]["op"], op, "{what}");
                    assert_eq!(requests[0].version, PROTOCOL_VERSION, "{what}");
                }
            }
        }
    }
}

#[test]
fn add_sends_everything_the_agent_needs() {
    for (conf_version, prev_version) in [("1.0.0", "0.4.0"), ("0.3.1", "1.1.0"), ("0.4.0", "0.4.0")]
    {
        let agent = FakeAgent::start(Behaviour::healthy());
        let mut c = conf(conf_version, agent.socket());
        c["prevResult"] = prev_result(prev_version);
        let r = run("ADD", &c);
        let what = format!("config {conf_version}, prevResult {prev_version}");
        assert_eq!(r.exit, 0, "{what}: {r:?}");
        assert_eq!(
            r.json(),
            prev_result(conf_version),
            "{what}: converted to the request's version"
        );
        let requests = agent.requests();
        let [envelope] = requests.as_slice() else {
            panic!("{what}: one request expected: {requests:?}")
        };
        let Request::Add(add) = &envelope.request else {
            panic!("{what}: not an Add: {envelope:?}")
        };
        assert_eq!(add.attachment.container_id, "3f5a7e9b21c4");
        assert_eq!(add.attachment.ifname, "eth0");
        assert_eq!(add.attachment.netns, "/proc/self/ns/net");
        assert_eq!(add.pod.namespace, "emojivoto");
        assert_eq!(add.pod.name, "web-5d8f");
        assert_eq!(add.pod.uid.as_deref(), Some("9d1c"));
        assert_eq!(
            add.cgroup_path.as_deref(),
            Some("/kubepods/besteffort/pod9d1c")
        );
        let want: Vec<IpAddr> = ["10.244.1.17", "fd00:10:244:1::11"]
            .iter()
            .map(|s| s.parse().unwrap_or_else(|e| panic!("{s}: {e}")))
            .collect();
        assert_eq!(add.pod_ips, want, "{what}: container-side IPs only");
        assert_eq!(
            add.config.outbound_ports_to_ignore.len(),
            1,
            "{what}: linkerd section forwarded"
        );
        assert!(add.config.ipv6, "{what}");
        assert!(
            r.stderr
                .contains("container=3f5a7e9b21c4 namespace=emojivoto pod=web-5d8f"),
            "{}",
            r.stderr
        );
    }
}

#[test]
fn add_without_pod_identity_or_in_simulate_contacts_nobody() {
    let agent = FakeAgent::start(Behaviour::healthy());
    // podman: only a pod name.
    let e = with_env("ADD", "CNI_ARGS", Some("IgnoreUnknown=1;K8S_POD_NAME=web"));
    let r = run_plugin(&e, conf("1.0.0", agent.socket()).to_string().as_bytes());
    assert_eq!(r.exit, 0, "{r:?}");
    assert_eq!(r.json(), prev_result("1.0.0"));

    let mut c = conf("0.4.0", agent.socket());
    c["linkerd"]["simulate"] = json!(true);
    let r = run("ADD", &c);
    assert_eq!(r.exit, 0, "{r:?}");
    assert_eq!(r.json(), prev_result("0.4.0"));
    assert!(
        r.stderr.contains("simulate: would register"),
        "{}",
        r.stderr
    );
    assert!(
        agent.requests().is_empty(),
        "agent received {:?}",
        agent.requests()
    );
}

#[test]
fn del_without_netns_and_twice() {
    let agent = FakeAgent::start(Behaviour::healthy());
    let c = conf("1.0.0", agent.socket());
    let first = run("DEL", &c);
    let second = run_plugin(
        &with_env("DEL", "CNI_NETNS", None),
        c.to_string().as_bytes(),
    );
    for r in [&first, &second] {
        assert_eq!(r.exit, 0, "{r:?}");
        assert_eq!(r.stdout, "");
    }
    let netns: Vec<String> = agent
        .requests()
        .into_iter()
        .map(|e| match e.request {
            Request::Del(a) => {
                assert_eq!(a.container_id, "3f5a7e9b21c4");
                a.netns
            }
            other => panic!("expected Del, got {other:?}"),
        })
        .collect();
    assert_eq!(netns, ["/proc/self/ns/net", ""]);
}

#[test]
fn gc_forwards_the_valid_attachments() {
    let agent = FakeAgent::start(Behaviour::healthy());
    let mut c = conf("1.1.0", agent.socket());
    c.as_object_mut()
        .unwrap_or_else(|| panic!("object"))
        .remove("cni.dev/valid-attachments");
    c["cni.dev/attachments"] =
        json!([{"containerID": "aaa", "ifname": "eth0"}, {"containerID": "bbb", "ifname": "eth0"}]);
    let r = run("GC", &c);
    assert_eq!(r.exit, 0, "{r:?}");
    let requests = agent.requests();
    let [envelope] = requests.as_slice() else {
        panic!("one request: {requests:?}")
    };
    let Request::Gc(gc) = &envelope.request else {
        panic!("not a Gc: {envelope:?}")
    };
    let ids: Vec<_> = gc.valid.iter().map(|a| a.container_id.as_str()).collect();
    assert_eq!(ids, ["aaa", "bbb"]);
}

#[test]
fn status_reports_readiness() {
    fn not_loaded(_: &Request) -> Response {
        Response::Status {
            programs_loaded: false,
            pods: 0,
        }
    }
    let agent = FakeAgent::start(Behaviour::answer(not_loaded));
    let r = run("STATUS", &conf("1.1.0", agent.socket()));
    assert_eq!(r.code(), 50, "{r:?}");
    assert_eq!(agent.requests().len(), 1);

    let dir = TempDir::new();
    let missing = dir.path().join("nobody.sock");
    let r = run(
        "STATUS",
        &conf("1.1.0", missing.to_str().unwrap_or_else(|| panic!("utf-8"))),
    );
    assert_eq!(r.code(), 50, "{r:?}");
    assert!(
        r.json()["details"]
            .as_str()
            .is_some_and(|d| d.contains("nobody.sock")),
        "{r:?}"
    );
}

#[test]
fn missing_agent_is_try_again_later_but_del_succeeds() {
    let dir = TempDir::new();
    let socket = dir.path().join("absent.sock");
    let socket = socket.to_str().unwrap_or_else(|| panic!("utf-8"));
    // ADD: no kubeconfig in this config, so the plugin cannot tell whether the pod is meshed.
    for verb in ["ADD", "CHECK", "GC"] {
        let r = run(verb, &conf("1.1.0", socket));
        assert_eq!(r.code(), 11, "{verb}: {r:?}");
        assert!(r.msg().contains("absent.sock"), "{verb}: {r:?}");
        // The runtime logs `msg` (not the plugin's stderr) for a failing call, and the pod's
        // `FailedCreatePodSandBox` event carries it: it greps like the plugin's log lines.
        assert!(
            r.msg().starts_with("linkerd-cni: "),
            "{verb}: msg without the prefix: {r:?}"
        );
        assert!(r.stderr.contains("code 11"), "{verb}: logged: {}", r.stderr);
        assert!(
            !r.stderr.contains("linkerd-cni: linkerd-cni:"),
            "{verb}: the prefix twice in the log line: {}",
            r.stderr
        );
    }
    let r = run("DEL", &conf("1.1.0", socket));
    assert_eq!(r.exit, 0, "DEL never fails for want of the agent: {r:?}");
    assert!(r.stdout.is_empty(), "{r:?}");
    assert!(
        r.stderr.contains("absent.sock"),
        "DEL logs why: {}",
        r.stderr
    );
}

/// Uninstalled with the conflist left patched: no agent socket, and the API rejects the
/// plugin's token (its ServiceAccount or RBAC deleted). ADD still fails closed (11) and tells
/// the operator the way out; the API was really asked.
#[test]
fn no_agent_and_rejected_credentials_names_the_way_out() {
    let dir = TempDir::new();
    let socket = dir.path().join("absent.sock");
    let socket = socket.to_str().unwrap_or_else(|| panic!("utf-8"));
    let api = linkerd_cni_fake_apiserver::FakeApiServer::start().expect("fake API server");
    let kubeconfig = dir.path().join("ZZZ-linkerd-cni-kubeconfig");
    api.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    // The pod env() names in CNI_ARGS.
    let pod_path = "/api/v1/namespaces/emojivoto/pods/web-5d8f";
    for status in [401u16, 403] {
        api.fail_path(pod_path, Some(status));
        let mut c = conf("1.1.0", socket);
        c["kubernetes"]["kubeconfig"] = kubeconfig.to_str().expect("utf-8").into();
        let before = api.hits(pod_path);
        let r = run("ADD", &c);
        assert_eq!(api.hits(pod_path), before + 1, "the plugin asked the API");
        assert_eq!(r.code(), 11, "fail closed: {r:?}");
        let msg = r.msg();
        assert!(
            msg.contains("linkerd-cni-agent uninstall")
                && msg.contains("remove the linkerd-cni entry")
                && msg.contains(&format!("status {status}")),
            "{r:?}"
        );
    }
}

#[test]
fn silent_or_garbled_agent() {
    // The agent says nothing for a minute: only the plugin's own timeout can end the ADD with
    // "300 ms" in its message (a plugin that waited would see the connection close instead),
    // however long this machine takes to schedule it.
    let agent = FakeAgent::start(Behaviour::Silent(Duration::from_secs(60)));
    let mut c = conf("1.0.0", agent.socket());
    c["linkerd"]["agent-timeout-ms"] = json!(300);
    let r = run("ADD", &c);
    assert_eq!(r.code(), 11, "{r:?}");
    assert!(r.msg().contains("300 ms"), "bounded by the timeout: {r:?}");
    assert_eq!(agent.requests().len(), 1);

    let agent = FakeAgent::start(Behaviour::Garbage);
    let r = run("ADD", &conf("1.0.0", agent.socket()));
    assert_eq!(r.code(), 102, "{r:?}");
}

#[test]
fn agent_error_kinds_map_to_codes() {
    fn answer(kind: ErrorKind) -> Response {
        Response::Error {
            kind,
            message: format!("fake agent says {kind:?}"),
        }
    }
    let table = [
        (ErrorKind::VersionMismatch, 11),
        (ErrorKind::BadRequest, 7),
        (ErrorKind::UnknownContainer, 3),
        (ErrorKind::KubernetesApi, 11),
        (ErrorKind::Unavailable, 11),
        (ErrorKind::NotInForce, 100),
        (ErrorKind::Internal, 101),
    ];
    for (kind, code) in table {
        for verb in ["ADD", "DEL", "CHECK", "GC", "STATUS"] {
            let agent = FakeAgent::start(Behaviour::answer(move |_| answer(kind)));
            let r = run(verb, &conf("1.1.0", agent.socket()));
            let want = if verb == "STATUS" { 50 } else { code };
            assert_eq!(r.code(), want, "{verb} answered {kind:?}: {r:?}");
            let text = format!("{} {}", r.msg(), r.json()["details"]);
            assert!(
                text.contains(&format!("fake agent says {kind:?}")),
                "{verb} {kind:?}: agent message kept: {r:?}"
            );
        }
    }
}

/// A bad-input row: name, environment, stdin, expected code, text the message must hold.
type Case<'a> = (&'a str, Vec<(&'static str, String)>, String, u64, &'a str);

#[test]
fn bad_input_corpus_changes_nothing() {
    let agent = FakeAgent::start(Behaviour::healthy());
    let good = conf("1.0.0", agent.socket()).to_string();
    let dir = TempDir::new();
    let file = dir.path().join("regular-file");
    std::fs::write(&file, b"not a netns").unwrap_or_else(|e| panic!("{e}"));
    let file = file.to_str().unwrap_or_else(|| panic!("utf-8")).to_string();
    let subdir = dir
        .path()
        .to_str()
        .unwrap_or_else(|| panic!("utf-8"))
        .to_string();
    let oversized = {
        let mut c = conf("1.0.0", agent.socket());
        c["padding"] = json!("x".repeat(1 << 20));
        c.to_string()
    };
    let with_linkerd = |k: &str, v: Value| {
        let mut c = conf("1.0.0", agent.socket());
        c["linkerd"][k] = v;
        c.to_string()
    };
    let cases: Vec<Case> = vec![
        (
            "no CNI_COMMAND",
            with_env("ADD", "CNI_COMMAND", None),
            good.clone(),
            4,
            "CNI_COMMAND",
        ),
        (
            "unknown command",
            with_env("ADD", "CNI_COMMAND", Some("REBOOT")),
            good.clone(),
            4,
            "CNI_COMMAND",
        ),
        (
            "no CNI_CONTAINERID",
            with_env("ADD", "CNI_CONTAINERID", None),
            good.clone(),
            4,
            "CNI_CONTAINERID",
        ),
        (
            "no CNI_NETNS on ADD",
            with_env("ADD", "CNI_NETNS", None),
            good.clone(),
            4,
            "CNI_NETNS",
        ),
        (
            "no CNI_NETNS on CHECK",
            with_env("CHECK", "CNI_NETNS", None),
            good.clone(),
            4,
            "CNI_NETNS",
        ),
        (
            "no CNI_IFNAME",
            with_env("DEL", "CNI_IFNAME", None),
            good.clone(),
            4,
            "CNI_IFNAME",
        ),
        (
            "bad CNI_IFNAME",
            with_env("ADD", "CNI_IFNAME", Some("eth0/../x")),
            good.clone(),
            4,
            "CNI_IFNAME",
        ),
        (
            "unknown CNI_ARGS key",
            with_env(
                "ADD",
                "CNI_ARGS",
                Some("K8S_POD_NAME=a;K8S_POD_NAMESPACE=b;X=1"),
            ),
            good.clone(),
            4,
            "CNI_ARGS",
        ),
        (
            "no CNI_PATH on GC",
            with_env("GC", "CNI_PATH", None),
            conf("1.1.0", agent.socket()).to_string(),
            4,
            "CNI_PATH",
        ),
        (
            "broken JSON",
            env("ADD"),
            good[..good.len() / 2].to_string(),
            6,
            "decode",
        ),
        ("empty stdin", env("ADD"), String::new(), 6, "decode"),
        ("oversized stdin", env("ADD"), oversized, 6, "exceeds"),
        (
            "wrong type",
            env("ADD"),
            with_linkerd("proxy-uid", json!("2102")),
            7,
            "linkerd.proxy-uid",
        ),
        (
            // One bad entry is dropped (as Linkerd does); a list that is no list is refused.
            "port list as an object",
            env("ADD"),
            with_linkerd("inbound-ports-to-ignore", json!({"9100": "9000"})),
            7,
            "linkerd.inbound-ports-to-ignore",
        ),
        (
            "unsupported version",
            env("ADD"),
            good.replace("\"1.0.0\"", "\"0.2.0\""),
            1,
            "0.2.0",
        ),
        (
            "CHECK in 0.3.1",
            env("CHECK"),
            conf("0.3.1", agent.socket()).to_string(),
            1,
            "CHECK",
        ),
        ("STATUS in 1.0.0", env("STATUS"), good.clone(), 1, "STATUS"),
        (
            "GC in 0.4.0",
            env("GC"),
            conf("0.4.0", agent.socket()).to_string(),
            1,
            "GC",
        ),
        (
            "nonexistent netns",
            with_env(
                "ADD",
                "CNI_NETNS",
                Some("/var/run/netns/cni-does-not-exist"),
            ),
            good.clone(),
            3,
            "not found",
        ),
        (
            "netns is a regular file",
            with_env("ADD", "CNI_NETNS", Some(&file)),
            good.clone(),
            3,
            "a regular file",
        ),
        (
            "netns is a directory",
            with_env("ADD", "CNI_NETNS", Some(&subdir)),
            good.clone(),
            3,
            "a directory",
        ),
        (
            "netns is a mount ns",
            with_env("CHECK", "CNI_NETNS", Some("/proc/self/ns/mnt")),
            good.clone(),
            3,
            "mount namespace",
        ),
        (
            "CHECK on a missing netns",
            with_env("CHECK", "CNI_NETNS", Some("/var/run/netns/cni-gone")),
            good.clone(),
            3,
            "not found",
        ),
    ];
    for (name, e, stdin, code, needle) in cases {
        let r = run_plugin(&e, stdin.as_bytes());
        assert_eq!(r.code(), code, "{name}: {r:?}");
        assert!(
            r.msg().contains(needle),
            "{name}: message should mention {needle:?}: {}",
            r.msg()
        );
        assert!(
            r.msg().starts_with("linkerd-cni: "),
            "{name}: msg without the linkerd-cni: prefix: {}",
            r.msg()
        );
        assert!(
            agent.requests().is_empty(),
            "{name}: agent received {:?}",
            agent.requests()
        );
    }
}

#[test]
fn log_levels_and_stream_discipline() {
    let agent = FakeAgent::start(Behaviour::healthy());
    for (level, expect_info, expect_debug) in [
        ("debug", true, true),
        ("info", true, false),
        ("warn", false, false),
        ("chatty", false, false),
    ] {
        let mut c = conf("1.0.0", agent.socket());
        c["log_level"] = json!(level);
        let r = run("ADD", &c);
        assert_eq!(r.exit, 0, "{level}: {r:?}");
        assert_eq!(
            r.json(),
            prev_result("1.0.0"),
            "{level}: stdout is only the result"
        );
        assert_eq!(
            r.stderr.contains(" INFO "),
            expect_info,
            "{level}: {}",
            r.stderr
        );
        assert_eq!(
            r.stderr.contains(" DEBUG "),
            expect_debug,
            "{level}: {}",
            r.stderr
        );
        for line in r.stderr.lines() {
            assert!(
                line.contains("container=3f5a7e9b21c4 namespace=emojivoto pod=web-5d8f"),
                "{level}: {line}"
            );
        }
    }
}

/// A record forged from outside: what issue 28 put in `CNI_ARGS` after a newline.
const FORGED: &str = "linkerd-cni: INFO container=c9 namespace=shop pod=web pod redirected through its proxy: forged";

#[test]
fn outside_input_cannot_forge_a_log_record_or_field() {
    // The agent's reason carries a forged record too, behind every kind of line break and an
    // ANSI "erase line" sequence.
    let reason = format!("pod has linkerd-proxy\n{FORGED}\r\u{1b}[2K\u{85}\u{2028}\u{7f}");
    let agent = FakeAgent::start(Behaviour::answer({
        let reason = reason.clone();
        move |req| match req {
            Request::Add(_) => Response::Added {
                redirected: true,
                reason: reason.clone(),
            },
            other => support::healthy(other),
        }
    }));
    let namespace = format!("shop\n{FORGED}");
    let args = format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME=web pod=admin");
    let mut c = conf("1.0.0", agent.socket());
    c["log_level"] = json!("debug");
    let r = run_plugin(
        &with_env("ADD", "CNI_ARGS", Some(&args)),
        c.to_string().as_bytes(),
    );
    assert_eq!(r.exit, 0, "{r:?}");

    // Escaping is for the log only: the agent gets the pod as the runtime named it.
    let requests = agent.requests();
    let [envelope] = requests.as_slice() else {
        panic!("one request expected: {requests:?}")
    };
    let Request::Add(add) = &envelope.request else {
        panic!("not an Add: {envelope:?}")
    };
    assert_eq!(add.pod.namespace, namespace);
    assert_eq!(add.pod.name, "web pod=admin");

    // Every record is one line carrying this run's own context, each outside value quoted
    // (so no value can end its field early) with its control characters escaped.
    let context = format!(
        "container=3f5a7e9b21c4 namespace={:?} pod=\"web pod=admin\" ",
        namespace
    );
    let lines: Vec<&str> = r.stderr.lines().collect();
    assert!(lines.len() >= 3, "{}", r.stderr);
    for line in &lines {
        let rest = ["DEBUG ", "INFO ", "WARN ", "ERROR "]
            .iter()
            .find_map(|level| line.strip_prefix("linkerd-cni: ")?.strip_prefix(level))
            .unwrap_or_else(|| panic!("not a record: {line:?}\n{}", r.stderr));
        assert!(
            rest.starts_with(&context),
            "a record without this run's context: {line:?}\n{}",
            r.stderr
        );
        assert!(
            !line
                .chars()
                .any(|c| c.is_control() || matches!(c, '\u{2028}' | '\u{2029}')),
            "an unescaped control character: {line:?}"
        );
    }
    // The agent's reason is still there, readable, on the ADD's own record.
    let want = format!(
        r"pod redirected through its proxy: pod has linkerd-proxy\n{FORGED}\r\u{{1b}}[2K\u{{85}}\u{{2028}}\u{{7f}}"
    );
    assert!(
        lines.iter().any(|l| l.ends_with(&want)),
        "the agent's reason, escaped: {want}\n{}",
        r.stderr
    );
}
