//! Scenario 9: the agent replaced under connection load: an upgrade across a layout change,
//! a rollback, a same-version restart, and a control that must fail.
//!
//! A node of its own (bridge, upstream server, a peer for inbound clients, two meshed pods
//! with a proxy and an app server each) whose pinned state starts as the previous agent
//! version left it. Only that version's eBPF object exists (`tests/fixtures/ebpf-layout-1.o`),
//! not its user space, so "the previous agent" is a replay (the support crate's
//! `layout::previous_loads` / `previous_registers`, shared with the layout test): its object
//! loaded, its untyped maps pinned where it pinned them with no layout record (layout 1), its
//! programs attached to both pods with pinned links (one pod per pod, one through the shared
//! attachment), each pod's entries and registry record written as it did on CNI ADD. Nothing
//! of it runs in user space afterwards: the programs redirect from bpffs, as they do between
//! two agent pods of a DaemonSet rollout.
//!
//! While clients in both pods (outbound) and in the peer (inbound) keep opening connections:
//! - `upgrade`: the current agent binary starts on that state: it plans, migrates the maps and
//!   swaps every link to its programs with `BPF_LINK_UPDATE`;
//! - `rollback`: the agent is stopped (SIGTERM), its state made to look like a newer layout that
//!   declares this agent able to read it (layout record `LAYOUT_VERSION + 1`, oldest reader
//!   ours, the pod config map re-pinned with another capacity, as the layout test does; no
//!   newer agent exists), then the agent starts on it;
//! - `restart`: SIGTERM, then a new process of the same version, as a DaemonSet rollout does
//!   (the agent runs without `--install` here, so the rollout-or-uninstall decision, which only
//!   concerns the CNI configs, is not made; what SIGTERM does to the data plane is the same);
//! - `control`: SIGTERM, the pods' link pins removed (the links detach), then the agent starts
//!   and re-attaches them on its next reconcile pass: an agent replacing programs without
//!   `BPF_LINK_UPDATE`. The same checks must see connections pass by the proxies.
//!
//! Every round counts each client's connections (ok / failed, per 100 ms), each proxy's
//! accepted connections and `SO_ORIGINAL_DST` answers, and watches the pinned links (which
//! program each runs) while the agent starts, to time the swap.

use std::{
    collections::BTreeMap,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, bail};
use linkerd_cni_common::{LAYOUT_VERSION, paths};
use linkerd_cni_proto::config;
use linkerd_cni_sys::bpf;
use linkerd_cni_tests::{Bridge, IfAddr, NetnsGuard, Placement, Pod, layout, link::PodPort};
use serde::{Deserialize, Serialize};

use crate::{
    node::{APP_UID, AgentProc, Daemon, run_load, tune, v4},
    workload::{
        load::{Kind, LoadArgs, LoadResult},
        proxy::ProxyCounters,
    },
};

/// The app port of the upstream and of the pods' app servers.
const APP_PORT: u16 = 8080;
/// Width of the load's time buckets.
const BUCKET_MS: u64 = 100;

/// What replaces the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Change {
    /// Previous layout (1) → this agent.
    Upgrade,
    /// A newer readable layout → this agent.
    Rollback,
    /// This agent → a new process of this agent (SIGTERM, start).
    Restart,
    /// Links unpinned (detached) before this agent starts: must show bypassed connections.
    Control,
}

impl Change {
    pub fn label(self) -> &'static str {
        match self {
            Change::Upgrade => "upgrade (layout 1 → current)",
            Change::Rollback => "rollback (newer readable layout → current)",
            Change::Restart => "same-version restart (SIGTERM, start)",
            Change::Control => "control: links detached, re-attached by the agent",
        }
    }
}

/// What one pod's clients and proxy saw over a round.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PodRound {
    pub pod: String,
    /// Outbound clients (in the pod, to the upstream): ok, failed.
    pub out_ok: u64,
    pub out_failed: u64,
    /// Inbound clients (in the peer, to the pod's app): ok, failed.
    pub in_ok: u64,
    pub in_failed: u64,
    /// The pod's proxy: accepted outbound, accepted inbound, original destinations answered,
    /// connections dropped for want of one.
    pub proxy_out: u64,
    pub proxy_in: u64,
    pub orig_dst: u64,
    pub no_dst: u64,
}

