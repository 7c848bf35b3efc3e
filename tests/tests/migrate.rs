//! Moving a node off Linkerd's iptables CNI plugin (root required): `linkerd install-cni
//! --mode=ebpf | kubectl apply --prune ...` over Linkerd's own DaemonSet (same object names,
//! same binary name `linkerd-cni`, same kubeconfig name). On a simulated node (libcni, the
//! agent as a real process, the fake Kubernetes API):
//!
//! - pods meshed by Linkerd's plugin run with Linkerd's NAT rules in their netns (the chains
//!   `PROXY_INIT_REDIRECT` and `PROXY_INIT_OUTPUT`, installed with `iptables-legacy`, Linkerd's
//!   default mode, and with `iptables-nft`), their proxy (UID 2102) and their app; the node's
//!   conflist ends with Linkerd's entry (`type: linkerd-cni`, its `iptables-mode`);
//! - then the agent starts as our DaemonSet runs it, installer included (`--install`):
//!   Linkerd's conflist entry is replaced by ours, not duplicated;
//! - the pods carrying Linkerd's rules are left to those rules (not adopted: adopting them
//!   broke their inbound `SO_ORIGINAL_DST`, see `docs/operating/migrating.md`), the refusal counted
//!   once per pod; outbound, inbound and `SO_ORIGINAL_DST` keep working for them, and the
//!   proxy UID stays exempt;
//! - a meshed pod that started with no plugin at all (between Linkerd's clean-up and our
//!   install) is adopted, and reading its netns for Linkerd's rules created no `nat` table
//!   there;
//! - a pod created after the switch goes through our plugin and is redirected by the agent,
//!   with the same checks;
//! - with our agent gone (as on the way back, when Linkerd's DaemonSet replaces ours), that pod
//!   stays redirected by what the agent pinned, and Linkerd's pods by their rules.
//!
//! Run: `cargo build --bins && cargo test -p linkerd-cni-tests --test migrate -- --test-threads=1`

use std::{
    fs,
    net::{IpAddr, SocketAddr, TcpListener},
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    time::Duration,
};

use linkerd_cni_tests::{
    ChildGuard, EchoServer,
    client::{Options, run_client},
    cniruntime::{self, Verb},
    iptables::Rules,
    names::run,
    node::{
        AgentCommand, AgentProcess, CNI_TIMEOUT, NODE_NAME, NodeOptions, PodSpec, SimNode, SimPod,
        chart_network_config, http_get, namespace_manifest, wait_until, workspace_bin,
    },
    proxy::{self, PROXY_UID, TestProxy},
};
use serde_json::{Value, json};

const APP_UID: u32 = 1000;
/// The agent's default `--adopt-interval`.
const ADOPT_INTERVAL: Duration = Duration::from_secs(5);
/// Two passes of the adopter and some.
const PASSES: Duration = Duration::from_secs(15);

/// A pod meshed by Linkerd's iptables plugin: started through the chain without our plugin,
/// Linkerd's rules in its netns, an app listening on 8080 and the proxy running.
struct LinkerdPod {
    pod: SimPod,
    _app_process: ChildGuard,
    app: EchoServer,
    proxy: TestProxy,
    /// Linkerd's rules in its netns (none for a pod that started while no plugin meshed it).
    rules: Option<Rules>,
}

