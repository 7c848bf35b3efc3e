//! The test client (`linkerd-cni-test-client`): one process that opens TCP connections (or
//! sends a UDP datagram) the way an application in a pod would, and reports in JSON what the
//! kernel told it. Tests run it as an ordinary UID (or as the proxy's) in a pod's netns and
//! cgroup with [`run_client`], and assert on the [`Report`].
//!
//! Besides the plain client it has a validator mode (`--listen`): listen first, then connect
//! and see whether the connection came back to the client's own listener, as
//! linkerd-network-validator checks that redirection works: its listener writes a token
//! unique to the run on the connection it accepts, and the client must read that token.
//! (Comparing addresses would not do: with redirection the client's `getsockname` shows the
//! pod's address, as under iptables, while the listener sees the socket's loopback address.)

use std::{
    io::{Read, Write},
    net::{Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket},
    process::Stdio,
    time::{Duration, Instant},
};

use serde::{Deserialize, Serialize};
use socket2::{Domain, Socket, Type};

use crate::{
    bins,
    child::Placement,
    error::{Error, Result},
};

/// How much of the response the report quotes (`received`); all of it is counted and hashed.
pub const QUOTE_LIMIT: usize = 4096;

/// Command line of `linkerd-cni-test-client`.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "linkerd-cni-test-client",
    about = "Connects (TCP) or sends (UDP) like a pod's application and prints a JSON report"
)]
pub struct Options {
    /// Where to connect (TCP) or send to (UDP): `10.0.0.2:80`, `[fd00::2]:80`, or a v4-mapped
    /// `[::ffff:10.0.0.2]:80` (an AF_INET6 socket).
    #[arg(long, env = "LINKERD_CNI_TEST_CLIENT_CONNECT")]
    pub connect: SocketAddr,
    /// Send one UDP datagram with `sendto` instead of connecting over TCP.
    #[arg(long, env = "LINKERD_CNI_TEST_CLIENT_UDP")]
    pub udp: bool,
    /// Bytes to send first (e.g. a request line).
    #[arg(long, env = "LINKERD_CNI_TEST_CLIENT_SEND")]
    pub send: Option<String>,
    /// Number of pattern bytes (`a`..`z`, no newline) to send after `--send`.
    #[arg(
        long,
        default_value_t = 0,
        env = "LINKERD_CNI_TEST_CLIENT_PAYLOAD_SIZE"
    )]
    pub payload_size: usize,
    /// Keep the write side open after sending (by default the client half-closes, so the server
    /// sees EOF).
    #[arg(long, env = "LINKERD_CNI_TEST_CLIENT_NO_SHUTDOWN")]
    pub no_shutdown: bool,
    /// Do not wait for a response.
    #[arg(long, env = "LINKERD_CNI_TEST_CLIENT_NO_READ")]
    pub no_read: bool,
    /// Timeout for connect, each read, and the accept of validator mode, in milliseconds.
    #[arg(
        long,
        default_value_t = 5000,
        env = "LINKERD_CNI_TEST_CLIENT_TIMEOUT_MS"
    )]
    pub timeout_ms: u64,
    /// Number of connections to make one after another (TCP); the report details the last one
    /// and counts the rest.
    #[arg(long, default_value_t = 1, env = "LINKERD_CNI_TEST_CLIENT_COUNT")]
    pub count: u64,
    /// Validator mode: listen on this address before connecting, then accept and report whether
    /// the connection reached this listener from the client's own socket.
    #[arg(long, env = "LINKERD_CNI_TEST_CLIENT_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Bind the client socket to this address before connecting / sending.
    #[arg(long, env = "LINKERD_CNI_TEST_CLIENT_BIND")]
    pub bind: Option<SocketAddr>,
    /// With `--listen`: exit as linkerd-network-validator does, [`VALIDATOR_PASSED`] when the
    /// connection reached the client's own listener, [`VALIDATOR_FAILED`] otherwise (the
    /// report is printed either way).
    #[arg(long, env = "LINKERD_CNI_TEST_CLIENT_VALIDATOR_EXIT_CODES")]
    pub validator_exit_codes: bool,
}

/// linkerd-network-validator's exit status when redirection works.
pub const VALIDATOR_PASSED: i32 = 0;
/// linkerd-network-validator's exit status when the connection did not come back to it.
pub const VALIDATOR_FAILED: i32 = 95;

