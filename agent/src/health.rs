//! The DaemonSet's probes and metrics over HTTP: `/live`, `/ready` (200 only when the
//! programs are loaded, the registration socket serves and, when the installer runs, the
//! plugin is in every conflist) and `/metrics` (Prometheus text format).

use std::{convert::Infallible, net::SocketAddr, sync::Arc, sync::atomic::Ordering};

use http_body_util::Full;
use hyper::{Request, Response, StatusCode, body::Bytes, server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use linkerd_cni_installer::Installer;

use crate::server::Server;

/// What the probes look at.
pub struct Health {
    pub server: Arc<Server>,
    pub installer: Option<Installer>,
}

impl Health {
    /// Why the agent is not ready, if it is not.
    pub fn not_ready(&self) -> Option<String> {
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
        let mut counter = |name: &str, help: &str, v: u64| {
            out.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}\n"
            ));
        };
        counter(
            "linkerd_cni_agent_add_total",
            "CNI ADD requests served.",
            s.adds.load(Ordering::Relaxed),
        );
        counter(
            "linkerd_cni_agent_del_total",
            "CNI DEL requests served.",
            s.dels.load(Ordering::Relaxed),
        );
        counter(
            "linkerd_cni_agent_check_total",
            "CNI CHECK requests served.",
            s.checks.load(Ordering::Relaxed),
        );
        counter(
            "linkerd_cni_agent_errors_total",
            "Requests answered with an error.",
            s.errors.load(Ordering::Relaxed),
        );
        let (pods, redirected, answered) = self.server.agent.pods().map_or((0, 0, 0), |records| {
            self.server.agent.with_maps(|maps| {
                let mut redirected = 0;
                let mut answered = 0;
                for cookie in maps.pods() {
                    let st = maps.stats(cookie);
                    redirected += st.out_redirected;
                    answered += st.orig_dst_answered;
                }
                (records.len() as u64, redirected, answered)
            })
        });
        counter(
            "linkerd_cni_outbound_redirected_total",
            "Outbound connections sent to a proxy (live pods).",
            redirected,
        );
        counter(
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
        out
    }

    fn respond(&self, path: &str) -> Response<Full<Bytes>> {
        let (status, body) = match path {
            "/live" => (StatusCode::OK, "ok\n".to_string()),
            "/ready" => match self.not_ready() {
                None => (StatusCode::OK, "ready\n".to_string()),
                Some(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
            },
            "/metrics" => (StatusCode::OK, self.metrics()),
            _ => (StatusCode::NOT_FOUND, "not found\n".to_string()),
        };
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        response
    }

    /// Serves until the listener fails.
    pub async fn serve(self: Arc<Self>, addr: SocketAddr) -> std::io::Result<()> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        tracing::info!(%addr, "health and metrics endpoint listening");
        loop {
            let (stream, _) = listener.accept().await?;
            let this = self.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                    let response = this.respond(req.uri().path());
                    async move { Ok::<_, Infallible>(response) }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    }
}
