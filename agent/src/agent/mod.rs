//! The node agent's core: registering and unregistering pods, checking that a pod's
//! redirection is in force, garbage collection, and adopting what an earlier run left.
//!
//! State lives in three places that must agree: the pinned maps (what the programs act on),
//! the pinned links (where the programs run) and the registry (what the agent remembers).
//! Every operation here updates all three, in an order that never leaves a half-meshed pod.

use std::{
    net::IpAddr,
    os::fd::AsFd,
    path::{Path, PathBuf},
};

pub use linkerd_cni_common::kernel::Mode;
use linkerd_cni_common::{kernel::SkLookupVariant, names, paths};
use linkerd_cni_proto::{config::LinkerdConfig, escape::Escaped, wire::PodRef};
pub use linkerd_cni_sys::probe::Choice as ModeChoice;

use crate::{
    agent::registry::{Attachment, CgroupSeen, PodRecord, Registry},
    dataplane::capacity::MapSizes,
    dataplane::limits,
    dataplane::limits::LimitError,
    dataplane::maps::{Maps, MapsError, PodEntries},
    dataplane::maps_lock::MapsLock,
    dataplane::{
        self, Dataplane, DataplaneError,
        order::{self, Conflict, Ours},
    },
    host::capabilities,
    host::cgroup,
    host::kernel,
    host::netns::{self, Netns, NetnsError},
    host::peer::{self, PeerError, PeerNetns, PeerPlaces},
    host::podnetns,
    host::rtnl,
    host::userns::{self, UsernsError},
};

pub mod adopt;
pub mod reconcile;
pub mod registry;
pub mod repair;
pub mod verify;

/// Where the agent keeps its state.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// bpffs directory for maps, programs and links.
    pub pin_root: PathBuf,
    /// Registry directory.
    pub state_dir: PathBuf,
    /// Cgroup for the shared (fallback) attachment; default: kubelet's kubepods cgroup
    /// (`kubepods.slice` or `kubepods` under the cgroup2 root), the root when there is no
    /// single one.
    pub shared_cgroup: Option<PathBuf>,
    /// Where the host's filesystems are mounted when the agent runs in a container (`/host`
    /// in the DaemonSet): netns and cgroup paths sent by the runtime are host paths.
    pub host_root: Option<PathBuf>,
    /// Capacities of the node-wide maps.
    pub map_sizes: MapSizes,
    /// The node's bpffs comes from the host (`--bpffs-from-host`): the reconciler never mounts
    /// one of its own when the pins go missing, it waits (unready) for the host's to be back.
    pub bpffs_from_host: bool,
    /// Where the netns and cgroup paths a peer of the socket sends may lead (the runtime's
    /// netns directories, which adoption also searches, and kubelet's pod cgroup trees).
    pub peer: PeerPlaces,
    /// The `sk_lookup` program forced (`--sk-lookup`); `None`: chosen by the kernel probes.
    pub sk_lookup: Option<SkLookupVariant>,
    /// How meshed pods are redirected on this node (`--mode`); `None` (`auto`): chosen by the
    /// kernel probes at start ([`ModeChoice`]).
    pub mode: Option<Mode>,
}

/// Why a pod of the per-node fallback is redirected, in words.
pub const RULES_REASON: &str =
    "redirected by Linkerd's rules (nftables table inet linkerd in the pod's network namespace)";

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            pin_root: paths::PIN_ROOT.into(),
            state_dir: paths::STATE_DIR.into(),
            shared_cgroup: None,
            host_root: None,
            map_sizes: MapSizes::default(),
            bpffs_from_host: false,
            peer: PeerPlaces::default(),
            sk_lookup: None,
            mode: None,
        }
    }
}

/// What to register.
#[derive(Clone, Debug)]
pub struct Registration {
    /// `CNI_CONTAINERID`: the registration's identity.
    pub id: String,
    pub ifname: String,
    /// The pod's network namespace.
    pub netns: PathBuf,
    /// The runtime's cgroup hint (`runtimeConfig.cgroupPath`), absolute or relative to the
    /// cgroup2 root.
    pub cgroup_hint: Option<String>,
    pub pod: Option<PodRef>,
    pub config: LinkerdConfig,
    /// Addresses known from the runtime; the netns's own addresses are added.
    pub pod_ips: Vec<IpAddr>,
}

/// Who names a registration's paths.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    /// The agent itself (adoption, tests driving the library): trusted.
    Agent,
    /// A peer of the registration socket: checked ([`peer`]).
    Peer,
}

