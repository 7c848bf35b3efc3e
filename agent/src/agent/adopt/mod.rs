//! Adoption: attaching redirection to a meshed pod that is already running without it,
//! because it started before linkerd-cni was in its node's CNI chain (or while the agent was
//! not ready), so no CNI ADD ever reached the agent for it.
//!
//! The pod is found from the host's side ([`crate::host::podscan`]): its cgroup by pod UID, its
//! processes, the one network namespace they share (never the host's). The programs are
//! attached only once something listens on the outbound port (outbound connections are never
//! sent to a port nothing serves), and:
//!
//! - when the proxy runs (a socket of the pod owned by the proxy UID listens on the outbound
//!   port), only once it also listens on the inbound port. That listener was opened before
//!   `sockops` could see its `listen()`, so it is taken from the proxy with `pidfd_getfd` and
//!   put in the listener SOCKHASH first;
//! - otherwise the pod is in its init phase, Linkerd's network validator listening on the
//!   outbound port (as another UID) and failing until connections are redirected: the pod is
//!   attached, its inbound connections are refused until the proxy listens, and `sockops`
//!   registers the proxy's listener then, as for any meshed pod.
//!
//! Then the map entries are written and the cgroup and netns links attached, exactly as a CNI
//! ADD does. Connections established before the adoption stay as they are (not redirected):
//! only new `connect()`s and new inbound connections go through the proxy.

mod pass;

pub use pass::Adopter;

use std::{
    os::fd::{AsFd, OwnedFd},
    path::{Path, PathBuf},
};

use linkerd_cni_common::{AF_INET, AF_INET6, ListenerKey};
use linkerd_cni_proto::{config::LinkerdConfig, wire::PodRef};

use super::{Agent, AgentError, Registration};
use crate::{
    agent::registry::PodRecord,
    dataplane::maps::Maps,
    host::netns::Netns,
    host::podscan::{self, Listening, RunningPod, ScanError, V1Hierarchies},
    host::userns,
};

