//! `linkerd-cni-agent`: the node agent binary.

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use anyhow::Context;
use clap::{Parser, Subcommand};
use linkerd_cni_agent::{
    Agent, AgentConfig,
    adopt::Adopter,
    agent::reconcile::Reconciler,
    capacity::MapSizes,
    health::Health,
    inspect,
    server::{self, Server},
};
use linkerd_cni_common::{names, paths};

#[derive(Parser)]
#[command(
    version,
    about = "linkerd-cni node agent: eBPF traffic redirection for meshed pods"
)]
struct Cli {
    /// bpffs directory holding the pinned maps, programs and links.
    #[arg(long, env = "LINKERD_CNI_AGENT_PIN_ROOT", default_value = paths::PIN_ROOT, global = true)]
    pin_root: PathBuf,
    /// Directory of the pod registry.
    #[arg(long, env = "LINKERD_CNI_AGENT_STATE_DIR", default_value = paths::STATE_DIR, global = true)]
    state_dir: PathBuf,
    /// Log filter (tracing syntax: info, debug, linkerd_cni_agent=debug, ...).
    #[arg(
        long = "log-level",
        env = "LINKERD_CNI_AGENT_LOG_LEVEL",
        default_value = "info",
        global = true
    )]
    log: String,
    /// Where bpffs is (or is to be) mounted.
    #[arg(long, env = "LINKERD_CNI_AGENT_BPFFS", default_value = paths::BPFFS, global = true)]
    bpffs: PathBuf,
    /// Pods the node's maps have room for (`l5d_pod_config`, `l5d_pod_stats`; two listener
    /// sockets each in `l5d_listeners`). A start with other sizes than the pinned maps
    /// replaces those maps, carrying their entries over.
    #[arg(long, env = "LINKERD_CNI_AGENT_MAX_PODS", default_value_t = names::MAX_PODS, global = true)]
    max_pods: u32,
    /// Port-set blocks (256 ports each) of every pod's ignored and redirected ports together.
    #[arg(long, env = "LINKERD_CNI_AGENT_MAX_PORT_BLOCKS", default_value_t = names::MAX_PORT_BLOCKS, global = true)]
    max_port_blocks: u32,
    /// Ignored subnets of every pod together, and pod addresses (`l5d_addrs`, `l5d_pod_by_ip`).
    #[arg(long, env = "LINKERD_CNI_AGENT_MAX_ADDRESSES", default_value_t = names::MAX_ADDRS, global = true)]
    max_addresses: u32,
    /// Live redirected connections on the node (`l5d_sock_dst`, `l5d_conn_dst`, LRU).
    #[arg(long, env = "LINKERD_CNI_AGENT_MAX_CONNECTIONS", default_value_t = names::MAX_CONNS, global = true)]
    max_connections: u32,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Load the programs, serve the registration socket, keep registrations in force.
    Run(Box<RunArgs>),
    /// Print every registered pod with its config and live counters.
    Inspect,
    /// Check the kernel, load and pin the programs, then exit.
    Load,
    /// Mount bpffs (if not mounted yet) and exit: the DaemonSet's privileged init step.
    MountBpffs,
    /// Remove linkerd-cni from every CNI config, then the kubeconfig and the plugin binary
    /// (configured by Linkerd's installer environment variables), and exit. `run` keeps the
    /// plugin in the conflists when it stops: this is the uninstall step.
    Uninstall,
}

