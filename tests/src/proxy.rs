//! The forwarding test proxy (`linkerd-cni-test-proxy`): what linkerd2-proxy does with a
//! redirected connection, and nothing else.
//!
//! It listens on the outbound port (`127.0.0.1:4140`, `[::1]:4140` with IPv6) and the inbound
//! port (`0.0.0.0:4143`, `[::]:4143`), asks every accepted socket for its original destination
//! with `getsockopt(SOL_IP, SO_ORIGINAL_DST)` (`SOL_IPV6, IP6T_SO_ORIGINAL_DST` on IPv6
//! sockets) exactly as linkerd2-proxy does, connects there, and copies both ways with
//! `splice(2)` through a pipe (read/write when splice is refused), passing half-closes on.
//! When the original destination cannot be read it logs the error and closes the connection:
//! there is nowhere to forward.
//!
//! Every event is one JSON line ([`Event`]) appended to the log file; tests read it with
//! [`ProxyLog`]. [`TestProxy`] starts the binary in a pod (netns, cgroup, UID 2102) and waits
//! until it listens.

use std::{
    fs::{File, OpenOptions},
    io::{self, Read, Write},
    net::{
        Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, SocketAddrV4, SocketAddrV6, TcpListener,
        TcpStream,
    },
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    path::{Path, PathBuf},
    process::Stdio,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use serde::{Deserialize, Serialize};
use socket2::{Domain, Socket, Type};

use crate::{
    bins,
    child::{ChildGuard, Placement},
    error::{Error, IoContext, Result},
    names::TempDir,
    pool::Pool,
};

/// linkerd2-proxy's UID (the one the data plane exempts), its outbound and its inbound
/// listener port: the defaults `linkerd_cni_proto::config` defines.
pub use linkerd_cni_proto::config::{
    DEFAULT_INBOUND_PORT as INBOUND_PORT, DEFAULT_OUTBOUND_PORT as OUTBOUND_PORT,
    DEFAULT_PROXY_UID as PROXY_UID,
};
/// The options (and their levels) the proxy asks for the original destination.
use linkerd_cni_sys::uapi::{IP6T_SO_ORIGINAL_DST, SO_ORIGINAL_DST, SOL_IP, SOL_IPV6};

/// Command line of `linkerd-cni-test-proxy`.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "linkerd-cni-test-proxy",
    about = "Forwards every accepted connection to its SO_ORIGINAL_DST, like linkerd2-proxy"
)]
pub struct Options {
    /// Outbound listener port (on 127.0.0.1, and ::1 with --ipv6).
    #[arg(long, default_value_t = OUTBOUND_PORT, env = "LINKERD_CNI_TEST_PROXY_OUTBOUND_PORT")]
    pub outbound_port: u16,
    /// Inbound listener port (on 0.0.0.0, and :: with --ipv6).
    #[arg(long, default_value_t = INBOUND_PORT, env = "LINKERD_CNI_TEST_PROXY_INBOUND_PORT")]
    pub inbound_port: u16,
    /// Also listen on IPv6 (`[::1]:<outbound>`, `[::]:<inbound>`, both IPV6_V6ONLY).
    #[arg(long, env = "LINKERD_CNI_TEST_PROXY_IPV6")]
    pub ipv6: bool,
    /// Listen only on these addresses instead of the defaults (repeat, or comma-separate).
    #[arg(long, value_delimiter = ',', env = "LINKERD_CNI_TEST_PROXY_LISTEN")]
    pub listen: Vec<SocketAddr>,
    /// After binding, drop to this UID (when started as root).
    #[arg(long, env = "LINKERD_CNI_TEST_PROXY_UID")]
    pub uid: Option<u32>,
    /// After binding, drop to this GID (defaults to --uid's value when that is given).
    #[arg(long, env = "LINKERD_CNI_TEST_PROXY_GID")]
    pub gid: Option<u32>,
    /// Append JSON-lines events here (default: stdout).
    #[arg(long, env = "LINKERD_CNI_TEST_PROXY_LOG")]
    pub log: Option<PathBuf>,
    /// Create this file once every listener is bound and privileges are dropped (its directory
    /// must be writable by the final UID).
    #[arg(long, env = "LINKERD_CNI_TEST_PROXY_READY_FILE")]
    pub ready_file: Option<PathBuf>,
    /// Timeout for connecting to the original destination, in milliseconds.
    #[arg(
        long,
        default_value_t = 3000,
        env = "LINKERD_CNI_TEST_PROXY_CONNECT_TIMEOUT_MS"
    )]
    pub connect_timeout_ms: u64,
    /// Copy with read/write instead of splice.
    #[arg(long, env = "LINKERD_CNI_TEST_PROXY_NO_SPLICE")]
    pub no_splice: bool,
    /// Wait this long after becoming ready before the first `accept()` (a busy proxy):
    /// connections made meanwhile wait in the accept queue.
    #[arg(
        long,
        default_value_t = 0,
        env = "LINKERD_CNI_TEST_PROXY_ACCEPT_DELAY_MS"
    )]
    pub accept_delay_ms: u64,
    /// No `accept()` until this file exists (after `--accept-delay-ms`): connections made
    /// meanwhile wait in the accept queue for as long as the test wants, however slow the
    /// machine. [`TestProxy::start`] places a relative path in the proxy's scratch directory;
    /// [`TestProxy::open_accept_gate`] creates it.
    #[arg(long, env = "LINKERD_CNI_TEST_PROXY_ACCEPT_GATE")]
    pub accept_gate: Option<PathBuf>,
}

