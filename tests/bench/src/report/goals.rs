//! The other goal rows: pod setup and restart, the image, RunPodSandbox, API load, the agent
//! replaced under load, and the chained tenant and feature probes (information).

use std::fmt::Write as _;

use super::{
    results::{Goal, TrafficRow, row},
    traffic_goals::{INFO, median_with_interval},
};
use crate::{
    measure::{bpfstats::Snapshot, stats::Summary},
    scenario::{
        apiload::ApiLoadResults,
        chain::{ChainResults, ChainRound, ProbeCost},
        podsetup::{Checkpoint, PodSetupResults, ReconcileCost},
        restart::RestartRound,
        traffic::{Mode, Sample, Scenario},
        upgrade::{Change, UpgradeRound},
    },
};

/// Evaluates the goals.
pub fn goals(rows: &[TrafficRow], pods: &PodSetupResults, restart: &[RestartRound]) -> Vec<Goal> {
    let mut out = Vec::new();
    for (conn, thr) in [
        (Scenario::OutboundConnections, Scenario::OutboundThroughput),
        (Scenario::InboundConnections, Scenario::InboundThroughput),
    ] {
        let dir = if conn == Scenario::OutboundConnections {
            "outbound"
        } else {
            "inbound"
        };
        let (Some(d), Some(e)) = (row(rows, conn, Mode::Direct), row(rows, conn, Mode::Ebpf))
        else {
            out.push(Goal {
                goal: format!("{dir}: ebpf ≥ 0.97 × direct, ahead of both iptables modes"),
                observed: "ebpf not measured (not yet implemented)".into(),
                met: None,
            });
            continue;
        };
        let ratio = e.rate.median / d.rate.median;
        out.push(Goal {
            goal: format!("{dir} connection rate: ebpf ≥ 0.97 × direct {INFO}"),
            observed: format!(
                "{ratio:.3} × direct ({:.0} vs {:.0} conn/s)",
                e.rate.median, d.rate.median
            ),
            met: None,
        });
        for m in [Mode::IptablesNft, Mode::IptablesLegacy] {
            let Some(i) = row(rows, conn, m) else {
                continue;
            };
            out.push(Goal {
                goal: format!(
                    "{dir} connection rate: ebpf clearly ahead of {} (min of ebpf > max of {}) {INFO}",
                    m.label(),
                    m.label()
                ),
                observed: format!(
                    "{:.3} × ({:.0}–{:.0} vs {:.0}–{:.0} conn/s)",
                    e.rate.median / i.rate.median,
                    e.rate.min,
                    e.rate.max,
                    i.rate.min,
                    i.rate.max
                ),
                met: None,
            });
            out.push(Goal {
                goal: format!(
                    "{dir} p99: ebpf clearly below {} (max of ebpf < min of {}) {INFO}",
                    m.label(),
                    m.label()
                ),
                observed: format!(
                    "{:.0}–{:.0} µs vs {:.0}–{:.0} µs",
                    e.p99_us.min, e.p99_us.max, i.p99_us.min, i.p99_us.max
                ),
                met: None,
            });
        }
        if let (Some(d), Some(e)) = (row(rows, thr, Mode::Direct), row(rows, thr, Mode::Ebpf)) {
            let ratio = e.gbps.median / d.gbps.median;
            // Within noise: within 3 %, or the two ranges overlap.
            let met = (ratio - 1.0).abs() <= 0.03
                || (e.gbps.min <= d.gbps.max && d.gbps.min <= e.gbps.max);
            out.push(Goal {
                goal: format!("{dir} throughput: ebpf = direct within noise {INFO}"),
                observed: format!(
                    "{ratio:.3} × direct ({:.2}–{:.2} vs {:.2}–{:.2} Gbit/s; {})",
                    e.gbps.min,
                    e.gbps.max,
                    d.gbps.min,
                    d.gbps.max,
                    if met { "within noise" } else { "outside noise" }
                ),
                met: None,
            });
        }
    }
    out.extend(pod_setup_goals(pods));
    let failed: u64 = restart.iter().map(|r| r.failed).sum();
    out.push(Goal {
        goal: "0 failed connections while the agent is SIGKILLed and restarted".into(),
        observed: format!(
            "{failed} failed of {} over {} restarts",
            restart.iter().map(|r| r.ok + r.failed).sum::<u64>(),
            restart.len()
        ),
        met: Some(failed == 0 && !restart.is_empty()),
    });
    out
}

