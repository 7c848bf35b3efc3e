//! Scenarios 1-3: connection setup, throughput and request/response over persistent
//! connections, outbound and inbound, in every mode.
//!
//! The simulated node: a node netns with a bridge; an `upstream` pod running the server (the
//! outbound destination); a `peer` pod (the inbound clients); and one meshed pod per mode, each
//! running the same proxy (UID 2102) and the same server, in its own netns and cgroup, with
//! that mode's redirection:
//! - `direct`: nothing intercepts; clients dial the proxy itself (the floor);
//! - `iptables-nft` / `iptables-legacy`: Linkerd's proxy-init rules in the pod netns;
//! - `ebpf`: the pod registered with the real agent through the real CNI plugin;
//! - `fallback`: the pod registered through the real plugin with a second agent of this
//!   build forced into the per-node fallback (`--mode iptables`): the plugin's nftables table
//!   in the pod netns, Linkerd's rules, no program (a node below the eBPF floor);
//! - `ebpf-baseline` (only with `--baseline-bins`): the same, through an earlier build's plugin
//!   and agent, a second agent process beside ours with its own pins, registry, socket, shared
//!   cgroup and node name. Each agent's programs are checked not to run in the other's windows.
//!
//! A mode has a pod of its own so that switching modes leaves no trace (a legacy `nat` table
//! and its conntrack hooks stay in a netns once created).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::Ipv4Addr,
    time::Duration,
};

use anyhow::{Context, bail};
use linkerd_cni_proto::config;
use linkerd_cni_tests::{
    Bridge, CgroupGuard, IfAddr, NetnsGuard, Placement, Pod, iptables::Rules, link::PodPort,
};
use serde::{Deserialize, Serialize};

use crate::{
    measure::{
        bpfstats,
        cpu::{self, CpuWindow},
    },
    node::{
        APP_UID, Api, BASELINE_NODE_NAME, Cni, CniPod, Daemon, FALLBACK_NODE_NAME, NODE_NAME,
        run_load, run_load_window, tune, v4,
    },
    workload::load::{Kind, LoadArgs},
};

/// The app port every server listens on.
pub const APP_PORT: u16 = 8080;

/// A redirection mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    Direct,
    IptablesNft,
    IptablesLegacy,
    Ebpf,
    /// The per-node fallback: Linkerd's rules written by the plugin as an nftables table,
    /// registered with an agent in `--mode iptables`.
    Fallback,
    /// The ebpf pod's twin, registered through the baseline build's plugin with the baseline
    /// agent (`--baseline-bins`).
    EbpfBaseline,
    /// A pod the agent does not redirect, with per-pod attachment (no program on its path):
    /// its app talks to the other side directly, no proxy.
    Unmeshed,
    /// The same unmeshed traffic from a pod whose cgroup lies below the agent's shared
    /// attachment (the programs run for its sockets and find no pod config).
    UnmeshedShared,
}

impl Mode {
    pub const ALL: [Mode; 5] = [
        Mode::Direct,
        Mode::IptablesNft,
        Mode::IptablesLegacy,
        Mode::Ebpf,
        Mode::Fallback,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Mode::Direct => "direct",
            Mode::IptablesNft => "iptables-nft",
            Mode::IptablesLegacy => "iptables-legacy",
            Mode::Ebpf => "ebpf",
            Mode::Fallback => "fallback",
            Mode::EbpfBaseline => "ebpf-baseline",
            Mode::Unmeshed => "unmeshed",
            Mode::UnmeshedShared => "unmeshed-shared",
        }
    }

    /// The unmeshed pods (connection scenarios only).
    pub const UNMESHED: [Mode; 2] = [Mode::Unmeshed, Mode::UnmeshedShared];

    pub fn meshed(self) -> bool {
        !Self::UNMESHED.contains(&self)
    }
}

/// A traffic scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    OutboundConnections,
    OutboundThroughput,
    InboundConnections,
    InboundThroughput,
    /// 1 KiB request and response in a loop over long-lived connections.
    OutboundPersistent,
    InboundPersistent,
}

impl Scenario {
    pub const ALL: [Scenario; 6] = [
        Scenario::OutboundConnections,
        Scenario::OutboundThroughput,
        Scenario::OutboundPersistent,
        Scenario::InboundConnections,
        Scenario::InboundThroughput,
        Scenario::InboundPersistent,
    ];