impl Options {
    /// The defaults: 127.0.0.1:4140 and 0.0.0.0:4143, IPv4 only, no privilege drop.
    pub fn new() -> Self {
        Options {
            outbound_port: OUTBOUND_PORT,
            inbound_port: INBOUND_PORT,
            ipv6: false,
            listen: Vec::new(),
            uid: None,
            gid: None,
            log: None,
            ready_file: None,
            connect_timeout_ms: 3000,
            no_splice: false,
            accept_delay_ms: 0,
            accept_gate: None,
        }
    }

    /// The addresses to listen on.
    pub fn listen_addrs(&self) -> Vec<SocketAddr> {
        if !self.listen.is_empty() {
            return self.listen.clone();
        }
        let mut out = vec![
            SocketAddr::from((Ipv4Addr::LOCALHOST, self.outbound_port)),
            SocketAddr::from((Ipv4Addr::UNSPECIFIED, self.inbound_port)),
        ];
        if self.ipv6 {
            out.push(SocketAddr::from((Ipv6Addr::LOCALHOST, self.outbound_port)));
            out.push(SocketAddr::from((Ipv6Addr::UNSPECIFIED, self.inbound_port)));
        }
        out
    }

    /// The command-line arguments that reproduce these options.
    pub fn to_args(&self) -> Vec<String> {
        let mut args = vec![
            "--outbound-port".to_string(),
            self.outbound_port.to_string(),
            "--inbound-port".to_string(),
            self.inbound_port.to_string(),
            "--connect-timeout-ms".to_string(),
            self.connect_timeout_ms.to_string(),
            "--accept-delay-ms".to_string(),
            self.accept_delay_ms.to_string(),
        ];
        if self.ipv6 {
            args.push("--ipv6".into());
        }
        if self.no_splice {
            args.push("--no-splice".into());
        }
        for a in &self.listen {
            args.extend(["--listen".into(), a.to_string()]);
        }
        let opt = |args: &mut Vec<String>, name: &str, v: Option<String>| {
            if let Some(v) = v {
                args.extend([name.to_string(), v]);
            }
        };
        opt(&mut args, "--uid", self.uid.map(|v| v.to_string()));
        opt(&mut args, "--gid", self.gid.map(|v| v.to_string()));
        opt(
            &mut args,
            "--log",
            self.log.as_ref().map(|p| p.display().to_string()),
        );
        opt(
            &mut args,
            "--ready-file",
            self.ready_file.as_ref().map(|p| p.display().to_string()),
        );
        opt(
            &mut args,
            "--accept-gate",
            self.accept_gate.as_ref().map(|p| p.display().to_string()),
        );
        args
    }
}

