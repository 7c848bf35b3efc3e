//! The DaemonSet, run as a pod (root required): the manifests an operator applies
//! (`linkerd install-cni --mode=ebpf`, `helm template` of the chart), the DaemonSet's pod made
//! as the DaemonSet controller, the ServiceAccount admission and the scheduler make it, then
//! translated field by field into CRI calls as kubelet makes them (a field the translation
//! does not handle fails the test) and run by Debian's containerd on a node with a root of its
//! own: the chart's default host paths (`/etc/cni/net.d`, `/opt/cni/bin`, `/run/linkerd-cni`,
//! `/sys/fs/bpf`, `/var/run/netns`) are the node's, bpffs is mounted by the `mount-bpffs` init
//! container through Bidirectional propagation, the agent reaches the API through the
//! `kubernetes` Service (HTTPS, the projected token), and kubelet's probes run from the node's
//! network namespace.
//!
//! The pod runs exactly as rendered (issue 25): the agent container is not privileged, holds
//! only the capabilities the chart adds (the agent's required table), with no_new_privs and
//! containerd's default seccomp profile, without the host's PID namespace; this proves the
//! list suffices, down to adopting a meshed pod that started before the plugin. A second test
//! renders `agent.mountBpffs=false` on a node whose bpffs the host mounted: no container of
//! the pod is privileged at all.
//!
//! At default values (repair on, the startup taint on, no `CAP_SYS_ADMIN`) one node plays the
//! node-start race of issue 44: a meshed pod started before the plugin is repaired and
//! recreated into redirection (its network validator 95, then 0), the startup taint goes only
//! once the agent is ready, a chain rewritten under the agent is put back and its window's pod
//! repaired, and a user-namespaced meshed pod is redirected.
//!
//! The image is the archive `cargo xtask image` built in the same run
//! (`LINKERD_CNI_TEST_IMAGE`), else a stand-in with the image's layout made from the
//! workspace's binaries. The test prints which one and which architecture ran, and the time
//! from the agent container's start to `/ready` with 0 and with 1,000 registered pods (a
//! measurement for the benchmarks, not asserted).
//!
//! Run: `cargo test -p linkerd-cni-tests --test daemonset -- --test-threads=1`

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use linkerd_cni_agent::host::capabilities::{CAPABILITIES, required_names};
use linkerd_cni_common::paths;
use linkerd_cni_tests::{
    EchoServer, Placement,
    client::{Options, Report, run_client},
    layout,
    names::TempDir,
    node::{
        BRIDGE, ContainerSpec, CriNode, CriNodeOptions, NODE_NAME, PodSpec, STARTUP_TAINT, Sandbox,
        group_object_path, http_get,
        image::{self, ImageOrigin},
        kubelet::{
            ClusterView, KubeletPod, PodPlan, ProbeKind, admit_service_account, capability_number,
            daemonset_pod, http_status, translate,
        },
        namespace_manifest,
        render::{self, NAMESPACE, Renderer},
        startup_tainted, tainted_node_manifest,
    },
    proxy::{self, Event, PROXY_UID},
};
use serde_json::{Value, json};

const APP_UID: u32 = 1000;
/// The echo server on the node (the bridge's gateway).
const GATEWAY: [u8; 4] = [10, 244, 0, 1];
const SERVER_PORT: u16 = 8080;
const APP_PORT: u16 = 8080;
const CLIENT_TIMEOUT: Duration = Duration::from_secs(15);
/// A hang guard for the agent's readiness, never a performance bound.
const READY_GUARD: Duration = Duration::from_secs(180);
/// The container of the DaemonSet that runs the agent.
const AGENT_CONTAINER: &str = "install-cni";
/// Registered pods for the second start-to-ready measurement.
const BULK_PODS: usize = 1000;
/// The values file both renderers get: debug logs, so a failure explains itself.
const VALUES: &str = "logLevel: debug\nagent:\n  logLevel: info,linkerd_cni_agent=debug\n";
/// [`VALUES`] with `agent.sysAdmin` (issue 36): CAP_SYS_ADMIN, which adopting a pod that
/// started before the plugin needs (entering its netns, loading the iterator).
const VALUES_ADOPTION: &str =
    "logLevel: debug\nagent:\n  logLevel: info,linkerd_cni_agent=debug\n  sysAdmin: true\n";
/// [`VALUES`] for a node whose host mounts bpffs itself: no `mount-bpffs` init container.
const VALUES_HOST_BPFFS: &str =
    "logLevel: debug\nagent:\n  logLevel: info,linkerd_cni_agent=debug\n  mountBpffs: false\n";

fn ok<T>(node: &CriNode, what: &str, r: linkerd_cni_tests::Result<T>) -> T {
    r.unwrap_or_else(|e| panic!("{what}: {e}\n{}", node.diagnostics()))
}

/// The rendered install.
struct Install {
    objects: Vec<Value>,
    daemonset: Value,
    /// The image the DaemonSet's containers name.
    image: String,
}

fn render_install(renderer: Renderer, work: &Path) -> Install {
    render_install_with(renderer, VALUES, work)
}

fn render_install_with(renderer: Renderer, values: &str, work: &Path) -> Install {
    let objects = render::render(renderer, values, &work.join(format!("{renderer:?}")))
        .unwrap_or_else(|e| panic!("rendering with {renderer}: {e}"));
    let daemonset = render::find(&objects, "DaemonSet", "linkerd-cni")
        .unwrap_or_else(|e| panic!("{renderer}: {e}"))
        .clone();
    let image = daemonset
        .pointer("/spec/template/spec/containers/0/image")
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("{renderer}: the DaemonSet's container names no image"))
        .to_string();
    Install {
        objects,
        daemonset,
        image,
    }
}

/// A node with its own root, the install's objects served (the DaemonSet included), and the
/// DaemonSet's image imported under the name the DaemonSet gives it.
fn start_node(install: &Install, work: &Path) -> CriNode {
    let mut objects = vec![namespace_manifest("shop", &[])];
    if !install
        .objects
        .iter()
        .any(|o| o["kind"] == "Namespace" && o["metadata"]["name"] == NAMESPACE)
    {
        objects.push(namespace_manifest(NAMESPACE, &[]));
    }
    objects.extend(install.objects.iter().cloned());
    let node = CriNode::start_opts(
        &objects,
        CriNodeOptions {
            host_agent: false,
            own_root: true,
        },
    )
    .unwrap_or_else(|e| panic!("starting containerd's node: {e}"));
    let origin = ok(
        &node,
        "the DaemonSet's image",
        image::agent_image(&work.join("image"), &install.image),
    );
    let names = ok(
        &node,
        "importing the image",
        node.import_image_archive(origin.archive(), &install.image),
    );
    let (id, platform) = ok(
        &node,
        "the image's platform",
        node.image_platform(&install.image),
    );
    let arch = platform.rsplit('/').next().unwrap_or("?");
    println!(
        "daemonset: image {} ({id}) from the {origin} (archive names {names:?}) runs as \
         {platform}: architecture {arch}",
        install.image
    );
    if let ImageOrigin::Xtask(_) = origin {
        assert_eq!(
            platform,
            format!("linux/{}", host_arch()),
            "containerd picked this machine's platform from the image index"
        );
    }
    node
}

fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// The DaemonSet's pod for this node (the controller, the ServiceAccount admission, the
/// scheduler's binding), served by the API, and kubelet's translation of it.
fn plan_pod(node: &CriNode, install: &Install, suffix: &str) -> (Value, PodPlan) {
    let uid = PodSpec::new(NAMESPACE, "linkerd-cni", &[]).uid;
    let mut pod = ok(
        node,
        "the DaemonSet controller's pod",
        daemonset_pod(&install.daemonset, NODE_NAME, &uid, suffix),
    );
    ok(
        node,
        "the ServiceAccount admission",
        admit_service_account(&mut pod, &install.objects, suffix),
    );
    ok(
        node,
        "serving the pod",
        node.apply(std::slice::from_ref(&pod)),
    );
    let info = ok(node, "the node's info", node.node_info());
    let front = node
        .api_front()
        .expect("a node with its own root has an API front");
    let plan = ok(
        node,
        "kubelet's translation of the pod",
        translate(
            &pod,
            &info,
            &ClusterView {
                objects: &install.objects,
                ca_pem: front.ca_pem(),
            },
        ),
    );
    (pod, plan)
}

