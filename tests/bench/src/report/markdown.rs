//! `BENCHMARKS.md`: the sections, tables and goal rows of a run, as text.

use std::fmt::Write as _;

use linkerd_cni_proto::config;

use super::{
    results::{Results, TrafficRow},
    traffic_goals::BASELINE_MAX_RATIO,
};
use crate::{
    measure::stats::Summary,
    scenario::{
        podsetup::PodSetupResults,
        traffic::{Mode, Scenario},
        upgrade::{Change, PodRound},
    },
};

/// How CPU per connection is measured, the floor, and the eBPF programs' share.
pub fn cpu_markdown(r: &Results) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "### CPU per connection: how it is measured\n");
    let _ = writeln!(
        md,
        "**own CPU** (what the goals judge): user + system time (`/proc/<pid>/stat`, the \
         processes' rusage) of the processes taking part (load generator, proxy, the pod's \
         server, the upstream server) over the load's measured window (the load generator marks \
         both edges), divided by the exchanges completed in it; per MiB moved for the long-lived \
         connections. Other tenants' work is left out; this kernel accounts by ticks, so softirq \
         work (the network stack, netfilter) is in it when it ran on our processes' time, which \
         is the usual case on veth and loopback. **CPU µs/conn** (information): machine-wide \
         busy time from `/proc/stat` (user + nice + system + irq + softirq, all CPUs; idle, \
         iowait and steal are not counted) over the same window: it includes every other tenant \
         of the machine. Both have a clock tick's resolution (10 ms per CPU). Medians over the \
         rounds, min–max in parentheses; modes alternate.\n"
    );
    let _ = writeln!(
        md,
        "**The floor** is `direct`: its pod's netns never had a netfilter rule ({}). The \
         iptables modes pay twice on the same node: their REDIRECT rules, and conntrack, which is \
         active in a netns as soon as a `nat` rule exists there, so every packet of the pod, its \
         proxy's upstream leg included, goes through connection tracking; the eBPF mode adds no \
         netfilter rule anywhere. The bridge between the pods lives in a node netns without \
         rules either. `unmeshed` is a pod the agent does not redirect, the app talking to the \
         other side directly (no proxy), whose cgroup carries no program (per-pod attachment: \
         what a pod sees on a node with the agent); `unmeshed-shared` is the same pod with its \
         cgroup below the agent's shared attachment, so every program runs for its sockets and \
         finds no pod config.\n",
        if r.floor_check.is_empty() {
            "not checked in this run"
        } else {
            r.floor_check.as_str()
        }
    );
    let _ = writeln!(md, "### The agent's eBPF programs, per connection\n");
    let _ = writeln!(
        md,
        "From the kernel's BPF statistics (`BPF_ENABLE_STATS(BPF_STATS_RUN_TIME)`, held for the \
         traffic scenarios only) over the same windows, for the agent's own programs (by id; a \
         tail call's time counts in its caller: `l5d_sk_pod`, the per-pod stub, carries \
         `sk_lookup`). Runs and ns per connection, ns per run; medians and ranges over the \
         rounds (results.json has the throughput scenarios too). The time is the programs' own, \
         measured by the kernel around each run: not the hooks' dispatch, nor the socket storage \
         the kernel frees with each socket.\n"
    );
    let _ = writeln!(
        md,
        "| scenario | mode | program | runs/conn | ns/conn | ns/run |\n|---|---|---|---|---|---|"
    );
    for x in &r.traffic {
        let total: f64 = x.bpf.values().map(|b| b.ns_per_unit.median).sum();
        // Per MiB, a few runs per long connection say nothing: connection scenarios only.
        if x.status != "measured"
            || x.scenario.kind() != crate::workload::load::Kind::Rr
            || (!matches!(x.mode, Mode::Ebpf | Mode::EbpfBaseline) && total == 0.0)
        {
            continue;
        }
        for (name, b) in &x.bpf {
            if b.runs_per_unit.max == 0.0 {
                continue;
            }
            let _ = writeln!(
                md,
                "| {} | {} | `{name}` | {} | {} | {} |",
                x.scenario.label(),
                x.mode.label(),
                range(&b.runs_per_unit, 2),
                range(&b.ns_per_unit, 0),
                range(&b.ns_per_run, 0)
            );
        }
        let _ = writeln!(
            md,
            "| {} | {} | all | {:.2} | {total:.0} | |",
            x.scenario.label(),
            x.mode.label(),
            x.bpf.values().map(|b| b.runs_per_unit.median).sum::<f64>()
        );
    }
    let _ = writeln!(md);
    md
}

