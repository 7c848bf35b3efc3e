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
//! Every descriptor a request carries is taken and closed but the first ([`MAX_RECEIVED_FDS`]);
//! the blocking work peers' requests hold is bounded ([`BlockingWork`]); a refused request is
//! logged with the peer's credentials, rate-limited ([`RefusalLog`]).

use std::{
    io,
    os::{
        fd::{AsRawFd, OwnedFd, RawFd},
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
    agent::{Agent, AgentError, Mode, Registration, reconcile::Reconciler, registry::Attachment},
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

/// Blocking work (netns, bpf syscalls, registry files) that peers' requests may have running
/// at once. A request beyond waits for a slot; see [`BlockingWork`].
pub const MAX_BLOCKING: usize = 16;

/// How long a request waits for a slot of blocking work before it is answered "try again
/// later" (CNI error 11): well within the plugin's own budget.
pub const SLOT_WAIT: Duration = Duration::from_secs(3);

/// Blocking work running this long is taken as stuck: when every slot holds such work, ADDs
/// cannot be served and `/ready` says so.
pub const STUCK_AFTER: Duration = Duration::from_secs(5);

/// The bound on peers' blocking work. Blocking work cannot be cancelled: a request whose
/// deadline passed leaves its thread running. Without a bound, requests whose work never
/// finishes (an open that blocks, a filesystem that hangs) would each hold one more thread
/// of the runtime's blocking pool until none is left for anything else; with it, at most
/// [`MAX_BLOCKING`] are held, later requests are answered "try again later" after
/// [`SLOT_WAIT`], and `/ready` fails while every slot is stuck ([`Self::not_ready`]).
#[derive(Debug)]
pub struct BlockingWork {
    slots: Arc<Semaphore>,
    max: usize,
    stuck_after: Duration,
    /// When each running piece of work started, by a sequence number.
    running: Arc<std::sync::Mutex<std::collections::BTreeMap<u64, Instant>>>,
    next: AtomicU64,
}

impl Default for BlockingWork {
    fn default() -> Self {
        Self::new(MAX_BLOCKING, STUCK_AFTER)
    }
}

/// A slot of [`BlockingWork`], held by the work itself until it returns.
struct Slot {
    _permit: tokio::sync::OwnedSemaphorePermit,
    running: Arc<std::sync::Mutex<std::collections::BTreeMap<u64, Instant>>>,
    seq: u64,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.seq);
    }
}

impl BlockingWork {
    /// At most `max` pieces at once; work running `stuck_after` is taken as stuck.
    pub fn new(max: usize, stuck_after: Duration) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(max)),
            max,
            stuck_after,
            running: Default::default(),
            next: AtomicU64::new(0),
        }
    }

    /// A slot, waiting at most `wait` for one.
    async fn slot(&self, wait: Duration) -> Option<Slot> {
        let permit = tokio::time::timeout(wait, self.slots.clone().acquire_owned())
            .await
            .ok()?
            .ok()?;
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        self.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(seq, Instant::now());
        Some(Slot {
            _permit: permit,
            running: self.running.clone(),
            seq,
        })
    }

    /// Why requests cannot be served, if every slot holds work running [`STUCK_AFTER`] or
    /// longer.
    pub fn not_ready(&self) -> Option<String> {
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        let stuck = running
            .values()
            .filter(|t| t.elapsed() >= self.stuck_after)
            .count();
        (stuck >= self.max).then(|| {
            format!(
                "registration requests cannot be served: all {} slots of blocking work are held \
                 by work running {}s or longer",
                self.max,
                self.stuck_after.as_secs()
            )
        })
    }
}

/// A refusal of the same reason to the same peer is logged at most once in this interval
/// (the next line says how many were not logged meanwhile).
pub const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// Peers and reasons [`RefusalLog`] remembers; when full, it is cleared (so a flood from
/// ever new pids costs bounded memory and at most this many lines per interval).
const REFUSAL_LOG_KEYS: usize = 256;

/// Who asked, from `SO_PEERCRED`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PeerCred {
    pub pid: Option<i32>,
    pub uid: u32,
    pub gid: u32,
}