    /// The scenarios on long-lived connections, whose CPU is per GiB moved.
    pub const LONG_LIVED: [Scenario; 4] = [
        Scenario::OutboundThroughput,
        Scenario::OutboundPersistent,
        Scenario::InboundThroughput,
        Scenario::InboundPersistent,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Scenario::OutboundConnections => "outbound connections",
            Scenario::OutboundThroughput => "outbound throughput",
            Scenario::InboundConnections => "inbound connections",
            Scenario::InboundThroughput => "inbound throughput",
            Scenario::OutboundPersistent => "outbound persistent 1 KiB request/response",
            Scenario::InboundPersistent => "inbound persistent 1 KiB request/response",
        }
    }

    pub fn inbound(self) -> bool {
        matches!(
            self,
            Scenario::InboundConnections
                | Scenario::InboundThroughput
                | Scenario::InboundPersistent
        )
    }

    pub fn kind(self) -> Kind {
        match self {
            Scenario::OutboundConnections | Scenario::InboundConnections => Kind::Rr,
            Scenario::OutboundPersistent | Scenario::InboundPersistent => Kind::Persistent,
            _ => Kind::Bulk,
        }
    }
}

/// Durations and load shape.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrafficConfig {
    pub rounds: usize,
    pub rr_ms: u64,
    pub bulk_ms: u64,
    pub warmup_ms: u64,
    pub concurrency: usize,
    pub streams: usize,
    /// Persistent request/response: connections, and measured time.
    #[serde(default)]
    pub persistent_conns: usize,
    #[serde(default)]
    pub persistent_ms: u64,
    /// The kernel's BPF run-time statistics are off in these rounds (the paired rounds that
    /// judge CPU per connection): no program figures, no isolation check between the agents.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub without_bpf_stats: bool,
}

/// One measurement.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Sample {
    pub round: usize,
    /// Connections per second (connection scenarios).
    pub rate: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// Gbit/s (throughput scenarios).
    pub gbps: f64,
    pub failed: u64,
    /// Connections the proxy accepted meanwhile (warm-up included).
    pub through_proxy: u64,
    /// Exchanges (connection scenarios) or streams completed in the measured window.
    #[serde(default)]
    pub exchanges: u64,
    /// Bytes received in the measured window (throughput scenarios), or moved both ways
    /// (persistent request/response).
    #[serde(default)]
    pub bytes: u64,
    /// Packets received by the interfaces of the meshed pod's netns (lo and its veth) over
    /// the window: what netfilter's hooks see there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packets: Option<u64>,
    /// CPU spent over the measured window (see [`crate::measure::cpu`]).
    #[serde(default)]
    pub cpu: Option<CpuWindow>,
    /// The agent's programs over the same window, per program name (the baseline agent's
    /// for `ebpf-baseline`).
    #[serde(default)]
    pub bpf: bpfstats::Snapshot,
    /// With a baseline agent: how many times the other agent's programs ran over the window
    /// (ours in `ebpf-baseline`, the baseline's in every other mode). Always 0: a run fails
    /// otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub other_agent_runs: Option<u64>,
    /// Measured with the kernel's BPF run-time statistics off: `bpf` is empty, and the CPU
    /// figure has no clock reads around each program run (with them on, about 1.5 µs per
    /// redirected connection here: `sched_clock` is the paravirtual clock on this VM).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub without_bpf_stats: bool,
}

impl Sample {
    /// What CPU figures are divided by: exchanges for connection scenarios, MiB moved for
    /// the long-lived ones.
    pub fn units(&self, scenario: Scenario) -> f64 {
        if scenario.kind() == Kind::Rr {
            self.exchanges as f64
        } else {
            self.bytes as f64 / (1024.0 * 1024.0)
        }
    }
}

/// A mode's pod: its processes first, so they are killed before their netns and cgroup go.
struct ModePod {
    mode: Mode,
    /// None for the unmeshed pods.
    proxy: Option<Daemon>,
    server: Daemon,
    _port: PodPort,
    pod: Pod,
    ip: Ipv4Addr,
}

/// The baseline agent's side of the node.
struct BaselineSide {
    cni: Cni,
    /// Its programs (pinned under its pin root, or run by links pinned there).
    bpf_ids: BTreeSet<u32>,
}