impl Options {
    /// Options for one TCP connection to `connect` with every default.
    pub fn new(connect: SocketAddr) -> Self {
        Options {
            connect,
            udp: false,
            send: None,
            payload_size: 0,
            no_shutdown: false,
            no_read: false,
            timeout_ms: 5000,
            count: 1,
            listen: None,
            bind: None,
            validator_exit_codes: false,
        }
    }

    /// Linkerd's network validator in the pod, as it runs (UID 65534, before the proxy):
    /// listen on the proxy's outbound port on every address, dial `connect` (an address
    /// nothing on the way answers), and exit 0 if the dial came back to the listener, 95 if
    /// not.
    pub fn validator(connect: SocketAddr, timeout: Duration) -> Self {
        let mut opts = Options::new(connect);
        opts.listen = Some(SocketAddr::from((
            [0, 0, 0, 0],
            crate::proxy::OUTBOUND_PORT,
        )));
        // It reads: the token its listener writes is how it knows the dial came back.
        opts.timeout_ms = timeout.as_millis() as u64;
        opts.validator_exit_codes = true;
        opts
    }

    /// Sends `s` first.
    pub fn send(mut self, s: impl Into<String>) -> Self {
        self.send = Some(s.into());
        self
    }

    /// Uses UDP.
    pub fn udp(mut self) -> Self {
        self.udp = true;
        self
    }

    /// The command-line arguments that reproduce these options.
    pub fn to_args(&self) -> Vec<String> {
        let mut args = vec!["--connect".to_string(), self.connect.to_string()];
        let mut flag = |on: bool, name: &str| {
            if on {
                args.push(name.to_string());
            }
        };
        flag(self.udp, "--udp");
        flag(self.no_shutdown, "--no-shutdown");
        flag(self.no_read, "--no-read");
        if let Some(s) = &self.send {
            args.extend(["--send".to_string(), s.clone()]);
        }
        args.extend(["--payload-size".to_string(), self.payload_size.to_string()]);
        args.extend(["--timeout-ms".to_string(), self.timeout_ms.to_string()]);
        args.extend(["--count".to_string(), self.count.to_string()]);
        if let Some(a) = self.listen {
            args.extend(["--listen".to_string(), a.to_string()]);
        }
        if let Some(a) = self.bind {
            args.extend(["--bind".to_string(), a.to_string()]);
        }
        if self.validator_exit_codes {
            args.push("--validator-exit-codes".to_string());
        }
        args
    }

    /// The bytes the client sends: `--send` followed by `--payload-size` pattern bytes.
    pub fn payload(&self) -> Vec<u8> {
        let mut out = self.send.clone().unwrap_or_default().into_bytes();
        out.extend(pattern(self.payload_size));
        out
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.max(1))
    }
}

/// `n` deterministic bytes `a`..`z` repeating (no newline, so line-based servers read to EOF).
pub fn pattern(n: usize) -> impl Iterator<Item = u8> {
    (0..n).map(|i| b'a' + (i % 26) as u8)
}

/// FNV-1a (64 bit) of `data`, as 16 hex digits: how reports identify payloads.
pub fn fnv1a64(data: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in data {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// The result of one step: success, or the error with its errno.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    /// The step succeeded (or was not performed).
    pub ok: bool,
    /// The OS error number, when the step failed with one.
    pub errno: Option<i32>,
    /// The error message, when the step failed.
    pub error: Option<String>,
}

impl Outcome {
    /// Success.
    pub fn ok() -> Self {
        Outcome {
            ok: true,
            errno: None,
            error: None,
        }
    }

    /// A failure from an I/O error.
    pub fn err(e: &std::io::Error) -> Self {
        Outcome {
            ok: false,
            errno: e.raw_os_error(),
            error: Some(e.to_string()),
        }
    }

    fn of<T>(r: &std::io::Result<T>) -> Self {
        match r {
            Ok(_) => Self::ok(),
            Err(e) => Self::err(e),
        }
    }
}

/// Validator mode: what the client's own listener accepted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Accepted {
    /// The accepted connection's peer (the client socket, if it came back to itself).
    pub peer: SocketAddr,
    /// The accepted connection's local address.
    pub local: SocketAddr,
    /// The client read, on its own connection, the token its listener wrote on the
    /// connection it accepted (as linkerd-network-validator checks): the connection reached
    /// itself.
    pub reached_self: bool,
}

