//! The results of a run and their renderings: `BENCHMARKS.md` (tables, ratios, goals, the
//! machine, the exact command), `bench/results.json` (everything, raw samples included) and
//! `bench/chart.svg` (the main comparisons, hand-drawn).

use std::{collections::BTreeMap, fmt::Write as _, path::Path};

use serde::{Deserialize, Serialize};

use crate::{
    measure::bpfstats::ProgStats,
    measure::cpu::CpuWindow,
    measure::stats::Summary,
    scenario::apiload::ApiLoadResults,
    scenario::podsetup::{Checkpoint, PodSetupResults},
    scenario::restart::RestartRound,
    scenario::traffic::{Mode, Sample, Scenario, TrafficConfig, TrafficResults},
    scenario::upgrade::{Change, PodRound, UpgradeRound},
};

/// The machine the run happened on.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Machine {
    pub uname: String,
    pub cpu: String,
    pub cores: usize,
    pub memory_mib: u64,
    /// `/proc/loadavg` at the start and at the end of the run: other work on the machine.
    pub loadavg_start: String,
    pub loadavg_end: String,
}

impl Machine {
    pub fn probe(loadavg_start: String) -> Self {
        let uname = std::process::Command::new("uname")
            .arg("-srvm")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find_map(|l| {
                l.strip_prefix("model name")
                    .and_then(|r| r.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            })
            .unwrap_or_default();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let memory_mib = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0)
            / 1024;
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        Self {
            uname,
            cpu,
            cores,
            memory_mib,
            loadavg_start,
            loadavg_end: loadavg(),
        }
    }
}

/// The first three fields of `/proc/loadavg`.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// One scenario × mode row.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrafficRow {
    pub scenario: Scenario,
    pub mode: Mode,
    /// `measured`, or why not.
    pub status: String,
    pub rate: Summary,
    pub p50_us: Summary,
    pub p99_us: Summary,
    pub gbps: Summary,
    pub failed: u64,
    /// Machine-wide busy CPU per exchange (µs), or per MiB for throughput scenarios.
    #[serde(default)]
    pub cpu_us: Summary,
    /// CPU of the processes taking part, per exchange (µs) or per MiB.
    #[serde(default)]
    pub own_cpu_us: Summary,
    /// Share of the window's CPU time the hypervisor stole (never counted as busy).
    #[serde(default)]
    pub steal_share: Summary,
    /// Per program of the agent: runs and ns per exchange (or per MiB), ns per run.
    #[serde(default)]
    pub bpf: BTreeMap<String, BpfRow>,
    pub samples: Vec<Sample>,
}

/// One program's cost in one scenario × mode.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct BpfRow {
    pub runs_per_unit: Summary,
    pub ns_per_unit: Summary,
    pub ns_per_run: Summary,
}

/// A goal of the issue, and whether this run met it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Goal {
    pub goal: String,
    pub observed: String,
    pub met: Option<bool>,
}

/// Everything one run produced.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Results {
    pub command: String,
    pub quick: bool,
    pub unix_time: u64,
    pub git_commit: String,
    pub duration_secs: f64,
    pub machine: Machine,
    pub traffic_config: TrafficConfig,
    pub traffic: Vec<TrafficRow>,
    pub pod_setup: PodSetupResults,
    pub restart: Vec<RestartRound>,
    /// Scenario 7 (absent from results written before it existed).
    #[serde(default)]
    pub api_load: Option<ApiLoadResults>,
    /// Scenario 8 (absent from results written before it existed).
    #[serde(default)]
    pub cri_sandbox: Option<crate::scenario::crisandbox::CriSandboxResults>,
    pub upgrade: Vec<UpgradeRound>,
    /// The image's size per architecture (issue 24), from `cargo xtask image`'s archives.
    #[serde(default)]
    pub image: Vec<crate::scenario::imagesize::ImageSize>,
    /// The agent's first start on the node (no pins, no registered pod) to `/ready`.
    #[serde(default)]
    pub start_empty: Option<crate::node::StartToReady>,
    pub goals: Vec<Goal>,
    /// How the floor's netns was checked to have no netfilter rule.
    #[serde(default)]
    pub floor_check: String,
    /// With `--baseline-bins`: the baseline agent (its version, the flags it was started
    /// without); the traffic rows then have the mode `ebpf-baseline`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline: Option<String>,
    /// Rounds of just the compared modes in the two connection scenarios, run after the main
    /// rounds with the BPF statistics off; the CPU goal rows are judged on their pairs.
    #[serde(default, alias = "baseline_pair_rounds")]
    pub pair_rounds: usize,
    /// The ebpf pod with and without another tenant's socket LB chained above it (issue 35;
    /// absent from results written before it existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chain: Option<crate::scenario::chain::ChainResults>,
    /// The kernel feature probes' cost (issue 38; absent from results written before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_cost: Option<crate::scenario::chain::ProbeCost>,
    /// Profiling notes and explanations, written by hand after a run is analysed; kept
    /// verbatim in BENCHMARKS.md.
    pub notes: Vec<String>,
}

/// Summarises raw traffic samples into rows.
pub fn traffic_rows(results: &TrafficResults) -> Vec<TrafficRow> {
    let mut rows = Vec::new();
    for (&scenario, modes) in results {
        for (&mode, samples) in modes {
            let samples = samples.clone();
            let status = if samples.is_some() {
                "measured"
            } else {
                "not yet implemented"
            };
            let s = samples.unwrap_or_default();
            let col = |f: fn(&Sample) -> f64| Summary::of(&s.iter().map(f).collect::<Vec<_>>());
            rows.push(TrafficRow {
                scenario,
                mode,
                status: status.into(),
                rate: col(|x| x.rate),
                p50_us: col(|x| x.p50_us),
                p99_us: col(|x| x.p99_us),
                gbps: col(|x| x.gbps),
                failed: s.iter().map(|x| x.failed).sum(),
                cpu_us: cpu_col(&s, scenario, |c| c.busy_ns),
                own_cpu_us: cpu_col(&s, scenario, |c| c.own_ns),
                steal_share: Summary::of(
                    &s.iter()
                        .filter_map(|x| x.cpu)
                        .map(|c| c.steal_ns / (c.busy_ns + c.steal_ns).max(1.0))
                        .collect::<Vec<_>>(),
                ),
                bpf: bpf_rows(&s, scenario),
                samples: s,
            });
        }
    }
    rows
}

/// A CPU figure per unit (exchange or MiB), in µs, over the samples that have one.
fn cpu_col(s: &[Sample], scenario: Scenario, f: fn(&CpuWindow) -> f64) -> Summary {
    Summary::of(
        &s.iter()
            .filter_map(|x| x.cpu.map(|c| f(&c) / x.units(scenario).max(1.0) / 1000.0))
            .collect::<Vec<_>>(),
    )
}

/// Per program: runs and ns per unit, ns per run.
fn bpf_rows(s: &[Sample], scenario: Scenario) -> BTreeMap<String, BpfRow> {
    // Rounds run without the kernel's statistics have no program figures.
    let s: Vec<&Sample> = s.iter().filter(|x| !x.without_bpf_stats).collect();
    let names: std::collections::BTreeSet<&String> = s.iter().flat_map(|x| x.bpf.keys()).collect();
    names
        .into_iter()
        .map(|name| {
            let per = |f: fn(&ProgStats, f64) -> f64| {
                Summary::of(
                    &s.iter()
                        .map(|x| {
                            let p = x.bpf.get(name).copied().unwrap_or_default();
                            f(&p, x.units(scenario).max(1.0))
                        })
                        .collect::<Vec<_>>(),
                )
            };
            (
                name.clone(),
                BpfRow {
                    runs_per_unit: per(|p, u| p.runs as f64 / u),
                    ns_per_unit: per(|p, u| p.ns as f64 / u),
                    ns_per_run: per(|p, _| p.ns as f64 / (p.runs.max(1)) as f64),
                },
            )
        })
        .collect()
}

fn row(rows: &[TrafficRow], scenario: Scenario, mode: Mode) -> Option<&TrafficRow> {
    rows.iter()
        .find(|r| r.scenario == scenario && r.mode == mode && r.status == "measured")
}

/// Rates swing too much between rounds on a shared machine to judge on: their rows are kept
/// as information; the goals are judged on CPU per connection ([`cpu_goals`]).
const INFO: &str = "(information: rates are not judged)";

/// Largest ratio of medians that still counts as "no regression" against the baseline build.
pub const BASELINE_MAX_RATIO: f64 = 1.02;

/// Whether a paired comparison of `a` with `b` uses only the rounds measured without the
/// kernel's BPF statistics: when both rows have such rounds (the statistics read the clock
/// around every program run, which only the modes with programs pay); otherwise every round.
fn statistics_off(a: &TrafficRow, b: &TrafficRow) -> bool {
    let quiet = |r: &TrafficRow| r.samples.iter().any(|x| x.without_bpf_stats);
    quiet(a) && quiet(b)
}

/// The samples of `r` a comparison uses ([`statistics_off`]).
fn judged(r: &TrafficRow, off: bool) -> impl Iterator<Item = &Sample> {
    r.samples
        .iter()
        .filter(move |x| !off || x.without_bpf_stats)
}

/// `f` of a sample's CPU window per unit of `scenario` (ns); none without a window or units.
fn cpu_per_unit(x: &Sample, scenario: Scenario, f: fn(&CpuWindow) -> f64) -> Option<f64> {
    let units = x.units(scenario);
    x.cpu.filter(|_| units > 0.0).map(|c| f(&c) / units)
}

/// Per-round ratios of `a`'s CPU per connection to `b`'s in their scenario, machine-wide busy
/// time and own processes' time, over the rounds [`judged`]. The two modes run back to back in
/// every round, so each pair saw the same state of the shared machine: the spread between
/// rounds (±10 % here) cancels out of a pair, and the median of the pairs is the comparison.
pub fn paired_ratios(a: &TrafficRow, b: &TrafficRow) -> (Vec<f64>, Vec<f64>) {
    let (mut busy, mut own) = (Vec::new(), Vec::new());
    for x in judged(a, statistics_off(a, b)) {
        let Some(y) = b.samples.iter().find(|y| y.round == x.round) else {
            continue;
        };
        let ratio = |f: fn(&CpuWindow) -> f64| {
            Some(cpu_per_unit(x, a.scenario, f)? / cpu_per_unit(y, b.scenario, f)?)
        };
        busy.extend(ratio(|c| c.busy_ns));
        own.extend(ratio(|c| c.own_ns));
    }
    (busy, own)
}

/// What a scenario's CPU figures are per, in goal rows: a connection (µs), or a GiB moved
/// through the proxy (ms).
fn per_unit_text(scenario: Scenario, us_per_unit: f64) -> String {
    match scenario.kind() {
        crate::workload::load::Kind::Rr => format!("{us_per_unit:.1} µs/conn"),
        _ => format!("{:.1} ms/GiB", us_per_unit * 1024.0 / 1000.0),
    }
}

/// The median over the [`judged`] rounds of `r`'s CPU per unit, own processes (`own`) or
/// machine-wide busy time, in µs.
fn judged_cpu_us(r: &TrafficRow, quiet: bool, own: bool) -> f64 {
    let f: fn(&CpuWindow) -> f64 = if own { |c| c.own_ns } else { |c| c.busy_ns };
    let v: Vec<f64> = judged(r, quiet)
        .filter_map(|x| cpu_per_unit(x, r.scenario, f))
        .map(|ns| ns / 1000.0)
        .collect();
    crate::measure::stats::percentile(&v, 0.5)
}

