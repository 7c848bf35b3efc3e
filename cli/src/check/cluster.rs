//! The contract's checks of an installation in the cluster: the linkerd-cni ConfigMap,
//! ClusterRole, ClusterRoleBinding, ServiceAccount and DaemonSet exist, and the DaemonSet is
//! ready on every node it is scheduled to.

use k8s_openapi::{
    api::{
        apps::v1::DaemonSet,
        core::v1::{ConfigMap, ServiceAccount},
        rbac::v1::{ClusterRole, ClusterRoleBinding},
    },
    serde::de::DeserializeOwned,
};
use kube::{Api, Client, Resource};

use linkerd_cni_k8s::names;

use super::result::CheckResult;

/// The category these checks are printed under.
pub const CATEGORY: &str = "linkerd-cni-plugin";

async fn exists<K>(api: Api<K>, what: &str, name: &str, where_: &str) -> (CheckResult, Option<K>)
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let check = format!("cni plugin {what} exists");
    match api.get_opt(name).await {
        Ok(Some(obj)) => (CheckResult::ok(CATEGORY, check, ""), Some(obj)),
        Ok(None) => (
            CheckResult::fail(
                CATEGORY,
                check,
                format!("{what} {name:?} not found{where_}"),
            ),
            None,
        ),
        Err(e) => (
            CheckResult::fail(
                CATEGORY,
                check,
                format!("getting {what} {name:?}{where_}: {e}"),
            ),
            None,
        ),
    }
}

/// Whether the DaemonSet runs a ready pod on every node it should run on.
pub fn daemonset_ready(ds: &DaemonSet) -> Result<String, String> {
    let status = ds
        .status
        .as_ref()
        .ok_or("the DaemonSet has no status yet")?;
    let (desired, ready) = (status.desired_number_scheduled, status.number_ready);
    if desired == 0 {
        return Err("the DaemonSet is not scheduled on any node".into());
    }
    if ready < desired {
        return Err(format!(
            "{ready} of {desired} linkerd-cni pods are ready; a pod is ready only when the plugin is in \
             every conflist of its node and the eBPF programs are loaded\n\
             see: kubectl -n linkerd-cni get pods -o wide; kubectl -n linkerd-cni logs -c install-cni <pod>"
        ));
    }
    Ok(format!("{ready}/{desired} nodes"))
}

/// Runs the checks against the cluster behind `client`.
pub async fn run(client: &Client, namespace: &str) -> Vec<CheckResult> {
    let in_ns = format!(" in namespace {namespace}");
    let mut results = vec![
        exists(
            Api::<ConfigMap>::namespaced(client.clone(), namespace),
            "ConfigMap",
            names::CNI_CONFIG_MAP,
            &in_ns,
        )
        .await
        .0,
        exists(
            Api::<ClusterRole>::all(client.clone()),
            "ClusterRole",
            names::CNI_NAME,
            "",
        )
        .await
        .0,
        exists(
            Api::<ClusterRoleBinding>::all(client.clone()),
            "ClusterRoleBinding",
            names::CNI_NAME,
            "",
        )
        .await
        .0,
        exists(
            Api::<ServiceAccount>::namespaced(client.clone(), namespace),
            "ServiceAccount",
            names::CNI_NAME,
            &in_ns,
        )
        .await
        .0,
    ];
    let (ds_check, ds) = exists(
        Api::<DaemonSet>::namespaced(client.clone(), namespace),
        "DaemonSet",
        names::CNI_NAME,
        &in_ns,
    )
    .await;
    results.push(ds_check);
    let ready = "cni plugin pod is running on all nodes";
    results.push(match ds {
        Some(ds) => CheckResult::from_outcome(CATEGORY, ready, daemonset_ready(&ds)),
        None => CheckResult::fail(CATEGORY, ready, "no DaemonSet to check"),
    });
    results
}