impl LinkerdPod {
    fn start(node: &SimNode, name: &str, iptables: Option<&str>) -> Self {
        let spec = PodSpec::meshed("shop", name);
        node.apply(&[spec.manifest(NODE_NAME)])
            .unwrap_or_else(|e| panic!("serving the pod: {e}"));
        let mut pod = SimPod::new_kubelet_cgroup(spec).expect("sandbox");
        node.add_before_plugin(&mut pod)
            .unwrap_or_else(|e| panic!("CNI ADD without our plugin: {e}"));
        let ip = IpAddr::V4(pod.ip().expect("the pod's address"));
        node.apply(&[pod.spec.manifest_running(NODE_NAME, &[ip])])
            .unwrap_or_else(|e| panic!("serving the pod's status: {e}"));
        // What Linkerd's plugin does at the pod's ADD: its two chains, in the pod's netns.
        let rules = iptables.map(|binary| {
            let rules = Rules {
                binary: binary.into(),
                ..Rules::default()
            };
            rules
                .install(pod.netns().expect("netns"))
                .unwrap_or_else(|e| panic!("Linkerd's rules with {binary}: {e}"));
            rules
        });
        let app_process = pod
            .container(APP_UID)
            .spawn(std::process::Command::new("sleep").arg("300"))
            .expect("app process");
        let app = EchoServer::bind_in(pod.netns().expect("netns"), (ip, 8080).into(), name)
            .unwrap_or_else(|e| panic!("app server: {e}"));
        let proxy = pod.start_proxy().expect("proxy");
        Self {
            pod,
            _app_process: app_process,
            app,
            proxy,
            rules,
        }
    }
}

/// The original destinations the proxy read on connections its `port` listener accepted.
fn accepted_on(proxy: &TestProxy, port: u16) -> Vec<SocketAddr> {
    proxy::accepted_on(&proxy.events().expect("proxy events"), port)
}

/// One request from `pod` as `uid` to `dst`; panics unless `server`'s reply comes back.
fn request_as(uid: u32, pod: &SimPod, dst: SocketAddr, server: &EchoServer) {
    let report = run_client(
        &pod.container(uid),
        &Options::new(dst).send("ping\n"),
        Duration::from_secs(5),
    )
    .unwrap_or_else(|e| panic!("client: {e}"));
    assert!(
        report.received_matches(&server.expected_reply(b"ping\n")),
        "{dst} answers: {report:?}"
    );
}

/// The other side of the checks: an unmeshed pod serving on 8080.
struct Peer<'a> {
    pod: &'a SimPod,
    server: &'a EchoServer,
}

/// Outbound from the app (UID 1000) reaches the proxy, which reads the original destination;
/// inbound from the peer reaches the proxy's inbound listener with the right original
/// destination and then the app; the proxy's UID is not redirected.
fn assert_meshed(what: &str, pod: &SimPod, proxy: &TestProxy, app: &EchoServer, peer: &Peer) {
    let dst = peer.server.addr();
    let out_before = accepted_on(proxy, proxy::OUTBOUND_PORT).len();
    request_as(APP_UID, pod, dst, peer.server);
    assert_eq!(
        accepted_on(proxy, proxy::OUTBOUND_PORT)[out_before..],
        [dst],
        "{what}: outbound through the proxy with SO_ORIGINAL_DST"
    );
    let inbound_dst = app.addr();
    let in_before = accepted_on(proxy, proxy::INBOUND_PORT).len();
    request_as(APP_UID, peer.pod, inbound_dst, app);
    assert_eq!(
        accepted_on(proxy, proxy::INBOUND_PORT)[in_before..],
        [inbound_dst],
        "{what}: inbound through the proxy with SO_ORIGINAL_DST"
    );
    let out_before = accepted_on(proxy, proxy::OUTBOUND_PORT).len();
    request_as(PROXY_UID, pod, dst, peer.server);
    assert_eq!(
        accepted_on(proxy, proxy::OUTBOUND_PORT).len(),
        out_before,
        "{what}: the proxy UID's connection went through the proxy"
    );
}

