//! `linkerd-cni-demo`: the README's demo (`cargo xtask demo` builds everything and runs it, as
//! root). A simulated node made of network namespaces: libcni runs the chain bridge +
//! host-local + linkerd-cni for three pods, the node agent runs as a real process, a local
//! stand-in for the Kubernetes API serves the pods' manifests. A meshed client's request goes
//! through its proxy, an unmeshed pod's does not; then `inspect` and `bpftool` show the state,
//! and everything is torn down and checked gone. Every step is printed in plain words.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use linkerd_cni_tests::{
    EchoServer,
    client::{Options, Report, run_client},
    cniruntime::{self, Verb},
    netns,
    node::{NODE_NAME, NodeOptions, PodSpec, SimNode, SimPod, namespace_manifest},
    proxy::{Event, PROXY_UID},
};

/// The UID the demo's applications run as (an ordinary user, not the proxy's 2102).
const APP_UID: u32 = 1000;
const NAMESPACE: &str = "demo";
const SERVER_PORT: u16 = 8080;

fn step(n: u32, text: &str) {
    println!("\n==> Step {n}: {text}");
}

fn say(text: impl AsRef<str>) {
    for line in text.as_ref().lines() {
        println!("    {line}");
    }
}

fn main() {
    let started = Instant::now();
    if let Err(e) = run() {
        eprintln!("\ndemo failed: {e:#}");
        std::process::exit(1);
    }
    println!("\nDemo finished in {:.1?}.", started.elapsed());
}

