//! `linkerd-cni-bench`: eBPF redirection against Linkerd's iptables rules and against no
//! interception, on a simulated node (run it through `cargo xtask bench [--quick]`).
//!
//! `run` drives the whole benchmark and writes `BENCHMARKS.md`, `tests/bench/results.json` and
//! `tests/bench/chart.svg`. The other subcommands are the pieces it starts inside pods: `proxy`,
//! `server`, `load` and `probe`.
//!
//! Layers, top first (each folder imports only from the folders below it, kept by
//! `xtask/tests/layers.rs`): [`run`] (the `run` subcommand), [`report`] (results, goals,
//! markdown, chart), [`scenario`] (what is measured: [`scenario::traffic`] (scenarios 1-3),
//! [`scenario::podsetup`] (4-5), [`scenario::restart`] (6), [`scenario::apiload`] (7),
//! [`scenario::crisandbox`] (8), [`scenario::upgrade`] (9), [`scenario::chain`],
//! [`scenario::imagesize`]), [`node`] (the agent, plugin, API server and placed processes),
//! [`workload`] (the processes placed in pods: proxy, server, load generator, probe) and
//! [`measure`] (CPU, BPF statistics, memory, statistics over samples).

mod measure;
mod node;
mod report;
mod run;
mod scenario;
mod workload;

use std::{net::SocketAddr, path::PathBuf};

use anyhow::Context;
use clap::{Parser, Subcommand};

use crate::{
    scenario::crisandbox,
    workload::{load, probe, proxy, server},
};

#[derive(Parser)]
#[command(about = "linkerd-cni benchmarks: ebpf vs iptables vs direct on a simulated node")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run every scenario and write the report.
    Run(run::RunArgs),
    /// Re-render BENCHMARKS.md and tests/bench/chart.svg from tests/bench/results.json (after editing
    /// tests/bench/ANALYSIS.md).
    Render {
        #[arg(long, default_value = ".")]
        out_dir: PathBuf,
    },
    /// RunPodSandbox time through a real containerd (CRI), with and without linkerd-cni in
    /// the chain (printed, not part of the report).
    CriSandbox {
        /// Counted sandboxes per chain and round.
        #[arg(long, default_value_t = 10)]
        pods: usize,
        /// Rounds (the chains alternate).
        #[arg(long, default_value_t = 2)]
        rounds: usize,
    },
    /// (internal) The load generator.
    Load {
        #[command(flatten)]
        args: load::LoadArgs,
        /// Write a mark line on stderr at both edges of the measured window.
        #[arg(long)]
        mark: bool,
    },
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

fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
        Cmd::Run(args) => run::run(args),
        Cmd::Load { args, mark } => {
            let r = load::run(&args, mark);
            println!("{}", serde_json::to_string(&r)?);
            Ok(())
        }
        Cmd::Render { out_dir } => {
            let text = std::fs::read_to_string(out_dir.join("tests/bench/results.json"))
                .context("reading tests/bench/results.json")?;
            let mut results: report::Results = serde_json::from_str(&text)?;
            results.notes = run::read_notes(&out_dir);
            report::write(&out_dir, &results)
        }
        Cmd::Proxy(args) => proxy::run(args),
        Cmd::Server { listen } => server::run(listen),
        Cmd::Probe { home } => probe::run(&home),
        Cmd::CriSandbox { pods, rounds } => crisandbox::print(rounds, pods),
    }
}