/// Linkerd's plugin entry as its `install-cni.sh` leaves it in a conflist (its chart's
/// `cni_network_config` with default values; the kubeconfig path filled in).
fn linkerd_entry(net_dir: &Path) -> Value {
    json!({
        "name": "linkerd-cni",
        "type": "linkerd-cni",
        "log_level": "info",
        "policy": {
            "type": "k8s",
            "k8s_api_root": "https://__KUBERNETES_SERVICE_HOST__:__KUBERNETES_SERVICE_PORT__",
            "k8s_auth_token": "__SERVICEACCOUNT_TOKEN__"
        },
        "kubernetes": {"kubeconfig": net_dir.join("ZZZ-linkerd-cni-kubeconfig")},
        "linkerd": {
            "incoming-proxy-port": proxy::INBOUND_PORT,
            "outgoing-proxy-port": proxy::OUTBOUND_PORT,
            "proxy-uid": PROXY_UID,
            "ports-to-redirect": [],
            "inbound-ports-to-ignore": ["4191", "4190"],
            "simulate": false,
            "use-wait-flag": false,
            "iptables-mode": "legacy",
            "ipv6": false
        }
    })
}

/// The `linkerd-cni` entries of a conflist.
fn linkerd_cni_entries(conflist: &Path) -> Vec<Value> {
    let text = fs::read_to_string(conflist).unwrap_or_default();
    let doc: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    doc["plugins"]
        .as_array()
        .map(|ps| {
            ps.iter()
                .filter(|p| p["type"] == "linkerd-cni")
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

/// The agent as our DaemonSet runs it over the node Linkerd's left: `run --install`, with the
/// installer's environment (the node's conflist directory `net_dir`, the plugin binary copied
/// to a bin directory of the test's).
fn start_installing_agent(node: &SimNode, net_dir: &Path) -> AgentProcess {
    let d = node.dir();
    let sa = d.join("sa");
    fs::create_dir_all(&sa).expect("service account dir");
    fs::write(sa.join("token"), "test-token").expect("token");
    fs::write(
        sa.join("ca.crt"),
        "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
    )
    .expect("ca");
    let bin_dir = d.join("cni-bin");
    fs::create_dir_all(&bin_dir).expect("bin dir");
    let plugin = workspace_bin("linkerd-cni").expect("plugin binary");
    let image_bin: PathBuf = plugin.parent().expect("plugin dir").into();
    let env = [
        ("DEST_CNI_NET_DIR", net_dir.display().to_string()),
        ("DEST_CNI_BIN_DIR", bin_dir.display().to_string()),
        ("CONTAINER_MOUNT_PREFIX", String::new()),
        ("CONTAINER_CNI_BIN_DIR", image_bin.display().to_string()),
        ("SERVICEACCOUNT_PATH", sa.display().to_string()),
        ("KUBERNETES_SERVICE_HOST", "10.96.0.1".into()),
        ("KUBERNETES_SERVICE_PORT", "443".into()),
        ("POD_NAMESPACE", "linkerd-cni".into()),
        (
            "CNI_NETWORK_CONFIG",
            chart_network_config(&node.socket()).to_string(),
        ),
    ];
    let mut script = String::from("#!/bin/sh\n");
    for (k, v) in &env {
        assert!(!v.contains('\''), "{k}: a quote in {v}");
        script.push_str(&format!("export {k}='{v}'\n"));
    }
    script.push_str("unset LINKERD_CNI_AGENT_DAEMONSET LINKERD_CNI_AGENT_CLEANUP_ON_SIGTERM\n");
    script.push_str(&format!(
        "exec '{}' \"$@\"\n",
        workspace_bin("linkerd-cni-agent")
            .expect("agent binary")
            .display()
    ));
    let wrapper = d.join("agent-with-installer");
    fs::write(&wrapper, script).expect("wrapper");
    fs::set_permissions(&wrapper, fs::Permissions::from_mode(0o755)).expect("chmod");
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let command = AgentCommand {
        bin: wrapper,
        pin_root: node.pin_root().to_path_buf(),
        state_dir: node.state_dir(),
        socket: node.socket(),
        kubeconfig: node.kubeconfig(),
        node_name: NODE_NAME.into(),
        log_level: "info,linkerd_cni_agent=debug".into(),
        reap_interval: Some(Duration::from_secs(10)),
        reconcile_interval: None,
        bpffs: None,
        health: SocketAddr::from(([127, 0, 0, 1], port)),
        shared_cgroup: None,
        log: d.join("logs").join("agent.log"),
        // Simulated pods live in test cgroups below the cgroup2 root, not in kubelet's trees.
        extra_args: vec!["--install".into(), "--pod-cgroup-tree".into(), "/".into()],
    };
    let mut agent = AgentProcess::spawn(&command).unwrap_or_else(|e| panic!("agent: {e}"));
    agent
        .wait_ready(Duration::from_secs(30), Duration::from_millis(20), |a| {
            matches!(
                http_get(a.health_addr(), "/live", Duration::from_secs(1)),
                Ok((200, _))
            )
        })
        .unwrap_or_else(|e| panic!("agent start-up: {e}"));
    agent
}

fn adopted(node: &SimNode, pod: &SimPod) -> bool {
    node.state()
        .expect("agent state")
        .registered()
        .contains(&format!("adopted-{}", pod.spec.uid))
}

#[test]
fn pods_meshed_by_linkerds_iptables_plugin_across_the_switch() {
    let mut node = SimNode::start(NodeOptions::default(), &[namespace_manifest("shop", &[])])
        .unwrap_or_else(|e| panic!("starting the simulated node: {e}"));
    let (server_pod, server) = node.echo_pod("shop", "server", 8080);
    let peer = Peer {
        pod: &server_pod,
        server: &server,
    };

    // Linkerd's era: no agent of ours; the node's conflist ends with Linkerd's entry, and
    // its plugin put its rules into each meshed pod.
    node.kill_agent();
    let net_dir = node.dir().join("net.d");
    fs::create_dir_all(&net_dir).expect("net dir");
    let conflist_path = net_dir.join("10-pods.conflist");
    let mut conflist: Value =
        serde_json::from_str(&fs::read_to_string(node.conflist()).expect("the node's conflist"))
            .expect("conflist JSON");
    let plugins = conflist["plugins"].as_array_mut().expect("plugins");
    plugins.pop();
    plugins.push(linkerd_entry(&net_dir));
    fs::write(
        &conflist_path,
        serde_json::to_string_pretty(&conflist).expect("JSON"),
    )
    .expect("Linkerd's conflist");
    let linkerd_pods = [
        LinkerdPod::start(&node, "iptables-legacy", Some("iptables-legacy")),
        LinkerdPod::start(&node, "iptables-nft", Some("iptables-nft")),
    ];
    for p in &linkerd_pods {
        assert_meshed(
            &format!("{} before the switch", p.pod.spec.name),
            &p.pod,
            &p.proxy,
            &p.app,
            &peer,
        );
    }

    // A meshed pod that started after Linkerd's pod cleaned up and before ours installed: no
    // plugin meshed it, so it has no rules and runs unmeshed.
    let gap = LinkerdPod::start(&node, "in-between", None);

    // The switch: our DaemonSet's agent, installer included.
    let agent = start_installing_agent(&node, &net_dir);
    let entries = wait_until("Linkerd's entry replaced", Duration::from_secs(20), || {
        let e = linkerd_cni_entries(&conflist_path);
        e.iter()
            .any(|p| p["linkerd"].get("agent-socket").is_some())
            .then_some(e)
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", node.diagnostics()));
    assert_eq!(
        entries.len(),
        1,
        "one linkerd-cni entry, not two: {entries:#?}"
    );
    assert!(
        entries[0].get("policy").is_none(),
        "nothing of Linkerd's entry kept: {entries:#?}"
    );

    // The pods meshed by Linkerd's rules are left to them: refused (counted once each), never
    // registered, however many passes go by, and still meshed.
    let refused = || {
        agent
            .metric("linkerd_cni_agent_adoption_failures_total{reason=\"linkerd_iptables\"}")
            .unwrap_or_else(|e| panic!("{e}"))
    };
    wait_until("both pods refused", PASSES, || {
        (refused() == 2).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", node.diagnostics()));
    std::thread::sleep(ADOPT_INTERVAL + Duration::from_secs(1));
    assert_eq!(refused(), 2, "each pod counted once");
    for p in &linkerd_pods {
        assert!(
            !adopted(&node, &p.pod),
            "{} adopted over Linkerd's rules\n{}",
            p.pod.spec.name,
            node.diagnostics()
        );
        assert_meshed(
            &format!("{} after the switch", p.pod.spec.name),
            &p.pod,
            &p.proxy,
            &p.app,
            &peer,
        );
        // Linkerd's rules are as they were: nothing of ours touched them.
        let rules = p
            .rules
            .as_ref()
            .expect("Linkerd's rules")
            .dump(p.pod.netns().expect("netns"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            rules.contains("-A PROXY_INIT_REDIRECT -p tcp -j REDIRECT --to-ports 4143"),
            "{rules}"
        );
    }

    // The pod without rules is adopted, and looking for Linkerd's rules created no nat table
    // in its netns (which would have turned on connection tracking there).
    wait_until("the pod without rules adopted", PASSES, || {
        adopted(&node, &gap.pod).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", node.diagnostics()));
    assert_meshed("the adopted pod", &gap.pod, &gap.proxy, &gap.app, &peer);
    for file in ["ip_tables_names", "ip6_tables_names"] {
        let tables = gap
            .pod
            .netns()
            .expect("netns")
            .command("cat")
            .ok()
            .and_then(|mut c| run(c.arg(format!("/proc/self/net/{file}"))).ok())
            .unwrap_or_default();
        assert!(
            !tables.lines().any(|t| t.trim() == "nat"),
            "a nat table appeared in the adopted pod's netns ({file}: {tables:?})"
        );
    }

    // A pod created after the switch goes through our plugin (the patched conflist) and is
    // redirected by the agent.
    let mut new_pod = node
        .new_pod(PodSpec::meshed("shop", "after-switch"))
        .expect("pod");
    let mut inv = node
        .invocation(&new_pod, Some(new_pod.netns_path()))
        .expect("invocation");
    inv.conflist = conflist_path.clone();
    let out = cniruntime::run(Some(node.netns()), Verb::Add, &inv, CNI_TIMEOUT)
        .and_then(|o| o.expect_ok())
        .unwrap_or_else(|e| {
            panic!(
                "CNI ADD through the patched conflist: {e}\n{}",
                node.diagnostics()
            )
        });
    new_pod.result = out.result();
    let new_ip = new_pod.ip().expect("the new pod's address");
    assert!(
        node.state()
            .expect("agent state")
            .registered()
            .contains(&new_pod.container_id),
        "the new pod registered by its ADD\n{}",
        node.diagnostics()
    );
    let new_app = EchoServer::bind_in(
        new_pod.netns().expect("netns"),
        (new_ip, 8080).into(),
        "after-switch",
    )
    .unwrap_or_else(|e| panic!("app server: {e}"));
    let new_proxy = new_pod.start_proxy().expect("proxy");
    assert_meshed(
        "the pod created after the switch",
        &new_pod,
        &new_proxy,
        &new_app,
        &peer,
    );

    // Our agent gone (as when Linkerd's DaemonSet replaces ours on the way back): what it
    // attached stays pinned and keeps redirecting, and Linkerd's pods keep their rules.
    drop(agent);
    assert_meshed(
        "the pod created after the switch, with the agent gone",
        &new_pod,
        &new_proxy,
        &new_app,
        &peer,
    );
    for p in &linkerd_pods {
        assert_meshed(
            &format!("{} with the agent gone", p.pod.spec.name),
            &p.pod,
            &p.proxy,
            &p.app,
            &peer,
        );
    }
}
