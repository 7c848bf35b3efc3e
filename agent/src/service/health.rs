//! The DaemonSet's probes and metrics over HTTP: `/live`, `/ready` (200 only when the
//! programs are loaded, the registration socket serves, the data plane's pins can be restored
//! and, when the installer runs, the plugin is in every conflist) and `/metrics` (Prometheus
//! text format).
//!
//! The endpoint is reachable from the node's network once the DaemonSet runs with
//! `hostNetwork`, so it is hardened: an accept error (EMFILE and the like) is logged and retried
//! after a pause, never fatal; at most [`MAX_CONNECTIONS`] are open at once, a new one closing
//! the oldest (so a probe always gets through); one request per connection, whose headers must
//! arrive within [`IDLE_TIMEOUT`], and no connection lives longer than [`MAX_LIFETIME`];
//! `/metrics` walks the maps on a blocking thread, never on a runtime thread.

use std::{
    collections::VecDeque, convert::Infallible, net::SocketAddr, sync::Arc, sync::atomic::Ordering,
    time::Duration,
};

use http_body_util::Full;
use hyper::{Request, Response, StatusCode, body::Bytes, server::conn::http1, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use linkerd_cni_installer::Installer;
use tokio::sync::oneshot;

use crate::{agent::reconcile::Reconciler, service::server::Server};

/// Connections open at once; one more closes the oldest.
pub const MAX_CONNECTIONS: usize = 64;
/// How long a connection may stay without a complete request.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long any connection may stay open.
pub const MAX_LIFETIME: Duration = Duration::from_secs(15);
/// The pause after a failed `accept` before the next one.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(200);

/// What the probes look at.
pub struct Health {
    pub server: Arc<Server>,
    pub installer: Option<Installer>,
    pub reconciler: Arc<Reconciler>,
}

impl Health {
    /// Why the agent is not ready, if it is not.
    pub fn not_ready(&self) -> Option<String> {
        if let Some(why) = self.reconciler.not_ready() {
            return Some(why);
        }
        if let Some(installer) = &self.installer {
            let status = installer.status();
            if !status.ready() {
                return Some(format!("installer not ready: {status:?}"));
            }
        }
        None
    }

    fn metrics(&self) -> String {
        let s = &self.server.stats;
        let mut out = String::new();
        counter(
            &mut out,
            "linkerd_cni_agent_add_total",
            "CNI ADD requests served.",
            s.adds.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "linkerd_cni_agent_del_total",
            "CNI DEL requests served.",
            s.dels.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "linkerd_cni_agent_check_total",
            "CNI CHECK requests served.",
            s.checks.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "linkerd_cni_agent_errors_total",
            "Requests answered with an error.",
            s.errors.load(Ordering::Relaxed),
        );
        let pods = self.server.agent.pod_count() as u64;
        let (redirected, answered) = self.server.agent.stats_totals().unwrap_or_default();
        counter(
            &mut out,
            "linkerd_cni_outbound_redirected_total",
            "Outbound connections sent to a proxy (live pods).",
            redirected,
        );
        counter(
            &mut out,
            "linkerd_cni_orig_dst_answered_total",
            "SO_ORIGINAL_DST answers given (live pods).",
            answered,
        );
        let fill = self.server.agent.fill_levels().unwrap_or_default();
        for (metric, help) in [
            ("linkerd_cni_map_entries", "Entries in each node-wide map."),
            (
                "linkerd_cni_map_max_entries",
                "Capacity of each node-wide map.",
            ),
        ] {
            out.push_str(&format!("# HELP {metric} {help}\n# TYPE {metric} gauge\n"));
            for f in &fill {
                let v = match metric {
                    "linkerd_cni_map_entries" => f.entries as u64,
                    _ => u64::from(f.max_entries),
                };
                out.push_str(&format!("{metric}{{map=\"{}\"}} {v}\n", f.name));
            }
        }
        out.push_str(&format!(
            "# HELP linkerd_cni_agent_pods Registered CNI attachments.\n# TYPE linkerd_cni_agent_pods gauge\nlinkerd_cni_agent_pods {pods}\n"
        ));
        out.push_str(
            "# HELP linkerd_cni_agent_repairs_total Data plane repairs: links re-attached, map entries re-written, pins restored.\n# TYPE linkerd_cni_agent_repairs_total counter\n",
        );
        for (kind, n) in self.reconciler.repairs() {
            out.push_str(&format!(
                "linkerd_cni_agent_repairs_total{{kind=\"{}\"}} {n}\n",
                kind.label()
            ));
        }
        out.push_str(&self.server.adopter.metrics());
        counter(
            &mut out,
            "linkerd_cni_agent_repair_failures_total",
            "Repairs that failed (retried at the next pass).",
            self.reconciler.failures(),
        );
        counter(
            &mut out,
            "linkerd_cni_agent_reconcile_passes_total",
            "Whole verification passes over every registered pod.",
            self.reconciler.passes(),
        );
        counter(
            &mut out,
            "linkerd_cni_agent_refused_total",
            "Registration connections refused (peer not root).",
            s.refused.load(Ordering::Relaxed),
        );
        out.push_str(&format!(
            "# HELP linkerd_cni_agent_dataplane_ready Whether the data plane's pins are in place (1) or cannot be restored (0).\n# TYPE linkerd_cni_agent_dataplane_ready gauge\nlinkerd_cni_agent_dataplane_ready {}\n",
            u8::from(self.reconciler.not_ready().is_none())
        ));
        out
    }

    async fn respond(self: Arc<Self>, path: &str) -> Response<Full<Bytes>> {
        let (status, body) = match path {
            "/live" => (StatusCode::OK, "ok\n".to_string()),
            "/ready" => match self.not_ready() {
                None => (StatusCode::OK, "ready\n".to_string()),
                Some(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
            },
            // Walks every pod's entries under the maps lock: not on a runtime thread.
            "/metrics" => match tokio::task::spawn_blocking(move || self.metrics()).await {
                Ok(text) => (StatusCode::OK, text),
                Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
            },
            _ => (StatusCode::NOT_FOUND, "not found\n".to_string()),
        };
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        response
    }

    /// Binds `addr`, then serves for ever (accept errors are logged and retried).
    pub async fn serve(self: Arc<Self>, addr: SocketAddr) -> std::io::Result<()> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        tracing::info!(%addr, "health and metrics endpoint listening");
        // One sender per open connection, oldest first; sending closes that connection.
        let mut open: VecDeque<oneshot::Sender<()>> = VecDeque::new();
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "health endpoint: accept failed; retrying");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            };
            open.retain(|tx| !tx.is_closed());
            if open.len() >= MAX_CONNECTIONS
                && let Some(oldest) = open.pop_front()
            {
                let _ = oldest.send(());
            }
            let (tx, close) = oneshot::channel();
            open.push_back(tx);
            let this = self.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                    let this = this.clone();
                    async move { Ok::<_, Infallible>(this.respond(req.uri().path()).await) }
                });
                let conn = http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(IDLE_TIMEOUT)
                    .keep_alive(false)
                    .serve_connection(TokioIo::new(stream), service);
                tokio::select! {
                    _ = tokio::time::timeout(MAX_LIFETIME, conn) => {}
                    _ = close => {}
                }
            });
        }
    }
}

/// Appends one counter in the Prometheus text format.
fn counter(out: &mut String, name: &str, help: &str, v: u64) {
    out.push_str(&format!(
        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}\n"
    ));
}
