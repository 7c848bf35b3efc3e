//! The benchmark's forwarding proxy: what linkerd2-proxy does with a connection, at the
//! lowest cost we can write, so that the redirection's own cost is what the numbers show.
//!
//! Every accepted connection (outbound listener `127.0.0.1:4140`, inbound `0.0.0.0:4143`)
//! asks the kernel for its original destination with `getsockopt(SOL_IP, SO_ORIGINAL_DST)`,
//! connects there and relays both directions with `splice(2)` through two pipes, from one
//! thread per connection (a poll loop; threads are reused). Only in the `direct` mode, where
//! nothing intercepts and so nothing can answer `SO_ORIGINAL_DST`, a failed lookup falls back
//! to the listener's `--direct-*` upstream: the lookup is still made, so the proxy does the
//! same work in every mode.
//!
//! It prints its counters as one JSON line on stdout whenever they changed (at most every
//! 50 ms): the benchmark checks with them that connections really went through the proxy.

use std::{
    io,
    net::{Shutdown, SocketAddr, TcpListener, TcpStream},
    os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use linkerd_cni_proto::config;
use linkerd_cni_tests::pool::Pool;
use serde::{Deserialize, Serialize};

/// Command line of `linkerd-cni-bench proxy`.
#[derive(Debug, Clone, clap::Args)]
pub struct ProxyArgs {
    /// Outbound listener.
    #[arg(long, default_value_t = SocketAddr::from(([127, 0, 0, 1], config::DEFAULT_OUTBOUND_PORT)))]
    pub outbound: SocketAddr,
    /// Inbound listener.
    #[arg(long, default_value_t = SocketAddr::from(([0, 0, 0, 0], config::DEFAULT_INBOUND_PORT)))]
    pub inbound: SocketAddr,
    /// Upstream of outbound connections whose original destination is unknown (direct mode).
    #[arg(long)]
    pub direct_outbound: Option<SocketAddr>,
    /// Upstream of inbound connections whose original destination is unknown (direct mode).
    #[arg(long)]
    pub direct_inbound: Option<SocketAddr>,
}

/// The proxy's counters (one JSON line on stdout).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProxyCounters {
    /// Connections accepted on the outbound listener.
    pub outbound: u64,
    /// Connections accepted on the inbound listener.
    pub inbound: u64,
    /// Connections whose original destination came from `SO_ORIGINAL_DST`.
    pub orig_dst: u64,
    /// Connections forwarded to the `--direct-*` fallback.
    pub fallback: u64,
    /// Connections dropped: no original destination and no fallback, or it pointed at the
    /// proxy itself.
    pub no_dst: u64,
    /// Upstream connects that failed.
    pub upstream_err: u64,
}

#[derive(Default)]
struct Counters {
    outbound: AtomicU64,
    inbound: AtomicU64,
    orig_dst: AtomicU64,
    fallback: AtomicU64,
    no_dst: AtomicU64,
    upstream_err: AtomicU64,
}

impl Counters {
    fn snapshot(&self) -> ProxyCounters {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ProxyCounters {
            outbound: g(&self.outbound),
            inbound: g(&self.inbound),
            orig_dst: g(&self.orig_dst),
            fallback: g(&self.fallback),
            no_dst: g(&self.no_dst),
            upstream_err: g(&self.upstream_err),
        }
    }
}

/// Listens (backlog 4096) on `addr` with SO_REUSEADDR.
pub fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    let domain = socket2::Domain::for_address(addr);
    let s = socket2::Socket::new(domain, socket2::Type::STREAM, None)?;
    s.set_reuse_address(true)?;
    s.bind(&addr.into())?;
    s.listen(4096)?;
    Ok(s.into())
}