/// A goal row judged on the median of the per-round pairs of `a` against `b`
/// ([`paired_ratios`]) of the CPU the processes taking part used (their own user + system
/// time: what the other tenants of a shared machine do not move): met when it is at most
/// `limit`. The machine-wide busy figure is shown beside it. `more` is appended.
fn paired_goal(goal: String, a: &TrafficRow, b: &TrafficRow, limit: f64, more: &str) -> Goal {
    let (busy, own) = paired_ratios(a, b);
    if own.is_empty() {
        return Goal {
            goal,
            observed: "no round measured both modes".into(),
            met: None,
        };
    }
    let quiet = statistics_off(a, b);
    let (median, interval) = median_with_interval(&own);
    let (busy_median, _) = median_with_interval(&busy);
    let cheaper = own.iter().filter(|r| **r < 1.0).count();
    Goal {
        goal,
        observed: format!(
            "paired median {median:.3} × ({}; {} cheaper in {cheaper} of {} rounds{}; the \
             processes' own CPU); machine-wide busy {busy_median:.3} ×; medians {} vs {}{more}",
            match interval {
                Some((lo, hi)) => format!("95 % interval {lo:.3}–{hi:.3}"),
                None => "too few rounds for an interval".into(),
            },
            a.mode.label(),
            own.len(),
            if quiet { ", BPF statistics off" } else { "" },
            per_unit_text(a.scenario, judged_cpu_us(a, quiet, true)),
            per_unit_text(b.scenario, judged_cpu_us(b, quiet, true)),
        ),
        met: Some(median <= limit),
    }
}

/// A goal row for a path where nothing is redirected (an unmeshed pod under the shared
/// attachment, whose connections our programs only look at; the bytes of a long-lived
/// connection after its set-up, which no program sees): `a` against `b`, judged on the
/// kernel's own count of our programs' run time per unit (the statistics' rounds) against
/// `b`'s CPU per unit, because on such a path the paired CPU ratio is too coarse for the
/// limit (its 95 % interval is 10–25 % wide on this shared machine against a limit of 1 %).
/// Met when that share is within `limit` and the paired CPU ratio does not exceed `limit`
/// beyond its interval (its lower end, or with too few rounds for one its smallest value, is
/// at most `limit`): a cost the counters cannot see would show there once it is larger than
/// the spread. `more` is appended.
fn counted_goal(goal: String, a: &TrafficRow, b: &TrafficRow, limit: f64, more: &str) -> Goal {
    let mut g = paired_goal(goal, a, b, limit, more);
    let (_, own) = paired_ratios(a, b);
    if own.is_empty() {
        return g;
    }
    // Our programs' time per unit, each round with the statistics on.
    let counted: Vec<f64> = a
        .samples
        .iter()
        .filter(|x| !x.without_bpf_stats)
        .map(|x| x.bpf.values().map(|p| p.ns as f64).sum::<f64>() / x.units(a.scenario).max(1.0))
        .collect();
    if counted.is_empty() {
        g.observed = format!("no round counted the programs' run time; {}", g.observed);
        g.met = None;
        return g;
    }
    let program_ns = crate::measure::stats::percentile(&counted, 0.5);
    let floor_ns = judged_cpu_us(b, statistics_off(a, b), true) * 1000.0;
    let ratio = 1.0 + program_ns / floor_ns.max(1.0);
    let (_, interval) = median_with_interval(&own);
    let lowest = match interval {
        Some((lo, _)) => lo,
        None => own.iter().copied().fold(f64::INFINITY, f64::min),
    };
    let within = lowest <= limit;
    g.observed = format!(
        "{ratio:.4} × counted: our programs ran {} per {} against the floor's {} of CPU \
         ({} rounds with the kernel's statistics); the paired CPU ratio {} the limit beyond \
         its interval: {}",
        match a.scenario.kind() {
            crate::workload::load::Kind::Rr => format!("{program_ns:.0} ns"),
            _ => format!("{:.1} µs", program_ns * 1024.0 / 1000.0),
        },
        match a.scenario.kind() {
            crate::workload::load::Kind::Rr => "connection",
            _ => "GiB",
        },
        per_unit_text(b.scenario, floor_ns / 1000.0),
        counted.len(),
        if within { "does not exceed" } else { "exceeds" },
        g.observed,
    );
    g.met = Some(ratio <= limit && within);
    g
}

/// Our share of iptables-nft's overhead, round by round: `e`'s, `d`'s (the floor) and `n`'s
/// (iptables-nft) CPU per unit, the three measured in the same rounds.
pub struct OverheadShare {
    /// Per round: e / d - 1 and n / d - 1 (the processes' own CPU).
    pub ours: Vec<f64>,
    pub theirs: Vec<f64>,
    /// The same, machine-wide busy time.
    pub ours_busy: Vec<f64>,
    pub theirs_busy: Vec<f64>,
    /// Whether only rounds without the BPF statistics were used.
    pub quiet: bool,
}

impl OverheadShare {
    pub fn of(e: &TrafficRow, d: &TrafficRow, n: &TrafficRow) -> Self {
        let quiet = statistics_off(e, d) && statistics_off(n, d);
        let mut out = Self {
            ours: Vec::new(),
            theirs: Vec::new(),
            ours_busy: Vec::new(),
            theirs_busy: Vec::new(),
            quiet,
        };
        let find = |r: &'_ TrafficRow, round: usize| -> Option<Sample> {
            r.samples.iter().find(|y| y.round == round).cloned()
        };
        for x in judged(e, quiet) {
            let (Some(y), Some(z)) = (find(d, x.round), find(n, x.round)) else {
                continue;
            };
            let over = |a: &Sample, ra: &TrafficRow, f: fn(&CpuWindow) -> f64| {
                Some(cpu_per_unit(a, ra.scenario, f)? / cpu_per_unit(&y, d.scenario, f)? - 1.0)
            };
            if let (Some(o), Some(t)) = (over(x, e, |c| c.own_ns), over(&z, n, |c| c.own_ns)) {
                out.ours.push(o);
                out.theirs.push(t);
            }
            if let (Some(o), Some(t)) = (over(x, e, |c| c.busy_ns), over(&z, n, |c| c.busy_ns)) {
                out.ours_busy.push(o);
                out.theirs_busy.push(t);
            }
        }
        out
    }

    /// The median of our overhead over the median of theirs (own CPU; busy time), if theirs
    /// is above the floor.
    pub fn share(&self) -> (Option<f64>, Option<f64>) {
        let ratio = |o: &[f64], t: &[f64]| {
            let (mo, mt) = (
                crate::measure::stats::percentile(o, 0.5),
                crate::measure::stats::percentile(t, 0.5),
            );
            (!o.is_empty() && mt > 0.0).then_some(mo / mt)
        };
        (
            ratio(&self.ours, &self.theirs),
            ratio(&self.ours_busy, &self.theirs_busy),
        )
    }
}

/// The limit on our CPU per connection over the floor, as a share of iptables-nft's.
pub const OVERHEAD_SHARE_MAX: f64 = 0.25;
/// The limit on our CPU per connection against the floor, every guarantee kept.
pub const FLOOR_MAX_RATIO: f64 = 1.03;

/// The row "our CPU over the floor ≤ `limit` × iptables-nft's over the floor", judged on the
/// paired medians of the two overheads over the same rounds ([`OverheadShare`]).
fn overhead_share_goal(
    goal: String,
    e: &TrafficRow,
    d: &TrafficRow,
    n: &TrafficRow,
    limit: f64,
) -> Goal {
    let s = OverheadShare::of(e, d, n);
    if s.ours.is_empty() {
        return Goal {
            goal,
            observed: "no round measured the three modes".into(),
            met: None,
        };
    }
    let pct = |v: &[f64]| 100.0 * crate::measure::stats::percentile(v, 0.5);
    let (share, share_busy) = s.share();
    let per_round: Vec<f64> = s
        .ours
        .iter()
        .zip(&s.theirs)
        .filter(|(_, t)| **t > 0.0)
        .map(|(o, t)| o / t)
        .collect();
    let within = per_round.iter().filter(|r| **r <= limit).count();
    let rounds = s.ours.len();
    let head = match share {
        Some(v) => format!("{v:.2} × iptables-nft's overhead"),
        None => "iptables-nft not above the floor: no share".into(),
    };
    Goal {
        goal,
        observed: format!(
            "{head} (paired medians over {rounds} rounds{}, the processes' own CPU: ebpf \
             {:+.1} %, iptables-nft {:+.1} % over the floor); per round the share was at most \
             {limit:.2} in {within} of the {} rounds where iptables-nft was above the floor; \
             machine-wide busy: {}",
            if s.quiet { ", BPF statistics off" } else { "" },
            pct(&s.ours),
            pct(&s.theirs),
            per_round.len(),
            match share_busy {
                Some(v) => format!(
                    "{v:.2} ({:+.1} % vs {:+.1} %)",
                    pct(&s.ours_busy),
                    pct(&s.theirs_busy)
                ),
                None => "no share".into(),
            },
        ),
        met: share.map(|v| v <= limit),
    }
}

/// The median of `values` and its distribution-free 95 % confidence interval (order
/// statistics of a sign test: the `k`-th smallest and largest values, `k` the largest with
/// P(Binomial(n, ½) < k) ≤ 2.5 %); no interval below 6 values.
pub fn median_with_interval(values: &[f64]) -> (f64, Option<(f64, f64)>) {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let median = crate::measure::stats::percentile(&v, 0.5);
    let n = v.len();
    // P(X <= i) for X ~ Binomial(n, 1/2).
    let mut below = 0.0;
    let mut k = 0;
    let mut choose = 1.0_f64;
    for i in 0..n {
        below += choose / 2f64.powi(n as i32);
        if below > 0.025 {
            break;
        }
        k = i + 1;
        choose = choose * (n - i) as f64 / (i + 1) as f64;
    }
    let interval = (n >= 6 && k >= 1).then(|| (v[k - 1], v[n - k]));
    (median, interval)
}

/// With an `ebpf-baseline` mode in the run (`--baseline-bins`), one row per direction: CPU
/// per redirected connection of ebpf against the baseline build's, judged on the median of
/// the per-round pairs ([`paired_ratios`]) against [`BASELINE_MAX_RATIO`]. None without it.
pub fn baseline_goals(rows: &[TrafficRow]) -> Vec<Goal> {
    if !rows.iter().any(|r| r.mode == Mode::EbpfBaseline) {
        return Vec::new();
    }
    let mut out = Vec::new();
    for (scenario, dir) in [
        (Scenario::OutboundConnections, "outbound"),
        (Scenario::InboundConnections, "inbound"),
    ] {
        let goal = format!(
            "{dir}: ebpf CPU per redirected connection ≤ {BASELINE_MAX_RATIO:.2} × ebpf-baseline \
             (median of the per-round pairs, the two modes run back to back)"
        );
        let e = row(rows, scenario, Mode::Ebpf).filter(|r| r.cpu_us.median > 0.0);
        let b = row(rows, scenario, Mode::EbpfBaseline).filter(|r| r.cpu_us.median > 0.0);
        let (Some(e), Some(b)) = (e, b) else {
            out.push(Goal {
                goal,
                observed: "not measured".into(),
                met: None,
            });
            continue;
        };
        let ns = |r: &TrafficRow| r.bpf.values().map(|p| p.ns_per_unit.median).sum::<f64>();
        let other_runs: u64 = e
            .samples
            .iter()
            .chain(&b.samples)
            .filter_map(|x| x.other_agent_runs)
            .sum();
        out.push(paired_goal(
            goal,
            e,
            b,
            BASELINE_MAX_RATIO,
            &format!(
                "; program time {:.0} vs {:.0} ns/conn; the other agent's programs ran \
                 {other_runs} times in the windows with statistics",
                ns(e),
                ns(b),
            ),
        ));
    }
    out
}