impl Default for Options {
    fn default() -> Self {
        Self::new()
    }
}

/// How a connection's bytes were copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CopyMode {
    /// `splice(2)` through a pipe, both directions.
    Splice,
    /// `read`/`write` in at least one direction (splice refused, or `--no-splice`).
    ReadWrite,
}

/// One line of the proxy's log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// A listener is bound.
    Listening {
        /// Its address.
        addr: SocketAddr,
    },
    /// Every listener is bound and privileges are dropped: the proxy serves.
    Ready {
        /// The proxy's PID.
        pid: u32,
        /// Its UID now.
        uid: u32,
        /// Its GID now.
        gid: u32,
    },
    /// A connection was accepted and its original destination read.
    Accepted {
        /// Connection number (per proxy run).
        id: u64,
        /// The listener that accepted it.
        listener: SocketAddr,
        /// The client (`getpeername` of the accepted socket).
        peer: SocketAddr,
        /// `getsockname` of the accepted socket.
        local: SocketAddr,
        /// `SO_ORIGINAL_DST`.
        orig_dst: SocketAddr,
    },
    /// `SO_ORIGINAL_DST` failed: the connection was closed.
    OrigDstError {
        /// Connection number.
        id: u64,
        /// The listener that accepted it.
        listener: SocketAddr,
        /// The client.
        peer: SocketAddr,
        /// `getsockname` of the accepted socket.
        local: SocketAddr,
        /// The errno (`ENOENT` when there is no redirection record).
        errno: Option<i32>,
        /// The error message.
        message: String,
    },
    /// The original destination is this very listener (a connection made to the proxy port
    /// directly): forwarding would loop, so the connection was closed.
    Rejected {
        /// Connection number.
        id: u64,
        /// The listener that accepted it.
        listener: SocketAddr,
        /// The client.
        peer: SocketAddr,
        /// The original destination reported.
        orig_dst: SocketAddr,
        /// Why.
        reason: String,
    },
    /// Connecting to the original destination failed: the connection was closed.
    UpstreamError {
        /// Connection number.
        id: u64,
        /// The listener that accepted it.
        listener: SocketAddr,
        /// The client.
        peer: SocketAddr,
        /// The original destination.
        orig_dst: SocketAddr,
        /// The errno.
        errno: Option<i32>,
        /// The error message.
        message: String,
    },
    /// A forwarded connection ended (both directions closed).
    Closed {
        /// Connection number.
        id: u64,
        /// The listener that accepted it.
        listener: SocketAddr,
        /// The client.
        peer: SocketAddr,
        /// The original destination.
        orig_dst: SocketAddr,
        /// The proxy's local address on the upstream connection.
        upstream_local: SocketAddr,
        /// Bytes copied client -> upstream.
        bytes_to_upstream: u64,
        /// Bytes copied upstream -> client.
        bytes_to_client: u64,
        /// How they were copied.
        copy: CopyMode,
        /// The first copy error, if a direction ended with one.
        error: Option<String>,
    },
}

impl Event {
    /// The connection number, for per-connection events.
    pub fn id(&self) -> Option<u64> {
        match self {
            Event::Listening { .. } | Event::Ready { .. } => None,
            Event::Accepted { id, .. }
            | Event::OrigDstError { id, .. }
            | Event::Rejected { id, .. }
            | Event::UpstreamError { id, .. }
            | Event::Closed { id, .. } => Some(*id),
        }
    }
}

/// Reads a proxy's JSON-lines log.
#[derive(Debug, Clone)]
pub struct ProxyLog {
    path: PathBuf,
    /// The events parsed so far and the bytes they came from: each read parses only the lines
    /// added since (a test waiting for 20,000 accepts re-parsed the whole log at every poll,
    /// minutes per poll in a debug build under emulation).
    parsed: Arc<Mutex<(usize, Vec<Event>)>>,
}

