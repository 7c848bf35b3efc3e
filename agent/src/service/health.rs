//! The DaemonSet's probes and metrics over HTTP: `/live`, `/ready` (200 only when the
//! programs are loaded, the registration socket serves (its bounded blocking work is not all
//! stuck), the data plane's pins can be restored
//! and, when the installer runs, the plugin is in every conflist) and `/metrics` (Prometheus
//! text format).
//!
//! The DaemonSet runs with `hostNetwork`, so whatever address the endpoint binds is the
//! node's. By default it binds loopback only (`127.0.0.1`, and `::1` where the node has IPv6):
//! kubelet, in the host's network namespace, probes `127.0.0.1`, and no pod can reach it.
//! `/metrics` can also be served alone on an address of its own (`--metrics-addr`), for a
//! Prometheus that scrapes the node. A peer that is not on loopback learns only whether the
//! agent is ready, never why not. The endpoint is hardened all the same: an accept error (EMFILE and the like) is logged and retried
//! after a pause, never fatal; at most [`MAX_CONNECTIONS`] are open at once, a new one closing
//! the oldest (so a probe always gets through); one request per connection, whose headers must
//! arrive within [`IDLE_TIMEOUT`], and no connection lives longer than [`MAX_LIFETIME`];
//! `/metrics` walks the maps on a blocking thread, never on a runtime thread.

use std::{
    collections::VecDeque, convert::Infallible, io, net::SocketAddr, sync::Arc,
    sync::atomic::Ordering, time::Duration,
};

use http_body_util::Full;
use hyper::{Request, Response, StatusCode, body::Bytes, server::conn::http1, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use linkerd_cni_installer::Installer;
use tokio::{net::TcpListener, sync::oneshot};

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
        if let Some(why) = self.server.work.not_ready() {
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
        out.push_str(&format!(
            "# HELP linkerd_cni_agent_order_conflicts Meshed pods whose programs were found, at their last check, not to run first on a hook, or to keep another tenant's program from running (see the agent's log).\n# TYPE linkerd_cni_agent_order_conflicts gauge\nlinkerd_cni_agent_order_conflicts {}\n",
            self.reconciler.order_conflicts()
        ));
        out.push_str(&self.server.adopter.metrics());
        out.push_str(&self.server.repairer.metrics());
        out.push_str(&self.server.verifier.metrics());
        let events = self.server.events.stats();
        counter(
            &mut out,
            "linkerd_cni_agent_events_created_total",
            "Kubernetes Events created on pods.",
            events.created.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "linkerd_cni_agent_events_aggregated_total",
            "Repeated Events counted into an existing Event's series.",
            events.aggregated.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "linkerd_cni_agent_events_dropped_total",
            "Events dropped: the queue to the API was full.",
            events.dropped.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "linkerd_cni_agent_events_failed_total",
            "Event writes the API refused or that failed.",
            events.failed.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "linkerd_cni_agent_repair_failures_total",
            "Repairs that failed (retried at the next pass).",
            self.reconciler.failures(),
        );
        counter(
            &mut out,
            "linkerd_cni_agent_reconcile_passes_total",
            "Reconcile passes, each verifying up to 512 registered pods where the last one stopped.",
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
        let choice = self.server.agent.mode_choice();
        out.push_str(&format!(
            "# HELP linkerd_cni_agent_mode How meshed pods are redirected on this node (1 for the mode in force), and what chose it: the kernel probes (--mode=auto) or the flag.\n# TYPE linkerd_cni_agent_mode gauge\nlinkerd_cni_agent_mode{{mode=\"{}\",chosen_by=\"{}\"}} 1\n",
            choice.mode.name(),
            match choice.forced {
                true => "flag",
                false => "probes",
            }
        ));
        out
    }

    async fn respond(
        self: Arc<Self>,
        path: &str,
        serves: Serves,
        peer_on_loopback: bool,
    ) -> Response<Full<Bytes>> {
        let (status, body) = match path {
            "/live" if serves == Serves::Probes => (StatusCode::OK, "ok\n".to_string()),
            "/ready" if serves == Serves::Probes => ready(self.not_ready(), peer_on_loopback),
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

    /// Serves `listener` for ever (accept errors are logged and retried): the probes and
    /// `/metrics`, or `/metrics` alone.
    pub async fn serve(self: Arc<Self>, listener: TcpListener, serves: Serves) {
        // One sender per open connection, oldest first; sending closes that connection.
        let mut open: VecDeque<oneshot::Sender<()>> = VecDeque::new();
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
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
                    let on_loopback = peer.ip().to_canonical().is_loopback();
                    async move {
                        let response = this.respond(req.uri().path(), serves, on_loopback).await;
                        Ok::<_, Infallible>(response)
                    }
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

/// What a listener of the endpoint serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Serves {
    /// `/live`, `/ready` and `/metrics` (`--health-addr`).
    Probes,
    /// `/metrics` only (`--metrics-addr`).
    Metrics,
}

/// Binds every address of `addrs`. An IPv6 address that the node cannot bind because it has
/// no IPv6 (the module not loaded, `disable_ipv6`, or `::1` absent) is skipped with a log line,
/// as long as another address was bound; any other failure is an error naming the address.
pub async fn bind(addrs: &[SocketAddr], what: &str) -> io::Result<Vec<TcpListener>> {
    let mut bound = Vec::new();
    let mut skipped = Vec::new();
    for addr in addrs {
        match TcpListener::bind(addr).await {
            Ok(listener) => {
                tracing::info!(%addr, "{what} listening");
                bound.push(listener);
            }
            Err(e) if addr.is_ipv6() && no_ipv6(&e) => {
                tracing::info!(%addr, error = %e, "{what}: no IPv6 on this node; not listening there");
                skipped.push(e);
            }
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("binding {addr} ({what}): {e}"),
                ));
            }
        }
    }
    if bound.is_empty()
        && let Some(e) = skipped.pop()
    {
        return Err(io::Error::new(
            e.kind(),
            format!("{what}: no address could be bound: {e}"),
        ));
    }
    Ok(bound)
}

/// `/ready`'s answer: why the agent is not ready only to a peer on loopback (the node
/// itself); anyone else learns ready or not.
fn ready(not_ready: Option<String>, peer_on_loopback: bool) -> (StatusCode, String) {
    match not_ready {
        None => (StatusCode::OK, "ready\n".to_string()),
        Some(why) if peer_on_loopback => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
        Some(_) => (StatusCode::SERVICE_UNAVAILABLE, "not ready\n".to_string()),
    }
}

/// Whether a bind failed because the node has no IPv6.
fn no_ipv6(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EAFNOSUPPORT) | Some(libc::EADDRNOTAVAIL) | Some(libc::EPROTONOSUPPORT)
    )
}