fn run() -> anyhow::Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!(
            "the demo loads BPF programs and creates network namespaces and cgroups: run it as root"
        );
    }
    println!("linkerd-cni (eBPF mode) on a simulated node");

    step(
        1,
        "build the CNI runtime: a small Go program over libcni (Debian's sources, offline)",
    );
    let tool = cniruntime::tool().context("building the libcni runtime")?;
    say(format!("runtime: {}", tool.display()));

    step(
        2,
        "create the node: its network namespace, the conflist, the Kubernetes API stand-in and the agent",
    );
    let server_spec = PodSpec::unmeshed(NAMESPACE, "server");
    let client_spec = PodSpec::meshed(NAMESPACE, "client");
    let plain_spec = PodSpec::unmeshed(NAMESPACE, "plain");
    let objects = vec![
        namespace_manifest(NAMESPACE, &[]),
        server_spec.manifest(NODE_NAME),
        client_spec.manifest(NODE_NAME),
        plain_spec.manifest(NODE_NAME),
    ];
    let mut node = SimNode::start(NodeOptions::default(), &objects).context("starting the node")?;
    say(format!("node network namespace: {}", node.netns().name()));
    say(format!(
        "fake Kubernetes API: pid {} at http://{} serving namespace {NAMESPACE} and pods server, \
         client (containers app + linkerd-proxy), plain (container app)",
        node.apiserver().pid(),
        node.apiserver().addr()
    ));
    let agent = node.agent().context("agent")?;
    say(format!(
        "node agent: pid {}, socket {}, pins under {}",
        agent.pid(),
        node.socket().display(),
        node.pin_root().display()
    ));
    let chain: Vec<String> = serde_json::from_str::<serde_json::Value>(
        &std::fs::read_to_string(node.conflist()).context("reading the conflist")?,
    )?["plugins"]
        .as_array()
        .map(|p| {
            p.iter()
                .filter_map(|e| {
                    let t = e["type"].as_str()?;
                    Some(match e["ipam"]["type"].as_str() {
                        Some(ipam) => format!("{t} (IPAM {ipam})"),
                        None => t.to_string(),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    say(format!(
        "conflist {}: chain {}",
        node.conflist().display(),
        chain.join(" -> ")
    ));

    step(
        3,
        "create each pod's sandbox and run CNI ADD through libcni (bridge + host-local + linkerd-cni)",
    );
    let mut pods = Vec::new();
    for spec in [server_spec, client_spec, plain_spec] {
        let mut pod = SimPod::new(spec).context("creating a pod sandbox")?;
        let out = node
            .cni(Verb::Add, &pod)?
            .expect_ok()
            .with_context(|| format!("CNI ADD of {}", pod.spec.name))?;
        pod.result = out.result();
        say(format!(
            "pod {}: netns {}, ip {}",
            pod.spec.name,
            pod.netns()?.name(),
            pod.ip().map(|ip| ip.to_string()).unwrap_or_default()
        ));
        // The plugin's own account (its stderr, which libcni passes through).
        for line in out
            .stderr
            .lines()
            .filter(|l| l.starts_with("linkerd-cni: INFO"))
        {
            say(format!("  {line}"));
        }
        pods.push(pod);
    }
    let [server_pod, client_pod, plain_pod] =
        <[SimPod; 3]>::try_from(pods).map_err(|_| anyhow::anyhow!("three pods expected"))?;

    step(
        4,
        "start the workloads: a server in pod server, the forwarding proxy (uid 2102) in pod client",
    );
    let server_ip = server_pod.ip().context("server ip")?;
    let dst = SocketAddr::from((server_ip, SERVER_PORT));
    let server = EchoServer::bind_in(server_pod.netns()?, dst, "server").context("server")?;
    say(format!("server listening on {dst}"));
    let proxy = client_pod.start_proxy().context("proxy")?;
    say(format!(
        "linkerd-proxy stand-in: pid {} as uid {PROXY_UID}, listening on 127.0.0.1:4140 (outbound)",
        proxy.pid()
    ));

    step(
        5,
        &format!("the meshed client (uid {APP_UID}) sends a request to {dst}"),
    );
    request(&client_pod, &server, dst, "hello from the meshed client\n")?;
    let events = proxy
        .log()
        .wait_for_finished(1, Duration::from_secs(10))
        .context("the proxy's log")?;
    for e in &events {
        if matches!(e, Event::Accepted { .. } | Event::Closed { .. }) {
            say(format!("proxy log: {}", serde_json::to_string(e)?));
        }
    }
    let orig = events.iter().find_map(|e| match e {
        Event::Accepted { orig_dst, .. } => Some(*orig_dst),
        _ => None,
    });
    let seen = server.received();
    let last = seen.last().context("the server saw nothing")?;
    say(format!(
        "=> the client connected to {dst}; the kernel sent it to the proxy, which read the original \
         destination {} with SO_ORIGINAL_DST and forwarded it; the server saw {} (the proxy's socket)",
        orig.map(|o| o.to_string()).unwrap_or_else(|| "?".into()),
        last.peer
    ));
    if orig != Some(dst) {
        bail!("the proxy did not see the original destination {dst}: {events:?}");
    }

    step(
        6,
        &format!("the unmeshed pod (uid {APP_UID}) sends a request to {dst}"),
    );
    let before = proxy.events()?.len();
    let report_plain = request(&plain_pod, &server, dst, "hello from the unmeshed pod\n")?;
    let after = proxy.events()?.len();
    let seen = server.received();
    let last = seen.last().context("the server saw nothing")?;
    say(format!(
        "=> it went direct: the server saw {}, the client's own socket; the proxy logged nothing new",
        last.peer
    ));
    if Some(last.peer) != report_plain.local || after != before {
        bail!(
            "the unmeshed pod's request did not go direct ({} proxy events before, {after} after)",
            before
        );
    }

    step(7, "what the agent holds: `linkerd-cni-agent inspect`");
    say(node.inspect().context("inspect")?);

    step(
        8,
        "the programs on the client pod's cgroup: `bpftool cgroup tree`",
    );
    say(shell(
        "bpftool",
        &["cgroup", "tree"],
        Some(client_pod.cgroup.path()),
    )?);
    step(
        9,
        "the per-pod config map: `bpftool map dump pinned .../maps/l5d_pod_config`",
    );
    let map = node.pin_root().join("maps").join("l5d_pod_config");
    say(shell("bpftool", &["map", "dump", "pinned"], Some(&map))?);
    say(format!(
        "(one entry, keyed by the client's netns cookie {}: outbound port 4140, proxy uid 2102)",
        client_pod.cookie()?
    ));

    step(
        10,
        "CNI CHECK through libcni: the client's redirection is in force",
    );
    node.cni(Verb::Check, &client_pod)?.expect_ok()?;
    say("CHECK passed for pod client");

    step(
        11,
        "tear down: CNI DEL (twice, as containerd does), stop processes, delete namespaces, cgroups, pins",
    );
    drop(proxy);
    drop(server);
    for pod in [&client_pod, &plain_pod, &server_pod] {
        node.cni_netns(Verb::Del, pod, Some(pod.netns_path()))?
            .expect_ok()?;
        node.cni_netns(Verb::Del, pod, None)?.expect_ok()?;
        say(format!(
            "CNI DEL of pod {} (with netns, then with an empty one): ok",
            pod.spec.name
        ));
    }
    let st = node.state()?;
    say(format!(
        "agent state after DEL: {} registrations, {} pinned links, {} pod_config entries",
        st.registry.len(),
        st.links.len(),
        st.pod_config.len()
    ));
    if !st.is_empty() {
        bail!("the agent still holds state after DEL: {st:?}");
    }
    let mut leftovers: Vec<String> = Vec::new();
    let agent_pid = node.agent().map(|a| a.pid());
    if let Some(a) = node.agent_mut() {
        let status = a
            .terminate(Duration::from_secs(10))
            .context("stopping the agent")?;
        say(format!("agent stopped (SIGTERM): {status}"));
    }
    let api_pid = node.apiserver().pid();
    let status = node
        .apiserver_mut()
        .terminate(Duration::from_secs(10))
        .context("stopping the API server")?;
    say(format!("API server stopped (SIGTERM): {status}"));
    let mut names: Vec<String> = vec![node.netns().name().to_string()];
    let mut paths: Vec<PathBuf> = vec![node.pin_root().to_path_buf(), node.dir().to_path_buf()];
    for pod in [client_pod, plain_pod, server_pod] {
        names.push(pod.netns()?.name().to_string());
        paths.push(pod.cgroup.path().to_path_buf());
        drop(pod);
    }
    drop(node);
    say(
        "pod namespaces and cgroups deleted; node namespace (with its bridge), pins and scratch files removed",
    );

    let live = netns::list().unwrap_or_default();
    leftovers.extend(
        names
            .iter()
            .filter(|n| live.contains(n))
            .map(|n| format!("netns {n}")),
    );
    leftovers.extend(
        paths
            .iter()
            .filter(|p| p.exists())
            .map(|p| p.display().to_string()),
    );
    for pid in [agent_pid, Some(api_pid)].into_iter().flatten() {
        if Path::new(&format!("/proc/{pid}")).exists() {
            leftovers.push(format!("process {pid}"));
        }
    }
    if !leftovers.is_empty() {
        bail!("left behind: {leftovers:?}");
    }
    say(format!(
        "checked: none of the {} network namespaces, {} paths and 2 processes is left",
        names.len(),
        paths.len()
    ));
    Ok(())
}

/// Sends one request from `pod` as an application UID and prints what came back.
fn request(
    pod: &SimPod,
    server: &EchoServer,
    dst: SocketAddr,
    text: &str,
) -> anyhow::Result<Report> {
    let opts = Options::new(dst).send(text);
    let report = run_client(&pod.container(APP_UID), &opts, Duration::from_secs(15))
        .with_context(|| format!("request from pod {}", pod.spec.name))?;
    say(format!(
        "client: connect {} -> getpeername {}; response: {:?}",
        dst,
        report.peer.map(|p| p.to_string()).unwrap_or_default(),
        report.received
    ));
    if !report.received_matches(&server.expected_reply(text.as_bytes())) {
        bail!("unexpected response from the server: {report:?}");
    }
    Ok(report)
}

/// Runs `program args... [path]` and returns its output.
fn shell(program: &str, args: &[&str], path: Option<&Path>) -> anyhow::Result<String> {
    let mut cmd = Command::new(program);
    cmd.args(args);
    if let Some(p) = path {
        cmd.arg(p);
    }
    let out = cmd.output().with_context(|| format!("running {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
