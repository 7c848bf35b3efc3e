//! Building the Kubernetes client, for every binary of the project: the node agent (in-cluster
//! configuration, or the installer's `ZZZ-linkerd-cni-kubeconfig`), the proxy injector and the
//! `linkerd` CLI (`--kubeconfig` / `--context`, else kube's inference).

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

pub use kube::Client;
use kube::{
    Config,
    config::{KubeConfigOptions, Kubeconfig},
};

/// How long establishing a connection to the API server may take (the node agent).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why no Kubernetes client could be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No kubeconfig was given and the in-cluster service account is not usable.
    #[error("in-cluster Kubernetes configuration unavailable: {0}")]
    InCluster(#[source] kube::config::InClusterError),
    /// The kubeconfig file named by the caller cannot be read or used.
    #[error("kubeconfig {}: {source}", path.display())]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// The default kubeconfig (`$KUBECONFIG`, `~/.kube/config`) cannot be read or used with
    /// the context asked for.
    #[error("loading kubeconfig: {0}")]
    DefaultKubeconfig(#[source] kube::config::KubeconfigError),
    /// Neither a kubeconfig nor the in-cluster service account is usable.
    #[error("no Kubernetes configuration (kubeconfig or in-cluster): {0}")]
    Infer(#[from] kube::config::InferConfigError),
    /// The client could not be built from a valid configuration (TLS setup, bad URL).
    #[error("building the Kubernetes client: {0}")]
    Client(#[from] kube::Error),
}

/// Where the configuration comes from when no kubeconfig file (nor context) is named.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fallback {
    /// Only the pod's in-cluster service account (the node agent: nothing else on the host
    /// may redirect it to another cluster).
    InCluster,
    /// kube's inference: in-cluster service account, `$KUBECONFIG`, `~/.kube/config`.
    Infer,
}

/// Builds a [`Client`]; see [`ClientBuilder::build`] for the order in which configurations are
/// tried.
#[derive(Clone, Debug)]
pub struct ClientBuilder {
    kubeconfig: Option<PathBuf>,
    context: Option<String>,
    fallback: Fallback,
    connect_timeout: Option<Duration>,
    read_timeout: Option<Duration>,
}

impl ClientBuilder {
    /// A builder with `fallback`, no kubeconfig, no context and kube's default timeouts.
    pub fn new(fallback: Fallback) -> Self {
        Self {
            kubeconfig: None,
            context: None,
            fallback,
            connect_timeout: None,
            read_timeout: None,
        }
    }

    /// Reads this kubeconfig file (`None`: the fallback).
    pub fn kubeconfig(mut self, path: Option<&Path>) -> Self {
        self.kubeconfig = path.map(Path::to_path_buf);
        self
    }

    /// Uses this context of the kubeconfig rather than its current one. Without a kubeconfig
    /// file, the default kubeconfig (`$KUBECONFIG`, `~/.kube/config`) is read.
    pub fn context(mut self, context: Option<String>) -> Self {
        self.context = context;
        self
    }

    /// Bounds establishing a connection.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }

    /// Bounds every read (unset: kube's default). Leave unset for clients that watch: a short
    /// one would cut the watch stream.
    pub fn read_timeout(mut self, timeout: Duration) -> Self {
        self.read_timeout = Some(timeout);
        self
    }

    /// The client: from the kubeconfig file if one was given, else from the default
    /// kubeconfig if a context was given, else from the [`Fallback`].
    ///
    /// Must be called inside a Tokio runtime (the client spawns its connection tasks there).
    pub async fn build(self) -> Result<Client, ClientError> {
        let options = KubeConfigOptions {
            context: self.context.clone(),
            ..KubeConfigOptions::default()
        };
        let mut config = match (&self.kubeconfig, &self.context) {
            (Some(path), _) => {
                let kubeconfig_error = |source| ClientError::Kubeconfig {
                    path: path.clone(),
                    source,
                };
                let file = Kubeconfig::read_from(path).map_err(kubeconfig_error)?;
                Config::from_custom_kubeconfig(file, &options)
                    .await
                    .map_err(kubeconfig_error)?
            }
            (None, Some(_)) => Config::from_kubeconfig(&options)
                .await
                .map_err(ClientError::DefaultKubeconfig)?,
            (None, None) => match self.fallback {
                Fallback::InCluster => Config::incluster().map_err(ClientError::InCluster)?,
                Fallback::Infer => Config::infer().await?,
            },
        };
        // Unset timeouts keep kube's defaults.
        if let Some(timeout) = self.connect_timeout {
            config.connect_timeout = Some(timeout);
        }
        if let Some(timeout) = self.read_timeout {
            config.read_timeout = Some(timeout);
        }
        Ok(Client::try_from(config)?)
    }
}

/// The node agent's client: from `kubeconfig` (its current context), or from the in-cluster
/// service account when `None`, with [`CONNECT_TIMEOUT`].
///
/// No read timeout: it would cut the watch stream. Every single request is bounded by the
/// caller instead (see `PodSource::with_timeout`), the watch by kube's own idle timer.
///
/// Must be called inside a Tokio runtime (the client spawns its connection tasks there).
pub async fn client(kubeconfig: Option<&Path>) -> Result<Client, ClientError> {
    ClientBuilder::new(Fallback::InCluster)
        .kubeconfig(kubeconfig)
        .connect_timeout(CONNECT_TIMEOUT)
        .build()
        .await
}
