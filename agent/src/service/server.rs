//! The registration service: the plugin's requests over the agent's Unix socket.
//!
//! One request per connection, framed as in `linkerd_cni_proto::wire`. Each connection is
//! served on its own task with a deadline, so a stuck plugin cannot hold the agent; the
//! kernel-facing work (netns, bpf syscalls, registry files) runs on blocking threads.
//!
//! Hardening: only root peers are served (`SO_PEERCRED`, whatever the socket's mode says);
//! at most [`MAX_CONNECTIONS`] are served at once (more wait in the listen backlog), each must
//! send its request within [`READ_TIMEOUT`]; a request's
//! buffer grows with the bytes that actually arrive, never to the size a peer announces; an
//! accept error (EMFILE, ENFILE, ENOBUFS) is logged and retried after a pause, never fatal.

use std::{
    io,
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
        unix::fs::PermissionsExt,
    },
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use linkerd_cni_k8s::{
    PodSource,
    events::{PodRef as EventPod, Reason as EventReason},
};
use linkerd_cni_proto::{
    escape::Escaped,
    wire::{
        self, AddRequest, AttachmentRef, Envelope, ErrorKind, FrameError, PROTOCOL_VERSION,
        Request, Response,
    },
};
use tokio::sync::Semaphore;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt, Interest},
    net::{UnixListener, UnixStream},
};
use tracing::Instrument;

use crate::{
    agent::adopt::Adopter,
    agent::{Agent, AgentError, Registration, reconcile::Reconciler, registry::Attachment},
    host::netns::NetnsError,
    host::peer::{PeerError, PeerNetns},
    host::userns::UsernsError,
};

/// How long one request may take, end to end (Kubernetes lookup included). An ADD whose
/// plugin sent a shorter budget (`Envelope::budget_ms`) is abandoned at that budget instead.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(20);

/// Connections served at once; more wait in the listen backlog.
pub const MAX_CONNECTIONS: usize = 64;

/// How long a peer may take to send its request (the plugin sends it at once).
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// The pause after a failed `accept` (fd exhaustion and the like) before the next one.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(200);

/// Counters the metrics endpoint exposes.
#[derive(Debug, Default)]
pub struct ServerStats {
    pub adds: AtomicU64,
    pub dels: AtomicU64,
    pub checks: AtomicU64,
    pub errors: AtomicU64,
    /// Connections refused (peer not root).
    pub refused: AtomicU64,
}

/// What serves requests.
pub struct Server {
    pub agent: Arc<Agent>,
    pub pods: PodSource,
    pub stats: ServerStats,
    /// Repairs a pod whose CHECK finds its redirection not in force.
    pub reconciler: Arc<Reconciler>,
    /// Adopts meshed pods that started without the plugin; learns the conflist's `linkerd`
    /// section from each ADD.
    pub adopter: Arc<Adopter>,
    /// Events on pods (what happened to their redirection), never waited for.
    pub events: linkerd_cni_k8s::events::EventRecorder,
}

/// Binds the socket: parent directory created 0700, stale socket replaced, socket 0600.
pub fn bind(path: &Path) -> io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

impl Server {
    /// Accepts connections for ever: accept errors are logged and retried.
    pub async fn serve(self: Arc<Self>, listener: UnixListener) {
        let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        loop {
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return; // The semaphore is never closed.
            };
            let conn = match listener.accept().await {
                Ok((conn, _)) => conn,
                Err(e) => {
                    tracing::warn!(error = %e, "registration socket: accept failed; retrying");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            };
            let this = self.clone();
            tokio::spawn(async move {
                let _slot = slot;
                if let Err(e) = tokio::time::timeout(REQUEST_DEADLINE, this.connection(conn)).await
                {
                    tracing::warn!(error = %e, "request exceeded its deadline");
                }
            });
        }
    }