#[derive(clap::Args)]
struct RunArgs {
    /// Registration socket (root only).
    #[arg(long, env = "LINKERD_CNI_AGENT_SOCKET", default_value = paths::AGENT_SOCKET)]
    socket: PathBuf,
    /// Kubeconfig for the API server; in-cluster configuration when absent.
    #[arg(long, env = "LINKERD_CNI_AGENT_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// This node's name (pods are watched with spec.nodeName=<name>).
    #[arg(long, env = "LINKERD_CNI_AGENT_NODE_NAME")]
    node_name: Option<String>,
    /// Cgroup of the shared attachment used for pods without a cgroup v2 of their own
    /// (default: the cgroup2 root).
    #[arg(long, env = "LINKERD_CNI_AGENT_SHARED_CGROUP")]
    shared_cgroup: Option<PathBuf>,
    /// Where the host's filesystems are mounted when running in a container (the DaemonSet
    /// mounts them under /host): netns and cgroup paths from the runtime are host paths.
    #[arg(long, env = "LINKERD_CNI_AGENT_HOST_ROOT")]
    host_root: Option<PathBuf>,
    /// Address of the /live, /ready and /metrics endpoint. With `hostNetwork` the default
    /// (every address of the node, port 9990) is where kubelet's probes (which go to the pod IP,
    /// the node's IP) and Prometheus reach it, and also anything else on the node's network:
    /// the endpoint only reads, bounds its connections and times idle ones out. To keep it on
    /// the node itself, use 127.0.0.1:9990 and set `host: 127.0.0.1` in the probes.
    #[arg(
        long,
        env = "LINKERD_CNI_AGENT_HEALTH_ADDR",
        default_value = "0.0.0.0:9990"
    )]
    health_addr: SocketAddr,
    /// Also run the node installer (plugin binary, kubeconfig, conflist patching), configured
    /// by Linkerd's installer environment variables.
    #[arg(long, env = "LINKERD_CNI_AGENT_INSTALL")]
    install: bool,
    /// How often registrations whose netns is gone are dropped.
    #[arg(long, env = "LINKERD_CNI_AGENT_REAP_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    reap_interval: Duration,
    /// How often every registered pod's links, map entries and the pins are verified, and
    /// what is missing put back (SIGHUP asks for a pass at once; CNI CHECK repairs its pod).
    #[arg(long, env = "LINKERD_CNI_AGENT_RECONCILE_INTERVAL", default_value = "2s", value_parser = parse_duration)]
    reconcile_interval: Duration,
    /// Attach redirection to meshed pods of this node that run without it because they
    /// started before linkerd-cni was in the CNI chain (found by pod UID in the cgroups, once
    /// their proxy listens), instead of leaving them for a restart.
    #[arg(
        long,
        env = "LINKERD_CNI_AGENT_ADOPT_RUNNING_PODS",
        default_value_t = true,
        action = clap::ArgAction::Set
    )]
    adopt_running_pods: bool,
    /// How often this node's pods are checked for meshed pods running without redirection.
    #[arg(long, env = "LINKERD_CNI_AGENT_ADOPT_INTERVAL", default_value = "5s", value_parser = parse_duration)]
    adopt_interval: Duration,
    /// With --install, always remove linkerd-cni from the CNI configs on SIGTERM. Without it,
    /// SIGTERM asks the API whether the agent's DaemonSet is being deleted (uninstall: remove)
    /// or not (a rolling update: keep, so that no pod starts without the plugin before the
    /// next agent is up); when the API cannot say, the plugin stays. `linkerd-cni-agent
    /// uninstall` removes it by hand. Any other stop (crash, SIGKILL) always leaves the configs.
    #[arg(long, env = "LINKERD_CNI_AGENT_CLEANUP_ON_SIGTERM")]
    cleanup_on_sigterm: bool,
    /// Namespace of the agent's DaemonSet (the downward API's metadata.namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "linkerd-cni")]
    pod_namespace: String,
    /// Name of the agent's DaemonSet, read on SIGTERM.
    #[arg(
        long,
        env = "LINKERD_CNI_AGENT_DAEMONSET",
        default_value = "linkerd-cni"
    )]
    daemonset: String,
}

/// Runtime worker threads (async: the socket, the API watch, the health endpoint).
const RUNTIME_WORKERS: usize = 2;
/// Threads for blocking work (registrations, reaping, reconciling), at most.
const RUNTIME_BLOCKING_THREADS: usize = 8;

/// How long SIGTERM waits for the API to say whether the DaemonSet is being deleted.
const TERMINATION_API_BOUND: Duration = Duration::from_secs(2);

/// glibc's allocator, tuned for a long-running process whose memory is mostly many small
/// long-lived blocks (a record per pod) between short-lived ones:
/// - one arena: glibc gives each thread that allocates an arena of its own (up to eight per
///   core), and the agent's blocking threads (netns work, bpf syscalls) left megabytes of
///   fragmented second arenas behind (10 of 26 MiB at 10,000 pods); the agent's threads
///   rarely allocate at the same time, so one arena costs no measurable contention;
/// - a fixed mmap threshold: by default it rises to the size of the largest block freed, so
///   after one large buffer (a page of a pod list, a response) every later one of that size
///   comes from the heap and leaves a hole there; fixed, large buffers are mapped and
///   unmapped whole.
fn tune_malloc() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only tunes the allocator; called before any thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
    }
}

