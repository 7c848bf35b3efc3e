//! The HTTP side: the HTTPS webhook endpoint (`POST /` or `/inject`) and a plain-HTTP admin
//! endpoint (`/metrics`, `/ready`, `/live`). Every connection is served on its own task, so a
//! bad client (slow, oversized, garbage) costs only itself; bodies are capped before being
//! read and headers must arrive within a deadline.

use std::{convert::Infallible, future::Future, net::SocketAddr, sync::Arc, time::Duration};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::{body::Incoming, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::webhook::Webhook;

/// Default cap of an AdmissionReview body.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1024 * 1024;
/// Deadline for a TLS handshake and for a request's headers.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Limits applied to every request.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Largest body accepted (larger: 413).
    pub max_body_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
        }
    }
}

type Body = Full<Bytes>;

fn text(status: StatusCode, body: impl Into<String>) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(body.into())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

fn json(body: Vec<u8>) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    r
}

async fn route(
    req: Request<Incoming>,
    webhook: Arc<Webhook>,
    admission: bool,
    limits: Limits,
) -> Response<Body> {
    let path = req.uri().path();
    let is_admission_path = admission && (path == "/" || path == "/inject");
    match (req.method(), path) {
        (&Method::GET, "/metrics") => text(StatusCode::OK, webhook.metrics().encode()),
        (&Method::GET, "/ready" | "/live") => text(StatusCode::OK, "ok\n"),
        (&Method::POST, _) if is_admission_path => admit(req, &webhook, limits).await,
        _ if is_admission_path => text(StatusCode::METHOD_NOT_ALLOWED, "POST an AdmissionReview\n"),
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    }
}

async fn admit(req: Request<Incoming>, webhook: &Webhook, limits: Limits) -> Response<Body> {
    let too_large = || {
        webhook.metrics().requests.inc();
        webhook.metrics().error("too-large");
        text(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body exceeds {} bytes\n", limits.max_body_bytes),
        )
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limits.max_body_bytes as u64) {
        return too_large();
    }
    let body = match Limited::new(req.into_body(), limits.max_body_bytes)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => return too_large(),
        Err(e) => {
            webhook.metrics().requests.inc();
            webhook.metrics().error("bad-request");
            return text(StatusCode::BAD_REQUEST, format!("reading the body: {e}\n"));
        }
    };
    match webhook.review(&body).await {
        // Serialising a serde_json::Value cannot fail.
        Ok(review) => json(serde_json::to_vec(&review).unwrap_or_default()),
        Err(e) => text(StatusCode::BAD_REQUEST, format!("{e}\n")),
    }
}

fn http1() -> hyper::server::conn::http1::Builder {
    let mut b = hyper::server::conn::http1::Builder::new();
    b.timer(TokioTimer::new())
        .header_read_timeout(HANDSHAKE_TIMEOUT);
    b
}

/// Serves the webhook over HTTPS on `listener` until `shutdown` completes.
pub async fn serve_https(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    webhook: Arc<Webhook>,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) {
    let acceptor = TlsAcceptor::from(tls);
    serve(listener, shutdown, move |stream, peer| {
        let (acceptor, webhook) = (acceptor.clone(), webhook.clone());
        async move {
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => return tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                Err(_) => return tracing::debug!(%peer, "TLS handshake timed out"),
            };
            let svc = service_fn(move |req| {
                let webhook = webhook.clone();
                async move { Ok::<_, Infallible>(route(req, webhook, true, limits).await) }
            });
            if let Err(e) = http1().serve_connection(TokioIo::new(tls), svc).await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        }
    })
    .await
}

/// Serves `/metrics`, `/ready` and `/live` over plain HTTP until `shutdown` completes.
pub async fn serve_admin(
    listener: TcpListener,
    webhook: Arc<Webhook>,
    shutdown: impl Future<Output = ()>,
) {
    serve(listener, shutdown, move |stream, peer| {
        let webhook = webhook.clone();
        async move {
            let svc = service_fn(move |req| {
                let webhook = webhook.clone();
                async move { Ok::<_, Infallible>(route(req, webhook, false, Limits::default()).await) }
            });
            if let Err(e) = http1().serve_connection(TokioIo::new(stream), svc).await {
                tracing::debug!(%peer, error = %e, "admin connection ended with an error");
            }
        }
    })
    .await
}

async fn serve<F, Fut>(listener: TcpListener, shutdown: impl Future<Output = ()>, conn: F)
where
    F: Fn(tokio::net::TcpStream, SocketAddr) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => { tokio::spawn(conn(stream, peer)); }
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }
}
