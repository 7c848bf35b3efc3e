//! The registration service: the plugin's requests over the agent's Unix socket.
//!
//! One request per connection, framed as in `linkerd_cni_proto::wire`. Each connection is
//! served on its own task with a deadline, so a stuck plugin cannot hold the agent; the
//! kernel-facing work (netns, bpf syscalls, registry files) runs on blocking threads.

use std::{
    io,
    os::unix::fs::PermissionsExt,
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use linkerd_cni_k8s::PodSource;
use linkerd_cni_proto::wire::{
    self, AddRequest, AttachmentRef, Envelope, ErrorKind, FrameError, PROTOCOL_VERSION, Request,
    Response,
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{UnixListener, UnixStream},
};
use tracing::Instrument;

use crate::{
    agent::{Agent, AgentError, Registration},
    netns::NetnsError,
    userns::UsernsError,
};

/// How long one request may take, end to end (Kubernetes lookup included).
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(20);

/// Counters the metrics endpoint exposes.
#[derive(Debug, Default)]
pub struct ServerStats {
    pub adds: AtomicU64,
    pub dels: AtomicU64,
    pub checks: AtomicU64,
    pub errors: AtomicU64,
}

/// What serves requests.
pub struct Server {
    pub agent: Arc<Agent>,
    pub pods: PodSource,
    pub stats: ServerStats,
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
    /// Accepts connections until the listener fails.
    pub async fn serve(self: Arc<Self>, listener: UnixListener) -> io::Result<()> {
        loop {
            let (conn, _) = listener.accept().await?;
            let this = self.clone();
            tokio::spawn(async move {
                if let Err(e) = tokio::time::timeout(REQUEST_DEADLINE, this.connection(conn)).await
                {
                    tracing::warn!(error = %e, "request exceeded its deadline");
                }
            });
        }
    }

    async fn connection(&self, mut conn: UnixStream) {
        let response = match read_request(&mut conn).await {
            Ok(env) if env.version != PROTOCOL_VERSION => error(
                ErrorKind::VersionMismatch,
                format!(
                    "agent speaks protocol {PROTOCOL_VERSION}, request uses {}",
                    env.version
                ),
            ),
            Ok(env) => self.handle(env.request).await,
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
        match request {
            Request::Add(add) => {
                self.stats.adds.fetch_add(1, Ordering::Relaxed);
                self.add(*add).await
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
                    Err(e) => agent_error(e),
                }
            }
            Request::Gc(gc) => {
                let valid: Vec<String> = gc.valid.into_iter().map(|a| a.container_id).collect();
                match self.blocking(move |a| a.gc(&valid)).await {
                    Ok(removed) => Response::Collected { removed },
                    Err(e) => agent_error(e),
                }
            }
            Request::Status => match self.blocking(|a| a.pods()).await {
                Ok(pods) => Response::Status {
                    programs_loaded: true,
                    pods: pods.len(),
                },
                Err(e) => agent_error(e),
            },
        }
    }

    async fn add(&self, add: AddRequest) -> Response {
        let span = tracing::info_span!(
            "add",
            container = %add.attachment.container_id,
            namespace = %add.pod.namespace,
            pod = %add.pod.name
        );
        // `instrument`, not `enter`: the future moves between runtime threads at each await,
        // and an entered span guard held across one corrupts the span stack (a panic under
        // concurrent ADDs).
        self.add_in_span(add).instrument(span).await
    }

    async fn add_in_span(&self, add: AddRequest) -> Response {
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
        } = add;
        if pod.namespace.is_empty() || pod.name.is_empty() {
            return error(
                ErrorKind::BadRequest,
                "ADD without pod namespace and name".into(),
            );
        }
        let decision = match self
            .pods
            .decide(&pod.namespace, &pod.name, pod.uid.as_deref(), &config)
            .await
        {
            Ok(d) => d,
            Err(e) if e.is_transient() => return error(ErrorKind::KubernetesApi, e.to_string()),
            Err(e) => return error(ErrorKind::BadRequest, e.to_string()),
        };
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
        let result = if decision.redirect {
            self.blocking(move |a| a.register(reg)).await
        } else {
            let why = reason.clone();
            self.blocking(move |a| a.record_unredirected(reg, why))
                .await
        };
        match result {
            Ok(record) => {
                tracing::info!(redirected = record.redirected(), reason = %reason, "pod added");
                // An unredirected record's reason is the decision's: say it once.
                let reason = if record.reason == reason {
                    reason
                } else {
                    format!("{reason}; {}", record.reason)
                };
                Response::Added {
                    redirected: record.redirected(),
                    reason,
                }
            }
            Err(e) => agent_error(e),
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

async fn read_request(conn: &mut UnixStream) -> Result<Envelope, FrameError> {
    let mut header = [0u8; 4];
    conn.read_exact(&mut header).await?;
    let mut body = vec![0u8; wire::frame_len(header)?];
    conn.read_exact(&mut body).await?;
    Ok(serde_json::from_slice(&body)?)
}

fn error(kind: ErrorKind, message: String) -> Response {
    Response::Error { kind, message }
}

/// The one place agent errors become protocol error kinds.
fn agent_error(e: AgentError) -> Response {
    let kind = match &e {
        AgentError::Netns(NetnsError::NotFound { .. } | NetnsError::NotNetns { .. }) => {
            ErrorKind::UnknownContainer
        }
        AgentError::UnknownContainer(_) => ErrorKind::UnknownContainer,
        AgentError::NotInForce { .. } => ErrorKind::NotInForce,
        // The pod's own configuration is at fault: retrying the same ADD cannot help.
        AgentError::Limit(_) | AgentError::Userns(UsernsError::Unmapped { .. }) => {
            ErrorKind::BadRequest
        }
        _ => ErrorKind::Internal,
    };
    error(kind, e.to_string())
}