/// The node and its pods.
pub struct Topology {
    pods: Vec<ModePod>,
    /// The fallback agent's plugin and socket (the fallback pod's DEL).
    fallback_cni: Cni,
    baseline: Option<BaselineSide>,
    upstream_server: Daemon,
    /// The pod registered without a cgroup of its own, so that the agent attaches its
    /// programs to the shared cgroup (for [`Mode::UnmeshedShared`]).
    shared_pod: NetnsGuard,
    bpf_ids: BTreeSet<u32>,
    upstream_ip: Ipv4Addr,
    _upstream_port: PodPort,
    _upstream: NetnsGuard,
    _peer_port: PodPort,
    peer: NetnsGuard,
    _bridge: Bridge,
    _node: NetnsGuard,
    me: std::path::PathBuf,
    /// A cgroup the benchmark owns above the ebpf pod's: its stand-in for the node's cgroup2
    /// root, where another tenant's programs go (dropped after the pods: declared last).
    node_root: CgroupGuard,
}

/// The CNI container id of a mode's pod.
pub fn ebpf_pod_id() -> String {
    format!("bench-traffic-{}", std::process::id())
}

/// The CNI container id of the fallback agent's pod.
fn fallback_pod_id() -> String {
    format!("bench-fallback-{}", std::process::id())
}

/// The CNI container id of the baseline agent's pod.
fn baseline_pod_id() -> String {
    format!("bench-baseline-{}", std::process::id())
}

/// The address the pod registered on the shared attachment claims (nothing runs in it).
const SHARED_POD_IP: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 250);

/// The CNI container id of the pod registered on the shared attachment.
fn shared_pod_id() -> String {
    format!("bench-shared-{}", std::process::id())
}

/// Serves a meshed pod named `id` (uid `<id>-uid`) on the node `node` from the API server and
/// sends its CNI ADD.
fn add_meshed_pod(
    api: &Api,
    cni: &Cni,
    node: &str,
    id: &str,
    netns: &std::path::Path,
    cgroup: Option<&std::path::Path>,
    ip: Ipv4Addr,
) -> anyhow::Result<()> {
    api.add_pod_on(id, &format!("{id}-uid"), node)?;
    invoke_for(cni, "ADD", id, netns, cgroup, ip)
}

/// Sends CNI `command` for the pod registered as `id` (uid `<id>-uid`, as [`add_meshed_pod`]
/// serves it).
fn invoke_for(
    cni: &Cni,
    command: &str,
    id: &str,
    netns: &std::path::Path,
    cgroup: Option<&std::path::Path>,
    ip: Ipv4Addr,
) -> anyhow::Result<()> {
    let uid = format!("{id}-uid");
    cni.invoke(
        command,
        &CniPod {
            id,
            name: id,
            uid: &uid,
            netns,
            cgroup,
            ip,
        },
    )?;
    Ok(())
}

