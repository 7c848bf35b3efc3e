//! `linkerd-proxy-injector`: the HTTPS admission webhook injecting Linkerd's proxy, honouring
//! `cniEnabled` from `linkerd-config` (re-read for every pod it injects).

#![forbid(unsafe_code)]

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use anyhow::Context;
use clap::Parser;
use linkerd_cni_k8s::{
    client::{ClientBuilder, Fallback},
    names,
};
use linkerd_injector::{metrics::Metrics, paths, server, tls, webhook::Webhook};

/// The Linkerd proxy injector (admission webhook).
#[derive(Parser, Debug)]
#[command(name = "linkerd-proxy-injector", version, about)]
struct Args {
    /// HTTPS address of the webhook.
    #[arg(
        long,
        env = "LINKERD_PROXY_INJECTOR_ADDR",
        default_value = "0.0.0.0:8443"
    )]
    addr: SocketAddr,
    /// Plain-HTTP address of /metrics, /ready and /live.
    #[arg(
        long,
        env = "LINKERD_PROXY_INJECTOR_ADMIN_ADDR",
        default_value = "0.0.0.0:9995"
    )]
    admin_addr: SocketAddr,
    /// PEM serving certificate (re-read when it changes).
    #[arg(long, env = "LINKERD_PROXY_INJECTOR_TLS_CERT", default_value_t = format!("{}/tls.crt", paths::PROXY_INJECTOR_TLS_DIR))]
    tls_cert: String,
    /// PEM private key of the serving certificate.
    #[arg(long, env = "LINKERD_PROXY_INJECTOR_TLS_KEY", default_value_t = format!("{}/tls.key", paths::PROXY_INJECTOR_TLS_DIR))]
    tls_key: String,
    /// Kubeconfig to use instead of the in-cluster service account.
    #[arg(long, env = "LINKERD_PROXY_INJECTOR_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Namespace of ConfigMap linkerd-config.
    #[arg(long, env = "LINKERD_PROXY_INJECTOR_CONTROL_PLANE_NAMESPACE", default_value = names::CONTROL_PLANE_NAMESPACE)]
    control_plane_namespace: String,
    /// Largest AdmissionReview body accepted, in bytes.
    #[arg(long, env = "LINKERD_PROXY_INJECTOR_MAX_BODY_BYTES", default_value_t = server::DEFAULT_MAX_BODY_BYTES)]
    max_body_bytes: usize,
    /// Timeout of each Kubernetes API request, in seconds.
    #[arg(long, env = "LINKERD_PROXY_INJECTOR_API_TIMEOUT", default_value_t = 5)]
    api_timeout: u64,
    /// Log filter (tracing-subscriber syntax).
    #[arg(long, env = "LINKERD_PROXY_INJECTOR_LOG", default_value = "info")]
    log: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_new(&args.log).context("--log")?)
        .with_writer(std::io::stderr)
        .init();

    let api_timeout = Duration::from_secs(args.api_timeout.max(1));
    let client = ClientBuilder::new(Fallback::Infer)
        .kubeconfig(args.kubeconfig.as_deref())
        .connect_timeout(api_timeout)
        .read_timeout(api_timeout)
        .build()
        .await
        .context("connecting to the Kubernetes API")?;
    let resolver = tls::ReloadingCert::load(args.tls_cert.as_ref(), args.tls_key.as_ref())
        .context("loading the serving certificate")?;
    let tls = tls::server_config_with(Arc::new(resolver))?;
    let metrics = Arc::new(Metrics::default());
    let webhook = Arc::new(Webhook::new(
        client,
        args.control_plane_namespace.clone(),
        metrics,
    ));

    let https = tokio::net::TcpListener::bind(args.addr)
        .await
        .with_context(|| format!("binding {}", args.addr))?;
    let admin = tokio::net::TcpListener::bind(args.admin_addr)
        .await
        .with_context(|| format!("binding {}", args.admin_addr))?;
    tracing::info!(addr = %args.addr, admin = %args.admin_addr, config = %format!("{}/{}", args.control_plane_namespace, names::CONFIG_MAP), "serving");

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let limits = server::Limits {
        max_body_bytes: args.max_body_bytes,
    };
    let https_task = tokio::spawn(server::serve_https(
        https,
        tls,
        webhook.clone(),
        limits,
        stopped(stop_rx.clone()),
    ));
    let admin_task = tokio::spawn(server::serve_admin(admin, webhook, stopped(stop_rx)));

    shutdown_signal().await?;
    tracing::info!("shutting down");
    let _ = stop_tx.send(true);
    let _ = tokio::join!(https_task, admin_task);
    Ok(())
}

async fn shutdown_signal() -> anyhow::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("SIGTERM handler")?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r.context("SIGINT handler")?,
        _ = term.recv() => {}
    }
    Ok(())
}
