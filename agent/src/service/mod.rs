//! The running agent: what `linkerd-cni-agent run` serves and the passes it repeats until it
//! is told to stop.
//!
//! - [`server`]: the registration service (the plugin's ADD, DEL and CHECK over a Unix socket).
//! - [`health`]: `/live`, `/ready` and `/metrics` over HTTP.
//! - [`inspect`]: the human view of the pinned state (`linkerd-cni-agent inspect`).
//! - [`run`]: starts all of it, the node installer (`--install`), and the background passes:
//!   reaping registrations whose netns is gone, reconciling every pod's redirection, adopting
//!   pods that started without it, reporting meshed pods that run without (verified)
//!   redirection (`crate::agent::verify`); removing the node's startup taint once ready
//!   (`--remove-startup-taint`); on SIGTERM, decides whether the plugin leaves the node.

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use anyhow::Context;
use linkerd_cni_installer::Installer;
use linkerd_cni_k8s::termination::{Termination, termination};

use crate::agent::{
    Agent, AgentConfig,
    adopt::Adopter,
    reconcile::Reconciler,
    repair::{RepairOptions, Repairer},
    verify::{Verifier, VerifyOptions},
};

pub mod health;
pub mod inspect;
pub mod logs;
pub mod server;
pub mod uninstall;

use health::{Health, Serves};
use server::Server;

/// How `run` serves and how often its passes repeat (the agent's `run` flags).
#[derive(Clone, Debug)]
pub struct Options {
    /// The registration socket.
    pub socket: PathBuf,
    /// Kubeconfig for the API server; in-cluster configuration when absent.
    pub kubeconfig: Option<PathBuf>,
    /// This node's name; the host name when absent.
    pub node_name: Option<String>,
    /// Where bpffs is mounted (the reconciler re-mounts it if it goes).
    pub bpffs: PathBuf,
    /// Addresses of the /live, /ready and /metrics endpoint (IPv6 ones skipped where the
    /// node has no IPv6).
    pub health_addrs: Vec<SocketAddr>,
    /// Addresses where `/metrics` alone is also served (none: only on `health_addrs`).
    pub metrics_addrs: Vec<SocketAddr>,
    /// Also run the node installer (Linkerd's installer environment variables).
    pub install: bool,
    /// How often registrations whose netns is gone are dropped.
    pub reap_interval: Duration,
    /// How often every registered pod is verified and repaired.
    pub reconcile_interval: Duration,
    /// Attach redirection to meshed pods that started without it.
    pub adopt_running_pods: bool,
    /// How often this node's pods are checked for adoption (and for repair).
    pub adopt_interval: Duration,
    /// Delete meshed pods running without redirection when they cannot be adopted in place
    /// (no `CAP_SYS_ADMIN`, or adoption off), paced by `repair`.
    pub repair_pods: bool,
    /// How the repair is paced.
    pub repair: RepairOptions,
    /// How the verification reports (its grace is the repair's).
    pub verify: VerifyOptions,
    /// With `install`, always remove linkerd-cni from the CNI configs on SIGTERM.
    pub cleanup_on_sigterm: bool,
    /// Remove the node's startup taint once ready (`linkerd_cni_k8s::taint`).
    pub remove_startup_taint: bool,
    /// Namespace of the agent's DaemonSet.
    pub pod_namespace: String,
    /// Name of the agent's DaemonSet, read on SIGTERM.
    pub daemonset: String,
}

/// Runtime worker threads (async: the socket, the API watch, the health endpoint).
const RUNTIME_WORKERS: usize = 2;
/// Threads for blocking work (registrations, reaping, reconciling), at most.
const RUNTIME_BLOCKING_THREADS: usize = 8;

/// How long SIGTERM waits for the API to say whether the DaemonSet is being deleted.
const TERMINATION_API_BOUND: Duration = Duration::from_secs(2);