/// Why an agent operation failed.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The agent lacks a capability it needs (named, with what needs it).
    #[error(transparent)]
    Capabilities(#[from] capabilities::MissingCapabilities),
    /// The pod's network namespace is missing or not a netns.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// Loading or attaching the programs failed.
    #[error(transparent)]
    Dataplane(#[from] DataplaneError),
    /// The maps refused an update.
    #[error(transparent)]
    Maps(#[from] MapsError),
    /// The registry could not be read or written.
    #[error("registry: {0}")]
    Registry(#[from] std::io::Error),
    /// A registration's cgroup, opened again, is not where or what it was.
    #[error(transparent)]
    Cgroup(#[from] cgroup::CgroupError),
    /// The pod's configuration needs more map entries than one pod may have.
    #[error("pod configuration refused: {0}")]
    Limit(#[from] LimitError),
    /// A peer's netns or cgroup path leads outside the places runtimes and kubelet use.
    #[error("refused: {0}")]
    Peer(#[from] PeerError),
    /// The pod's user namespace could not be read, or does not map the proxy's IDs.
    #[error(transparent)]
    Userns(#[from] UsernsError),
    /// CHECK: the redirection decided at ADD is not in force.
    #[error("redirection of {id} is not in force: {why}")]
    NotInForce { id: String, why: String },
    /// Another tenant's program runs before ours for the pod, or ours would keep it from
    /// running ([`order`]): the pod is not meshed.
    #[error("{id} cannot be meshed: {conflict}")]
    Order { id: String, conflict: Box<Conflict> },
    /// The node runs the per-node fallback ([`Mode::Iptables`]): no eBPF program is loaded,
    /// so nothing can be attached or written to a map (the mode's reason).
    #[error("no eBPF data plane on this node: it runs the per-node fallback ({0})")]
    NoDataplane(String),
    /// CHECK: nothing is registered under this id.
    #[error("no registration for container {0}")]
    UnknownContainer(String),
    /// No slot of blocking work came free in time (the service bounds the work peers'
    /// requests hold at once): retry later.
    #[error(
        "the agent is busy: no slot of blocking work came free within {}s (at most {max} at once)",
        waited.as_secs()
    )]
    Busy {
        waited: std::time::Duration,
        max: usize,
    },
}

/// The node agent.
pub struct Agent {
    config: AgentConfig,
    /// The mode this node runs and why, chosen at start.
    choice: ModeChoice,
    /// The loaded programs: in [`Mode::Ebpf`] only. The per-node fallback loads, pins and
    /// attaches nothing; every operation that needs programs says so
    /// ([`AgentError::NoDataplane`]) and every other one works without them.
    dataplane: Option<Dataplane>,
    registry: Registry,
    /// Serialises updates: maps, links and registry change together. The maps are open in
    /// [`Mode::Ebpf`], and in the fallback only where an earlier eBPF agent left them pinned
    /// (its pods' DEL takes their entries out).
    maps: MapsLock<Option<Maps>>,
    /// The cgroup2 root the pods' cgroups are found under.
    cgroup_root: PathBuf,
    shared_cgroup: PathBuf,
    /// The runtime's pinned network namespaces by address, for adoption (kept across passes).
    netns_index: std::sync::Mutex<podnetns::NetnsIndex>,
}

impl Agent {
    /// Loads the programs (reusing pinned maps) and opens the registry. Pods registered by an
    /// earlier run are adopted as they are: their links and map entries were never touched.
    ///
    /// A redirected pod whose record holds a configuration over the per-pod limits a fresh
    /// ADD is held to (an earlier agent accepted it before those limits) keeps the
    /// redirection that agent gave it until the pod ends: its entries are migrated as they
    /// are when a layout migration replaces its maps, its links are switched like every
    /// other pod's, and one warning per such pod names the limit. Its map space is already
    /// held, and refusing it here would run a working meshed pod with its traffic past the
    /// proxy until it is recreated. Only a new ADD with that configuration is refused
    /// ([`Self::register`]).
    pub fn start(config: AgentConfig) -> Result<Self, AgentError> {
        capabilities::check()?;
        // The mode: `--mode`, or the kernel's answers (`auto`). Below the floor in `auto`,
        // the fallback, with the missing features as the reason; `--mode=ebpf` there is
        // refused naming them.
        let findings = kernel::Findings::probe();
        let choice = findings
            .choose(config.mode)
            .map_err(|why| DataplaneError::Kernel(kernel::KernelUnfit(why)))?;
        let registry = Registry::open(&config.state_dir)?;
        let (dataplane, maps) = match choice.mode {
            Mode::Ebpf => {
                let (dataplane, maps) = Self::load_dataplane(&config, &registry, &findings)?;
                (Some(dataplane), Some(maps))
            }
            Mode::Iptables => (None, leftover_maps(&config.pin_root)),
        };
        let cgroup_root = match (
            kernel::cgroup2_mount(config.host_root.as_deref()),
            &dataplane,
        ) {
            (Ok(root), _) => root,
            (Err(e), Some(_)) => return Err(e.into()),
            // The fallback attaches nothing to cgroups: where none is mounted, the path cgroup
            // v2 would have is only looked in (and found empty).
            (Err(e), None) => {
                let root = config.host_root.as_deref().unwrap_or(Path::new("/"));
                let guess = root.join("sys/fs/cgroup");
                tracing::warn!(error = %e, cgroup_root = %guess.display(), "no cgroup2 filesystem: the per-node fallback does without");
                guess
            }
        };
        // The lowest cgroup that holds every pod: below the cgroup2 root, where other
        // tenants' socket load balancers attach, so that ours run before theirs.
        let shared_cgroup = match &config.shared_cgroup {
            Some(c) => c.clone(),
            None => cgroup::kubepods(&cgroup_root).unwrap_or_else(|| {
                if dataplane.is_some() {
                    tracing::warn!(
                        root = %cgroup_root.display(),
                        "no single kubepods cgroup (kubepods.slice or kubepods) under the \
                         cgroup2 root: the shared attachment goes on the root, after any \
                         program already there unless the kernel orders cgroup links"
                    );
                }
                cgroup_root.clone()
            }),
        };
        let mut agent = Self {
            config,
            choice,
            dataplane,
            registry,
            maps: MapsLock::new(maps),
            cgroup_root,
            shared_cgroup,
            netns_index: Default::default(),
        };
        let dirs = podnetns::runtime_dirs(&agent.config.peer.netns_dirs, |p| agent.host_path(p));
        agent.netns_index = std::sync::Mutex::new(podnetns::NetnsIndex::new(dirs));
        agent.check_recorded_cgroups();
        agent.attach_added_programs();
        agent.record_mode();
        let registered = agent.registry.len();
        let (mode, forced, reason) = (
            agent.choice.mode.name(),
            agent.choice.forced,
            agent.choice.reason.as_str(),
        );
        match &agent.dataplane {
            Some(_) => {
                tracing::info!(mode, forced, %reason, pods = registered, pin_root = %agent.config.pin_root.display(), "data plane loaded")
            }
            None => tracing::info!(
                mode,
                forced,
                %reason,
                pods = registered,
                "per-node fallback: no eBPF program loaded; meshed pods get Linkerd's rules from \
                 the plugin at ADD"
            ),
        }
        Ok(agent)
    }

    /// The eBPF side of [`Self::start`]: loads the programs (reusing pinned maps, migrating
    /// registered pods' entries when a layout change replaces them), then opens the maps.
    fn load_dataplane(
        config: &AgentConfig,
        registry: &Registry,
        findings: &kernel::Findings,
    ) -> Result<(Dataplane, Maps), AgentError> {
        // A bpffs mounted here would be this container's only: the host's must be there.
        if config.bpffs_from_host {
            kernel::require_bpffs(&config.pin_root).map_err(DataplaneError::NoHostBpffs)?;
        }
        // Redirected pods, for maps a layout migration replaces (the registry is the source of
        // truth for per-pod config), each with the entries its registration wrote, within
        // today's per-pod limits or not.
        let mut pods = Vec::new();
        for r in registry.all()?.into_iter().filter(PodRecord::redirected) {
            let entries = match entries_within_limits(&r) {
                Ok(entries) => entries,
                Err(why) => {
                    warn_over_limits(&r, &why);
                    entries_of(&r)
                }
            };
            let dir = pod_link_dir(&config.pin_root, &r.id);
            pods.push((dir, r.netns_cookie, entries));
        }
        let dataplane = Dataplane::load_probed(
            &config.pin_root,
            &config.map_sizes,
            config.sk_lookup,
            findings,
        )?;
        dataplane.finish_load(&pods)?;
        drop(pods);
        let maps = Maps::open(&config.pin_root.join(paths::PIN_MAPS))?;
        Ok((dataplane, maps))
    }

    /// Writes the mode and its reason where `inspect` and `linkerd check --node` read them
    /// ([`paths::MODE_FILE`] in the state directory); a failure is logged (the agent serves
    /// either way).
    fn record_mode(&self) {
        let path = self.config.state_dir.join(paths::MODE_FILE);
        let tmp = path.with_extension("tmp");
        let written =
            std::fs::write(&tmp, self.choice.render()).and_then(|()| std::fs::rename(&tmp, &path));
        if let Err(e) = written {
            tracing::warn!(path = %path.display(), error = %e, "recording the mode for inspect and check --node");
        }
    }

    /// The mode this node runs, and why.
    pub fn mode_choice(&self) -> &ModeChoice {
        &self.choice
    }

    /// The loaded programs, or why there are none (the fallback).
    fn dataplane(&self) -> Result<&Dataplane, AgentError> {
        self.dataplane
            .as_ref()
            .ok_or_else(|| AgentError::NoDataplane(self.choice.reason.clone()))
    }

    /// Records of earlier agents name their pod's cgroup by the path as it was sent, which may
    /// have gone through a symbolic link or `..`: each is opened again as every later open
    /// will be ([`cgroup::open_recorded`]: beneath the cgroup2 root, through no symbolic
    /// link). One that opens has its inode recorded, so later opens must find that cgroup
    /// again; one that does not is reported, and its links are never re-made.
    fn check_recorded_cgroups(&self) {
        let unchecked = self
            .registry
            .map_each(|r| match (&r.attachment, r.cgroup_seen) {
                (Attachment::PerPod { cgroup }, None) => Some((r.id.clone(), cgroup.clone())),
                _ => None,
            });
        for (id, path) in unchecked.into_iter().flatten() {
            match cgroup::open_recorded(&self.cgroup_root, &path, None, None) {
                Ok(opened) => {
                    let Ok(Some(mut record)) = self.registry.get(&id) else {
                        continue;
                    };
                    record.cgroup_seen = Some(CgroupSeen {
                        ino: opened.ino,
                        peer: false,
                    });
                    if let Err(e) = self.registry.put(&record) {
                        tracing::warn!(id = %Escaped(&id), error = %e, "recording a registration's cgroup inode");
                    }
                }
                Err(e) => tracing::error!(
                    id = %Escaped(&id),
                    error = %e,
                    "a registration an earlier agent made names its cgroup by a path that does \
                     not lead there plainly: its cgroup links are not re-made"
                ),
            }
        }
    }

    /// The maps, for an ADD, a DEL or anything a caller waits for.
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Maps>> {
        self.maps.lock()
    }

    /// The maps, for a background pass (reconcile, adoption): after any waiting ADD or DEL.
    fn lock_background(&self) -> std::sync::MutexGuard<'_, Option<Maps>> {
        self.maps.lock_background()
    }

    /// The maps behind `guard`, or why there are none (the fallback).
    fn maps_in<'g>(&self, guard: &'g mut Option<Maps>) -> Result<&'g mut Maps, AgentError> {
        guard
            .as_mut()
            .ok_or_else(|| AgentError::NoDataplane(self.choice.reason.clone()))
    }

    fn pod_link_dir(&self, id: &str) -> PathBuf {
        pod_link_dir(&self.config.pin_root, id)
    }

    fn shared_link_dir(&self) -> PathBuf {
        self.config.pin_root.join(paths::PIN_SHARED)
    }

    /// A host path as this process sees it.
    fn host_path(&self, path: &Path) -> PathBuf {
        match &self.config.host_root {
            Some(root) => root.join(path.strip_prefix("/").unwrap_or(path)),
            None => path.into(),
        }
    }

    /// Meshes a pod: map entries, then the attachment, then the record.
    ///
    /// Re-registering an id (a runtime retrying ADD) with the same netns updates the pod in
    /// place: its map entries are rewritten without ever being absent, its links are kept
    /// (re-made only if they are no longer in force or the cgroup changed), and what the
    /// programs recorded themselves (the proxy's inbound listener, live connections,
    /// counters) is kept. With another netns, the earlier registration is removed first.
    ///
    /// A configuration over a per-pod limit ([`limits`]) is refused before anything is
    /// written, and a failed write is rolled back: a failed registration leaves no entries.
    pub fn register(&self, reg: Registration) -> Result<PodRecord, AgentError> {
        self.register_from(reg, Origin::Agent, None)
    }

    /// [`Self::register`] for a request from a peer of the socket: its netns and cgroup
    /// must lead where runtimes and kubelet put pods ([`peer`]), or it is refused before
    /// anything is written. `inside` is what the plugin passed from inside the netns: the
    /// cookie is read from its socket, nothing enters the namespace (without it, the agent
    /// enters it, which needs `CAP_SYS_ADMIN`).
    pub fn register_from_peer(
        &self,
        reg: Registration,
        inside: Option<PeerNetns>,
    ) -> Result<PodRecord, AgentError> {
        self.register_from(reg, Origin::Peer, inside)
    }

    /// The netns's cookie and addresses: from the plugin's socket when it passed one, else
    /// read inside the namespace.
    fn cookie_and_addresses(
        &self,
        ns: &Netns,
        origin: Origin,
        inside: Option<&PeerNetns>,
    ) -> Result<(u64, Vec<IpAddr>), AgentError> {
        match (inside, origin) {
            (Some(p), _) => {
                let cookie = p.cookie_of(ns)?;
                Ok((cookie, self.verified_addresses(ns, cookie, p)))
            }
            (None, Origin::Agent) => Ok(ns.cookie_and_addresses()?),
            (None, Origin::Peer) => ns.cookie_and_addresses().map_err(|e| match e {
                NetnsError::Io { source, .. } if source.raw_os_error() == Some(libc::EPERM) => {
                    PeerError::NoSocket {
                        path: ns.path.display().to_string(),
                    }
                    .into()
                }
                e => e.into(),
            }),
        }
    }

    /// The addresses a peer sent as the netns's own (`netns_addrs`), less those it cannot
    /// hold, each of which is ignored and logged: any not among the netns's own addresses,
    /// read by the agent itself: from the route netlink socket the plugin made inside the
    /// netns (its `RTM_GETADDR` dump answers for that namespace; the socket is already shown to
    /// be the netns's), else, for an older plugin's Unix socket, by entering the netns where
    /// the agent holds `CAP_SYS_ADMIN`; and, always, any that another registration of a live
    /// network namespace holds (a peer's claim must not displace another pod's
    /// `l5d_pod_by_ip` entry). Where the netns's addresses cannot be read (an older plugin and
    /// no `CAP_SYS_ADMIN`), only the second check applies.
    fn verified_addresses(&self, ns: &Netns, cookie: u64, peer: &PeerNetns) -> Vec<IpAddr> {
        let sent = &peer.addrs;
        if sent.is_empty() {
            return Vec::new();
        }
        const CAP_SYS_ADMIN: u32 = 21;
        let own = if rtnl::is_route_socket(peer.socket.as_fd()) {
            match rtnl::addresses(peer.socket.as_fd()) {
                Ok(addrs) => Some(addrs),
                Err(e) => {
                    // Nothing the peer claims can be shown to be the netns's: none is kept.
                    tracing::warn!(netns = %ns.path.display(), error = %e, "the netns's addresses could not be read from the plugin's socket: the addresses it sent are ignored");
                    Some(Vec::new())
                }
            }
        } else {
            capabilities::effective()
                .is_ok_and(|set| set & (1 << CAP_SYS_ADMIN) != 0)
                .then(|| ns.cookie_and_addresses().ok())
                .flatten()
                .filter(|(c, _)| *c == cookie)
                .map(|(_, addrs)| addrs)
        };
        let held_elsewhere = |ip: &IpAddr| {
            let others = self.registry.map_each(|r| {
                (r.netns_cookie != cookie && r.redirected() && r.pod_ips.contains(ip))
                    .then(|| (r.id.clone(), r.netns.clone(), r.netns_ino))
            });
            others
                .into_iter()
                .flatten()
                .find(|(_, path, ino)| netns::still_exists(path, *ino))
                .map(|(id, _, _)| id)
        };
        let mut kept = Vec::with_capacity(sent.len());
        for ip in sent {
            if let Some(own) = &own
                && !own.contains(ip)
            {
                tracing::warn!(%ip, netns = %ns.path.display(), "an address the peer sent as the netns's own is not among its addresses: ignored");
                continue;
            }
            if let Some(other) = held_elsewhere(ip) {
                tracing::warn!(%ip, netns = %ns.path.display(), holder = %Escaped(&other), "an address the peer sent as the netns's own belongs to another registered pod: ignored");
                continue;
            }
            kept.push(*ip);
        }
        kept
    }

    /// Opens the netns `reg` names (a host path), checked as [`peer`] says when a peer sent
    /// it; `reg.netns` becomes the path as this process sees it.
    fn open_netns(&self, reg: &mut Registration, origin: Origin) -> Result<Netns, AgentError> {
        let host = |p: &Path| self.host_path(p);
        let ns = match origin {
            // A netns that is gone or not one stays what it is (the runtime's "unknown
            // container"), whoever named it.
            Origin::Peer => match peer::open_netns(&reg.netns, &self.config.peer, host) {
                Err(PeerError::Netns(e)) => return Err(e.into()),
                opened => opened?,
            },
            Origin::Agent => Netns::open(&host(&reg.netns))?,
        };
        reg.netns = ns.path.clone();
        Ok(ns)
    }

    fn register_from(
        &self,
        mut reg: Registration,
        origin: Origin,
        inside: Option<PeerNetns>,
    ) -> Result<PodRecord, AgentError> {
        let id = reg.id.clone();
        let mut phases = Phases::new("add", &id);
        // No programs (the fallback): refused before anything is done.
        self.dataplane()?;
        // Lists longer than a pod may have are refused before any work is done for them.
        limits::check_config(&reg.config)?;
        let ns = self.open_netns(&mut reg, origin)?;
        let (netns_cookie, addresses) = self.cookie_and_addresses(&ns, origin, inside.as_ref())?;
        phases.mark("netns");
        let mut pod_ips = reg.pod_ips.clone();
        for ip in addresses {
            if !pod_ips.contains(&ip) {
                pod_ips.push(ip);
            }
        }
        // An absolute hint is a host path; a relative one is relative to the cgroup2 root.
        let hint = reg
            .cgroup_hint
            .as_deref()
            .map(|h| match Path::new(h).is_absolute() {
                true if !Path::new(h).starts_with(&self.cgroup_root) => {
                    self.host_path(Path::new(h)).display().to_string()
                }
                _ => h.to_string(),
            });
        let cgroup = cgroup::resolve(
            &self.cgroup_root,
            hint.as_deref(),
            reg.pod.as_ref().and_then(|p| p.uid.as_deref()),
        );
        // No cgroup yet (the shared attachment): the hint is kept, to find the pod's cgroup
        // once it exists and verify that the shared attachment covers it.
        let cgroup_hint = match cgroup {
            None => hint.filter(|h| !h.is_empty()),
            Some(_) => None,
        };
        // Resolved once (symbolic links, `..`), checked where a peer named it: the record
        // keeps the resolved path and the inode, and every later open must find them again.
        let (cgroup, cgroup_seen) = match cgroup {
            Some(found) => {
                let peer = origin == Origin::Peer;
                let resolved = match peer {
                    true => peer::check_pod_cgroup(
                        &self.cgroup_root,
                        &self.config.peer.pod_cgroup_trees,
                        &found,
                    )?,
                    false => cgroup::resolved_below(&self.cgroup_root, &found)
                        .map(|rel| self.cgroup_root.join(rel))
                        .unwrap_or(found),
                };
                let trees = peer.then_some(self.config.peer.pod_cgroup_trees.as_slice());
                let opened = cgroup::open_recorded(&self.cgroup_root, &resolved, trees, None)?;
                let seen = CgroupSeen {
                    ino: opened.ino,
                    peer,
                };
                (Some(resolved), Some(seen))
            }
            None => (None, None),
        };
        phases.mark("cgroup");
        let host_ids = userns::host_ids(
            ns.file(),
            reg.config.proxy_uid(),
            reg.config.proxy_gid(),
            inside.as_ref().and_then(|i| i.userns.as_ref()),
        )?;
        phases.mark("userns");
        let entries =
            PodEntries::new(netns_cookie, &reg.config, &pod_ips).with_host_ids(host_ids.as_ref());
        limits::check(&entries)?;
        let record = PodRecord {
            id: reg.id,
            ifname: reg.ifname.into(),
            netns: reg.netns,
            netns_ino: ns.ino,
            netns_cookie,
            pod: reg.pod,
            attachment: Attachment::None,
            reason: "".into(),
            config: reg.config.into(),
            pod_ips,
            host_ids,
            refused: false,
            cgroup_seen,
            rules: false,
            cgroup_hint,
        };

        let mut guard = self.lock();
        let maps = self.maps_in(&mut guard)?;
        phases.mark("lock");
        match self.registry.get(&record.id)? {
            Some(old) if old.redirected() && old.netns_cookie == netns_cookie => {
                return self.update_in_place(maps, old, record, &ns, cgroup, &entries);
            }
            Some(old) => self.unregister_locked(Some(&mut *maps), &old)?,
            None => {}
        }
        // Links left by a crash between steps of an earlier registration of this id.
        let _ = dataplane::detach(&self.pod_link_dir(&record.id));
        phases.mark("leftovers");
        maps.write_pod(netns_cookie, &entries)?;
        phases.mark("maps");
        let result = self.attach_and_record(maps, record, &ns, cgroup, &entries, &mut phases);
        phases.done();
        result
    }

    /// The last steps of a registration whose entries are written: attach (cgroup and netns
    /// links), then the record. On failure, the links and `entries` are removed again.
    fn attach_and_record(
        &self,
        maps: &mut Maps,
        mut record: PodRecord,
        ns: &Netns,
        cgroup: Option<PathBuf>,
        entries: &PodEntries,
        phases: &mut Phases<'_>,
    ) -> Result<PodRecord, AgentError> {
        let attached = self.attach(&record, cgroup).and_then(|a| {
            phases.mark("attach_cgroup");
            // Inbound: the netns link lives with the pod's links whatever the cgroup mode.
            self.dataplane()?.attach_netns_marked(
                ns.file(),
                record.netns_cookie,
                &self.pod_link_dir(&record.id),
                &mut |step| phases.mark(step),
            )?;
            Ok(a)
        });
        // Never assumed: ours run first and switch no other tenant off, or the pod is refused
        // (fail closed: a pod whose proxy may see rewritten destinations is worse than none).
        let attached = attached.and_then(|a| {
            record.attachment = a;
            let checked = self.check_order(&record);
            phases.mark("order");
            checked.map_err(|conflict| AgentError::Order {
                id: record.id.clone(),
                conflict: Box::new(conflict),
            })
        });
        match attached {
            Ok(()) => {}
            Err(e) => {
                let _ = dataplane::detach(&self.pod_link_dir(&record.id));
                let _ = self.release_entries(maps, &record.id, record.netns_cookie, entries);
                let _ = self.registry.remove(&record.id);
                return Err(e);
            }
        }
        record.reason = record.attachment.describe().into();
        if let Err(e) = self.registry.put(&record) {
            let _ = self.unregister_locked(Some(maps), &record);
            return Err(e.into());
        }
        phases.mark("registry");
        tracing::info!(id = %record.id, netns_cookie = record.netns_cookie, reason = %Escaped(&record.reason), cgroup = ?record.attachment.cgroup(), "pod registered");
        Ok(record)
    }

    /// Takes out of the maps what registration `id` wrote (`entries`, under `cookie`), and
    /// only that: when another redirected registration has the same netns cookie (the same
    /// netns registered under two ids), its entries are written back in place instead
    /// (entries only `id` had are removed, the netns's config stays), so neither a DEL nor
    /// the rollback of a refused ADD un-meshes another pod. Constant time unless the cookie
    /// is shared (a count kept by the registry).
    fn release_entries(
        &self,
        maps: &mut Maps,
        id: &str,
        cookie: u64,
        entries: &PodEntries,
    ) -> Result<(), MapsError> {
        match self
            .registry
            .other_redirected_record_with_cookie(id, cookie)
        {
            Some(other) => maps.update_pod(cookie, Some(entries), &entries_of(&other)),
            None => maps.remove_pod(cookie, entries).map(drop),
        }
    }

    /// A repeated registration of the same pod (same id, same netns): see [`Self::register`].
    fn update_in_place(
        &self,
        maps: &mut Maps,
        old: PodRecord,
        mut record: PodRecord,
        ns: &Netns,
        cgroup: Option<PathBuf>,
        entries: &PodEntries,
    ) -> Result<PodRecord, AgentError> {
        let old_entries = entries_of(&old);
        maps.update_pod(record.netns_cookie, Some(&old_entries), entries)?;
        let wanted = match &cgroup {
            Some(cgroup) => Attachment::PerPod {
                cgroup: cgroup.clone(),
            },
            None => Attachment::Shared {
                cgroup: self.shared_cgroup.clone(),
            },
        };
        let in_force = self
            .links_of(&old)
            .into_iter()
            .all(|(dir, programs)| dataplane::links_in_force(&dir, programs).is_ok());
        if wanted != old.attachment || !in_force {
            // Repair or move: the only case where the links are re-made.
            tracing::info!(id = %record.id, in_force, "re-ADD: re-attaching");
            dataplane::detach(&self.pod_link_dir(&record.id)).map_err(|source| {
                DataplaneError::Pin {
                    path: self.pod_link_dir(&record.id),
                    source,
                }
            })?;
            let mut phases = Phases::new("re-add", &old.id);
            return self.attach_and_record(maps, record, ns, cgroup, entries, &mut phases);
        }
        record.attachment = old.attachment.clone();
        record.reason = record.attachment.describe().into();
        if let Err(e) = self.registry.put(&record) {
            // Back to what the kept record describes.
            let _ = maps.update_pod(record.netns_cookie, Some(entries), &old_entries);
            return Err(e.into());
        }
        tracing::info!(id = %record.id, netns_cookie = record.netns_cookie, "pod registered again: updated in place");
        Ok(record)
    }

    /// Records a pod that is not redirected (so DEL and CHECK know about it) without touching
    /// the data plane.
    pub fn record_unredirected(
        &self,
        reg: Registration,
        reason: String,
    ) -> Result<PodRecord, AgentError> {
        self.record_unredirected_from(reg, reason, Origin::Agent, None, false)
    }

    /// [`Self::record_unredirected`] for a request from a peer of the socket (its netns
    /// checked as for [`Self::register_from_peer`]).
    pub fn record_unredirected_from_peer(
        &self,
        reg: Registration,
        reason: String,
        inside: Option<PeerNetns>,
    ) -> Result<PodRecord, AgentError> {
        self.record_unredirected_from(reg, reason, Origin::Peer, inside, false)
    }

    /// Records a pod meshed in the per-node fallback ([`Mode::Iptables`]): no programs, the
    /// plugin writes Linkerd's rules for `reg.config` in its netns (checked as for
    /// [`Self::register_from_peer`]). A registration of the same id in eBPF mode is undone.
    pub fn record_rules_from_peer(
        &self,
        reg: Registration,
        inside: Option<PeerNetns>,
    ) -> Result<PodRecord, AgentError> {
        let reason = RULES_REASON.to_string();
        self.record_unredirected_from(reg, reason, Origin::Peer, inside, true)
    }

    /// The mode meshed pods are redirected in (`--mode`).
    pub fn mode(&self) -> Mode {
        self.choice.mode
    }

    fn record_unredirected_from(
        &self,
        mut reg: Registration,
        reason: String,
        origin: Origin,
        inside: Option<PeerNetns>,
        rules: bool,
    ) -> Result<PodRecord, AgentError> {
        let ns = self.open_netns(&mut reg, origin)?;
        let netns_ino = ns.ino;
        // The cookie keys the eBPF maps: the fallback has none to key, and a kernel below the
        // floor may not say it (`SO_NETNS_COOKIE`, 5.14): 0. The plugin's socket must still be
        // inside the netns it names.
        let netns_cookie = match (&inside, &self.dataplane) {
            (Some(p), Some(_)) => p.cookie_of(&ns)?,
            (None, Some(_)) => self.cookie_and_addresses(&ns, origin, None)?.0,
            (Some(p), None) => {
                p.check_inside(&ns)?;
                0
            }
            (None, None) => 0,
        };
        let mut maps = self.lock();
        if let Some(old) = self.registry.get(&reg.id)? {
            self.unregister_locked(maps.as_mut(), &old)?;
        }
        let record = PodRecord {
            id: reg.id,
            ifname: reg.ifname.into(),
            netns: reg.netns,
            netns_ino,
            netns_cookie,
            pod: reg.pod,
            attachment: Attachment::None,
            reason: reason.into(),
            config: reg.config.into(),
            pod_ips: reg.pod_ips,
            host_ids: None,
            refused: false,
            cgroup_seen: None,
            rules,
            cgroup_hint: None,
        };
        self.registry.put(&record)?;
        Ok(record)
    }

    /// Opens registration `record`'s own cgroup `path` again, as
    /// [`cgroup::open_recorded`] says: the same inode as found at registration, through no
    /// symbolic link, inside the pods' trees when a peer named it. A record without what was
    /// found (an earlier agent's, which [`Self::start`] could not check) is opened the same
    /// way, without the inode.
    pub(crate) fn open_pod_cgroup(
        &self,
        path: &Path,
        record: &PodRecord,
    ) -> Result<std::fs::File, AgentError> {
        let seen = record.cgroup_seen;
        let trees = seen
            .is_some_and(|s| s.peer)
            .then_some(self.config.peer.pod_cgroup_trees.as_slice());
        let opened = cgroup::open_recorded(&self.cgroup_root, path, trees, seen.map(|s| s.ino))
            .inspect_err(|e| {
                tracing::error!(id = %Escaped(&record.id), error = %e, "a registration's cgroup is refused");
            })?;
        Ok(opened.file)
    }

    fn attach(
        &self,
        record: &PodRecord,
        cgroup: Option<PathBuf>,
    ) -> Result<Attachment, AgentError> {
        let id = &record.id;
        match cgroup {
            Some(cgroup) => {
                let cg = self.open_pod_cgroup(&cgroup, record)?;
                self.dataplane()?
                    .attach_opened(&cg, &cgroup, &self.pod_link_dir(id))?;
                Ok(Attachment::PerPod { cgroup })
            }
            None => {
                let dir = self.shared_link_dir();
                if dataplane::links_in_force(&dir, &names::CGROUP_PROGRAMS).is_err() {
                    let _ = dataplane::detach(&dir);
                    self.dataplane()?.attach(&self.shared_cgroup, &dir)?;
                }
                Ok(Attachment::Shared {
                    cgroup: self.shared_cgroup.clone(),
                })
            }
        }
    }

    /// The registration of container `id`, if any.
    pub fn record(&self, id: &str) -> Result<Option<PodRecord>, AgentError> {
        Ok(self.registry.get(id)?)
    }

    /// Removes every trace of a registration: links, map entries, record. Returns whether
    /// there was one. Idempotent.
    pub fn unregister(&self, id: &str) -> Result<bool, AgentError> {
        let mut maps = self.lock();
        match self.registry.get(id)? {
            Some(record) => {
                self.unregister_locked(maps.as_mut(), &record)?;
                tracing::info!(id, "pod unregistered");
                Ok(true)
            }
            None => {
                // No record, but a crash between steps could have left links: remove them.
                let _ = dataplane::detach(&self.pod_link_dir(id));
                Ok(false)
            }
        }
    }

    /// [`Self::unregister`] with the lock held: `maps` is `None` in the fallback when no
    /// earlier eBPF agent left maps (then a record of its has no entries to take out either).
    fn unregister_locked(
        &self,
        maps: Option<&mut Maps>,
        record: &PodRecord,
    ) -> Result<(), AgentError> {
        let mut phases = Phases::new("del", &record.id);
        dataplane::detach(&self.pod_link_dir(&record.id)).map_err(|source| {
            DataplaneError::Pin {
                path: self.pod_link_dir(&record.id),
                source,
            }
        })?;
        phases.mark("detach");
        match maps {
            Some(maps) if record.redirected() => {
                self.release_entries(maps, &record.id, record.netns_cookie, &entries_of(record))?
            }
            _ => {}
        }
        phases.mark("maps");
        self.registry.remove(&record.id)?;
        phases.mark("registry");
        let shared_left = self.registry.other_shared(&record.id);
        if matches!(record.attachment, Attachment::Shared { .. }) && !shared_left {
            let _ = dataplane::detach(&self.shared_link_dir());
        }
        phases.done();
        Ok(())
    }

    /// CNI CHECK: the registration exists and, if it was redirected, its map entries and live
    /// links are in place and its netns still exists.
    pub fn check(&self, id: &str) -> Result<PodRecord, AgentError> {
        let record = self
            .registry
            .get(id)?
            .ok_or_else(|| AgentError::UnknownContainer(id.into()))?;
        let not_in_force = |why: String| AgentError::NotInForce { id: id.into(), why };
        if !netns::still_exists(&record.netns, record.netns_ino) {
            return Err(not_in_force(format!(
                "network namespace {} is gone",
                record.netns.display()
            )));
        }
        if record.refused {
            // Reported as the refused ADD it stands for: the same error, so the same code.
            return Err(match entries_within_limits(&record) {
                Err(why) => AgentError::Limit(why),
                Ok(_) => not_in_force(record.reason.to_string()),
            });
        }
        if !record.redirected() {
            return Ok(record);
        }
        let expected = entries_of(&record).config;
        let found = match self.lock().as_ref() {
            Some(maps) => maps.pod_config(record.netns_cookie),
            // A pod an earlier eBPF agent meshed, on a node of the fallback with no maps left.
            None => {
                let why = AgentError::NoDataplane(self.choice.reason.clone());
                return Err(not_in_force(why.to_string()));
            }
        };
        match found {
            None => {
                return Err(not_in_force(
                    "its pod config entry is missing from the maps".into(),
                ));
            }
            Some(found) if found != expected => {
                return Err(not_in_force(format!(
                    "its pod config entry differs: {found:?}"
                )));
            }
            Some(_) => {}
        }
        let mut ours = Ours::default();
        for (dir, programs) in self.links_of(&record) {
            ours.extend(dataplane::links_in_force(&dir, programs).map_err(not_in_force)?);
        }
        self.check_order_of(&record, &ours, &mut order::Parents::default())
            .map_err(|conflict| not_in_force(conflict.to_string()))?;
        Ok(record)
    }

    /// Where a redirected pod's programs run among other tenants' programs on the same hooks
    /// ([`order`]): `Ok` when ours run first on every hook of its cgroup attachment and of its
    /// network namespace, and every program that runs above its cgroup still runs for it.
    pub fn check_order(&self, record: &PodRecord) -> Result<(), Conflict> {
        let dirs = self.links_of(record);
        let ours = Ours::in_dirs(dirs.iter().map(|(d, _)| d.as_path()));
        self.check_order_of(record, &ours, &mut order::Parents::default())
    }

    /// [`Self::check_order`] with the programs of the pod's links already read (`ours`, from
    /// [`dataplane::links_in_force`]) and what runs above pod cgroups read once per pass
    /// (`parents`).
    pub fn check_order_of(
        &self,
        record: &PodRecord,
        ours: &Ours,
        parents: &mut order::Parents,
    ) -> Result<(), Conflict> {
        let Some(cgroup) = record.attachment.cgroup() else {
            return Ok(());
        };
        if let Attachment::PerPod { cgroup } = &record.attachment {
            self.open_pod_cgroup(cgroup, record)
                .map_err(|e| Conflict::Query {
                    hook: names::Hook::Connect4,
                    target: cgroup.clone(),
                    source: std::io::Error::other(e.to_string()),
                })?;
        }
        order::check_cgroup(cgroup, ours, parents)?;
        let ns = netns::open_nonblocking(&record.netns).map_err(|source| Conflict::Query {
            hook: names::Hook::SkLookup,
            target: record.netns.clone(),
            source,
        })?;
        let others = self
            .registry
            .other_redirected_ids_with_cookie(&record.id, record.netns_cookie);
        if others.is_empty() {
            return order::check_netns(&ns, &record.netns, ours, false);
        }
        // Another registration of ours in the same network namespace: its `sk_lookup` stub,
        // which may run ahead of this one's, is ours too. Known by its pinned link, since the
        // kernel names a program by id only to CAP_SYS_ADMIN, which the DaemonSet's agent lacks.
        let mut with_others = ours.clone();
        let dirs: Vec<PathBuf> = others.iter().map(|id| self.pod_link_dir(id)).collect();
        with_others.extend(Ours::in_dirs(dirs.iter().map(PathBuf::as_path)));
        order::check_netns(&ns, &record.netns, &with_others, true)
    }

    /// CNI GC: drops every registration whose id is not in `valid`. Returns the dropped ids.
    pub fn gc(&self, valid: &[String]) -> Result<Vec<String>, AgentError> {
        let valid: std::collections::HashSet<&str> = valid.iter().map(String::as_str).collect();
        let mut removed = Vec::new();
        for id in self.registry.map_each(|r| r.id.clone()) {
            // An adopted pod is no attachment of the runtime's: it goes when its netns does.
            if !valid.contains(id.as_str()) && !adopt::is_adopted(&id) && self.unregister(&id)? {
                removed.push(id);
            }
        }
        Ok(removed)
    }

    /// Drops registrations whose network namespace no longer exists.
    ///
    /// Copies out only what the check needs (id, netns path and inode), not whole records,
    /// and holds the registry lock only for that copy: ADD and DEL are not held up by the
    /// filesystem checks.
    ///
    /// Logs the pass (registrations checked, wall and CPU time of this thread) at debug level,
    /// and at info level when it took [`SLOW_REAP`] or more.
    pub fn reap_dead(&self) -> Result<Vec<String>, AgentError> {
        let start = std::time::Instant::now();
        let cpu_start = thread_cpu_time();
        let mut removed = Vec::new();
        let netns = self
            .registry
            .map_each(|r| (r.id.clone(), r.netns.clone(), r.netns_ino));
        let checked = netns.len();
        for (id, path, ino) in netns {
            if !netns::still_exists(&path, ino) && self.unregister(&id)? {
                tracing::info!(id = %id, netns = %Escaped(&path.to_string_lossy()), "netns gone: registration dropped");
                removed.push(id);
            }
        }
        let wall = start.elapsed();
        let cpu_us = (thread_cpu_time() - cpu_start).as_micros() as u64;
        let wall_us = wall.as_micros() as u64;
        let dropped = removed.len();
        if wall >= SLOW_REAP {
            tracing::info!(checked, dropped, wall_us, cpu_us, "slow reap pass");
        } else {
            tracing::debug!(checked, dropped, wall_us, cpu_us, "reap pass");
        }
        Ok(removed)
    }

    /// Up to `n` registered container ids after `after`, in id order, wrapping around.
    pub fn ids_from(&self, after: Option<&str>, n: usize) -> Vec<String> {
        self.registry.ids_from(after, n)
    }

    /// Whether container `id` is registered.
    pub fn is_registered(&self, id: &str) -> bool {
        self.registry.contains(id)
    }

    /// Every registration.
    pub fn pods(&self) -> Result<Vec<PodRecord>, AgentError> {
        Ok(self.registry.all()?)
    }

    /// The registrations on the shared attachment, cloned; the others are not copied (on a
    /// node of 10,000 pods a copy of every record per pass is megabytes of short-lived
    /// allocations, which raise the heap's high-water mark).
    pub fn shared_pods(&self) -> Vec<PodRecord> {
        self.registry
            .filtered(|r| matches!(r.attachment, Attachment::Shared { .. }))
    }

    /// How many registrations there are (without copying them).
    pub fn pod_count(&self) -> usize {
        self.registry.len()
    }

    /// The programs' per-pod counters summed over every pod: (outbound connections
    /// redirected, SO_ORIGINAL_DST answers). Walks the maps through handles of its own, so a
    /// metrics scrape never holds up a registration.
    pub fn stats_totals(&self) -> Result<(u64, u64), AgentError> {
        if self.dataplane.is_none() {
            return Ok((0, 0));
        }
        let maps = Maps::open(&self.config.pin_root.join(paths::PIN_MAPS))?;
        let (mut redirected, mut answered) = (0, 0);
        for cookie in maps.pods() {
            let st = maps.stats(cookie);
            redirected += st.out_redirected;
            answered += st.orig_dst_answered;
        }
        Ok((redirected, answered))
    }

    /// How full each node-wide map is. Walks the maps through handles of its own, so a
    /// metrics scrape never holds up a registration.
    pub fn fill_levels(&self) -> Result<Vec<crate::dataplane::maps::Fill>, AgentError> {
        if self.dataplane.is_none() {
            return Ok(Vec::new());
        }
        Ok(Maps::open(&self.config.pin_root.join(paths::PIN_MAPS))?.fill_levels())
    }

    /// Runs `f` with the maps (for inspection and tests): `None` in the fallback (unless an
    /// earlier eBPF agent left them).
    pub fn with_maps<T>(&self, f: impl FnOnce(Option<&Maps>) -> T) -> T {
        f(self.lock().as_ref())
    }

    /// The pin directory of a registration's own links (cgroup links when attached per pod,
    /// and the netns link).
    pub fn link_dir(&self, record: &PodRecord) -> Option<PathBuf> {
        record.redirected().then(|| self.pod_link_dir(&record.id))
    }

    /// Where a registration's links are pinned, and which programs each directory must hold.
    pub fn links_of(&self, record: &PodRecord) -> Vec<(PathBuf, &'static [&'static str])> {
        links_of(&self.config.pin_root, record)
    }
}

/// The maps an earlier eBPF agent left pinned under `pin_root`, opened as they are (nothing
/// mounted, loaded or pinned): the fallback takes its pods' entries out at their DEL. `None`
/// where there are none, or they cannot be opened (logged).
fn leftover_maps(pin_root: &Path) -> Option<Maps> {
    let dir = pin_root.join(paths::PIN_MAPS);
    if !dir.is_dir() {
        return None;
    }
    Maps::open(&dir)
        .inspect_err(|e| tracing::warn!(maps = %dir.display(), error = %e, "maps an earlier agent pinned cannot be opened: its pods' entries stay until they are gone"))
        .ok()
}

/// The map entries of `record` when its configuration is within the per-pod limits a fresh
/// ADD is held to, else the limit it exceeds: the lengths of its lists first
/// ([`limits::check_config`]), so an over-long list is never built, then the entries
/// ([`limits::check`]).
pub fn entries_within_limits(record: &PodRecord) -> Result<PodEntries, LimitError> {
    limits::check_config(&record.config)?;
    let entries = entries_of(record);
    limits::check(&entries)?;
    Ok(entries)
}

/// Says (warning level) that the registration `record`, which an earlier agent made, is over
/// today's per-pod limits and is kept as that agent made it (see [`Agent::start`]).
fn warn_over_limits(record: &PodRecord, why: &LimitError) {
    let pod = record
        .pod
        .as_ref()
        .map(|p| format!("{}/{}", p.namespace, p.name))
        .unwrap_or_default();
    tracing::warn!(
        id = %Escaped(&record.id),
        pod = %Escaped(&pod),
        over = why.what,
        count = why.count,
        max = why.max,
        from = %why.source_keys,
        "a registration an earlier agent made over today's per-pod limits keeps its \
         redirection until the pod ends; a new ADD with this configuration is refused"
    );
}

/// The map entries a registration wrote.
pub fn entries_of(record: &PodRecord) -> PodEntries {
    PodEntries::new(record.netns_cookie, &record.config, &record.pod_ips)
        .with_host_ids(record.host_ids.as_ref())
}

/// The directory of a registration's own links under `pin_root`.
pub fn pod_link_dir(pin_root: &Path, id: &str) -> PathBuf {
    pin_root.join(paths::PIN_PODS).join(dataplane::pin_name(id))
}

/// Where a registration's links are pinned under `pin_root`, and which programs each
/// directory must hold: per pod, every program in the pod's directory; shared, the netns link
/// there and the cgroup links in the shared directory.
pub fn links_of(pin_root: &Path, record: &PodRecord) -> Vec<(PathBuf, &'static [&'static str])> {
    let own = pod_link_dir(pin_root, &record.id);
    match record.attachment {
        Attachment::PerPod { .. } => vec![(own, &names::ALL_PROGRAMS)],
        Attachment::Shared { .. } => {
            vec![
                (own, &names::NETNS_PROGRAMS),
                (pin_root.join(paths::PIN_SHARED), &names::CGROUP_PROGRAMS),
            ]
        }
        Attachment::None => vec![],
    }
}

