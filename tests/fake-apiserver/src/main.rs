//! `linkerd-cni-fake-apiserver`: the fake Kubernetes API server of this crate's library as a
//! process, for the end-to-end tests, the demo and manual runs.
//!
//! Serves the objects of a directory of JSON/YAML manifests over plain HTTP, writes a
//! kubeconfig pointing at itself (give it to the agent's `--kubeconfig`), and keeps serving what
//! the directory holds: it rescans the directory every `--rescan-ms` and at once on SIGHUP
//! (new and changed manifests are applied, removed ones deleted, each a watch event). Prints
//! `listening on URL` on stdout once ready. SIGTERM / SIGINT: removes the kubeconfig it wrote
//! and exits.

#![forbid(unsafe_code)]

use std::{io::Write, net::SocketAddr, path::PathBuf, time::Duration};

use anyhow::Context;
use clap::Parser;
use linkerd_cni_fake_apiserver::{FakeApiServer, ManifestDir};
use tokio::signal::unix::{SignalKind, signal};

/// A fake Kubernetes API server serving a directory of manifests (tests and demo only).
#[derive(Parser, Debug)]
#[command(version)]
struct Options {
    /// Address to listen on (port 0: any free port; see the `listening on` line).
    #[arg(
        long,
        env = "LINKERD_CNI_FAKE_APISERVER_LISTEN",
        default_value = "127.0.0.1:0"
    )]
    listen: SocketAddr,
    /// Directory of `*.json` / `*.yaml` / `*.yml` manifests (core v1 objects) to serve.
    #[arg(long, env = "LINKERD_CNI_FAKE_APISERVER_MANIFESTS")]
    manifests: Option<PathBuf>,
    /// Write a kubeconfig pointing at this server here (removed on exit).
    #[arg(long, env = "LINKERD_CNI_FAKE_APISERVER_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Rescan the manifests directory this often, in milliseconds (0: only on SIGHUP).
    #[arg(
        long,
        env = "LINKERD_CNI_FAKE_APISERVER_RESCAN_MS",
        default_value_t = 1000
    )]
    rescan_ms: u64,
}

fn main() -> anyhow::Result<()> {
    let opts = Options::parse();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run(opts))
}

async fn run(opts: Options) -> anyhow::Result<()> {
    let server = FakeApiServer::bind(opts.listen)?;
    let mut dir = opts.manifests.as_ref().map(ManifestDir::new);
    if let (Some(dir), Some(path)) = (dir.as_mut(), opts.manifests.as_ref()) {
        let report = dir
            .sync(&server)
            .with_context(|| format!("loading {}", path.display()))?;
        eprintln!(
            "fake-apiserver: loaded {} objects from {}",
            report.objects,
            path.display()
        );
    }
    // Handlers first: a SIGHUP sent as soon as the `listening on` line appears must not kill
    // the process with the default action.
    let mut hup = signal(SignalKind::hangup())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    if let Some(path) = &opts.kubeconfig {
        server
            .write_kubeconfig(path)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    println!("listening on {}", server.url());
    std::io::stdout().flush()?;

    let period = Duration::from_millis(opts.rescan_ms.max(1));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let reason = tokio::select! {
            _ = hup.recv() => "SIGHUP",
            _ = tick.tick(), if opts.rescan_ms > 0 => "rescan",
            _ = term.recv() => break,
            _ = int.recv() => break,
        };
        if let Some(dir) = dir.as_mut() {
            let before = server.resource_version();
            match dir.sync(&server) {
                Ok(report)
                    if server.resource_version() != before
                        || report.deleted > 0
                        || reason == "SIGHUP" =>
                {
                    eprintln!(
                        "fake-apiserver: {reason}: {} objects, {} deleted, resourceVersion {}",
                        report.objects,
                        report.deleted,
                        server.resource_version()
                    );
                }
                Ok(_) => {}
                Err(e) => eprintln!("fake-apiserver: {reason}: keeping the previous objects: {e}"),
            }
        }
    }
    if let Some(path) = &opts.kubeconfig {
        let _ = std::fs::remove_file(path);
    }
    drop(server);
    Ok(())
}