impl ProxyLog {
    /// The log at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        ProxyLog {
            path: path.into(),
            parsed: Arc::default(),
        }
    }

    /// The log file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every complete event logged so far (a line still being written is skipped).
    pub fn events(&self) -> Result<Vec<Event>> {
        let text = match std::fs::read(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Error::io(format!("reading {}", self.path.display()), e)),
        };
        let mut parsed = self.parsed.lock().unwrap_or_else(|e| e.into_inner());
        if text.len() < parsed.0 {
            // A new log at the same path: start over.
            *parsed = (0, Vec::new());
        }
        let complete = match text[parsed.0..].iter().rposition(|b| *b == b'\n') {
            Some(i) => parsed.0 + i + 1,
            None => parsed.0,
        };
        let new = String::from_utf8_lossy(&text[parsed.0..complete]).into_owned();
        let events = new
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                serde_json::from_str(l).map_err(|e| Error::Parse {
                    what: format!("proxy log line in {}", self.path.display()),
                    detail: format!("{e}: {l}"),
                })
            })
            .collect::<Result<Vec<Event>>>()?;
        parsed.1.extend(events);
        parsed.0 = complete;
        Ok(parsed.1.clone())
    }

    /// Waits up to `timeout` until `done(events)` holds, and returns the events then.
    pub fn wait_for(
        &self,
        timeout: Duration,
        done: impl Fn(&[Event]) -> bool,
    ) -> Result<Vec<Event>> {
        let deadline = Instant::now() + timeout;
        loop {
            let events = self.events()?;
            if done(&events) {
                return Ok(events);
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout {
                    what: "waiting for proxy events".into(),
                    timeout,
                    detail: format!("events so far: {events:?}"),
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits until `n` connections were accepted or failed `SO_ORIGINAL_DST`, and returns all
    /// events then.
    pub fn wait_for_accepted(&self, n: usize, timeout: Duration) -> Result<Vec<Event>> {
        self.wait_for(timeout, |events| {
            events
                .iter()
                .filter(|e| matches!(e, Event::Accepted { .. } | Event::OrigDstError { .. }))
                .count()
                >= n
        })
    }

    /// Waits until `n` connections are finished (closed, or refused for any reason), and
    /// returns all events then.
    pub fn wait_for_finished(&self, n: usize, timeout: Duration) -> Result<Vec<Event>> {
        self.wait_for(timeout, |events| finished(events).count() >= n)
    }
}

/// The (listener, original destination) of every connection accepted in `events`.
pub fn accepted(events: &[Event]) -> Vec<(SocketAddr, SocketAddr)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Accepted {
                listener, orig_dst, ..
            } => Some((*listener, *orig_dst)),
            _ => None,
        })
        .collect()
}

/// The original destinations of the connections accepted in `events` on a listener at `port`.
pub fn accepted_on(events: &[Event], port: u16) -> Vec<SocketAddr> {
    accepted(events)
        .into_iter()
        .filter(|(listener, _)| listener.port() == port)
        .map(|(_, orig_dst)| orig_dst)
        .collect()
}

/// The events that end a connection (closed or refused).
pub fn finished(events: &[Event]) -> impl Iterator<Item = &Event> {
    events.iter().filter(|e| {
        matches!(
            e,
            Event::Closed { .. }
                | Event::OrigDstError { .. }
                | Event::Rejected { .. }
                | Event::UpstreamError { .. }
        )
    })
}

/// Serialises event lines into the log (one `write` per line, O_APPEND).
struct Logger {
    out: Mutex<Box<dyn Write + Send>>,
}

impl Logger {
    fn log(&self, event: &Event) {
        // Serialising a plain enum of addresses, integers and strings cannot fail.
        let mut line = serde_json::to_string(event)
            .unwrap_or_else(|e| format!("{{\"event\":\"bug\",\"message\":\"{e}\"}}"));
        line.push('\n');
        let mut out = match self.out.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        let _ = out.write_all(line.as_bytes());
        let _ = out.flush();
    }
}

fn bind_listener(addr: SocketAddr) -> io::Result<TcpListener> {
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    sock.set_reuse_address(true)?;
    if addr.is_ipv6() {
        sock.set_only_v6(true)?;
    }
    sock.bind(&addr.into())?;
    sock.listen(1024)?;
    Ok(sock.into())
}