impl Topology {
    /// Builds the node; registers the ebpf pod through `cni` (the agent must be running), and
    /// one pod without a cgroup of its own so that the agent attaches to `shared_cgroup`.
    /// Registers the fallback pod through `fallback`'s plugin and agent. With `baseline`,
    /// registers the ebpf-baseline pod through its plugin and agent too.
    pub fn build(
        me: &std::path::Path,
        api: &Api,
        cni: &Cni,
        shared_cgroup: &std::path::Path,
        pin_root: &std::path::Path,
        fallback: &crate::node::SideAgent,
        baseline: Option<&crate::node::Baseline>,
    ) -> anyhow::Result<Self> {
        let node = NetnsGuard::new()?;
        let mut bridge = Bridge::create(
            &node,
            IfAddr::new(Ipv4Addr::new(10, 244, 0, 1), 24),
            IfAddr::new("fd00:244::1".parse::<std::net::Ipv6Addr>()?, 64),
        )?;
        let server_args = |port: u16| {
            vec![
                "server".to_string(),
                "--listen".into(),
                format!("0.0.0.0:{port}"),
            ]
        };

        let upstream = NetnsGuard::new()?;
        tune(&upstream)?;
        let upstream_port = bridge.attach(&upstream)?;
        let upstream_server = Daemon::start(
            me,
            &Placement::new().netns(&upstream).uid(APP_UID),
            &server_args(APP_PORT),
        )?;
        let upstream_ip = upstream_port.v4();

        let peer = NetnsGuard::new()?;
        tune(&peer)?;
        let peer_port = bridge.attach(&peer)?;

        // Registered without a cgroup: the agent attaches to the shared cgroup. Nothing runs
        // in it; it only puts the programs above the unmeshed-shared pod.
        let shared_pod = NetnsGuard::new()?;
        add_meshed_pod(
            api,
            cni,
            NODE_NAME,
            &shared_pod_id(),
            shared_pod.path(),
            None,
            SHARED_POD_IP,
        )?;

        let node_root = CgroupGuard::new()?;
        let mut pods = Vec::new();
        let baseline_mode = baseline.map(|_| Mode::EbpfBaseline);
        for mode in Mode::ALL
            .into_iter()
            .chain(baseline_mode)
            .chain(Mode::UNMESHED)
        {
            let pod = if mode == Mode::UnmeshedShared {
                Pod {
                    cgroup: CgroupGuard::new_under(shared_cgroup)?,
                    netns: NetnsGuard::new()?,
                }
            } else if mode == Mode::Ebpf {
                Pod {
                    cgroup: CgroupGuard::new_under(node_root.path())?,
                    netns: NetnsGuard::new()?,
                }
            } else {
                Pod::new()?
            };
            tune(&pod.netns)?;
            let port = bridge.attach(&pod.netns)?;
            let ip = port.v4();
            match mode {
                Mode::IptablesNft | Mode::IptablesLegacy => {
                    let binary = if mode == Mode::IptablesNft {
                        "iptables-nft"
                    } else {
                        "iptables-legacy"
                    };
                    Rules {
                        binary: binary.into(),
                        ..Rules::default()
                    }
                    .install(&pod.netns)
                    .with_context(|| format!("installing the {binary} rules"))?;
                }
                Mode::Ebpf => {
                    add_meshed_pod(
                        api,
                        cni,
                        NODE_NAME,
                        &ebpf_pod_id(),
                        pod.netns.path(),
                        Some(pod.cgroup.path()),
                        ip,
                    )?;
                }
                Mode::Fallback => {
                    add_meshed_pod(
                        api,
                        &fallback.cni,
                        FALLBACK_NODE_NAME,
                        &fallback_pod_id(),
                        pod.netns.path(),
                        Some(pod.cgroup.path()),
                        ip,
                    )
                    .context("registering the fallback pod with the fallback agent")?;
                }
                Mode::EbpfBaseline => {
                    let b = baseline.context("no baseline agent")?;
                    add_meshed_pod(
                        api,
                        &b.side.cni,
                        BASELINE_NODE_NAME,
                        &baseline_pod_id(),
                        pod.netns.path(),
                        Some(pod.cgroup.path()),
                        ip,
                    )
                    .context("registering the ebpf-baseline pod with the baseline agent")?;
                }
                Mode::Direct | Mode::Unmeshed | Mode::UnmeshedShared => {}
            }
            let mut proxy_args = vec!["proxy".to_string()];
            if mode == Mode::Direct {
                proxy_args.extend([
                    "--direct-outbound".into(),
                    v4(upstream_ip, APP_PORT).to_string(),
                    "--direct-inbound".into(),
                    v4(ip, APP_PORT).to_string(),
                ]);
            }
            let proxy = if mode.meshed() {
                Some(Daemon::start(
                    me,
                    &pod.container(config::DEFAULT_PROXY_UID),
                    &proxy_args,
                )?)
            } else {
                None
            };
            let server = Daemon::start(me, &pod.container(APP_UID), &server_args(APP_PORT))?;
            pods.push(ModePod {
                mode,
                proxy,
                server,
                _port: port,
                pod,
                ip,
            });
        }
        // Every program of the agent, the pods' sk_lookup stubs included, is in force now.
        let bpf_ids = bpfstats::program_ids(pin_root);
        let baseline = baseline.map(|b| BaselineSide {
            cni: b.side.cni.clone(),
            bpf_ids: bpfstats::program_ids(b.side.agent.pin_root()),
        });
        if let Some(b) = &baseline {
            let shared: Vec<&u32> = b.bpf_ids.intersection(&bpf_ids).collect();
            if !shared.is_empty() {
                bail!("the two agents share programs {shared:?}: their pin roots overlap");
            }
            if b.bpf_ids.is_empty() {
                eprintln!(
                    "bench: no program of the baseline agent found under its pin root: \
                     ebpf-baseline has no BPF statistics"
                );
            }
        }
        Ok(Self {
            pods,
            fallback_cni: fallback.cni.clone(),
            baseline,
            upstream_server,
            shared_pod,
            bpf_ids,
            upstream_ip,
            _upstream_port: upstream_port,
            _upstream: upstream,
            _peer_port: peer_port,
            peer,
            _bridge: bridge,
            _node: node,
            me: me.into(),
            node_root,
        })
    }

