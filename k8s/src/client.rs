//! Building the Kubernetes client: in-cluster configuration by default, an explicit kubeconfig
//! file otherwise (the installer's `ZZZ-linkerd-cni-kubeconfig`, or a test server's).

use std::{path::Path, time::Duration};

use kube::{
    Client, Config,
    config::{KubeConfigOptions, Kubeconfig},
};

use crate::K8sError;

/// How long establishing a connection to the API server may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Builds a client from `kubeconfig` (its current context), or from the in-cluster service
/// account when `None`.
///
/// Must be called inside a Tokio runtime (the client spawns its connection tasks there).
pub async fn client(kubeconfig: Option<&Path>) -> Result<Client, K8sError> {
    let mut config = match kubeconfig {
        None => Config::incluster().map_err(K8sError::InCluster)?,
        Some(path) => {
            let kubeconfig_error = |source| K8sError::Kubeconfig {
                path: path.to_path_buf(),
                source,
            };
            let file = Kubeconfig::read_from(path).map_err(kubeconfig_error)?;
            Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .map_err(kubeconfig_error)?
        }
    };
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    // No read timeout here: it would cut the watch stream. Every single request is bounded by
    // the caller instead (see `PodSource::with_timeout`), the watch by kube's own idle timer.
    Client::try_from(config).map_err(K8sError::Client)
}
