//! Scenario 8: RunPodSandbox through a real containerd 1.6 (CRI plugin, runc) with and
//! without `linkerd-cni` in the chain: the time kubelet waits for a sandbox, CNI ADD included
//! (bridge + host-local alone, against bridge + host-local + linkerd-cni with the agent
//! registering a meshed pod). Each sandbox is created as kubelet does (pod cgroup first) and
//! stopped and removed before the next; one warm-up sandbox per configuration and round is not
//! counted. The two chains alternate round by round, each on its own containerd.

use std::fmt::Write as _;

use linkerd_cni_tests::node::{CriNode, PodSpec, namespace_manifest};
use serde::{Deserialize, Serialize};

use crate::measure::stats::{Summary, percentile};

/// One chain's RunPodSandbox times, in milliseconds.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ChainTimes {
    pub chain: String,
    pub samples_ms: Vec<f64>,
    pub summary: Summary,
    pub p90_ms: f64,
}

/// Both chains.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CriSandboxResults {
    pub rounds: usize,
    pub pods_per_round: usize,
    pub without: ChainTimes,
    pub with_linkerd: ChainTimes,
}

impl CriSandboxResults {
    /// Median with linkerd-cni over median without.
    pub fn ratio(&self) -> f64 {
        self.with_linkerd.summary.median / self.without.summary.median.max(f64::MIN_POSITIVE)
    }
}

const WITHOUT: &str = "bridge + host-local";
const WITH: &str = "bridge + host-local + linkerd-cni (meshed pod)";

/// Runs `rounds` alternating rounds of `pods` sandboxes per chain.
pub fn run(rounds: usize, pods: usize) -> anyhow::Result<CriSandboxResults> {
    let mut without = Vec::new();
    let mut with = Vec::new();
    for round in 0..rounds {
        // Alternate which chain goes first.
        let order = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for linkerd in order {
            let samples = one_round(linkerd, pods)?;
            if linkerd { &mut with } else { &mut without }.extend(samples);
        }
    }
    let times = |chain: &str, samples: Vec<f64>| ChainTimes {
        chain: chain.to_string(),
        summary: Summary::of(&samples),
        p90_ms: percentile(&samples, 0.9),
        samples_ms: samples,
    };
    Ok(CriSandboxResults {
        rounds,
        pods_per_round: pods,
        without: times(WITHOUT, without),
        with_linkerd: times(WITH, with),
    })
}

/// One containerd, `pods` counted sandboxes (after one warm-up), in ms.
fn one_round(linkerd: bool, pods: usize) -> anyhow::Result<Vec<f64>> {
    let node = CriNode::start_with(&[namespace_manifest("bench", &[])], linkerd)
        .map_err(|e| anyhow::anyhow!("starting containerd's node: {e}"))?;
    let mut samples = Vec::with_capacity(pods);
    for i in 0..=pods {
        let spec = PodSpec::meshed("bench", &format!("pod-{i}"));
        let step = |e: linkerd_cni_tests::Error| {
            anyhow::anyhow!("sandbox {i}: {e}\n{}", node.diagnostics())
        };
        node.create_pod_cgroup(&spec).map_err(step)?;
        let sandbox = node.run_pod(&spec).map_err(step)?;
        if i > 0 {
            samples.push(sandbox.run_time.as_secs_f64() * 1000.0);
        }
        node.stop_pod(&sandbox).map_err(step)?;
        node.remove_pod(&sandbox).map_err(step)?;
    }
    Ok(samples)
}

/// The report's section for scenario 8.
pub fn markdown(r: &CriSandboxResults) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "\n## 8. RunPodSandbox through containerd, with and without linkerd-cni\n\n\
         A real containerd 1.6 (CRI, runc) on the simulated node, driven over CRI v1 as kubelet \
         drives it (pod cgroup first, then RunPodSandbox; StopPodSandbox and RemovePodSandbox \
         after each). {} rounds of {} sandboxes per chain, chains alternating, each round on a \
         fresh containerd with one uncounted warm-up sandbox. Times in ms: the whole \
         RunPodSandbox call (sandbox container, netns, every plugin of the chain).\n",
        r.rounds, r.pods_per_round
    );
    let _ = writeln!(
        md,
        "| chain | median | p90 | min | max |\n|---|---|---|---|---|"
    );
    for c in [&r.without, &r.with_linkerd] {
        let _ = writeln!(
            md,
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} |",
            c.chain, c.summary.median, c.p90_ms, c.summary.min, c.summary.max
        );
    }
    let _ = writeln!(
        md,
        "\nWith linkerd-cni: {:.2} × the median without ({:+.1} ms).",
        r.ratio(),
        r.with_linkerd.summary.median - r.without.summary.median
    );
    md
}

/// Prints the section (the `cri-sandbox` subcommand).
pub fn print(rounds: usize, pods: usize) -> anyhow::Result<()> {
    println!("{}", markdown(&run(rounds, pods)?));
    Ok(())
}