/// Runs the DaemonSet's pod; returns it and the time from its agent container's start to the
/// first `/ready` answering 200 (polled every 10 ms from the node netns: finer than kubelet's
/// period), after which kubelet's own readiness probe must pass too.
fn run_agent_pod(node: &CriNode, plan: PodPlan) -> (KubeletPod, Duration) {
    let pod = ok(
        node,
        "running the DaemonSet's pod",
        node.run_kubelet_pod(plan),
    );
    let c = pod
        .container(AGENT_CONTAINER)
        .unwrap_or_else(|| panic!("no {AGENT_CONTAINER} container"))
        .clone();
    let probe = pod
        .prober(AGENT_CONTAINER, ProbeKind::Readiness)
        .unwrap_or_else(|| panic!("the {AGENT_CONTAINER} container has no readiness probe"))
        .plan()
        .clone();
    let ready_at = node
        .netns()
        .run_in(|| {
            let deadline = Instant::now() + READY_GUARD;
            loop {
                if http_status(
                    probe.addr,
                    &probe.path,
                    &probe.host_header,
                    &probe.headers,
                    Duration::from_secs(1),
                ) == Ok(200)
                {
                    return Some(Instant::now());
                }
                if Instant::now() > deadline {
                    return None;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        })
        .unwrap_or_else(|e| panic!("polling /ready: {e}"));
    let Some(ready_at) = ready_at else {
        panic!(
            "the agent never answered {} {} with 200:\n--- agent ---\n{}\n{}",
            probe.addr,
            probe.path,
            pod.logs(AGENT_CONTAINER),
            node.diagnostics()
        );
    };
    let kubelet_ready = pod
        .prober(AGENT_CONTAINER, ProbeKind::Readiness)
        .map(|p| p.wait_passing(READY_GUARD))
        .unwrap_or_else(|| panic!("no readiness probe"))
        .unwrap_or_else(|e| {
            panic!(
                "kubelet's readiness probe: {e}\n{}",
                pod.logs(AGENT_CONTAINER)
            )
        });
    println!(
        "daemonset: {AGENT_CONTAINER} ready {:?} after StartContainer ({} every {:?}: ready \
         {:?} after the start)",
        ready_at.duration_since(c.starting),
        probe.path,
        probe.period,
        kubelet_ready.duration_since(c.starting)
    );
    (pod, ready_at.duration_since(c.starting))
}

/// The conflist's plugin types.
fn chain(node: &CriNode) -> Vec<String> {
    let text = std::fs::read_to_string(node.conflist()).unwrap_or_default();
    let v: Value = serde_json::from_str(&text).unwrap_or_default();
    v["plugins"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["type"].as_str().map(str::to_string))
        .collect()
}

fn plugin_installed(node: &CriNode) -> bool {
    node.cni_bin_dir().join("linkerd-cni").is_file()
}

fn gateway() -> SocketAddr {
    SocketAddr::from((GATEWAY, SERVER_PORT))
}

/// A meshed app pod (pod cgroup made first, as kubelet does), its proxy and app containers.
struct App {
    sandbox: Sandbox,
    app: String,
}

fn start_app(node: &CriNode, spec: &PodSpec, with_proxy: bool) -> App {
    ok(node, "pod cgroup", node.create_pod_cgroup(spec));
    let sandbox = ok(node, "RunPodSandbox", node.run_pod(spec));
    if with_proxy {
        ok(node, "proxy container", node.start_proxy(&sandbox));
    }
    let app = start_app_container(node, &sandbox);
    App { sandbox, app }
}

/// The app container of `sandbox`: an echo server on [`APP_PORT`], as [`APP_UID`].
fn start_app_container(node: &CriNode, sandbox: &Sandbox) -> String {
    let command = [
        "/bin/nc",
        "-ll",
        "-p",
        &APP_PORT.to_string(),
        "-e",
        "/bin/cat",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    ok(
        node,
        "app container",
        node.start_container(
            sandbox,
            &ContainerSpec {
                name: "app".into(),
                run_as_user: i64::from(APP_UID),
                command,
            },
        ),
    )
}

fn connect_out(node: &CriNode, app: &App, payload: &str) -> Report {
    let report = ok(
        node,
        "the app's outbound connection",
        node.run_client(&app.app, &Options::new(gateway()).send(payload)),
    );
    assert_eq!(
        report.uid, APP_UID,
        "the client ran as the container's user"
    );
    report
}

/// The app's outbound connections the proxy accepted (on its outbound port, with the
/// gateway as SO_ORIGINAL_DST).
fn accepted_outbound(events: &[Event]) -> usize {
    events
        .iter()
        .filter(|e| {
            matches!(e, Event::Accepted { listener, orig_dst, .. }
                if listener.port() == proxy::OUTBOUND_PORT && *orig_dst == gateway())
        })
        .count()
}

/// The meshed app's next outbound connection goes through its proxy (SO_ORIGINAL_DST), and
/// the server sees the pod's address (the proxy's own upstream, UID 2102, is not redirected).
fn assert_redirected(node: &CriNode, app: &App, server: &EchoServer, when: &str) {
    let log = node.proxy_log(&app.sandbox);
    let before = accepted_outbound(&log.events().unwrap_or_default());
    let served = server.wait_for(0, CLIENT_TIMEOUT).map_or(0, |r| r.len());
    let payload = format!("{when}\n");
    let report = connect_out(node, app, &payload);
    assert!(
        report.received_matches(&server.expected_reply(payload.as_bytes())),
        "{when}: the meshed app's reply: {report:?}\n{}",
        node.diagnostics()
    );
    assert_eq!(report.peer, Some(gateway()), "{when}: the app's peer");
    let events = ok(
        node,
        "proxy events",
        log.wait_for(CLIENT_TIMEOUT, |e| accepted_outbound(e) > before),
    );
    assert_eq!(
        accepted_outbound(&events),
        before + 1,
        "{when}: the proxy accepted the app's connection on {} with SO_ORIGINAL_DST {}",
        proxy::OUTBOUND_PORT,
        gateway()
    );
    let received = ok(node, "server", server.wait_for(served + 1, CLIENT_TIMEOUT));
    assert_eq!(
        received[served].peer.ip(),
        IpAddr::V4(app.sandbox.ip),
        "{when}: the proxy's upstream (UID {PROXY_UID}) comes from the pod"
    );
}

/// The unmeshed app's connection goes straight to the server (nothing listens on the proxy
/// port in that pod: a redirected connection would be refused).
fn assert_direct(node: &CriNode, app: &App, server: &EchoServer, when: &str) {
    let served = server.wait_for(0, CLIENT_TIMEOUT).map_or(0, |r| r.len());
    let payload = format!("{when}\n");
    let report = connect_out(node, app, &payload);
    assert!(
        report.received_matches(&server.expected_reply(payload.as_bytes())),
        "{when}: the unmeshed app's reply: {report:?}"
    );
    let received = ok(node, "server", server.wait_for(served + 1, CLIENT_TIMEOUT));
    assert_eq!(received[served].peer.ip(), IpAddr::V4(app.sandbox.ip));
}

/// The meshed app is reachable inbound through its proxy's inbound listener.
fn assert_inbound_redirected(node: &CriNode, app: &App, when: &str) {
    let target = SocketAddr::from((app.sandbox.ip, APP_PORT));
    let log = node.proxy_log(&app.sandbox);
    let inbound = |events: &[Event]| {
        events
            .iter()
            .filter(|e| {
                matches!(e, Event::Accepted { listener, orig_dst, .. }
                    if listener.port() == proxy::INBOUND_PORT && *orig_dst == target)
            })
            .count()
    };
    let before = inbound(&log.events().unwrap_or_default());
    let report = ok(
        node,
        "inbound client",
        run_client(
            &Placement::new().netns(node.netns()),
            &Options::new(target).send("inbound\n"),
            CLIENT_TIMEOUT,
        ),
    );
    assert!(
        report.connect.ok && report.received == "inbound\n",
        "{when}: the app echoed the inbound request: {report:?}"
    );
    ok(
        node,
        "proxy events",
        log.wait_for(CLIENT_TIMEOUT, |e| inbound(e) > before),
    );
}

/// The mount of the container's `path` and its propagation, from its process's mountinfo:
/// (`shared`, `master`, read-only).
fn mount_of(pid: u32, path: &str) -> Option<(bool, bool, bool)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).ok()?;
    text.lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        if f.get(4) != Some(&path) {
            return None;
        }
        let sep = f.iter().position(|x| *x == "-")?;
        let optional = &f[6..sep];
        let ro = f.get(5).is_some_and(|o| o.split(',').any(|x| x == "ro"));
        Some((
            optional.iter().any(|o| o.starts_with("shared:")),
            optional.iter().any(|o| o.starts_with("master:")),
            ro,
        ))
    })
}

/// What the running agent container got: its process's credentials, environment, mounts,
/// seccomp mode and no_new_privs, against the translation's CRI config.
fn assert_container_as_translated(node: &CriNode, pod: &KubeletPod) {
    let c = pod.container(AGENT_CONTAINER).expect("agent container");
    let pid = ok(node, "the agent's PID", node.container_pid(&c.id));
    let plan = pod
        .plan
        .containers
        .iter()
        .find(|p| p.name == AGENT_CONTAINER)
        .expect("plan");
    let sc = plan
        .config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.clone())
        .expect("security context");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_string())
            .unwrap_or_default()
    };
    // Credentials: runAsUser.
    if let Some(uid) = &sc.run_as_user {
        let uids = field("Uid:");
        assert!(
            uids.split_whitespace().all(|u| u == uid.value.to_string()),
            "runAsUser {}: the agent runs as {uids}",
            uid.value
        );
    }
    // Capabilities: privileged gets every one; otherwise exactly the added ones (after
    // drop ALL).
    let cap_eff = u64::from_str_radix(&field("CapEff:"), 16).expect("CapEff");
    let cap_bnd = u64::from_str_radix(&field("CapBnd:"), 16).expect("CapBnd");
    if sc.privileged {
        assert_eq!(
            cap_eff, cap_bnd,
            "a privileged container has every capability"
        );
    } else if let Some(caps) = &sc.capabilities {
        let want: u64 = caps
            .add_capabilities
            .iter()
            .map(|c| 1u64 << cap_number(c))
            .sum();
        if caps.drop_capabilities.iter().any(|d| d == "ALL") {
            assert_eq!(
                cap_eff, want,
                "capabilities as added after drop ALL: {caps:?}"
            );
        }
    }
    // no_new_privs (allowPrivilegeEscalation: false) and seccomp (filter mode 2 unless
    // unconfined; containerd runs privileged containers unconfined).
    assert_eq!(
        field("NoNewPrivs:") == "1",
        sc.no_new_privs,
        "NoNewPrivs as translated"
    );
    let seccomp_filtered = field("Seccomp:") == "2";
    let want_filter = !sc.privileged
        && sc
            .seccomp
            .as_ref()
            .is_some_and(|s| s.profile_type != 1 /* Unconfined */);
    assert_eq!(
        seccomp_filtered, want_filter,
        "seccomp as translated: {:?}",
        sc.seccomp
    );
    // readOnlyRootFilesystem.
    let (_, _, root_ro) = mount_of(pid, "/").expect("the container's root mount");
    assert_eq!(root_ro, sc.readonly_rootfs, "read-only root as translated");
    // Every mount with its propagation and read-only flag.
    for m in &plan.config.mounts {
        let (shared, slave, ro) = mount_of(pid, &m.container_path).unwrap_or_else(|| {
            panic!("{} is not mounted in the agent container", m.container_path)
        });
        match m.propagation {
            2 => assert!(
                shared,
                "{}: Bidirectional is a shared mount",
                m.container_path
            ),
            1 => assert!(
                slave && !shared,
                "{}: HostToContainer is a slave mount",
                m.container_path
            ),
            _ => assert!(
                !shared && !slave,
                "{}: no propagation is a private mount",
                m.container_path
            ),
        }
        assert_eq!(
            ro, m.readonly,
            "{}: read-only as translated",
            m.container_path
        );
    }
    // The environment: every variable as translated, downward API and ConfigMap values
    // included.
    let environ = std::fs::read(format!("/proc/{pid}/environ")).expect("environ");
    let env: BTreeMap<String, String> = environ
        .split(|b| *b == 0)
        .filter_map(|kv| {
            let kv = String::from_utf8_lossy(kv);
            let (k, v) = kv.split_once('=')?;
            Some((k.to_string(), v.to_string()))
        })
        .collect();
    for kv in &plan.config.envs {
        assert_eq!(
            env.get(&kv.key),
            Some(&kv.value),
            "{} in the agent's environment",
            kv.key
        );
    }
    assert_eq!(
        env.get("POD_NAMESPACE").map(String::as_str),
        Some(NAMESPACE)
    );
    assert_eq!(
        env.get("LINKERD_CNI_AGENT_NODE_NAME").map(String::as_str),
        Some(NODE_NAME),
        "spec.nodeName through the downward API"
    );
    // The cluster DNS in its resolv.conf (dnsPolicy ClusterFirstWithHostNet).
    let resolv =
        std::fs::read_to_string(format!("/proc/{pid}/root/etc/resolv.conf")).unwrap_or_default();
    for server in &pod.plan.sandbox.dns_config.as_ref().expect("dns").servers {
        assert!(
            resolv.contains(server.as_str()),
            "nameserver {server} in the container's resolv.conf: {resolv}"
        );
    }
    // hostNetwork and hostPID: the node's network namespace and the host's PID namespace.
    let ns = |p: String, kind: &str| std::fs::read_link(format!("{p}/ns/{kind}")).ok();
    let ns_opts = sc.namespace_options.as_ref().expect("namespaces");
    let node_net = std::fs::metadata(node.netns().path()).map(|m| {
        use std::os::unix::fs::MetadataExt;
        m.ino()
    });
    let agent_net = std::fs::metadata(format!("/proc/{pid}/ns/net")).map(|m| {
        use std::os::unix::fs::MetadataExt;
        m.ino()
    });
    assert_eq!(
        ns_opts.network == 2,
        node_net.ok() == agent_net.ok(),
        "hostNetwork as translated"
    );
    assert_eq!(
        ns_opts.pid == 2,
        ns(format!("/proc/{pid}"), "pid") == ns("/proc/self".into(), "pid"),
        "hostPID as translated"
    );
}