/// Appends one counter in the Prometheus text format.
fn counter(out: &mut String, name: &str, help: &str, v: u64) {
    out.push_str(&format!(
        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}\n"
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_says_why_only_to_loopback() {
        let why = || Some("installer not ready: conflist missing".to_string());
        assert_eq!(
            ready(why(), true),
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "installer not ready: conflist missing\n".to_string()
            )
        );
        assert_eq!(
            ready(why(), false),
            (StatusCode::SERVICE_UNAVAILABLE, "not ready\n".to_string())
        );
        assert_eq!(ready(None, false), (StatusCode::OK, "ready\n".to_string()));
    }

    #[tokio::test]
    async fn binds_every_address_and_names_the_one_that_fails() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let taken_addr = taken.local_addr().expect("addr");
        let ok: SocketAddr = "127.0.0.1:0".parse().expect("addr");
        let bound = bind(&[ok], "test").await.expect("loopback binds");
        assert_eq!(bound.len(), 1);
        let err = bind(&[ok, taken_addr], "test endpoint")
            .await
            .expect_err("an address in use is an error");
        assert!(
            err.to_string().contains(&taken_addr.to_string()),
            "names the address: {err}"
        );
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
    }

    #[test]
    fn a_node_without_ipv6_is_told_apart_from_other_failures() {
        assert!(no_ipv6(&io::Error::from_raw_os_error(libc::EADDRNOTAVAIL)));
        assert!(no_ipv6(&io::Error::from_raw_os_error(libc::EAFNOSUPPORT)));
        assert!(!no_ipv6(&io::Error::from_raw_os_error(libc::EADDRINUSE)));
        assert!(!no_ipv6(&io::Error::from_raw_os_error(libc::EACCES)));
    }
}
