//! `linkerd version`: the client's version and, unless `--client`, the control plane's, read as
//! Linkerd reads it (`linkerdVersion` in the `values` of the `linkerd-config` ConfigMap of
//! `-L/--linkerd-namespace`), or "unavailable" when it cannot be read; with `--proxy`, the
//! meshed pods' proxy versions (the tag of each `linkerd-proxy` container's image).

use std::{collections::BTreeMap, io::Write};

use clap::Args;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::{Api, api::ListParams};
use linkerd_cni_k8s::names;
use serde_json::Value as Json;

use crate::kubernetes::{KubeArgs, KubeArgsError};

/// The client's version: the chart's appVersion and the image's default tag.
pub const CLIENT_VERSION: &str = concat!("v", env!("CARGO_PKG_VERSION"));

/// What is printed for a version that cannot be read, as Linkerd prints it.
pub const UNAVAILABLE: &str = "unavailable";

/// The flags of `linkerd version`, Linkerd's.
#[derive(Args, Debug, Clone)]
pub struct VersionArgs {
    /// Print the version number(s) only, with no additional output.
    #[arg(long, env = "LINKERD_VERSION_SHORT")]
    pub short: bool,
    /// Print the client version only (nothing is asked of the cluster).
    #[arg(long, env = "LINKERD_VERSION_CLIENT")]
    pub client: bool,
    /// Print data-plane versions: the proxy image tags of the meshed pods.
    #[arg(long, env = "LINKERD_VERSION_PROXY")]
    pub proxy: bool,
    /// Namespace to use for --proxy versions [default: all namespaces].
    #[arg(short = 'n', long, env = "LINKERD_VERSION_NAMESPACE")]
    pub namespace: Option<String>,
}

/// `linkerdVersion` of a `linkerd-config` ConfigMap, if it has one.
pub fn server_version(config_map: &ConfigMap) -> Option<String> {
    let yaml = config_map.data.as_ref()?.get(names::CONFIG_VALUES_KEY)?;
    let values: Json = serde_yaml_ng::from_str(yaml).ok()?;
    match values.get("linkerdVersion")? {
        Json::String(s) => Some(s.clone()),
        _ => None,
    }
}

/// The version of the proxy of a pod, as Linkerd reads it: the tag of its `linkerd-proxy`
/// container's image (sidecar or native sidecar); none when the image is pinned by digest.
pub fn proxy_version(pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    let image = spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .find(|c| c.name == names::PROXY_CONTAINER)?
        .image
        .as_deref()?;
    if image.contains('@') {
        return None;
    }
    Some(image.rsplit(':').next().unwrap_or(image).to_string())
}

/// Prints the versions; errors only when writing fails or impersonation is asked for (an
/// unreadable server says "unavailable").
pub async fn run(args: &VersionArgs, kube: &KubeArgs, out: &mut impl Write) -> anyhow::Result<()> {
    if args.short {
        writeln!(out, "{CLIENT_VERSION}")?;
    } else {
        writeln!(out, "Client version: {CLIENT_VERSION}")?;
    }
    if args.client {
        return Ok(());
    }
    let client = kube.client().await;
    if let Err(e @ KubeArgsError::Impersonation) = &client {
        anyhow::bail!("{e}");
    }
    let server = match &client {
        Ok(client) => Api::<ConfigMap>::namespaced(client.clone(), &kube.linkerd_namespace)
            .get_opt(names::CONFIG_MAP)
            .await
            .ok()
            .flatten()
            .and_then(|cm| server_version(&cm)),
        Err(_) => None,
    };
    let server = server.unwrap_or_else(|| UNAVAILABLE.to_string());
    if args.short {
        writeln!(out, "{server}")?;
    } else {
        writeln!(out, "Server version: {server}")?;
    }
    if args.proxy {
        let selector = format!(
            "{}={}",
            names::CONTROL_PLANE_NS_LABEL,
            kube.linkerd_namespace
        );
        let pods = match &client {
            Ok(client) => {
                let api: Api<Pod> = match &args.namespace {
                    Some(ns) => Api::namespaced(client.clone(), ns),
                    None => Api::all(client.clone()),
                };
                api.list(&ListParams::default().labels(&selector))
                    .await
                    .ok()
            }
            Err(_) => None,
        };
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for pod in pods.iter().flat_map(|l| l.items.iter()) {
            *counts
                .entry(proxy_version(pod).unwrap_or_default())
                .or_default() += 1;
        }
        if counts.is_empty() {
            writeln!(out, "Proxy versions: {UNAVAILABLE}")?;
        } else {
            writeln!(out, "Proxy versions:")?;
            for (version, n) in counts {
                writeln!(out, "\t{version} ({n} pods)")?;
            }
        }
    }
    Ok(())
}