/// The goals judged on CPU per connection (machine-wide busy time, medians of one run), and
/// the unmeshed pods' overhead.
pub fn cpu_goals(rows: &[TrafficRow]) -> Vec<Goal> {
    let mut out = Vec::new();
    for (scenario, dir) in [
        (Scenario::OutboundConnections, "outbound"),
        (Scenario::InboundConnections, "inbound"),
    ] {
        let e = row(rows, scenario, Mode::Ebpf).filter(|r| r.cpu_us.median > 0.0);
        let d = row(rows, scenario, Mode::Direct).filter(|r| r.cpu_us.median > 0.0);
        let n = row(rows, scenario, Mode::IptablesNft).filter(|r| r.cpu_us.median > 0.0);
        let goal = format!(
            "{dir}: our CPU per connection over the floor ≤ {OVERHEAD_SHARE_MAX:.2} × \
             iptables-nft's over the floor (the three modes paired per round)"
        );
        out.push(match (e, d, n) {
            (Some(e), Some(d), Some(n)) => overhead_share_goal(goal, e, d, n, OVERHEAD_SHARE_MAX),
            _ => Goal {
                goal,
                observed: "not measured".into(),
                met: None,
            },
        });
        let goal = format!(
            "{dir}: CPU per redirected connection ≤ {FLOOR_MAX_RATIO:.2} × the floor (direct), \
             every guarantee kept"
        );
        out.push(match (e, d) {
            (Some(e), Some(d)) => paired_goal(goal, e, d, FLOOR_MAX_RATIO, ""),
            _ => Goal {
                goal,
                observed: "not measured".into(),
                met: None,
            },
        });
        let plain = row(rows, scenario, Mode::Unmeshed).filter(|r| r.cpu_us.median > 0.0);
        let shared = row(rows, scenario, Mode::UnmeshedShared).filter(|r| r.cpu_us.median > 0.0);
        let goal = format!(
            "{dir}: unmeshed pod under the shared attachment ≤ 1.01 × an unmeshed pod no program \
             sees (counted: our programs' run time against its CPU)"
        );
        match (plain, shared) {
            (Some(p), Some(s)) => {
                let runs: f64 = s.bpf.values().map(|b| b.runs_per_unit.median).sum();
                out.push(counted_goal(
                    goal,
                    s,
                    p,
                    1.01,
                    &format!("; {runs:.1} program runs per connection"),
                ));
            }
            _ => out.push(Goal {
                goal,
                observed: "not measured".into(),
                met: None,
            }),
        }
        let goal = format!(
            "{dir}: unmeshed pod with per-pod attachment, meshed pods running: 0 overhead \
             (no program of the agent runs for its connections)"
        );
        match plain {
            Some(p) => {
                // Run counts exist only in the rounds measured with the statistics on.
                let counted = || p.samples.iter().filter(|x| !x.without_bpf_stats);
                let runs: u64 = counted().flat_map(|x| x.bpf.values()).map(|b| b.runs).sum();
                let conns: u64 = counted().map(|x| x.exchanges).sum();
                out.push(Goal {
                    goal,
                    observed: format!(
                        "{runs} program runs over {conns} connections ({:.1} µs/conn busy)",
                        p.cpu_us.median
                    ),
                    met: Some(runs == 0),
                });
            }
            None => out.push(Goal {
                goal,
                observed: "not measured".into(),
                met: None,
            }),
        }
    }
    out
}

/// The limit on ebpf's CPU per GiB moved over long-lived connections against the floor.
pub const GIB_MAX_RATIO: f64 = 1.01;

/// The pairs of samples of `a` and `b` measured in the same round, over the rounds
/// [`judged`] for the two.
fn pairs<'a>(a: &'a TrafficRow, b: &'a TrafficRow) -> Vec<(&'a Sample, &'a Sample)> {
    judged(a, statistics_off(a, b))
        .filter_map(|x| Some((x, b.samples.iter().find(|y| y.round == x.round)?)))
        .collect()
}

/// The rows of the long-lived connections (bulk download, and 1 KiB request/response over
/// persistent connections): CPU per GiB moved through the proxy, ebpf against the floor
/// (judged: ≤ [`GIB_MAX_RATIO`] ×), with iptables-nft's ratio and its cost per packet beside
/// it; and the persistent connections' latency, p50 and p99, each mode against the floor
/// paired per round (information).
pub fn long_lived_goals(rows: &[TrafficRow]) -> Vec<Goal> {
    let mut out = Vec::new();
    for scenario in Scenario::LONG_LIVED {
        let dir = if scenario.inbound() {
            "inbound"
        } else {
            "outbound"
        };
        let what = match scenario.kind() {
            crate::workload::load::Kind::Bulk => "bulk download",
            _ => "1 KiB request/response",
        };
        let goal = format!(
            "{dir}, long-lived connections ({what}): CPU per GiB moved through the proxy, ebpf \
             ≤ {GIB_MAX_RATIO:.2} × the floor (direct; counted: our programs' run time against \
             the floor's CPU)"
        );
        let e = row(rows, scenario, Mode::Ebpf).filter(|r| r.cpu_us.median > 0.0);
        let d = row(rows, scenario, Mode::Direct).filter(|r| r.cpu_us.median > 0.0);
        let (Some(e), Some(d)) = (e, d) else {
            out.push(Goal {
                goal,
                observed: "not measured".into(),
                met: None,
            });
            continue;
        };
        let mut more = String::new();
        if let Some(n) = row(rows, scenario, Mode::IptablesNft).filter(|r| r.cpu_us.median > 0.0) {
            let (_, own) = paired_ratios(n, d);
            // Per round: iptables-nft's CPU over the floor's, per packet its pod's netns
            // received, and those packets per MiB.
            let mut per_packet = Vec::new();
            let mut packets_per_mib = Vec::new();
            for (x, y) in pairs(n, d) {
                let (Some(cx), Some(cy), Some(p)) = (
                    cpu_per_unit(x, scenario, |c| c.own_ns),
                    cpu_per_unit(y, scenario, |c| c.own_ns),
                    x.packets,
                ) else {
                    continue;
                };
                let mib = x.units(scenario);
                if p == 0 || mib <= 0.0 {
                    continue;
                }
                let per_mib = p as f64 / mib;
                packets_per_mib.push(per_mib);
                per_packet.push((cx - cy) / per_mib);
            }
            let (m, interval) = median_with_interval(&own);
            let _ = write!(
                more,
                "; iptables-nft {m:.3} × the floor ({}){}",
                match interval {
                    Some((lo, hi)) => format!("95 % interval {lo:.3}–{hi:.3}"),
                    None => "too few rounds for an interval".into(),
                },
                match per_packet.is_empty() {
                    true => String::new(),
                    false => format!(
                        ", {:.0} ns of CPU per packet over the floor ({:.0} packets per MiB \
                         received in its pod's netns)",
                        crate::measure::stats::percentile(&per_packet, 0.5),
                        crate::measure::stats::percentile(&packets_per_mib, 0.5)
                    ),
                }
            );
        }
        let bpf: f64 = e.bpf.values().map(|b| b.runs_per_unit.median).sum();
        let _ = write!(
            more,
            "; the agent's programs ran {:.2} times per GiB",
            bpf * 1024.0
        );
        out.push(counted_goal(goal, e, d, GIB_MAX_RATIO, &more));
    }
    for scenario in [Scenario::OutboundPersistent, Scenario::InboundPersistent] {
        let dir = if scenario.inbound() {
            "inbound"
        } else {
            "outbound"
        };
        let Some(d) = row(rows, scenario, Mode::Direct) else {
            continue;
        };
        for mode in [Mode::Ebpf, Mode::IptablesNft] {
            let Some(a) = row(rows, scenario, mode) else {
                continue;
            };
            let goal = format!(
                "{dir} latency of 1 KiB request/response over persistent connections, {} \
                 against the floor, p50 and p99 paired per round (information)",
                mode.label()
            );
            let ps = pairs(a, d);
            let ratio = |f: fn(&Sample) -> f64| -> Vec<f64> {
                ps.iter()
                    .filter(|(x, y)| f(y) > 0.0 && f(x) > 0.0)
                    .map(|(x, y)| f(x) / f(y))
                    .collect()
            };
            let show = |v: &[f64]| {
                let (m, interval) = median_with_interval(v);
                match interval {
                    Some((lo, hi)) => format!(
                        "{m:.3} × (95 % interval {lo:.3}–{hi:.3}: {})",
                        if hi < 1.0 {
                            "lower"
                        } else if lo > 1.0 {
                            "higher"
                        } else {
                            "within noise"
                        }
                    ),
                    None => format!("{m:.3} × (too few rounds for an interval)"),
                }
            };
            let (p50, p99) = (ratio(|x| x.p50_us), ratio(|x| x.p99_us));
            out.push(Goal {
                goal,
                observed: format!(
                    "p50 {}, p99 {} over {} rounds; medians p50 {:.0} vs {:.0} µs, p99 {:.0} \
                     vs {:.0} µs",
                    show(&p50),
                    show(&p99),
                    p50.len(),
                    a.p50_us.median,
                    d.p50_us.median,
                    a.p99_us.median,
                    d.p99_us.median
                ),
                met: None,
            });
        }
    }
    out
}

/// Evaluates the issue's goals.
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

