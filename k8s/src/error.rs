//! Why a pod could not be decided, and whether trying again may help.

use std::time::Duration;

use crate::{client::ClientError, decision::AnnotationError};

/// Why a pod could not be decided.
#[derive(Debug, thiserror::Error)]
pub enum K8sError {
    /// No client could be built (configuration missing or unusable).
    #[error(transparent)]
    Client(#[from] ClientError),
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