/// A plan as lines that compare across renderings: maps sorted, the `created-by` annotation
/// (which names the renderer) and the token (which names the time) left out.
fn canonical(p: &PodPlan) -> Vec<String> {
    use linkerd_cni_tests::node::kubelet::NodeFile;
    let sorted = |m: &std::collections::HashMap<String, String>| {
        m.iter()
            .filter(|(k, _)| k.as_str() != "linkerd.io/created-by")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<BTreeMap<String, String>>()
    };
    let mut out = Vec::new();
    let mut sandbox = p.sandbox.clone();
    out.push(format!("sandbox labels {:?}", sorted(&sandbox.labels)));
    out.push(format!(
        "sandbox annotations {:?}",
        sorted(&sandbox.annotations)
    ));
    sandbox.labels.clear();
    sandbox.annotations.clear();
    out.push(format!("sandbox {sandbox:?}"));
    for c in p.init_containers.iter().chain(&p.containers) {
        let mut config = c.config.clone();
        out.push(format!("{} labels {:?}", c.name, sorted(&config.labels)));
        out.push(format!(
            "{} annotations {:?}",
            c.name,
            sorted(&config.annotations)
        ));
        config.labels.clear();
        config.annotations.clear();
        out.push(format!("{} {config:?}", c.name));
        out.push(format!(
            "{} probes {:?} {:?} {:?}",
            c.name, c.readiness, c.liveness, c.startup
        ));
    }
    for f in &p.files {
        match f {
            NodeFile::File { path, mode, .. } if path.ends_with("token") => {
                out.push(format!("token file {} {mode:o}", path.display()))
            }
            other => out.push(format!("{other:?}")),
        }
    }
    out
}

fn cap_number(name: &str) -> u32 {
    capability_number(name).unwrap_or_else(|| panic!("unknown capability {name}"))
}

/// Stops the DaemonSet's pod as kubelet does; the agent must exit cleanly on SIGTERM.
fn stop_agent_pod(node: &CriNode, pod: &mut KubeletPod, why: &str) {
    let logs = pod.logs(AGENT_CONTAINER);
    let exits = ok(
        node,
        "stopping the DaemonSet's pod",
        node.stop_kubelet_pod(pod),
    );
    let agent = exits
        .iter()
        .find(|e| e.name == AGENT_CONTAINER)
        .expect("the agent's exit");
    assert_eq!(
        agent.exit_code, 0,
        "{why}: the agent exits cleanly on SIGTERM ({}, after {:?})\n{logs}",
        agent.reason, agent.stop_took
    );
    println!(
        "daemonset: {why}: {AGENT_CONTAINER} stopped in {:?}",
        agent.stop_took
    );
}

/// A CNI ADD of `spec`'s sandbox `id` (netns `netns`, holding `address`) through the
/// installed plugin, run in the node as containerd runs it: the conflist's entry with the
/// primary plugin's result as `prevResult`, `CNI_ARGS` as containerd sends them.
fn plugin_add(
    node: &CriNode,
    spec: &PodSpec,
    id: &str,
    netns: &str,
    address: &str,
) -> std::process::Output {
    let conflist: Value =
        serde_json::from_str(&std::fs::read_to_string(node.conflist()).expect("the conflist"))
            .expect("conflist JSON");
    let mut stdin = conflist["plugins"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["type"] == "linkerd-cni"))
        .cloned()
        .expect("the linkerd-cni entry");
    stdin["cniVersion"] = conflist["cniVersion"].clone();
    stdin["name"] = conflist["name"].clone();
    stdin["prevResult"] = json!({
        "cniVersion": conflist["cniVersion"],
        "interfaces": [{"name": "eth0", "sandbox": netns}],
        "ips": [{"address": address, "interface": 0}],
    });
    let args: Vec<String> = spec
        .cni_args(id)
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let plugin = Path::new(paths::CNI_BIN_DIR).join("linkerd-cni");
    let mut cmd = node.node_command(&plugin).expect("the plugin's command");
    cmd.env_clear()
        .env("CNI_COMMAND", "ADD")
        .env("CNI_CONTAINERID", id)
        .env("CNI_NETNS", netns)
        .env("CNI_IFNAME", "eth0")
        .env("CNI_ARGS", args.join(";"))
        .env("CNI_PATH", paths::CNI_BIN_DIR)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().expect("spawning the plugin");
    {
        use std::io::Write;
        let mut pipe = child.stdin.take().expect("stdin");
        pipe.write_all(stdin.to_string().as_bytes())
            .expect("writing stdin");
    }
    child.wait_with_output().expect("the plugin's exit")
}