    fn pod(&self, mode: Mode) -> anyhow::Result<&ModePod> {
        self.pods
            .iter()
            .find(|p| p.mode == mode)
            .context("no pod for this mode")
    }

    /// The ebpf pod's netns and cgroup (for the restart scenario).
    pub fn ebpf_pod(&self) -> anyhow::Result<(&Pod, Ipv4Addr)> {
        let p = self.pod(Mode::Ebpf)?;
        Ok((&p.pod, p.ip))
    }

    /// The cgroup the benchmark owns above the ebpf pod's (the stand-in for the node's root).
    pub fn node_root(&self) -> &std::path::Path {
        self.node_root.path()
    }

    /// The upstream server's address.
    pub fn upstream(&self) -> std::net::SocketAddr {
        v4(self.upstream_ip, APP_PORT)
    }

    /// Where and as whom the clients of `scenario` run, and what they dial, in `mode`.
    fn client(
        &self,
        mode: Mode,
        scenario: Scenario,
    ) -> anyhow::Result<(Placement, std::net::SocketAddr)> {
        let p = self.pod(mode)?;
        Ok(if scenario.inbound() {
            let port = if mode == Mode::Direct {
                config::DEFAULT_INBOUND_PORT
            } else {
                APP_PORT
            };
            (
                Placement::new().netns(&self.peer).uid(APP_UID),
                v4(p.ip, port),
            )
        } else {
            let target = if mode == Mode::Direct {
                v4(Ipv4Addr::LOCALHOST, config::DEFAULT_OUTBOUND_PORT)
            } else {
                self.upstream()
            };
            (p.pod.container(APP_UID), target)
        })
    }

    /// The processes taking part in an exchange of `mode`'s pod, the load generator aside:
    /// its proxy and server, and the upstream server.
    fn pids(&self, mode: Mode) -> anyhow::Result<Vec<u32>> {
        let p = self.pod(mode)?;
        let mut pids = vec![p.server.pid(), self.upstream_server.pid()];
        pids.extend(p.proxy.as_ref().map(Daemon::pid));
        Ok(pids)
    }

    /// The modes measured in `scenario`: every mode (with `ebpf-baseline` when there is a
    /// baseline agent); the unmeshed pods in connection scenarios.
    pub fn modes(&self, scenario: Scenario) -> Vec<Mode> {
        let mut m = Mode::ALL.to_vec();
        if self.baseline.is_some() {
            m.push(Mode::EbpfBaseline);
        }
        if scenario.kind() == Kind::Rr {
            m.extend(Mode::UNMESHED);
        }
        m
    }

    /// The programs whose statistics `mode`'s samples carry, and those of the other agent (if
    /// any), which must not run in its window.
    fn bpf_ids(&self, mode: Mode) -> (&BTreeSet<u32>, Option<&BTreeSet<u32>>) {
        match &self.baseline {
            Some(b) if mode == Mode::EbpfBaseline => (&b.bpf_ids, Some(&self.bpf_ids)),
            Some(b) => (&self.bpf_ids, Some(&b.bpf_ids)),
            None => (&self.bpf_ids, None),
        }
    }

    /// Runs the load of `scenario` in `mode` and checks that every connection went through
    /// the proxy (meshed modes). CPU and BPF statistics are read at the edges of the load's
    /// measured window.
    pub fn measure(
        &self,
        mode: Mode,
        scenario: Scenario,
        cfg: &TrafficConfig,
        round: usize,
    ) -> anyhow::Result<Sample> {
        self.measure_extra(mode, scenario, cfg, round, &BTreeSet::new())
    }

