//! The node agent client: one request per connection over the agent's Unix socket, with one
//! deadline for connect, write and read together. Blocking std I/O, no runtime.

use std::{
    io::{self, Write},
    os::{
        fd::{AsRawFd, BorrowedFd},
        unix::net::UnixStream,
    },
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use linkerd_cni_proto::wire::{self, Envelope, FrameError, Request, Response};

use crate::error::AgentError;

/// Sends one request to the agent and returns its answer. A trait so the command logic can
/// be tested without sockets.
pub trait AgentClient {
    /// Sends `request` to the agent listening on `socket`, giving up after `timeout`. An
    /// agent `Error` answer comes back as [`AgentError::Refused`].
    fn call(
        &self,
        socket: &str,
        timeout: Duration,
        request: Request,
    ) -> Result<Response, AgentError>;

    /// [`Self::call`], with `fd` passed to the agent as `SCM_RIGHTS` on the request's first
    /// byte (the netns socket of an ADD: see `linkerd_cni_proto::wire`). Clients without
    /// a socket (tests) ignore it.
    fn call_with_fd(
        &self,
        socket: &str,
        timeout: Duration,
        request: Request,
        fd: Option<BorrowedFd<'_>>,
    ) -> Result<Response, AgentError> {
        let _ = fd;
        self.call(socket, timeout, request)
    }
}

/// The real client.
#[derive(Clone, Copy, Debug, Default)]
pub struct UnixAgent;

impl AgentClient for UnixAgent {
    fn call(
        &self,
        socket: &str,
        timeout: Duration,
        request: Request,
    ) -> Result<Response, AgentError> {
        self.call_with_fd(socket, timeout, request, None)
    }

    fn call_with_fd(
        &self,
        socket: &str,
        timeout: Duration,
        request: Request,
        fd: Option<BorrowedFd<'_>>,
    ) -> Result<Response, AgentError> {
        let deadline = Instant::now() + timeout;
        let timed_out = || AgentError::Timeout {
            socket: socket.into(),
            timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        };
        let mut stream = connect(socket, timeout)
            .ok_or_else(timed_out)?
            .map_err(|source| AgentError::Unreachable {
                socket: socket.into(),
                source,
            })?;
        let remaining = || {
            deadline
                .checked_duration_since(Instant::now())
                .filter(|d| !d.is_zero())
        };

        let frame_err = |e: FrameError| match e {
            FrameError::Io(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                timed_out()
            }
            FrameError::Io(source) => AgentError::Connection {
                socket: socket.into(),
                source,
            },
            other => AgentError::Protocol {
                socket: socket.into(),
                detail: other.to_string(),
            },
        };
        let set = |r: io::Result<()>| {
            r.map_err(|source| AgentError::Connection {
                socket: socket.into(),
                source,
            })
        };

        let budget = remaining().ok_or_else(timed_out)?;
        set(stream.set_write_timeout(Some(budget)))?;
        // The agent abandons the work it cannot finish within this budget (see `Envelope`).
        let frame = wire::encode(&Envelope::with_budget(request, budget)).map_err(frame_err)?;
        let sent = match fd {
            Some(fd) => send_with_fd(&stream, &frame, fd),
            None => Ok(0),
        };
        let sent = sent.map_err(|e| frame_err(e.into()))?;
        stream
            .write_all(&frame[sent..])
            .map_err(|e| frame_err(e.into()))?;
        set(stream.set_read_timeout(Some(remaining().ok_or_else(timed_out)?)))?;
        match wire::read_frame::<Response>(&mut stream).map_err(frame_err)? {
            Response::Error { kind, message } => Err(AgentError::Refused { kind, message }),
            response => Ok(response),
        }
    }
}

/// Sends the start of `frame` with `fd` attached (`SCM_RIGHTS`); returns how many bytes
/// went (at least one: the descriptor travels with the first byte).
fn send_with_fd(stream: &UnixStream, frame: &[u8], fd: BorrowedFd<'_>) -> io::Result<usize> {
    loop {
        match linkerd_cni_sys::sock::send_with_fds(
            stream,
            frame,
            &[fd.as_raw_fd()],
            libc::MSG_NOSIGNAL,
        ) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            sent => return sent,
        }
    }
}

