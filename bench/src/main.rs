//! `linkerd-cni-bench`: eBPF redirection against Linkerd's iptables rules and against no
//! interception, on a simulated node (run it through `cargo xtask bench [--quick]`).
//!
//! `run` drives the whole benchmark and writes `BENCHMARKS.md`, `bench/results.json` and
//! `bench/chart.svg`. The other subcommands are the pieces it starts inside pods: `proxy`,
//! `server`, `load` and `probe`.
//!
//! Modules: [`traffic`] (scenarios 1-3), [`podsetup`] (4-5), [`restart`] (6), [`upgrade`] (7),
//! [`node`] (the agent, plugin, API server and placed processes), [`report`] (renderings).

mod diag;
mod fastns;
mod load;
mod node;
mod podsetup;
mod pool;
mod probe;
mod proxy;
mod report;
mod restart;
mod server;
mod stats;
mod traffic;
mod upgrade;

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    time::{Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use linkerd_cni_tests::CgroupGuard;

/// linkerd2-proxy's UID.
pub const PROXY_UID: u32 = 2102;
/// The proxy's outbound port.
pub const OUTBOUND_PORT: u16 = 4140;
/// The proxy's inbound port.
pub const INBOUND_PORT: u16 = 4143;

#[derive(Parser)]
#[command(about = "linkerd-cni benchmarks: ebpf vs iptables vs direct on a simulated node")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run every scenario and write the report.
    Run(RunArgs),
    /// Re-render BENCHMARKS.md and bench/chart.svg from bench/results.json (after editing
    /// bench/ANALYSIS.md).
    Render {
        #[arg(long, default_value = ".")]
        out_dir: PathBuf,
    },
    /// (internal) The load generator.
    Load(load::LoadArgs),
    /// (internal) The forwarding proxy.
    Proxy(proxy::ProxyArgs),
    /// (internal) The application server.
    Server {
        #[arg(long)]
        listen: SocketAddr,
    },
    /// (internal) The redirection probe.
    Probe {
        #[arg(long)]
        home: PathBuf,
    },
}

#[derive(clap::Args)]
struct RunArgs {
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
}

/// The hand-written analysis kept in bench/ANALYSIS.md, if any.
fn read_notes(root: &Path) -> Vec<String> {
    std::fs::read_to_string(root.join("bench/ANALYSIS.md"))
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

fn run(args: RunArgs) -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the benchmark creates netns, cgroups and BPF programs: run it as root");
    }
    let started = Instant::now();
    let loadavg_start = report::loadavg();
    let quick = args.quick;
    let bins = node::Bins::find()?;
    let cfg = if quick {
        traffic::TrafficConfig {
            rounds: 2,
            rr_ms: 1000,
            bulk_ms: 800,
            warmup_ms: 300,
            concurrency: 32,
            streams: 2,
        }
    } else {
        traffic::TrafficConfig {
            rounds: 5,
            rr_ms: 3000,
            bulk_ms: 2000,
            warmup_ms: 500,
            concurrency: 32,
            streams: 2,
        }
    };
    let (checkpoints, samples, restarts, restart_ms) = if quick {
        (vec![1, 100, 1000], 20, 1, 4000)
    } else {
        (vec![1, 100, 1000], 100, 3, 6000)
    };
    let upgrade_cfg = upgrade::UpgradeConfig {
        rounds: if quick { 1 } else { 2 },
        duration_ms: if quick { 3000 } else { 4000 },
        change_at_ms: 1000,
        concurrency: 4,
    };

    let api = node::Api::start()?;
    let shared_cgroup = CgroupGuard::new()?;
    let mut agent = node::AgentProc::start(&bins.agent, &api.kubeconfig, shared_cgroup.path())?;
    eprintln!("bench: agent running, PID {}", agent.pid().unwrap_or(0));
    let cni = node::Cni {
        plugin: bins.plugin.clone(),
        socket: agent.socket().to_path_buf(),
    };
    let outcome = (|| -> anyhow::Result<_> {
        let topo = traffic::Topology::build(&bins.me, &api, &cni)
            .context("building the simulated node")?;
        eprintln!(
            "bench: node ready ({:.1} s)",
            started.elapsed().as_secs_f64()
        );
        let traffic = if args.skip_traffic {
            Default::default()
        } else {
            traffic::run(&topo, &cfg)?
        };
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
        Ok((traffic, restart, upgrade, pods))
    })();
    let outcome = outcome
        .map_err(|e| anyhow::anyhow!("{e:#}\nagent log (last lines):\n{}", agent.log_tail()));
    drop(agent);
    let (traffic, restart, upgrade, pods) = outcome?;

    let rows = report::traffic_rows(&traffic);
    let mut goals = report::goals(&rows, &pods, &restart);
    goals.extend(report::upgrade_goals(&upgrade));
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
        upgrade,
        goals,
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
        "bench: wrote {} and bench/results.json, bench/chart.svg ({:.0} s)",
        args.out_dir.join("BENCHMARKS.md").display(),
        results.duration_secs
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
        Cmd::Run(args) => run(args),
        Cmd::Load(args) => {
            let r = load::run(&args);
            println!("{}", serde_json::to_string(&r)?);
            Ok(())
        }
        Cmd::Render { out_dir } => {
            let text = std::fs::read_to_string(out_dir.join("bench/results.json"))
                .context("reading bench/results.json")?;
            let mut results: report::Results = serde_json::from_str(&text)?;
            results.notes = read_notes(&out_dir);
            report::write(&out_dir, &results)
        }
        Cmd::Proxy(args) => proxy::run(args),
        Cmd::Server { listen } => server::run(listen),
        Cmd::Probe { home } => probe::run(&home),
    }
}