/// The `linkerd` section of the plugin entry the installer writes, parsed as the plugin does
/// (malformed list entries dropped).
fn linkerd_section(
    installer: &linkerd_cni_installer::Installer,
) -> Option<linkerd_cni_proto::config::LinkerdConfig> {
    use serde::Deserialize;
    let bytes = installer.plugin_entry().get("linkerd")?.to_pretty_bytes();
    let mut section: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&bytes).ok()?;
    linkerd_cni_proto::config::drop_malformed_entries(&mut section);
    linkerd_cni_proto::config::LinkerdConfig::deserialize(serde_json::Value::Object(section)).ok()
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num.parse().map_err(|_| format!("invalid duration {s:?}"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" | "" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        _ => Err(format!("invalid duration unit in {s:?} (ms, s, m)")),
    }
}

#[cfg(feature = "heap-profile")]
#[global_allocator]
static ALLOC: linkerd_cni_agent::heap_profile::Counting = linkerd_cni_agent::heap_profile::Counting;

fn main() -> anyhow::Result<()> {
    tune_malloc();
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(&cli.log))
        .with_writer(std::io::stderr)
        .init();
    let map_sizes = MapSizes {
        pods: cli.max_pods,
        port_blocks: cli.max_port_blocks,
        addrs: cli.max_addresses,
        conns: cli.max_connections,
    };
    map_sizes.validate()?;
    let config = AgentConfig {
        pin_root: cli.pin_root.clone(),
        state_dir: cli.state_dir.clone(),
        map_sizes,
        ..AgentConfig::default()
    };
    match cli.command {
        Command::Inspect => {
            print!("{}", inspect::render(&cli.pin_root, &cli.state_dir)?);
            Ok(())
        }
        Command::MountBpffs => {
            linkerd_cni_agent::kernel::ensure_bpffs_at(&cli.bpffs)?;
            println!("bpffs mounted at {}", cli.bpffs.display());
            Ok(())
        }
        Command::Uninstall => {
            let cfg = linkerd_cni_installer::InstallerConfig::from_env()?;
            linkerd_cni_installer::Installer::new(cfg)?.cleanup()?;
            println!("linkerd-cni removed from the CNI configs");
            Ok(())
        }
        Command::Load => {
            Agent::start(config)?;
            println!(
                "programs loaded and pinned under {}",
                cli.pin_root.display()
            );
            Ok(())
        }
        Command::Run(args) => {
            let config = AgentConfig {
                shared_cgroup: args.shared_cgroup.clone(),
                host_root: args.host_root.clone(),
                ..config
            };
            // A fixed, small runtime whatever the node's core count: the agent's work is a few
            // requests at a time, serialised on its maps anyway, and every thread costs
            // resident memory (stack pages, allocator caches).
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(RUNTIME_WORKERS)
                .max_blocking_threads(RUNTIME_BLOCKING_THREADS)
                .enable_all()
                .build()?
                .block_on(run(config, *args, cli.bpffs))
        }
    }
}

