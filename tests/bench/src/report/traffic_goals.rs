//! The goals judged on the traffic scenarios: CPU per connection against the floor and
//! iptables-nft (paired per round), against a baseline build, and per GiB over long-lived
//! connections.

use std::fmt::Write as _;

use super::results::{Goal, TrafficRow, row};
use crate::{
    measure::cpu::CpuWindow,
    scenario::traffic::{Mode, Sample, Scenario},
};

/// Rates swing too much between rounds on a shared machine to judge on: their rows are kept
/// as information; the goals are judged on CPU per connection ([`cpu_goals`]).
pub(super) const INFO: &str = "(information: rates are not judged)";

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

/// The per-node fallback's CPU per redirected connection over the floor, beside eBPF's and
/// iptables-nft's, the four modes measured in the same rounds (information, not a goal: the
/// fallback serves nodes where eBPF cannot run, and is expected to cost what iptables-nft
/// costs: the same netfilter NAT and conntrack path).
pub fn fallback_rows(rows: &[TrafficRow]) -> Vec<Goal> {
    let mut out = Vec::new();
    for (scenario, dir) in [
        (Scenario::OutboundConnections, "outbound"),
        (Scenario::InboundConnections, "inbound"),
    ] {
        let measured = |mode| row(rows, scenario, mode).filter(|r| r.cpu_us.median > 0.0);
        let goal = format!(
            "{dir}: the fallback's CPU per connection over the floor, beside ebpf's and \
             iptables-nft's (information; paired per round)"
        );
        let (Some(f), Some(e), Some(d), Some(n)) = (
            measured(Mode::Fallback),
            measured(Mode::Ebpf),
            measured(Mode::Direct),
            measured(Mode::IptablesNft),
        ) else {
            out.push(Goal {
                goal,
                observed: "not measured".into(),
                met: None,
            });
            continue;
        };
        let fallback = OverheadShare::of(f, d, n);
        let ebpf = OverheadShare::of(e, d, n);
        let pct = |v: &[f64]| 100.0 * crate::measure::stats::percentile(v, 0.5);
        let observed = if fallback.ours.is_empty() || ebpf.ours.is_empty() {
            "no round measured the four modes".into()
        } else {
            format!(
                "fallback {:+.1} %, ebpf {:+.1} %, iptables-nft {:+.1} % over the floor \
                 (paired medians over {} rounds{}, the processes' own CPU); the fallback at {}",
                pct(&fallback.ours),
                pct(&ebpf.ours),
                pct(&fallback.theirs),
                fallback.ours.len(),
                if fallback.quiet {
                    ", BPF statistics off"
                } else {
                    ""
                },
                match fallback.share().0 {
                    Some(v) => format!("{v:.2} × iptables-nft's overhead"),
                    None => "iptables-nft not above the floor: no share".into(),
                },
            )
        };
        out.push(Goal {
            goal,
            observed,
            met: None,
        });
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