/// Section 7 of BENCHMARKS.md: the agent replaced under load.
fn upgrade_section(md: &mut String, r: &Results) {
    if r.upgrade.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "\n## 9. Agent upgrade, rollback and rollout under load\n"
    );
    let _ = writeln!(
        md,
        "A node of its own with two meshed pods (one attached per pod, one through the shared \
         attachment), each with its proxy and an app server; in each pod clients dial an upstream \
         (outbound) and clients in a peer dial the pod's app (inbound), {} threads each, short \
         connections, while the agent is replaced. The state starts as the previous agent version \
         left it: only that version's eBPF object exists (`tests/fixtures/ebpf-layout-1.o`), so its \
         part is a replay shared with the layout test: the object loaded, its untyped maps pinned \
         without a layout record (layout 1), its programs attached to both pods with pinned links, \
         each pod's entries and registry record written as it did on ADD. Then: **upgrade**, the \
         current agent binary starts on that state (maps migrated, links swapped with \
         `BPF_LINK_UPDATE`); **rollback**, after SIGTERM the state is made to look like a newer \
         layout that declares this agent able to read it (layout record {}, the pod config map \
         re-pinned with another capacity; no newer agent exists), and the agent starts on it; \
         **rollout**, SIGTERM and a new process of the same version (the agent runs without \
         `--install`, so the rollout-or-uninstall decision about the CNI configs is not made); \
         **control**, SIGTERM, the pods' link pins removed (links detached), the agent started: \
         it re-attaches them on its next reconcile pass, as an agent replacing programs without \
         `BPF_LINK_UPDATE` would leave pods in between. A pod is redirected throughout when its \
         proxy accepted at least as many connections, each way, as its clients completed, answered \
         `SO_ORIGINAL_DST` for each, and dropped none for want of one. Each pod's inbound link \
         runs a stub of its own that reaches whichever shared program the running agent \
         installed: the upgrade from layout 1 (no stubs) gives every pod one, the later changes \
         keep them, so there one link per pod is not swapped, by design.\n",
        r.upgrade.first().map_or(0, |u| u.concurrency),
        r.upgrade
            .iter()
            .find(|u| u.change == Change::Rollback)
            .map_or(0, |u| u.from_layout),
    );
    let _ = writeln!(
        md,
        "| change | layout | ok | failed | in the window (ok / failed) | agent down ms | links swapped | swap ms (first → last link, ± watcher pass) | pods redirected throughout |\n|---|---|---|---|---|---|---|---|---|"
    );
    for u in &r.upgrade {
        let redirected: Vec<String> = u
            .pods
            .iter()
            .map(|p: &PodRound| {
                format!(
                    "{} {} (out {}/{}, in {}/{} via proxy)",
                    p.pod,
                    if p.redirected_throughout() {
                        "yes"
                    } else {
                        "**no**"
                    },
                    p.proxy_out,
                    p.out_ok,
                    p.proxy_in,
                    p.in_ok
                )
            })
            .collect();
        let _ = writeln!(
            md,
            "| {} | {} → {} | {} | {} | {} / {} | {:.0} | {} | {} | {} |",
            u.change.label(),
            u.from_layout,
            u.to_layout,
            u.ok,
            u.failed,
            u.window_ok,
            u.window_failed,
            u.down_ms,
            match u.change {
                Change::Control =>
                    format!("re-attached after {:.0} ms", u.relinked_ms.unwrap_or(0.0)),
                _ => format!("{}/{}", u.links_swapped, u.links),
            },
            u.swap_ms.map_or("–".into(), |m| format!(
                "{m:.1} ± {:.2}",
                u.swap_resolution_ms
            )),
            redirected.join("; ")
        );
    }
    let problems: Vec<String> = r
        .upgrade
        .iter()
        .flat_map(|u| {
            u.problems
                .iter()
                .map(move |p| format!("{}: {p}", u.change.label()))
        })
        .collect();
    if !problems.is_empty() {
        let _ = writeln!(
            md,
            "\nState checks that did not hold: {}.",
            problems.join("; ")
        );
    }
}