impl PodRound {
    /// Every connection that completed went through the pod's proxy, with its original
    /// destination (a connection that passed by the proxy completes without being accepted).
    pub fn redirected_throughout(&self) -> bool {
        self.proxy_out >= self.out_ok
            && self.proxy_in >= self.in_ok
            && self.orig_dst >= self.out_ok + self.in_ok
            && self.no_dst == 0
    }
}

/// One agent replacement under load.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UpgradeRound {
    pub change: Change,
    /// Client threads per load (four loads: two pods × outbound and inbound).
    pub concurrency: usize,
    /// The layout version of the state the new agent found (1: no layout record).
    pub from_layout: u32,
    /// The layout version it recorded.
    pub to_layout: u32,
    /// From the load's start to the change (SIGTERM, or the new agent's spawn).
    pub change_at_ms: f64,
    /// From the change to the new agent answering on its socket.
    pub down_ms: f64,
    /// First to last pinned link seen running a new program (`None`: none seen changing).
    pub swap_ms: Option<f64>,
    /// The longest pass of the watcher over all links: the resolution of `swap_ms`.
    #[serde(default)]
    pub swap_resolution_ms: f64,
    /// Links pinned, and how many run a new program afterwards.
    pub links: usize,
    pub links_swapped: usize,
    /// Control only: from unpinning the links to all of them pinned again.
    pub relinked_ms: Option<f64>,
    /// All clients: connections ok / failed over the whole load, failure kinds.
    pub ok: u64,
    pub failed: u64,
    pub errors: BTreeMap<String, u64>,
    /// Connections ok / failed in the 100 ms buckets from the change to the agent answering
    /// (control: to the links being back).
    pub window_ok: u64,
    pub window_failed: u64,
    pub pods: Vec<PodRound>,
    /// Structural checks that did not hold (layout recorded, links on the new programs).
    pub problems: Vec<String>,
}

impl UpgradeRound {
    /// No failed connection and every pod redirected throughout.
    pub fn clean(&self) -> bool {
        self.failed == 0 && self.pods.iter().all(PodRound::redirected_throughout)
    }
}

/// Lengths of the loads.
#[derive(Debug, Clone, Copy)]
pub struct UpgradeConfig {
    pub rounds: usize,
    pub duration_ms: u64,
    pub change_at_ms: u64,
    /// Client threads per load (four loads: two pods × outbound and inbound).
    pub concurrency: usize,
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

struct MeshedPod {
    name: String,
    pod: Pod,
    ip: Ipv4Addr,
    proxy: Option<Daemon>,
    _server: Option<Daemon>,
    _port: PodPort,
}

/// The scenario's node.
struct Node {
    pods: Vec<MeshedPod>,
    peer: NetnsGuard,
    upstream_ip: Ipv4Addr,
    _upstream_server: Daemon,
    _upstream_port: PodPort,
    _peer_port: PodPort,
    _upstream: NetnsGuard,
    _bridge: Bridge,
    _node: NetnsGuard,
}

fn server_args() -> Vec<String> {
    vec![
        "server".into(),
        "--listen".into(),
        format!("0.0.0.0:{APP_PORT}"),
    ]
}

impl Node {
    fn build(me: &Path) -> anyhow::Result<Self> {
        let node = NetnsGuard::new()?;
        let mut bridge = Bridge::create(
            &node,
            IfAddr::new(Ipv4Addr::new(10, 245, 0, 1), 24),
            IfAddr::new("fd00:245::1".parse::<std::net::Ipv6Addr>()?, 64),
        )?;
        let upstream = NetnsGuard::new()?;
        tune(&upstream)?;
        let upstream_port = bridge.attach(&upstream)?;
        let upstream_server = Daemon::start(
            me,
            &Placement::new().netns(&upstream).uid(APP_UID),
            &server_args(),
        )?;
        let peer = NetnsGuard::new()?;
        tune(&peer)?;
        let peer_port = bridge.attach(&peer)?;
        let mut pods = Vec::new();
        for name in ["per-pod", "shared"] {
            let pod = Pod::new()?;
            tune(&pod.netns)?;
            let port = bridge.attach(&pod.netns)?;
            pods.push(MeshedPod {
                name: name.into(),
                ip: port.v4(),
                pod,
                proxy: None,
                _server: None,
                _port: port,
            });
        }
        Ok(Self {
            pods,
            peer,
            upstream_ip: upstream_port.v4(),
            _upstream_server: upstream_server,
            _upstream_port: upstream_port,
            _peer_port: peer_port,
            _upstream: upstream,
            _bridge: bridge,
            _node: node,
        })
    }