fn drop_privileges(uid: Option<u32>, gid: Option<u32>) -> io::Result<()> {
    let gid = gid.or(uid);
    if uid.is_none() && gid.is_none() {
        return Ok(());
    }
    // SAFETY: plain system calls with integer arguments and an empty group list.
    unsafe {
        if libc::setgroups(0, std::ptr::null()) != 0 {
            return Err(io::Error::last_os_error());
        }
        if let Some(gid) = gid
            && libc::setgid(gid) != 0
        {
            return Err(io::Error::last_os_error());
        }
        if let Some(uid) = uid
            && libc::setuid(uid) != 0
        {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// `SO_ORIGINAL_DST` of an accepted socket, asked at the level that matches the socket's
/// family, like linkerd2-proxy does.
pub fn original_dst(sock: &TcpStream) -> io::Result<SocketAddr> {
    let fd = sock.as_raw_fd();
    match sock.local_addr()? {
        SocketAddr::V4(_) => {
            // SAFETY: an all-zero sockaddr_in is valid.
            let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
            let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            // SAFETY: sa is writable and len says its size.
            let rc = unsafe {
                libc::getsockopt(fd, SOL_IP, SO_ORIGINAL_DST, (&raw mut sa).cast(), &mut len)
            };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
            if i32::from(sa.sin_family) != libc::AF_INET {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("SO_ORIGINAL_DST returned family {}", sa.sin_family),
                ));
            }
            let ip = Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr));
            Ok(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(sa.sin_port),
            )))
        }
        SocketAddr::V6(_) => {
            // SAFETY: an all-zero sockaddr_in6 is valid.
            let mut sa: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
            let mut len = std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t;
            // SAFETY: sa is writable and len says its size.
            let rc = unsafe {
                libc::getsockopt(
                    fd,
                    SOL_IPV6,
                    IP6T_SO_ORIGINAL_DST,
                    (&raw mut sa).cast(),
                    &mut len,
                )
            };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
            if i32::from(sa.sin6_family) != libc::AF_INET6 {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("IP6T_SO_ORIGINAL_DST returned family {}", sa.sin6_family),
                ));
            }
            let ip = Ipv6Addr::from(sa.sin6_addr.s6_addr);
            Ok(SocketAddr::V6(SocketAddrV6::new(
                ip,
                u16::from_be(sa.sin6_port),
                sa.sin6_flowinfo,
                sa.sin6_scope_id,
            )))
        }
    }
}