/// What the test client prints (one JSON object on stdout).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// The client's PID.
    pub pid: u32,
    /// The client's real UID.
    pub uid: u32,
    /// The client's real GID.
    pub gid: u32,
    /// `tcp` or `udp`.
    pub protocol: String,
    /// The address the client asked for.
    pub target: SocketAddr,
    /// `connect()` (TCP) or `sendto()` (UDP).
    pub connect: Outcome,
    /// `getsockname()` after connect / send.
    pub local: Option<SocketAddr>,
    /// `getpeername()` after connect (TCP), or the source of the reply (UDP).
    pub peer: Option<SocketAddr>,
    /// Writing the payload (TCP).
    pub write: Outcome,
    /// Bytes sent.
    pub sent_len: u64,
    /// FNV-1a of the bytes sent.
    pub sent_hash: String,
    /// Reading the response (ok when not requested).
    pub read: Outcome,
    /// Bytes received.
    pub received_len: u64,
    /// FNV-1a of the bytes received.
    pub received_hash: String,
    /// The first [`QUOTE_LIMIT`] bytes received, lossily decoded.
    pub received: String,
    /// Validator mode: what the client's listener accepted, if anything.
    pub accepted: Option<Accepted>,
    /// Connections attempted.
    pub count: u64,
    /// Connections where connect, write and read all succeeded.
    pub succeeded: u64,
    /// Connections where a step failed.
    pub failed: u64,
    /// The first failure, if any (`<step>: <error>`).
    pub first_failure: Option<String>,
    /// Wall time for all connections, in microseconds.
    pub elapsed_us: u64,
    /// Distribution of the time per connection (connect, send, receive, close).
    pub latency: Latency,
}

/// Distribution of per-connection times, in microseconds (nearest-rank percentiles).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Latency {
    /// Fastest.
    pub min_us: u64,
    /// Median.
    pub p50_us: u64,
    /// 90th percentile.
    pub p90_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// Slowest.
    pub max_us: u64,
}

impl Latency {
    /// The distribution of `samples` (sorted in place); all zero when empty.
    pub fn of(samples: &mut [u64]) -> Self {
        samples.sort_unstable();
        let rank = |p: usize| -> u64 {
            if samples.is_empty() {
                return 0;
            }
            let i = (samples.len() * p).div_ceil(100).max(1) - 1;
            samples[i.min(samples.len() - 1)]
        };
        Latency {
            min_us: rank(0),
            p50_us: rank(50),
            p90_us: rank(90),
            p99_us: rank(99),
            max_us: rank(100),
        }
    }
}

impl Report {
    /// The response as bytes was fully received and equals `expected`.
    pub fn received_matches(&self, expected: &[u8]) -> bool {
        self.received_len == expected.len() as u64 && self.received_hash == fnv1a64(expected)
    }

    /// linkerd-network-validator's exit status for this run: passed when the connection came
    /// back to the client's own listener.
    pub fn validator_exit_code(&self) -> i32 {
        if self.accepted.as_ref().is_some_and(|a| a.reached_self) {
            VALIDATOR_PASSED
        } else {
            VALIDATOR_FAILED
        }
    }
}

struct Conn {
    connect: Outcome,
    local: Option<SocketAddr>,
    peer: Option<SocketAddr>,
    write: Outcome,
    read: Outcome,
    received: Vec<u8>,
}

impl Conn {
    fn failure(&self) -> Option<String> {
        [
            ("connect", &self.connect),
            ("write", &self.write),
            ("read", &self.read),
        ]
        .iter()
        .find(|(_, o)| !o.ok)
        .map(|(step, o)| format!("{step}: {}", o.error.as_deref().unwrap_or("failed")))
    }
}

fn new_socket(opts: &Options, ty: Type) -> std::io::Result<Socket> {
    let sock = Socket::new(Domain::for_address(opts.connect), ty, None)?;
    if let Some(bind) = opts.bind {
        sock.bind(&bind.into())?;
    }
    Ok(sock)
}