/// Issue 24's rows: the image's size per architecture, and the agent's start to `/ready` with
/// 0 and with [`crate::scenario::podsetup::RESTART_READY_PODS`] registered pods (information).
pub fn image_rows(
    image: &[crate::scenario::imagesize::ImageSize],
    start_empty: &crate::node::StartToReady,
    restart: Option<&crate::node::StartToReady>,
) -> Vec<Goal> {
    let mib = |b: u64| b as f64 / 1_048_576.0;
    let mut out = Vec::new();
    if image.is_empty() {
        out.push(Goal {
            goal: "image size per architecture (information; `cargo xtask image`)".into(),
            observed: "no archive found: `cargo xtask image` did not run or failed".into(),
            met: None,
        });
    }
    for i in image {
        out.push(Goal {
            goal: format!(
                "image size, {} (information; `cargo xtask image`'s archive)",
                i.platform
            ),
            observed: format!(
                "{:.2} MiB compressed (what a node pulls: manifest, config and the gzip layer), \
                 {:.2} MiB uncompressed; archive `{}` {:.2} MiB",
                mib(i.pulled_bytes),
                mib(i.unpacked_bytes),
                i.archive,
                mib(i.archive_bytes)
            ),
            met: None,
        });
    }
    let how = "the agent process's spawn to `/ready` answering 200, polled every 2 ms (not a \
               container start: the DaemonSet's pod through containerd is \
               tests/tests/daemonset.rs, which prints its own figure)";
    out.push(Goal {
        goal: "time from the agent's start to readiness, 0 registered pods (information)".into(),
        observed: format!(
            "{:.0} ms on a fresh node (registration socket answering after {:.0} ms); {how}",
            start_empty.ready_ms, start_empty.socket_ms
        ),
        met: None,
    });
    let goal = format!(
        "time from the agent's start to readiness, {} registered pods, restarted \
         (information)",
        crate::scenario::podsetup::RESTART_READY_PODS
    );
    out.push(match restart {
        Some(r) => Goal {
            goal,
            observed: format!(
                "{:.0} ms with {} pods in its registry and pins, after SIGTERM (registration \
                 socket answering after {:.0} ms); {how}",
                r.ready_ms, r.registered, r.socket_ms
            ),
            met: None,
        },
        None => Goal {
            goal,
            observed: "not measured (no checkpoint reached it)".into(),
            met: None,
        },
    });
    out
}

/// Scenario 8's row: RunPodSandbox with linkerd-cni against without (information: the
/// sandbox's own setup dominates and swings with the machine).
pub fn cri_sandbox_row(r: &crate::scenario::crisandbox::CriSandboxResults) -> Goal {
    Goal {
        goal: "RunPodSandbox through containerd with linkerd-cni / without (information)".into(),
        observed: format!(
            "{:.2} × ({:.1} vs {:.1} ms median, {} sandboxes each)",
            r.ratio(),
            r.with_linkerd.summary.median,
            r.without.summary.median,
            r.without.samples_ms.len()
        ),
        met: None,
    }
}

/// The goal rows of scenario 7 (Kubernetes API load).
pub fn api_goals(r: &ApiLoadResults) -> Vec<Goal> {
    let mut out = Vec::new();
    if let Some(p) = r.phase("churn (steady state)") {
        out.push(Goal {
            goal: "0 Kubernetes API requests per ADD in steady state (caches synced)".into(),
            observed: format!(
                "{} requests for {} ADDs and {} DELs on {} nodes ({:.2} per ADD)",
                p.requests,
                p.adds,
                p.dels,
                r.config.nodes,
                p.requests_per_add()
            ),
            met: Some(p.requests == 0 && p.adds > 0),
        });
    }
    out.push(Goal {
        goal: format!(
            "API requests per node ≤ Linkerd's plugin ({} GETs per meshed ADD) at the same churn",
            crate::scenario::apiload::LINKERD_REQUESTS_PER_ADD
        ),
        observed: format!(
            "{:.0} vs {:.0} for {:.0} ADDs per node ({:.1} % of it); {:.1} watch connections per node",
            r.requests_per_node,
            r.linkerd_requests_per_node,
            r.adds_per_node,
            100.0 * r.requests_per_node / r.linkerd_requests_per_node.max(1.0),
            r.watches_open_per_node
        ),
        met: Some(r.requests_per_node <= r.linkerd_requests_per_node),
    });
    out
}