    async fn connection(&self, mut conn: UnixStream) {
        match conn.peer_cred() {
            Ok(cred) if cred.uid() == 0 => {}
            Ok(cred) => {
                tracing::warn!(
                    uid = cred.uid(),
                    pid = ?cred.pid(),
                    "registration socket: refused a peer that is not root"
                );
                self.stats.refused.fetch_add(1, Ordering::Relaxed);
                let refusal = error(
                    ErrorKind::BadRequest,
                    format!(
                        "permission denied: only root may use the registration socket (peer uid {})",
                        cred.uid()
                    ),
                );
                if let Ok(bytes) = wire::encode(&refusal) {
                    let _ = conn.write_all(&bytes).await;
                }
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "registration socket: no peer credentials; refused");
                self.stats.refused.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        let request = tokio::time::timeout(READ_TIMEOUT, read_request(&mut conn))
            .await
            .unwrap_or_else(|_| Err(io::Error::from(io::ErrorKind::TimedOut).into()));
        let response = match request {
            Ok((env, _)) if env.version != PROTOCOL_VERSION => error(
                ErrorKind::VersionMismatch,
                format!(
                    "agent speaks protocol {PROTOCOL_VERSION}, request uses {}",
                    env.version
                ),
            ),
            Ok((env, fd)) => {
                let deadline = env.agent_budget().map(|b| Instant::now() + b);
                self.handle_with(env.request, deadline, fd).await
            }
            Err(e) => error(ErrorKind::BadRequest, e.to_string()),
        };
        if matches!(response, Response::Error { .. }) {
            self.stats.errors.fetch_add(1, Ordering::Relaxed);
        }
        match wire::encode(&response) {
            Ok(bytes) => {
                let _ = conn.write_all(&bytes).await;
            }
            Err(e) => tracing::error!(error = %e, "cannot encode response"),
        }
    }

    /// Serves one request.
    pub async fn handle(&self, request: Request) -> Response {
        self.handle_until(request, None).await
    }

    /// Serves one request; an ADD not finished by `deadline` (when the plugin stops waiting)
    /// is abandoned and anything it registered rolled back.
    pub async fn handle_until(&self, request: Request, deadline: Option<Instant>) -> Response {
        self.handle_with(request, deadline, None).await
    }

    /// [`Self::handle_until`], with the descriptor the request carried (an ADD's netns
    /// socket; any other request's is closed unused).
    pub async fn handle_with(
        &self,
        request: Request,
        deadline: Option<Instant>,
        fd: Option<OwnedFd>,
    ) -> Response {
        match request {
            Request::Add(add) => {
                self.stats.adds.fetch_add(1, Ordering::Relaxed);
                self.add(*add, deadline, fd).await
            }
            Request::Del(att) => {
                self.stats.dels.fetch_add(1, Ordering::Relaxed);
                let id = att.container_id.clone();
                match self.blocking(move |a| a.unregister(&id)).await {
                    Ok(existed) => Response::Deleted { existed },
                    Err(e) => agent_error(e),
                }
            }
            Request::Check(att) => {
                self.stats.checks.fetch_add(1, Ordering::Relaxed);
                let id = att.container_id.clone();
                match self.blocking(move |a| a.check(&id)).await {
                    Ok(record) => Response::Checked {
                        redirected: record.redirected(),
                    },
                    Err(AgentError::NotInForce { id, why }) => {
                        // Report what was found, and put it back (counted and logged).
                        let reconciler = self.reconciler.clone();
                        let rid = id.clone();
                        let repaired =
                            tokio::task::spawn_blocking(move || reconciler.repair_pod(&rid))
                                .await
                                .unwrap_or_default();
                        let why = match repaired.is_empty() {
                            true => why,
                            false => format!("{why} (repaired)"),
                        };
                        agent_error(AgentError::NotInForce { id, why })
                    }
                    Err(e) => agent_error(e),
                }
            }
            // An empty list would drop every registration (a runtime that lost its state):
            // refused, as the plugin refuses a GC without a list. Dead pods are reaped anyway.
            Request::Gc(gc) if gc.valid.is_empty() => error(
                ErrorKind::BadRequest,
                "GC with an empty list of valid attachments refused: it would unregister every pod"
                    .into(),
            ),
            Request::Gc(gc) => {
                let valid: Vec<String> = gc.valid.into_iter().map(|a| a.container_id).collect();
                match self.blocking(move |a| a.gc(&valid)).await {
                    Ok(removed) => Response::Collected { removed },
                    Err(e) => agent_error(e),
                }
            }
            Request::Status => Response::Status {
                programs_loaded: true,
                pods: self.agent.pod_count(),
            },
        }
    }

    async fn add(
        &self,
        add: AddRequest,
        deadline: Option<Instant>,
        fd: Option<OwnedFd>,
    ) -> Response {
        let span = add_span(&add);
        // `instrument`, not `enter`: the future moves between runtime threads at each await,
        // and an entered span guard held across one corrupts the span stack (a panic under
        // concurrent ADDs).
        self.add_in_span(add, deadline, fd).instrument(span).await
    }

    async fn add_in_span(
        &self,
        add: AddRequest,
        deadline: Option<Instant>,
        fd: Option<OwnedFd>,
    ) -> Response {
        let AddRequest {
            attachment:
                AttachmentRef {
                    container_id,
                    ifname,
                    netns,
                },
            pod,
            cgroup_path,
            pod_ips,
            config,
            netns_addrs,
        } = add;
        // The socket the plugin made inside the pod's netns, with the addresses it read there.
        let inside = fd.map(|socket| PeerNetns {
            socket,
            addrs: netns_addrs.unwrap_or_default(),
        });
        self.adopter.remember_config(&config);
        if pod.namespace.is_empty() || pod.name.is_empty() {
            return error(
                ErrorKind::BadRequest,
                "ADD without pod namespace and name".into(),
            );
        }
        let decide = self
            .pods
            .decide(&pod.namespace, &pod.name, pod.uid.as_deref(), &config);
        let decided = match deadline {
            Some(d) => match tokio::time::timeout_at(d.into(), decide).await {
                Ok(decided) => decided,
                Err(_) => return abandoned("while deciding from the Kubernetes API"),
            },
            None => decide.await,
        };
        let decision = match decided {
            Ok(d) => d,
            Err(e) if e.is_transient() => return error(ErrorKind::KubernetesApi, e.to_string()),
            Err(e) => return error(ErrorKind::BadRequest, e.to_string()),
        };
        let event_pod = EventPod::new(pod.namespace.clone(), pod.name.clone(), pod.uid.clone());
        let reg = Registration {
            id: container_id,
            ifname,
            netns: netns.into(),
            cgroup_hint: cgroup_path,
            pod: Some(pod),
            config: decision.config,
            pod_ips,
        };
        if config.simulate {
            return Response::Added {
                redirected: false,
                reason: format!("simulate: would have {}", decision.reason),
            };
        }
        let reason = decision.reason;
        let redirect = decision.redirect;
        let why = reason.clone();
        // Checked on the blocking thread, around the work itself: the request's task may be
        // cancelled, the blocking work never is.
        let past = move || deadline.is_some_and(|d| Instant::now() >= d);
        let result = self
            .blocking(move |a| {
                if past() {
                    return Ok(None);
                }
                let id = reg.id.clone();
                let before = a.record(&id)?;
                let record = if redirect {
                    a.register_from_peer(reg, inside)?
                } else {
                    a.record_unredirected_from_peer(reg, why, inside)?
                };
                if past() {
                    // A retry for a pod already redirected in this netns was an update in
                    // place: undoing it would un-mesh a pod that was meshed before this ADD.
                    let kept = before
                        .is_some_and(|b| b.redirected() && b.netns_cookie == record.netns_cookie);
                    if !kept {
                        a.unregister(&id)?;
                    }
                    return Ok(None);
                }
                Ok(Some(record))
            })
            .await;
        match result {
            Ok(None) => abandoned("while registering (rolled back)"),
            Ok(Some(record)) => {
                tracing::info!(redirected = record.redirected(), reason = %Escaped(&reason), "pod added");
                // "Redirected" only where the attachment itself is the pod's: programs on the
                // pod's own cgroup. A pod on the shared attachment is selected by netns cookie,
                // and is redirected only if its processes end up below the shared cgroup,
                // which is known once its cgroup exists, after ADD: no Event claims it here.
                if let Attachment::PerPod { .. } = record.attachment {
                    self.events
                        .record(&event_pod, EventReason::Redirected, &*record.reason);
                }
                // An unredirected record's reason is the decision's: say it once.
                let reason = if *record.reason == *reason {
                    reason
                } else {
                    format!("{reason}; {}", record.reason)
                };
                Response::Added {
                    redirected: record.redirected(),
                    reason,
                }
            }
            Err(e) => {
                if redirect {
                    // A meshed pod's ADD refused: it does not start (the runtime retries);
                    // the Event says why where `kubectl describe pod` looks.
                    self.events.record(
                        &event_pod,
                        EventReason::Refused,
                        format!("linkerd-cni refused the pod's ADD: {e}"),
                    );
                }
                agent_error(e)
            }
        }
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Agent) -> Result<T, AgentError> + Send + 'static,
    ) -> Result<T, AgentError> {
        let agent = self.agent.clone();
        tokio::task::spawn_blocking(move || f(&agent))
            .await
            .unwrap_or_else(|e| {
                Err(AgentError::Registry(io::Error::other(format!(
                    "worker failed: {e}"
                ))))
            })
    }
}

