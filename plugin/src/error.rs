//! Everything that can go wrong, and the one place that turns it into a CNI error code.
//!
//! [`cni_code`] is the only function that knows the numbers. Choices made there that the CNI
//! spec leaves open:
//!
//! - A netns path that exists but is not a network namespace is code 3, like a missing one:
//!   either way the container the runtime names is not there. The message says which.
//! - A network config over [`crate::netconf::MAX_CONFIG_BYTES`] is code 6 (not decoded).
//!   Broken JSON is 6; well-formed JSON with a wrong type or value is 7, naming the key.
//! - The node agent unreachable, timing out or hanging up is 11 (try again later) for ADD of a
//!   meshed pod (or of a pod the Kubernetes API cannot tell about), CHECK and GC. ADD of an
//!   unmeshed pod and DEL succeed without the agent (see `cmd`). STATUS reports every failure
//!   as 50.
//! - The agent answering `VersionMismatch` is 11, not 1: code 1 is about CNI spec versions,
//!   while a plugin/agent protocol mismatch only happens during a rollout of the DaemonSet and
//!   goes away on retry.
//! - Plugin-specific codes: 100 CHECK found the redirection not in force (the eBPF state, or
//!   the fallback's rules), 101 the agent failed internally, 102 the agent's answer broke the
//!   protocol, 103 the fallback's rules could not be written or read in the pod's netns.

use std::io;

use linkerd_cni_proto::wire::ErrorKind;
use serde::Serialize;

use crate::{
    apiserver::ApiError,
    version::{Command, SpecVersion},
};

/// A failure of the plugin, as precise as the code that saw it.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// The network config's `cniVersion` is not one this plugin speaks.
    #[error("CNI version {version:?} is not supported (supported: {supported})")]
    UnsupportedVersion { version: String, supported: String },
    /// The verb exists only from a later spec version than the config's.
    #[error("{command} needs CNI spec version {since} or later, the network config says {version}")]
    VerbTooNew {
        command: Command,
        version: SpecVersion,
        since: SpecVersion,
    },
    /// The network config uses a field this plugin cannot honour.
    #[error("unsupported field {field} in network config: {reason}")]
    UnsupportedField { field: String, reason: String },
    /// `CNI_NETNS` names nothing.
    #[error("container unknown or does not exist: network namespace {path:?} not found")]
    NetnsMissing { path: String },
    /// `CNI_NETNS` names something that is not a network namespace.
    #[error("container unknown or does not exist: {path:?} is {what}, not a network namespace")]
    NotANetns { path: String, what: String },
    /// A `CNI_*` environment variable is missing or malformed.
    #[error("invalid environment variable {var}: {reason}")]
    InvalidEnv { var: &'static str, reason: String },
    /// Reading stdin or inspecting the netns failed.
    #[error("I/O failure: {what}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    /// stdin is not JSON.
    #[error("failed to decode the network config on stdin")]
    Decode {
        #[source]
        source: serde_json::Error,
    },
    /// stdin is larger than the plugin accepts.
    #[error("failed to decode the network config: it exceeds {limit} bytes")]
    ConfigTooLarge { limit: usize },
    /// The network config is JSON but not a valid config (missing key, wrong type or value).
    #[error("invalid network config: {field}: {reason}")]
    InvalidConfig { field: String, reason: String },
    /// Talking to the node agent failed, or the agent refused.
    #[error(transparent)]
    Agent(#[from] AgentError),
    /// ADD of a meshed pod while the node agent is unavailable: it is not started unmeshed.
    #[error(
        "pod is meshed (it has a linkerd-proxy container) and the linkerd-cni node agent at \
         {socket} is unavailable: not starting it unredirected; the runtime retries the ADD and \
         it starts once the agent is back"
    )]
    MeshedAgentDown {
        socket: String,
        #[source]
        source: AgentError,
    },
    /// ADD while the node agent is unavailable and the Kubernetes API cannot say whether the
    /// pod is meshed.
    #[error(
        "the linkerd-cni node agent at {socket} is unavailable ({agent}) and the Kubernetes API \
         cannot tell whether the pod is meshed: not starting it; the runtime retries the ADD"
    )]
    AgentAndApiDown {
        socket: String,
        agent: Box<AgentError>,
        #[source]
        source: ApiError,
    },
    /// ADD with no node agent running (its socket absent) and the Kubernetes API rejecting
    /// the plugin's credentials (401/403): what a node looks like when linkerd-cni was
    /// uninstalled but its entry stayed in the conflist. Fails closed like
    /// [`Self::AgentAndApiDown`] (the pod may be meshed), and says how to get out.
    #[error(
        "the linkerd-cni node agent is not running ({agent}) and the Kubernetes API rejects \
         linkerd-cni's credentials (status {status}): linkerd-cni looks uninstalled (its \
         ServiceAccount or RBAC deleted) while this node's CNI config still lists it. Not \
         starting the pod, it may be meshed. If linkerd-cni was removed, run \
         `linkerd-cni-agent uninstall` on this node, or remove the linkerd-cni entry from the \
         conflists in the CNI config directory (and its ZZZ-linkerd-cni-kubeconfig); otherwise \
         reinstall linkerd-cni so its agent comes back"
    )]
    Orphaned {
        status: u16,
        agent: Box<AgentError>,
        #[source]
        source: ApiError,
    },
    /// Writing, reading or deleting Linkerd's rules in the pod's network namespace (the
    /// per-node fallback) failed: the ADD of a meshed pod fails with it.
    #[error("{what} in network namespace {netns:?}")]
    Rules {
        what: &'static str,
        netns: String,
        #[source]
        source: crate::nft::NftError,
    },
    /// CHECK of a pod of the per-node fallback: its rules are not those its configuration
    /// makes.
    #[error("Linkerd's rules are not in force in network namespace {netns:?}: {why}")]
    RulesNotInForce { netns: String, why: String },
    /// STATUS: the plugin cannot serve ADDs now.
    #[error("linkerd-cni is not available: {reason}")]
    NotAvailable {
        reason: String,
        #[source]
        source: Option<AgentError>,
    },
}

