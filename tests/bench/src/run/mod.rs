//! `linkerd-cni-bench run`: the whole benchmark on a simulated node, scenario by scenario, and
//! the report it writes (`BENCHMARKS.md`, `tests/bench/results.json`, `tests/bench/chart.svg`); its hidden
//! flags run a part and print it instead.

use std::{
    path::{Path, PathBuf},
    time::{Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, bail};
use linkerd_cni_tests::CgroupGuard;

use crate::{
    measure::{bpfstats, scale},
    node, report,
    scenario::{apiload, chain, crisandbox, imagesize, podsetup, restart, traffic, upgrade},
};

/// The flags of `linkerd-cni-bench run`.
#[derive(clap::Args)]
pub struct RunArgs {
    /// Short run (under two minutes): fewer rounds, shorter loads, fewer samples.
    #[arg(long)]
    quick: bool,
    /// Where BENCHMARKS.md and bench/ are written (the repository root).
    #[arg(long, default_value = ".")]
    out_dir: PathBuf,
    /// The command line recorded in the report.
    #[arg(long)]
    command: Option<String>,
    /// Skip scenarios 1-3 (to iterate on the others; the report then has no traffic rows).
    #[arg(long, hide = true)]
    skip_traffic: bool,
    /// Run only scenario 7 (API load) and print its section and goal rows; writes nothing.
    #[arg(long, hide = true)]
    only_api_load: bool,
    /// Run scenarios 1-3 only and print their CPU goals (to iterate on the data plane's cost;
    /// writes no report).
    #[arg(long, hide = true)]
    traffic_only: bool,
    /// Run only the pod-setup scenarios (4-5: ADD/DEL latency, reconcile passes, RSS, map
    /// memory) and print their sections, goal rows and results (JSON, last line) (to iterate
    /// on the agent's per-pod cost; writes no report).
    #[arg(long, hide = true)]
    only_pod_setup: bool,
    /// Run only the rows added after the committed report's run (the chain with another
    /// tenant's socket LB, the feature probes' cost) and print them; writes nothing.
    #[arg(long, hide = true)]
    only_added_rows: bool,
    /// With `--traffic-only`: only these scenarios (labels, comma-separated).
    #[arg(long, hide = true, value_delimiter = ',')]
    scenarios: Vec<String>,
    /// With `--traffic-only`: only these modes (labels, comma-separated).
    #[arg(long, hide = true, value_delimiter = ',')]
    modes: Vec<String>,
    /// Rounds of the traffic scenarios instead of the default (2 quick, 5 full).
    #[arg(long, hide = true)]
    rounds: Option<usize>,
    /// Registered-pod checkpoints of the pod-setup scenario instead of the default ones
    /// (`1,100,1000` quick, `1,100,1000,10000` full), comma-separated.
    #[arg(long, hide = true, value_delimiter = ',')]
    checkpoints: Vec<usize>,
    /// A directory holding an earlier build's `linkerd-cni-agent` and `linkerd-cni` (its
    /// `target/release`): the traffic scenarios gain the mode `ebpf-baseline`, a pod redirected
    /// by that agent, run as a second agent process beside ours, and the goals compare ebpf's
    /// CPU per connection with it.
    #[arg(long)]
    baseline_bins: Option<PathBuf>,
    /// Rounds of just the compared modes (direct, iptables-nft, ebpf, fallback, ebpf-baseline and the
    /// two unmeshed pods) in the two connection scenarios after the main rounds, with the
    /// kernel's BPF statistics off: the CPU goal rows are judged on their per-round pairs
    /// (default 6 quick, 15 full, 0 with `--traffic-only`).
    #[arg(long, alias = "baseline-pairs")]
    pair_rounds: Option<usize>,
    /// Where `cargo xtask image` wrote the image archives (default: `target/image` under
    /// `--out-dir`): their sizes per architecture are reported.
    #[arg(long)]
    image_dir: Option<PathBuf>,
}

/// The hand-written analysis kept in tests/bench/ANALYSIS.md, if any.
pub fn read_notes(root: &Path) -> Vec<String> {
    std::fs::read_to_string(root.join("tests/bench/ANALYSIS.md"))
        .map(|n| vec![n.trim().to_string()])
        .unwrap_or_default()
}

fn git_commit(root: &Path) -> String {
    std::process::Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// `--traffic-only`: the CPU figures and goals on stderr (the baseline rows from `paired`).
fn print_cpu(rows: &[report::TrafficRow], paired: &[report::TrafficRow], floor_check: &str) {
    for x in rows {
        let bpf: f64 = x.bpf.values().map(|b| b.ns_per_unit.median).sum();
        eprintln!(
            "{:<20} {:<16} CPU {:>7.1} µs own {:>7.1} µs bpf {bpf:>6.0} ns {:?}",
            x.scenario.label(),
            x.mode.label(),
            x.cpu_us.median,
            x.own_cpu_us.median,
            x.bpf
                .iter()
                .map(|(n, b)| format!(
                    "{n}: {:.2} runs {:.0} ns",
                    b.runs_per_unit.median, b.ns_per_unit.median
                ))
                .collect::<Vec<_>>()
        );
    }
    eprint_goals(&report::cpu_goals(paired));
    eprint_goals(&report::fallback_rows(paired));
    eprint_goals(&report::baseline_goals(paired));
    eprint_goals(&report::long_lived_goals(paired));
    eprintln!("floor: {floor_check}");
}

/// The goal rows of a partial run (`--traffic-only`, `--only-pod-setup`), one per line on stderr.
fn eprint_goals(goals: &[report::Goal]) {
    for g in goals {
        eprintln!("goal {:?}: {} — {}", g.met, g.goal, g.observed);
    }
}

/// Runs the benchmark (or the part its hidden flags ask for) and writes or prints the report.
pub fn run(args: RunArgs) -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the benchmark creates netns, cgroups and BPF programs: run it as root");
    }
    let started = Instant::now();
    let loadavg_start = report::loadavg();
    let quick = args.quick;
    let bins = node::Bins::find()?;
    // The kernel feature probes the agent runs at start (issue 38), in this process.
    let probe_cost = chain::probe_cost(if quick { 20 } else { 100 });
    eprintln!(
        "bench: feature probes: {:.2} ms wall, {:.2} ms CPU per run (median of {})",
        probe_cost.wall_ms.median, probe_cost.cpu_ms.median, probe_cost.runs
    );
    let cfg = if quick {
        traffic::TrafficConfig {
            rounds: 2,
            rr_ms: 1000,
            bulk_ms: 800,
            warmup_ms: 300,
            concurrency: 32,
            streams: 2,
            persistent_conns: 8,
            persistent_ms: 800,
            without_bpf_stats: false,
        }
    } else {
        traffic::TrafficConfig {
            rounds: 5,
            rr_ms: 3000,
            bulk_ms: 2000,
            warmup_ms: 500,
            concurrency: 32,
            streams: 2,
            persistent_conns: 8,
            persistent_ms: 2000,
            without_bpf_stats: false,
        }
    };
    let cfg = traffic::TrafficConfig {
        rounds: args.rounds.unwrap_or(cfg.rounds),
        ..cfg
    };
    let pair_rounds = match args.pair_rounds {
        Some(n) => n,
        None if args.traffic_only => 0,
        None if quick => 6,
        None => 15,
    };
    let (checkpoints, samples, restarts, restart_ms) = if quick {
        (vec![1, 100, 1000], 20, 1, 4000)
    } else {
        (vec![1, 100, 1000, scale::FULL_PODS], 100, 3, 6000)
    };
    let upgrade_cfg = upgrade::UpgradeConfig {
        rounds: if quick { 1 } else { 2 },
        duration_ms: if quick { 3000 } else { 4000 },
        change_at_ms: 1000,
        concurrency: 4,
    };

    let api_load_cfg = if quick {
        apiload::ApiLoadConfig {
            nodes: 4,
            pods_per_node: 100,
            churn_rounds: 2,
            churn_per_round: 25,
            racing_per_node: 10,
        }
    } else {
        apiload::ApiLoadConfig {
            nodes: 16,
            pods_per_node: 100,
            churn_rounds: 4,
            churn_per_round: 50,
            racing_per_node: 20,
        }
    };

    if args.only_api_load {
        let r = apiload::run(&bins, &api_load_cfg)?;
        println!("{}", apiload::markdown(&r));
        for g in report::api_goals(&r) {
            println!("goal {:?}: {} — {}", g.met, g.goal, g.observed);
        }
        return Ok(());
    }

    let checkpoints = match args.checkpoints.is_empty() {
        true => checkpoints,
        false => args.checkpoints.clone(),
    };
    let api = node::Api::start()?;
    let shared_cgroup = CgroupGuard::new()?;
    let mut agent = node::AgentProc::stopped(
        &bins.agent,
        &api.kubeconfig,
        shared_cgroup.path(),
        node::NODE_NAME,
        scale::BENCH_MAX_PODS,
    )?;
    // A fresh node: no pins, no registered pod.
    let start_empty = agent.spawn_until_ready()?;
    eprintln!(
        "bench: agent running, PID {}: socket after {:.0} ms, /ready after {:.0} ms ({} pods)",
        agent.pid().unwrap_or(0),
        start_empty.socket_ms,
        start_empty.ready_ms,
        start_empty.registered
    );
    let cni = node::Cni {
        plugin: bins.plugin.clone(),
        socket: agent.socket().to_path_buf(),
    };
    if args.only_pod_setup {
        let pods = podsetup::run(&bins.me, &api, &mut agent, &cni, &checkpoints, samples)
            .map_err(|e| anyhow::anyhow!("{e:#}\nagent log (last lines):\n{}", agent.log_tail()))?;
        let mut md = String::new();
        report::pod_setup_section(&mut md, &pods);
        println!("{md}");
        eprint_goals(&report::pod_setup_goals(&pods));
        println!("{}", serde_json::to_string(&pods)?);
        return Ok(());
    }
    // The per-node fallback's pod is registered with a second agent of this build in
    // `--mode iptables` (issue 46: the fallback's CPU per connection beside eBPF's).
    let fallback = node::start_fallback_agent(
        &bins.agent,
        &bins.plugin,
        &api.kubeconfig,
        scale::BENCH_MAX_PODS,
    )?;
    let baseline = match &args.baseline_bins {
        Some(dir) => {
            let b = node::Baseline::start(dir, &api.kubeconfig, scale::BENCH_MAX_PODS)
                .context("--baseline-bins")?;
            eprintln!(
                "bench: baseline agent running, PID {} ({})",
                b.side.agent.pid().unwrap_or(0),
                b.description
            );
            Some(b)
        }
        None => None,
    };
    // The ebpf pod with and without another tenant's socket LB chained above it (issue 35).
    let mut chain = chain::ChainResults::default();
    let outcome = (|| -> anyhow::Result<_> {
        let topo = traffic::Topology::build(
            &bins.me,
            &api,
            &cni,
            shared_cgroup.path(),
            agent.pin_root(),
            &fallback,
            baseline.as_ref(),
        )
        .context("building the simulated node")?;
        // BPF run-time statistics stay on while this lives (the traffic scenarios).
        let bpf_stats = bpfstats::Stats::enable()?;
        eprintln!(
            "bench: node ready ({:.1} s)",
            started.elapsed().as_secs_f64()
        );
        if args.only_added_rows {
            chain.rounds = chain::run(&topo, &cfg, cfg.rounds, 0)?;
            drop(bpf_stats);
            let quiet = traffic::TrafficConfig {
                without_bpf_stats: true,
                ..cfg.clone()
            };
            chain
                .rounds
                .extend(chain::run(&topo, &quiet, pair_rounds, cfg.rounds)?);
            topo.teardown(&cni)?;
            return Ok((Default::default(), Default::default(), String::new(), None));
        }
        let traffic = if args.skip_traffic {
            Default::default()
        } else {
            let only = traffic::Only {
                scenarios: args.scenarios.clone(),
                modes: args.modes.clone(),
            };
            traffic::run(&topo, &cfg, &only)?
        };
        if !args.skip_traffic && !args.traffic_only {
            chain.rounds = chain::run(&topo, &cfg, cfg.rounds, 0)?;
        }
        // The program figures come from the main rounds; the paired rounds run without the
        // statistics' clock reads around every program run.
        drop(bpf_stats);
        let paired = if !args.skip_traffic && pair_rounds > 0 {
            eprintln!("bench: {pair_rounds} more rounds of the compared modes, BPF statistics off");
            let extra = traffic::TrafficConfig {
                rounds: pair_rounds,
                without_bpf_stats: true,
                ..cfg.clone()
            };
            let pairs = traffic::run(&topo, &extra, &traffic::Only::paired())?;
            traffic::with_extra_rounds(&traffic, pairs, cfg.rounds)
        } else {
            traffic.clone()
        };
        if !args.skip_traffic && !args.traffic_only && pair_rounds > 0 {
            let quiet = traffic::TrafficConfig {
                without_bpf_stats: true,
                ..cfg.clone()
            };
            chain
                .rounds
                .extend(chain::run(&topo, &quiet, pair_rounds, cfg.rounds)?);
        }
        let floor_check = if args.skip_traffic {
            String::new()
        } else {
            topo.floor_check()?
        };
        if args.traffic_only {
            topo.teardown(&cni)?;
            return Ok((traffic, paired, floor_check, None));
        }
        let restart = restart::run(
            &bins.me,
            &topo,
            &mut agent,
            restarts,
            restart_ms,
            restart_ms / 3,
            cfg.concurrency,
        )?;
        let upgrade = upgrade::run(&bins.me, &bins.agent, &api.kubeconfig, &upgrade_cfg)?;
        topo.teardown(&cni)?;
        let pods = podsetup::run(&bins.me, &api, &mut agent, &cni, &checkpoints, samples)?;
        Ok((traffic, paired, floor_check, Some((restart, upgrade, pods))))
    })();
    let outcome = outcome.map_err(|e| {
        let mut msg = format!(
            "{e:#}\nagent log (last lines):\n{}\nfallback agent log (last lines):\n{}",
            agent.log_tail(),
            fallback.agent.log_tail()
        );
        if let Some(b) = &baseline {
            msg.push_str(&format!(
                "\nbaseline agent log (last lines):\n{}",
                b.side.agent.log_tail()
            ));
        }
        anyhow::anyhow!(msg)
    });
    let baseline = baseline.map(|b| b.description);
    drop(agent);
    let (traffic, paired, floor_check, rest) = outcome?;
    if args.only_added_rows {
        eprintln!(
            "bench: agent start to /ready on a fresh node: {:.0} ms",
            start_empty.ready_ms
        );
        let mut rows = report::chain_goals(&chain);
        rows.push(report::probe_goal(&probe_cost, Some(start_empty.ready_ms)));
        for g in rows {
            println!("| {} | {} |", g.goal, g.observed);
        }
        println!("{}", serde_json::to_string(&(&chain, &probe_cost))?);
        return Ok(());
    }
    let paired = report::traffic_rows(&paired);
    let Some((restart, upgrade, pods)) = rest else {
        print_cpu(&report::traffic_rows(&traffic), &paired, &floor_check);
        return Ok(());
    };
    let api_load = apiload::run(&bins, &api_load_cfg).context("API load (scenario 7)")?;
    let (cri_rounds, cri_pods) = if quick { (2, 5) } else { (4, 10) };
    let cri_sandbox = crisandbox::run(cri_rounds, cri_pods)
        .context("RunPodSandbox through containerd (scenario 8)")?;

    let image_dir = args
        .image_dir
        .clone()
        .unwrap_or_else(|| args.out_dir.join("target/image"));
    let image = imagesize::read_dir(&image_dir).unwrap_or_else(|e| {
        eprintln!("bench: no image sizes: {e:#}");
        Vec::new()
    });
    let rows = report::traffic_rows(&traffic);
    let mut goals = report::cpu_goals(&paired);
    goals.extend(report::fallback_rows(&paired));
    goals.extend(report::baseline_goals(&paired));
    goals.extend(report::long_lived_goals(&paired));
    goals.extend(report::goals(&rows, &pods, &restart));
    goals.extend(report::upgrade_goals(&upgrade));
    goals.extend(report::api_goals(&api_load));
    goals.push(report::cri_sandbox_row(&cri_sandbox));
    goals.extend(report::image_rows(
        &image,
        &start_empty,
        pods.restart_to_ready.as_ref(),
    ));
    goals.extend(report::chain_goals(&chain));
    goals.push(report::probe_goal(&probe_cost, Some(start_empty.ready_ms)));
    let notes = read_notes(&args.out_dir);
    let results = report::Results {
        command: args
            .command
            .unwrap_or_else(|| format!("cargo xtask bench{}", if quick { " --quick" } else { "" })),
        quick,
        unix_time: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        git_commit: git_commit(&args.out_dir),
        duration_secs: started.elapsed().as_secs_f64(),
        machine: report::Machine::probe(loadavg_start),
        traffic_config: cfg,
        traffic: rows,
        pod_setup: pods,
        restart,
        api_load: Some(api_load),
        cri_sandbox: Some(cri_sandbox),
        upgrade,
        image,
        start_empty: Some(start_empty),
        goals,
        floor_check,
        baseline,
        pair_rounds,
        chain: Some(chain),
        probe_cost: Some(probe_cost),
        notes,
    };
    report::write(&args.out_dir, &results)?;
    for g in &results.goals {
        let met = match g.met {
            Some(true) => "met",
            Some(false) => "MISSED",
            None => "n/a",
        };
        eprintln!("goal {met:>6}: {} — {}", g.goal, g.observed);
    }
    eprintln!(
        "bench: wrote {} and tests/bench/results.json, tests/bench/chart.svg ({:.0} s)",
        args.out_dir.join("BENCHMARKS.md").display(),
        results.duration_secs
    );
    Ok(())
}