/// Per-phase timing of one operation: logged at debug level (`--log-level
/// linkerd_cni_agent=debug`) as one line, and at info level whatever the level when the
/// operation took [`SLOW_OPERATION`] or more, so the tail of pod setup on a busy node can be
/// attributed (which phase, waiting for the lock or in the kernel) without debug logging.
/// Two clock reads per phase (vDSO, tens of nanoseconds) when nothing is logged.
pub(crate) struct Phases<'a> {
    op: &'static str,
    id: &'a str,
    start: std::time::Instant,
    last: std::time::Instant,
    marks: Vec<(&'static str, std::time::Duration)>,
}

/// A reap pass at least this long is logged at info level (a pass checks every registration
/// with one `stat`).
pub const SLOW_REAP: std::time::Duration = std::time::Duration::from_millis(100);

/// CPU time the calling thread has used (`CLOCK_THREAD_CPUTIME_ID`).
pub(crate) fn thread_cpu_time() -> std::time::Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// An ADD or DEL at least this long in the agent is logged with its phases at info level
/// (half the plugin's 10 ms p99 goal for a whole ADD).
pub const SLOW_OPERATION: std::time::Duration = std::time::Duration::from_millis(5);

impl<'a> Phases<'a> {
    pub(crate) fn new(op: &'static str, id: &'a str) -> Self {
        let now = std::time::Instant::now();
        Self {
            op,
            id,
            start: now,
            last: now,
            marks: Vec::with_capacity(12),
        }
    }

    /// Ends the phase `name` now.
    pub(crate) fn mark(&mut self, name: &'static str) {
        let now = std::time::Instant::now();
        self.marks.push((name, now - self.last));
        self.last = now;
    }

    /// Logs the phases (debug level; info level when the operation was slow).
    pub(crate) fn done(self) {
        let total = self.start.elapsed();
        let slow = total >= SLOW_OPERATION;
        if !slow && !tracing::enabled!(tracing::Level::DEBUG) {
            return;
        }
        let phases = self
            .marks
            .iter()
            .map(|(name, d)| format!("{name}={}us", d.as_micros()))
            .collect::<Vec<_>>()
            .join(" ");
        let total_us = total.as_micros() as u64;
        match slow {
            true => {
                tracing::info!(op = self.op, id = self.id, total_us, %phases, "slow operation")
            }
            false => tracing::debug!(op = self.op, id = self.id, total_us, %phases, "phases"),
        }
    }
}

#[cfg(test)]
mod tests;