fn tcp_once(opts: &Options, payload: &[u8]) -> Conn {
    let mut conn = Conn {
        connect: Outcome::ok(),
        local: None,
        peer: None,
        write: Outcome::ok(),
        read: Outcome::ok(),
        received: Vec::new(),
    };
    let stream = new_socket(opts, Type::STREAM).and_then(|s| {
        s.connect_timeout(&opts.connect.into(), opts.timeout())
            .map(|()| s)
    });
    let mut stream: TcpStream = match stream {
        Ok(s) => s.into(),
        Err(e) => {
            conn.connect = Outcome::err(&e);
            return conn;
        }
    };
    conn.local = stream.local_addr().ok();
    conn.peer = stream.peer_addr().ok();
    if !payload.is_empty() {
        conn.write = Outcome::of(&stream.write_all(payload));
    }
    if !opts.no_shutdown {
        let _ = stream.shutdown(Shutdown::Write);
    }
    if !opts.no_read {
        let _ = stream.set_read_timeout(Some(opts.timeout()));
        conn.read = Outcome::of(&stream.read_to_end(&mut conn.received));
    }
    conn
}

fn accept_within(
    listener: &TcpListener,
    timeout: Duration,
    give_up: &std::sync::atomic::AtomicBool,
) -> std::io::Result<(TcpStream, SocketAddr)> {
    listener.set_nonblocking(true)?;
    let deadline = Instant::now() + timeout;
    loop {
        match listener.accept() {
            Ok((s, peer)) => {
                s.set_nonblocking(false)?;
                return Ok((s, peer));
            }
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    && Instant::now() < deadline
                    && !give_up.load(std::sync::atomic::Ordering::Relaxed) =>
            {
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => return Err(e),
        }
    }
}

fn udp_once(opts: &Options, payload: &[u8]) -> Conn {
    let mut conn = Conn {
        connect: Outcome::ok(),
        local: None,
        peer: None,
        write: Outcome::ok(),
        read: Outcome::ok(),
        received: Vec::new(),
    };
    let sock: UdpSocket = match new_socket(opts, Type::DGRAM) {
        Ok(s) => s.into(),
        Err(e) => {
            conn.connect = Outcome::err(&e);
            return conn;
        }
    };
    conn.connect = Outcome::of(&sock.send_to(payload, opts.connect));
    conn.local = sock.local_addr().ok();
    if conn.connect.ok && !opts.no_read {
        let _ = sock.set_read_timeout(Some(opts.timeout()));
        let mut buf = vec![0u8; 65536];
        match sock.recv_from(&mut buf) {
            Ok((n, from)) => {
                conn.received = buf[..n].to_vec();
                conn.peer = Some(from);
            }
            Err(e) => conn.read = Outcome::err(&e),
        }
    }
    conn
}

/// Runs the client as `opts` say and reports what happened. Never panics on network errors:
/// they are part of the report.
pub fn execute(opts: &Options) -> Report {
    let payload = opts.payload();
    let started = Instant::now();
    // Validator mode: the listener accepts on a thread of its own, so that what it writes
    // reaches the client while the client reads; it gives up once the client's connect failed.
    let token = format!(
        "l5d-validator-{}-{}\n",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    );
    let give_up = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let listener = opts.listen.map(|addr| {
        let listener = TcpListener::bind(addr)?;
        let (token, give_up, timeout) = (token.clone(), give_up.clone(), opts.timeout());
        Ok::<_, std::io::Error>(std::thread::spawn(move || {
            let (mut s, peer) = accept_within(&listener, timeout, &give_up)?;
            let local = s.local_addr().unwrap_or(peer);
            s.write_all(token.as_bytes())?;
            Ok::<_, std::io::Error>((peer, local))
        }))
    });
    let (mut succeeded, mut failed, mut first_failure) = (0, 0, None);
    let mut accepted = None;
    let count = if opts.udp { 1 } else { opts.count.max(1) };
    let mut durations_us: Vec<u64> = Vec::with_capacity(count.min(1 << 20) as usize);
    let mut once = || {
        let t = Instant::now();
        let conn = if opts.udp {
            udp_once(opts, &payload)
        } else {
            tcp_once(opts, &payload)
        };
        durations_us.push(t.elapsed().as_micros() as u64);
        conn
    };
    let mut tally = |conn: &Conn| match conn.failure() {
        None => succeeded += 1,
        Some(f) => {
            failed += 1;
            first_failure.get_or_insert(f);
        }
    };
    let mut conn = once();
    tally(&conn);
    for _ in 1..count {
        conn = once();
        tally(&conn);
    }
    let latency = Latency::of(&mut durations_us);
    if !conn.connect.ok {
        give_up.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    match listener {
        Some(Ok(acceptor)) => match acceptor.join() {
            Ok(Ok((peer, local))) => {
                accepted = Some(Accepted {
                    peer,
                    local,
                    reached_self: conn.received == token.as_bytes(),
                });
            }
            Ok(Err(e)) if conn.connect.ok => {
                first_failure.get_or_insert(format!("accept: {e}"));
                conn.read = Outcome::err(&e);
            }
            Ok(Err(_)) => {}
            Err(_) => {
                first_failure.get_or_insert("accept: the listener's thread panicked".into());
            }
        },
        Some(Err(e)) => {
            first_failure.get_or_insert(format!("listen: {e}"));
            conn.read = Outcome::err(&e);
        }
        _ => {}
    }
    Report {
        pid: std::process::id(),
        // SAFETY: getuid/getgid cannot fail.
        uid: unsafe { libc::getuid() },
        gid: unsafe { libc::getgid() },
        protocol: if opts.udp { "udp" } else { "tcp" }.to_string(),
        target: opts.connect,
        connect: conn.connect,
        local: conn.local,
        peer: conn.peer,
        write: conn.write,
        sent_len: payload.len() as u64,
        sent_hash: fnv1a64(&payload),
        read: conn.read,
        received_len: conn.received.len() as u64,
        received_hash: fnv1a64(&conn.received),
        received: String::from_utf8_lossy(&conn.received[..conn.received.len().min(QUOTE_LIMIT)])
            .into_owned(),
        accepted,
        count,
        succeeded,
        failed,
        first_failure,
        elapsed_us: started.elapsed().as_micros() as u64,
        latency,
    }
}

/// Runs `linkerd-cni-test-client` with `opts`, placed as `placement` says (netns, cgroup, UID),
/// waits up to `timeout`, and returns its report.
pub fn run_client(placement: &Placement, opts: &Options, timeout: Duration) -> Result<Report> {
    let mut cmd = placement.command(bins::bin_path(bins::CLIENT)?)?;
    cmd.args(opts.to_args())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = crate::child::ChildGuard::spawn(&mut cmd)?.wait_output(timeout)?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(Error::Command {
            command: format!("{} {}", bins::CLIENT, opts.to_args().join(" ")),
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    serde_json::from_str(stdout.trim()).map_err(|e| Error::Parse {
        what: "the test client's report".into(),
        detail: format!("{e}: {stdout}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn options_round_trip_through_the_command_line() {
        let base = Options::new("10.0.0.2:80".parse().expect("literal"));
        let mut full = base.clone().send("GET /\n").udp();
        full.no_shutdown = true;
        full.no_read = true;
        full.payload_size = 10;
        full.count = 3;
        full.listen = Some("0.0.0.0:4140".parse().expect("literal"));
        full.bind = Some("[::]:0".parse().expect("literal"));
        for opts in [base, full] {
            let args = opts.to_args();
            let parsed =
                Options::try_parse_from(std::iter::once("client".to_string()).chain(args.clone()))
                    .unwrap_or_else(|e| panic!("{args:?} must parse: {e}"));
            assert_eq!(parsed.to_args(), args, "round trip");
            assert_eq!(parsed.payload(), opts.payload(), "payload of {args:?}");
        }
    }

    #[test]
    fn latency_uses_nearest_rank_percentiles() {
        let mut hundred: Vec<u64> = (1..=100).rev().collect();
        let cases: [(&mut [u64], Latency); 3] = [
            (&mut [], Latency::default()),
            (
                &mut [7],
                Latency {
                    min_us: 7,
                    p50_us: 7,
                    p90_us: 7,
                    p99_us: 7,
                    max_us: 7,
                },
            ),
            (
                &mut hundred,
                Latency {
                    min_us: 1,
                    p50_us: 50,
                    p90_us: 90,
                    p99_us: 99,
                    max_us: 100,
                },
            ),
        ];
        for (samples, want) in cases {
            let shown = format!("{samples:?}");
            assert_eq!(Latency::of(samples), want, "latency of {shown}");
        }
    }

    #[test]
    fn pattern_has_no_newline_and_hash_is_fnv1a() {
        let p: Vec<u8> = pattern(1000).collect();
        assert_eq!(p.len(), 1000);
        assert!(!p.contains(&b'\n'), "pattern must not contain a newline");
        // Published FNV-1a 64 test vectors.
        for (input, want) in [
            ("", "cbf29ce484222325"),
            ("a", "af63dc4c8601ec8c"),
            ("foobar", "85944171f73967e8"),
        ] {
            assert_eq!(fnv1a64(input.as_bytes()), want, "fnv1a64({input:?})");
        }
    }
}
