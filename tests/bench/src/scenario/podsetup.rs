//! Scenarios 4 and 5: CNI ADD and DEL latency through the real plugin against the real agent
//! with 1, 100 and 1,000 pods registered, and the agent's footprint at 1,000 pods.
//!
//! A pod here is a netns (lo up) and a cgroup, made in-process ([`crate::node::fastns`]). Each
//! measured ADD runs the plugin binary as a runtime does (spawn to exit: the agent answers
//! once the programs are attached and the maps written, so exit means "in force"), then a
//! probe inside the pod checks that its connects are redirected; DEL is timed the same way and
//! the probe checks they no longer are.

use std::{
    io::{BufRead, BufReader, Write},
    path::Path,
    process::{ChildStdin, ChildStdout, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use linkerd_cni_common::paths;
use linkerd_cni_tests::{CgroupGuard, ChildGuard, Placement};
use serde::{Deserialize, Serialize};

use crate::{
    measure::stats,
    node::{AgentProc, Api, Cni, CniPod, fastns::LightPod},
};

/// The long-lived probe process.
pub struct Prober {
    _child: ChildGuard,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Prober {
    pub fn start(me: &Path, home: &CgroupGuard) -> anyhow::Result<Self> {
        let mut cmd = Placement::new().cgroup(home).command(me)?;
        cmd.arg("probe")
            .arg("--home")
            .arg(home.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        let mut child = ChildGuard::spawn(&mut cmd)?;
        let stdin = child.child_mut().stdin.take().context("probe stdin")?;
        let stdout = BufReader::new(child.child_mut().stdout.take().context("probe stdout")?);
        Ok(Self {
            _child: child,
            stdin,
            stdout,
        })
    }

    /// `redirected`, `direct` or `other ...`.
    pub fn check(&mut self, pod: &LightPod) -> anyhow::Result<String> {
        writeln!(
            self.stdin,
            "{} {}",
            pod.cgroup.display(),
            pod.netns.display()
        )?;
        self.stdin.flush()?;
        let mut line = String::new();
        self.stdout.read_line(&mut line)?;
        Ok(line.trim().to_string())
    }
}

/// ADD and DEL latencies with `registered` pods already registered.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Checkpoint {
    pub registered: usize,
    pub add_ms: Vec<f64>,
    pub del_ms: Vec<f64>,
    pub add_p50_ms: f64,
    pub add_p99_ms: f64,
    pub del_p50_ms: f64,
    pub del_p99_ms: f64,
    /// Agent VmRSS at this point, KiB.
    pub agent_rss_kib: u64,
    /// The map walks every ADD and DEL makes, timed here with the agent library.
    pub scans: Vec<crate::measure::diag::Scan>,
    /// One `remove_pod` of an unknown pod (all those walks plus the deletes), ms.
    pub remove_pod_ms: f64,
    /// Opening the registry and reading every record from disk (what an agent start does;
    /// ADD and DEL use the agent's in-memory registry), ms.
    pub registry_all_ms: f64,
    /// The plugin answering VERSION, spawn to exit (no agent): the floor of a CNI call, p50 ms.
    pub plugin_floor_p50_ms: f64,
    /// A minimal static binary (reads stdin to the end, exits 0; 151 bytes) spawned exactly as the plugin is, one
    /// right after each measured ADD: the machine's exec floor, p50 ms (0: not measured).
    #[serde(default)]
    pub exec_floor_p50_ms: f64,
    /// Where the agent's resident memory is at this point.
    #[serde(default)]
    pub agent_mem: crate::measure::scale::MemBreakdown,
    /// The agent's own handling of the measured ADDs and DELs (its phase log: from taking the
    /// request's netns to the registry write), p50 in µs; 0: not found in the log.
    #[serde(default)]
    pub agent_add_p50_us: f64,
    #[serde(default)]
    pub agent_del_p50_us: f64,
    /// The agent's last reap pass before this checkpoint was read (its log), if any.
    #[serde(default)]
    pub reap_pass: Option<ReapPass>,
    /// The agent's own time in the order checks of the measured ADDs (the `order` phase of
    /// its phase log: where our programs run among other tenants'), p50 µs; 0: not found.
    #[serde(default)]
    pub agent_add_order_p50_us: f64,
    /// Reconcile passes over every registered pod, asked for with SIGHUP (None: not measured).
    #[serde(default)]
    pub reconcile: Option<ReconcileCost>,
}

/// One reconcile pass, as the agent's log reports it (`reconcile pass` at debug level, `slow
/// reconcile pass` at info level).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReconcilePass {
    /// Registrations verified.
    pub checked: u64,
    /// Wall time, µs.
    pub wall_us: u64,
    /// CPU time of the thread that ran it, µs.
    pub cpu_us: u64,
    /// The part of `cpu_us` spent reading where each pod's programs run among other tenants'.
    pub order_cpu_us: u64,
}

/// What verifying every registered pod once costs the agent: as many reconcile passes as it
/// takes (each verifies up to `PODS_PER_PASS` pods, continuing where the last stopped).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReconcileCost {
    /// The passes, in order.
    pub passes: Vec<ReconcilePass>,
    /// `bpf()` calls of every thread of the agent over one more pass (strace -c), and the pods
    /// that pass verified (None: strace not available).
    pub bpf_calls: Option<(u64, u64)>,
}

impl ReconcileCost {
    /// Pods verified over the passes.
    pub fn checked(&self) -> u64 {
        self.passes.iter().map(|p| p.checked).sum()
    }

    /// CPU time over the passes, ms.
    pub fn cpu_ms(&self) -> f64 {
        self.passes.iter().map(|p| p.cpu_us).sum::<u64>() as f64 / 1e3
    }

    /// The order checks' part of [`Self::cpu_ms`], ms.
    pub fn order_cpu_ms(&self) -> f64 {
        self.passes.iter().map(|p| p.order_cpu_us).sum::<u64>() as f64 / 1e3
    }

    /// CPU time per pod verified, µs.
    pub fn cpu_us_per_pod(&self) -> f64 {
        self.cpu_ms() * 1e3 / self.checked().max(1) as f64
    }

    /// `bpf()` calls per pod verified.
    pub fn bpf_per_pod(&self) -> Option<f64> {
        self.bpf_calls
            .map(|(calls, pods)| calls as f64 / pods.max(1) as f64)
    }
}

/// Every reconcile pass in the agent's log, colour codes removed ([`strip_ansi`]), in order.
pub fn reconcile_passes(plain_log: &str) -> Vec<ReconcilePass> {
    plain_log
        .lines()
        .filter(|l| l.contains("reconcile pass"))
        .filter_map(|l| {
            let number = |name| log_field(l, name)?.parse().ok();
            Some(ReconcilePass {
                checked: number("checked")?,
                wall_us: number("wall_us")?,
                cpu_us: number("cpu_us")?,
                order_cpu_us: number("order_cpu_us")?,
            })
        })
        .collect()
}

/// The reconcile passes the agent logged after byte `offset` of its log.
fn passes_since(agent: &AgentProc, offset: u64) -> Vec<ReconcilePass> {
    let text = std::fs::read(agent.log_path()).unwrap_or_default();
    let tail = text.get(offset as usize..).unwrap_or_default();
    reconcile_passes(&strip_ansi(&String::from_utf8_lossy(tail)))
}

/// Asks the agent for reconcile passes (SIGHUP, one at a time) until they have verified
/// `registered` pods; then counts the `bpf()` calls of one more pass with strace (a pass
/// of its own: strace slows the calls it counts).
pub fn reconcile_cost(agent: &AgentProc, registered: usize) -> anyhow::Result<ReconcileCost> {
    let log_len = || std::fs::metadata(agent.log_path()).map_or(0, |m| m.len());
    let deadline = Instant::now() + Duration::from_secs(300);
    // Waits for the passes logged after `offset` to number more than `seen`.
    let wait_pass = |offset: u64, seen: usize| -> anyhow::Result<Vec<ReconcilePass>> {
        loop {
            let passes = passes_since(agent, offset);
            if passes.len() > seen {
                return Ok(passes);
            }
            if Instant::now() >= deadline {
                bail!("the agent logged no reconcile pass after SIGHUP (its log level?)");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    let offset = log_len();
    let mut passes = Vec::new();
    while passes
        .iter()
        .map(|p: &ReconcilePass| p.checked)
        .sum::<u64>()
        < registered as u64
    {
        agent.hangup()?;
        passes = wait_pass(offset, passes.len())?;
    }
    let bpf_calls = match linkerd_cni_tests::strace::available() {
        false => None,
        true => {
            let pid = agent.pid().context("agent not running")?;
            let counter = linkerd_cni_tests::strace::Counter::attach(pid, true, "bpf")?;
            let offset = log_len();
            agent.hangup()?;
            let counted = wait_pass(offset, 0);
            let calls = counter.finish()?;
            let pods = counted?.iter().map(|p| p.checked).sum();
            Some((calls.get("bpf").copied().unwrap_or(0), pods))
        }
    };
    Ok(ReconcileCost { passes, bpf_calls })
}

/// One pass of the agent's reaper over every registration (checking each pod's netns still
/// exists), as its log line reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReapPass {
    /// Registrations checked.
    pub checked: u64,
    /// Wall time, µs.
    pub wall_us: u64,
    /// CPU time of the thread that ran it, µs.
    pub cpu_us: u64,
}

/// The last reap pass in the agent's log, colour codes removed ([`strip_ansi`]): `reap pass`
/// at debug, `slow reap pass` at info.
pub fn last_reap_pass(plain_log: &str) -> Option<ReapPass> {
    plain_log
        .lines()
        .rev()
        .filter(|l| l.contains("reap pass"))
        .find_map(|l| {
            let number = |name| log_field(l, name)?.parse().ok();
            Some(ReapPass {
                checked: number("checked")?,
                wall_us: number("wall_us")?,
                cpu_us: number("cpu_us")?,
            })
        })
}

/// The agent's own time for operation `op` (`add`, `del`) of each container id in `ids`, µs,
/// from the phase lines of its log, colour codes removed ([`strip_ansi`]): `phases` at debug,
/// `slow operation` at info, each with `op`, `id` and `total_us`.
pub fn agent_handling_us(
    plain_log: &str,
    op: &str,
    ids: &std::collections::BTreeSet<&str>,
) -> Vec<f64> {
    agent_phase_us(plain_log, op, ids, "total_us")
}

/// Like [`agent_handling_us`], the time of one field of the phase lines: `total_us`, or a
/// phase's own (`order`: its value is `<n>us` inside the `phases` field).
pub fn agent_phase_us(
    plain_log: &str,
    op: &str,
    ids: &std::collections::BTreeSet<&str>,
    field: &str,
) -> Vec<f64> {
    let op_value = format!("\"{op}\"");
    plain_log
        .lines()
        .filter(|l| log_field(l, "op") == Some(op_value.as_str()))
        .filter_map(|l| {
            let id = log_field(l, "id")?.trim_matches('"');
            let value = match field {
                "total_us" => log_field(l, field)?,
                phase => log_field(l, phase)?.strip_suffix("us")?,
            };
            ids.contains(id)
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
        .collect()
}

/// The value of field `name` in one line of the agent's log (` name=value`, up to the next
/// space; strings keep their quotes).
fn log_field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    line.split(&format!(" {name}="))
        .nth(1)?
        .split_whitespace()
        .next()
}

/// `text` without ANSI escape sequences (`ESC [ ... letter`): the agent's log file has them
/// around field names.
pub fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// One pinned map's kernel memory.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MapMem {
    pub name: String,
    pub kind: String,
    pub max_entries: u64,
    pub bytes_memlock: u64,
}

/// The agent's footprint with the most pods registered.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Footprint {
    pub registered: usize,
    pub agent_rss_kib: u64,
    pub agent_hwm_kib: u64,
    /// Heap and stacks / mapped files (the 18 MB binary with its embedded eBPF object), KiB.
    pub agent_anon_kib: u64,
    pub agent_file_kib: u64,
    /// RSS after the pods' API objects were deleted (the agent's pod cache emptied), KiB.
    pub agent_rss_without_api_pods_kib: u64,
    pub agent_rss_1_pod_kib: u64,
    pub maps: Vec<MapMem>,
    pub maps_total_bytes: u64,
    /// bpf_links pinned for the pods.
    pub links: usize,
    /// Agent restart (spawn to answering) with this many pods to adopt, ms.
    pub restart_ready_ms: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PodSetupResults {
    pub checkpoints: Vec<Checkpoint>,
    /// The agent stopped (SIGTERM) and started again at the first checkpoint with
    /// [`RESTART_READY_PODS`] or more registered pods: its start to `/ready`.
    #[serde(default)]
    pub restart_to_ready: Option<crate::node::StartToReady>,
    pub footprint: Footprint,
    /// Seconds spent filling the node (pods made and added).
    pub fill_secs: f64,
}

struct Registered {
    pod: LightPod,
    uid: String,
}

fn cni_pod<'a>(r: &'a Registered, n: usize) -> CniPod<'a> {
    CniPod {
        id: &r.pod.name,
        name: &r.pod.name,
        uid: &r.uid,
        netns: &r.pod.netns,
        cgroup: Some(&r.pod.cgroup),
        ip: std::net::Ipv4Addr::new(10, 245, (n / 250) as u8, (n % 250 + 2) as u8),
    }
}

fn make_pods(count: usize, parent: &Path, api: &Api) -> anyhow::Result<Vec<Registered>> {
    let pods = LightPod::create_many(count, parent)?;
    pods.into_iter()
        .map(|pod| {
            let uid = format!("{}-uid", pod.name);
            api.add_pod(&pod.name, &uid)?;
            Ok(Registered { pod, uid })
        })
        .collect()
}

/// Reads `bpftool -j map show pinned <path>` for every pinned map under `dir`.
pub fn map_memory(dir: &Path) -> anyhow::Result<Vec<MapMem>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = e?.path();
        let o = std::process::Command::new("bpftool")
            .args(["-j", "map", "show", "pinned"])
            .arg(&path)
            .output()?;
        if !o.status.success() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_slice(&o.stdout)?;
        out.push(MapMem {
            name: v["name"].as_str().unwrap_or_default().to_string(),
            kind: v["type"].as_str().unwrap_or_default().to_string(),
            max_entries: v["max_entries"].as_u64().unwrap_or(0),
            bytes_memlock: v["bytes_memlock"].as_u64().unwrap_or(0),
        });
    }
    out.sort_by_key(|m| std::cmp::Reverse(m.bytes_memlock));
    Ok(out)
}