/// Connects within `timeout`; `None` on timeout. A non-blocking connect first: it succeeds at
/// once whenever the agent's listen backlog has room (the usual case, no thread). A full
/// backlog (`EAGAIN`) is the one case where a connect would wait, and std has no connect
/// timeout for Unix sockets: the blocking connect then runs on a helper thread that is
/// abandoned (the process exits soon after) if it does not finish in time.
fn connect(socket: &str, timeout: Duration) -> Option<io::Result<UnixStream>> {
    match connect_nonblocking(socket) {
        Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {}
        done => return Some(done),
    }
    let (tx, rx) = mpsc::channel();
    let path = socket.to_string();
    let spawned = thread::Builder::new()
        .name("agent-connect".into())
        .spawn(move || {
            // The receiver may be gone after a timeout; nothing to do then.
            let _ = tx.send(UnixStream::connect(path));
        });
    if let Err(e) = spawned {
        return Some(Err(e));
    }
    rx.recv_timeout(timeout).ok()
}

/// One `connect(2)` on a non-blocking Unix stream socket; the stream is made blocking again
/// once connected.
fn connect_nonblocking(socket: &str) -> io::Result<UnixStream> {
    use std::os::fd::{FromRawFd, OwnedFd};

    let path = socket.as_bytes();
    // SAFETY: sockaddr_un is plain data; all zeroes is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if path.len() >= addr.sun_path.len() || path.contains(&0) {
        // Too long (or not a path) for a sockaddr: std says why.
        return UnixStream::connect(socket);
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(path) {
        *d = *s as libc::c_char;
    }
    // SAFETY: plain socket(2); the result is checked before use.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor owned by nothing else.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let len = std::mem::size_of::<libc::sa_family_t>() + path.len() + 1;
    // SAFETY: `addr` is a valid sockaddr_un of at least `len` bytes.
    let rc = unsafe {
        libc::connect(
            fd,
            std::ptr::from_ref(&addr).cast::<libc::sockaddr>(),
            len as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let stream = UnixStream::from(owned);
    stream.set_nonblocking(false)?;
    Ok(stream)
}

#[cfg(test)]
mod tests {
    use std::{os::unix::net::UnixListener, path::PathBuf};

    use linkerd_cni_proto::wire::ErrorKind;

    use super::*;

    /// A socket path in a directory of its own, removed with it.
    struct SocketPath {
        dir: PathBuf,
        path: PathBuf,
    }

    impl std::ops::Deref for SocketPath {
        type Target = PathBuf;
        fn deref(&self) -> &PathBuf {
            &self.path
        }
    }

    impl Drop for SocketPath {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    fn socket_path(name: &str) -> SocketPath {
        let dir = std::env::temp_dir().join(format!(
            "linkerd-cni-agent-test-{}-{name}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        SocketPath {
            path: dir.join("agent.sock"),
            dir,
        }
    }

    /// How long a silent agent holds a connection (or a full backlog stays full) unless the
    /// test releases it first: far beyond any scheduling delay, so only a client that ignores
    /// its timeout sees the agent give up, and then fails with another error than `Timeout`.
    const HOLD: Duration = Duration::from_secs(60);

    /// Serves one connection with `answer`, returning what it received. Without an answer it
    /// reads the request and says nothing until `release` is dropped or sent to (or `HOLD`).
    fn serve_once(
        path: &PathBuf,
        answer: Option<Response>,
    ) -> (thread::JoinHandle<Envelope>, mpsc::Sender<()>) {
        let listener = UnixListener::bind(path).expect("bind");
        let (release, released) = mpsc::channel::<()>();
        let server = thread::spawn(move || {
            let (mut conn, _) = listener.accept().expect("accept");
            let env: Envelope = wire::read_frame(&mut conn).expect("request frame");
            match answer {
                Some(a) => wire::write_frame(&mut conn, &a).expect("answer"),
                None => {
                    let _ = released.recv_timeout(HOLD);
                }
            }
            env
        });
        (server, release)
    }

    #[test]
    fn round_trip_and_refusal() {
        let path = socket_path("rt");
        let sock = path.to_str().expect("utf-8");
        let (server, _) = serve_once(
            &path,
            Some(Response::Status {
                programs_loaded: true,
                pods: 3,
            }),
        );
        let start = Instant::now();
        let got = UnixAgent
            .call(sock, Duration::from_secs(5), Request::Status)
            .expect("status");
        let took = start.elapsed();
        assert_eq!(
            got,
            Response::Status {
                programs_loaded: true,
                pods: 3
            }
        );
        let seen = server.join().expect("server thread");
        assert_eq!(seen.request, Request::Status);
        let budget = seen.budget_ms.expect("the plugin sends its budget");
        // What is left of its 5 s when it sends, in whole milliseconds (rounded down): at
        // most 5 s, and no less than what the whole call left, rounded down too (however
        // long connecting took on this machine).
        let took_ms = u64::try_from(took.as_millis()).unwrap_or(u64::MAX);
        let floor = 5_000_u64.saturating_sub(took_ms.saturating_add(1));
        assert!(
            (floor..=5_000).contains(&budget),
            "budget {budget} ms, call took {took:?}"
        );

        std::fs::remove_file(&*path).expect("rm socket");
        let (server, _) = serve_once(
            &path,
            Some(Response::Error {
                kind: ErrorKind::Internal,
                message: "boom".into(),
            }),
        );
        match UnixAgent.call(sock, Duration::from_secs(5), Request::Status) {
            Err(AgentError::Refused {
                kind: ErrorKind::Internal,
                message,
            }) => assert_eq!(message, "boom"),
            other => panic!("expected Refused, got {other:?}"),
        }
        server.join().expect("server thread");
    }

    /// A listener that never accepts, with the smallest backlog, filled: a connect now waits.
    /// The client must still give up at its timeout (the non-blocking connect says EAGAIN,
    /// the helper thread's connect blocks), and connect at once when there is room (a
    /// non-blocking connect that succeeds never waited).
    #[test]
    fn full_backlog_times_out_and_room_connects_at_once() {
        use std::os::fd::{FromRawFd, OwnedFd};

        let path = socket_path("backlog");
        let sock = path.to_str().expect("utf-8");
        // SAFETY: plain socket calls on a new descriptor, checked.
        let listener = unsafe {
            let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            assert!(fd >= 0);
            OwnedFd::from_raw_fd(fd)
        };
        let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        for (d, s) in addr.sun_path.iter_mut().zip(sock.as_bytes()) {
            *d = *s as libc::c_char;
        }
        use std::os::fd::AsRawFd;
        // SAFETY: a valid sockaddr_un and descriptor.
        unsafe {
            assert_eq!(
                libc::bind(
                    listener.as_raw_fd(),
                    std::ptr::from_ref(&addr).cast(),
                    std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t
                ),
                0
            );
            assert_eq!(libc::listen(listener.as_raw_fd(), 0), 0);
        }
        let first = connect_nonblocking(sock).expect("room for one: connected at once");
        let mut held = vec![first];
        let full = loop {
            match connect_nonblocking(sock) {
                Ok(s) => held.push(s),
                Err(e) => break e,
            }
            assert!(held.len() < 16, "the backlog never filled");
        };
        assert_eq!(full.raw_os_error(), Some(libc::EAGAIN), "{full}");
        // The backlog stays full until the call returns (or `HOLD`: then the listener closes
        // and a client that ignored its timeout would see the connect refused instead).
        let (release, released) = mpsc::channel::<()>();
        let holder = thread::spawn(move || {
            let _ = released.recv_timeout(HOLD);
            drop(listener);
        });
        match UnixAgent.call(sock, Duration::from_millis(200), Request::Status) {
            Err(AgentError::Timeout {
                timeout_ms: 200, ..
            }) => {}
            other => panic!("expected Timeout, got {other:?}"),
        }
        let _ = release.send(());
        holder.join().expect("listener holder");
        drop(held);
    }

    #[test]
    fn missing_socket_and_silent_agent() {
        let path = socket_path("fail");
        let sock = path.to_str().expect("utf-8");
        match UnixAgent.call(sock, Duration::from_secs(1), Request::Status) {
            Err(AgentError::Unreachable { source, .. }) => {
                assert_eq!(source.kind(), io::ErrorKind::NotFound)
            }
            other => panic!("expected Unreachable, got {other:?}"),
        }
        // The agent holds the connection open and silent until the call has returned: only
        // the client's own timeout can end it, whatever the machine's load.
        let (server, release) = serve_once(&path, None);
        match UnixAgent.call(sock, Duration::from_millis(200), Request::Status) {
            Err(AgentError::Timeout {
                timeout_ms: 200, ..
            }) => {}
            other => panic!("expected Timeout, got {other:?}"),
        }
        let _ = release.send(());
        server.join().expect("server thread");
    }
}