/// Runs the agent until SIGTERM or SIGINT (or until the registration service fails).
pub fn run(config: AgentConfig, options: Options) -> anyhow::Result<()> {
    // A fixed, small runtime whatever the node's core count: the agent's work is a few
    // requests at a time, serialised on its maps anyway, and every thread costs resident
    // memory (stack pages, allocator caches).
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(RUNTIME_WORKERS)
        .max_blocking_threads(RUNTIME_BLOCKING_THREADS)
        .enable_all()
        .build()?
        .block_on(serve(config, options))
}

async fn serve(config: AgentConfig, args: Options) -> anyhow::Result<()> {
    // Before anything serves: SIGHUP's default action would end the agent.
    let hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    let agent = Arc::new(tokio::task::spawn_blocking(move || Agent::start(config)).await??);
    let node = match &args.node_name {
        Some(n) => n.clone(),
        None => nix::unistd::gethostname()?.to_string_lossy().into_owned(),
    };
    let client = linkerd_cni_k8s::client::client(args.kubeconfig.as_deref()).await?;
    let pods = linkerd_cni_k8s::PodSource::new(client.clone(), node.clone());
    let reconciler = Arc::new(Reconciler::new(agent.clone(), &args.bpffs));
    let adopter = Arc::new(Adopter::new(agent.clone()));
    let events = linkerd_cni_k8s::events::EventRecorder::spawn(client.clone(), node.clone());
    let repairer = Arc::new(Repairer::new(
        agent.clone(),
        args.repair.clone(),
        events.clone(),
    ));
    let verifier = Arc::new(Verifier::new(
        agent.clone(),
        args.verify.clone(),
        events.clone(),
    ));
    let server = Arc::new(Server {
        agent: agent.clone(),
        pods,
        stats: Default::default(),
        reconciler: reconciler.clone(),
        adopter: adopter.clone(),
        work: Default::default(),
        refusals: Default::default(),
        repairer: repairer.clone(),
        verifier: verifier.clone(),
        events,
    });
    #[cfg(feature = "heap-profile")]
    {
        let profiled = server.clone();
        linkerd_cni_memory::heap_profile::spawn_reporter(move || profiled.pods.cached_len());
    }
    let listener =
        server::bind(&args.socket).with_context(|| format!("binding {}", args.socket.display()))?;
    tracing::info!(socket = %args.socket.display(), %node, "registration service listening");

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let installer = if args.install {
        let cfg = linkerd_cni_installer::InstallerConfig::from_env()?;
        Some(Installer::new(cfg)?)
    } else {
        None
    };
    // Adoption decides with the conflist's `linkerd` section: the one this agent installs,
    // until an ADD brings the one in force.
    if let Some(section) = installer.as_ref().and_then(linkerd_section) {
        adopter.remember_config(&section);
    }
    let installer_task = installer
        .clone()
        .map(|i| spawn_installer(i, stop_rx.clone()));
    let health = Arc::new(Health {
        server: server.clone(),
        installer: installer.clone(),
        reconciler: reconciler.clone(),
    });
    // Bound before anything is spawned: an address that cannot be bound stops the agent
    // with its name, rather than leaving kubelet's probes to fail without a word.
    let probes = health::bind(
        &args.health_addrs,
        "health endpoint (/live, /ready, /metrics)",
    )
    .await?;
    let metrics = if args.metrics_addrs.is_empty() {
        Vec::new()
    } else {
        health::bind(&args.metrics_addrs, "metrics endpoint (/metrics)").await?
    };
    let listeners = probes
        .into_iter()
        .map(|l| (l, Serves::Probes))
        .chain(metrics.into_iter().map(|l| (l, Serves::Metrics)));
    // One reconcile pass before /ready answers: a restarted agent whose pins were lost (its
    // bpffs gone with the previous container, pins removed) re-attaches the registered pods
    // first, so that ready means they are redirected again, not that they will be at the
    // first timed pass.
    let first = reconciler.clone();
    if let Err(e) = tokio::task::spawn_blocking(move || first.run_once()).await {
        tracing::warn!(error = %e, "reconcile pass failed");
    }
    for (listener, serves) in listeners {
        tokio::spawn(health.clone().serve(listener, serves));
    }
    spawn_reaper(agent.clone(), args.reap_interval);
    spawn_reconciler(reconciler, args.reconcile_interval, hup);
    if args.adopt_running_pods && adoption_possible(&agent, args.repair_pods) {
        spawn_adopter(adopter, server.clone(), args.adopt_interval);
    } else if args.repair_pods {
        tracing::info!(
            grace = ?args.repair.grace,
            burst = args.repair.burst,
            per_minute = args.repair.per_minute,
            window = ?args.repair.window,
            "repair of running pods is on: a meshed pod of this node running without \
             redirection is deleted, so that it is recreated through the plugin"
        );
        spawn_repairer(
            repairer,
            server.clone(),
            adopter,
            health.clone(),
            args.adopt_interval,
        );
    } else {
        tracing::warn!(
            "repair of running pods is off (--repair-pods=false): meshed pods that started \
             without linkerd-cni keep running without redirection until they are recreated"
        );
    }
    // Whatever acts on them (adoption, repair, nothing), meshed pods without redirection are
    // reported.
    spawn_verifier(verifier, server.clone(), args.adopt_interval);
    let serving = tokio::spawn(server.clone().serve(listener));
    if args.remove_startup_taint {
        // Ready is what /ready says: the same rule, asked of the same object.
        let ready = health.clone();
        tokio::spawn(linkerd_cni_k8s::taint::remove_when_ready(
            client.clone(),
            node.clone(),
            move || ready.not_ready(),
        ));
    }

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let sigterm = tokio::select! {
        _ = term.recv() => {
            tracing::info!("SIGTERM: shutting down (redirection stays in force)");
            true
        }
        _ = tokio::signal::ctrl_c() => {
            tracing::info!("interrupted: shutting down (redirection stays in force)");
            false
        }
        r = serving => {
            // Cannot happen (accept errors are retried); if it does, fail closed: the
            // conflists stay as they are and the exit status says something went wrong.
            tracing::error!(result = ?r, "registration service stopped");
            anyhow::bail!("the registration service stopped: {r:?}");
        }
    };
    let _ = stop_tx.send(true);
    if let Some(task) = installer_task {
        let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
    }
    if let Some(i) = installer
        && let Some(why) = uninstalling(sigterm, &args, client).await
    {
        tracing::info!(reason = %why, "uninstall: removing linkerd-cni from the host");
        tokio::task::spawn_blocking(move || i.cleanup()).await??;
    }
    let _ = std::fs::remove_file(&args.socket);
    Ok(())
}