fn count_links(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| std::fs::read_dir(e.path()).map(|x| x.count()).unwrap_or(0))
                .sum()
        })
        .unwrap_or(0)
}

/// The registered pods of the start-to-ready measurement after a restart (issue 24's row).
pub const RESTART_READY_PODS: usize = 1000;

/// Runs scenarios 4 and 5. `checkpoints` are the registered-pod counts (ascending);
/// `samples` ADD/DEL pairs are measured at each.
pub fn run(
    me: &Path,
    api: &Api,
    agent: &mut AgentProc,
    cni: &Cni,
    checkpoints: &[usize],
    samples: usize,
) -> anyhow::Result<PodSetupResults> {
    let parent = CgroupGuard::new()?;
    let home = CgroupGuard::new()?;
    let mut prober = Prober::start(me, &home)?;
    let exec_floor = crate::measure::scale::ExecFloor::new()?;
    let mut filler: Vec<Registered> = Vec::new();
    let mut out = Vec::new();
    let mut fill_secs = 0.0;
    let mut rss_1 = 0;
    let mut counter = 0usize;
    let mut restart_to_ready = None;
    let result = (|| -> anyhow::Result<PodSetupResults> {
        for &target in checkpoints {
            // Re-read the count: the agent also drops registrations whose netns went away.
            loop {
                let base = agent.status()?;
                if base >= target {
                    break;
                }
                let t0 = Instant::now();
                let new = make_pods(target - base, parent.path(), api)?;
                for r in new {
                    counter += 1;
                    cni.invoke("ADD", &cni_pod(&r, counter))?;
                    filler.push(r);
                }
                fill_secs += t0.elapsed().as_secs_f64();
            }
            let registered = agent.status()?;
            let measured = make_pods(samples, parent.path(), api)?;
            // Let the agent's watch cache see the new pod objects, as it would in a cluster
            // (pods exist well before their sandbox).
            std::thread::sleep(Duration::from_millis(300));
            let (mut add_ms, mut del_ms, mut exec_ms) = (Vec::new(), Vec::new(), Vec::new());
            for r in &measured {
                counter += 1;
                let pod = cni_pod(r, counter);
                add_ms.push(cni.invoke("ADD", &pod)?.as_secs_f64() * 1e3);
                if let Some(f) = &exec_floor {
                    exec_ms.push(f.once(&cni.netconf_bytes(&pod)?)?);
                }
                let state = prober.check(&r.pod)?;
                if state != "redirected" {
                    bail!(
                        "after ADD of {}, its connects are not redirected: {state}",
                        r.pod.name
                    );
                }
                del_ms.push(cni.invoke("DEL", &pod)?.as_secs_f64() * 1e3);
                let state = prober.check(&r.pod)?;
                if state != "direct" {
                    bail!(
                        "after DEL of {}, its connects are still redirected: {state}",
                        r.pod.name
                    );
                }
            }
            for r in &measured {
                let _ = api.delete_pod(&r.pod.name);
            }
            let log = strip_ansi(&std::fs::read_to_string(agent.log_path()).unwrap_or_default());
            let ids: std::collections::BTreeSet<&str> =
                measured.iter().map(|r| r.pod.name.as_str()).collect();
            let handled = |op: &str| {
                let v = agent_handling_us(&log, op, &ids);
                match v.is_empty() {
                    true => 0.0,
                    false => stats::percentile(&v, 0.5),
                }
            };
            let (agent_add_p50_us, agent_del_p50_us) = (handled("add"), handled("del"));
            let order = agent_phase_us(&log, "add", &ids, "order");
            let agent_add_order_p50_us = match order.is_empty() {
                true => 0.0,
                false => stats::percentile(&order, 0.5),
            };
            let reap_pass = last_reap_pass(&log);
            drop(log);
            let reconcile = reconcile_cost(agent, registered)?;
            drop(measured);
            let rss = agent.rss()?.rss;
            let agent_mem =
                crate::measure::scale::MemBreakdown::of(agent.pid().context("agent not running")?)?;
            let (scans, remove_pod_ms) =
                crate::measure::diag::scan_costs(&agent.pin_root().join(paths::PIN_MAPS))?;
            let registry_all_ms = crate::measure::diag::registry_cost(agent.state_dir())?;
            let mut floor = Vec::new();
            for _ in 0..samples.min(50) {
                floor.push(cni.version()?.as_secs_f64() * 1e3);
            }
            if rss_1 == 0 {
                rss_1 = rss;
            }
            let cp = Checkpoint {
                registered,
                add_p50_ms: stats::percentile(&add_ms, 0.5),
                add_p99_ms: stats::percentile(&add_ms, 0.99),
                del_p50_ms: stats::percentile(&del_ms, 0.5),
                del_p99_ms: stats::percentile(&del_ms, 0.99),
                add_ms,
                del_ms,
                agent_rss_kib: rss,
                scans,
                remove_pod_ms,
                registry_all_ms,
                plugin_floor_p50_ms: stats::percentile(&floor, 0.5),
                exec_floor_p50_ms: match exec_ms.is_empty() {
                    true => 0.0,
                    false => stats::percentile(&exec_ms, 0.5),
                },
                agent_mem,
                agent_add_p50_us,
                agent_del_p50_us,
                reap_pass,
                agent_add_order_p50_us,
                reconcile: Some(reconcile),
            };
            if let Some(r) = &cp.reconcile {
                eprintln!(
                    "bench: reconcile with {registered} registered: {} passes, {} pods verified, \
                     CPU {:.1} ms ({:.1} µs per pod; order checks {:.1} ms), bpf() calls per pod \
                     {:?}; agent's own ADD order phase p50 {:.0} µs",
                    r.passes.len(),
                    r.checked(),
                    r.cpu_ms(),
                    r.cpu_us_per_pod(),
                    r.order_cpu_ms(),
                    r.bpf_per_pod(),
                    cp.agent_add_order_p50_us
                );
            }
            eprintln!(
                "bench: pod setup with {registered} registered: ADD p50 {:.2} ms p99 {:.2} ms, DEL p50 {:.2} ms p99 {:.2} ms, agent's own ADD p50 {:.0} µs DEL p50 {:.0} µs, last reap pass {:?}, agent RSS {} KiB, map walks {:.2} ms, registry read {:.2} ms, plugin floor {:.2} ms, exec floor {:.2} ms, agent memory {:?} {:?}",
                cp.add_p50_ms,
                cp.add_p99_ms,
                cp.del_p50_ms,
                cp.del_p99_ms,
                cp.agent_add_p50_us,
                cp.agent_del_p50_us,
                cp.reap_pass,
                rss,
                cp.remove_pod_ms,
                cp.registry_all_ms,
                cp.plugin_floor_p50_ms,
                cp.exec_floor_p50_ms,
                cp.agent_mem,
                cp.scans
                    .iter()
                    .map(|s| format!("{} {} entries {:.2} ms", s.map, s.entries, s.ms))
                    .collect::<Vec<_>>()
            );
            out.push(cp);
            if restart_to_ready.is_none() && registered >= RESTART_READY_PODS {
                // As a rolling update replaces the agent's container: SIGTERM, a new process
                // on the same pins and registry.
                let before = agent.status()?;
                agent.terminate()?;
                let s = agent.spawn_until_ready()?;
                if s.registered != before {
                    bail!(
                        "after a restart the agent knows {} pods, not {before}",
                        s.registered
                    );
                }
                eprintln!(
                    "bench: agent restarted with {} registered pods: socket after {:.0} ms, \
                     /ready after {:.0} ms",
                    s.registered, s.socket_ms, s.ready_ms
                );
                restart_to_ready = Some(s);
            }
        }
        let registered = agent.status()?;
        let mem = agent.rss()?;
        for r in &filler {
            let _ = api.delete_pod(&r.pod.name);
        }
        std::thread::sleep(Duration::from_secs(2));
        let without_api_pods = agent.rss()?.rss;
        let maps = map_memory(&agent.pin_root().join(paths::PIN_MAPS))?;
        let links = count_links(&agent.pin_root().join(paths::PIN_PODS));
        agent.kill();
        let restart = agent.spawn()?;
        let adopted = agent.status()?;
        if adopted != registered {
            bail!("after a restart the agent knows {adopted} pods, not {registered}");
        }
        let footprint = Footprint {
            registered,
            agent_rss_kib: mem.rss,
            agent_hwm_kib: mem.hwm,
            agent_anon_kib: mem.anon,
            agent_file_kib: mem.file,
            agent_rss_without_api_pods_kib: without_api_pods,
            agent_rss_1_pod_kib: rss_1,
            maps_total_bytes: maps.iter().map(|m| m.bytes_memlock).sum(),
            maps,
            links,
            restart_ready_ms: restart.as_secs_f64() * 1e3,
        };
        eprintln!(
            "bench: footprint with {registered} pods: agent RSS {} KiB, maps {} KiB, {links} links, restart {:.0} ms",
            footprint.agent_rss_kib,
            footprint.maps_total_bytes / 1024,
            footprint.restart_ready_ms
        );
        Ok(PodSetupResults {
            restart_to_ready,
            checkpoints: out,
            footprint,
            fill_secs,
        })
    })();
    drop(prober);
    // The fillers stay registered until the agent goes (its pins are removed then); their
    // netns and cgroups go now.
    for r in &filler {
        let _ = api.delete_pod(&r.pod.name);
    }
    drop(filler);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The agent's log lines as its file holds them (colour codes around field names).
    #[test]
    fn agent_handling_from_its_phase_lines() {
        let log = "2026-11-25T18:16:42Z \u{1b}[34mDEBUG\u{1b}[0m \u{1b}[2mlinkerd_cni_agent::agent\u{1b}[0m\u{1b}[2m:\u{1b}[0m phases \u{1b}[3mop\u{1b}[0m\u{1b}[2m=\u{1b}[0m\"add\" \u{1b}[3mid\u{1b}[0m\u{1b}[2m=\u{1b}[0m\"pod-7\" \u{1b}[3mtotal_us\u{1b}[0m\u{1b}[2m=\u{1b}[0m1222 \u{1b}[3mphases\u{1b}[0m\u{1b}[2m=\u{1b}[0mnetns=378us
2026-11-25T18:16:43Z  INFO linkerd_cni_agent::agent: slow operation op=\"add\" id=\"pod-8\" total_us=6100 phases=netns=5000us
2026-11-25T18:16:43Z DEBUG linkerd_cni_agent::agent: phases op=\"del\" id=\"pod-7\" total_us=284 phases=detach=175us
2026-11-25T18:16:43Z DEBUG linkerd_cni_agent::agent: phases op=\"add\" id=\"filler-1\" total_us=300 phases=netns=1us
";
        let log = &strip_ansi(log);
        let ids: std::collections::BTreeSet<&str> = ["pod-7", "pod-8"].into_iter().collect();
        assert_eq!(agent_handling_us(log, "add", &ids), [1222.0, 6100.0]);
        assert_eq!(agent_handling_us(log, "del", &ids), [284.0]);
        assert!(agent_handling_us(log, "check", &ids).is_empty());
    }

    /// Every pass, at debug or (slow) at info level, in order; the ADD's order phase from its
    /// phases field.
    #[test]
    fn reconcile_passes_and_the_order_phase_from_the_agent_log() {
        let log = "2026-11-29T09:16:42Z \u{1b}[34mDEBUG\u{1b}[0m \u{1b}[2mlinkerd_cni_agent::agent::reconcile\u{1b}[0m\u{1b}[2m:\u{1b}[0m reconcile pass \u{1b}[3mchecked\u{1b}[0m\u{1b}[2m=\u{1b}[0m512 \u{1b}[3mrepaired\u{1b}[0m\u{1b}[2m=\u{1b}[0m0 \u{1b}[3mwall_us\u{1b}[0m\u{1b}[2m=\u{1b}[0m90000 \u{1b}[3mcpu_us\u{1b}[0m\u{1b}[2m=\u{1b}[0m80000 \u{1b}[3morder_cpu_us\u{1b}[0m\u{1b}[2m=\u{1b}[0m50000
2026-11-29T09:16:43Z  INFO linkerd_cni_agent::agent::reconcile: slow reconcile pass checked=100 repaired=1 wall_us=1200000 cpu_us=20000 order_cpu_us=9000
2026-11-29T09:16:43Z  INFO linkerd_cni_agent::agent: slow reap pass checked=10100 dropped=2 wall_us=150000 cpu_us=90000
2026-11-29T09:16:44Z DEBUG linkerd_cni_agent::agent: phases op=\"add\" id=\"pod-1\" total_us=300 phases=netns=1us attach_cgroup=90us order=120us registry=8us
";
        let log = &strip_ansi(log);
        let passes = reconcile_passes(log);
        assert_eq!(
            passes,
            [
                ReconcilePass {
                    checked: 512,
                    wall_us: 90_000,
                    cpu_us: 80_000,
                    order_cpu_us: 50_000
                },
                ReconcilePass {
                    checked: 100,
                    wall_us: 1_200_000,
                    cpu_us: 20_000,
                    order_cpu_us: 9_000
                }
            ]
        );
        let cost = ReconcileCost {
            passes,
            bpf_calls: Some((15_360, 512)),
        };
        assert_eq!(cost.checked(), 612);
        assert_eq!(cost.cpu_ms(), 100.0);
        assert_eq!(cost.order_cpu_ms(), 59.0);
        assert_eq!(cost.bpf_per_pod(), Some(30.0));
        let ids: std::collections::BTreeSet<&str> = ["pod-1"].into_iter().collect();
        assert_eq!(agent_phase_us(log, "add", &ids, "order"), [120.0]);
        assert_eq!(agent_phase_us(log, "add", &ids, "total_us"), [300.0]);
        assert!(agent_phase_us(log, "add", &ids, "stub_load").is_empty());
    }

    /// The last pass counts, at debug or (slow) at info level; other lines are skipped.
    #[test]
    fn last_reap_pass_from_the_agent_log() {
        let log = "2026-11-25T18:16:42Z \u{1b}[34mDEBUG\u{1b}[0m \u{1b}[2mlinkerd_cni_agent::agent\u{1b}[0m\u{1b}[2m:\u{1b}[0m reap pass \u{1b}[3mchecked\u{1b}[0m\u{1b}[2m=\u{1b}[0m100 \u{1b}[3mdropped\u{1b}[0m\u{1b}[2m=\u{1b}[0m0 \u{1b}[3mwall_us\u{1b}[0m\u{1b}[2m=\u{1b}[0m900 \u{1b}[3mcpu_us\u{1b}[0m\u{1b}[2m=\u{1b}[0m800
2026-11-25T18:16:52Z  INFO linkerd_cni_agent::agent: slow reap pass checked=10100 dropped=2 wall_us=150000 cpu_us=90000
2026-11-25T18:16:53Z DEBUG linkerd_cni_agent::agent: phases op=\"add\" id=\"pod-1\" total_us=300 phases=netns=1us
";
        let log = &strip_ansi(log);
        assert_eq!(
            last_reap_pass(log),
            Some(ReapPass {
                checked: 10_100,
                wall_us: 150_000,
                cpu_us: 90_000
            })
        );
        assert_eq!(
            last_reap_pass(log.lines().next().unwrap()),
            Some(ReapPass {
                checked: 100,
                wall_us: 900,
                cpu_us: 800
            })
        );
        assert_eq!(last_reap_pass("no such line"), None);
    }
}