/// Copies `src` to `dst` until EOF, then half-closes `dst`. Returns the byte count and whether
/// splice was used; on error both sockets are shut down so the other direction ends too.
fn pump(src: &TcpStream, dst: &TcpStream, use_splice: bool) -> (u64, CopyMode, Option<io::Error>) {
    let mut total = 0u64;
    let mut mode = CopyMode::ReadWrite;
    let result = (|| -> io::Result<()> {
        if use_splice {
            match splice_all(src, dst, &mut total) {
                Ok(()) => {
                    mode = CopyMode::Splice;
                    return Ok(());
                }
                // Splice refused before anything moved: fall back.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) && total == 0 => {}
                Err(e) => return Err(e),
            }
        }
        let mut buf = vec![0u8; 64 * 1024];
        let (mut r, mut w) = (src, dst);
        loop {
            let n = match r.read(&mut buf) {
                Ok(0) => return Ok(()),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            w.write_all(&buf[..n])?;
            total += n as u64;
        }
    })();
    match result {
        Ok(()) => {
            let _ = dst.shutdown(Shutdown::Write);
            (total, mode, None)
        }
        Err(e) => {
            let _ = src.shutdown(Shutdown::Both);
            let _ = dst.shutdown(Shutdown::Both);
            (total, mode, Some(e))
        }
    }
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: fds has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both are fresh descriptors we now own.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn splice_all(src: &TcpStream, dst: &TcpStream, total: &mut u64) -> io::Result<()> {
    const CHUNK: usize = 64 * 1024;
    let (pipe_r, pipe_w) = pipe()?;
    loop {
        // SAFETY: valid descriptors, null offsets (sockets and pipes have none).
        let n = unsafe {
            libc::splice(
                src.as_raw_fd(),
                std::ptr::null_mut(),
                pipe_w.as_raw_fd(),
                std::ptr::null_mut(),
                CHUNK,
                libc::SPLICE_F_MOVE,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Ok(());
        }
        let mut left = n as usize;
        while left > 0 {
            // SAFETY: as above.
            let m = unsafe {
                libc::splice(
                    pipe_r.as_raw_fd(),
                    std::ptr::null_mut(),
                    dst.as_raw_fd(),
                    std::ptr::null_mut(),
                    left,
                    libc::SPLICE_F_MOVE,
                )
            };
            if m < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            left -= m as usize;
            *total += m as u64;
        }
    }
}

struct Ctx {
    logger: Logger,
    pool: Pool,
    next_id: AtomicU64,
    connect_timeout: Duration,
    use_splice: bool,
}

fn handle(ctx: &Ctx, listener: SocketAddr, client: TcpStream, peer: SocketAddr) {
    let id = ctx.next_id.fetch_add(1, Ordering::Relaxed);
    let local = client.local_addr().unwrap_or(listener);
    let orig_dst = match original_dst(&client) {
        Ok(a) => a,
        Err(e) => {
            eprintln!(
                "linkerd-cni-test-proxy: connection {id} from {peer} on {listener}: SO_ORIGINAL_DST failed: {e}"
            );
            ctx.logger.log(&Event::OrigDstError {
                id,
                listener,
                peer,
                local,
                errno: e.raw_os_error(),
                message: e.to_string(),
            });
            return;
        }
    };
    ctx.logger.log(&Event::Accepted {
        id,
        listener,
        peer,
        local,
        orig_dst,
    });
    if orig_dst == local && local.port() == listener.port() {
        ctx.logger.log(&Event::Rejected {
            id,
            listener,
            peer,
            orig_dst,
            reason: "original destination is the proxy listener itself".into(),
        });
        return;
    }
    let upstream = match TcpStream::connect_timeout(&orig_dst, ctx.connect_timeout) {
        Ok(s) => s,
        Err(e) => {
            ctx.logger.log(&Event::UpstreamError {
                id,
                listener,
                peer,
                orig_dst,
                errno: e.raw_os_error(),
                message: e.to_string(),
            });
            return;
        }
    };
    let upstream_local = upstream
        .local_addr()
        .unwrap_or(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)));
    let use_splice = ctx.use_splice;
    let down = match (upstream.try_clone(), client.try_clone()) {
        (Ok(from), Ok(to)) => {
            let (tx, rx) = std::sync::mpsc::channel();
            ctx.pool.execute(move || {
                let _ = tx.send(pump(&from, &to, use_splice));
            });
            Some(rx)
        }
        _ => None,
    };
    let up = pump(&client, &upstream, use_splice);
    let down = match down.map(|rx| rx.recv()) {
        Some(Ok(result)) => result,
        _ => {
            let _ = client.shutdown(Shutdown::Both);
            (
                0,
                CopyMode::ReadWrite,
                Some(io::Error::other("cannot copy upstream -> client")),
            )
        }
    };
    let copy = if up.1 == CopyMode::Splice && down.1 == CopyMode::Splice {
        CopyMode::Splice
    } else {
        CopyMode::ReadWrite
    };
    let error = up.2.or(down.2).map(|e| e.to_string());
    ctx.logger.log(&Event::Closed {
        id,
        listener,
        peer,
        orig_dst,
        upstream_local,
        bytes_to_upstream: up.0,
        bytes_to_client: down.0,
        copy,
        error,
    });
}

/// Runs the proxy until the process is killed: binds, drops privileges, writes the ready file,
/// then forwards connections (a thread per listener and per connection).
pub fn serve(opts: &Options) -> Result<()> {
    let out: Box<dyn Write + Send> = match &opts.log {
        Some(path) => Box::new(
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .ctx(|| format!("opening log {}", path.display()))?,
        ),
        None => Box::new(io::stdout()),
    };
    let ctx = Arc::new(Ctx {
        logger: Logger {
            out: Mutex::new(out),
        },
        pool: Pool::new(),
        next_id: AtomicU64::new(0),
        connect_timeout: Duration::from_millis(opts.connect_timeout_ms.max(1)),
        use_splice: !opts.no_splice,
    });
    let mut listeners = Vec::new();
    for addr in opts.listen_addrs() {
        let l = bind_listener(addr).ctx(|| format!("listening on {addr}"))?;
        let bound = l.local_addr().ctx(|| "getsockname of a listener")?;
        ctx.logger.log(&Event::Listening { addr: bound });
        listeners.push((bound, l));
    }
    // Before any thread exists, so every thread runs with the new credentials.
    drop_privileges(opts.uid, opts.gid)
        .ctx(|| format!("dropping privileges to {:?}:{:?}", opts.uid, opts.gid))?;
    // SAFETY: these cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    ctx.logger.log(&Event::Ready {
        pid: std::process::id(),
        uid,
        gid,
    });
    if let Some(ready) = &opts.ready_file {
        File::create(ready).ctx(|| format!("creating ready file {}", ready.display()))?;
    }
    std::thread::sleep(Duration::from_millis(opts.accept_delay_ms));
    if let Some(gate) = &opts.accept_gate {
        while !gate.exists() {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let mut threads = Vec::new();
    for (bound, listener) in listeners {
        let ctx = Arc::clone(&ctx);
        threads.push(std::thread::spawn(move || {
            loop {
                match listener.accept() {
                    Ok((client, peer)) => {
                        let job_ctx = Arc::clone(&ctx);
                        ctx.pool
                            .execute(move || handle(&job_ctx, bound, client, peer));
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        eprintln!("linkerd-cni-test-proxy: accept on {bound}: {e}");
                        std::thread::sleep(Duration::from_millis(10));
                    }
                }
            }
        }));
    }
    for t in threads {
        let _ = t.join();
    }
    Ok(())
}

/// A running `linkerd-cni-test-proxy`, killed on drop, with its log and stderr in a scratch
/// directory.
#[derive(Debug)]
pub struct TestProxy {
    child: ChildGuard,
    log: ProxyLog,
    stderr: PathBuf,
    accept_gate: Option<PathBuf>,
    _dir: TempDir,
}

impl TestProxy {
    /// Starts the proxy as `placement` says (typically a pod's netns and cgroup, UID 2102),
    /// with `opts` (its `log` and `ready_file` are set here, a relative `accept_gate` is put in
    /// the scratch directory), and waits until it listens.
    pub fn start(placement: &Placement, opts: &Options) -> Result<Self> {
        let dir = TempDir::new()?;
        // The proxy writes its ready file after dropping privileges, as whichever UID it ends up.
        if let Some(uid) = opts.uid.or(placement.get_uid()) {
            let gid = if opts.uid.is_some() {
                opts.gid.unwrap_or(uid)
            } else {
                placement.get_gid().unwrap_or(uid)
            };
            dir.chown(uid, gid)?;
        }
        let mut opts = opts.clone();
        let log = dir.path().join("proxy.jsonl");
        let ready = dir.path().join("ready");
        let stderr = dir.path().join("stderr");
        opts.log = Some(log.clone());
        opts.ready_file = Some(ready.clone());
        opts.accept_gate = opts.accept_gate.map(|gate| dir.path().join(gate));
        let stderr_file = File::create(&stderr).ctx(|| format!("creating {}", stderr.display()))?;
        let mut cmd = placement.command(bins::bin_path(bins::PROXY)?)?;
        cmd.args(opts.to_args())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr_file);
        let mut child = ChildGuard::spawn(&mut cmd)?;
        let timeout = Duration::from_secs(10);
        let deadline = Instant::now() + timeout;
        while !ready.exists() {
            let read_stderr = || std::fs::read_to_string(&stderr).unwrap_or_default();
            if let Some(status) = child.try_wait()? {
                return Err(Error::Missing(format!(
                    "the test proxy exited with {status} before it was ready: {}",
                    read_stderr()
                )));
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout {
                    what: "test proxy start".into(),
                    timeout,
                    detail: read_stderr(),
                });
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(TestProxy {
            child,
            log: ProxyLog::new(log),
            stderr,
            accept_gate: opts.accept_gate,
            _dir: dir,
        })
    }

    /// Lets a proxy started with an `accept_gate` accept (see [`Options::accept_gate`]).
    pub fn open_accept_gate(&self) -> Result<()> {
        let gate = self.accept_gate.as_ref().ok_or_else(|| {
            Error::Missing("this test proxy was started without an accept gate".into())
        })?;
        File::create(gate).ctx(|| format!("creating {}", gate.display()))?;
        Ok(())
    }

    /// The proxy's PID.
    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// Its event log.
    pub fn log(&self) -> &ProxyLog {
        &self.log
    }

    /// Every event so far.
    pub fn events(&self) -> Result<Vec<Event>> {
        self.log.events()
    }

    /// What it wrote to stderr so far (one line per refused connection).
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// The process has not exited.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn default_listeners_follow_the_linkerd_ports() {
        let mut opts = Options::new();
        let want_v4: Vec<SocketAddr> = vec![
            "127.0.0.1:4140".parse().expect("literal"),
            "0.0.0.0:4143".parse().expect("literal"),
        ];
        assert_eq!(opts.listen_addrs(), want_v4);
        opts.ipv6 = true;
        let got = opts.listen_addrs();
        assert_eq!(got.len(), 4, "{got:?}");
        assert!(
            got.contains(&"[::1]:4140".parse().expect("literal")),
            "{got:?}"
        );
        assert!(
            got.contains(&"[::]:4143".parse().expect("literal")),
            "{got:?}"
        );
        opts.listen = vec!["127.0.0.1:5000".parse().expect("literal")];
        assert_eq!(
            opts.listen_addrs(),
            opts.listen,
            "--listen replaces the defaults"
        );
    }

    #[test]
    fn options_round_trip_through_the_command_line() {
        let mut opts = Options::new();
        opts.ipv6 = true;
        opts.uid = Some(2102);
        opts.listen = vec![
            "127.0.0.1:1".parse().expect("literal"),
            "[::1]:2".parse().expect("literal"),
        ];
        opts.log = Some("/tmp/x.jsonl".into());
        opts.no_splice = true;
        opts.accept_gate = Some("accept-gate".into());
        let args = opts.to_args();
        let parsed =
            Options::try_parse_from(std::iter::once("proxy".to_string()).chain(args.clone()))
                .unwrap_or_else(|e| panic!("{args:?} must parse: {e}"));
        assert_eq!(parsed.to_args(), args);
    }

    #[test]
    fn events_round_trip_as_json_lines() {
        let a: SocketAddr = "10.0.0.1:1".parse().expect("literal");
        let events = [
            Event::Listening { addr: a },
            Event::Ready {
                pid: 1,
                uid: 2102,
                gid: 2102,
            },
            Event::Accepted {
                id: 0,
                listener: a,
                peer: a,
                local: a,
                orig_dst: a,
            },
            Event::OrigDstError {
                id: 1,
                listener: a,
                peer: a,
                local: a,
                errno: Some(2),
                message: "x".into(),
            },
            Event::Closed {
                id: 2,
                listener: a,
                peer: a,
                orig_dst: a,
                upstream_local: a,
                bytes_to_upstream: 3,
                bytes_to_client: 4,
                copy: CopyMode::Splice,
                error: None,
            },
        ];
        for e in events {
            let line = serde_json::to_string(&e).expect("serialise");
            assert!(!line.contains('\n'), "one line: {line}");
            let back: Event = serde_json::from_str(&line).expect("parse back");
            assert_eq!(back, e, "{line}");
        }
        let line = serde_json::to_string(&Event::Ready {
            pid: 1,
            uid: 2,
            gid: 3,
        })
        .expect("serialise");
        assert_eq!(line, r#"{"event":"ready","pid":1,"uid":2,"gid":3}"#);
    }
}