async fn run(config: AgentConfig, args: RunArgs, bpffs: PathBuf) -> anyhow::Result<()> {
    // Before anything serves: SIGHUP's default action would end the agent.
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    let agent = Arc::new(tokio::task::spawn_blocking(move || Agent::start(config)).await??);
    let node = match args.node_name {
        Some(n) => n,
        None => nix::unistd::gethostname()?.to_string_lossy().into_owned(),
    };
    let client = linkerd_cni_k8s::client::client(args.kubeconfig.as_deref()).await?;
    let pods = linkerd_cni_k8s::PodSource::new(client.clone(), node.clone());
    let reconciler = Arc::new(Reconciler::new(agent.clone(), &bpffs));
    let adopter = Arc::new(Adopter::new(agent.clone()));
    let server = Arc::new(Server {
        agent: agent.clone(),
        pods,
        stats: Default::default(),
        reconciler: reconciler.clone(),
        adopter: adopter.clone(),
    });
    #[cfg(feature = "heap-profile")]
    {
        let profiled = server.clone();
        linkerd_cni_agent::heap_profile::spawn_reporter(move || profiled.pods.cached_len());
    }
    let listener =
        server::bind(&args.socket).with_context(|| format!("binding {}", args.socket.display()))?;
    tracing::info!(socket = %args.socket.display(), %node, "registration service listening");

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let installer = if args.install {
        let cfg = linkerd_cni_installer::InstallerConfig::from_env()?;
        Some(linkerd_cni_installer::Installer::new(cfg)?)
    } else {
        None
    };
    // Adoption decides with the conflist's `linkerd` section: the one this agent installs,
    // until an ADD brings the one in force.
    if let Some(section) = installer.as_ref().and_then(linkerd_section) {
        adopter.remember_config(&section);
    }
    // Install and keep the installation until told to stop; the cleanup (if any) is decided
    // below, from why the agent stops.
    let installer_task = installer.clone().map(|i| {
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let shutdown = async move {
                let _ = stop.wait_for(|s| *s).await;
            };
            let first = i.clone();
            match tokio::task::spawn_blocking(move || first.install_once()).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::error!(error = %e, "node installer: first install failed"),
                Err(e) => tracing::error!(error = %e, "node installer: first install panicked"),
            }
            if let Err(e) = i.watch_until(shutdown).await {
                tracing::error!(error = %e, "node installer failed");
            }
        })
    });
    let health = Arc::new(Health {
        server: server.clone(),
        installer: installer.clone(),
        reconciler: reconciler.clone(),
    });
    tokio::spawn(async move {
        if let Err(e) = health.serve(args.health_addr).await {
            tracing::error!(error = %e, "health endpoint failed");
        }
    });
    let reaper = agent.clone();
    let interval = args.reap_interval;
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(interval).await;
            let a = reaper.clone();
            match tokio::task::spawn_blocking(move || a.reap_dead()).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "reaping dead registrations"),
                Err(e) => tracing::warn!(error = %e, "reaper task failed"),
            }
            linkerd_cni_k8s::memory::trim_if_worthwhile();
        }
    });
    let every = args.reconcile_interval;
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = hup.recv() => tracing::info!("SIGHUP: verifying every pod now"),
            }
            let r = reconciler.clone();
            if let Err(e) = tokio::task::spawn_blocking(move || r.run_once()).await {
                tracing::warn!(error = %e, "reconcile pass failed");
            }
            // Return what the pass (and the requests since the last one) freed.
            linkerd_cni_k8s::memory::trim_if_worthwhile();
        }
    });
    let host_proc = match &args.host_root {
        Some(root) => root.join("proc"),
        None => PathBuf::from("/proc"),
    };
    let adopt = args.adopt_running_pods
        && match linkerd_cni_agent::podscan::in_host_pid_namespace(&host_proc) {
            Ok(true) => true,
            Ok(false) => {
                tracing::warn!(
                    "adoption of running pods is off: the agent is not in the host's PID \
                     namespace (run its pod with hostPID: true), so it cannot take a proxy's \
                     listener; meshed pods that started without linkerd-cni keep running \
                     without redirection until they are recreated"
                );
                false
            }
            Err(error) => {
                tracing::warn!(%error, proc = %host_proc.display(), "adoption of running pods is off: cannot compare PID namespaces");
                false
            }
        };
    if adopt {
        let every = args.adopt_interval;
        let source = server.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                adopter.run_once(&source.pods).await;
            }
        });
    }
    let serving = tokio::spawn(server.clone().serve(listener));

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
    if let Some(i) = installer {
        let remove = if !sigterm {
            None
        } else if args.cleanup_on_sigterm {
            Some("--cleanup-on-sigterm".to_string())
        } else {
            use linkerd_cni_k8s::termination::{Termination, termination};
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
        };
        if let Some(why) = remove {
            tracing::info!(reason = %why, "uninstall: removing linkerd-cni from the host");
            tokio::task::spawn_blocking(move || i.cleanup()).await??;
        }
    }
    let _ = std::fs::remove_file(&args.socket);
    Ok(())
}
