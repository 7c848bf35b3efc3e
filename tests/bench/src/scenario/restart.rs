//! Scenario 6: the agent is SIGKILLed and restarted while clients in a meshed pod keep
//! opening connections; every failed connection is counted.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::{
    node::{APP_UID, AgentProc, run_load},
    scenario::traffic::{Mode, Topology},
    workload::load::{Kind, LoadArgs},
};

/// Width of the load's time buckets.
const BUCKET_MS: u64 = 100;

/// One kill/restart under load.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RestartRound {
    /// From the load's start to the SIGKILL.
    pub kill_at_ms: f64,
    /// From the SIGKILL to the new agent answering on its socket.
    pub down_ms: f64,
    /// Connections that succeeded / failed over the whole run.
    pub ok: u64,
    pub failed: u64,
    pub errors: std::collections::BTreeMap<String, u64>,
    /// Failures from the kill to one second after the new agent answered.
    pub failed_in_window: u64,
    /// Connections the pod's proxy accepted during the run.
    pub through_proxy: u64,
    /// (ok, failed) per 100 ms.
    pub series: Vec<(u64, u64)>,
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// Runs `rounds` kill/restart cycles, each under `duration_ms` of load with the kill at
/// `kill_at_ms`.
pub fn run(
    me: &std::path::Path,
    topo: &Topology,
    agent: &mut AgentProc,
    rounds: usize,
    duration_ms: u64,
    kill_at_ms: u64,
    concurrency: usize,
) -> anyhow::Result<Vec<RestartRound>> {
    let (pod, _) = topo.ebpf_pod()?;
    let placement = pod.container(APP_UID);
    let args = LoadArgs {
        kind: Kind::Rr,
        target: topo.upstream(),
        concurrency,
        duration_ms,
        warmup_ms: 0,
        series_ms: Some(BUCKET_MS),
    };
    let mut out = Vec::new();
    for round in 0..rounds {
        let before = topo.proxy_counters(Mode::Ebpf)?;
        let pods_before = agent.status()?;
        let (result, t_kill, t_ready) = std::thread::scope(|s| -> anyhow::Result<_> {
            let load = s.spawn(|| run_load(me, &placement, &args));
            std::thread::sleep(Duration::from_millis(kill_at_ms));
            let t_kill = now_us();
            agent.kill();
            let spawned = agent.spawn();
            let t_ready = now_us();
            let result = load
                .join()
                .map_err(|_| anyhow::anyhow!("load thread panicked"))?;
            spawned?;
            Ok((result?, t_kill, t_ready))
        })?;
        let after = topo.proxy_counters(Mode::Ebpf)?;
        let pods_after = agent.status()?;
        if pods_after != pods_before {
            anyhow::bail!("the restarted agent knows {pods_after} pods, not {pods_before}");
        }
        let bucket = |t: u64| (t.saturating_sub(result.start_unix_us) / 1000 / BUCKET_MS) as usize;
        let (from, to) = (
            bucket(t_kill),
            bucket(t_ready) + (1000 / BUCKET_MS) as usize,
        );
        let failed_in_window: u64 = result
            .series
            .iter()
            .enumerate()
            .filter(|(i, _)| *i >= from && *i <= to)
            .map(|(_, b)| b.1)
            .sum();
        let r = RestartRound {
            kill_at_ms: t_kill.saturating_sub(result.start_unix_us) as f64 / 1e3,
            down_ms: (t_ready - t_kill) as f64 / 1e3,
            ok: result.series.iter().map(|b| b.0).sum(),
            failed: result.failed,
            errors: result.errors,
            failed_in_window,
            through_proxy: after.outbound - before.outbound,
            series: result.series,
        };
        eprintln!(
            "bench: agent restart {round}: down {:.0} ms, {} connections ok, {} failed ({} around the restart), {} through the proxy",
            r.down_ms, r.ok, r.failed, r.failed_in_window, r.through_proxy
        );
        out.push(r);
    }
    Ok(out)
}