/// A failed exchange with the node agent.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// Nothing listens on the socket (agent not running, socket missing).
    #[error("cannot reach the linkerd-cni node agent at {socket}")]
    Unreachable {
        socket: String,
        #[source]
        source: io::Error,
    },
    /// The agent did not answer within `linkerd.agent-timeout-ms`.
    #[error("the linkerd-cni node agent at {socket} did not answer within {timeout_ms} ms")]
    Timeout { socket: String, timeout_ms: u64 },
    /// The connection broke mid-exchange (agent restarting).
    #[error("the connection to the linkerd-cni node agent at {socket} failed")]
    Connection {
        socket: String,
        #[source]
        source: io::Error,
    },
    /// The agent's answer is not a valid response to the request.
    #[error("the linkerd-cni node agent at {socket} broke the protocol: {detail}")]
    Protocol { socket: String, detail: String },
    /// The agent answered with an error.
    #[error("the linkerd-cni node agent refused the request ({kind:?}): {message}")]
    Refused { kind: ErrorKind, message: String },
}

/// The CNI error code for `err`. The only place that knows the numbers (see the module doc
/// for the choices made).
pub fn cni_code(err: &PluginError) -> u32 {
    match err {
        PluginError::UnsupportedVersion { .. } | PluginError::VerbTooNew { .. } => 1,
        PluginError::UnsupportedField { .. } => 2,
        PluginError::NetnsMissing { .. } | PluginError::NotANetns { .. } => 3,
        PluginError::InvalidEnv { .. } => 4,
        PluginError::Io { .. } => 5,
        PluginError::Decode { .. } | PluginError::ConfigTooLarge { .. } => 6,
        PluginError::InvalidConfig { .. } => 7,
        PluginError::NotAvailable { .. } => 50,
        PluginError::RulesNotInForce { .. } => 100,
        PluginError::Rules { .. } => 103,
        PluginError::MeshedAgentDown { .. }
        | PluginError::AgentAndApiDown { .. }
        | PluginError::Orphaned { .. } => 11,
        PluginError::Agent(agent) => match agent {
            AgentError::Unreachable { .. }
            | AgentError::Timeout { .. }
            | AgentError::Connection { .. } => 11,
            AgentError::Protocol { .. } => 102,
            AgentError::Refused { kind, .. } => match kind {
                ErrorKind::UnknownContainer => 3,
                ErrorKind::BadRequest => 7,
                ErrorKind::KubernetesApi | ErrorKind::Unavailable | ErrorKind::VersionMismatch => {
                    11
                }
                ErrorKind::NotInForce => 100,
                ErrorKind::Internal => 101,
            },
        },
    }
}

/// What every error reply's `msg` starts with, as every line the plugin logs does.
pub const MSG_PREFIX: &str = "linkerd-cni: ";

/// The CNI error object printed on stdout.
#[derive(Debug, Serialize)]
pub struct CniErrorBody {
    #[serde(rename = "cniVersion")]
    pub cni_version: &'static str,
    pub code: u32,
    pub msg: String,
    pub details: String,
}

