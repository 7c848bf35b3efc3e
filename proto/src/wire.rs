//! The registration protocol between the plugin and the agent.
//!
//! One request per connection on the agent's Unix socket. Each message is a frame: a 4-byte
//! big-endian length, then that many bytes of JSON. Every request carries
//! [`PROTOCOL_VERSION`]; an agent answers a version it does not speak with
//! [`ErrorKind::VersionMismatch`], so plugin and agent can be upgraded independently.
//!
//! An ADD may carry one file descriptor as `SCM_RIGHTS` ancillary data on its first byte: a
//! socket the plugin (root, handed the pod's netns by the runtime) created inside the pod's
//! network namespace. From it the agent learns that namespace and its cookie without entering
//! it, so it needs no `CAP_SYS_ADMIN` ([`AddRequest::netns_addrs`] carries the addresses the
//! plugin read there; the socket is a route netlink one, on which the agent asks the
//! namespace's addresses itself to check them; an older plugin's is an `AF_UNIX` one). An agent that predates this reads the frame with `read(2)`, which
//! discards the descriptor; an ADD without one (an older plugin) is served by entering the
//! namespace, which only an agent holding `CAP_SYS_ADMIN` can.

use std::{
    io::{self, Read, Write},
    net::IpAddr,
    time::Duration,
};

use serde::{Deserialize, Serialize};

use crate::config::LinkerdConfig;

/// The protocol version this crate speaks.
pub const PROTOCOL_VERSION: u32 = 1;
/// Largest frame either side accepts.
pub const MAX_FRAME: usize = 1 << 20;

/// How long before the plugin's deadline the agent stops working on a request, so that its
/// answer (success, or "abandoned") reaches the plugin before the plugin gives up.
pub const DEADLINE_MARGIN: Duration = Duration::from_millis(250);

/// A request with its protocol version.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    pub version: u32,
    pub request: Request,
    /// How many milliseconds the plugin still waits for the answer when it sends the request.
    /// The agent abandons (and rolls back) an ADD it cannot finish within this budget minus
    /// [`DEADLINE_MARGIN`]: the runtime has seen the ADD fail by then and would never DEL a
    /// registration that appears later. Absent (older plugins): the agent's own limit applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_ms: Option<u64>,
}

impl Envelope {
    pub fn new(request: Request) -> Self {
        Self {
            version: PROTOCOL_VERSION,
            request,
            budget_ms: None,
        }
    }

    /// A request the plugin waits `budget` for.
    pub fn with_budget(request: Request, budget: Duration) -> Self {
        Self {
            budget_ms: Some(u64::try_from(budget.as_millis()).unwrap_or(u64::MAX)),
            ..Self::new(request)
        }
    }

    /// How long the agent may work on this request, counted from when it read it: the
    /// plugin's budget minus [`DEADLINE_MARGIN`] (at most half the budget), or `None`.
    pub fn agent_budget(&self) -> Option<Duration> {
        let budget = Duration::from_millis(self.budget_ms?);
        Some(budget - DEADLINE_MARGIN.min(budget / 2))
    }
}

/// The Kubernetes identity of a pod, from `CNI_ARGS`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    /// `K8S_POD_UID`, when the runtime sends it (used to find the pod's cgroup).
    pub uid: Option<String>,
}

/// What the plugin asks of the agent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// CNI ADD: decide, then (maybe) redirect this pod. Boxed: it is by far the largest
    /// request (the whole `linkerd` config), and the same JSON either way.
    Add(Box<AddRequest>),
    /// CNI DEL: forget the attachment; idempotent, works without the netns.
    Del(AttachmentRef),
    /// CNI CHECK: fail unless the redirection decided at ADD is in force.
    Check(AttachmentRef),
    /// CNI GC: drop every registration not in `valid`.
    Gc(GcRequest),
    /// CNI STATUS: is the agent ready for ADDs.
    Status,
}