/// Registers `n` meshed pods with the running agent the way containerd would: each a netns
/// in the node (`ip netns add`), a Pod object, and a CNI ADD through the installed plugin
/// with the conflist's entry and a prevResult. Returns how long it took.
fn register_bulk(node: &CriNode, n: usize) -> Duration {
    let t = Instant::now();
    let prefix = format!("l5dbulk{}", std::process::id());
    let script = format!(
        "for i in $(seq 0 {}); do ip netns add {prefix}-$i && ip -n {prefix}-$i link set lo up \
         || exit 1; done",
        n - 1
    );
    let out = ok(
        node,
        "creating the bulk pods' netns",
        node.node_command("sh")
            .and_then(|mut c| linkerd_cni_tests::names::run(c.args(["-c", &script]))),
    );
    let _ = out;
    let mut specs = Vec::with_capacity(n);
    let mut manifests = vec![namespace_manifest("bulk", &[])];
    for i in 0..n {
        let spec = PodSpec::meshed("bulk", &format!("bulk-{i}"));
        manifests.push(spec.manifest(NODE_NAME));
        specs.push(spec);
    }
    ok(node, "serving the bulk pods", node.apply(&manifests));
    for (i, spec) in specs.iter().enumerate() {
        let netns = format!("/var/run/netns/{prefix}-{i}");
        let id = format!("{:064x}", 0xb000_0000_0000u64 + i as u64);
        let address = format!("10.245.{}.{}/16", i / 250, i % 250 + 1);
        let out = plugin_add(node, spec, &id, &netns, &address);
        assert!(
            out.status.success(),
            "ADD of bulk pod {i}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    t.elapsed()
}

/// The rendered pod's least-privilege shape (issue 25): no host PIDs, the agent container
/// unprivileged with exactly the agent's required capabilities (and `extra`, optional ones
/// the values asked for), and `mount-bpffs` the only privileged container (or none when the
/// host mounts bpffs).
fn assert_rendered_least_privilege(install: &Install, mount_bpffs: bool, extra: &[&str]) {
    let pod = install
        .daemonset
        .pointer("/spec/template/spec")
        .expect("pod template");
    assert_eq!(pod.get("hostPID"), None, "no hostPID");
    assert_eq!(pod["hostNetwork"], true);
    let privileged: Vec<&str> = ["initContainers", "containers"]
        .iter()
        .flat_map(|k| pod[*k].as_array().into_iter().flatten())
        .filter(|c| c.pointer("/securityContext/privileged") == Some(&json!(true)))
        .filter_map(|c| c["name"].as_str())
        .collect();
    let want: &[&str] = if mount_bpffs { &["mount-bpffs"] } else { &[] };
    assert_eq!(privileged, want, "the privileged containers");
    let agent = pod["containers"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == AGENT_CONTAINER))
        .expect("the agent container");
    let required: Vec<&str> = required_names()
        .into_iter()
        .chain(extra.iter().copied())
        .collect();
    assert_eq!(
        agent.pointer("/securityContext/capabilities"),
        Some(&json!({"drop": ["ALL"], "add": required})),
        "the agent container's capabilities are the agent's required table"
    );
    assert_eq!(agent.get("ports"), None, "no containerPort (a hostPort)");
}

/// The running agent's effective capabilities are exactly the agent's required table (and
/// `extra`, optional ones the values asked for).
fn assert_agent_holds_only_its_capabilities(node: &CriNode, pod: &KubeletPod, extra: &[&str]) {
    let c = pod.container(AGENT_CONTAINER).expect("agent container");
    let pid = ok(node, "the agent's PID", node.container_pid(&c.id));
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .expect("CapEff");
    let want: u64 = CAPABILITIES
        .iter()
        .filter(|c| c.required || extra.contains(&c.name))
        .map(|c| 1u64 << c.bit)
        .sum();
    assert_eq!(
        eff, want,
        "the agent process holds exactly the required capabilities and {extra:?} (CapEff {eff:x})"
    );
}

/// Waits until the agent's `/metrics` (read on its probe address, from the node's network
/// namespace, as anything on the node would) counts `n` adoptions.
fn wait_adoptions(node: &CriNode, pod: &KubeletPod, n: u64) {
    let addr = pod
        .prober(AGENT_CONTAINER, ProbeKind::Readiness)
        .expect("readiness probe")
        .plan()
        .addr;
    let line = format!("linkerd_cni_agent_adoptions_total {n}\n");
    let found = node
        .netns()
        .run_in(|| {
            let deadline = Instant::now() + READY_GUARD;
            loop {
                let body = http_get(addr, "/metrics", Duration::from_secs(2))
                    .map(|(_, b)| b)
                    .unwrap_or_default();
                if body.contains(&line) {
                    return true;
                }
                if Instant::now() > deadline {
                    return false;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        })
        .unwrap_or_else(|e| panic!("reading /metrics: {e}"));
    assert!(
        found,
        "the agent never counted {n} adoption(s):\n{}\n{}",
        pod.logs(AGENT_CONTAINER),
        node.diagnostics()
    );
}

fn registered(node: &CriNode) -> usize {
    ok(node, "the agent's state", node.state())
        .registered()
        .len()
}

#[test]
fn daemonset_pod_installs_redirects_survives_a_rolling_update_and_uninstalls() {
    let work = TempDir::new().expect("scratch directory");
    let install = render_install_with(Renderer::Cli, VALUES_ADOPTION, work.path());
    let node = start_node(&install, work.path());
    let server = ok(
        &node,
        "echo server on the node",
        EchoServer::bind_in(
            node.netns(),
            SocketAddr::from(([0, 0, 0, 0], SERVER_PORT)),
            "node",
        ),
    );
    let root = node.root().expect("own root");
    assert_eq!(
        chain(&node),
        ["bridge"],
        "before the install: the primary CNI alone"
    );
    assert_eq!(
        root.fstype_at(paths::BPFFS),
        None,
        "before the install nothing is mounted at the node's {}",
        paths::BPFFS
    );
    assert_rendered_least_privilege(&install, true, &["SYS_ADMIN"]);

    // 0. A meshed pod that starts before the plugin is in the chain (no ADD reaches any
    //    agent): its proxy listens, kubelet publishes its address; it runs unredirected.
    let early_spec = PodSpec::meshed("shop", "early");
    let early = start_app(&node, &early_spec, true);
    ok(
        &node,
        "publishing the early pod's address",
        node.apply(&[early_spec.manifest_running(NODE_NAME, &[IpAddr::V4(early.sandbox.ip)])]),
    );
    assert_direct(&node, &early, &server, "before the install");

    // 1. The DaemonSet's first pod on this node: bpffs mounted through Bidirectional
    //    propagation, the plugin installed, ready.
    let (_, plan) = plan_pod(&node, &install, "a0001");
    let (mut pod, ready_empty) = run_agent_pod(&node, plan);
    assert_eq!(
        root.fstype_at(paths::BPFFS).as_deref(),
        Some("bpf"),
        "mount-bpffs's mount reached the node (Bidirectional)"
    );
    assert_eq!(
        chain(&node),
        ["bridge", "linkerd-cni"],
        "the agent appended the plugin to the node's conflist\n{}",
        pod.logs(AGENT_CONTAINER)
    );
    assert!(plugin_installed(&node), "the plugin binary was copied");
    assert!(
        node.cni_conf_dir()
            .join(paths::KUBECONFIG_FILE_NAME)
            .is_file(),
        "the plugin's kubeconfig was written"
    );
    assert!(
        node.pin_root().join(paths::PIN_MAPS).is_dir(),
        "the agent pinned its maps on the node's bpffs"
    );
    assert_container_as_translated(&node, &pod);
    assert_agent_holds_only_its_capabilities(&node, &pod, &["SYS_ADMIN"]);
    // The early pod is adopted in place, on these capabilities and without the host's PIDs:
    // outbound through its proxy, inbound to the listener its proxy opened before the agent.
    wait_adoptions(&node, &pod, 1);
    assert_redirected(&node, &early, &server, "adopted");
    assert_inbound_redirected(&node, &early, "adopted");
    let front = node.api_front().expect("API front");
    let token = pod.plan.token.clone().expect("a projected token");
    assert!(
        front.bearer_tokens().contains(&token),
        "the agent reached the API through the kubernetes Service with the projected token"
    );
    let api = node.api_server().expect("API server");
    assert!(
        api.requests().iter().any(|r| r.path == "/api/v1/pods"
            && r.param("fieldSelector") == Some(format!("spec.nodeName={NODE_NAME}").as_str())),
        "the agent watches this node's pods (downward-API node name)"
    );
    println!(
        "daemonset: time from container start to /ready with 0 registered pods: {ready_empty:?}"
    );

    // 2. App pods: the meshed one through its proxy, the unmeshed one untouched.
    let meshed = start_app(&node, &PodSpec::meshed("shop", "web"), true);
    let plain = start_app(&node, &PodSpec::unmeshed("shop", "plain"), false);
    assert_redirected(&node, &meshed, &server, "installed");
    assert_inbound_redirected(&node, &meshed, "installed");
    assert_direct(&node, &plain, &server, "installed");
    // kubelet's liveness probe: it may fail before the agent listens (the first probe runs
    // at the start), never up to its failure threshold (a restart).
    let liveness = pod
        .prober(AGENT_CONTAINER, ProbeKind::Liveness)
        .expect("liveness probe")
        .wait_state("a liveness probe to succeed", READY_GUARD, |s| {
            s.results.iter().any(|r| r.success())
        })
        .unwrap_or_else(|e| panic!("{e}\n{}", pod.logs(AGENT_CONTAINER)));
    assert_eq!(
        liveness.threshold_failures, 0,
        "kubelet's liveness probe never reached its failure threshold: {:?}",
        liveness.results
    );

    // 3. A rolling update: the DaemonSet is still served when the pod stops; the plugin stays
    //    in the conflist, and running pods stay redirected while no agent runs.
    stop_agent_pod(&node, &mut pod, "rolling update");
    assert_eq!(
        chain(&node),
        ["bridge", "linkerd-cni"],
        "a rolling update keeps the plugin in the conflist"
    );
    assert!(plugin_installed(&node), "and its binary");
    assert_redirected(&node, &meshed, &server, "between two agents");
    assert_direct(&node, &plain, &server, "between two agents");

    // 4. The next pod adopts the pinned state.
    let (_, plan) = plan_pod(&node, &install, "b0002");
    let (mut pod, _) = run_agent_pod(&node, plan);
    assert_redirected(&node, &meshed, &server, "after the rolling update");
    assert_direct(&node, &plain, &server, "after the rolling update");
    let late = start_app(&node, &PodSpec::meshed("shop", "late"), true);
    assert_redirected(&node, &late, &server, "a pod started under the new agent");

    // 5. 1,000 more registered pods, and the next agent's start to /ready with them.
    let before = registered(&node);
    let took = register_bulk(&node, BULK_PODS);
    let count = registered(&node);
    assert_eq!(count, before + BULK_PODS, "every bulk pod registered");
    println!("daemonset: {BULK_PODS} pods registered through the plugin in {took:?}");
    stop_agent_pod(&node, &mut pod, "rolling update with 1,000 more pods");
    let (_, plan) = plan_pod(&node, &install, "c0003");
    let (mut pod, ready_full) = run_agent_pod(&node, plan);
    assert_eq!(
        registered(&node),
        count,
        "the new agent kept every registration"
    );
    println!(
        "daemonset: time from container start to /ready with {count} registered pods: \
         {ready_full:?} (0 registered: {ready_empty:?})"
    );
    assert_redirected(&node, &meshed, &server, "after the restart at 1,000 pods");

    // 6. An uninstall: the DaemonSet is gone when the pod stops; the plugin leaves the
    //    conflist, its binary and kubeconfig go; running pods stay redirected.
    let ds_path = group_object_path(&install.daemonset).expect("DaemonSet path");
    api.remove_route(&ds_path);
    stop_agent_pod(&node, &mut pod, "uninstall");
    assert_eq!(chain(&node), ["bridge"], "an uninstall removes the plugin");
    assert!(!plugin_installed(&node), "and its binary");
    assert!(
        !node
            .cni_conf_dir()
            .join(paths::KUBECONFIG_FILE_NAME)
            .exists(),
        "and its kubeconfig"
    );
    assert_redirected(&node, &meshed, &server, "after the uninstall");

    // 7. Installed again: the new pod adopts what is pinned.
    api.route(&ds_path, install.daemonset.clone());
    let (_, plan) = plan_pod(&node, &install, "d0004");
    let (_pod, _) = run_agent_pod(&node, plan);
    assert_eq!(chain(&node), ["bridge", "linkerd-cni"], "installed again");
    assert_redirected(&node, &meshed, &server, "after the reinstall");
    assert_redirected(&node, &late, &server, "after the reinstall");
    assert_direct(&node, &plain, &server, "after the reinstall");
}

/// Both renderers' DaemonSets translate (no field the translation does not handle) into the
/// same CRI configuration, apart from who created them; and a field nobody handles fails the
/// translation, naming it.
#[test]
fn cli_and_helm_render_the_same_pod_and_unknown_fields_fail() {
    let work = TempDir::new().expect("scratch directory");
    let cli = render_install(Renderer::Cli, work.path());
    let helm = render_install(Renderer::Helm, work.path());
    let info = linkerd_cni_tests::node::kubelet::NodeInfo {
        name: NODE_NAME.into(),
        ip: linkerd_cni_tests::node::NODE_IP,
        labels: [("kubernetes.io/os".to_string(), "linux".to_string())].into(),
        cluster_dns: linkerd_cni_tests::node::CLUSTER_DNS,
        cluster_domain: "cluster.local".into(),
        api_service: "10.96.0.1:443".parse().expect("address"),
        resolv_conf: "nameserver 192.0.2.53\n".into(),
        etc_hosts: "127.0.0.1 localhost\n".into(),
        pods_dir: "/var/lib/kubelet/pods".into(),
        logs_dir: "/var/log/pods".into(),
        memory_bytes: 1 << 33,
    };
    let plan = |install: &Install, change: &dyn Fn(&mut Value)| {
        let mut pod = daemonset_pod(&install.daemonset, NODE_NAME, "uid-1", "x1").expect("pod");
        admit_service_account(&mut pod, &install.objects, "x1").expect("admission");
        change(&mut pod);
        translate(
            &pod,
            &info,
            &ClusterView {
                objects: &install.objects,
                ca_pem: "CA",
            },
        )
    };
    let a = plan(&cli, &|_| {}).unwrap_or_else(|e| panic!("{}: {e}", Renderer::Cli));
    let b = plan(&helm, &|_| {}).unwrap_or_else(|e| panic!("{}: {e}", Renderer::Helm));
    let (ca, cb) = (canonical(&a), canonical(&b));
    let diff: Vec<String> = ca
        .iter()
        .zip(&cb)
        .filter(|(x, y)| x != y)
        .map(|(x, y)| format!("cli:  {x}\nhelm: {y}"))
        .collect();
    assert!(
        diff.is_empty() && ca.len() == cb.len(),
        "the CLI's and Helm's pods translate alike:\n{}",
        diff.join("\n")
    );
    println!(
        "daemonset: both renderings translate: {} init container(s), {} container(s), {} \
         node files, QoS {:?}",
        a.init_containers.len(),
        a.containers.len(),
        a.files.len(),
        a.qos
    );
    // A field the chart might grow: the translation names it.
    let err = plan(&cli, &|pod| {
        pod["spec"]["containers"][0]["stdin"] = json!(true)
    })
    .map(|_| ())
    .expect_err("an unhandled field fails the translation");
    assert!(
        err.to_string().contains("/spec/containers/0/stdin"),
        "the error names the field: {err}"
    );
    let err = plan(&cli, &|pod| {
        pod["spec"]["shareProcessNamespace"] = json!(true)
    });
    assert!(err.is_err(), "shareProcessNamespace is not handled");
}

/// A node whose host mounts bpffs itself (as systemd does): `agent.mountBpffs=false` renders no
/// `mount-bpffs` init container, so no container of the pod is privileged and no mount is
/// Bidirectional. The agent pins on the host's bpffs through its HostToContainer mount (the
/// node sees the pins), redirects a meshed pod, and the next pod after a rolling update keeps
/// the redirection and the pins. When the host then loses its bpffs, the running agent's own
/// mount keeps the pods redirected until it stops; the pins go with it, and the next agent,
/// once the host has bpffs again, re-attaches the pod from its registry.
#[test]
fn host_mounted_bpffs_leaves_nothing_privileged() {
    let work = TempDir::new().expect("scratch directory");
    let install = render_install_with(Renderer::Cli, VALUES_HOST_BPFFS, work.path());
    let helm = render_install_with(Renderer::Helm, VALUES_HOST_BPFFS, &work.path().join("helm"));
    assert_eq!(
        helm.daemonset.pointer("/spec/template/spec/initContainers"),
        None,
        "helm template renders no init container either"
    );
    // The default capabilities, BPF, NET_ADMIN and PERFMON (issue 36): no CAP_SYS_ADMIN.
    assert_rendered_least_privilege(&install, false, &[]);
    let node = start_node(&install, work.path());
    let root = node.root().expect("own root");
    // The host mounts bpffs at boot (shared, as everything on a systemd host).
    ok(
        &node,
        "mounting bpffs on the node",
        node.node_command("sh").and_then(|mut c| {
            linkerd_cni_tests::names::run(c.args([
                "-c",
                &format!(
                    "mount -t bpf bpf {0} && mount --make-shared {0}",
                    paths::BPFFS
                ),
            ]))
        }),
    );
    assert_eq!(root.fstype_at(paths::BPFFS).as_deref(), Some("bpf"));
    let server = ok(
        &node,
        "echo server on the node",
        EchoServer::bind_in(
            node.netns(),
            SocketAddr::from(([0, 0, 0, 0], SERVER_PORT)),
            "node",
        ),
    );
    let (_, plan) = plan_pod(&node, &install, "h0001");
    assert!(plan.init_containers.is_empty(), "no init container runs");
    let (mut pod, ready) = run_agent_pod(&node, plan);
    println!("daemonset: with the host's bpffs the agent was ready {ready:?} after its start");
    assert_container_as_translated(&node, &pod);
    assert_agent_holds_only_its_capabilities(&node, &pod, &[]);
    assert_eq!(chain(&node), ["bridge", "linkerd-cni"]);
    assert!(
        node.pin_root().join(paths::PIN_MAPS).is_dir(),
        "the agent pinned its maps on the host's bpffs (seen from the node)"
    );
    let meshed = start_app(&node, &PodSpec::meshed("shop", "web"), true);
    assert_redirected(&node, &meshed, &server, "nothing privileged");
    assert_inbound_redirected(&node, &meshed, "nothing privileged");

    // A rolling update: the pins stay on the host's bpffs, the next agent adopts them.
    stop_agent_pod(&node, &mut pod, "rolling update, host's bpffs");
    assert!(node.pin_root().join(paths::PIN_MAPS).is_dir(), "pins kept");
    assert_redirected(&node, &meshed, &server, "between two agents, host's bpffs");
    let (_, plan) = plan_pod(&node, &install, "h0002");
    let (mut pod, _) = run_agent_pod(&node, plan);
    assert_redirected(
        &node,
        &meshed,
        &server,
        "after the rolling update, host's bpffs",
    );

    // The host loses its bpffs while the agent runs. The agent's HostToContainer mount is a
    // mount of its own: it keeps that bpffs instance, its pins and the pods' links alive, but
    // the host no longer sees them, and the agent cannot make a mount the host's.
    let host_bpffs = |cmd: &str| {
        ok(
            &node,
            cmd,
            node.node_command("sh")
                .and_then(|mut c| linkerd_cni_tests::names::run(c.args(["-c", cmd]))),
        )
    };
    host_bpffs(&format!("umount {}", paths::BPFFS));
    assert_eq!(
        root.fstype_at(paths::BPFFS),
        None,
        "the node lost its bpffs"
    );
    assert_redirected(&node, &meshed, &server, "host lost bpffs, agent running");
    // When that agent stops, its mount and with it the pins and links go: the meshed pod's
    // connections go straight out until the next agent re-attaches it from its registry.
    stop_agent_pod(&node, &mut pod, "rolling update after the host lost bpffs");
    let log = node.proxy_log(&meshed.sandbox);
    let before = accepted_outbound(&log.events().unwrap_or_default());
    assert_direct(
        &node,
        &meshed,
        &server,
        "no agent, pins gone with its container",
    );
    assert_eq!(
        accepted_outbound(&log.events().unwrap_or_default()),
        before,
        "the pod's connection did not reach its proxy: its links went with the old agent's mount"
    );
    // The host mounts bpffs again (systemd at the next boot, or by hand); the next agent pins
    // on it and re-attaches the registered pod.
    host_bpffs(&format!(
        "mount -t bpf bpf {0} && mount --make-shared {0}",
        paths::BPFFS
    ));
    let (_, plan) = plan_pod(&node, &install, "h0003");
    let (_pod, _) = run_agent_pod(&node, plan);
    assert_redirected(&node, &meshed, &server, "re-attached after bpffs came back");
    assert!(
        node.pin_root().join(paths::PIN_MAPS).is_dir(),
        "pinned on the host's bpffs again"
    );
}

/// What of linkerd-cni's a node can hold, compared before the install and after the
/// uninstall: the conflists (name and content), the CNI bin dir (names and sizes), the
/// agent's `/run` directory, what is mounted at the node's bpffs path and what it holds, and
/// the programs attached directly to the cgroup2 root (where the shared attachment goes).
#[derive(Debug, PartialEq, Eq)]
struct NodeFiles {
    conflists: BTreeMap<String, String>,
    cni_bin: BTreeMap<String, u64>,
    run_dir: Option<Vec<String>>,
    bpffs: (Option<String>, Option<Vec<String>>),
    cgroup_root_programs: String,
}

/// Every path below `dir`, relative to it, sorted; `None` when `dir` does not exist.
fn tree(dir: &Path) -> Option<Vec<String>> {
    fn walk(dir: &Path, base: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            out.push(p.strip_prefix(base).unwrap_or(&p).display().to_string());
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                walk(&p, base, out);
            }
        }
    }
    dir.is_dir().then(|| {
        let mut out = Vec::new();
        walk(dir, dir, &mut out);
        out.sort();
        out
    })
}

fn node_files(node: &CriNode) -> NodeFiles {
    let root = node.root().expect("own root");
    let read = |dir: PathBuf| -> Vec<(String, std::fs::Metadata, PathBuf)> {
        std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
            .flatten()
            .map(|e| {
                let meta = e.metadata().expect("metadata");
                (e.file_name().to_string_lossy().into_owned(), meta, e.path())
            })
            .collect()
    };
    let conflists = read(node.cni_conf_dir())
        .into_iter()
        .map(|(name, _, path)| (name, std::fs::read_to_string(path).unwrap_or_default()))
        .collect();
    let cni_bin = read(node.cni_bin_dir())
        .into_iter()
        .map(|(name, meta, _)| (name, meta.len()))
        .collect();
    let cgroup2 = linkerd_cni_tests::cgroup::cgroup2_root().expect("cgroup2 root");
    let out = std::process::Command::new("bpftool")
        .args(["-j", "cgroup", "show"])
        .arg(&cgroup2)
        .output()
        .expect("run bpftool");
    assert!(out.status.success(), "bpftool cgroup show: {out:?}");
    NodeFiles {
        conflists,
        cni_bin,
        run_dir: tree(&node.node_path("/run/linkerd-cni")),
        bpffs: (
            root.fstype_at(paths::BPFFS),
            tree(&node.node_path(paths::BPFFS)),
        ),
        cgroup_root_programs: String::from_utf8_lossy(&out.stdout).into_owned(),
    }
}

/// Issue 37: an uninstall leaves the node as it was before the install, even when the last
/// agent was SIGKILLed (no SIGTERM, so nothing of its own clean-up ran): the manifests
/// rendered with `uninstall.enabled=true` run the clean-up DaemonSet's pod; its init
/// container takes the plugin out of the conflist at once but leaves a still-running meshed
/// pod its redirection (real traffic through its proxy) until the pod ends, then removes the
/// rest. Compared with the node before the install: conflists, CNI bin dir,
/// `/run/linkerd-cni`, bpffs (mount and contents) and the cgroup2 root's programs; and
/// `bpftool prog/map/link show` lists none of the objects that were pinned.
#[test]
fn uninstall_after_a_sigkilled_agent_leaves_the_node_as_before() {
    let work = TempDir::new().expect("scratch directory");
    let install = render_install(Renderer::Cli, work.path());
    let objects = render::render(
        Renderer::Helm,
        &format!("{VALUES}uninstall:\n  enabled: true\n"),
        &work.path().join("uninstall"),
    )
    .unwrap_or_else(|e| panic!("rendering the uninstall: {e}"));
    assert!(
        render::find(&objects, "DaemonSet", "linkerd-cni").is_err(),
        "uninstall.enabled renders no agent DaemonSet"
    );
    let uninstall = Install {
        daemonset: render::find(&objects, "DaemonSet", "linkerd-cni-uninstall")
            .expect("the clean-up DaemonSet")
            .clone(),
        objects,
        image: install.image.clone(),
    };
    let node = start_node(&install, work.path());
    let server = ok(
        &node,
        "echo server on the node",
        EchoServer::bind_in(
            node.netns(),
            SocketAddr::from(([0, 0, 0, 0], SERVER_PORT)),
            "node",
        ),
    );
    let before = node_files(&node);
    assert_eq!(before.run_dir, None, "{before:?}");

    // Installed; a meshed and an unmeshed pod.
    let (_, plan) = plan_pod(&node, &install, "u0001");
    let (mut pod, _) = run_agent_pod(&node, plan);
    let meshed = start_app(&node, &PodSpec::meshed("shop", "web"), true);
    let plain = start_app(&node, &PodSpec::unmeshed("shop", "plain"), false);
    assert_redirected(&node, &meshed, &server, "installed");
    assert_direct(&node, &plain, &server, "installed");
    let ours = ok(
        &node,
        "the pinned objects",
        layout::pinned_objects(&node.pin_root()),
    );
    assert!(ours.get("link").is_some_and(|l| !l.is_empty()), "{ours:?}");
    // The positive control of the check below: bpftool lists each of them now.
    assert_eq!(
        ok(&node, "bpftool", layout::still_loaded(&ours)).len(),
        ours.values().map(BTreeSet::len).sum::<usize>(),
        "{ours:?}"
    );

    // The agent is SIGKILLed, then its DaemonSet deleted: nothing of the SIGTERM path runs.
    let agent = pod
        .container(AGENT_CONTAINER)
        .expect("the agent container")
        .id
        .clone();
    let pid = ok(&node, "the agent's pid", node.container_pid(&agent));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("SIGKILL the agent");
    let deadline = Instant::now() + READY_GUARD;
    while node
        .container_status(&agent)
        .is_ok_and(|s| s.state != k8s_cri::v1::ContainerState::ContainerExited as i32)
    {
        assert!(
            Instant::now() < deadline,
            "the agent container never exited"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let api = node.api_server().expect("API server");
    api.remove_route(&group_object_path(&install.daemonset).expect("DaemonSet path"));
    ok(
        &node,
        "removing the agent's pod",
        node.stop_kubelet_pod(&mut pod),
    );
    assert_eq!(
        chain(&node),
        ["bridge", "linkerd-cni"],
        "a SIGKILLed agent left the plugin in the conflist"
    );
    assert_redirected(&node, &meshed, &server, "agent SIGKILLed");

    // The clean-up DaemonSet's pod: its init container runs while the meshed pod runs.
    let (_, plan) = plan_pod(&node, &uninstall, "v0001");
    let mut cleanup = std::thread::scope(|s| {
        let running = s.spawn(|| node.run_kubelet_pod(plan));
        let deadline = Instant::now() + READY_GUARD;
        while chain(&node) != ["bridge"] {
            assert!(
                Instant::now() < deadline && !running.is_finished(),
                "the plugin never left the conflist: {:?}",
                chain(&node)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        // Removed right after the conflist entry (a moment apart: the test may look between).
        let gone = Instant::now() + Duration::from_secs(10);
        while plugin_installed(&node) {
            assert!(Instant::now() < gone, "the plugin binary went at once");
            std::thread::sleep(Duration::from_millis(50));
        }
        // The meshed pod keeps its redirection while it runs, however long.
        std::thread::sleep(Duration::from_secs(3));
        assert!(
            !running.is_finished(),
            "the clean-up waits for the meshed pod"
        );
        assert!(node.pin_root().join(paths::PIN_PROGS).is_dir(), "pins kept");
        assert_redirected(&node, &meshed, &server, "during the uninstall");
        assert_inbound_redirected(&node, &meshed, "during the uninstall");
        // The pod ends (deleted: its sandbox stopped and removed).
        ok(
            &node,
            "stopping the meshed pod",
            node.stop_pod(&meshed.sandbox),
        );
        ok(
            &node,
            "removing the meshed pod",
            node.remove_pod(&meshed.sandbox),
        );
        running
            .join()
            .expect("the clean-up thread")
            .unwrap_or_else(|e| panic!("the clean-up pod: {e}\n{}", node.diagnostics()))
    });
    println!(
        "daemonset: uninstall init container:\n{}",
        cleanup.logs("uninstall")
    );
    assert_direct(&node, &plain, &server, "after the uninstall");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = ok(&node, "bpftool", layout::still_loaded(&ours));
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "bpftool still lists what was pinned: {left:?}\n{}",
            cleanup.logs("uninstall")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        node_files(&node),
        before,
        "the node after the uninstall, as before the install\n{}",
        cleanup.logs("uninstall")
    );
    // The clean-up pod's own stop and removal leave nothing either.
    let exits = ok(
        &node,
        "removing the clean-up pod",
        node.stop_kubelet_pod(&mut cleanup),
    );
    assert!(
        exits.iter().all(|e| e.exit_code == 0),
        "the clean-up pod exits cleanly on SIGTERM: {exits:?}"
    );
    assert_eq!(node_files(&node), before, "after the clean-up pod is gone");
}

/// Issue 37: `agent.socketPath` moved to `/var/run/l5d/agent.sock` moves everything that
/// depends on it: rendered and run as the DaemonSet's pod, the agent starts (its pod registry
/// next to the socket, on the same writable hostPath mount, not on the container's read-only
/// root, where it used to fail with `registry: Read-only file system`), the conflist entry it
/// installs names the moved socket, a meshed pod's ADD goes through it and the pod is
/// redirected, and the pod's registration is in `/var/run/l5d/pods` on the node.
#[test]
fn moved_socket_path_starts_and_serves() {
    const SOCKET: &str = "/var/run/l5d/agent.sock";
    let work = TempDir::new().expect("scratch directory");
    let values = format!("{VALUES}  socketPath: {SOCKET}\n");
    let install = render_install_with(Renderer::Cli, &values, work.path());
    let node = start_node(&install, work.path());
    let root = node.root().expect("own root");
    let server = ok(
        &node,
        "echo server on the node",
        EchoServer::bind_in(
            node.netns(),
            SocketAddr::from(([0, 0, 0, 0], SERVER_PORT)),
            "node",
        ),
    );
    let (_, plan) = plan_pod(&node, &install, "s0001");
    let (mut pod, _) = run_agent_pod(&node, plan);
    assert_eq!(
        chain(&node),
        ["bridge", "linkerd-cni"],
        "installed\n{}",
        pod.logs(AGENT_CONTAINER)
    );
    let conflist: Value =
        serde_json::from_str(&std::fs::read_to_string(node.conflist()).expect("the conflist"))
            .expect("conflist JSON");
    let entry = conflist["plugins"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["type"] == "linkerd-cni"))
        .cloned()
        .expect("the linkerd-cni entry");
    assert_eq!(entry["linkerd"]["agent-socket"], SOCKET);
    assert!(
        root.path(SOCKET).exists(),
        "the agent's socket at {SOCKET} on the node"
    );
    assert!(
        !root.path(paths::AGENT_SOCKET).exists(),
        "nothing at the default socket path"
    );
    let meshed = start_app(&node, &PodSpec::meshed("shop", "web"), true);
    assert_redirected(&node, &meshed, &server, "socket moved");
    let registry = root.path("/var/run/l5d/pods");
    let records = std::fs::read_dir(&registry)
        .unwrap_or_else(|e| panic!("{}: {e}\n{}", registry.display(), pod.logs(AGENT_CONTAINER)))
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .count();
    assert_eq!(
        records, 1,
        "the meshed pod's registration next to the socket"
    );

    // Issue 36: every API request the agent made (its watches, the ADD, SIGTERM's read of its
    // DaemonSet and namespace), through the kubernetes Service with its projected token, is
    // one the rendered RBAC allows its ServiceAccount.
    stop_agent_pod(&node, &mut pod, "rolling update, socket moved");
    let api = node.api_server().expect("API server");
    let rbac = linkerd_cni_tests::fake_apiserver::rbac::Rbac::for_service_account(
        &install.objects,
        NAMESPACE,
        "linkerd-cni",
    );
    let requests = api.requests();
    assert!(
        requests
            .iter()
            .any(|r| r.path.ends_with("/daemonsets/linkerd-cni")),
        "the agent read its DaemonSet on SIGTERM"
    );
    let denied: Vec<String> = requests
        .iter()
        .filter_map(|r| {
            let a = linkerd_cni_tests::fake_apiserver::rbac::Attributes::of(r)?;
            rbac.allowing(&a)
                .is_empty()
                .then(|| format!("{} {} {:?}", r.method, r.path, r.query))
        })
        .collect();
    assert!(
        denied.is_empty(),
        "requests the rendered RBAC denies:\n{}",
        denied.join("\n")
    );
}

/// Linkerd's network validator's init container.
const VALIDATOR: &str = "linkerd-network-validator";
/// The stated bound on a repair at the default values: from the agent's readiness (or the
/// pod's start, whichever is later) to the unredirected pod's deletion, the repair's grace
/// (10 s) and one pass of its interval (5 s), with room for a busy machine.
const REPAIR_BOUND: Duration = Duration::from_secs(45);
/// The mapping a `hostUsers: false` pod gets here: in-namespace 0-65535 to host 100000-165535.
const USERNS_HOST_BASE: u32 = linkerd_cni_tests::userns::UsernsPod::HOST_BASE;

fn tainted(node: &CriNode) -> bool {
    startup_tainted(node.api_server().expect("API server"), NODE_NAME)
}

/// The agent's answer to `path` on its probe address, from the node's network namespace.
fn agent_status(node: &CriNode, pod: &KubeletPod, path: &str) -> Option<u16> {
    let probe = pod
        .prober(AGENT_CONTAINER, ProbeKind::Readiness)
        .expect("readiness probe")
        .plan()
        .clone();
    node.netns()
        .run_in(|| {
            http_status(
                probe.addr,
                path,
                &probe.host_header,
                &probe.headers,
                Duration::from_secs(1),
            )
            .ok()
        })
        .unwrap_or_else(|e| panic!("asking {path}: {e}"))
}

/// A meshed pod as Linkerd's injector makes it with `cniEnabled`: its proxy, and the network
/// validator as its init container.
fn validated_spec(name: &str) -> PodSpec {
    let mut spec = PodSpec::meshed("shop", name);
    spec.init_containers.push(VALIDATOR.into());
    spec
}

/// kubelet runs `spec`'s pod: its pod cgroup, its sandbox (the ADD through the chain
/// containerd has loaded), the validator init container to its exit; and reports the pod's
/// address (`status.podIPs`), as kubelet does once the sandbox has one. Returns the sandbox
/// and the validator's exit code (kubelet would retry a 95 with back-off).
fn run_validated_pod(node: &CriNode, spec: &PodSpec) -> (Sandbox, i32) {
    ok(node, "pod cgroup", node.create_pod_cgroup(spec));
    let sandbox = ok(node, "RunPodSandbox", node.run_pod(spec));
    let code = ok(node, "the validator", node.run_validator(&sandbox));
    ok(
        node,
        "publishing the pod's address",
        node.apply(&[spec.manifest_running(NODE_NAME, &[IpAddr::V4(sandbox.ip)])]),
    );
    (sandbox, code)
}

/// Waits until the repair deleted `sandbox`'s pod from the API (at most [`REPAIR_BOUND`]
/// after `since`), with a `LinkerdCNIRepaired` Event on it; returns the time since `since`.
fn wait_repaired(node: &CriNode, pod: &KubeletPod, sandbox: &Sandbox, since: Instant) -> Duration {
    let api = node.api_server().expect("API server");
    let spec = &sandbox.spec;
    let bound = REPAIR_BOUND * linkerd_cni_tests::node::slowdown();
    loop {
        let served = api
            .get("Pod", Some(&spec.namespace), &spec.name)
            .expect("get the pod");
        if served.is_none_or(|p| p["metadata"]["uid"] != spec.uid.as_str()) {
            break;
        }
        assert!(
            since.elapsed() < bound,
            "{}/{} was not repaired within {bound:?}:\n{}\n{}",
            spec.namespace,
            spec.name,
            pod.logs(AGENT_CONTAINER),
            node.diagnostics()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let took = since.elapsed();
    let deadline = Instant::now() + CLIENT_TIMEOUT;
    while !api
        .events()
        .iter()
        .any(|e| e["reason"] == "LinkerdCNIRepaired" && e["regarding"]["uid"] == spec.uid.as_str())
    {
        assert!(
            Instant::now() < deadline,
            "no LinkerdCNIRepaired Event on {}: {:?}",
            spec.name,
            api.events()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    took
}

/// kubelet and the ReplicaSet after the repair deleted `old`'s pod: kubelet stops and
/// removes its sandbox, the ReplicaSet creates the replacement (a new name and UID), kubelet
/// runs it through the plugin: its validator must pass, then its proxy and app start.
fn recreate(node: &CriNode, old: &Sandbox, name: &str) -> App {
    ok(node, "StopPodSandbox", node.stop_pod(old));
    ok(node, "RemovePodSandbox", node.remove_pod(old));
    let spec = validated_spec(name);
    let (sandbox, code) = run_validated_pod(node, &spec);
    assert_eq!(
        code,
        linkerd_cni_tests::client::VALIDATOR_PASSED,
        "the recreated pod's validator passes\n{}",
        node.diagnostics()
    );
    ok(node, "proxy container", node.start_proxy(&sandbox));
    let app = start_app_container(node, &sandbox);
    App { sandbox, app }
}

/// Issue 44 item 6: the node-start race with the rendered DaemonSet at its default values
/// (repair on, startup taint on, no `CAP_SYS_ADMIN`), one node for every case:
///
/// 1. a meshed pod started while the chain holds the primary CNI alone (its network validator
///    exits 95) is deleted by the repair within [`REPAIR_BOUND`] of the agent's readiness;
///    recreated as its ReplicaSet and kubelet would, its validator passes (0) and its app's
///    connections go through its proxy;
/// 2. the node registered with the startup taint keeps it while the agent cannot be ready
///    (no conflist yet: `/live` answers, `/ready` does not, no PATCH of the node), and loses
///    it once the agent is ready, never before (each look that finds it gone finds `/ready`
///    200);
/// 3. a user-namespaced meshed pod is redirected: containerd 1.6 ignores the CRI's user
///    namespace request (asserted: the sandbox runs in the host's user namespace), so the
///    sandbox is made as a runtime with user namespaces makes it (a network namespace owned
///    by a user namespace with the pod's mapping) and added through the installed plugin;
///    its proxy (in-namespace 2102, host 102102) is exempt and its app redirected;
/// 4. the conflist rewritten under the running agent without our entry (a Calico- or
///    Cilium-like writer): the agent puts itself back, and a pod created in the window (the
///    agent held stopped so that the window is wide enough to land one) is repaired.
///
/// Negative controls: in the test, each validator's 95 before its repair. Run by hand, it
/// fails where each feature is asserted with that feature off: `repairController.enabled=false`
/// (1: not repaired within the bound), the agent's `LINKERD_CNI_AGENT_REMOVE_STARTUP_TAINT`
/// false (2: the taint stays), an agent removing the taint without waiting for readiness (2:
/// gone before ready), a plugin that sends no ID maps (3: the ADD fails on
/// `setns(CLONE_NEWUSER)`).
#[test]
fn default_install_repairs_the_node_start_race_and_removes_the_taint() {
    let work = TempDir::new().expect("scratch directory");
    let install = render_install(Renderer::Cli, work.path());
    let tolerations = install
        .daemonset
        .pointer("/spec/template/spec/tolerations")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    assert!(
        tolerations
            .iter()
            .any(|t| t["key"] == STARTUP_TAINT
                || (t.get("key").is_none() && t["operator"] == "Exists")),
        "the DaemonSet tolerates the startup taint: {tolerations:?}"
    );
    let node = start_node(&install, work.path());
    let api = node.api_server().expect("API server");
    let server = ok(
        &node,
        "echo server on the node",
        EchoServer::bind_in(
            node.netns(),
            SocketAddr::from(([0, 0, 0, 0], SERVER_PORT)),
            "node",
        ),
    );
    let primary = std::fs::read_to_string(node.conflist()).expect("the primary conflist");
    ok(
        &node,
        "the node",
        node.apply(&[tainted_node_manifest(NODE_NAME, &[STARTUP_TAINT])]),
    );

    // 1. A meshed pod starts while the chain holds the primary CNI alone: no ADD reaches any
    //    agent, its validator's dial goes out unredirected.
    let (early, code) = run_validated_pod(&node, &validated_spec("web-early"));
    assert_eq!(
        code,
        linkerd_cni_tests::client::VALIDATOR_FAILED,
        "without linkerd-cni in the chain the validator fails"
    );

    // 2. The agent cannot be ready while the node has no conflist (the primary CNI's held
    //    back): the taint stays.
    // Beside it under a name neither the installer nor containerd reads.
    let held = node.cni_conf_dir().join("primary.held");
    std::fs::rename(node.conflist(), &held).expect("holding the conflist back");
    let (_, plan) = plan_pod(&node, &install, "r0001");
    let pod = ok(&node, "the DaemonSet's pod", node.run_kubelet_pod(plan));
    let deadline = Instant::now() + READY_GUARD;
    while agent_status(&node, &pod, "/live") != Some(200) {
        assert!(
            Instant::now() < deadline,
            "the agent never answered /live\n{}",
            pod.logs(AGENT_CONTAINER)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let unready = Instant::now() + Duration::from_secs(2);
    while Instant::now() < unready {
        assert_ne!(
            agent_status(&node, &pod, "/ready"),
            Some(200),
            "ready without a conflist"
        );
        assert!(tainted(&node), "the taint went before the agent was ready");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        !api.requests()
            .iter()
            .any(|r| r.path.starts_with("/api/v1/nodes") && r.method == "PATCH"),
        "no node patch before ready"
    );
    std::fs::rename(&held, node.conflist()).expect("the primary CNI's conflist");
    let mut ready_at = None;
    let deadline = Instant::now() + READY_GUARD;
    loop {
        let tainted = tainted(&node);
        let ready = agent_status(&node, &pod, "/ready") == Some(200);
        if ready {
            ready_at.get_or_insert_with(Instant::now);
        }
        if !tainted {
            assert!(ready, "the taint went while /ready did not answer 200");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the taint stayed (ready: {ready})\n{}",
            pod.logs(AGENT_CONTAINER)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let ready_at = ready_at.expect("ready");
    println!(
        "daemonset: the startup taint went {:?} after /ready first answered 200",
        ready_at.elapsed()
    );
    assert_eq!(chain(&node), ["bridge", "linkerd-cni"]);
    assert_agent_holds_only_its_capabilities(&node, &pod, &[]);

    // 1, continued: the repair deletes the early pod; recreated, it is redirected.
    let took = wait_repaired(&node, &pod, &early, ready_at);
    let recreated = recreate(&node, &early, "web-b7d4x");
    assert_redirected(&node, &recreated, &server, "recreated after the repair");
    println!(
        "daemonset: the early pod was deleted {took:?} after the agent was ready, and its \
         replacement redirected {:?} after it",
        ready_at.elapsed()
    );

    // 4. Another writer replaces the conflist without our entry while the agent is stopped,
    //    and containerd loads it: a pod created then goes through the primary CNI alone.
    let agent = pod.container(AGENT_CONTAINER).expect("agent").id.clone();
    let pid =
        nix::unistd::Pid::from_raw(ok(&node, "the agent's pid", node.container_pid(&agent)) as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).expect("SIGSTOP the agent");
    let resume = resume_on_drop(pid);
    let tmp = node.cni_conf_dir().join(".10-other.tmp");
    std::fs::write(&tmp, &primary).expect("the other writer's conflist");
    std::fs::rename(&tmp, node.conflist()).expect("the other writer's rename");
    let deadline = Instant::now() + READY_GUARD;
    while ok(&node, "containerd's CNI config", node.loaded_cni_config()).contains("linkerd-cni") {
        assert!(
            Instant::now() < deadline,
            "containerd never loaded the rewritten conflist"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let (window, code) = run_validated_pod(&node, &validated_spec("web-window"));
    assert_eq!(
        code,
        linkerd_cni_tests::client::VALIDATOR_FAILED,
        "a pod created in the window runs unredirected"
    );
    drop(resume);
    let back = Instant::now();
    while chain(&node) != ["bridge", "linkerd-cni"] {
        assert!(
            back.elapsed() < READY_GUARD,
            "the agent did not put itself back: {:?}",
            chain(&node)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    println!(
        "daemonset: the agent put itself back in the chain {:?} after it resumed",
        back.elapsed()
    );
    let took = wait_repaired(&node, &pod, &window, back);
    let recreated = recreate(&node, &window, "web-q9k2m");
    assert_redirected(&node, &recreated, &server, "the window's pod recreated");
    println!("daemonset: the window's pod was deleted {took:?} after the agent resumed");

    // 3. A user-namespaced meshed pod: kubelet asks containerd for a user namespace...
    let spec = PodSpec::meshed("shop", "web-userns");
    ok(&node, "pod cgroup", node.create_pod_cgroup(&spec));
    let asked = ok(
        &node,
        "RunPodSandbox with a user namespace",
        node.run_pod_userns(&spec, Some((0, USERNS_HOST_BASE, 65536))),
    );
    assert_eq!(
        ok(&node, "the sandbox's uid_map", node.sandbox_uid_map(&asked)),
        "0 0 4294967295",
        "containerd 1.6 ignores userns_options: if it now honours them, test that sandbox"
    );
    ok(&node, "StopPodSandbox", node.stop_pod(&asked));
    ok(&node, "RemovePodSandbox", node.remove_pod(&asked));
    // ... which containerd 1.6 cannot give: the sandbox as a runtime that can makes it.
    userns_pod_is_redirected(&node, &server);
}

/// SIGCONTs `pid` when dropped (also when an assertion fails while it is stopped).
fn resume_on_drop(pid: nix::unistd::Pid) -> impl Drop {
    struct Cont(nix::unistd::Pid);
    impl Drop for Cont {
        fn drop(&mut self) {
            let _ = nix::sys::signal::kill(self.0, nix::sys::signal::Signal::SIGCONT);
        }
    }
    Cont(pid)
}

/// A user-namespaced meshed pod's sandbox as a runtime with user namespaces makes it (a
/// network namespace owned by the pod's user namespace, mounted at `/var/run/netns/`), wired
/// to the node's bridge, added through the installed plugin: the agent stores the proxy's
/// host UID from the mapping the plugin read, the app's connection goes through the proxy and
/// the proxy's own upstream (host UID 102102) goes out from the pod.
fn userns_pod_is_redirected(node: &CriNode, server: &EchoServer) {
    use linkerd_cni_tests::{proxy::TestProxy, userns::UsernsPod};
    const ADDRESS: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 250);
    let spec = PodSpec::meshed("shop", "web-userns-2");
    ok(
        node,
        "serving the pod",
        node.apply(&[spec.manifest(NODE_NAME)]),
    );
    ok(node, "pod cgroup", node.create_pod_cgroup(&spec));
    let sandbox = UsernsPod::new().expect("a user-namespaced sandbox");
    let cidr = format!("{ADDRESS}/24");
    let host_if = format!("l5du{}", std::process::id() % 100_000);
    let pod_net = sandbox.path("net").display().to_string();
    ok(
        node,
        "the pod's veth",
        node.netns().exec(
            "ip",
            [
                "link", "add", &host_if, "type", "veth", "peer", "name", "eth0", "netns", &pod_net,
            ],
        ),
    );
    ok(
        node,
        "on the bridge",
        node.netns()
            .exec("ip", ["link", "set", &host_if, "master", BRIDGE, "up"]),
    );
    for args in [
        vec!["addr", "add", &cidr, "dev", "eth0"],
        vec!["link", "set", "eth0", "up"],
        vec!["route", "add", "default", "via", "10.244.0.1"],
    ] {
        sandbox.ip(&args).expect("the pod's network");
    }
    let name = format!("l5dt-{}-userns", std::process::id());
    let netns = format!("/var/run/netns/{name}");
    let mount =
        format!("mkdir -p /var/run/netns && touch {netns} && mount --bind {pod_net} {netns}");
    ok(
        node,
        "mounting the pod's netns",
        node.node_command("sh")
            .and_then(|mut c| linkerd_cni_tests::names::run(c.args(["-c", &mount]))),
    );
    let id = format!(
        "{:064x}",
        0xc000_0000_0000u64 + u64::from(std::process::id())
    );
    let out = plugin_add(node, &spec, &id, &netns, &cidr);
    assert!(
        out.status.success(),
        "ADD of the user-namespaced pod: {}\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        node.diagnostics()
    );
    let record = ok(node, "the agent's state", node.state())
        .record(&id)
        .unwrap_or_else(|| {
            panic!(
                "the user-namespaced pod is registered\n{}",
                node.diagnostics()
            )
        });
    assert_eq!(
        record.pointer("/host_ids/uid").and_then(Value::as_u64),
        Some(u64::from(USERNS_HOST_BASE + PROXY_UID)),
        "the proxy's host UID, from the pod's mapping: {record}"
    );
    // The pod's containers, as the kernel sees them: in its netns and pod cgroup, with the
    // host IDs its mapping gives their in-namespace IDs.
    let cgroup = linkerd_cni_tests::cgroup::cgroup2_root()
        .expect("cgroup2")
        .join(CriNode::pod_cgroup(&spec));
    let container = |uid: u32| {
        Placement::new()
            .netns_path(&pod_net)
            .cgroup_path(&cgroup)
            .uid(USERNS_HOST_BASE + uid)
    };
    let proxy = TestProxy::start(&container(PROXY_UID), &proxy::Options::new())
        .unwrap_or_else(|e| panic!("the pod's proxy: {e}"));
    let served = server.wait_for(0, CLIENT_TIMEOUT).map_or(0, |r| r.len());
    let report = run_client(
        &container(APP_UID),
        &Options::new(gateway()).send("userns\n"),
        CLIENT_TIMEOUT,
    )
    .unwrap_or_else(|e| panic!("the app's connection: {e}"));
    assert!(
        report.received_matches(&server.expected_reply(b"userns\n")),
        "the user-namespaced app's reply: {report:?}\n{}",
        node.diagnostics()
    );
    let events = proxy
        .log()
        .wait_for(CLIENT_TIMEOUT, |e| accepted_outbound(e) > 0)
        .unwrap_or_else(|e| panic!("the proxy's events: {e}"));
    assert_eq!(
        accepted_outbound(&events),
        1,
        "the user-namespaced app's connection went through its proxy"
    );
    let received = ok(node, "server", server.wait_for(served + 1, CLIENT_TIMEOUT));
    assert_eq!(
        received[served].peer.ip(),
        IpAddr::V4(ADDRESS),
        "the proxy's upstream (host UID {}) comes from the pod",
        USERNS_HOST_BASE + PROXY_UID
    );
    drop(proxy);
    let umount = format!("umount {netns} && rm -f {netns}");
    ok(
        node,
        "unmounting the pod's netns",
        node.node_command("sh")
            .and_then(|mut c| linkerd_cni_tests::names::run(c.args(["-c", &umount]))),
    );
}
