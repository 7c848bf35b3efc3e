//! The flags Linkerd's CLI takes on every command: connecting to the Kubernetes API
//! (`--kubeconfig` / `--context`, else `KUBECONFIG`, `~/.kube/config` or the in-cluster service
//! account, kube's inference), the namespaces (`-L/--linkerd-namespace`, `--cni-namespace`),
//! and impersonation (`--as`, `--as-group`), which is refused with the way to get it.

use std::{path::PathBuf, time::Duration};

use clap::Args;
use linkerd_cni_k8s::{
    client::{ClientBuilder, ClientError, Fallback},
    names,
};

/// Why no client was built.
#[derive(Debug, thiserror::Error)]
pub enum KubeArgsError {
    /// `--as` or `--as-group` was given: the client cannot impersonate from flags.
    #[error(
        "--as and --as-group are not supported by this CLI: set the impersonation on the \
         kubeconfig's user instead (`as: <user>` and `as-groups: [<group>, ...]` under the \
         user entry of the context in use, which the client honours), or use a context whose \
         user has the rights"
    )]
    Impersonation,
    /// The client could not be built.
    #[error(transparent)]
    Client(#[from] ClientError),
}

/// Linkerd's check of a namespace flag: letters, digits and dashes.
fn namespace(s: &str) -> Result<String, String> {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        Ok(s.to_string())
    } else {
        Err(format!("{s} is not a valid namespace"))
    }
}

/// The flags shared by every subcommand, as Linkerd's root command has them (global: they go
/// before or after the subcommand).
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Global options")]
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
    /// Namespace in which Linkerd's control plane is installed (install renders into it; check,
    /// inject and version read there).
    #[arg(
        short = 'L',
        long,
        global = true,
        env = "LINKERD_NAMESPACE",
        default_value = names::CONTROL_PLANE_NAMESPACE,
        value_parser = namespace,
        value_name = "NAMESPACE"
    )]
    pub linkerd_namespace: String,
    /// Namespace in which the Linkerd CNI plugin is installed (install-cni renders into it,
    /// check looks there).
    #[arg(
        long,
        global = true,
        env = "LINKERD_CNI_NAMESPACE",
        default_value = names::CNI_NAMESPACE,
        value_parser = namespace,
        value_name = "NAMESPACE"
    )]
    pub cni_namespace: String,
    /// Username to impersonate for Kubernetes operations: refused (see the message), set `as`
    /// on the kubeconfig's user instead.
    #[arg(long = "as", global = true, value_name = "USER")]
    pub impersonate: Option<String>,
    /// Group to impersonate for Kubernetes operations: refused, as --as.
    #[arg(long = "as-group", global = true, value_name = "GROUP")]
    pub impersonate_groups: Vec<String>,
}

impl Default for KubeArgs {
    fn default() -> Self {
        Self {
            kubeconfig: None,
            context: None,
            api_timeout_secs: 10,
            linkerd_namespace: names::CONTROL_PLANE_NAMESPACE.to_string(),
            cni_namespace: names::CNI_NAMESPACE.to_string(),
            impersonate: None,
            impersonate_groups: Vec::new(),
        }
    }
}

impl KubeArgs {
    /// The client these flags describe: `--kubeconfig` (with `--context`), else the default
    /// kubeconfig with `--context`, else kube's inference; `--api-timeout` bounds connecting
    /// and every read. Refused with `--as` or `--as-group`, before anything is read.
    pub async fn client(&self) -> Result<kube::Client, KubeArgsError> {
        if self.impersonate.is_some() || !self.impersonate_groups.is_empty() {
            return Err(KubeArgsError::Impersonation);
        }
        let timeout = Duration::from_secs(self.api_timeout_secs.max(1));
        Ok(ClientBuilder::new(Fallback::Infer)
            .kubeconfig(self.kubeconfig.as_deref())
            .context(self.context.clone())
            .connect_timeout(timeout)
            .read_timeout(timeout)
            .build()
            .await?)
    }
}