/// A CNI attachment: the container id and interface name identify it (CNI spec).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachmentRef {
    pub container_id: String,
    pub ifname: String,
    /// May be empty on DEL.
    pub netns: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AddRequest {
    pub attachment: AttachmentRef,
    /// `None` when `CNI_ARGS` has no `K8S_POD_NAMESPACE`/`K8S_POD_NAME` (never sent: the plugin
    /// passes such pods through itself; kept for completeness).
    pub pod: PodRef,
    /// `runtimeConfig.cgroupPath`, when the runtime sent it.
    pub cgroup_path: Option<String>,
    /// The pod's addresses from `prevResult`.
    pub pod_ips: Vec<IpAddr>,
    /// The `linkerd` section of the network config.
    pub config: LinkerdConfig,
    /// The addresses of the pod's network namespace (except loopback), read by the plugin
    /// inside it, sent with the netns socket (see the module). Absent from older plugins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns_addrs: Option<Vec<IpAddr>>,
    /// For a pod in a user namespace of its own (`hostUsers: false`): that namespace's ID maps
    /// as the plugin read them, sent with the netns socket. Absent for a pod in the host's user
    /// namespace, and from older plugins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub userns: Option<UsernsMaps>,
}

/// The user namespace that owns a pod's network namespace, and its `uid_map` and `gid_map` as
/// the host's user namespace sees them (`/proc/<pid>/uid_map` of a process inside it, read
/// from outside). The plugin reads them at ADD (it may enter the namespace; the agent's
/// container, under the runtime's default seccomp profile, may not without `CAP_SYS_ADMIN`);
/// the agent uses them only when `dev` and `ino` name the user namespace that owns the netns it
/// was handed (`NS_GET_USERNS`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsernsMaps {
    /// The user namespace's nsfs device and inode.
    pub dev: u64,
    pub ino: u64,
    pub uid_map: String,
    pub gid_map: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GcRequest {
    /// Attachments that are still valid (container id, ifname); every other is dropped.
    pub valid: Vec<AttachmentRef>,
}

/// What the agent answers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Response {
    Added {
        /// Whether the pod's traffic now goes through its proxy.
        redirected: bool,
        /// Why, in words, for the plugin's log.
        reason: String,
    },
    /// The pod is meshed in the per-node fallback (`--mode=iptables`): the plugin writes
    /// Linkerd's rules for `config` in the pod's network namespace before the ADD succeeds
    /// (a plugin that cannot read this answer fails the ADD: the pod never starts without
    /// its rules).
    AddedRules {
        /// Why, in words, for the plugin's log.
        reason: String,
        /// The pod's configuration as the agent decided it (overrides applied).
        config: LinkerdConfig,
    },
    Deleted {
        /// Whether there was anything to delete.
        existed: bool,
    },
    Checked {
        redirected: bool,
    },
    /// CHECK of a pod meshed in the per-node fallback: the plugin compares the rules in the
    /// pod's network namespace with those `config` makes.
    CheckedRules {
        config: LinkerdConfig,
    },
    Collected {
        /// Container ids whose registration was dropped.
        removed: Vec<String>,
    },
    Status {
        programs_loaded: bool,
        pods: usize,
    },
    Error {
        kind: ErrorKind,
        message: String,
    },
}

/// Why the agent refused a request. The plugin maps these to CNI error codes in one place.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The agent does not speak the request's protocol version.
    VersionMismatch,
    /// The request itself is malformed.
    BadRequest,
    /// The netns or container does not exist (or is not a network namespace).
    UnknownContainer,
    /// The Kubernetes API failed or timed out (the runtime should retry).
    KubernetesApi,
    /// The agent cannot serve now (programs not loaded, shutting down).
    Unavailable,
    /// CHECK found the redirection decided at ADD not in force.
    NotInForce,
    /// Anything else (kernel refused, I/O).
    Internal,
}