    /// Starts each pod's proxy (UID 2102) and app server, once the pod is redirected (the
    /// proxy's listener is registered by the programs when it calls `listen()`).
    fn start_workloads(&mut self, me: &Path) -> anyhow::Result<()> {
        for p in &mut self.pods {
            p.proxy = Some(Daemon::start(
                me,
                &p.pod.container(config::DEFAULT_PROXY_UID),
                &["proxy".to_string()],
            )?);
            p._server = Some(Daemon::start(
                me,
                &p.pod.container(APP_UID),
                &server_args(),
            )?);
        }
        Ok(())
    }

    fn counters(&self) -> Vec<ProxyCounters> {
        self.pods
            .iter()
            .map(|p| p.proxy.as_ref().map(Daemon::counters).unwrap_or_default())
            .collect()
    }

    /// Per pod: (outbound clients in the pod, inbound clients in the peer).
    fn loads(&self, cfg: &UpgradeConfig) -> Vec<(Placement, LoadArgs)> {
        let args = |target| LoadArgs {
            kind: Kind::Rr,
            target,
            concurrency: cfg.concurrency,
            duration_ms: cfg.duration_ms,
            warmup_ms: 0,
            series_ms: Some(BUCKET_MS),
        };
        self.pods
            .iter()
            .flat_map(|p| {
                [
                    (
                        p.pod.container(APP_UID),
                        args(v4(self.upstream_ip, APP_PORT)),
                    ),
                    (
                        Placement::new().netns(&self.peer).uid(APP_UID),
                        args(v4(p.ip, APP_PORT)),
                    ),
                ]
            })
            .collect()
    }
}

/// Watches the pinned links while the agent starts: when the first and the last of them was
/// seen running a program other than the one it ran before, and the longest pass over all of
/// them (the resolution of those times).
struct SwapWatch {
    first: Option<Instant>,
    last: Option<Instant>,
    swapped: usize,
    resolution: Duration,
}

/// The program the link pinned at `path` runs.
fn link_program(path: &Path) -> Option<u32> {
    let fd = bpf::obj_get(path).ok()?;
    bpf::link_info(fd).ok().map(|l| l.prog_id)
}

fn watch_links(before: &BTreeMap<PathBuf, u32>, stop: &AtomicBool) -> SwapWatch {
    let mut seen: BTreeMap<&PathBuf, Instant> = BTreeMap::new();
    let mut resolution = Duration::ZERO;
    let mut last_pass = Instant::now();
    while seen.len() < before.len() && !stop.load(Ordering::Relaxed) {
        for (path, prog) in before {
            if !seen.contains_key(path) && link_program(path).is_some_and(|p| p != *prog) {
                seen.insert(path, Instant::now());
            }
        }
        // Leave the CPU to the agent between passes (two cores, shared).
        std::thread::sleep(Duration::from_micros(100));
        let now = Instant::now();
        resolution = resolution.max(now - last_pass);
        last_pass = now;
    }
    SwapWatch {
        first: seen.values().min().copied(),
        last: seen.values().max().copied(),
        swapped: seen.len(),
        resolution,
    }
}

/// The pinned link paths of the pods (per-pod directories and `shared/`).
fn link_pins(pin_root: &Path) -> anyhow::Result<Vec<PathBuf>> {
    Ok(layout::link_programs(pin_root)?.into_keys().collect())
}

/// Runs the loads while `change` happens at `cfg.change_at_ms`; `change` returns the instant
/// the window it opened closes (µs since the epoch).
fn under_load(
    me: &Path,
    node: &Node,
    cfg: &UpgradeConfig,
    change: impl FnOnce() -> anyhow::Result<u64>,
) -> anyhow::Result<(Vec<LoadResult>, u64, u64, Vec<ProxyCounters>)> {
    let before = node.counters();
    let loads = node.loads(cfg);
    let (results, t_change, t_end) = std::thread::scope(|s| -> anyhow::Result<_> {
        let handles: Vec<_> = loads
            .iter()
            .map(|(placement, args)| s.spawn(move || run_load(me, placement, args)))
            .collect();
        std::thread::sleep(Duration::from_millis(cfg.change_at_ms));
        let t_change = now_us();
        let end = change();
        let mut results = Vec::new();
        for h in handles {
            results.push(
                h.join()
                    .map_err(|_| anyhow::anyhow!("load thread panicked"))??,
            );
        }
        Ok((results, t_change, end?))
    })?;
    let after = node.counters();
    let delta = before
        .iter()
        .zip(after)
        .map(|(b, a)| ProxyCounters {
            outbound: a.outbound - b.outbound,
            inbound: a.inbound - b.inbound,
            orig_dst: a.orig_dst - b.orig_dst,
            fallback: a.fallback - b.fallback,
            no_dst: a.no_dst - b.no_dst,
            upstream_err: a.upstream_err - b.upstream_err,
        })
        .collect();
    Ok((results, t_change, t_end, delta))
}

#[expect(
    clippy::too_many_arguments,
    reason = "the round's figures come from separate steps of `run`, assembled here once"
)]
fn round(
    (change, concurrency): (Change, usize),
    node: &Node,
    results: &[LoadResult],
    proxies: &[ProxyCounters],
    (t_change, t_ready, t_end): (u64, u64, u64),
    from_layout: u32,
    links: usize,
    watch: Option<SwapWatch>,
    relinked_ms: Option<f64>,
    problems: Vec<String>,
) -> UpgradeRound {
    let start = results.iter().map(|r| r.start_unix_us).min().unwrap_or(0);
    let mut errors = BTreeMap::new();
    let (mut window_ok, mut window_failed) = (0, 0);
    for r in results {
        for (k, v) in &r.errors {
            *errors.entry(k.clone()).or_insert(0) += v;
        }
        let bucket = |t: u64| (t.saturating_sub(r.start_unix_us) / 1000 / BUCKET_MS) as usize;
        let (from, to) = (bucket(t_change), bucket(t_end));
        for (_, b) in r
            .series
            .iter()
            .enumerate()
            .filter(|(i, _)| *i >= from && *i <= to)
        {
            window_ok += b.0;
            window_failed += b.1;
        }
    }
    let pods = node
        .pods
        .iter()
        .zip(results.chunks(2))
        .zip(proxies)
        .map(|((p, r), c)| PodRound {
            pod: p.name.clone(),
            out_ok: r[0].ok,
            out_failed: r[0].failed,
            in_ok: r[1].ok,
            in_failed: r[1].failed,
            proxy_out: c.outbound,
            proxy_in: c.inbound,
            orig_dst: c.orig_dst,
            no_dst: c.no_dst,
        })
        .collect();
    let (swap_ms, links_swapped) = match &watch {
        Some(SwapWatch {
            first: Some(a),
            last: Some(b),
            swapped,
            ..
        }) => (Some((*b - *a).as_secs_f64() * 1e3), *swapped),
        _ => (None, 0),
    };
    let swap_resolution_ms = watch.map_or(0.0, |w| w.resolution.as_secs_f64() * 1e3);
    UpgradeRound {
        change,
        concurrency,
        from_layout,
        to_layout: LAYOUT_VERSION,
        change_at_ms: t_change.saturating_sub(start) as f64 / 1e3,
        down_ms: t_ready.saturating_sub(t_change) as f64 / 1e3,
        swap_ms,
        swap_resolution_ms,
        links,
        links_swapped,
        relinked_ms,
        ok: results.iter().map(|r| r.ok).sum(),
        failed: results.iter().map(|r| r.failed).sum(),
        errors,
        window_ok,
        window_failed,
        pods,
        problems,
    }
}

