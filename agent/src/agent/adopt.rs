//! Adoption: attaching redirection to a meshed pod that is already running without it,
//! because it started before linkerd-cni was in its node's CNI chain (or while the agent was
//! not ready), so no CNI ADD ever reached the agent for it.
//!
//! The pod is found from the host's side ([`crate::podscan`]): its cgroup by pod UID, its
//! processes, the one network namespace they share (never the host's). The programs are
//! attached only once the proxy is known to serve both sides: its inbound listener (a socket
//! of the pod, owned by the proxy UID, listening on the inbound port) and its outbound
//! listener. The inbound listener was opened before `sockops` could see its `listen()`, so it
//! is taken from the proxy with `pidfd_getfd` and put in the listener SOCKHASH first; only
//! then are the map entries written and the cgroup and netns links attached, exactly as a CNI
//! ADD does. Connections established before the adoption stay as they are (not redirected):
//! only new `connect()`s and new inbound connections go through the proxy.

use std::{
    os::fd::{AsFd, OwnedFd},
    path::{Path, PathBuf},
};

use linkerd_cni_common::{AF_INET, AF_INET6, ListenerKey};
use linkerd_cni_proto::{config::LinkerdConfig, wire::PodRef};

use super::{Agent, AgentError, Registration};
use crate::{
    netns::Netns,
    podscan::{self, Listening, RunningPod, ScanError},
    registry::PodRecord,
    userns,
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

/// What an adoption attempt did.
#[derive(Debug)]
pub enum Adopted {
    /// Redirection is attached; the pod is registered.
    Registered(Box<PodRecord>),
    /// Not yet: the proxy does not listen on both ports (it may still be starting). Retried.
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
        Ok(self.registry.all()?.iter().any(|r| {
            r.pod.as_ref().is_some_and(|p| match (&p.uid, &pod.uid) {
                (Some(a), Some(b)) => a == b,
                _ => p.namespace == pod.namespace && p.name == pod.name,
            })
        }))
    }

    /// Adopts the running pod `pod` (its UID is required: it names the pod's cgroup) with the
    /// decided `config`: see the module documentation.
    pub fn adopt(&self, pod: PodRef, config: LinkerdConfig) -> Result<Adopted, AdoptError> {
        let uid = pod
            .uid
            .clone()
            .filter(|u| !u.is_empty())
            .ok_or(ScanError::NoCgroup)?;
        let proc_root = self.host_path(Path::new("/proc"));
        let within = self.config.host_root.clone().unwrap_or_else(|| "/".into());
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
            .map_err(|e| ScanError::Io(format!("/proc/self/mountinfo: {e}")))?;
        let v1 = podscan::v1_roots(&mountinfo, &within);
        let running = podscan::find(&self.cgroup_root, &v1, &proc_root, &uid)?;
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
        let inbound = proxy_on(config.incoming_proxy_port);
        let outbound = proxy_on(config.outgoing_proxy_port);
        if inbound.is_empty() || outbound.is_empty() {
            return Ok(Adopted::Waiting(format!(
                "the proxy (uid {proxy_uid}) does not listen on both {} (inbound: {}) and {} \
                 (outbound: {}) yet",
                config.incoming_proxy_port,
                !inbound.is_empty(),
                config.outgoing_proxy_port,
                !outbound.is_empty()
            )));
        }
        // The inbound listeners, taken from the process of the pod that holds them.
        let mut taken: Vec<(u32, OwnedFd)> = Vec::new();
        for l in &inbound {
            let Some((pid, fd)) = podscan::owner_of(&proc_root, &pids, l.inode) else {
                continue;
            };
            match podscan::take_socket(pid, fd) {
                Ok(sock) => taken.push((l.family, sock)),
                Err(e) => {
                    return Err(ScanError::Io(format!(
                        "taking the proxy's listener (pid {pid}, fd {fd}) with pidfd_getfd: {e} \
                         (the agent must run in the host's PID namespace)"
                    ))
                    .into());
                }
            }
        }
        if taken.is_empty() {
            return Ok(Adopted::Waiting(
                "no process of the pod holds the proxy's inbound listener".into(),
            ));
        }
        let id = adopted_id(&uid);
        {
            let mut maps = self.lock();
            if self.knows_pod(&pod)? {
                return Ok(Adopted::Waiting("registered meanwhile".into()));
            }
            // As `sockops` does at `listen()`: per family; an IPv6 listener also serves IPv4
            // unless an IPv4 one exists.
            taken.sort_by_key(|(family, _)| *family != AF_INET);
            for (family, sock) in &taken {
                let key = |family| ListenerKey {
                    netns_cookie,
                    family,
                    _pad: 0,
                };
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
        }
        let reg = Registration {
            id,
            ifname: "eth0".into(),
            netns: host_netns_path,
            cgroup_hint: cgroup_v2.as_ref().map(|p| p.display().to_string()),
            pod: Some(pod),
            config,
            pod_ips: Vec::new(),
        };
        match self.register(reg) {
            Ok(record) => Ok(Adopted::Registered(Box::new(record))),
            Err(e) => {
                let mut maps = self.lock();
                for family in [AF_INET, AF_INET6] {
                    let _ = maps.listeners.remove(&ListenerKey {
                        netns_cookie,
                        family,
                        _pad: 0,
                    });
                }
                Err(e.into())
            }
        }
    }
}

/// A host path (as the registry keeps them) from the path the agent sees it under.
fn unprefixed(root: Option<&Path>, path: &Path) -> PathBuf {
    match root {
        Some(root) => Path::new("/").join(path.strip_prefix(root).unwrap_or(path)),
        None => path.into(),
    }
}