/// A per-MiB figure in µs as ms per GiB.
fn per_gib(s: &Summary) -> Summary {
    let f = 1024.0 / 1000.0;
    Summary {
        median: s.median * f,
        min: s.min * f,
        max: s.max * f,
    }
}

/// The median packets received in the pod's netns per MiB of a long-lived scenario's row.
fn packets_per_mib(x: &TrafficRow) -> String {
    let v: Vec<f64> = x
        .samples
        .iter()
        .filter_map(|s| Some(s.packets? as f64 / s.units(x.scenario)).filter(|_| s.bytes > 0))
        .collect();
    match v.is_empty() {
        true => "–".into(),
        false => format!("{:.0}", crate::measure::stats::percentile(&v, 0.5)),
    }
}

fn range(s: &Summary, prec: usize) -> String {
    format!("{:.p$} ({:.p$}–{:.p$})", s.median, s.min, s.max, p = prec)
}

/// Sections 4 and 5 of BENCHMARKS.md: pod setup (ADD and DEL at each checkpoint, the agent's
/// own handling, the reconcile passes, memory) and the footprint with the most pods (also
/// printed by `run --only-pod-setup`).
pub fn pod_setup_section(md: &mut String, p: &PodSetupResults) {
    let _ = writeln!(
        md,
        "## 4. Pod setup: CNI ADD and DEL through the real plugin and agent\n"
    );
    let _ = writeln!(
        md,
        "Each sample spawns the `linkerd-cni` binary as a runtime does (spawn to exit; the agent \
         answers once the programs are attached to the pod's cgroup and the maps are written), \
         then checks from inside the pod that its connects are redirected; DEL likewise, checking \
         they no longer are. Pods: a netns (lo up) and a cgroup each, registered with a fake API \
         server. Filling the node took {:.1} s.\n",
        p.fill_secs
    );
    let _ = writeln!(
        md,
        "The agent's own time is its handling of the same ADDs and DELs, from its phase log \
         (taking the pod's netns to writing the registry): the part of a CNI call that can \
         depend on the pod count, where the spawn-to-exit figures also carry the machine's \
         drift between checkpoints minutes apart. The last reap pass is the agent's periodic \
         check that every registered pod's netns still exists (every 10 s, one `stat` per \
         registration), from its log: how many it checked and the CPU time its thread took.\n"
    );
    let _ = writeln!(
        md,
        "| pods registered | samples | ADD p50 ms | ADD p99 ms | DEL p50 ms | DEL p99 ms | agent's own ADD / DEL p50 µs | agent RSS MiB | exec floor ms | plugin floor ms | map walk ms | registry read ms | last reap pass: pods, CPU ms |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for cp in &p.checkpoints {
        let own = match cp.agent_add_p50_us > 0.0 {
            true => format!("{:.0} / {:.0}", cp.agent_add_p50_us, cp.agent_del_p50_us),
            false => "–".into(),
        };
        let reap = match cp.reap_pass {
            Some(p) => format!("{}, {:.1}", p.checked, p.cpu_us as f64 / 1e3),
            None => "–".into(),
        };
        let _ = writeln!(
            md,
            "| {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {own} | {:.1} | {:.2} | {:.2} | {:.2} | {:.2} | {reap} |",
            cp.registered,
            cp.add_ms.len(),
            cp.add_p50_ms,
            cp.add_p99_ms,
            cp.del_p50_ms,
            cp.del_p99_ms,
            cp.agent_rss_kib as f64 / 1024.0,
            cp.exec_floor_p50_ms,
            cp.plugin_floor_p50_ms,
            cp.remove_pod_ms,
            cp.registry_all_ms
        );
    }
    if let (Some(a), Some(b)) = (p.checkpoints.first(), p.checkpoints.last()) {
        let _ = writeln!(
            md,
            "\nRatio {} pods / {} pod(s): ADD p50 {:.2}, ADD p99 {:.2}, DEL p50 {:.2}, DEL p99 {:.2}; \
             exec floor p50 {:.2}. The growth goals divide each checkpoint's ADD and DEL p50 by its \
             exec floor first: the machine's drift between checkpoints minutes apart moves every \
             spawn alike.\n",
            b.registered,
            a.registered,
            b.add_p50_ms / a.add_p50_ms,
            b.add_p99_ms / a.add_p99_ms,
            b.del_p50_ms / a.del_p50_ms,
            b.del_p99_ms / a.del_p99_ms,
            b.exec_floor_p50_ms / a.exec_floor_p50_ms,
        );
    }

    let _ = writeln!(
        md,
        "The exec floor is a 151-byte static binary (reads its stdin to the end and exits 0; no loader, no libc) spawned \
         exactly as the plugin is, once after every measured ADD: what any executable costs here. \
         Map walk: one removal of an unknown pod through the pinned maps with the agent library \
         (every walk an unregistration makes). Registry read: opening the registry and reading every \
         record from disk, as an agent start does (ADD and DEL use the agent's in-memory registry).\n"
    );
    if p.checkpoints.iter().any(|c| c.reconcile.is_some()) {
        let _ = writeln!(
            md,
            "Reconcile: at each checkpoint the agent is asked for reconcile passes (SIGHUP, one \
             at a time; each verifies up to {} pods, continuing where the last stopped: links, \
             map entries, and where its programs run among other tenants') until every \
             registered pod was verified once; CPU is the passing thread's own, from the agent's \
             log of each pass, with the part spent in the order checks. `bpf()` calls: one more \
             pass with `strace -f -c` attached to the agent (not a timed pass).\n\n\
             | pods registered | passes | pods verified | CPU ms | CPU µs per pod | order checks ms (share) | `bpf()` calls per pod | agent's own ADD order checks p50 µs |\n\
             |---|---|---|---|---|---|---|---|",
            linkerd_cni_agent::agent::reconcile::PODS_PER_PASS
        );
        for cp in &p.checkpoints {
            let Some(r) = &cp.reconcile else { continue };
            let bpf = r
                .bpf_per_pod()
                .map_or_else(|| "–".into(), |b| format!("{b:.1}"));
            let _ = writeln!(
                md,
                "| {} | {} | {} | {:.1} | {:.1} | {:.1} ({:.0} %) | {bpf} | {:.0} |",
                cp.registered,
                r.passes.len(),
                r.checked(),
                r.cpu_ms(),
                r.cpu_us_per_pod(),
                r.order_cpu_ms(),
                100.0 * r.order_cpu_ms() / r.cpu_ms().max(f64::MIN_POSITIVE),
                cp.agent_add_order_p50_us
            );
        }
        let _ = writeln!(md);
    }
    let _ = writeln!(
        md,
        "Agent memory at each checkpoint (`/proc/<pid>/smaps`, resident MiB):\n\n\
         | pods registered | RSS | heap | other anonymous (arenas, stacks) | binary | libraries | other | threads |\n\
         |---|---|---|---|---|---|---|---|"
    );
    for cp in &p.checkpoints {
        let m = &cp.agent_mem;
        let mib = |k: u64| k as f64 / 1024.0;
        let _ = writeln!(
            md,
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {} |",
            cp.registered,
            mib(m.rss_kib),
            mib(m.heap_kib),
            mib(m.anon_mmap_kib),
            mib(m.binary_kib),
            mib(m.libs_kib),
            mib(m.other_kib),
            m.threads
        );
    }
    let _ = writeln!(md);

    let f = &p.footprint;
    let _ = writeln!(
        md,
        "## 5. Footprint with {} pods registered\n",
        f.registered
    );
    let _ = writeln!(
        md,
        "Agent RSS {:.1} MiB (peak {:.1} MiB; {:.1} MiB with one pod): {:.1} MiB anonymous (heap, \
         stacks), {:.1} MiB file-backed (the binary). After the pods' API objects were deleted \
         (the agent's pod cache emptied, registrations kept): {:.1} MiB. {} pinned bpf_links. \
         BPF maps {:.1} KiB in total (`bpftool map show` → `bytes_memlock`). An agent restart \
         (spawn to answering on its socket, adopting every pod) took {:.0} ms.\n",
        f.agent_rss_kib as f64 / 1024.0,
        f.agent_hwm_kib as f64 / 1024.0,
        f.agent_rss_1_pod_kib as f64 / 1024.0,
        f.agent_anon_kib as f64 / 1024.0,
        f.agent_file_kib as f64 / 1024.0,
        f.agent_rss_without_api_pods_kib as f64 / 1024.0,
        f.links,
        f.maps_total_bytes as f64 / 1024.0,
        f.restart_ready_ms
    );
    let _ = writeln!(
        md,
        "| map | type | max entries | memlock KiB |\n|---|---|---|---|"
    );
    for m in &f.maps {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.1} |",
            m.name,
            m.kind,
            m.max_entries,
            m.bytes_memlock as f64 / 1024.0
        );
    }
}