/// After the new agent is up: the layout it recorded, and whether every link runs one of its
/// programs.
fn check_state(pin_root: &Path, before: &BTreeMap<PathBuf, u32>) -> anyhow::Result<Vec<String>> {
    let mut problems = Vec::new();
    let recorded = layout::meta(pin_root)?.map(|m| m.version);
    if recorded != Some(LAYOUT_VERSION) {
        problems.push(format!("layout recorded {recorded:?}"));
    }
    let now = layout::link_programs(pin_root)?;
    for (path, prog) in before {
        let name = path.strip_prefix(pin_root).unwrap_or(path).display();
        match now.get(path) {
            Some(p) if p != prog => {}
            // A pod's inbound stub is kept while its maps are the pinned ones: it reaches the
            // new agent's shared program through the program array.
            Some(p) if runs_stub(*p) => {}
            Some(_) => problems.push(format!("link {name} still runs its old program")),
            None => problems.push(format!("link {name} is gone")),
        }
    }
    if !pin_root.join(paths::PIN_NEXT).exists() {
        return Ok(problems);
    }
    problems.push("staging directory left behind".into());
    Ok(problems)
}

/// Whether the program with id `prog` is a pod's `sk_lookup` stub.
fn runs_stub(prog: u32) -> bool {
    bpf::prog_by_id(prog)
        .and_then(bpf::prog_name)
        .is_ok_and(|n| n == linkerd_cni_common::names::PROG_SK_LOOKUP_STUB)
}

