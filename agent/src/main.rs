//! `linkerd-cni-agent`: the node agent binary: its command line, then one call into the
//! library (`run` is [`linkerd_cni_agent::service::run`]).

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::{Parser, Subcommand};
use linkerd_cni_agent::{
    Agent, AgentConfig,
    agent::Mode,
    dataplane::capacity::MapSizes,
    host::{kernel, peer::PeerPlaces},
    service::{
        self, inspect,
        logs::{self, LogFormat},
        uninstall,
    },
};
use linkerd_cni_common::{kernel::SkLookupVariant, names, paths};

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
    /// Log format: plain (text lines, coloured only on a terminal) or json (one object per
    /// line, the same fields). Records go to standard error.
    #[arg(
        long = "log-format",
        env = "LINKERD_CNI_AGENT_LOG_FORMAT",
        value_enum,
        default_value = "plain",
        global = true
    )]
    log_format: LogFormat,
    /// Where bpffs is (or is to be) mounted.
    #[arg(long, env = "LINKERD_CNI_AGENT_BPFFS", default_value = paths::BPFFS, global = true)]
    bpffs: PathBuf,
    /// The node's bpffs is mounted by the host (or by the DaemonSet's mount-bpffs init
    /// container) and reaches this process by mount propagation: `run` and `load` refuse to
    /// start when no bpffs covers the pin root, instead of mounting one that would be this
    /// container's only.
    #[arg(long, env = "LINKERD_CNI_AGENT_BPFFS_FROM_HOST", global = true)]
    bpffs_from_host: bool,
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
    /// Which `sk_lookup` program to run: `auto` asks the kernel (`ifindex` where the
    /// `sk_lookup` context has `ingress_ifindex`, 5.17+; `address` otherwise, e.g. 5.15), or
    /// force one. Both decide alike; `address` knows the pod's own traffic by its source
    /// address instead of the loopback interface.
    #[arg(long, env = "LINKERD_CNI_AGENT_SK_LOOKUP", default_value = "auto", value_parser = parse_sk_lookup, global = true)]
    sk_lookup: SkLookupChoice,
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
    /// Take linkerd-cni off this node (docs/operating/uninstalling.md): the plugin's conflist entry,
    /// kubeconfig and binary (configured by Linkerd's installer environment variables), then,
    /// once no pod redirected by it runs, every pin (links, maps, programs), the registry and
    /// the socket. Nothing is touched while an agent answers on the socket. Exits 0 once the
    /// node is clean; 3 while an agent runs or redirected pods remain (they keep their
    /// redirection until they end), unless `--wait`.
    Uninstall(UninstallArgs),
}

