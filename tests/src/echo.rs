//! Servers that record what reached them and from whom, to assert where a connection landed.
//!
//! [`EchoServer`] (TCP) answers each connection with its name, a newline, and the bytes it
//! received: everything up to the first newline, or up to EOF when there is none (so large
//! payloads without newlines go through whole, half-close included). In HTTP mode it answers
//! every request on a keep-alive connection with `200 OK` and its name as the body (usable
//! with `wrk`, `hey`, `ab`). [`UdpEcho`] does the same per datagram.
//! Each listener is created in the netns the caller chooses (sockets keep their netns) and
//! served from a background thread that stops on drop.

use std::{
    io::{self, Read, Write},
    net::{SocketAddr, TcpListener, TcpStream, UdpSocket},
    os::fd::AsRawFd,
    sync::{
        Arc, Condvar, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use crate::{
    error::{Error, IoContext, Result},
    netns::NetnsGuard,
    pool::Pool,
};

/// Largest request the echo server buffers.
const MAX_REQUEST: usize = 64 * 1024 * 1024;
/// How long a connection may stay silent.
const IDLE: Duration = Duration::from_secs(10);

/// One connection (TCP) or datagram (UDP) a server received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// The peer as the server saw it.
    pub peer: SocketAddr,
    /// The server's local address for it (`getsockname` of the accepted socket).
    pub local: SocketAddr,
    /// The request bytes (echo mode: up to the first newline or EOF; HTTP: the request head).
    pub data: Vec<u8>,
}

/// What an [`EchoServer`] speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Reply `<name>\n<request>` and close.
    Echo,
    /// HTTP/1.1: `200 OK` with `<name>\n` as the body for each request, keep-alive.
    Http,
}

#[derive(Default)]
struct Records {
    list: Mutex<Vec<Received>>,
    changed: Condvar,
}

impl Records {
    fn push(&self, r: Received) {
        let mut list = match self.list.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        list.push(r);
        self.changed.notify_all();
    }

    fn snapshot(&self) -> Vec<Received> {
        match self.list.lock() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    fn wait_for(&self, n: usize, timeout: Duration, what: &str) -> Result<Vec<Received>> {
        let deadline = Instant::now() + timeout;
        let mut list = match self.list.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        while list.len() < n {
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Timeout {
                    what: format!("{what}: {n} receptions"),
                    timeout,
                    detail: format!("got {}: {:?}", list.len(), *list),
                });
            }
            list = match self.changed.wait_timeout(list, deadline - now) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
        Ok(list.clone())
    }
}

/// Waits until `fd` is readable or `stop` is set; true when readable.
fn readable(fd: i32, stop: &AtomicBool) -> bool {
    while !stop.load(Ordering::Relaxed) {
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let rc = unsafe { libc::poll(&mut pfd, 1, 50) };
        if rc > 0 {
            return true;
        }
    }
    false
}

/// A TCP server that records every connection and answers with its name.
pub struct EchoServer {
    name: String,
    addr: SocketAddr,
    records: Arc<Records>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for EchoServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EchoServer")
            .field("name", &self.name)
            .field("addr", &self.addr)
            .finish()
    }
}

impl EchoServer {
    /// Binds `addr` inside `netns` and serves in echo mode.
    pub fn bind_in(netns: &NetnsGuard, addr: SocketAddr, name: &str) -> Result<Self> {
        Self::bind_in_mode(netns, addr, name, Mode::Echo)
    }

    /// Binds `addr` inside `netns` and serves in `mode`.
    pub fn bind_in_mode(
        netns: &NetnsGuard,
        addr: SocketAddr,
        name: &str,
        mode: Mode,
    ) -> Result<Self> {
        let listener = netns
            .run_in(|| TcpListener::bind(addr))?
            .ctx(|| format!("binding {addr} in {}", netns.name()))?;
        Self::serve(listener, name, mode)
    }

    /// Binds `addr` in the caller's netns and serves in echo mode.
    pub fn bind(addr: SocketAddr, name: &str) -> Result<Self> {
        let listener = TcpListener::bind(addr).ctx(|| format!("binding {addr}"))?;
        Self::serve(listener, name, Mode::Echo)
    }