/// How CPU per connection is measured, the floor, and the eBPF programs' share.
pub fn cpu_markdown(r: &Results) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "### CPU per connection: how it is measured\n");
    let _ = writeln!(
        md,
        "**own CPU** (what the goals judge): user + system time (`/proc/<pid>/stat`, the \
         processes' rusage) of the processes taking part (load generator, proxy, the pod's \
         server, the upstream server) over the load's measured window (the load generator marks \
         both edges), divided by the exchanges completed in it; per MiB moved for the long-lived \
         connections. Other tenants' work is left out; this kernel accounts by ticks, so softirq \
         work (the network stack, netfilter) is in it when it ran on our processes' time, which \
         is the usual case on veth and loopback. **CPU µs/conn** (information): machine-wide \
         busy time from `/proc/stat` (user + nice + system + irq + softirq, all CPUs; idle, \
         iowait and steal are not counted) over the same window: it includes every other tenant \
         of the machine. Both have a clock tick's resolution (10 ms per CPU). Medians over the \
         rounds, min–max in parentheses; modes alternate.\n"
    );
    let _ = writeln!(
        md,
        "**The floor** is `direct`: its pod's netns never had a netfilter rule ({}). The \
         iptables modes pay twice on the same node: their REDIRECT rules, and conntrack, which is \
         active in a netns as soon as a `nat` rule exists there, so every packet of the pod, its \
         proxy's upstream leg included, goes through connection tracking; the eBPF mode adds no \
         netfilter rule anywhere. The bridge between the pods lives in a node netns without \
         rules either. `unmeshed` is a pod the agent does not redirect, the app talking to the \
         other side directly (no proxy), whose cgroup carries no program (per-pod attachment: \
         what a pod sees on a node with the agent); `unmeshed-shared` is the same pod with its \
         cgroup below the agent's shared attachment, so every program runs for its sockets and \
         finds no pod config.\n",
        if r.floor_check.is_empty() {
            "not checked in this run"
        } else {
            r.floor_check.as_str()
        }
    );
    let _ = writeln!(md, "### The agent's eBPF programs, per connection\n");
    let _ = writeln!(
        md,
        "From the kernel's BPF statistics (`BPF_ENABLE_STATS(BPF_STATS_RUN_TIME)`, held for the \
         traffic scenarios only) over the same windows, for the agent's own programs (by id; a \
         tail call's time counts in its caller: `l5d_sk_pod`, the per-pod stub, carries \
         `sk_lookup`). Runs and ns per connection, ns per run; medians and ranges over the \
         rounds (results.json has the throughput scenarios too). The time is the programs' own, \
         measured by the kernel around each run: not the hooks' dispatch, nor the socket storage \
         the kernel frees with each socket.\n"
    );
    let _ = writeln!(
        md,
        "| scenario | mode | program | runs/conn | ns/conn | ns/run |\n|---|---|---|---|---|---|"
    );
    for x in &r.traffic {
        let total: f64 = x.bpf.values().map(|b| b.ns_per_unit.median).sum();
        // Per MiB, a few runs per long connection say nothing: connection scenarios only.
        if x.status != "measured"
            || x.scenario.kind() != crate::workload::load::Kind::Rr
            || (!matches!(x.mode, Mode::Ebpf | Mode::EbpfBaseline) && total == 0.0)
        {
            continue;
        }
        for (name, b) in &x.bpf {
            if b.runs_per_unit.max == 0.0 {
                continue;
            }
            let _ = writeln!(
                md,
                "| {} | {} | `{name}` | {} | {} | {} |",
                x.scenario.label(),
                x.mode.label(),
                range(&b.runs_per_unit, 2),
                range(&b.ns_per_unit, 0),
                range(&b.ns_per_run, 0)
            );
        }
        let _ = writeln!(
            md,
            "| {} | {} | all | {:.2} | {total:.0} | |",
            x.scenario.label(),
            x.mode.label(),
            x.bpf.values().map(|b| b.runs_per_unit.median).sum::<f64>()
        );
    }
    let _ = writeln!(md);
    md
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
        // The issue's bound on the plugin is its start-up (above): the whole ADD, the agent's
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

/// Section 7 of BENCHMARKS.md: the agent replaced under load.
fn upgrade_section(md: &mut String, r: &Results) {
    if r.upgrade.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "\n## 9. Agent upgrade, rollback and rollout under load\n"
    );
    let _ = writeln!(
        md,
        "A node of its own with two meshed pods (one attached per pod, one through the shared \
         attachment), each with its proxy and an app server; in each pod clients dial an upstream \
         (outbound) and clients in a peer dial the pod's app (inbound), {} threads each, short \
         connections, while the agent is replaced. The state starts as the previous agent version \
         left it: only that version's eBPF object exists (`tests/fixtures/ebpf-layout-1.o`), so its \
         part is a replay shared with the layout test: the object loaded, its untyped maps pinned \
         without a layout record (layout 1), its programs attached to both pods with pinned links, \
         each pod's entries and registry record written as it did on ADD. Then: **upgrade**, the \
         current agent binary starts on that state (maps migrated, links swapped with \
         `BPF_LINK_UPDATE`); **rollback**, after SIGTERM the state is made to look like a newer \
         layout that declares this agent able to read it (layout record {}, the pod config map \
         re-pinned with another capacity; no newer agent exists), and the agent starts on it; \
         **rollout**, SIGTERM and a new process of the same version (the agent runs without \
         `--install`, so the rollout-or-uninstall decision about the CNI configs is not made); \
         **control**, SIGTERM, the pods' link pins removed (links detached), the agent started: \
         it re-attaches them on its next reconcile pass, as an agent replacing programs without \
         `BPF_LINK_UPDATE` would leave pods in between. A pod is redirected throughout when its \
         proxy accepted at least as many connections, each way, as its clients completed, answered \
         `SO_ORIGINAL_DST` for each, and dropped none for want of one. Each pod's inbound link \
         runs a stub of its own that reaches whichever shared program the running agent \
         installed: the upgrade from layout 1 (no stubs) gives every pod one, the later changes \
         keep them, so there one link per pod is not swapped, by design.\n",
        r.upgrade.first().map_or(0, |u| u.concurrency),
        r.upgrade
            .iter()
            .find(|u| u.change == Change::Rollback)
            .map_or(0, |u| u.from_layout),
    );
    let _ = writeln!(
        md,
        "| change | layout | ok | failed | in the window (ok / failed) | agent down ms | links swapped | swap ms (first → last link, ± watcher pass) | pods redirected throughout |\n|---|---|---|---|---|---|---|---|---|"
    );
    for u in &r.upgrade {
        let redirected: Vec<String> = u
            .pods
            .iter()
            .map(|p: &PodRound| {
                format!(
                    "{} {} (out {}/{}, in {}/{} via proxy)",
                    p.pod,
                    if p.redirected_throughout() {
                        "yes"
                    } else {
                        "**no**"
                    },
                    p.proxy_out,
                    p.out_ok,
                    p.proxy_in,
                    p.in_ok
                )
            })
            .collect();
        let _ = writeln!(
            md,
            "| {} | {} → {} | {} | {} | {} / {} | {:.0} | {} | {} | {} |",
            u.change.label(),
            u.from_layout,
            u.to_layout,
            u.ok,
            u.failed,
            u.window_ok,
            u.window_failed,
            u.down_ms,
            match u.change {
                Change::Control =>
                    format!("re-attached after {:.0} ms", u.relinked_ms.unwrap_or(0.0)),
                _ => format!("{}/{}", u.links_swapped, u.links),
            },
            u.swap_ms.map_or("–".into(), |m| format!(
                "{m:.1} ± {:.2}",
                u.swap_resolution_ms
            )),
            redirected.join("; ")
        );
    }
    let problems: Vec<String> = r
        .upgrade
        .iter()
        .flat_map(|u| {
            u.problems
                .iter()
                .map(move |p| format!("{}: {p}", u.change.label()))
        })
        .collect();
    if !problems.is_empty() {
        let _ = writeln!(
            md,
            "\nState checks that did not hold: {}.",
            problems.join("; ")
        );
    }
}

/// A per-MiB figure in µs as ms per GiB.
fn per_gib(s: &Summary) -> Summary {
    let f = 1024.0 / 1000.0;
    Summary {
        median: s.median * f,
        min: s.min * f,
        max: s.max * f,
    }
}

/// The median packets received in the pod's netns per MiB of a long-lived scenario's row.
fn packets_per_mib(x: &TrafficRow) -> String {
    let v: Vec<f64> = x
        .samples
        .iter()
        .filter_map(|s| Some(s.packets? as f64 / s.units(x.scenario)).filter(|_| s.bytes > 0))
        .collect();
    match v.is_empty() {
        true => "–".into(),
        false => format!("{:.0}", crate::measure::stats::percentile(&v, 0.5)),
    }
}

fn range(s: &Summary, prec: usize) -> String {
    format!("{:.p$} ({:.p$}–{:.p$})", s.median, s.min, s.max, p = prec)
}

