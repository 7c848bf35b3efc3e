//! Where the agent's per-pod time goes, measured on the live pinned maps with the agent
//! library itself: what a full walk of each map would cost, what a DEL's `Maps::remove_pod`
//! costs (entries deleted by key, only the live-connection map walked), and what loading the
//! registry costs (`Registry::open`, one JSON file per pod, done once at agent start).

use std::{path::Path, time::Instant};

use linkerd_cni_agent::dataplane::maps::Maps;
use serde::{Deserialize, Serialize};

/// One map walk.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Scan {
    pub map: String,
    pub entries: usize,
    pub ms: f64,
}

/// Walks every per-pod map and times each walk, then times a `remove_pod` of a netns cookie
/// nobody has (cookie 0: the kernel starts counting at 1).
pub fn scan_costs(maps_dir: &Path) -> anyhow::Result<(Vec<Scan>, f64)> {
    let mut maps = Maps::open(maps_dir)?;
    let mut out = Vec::new();
    let mut time = |map: &str, f: &mut dyn FnMut() -> usize| {
        let t0 = Instant::now();
        let entries = f();
        out.push(Scan {
            map: map.into(),
            entries,
            ms: t0.elapsed().as_secs_f64() * 1e3,
        });
    };
    time("l5d_port_sets", &mut || maps.port_sets.keys().count());
    time("l5d_addrs", &mut || maps.addrs.keys().count());
    time("l5d_conn_dst", &mut || maps.conn_dst.keys().count());
    time("l5d_pod_by_ip", &mut || maps.pod_by_ip.iter().count());
    time("l5d_listeners", &mut || maps.listeners.keys().count());
    let t0 = Instant::now();
    maps.remove_pod(
        0,
        &linkerd_cni_agent::dataplane::maps::PodEntries::default(),
    )?;
    Ok((out, t0.elapsed().as_secs_f64() * 1e3))
}

/// Times loading the registry from the agent's state directory (what an agent start reads), ms.
pub fn registry_cost(state_dir: &Path) -> anyhow::Result<f64> {
    let t0 = Instant::now();
    let registry = linkerd_cni_agent::agent::registry::Registry::open(state_dir)?;
    let n = registry.all()?.len();
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    anyhow::ensure!(n > 0, "the registry at {} is empty", state_dir.display());
    Ok(ms)
}
