//! The kernel's BPF run-time statistics for the agent's programs.
//!
//! [`Stats::enable`] turns them on with `BPF_ENABLE_STATS(BPF_STATS_RUN_TIME)`: they stay on
//! while the returned fd is open (the `kernel.bpf_stats_enabled` sysctl is never touched, so
//! nothing is left on if the run is killed). Each program then has `run_cnt` and `run_time_ns`
//! (time inside the program, measured by the kernel around each run).
//!
//! Only our agent's programs are read: the ids of the programs pinned under its pin root and
//! of the programs behind the links pinned there (the per-pod `sk_lookup` stubs), so programs
//! of the same names loaded by anything else on the machine are not counted. A tail-called
//! program's time is counted in the program that called it (the stub, for `sk_lookup`).

use std::{
    collections::{BTreeMap, BTreeSet},
    os::fd::{AsRawFd, OwnedFd},
    path::Path,
};

use aya::programs::loaded_programs;
use serde::{Deserialize, Serialize};

/// Run count and run time of one program (or the sum over programs of the same name).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProgStats {
    pub runs: u64,
    pub ns: u64,
}

/// Per program name.
pub type Snapshot = BTreeMap<String, ProgStats>;

/// Run-time statistics switched on for as long as this lives.
pub struct Stats {
    _fd: OwnedFd,
}

impl Stats {
    pub fn enable() -> anyhow::Result<Self> {
        let fd = aya::sys::enable_stats(aya::sys::Stats::RunTime)
            .map_err(|e| anyhow::anyhow!("BPF_ENABLE_STATS: {e}"))?;
        Ok(Self { _fd: fd })
    }
}

/// The ids of the programs pinned under `pin_root` or run by links pinned there.
pub fn program_ids(pin_root: &Path) -> BTreeSet<u32> {
    let mut ids = BTreeSet::new();
    let mut dirs = vec![pin_root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                dirs.push(path);
            } else if let Some(id) = pinned_prog_id(&path) {
                ids.insert(id);
            }
        }
    }
    ids
}

/// The program of a pinned program or link: the `prog_id` its fd shows in
/// `/proc/self/fdinfo` (a link's fdinfo carries its program's id too; a map's has none).
fn pinned_prog_id(path: &Path) -> Option<u32> {
    let fd = linkerd_cni_sys::bpf::obj_get(path).ok()?;
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("prog_id:"))
        .and_then(|v| v.trim().parse().ok())
}

/// The counters of the programs in `ids`, summed per name.
pub fn snapshot(ids: &BTreeSet<u32>) -> Snapshot {
    let mut out = Snapshot::new();
    for info in loaded_programs().flatten() {
        if !ids.contains(&info.id()) {
            continue;
        }
        let name = info.name_as_str().unwrap_or("?").to_string();
        let s = out.entry(name).or_default();
        s.runs += info.run_count();
        s.ns += info.run_time().as_nanos() as u64;
    }
    out
}

/// `b - a`, per name (names only in `b` count from 0).
pub fn delta(a: &Snapshot, b: &Snapshot) -> Snapshot {
    b.iter()
        .map(|(name, s)| {
            let before = a.get(name).copied().unwrap_or_default();
            (
                name.clone(),
                ProgStats {
                    runs: s.runs.saturating_sub(before.runs),
                    ns: s.ns.saturating_sub(before.ns),
                },
            )
        })
        .collect()
}
