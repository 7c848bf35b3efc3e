//! RunPodSandbox through a real containerd 1.6 (CRI plugin, runc) with and without
//! `linkerd-cni` in the chain: the time kubelet waits for a sandbox, CNI ADD included
//! (bridge + host-local alone, against bridge + host-local + linkerd-cni with the agent
//! registering a meshed pod). Each sandbox is created as kubelet does (pod cgroup first) and
//! stopped and removed before the next; one warm-up sandbox per configuration is not counted.

use linkerd_cni_tests::node::{CriNode, PodSpec, namespace_manifest};

use crate::stats::{Summary, percentile};

/// Runs `pods` sandboxes per configuration and prints the times in milliseconds.
pub fn run(pods: usize) -> anyhow::Result<()> {
    println!("RunPodSandbox through containerd, {pods} sandboxes per configuration (ms)");
    println!(
        "{:<28} {:>8} {:>8} {:>8} {:>8}",
        "chain", "median", "p90", "min", "max"
    );
    for (label, linkerd) in [
        ("bridge + host-local", false),
        ("... + linkerd-cni (meshed)", true),
    ] {
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
        let s = Summary::of(&samples);
        println!(
            "{label:<28} {:>8.1} {:>8.1} {:>8.1} {:>8.1}",
            s.median,
            percentile(&samples, 0.9),
            s.min,
            s.max
        );
    }
    Ok(())
}