/// Reads one request and the descriptor it may carry (see `linkerd_cni_proto::wire`).
async fn read_request(conn: &mut UnixStream) -> Result<(Envelope, Option<OwnedFd>), FrameError> {
    let mut header = [0u8; 4];
    // The first bytes with `recvmsg`: a descriptor travels with the first byte.
    let (got, fd) = loop {
        conn.readable().await?;
        match conn.try_io(Interest::READABLE, || {
            recv_with_fd(conn.as_raw_fd(), &mut header)
        }) {
            Ok(done) => break done,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e.into()),
        }
    };
    if got == 0 {
        return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into());
    }
    conn.read_exact(&mut header[got..]).await?;
    let len = wire::frame_len(header)?;
    // Grows with what arrives: an announced length allocates nothing by itself.
    let mut body = Vec::with_capacity(len.min(64 * 1024));
    (&mut *conn).take(len as u64).read_to_end(&mut body).await?;
    if body.len() < len {
        return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into());
    }
    Ok((serde_json::from_slice(&body)?, fd))
}

/// One `recvmsg` into `buf`, with room for one `SCM_RIGHTS` descriptor (received
/// close-on-exec; any more than one are closed by the kernel as the room is short).
fn recv_with_fd(fd: RawFd, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    // SAFETY: CMSG_SPACE is a pure computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) } as usize;
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain data; all zeroes is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: `msg` points to live buffers for the duration of the call.
    let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_CMSG_CLOEXEC | libc::MSG_DONTWAIT) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut received = None;
    // SAFETY: walking the control messages the kernel wrote into `control`, within
    // `msg_controllen`; an SCM_RIGHTS message's data holds descriptors now ours.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let raw = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::c_int>());
                received = Some(OwnedFd::from_raw_fd(raw));
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    Ok((n as usize, received))
}

