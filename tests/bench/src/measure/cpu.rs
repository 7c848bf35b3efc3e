//! CPU cost of a measured window: machine-wide busy time from `/proc/stat`, and the CPU time
//! of the benchmark's own processes from `/proc/<pid>/stat`.
//!
//! Busy = user + nice + system + irq + softirq. Not counted: idle, iowait and steal (time the
//! hypervisor gave to other VMs). Guest time is not added: the kernel already counts it inside
//! user (and guest_nice inside nice), so it is in busy once; nothing here runs VMs anyway.
//!
//! The busy figure is what the issue judges on, and it includes every other tenant of the
//! machine. The companion figure ("own") sums user + system time of the processes taking part
//! in the exchange (load generator, proxy, servers): other tenants' work is not in it. This
//! kernel accounts CPU by ticks (no `CONFIG_IRQ_TIME_ACCOUNTING`), so softirq work, where most
//! of the network stack and netfilter run, is charged to whichever task it interrupted: to our
//! processes when they drive it (the usual case on loopback and veth), to a tenant's otherwise.
//! Both figures have the resolution of a clock tick (`CLK_TCK`, 10 ms) per CPU.

use std::time::Instant;

use serde::{Deserialize, Serialize};

/// The aggregate `cpu` line of `/proc/stat`, in clock ticks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcStat {
    pub user: u64,
    pub nice: u64,
    pub system: u64,
    pub idle: u64,
    pub iowait: u64,
    pub irq: u64,
    pub softirq: u64,
    pub steal: u64,
}

impl ProcStat {
    /// Parses the first (`cpu `) line of a `/proc/stat` text.
    pub fn parse(text: &str) -> Option<Self> {
        let line = text.lines().find(|l| l.starts_with("cpu "))?;
        let v: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .map(|f| f.parse().unwrap_or(0))
            .collect();
        let f = |i: usize| v.get(i).copied().unwrap_or(0);
        Some(Self {
            user: f(0),
            nice: f(1),
            system: f(2),
            idle: f(3),
            iowait: f(4),
            irq: f(5),
            softirq: f(6),
            steal: f(7),
        })
    }

    pub fn read() -> Self {
        std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|t| Self::parse(&t))
            .unwrap_or_default()
    }

    /// user + nice + system + irq + softirq (guest is inside user and nice already).
    pub fn busy(&self) -> u64 {
        self.user + self.nice + self.system + self.irq + self.softirq
    }
}

/// utime + stime of a process (all its threads, the exited ones included), from the text of
/// `/proc/<pid>/stat`, in clock ticks.
pub fn parse_pid_ticks(text: &str) -> Option<u64> {
    // `pid (comm) state ppid ...`: comm may hold spaces and parentheses; fields restart after
    // the last `)`. utime and stime are fields 14 and 15 (1-based), 12th and 13th after it.
    let rest = &text[text.rfind(')')? + 1..];
    let mut it = rest.split_whitespace().skip(11);
    let utime: u64 = it.next()?.parse().ok()?;
    let stime: u64 = it.next()?.parse().ok()?;
    Some(utime + stime)
}

/// utime + stime of `pids`, summed (a process that is gone counts 0).
pub fn pid_ticks(pids: &[u32]) -> u64 {
    pids.iter()
        .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/stat")).ok())
        .filter_map(|t| parse_pid_ticks(&t))
        .sum()
}

/// Nanoseconds per clock tick.
pub fn tick_ns() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    1e9 / if hz > 0 { hz as f64 } else { 100.0 }
}

/// One reading at a window's edge.
#[derive(Debug, Clone)]
pub struct Reading {
    at: Instant,
    stat: ProcStat,
    own: u64,
}

impl Reading {
    pub fn take(pids: &[u32]) -> Self {
        Self {
            at: Instant::now(),
            stat: ProcStat::read(),
            own: pid_ticks(pids),
        }
    }
}

/// CPU spent over a window, in nanoseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct CpuWindow {
    /// Wall-clock length of the window.
    pub secs: f64,
    /// Machine-wide busy time (all CPUs).
    pub busy_ns: f64,
    /// Machine-wide steal (reported, never counted as busy).
    pub steal_ns: f64,
    /// Of busy: irq + softirq.
    pub softirq_ns: f64,
    /// user + system of the processes taking part.
    pub own_ns: f64,
}

impl CpuWindow {
    pub fn between(a: &Reading, b: &Reading) -> Self {
        let t = tick_ns();
        let d = |x: u64, y: u64| y.saturating_sub(x) as f64 * t;
        Self {
            secs: (b.at - a.at).as_secs_f64(),
            busy_ns: d(a.stat.busy(), b.stat.busy()),
            steal_ns: d(a.stat.steal, b.stat.steal),
            softirq_ns: d(a.stat.irq + a.stat.softirq, b.stat.irq + b.stat.softirq),
            own_ns: d(a.own, b.own),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_busy_leaves_out_idle_iowait_and_steal() {
        let s = ProcStat::parse("cpu  10 2 30 1000 7 1 4 50 3 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")
            .expect("parses");
        assert_eq!(s.busy(), 10 + 2 + 30 + 1 + 4, "busy ticks");
        assert_eq!(s.steal, 50, "steal");
        assert_eq!(s.idle + s.iowait, 1007, "idle and iowait");
    }

    #[test]
    fn pid_stat_fields_after_a_comm_with_spaces() {
        let text = "42 (a b) c) S 1 42 42 0 -1 4194560 100 0 0 0 17 5 0 0 20 0 3 0 100 0 0\n";
        assert_eq!(parse_pid_ticks(text), Some(22), "utime 17 + stime 5");
    }
}
