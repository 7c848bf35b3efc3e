//! What one run of the `iter/tcp` program costs, as adoption runs it (root; a throwaway netns
//! and pin root, both removed at the end).
//!
//! `cargo run --release -p linkerd-cni-agent --example iter_cost -- 4 1000 50` loads the data
//! plane under a pin root of its own, makes a netns holding 4 listeners (one of them the
//! "proxy's" inbound listener on 4143) and 1000 established loopback connections, then runs
//! the iterator 50 times in report mode and 50 times registering the listener; prints the
//! median and worst wall time per run (setns into the netns, one `BPF_ITER_CREATE`, reading
//! the output to its end, setns back) and the kernel's own `run_time_ns / run_cnt` for the
//! program (with `kernel.bpf_stats_enabled=1`).

use std::{
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use linkerd_cni_agent::{dataplane::Dataplane, host::netns::Netns};
use linkerd_cni_common::{ITER_REGISTER, IterArgs, names, paths};

/// Removes the netns and the pin root, whatever happened.
struct Cleanup {
    netns: String,
    pin_root: PathBuf,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.netns])
            .status();
        let _ = std::fs::remove_dir_all(&self.pin_root);
    }
}

fn main() -> anyhow::Result<()> {
    let arg = |i: usize, default: usize| -> usize {
        std::env::args()
            .nth(i)
            .and_then(|a| a.parse().ok())
            .unwrap_or(default)
    };
    let (listeners, connections, runs) = (arg(1, 4).max(1), arg(2, 1000), arg(3, 50).max(1));
    let tag = format!("l5dx-iter-cost-{}", std::process::id());
    let _cleanup = Cleanup {
        netns: tag.clone(),
        pin_root: Path::new(paths::BPFFS).join(&tag),
    };
    let pin_root = Path::new(paths::BPFFS).join(&tag);
    for args in [
        vec!["netns", "add", &tag],
        vec!["-n", &tag, "link", "set", "lo", "up"],
    ] {
        if !Command::new("ip").args(&args).status()?.success() {
            bail!("ip {args:?} failed");
        }
    }
    let dataplane = Dataplane::load(&pin_root).context("loading the data plane")?;
    let iter = dataplane
        .listener_iter()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let ns = Netns::open(&Path::new("/run/netns").join(&tag))?;
    // Sockets keep the netns they were made in.
    let sockets = ns.run(|| {
        let mut held = Vec::new();
        let mut ports = vec![4143];
        ports.extend(20000..20000 + listeners as u16 - 1);
        let mut listening = Vec::new();
        for port in ports {
            listening.push(TcpListener::bind(("127.0.0.1", port))?);
        }
        for i in 0..connections {
            let to = listening[i % listening.len()].local_addr()?;
            let client = TcpStream::connect(to)?;
            let (server, _) = listening[i % listening.len()].accept()?;
            held.push((client, server));
        }
        Ok((listening, held))
    })?;
    let cookie = ns.cookie()?;
    let uid = nix::unistd::getuid().as_raw();
    let mut report = IterArgs {
        netns_cookie: cookie,
        proxy_uid: uid,
        inbound_port: 4143,
        ..IterArgs::default()
    };
    for (mode, flags) in [("report", 0), ("register", ITER_REGISTER)] {
        report.flags = flags;
        let mut times: Vec<Duration> = Vec::with_capacity(runs);
        let mut seen = 0;
        for _ in 0..runs {
            let start = Instant::now();
            let records = ns.run(|| iter.run(&report))?;
            times.push(start.elapsed());
            seen = records.len();
            if flags != 0 && !records.iter().any(|r| r.port == 4143 && r.registered == 0) {
                bail!("the listener was not registered: {records:?}");
            }
        }
        times.sort_unstable();
        println!(
            "{mode}: {runs} runs over {} sockets ({seen} listening reported): median {:?}, worst {:?}",
            listeners + 2 * connections,
            times[runs / 2],
            times[runs - 1],
        );
    }
    let prog = pin_root.join(paths::PIN_PROGS).join(names::PROG_ITER_TCP);
    let out = Command::new("bpftool")
        .args(["prog", "show", "pinned"])
        .arg(&prog)
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |name: &str| -> Option<u64> {
        let mut words = text.split_whitespace();
        words.find(|w| *w == name)?;
        words.next()?.parse().ok()
    };
    match (field("run_time_ns"), field("run_cnt")) {
        (Some(ns_total), Some(cnt)) if cnt > 0 => println!(
            "kernel: run_cnt {cnt} (one per socket visited, plus one closing call per run), \
             run_time_ns {ns_total}: {} ns per call, {} ns per run",
            ns_total / cnt,
            ns_total / (2 * runs as u64)
        ),
        _ => println!("kernel: no run statistics (sysctl kernel.bpf_stats_enabled=1 first)"),
    }
    drop(sockets);
    Ok(())
}