/// Renders BENCHMARKS.md.
pub fn markdown(r: &Results) -> String {
    let mut md = String::new();
    let c = &r.traffic_config;
    let _ = writeln!(
        md,
        "# Benchmarks: eBPF redirection vs Linkerd's iptables rules vs no interception\n"
    );
    let _ = writeln!(
        md,
        "Generated by `{}` ({}run, {:.0} s, commit `{}`). Numbers are medians over {} rounds \
         with the min–max in parentheses; modes run back to back, alternating (the order rotates \
         every round). Raw samples: `bench/results.json`; chart: `bench/chart.svg`.\n",
        r.command,
        if r.quick { "quick " } else { "full " },
        r.duration_secs,
        r.git_commit,
        c.rounds
    );
    let m = &r.machine;
    let _ = writeln!(
        md,
        "**Machine**: `{}`; {} ({} cores), {} MiB RAM. Load average (1, 5, 15 min) at the start: {}, \
         at the end: {} (the machine is shared: other work runs alongside).\n",
        m.uname, m.cpu, m.cores, m.memory_mib, m.loadavg_start, m.loadavg_end
    );
    let _ = writeln!(md, "![main comparisons](bench/chart.svg)\n");

    let _ = writeln!(md, "## Goals\n");
    let _ = writeln!(md, "| goal | observed | met |\n|---|---|---|");
    for g in &r.goals {
        let met = match g.met {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "n/a",
        };
        let _ = writeln!(md, "| {} | {} | {met} |", g.goal, g.observed);
    }
    if !r.notes.is_empty() {
        let _ = writeln!(md, "\n## Analysis\n");
        for n in &r.notes {
            let _ = writeln!(md, "{n}\n");
        }
    }

    let _ = writeln!(md, "\n## 1–3. Traffic through the proxy\n");
    let _ = writeln!(
        md,
        "Connections: {} concurrent clients, each looping connect, {}-byte request, response, close, \
         for {} ms (after {} ms warm-up); latency is connect-to-close of one exchange. Throughput: {} \
         long connections downloading for {} ms. Persistent request/response: {} long connections, \
         each looping a {}-byte request and its response for {} ms; latency is request written to \
         response read, CPU per GiB moved both ways. Packets/MiB: packets received by the \
         interfaces of the meshed pod's netns (lo and its veth), what netfilter's hooks see there. \
         The ratio column is the median against `direct`.\n",
        c.concurrency,
        crate::workload::server::REQ_LEN,
        c.rr_ms,
        c.warmup_ms,
        c.streams,
        c.bulk_ms,
        c.persistent_conns,
        crate::workload::server::MSG_LEN,
        c.persistent_ms
    );
    for scenario in Scenario::ALL {
        let rows: Vec<&TrafficRow> = r
            .traffic
            .iter()
            .filter(|x| x.scenario == scenario)
            .collect();
        let direct = rows
            .iter()
            .copied()
            .find(|x| x.mode == Mode::Direct && x.status == "measured");
        let _ = writeln!(md, "### {}\n", scenario.label());
        if scenario.kind() == crate::workload::load::Kind::Rr {
            let _ = writeln!(
                md,
                "| mode | CPU µs/conn | CPU × direct | own CPU µs/conn | conn/s | × direct | p50 µs | p99 µs | failed |\n|---|---|---|---|---|---|---|---|---|"
            );
            for x in &rows {
                if x.status != "measured" {
                    let _ = writeln!(md, "| {} | {} | | | | | | | |", x.mode.label(), x.status);
                    continue;
                }
                let ratio = direct
                    .map(|d| format!("{:.3}", x.rate.median / d.rate.median))
                    .unwrap_or_default();
                let cpu_ratio = direct
                    .filter(|d| d.cpu_us.median > 0.0)
                    .map(|d| format!("{:.3}", x.cpu_us.median / d.cpu_us.median))
                    .unwrap_or_default();
                let _ = writeln!(
                    md,
                    "| {} | {} | {cpu_ratio} | {} | {} | {ratio} | {} | {} | {} |",
                    x.mode.label(),
                    range(&x.cpu_us, 1),
                    range(&x.own_cpu_us, 1),
                    range(&x.rate, 0),
                    range(&x.p50_us, 0),
                    range(&x.p99_us, 0),
                    x.failed
                );
            }
        } else if scenario.kind() == crate::workload::load::Kind::Persistent {
            let _ = writeln!(
                md,
                "| mode | own CPU ms/GiB | × direct | CPU ms/GiB | exchanges/s | p50 µs | p99 µs | packets/MiB | failed |\n|---|---|---|---|---|---|---|---|---|"
            );
            for x in &rows {
                if x.status != "measured" {
                    let _ = writeln!(md, "| {} | {} | | | | | | | |", x.mode.label(), x.status);
                    continue;
                }
                let cpu_ratio = direct
                    .filter(|d| d.own_cpu_us.median > 0.0)
                    .map(|d| format!("{:.3}", x.own_cpu_us.median / d.own_cpu_us.median))
                    .unwrap_or_default();
                let _ = writeln!(
                    md,
                    "| {} | {} | {cpu_ratio} | {} | {} | {} | {} | {} | {} |",
                    x.mode.label(),
                    range(&per_gib(&x.own_cpu_us), 1),
                    range(&per_gib(&x.cpu_us), 1),
                    range(&x.rate, 0),
                    range(&x.p50_us, 0),
                    range(&x.p99_us, 0),
                    packets_per_mib(x),
                    x.failed
                );
            }
        } else {
            let _ = writeln!(
                md,
                "| mode | CPU µs/MiB | own CPU µs/MiB | Gbit/s | × direct | packets/MiB | failed |\n|---|---|---|---|---|---|---|"
            );
            for x in &rows {
                if x.status != "measured" {
                    let _ = writeln!(md, "| {} | {} | | | | |", x.mode.label(), x.status);
                    continue;
                }
                let ratio = direct
                    .map(|d| format!("{:.3}", x.gbps.median / d.gbps.median))
                    .unwrap_or_default();
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {ratio} | {} | {} |",
                    x.mode.label(),
                    range(&x.cpu_us, 1),
                    range(&x.own_cpu_us, 1),
                    range(&x.gbps, 2),
                    packets_per_mib(x),
                    x.failed
                );
            }
        }
        let _ = writeln!(md);
    }
    md.push_str(&cpu_markdown(r));

    let p = &r.pod_setup;
    let _ = writeln!(
        md,
        "## 4. Pod setup: CNI ADD and DEL through the real plugin and agent\n"
    );
    let _ = writeln!(
        md,
        "Each sample spawns the `linkerd-cni` binary as a runtime does (spawn to exit; the agent \
         answers once the programs are attached to the pod's cgroup and the maps are written), \
         then checks from inside the pod that its connects are redirected; DEL likewise, checking \
         they no longer are. Pods: a netns (lo up) and a cgroup each, registered with a fake API \
         server. Filling the node took {:.1} s.\n",
        p.fill_secs
    );
    let _ = writeln!(
        md,
        "The agent's own time is its handling of the same ADDs and DELs, from its phase log \
         (taking the pod's netns to writing the registry): the part of a CNI call that can \
         depend on the pod count, where the spawn-to-exit figures also carry the machine's \
         drift between checkpoints minutes apart. The last reap pass is the agent's periodic \
         check that every registered pod's netns still exists (every 10 s, one `stat` per \
         registration), from its log: how many it checked and the CPU time its thread took.\n"
    );
    let _ = writeln!(
        md,
        "| pods registered | samples | ADD p50 ms | ADD p99 ms | DEL p50 ms | DEL p99 ms | agent's own ADD / DEL p50 µs | agent RSS MiB | exec floor ms | plugin floor ms | map walk ms | registry read ms | last reap pass: pods, CPU ms |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for cp in &p.checkpoints {
        let own = match cp.agent_add_p50_us > 0.0 {
            true => format!("{:.0} / {:.0}", cp.agent_add_p50_us, cp.agent_del_p50_us),
            false => "–".into(),
        };
        let reap = match cp.reap_pass {
            Some(p) => format!("{}, {:.1}", p.checked, p.cpu_us as f64 / 1e3),
            None => "–".into(),
        };
        let _ = writeln!(
            md,
            "| {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {own} | {:.1} | {:.2} | {:.2} | {:.2} | {:.2} | {reap} |",
            cp.registered,
            cp.add_ms.len(),
            cp.add_p50_ms,
            cp.add_p99_ms,
            cp.del_p50_ms,
            cp.del_p99_ms,
            cp.agent_rss_kib as f64 / 1024.0,
            cp.exec_floor_p50_ms,
            cp.plugin_floor_p50_ms,
            cp.remove_pod_ms,
            cp.registry_all_ms
        );
    }
    if let (Some(a), Some(b)) = (p.checkpoints.first(), p.checkpoints.last()) {
        let _ = writeln!(
            md,
            "\nRatio {} pods / {} pod(s): ADD p50 {:.2}, ADD p99 {:.2}, DEL p50 {:.2}, DEL p99 {:.2}; \
             exec floor p50 {:.2}. The growth goals divide each checkpoint's ADD and DEL p50 by its \
             exec floor first: the machine's drift between checkpoints minutes apart moves every \
             spawn alike.\n",
            b.registered,
            a.registered,
            b.add_p50_ms / a.add_p50_ms,
            b.add_p99_ms / a.add_p99_ms,
            b.del_p50_ms / a.del_p50_ms,
            b.del_p99_ms / a.del_p99_ms,
            b.exec_floor_p50_ms / a.exec_floor_p50_ms,
        );
    }

    let _ = writeln!(
        md,
        "The exec floor is a 151-byte static binary (reads its stdin to the end and exits 0; no loader, no libc) spawned \
         exactly as the plugin is, once after every measured ADD: what any executable costs here. \
         Map walk: one removal of an unknown pod through the pinned maps with the agent library \
         (every walk an unregistration makes). Registry read: opening the registry and reading every \
         record from disk, as an agent start does (ADD and DEL use the agent's in-memory registry).\n"
    );
    let _ = writeln!(
        md,
        "Agent memory at each checkpoint (`/proc/<pid>/smaps`, resident MiB):\n\n\
         | pods registered | RSS | heap | other anonymous (arenas, stacks) | binary | libraries | other | threads |\n\
         |---|---|---|---|---|---|---|---|"
    );
    for cp in &p.checkpoints {
        let m = &cp.agent_mem;
        let mib = |k: u64| k as f64 / 1024.0;
        let _ = writeln!(
            md,
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {} |",
            cp.registered,
            mib(m.rss_kib),
            mib(m.heap_kib),
            mib(m.anon_mmap_kib),
            mib(m.binary_kib),
            mib(m.libs_kib),
            mib(m.other_kib),
            m.threads
        );
    }
    let _ = writeln!(md);

    let f = &p.footprint;
    let _ = writeln!(
        md,
        "## 5. Footprint with {} pods registered\n",
        f.registered
    );
    let _ = writeln!(
        md,
        "Agent RSS {:.1} MiB (peak {:.1} MiB; {:.1} MiB with one pod): {:.1} MiB anonymous (heap, \
         stacks), {:.1} MiB file-backed (the binary). After the pods' API objects were deleted \
         (the agent's pod cache emptied, registrations kept): {:.1} MiB. {} pinned bpf_links. \
         BPF maps {:.1} KiB in total (`bpftool map show` → `bytes_memlock`). An agent restart \
         (spawn to answering on its socket, adopting every pod) took {:.0} ms.\n",
        f.agent_rss_kib as f64 / 1024.0,
        f.agent_hwm_kib as f64 / 1024.0,
        f.agent_rss_1_pod_kib as f64 / 1024.0,
        f.agent_anon_kib as f64 / 1024.0,
        f.agent_file_kib as f64 / 1024.0,
        f.agent_rss_without_api_pods_kib as f64 / 1024.0,
        f.links,
        f.maps_total_bytes as f64 / 1024.0,
        f.restart_ready_ms
    );
    let _ = writeln!(
        md,
        "| map | type | max entries | memlock KiB |\n|---|---|---|---|"
    );
    for m in &f.maps {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.1} |",
            m.name,
            m.kind,
            m.max_entries,
            m.bytes_memlock as f64 / 1024.0
        );
    }

    let _ = writeln!(md, "\n## 6. Agent restart under load\n");
    let _ = writeln!(
        md,
        "Clients in the ebpf pod ({} concurrent, short connections) run while the agent is \
         SIGKILLed and started again; a failure is any exchange that did not complete.\n",
        c.concurrency
    );
    let _ = writeln!(
        md,
        "| restart | killed at ms | down ms (kill → answering) | connections ok | failed | failed kill→ready+1 s | through the proxy |\n|---|---|---|---|---|---|---|"
    );
    for (i, x) in r.restart.iter().enumerate() {
        let _ = writeln!(
            md,
            "| {} | {:.0} | {:.0} | {} | {} | {} | {} |",
            i + 1,
            x.kill_at_ms,
            x.down_ms,
            x.ok,
            x.failed,
            x.failed_in_window,
            x.through_proxy
        );
    }

    if let Some(api) = &r.api_load {
        md.push_str(&crate::scenario::apiload::markdown(api));
    }
    if let Some(cri) = &r.cri_sandbox {
        md.push_str(&crate::scenario::crisandbox::markdown(cri));
    }
    upgrade_section(&mut md, r);

    let _ = writeln!(md, "\n## Method\n");
    let _ = writeln!(
        md,
        "- Everything runs on one simulated node: a node netns with a bridge, pods as netns + cgroup \
         v2 attached to it, an upstream pod running the server, a peer pod for inbound clients. No \
         traffic leaves the netns made for the run.\n\
         - Each mode has its own meshed pod running the same proxy (`linkerd-cni-bench proxy`, UID \
         2102: `getsockopt(SO_ORIGINAL_DST)` on every accepted connection, connect there, relay with \
         `splice(2)`) and the same server. A mode has a pod of its own because a netns keeps the \
         legacy `nat` table and its conntrack hooks once iptables-legacy touched it.\n\
         - `direct`: clients dial the proxy (outbound `127.0.0.1:4140`, inbound `<pod>:4143`); the \
         proxy still calls `SO_ORIGINAL_DST`, which has nothing to answer, and forwards to the \
         configured upstream. `iptables-nft` / `iptables-legacy`: Linkerd proxy-init's chains \
         `PROXY_INIT_REDIRECT` (PREROUTING) and `PROXY_INIT_OUTPUT` (OUTPUT: proxy UID, `lo`, then \
         REDIRECT) in the pod netns. `ebpf`: the pod registered through the real `linkerd-cni` \
         plugin with the real agent process.\n\
         - Every measurement checks the proxy's accept counter: a connection that bypassed the \
         proxy fails the run.\n\
         - Clients are a separate process in the client pod (netns, cgroup, UID 1000), threads \
         with blocking sockets; every netns gets `tcp_tw_reuse=1` and a wide ephemeral port range."
    );
    if let Some(b) = &r.baseline {
        let _ = writeln!(
            md,
            "- `ebpf-baseline` (`--baseline-bins`): a pod like the ebpf pod, registered through an \
             earlier build's `linkerd-cni` plugin with that build's agent ({b}), run as a second \
             agent process beside ours with its own pin root, registry, socket, shared cgroup, \
             health port and node name; its rows carry that agent's programs. Each agent's \
             programs are checked to run 0 times in the other agent's pod's windows (and the \
             baseline's in every other mode's, in the rounds with statistics); its goal rows \
             are judged in pairs like the others (below), met at most {BASELINE_MAX_RATIO:.2}."
        );
    }
    let _ = writeln!(
        md,
        "- **CPU goal rows are judged in pairs.** Two modes measured back to back share the \
         machine's state, while the same mode swings ±10 % between rounds: a row takes, round by \
         round, the ratio of the two modes' CPU per connection and is met when the median of \
         those ratios is within its limit (with the median's distribution-free 95 % interval \
         and in how many rounds the first mode was the cheaper).{}",
        match r.pair_rounds {
            0 => " This run had no extra paired rounds: the pairs are the run's own rounds, \
                  measured with the BPF statistics on."
                .to_string(),
            n => format!(
                " Besides the run's rounds, {n} more rounds of just the compared modes (direct, \
                 iptables-nft, ebpf{}, the two unmeshed pods) in every scenario give the pairs, measured with the kernel's BPF statistics off: with them on, the \
                 kernel reads the clock around every program run (`sched_clock`, the \
                 paravirtual clock on this VM), about 1.5 µs per redirected connection that only \
                 the modes with programs pay (`perf` of an ebpf run against a direct one). The \
                 tables above and the program figures are the run's own rounds, statistics on.",
                if r.baseline.is_some() {
                    ", ebpf-baseline"
                } else {
                    ""
                }
            ),
        }
    );
    let _ = writeln!(
        md,
        "- **Rows where nothing is redirected are counted.** On the paths our programs only \
         look at (an unmeshed pod under the shared attachment) or do not see at all (the bytes \
         of a long-lived connection after its set-up), the paired CPU ratio is too coarse for a \
         1 % limit: its 95 % interval is 10–25 % wide here. Those rows are judged on the \
         kernel's own count of our programs' run time per connection or per GiB (the run's \
         rounds, statistics on) against the floor's CPU per unit, and are met when that is \
         within the limit and the paired CPU ratio does not exceed the limit beyond its \
         interval (a cost the counters cannot see would show there once it is larger than the \
         spread). Not in the count: what a run adds to the kernel's dispatch of the hook, \
         which the floor's sockets go through as well with an empty program array (a step of \
         its loop and an indirect call, a few ns per run)."
    );
    if r.chain.as_ref().is_some_and(|c| !c.rounds.is_empty()) {
        let _ = writeln!(
            md,
            "- **Another tenant's socket load balancer above the pod** (issue 35): the ebpf \
             pod's cgroup lies below a cgroup the run owns, its stand-in for the node's cgroup2 \
             root (never the real root). The stand-in socket LB of the coexistence tests \
             (`connect4/6`, `getpeername4/6`, one Service address translated to a backend) is \
             linked there (a bpf_link, multi: how Cilium >= 1.14 and Calico attach theirs) for \
             half of each round: the pod's outbound connections are measured with and without \
             it back to back (the order alternates), to the upstream server, not to the \
             Service, so the tenant runs for every connect (the app's and the proxy's) and \
             leaves it alone. Its CPU row is the paired median of the per-round ratios (the \
             paired rounds, statistics off); the program row is the kernel's run time of ours \
             and of the tenant's (the run's rounds, statistics on). Information rows: no limit.\n\
             - **The feature probes** (issue 38): `Findings::probe()` (every kernel feature \
             probe the agent runs at start) timed in the benchmark's own process, root, after \
             one untimed run: wall clock and the thread's CPU time (the verifier's work \
             included) per run."
        );
    }
    md
}