#[derive(clap::Args)]
struct UninstallArgs {
    /// The agent's registration socket, as `run` was given it (`--state-dir`, `--pin-root`
    /// and `--bpffs` too: where `run` kept its registry and pins).
    #[arg(long, env = "LINKERD_CNI_AGENT_SOCKET", default_value = paths::AGENT_SOCKET)]
    socket: PathBuf,
    /// Where this process sees the host's root (the clean-up DaemonSet's `/host`): the paths
    /// above are checked against other components' trees as the host paths they name.
    #[arg(long, env = "LINKERD_CNI_AGENT_HOST_ROOT")]
    host_root: Option<PathBuf>,
    /// Wait (checking every 2 s) until no agent runs and no redirected pod is left, then
    /// finish.
    #[arg(long, env = "LINKERD_CNI_UNINSTALL_WAIT")]
    wait: bool,
    /// Once the node is clean, keep running until SIGTERM (the clean-up DaemonSet's main
    /// container, so that its pod stays Ready).
    #[arg(long)]
    stay: bool,
    /// Leave the plugin's conflist entry, kubeconfig and binary (the way back to Linkerd's
    /// own plugin, which uses the same type and file names): only our eBPF state goes.
    #[arg(long)]
    keep_plugin: bool,
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
    /// How meshed pods are redirected: `auto` (the kernel probes choose at start: the eBPF
    /// data plane where the kernel has every feature it needs, else the per-node fallback,
    /// naming the missing features), `ebpf` (the eBPF data plane, refused below the floor), or
    /// `iptables` (the fallback: Linkerd's own rules, one nftables table in each meshed pod's
    /// network namespace, written by the plugin over netlink: docs/design/nftables.md; no eBPF
    /// program is loaded).
    #[arg(long, env = "LINKERD_CNI_AGENT_MODE", default_value = "auto", value_parser = parse_mode)]
    mode: ModeFlag,
    /// Cgroup of the shared attachment used for pods without a cgroup v2 of their own
    /// (default: kubelet's kubepods cgroup, `kubepods.slice` or `kubepods`; the cgroup2 root
    /// when there is no single one).
    #[arg(long, env = "LINKERD_CNI_AGENT_SHARED_CGROUP")]
    shared_cgroup: Option<PathBuf>,
    /// Where the host's filesystems are mounted when running in a container (the DaemonSet
    /// mounts them under /host): netns and cgroup paths from the runtime are host paths.
    #[arg(long, env = "LINKERD_CNI_AGENT_HOST_ROOT")]
    host_root: Option<PathBuf>,
    /// Host directories where the container runtime pins pods' network namespaces,
    /// comma-separated: a CNI_NETNS below none of them (nor a /proc/<pid>/ns/net) is refused,
    /// and adoption looks for running pods' namespaces there.
    #[arg(
        long = "netns-dir",
        env = "LINKERD_CNI_AGENT_NETNS_DIRS",
        value_delimiter = ',',
        default_values = paths::NETNS_DIRS
    )]
    netns_dirs: Vec<PathBuf>,
    /// Kubelet's pod cgroup trees, relative to the cgroup2 root, comma-separated: a pod
    /// cgroup (runtimeConfig.cgroupPath or found by pod UID) that is not strictly inside one
    /// of them, or is a QoS cgroup, is refused (`/` allows every cgroup but the root).
    #[arg(
        long = "pod-cgroup-tree",
        env = "LINKERD_CNI_AGENT_POD_CGROUP_TREES",
        value_delimiter = ',',
        default_values = paths::POD_CGROUP_TREES
    )]
    pod_cgroup_trees: Vec<PathBuf>,
    /// Addresses of the /live, /ready and /metrics endpoint, comma-separated. With
    /// `hostNetwork` every address is the node's: the default, loopback, is where kubelet (in
    /// the host's network namespace) probes and where no pod reaches. An IPv6 address is
    /// skipped when the node has no IPv6.
    #[arg(
        long = "health-addr",
        env = "LINKERD_CNI_AGENT_HEALTH_ADDR",
        value_delimiter = ',',
        default_value = "127.0.0.1:9990,[::1]:9990"
    )]
    health_addrs: Vec<SocketAddr>,
    /// Addresses where `/metrics` alone is also served, comma-separated, for a Prometheus that
    /// scrapes the node (e.g. `0.0.0.0:9991`: then anything that reaches the node's addresses
    /// reads the agent's counters). Default: none (`/metrics` only on the health addresses).
    #[arg(
        long = "metrics-addr",
        env = "LINKERD_CNI_AGENT_METRICS_ADDR",
        value_delimiter = ','
    )]
    metrics_addrs: Vec<SocketAddr>,
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
    /// Where running pods cannot be adopted in place (no CAP_SYS_ADMIN, or adoption off),
    /// delete a meshed pod of this node that runs without redirection, so that it is
    /// recreated through the plugin (Linkerd's repair controller; the chart's
    /// `repairController.enabled`). Never hostNetwork, unmeshed or `linkerd-init` pods.
    #[arg(
        long,
        env = "LINKERD_CNI_AGENT_REPAIR_PODS",
        default_value_t = true,
        action = clap::ArgAction::Set
    )]
    repair_pods: bool,
    /// How long a meshed pod must run without a registration, with the agent ready, before it
    /// is repaired; also how long one may run unregistered (or on the shared attachment with
    /// no cgroup found) before an Event reports it.
    #[arg(long, env = "LINKERD_CNI_AGENT_REPAIR_GRACE", default_value = "10s", value_parser = parse_duration)]
    repair_grace: Duration,
    /// How often the Event of a meshed pod that still runs without verified redirection
    /// (`LinkerdCNIUnredirected`) is recorded again, so that one stays in the API (whose
    /// default Event TTL is 1h) for as long as the pod runs so.
    #[arg(long, env = "LINKERD_CNI_AGENT_UNREDIRECTED_EVENT_INTERVAL", default_value = "15m", value_parser = parse_duration)]
    unredirected_event_interval: Duration,
    /// Repairs this node may make at once (its token bucket's size).
    #[arg(long, env = "LINKERD_CNI_AGENT_REPAIR_BURST", default_value_t = 5)]
    repair_burst: u32,
    /// Repairs this node may make per minute once its burst is spent.
    #[arg(
        long,
        env = "LINKERD_CNI_AGENT_REPAIR_PER_MINUTE",
        default_value_t = 30
    )]
    repair_per_minute: u32,
    /// A pod (namespace/name) the agent deleted is not deleted again within this window.
    #[arg(long, env = "LINKERD_CNI_AGENT_REPAIR_WINDOW", default_value = "10m", value_parser = parse_duration)]
    repair_window: Duration,
    /// With --install, always remove linkerd-cni from the CNI configs on SIGTERM. Without it,
    /// SIGTERM asks the API whether the agent's DaemonSet is being deleted (uninstall: remove)
    /// or not (a rolling update: keep, so that no pod starts without the plugin before the
    /// next agent is up); when the API cannot say, the plugin stays. `linkerd-cni-agent
    /// uninstall` removes it by hand. Any other stop (crash, SIGKILL) always leaves the configs.
    #[arg(long, env = "LINKERD_CNI_AGENT_CLEANUP_ON_SIGTERM")]
    cleanup_on_sigterm: bool,
    /// Remove the startup taint (`cni.linkerd.io/agent-not-ready`) from this node once the
    /// agent is ready (what /ready checks), retrying with backoff; never put it back. Needs
    /// `patch` on nodes.
    #[arg(
        long,
        env = "LINKERD_CNI_AGENT_REMOVE_STARTUP_TAINT",
        default_value_t = false,
        action = clap::ArgAction::Set
    )]
    remove_startup_taint: bool,
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