/// Spawns the agent while watching the links; returns (ready µs, watch).
fn spawn_watched(
    agent: &mut AgentProc,
    before: &BTreeMap<PathBuf, u32>,
) -> anyhow::Result<(u64, SwapWatch)> {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let watcher = s.spawn(|| watch_links(before, &stop));
        let spawned = agent.spawn();
        let t_ready = now_us();
        // Links still old once the agent answers are reported by `check_state`.
        std::thread::sleep(Duration::from_millis(200));
        stop.store(true, Ordering::Relaxed);
        let watch = watcher
            .join()
            .map_err(|_| anyhow::anyhow!("link watcher panicked"))?;
        spawned?;
        Ok((t_ready, watch))
    })
}

/// Runs `cfg.rounds` rounds of the four changes on a node of its own, with the agent binary
/// `agent_bin` and the API server's `kubeconfig`.
pub fn run(
    me: &Path,
    agent_bin: &Path,
    kubeconfig: &Path,
    cfg: &UpgradeConfig,
) -> anyhow::Result<Vec<UpgradeRound>> {
    let mut out = Vec::new();
    for i in 0..cfg.rounds {
        let rounds = one_node(me, agent_bin, kubeconfig, cfg)
            .with_context(|| format!("upgrade scenario, round {}", i + 1))?;
        for r in &rounds {
            eprintln!(
                "bench: {} {}: {} ok, {} failed ({} ok / {} failed from the change to the agent answering), agent down {:.0} ms, links swapped {}/{} in {} (±{:.2} ms), every pod redirected: {}{}",
                i + 1,
                r.change.label(),
                r.ok,
                r.failed,
                r.window_ok,
                r.window_failed,
                r.down_ms,
                r.links_swapped,
                r.links,
                r.swap_ms.map_or("-".into(), |m| format!("{m:.1} ms")),
                r.swap_resolution_ms,
                r.pods.iter().all(PodRound::redirected_throughout),
                match r.problems.as_slice() {
                    [] => String::new(),
                    [one] => format!(" — {one}"),
                    [first, rest @ ..] => format!(" — {first} (and {} more)", rest.len()),
                }
            );
        }
        out.extend(rounds);
    }
    Ok(out)
}

