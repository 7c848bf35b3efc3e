//! Adoption: attaching redirection to a meshed pod that is already running without it,
//! because it started before linkerd-cni was in its node's CNI chain (or while the agent was
//! not ready), so no CNI ADD ever reached the agent for it.
//!
//! The pod is found from the host's side without looking at its processes
//! ([`crate::host::podscan`]): its cgroup by pod UID, and its network namespace among the
//! runtime's netns pins by the pod's address (`status.podIPs`,
//! [`crate::host::podnetns`]). Inside that namespace, the `iter/tcp` program
//! ([`crate::dataplane::iter`]) lists the listening TCP sockets. The programs are attached
//! only once something listens on the outbound port (outbound connections are never sent to
//! a port nothing serves), and:
//!
//! - when the proxy runs (a socket owned by the proxy UID listens on the outbound port), only
//!   once it also listens on the inbound port. That listener was opened before `sockops` could
//!   see its `listen()`, so the iterator puts it in the listener SOCKHASH first, from inside
//!   the kernel: no `pidfd_getfd`, no host PID namespace;
//! - otherwise the pod is in its init phase, Linkerd's network validator listening on the
//!   outbound port (as another UID) and failing until connections are redirected: the pod is
//!   attached, its inbound connections are refused until the proxy listens, and `sockops`
//!   registers the proxy's listener then, as for any meshed pod.
//!
//! A pod whose namespace carries Linkerd's iptables rules (its `PROXY_INIT_REDIRECT` or
//! `PROXY_INIT_OUTPUT` nat chains, [`crate::host::natrules`]: a pod meshed by Linkerd's own CNI
//! plugin or `linkerd-init` before linkerd-cni replaced it) is meshed by them already and is
//! left to them: attaching on top breaks its inbound connections, which reach the proxy
//! REDIRECTed to its inbound port, so that `sockops` records that port as their original
//! destination (measured in `tests/tests/migrate.rs`). It goes through linkerd-cni once it is
//! recreated.
//!
//! Then the map entries are written and the cgroup and netns links attached, exactly as a CNI
//! ADD does. Connections established before the adoption stay as they are (not redirected):
//! only new `connect()`s and new inbound connections go through the proxy.

mod pass;

pub use pass::Adopter;

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
};

use linkerd_cni_common::{AF_INET, AF_INET6, ITER_REGISTER, IterArgs, IterListener, ListenerKey};
use linkerd_cni_proto::{config::LinkerdConfig, wire::PodRef};

use super::{Agent, AgentError, Registration};
use crate::{
    agent::registry::PodRecord,
    dataplane::iter::ListenerIter,
    host::capabilities,
    host::natrules,
    host::netns::{self, Netns},
    host::podscan::{self, PodScan, RunningPod, ScanError, V1Hierarchies},
    host::userns,
};

/// Prefix of the registration id of an adopted pod (no runtime gave it a `CNI_CONTAINERID`).
pub const ADOPTED_PREFIX: &str = "adopted-";

/// The registration id of the adopted pod with UID `uid`.
pub fn adopted_id(uid: &str) -> String {
    format!("{ADOPTED_PREFIX}{uid}")
}

/// Whether a registration was made by adoption rather than by a CNI ADD.
pub fn is_adopted(id: &str) -> bool {
    id.starts_with(ADOPTED_PREFIX)
}

/// The pods registrations are for (see [`Agent::known_pods`]).
#[derive(Debug, Default)]
pub struct KnownPods {
    uids: std::collections::HashSet<String>,
    names: std::collections::HashSet<(String, String)>,
}

impl KnownPods {
    /// The pods with these UIDs (registrations made with one).
    pub fn from_uids<'a>(uids: impl IntoIterator<Item = &'a str>) -> Self {
        Self {
            uids: uids.into_iter().map(str::to_string).collect(),
            names: Default::default(),
        }
    }

    /// Whether a registration is for the pod `namespace/name` with UID `uid`.
    pub fn contains(&self, namespace: &str, name: &str, uid: &str) -> bool {
        self.uids.contains(uid) || self.names.contains(&(namespace.into(), name.into()))
    }
}