impl RunArgs {
    fn options(self, bpffs: PathBuf) -> service::Options {
        service::Options {
            socket: self.socket,
            kubeconfig: self.kubeconfig,
            node_name: self.node_name,
            bpffs,
            health_addrs: self.health_addrs,
            metrics_addrs: self.metrics_addrs,
            install: self.install,
            reap_interval: self.reap_interval,
            reconcile_interval: self.reconcile_interval,
            adopt_running_pods: self.adopt_running_pods,
            adopt_interval: self.adopt_interval,
            repair_pods: self.repair_pods,
            repair: linkerd_cni_agent::agent::repair::RepairOptions {
                grace: self.repair_grace,
                burst: self.repair_burst,
                per_minute: self.repair_per_minute,
                window: self.repair_window,
            },
            verify: linkerd_cni_agent::agent::verify::VerifyOptions {
                grace: self.repair_grace,
                refresh: self.unredirected_event_interval,
            },
            cleanup_on_sigterm: self.cleanup_on_sigterm,
            remove_startup_taint: self.remove_startup_taint,
            pod_namespace: self.pod_namespace,
            daemonset: self.daemonset,
        }
    }
}

/// `--mode`: `None` is `auto` (chosen by the kernel probes at start).
#[derive(Clone, Copy)]
struct ModeFlag(Option<Mode>);

fn parse_mode(s: &str) -> Result<ModeFlag, String> {
    match s {
        "auto" => Ok(ModeFlag(None)),
        _ => Mode::of_name(s)
            .map(|m| ModeFlag(Some(m)))
            .ok_or_else(|| format!("{s:?}: one of auto, ebpf, iptables")),
    }
}

/// `--sk-lookup`: `None` is `auto`.
#[derive(Clone, Copy)]
struct SkLookupChoice(Option<SkLookupVariant>);

