//! Connecting to the Kubernetes API: `--kubeconfig` / `--context`, else `KUBECONFIG`,
//! `~/.kube/config` or the in-cluster service account (kube's inference).

use std::{path::PathBuf, time::Duration};

use clap::Args;
use kube::config::{Config, KubeConfigOptions, Kubeconfig};

/// Kubernetes connection flags shared by every subcommand that talks to a cluster.
#[derive(Args, Debug, Clone, Default)]
#[command(next_help_heading = "Kubernetes options")]
pub struct KubeArgs {
    /// Path to the kubeconfig file [default: $KUBECONFIG, ~/.kube/config, or in-cluster].
    #[arg(long, global = true, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// Name of the kubeconfig context to use.
    #[arg(long, global = true, env = "LINKERD_CONTEXT", value_name = "NAME")]
    pub context: Option<String>,
    /// Timeout of each API request, in seconds.
    #[arg(
        long = "api-timeout",
        global = true,
        env = "LINKERD_API_TIMEOUT",
        default_value_t = 10,
        value_name = "SECONDS"
    )]
    pub api_timeout_secs: u64,
}

/// Why no client could be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The kubeconfig could not be read or used.
    #[error("loading kubeconfig: {0}")]
    Kubeconfig(#[from] kube::config::KubeconfigError),
    /// Neither a kubeconfig nor an in-cluster environment was found.
    #[error("finding a cluster (no usable kubeconfig, not in a cluster): {0}")]
    Infer(#[from] kube::config::InferConfigError),
    /// The configuration is not usable by the HTTP client (TLS, proxy...).
    #[error("building the Kubernetes client: {0}")]
    Client(#[from] kube::Error),
}

impl KubeArgs {
    /// The client these flags describe.
    pub async fn client(&self) -> Result<kube::Client, ClientError> {
        let options = KubeConfigOptions {
            context: self.context.clone(),
            ..KubeConfigOptions::default()
        };
        let mut config = match (&self.kubeconfig, &self.context) {
            (Some(path), _) => {
                Config::from_custom_kubeconfig(Kubeconfig::read_from(path)?, &options).await?
            }
            (None, Some(_)) => Config::from_kubeconfig(&options).await?,
            (None, None) => Config::infer().await?,
        };
        let timeout = Some(Duration::from_secs(self.api_timeout_secs.max(1)));
        config.connect_timeout = timeout;
        config.read_timeout = timeout;
        Ok(kube::Client::try_from(config)?)
    }
}