/// `BPF_NOEXIST`: insert only if the key is absent.
const BPF_NOEXIST: u64 = 1;

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
    /// Adopting it would not be safe (no process, host netns, processes in several netns).
    #[error(transparent)]
    Unsafe(#[from] ScanError),
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
            Self::Unsafe(ScanError::AmbiguousNetns(_)) => "ambiguous_netns",
            Self::Unsafe(ScanError::HostNetns) => "host_netns",
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

    /// The host's cgroup v1 hierarchies, for one scan of the node's pods (the mount table is
    /// read once, when a pod without a cgroup v2 directory first needs it).
    pub fn v1_hierarchies(&self) -> V1Hierarchies {
        let within = self.config.host_root.clone().unwrap_or_else(|| "/".into());
        V1Hierarchies::new("/proc/self/mountinfo", within)
    }

    /// The pod with UID `uid` as the host sees it (cgroup, processes, netns), without
    /// touching anything: whether there is anything to adopt. `v1` is the scan's view of the
    /// cgroup v1 hierarchies ([`Agent::v1_hierarchies`]).
    pub fn running_pod(&self, uid: &str, v1: &V1Hierarchies) -> Result<RunningPod, ScanError> {
        let proc_root = self.host_path(Path::new("/proc"));
        podscan::find(&self.cgroup_root, v1, &proc_root, uid)
    }

    /// Adopts the running pod `pod` (its UID is required: it names the pod's cgroup) with the
    /// decided `config`: see the module documentation.
    pub fn adopt(
        &self,
        pod: PodRef,
        config: LinkerdConfig,
        v1: &V1Hierarchies,
    ) -> Result<Adopted, AdoptError> {
        let uid = pod
            .uid
            .clone()
            .filter(|u| !u.is_empty())
            .ok_or(ScanError::NoCgroup)?;
        let proc_root = self.host_path(Path::new("/proc"));
        let running = self.running_pod(&uid, v1)?;
        let RunningPod {
            cgroup_v2,
            pids,
            netns_ino,
        } = running;
        // Prefer the runtime's pin of the netns (it lives as long as the sandbox); otherwise
        // a process's view of it. Registry paths are host paths.
        let dirs = ["/run/netns", "/var/run/netns"].map(|d| self.host_path(Path::new(d)));
        let netns_path = podscan::pinned_netns(&dirs, netns_ino)
            .unwrap_or_else(|| proc_root.join(pids[0].to_string()).join("ns/net"));
        let host_netns_path = unprefixed(self.config.host_root.as_deref(), &netns_path);
        let ns = Netns::open(&netns_path).map_err(AgentError::from)?;
        if ns.ino != netns_ino {
            return Ok(Adopted::Waiting(
                "the pod's network namespace changed".into(),
            ));
        }
        let netns_cookie = ns.cookie().map_err(AgentError::from)?;
        let host_ids = userns::host_ids(ns.file(), config.proxy_uid(), config.proxy_gid())
            .map_err(AgentError::from)?;
        let Some(proxy_uid) = host_ids.and_then(|h| h.uid).or(config.proxy_uid()) else {
            return Ok(Adopted::Waiting(
                "no proxy UID configured: the proxy's listener cannot be told apart".into(),
            ));
        };
        let listening = podscan::listening(&proc_root, pids[0])
            .map_err(|e| ScanError::Io(format!("listening sockets of pid {}: {e}", pids[0])))?;
        let proxy_on = |port: u16| -> Vec<Listening> {
            listening
                .iter()
                .filter(|l| l.port == port && l.uid == proxy_uid)
                .copied()
                .collect()
        };
        let (in_port, out_port) = (config.incoming_proxy_port, config.outgoing_proxy_port);
        let inbound = proxy_on(in_port);
        let proxy_outbound = !proxy_on(out_port).is_empty();
        // Outbound connections are only ever sent to a port something listens on.
        if !listening.iter().any(|l| l.port == out_port) {
            return Ok(Adopted::Waiting(format!(
                "nothing listens on the outbound port {out_port} yet"
            )));
        }
        // The proxy is starting (its outbound listener is up, its inbound one not yet): one
        // more pass, rather than refusing inbound connections in between.
        if inbound.is_empty() && proxy_outbound {
            return Ok(Adopted::Waiting(format!(
                "the proxy (uid {proxy_uid}) listens on {out_port} but not on {in_port} yet"
            )));
        }
        // Otherwise, without an inbound listener, the pod is in its init phase: Linkerd's
        // network validator (another UID) listens on the outbound port and its check passes
        // only once connections are redirected. Inbound connections are refused until the
        // proxy listens, and `sockops` registers its listener then, as for any meshed pod.
        let taken = take_listeners(&proc_root, &pids, &inbound)?;
        if !inbound.is_empty() && taken.is_empty() {
            return Ok(Adopted::Waiting(
                "no process of the pod holds the proxy's inbound listener".into(),
            ));
        }
        {
            let mut maps = self.lock_background();
            if self.knows_pod(&pod)? {
                return Ok(Adopted::Waiting("registered meanwhile".into()));
            }
            insert_listeners(&mut maps, netns_cookie, taken)?;
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
                let mut maps = self.lock_background();
                for family in [AF_INET, AF_INET6] {
                    let _ = maps.listeners.remove(&ListenerKey {
                        netns_cookie,
                        family,
                        _pad: 0,
                    });
                }
                return Err(e.into());
            }
        };
        // A proxy that started listening between the scan and the attachment was not seen by
        // `sockops`: look once more now that every later `listen()` is.
        if inbound.is_empty() {
            let late = podscan::listening(&proc_root, pids[0])
                .map(|all| {
                    all.into_iter()
                        .filter(|l| l.port == in_port && l.uid == proxy_uid)
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default();
            let mut maps = self.lock_background();
            let missing = !maps.has_listener(netns_cookie, AF_INET)
                && !maps.has_listener(netns_cookie, AF_INET6);
            if missing && !late.is_empty() {
                let taken = take_listeners(&proc_root, &pids, &late)?;
                insert_listeners(&mut maps, netns_cookie, taken)?;
                tracing::info!(id = %record.id, "adoption: the proxy's inbound listener, opened during the attachment, registered");
            }
        }
        Ok(Adopted::Registered(Box::new(record)))
    }
}

/// Duplicates the listening sockets `listeners` from the pod's process that holds each.
fn take_listeners(
    proc_root: &Path,
    pids: &[u32],
    listeners: &[Listening],
) -> Result<Vec<(u32, OwnedFd)>, AdoptError> {
    let mut taken = Vec::new();
    for l in listeners {
        let Some((pid, fd)) = podscan::owner_of(proc_root, pids, l.inode) else {
            continue;
        };
        let sock = podscan::take_socket(pid, fd).map_err(|e| {
            ScanError::Io(format!(
                "taking the proxy's listener (pid {pid}, fd {fd}) with pidfd_getfd: {e} (the \
                 agent must run in the host's PID namespace)"
            ))
        })?;
        taken.push((l.family, sock));
    }
    Ok(taken)
}

/// Puts the proxy's inbound listeners in the listener SOCKHASH, as `sockops` does at
/// `listen()`: per family; an IPv6 listener also serves IPv4 unless an IPv4 one exists.
fn insert_listeners(
    maps: &mut Maps,
    netns_cookie: u64,
    mut taken: Vec<(u32, OwnedFd)>,
) -> Result<(), AgentError> {
    taken.sort_by_key(|(family, _)| *family != AF_INET);
    let key = |family| ListenerKey {
        netns_cookie,
        family,
        _pad: 0,
    };
    for (family, sock) in &taken {
        maps.listeners
            .insert(key(*family), sock.as_fd(), 0)
            .map_err(|e| {
                AgentError::Registry(std::io::Error::other(format!(
                    "registering the proxy's inbound listener: {e}"
                )))
            })?;
        if *family == AF_INET6 {
            let _ = maps
                .listeners
                .insert(key(AF_INET), sock.as_fd(), BPF_NOEXIST);
        }
    }
    Ok(())
}

/// A host path (as the registry keeps them) from the path the agent sees it under.
fn unprefixed(root: Option<&Path>, path: &Path) -> PathBuf {
    match root {
        Some(root) => Path::new("/").join(path.strip_prefix(root).unwrap_or(path)),
        None => path.into(),
    }
}