    /// Serves an existing listener.
    pub fn serve(listener: TcpListener, name: &str, mode: Mode) -> Result<Self> {
        let addr = listener
            .local_addr()
            .ctx(|| "getsockname of the echo listener")?;
        let records = Arc::new(Records::default());
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (records, stop, name) = (Arc::clone(&records), Arc::clone(&stop), name.to_string());
            std::thread::spawn(move || {
                let pool = Pool::new();
                while readable(listener.as_raw_fd(), &stop) {
                    let Ok((conn, peer)) = listener.accept() else {
                        continue;
                    };
                    let (records, name) = (Arc::clone(&records), name.clone());
                    pool.execute(move || {
                        let _ = match mode {
                            Mode::Echo => serve_echo(conn, peer, &name, &records),
                            Mode::Http => serve_http(conn, peer, &name, &records),
                        };
                    });
                }
            })
        };
        Ok(EchoServer {
            name: name.into(),
            addr,
            records,
            stop,
            thread: Some(thread),
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The server's name (first line of every answer).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The answer this server gives to `request` in echo mode.
    pub fn expected_reply(&self, request: &[u8]) -> Vec<u8> {
        echo_reply(&self.name, request)
    }

    /// Everything received so far.
    pub fn received(&self) -> Vec<Received> {
        self.records.snapshot()
    }

    /// Waits until at least `n` connections were received.
    pub fn wait_for(&self, n: usize, timeout: Duration) -> Result<Vec<Received>> {
        self.records
            .wait_for(n, timeout, &format!("echo server {}", self.name))
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn echo_reply(name: &str, request: &[u8]) -> Vec<u8> {
    let mut out = format!("{name}\n").into_bytes();
    out.extend_from_slice(request);
    out
}

fn serve_echo(
    mut conn: TcpStream,
    peer: SocketAddr,
    name: &str,
    records: &Records,
) -> io::Result<()> {
    conn.set_read_timeout(Some(IDLE))?;
    let local = conn.local_addr()?;
    let mut data = Vec::new();
    let mut buf = [0u8; 64 * 1024];
    loop {
        let n = match conn.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => 0,
        };
        if n == 0 {
            break;
        }
        if let Some(i) = buf[..n].iter().position(|&b| b == b'\n') {
            data.extend_from_slice(&buf[..=i]);
            break;
        }
        data.extend_from_slice(&buf[..n]);
        if data.len() >= MAX_REQUEST {
            break;
        }
    }
    records.push(Received {
        peer,
        local,
        data: data.clone(),
    });
    conn.write_all(&echo_reply(name, &data))?;
    conn.shutdown(std::net::Shutdown::Write)
}

fn serve_http(
    mut conn: TcpStream,
    peer: SocketAddr,
    name: &str,
    records: &Records,
) -> io::Result<()> {
    conn.set_read_timeout(Some(IDLE))?;
    let local = conn.local_addr()?;
    let body = format!("{name}\n");
    let mut pending: Vec<u8> = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        let end = loop {
            if let Some(i) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let n = conn.read(&mut buf)?;
            if n == 0 || pending.len() > MAX_REQUEST {
                return Ok(());
            }
            pending.extend_from_slice(&buf[..n]);
        };
        let head: Vec<u8> = pending.drain(..end).collect();
        let close = String::from_utf8_lossy(&head)
            .to_ascii_lowercase()
            .contains("connection: close");
        records.push(Received {
            peer,
            local,
            data: head,
        });
        let reply = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n{}\r\n{body}",
            body.len(),
            if close { "Connection: close\r\n" } else { "" }
        );
        conn.write_all(reply.as_bytes())?;
        if close {
            return Ok(());
        }
    }
}

/// A UDP server that records every datagram and answers `<name>\n<datagram>`.
pub struct UdpEcho {
    name: String,
    addr: SocketAddr,
    records: Arc<Records>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for UdpEcho {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UdpEcho")
            .field("name", &self.name)
            .field("addr", &self.addr)
            .finish()
    }
}

impl UdpEcho {
    /// Binds `addr` inside `netns` and serves.
    pub fn bind_in(netns: &NetnsGuard, addr: SocketAddr, name: &str) -> Result<Self> {
        let sock = netns
            .run_in(|| UdpSocket::bind(addr))?
            .ctx(|| format!("binding udp {addr} in {}", netns.name()))?;
        Self::serve(sock, name)
    }

    /// Serves an existing socket.
    pub fn serve(sock: UdpSocket, name: &str) -> Result<Self> {
        let addr = sock.local_addr().ctx(|| "getsockname of the udp socket")?;
        let records = Arc::new(Records::default());
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (records, stop, name) = (Arc::clone(&records), Arc::clone(&stop), name.to_string());
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 65536];
                while readable(sock.as_raw_fd(), &stop) {
                    let Ok((n, peer)) = sock.recv_from(&mut buf) else {
                        continue;
                    };
                    records.push(Received {
                        peer,
                        local: addr,
                        data: buf[..n].to_vec(),
                    });
                    let _ = sock.send_to(&echo_reply(&name, &buf[..n]), peer);
                }
            })
        };
        Ok(UdpEcho {
            name: name.into(),
            addr,
            records,
            stop,
            thread: Some(thread),
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The answer this server gives to `datagram`.
    pub fn expected_reply(&self, datagram: &[u8]) -> Vec<u8> {
        echo_reply(&self.name, datagram)
    }

    /// Every datagram received so far.
    pub fn received(&self) -> Vec<Received> {
        self.records.snapshot()
    }

    /// Waits until at least `n` datagrams were received.
    pub fn wait_for(&self, n: usize, timeout: Duration) -> Result<Vec<Received>> {
        self.records
            .wait_for(n, timeout, &format!("udp echo {}", self.name))
    }
}

impl Drop for UdpEcho {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