/// What an adoption attempt did.
#[derive(Debug)]
pub enum Adopted {
    /// Redirection is attached; the pod is registered.
    Registered(Box<PodRecord>),
    /// Not yet: nothing listens on the outbound port, or the proxy is between its two
    /// listeners. Retried.
    Waiting(String),
}

/// Why a pod cannot be adopted.
#[derive(Debug, thiserror::Error)]
pub enum AdoptError {
    /// Adopting it would not be safe (not running, its address in the host netns or in
    /// several netns).
    #[error(transparent)]
    Unsafe(#[from] ScanError),
    /// The `iter/tcp` program cannot be used on this node (the reason).
    #[error("the iter/tcp program is not available: {0}")]
    NoIterator(String),
    /// The pod's namespace carries Linkerd's iptables rules (the chains found): it is meshed
    /// by them, and left to them until it is recreated.
    #[error(
        "its network namespace carries Linkerd's iptables rules ({0}): left to them until the \
         pod is recreated"
    )]
    LinkerdIptables(String),
    /// The registration failed.
    #[error(transparent)]
    Agent(#[from] AgentError),
}

impl AdoptError {
    /// The `reason` label in `/metrics`.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Unsafe(ScanError::NoCgroup) => "no_cgroup",
            Self::Unsafe(ScanError::NoProcess(_)) => "no_process",
            Self::Unsafe(ScanError::NoAddress) => "no_address",
            Self::Unsafe(ScanError::NoNetns(_)) => "no_netns",
            Self::Unsafe(ScanError::AmbiguousNetns(_)) => "ambiguous_netns",
            Self::Unsafe(ScanError::HostNetns) => "host_netns",
            Self::NoIterator(_) => "no_iterator",
            Self::LinkerdIptables(_) => "linkerd_iptables",
            Self::Unsafe(ScanError::Io(_)) | Self::Agent(_) => "error",
        }
    }
}

impl Agent {
    /// Whether any registration (redirected or not) is for the pod `pod`.
    pub fn knows_pod(&self, pod: &PodRef) -> Result<bool, AgentError> {
        Ok(self.registry.any(|r| {
            r.pod.as_ref().is_some_and(|p| match (&p.uid, &pod.uid) {
                (Some(a), Some(b)) => a == b,
                _ => p.namespace == pod.namespace && p.name == pod.name,
            })
        }))
    }

    /// The pods the registry knows (redirected or not): their UIDs, and the namespace/name of
    /// those registered without one.
    pub fn known_pods(&self) -> Result<KnownPods, AgentError> {
        // Without cloning the records: on a node of 10,000 pods a clone of every record each
        // adoption pass is about 14 MB of short-lived allocations.
        let mut known = KnownPods::default();
        self.registry.for_each(|r| {
            if let Some(p) = &r.pod {
                match &p.uid {
                    Some(uid) => known.uids.insert(uid.clone()),
                    None => known.names.insert((p.namespace.clone(), p.name.clone())),
                };
            }
        });
        Ok(known)
    }

    /// Why running pods cannot be adopted on this node (the `iter/tcp` program cannot be
    /// used, or this process may not enter a pod's network namespace), or `None` when they can.
    pub fn adoption_unavailable(&self) -> Option<String> {
        let Some(dataplane) = &self.dataplane else {
            // The plugin writes the fallback's rules at ADD: a running pod gets them only by
            // being recreated (repair by deletion).
            return Some(format!(
                "this node runs the per-node fallback ({}): Linkerd's rules are written by the \
                 plugin at a pod's ADD, so a running pod cannot be adopted in place",
                self.choice.reason
            ));
        };
        if let Err(e) = dataplane.listener_iter() {
            return Some(e.to_string());
        }
        // setns(CLONE_NEWNET) needs CAP_SYS_ADMIN (the chart's agent.sysAdmin).
        let sys_admin = capabilities::CAPABILITIES
            .iter()
            .find(|c| c.name == "SYS_ADMIN")
            .map(|c| 1u64 << c.bit);
        match (capabilities::effective(), sys_admin) {
            (Ok(held), Some(bit)) if held & bit == 0 => Some(
                "entering a pod's network namespace needs CAP_SYS_ADMIN (agent.sysAdmin=true)"
                    .into(),
            ),
            _ => None,
        }
    }

