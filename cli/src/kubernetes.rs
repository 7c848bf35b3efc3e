//! Connecting to the Kubernetes API: `--kubeconfig` / `--context`, else `KUBECONFIG`,
//! `~/.kube/config` or the in-cluster service account (kube's inference).

use std::{path::PathBuf, time::Duration};

use clap::Args;
use linkerd_cni_k8s::client::{ClientBuilder, ClientError, Fallback};

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

impl KubeArgs {
    /// The client these flags describe: `--kubeconfig` (with `--context`), else the default
    /// kubeconfig with `--context`, else kube's inference; `--api-timeout` bounds connecting
    /// and every read.
    pub async fn client(&self) -> Result<kube::Client, ClientError> {
        let timeout = Duration::from_secs(self.api_timeout_secs.max(1));
        ClientBuilder::new(Fallback::Infer)
            .kubeconfig(self.kubeconfig.as_deref())
            .context(self.context.clone())
            .connect_timeout(timeout)
            .read_timeout(timeout)
            .build()
            .await
    }
}
