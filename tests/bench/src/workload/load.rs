//! The load generator (`linkerd-cni-bench load`), run as a separate process inside the client
//! pod (its netns and cgroup, an ordinary UID) so that the pod's redirection applies to it.
//!
//! - `rr`: `concurrency` threads each loop connect, one [`REQ_LEN`]-byte request, the
//!   response, close; every exchange's latency (connect to close) is recorded.
//! - `bulk`: `concurrency` long connections each download as fast as they can.
//! - `persistent`: `concurrency` long connections each loop one [`MSG_LEN`]-byte request and
//!   its response (1 KiB each way); every exchange's latency (request written to response
//!   read) is recorded, and the bytes moved both ways are counted.
//!
//! Measurement starts after the warm-up and stops at the deadline; the result is one JSON line
//! on stdout ([`LoadResult`]).

use std::{
    collections::BTreeMap,
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use serde::{Deserialize, Serialize};

use crate::workload::server::{BULK, MSG_LEN, PERSISTENT, REQ_LEN, RR};

/// What to generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
pub enum Kind {
    /// Short connections: connect, request, response, close.
    Rr,
    /// Long connections, bulk download.
    Bulk,
    /// Long connections, 1 KiB request and response in a loop.
    Persistent,
}

/// Command line of `linkerd-cni-bench load`.
#[derive(Debug, Clone, clap::Args)]
pub struct LoadArgs {
    #[arg(long, value_enum)]
    pub kind: Kind,
    /// Where the client connects (the original destination).
    #[arg(long)]
    pub target: SocketAddr,
    /// Concurrent clients (threads) or streams.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// Measured time.
    #[arg(long, default_value_t = 3000)]
    pub duration_ms: u64,
    /// Unmeasured time before it.
    #[arg(long, default_value_t = 500)]
    pub warmup_ms: u64,
    /// Also count successes and failures per bucket of this many milliseconds (whole run).
    #[arg(long)]
    pub series_ms: Option<u64>,
}

/// What one load run observed.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LoadResult {
    /// Exchanges (rr) or streams (bulk) that succeeded in the measured window.
    pub ok: u64,
    /// Exchanges or streams that failed (whole run).
    pub failed: u64,
    /// Failure kinds with counts.
    pub errors: BTreeMap<String, u64>,
    /// Measured seconds.
    pub secs: f64,
    /// rr: exchanges per second.
    pub rate: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    /// bulk: bytes received in the measured window, and the rate in Gbit/s.
    pub bytes: u64,
    pub gbps: f64,
    /// Wall clock at the start of the run (warm-up included), µs since the epoch.
    pub start_unix_us: u64,
    /// Per bucket: (ok, failed), from the start of the run.
    pub series: Vec<(u64, u64)>,
}

#[derive(Default)]
struct ThreadResult {
    lat_us: Vec<u32>,
    ok: u64,
    failed: u64,
    errors: BTreeMap<String, u64>,
    bytes: u64,
    series: Vec<(u64, u64)>,
}

impl ThreadResult {
    fn bucket(&mut self, series_ms: Option<u64>, since_start: Duration, ok: bool) {
        let Some(ms) = series_ms else { return };
        let i = (since_start.as_millis() as u64 / ms.max(1)) as usize;
        if self.series.len() <= i {
            self.series.resize(i + 1, (0, 0));
        }
        if ok {
            self.series[i].0 += 1;
        } else {
            self.series[i].1 += 1;
        }
    }

    fn fail(&mut self, e: &std::io::Error) {
        self.failed += 1;
        let kind = match e.raw_os_error() {
            Some(n) => std::io::Error::from_raw_os_error(n).to_string(),
            None => e.kind().to_string(),
        };
        *self.errors.entry(kind).or_default() += 1;
    }
}

fn exchange(target: SocketAddr) -> std::io::Result<()> {
    let mut s = TcpStream::connect_timeout(&target, Duration::from_secs(3))?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(Duration::from_secs(3)))?;
    let mut req = [b'.'; REQ_LEN];
    req[0] = RR;
    s.write_all(&req)?;
    let mut resp = [0u8; REQ_LEN];
    s.read_exact(&mut resp)?;
    if resp[0] != b'r' {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "unexpected response",
        ));
    }
    Ok(())
}