    /// One scan of the node's pods: the host's cgroup v1 hierarchies (the mount table is read
    /// once, when a pod without a cgroup v2 directory first needs it) and the runtime's netns
    /// pins by address (brought up to date once, when a pod first needs it).
    pub fn pod_scan(&self) -> PodScan {
        let within = self.config.host_root.clone().unwrap_or_else(|| "/".into());
        PodScan::new(V1Hierarchies::new("/proc/self/mountinfo", within))
    }

    /// Forgets what the netns index holds of the namespace with inode `ino` (it did not hold
    /// what the index said): the next scan enters it again.
    fn forget_netns(&self, ino: u64) {
        self.netns_index
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .forget(ino);
    }

    /// The pod with UID `uid` and addresses `ips` as the host sees it (cgroup, netns),
    /// without touching anything: whether there is anything to adopt.
    pub fn running_pod(
        &self,
        uid: &str,
        ips: &[IpAddr],
        scan: &PodScan,
    ) -> Result<RunningPod, ScanError> {
        podscan::find(&self.cgroup_root, scan, &self.netns_index, uid, ips)
    }

    /// Adopts the running pod `pod` (its UID is required: it names the pod's cgroup) whose
    /// addresses are `ips`, with the decided `config`: see the module documentation.
    pub fn adopt(
        &self,
        pod: PodRef,
        ips: &[IpAddr],
        config: LinkerdConfig,
        scan: &PodScan,
    ) -> Result<Adopted, AdoptError> {
        let uid = pod
            .uid
            .clone()
            .filter(|u| !u.is_empty())
            .ok_or(ScanError::NoCgroup)?;
        let RunningPod {
            cgroup_v2,
            netns_path,
            netns_ino,
        } = self.running_pod(&uid, ips, scan)?;
        let iter = self
            .dataplane()?
            .listener_iter()
            .map_err(|why| AdoptError::NoIterator(why.to_string()))?;
        // Registry paths are host paths.
        let host_netns_path = unprefixed(self.config.host_root.as_deref(), &netns_path);
        let ns = Netns::open(&netns_path).map_err(AgentError::from)?;
        if ns.ino != netns_ino {
            self.forget_netns(netns_ino);
            return Ok(Adopted::Waiting(
                "the pod's network namespace changed".into(),
            ));
        }
        let host_ids = userns::host_ids(ns.file(), config.proxy_uid(), config.proxy_gid(), None)
            .map_err(AgentError::from)?;
        let Some(proxy_uid) = host_ids.and_then(|h| h.uid).or(config.proxy_uid()) else {
            return Ok(Adopted::Waiting(
                "no proxy UID configured: the proxy's listener cannot be told apart".into(),
            ));
        };
        let (in_port, out_port) = (config.incoming_proxy_port, config.outgoing_proxy_port);
        let mut args = IterArgs {
            proxy_uid,
            inbound_port: in_port,
            ..IterArgs::default()
        };
        // One visit: the cookie, the addresses (the index's answer is checked, not trusted),
        // Linkerd's iptables chains if any, and what listens.
        let (netns_cookie, addrs, linkerd_chains, listening) = ns
            .run(|| {
                let chains = natrules::linkerd_chains()?;
                // Such a pod is refused below: no need to list its sockets.
                let listening = if chains.is_empty() {
                    iter.run(&args)?
                } else {
                    Vec::new()
                };
                Ok((
                    netns::current_netns_cookie()?,
                    netns::current_addresses()?,
                    chains,
                    listening,
                ))
            })
            .map_err(AgentError::from)?;
        if !addrs.iter().any(|a| ips.contains(a)) {
            self.forget_netns(netns_ino);
            return Ok(Adopted::Waiting(
                "the network namespace no longer holds the pod's address".into(),
            ));
        }
        if !linkerd_chains.is_empty() {
            let chains: Vec<String> = linkerd_chains.iter().map(ToString::to_string).collect();
            return Err(AdoptError::LinkerdIptables(chains.join(", ")));
        }
        args.netns_cookie = netns_cookie;
        let proxy_on = |port: u16| {
            listening
                .iter()
                .any(|l| l.port == port && l.uid == proxy_uid)
        };
        let inbound = proxy_on(in_port);
        // Outbound connections are only ever sent to a port something listens on.
        if !listening.iter().any(|l| l.port == out_port) {
            return Ok(Adopted::Waiting(format!(
                "nothing listens on the outbound port {out_port} yet"
            )));
        }
        // The proxy is starting (its outbound listener is up, its inbound one not yet): one
        // more pass, rather than refusing inbound connections in between.
        if !inbound && proxy_on(out_port) {
            return Ok(Adopted::Waiting(format!(
                "the proxy (uid {proxy_uid}) listens on {out_port} but not on {in_port} yet"
            )));
        }
        // Otherwise, without an inbound listener, the pod is in its init phase: Linkerd's
        // network validator (another UID) listens on the outbound port and its check passes
        // only once connections are redirected. Inbound connections are refused until the
        // proxy listens, and `sockops` registers its listener then, as for any meshed pod.
        {
            let maps = self.lock_background();
            if self.knows_pod(&pod)? {
                return Ok(Adopted::Waiting("registered meanwhile".into()));
            }
            if inbound {
                let registered = register_listener(&ns, iter, &args, in_port)?;
                if !registered.iter().any(|l| l.registered == 0) {
                    drop(maps);
                    self.remove_listeners(netns_cookie);
                    return Ok(Adopted::Waiting(format!(
                        "the proxy's inbound listener could not be registered: {}",
                        outcome(&registered)
                    )));
                }
            }
        }
        let reg = Registration {
            id: adopted_id(&uid),
            ifname: "eth0".into(),
            netns: host_netns_path,
            cgroup_hint: cgroup_v2.as_ref().map(|p| p.display().to_string()),
            pod: Some(pod),
            config,
            pod_ips: Vec::new(),
        };
        let record = match self.register(reg) {
            Ok(record) => record,
            Err(e) => {
                self.remove_listeners(netns_cookie);
                return Err(e.into());
            }
        };
        // A proxy that started listening between the scan and the attachment was not seen by
        // `sockops`: look once more now that every later `listen()` is.
        if !inbound {
            let maps = self.lock_background();
            let missing = maps.as_ref().is_some_and(|maps| {
                !maps.has_listener(netns_cookie, AF_INET)
                    && !maps.has_listener(netns_cookie, AF_INET6)
            });
            if missing {
                let late = register_listener(&ns, iter, &args, in_port)?;
                if late.iter().any(|l| l.registered == 0) {
                    tracing::info!(id = %record.id, "adoption: the proxy's inbound listener, opened during the attachment, registered");
                }
            }
        }
        Ok(Adopted::Registered(Box::new(record)))
    }

