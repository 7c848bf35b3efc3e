//! Where the agent's per-pod time goes: the cost of the full map scans the agent makes on
//! every ADD and DEL (`Maps::remove_pod` walks every per-pod map to find the pod's entries),
//! measured on the live pinned maps with the agent library itself, and of the registry read
//! every DEL makes (`Registry::all`, one JSON file per pod).

use std::{path::Path, time::Instant};

use linkerd_cni_agent::maps::Maps;
use serde::{Deserialize, Serialize};

/// One map walk.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Scan {
    pub map: String,
    pub entries: usize,
    pub ms: f64,
}

/// Walks every map `remove_pod` walks and times each walk, then times a `remove_pod` of a
/// netns cookie nobody has (cookie 0: the kernel starts counting at 1).
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
    maps.remove_pod(0)?;
    Ok((out, t0.elapsed().as_secs_f64() * 1e3))
}

/// Times `Registry::all` over the agent's state directory (what every DEL reads), ms.
pub fn registry_cost(state_dir: &Path) -> anyhow::Result<f64> {
    let registry = linkerd_cni_agent::registry::Registry::open(state_dir)?;
    let t0 = Instant::now();
    let n = registry.all()?.len();
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    anyhow::ensure!(n > 0, "the registry at {} is empty", state_dir.display());
    Ok(ms)
}
