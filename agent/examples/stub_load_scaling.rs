//! How a pod's `sk_lookup` stub's load time grows with the number of stubs already loaded
//! (root; loads and frees N stubs against two throwaway maps, nothing attached or pinned).
//!
//! `cargo run --release -p linkerd-cni-agent --example stub_load_scaling -- 10000`
//! prints the median load time of each successive thousand stubs.

use std::{os::fd::AsFd, time::Instant};

use linkerd_cni_agent::dataplane::stub;
use linkerd_cni_sys::{
    bpf,
    uapi::{MAP_TYPE_PERCPU_ARRAY, MAP_TYPE_PROG_ARRAY},
};

fn main() -> std::io::Result<()> {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000);
    let scratch = bpf::map_create(MAP_TYPE_PERCPU_ARRAY, 4, 8, 1, 0, "l5dx_scratch", None)?;
    let progs = bpf::map_create(MAP_TYPE_PROG_ARRAY, 4, 4, 1, 0, "l5dx_progs", None)?;
    let mut stubs = Vec::with_capacity(n);
    let mut times = Vec::with_capacity(1000);
    for i in 0..n {
        let insns = stub::sk_lookup_stub(i as u64 + 1, scratch.as_fd(), progs.as_fd());
        let start = Instant::now();
        stubs.push(bpf::load_sk_lookup("l5dx_stub", &insns)?);
        times.push(start.elapsed().as_micros());
        if times.len() == 1000 || i + 1 == n {
            times.sort_unstable();
            println!(
                "stubs {:>6}-{:<6} load median {:>4} µs",
                i + 1 - times.len(),
                i + 1,
                times[times.len() / 2]
            );
            times.clear();
        }
    }
    let start = Instant::now();
    // Freed one at a time with the agent's pacing, as `dataplane::detach` frees a pod's stub.
    for stub in stubs {
        drop(stub);
        bpf::pace_program_frees(1);
    }
    println!(
        "freed {n} stubs in {:.0} ms",
        start.elapsed().as_secs_f64() * 1e3
    );
    Ok(())
}
