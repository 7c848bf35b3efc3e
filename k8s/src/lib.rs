//! The node agent's Kubernetes side: decides from the API whether a pod's traffic is redirected
//! to its proxy, and with which per-pod overrides (the contract's section 2).
//!
//! - [`decision::decide`] is the pure rule: Pod + Namespace + `default/kubernetes` Service +
//!   the conflist's `linkerd` section in, [`Decision`] out.
//! - [`PodSource`] feeds it from a watch cache of this node's pods, with direct GETs for what
//!   the cache does not hold yet.
//! - [`client::ClientBuilder`] builds the API client for every binary of the project;
//!   [`client::client`] is the agent's (in-cluster, or from a kubeconfig file).
//! - [`names`]: Linkerd's vocabulary (container names, annotation and label keys, object
//!   names, defaults), shared with the proxy injector and the CLI.

use std::time::Duration;

pub mod client;
pub mod decision;
pub mod names;
pub mod source;

pub use decision::{AnnotationError, Decision};
pub use source::{PodOrigin, PodSource};

/// Why a pod could not be decided.
#[derive(Debug, thiserror::Error)]
pub enum K8sError {
    /// No client could be built (configuration missing or unusable).
    #[error(transparent)]
    Client(#[from] client::ClientError),
    /// An API request failed (connection, HTTP error, undecodable answer).
    #[error("Kubernetes API: reading {what}: {source}")]
    Api {
        what: String,
        #[source]
        source: Box<kube::Error>,
    },
    /// The API server says the object does not exist.
    #[error("Kubernetes API: {what} not found")]
    NotFound { what: String },
    /// An API request got no answer in time.
    #[error("Kubernetes API: reading {what}: no answer within {after:?}")]
    Timeout { what: String, after: Duration },
    /// The pod of that name is not the pod the runtime is creating (deleted and recreated).
    #[error("pod {namespace}/{name} has uid {found_uid}, the runtime asked for {expected_uid}")]
    PodReplaced {
        namespace: String,
        name: String,
        expected_uid: String,
        found_uid: String,
    },
    /// The watch cache did not finish its first list in time.
    #[error("pod watch cache not synced within {after:?}")]
    NotSynced { after: Duration },
    /// A `config.linkerd.io/*` override is malformed.
    #[error(transparent)]
    Annotation(#[from] AnnotationError),
}

impl K8sError {
    /// Whether retrying later may succeed (API trouble), as opposed to a problem that needs a
    /// person to fix a manifest or the configuration.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Api { .. }
            | Self::NotFound { .. }
            | Self::Timeout { .. }
            | Self::PodReplaced { .. }
            | Self::NotSynced { .. } => true,
            Self::Client(_) | Self::Annotation(_) => false,
        }
    }
}
