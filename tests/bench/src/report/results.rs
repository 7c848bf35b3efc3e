//! The results of a run as `tests/bench/results.json` holds them: the machine, the traffic rows
//! summarised from raw samples, the goal rows, and everything else each scenario returned.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{
    measure::{bpfstats::ProgStats, cpu::CpuWindow, stats::Summary},
    scenario::{
        apiload::ApiLoadResults,
        podsetup::PodSetupResults,
        restart::RestartRound,
        traffic::{Mode, Sample, Scenario, TrafficConfig, TrafficResults},
        upgrade::UpgradeRound,
    },
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

pub(super) fn row(rows: &[TrafficRow], scenario: Scenario, mode: Mode) -> Option<&TrafficRow> {
    rows.iter()
        .find(|r| r.scenario == scenario && r.mode == mode && r.status == "measured")
}