/// Renders BENCHMARKS.md.
pub fn markdown(r: &Results) -> String {
    let mut md = String::new();
    let c = &r.traffic_config;
    let _ = writeln!(
        md,
        "# Benchmarks: eBPF redirection vs Linkerd's iptables rules vs no interception\n"
    );
    let _ = writeln!(
        md,
        "Generated by `{}` ({}run, {:.0} s, commit `{}`). Numbers are medians over {} rounds \
         with the min–max in parentheses; modes run back to back, alternating (the order rotates \
         every round). Raw samples: `tests/bench/results.json`; chart: `tests/bench/chart.svg`.\n",
        r.command,
        if r.quick { "quick " } else { "full " },
        r.duration_secs,
        r.git_commit,
        c.rounds
    );
    let m = &r.machine;
    let _ = writeln!(
        md,
        "**Machine**: `{}`; {} ({} cores), {} MiB RAM. Load average (1, 5, 15 min) at the start: {}, \
         at the end: {} (the machine is shared: other work runs alongside).\n",
        m.uname, m.cpu, m.cores, m.memory_mib, m.loadavg_start, m.loadavg_end
    );
    let _ = writeln!(md, "![main comparisons](tests/bench/chart.svg)\n");

    let _ = writeln!(md, "## Goals\n");
    let _ = writeln!(md, "| goal | observed | met |\n|---|---|---|");
    for g in &r.goals {
        let met = match g.met {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "n/a",
        };
        let _ = writeln!(md, "| {} | {} | {met} |", g.goal, g.observed);
    }
    if !r.notes.is_empty() {
        let _ = writeln!(md, "\n## Analysis\n");
        for n in &r.notes {
            let _ = writeln!(md, "{n}\n");
        }
    }

    let _ = writeln!(md, "\n## 1–3. Traffic through the proxy\n");
    let _ = writeln!(
        md,
        "Connections: {} concurrent clients, each looping connect, {}-byte request, response, close, \
         for {} ms (after {} ms warm-up); latency is connect-to-close of one exchange. Throughput: {} \
         long connections downloading for {} ms. Persistent request/response: {} long connections, \
         each looping a {}-byte request and its response for {} ms; latency is request written to \
         response read, CPU per GiB moved both ways. Packets/MiB: packets received by the \
         interfaces of the meshed pod's netns (lo and its veth), what netfilter's hooks see there. \
         The ratio column is the median against `direct`.\n",
        c.concurrency,
        crate::workload::server::REQ_LEN,
        c.rr_ms,
        c.warmup_ms,
        c.streams,
        c.bulk_ms,
        c.persistent_conns,
        crate::workload::server::MSG_LEN,
        c.persistent_ms
    );
    for scenario in Scenario::ALL {
        let rows: Vec<&TrafficRow> = r
            .traffic
            .iter()
            .filter(|x| x.scenario == scenario)
            .collect();
        let direct = rows
            .iter()
            .copied()
            .find(|x| x.mode == Mode::Direct && x.status == "measured");
        let _ = writeln!(md, "### {}\n", scenario.label());
        if scenario.kind() == crate::workload::load::Kind::Rr {
            let _ = writeln!(
                md,
                "| mode | CPU µs/conn | CPU × direct | own CPU µs/conn | conn/s | × direct | p50 µs | p99 µs | failed |\n|---|---|---|---|---|---|---|---|---|"
            );
            for x in &rows {
                if x.status != "measured" {
                    let _ = writeln!(md, "| {} | {} | | | | | | | |", x.mode.label(), x.status);
                    continue;
                }
                let ratio = direct
                    .map(|d| format!("{:.3}", x.rate.median / d.rate.median))
                    .unwrap_or_default();
                let cpu_ratio = direct
                    .filter(|d| d.cpu_us.median > 0.0)
                    .map(|d| format!("{:.3}", x.cpu_us.median / d.cpu_us.median))
                    .unwrap_or_default();
                let _ = writeln!(
                    md,
                    "| {} | {} | {cpu_ratio} | {} | {} | {ratio} | {} | {} | {} |",
                    x.mode.label(),
                    range(&x.cpu_us, 1),
                    range(&x.own_cpu_us, 1),
                    range(&x.rate, 0),
                    range(&x.p50_us, 0),
                    range(&x.p99_us, 0),
                    x.failed
                );
            }
        } else if scenario.kind() == crate::workload::load::Kind::Persistent {
            let _ = writeln!(
                md,
                "| mode | own CPU ms/GiB | × direct | CPU ms/GiB | exchanges/s | p50 µs | p99 µs | packets/MiB | failed |\n|---|---|---|---|---|---|---|---|---|"
            );
            for x in &rows {
                if x.status != "measured" {
                    let _ = writeln!(md, "| {} | {} | | | | | | | |", x.mode.label(), x.status);
                    continue;
                }
                let cpu_ratio = direct
                    .filter(|d| d.own_cpu_us.median > 0.0)
                    .map(|d| format!("{:.3}", x.own_cpu_us.median / d.own_cpu_us.median))
                    .unwrap_or_default();
                let _ = writeln!(
                    md,
                    "| {} | {} | {cpu_ratio} | {} | {} | {} | {} | {} | {} |",
                    x.mode.label(),
                    range(&per_gib(&x.own_cpu_us), 1),
                    range(&per_gib(&x.cpu_us), 1),
                    range(&x.rate, 0),
                    range(&x.p50_us, 0),
                    range(&x.p99_us, 0),
                    packets_per_mib(x),
                    x.failed
                );
            }
        } else {
            let _ = writeln!(
                md,
                "| mode | CPU µs/MiB | own CPU µs/MiB | Gbit/s | × direct | packets/MiB | failed |\n|---|---|---|---|---|---|---|"
            );
            for x in &rows {
                if x.status != "measured" {
                    let _ = writeln!(md, "| {} | {} | | | | |", x.mode.label(), x.status);
                    continue;
                }
                let ratio = direct
                    .map(|d| format!("{:.3}", x.gbps.median / d.gbps.median))
                    .unwrap_or_default();
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {ratio} | {} | {} |",
                    x.mode.label(),
                    range(&x.cpu_us, 1),
                    range(&x.own_cpu_us, 1),
                    range(&x.gbps, 2),
                    packets_per_mib(x),
                    x.failed
                );
            }
        }
        let _ = writeln!(md);
    }
    md.push_str(&cpu_markdown(r));

    pod_setup_section(&mut md, &r.pod_setup);

    let _ = writeln!(md, "\n## 6. Agent restart under load\n");
    let _ = writeln!(
        md,
        "Clients in the ebpf pod ({} concurrent, short connections) run while the agent is \
         SIGKILLed and started again; a failure is any exchange that did not complete.\n",
        c.concurrency
    );
    let _ = writeln!(
        md,
        "| restart | killed at ms | down ms (kill → answering) | connections ok | failed | failed kill→ready+1 s | through the proxy |\n|---|---|---|---|---|---|---|"
    );
    for (i, x) in r.restart.iter().enumerate() {
        let _ = writeln!(
            md,
            "| {} | {:.0} | {:.0} | {} | {} | {} | {} |",
            i + 1,
            x.kill_at_ms,
            x.down_ms,
            x.ok,
            x.failed,
            x.failed_in_window,
            x.through_proxy
        );
    }

    if let Some(api) = &r.api_load {
        md.push_str(&crate::scenario::apiload::markdown(api));
    }
    if let Some(cri) = &r.cri_sandbox {
        md.push_str(&crate::scenario::crisandbox::markdown(cri));
    }
    upgrade_section(&mut md, r);

    let _ = writeln!(md, "\n## Method\n");
    let _ = writeln!(
        md,
        "- Everything runs on one simulated node: a node netns with a bridge, pods as netns + cgroup \
         v2 attached to it, an upstream pod running the server, a peer pod for inbound clients. No \
         traffic leaves the netns made for the run.\n\
         - Each mode has its own meshed pod running the same proxy (`linkerd-cni-bench proxy`, UID \
         {uid}: `getsockopt(SO_ORIGINAL_DST)` on every accepted connection, connect there, relay with \
         `splice(2)`) and the same server. A mode has a pod of its own because a netns keeps the \
         legacy `nat` table and its conntrack hooks once iptables-legacy touched it.\n\
         - `direct`: clients dial the proxy (outbound `127.0.0.1:{outbound}`, inbound `<pod>:{inbound}`); the \
         proxy still calls `SO_ORIGINAL_DST`, which has nothing to answer, and forwards to the \
         configured upstream. `iptables-nft` / `iptables-legacy`: Linkerd proxy-init's chains \
         `PROXY_INIT_REDIRECT` (PREROUTING) and `PROXY_INIT_OUTPUT` (OUTPUT: proxy UID, `lo`, then \
         REDIRECT) in the pod netns. `ebpf`: the pod registered through the real `linkerd-cni` \
         plugin with the real agent process. `fallback`: the pod registered through the same \
         plugin with a second agent of this build in `--mode iptables` (the per-node fallback \
         below the eBPF floor): the plugin writes Linkerd's rules as the nftables table \
         `inet linkerd` in the pod netns over netlink, no program.\n\
         - Every measurement checks the proxy's accept counter: a connection that bypassed the \
         proxy fails the run.\n\
         - Clients are a separate process in the client pod (netns, cgroup, UID 1000), threads \
         with blocking sockets; every netns gets `tcp_tw_reuse=1` and a wide ephemeral port range.",
        uid = config::DEFAULT_PROXY_UID,
        outbound = config::DEFAULT_OUTBOUND_PORT,
        inbound = config::DEFAULT_INBOUND_PORT,
    );
    if let Some(b) = &r.baseline {
        let _ = writeln!(
            md,
            "- `ebpf-baseline` (`--baseline-bins`): a pod like the ebpf pod, registered through an \
             earlier build's `linkerd-cni` plugin with that build's agent ({b}), run as a second \
             agent process beside ours with its own pin root, registry, socket, shared cgroup, \
             health port and node name; its rows carry that agent's programs. Each agent's \
             programs are checked to run 0 times in the other agent's pod's windows (and the \
             baseline's in every other mode's, in the rounds with statistics); its goal rows \
             are judged in pairs like the others (below), met at most {BASELINE_MAX_RATIO:.2}."
        );
    }
    let _ = writeln!(
        md,
        "- **CPU goal rows are judged in pairs.** Two modes measured back to back share the \
         machine's state, while the same mode swings ±10 % between rounds: a row takes, round by \
         round, the ratio of the two modes' CPU per connection and is met when the median of \
         those ratios is within its limit (with the median's distribution-free 95 % interval \
         and in how many rounds the first mode was the cheaper).{}",
        match r.pair_rounds {
            0 => " This run had no extra paired rounds: the pairs are the run's own rounds, \
                  measured with the BPF statistics on."
                .to_string(),
            n => format!(
                " Besides the run's rounds, {n} more rounds of just the compared modes (direct, \
                 iptables-nft, ebpf{}, the two unmeshed pods) in every scenario give the pairs, measured with the kernel's BPF statistics off: with them on, the \
                 kernel reads the clock around every program run (`sched_clock`, the \
                 paravirtual clock on this VM), about 1.5 µs per redirected connection that only \
                 the modes with programs pay (`perf` of an ebpf run against a direct one). The \
                 tables above and the program figures are the run's own rounds, statistics on.",
                if r.baseline.is_some() {
                    ", ebpf-baseline"
                } else {
                    ""
                }
            ),
        }
    );
    let _ = writeln!(
        md,
        "- **Rows where nothing is redirected are counted.** On the paths our programs only \
         look at (an unmeshed pod under the shared attachment) or do not see at all (the bytes \
         of a long-lived connection after its set-up), the paired CPU ratio is too coarse for a \
         1 % limit: its 95 % interval is 10–25 % wide here. Those rows are judged on the \
         kernel's own count of our programs' run time per connection or per GiB (the run's \
         rounds, statistics on) against the floor's CPU per unit, and are met when that is \
         within the limit and the paired CPU ratio does not exceed the limit beyond its \
         interval (a cost the counters cannot see would show there once it is larger than the \
         spread). Not in the count: what a run adds to the kernel's dispatch of the hook, \
         which the floor's sockets go through as well with an empty program array (a step of \
         its loop and an indirect call, a few ns per run)."
    );
    if r.chain.as_ref().is_some_and(|c| !c.rounds.is_empty()) {
        let _ = writeln!(
            md,
            "- **Another tenant's socket load balancer above the pod** (issue 35): the ebpf \
             pod's cgroup lies below a cgroup the run owns, its stand-in for the node's cgroup2 \
             root (never the real root). The stand-in socket LB of the coexistence tests \
             (`connect4/6`, `getpeername4/6`, one Service address translated to a backend) is \
             linked there (a bpf_link, multi: how Cilium >= 1.14 and Calico attach theirs) for \
             half of each round: the pod's outbound connections are measured with and without \
             it back to back (the order alternates), to the upstream server, not to the \
             Service, so the tenant runs for every connect (the app's and the proxy's) and \
             leaves it alone. Its CPU row is the paired median of the per-round ratios (the \
             paired rounds, statistics off); the program row is the kernel's run time of ours \
             and of the tenant's (the run's rounds, statistics on). Information rows: no limit.\n\
             - **The feature probes** (issue 38): `Findings::probe()` (every kernel feature \
             probe the agent runs at start) timed in the benchmark's own process, root, after \
             one untimed run: wall clock and the thread's CPU time (the verifier's work \
             included) per run."
        );
    }
    md
}