/// Logs refused requests: once per reason and peer, then at most once per
/// [`REFUSAL_LOG_INTERVAL`], each line with the reason and the peer's credentials, so a
/// hostile peer is seen in the log without flooding it.
#[derive(Debug, Default)]
pub struct RefusalLog {
    seen: std::sync::Mutex<std::collections::HashMap<(PeerCred, String), (Instant, u64)>>,
}

impl RefusalLog {
    /// Records a refusal of `peer` for `reason` (`kind` classes it); returns whether a line
    /// was logged.
    pub fn refused(&self, peer: PeerCred, kind: &str, reason: &str) -> bool {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.len() >= REFUSAL_LOG_KEYS {
            seen.clear();
        }
        let now = Instant::now();
        let entry = seen
            .entry((peer, kind.to_string()))
            .or_insert((now - REFUSAL_LOG_INTERVAL, 0));
        if now.duration_since(entry.0) < REFUSAL_LOG_INTERVAL {
            entry.1 += 1;
            return false;
        }
        let suppressed = std::mem::take(&mut entry.1);
        entry.0 = now;
        tracing::warn!(
            peer_pid = ?peer.pid,
            peer_uid = peer.uid,
            peer_gid = peer.gid,
            kind,
            reason = %Escaped(reason),
            suppressed,
            "registration socket: request refused"
        );
        true
    }
}

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
    /// The bound on the blocking work peers' requests hold.
    pub work: BlockingWork,
    /// Refused requests, logged rate-limited.
    pub refusals: RefusalLog,
    /// Deletes meshed pods running without redirection (when adoption cannot run).
    pub repairer: Arc<crate::agent::repair::Repairer>,
    /// Reports meshed pods running without verified redirection (Events, gauge, log).
    pub verifier: Arc<crate::agent::verify::Verifier>,
    /// Events on pods (what happened to their redirection), never waited for.
    pub events: linkerd_cni_k8s::events::EventRecorder,
}