/// The agent's default `--reconcile-interval` (its `run` flag), s: how often a pass runs.
const RECONCILE_INTERVAL_S: f64 = 2.0;

/// The reconcile row at 10,000 pods (information): the CPU of verifying every pod once, what a
/// pass of `PODS_PER_PASS` pods every interval keeps of one core, the order checks' share, and
/// the `bpf()` calls per pod.
fn reconcile_row(registered: usize, r: &ReconcileCost) -> Goal {
    let per_pass = linkerd_cni_agent::agent::reconcile::PODS_PER_PASS.min(registered) as f64;
    let pass_ms = r.cpu_us_per_pod() * per_pass / 1e3;
    Goal {
        goal: format!(
            "reconcile at {registered} pods: CPU of verifying every pod once, and of one pass \
             every {RECONCILE_INTERVAL_S:.0} s (information)"
        ),
        observed: format!(
            "{:.0} ms over {} passes ({:.1} µs per pod; the order checks {:.0} % of it); a pass \
             of {per_pass:.0} pods {pass_ms:.1} ms, {:.1} % of one core; {} `bpf()` calls per pod \
             and pass",
            r.cpu_ms(),
            r.passes.len(),
            r.cpu_us_per_pod(),
            100.0 * r.order_cpu_ms() / r.cpu_ms().max(f64::MIN_POSITIVE),
            100.0 * pass_ms / (RECONCILE_INTERVAL_S * 1e3),
            r.bpf_per_pod()
                .map_or_else(|| "not counted (no strace)".into(), |b| format!("{b:.1}"))
        ),
        met: None,
    }
}

/// How much `f` (an ADD or DEL figure, ms) grew from checkpoint `a` to `b`, each taken in
/// units of its checkpoint's exec floor: a 151-byte static binary spawned exactly as the
/// plugin is, right after every measured ADD. The checkpoints are minutes apart, and the
/// machine's drift in between moves every spawn alike (the floor itself moved 0.12 → 0.19 ms
/// in one run and 0.21 → 0.15 ms in the one before); what is left is the growth with the pod
/// count. None without a floor at both.
fn growth_over_exec_floor(
    a: &Checkpoint,
    b: &Checkpoint,
    f: fn(&Checkpoint) -> f64,
) -> Option<f64> {
    (a.exec_floor_p50_ms > 0.0 && b.exec_floor_p50_ms > 0.0 && f(a) > 0.0)
        .then(|| (f(b) / b.exec_floor_p50_ms) / (f(a) / a.exec_floor_p50_ms))
}