/// The span every log line of an ADD carries: the attachment and pod as the plugin named them,
/// escaped (they are unchecked input: a newline in one must not start a forged record).
fn add_span(add: &AddRequest) -> tracing::Span {
    tracing::info_span!(
        "add",
        container = %Escaped(&add.attachment.container_id),
        namespace = %Escaped(&add.pod.namespace),
        pod = %Escaped(&add.pod.name)
    )
}

/// The answer to an ADD whose plugin has stopped waiting: nothing stays registered, the
/// runtime sees the ADD fail and retries it.
fn abandoned(when: &str) -> Response {
    tracing::warn!(when, "ADD abandoned: the plugin's deadline passed");
    error(
        ErrorKind::Unavailable,
        format!("the plugin's deadline passed {when}: nothing registered"),
    )
}

fn error(kind: ErrorKind, message: String) -> Response {
    Response::Error { kind, message }
}

/// The one place agent errors become protocol error kinds.
fn agent_error(e: AgentError) -> Response {
    let kind = match &e {
        // A plugin older than the agent, seen while the agent installs its own: retry.
        AgentError::Peer(PeerError::NoSocket { .. }) => ErrorKind::Unavailable,
        AgentError::Netns(NetnsError::NotFound { .. } | NetnsError::NotNetns { .. }) => {
            ErrorKind::UnknownContainer
        }
        AgentError::UnknownContainer(_) => ErrorKind::UnknownContainer,
        AgentError::NotInForce { .. } => ErrorKind::NotInForce,
        // The pod's own configuration is at fault: retrying the same ADD cannot help.
        // So is a netns or cgroup path that leads outside the places pods live.
        AgentError::Limit(_)
        | AgentError::Userns(UsernsError::Unmapped { .. })
        | AgentError::Peer(_) => ErrorKind::BadRequest,
        _ => ErrorKind::Internal,
    };
    error(kind, e.to_string())
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use linkerd_cni_proto::{config::LinkerdConfig, wire::PodRef};

    use super::*;

    /// A log sink the test reads back.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// What the plugin forwards from `CNI_ARGS` and `CNI_CONTAINERID` cannot forge a record of
    /// the agent's log or a field of one: each value is one token, escaped (issue 28).
    #[test]
    fn an_adds_span_escapes_what_the_plugin_sent() {
        const FORGED: &str = "2026-01-01T00:00:00Z  INFO add{container=c9 namespace=shop pod=web}: linkerd_cni_agent: pod added";
        let add = AddRequest {
            attachment: AttachmentRef {
                container_id: "c1\r\u{1b}[2K".into(),
                ifname: "eth0".into(),
                netns: "/proc/self/ns/net".into(),
            },
            pod: PodRef {
                namespace: format!("shop\n{FORGED}"),
                name: "web pod=admin".into(),
                uid: None,
            },
            cgroup_path: None,
            pod_ips: Vec::new(),
            config: LinkerdConfig::default(),
            netns_addrs: None,
        };
        let sink = Captured::default();
        let writer = sink.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let _entered = add_span(&add).entered();
            tracing::info!("pod added");
        });
        let text = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1, "one record: {text:?}");
        let want = format!(
            "add{{container=\"c1\\r\\u{{1b}}[2K\" namespace={:?} pod=\"web pod=admin\"}}",
            add.pod.namespace
        );
        assert!(lines[0].contains(&want), "{want}\n{text}");
        assert!(!text.trim_end().chars().any(char::is_control), "{text:?}");
    }
}