    /// [`Self::measure`], with the statistics of the programs `extra` (another tenant's) in
    /// the sample's `bpf` too.
    pub fn measure_extra(
        &self,
        mode: Mode,
        scenario: Scenario,
        cfg: &TrafficConfig,
        round: usize,
        extra: &BTreeSet<u32>,
    ) -> anyhow::Result<Sample> {
        let (placement, target) = self.client(mode, scenario)?;
        let kind = scenario.kind();
        let (concurrency, duration_ms) = match kind {
            Kind::Rr => (cfg.concurrency, cfg.rr_ms),
            Kind::Bulk => (cfg.streams, cfg.bulk_ms),
            Kind::Persistent => (cfg.persistent_conns.max(1), cfg.persistent_ms.max(100)),
        };
        let args = LoadArgs {
            kind,
            target,
            concurrency,
            duration_ms,
            warmup_ms: cfg.warmup_ms,
            series_ms: None,
        };
        let proxy = self.pod(mode)?.proxy.as_ref();
        let before = proxy.map(Daemon::counters).unwrap_or_default();
        let pids = self.pids(mode)?;
        // A process in the pod's netns: its /proc/<pid>/net/dev is that netns'.
        let in_pod = self.pod(mode)?.server.pid();
        let (ids, other_ids) = self.bpf_ids(mode);
        let ids = &ids.union(extra).copied().collect::<BTreeSet<u32>>();
        // Without the statistics there are no run counts to read.
        let stats = !cfg.without_bpf_stats;
        let take = |load_pid: u32| {
            let mut all = pids.clone();
            all.push(load_pid);
            (
                cpu::Reading::take(&all),
                rx_packets(in_pod),
                if stats {
                    bpfstats::snapshot(ids)
                } else {
                    Default::default()
                },
                other_ids.filter(|_| stats).map(bpfstats::snapshot),
            )
        };
        let (r, window) = run_load_window(&self.me, &placement, &args, take)?;
        let after = proxy.map(Daemon::counters).unwrap_or_default();
        let through_proxy = if scenario.inbound() {
            after.inbound - before.inbound
        } else {
            after.outbound - before.outbound
        };
        // Each exchange is a connection of its own, except on persistent connections.
        let connections = match kind {
            Kind::Persistent => (args.concurrency as u64).saturating_sub(r.failed),
            _ => r.ok,
        };
        if mode.meshed() && through_proxy < connections {
            bail!(
                "{} / {}: {} connections succeeded but the proxy accepted only {through_proxy}: \
                 redirection is not in force",
                mode.label(),
                scenario.label(),
                connections
            );
        }
        if r.ok == 0 {
            bail!(
                "{} / {}: no connection succeeded: {:?}",
                mode.label(),
                scenario.label(),
                r.errors
            );
        }
        let (cpu, packets, bpf, other_agent_runs) = match window {
            Some(((c0, p0, b0, o0), (c1, p1, b1, o1))) => (
                Some(CpuWindow::between(&c0, &c1)),
                p0.zip(p1).map(|(a, b)| b.saturating_sub(a)),
                bpfstats::delta(&b0, &b1),
                o0.zip(o1)
                    .map(|(a, b)| bpfstats::delta(&a, &b).values().map(|p| p.runs).sum()),
            ),
            None => (None, None, Default::default(), None),
        };
        if let Some(n) = other_agent_runs.filter(|&n| n > 0) {
            bail!(
                "{} / {}: the other agent's programs ran {n} times in this window: the ebpf \
                 and ebpf-baseline pods are not isolated from each other",
                mode.label(),
                scenario.label()
            );
        }
        Ok(Sample {
            round,
            rate: r.rate,
            p50_us: r.p50_us,
            p99_us: r.p99_us,
            gbps: r.gbps,
            failed: r.failed,
            through_proxy,
            exchanges: r.ok,
            bytes: r.bytes,
            packets,
            cpu,
            bpf,
            other_agent_runs,
            without_bpf_stats: cfg.without_bpf_stats,
        })
    }

    /// Whether inbound connections to `mode`'s pod reach its proxy (a short probe load).
    /// (Unmeshed pods: whether they are reachable.)
    pub fn inbound_redirected(&self, mode: Mode) -> anyhow::Result<bool> {
        let (placement, target) = self.client(mode, Scenario::InboundConnections)?;
        let proxy = self.pod(mode)?.proxy.as_ref();
        let before = proxy.map(Daemon::counters).unwrap_or_default();
        let args = LoadArgs {
            kind: Kind::Rr,
            target,
            concurrency: 1,
            duration_ms: 200,
            warmup_ms: 0,
            series_ms: None,
        };
        let r = run_load(&self.me, &placement, &args)?;
        let Some(proxy) = proxy else {
            return Ok(r.ok > 0);
        };
        let after = proxy.counters();
        Ok(r.ok > 0 && after.inbound - before.inbound >= r.ok)
    }