/// Binds the socket: parent directory created 0700, stale socket replaced, socket 0600.
pub fn bind(path: &Path) -> io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        crate::host::owned::create_dir_all(dir)?;
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
        let peer = match conn.peer_cred() {
            Ok(cred) if cred.uid() == 0 => PeerCred {
                pid: cred.pid(),
                uid: cred.uid(),
                gid: cred.gid(),
            },
            Ok(cred) => {
                let message = format!(
                    "permission denied: only root may use the registration socket (peer uid {})",
                    cred.uid()
                );
                let peer = PeerCred {
                    pid: cred.pid(),
                    uid: cred.uid(),
                    gid: cred.gid(),
                };
                self.refusals.refused(peer, "not root", &message);
                self.stats.refused.fetch_add(1, Ordering::Relaxed);
                let refusal = error(ErrorKind::BadRequest, message);
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
        };
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
        if let Response::Error { kind, message } = &response {
            self.stats.errors.fetch_add(1, Ordering::Relaxed);
            // What the peer sent is at fault: the peer is named (anything else is the
            // agent's or the node's trouble, logged where it happens).
            if matches!(kind, ErrorKind::BadRequest | ErrorKind::VersionMismatch) {
                self.refusals
                    .refused(peer, &refusal_class(message), message);
            }
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
                    // The plugin reads the rules back: the agent cannot see them.
                    Ok(record) if record.rules => Response::CheckedRules {
                        config: (*record.config).clone(),
                    },
                    Ok(record) => Response::Checked {
                        redirected: record.redirected(),
                    },
                    Err(AgentError::NotInForce { id, why }) => {
                        // Report what was found, and put it back (counted and logged).
                        let reconciler = self.reconciler.clone();
                        let rid = id.clone();
                        let repaired = self
                            .blocking(move |_| Ok(reconciler.repair_pod(&rid)))
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
            userns,
        } = add;
        // The socket the plugin made inside the pod's netns, with the addresses it read there.
        let inside = fd.map(|socket| PeerNetns {
            socket,
            addrs: netns_addrs.unwrap_or_default(),
            userns,
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
                let record = if redirect && a.mode() == Mode::Iptables {
                    a.record_rules_from_peer(reg, inside)?
                } else if redirect {
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
                if record.rules {
                    return Response::AddedRules {
                        reason,
                        config: (*record.config).clone(),
                    };
                }
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
        let Some(slot) = self.work.slot(SLOT_WAIT).await else {
            return Err(AgentError::Busy {
                waited: SLOT_WAIT,
                max: self.work.max,
            });
        };
        tokio::task::spawn_blocking(move || {
            let _slot = slot;
            f(&agent)
        })
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

/// Descriptors one request may carry: the plugin sends one (the netns socket); room for
/// more is there only so that every descriptor a peer sends is received and closed here,
/// never left to pile up or be truncated silently.
const MAX_RECEIVED_FDS: usize = 16;

/// One `recvmsg` into `buf`. Every `SCM_RIGHTS` descriptor received is taken (close-on-exec):
/// the first is returned, any others are closed at once; a control message cut short
/// (`MSG_CTRUNC`: more descriptors than [`MAX_RECEIVED_FDS`], which the kernel closes) is an
/// error, after what did arrive is closed.
fn recv_with_fd(fd: RawFd, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    let received =
        linkerd_cni_sys::sock::recv_with_fds(fd, buf, MAX_RECEIVED_FDS, libc::MSG_DONTWAIT)?;
    if received.truncated {
        drop(received.fds);
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "more than {MAX_RECEIVED_FDS} descriptors (or other control data) sent with a request"
            ),
        ));
    }
    let mut fds = received.fds.into_iter();
    // Any after the first are closed here (dropped with the iterator).
    Ok((received.len, fds.next()))
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

/// The class of a refusal's reason, for [`RefusalLog`]: its message up to the first path,
/// number or quote, so that one reason with ever other paths is still one reason.
fn refusal_class(message: &str) -> String {
    message
        .split(['/', '"', ':', '('])
        .next()
        .unwrap_or(message)
        .chars()
        .filter(|c| !c.is_ascii_digit())
        .take(80)
        .collect()
}

fn error(kind: ErrorKind, message: String) -> Response {
    Response::Error { kind, message }
}

/// The one place agent errors become protocol error kinds.
fn agent_error(e: AgentError) -> Response {
    let kind = match &e {
        // A plugin older than the agent, seen while the agent installs its own: retry.
        AgentError::Peer(PeerError::NoSocket { .. }) => ErrorKind::Unavailable,
        // Every slot of blocking work busy: retry later.
        AgentError::Busy { .. } => ErrorKind::Unavailable,
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
    use std::os::fd::{BorrowedFd, FromRawFd};

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

    /// At most `max` pieces of blocking work hold slots; one more waits and gives up, and
    /// `/ready`'s reason appears only while every slot holds stuck work (issue 45, D4).
    #[tokio::test]
    async fn blocking_work_is_bounded_and_all_stuck_is_not_ready() {
        let wait = Duration::from_millis(20);
        let work = BlockingWork::new(2, Duration::ZERO);
        let a = work.slot(wait).await.expect("a first slot");
        assert_eq!(work.not_ready(), None, "one slot is still free");
        let _b = work.slot(wait).await.expect("a second slot");
        assert!(work.slot(wait).await.is_none(), "no third slot");
        let why = work.not_ready().expect("every slot stuck");
        assert!(why.contains("all 2 slots"), "{why}");
        drop(a);
        assert_eq!(work.not_ready(), None);
        assert!(
            work.slot(wait).await.is_some(),
            "a released slot serves again"
        );
        // Work that is not yet stuck keeps the agent ready.
        let patient = BlockingWork::new(1, Duration::from_secs(3600));
        let _c = patient.slot(wait).await.expect("a slot");
        assert_eq!(patient.not_ready(), None);
    }

    /// A refused request is logged once per reason and peer, with the peer's credentials,
    /// then not again within the interval; another peer or another reason is logged anew
    /// (issue 45, item 2).
    #[test]
    fn refusals_are_logged_once_per_reason_and_peer() {
        let log = RefusalLog::default();
        let peer = PeerCred {
            pid: Some(41),
            uid: 0,
            gid: 0,
        };
        let other = PeerCred {
            pid: Some(42),
            ..peer
        };
        let outside = "refused: netns path /tmp/x1 is neither below a runtime's netns directory";
        let class = refusal_class(outside);
        assert_eq!(class, refusal_class(&outside.replace("x1", "x2")));
        assert!(log.refused(peer, &class, outside));
        for _ in 0..100 {
            assert!(!log.refused(peer, &class, outside), "rate-limited");
        }
        assert!(log.refused(other, &class, outside), "another peer");
        assert!(
            log.refused(peer, "not root", "permission denied"),
            "another reason"
        );
    }

    /// Sends `bytes` with `fds` in one `SCM_RIGHTS` message.
    fn send_fds(sock: RawFd, bytes: &[u8], fds: &[RawFd]) {
        // SAFETY: the test's socket, open for the duration of the call.
        let sock = unsafe { BorrowedFd::borrow_raw(sock) };
        let sent = linkerd_cni_sys::sock::send_with_fds(sock, bytes, fds, 0);
        assert_eq!(sent.expect("sendmsg"), bytes.len());
    }

    /// A pipe: (read end, write end).
    fn pipe() -> (OwnedFd, OwnedFd) {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: two new descriptors owned by nothing else.
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
    }

    /// Whether a read end of the pipe whose write end is `w` is still open anywhere (in this
    /// process: the receiver kept it).
    fn read_end_open(w: &OwnedFd) -> bool {
        // SAFETY: a one-byte write to a pipe we own; SIGPIPE is ignored by the test harness.
        let n = unsafe { libc::write(w.as_raw_fd(), b"x".as_ptr().cast(), 1) };
        n == 1 || io::Error::last_os_error().raw_os_error() != Some(libc::EPIPE)
    }

    /// Every descriptor a request carries is received and closed: the first is handed on,
    /// the others are closed at once (issue 45, D3: the second of two, which fits in the
    /// room for one on 64-bit, stayed open in the agent for ever), and a request carrying
    /// more than there is room for is refused with what arrived closed.
    #[test]
    fn every_received_descriptor_is_taken_and_closed() {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let ends: Vec<(OwnedFd, OwnedFd)> = (0..2).map(|_| pipe()).collect();
        let raw: Vec<RawFd> = ends.iter().map(|(r, _)| r.as_raw_fd()).collect();
        send_fds(a.as_raw_fd(), b"abcd", &raw);
        let (ends_r, ends_w): (Vec<_>, Vec<_>) = ends.into_iter().unzip();
        drop(ends_r);
        let mut buf = [0u8; 4];
        let (n, kept) = recv_with_fd(b.as_raw_fd(), &mut buf).unwrap();
        assert_eq!((n, &buf), (4, b"abcd"));
        assert!(kept.is_some(), "the first descriptor is handed on");
        assert!(read_end_open(&ends_w[0]), "the first is kept until dropped");
        assert!(
            !read_end_open(&ends_w[1]),
            "the second was closed on receipt"
        );
        drop(kept);
        assert!(!read_end_open(&ends_w[0]));

        // More than there is room for: refused, nothing left open.
        let many: Vec<(OwnedFd, OwnedFd)> = (0..MAX_RECEIVED_FDS + 4).map(|_| pipe()).collect();
        let raw: Vec<RawFd> = many.iter().map(|(r, _)| r.as_raw_fd()).collect();
        send_fds(a.as_raw_fd(), b"efgh", &raw);
        let (many_r, many_w): (Vec<_>, Vec<_>) = many.into_iter().unzip();
        drop(many_r);
        let refused = recv_with_fd(b.as_raw_fd(), &mut buf).expect_err("truncated");
        assert_eq!(refused.kind(), io::ErrorKind::InvalidData, "{refused}");
        for w in &many_w {
            assert!(
                !read_end_open(w),
                "every descriptor of a refused request is closed"
            );
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
            userns: None,
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