    /// Removes the pod's listener entries (an adoption that did not go through).
    fn remove_listeners(&self, netns_cookie: u64) {
        let mut guard = self.lock_background();
        let Some(maps) = guard.as_mut() else {
            return;
        };
        for family in [AF_INET, AF_INET6] {
            let _ = maps.listeners.remove(&ListenerKey {
                netns_cookie,
                family,
                _pad: 0,
            });
        }
    }
}

/// Runs the iterator in `ns` asking it to register the proxy's inbound listener; returns the
/// records of the proxy's listeners on `port`, with what registering each returned.
fn register_listener(
    ns: &Netns,
    iter: &ListenerIter,
    args: &IterArgs,
    port: u16,
) -> Result<Vec<IterListener>, AgentError> {
    let args = IterArgs {
        flags: ITER_REGISTER,
        ..*args
    };
    let listening = ns.run(|| iter.run(&args))?;
    Ok(listening
        .into_iter()
        .filter(|l| l.port == port && l.uid == args.proxy_uid)
        .collect())
}

/// What registering the listeners returned, in words.
fn outcome(records: &[IterListener]) -> String {
    if records.is_empty() {
        return "the listener was gone".into();
    }
    records
        .iter()
        .map(|l| {
            format!(
                "{} (family {}): {}",
                l.port,
                l.family,
                std::io::Error::from_raw_os_error(-l.registered)
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// A host path (as the registry keeps them) from the path the agent sees it under.
fn unprefixed(root: Option<&Path>, path: &Path) -> PathBuf {
    match root {
        Some(root) => Path::new("/").join(path.strip_prefix(root).unwrap_or(path)),
        None => path.into(),
    }
}