    /// Unregisters the ebpf pod, the fallback pod and the ebpf-baseline pod (each through its
    /// agent's plugin) and the shared-attachment pod (CNI DEL), before the pods go.
    pub fn teardown(self, cni: &Cni) -> anyhow::Result<()> {
        let of_mode = |mode: Mode| -> anyhow::Result<_> {
            let p = self.pod(mode)?;
            Ok((p.pod.netns.path(), Some(p.pod.cgroup.path()), p.ip))
        };
        let (netns, cgroup, ip) = of_mode(Mode::Fallback)?;
        invoke_for(
            &self.fallback_cni,
            "DEL",
            &fallback_pod_id(),
            netns,
            cgroup,
            ip,
        )?;
        if let Some(b) = &self.baseline {
            let (netns, cgroup, ip) = of_mode(Mode::EbpfBaseline)?;
            invoke_for(&b.cni, "DEL", &baseline_pod_id(), netns, cgroup, ip)?;
        }
        invoke_for(
            cni,
            "DEL",
            &shared_pod_id(),
            self.shared_pod.path(),
            None,
            SHARED_POD_IP,
        )?;
        let (netns, cgroup, ip) = of_mode(Mode::Ebpf)?;
        invoke_for(cni, "DEL", &ebpf_pod_id(), netns, cgroup, ip)
    }

    /// Checks that the floor's netns (`direct`) has no netfilter rule and tracks no connection:
    /// no legacy iptables table, no table in `iptables-nft-save`/`ip6tables-nft-save`, a
    /// conntrack count of 0. Returns what it saw.
    pub fn floor_check(&self) -> anyhow::Result<String> {
        let ns = &self.pod(Mode::Direct)?.pod.netns;
        let tables = ns.exec("cat", ["/proc/self/net/ip_tables_names"])?;
        let mut nft = String::new();
        for tool in ["iptables-nft-save", "ip6tables-nft-save"] {
            // Comment lines only when no table exists.
            let out = ns.exec(tool, std::iter::empty::<&str>())?;
            nft.extend(out.lines().filter(|l| !l.starts_with('#')));
        }
        // The count exists once the conntrack module is loaded; per netns.
        let tracked = ns
            .exec("cat", ["/proc/sys/net/netfilter/nf_conntrack_count"])
            .map(|c| c.trim().to_string())
            .unwrap_or_else(|_| "no conntrack".into());
        if !tables.trim().is_empty()
            || !nft.trim().is_empty()
            || tracked.parse::<u64>().unwrap_or(0) != 0
        {
            bail!(
                "the floor's netns has netfilter state: iptables tables {tables:?}, nft {nft:?}, \
                 conntrack entries {tracked}"
            );
        }
        Ok(format!(
            "checked after the traffic: no legacy iptables table, nothing in \
             `iptables-nft-save`/`ip6tables-nft-save`, {tracked} conntrack entries in that netns"
        ))
    }

    /// The proxy counters of `mode`'s pod.
    pub fn proxy_counters(
        &self,
        mode: Mode,
    ) -> anyhow::Result<crate::workload::proxy::ProxyCounters> {
        self.pod(mode)?
            .proxy
            .as_ref()
            .map(Daemon::counters)
            .context("this pod has no proxy")
    }
}

/// The packets received by every interface of the netns of process `pid` (sum of the
/// `/proc/<pid>/net/dev` receive counts), if readable.
pub fn rx_packets(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/net/dev")).ok()?;
    parse_rx_packets(&text)
}

/// The sum of the receive packet counts of a `/proc/net/dev` text.
pub fn parse_rx_packets(text: &str) -> Option<u64> {
    let mut total = 0u64;
    let mut seen = false;
    for line in text.lines().skip(2) {
        let Some((_, counters)) = line.split_once(':') else {
            continue;
        };
        // Receive: bytes, packets, ...
        total += counters.split_whitespace().nth(1)?.parse::<u64>().ok()?;
        seen = true;
    }
    seen.then_some(total)
}

/// Every sample, per scenario and mode; `None` where a mode does not support the scenario.
pub type TrafficResults = BTreeMap<Scenario, BTreeMap<Mode, Option<Vec<Sample>>>>;

/// Which scenarios and modes a run measures (labels; empty = all): `--traffic-only` runs that
/// compare two modes over many rounds.
#[derive(Debug, Clone, Default)]
pub struct Only {
    pub scenarios: Vec<String>,
    pub modes: Vec<String>,
}

impl Only {
    /// The modes the CPU goal rows compare in pairs (ebpf with the floor, iptables-nft and
    /// the baseline build; the unmeshed pod under the shared attachment with the plain one),
    /// in every scenario (the unmeshed pods in the connection scenarios only). A mode the
    /// node does not have is left out.
    pub fn paired() -> Self {
        Self {
            scenarios: Scenario::ALL.map(|s| s.label().to_string()).to_vec(),
            modes: [
                Mode::Direct,
                Mode::IptablesNft,
                Mode::Ebpf,
                Mode::Fallback,
                Mode::EbpfBaseline,
                Mode::Unmeshed,
                Mode::UnmeshedShared,
            ]
            .map(|m| m.label().to_string())
            .to_vec(),
        }
    }