fn one_node(
    me: &Path,
    agent_bin: &Path,
    kubeconfig: &Path,
    cfg: &UpgradeConfig,
) -> anyhow::Result<Vec<UpgradeRound>> {
    let mut node = Node::build(me)?;
    // The second pod's links stand for the shared ancestor's: the agent is told that its
    // cgroup is the shared one.
    let shared = node.pods[1].pod.cgroup.path().to_path_buf();
    let mut agent =
        AgentProc::stopped(agent_bin, kubeconfig, &shared, crate::node::NODE_NAME, 1024)?;
    let pin_root = agent.pin_root().to_path_buf();
    {
        let previous = layout::previous_loads(&pin_root)?;
        for (i, p) in node.pods.iter().enumerate() {
            let id = format!("bench-upgrade-{}-{}", std::process::id(), p.name);
            layout::previous_registers(
                &previous,
                &pin_root,
                agent.state_dir(),
                &layout::PreviousPod {
                    id: &id,
                    netns: p.pod.netns.path(),
                    cgroup: p.pod.cgroup.path(),
                    shared: i == 1,
                },
            )?;
        }
        // The previous agent's user space is gone; its programs stay pinned and attached.
    }
    node.start_workloads(me)?;
    if layout::meta(&pin_root)?.is_some() {
        bail!("the previous version's state has a layout record");
    }
    let mut out = Vec::new();

    // Upgrade and rollback: the agent starts on state of another layout.
    for change in [Change::Upgrade, Change::Rollback] {
        if change == Change::Rollback {
            agent.terminate()?;
            layout::make_newer_readable_layout(&pin_root)?;
        }
        let from_layout = layout::meta(&pin_root)?.map_or(1, |m| m.version);
        let before = layout::link_programs(&pin_root)?;
        let mut watch = None;
        let mut t_ready = 0;
        let (results, t_change, t_end, proxies) = under_load(me, &node, cfg, || {
            let (ready, w) = spawn_watched(&mut agent, &before)?;
            (t_ready, watch) = (ready, Some(w));
            Ok(ready)
        })?;
        let problems = check_state(&pin_root, &before)?;
        out.push(round(
            (change, cfg.concurrency),
            &node,
            &results,
            &proxies,
            (t_change, t_ready, t_end),
            from_layout,
            before.len(),
            watch,
            None,
            problems,
        ));
    }

    // Same-version restart: SIGTERM under load, then a new process.
    let before = layout::link_programs(&pin_root)?;
    let mut watch = None;
    let mut t_ready = 0;
    let (results, t_change, t_end, proxies) = under_load(me, &node, cfg, || {
        agent.terminate()?;
        let (ready, w) = spawn_watched(&mut agent, &before)?;
        (t_ready, watch) = (ready, Some(w));
        Ok(ready)
    })?;
    let problems = check_state(&pin_root, &before)?;
    out.push(round(
        (Change::Restart, cfg.concurrency),
        &node,
        &results,
        &proxies,
        (t_change, t_ready, t_end),
        LAYOUT_VERSION,
        before.len(),
        watch,
        None,
        problems,
    ));

    // Control: the links are detached while the agent is down; it re-attaches them.
    let pins = link_pins(&pin_root)?;
    let mut t_ready = 0;
    let mut relinked_ms = None;
    let (results, t_change, t_end, proxies) = under_load(me, &node, cfg, || {
        agent.terminate()?;
        let t0 = Instant::now();
        for pin in &pins {
            std::fs::remove_file(pin).with_context(|| format!("unpinning {}", pin.display()))?;
        }
        agent.spawn()?;
        t_ready = now_us();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !pins.iter().all(|p| p.exists()) {
            if Instant::now() > deadline {
                bail!("the agent did not re-attach the links within 10 s");
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        relinked_ms = Some(t0.elapsed().as_secs_f64() * 1e3);
        Ok(now_us())
    })?;
    out.push(round(
        (Change::Control, cfg.concurrency),
        &node,
        &results,
        &proxies,
        (t_change, t_ready, t_end),
        LAYOUT_VERSION,
        pins.len(),
        None,
        relinked_ms,
        Vec::new(),
    ));
    drop(agent);
    drop(node);
    Ok(out)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A pod that made `ok` connections each way, `via_proxy` of them through the proxy.
    pub(crate) fn pod(ok: u64, via_proxy: u64) -> PodRound {
        PodRound {
            pod: "p".into(),
            out_ok: ok,
            in_ok: ok,
            proxy_out: via_proxy,
            proxy_in: via_proxy,
            orig_dst: 2 * via_proxy,
            ..PodRound::default()
        }
    }

    /// A round of `change` with `failed` failed connections, `pods` and `problems`.
    pub(crate) fn round(
        change: Change,
        failed: u64,
        pods: Vec<PodRound>,
        problems: &[&str],
    ) -> UpgradeRound {
        UpgradeRound {
            change,
            concurrency: 4,
            from_layout: 1,
            to_layout: LAYOUT_VERSION,
            change_at_ms: 1000.0,
            down_ms: 300.0,
            swap_ms: Some(10.0),
            swap_resolution_ms: 0.2,
            links: 14,
            links_swapped: 14,
            relinked_ms: None,
            ok: 100,
            failed,
            errors: BTreeMap::new(),
            window_ok: 10,
            window_failed: 0,
            pods,
            problems: problems.iter().map(|p| p.to_string()).collect(),
        }
    }

    #[test]
    fn a_connection_past_the_proxy_or_without_its_original_destination_is_seen() {
        assert!(pod(50, 50).redirected_throughout());
        assert!(!pod(50, 49).redirected_throughout());
        let mut no_dst = pod(50, 50);
        no_dst.no_dst = 1;
        assert!(!no_dst.redirected_throughout());
        let mut unanswered = pod(50, 50);
        unanswered.orig_dst = 99;
        assert!(!unanswered.redirected_throughout());
    }
}