/// A frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The socket failed or timed out.
    #[error("I/O: {0}")]
    Io(#[from] io::Error),
    /// The peer announced a frame over [`MAX_FRAME`].
    #[error("frame of {0} bytes exceeds the {MAX_FRAME}-byte limit")]
    TooLarge(usize),
    /// The frame is not the JSON we expect.
    #[error("malformed message: {0}")]
    Json(#[from] serde_json::Error),
}

/// Serializes `msg` as one frame (length prefix included).
pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, FrameError> {
    let body = serde_json::to_vec(msg)?;
    if body.len() > MAX_FRAME {
        return Err(FrameError::TooLarge(body.len()));
    }
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    Ok(out)
}

/// Length of the frame whose 4-byte header is `header`, checked against [`MAX_FRAME`].
pub fn frame_len(header: [u8; 4]) -> Result<usize, FrameError> {
    let len = u32::from_be_bytes(header) as usize;
    if len > MAX_FRAME {
        return Err(FrameError::TooLarge(len));
    }
    Ok(len)
}

/// Writes one frame (blocking).
pub fn write_frame<T: Serialize>(w: &mut impl Write, msg: &T) -> Result<(), FrameError> {
    w.write_all(&encode(msg)?)?;
    w.flush()?;
    Ok(())
}

/// Reads one frame (blocking).
pub fn read_frame<T: for<'de> Deserialize<'de>>(r: &mut impl Read) -> Result<T, FrameError> {
    let mut header = [0u8; 4];
    r.read_exact(&mut header)?;
    let mut body = vec![0u8; frame_len(header)?];
    r.read_exact(&mut body)?;
    Ok(serde_json::from_slice(&body)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let req = Envelope::new(Request::Add(Box::new(AddRequest {
            attachment: AttachmentRef {
                container_id: "abc".into(),
                ifname: "eth0".into(),
                netns: "/var/run/netns/cni-1".into(),
            },
            pod: PodRef {
                namespace: "ns".into(),
                name: "p".into(),
                uid: Some("u".into()),
            },
            cgroup_path: None,
            pod_ips: vec!["10.0.0.5".parse().unwrap()],
            config: LinkerdConfig::default(),
            netns_addrs: Some(vec!["10.0.0.5".parse().unwrap()]),
            userns: Some(UsernsMaps {
                dev: 4,
                ino: 4026532178,
                uid_map: "0 100000 65536\n".into(),
                gid_map: "0 100000 65536\n".into(),
            }),
        })));
        let bytes = encode(&req).unwrap();
        let back: Envelope = read_frame(&mut &bytes[..]).unwrap();
        assert_eq!(back, req);
    }

    #[test]
    fn budget_travels_and_leaves_a_margin() {
        let env = Envelope::with_budget(Request::Status, Duration::from_secs(10));
        let bytes = encode(&env).unwrap();
        let back: Envelope = read_frame(&mut &bytes[..]).unwrap();
        assert_eq!(back.budget_ms, Some(10_000));
        assert_eq!(
            back.agent_budget(),
            Some(Duration::from_secs(10) - DEADLINE_MARGIN)
        );
        let tiny = Envelope::with_budget(Request::Status, Duration::from_millis(100));
        assert_eq!(tiny.agent_budget(), Some(Duration::from_millis(50)));
        // An older plugin sends no budget.
        let old: Envelope =
            serde_json::from_str(r#"{"version":1,"request":{"op":"status"}}"#).unwrap();
        assert_eq!(old.budget_ms, None);
        assert_eq!(old.agent_budget(), None);
    }

    #[test]
    fn oversized_frames_are_refused() {
        let header = ((MAX_FRAME + 1) as u32).to_be_bytes();
        assert!(matches!(frame_len(header), Err(FrameError::TooLarge(_))));
        let mut bytes = header.to_vec();
        bytes.extend_from_slice(b"{}");
        assert!(matches!(
            read_frame::<Response>(&mut &bytes[..]),
            Err(FrameError::TooLarge(_))
        ));
    }
}