/// The pod-setup goals: CNI ADD and DEL latency at every checkpoint and their growth, the
/// plugin against the machine's exec floor, agent RSS at 1,000 and 10,000 pods.
pub fn pod_setup_goals(pods: &PodSetupResults) -> Vec<Goal> {
    let mut out = Vec::new();
    let cps = &pods.checkpoints;
    let at = |n: usize| {
        cps.iter()
            .find(|c| c.registered >= n && c.registered < n + n / 10 + 5)
    };
    for (verb, p50, p99) in [
        (
            "ADD",
            (|c: &Checkpoint| c.add_p50_ms) as fn(&Checkpoint) -> f64,
            (|c: &Checkpoint| c.add_p99_ms) as fn(&Checkpoint) -> f64,
        ),
        (
            "DEL",
            |c: &Checkpoint| c.del_p50_ms,
            |c: &Checkpoint| c.del_p99_ms,
        ),
    ] {
        let counts = cps
            .iter()
            .map(|c| c.registered.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        let worst = |f: fn(&Checkpoint) -> f64| cps.iter().map(f).fold(0.0, f64::max);
        out.push(Goal {
            goal: format!("CNI {verb} p50 ≤ 2 ms at {counts} pods"),
            observed: format!(
                "worst {:.2} ms ({})",
                worst(p50),
                cps.iter()
                    .map(|c| format!("{:.2}", p50(c)))
                    .collect::<Vec<_>>()
                    .join(" / ")
            ),
            met: (!cps.is_empty()).then(|| worst(p50) <= 2.0),
        });
        out.push(Goal {
            goal: format!("CNI {verb} p99 ≤ 10 ms at {counts} pods"),
            observed: format!(
                "worst {:.2} ms ({})",
                worst(p99),
                cps.iter()
                    .map(|c| format!("{:.2}", p99(c)))
                    .collect::<Vec<_>>()
                    .join(" / ")
            ),
            met: (!cps.is_empty()).then(|| worst(p99) <= 10.0),
        });
        let (first, last) = (cps.first(), at(10_000));
        out.push(Goal {
            goal: format!(
                "CNI {verb} p50 with 10,000 pods / with 1 ≤ 1.2 (each in units of its \
                 checkpoint's exec floor)"
            ),
            observed: match (first, last) {
                (Some(a), Some(b)) => match growth_over_exec_floor(a, b, p50) {
                    Some(g) => format!(
                        "{g:.2} ({:.2} / {:.2} exec floors of {:.2} / {:.2} ms); spawn to exit \
                         {:.2} ({:.2} / {:.2} ms)",
                        p50(b) / b.exec_floor_p50_ms,
                        p50(a) / a.exec_floor_p50_ms,
                        b.exec_floor_p50_ms,
                        a.exec_floor_p50_ms,
                        p50(b) / p50(a),
                        p50(b),
                        p50(a)
                    ),
                    None => format!(
                        "{:.2} ({:.2} / {:.2} ms; no exec floor measured)",
                        p50(b) / p50(a),
                        p50(b),
                        p50(a)
                    ),
                },
                (Some(a), None) => format!(
                    "not measured (this run stopped at {} pods: {:.2} there / {:.2} ms with 1)",
                    cps.last().map_or(0, |c| c.registered),
                    cps.last().map_or(0.0, p50),
                    p50(a)
                ),
                _ => "not measured".into(),
            },
            met: match (first, last) {
                (Some(a), Some(b)) => {
                    Some(growth_over_exec_floor(a, b, p50).unwrap_or(p50(b) / p50(a)) <= 1.2)
                }
                _ => None,
            },
        });
    }
    // What of an ADD or DEL depends on the pod count is the agent's work; the spawn-to-exit
    // ratio above also carries the machine's drift between two checkpoints minutes apart.
    for (verb, f) in [
        (
            "ADD",
            (|c: &Checkpoint| c.agent_add_p50_us) as fn(&Checkpoint) -> f64,
        ),
        ("DEL", |c: &Checkpoint| c.agent_del_p50_us),
    ] {
        let (Some(a), Some(b)) = (cps.first(), at(10_000)) else {
            continue;
        };
        if f(a) <= 0.0 || f(b) <= 0.0 {
            continue;
        }
        out.push(Goal {
            goal: format!(
                "the agent's own {verb} handling p50 with 10,000 pods / with 1 (information: \
                 its phase log, the part of a CNI call that depends on the pod count)"
            ),
            observed: format!("{:.2} ({:.0} / {:.0} µs)", f(b) / f(a), f(b), f(a)),
            met: None,
        });
    }
    if let Some((c, r)) = at(10_000).and_then(|c| Some((c, c.reconcile.as_ref()?))) {
        out.push(reconcile_row(c.registered, r));
    }
    let floors: Vec<&Checkpoint> = cps.iter().filter(|c| c.exec_floor_p50_ms > 0.0).collect();
    if !floors.is_empty() {
        let worst_version = floors
            .iter()
            .map(|c| c.plugin_floor_p50_ms - c.exec_floor_p50_ms)
            .fold(f64::MIN, f64::max);
        out.push(Goal {
            goal: "plugin start-up (VERSION, spawn to exit) within 0.3 ms of the exec floor (a \
                   151-byte static binary reading stdin, spawned the same way)"
                .into(),
            observed: format!(
                "+{worst_version:.2} ms (worst checkpoint; exec floor {})",
                floors
                    .iter()
                    .map(|c| format!("{:.2}", c.exec_floor_p50_ms))
                    .collect::<Vec<_>>()
                    .join(" / ")
            ),
            met: Some(worst_version <= 0.3),
        });
        let worst_add = floors
            .iter()
            .map(|c| c.add_p50_ms - c.exec_floor_p50_ms)
            .fold(f64::MIN, f64::max);
        // The bound on the plugin is its start-up (above): the whole ADD, the agent's
        // kernel work included, is judged by ADD p50 ≤ 2 ms (0.3 ms over a 0.2 ms floor would
        // make that goal moot). Kept as information: what plugin and agent add together.
        out.push(Goal {
            goal: "CNI ADD p50 over the exec floor, plugin and agent together (information: \
                   the ADD is judged by ADD p50 ≤ 2 ms, the plugin by its start-up)"
                .into(),
            observed: format!("+{worst_add:.2} ms (worst checkpoint)"),
            met: None,
        });
    }
    for (n, mib) in [(1_000usize, 16u64), (10_000, 24)] {
        let cp = at(n);
        out.push(Goal {
            goal: format!("agent RSS ≤ {mib} MiB with {n} pods"),
            observed: match cp {
                Some(c) => format!(
                    "{:.1} MiB (heap {:.1}, other anonymous {:.1}, binary {:.1}, libraries {:.1} MiB; {} threads)",
                    c.agent_rss_kib as f64 / 1024.0,
                    c.agent_mem.heap_kib as f64 / 1024.0,
                    c.agent_mem.anon_mmap_kib as f64 / 1024.0,
                    c.agent_mem.binary_kib as f64 / 1024.0,
                    c.agent_mem.libs_kib as f64 / 1024.0,
                    c.agent_mem.threads
                ),
                None => "not measured in this run".into(),
            },
            met: cp.map(|c| c.agent_rss_kib <= mib * 1024),
        });
    }
    out
}

/// The goal rows of scenario 9: 0 failed connections, every pod redirected throughout, across
/// an agent upgrade and rollback (layout change), and across a same-version rollout. Judged
/// only when the control (links detached) was seen by the same checks.
pub fn upgrade_goals(upgrade: &[UpgradeRound]) -> Vec<Goal> {
    let of = |changes: &[Change]| -> Vec<&UpgradeRound> {
        upgrade
            .iter()
            .filter(|r| changes.contains(&r.change))
            .collect()
    };
    let controls = of(&[Change::Control]);
    let control_seen = !controls.is_empty() && controls.iter().all(|r| !r.clean());
    let bypassed: u64 = controls
        .iter()
        .flat_map(|r| &r.pods)
        .map(|p| {
            (p.out_ok + p.in_ok).saturating_sub(p.proxy_out.min(p.out_ok) + p.proxy_in.min(p.in_ok))
        })
        .sum();
    let goal = |goal: &str, rounds: Vec<&UpgradeRound>| {
        let failed: u64 = rounds.iter().map(|r| r.failed).sum();
        let total: u64 = rounds.iter().map(|r| r.ok + r.failed).sum();
        let window: u64 = rounds.iter().map(|r| r.window_ok + r.window_failed).sum();
        let unredirected = rounds
            .iter()
            .flat_map(|r| &r.pods)
            .filter(|p| !p.redirected_throughout())
            .count();
        let problems: Vec<&String> = rounds.iter().flat_map(|r| &r.problems).collect();
        let clean = !rounds.is_empty() && rounds.iter().all(|r| r.clean()) && problems.is_empty();
        let mut observed = format!(
            "{failed} failed of {total} over {} replacements ({window} in the swap windows), \
             {unredirected} pod-rounds not redirected throughout",
            rounds.len()
        );
        if !problems.is_empty() {
            let _ = write!(observed, "; {}", problems.len());
            let _ = write!(observed, " state problems (first: {})", problems[0]);
        }
        let _ = write!(
            observed,
            "; control (links detached): {}",
            if control_seen {
                format!("{bypassed} connections seen passing by the proxies")
            } else {
                "NOT seen by the checks".into()
            }
        );
        Goal {
            goal: goal.into(),
            observed,
            met: control_seen.then_some(clean),
        }
    };
    vec![
        goal(
            "0 failed connections across an agent upgrade and rollback (layout change, maps migrated, links swapped) under load, every pod redirected throughout",
            of(&[Change::Upgrade, Change::Rollback]),
        ),
        goal(
            "0 failed connections across a same-version agent rollout (SIGTERM, new process) under load, every pod redirected throughout",
            of(&[Change::Restart]),
        ),
    ]
}

fn per_conn(s: &Sample, ns: impl Fn(&crate::measure::cpu::CpuWindow) -> f64) -> Option<f64> {
    let c = s.cpu.as_ref()?;
    (s.exchanges > 0).then(|| ns(c) / s.exchanges as f64 / 1000.0)
}

fn bpf_ns_per_conn(snap: &Snapshot, exchanges: u64) -> f64 {
    snap.values().map(|p| p.ns).sum::<u64>() as f64 / exchanges.max(1) as f64
}

fn runs_per_conn(snap: &Snapshot, exchanges: u64) -> f64 {
    snap.values().map(|p| p.runs).sum::<u64>() as f64 / exchanges.max(1) as f64
}

/// The report's rows (information: no limit is set for the chain's cost).
pub fn chain_goals(c: &ChainResults) -> Vec<Goal> {
    let goal = "outbound: CPU per redirected connection with another tenant's socket load \
                balancer (a bpf_link, multi) on the cgroup above the pod, against the same \
                without it, traffic not to its Service (information)"
        .to_string();
    if c.rounds.is_empty() {
        return vec![Goal {
            goal,
            observed: "not measured".into(),
            met: None,
        }];
    }
    let quiet: Vec<&ChainRound> = c
        .rounds
        .iter()
        .filter(|r| r.without.without_bpf_stats)
        .collect();
    let judged: Vec<&ChainRound> = if quiet.is_empty() {
        c.rounds.iter().collect()
    } else {
        quiet
    };
    let ratios = |f: &dyn Fn(&crate::measure::cpu::CpuWindow) -> f64| -> Vec<f64> {
        judged
            .iter()
            .filter_map(|r| Some(per_conn(&r.with, f)? / per_conn(&r.without, f)?))
            .filter(|x| x.is_finite())
            .collect()
    };
    let own = ratios(&|c| c.own_ns);
    let busy = ratios(&|c| c.busy_ns);
    let (own_median, interval) = median_with_interval(&own);
    let (busy_median, _) = median_with_interval(&busy);
    let med = |f: &dyn Fn(&ChainRound) -> Option<f64>| {
        Summary::of(&judged.iter().filter_map(|r| f(r)).collect::<Vec<_>>()).median
    };
    let own_without = med(&|r| per_conn(&r.without, |c| c.own_ns));
    let own_with = med(&|r| per_conn(&r.with, |c| c.own_ns));
    let translated: u64 = c.rounds.iter().map(|r| r.translated).sum();
    let mut out = vec![Goal {
        goal,
        observed: format!(
            "paired median {own_median:.3} × ({}; {} rounds{}; the processes' own CPU, no \
             steal); machine-wide busy {busy_median:.3} ×; medians {own_without:.1} µs vs \
             {own_with:.1} µs per connection without and with it; {translated} connections \
             translated by it (none expected)",
            match interval {
                Some((lo, hi)) => format!("95 % interval {lo:.3}–{hi:.3}"),
                None => "too few rounds for an interval".into(),
            },
            own.len(),
            if judged[0].without.without_bpf_stats {
                ", BPF statistics off"
            } else {
                ""
            },
        ),
        met: None,
    }];
    let stats: Vec<&ChainRound> = c
        .rounds
        .iter()
        .filter(|r| !r.without.without_bpf_stats)
        .collect();
    if !stats.is_empty() {
        let m = |f: &dyn Fn(&ChainRound) -> f64| {
            Summary::of(&stats.iter().map(|r| f(r)).collect::<Vec<_>>()).median
        };
        let ours_without = m(&|r| bpf_ns_per_conn(&r.without.bpf, r.without.exchanges));
        let ours_with = m(&|r| bpf_ns_per_conn(&r.with.bpf, r.with.exchanges));
        let tenant = m(&|r| bpf_ns_per_conn(&r.tenant, r.with.exchanges));
        let tenant_runs = m(&|r| runs_per_conn(&r.tenant, r.with.exchanges));
        out.push(Goal {
            goal: "outbound: program run time per redirected connection, ours and the chained \
                   tenant's (kernel BPF statistics; information)"
                .into(),
            observed: format!(
                "ours {ours_without:.0} ns without the tenant, {ours_with:.0} ns with it; the \
                 tenant's {tenant:.0} ns ({tenant_runs:.2} runs per connection); medians of {} \
                 statistics' rounds",
                stats.len()
            ),
            met: None,
        });
    }
    out
}

/// The report's row, beside the agent's start to `/ready`.
pub fn probe_goal(p: &ProbeCost, start_ready_ms: Option<f64>) -> Goal {
    Goal {
        goal: "the kernel feature probes the agent runs at start (`Findings::probe()`; \
               information)"
            .into(),
        observed: format!(
            "{:.2} ms wall, {:.2} ms CPU per run (medians of {} runs; max {:.2} ms wall) for {} \
             features{}; kernel: {}",
            p.wall_ms.median,
            p.cpu_ms.median,
            p.runs,
            p.wall_ms.max,
            p.features,
            match start_ready_ms {
                Some(ms) => format!(", against {ms:.0} ms from the agent's start to /ready"),
                None => String::new(),
            },
            p.verdict
        ),
        met: None,
    }
}
