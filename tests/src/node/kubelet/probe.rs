//! kubelet's HTTP probes: `GET` to the probe's address from the node's network namespace, at
//! the probe's period after its initial delay, each with its timeout, a status in 200..400
//! counting as success, and the success and failure thresholds deciding the result (a
//! readiness probe starts not ready, a liveness probe starts healthy).

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    os::fd::{AsFd, OwnedFd},
    path::Path,
    sync::{
        Arc, Condvar, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use nix::sched::{CloneFlags, setns};

use super::translate::ProbePlan;
use crate::error::{Error, IoContext, Result};

/// kubelet's probe `User-Agent` (`kube-probe/<major>.<minor>`).
const USER_AGENT: &str = "kube-probe/1.34";

/// Which probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeKind {
    Readiness,
    Liveness,
    Startup,
}

/// One probe's outcome.
#[derive(Clone, Debug)]
pub struct ProbeResult {
    /// When the request was sent.
    pub at: Instant,
    /// The HTTP status, or why there was none.
    pub outcome: std::result::Result<u16, String>,
}

impl ProbeResult {
    /// Whether kubelet counts it as a success.
    pub fn success(&self) -> bool {
        matches!(self.outcome, Ok(s) if (200..400).contains(&s))
    }
}

/// What a probe has seen so far.
#[derive(Clone, Debug)]
pub struct ProbeState {
    /// Every result, oldest first.
    pub results: Vec<ProbeResult>,
    /// The probe's verdict now (ready, alive, started).
    pub passing: bool,
    /// When the verdict first turned passing.
    pub first_passing: Option<Instant>,
    /// How often failures reached the failure threshold (a liveness probe's would each have
    /// restarted the container).
    pub threshold_failures: u32,
    consecutive_ok: u32,
    consecutive_failed: u32,
}

/// A probe running on its own thread until dropped.
#[derive(Debug)]
pub struct Prober {
    kind: ProbeKind,
    plan: ProbePlan,
    state: Arc<(Mutex<ProbeState>, Condvar)>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Prober {
    /// Starts probing `plan` from the network namespace at `netns` (a file to `setns` to),
    /// as from the moment the container started (`started`).
    pub fn start(kind: ProbeKind, plan: ProbePlan, netns: &Path, started: Instant) -> Result<Self> {
        let fd = OwnedFd::from(
            std::fs::File::open(netns).ctx(|| format!("opening {}", netns.display()))?,
        );
        let state = Arc::new((
            Mutex::new(ProbeState {
                results: Vec::new(),
                passing: kind != ProbeKind::Readiness && kind != ProbeKind::Startup,
                first_passing: None,
                threshold_failures: 0,
                consecutive_ok: 0,
                consecutive_failed: 0,
            }),
            Condvar::new(),
        ));
        let stop = Arc::new(AtomicBool::new(false));
        let (st, sp, p) = (state.clone(), stop.clone(), plan.clone());
        let thread = std::thread::Builder::new()
            .name(format!("probe-{kind:?}"))
            .spawn(move || {
                if setns(fd.as_fd(), CloneFlags::CLONE_NEWNET).is_err() {
                    return;
                }
                let mut next = started + p.initial_delay;
                while !sp.load(Ordering::Relaxed) {
                    let now = Instant::now();
                    if now < next {
                        std::thread::sleep((next - now).min(Duration::from_millis(50)));
                        continue;
                    }
                    let result = ProbeResult {
                        at: now,
                        outcome: http_probe(&p),
                    };
                    let (lock, cv) = &*st;
                    let mut s = lock.lock().unwrap_or_else(|e| e.into_inner());
                    if result.success() {
                        s.consecutive_ok += 1;
                        s.consecutive_failed = 0;
                        if s.consecutive_ok >= p.success_threshold && !s.passing {
                            s.passing = true;
                        }
                        if s.passing && s.first_passing.is_none() {
                            s.first_passing = Some(now);
                        }
                    } else {
                        s.consecutive_failed += 1;
                        s.consecutive_ok = 0;
                        if s.consecutive_failed >= p.failure_threshold {
                            if s.consecutive_failed == p.failure_threshold {
                                s.threshold_failures += 1;
                            }
                            s.passing = false;
                        }
                    }
                    s.results.push(result);
                    cv.notify_all();
                    drop(s);
                    next += p.period;
                }
            })
            .ctx(|| "spawning a prober")?;
        Ok(Self {
            kind,
            plan,
            state,
            stop,
            thread: Some(thread),
        })
    }

    /// Which probe this is.
    pub fn kind(&self) -> ProbeKind {
        self.kind
    }

    /// What it probes.
    pub fn plan(&self) -> &ProbePlan {
        &self.plan
    }

    /// Its state now.
    pub fn state(&self) -> ProbeState {
        self.state
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Waits until the verdict is passing; returns when it first was.
    pub fn wait_passing(&self, timeout: Duration) -> Result<Instant> {
        let (lock, cv) = &*self.state;
        let deadline = Instant::now() + timeout;
        let mut s = lock.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if s.passing
                && let Some(t) = s.first_passing
            {
                return Ok(t);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Timeout {
                    what: format!("the {:?} probe to pass", self.kind),
                    timeout,
                    detail: format!("{:?}", s.results),
                });
            }
            s = cv
                .wait_timeout(s, deadline - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    /// Waits until `n` probes have run in all.
    pub fn wait_results(&self, n: usize, timeout: Duration) -> Result<ProbeState> {
        self.wait_state(&format!("{n} {:?} probes", self.kind), timeout, |s| {
            s.results.len() >= n
        })
    }

    /// Waits until `done` holds for the probe's state; returns that state.
    pub fn wait_state(
        &self,
        what: &str,
        timeout: Duration,
        done: impl Fn(&ProbeState) -> bool,
    ) -> Result<ProbeState> {
        let (lock, cv) = &*self.state;
        let deadline = Instant::now() + timeout;
        let mut s = lock.lock().unwrap_or_else(|e| e.into_inner());
        while !done(&s) {
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Timeout {
                    what: what.to_string(),
                    timeout,
                    detail: format!("{:?}", s.results),
                });
            }
            s = cv
                .wait_timeout(s, deadline - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
        Ok(s.clone())
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One HTTP probe as kubelet sends it; the status code or the failure.
pub fn http_probe(p: &ProbePlan) -> std::result::Result<u16, String> {
    http_status(p.addr, &p.path, &p.host_header, &p.headers, p.timeout)
}

/// `GET path` to `addr` with kubelet's headers, within `timeout` in all; the status code.
pub fn http_status(
    addr: SocketAddr,
    path: &str,
    host: &str,
    headers: &[(String, String)],
    timeout: Duration,
) -> std::result::Result<u16, String> {
    let deadline = Instant::now() + timeout;
    let mut conn = TcpStream::connect_timeout(&addr, timeout).map_err(|e| e.to_string())?;
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err("timeout".into());
    }
    conn.set_read_timeout(Some(left))
        .map_err(|e| e.to_string())?;
    conn.set_write_timeout(Some(left))
        .map_err(|e| e.to_string())?;
    let mut req = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: {USER_AGENT}\r\nAccept: */*\r\nConnection: close\r\n"
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    conn.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    // kubelet reads at most 10 KiB of the body; the status line is all that matters.
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(2).any(|w| w == b"\r\n") {
        let n = conn.read(&mut buf).map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() > 10 * 1024 {
            break;
        }
    }
    let text = String::from_utf8_lossy(&head);
    text.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status line in {text:?}"))
}
