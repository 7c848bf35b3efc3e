//! Linkerd proxy injection honouring `cniEnabled`.
//!
//! - [`decision`]: whether a pod gets a proxy (`linkerd.io/inject` on pod and namespace).
//! - [`patch`]: what injection adds (`linkerd-proxy` as a native sidecar, and either
//!   `linkerd-init` or, with `cniEnabled`, `linkerd-network-validator`) as an RFC 6902 patch;
//!   [`patch::injected_pod`] turns a pod JSON into the injected pod JSON.
//! - [`values`]: the control plane's values in ConfigMap `linkerd-config`.
//! - [`admission`], [`webhook`], [`server`], [`metrics`], [`tls`]: the HTTPS admission webhook
//!   (binary `linkerd-proxy-injector`).
//! - [`manifest`]: `linkerd inject` / `linkerd uninject` over multi-document YAML.
//! - [`install`]: the objects `linkerd install` renders (namespace, `linkerd-config`, the
//!   injector and its webhook configuration).
//! - [`check`]: post-install checks that honour `cniEnabled`.

pub mod admission;
pub mod check;
pub mod decision;
pub mod install;
pub mod manifest;
pub mod metrics;
pub mod names;
pub mod patch;
pub mod server;
pub mod tls;
pub mod values;
pub mod webhook;

pub use decision::{Decision, InjectMode, SkipReason};
pub use patch::{InjectContext, InjectError, inject_pod, injected_pod, uninject_pod};
pub use values::Values;

/// Why no Kubernetes client could be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The kubeconfig file could not be read or used.
    #[error("kubeconfig {}: {source}", path.display())]
    Kubeconfig {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// Neither a kubeconfig nor the in-cluster service account is usable.
    #[error("no Kubernetes configuration (kubeconfig or in-cluster): {0}")]
    Infer(#[from] kube::config::InferConfigError),
    /// The configuration could not make a client.
    #[error("building the Kubernetes client: {0}")]
    Client(#[from] kube::Error),
}

/// A Kubernetes client from `kubeconfig`, or else inferred (in-cluster service account,
/// `$KUBECONFIG`, `~/.kube/config`), with `timeout` on connecting and reading.
pub async fn kube_client(
    kubeconfig: Option<&std::path::Path>,
    timeout: std::time::Duration,
) -> Result<kube::Client, ClientError> {
    let mut config = match kubeconfig {
        Some(path) => {
            let err = |source| ClientError::Kubeconfig {
                path: path.to_path_buf(),
                source,
            };
            let kc = kube::config::Kubeconfig::read_from(path).map_err(err)?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(err)?
        }
        None => kube::Config::infer().await?,
    };
    config.connect_timeout = Some(timeout);
    config.read_timeout = Some(timeout);
    Ok(kube::Client::try_from(config)?)
}
