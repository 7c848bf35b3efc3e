//! Two rows added for issues 35 and 38 (their goal rows: `report::goals`): the cost of another
//! tenant's socket load balancer chained after ours, and the cost of the kernel feature probes
//! the agent runs at start.
//!
//! **The chain** (issue 35): the stand-in socket load balancer (`linkerd_cni_tests::tenant`,
//! `connect4/6` and `getpeername4/6` translating one Service address) attached as a bpf_link
//! (multi semantics, as Cilium >= 1.14 and Calico attach theirs to the cgroup2 root) on the
//! cgroup the benchmark owns above the ebpf pod's (its stand-in for the node's root: never the
//! real root). The ebpf pod's outbound connections go to the upstream server, not to the
//! Service address, so the tenant's program runs for each and leaves it alone: what the chain
//! costs every redirected connection. Each round measures the pod with and without the tenant
//! back to back (the order alternates); the tenant is attached for its half of the round only.
//! Rounds with the kernel's BPF statistics on give both sides' program run time; rounds with
//! them off give the CPU figures (as for the harness's other ratios).
//!
//! **The probes** (issue 38): `linkerd_cni_sys::probe::Findings::probe()` run N times in
//! this process, wall-clock and this thread's CPU time per run.

use std::{collections::BTreeSet, net::SocketAddrV4, time::Instant};

use anyhow::{Context, bail};
use linkerd_cni_tests::tenant::{How, SocketLb};
use serde::{Deserialize, Serialize};

use crate::{
    measure::{bpfstats::Snapshot, stats::Summary},
    scenario::traffic::{Mode, Sample, Scenario, Topology, TrafficConfig},
};

/// The Service address the tenant translates (routed nowhere; the measured traffic is not to
/// it).
const VIP: SocketAddrV4 = SocketAddrV4::new(std::net::Ipv4Addr::new(10, 96, 0, 10), 80);

/// One round: the ebpf pod's outbound connections without and with the tenant.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChainRound {
    pub round: usize,
    pub without: Sample,
    pub with: Sample,
    /// The tenant's programs over the `with` half's measured window (statistics' rounds).
    #[serde(default)]
    pub tenant: Snapshot,
    /// Connections the tenant translated meanwhile (0: the traffic is not to its Service).
    pub translated: u64,
}

/// The chain's rounds.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ChainResults {
    pub rounds: Vec<ChainRound>,
}

/// Runs `rounds` rounds (statistics on or off as `cfg` says), round numbers from `offset`.
pub fn run(
    topo: &Topology,
    cfg: &TrafficConfig,
    rounds: usize,
    offset: usize,
) -> anyhow::Result<Vec<ChainRound>> {
    let cgroup = topo.node_root();
    let backend = match topo.upstream() {
        std::net::SocketAddr::V4(a) => a,
        other => bail!("upstream {other} is not IPv4"),
    };
    let mut lb = SocketLb::load(VIP, backend)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .context("loading the stand-in socket LB")?;
    let ids: BTreeSet<u32> = lb.ids().into_iter().collect();
    let scenario = Scenario::OutboundConnections;
    let mut out = Vec::new();
    for r in 0..rounds {
        let round = offset + r;
        let measure_with = |lb: &mut SocketLb| -> anyhow::Result<(Sample, Snapshot, u64)> {
            lb.attach(cgroup, How::Link)
                .with_context(|| format!("attaching the tenant to {}", cgroup.display()))?;
            let before = lb.connects();
            let s = topo.measure_extra(Mode::Ebpf, scenario, cfg, round, &ids);
            let translated = lb.connects().saturating_sub(before);
            lb.detach_all();
            let mut s = s?;
            // The tenant's programs, apart from ours.
            let tenant: Snapshot = s
                .bpf
                .iter()
                .filter(|(n, _)| n.starts_with("tenant_"))
                .map(|(n, p)| (n.clone(), *p))
                .collect();
            s.bpf.retain(|n, _| !n.starts_with("tenant_"));
            Ok((s, tenant, translated))
        };
        let measure_without = || topo.measure(Mode::Ebpf, scenario, cfg, round);
        let (without, (with, tenant, translated)) = if round.is_multiple_of(2) {
            let w = measure_without()?;
            std::thread::sleep(std::time::Duration::from_millis(200));
            (w, measure_with(&mut lb)?)
        } else {
            let t = measure_with(&mut lb)?;
            std::thread::sleep(std::time::Duration::from_millis(200));
            (measure_without()?, t)
        };
        let per = |s: &Sample| {
            s.cpu
                .map(|c| c.own_ns / s.exchanges.max(1) as f64 / 1000.0)
                .unwrap_or_default()
        };
        eprintln!(
            "bench: chain round {round}: ebpf {:.1} µs own/conn, ebpf + tenant {:.1} µs own/conn \
             ({translated} translated){}",
            per(&without),
            per(&with),
            if cfg.without_bpf_stats {
                ", BPF statistics off"
            } else {
                ""
            }
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
        out.push(ChainRound {
            round,
            without,
            with,
            tenant,
            translated,
        });
    }
    Ok(out)
}

/// The feature probes' cost: `Findings::probe()` timed over `runs` runs.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ProbeCost {
    pub runs: usize,
    pub features: usize,
    /// Per run, ms.
    pub wall_ms: Summary,
    /// This thread's CPU time per run (user + system: the verifier's work included), ms.
    pub cpu_ms: Summary,
    /// The kernel's verdict on the last run (`Ok` text or the refusal).
    pub verdict: String,
}

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write into.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Runs the probes `runs` times (after one untimed run).
pub fn probe_cost(runs: usize) -> ProbeCost {
    use linkerd_cni_sys::probe::Findings;
    let first = Findings::probe();
    let mut wall = Vec::new();
    let mut cpu = Vec::new();
    let mut last = first;
    for _ in 0..runs {
        let (t, c) = (Instant::now(), thread_cpu_ns());
        last = Findings::probe();
        cpu.push((thread_cpu_ns() - c) as f64 / 1e6);
        wall.push(t.elapsed().as_secs_f64() * 1e3);
    }
    ProbeCost {
        runs,
        features: last.answers.len(),
        wall_ms: Summary::of(&wall),
        cpu_ms: Summary::of(&cpu),
        verdict: match last.verdict() {
            Ok(s) => s,
            Err(s) => format!("refused: {s}"),
        },
    }
}