/// Installs and keeps the installation until told to stop; the cleanup (if any) is decided
/// by [`uninstalling`], from why the agent stops.
fn spawn_installer(
    installer: Installer,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let shutdown = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        let first = installer.clone();
        match tokio::task::spawn_blocking(move || first.install_once()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::error!(error = %e, "node installer: first install failed"),
            Err(e) => tracing::error!(error = %e, "node installer: first install panicked"),
        }
        if let Err(e) = installer.watch_until(shutdown).await {
            tracing::error!(error = %e, "node installer failed");
        }
    })
}

/// Every `interval`, drops the registrations whose netns is gone.
fn spawn_reaper(agent: Arc<Agent>, interval: Duration) {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(interval).await;
            let a = agent.clone();
            match tokio::task::spawn_blocking(move || a.reap_dead()).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "reaping dead registrations"),
                Err(e) => tracing::warn!(error = %e, "reaper task failed"),
            }
            linkerd_cni_memory::trim_if_worthwhile();
        }
    });
}

/// Every `interval`, and at once on SIGHUP, verifies every registered pod and repairs it.
fn spawn_reconciler(
    reconciler: Arc<Reconciler>,
    interval: Duration,
    mut hup: tokio::signal::unix::Signal,
) {
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = hup.recv() => tracing::info!("SIGHUP: verifying every pod now"),
            }
            let r = reconciler.clone();
            if let Err(e) = tokio::task::spawn_blocking(move || r.run_once()).await {
                tracing::warn!(error = %e, "reconcile pass failed");
            }
            // Return what the pass (and the requests since the last one) freed.
            linkerd_cni_memory::trim_if_worthwhile();
        }
    });
}