    fn scenarios(&self) -> Vec<Scenario> {
        Scenario::ALL
            .into_iter()
            .filter(|s| self.scenarios.is_empty() || self.scenarios.iter().any(|l| l == s.label()))
            .collect()
    }

    fn modes(&self, topo: &Topology, scenario: Scenario) -> Vec<Mode> {
        topo.modes(scenario)
            .into_iter()
            .filter(|m| self.modes.is_empty() || self.modes.iter().any(|l| l == m.label()))
            .collect()
    }
}

/// `main` with the samples of `extra` (a later run of some of its scenarios and modes) added,
/// their rounds numbered after `main`'s `offset` rounds so that pairs stay per round.
pub fn with_extra_rounds(
    main: &TrafficResults,
    extra: TrafficResults,
    offset: usize,
) -> TrafficResults {
    let mut out = main.clone();
    for (scenario, modes) in extra {
        for (mode, samples) in modes {
            let Some(samples) = samples else { continue };
            let slot = out.entry(scenario).or_default().entry(mode).or_default();
            slot.get_or_insert_with(Vec::new)
                .extend(samples.into_iter().map(|mut s| {
                    s.round += offset;
                    s
                }));
        }
    }
    out
}

/// Runs every scenario in every mode (or those `only` names), `rounds` times, modes back to
/// back and alternating (the order rotates each round).
pub fn run(topo: &Topology, cfg: &TrafficConfig, only: &Only) -> anyhow::Result<TrafficResults> {
    let mut results: TrafficResults = BTreeMap::new();
    let mut supported: BTreeMap<(Scenario, Mode), bool> = BTreeMap::new();
    for scenario in only.scenarios() {
        for mode in only.modes(topo, scenario) {
            let ok = !scenario.inbound() || topo.inbound_redirected(mode)?;
            if !ok {
                eprintln!(
                    "bench: {} in mode {}: not redirected (not yet implemented)",
                    scenario.label(),
                    mode.label()
                );
            }
            supported.insert((scenario, mode), ok);
            results
                .entry(scenario)
                .or_default()
                .insert(mode, ok.then(Vec::new));
        }
    }
    for round in 0..cfg.rounds {
        for scenario in only.scenarios() {
            let mut order = only.modes(topo, scenario);
            let n = order.len();
            order.rotate_left(round % n);
            for &mode in &order {
                if !supported[&(scenario, mode)] {
                    continue;
                }
                let s = topo.measure(mode, scenario, cfg, round)?;
                let per = |ns: f64| ns / s.units(scenario).max(1.0) / 1000.0;
                let (busy, own) = s
                    .cpu
                    .map(|c| (per(c.busy_ns), per(c.own_ns)))
                    .unwrap_or_default();
                let unit = match scenario.kind() {
                    Kind::Rr => "conn",
                    _ => "MiB",
                };
                let bpf: u64 = s.bpf.values().map(|p| p.ns).sum();
                eprintln!(
                    "bench: round {round} {:<20} {:<16} {:>9.0} conn/s p50 {:>6.0} µs p99 {:>6.0} µs {:>6.2} Gbit/s failed {} | CPU/{} busy {busy:.1} µs own {own:.1} µs bpf {:.2} µs",
                    scenario.label(),
                    mode.label(),
                    s.rate,
                    s.p50_us,
                    s.p99_us,
                    s.gbps,
                    s.failed,
                    unit,
                    per(bpf as f64),
                );
                if let Some(Some(v)) = results.get_mut(&scenario).and_then(|m| m.get_mut(&mode)) {
                    v.push(s);
                }
                // Let TIME_WAIT sockets and worker threads settle between runs.
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rx_packets_sum_every_interface() {
        let text = "Inter-|   Receive                                                |  Transmit\n \
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    \
lo: 1000      10    0    0    0     0          0         0     1000      10    0    0    0     0       0          0\n  \
eth0: 5000      32    0    0    0     0          0         0     7000      40    0    0    0     0       0          0\n";
        assert_eq!(parse_rx_packets(text), Some(42));
        assert_eq!(parse_rx_packets("header\nheader\n"), None);
    }
}