fn parse_sk_lookup(s: &str) -> Result<SkLookupChoice, String> {
    match s {
        "auto" => Ok(SkLookupChoice(None)),
        _ => [SkLookupVariant::Ifindex, SkLookupVariant::Address]
            .into_iter()
            .find(|v| v.flag() == s)
            .map(|v| SkLookupChoice(Some(v)))
            .ok_or_else(|| format!("{s:?}: one of auto, ifindex, address")),
    }
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
static ALLOC: linkerd_cni_memory::heap_profile::Counting =
    linkerd_cni_memory::heap_profile::Counting;

fn main() -> anyhow::Result<()> {
    linkerd_cni_memory::tune_allocator();
    let cli = Cli::parse();
    logs::init(&cli.log, cli.log_format);
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
        bpffs_from_host: cli.bpffs_from_host,
        sk_lookup: cli.sk_lookup.0,
        ..AgentConfig::default()
    };
    // Every command that writes or removes node paths refuses ones inside another
    // component's tree (its files would be at the mercy of our clean-up).
    let socket = match &cli.command {
        Command::Run(args) => Some((args.socket.as_path(), args.host_root.as_deref())),
        Command::Load => Some((std::path::Path::new(paths::AGENT_SOCKET), None)),
        _ => None,
    };
    if let Some((socket, host_root)) = socket {
        paths::check_node_paths(&paths::NodePaths {
            socket,
            state_dir: &cli.state_dir,
            pin_root: &cli.pin_root,
            bpffs: &cli.bpffs,
            host_root,
        })
        .map_err(|e| anyhow::anyhow!("refusing to start: {e}"))?;
    }
    // The commands that pin: neither mounts a bpffs of its own when told the host's is the
    // one (`mount-bpffs` is the command that mounts it). `run` checks once its mode is chosen
    // (`Agent::start`): the fallback pins nothing.
    if cli.bpffs_from_host && matches!(cli.command, Command::Load) {
        kernel::require_bpffs(&cli.pin_root)?;
    }
    match cli.command {
        Command::Inspect => {
            print!("{}", inspect::render(&cli.pin_root, &cli.state_dir)?);
            Ok(())
        }
        Command::MountBpffs => {
            if !kernel::on_bpffs(&cli.bpffs)? {
                kernel::ensure_bpffs_at(&cli.bpffs)?;
                // Ours to unmount at the uninstall, once it holds nothing else.
                std::fs::create_dir(cli.bpffs.join(uninstall::MOUNTED_MARKER))?;
            }
            // A log record, in the format asked for (agent.logFormat), as every other line.
            tracing::info!(bpffs = %cli.bpffs.display(), "bpffs mounted");
            Ok(())
        }
        Command::Uninstall(args) => {
            let installer = match args.keep_plugin {
                true => None,
                false => Some(linkerd_cni_installer::InstallerConfig::from_env()?),
            };
            let opts = uninstall::Options {
                pin_root: cli.pin_root,
                state_dir: cli.state_dir,
                socket: args.socket,
                bpffs: cli.bpffs,
                host_root: args.host_root,
                installer,
            };
            match uninstall::run(&opts, args.wait, args.stay, Duration::from_secs(2))? {
                (uninstall::Outcome::Clean, removal) => {
                    println!("linkerd-cni removed from this node");
                    for line in removal.lines() {
                        println!("  {line}");
                    }
                    Ok(())
                }
                (other, _) => {
                    println!("linkerd-cni not removed yet: {other:?}");
                    std::process::exit(3)
                }
            }
        }
        Command::Load => {
            // The command that loads the programs: the eBPF data plane or nothing.
            let config = AgentConfig {
                mode: Some(Mode::Ebpf),
                ..config
            };
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
                peer: PeerPlaces {
                    netns_dirs: args.netns_dirs.clone(),
                    pod_cgroup_trees: args.pod_cgroup_trees.clone(),
                },
                mode: args.mode.0,
                ..config
            };
            service::run(config, args.options(cli.bpffs))
        }
    }
}