const COLORS: [(&str, Mode); 5] = [
    ("#9e9e9e", Mode::Direct),
    ("#e6862e", Mode::IptablesNft),
    ("#c0392b", Mode::IptablesLegacy),
    ("#2e86de", Mode::Ebpf),
    ("#85c1e9", Mode::EbpfBaseline),
];

fn color(mode: Mode) -> &'static str {
    COLORS
        .iter()
        .find(|(_, m)| *m == mode)
        .map(|(c, _)| *c)
        .unwrap_or("#000")
}

/// A group of bars in a panel: its label, and its bars (label, colour, value).
type BarGroup<'a> = (String, Vec<(String, &'a str, Option<Summary>)>);

/// A grouped bar panel with min–max whiskers. `groups`: (label, bars (label, colour, value)).
fn panel(svg: &mut String, x: f64, y: f64, w: f64, h: f64, title: &str, groups: &[BarGroup<'_>]) {
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" font-size="14" font-weight="bold">{title}</text>"#,
        x,
        y + 14.0
    );
    let (top, bottom) = (y + 28.0, y + h - 34.0);
    let max = groups
        .iter()
        .flat_map(|(_, b)| b.iter().filter_map(|(_, _, s)| s.map(|s| s.max)))
        .fold(0.0f64, f64::max)
        .max(1e-9)
        * 1.1;
    let _ = writeln!(
        svg,
        r##"<line x1="{x:.1}" y1="{bottom:.1}" x2="{:.1}" y2="{bottom:.1}" stroke="#333"/>"##,
        x + w
    );
    for t in 0..=4 {
        let v = max * f64::from(t) / 4.0;
        let ty = bottom - (bottom - top) * f64::from(t) / 4.0;
        let _ = writeln!(
            svg,
            r##"<line x1="{x:.1}" y1="{ty:.1}" x2="{:.1}" y2="{ty:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" font-size="10" fill="#555">{}</text>"##,
            x + w,
            x + 2.0,
            ty - 2.0,
            fmt_num(v)
        );
    }
    let gw = w / groups.len().max(1) as f64;
    for (gi, (glabel, bars)) in groups.iter().enumerate() {
        let gx = x + gw * gi as f64;
        let bw = (gw - 16.0) / bars.len().max(1) as f64;
        for (bi, (blabel, colour, s)) in bars.iter().enumerate() {
            let bx = gx + 8.0 + bw * bi as f64;
            match s {
                Some(s) => {
                    let bh = (bottom - top) * s.median / max;
                    let _ = writeln!(
                        svg,
                        r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{bh:.1}" fill="{colour}"><title>{blabel}: {} ({}–{})</title></rect>"#,
                        bx + 1.0,
                        bottom - bh,
                        bw - 2.0,
                        fmt_num(s.median),
                        fmt_num(s.min),
                        fmt_num(s.max)
                    );
                    let (ymin, ymax) = (
                        bottom - (bottom - top) * s.min / max,
                        bottom - (bottom - top) * s.max / max,
                    );
                    let cx = bx + bw / 2.0;
                    let _ = writeln!(
                        svg,
                        r##"<line x1="{cx:.1}" y1="{ymin:.1}" x2="{cx:.1}" y2="{ymax:.1}" stroke="#222"/><line x1="{:.1}" y1="{ymin:.1}" x2="{:.1}" y2="{ymin:.1}" stroke="#222"/><line x1="{:.1}" y1="{ymax:.1}" x2="{:.1}" y2="{ymax:.1}" stroke="#222"/>"##,
                        cx - 3.0,
                        cx + 3.0,
                        cx - 3.0,
                        cx + 3.0
                    );
                    let _ = writeln!(
                        svg,
                        r#"<text x="{cx:.1}" y="{:.1}" font-size="9" text-anchor="middle">{}</text>"#,
                        ymax - 3.0,
                        fmt_num(s.median)
                    );
                }
                None => {
                    let _ = writeln!(
                        svg,
                        r##"<text x="{:.1}" y="{:.1}" font-size="9" text-anchor="middle" fill="#888" transform="rotate(-90 {:.1} {:.1})">not yet implemented</text>"##,
                        bx + bw / 2.0,
                        bottom - 6.0,
                        bx + bw / 2.0,
                        bottom - 6.0
                    );
                }
            }
        }
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" font-size="11" text-anchor="middle">{glabel}</text>"#,
            gx + gw / 2.0,
            bottom + 14.0
        );
    }
}