/// Whether running pods can be adopted on this node: the `iter/tcp` program must be usable.
/// Says why not, once, when it cannot (and what happens to such pods instead: repaired by
/// deletion when `repair` is on).
fn adoption_possible(agent: &Agent, repair: bool) -> bool {
    match agent.adoption_unavailable() {
        None => true,
        Some(reason) if repair => {
            tracing::info!(
                %reason,
                "adoption of running pods in place is off: meshed pods that run without \
                 redirection are repaired by deletion instead"
            );
            false
        }
        Some(reason) => {
            tracing::warn!(
                %reason,
                "adoption of running pods is off: meshed pods that started without \
                 linkerd-cni keep running without redirection until they are recreated"
            );
            false
        }
    }
}

/// Every `interval`, deletes the meshed pods of this node that run without redirection (see
/// [`crate::agent::repair`]), only while the agent is ready.
fn spawn_repairer(
    repairer: Arc<Repairer>,
    source: Arc<Server>,
    adopter: Arc<Adopter>,
    health: Arc<Health>,
    interval: Duration,
) {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(interval).await;
            let ready = health.not_ready().is_none();
            repairer
                .run_once(&source.pods, &adopter.base_config(), ready)
                .await;
        }
    });
}

/// Every `interval`, reports the meshed pods of this node that run without verified
/// redirection (see [`crate::agent::verify`]).
fn spawn_verifier(verifier: Arc<Verifier>, source: Arc<Server>, interval: Duration) {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(interval).await;
            verifier
                .run_once(&source.pods, &source.adopter.base_config())
                .await;
        }
    });
}

/// Every `interval`, adopts the meshed pods of this node that run without redirection.
fn spawn_adopter(adopter: Arc<Adopter>, source: Arc<Server>, interval: Duration) {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(interval).await;
            adopter.run_once(&source.pods).await;
        }
    });
}

/// Why linkerd-cni is to leave this node's CNI configs as the agent stops, or `None` when it
/// stays: only on SIGTERM, and then with `--cleanup-on-sigterm` or when the API says the
/// agent's DaemonSet is being deleted (a rolling update keeps it, so that no pod starts
/// without the plugin before the next agent is up; so does an API that cannot say).
async fn uninstalling(
    sigterm: bool,
    args: &Options,
    client: linkerd_cni_k8s::client::Client,
) -> Option<String> {
    if !sigterm {
        return None;
    }
    if args.cleanup_on_sigterm {
        return Some("--cleanup-on-sigterm".to_string());
    }
    match termination(
        client,
        &args.pod_namespace,
        &args.daemonset,
        TERMINATION_API_BOUND,
    )
    .await
    {
        Termination::Uninstall(why) => Some(why),
        Termination::Rollout => {
            tracing::info!(
                daemonset = %args.daemonset,
                namespace = %args.pod_namespace,
                "the DaemonSet stays (rollout): linkerd-cni stays in the CNI configs, \
                 new pods wait for the next agent"
            );
            None
        }
        Termination::Unknown(why) => {
            tracing::warn!(
                reason = %why,
                "cannot tell a rollout from an uninstall: linkerd-cni stays in the CNI \
                 configs; if the DaemonSet is being removed, run \
                 `linkerd-cni-agent uninstall` on this node (or remove the linkerd-cni \
                 entry from its conflists)"
            );
            None
        }
    }
}

/// The `linkerd` section of the plugin entry the installer writes, parsed as the plugin does
/// (malformed list entries dropped).
fn linkerd_section(installer: &Installer) -> Option<linkerd_cni_proto::config::LinkerdConfig> {
    use serde::Deserialize;
    let bytes = installer.plugin_entry().get("linkerd")?.to_pretty_bytes();
    let mut section: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&bytes).ok()?;
    linkerd_cni_proto::config::drop_malformed_entries(&mut section);
    linkerd_cni_proto::config::LinkerdConfig::deserialize(serde_json::Value::Object(section)).ok()
}