/// Runs the proxy until killed.
pub fn run(args: ProxyArgs) -> anyhow::Result<()> {
    let counters = Arc::new(Counters::default());
    let pool = Arc::new(Pool::new());
    let mut threads = Vec::new();
    for (addr, inbound, fallback) in [
        (args.outbound, false, args.direct_outbound),
        (args.inbound, true, args.direct_inbound),
    ] {
        let listener = listen(addr)?;
        let (counters, pool) = (counters.clone(), pool.clone());
        threads.push(std::thread::spawn(move || {
            loop {
                let Ok((conn, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                };
                let c = counters.clone();
                if inbound {
                    c.inbound.fetch_add(1, Ordering::Relaxed);
                } else {
                    c.outbound.fetch_add(1, Ordering::Relaxed);
                }
                pool.execute(move || handle(&c, conn, addr, fallback));
            }
        }));
    }
    // Ready: the first counters line.
    let mut last = None;
    loop {
        let now = counters.snapshot();
        if last != Some(now) {
            println!("{}", serde_json::to_string(&now)?);
            last = Some(now);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn handle(c: &Counters, client: TcpStream, listener: SocketAddr, fallback: Option<SocketAddr>) {
    // The same SO_ORIGINAL_DST call as the test proxy's, at the socket family's level.
    let upstream = match (linkerd_cni_tests::proxy::original_dst(&client), fallback) {
        (Ok(dst), _) if dst != listener && dst.port() != listener.port() => {
            c.orig_dst.fetch_add(1, Ordering::Relaxed);
            dst
        }
        (_, Some(f)) => {
            c.fallback.fetch_add(1, Ordering::Relaxed);
            f
        }
        _ => {
            c.no_dst.fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    let Ok(up) = TcpStream::connect_timeout(&upstream, Duration::from_secs(3)) else {
        c.upstream_err.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = up.set_nodelay(true);
    let _ = relay(&client, &up);
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: fds has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded: both are fresh descriptors we now own.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn splice(from: RawFd, to: RawFd, len: usize, flags: libc::c_uint) -> io::Result<usize> {
    loop {
        // SAFETY: valid descriptors, null offsets (sockets and pipes have none).
        let n = unsafe {
            libc::splice(
                from,
                std::ptr::null_mut(),
                to,
                std::ptr::null_mut(),
                len,
                flags,
            )
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// One direction: socket -> pipe -> socket.
struct Half<'a> {
    src: &'a TcpStream,
    dst: &'a TcpStream,
    pipe_r: OwnedFd,
    pipe_w: OwnedFd,
    open: bool,
}

impl Half<'_> {
    /// Moves what is readable now; false once the source reached EOF (dst half-closed then).
    fn pump(&mut self) -> io::Result<bool> {
        const CHUNK: usize = 1 << 16;
        let n = splice(
            self.src.as_raw_fd(),
            self.pipe_w.as_raw_fd(),
            CHUNK,
            libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
        );
        let n = match n {
            Ok(0) => {
                let _ = self.dst.shutdown(Shutdown::Write);
                self.open = false;
                return Ok(false);
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(true),
            Err(e) => return Err(e),
        };
        let mut left = n;
        while left > 0 {
            left -= splice(
                self.pipe_r.as_raw_fd(),
                self.dst.as_raw_fd(),
                left,
                libc::SPLICE_F_MOVE,
            )?;
        }
        Ok(true)
    }
}

fn relay(a: &TcpStream, b: &TcpStream) -> io::Result<()> {
    let (r1, w1) = pipe()?;
    let (r2, w2) = pipe()?;
    let mut halves = [
        Half {
            src: a,
            dst: b,
            pipe_r: r1,
            pipe_w: w1,
            open: true,
        },
        Half {
            src: b,
            dst: a,
            pipe_r: r2,
            pipe_w: w2,
            open: true,
        },
    ];
    let result = (|| {
        while halves.iter().any(|h| h.open) {
            let mut fds: Vec<libc::pollfd> = halves
                .iter()
                .map(|h| libc::pollfd {
                    fd: if h.open { h.src.as_raw_fd() } else { -1 },
                    events: libc::POLLIN | libc::POLLRDHUP,
                    revents: 0,
                })
                .collect();
            // SAFETY: fds is a valid array of pollfd of the given length.
            let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
            if rc < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            for (h, p) in halves.iter_mut().zip(&fds) {
                if h.open && p.revents != 0 {
                    h.pump()?;
                }
            }
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = a.shutdown(Shutdown::Both);
        let _ = b.shutdown(Shutdown::Both);
    }
    result
}