impl CniErrorBody {
    /// The error reply for `err` in spec version `version`. `details` holds the chain of
    /// underlying causes, or what the operator can do about it.
    pub fn new(err: &PluginError, version: SpecVersion) -> Self {
        let mut causes = Vec::new();
        let mut source = std::error::Error::source(err);
        while let Some(s) = source {
            causes.push(s.to_string());
            source = s.source();
        }
        let code = cni_code(err);
        let mut details = causes.join(": ");
        if code == 11 {
            if !details.is_empty() {
                details.push_str("; ");
            }
            details.push_str(
                "is the linkerd-cni DaemonSet running on this node? The pod is not started \
                 unmeshed; the runtime retries",
            );
        }
        Self {
            cni_version: version.as_str(),
            code,
            // The runtime logs `msg` (and the pod's `FailedCreatePodSandBox` event carries it)
            // without the plugin's standard error: the prefix lets an operator grep for it as
            // for the plugin's own log lines.
            msg: format!("{MSG_PREFIX}{err}"),
            details,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(kind: ErrorKind) -> PluginError {
        PluginError::Agent(AgentError::Refused {
            kind,
            message: "m".into(),
        })
    }

    #[test]
    fn every_error_has_its_code() {
        let io = || io::Error::from(io::ErrorKind::NotFound);
        let json = || serde_json::from_str::<serde_json::Value>("{").expect_err("broken JSON");
        let s = || "x".to_string();
        let table: Vec<(PluginError, u32)> = vec![
            (
                PluginError::UnsupportedVersion {
                    version: s(),
                    supported: s(),
                },
                1,
            ),
            (
                PluginError::VerbTooNew {
                    command: Command::Check,
                    version: SpecVersion::V0_3_1,
                    since: SpecVersion::V0_4_0,
                },
                1,
            ),
            (
                PluginError::UnsupportedField {
                    field: s(),
                    reason: s(),
                },
                2,
            ),
            (PluginError::NetnsMissing { path: s() }, 3),
            (
                PluginError::NotANetns {
                    path: s(),
                    what: s(),
                },
                3,
            ),
            (
                PluginError::InvalidEnv {
                    var: "CNI_IFNAME",
                    reason: s(),
                },
                4,
            ),
            (
                PluginError::Io {
                    what: s(),
                    source: io(),
                },
                5,
            ),
            (PluginError::Decode { source: json() }, 6),
            (PluginError::ConfigTooLarge { limit: 1 }, 6),
            (
                PluginError::InvalidConfig {
                    field: s(),
                    reason: s(),
                },
                7,
            ),
            (
                PluginError::NotAvailable {
                    reason: s(),
                    source: None,
                },
                50,
            ),
            (
                AgentError::Unreachable {
                    socket: s(),
                    source: io(),
                }
                .into(),
                11,
            ),
            (
                PluginError::MeshedAgentDown {
                    socket: s(),
                    source: AgentError::Unreachable {
                        socket: s(),
                        source: io(),
                    },
                },
                11,
            ),
            (
                PluginError::AgentAndApiDown {
                    socket: s(),
                    agent: Box::new(AgentError::Timeout {
                        socket: s(),
                        timeout_ms: 1,
                    }),
                    source: ApiError::NoKubeconfig,
                },
                11,
            ),
            (
                AgentError::Timeout {
                    socket: s(),
                    timeout_ms: 1,
                }
                .into(),
                11,
            ),
            (
                AgentError::Connection {
                    socket: s(),
                    source: io(),
                }
                .into(),
                11,
            ),
            (
                AgentError::Protocol {
                    socket: s(),
                    detail: s(),
                }
                .into(),
                102,
            ),
            (agent(ErrorKind::UnknownContainer), 3),
            (agent(ErrorKind::BadRequest), 7),
            (agent(ErrorKind::KubernetesApi), 11),
            (agent(ErrorKind::Unavailable), 11),
            (agent(ErrorKind::VersionMismatch), 11),
            (agent(ErrorKind::NotInForce), 100),
            (agent(ErrorKind::Internal), 101),
            (
                PluginError::RulesNotInForce {
                    netns: s(),
                    why: s(),
                },
                100,
            ),
            (
                PluginError::Rules {
                    what: "writing",
                    netns: s(),
                    source: crate::nft::NftError::Timeout(std::time::Duration::ZERO, "x"),
                },
                103,
            ),
        ];
        for (err, code) in table {
            assert_eq!(cni_code(&err), code, "code of {err:?}");
        }
    }

    #[test]
    fn body_carries_message_causes_and_version() {
        let err = PluginError::Agent(AgentError::Unreachable {
            socket: "/run/a.sock".into(),
            source: io::Error::from(io::ErrorKind::ConnectionRefused),
        });
        let body = CniErrorBody::new(&err, SpecVersion::V0_4_0);
        let json = serde_json::to_value(&body).expect("serializes");
        assert_eq!(json["cniVersion"], "0.4.0");
        assert_eq!(json["code"], 11);
        assert!(
            json["msg"]
                .as_str()
                .is_some_and(|m| m.starts_with("linkerd-cni: ") && m.contains("/run/a.sock")),
            "{json}"
        );
        let details = json["details"].as_str().unwrap_or_default();
        assert!(
            details.starts_with("connection refused"),
            "cause first: {details}"
        );
        assert!(details.contains("DaemonSet"), "hint present: {details}");
    }
}