fn fmt_num(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Renders the chart.
pub fn svg(r: &Results) -> String {
    let (w, h) = (1000.0, 760.0);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    // The chart's modes: the ebpf-baseline one only in a run that has it.
    let modes: Vec<Mode> = COLORS
        .iter()
        .map(|(_, m)| *m)
        .filter(|m| Mode::ALL.contains(m) || r.traffic.iter().any(|x| x.mode == *m))
        .collect();
    let traffic = |scenario: Scenario,
                   f: fn(&TrafficRow) -> Summary|
     -> Vec<(String, &str, Option<Summary>)> {
        modes
            .iter()
            .map(|&m| {
                let row = r
                    .traffic
                    .iter()
                    .find(|x| x.scenario == scenario && x.mode == m);
                (
                    m.label().to_string(),
                    color(m),
                    row.filter(|x| x.status == "measured").map(f),
                )
            })
            .collect()
    };
    panel(
        &mut s,
        20.0,
        40.0,
        460.0,
        330.0,
        "Connections per second (higher is better)",
        &[
            (
                "outbound".into(),
                traffic(Scenario::OutboundConnections, |x| x.rate),
            ),
            (
                "inbound".into(),
                traffic(Scenario::InboundConnections, |x| x.rate),
            ),
        ],
    );
    panel(
        &mut s,
        520.0,
        40.0,
        460.0,
        330.0,
        "p99 connection latency, µs (lower is better)",
        &[
            (
                "outbound".into(),
                traffic(Scenario::OutboundConnections, |x| x.p99_us),
            ),
            (
                "inbound".into(),
                traffic(Scenario::InboundConnections, |x| x.p99_us),
            ),
        ],
    );
    panel(
        &mut s,
        20.0,
        400.0,
        460.0,
        330.0,
        "Throughput, Gbit/s (higher is better)",
        &[
            (
                "outbound".into(),
                traffic(Scenario::OutboundThroughput, |x| x.gbps),
            ),
            (
                "inbound".into(),
                traffic(Scenario::InboundThroughput, |x| x.gbps),
            ),
        ],
    );
    let pods: Vec<BarGroup<'_>> = r
        .pod_setup
        .checkpoints
        .iter()
        .map(|c| {
            let one = |v: f64| {
                Some(Summary {
                    median: v,
                    min: v,
                    max: v,
                })
            };
            (
                format!("{} pods", c.registered),
                vec![
                    ("ADD p50".to_string(), "#2e86de", one(c.add_p50_ms)),
                    ("ADD p99".to_string(), "#1b4f72", one(c.add_p99_ms)),
                    ("DEL p50".to_string(), "#58d68d", one(c.del_p50_ms)),
                    ("DEL p99".to_string(), "#1e8449", one(c.del_p99_ms)),
                ],
            )
        })
        .collect();
    panel(
        &mut s,
        520.0,
        400.0,
        460.0,
        330.0,
        "CNI ADD / DEL latency, ms (lower is better)",
        &pods,
    );
    // Legends.
    for (i, &m) in modes.iter().enumerate() {
        let c = color(m);
        let step = if modes.len() > Mode::ALL.len() {
            110.0
        } else {
            130.0
        };
        let lx = 20.0 + step * i as f64;
        let _ = writeln!(
            s,
            r#"<rect x="{lx}" y="8" width="12" height="12" fill="{c}"/><text x="{:.0}" y="18" font-size="12">{}</text>"#,
            lx + 16.0,
            m.label()
        );
    }
    for (i, (c, l)) in [
        ("#2e86de", "ADD p50"),
        ("#1b4f72", "ADD p99"),
        ("#58d68d", "DEL p50"),
        ("#1e8449", "DEL p99"),
    ]
    .iter()
    .enumerate()
    {
        let lx = 560.0 + 105.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<rect x="{lx}" y="745" width="12" height="12" fill="{c}"/><text x="{:.0}" y="755" font-size="12">{l}</text>"#,
            lx + 16.0
        );
    }
    let _ = writeln!(
        s,
        r##"<text x="20" y="755" font-size="11" fill="#555">bars: median of rounds; whiskers: min–max. {}</text>"##,
        r.machine
            .uname
            .split_whitespace()
            .take(2)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let _ = writeln!(s, "</svg>");
    s
}

/// Writes BENCHMARKS.md, bench/results.json and bench/chart.svg under `root`.
pub fn write(root: &Path, r: &Results) -> anyhow::Result<()> {
    std::fs::create_dir_all(root.join("bench"))?;
    std::fs::write(
        root.join("bench/results.json"),
        serde_json::to_string_pretty(r)? + "\n",
    )?;
    std::fs::write(root.join("bench/chart.svg"), svg(r))?;
    std::fs::write(root.join("BENCHMARKS.md"), markdown(r))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(median: f64, min: f64, max: f64) -> Summary {
        Summary { median, min, max }
    }

    /// A connection-scenario sample of round `round`: 1,000 exchanges at `busy_us` µs of CPU
    /// each, machine-wide and own processes alike.
    fn cpu_sample(round: usize, busy_us: f64) -> Sample {
        serde_json::from_value(serde_json::json!({
            "round": round, "rate": 0.0, "p50_us": 0.0, "p99_us": 0.0, "gbps": 0.0,
            "failed": 0, "through_proxy": 0, "exchanges": 1000,
            "cpu": { "secs": 1.0, "busy_ns": busy_us * 1000.0 * 1000.0, "steal_ns": 0.0,
                     "softirq_ns": 0.0, "own_ns": busy_us * 1000.0 * 1000.0 },
        }))
        .unwrap()
    }

    fn cpu_row(scenario: Scenario, mode: Mode, cpu: Summary) -> TrafficRow {
        TrafficRow {
            scenario,
            mode,
            status: "measured".into(),
            rate: Summary::default(),
            p50_us: Summary::default(),
            p99_us: Summary::default(),
            gbps: Summary::default(),
            failed: 0,
            cpu_us: cpu,
            own_cpu_us: cpu,
            steal_share: Summary::default(),
            bpf: BTreeMap::new(),
            samples: Vec::new(),
        }
    }

    #[test]
    fn paired_median_has_the_sign_test_interval() {
        // n = 20: P(Binomial(20, 1/2) <= 5) = 2.1 %, <= 6: 5.8 %: the 6th and 15th values.
        let v: Vec<f64> = (1..=20).rev().map(f64::from).collect();
        let (median, interval) = median_with_interval(&v);
        assert_eq!(median, 10.0, "an observed value, as every percentile here");
        assert_eq!(interval, Some((6.0, 15.0)));
        // n = 6: P(X = 0) = 1.6 %: the extremes.
        let (_, interval) = median_with_interval(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert_eq!(interval, Some((1.0, 6.0)));
        // Fewer values: a median, no interval.
        assert_eq!(median_with_interval(&[3.0, 1.0, 2.0]), (2.0, None));
    }

    #[test]
    fn baseline_rows_only_in_a_run_with_a_baseline() {
        let mut rows: Vec<TrafficRow> =
            [Scenario::OutboundConnections, Scenario::InboundConnections]
                .into_iter()
                .flat_map(|sc| {
                    [
                        cpu_row(sc, Mode::Direct, s(100.0, 95.0, 105.0)),
                        cpu_row(sc, Mode::Ebpf, s(104.0, 103.0, 106.0)),
                    ]
                })
                .collect();
        let names = |g: &[Goal]| {
            g.iter()
                .filter(|g| g.goal.contains("ebpf-baseline"))
                .count()
        };
        assert_eq!(names(&cpu_goals(&rows)), 0, "the floor rows are separate");
        assert_eq!(
            names(&baseline_goals(&rows)),
            0,
            "no baseline rows without one"
        );
        // Rounds with CPU per connection of (ebpf, baseline): outbound ebpf 4 % dearer in every
        // round; inbound 3 % dearer in one round, cheaper in the others.
        let with_samples = |mut r: TrafficRow, busy: &[f64]| {
            r.samples = busy
                .iter()
                .enumerate()
                .map(|(i, b)| cpu_sample(i, *b))
                .collect();
            r
        };
        let round_cpu = [100.0, 120.0, 90.0, 110.0, 95.0, 105.0];
        for r in rows.iter_mut().filter(|r| r.mode == Mode::Ebpf) {
            let factor = match r.scenario {
                Scenario::OutboundConnections => vec![1.04; 6],
                _ => vec![1.03, 0.98, 0.99, 0.97, 0.99, 0.98],
            };
            let busy: Vec<f64> = round_cpu.iter().zip(&factor).map(|(c, f)| c * f).collect();
            *r = with_samples(r.clone(), &busy);
        }
        for sc in [Scenario::OutboundConnections, Scenario::InboundConnections] {
            rows.push(with_samples(
                cpu_row(sc, Mode::EbpfBaseline, s(100.0, 90.0, 120.0)),
                &round_cpu,
            ));
        }
        let goals = baseline_goals(&rows);
        assert_eq!(goals.len(), 2, "{goals:?}");
        assert!(
            goals[0]
                .goal
                .starts_with("outbound: ebpf CPU per redirected connection ≤ 1.02 × ebpf-baseline"),
            "{}",
            goals[0].goal
        );
        assert_eq!(goals[0].met, Some(false), "outbound: 1.04 × in every round");
        assert!(
            goals[0].observed.starts_with(
                "paired median 1.040 × (95 % interval 1.040–1.040; ebpf cheaper in 0 of 6 rounds; \
                 the processes' own CPU)"
            ),
            "{}",
            goals[0].observed
        );
        assert_eq!(
            goals[1].met,
            Some(true),
            "inbound: cheaper in 5 rounds of 6"
        );
        assert!(
            goals[1].observed.contains("ebpf cheaper in 5 of 6 rounds"),
            "{}",
            goals[1].observed
        );
        assert_eq!(
            names(&cpu_goals(&rows)),
            0,
            "the baseline rows are separate"
        );
    }

    /// The overhead share is the paired median of our overhead over the paired median of
    /// iptables-nft's, over the rounds that measured the three modes.
    #[test]
    fn overhead_share_is_judged_on_paired_medians() {
        let sc = Scenario::OutboundConnections;
        let with = |mode: Mode, cpu: &[f64]| {
            let mut r = cpu_row(sc, mode, s(cpu[0], cpu[0], cpu[0]));
            r.samples = cpu
                .iter()
                .enumerate()
                .map(|(i, c)| cpu_sample(i, *c))
                .collect();
            r
        };
        // Floor 100, 200, 100, 200, 100, 200; ebpf 2 % over it, iptables-nft 10 % over it,
        // but in round 5 iptables-nft only at the floor (no share that round).
        let floor = [100.0, 200.0, 100.0, 200.0, 100.0, 200.0];
        let ebpf: Vec<f64> = floor.iter().map(|c| c * 1.02).collect();
        let mut nft: Vec<f64> = floor.iter().map(|c| c * 1.10).collect();
        nft[5] = 200.0;
        let rows = vec![
            with(Mode::Direct, &floor),
            with(Mode::Ebpf, &ebpf),
            with(Mode::IptablesNft, &nft),
        ];
        let goals = cpu_goals(&rows);
        let share = &goals[0];
        assert!(
            share.goal.starts_with(
                "outbound: our CPU per connection over the floor ≤ 0.25 × iptables-nft's"
            ),
            "{}",
            share.goal
        );
        assert_eq!(share.met, Some(true), "{}", share.observed);
        assert!(
            share.observed.starts_with(
                "0.20 × iptables-nft's overhead (paired medians over 6 rounds, the processes' \
                 own CPU: ebpf +2.0 %, iptables-nft +10.0 % over the floor); per round the share \
                 was at most 0.25 in 5 of the 5 rounds"
            ),
            "{}",
            share.observed
        );
        // iptables-nft at 4 % over the floor: 2 % is half of it.
        let nft: Vec<f64> = floor.iter().map(|c| c * 1.04).collect();
        let rows = vec![
            with(Mode::Direct, &floor),
            with(Mode::Ebpf, &ebpf),
            with(Mode::IptablesNft, &nft),
        ];
        let goals = cpu_goals(&rows);
        assert_eq!(goals[0].met, Some(false), "{}", goals[0].observed);
        assert!(
            goals[0].observed.starts_with("0.50 ×"),
            "{}",
            goals[0].observed
        );
        let floor_row = &goals[1];
        assert!(
            floor_row.goal.starts_with(
                "outbound: CPU per redirected connection ≤ 1.03 × the floor (direct), every \
                 guarantee kept"
            ),
            "{}",
            floor_row.goal
        );
        assert_eq!(floor_row.met, Some(true), "1.02 × the floor in every round");
    }

    /// Extra paired rounds are numbered after the run's own, so every pair stays a pair.
    #[test]
    fn extra_rounds_add_pairs_to_the_baseline_rows() {
        use crate::scenario::traffic::{TrafficResults, with_extra_rounds};
        let results = |ebpf: &[f64], base: &[f64]| -> TrafficResults {
            let mut modes = std::collections::BTreeMap::new();
            for (mode, busy) in [(Mode::Ebpf, ebpf), (Mode::EbpfBaseline, base)] {
                let v = busy
                    .iter()
                    .enumerate()
                    .map(|(i, b)| cpu_sample(i, *b))
                    .collect();
                modes.insert(mode, Some(v));
            }
            [(Scenario::OutboundConnections, modes)]
                .into_iter()
                .collect()
        };
        // The run: ebpf dearer in both rounds; the extra rounds: cheaper in all three.
        let main = results(&[110.0, 220.0], &[100.0, 200.0]);
        let extra = results(&[99.0, 198.0, 297.0], &[100.0, 200.0, 300.0]);
        let merged = with_extra_rounds(&main, extra, 2);
        let rows = traffic_rows(&merged);
        let ebpf = rows.iter().find(|r| r.mode == Mode::Ebpf).unwrap();
        let rounds: Vec<usize> = ebpf.samples.iter().map(|x| x.round).collect();
        assert_eq!(rounds, [0, 1, 2, 3, 4]);
        let goals = baseline_goals(&rows);
        assert!(
            goals[0].observed.starts_with("paired median 0.990 ×")
                && goals[0].observed.contains("ebpf cheaper in 3 of 5 rounds"),
            "{}",
            goals[0].observed
        );
        assert_eq!(goals[0].met, Some(true));
        // The run's own rows are unchanged.
        assert_eq!(traffic_rows(&main)[0].samples.len(), 2);
    }

    /// The CPU rows are judged on the rounds run without the BPF statistics when there are
    /// any: the run's own rounds (statistics on) keep the program figures and the per-pod
    /// attachment's run count, the paired rounds decide the ratios.
    #[test]
    fn cpu_rows_are_judged_on_the_rounds_without_statistics() {
        use crate::{measure::bpfstats::ProgStats, scenario::traffic::TrafficResults};
        let sc = Scenario::OutboundConnections;
        let sample = |round: usize, busy: f64, quiet: bool, runs: u64| {
            let mut x = cpu_sample(round, busy);
            x.without_bpf_stats = quiet;
            if runs > 0 {
                x.bpf.insert(
                    "l5d_connect4".into(),
                    ProgStats {
                        runs,
                        ns: runs * 300,
                    },
                );
            }
            x
        };
        let mut modes = BTreeMap::new();
        // The run's two rounds (statistics on): ebpf 10 % over the floor, 2 runs per
        // connection. Six paired rounds (off): 1 % over.
        let ebpf: Vec<Sample> = (0..2)
            .map(|i| sample(i, 110.0, false, 2000))
            .chain((2..8).map(|i| sample(i, 101.0, true, 0)))
            .collect();
        let direct: Vec<Sample> = (0..2)
            .map(|i| sample(i, 100.0, false, 0))
            .chain((2..8).map(|i| sample(i, 100.0, true, 0)))
            .collect();
        let unmeshed: Vec<Sample> = (0..8).map(|i| sample(i, 50.0, i >= 2, 0)).collect();
        modes.insert(Mode::Ebpf, Some(ebpf));
        modes.insert(Mode::Direct, Some(direct));
        modes.insert(Mode::Unmeshed, Some(unmeshed));
        let results: TrafficResults = [(sc, modes)].into_iter().collect();
        let rows = traffic_rows(&results);
        let goals = cpu_goals(&rows);
        let floor = goals
            .iter()
            .find(|g| {
                g.goal
                    .starts_with("outbound: CPU per redirected connection ≤ 1.03")
            })
            .unwrap();
        assert_eq!(floor.met, Some(true), "{}", floor.observed);
        assert!(
            floor.observed.starts_with(
                "paired median 1.010 × (95 % interval 1.010–1.010; ebpf cheaper in 0 of 6 \
                 rounds, BPF statistics off; the processes' own CPU)"
            ) && floor
                .observed
                .contains("medians 101.0 µs/conn vs 100.0 µs/conn"),
            "{}",
            floor.observed
        );
        let ebpf = rows.iter().find(|r| r.mode == Mode::Ebpf).unwrap();
        assert_eq!(
            ebpf.bpf["l5d_connect4"].runs_per_unit.median, 2.0,
            "program figures from the rounds with statistics only"
        );
        let per_pod = goals
            .iter()
            .find(|g| {
                g.goal
                    .starts_with("outbound: unmeshed pod with per-pod attachment")
            })
            .unwrap();
        assert!(
            per_pod
                .observed
                .starts_with("0 program runs over 2000 connections"),
            "{}",
            per_pod.observed
        );
        // Without paired rounds (a --traffic-only run), every round is a pair.
        let only_main: TrafficResults = results
            .iter()
            .map(|(sc, modes)| {
                let modes = modes
                    .iter()
                    .map(|(m, v)| {
                        let v = v
                            .as_ref()
                            .map(|v| v.iter().filter(|x| !x.without_bpf_stats).cloned().collect());
                        (*m, v)
                    })
                    .collect();
                (*sc, modes)
            })
            .collect();
        let goals = cpu_goals(&traffic_rows(&only_main));
        assert_eq!(
            goals[0].observed, "not measured",
            "no iptables-nft rows: no overhead share"
        );
        assert!(
            goals[1].observed.starts_with("paired median 1.100 ×")
                && goals[1].observed.contains("ebpf cheaper in 0 of 2 rounds;"),
            "{}",
            goals[1].observed
        );
        assert_eq!(goals[1].met, Some(false));
    }
    /// A path where nothing is redirected is judged on the kernel's count of our programs'
    /// run time against the floor's CPU, and not met when the paired CPU ratio exceeds the
    /// limit beyond its interval (a cost the counters do not see) or when no round counted.
    #[test]
    fn rows_without_a_redirect_are_judged_on_the_counted_program_time() {
        use crate::{measure::bpfstats::ProgStats, scenario::traffic::TrafficResults};
        let sc = Scenario::InboundConnections;
        // `shared`: per round, the own CPU per connection; `ns`: program time per connection
        // in the rounds with statistics (the first two), none without.
        let judge = |shared: &[f64], ns: u64, stats: bool| {
            let sample = |round: usize, busy: f64, prog: bool| {
                let mut x = cpu_sample(round, busy);
                x.without_bpf_stats = round >= 2 || !stats;
                if prog && !x.without_bpf_stats {
                    x.bpf.insert(
                        "l5d_connect4".into(),
                        ProgStats {
                            runs: 5000,
                            ns: ns * 1000,
                        },
                    );
                }
                x
            };
            let mut modes = BTreeMap::new();
            let n = shared.len();
            modes.insert(
                Mode::UnmeshedShared,
                Some(
                    shared
                        .iter()
                        .enumerate()
                        .map(|(i, v)| sample(i, *v, true))
                        .collect(),
                ),
            );
            modes.insert(
                Mode::Unmeshed,
                Some((0..n).map(|i| sample(i, 100.0, false)).collect()),
            );
            let results: TrafficResults = [(sc, modes)].into_iter().collect();
            cpu_goals(&traffic_rows(&results))
                .into_iter()
                .find(|g| g.goal.starts_with("inbound: unmeshed pod under the shared"))
                .unwrap()
        };
        // 300 ns of 100 µs counted; the paired ratios spread 0.95–1.08 (median 1.03): met.
        let spread = [
            95.0, 97.0, 99.0, 101.0, 103.0, 103.0, 104.0, 105.0, 106.0, 108.0,
        ];
        let g = judge(&spread, 300, true);
        assert_eq!(g.met, Some(true), "{}", g.observed);
        assert!(
            g.observed.starts_with(
                "1.0030 × counted: our programs ran 300 ns per connection against the \
                 floor's 100.0 µs/conn of CPU (2 rounds with the kernel's statistics); the \
                 paired CPU ratio does not exceed the limit beyond its interval: paired median \
                 1.030 × (95 % interval 0.990–1.080; unmeshed-shared cheaper in 1 of 8 \
                 rounds, BPF statistics off;"
            ),
            "{}",
            g.observed
        );
        assert!(
            g.observed.ends_with("; 5.0 program runs per connection"),
            "{}",
            g.observed
        );
        // 1.5 µs counted: over 1.01.
        let g = judge(&spread, 1500, true);
        assert_eq!(g.met, Some(false), "{}", g.observed);
        assert!(g.observed.starts_with("1.0150 × counted"), "{}", g.observed);
        // Counted within the limit, but every pair 3–8 % over: a cost the counters miss.
        let over = [103.0, 104.0, 105.0, 106.0, 107.0, 108.0, 103.0, 104.0];
        let g = judge(&over, 300, true);
        assert_eq!(g.met, Some(false), "{}", g.observed);
        assert!(
            g.observed
                .contains("the paired CPU ratio exceeds the limit beyond its interval"),
            "{}",
            g.observed
        );
        // Too few pairs for an interval (three rounds after the two counted): the smallest
        // pair decides.
        let g = judge(&[100.0, 100.0, 100.5, 120.0, 130.0], 300, true);
        assert_eq!(g.met, Some(true), "{}", g.observed);
        let g = judge(&[100.0, 100.0, 102.0, 120.0, 130.0], 300, true);
        assert_eq!(g.met, Some(false), "{}", g.observed);
        // No round with the statistics: nothing counted, not judged.
        let g = judge(&spread, 300, false);
        assert_eq!(g.met, None, "{}", g.observed);
        assert!(g.observed.starts_with("no round counted"), "{}", g.observed);
    }
    /// The growth of ADD and DEL with the pod count is judged in units of each checkpoint's
    /// exec floor: a drift of the machine that slows every spawn alike is not growth, a slower
    /// ADD at the same floor is.
    #[test]
    fn pod_count_growth_is_judged_against_the_exec_floor() {
        let cp = |registered: usize, add: f64, del: f64, floor: f64| -> Checkpoint {
            serde_json::from_value(serde_json::json!({
                "registered": registered, "add_ms": [], "del_ms": [],
                "add_p50_ms": add, "add_p99_ms": add, "del_p50_ms": del, "del_p99_ms": del,
                "agent_rss_kib": 0, "scans": [], "remove_pod_ms": 0.0, "registry_all_ms": 0.0,
                "plugin_floor_p50_ms": floor, "exec_floor_p50_ms": floor,
            }))
            .unwrap()
        };
        let judge = |a: Checkpoint, b: Checkpoint| -> Vec<Goal> {
            let pods: PodSetupResults = serde_json::from_value(serde_json::json!({
                "checkpoints": [a, b], "fill_secs": 0.0,
                "footprint": {
                    "registered": 0, "agent_rss_kib": 0, "agent_hwm_kib": 0,
                    "agent_anon_kib": 0, "agent_file_kib": 0,
                    "agent_rss_without_api_pods_kib": 0, "agent_rss_1_pod_kib": 0, "maps": [],
                    "maps_total_bytes": 0, "links": 0, "restart_ready_ms": 0.0,
                },
            }))
            .unwrap();
            pod_setup_goals(&pods)
                .into_iter()
                .filter(|g| g.goal.contains("with 10,000 pods / with 1 ≤ 1.2"))
                .collect()
        };
        // This run's figures: ADD 0.66 → 0.97 ms, DEL 0.55 → 0.83, the floor 0.12 → 0.19.
        let g = judge(cp(1, 0.66, 0.55, 0.12), cp(10_000, 0.97, 0.83, 0.19));
        assert_eq!(g.len(), 2);
        assert_eq!(g[0].met, Some(true), "{}", g[0].observed);
        assert!(
            g[0].observed.starts_with(
                "0.93 (5.11 / 5.50 exec floors of 0.19 / 0.12 ms); spawn to exit 1.47 \
                 (0.97 / 0.66 ms)"
            ),
            "{}",
            g[0].observed
        );
        assert_eq!(g[1].met, Some(true), "{}", g[1].observed);
        // The same ADD 0.3 ms slower at 10,000 pods on an unmoved floor.
        let g = judge(cp(1, 0.66, 0.55, 0.12), cp(10_000, 0.96, 0.55, 0.12));
        assert_eq!(g[0].met, Some(false), "{}", g[0].observed);
        assert!(g[0].observed.starts_with("1.45 "), "{}", g[0].observed);
        assert_eq!(g[1].met, Some(true), "{}", g[1].observed);
        // No floor measured: the spawn-to-exit ratio decides.
        let g = judge(cp(1, 0.66, 0.55, 0.0), cp(10_000, 0.97, 0.55, 0.0));
        assert_eq!(g[0].met, Some(false), "{}", g[0].observed);
        assert!(
            g[0].observed.contains("no exec floor measured"),
            "{}",
            g[0].observed
        );
    }

    /// The rendered text of `name` against its golden copy in `bench/testdata/report/`
    /// (`BENCH_BLESS=1` rewrites the golden copy instead).
    fn same_as_golden(name: &str, rendered: &str) {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata/report")
            .join(name);
        if std::env::var_os("BENCH_BLESS").is_some() {
            std::fs::write(&path, rendered).expect("writing the golden copy");
        }
        let golden = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        if let Some((i, (a, b))) = rendered
            .lines()
            .zip(golden.lines())
            .enumerate()
            .find(|(_, (a, b))| a != b)
        {
            panic!("{name} line {}: rendered\n{a}\ngolden\n{b}", i + 1);
        }
        assert_eq!(rendered, golden, "{name}");
    }

    #[test]
    fn a_fixed_result_set_renders_byte_for_byte_as_before() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/report/results.json");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let r: Results = serde_json::from_str(&text).expect("the fixture parses");
        same_as_golden("BENCHMARKS.md.golden", &markdown(&r));
        same_as_golden("chart.svg.golden", &svg(&r));
    }
}