fn rr_thread(args: &LoadArgs, start: Instant, measure: Instant, end: Instant) -> ThreadResult {
    let mut r = ThreadResult::default();
    loop {
        let t0 = Instant::now();
        if t0 >= end {
            return r;
        }
        let res = exchange(args.target);
        let t1 = Instant::now();
        match res {
            Ok(()) => {
                if t0 >= measure && t1 <= end {
                    r.ok += 1;
                    r.lat_us
                        .push((t1 - t0).as_micros().min(u32::MAX as u128) as u32);
                }
                r.bucket(args.series_ms, t1 - start, true);
            }
            Err(e) => {
                r.fail(&e);
                r.bucket(args.series_ms, t1 - start, false);
                // Do not spin on an immediate refusal.
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

fn bulk_thread(args: &LoadArgs, measure: Instant, end: Instant) -> ThreadResult {
    let mut r = ThreadResult::default();
    let run = |r: &mut ThreadResult| -> std::io::Result<()> {
        let mut s = TcpStream::connect_timeout(&args.target, Duration::from_secs(3))?;
        s.set_read_timeout(Some(Duration::from_secs(3)))?;
        let mut req = [b'.'; REQ_LEN];
        req[0] = BULK;
        s.write_all(&req)?;
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            let n = s.read(&mut buf)?;
            if n == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "server closed",
                ));
            }
            let now = Instant::now();
            if now >= end {
                return Ok(());
            }
            if now >= measure {
                r.bytes += n as u64;
            }
        }
    };
    match run(&mut r) {
        Ok(()) => r.ok += 1,
        Err(e) => r.fail(&e),
    }
    r
}

fn persistent_thread(args: &LoadArgs, measure: Instant, end: Instant) -> ThreadResult {
    let mut r = ThreadResult::default();
    let run = |r: &mut ThreadResult| -> std::io::Result<()> {
        let mut s = TcpStream::connect_timeout(&args.target, Duration::from_secs(3))?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(3)))?;
        let mut req = [b'.'; REQ_LEN];
        req[0] = PERSISTENT;
        s.write_all(&req)?;
        let msg = [b'p'; MSG_LEN];
        let mut resp = [0u8; MSG_LEN];
        loop {
            let t0 = Instant::now();
            if t0 >= end {
                return Ok(());
            }
            s.write_all(&msg)?;
            s.read_exact(&mut resp)?;
            let t1 = Instant::now();
            if t0 >= measure && t1 <= end {
                r.ok += 1;
                r.bytes += 2 * MSG_LEN as u64;
                r.lat_us
                    .push((t1 - t0).as_micros().min(u32::MAX as u128) as u32);
            }
        }
    };
    if let Err(e) = run(&mut r) {
        r.fail(&e);
    }
    r
}

/// What marks the edges of the measured window: with `--mark`, the load generator writes
/// this line to stderr when measuring starts and when it stops, so that its parent can read
/// CPU and BPF statistics over exactly that window.
pub const MARK: &str = "linkerd-cni-bench-mark";

/// Runs the load and returns what it saw; with `mark`, writes [`MARK`] lines on stderr at the
/// start and the end of the measured window.
pub fn run(args: &LoadArgs, mark: bool) -> LoadResult {
    let start_unix_us = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0);
    let start = Instant::now();
    let measure = start + Duration::from_millis(args.warmup_ms);
    let end = measure + Duration::from_millis(args.duration_ms);
    let results: Vec<ThreadResult> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..args.concurrency.max(1))
            .map(|_| {
                s.spawn(move || match args.kind {
                    Kind::Rr => rr_thread(args, start, measure, end),
                    Kind::Bulk => bulk_thread(args, measure, end),
                    Kind::Persistent => persistent_thread(args, measure, end),
                })
            })
            .collect();
        if mark {
            for edge in [measure, end] {
                std::thread::sleep(edge.saturating_duration_since(Instant::now()));
                eprintln!("{MARK}");
            }
        }
        handles.into_iter().filter_map(|h| h.join().ok()).collect()
    });
    let mut out = LoadResult {
        start_unix_us,
        secs: args.duration_ms as f64 / 1000.0,
        ..Default::default()
    };
    let mut lat = Vec::new();
    for r in results {
        out.ok += r.ok;
        out.failed += r.failed;
        out.bytes += r.bytes;
        for (k, v) in r.errors {
            *out.errors.entry(k).or_default() += v;
        }
        if out.series.len() < r.series.len() {
            out.series.resize(r.series.len(), (0, 0));
        }
        for (i, (ok, failed)) in r.series.into_iter().enumerate() {
            out.series[i].0 += ok;
            out.series[i].1 += failed;
        }
        lat.extend(r.lat_us);
    }
    lat.sort_unstable();
    let pct = |p: f64| -> f64 {
        if lat.is_empty() {
            return 0.0;
        }
        let i = ((lat.len() as f64 * p).ceil() as usize).clamp(1, lat.len()) - 1;
        f64::from(lat[i])
    };
    out.p50_us = pct(0.50);
    out.p90_us = pct(0.90);
    out.p99_us = pct(0.99);
    out.max_us = lat.last().map(|&v| f64::from(v)).unwrap_or(0.0);
    out.rate = out.ok as f64 / out.secs;
    out.gbps = out.bytes as f64 * 8.0 / out.secs / 1e9;
    out
}
