//! Why the node agent got SIGTERM: a rolling update (keep the plugin in the conflists, the next
//! agent takes over) or an uninstall (take it out, or every new pod on the node would wait for
//! an agent that never comes back). Decided from the agent's own DaemonSet, within a bound.

use std::time::Duration;

use k8s_openapi::api::{apps::v1::DaemonSet, core::v1::Namespace};
use kube::{Api, Client};

/// What the API says about the agent's DaemonSet when the agent is told to stop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Termination {
    /// The DaemonSet exists and is not being deleted: a rollout (or a node drain); a new agent
    /// follows.
    Rollout,
    /// Deletion is confirmed: the DaemonSet (or its namespace) is gone or being deleted, or
    /// the API says the agent's identity itself is gone (ServiceAccount deleted: 401; its
    /// ClusterRoleBinding deleted: 403 on everything it reads).
    Uninstall(String),
    /// The API could not say (unreachable, no answer within the bound, another error).
    Unknown(String),
}

fn status(e: &kube::Error) -> Option<&kube::core::Status> {
    match e {
        kube::Error::Api(s) => Some(s),
        _ => None,
    }
}

/// Reads DaemonSet `namespace/name` (and, if needed, the namespace) within `bound` in all.
pub async fn termination(
    client: Client,
    namespace: &str,
    name: &str,
    bound: Duration,
) -> Termination {
    match tokio::time::timeout(bound, decide(client, namespace, name)).await {
        Ok(t) => t,
        Err(_) => Termination::Unknown(format!("no answer from the API within {bound:?}")),
    }
}

async fn decide(client: Client, namespace: &str, name: &str) -> Termination {
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), namespace);
    let namespaces: Api<Namespace> = Api::all(client);
    let what = format!("DaemonSet {namespace}/{name}");
    match daemonsets.get(name).await {
        Ok(ds) if ds.metadata.deletion_timestamp.is_some() => {
            Termination::Uninstall(format!("{what} is being deleted"))
        }
        Ok(_) => match namespaces.get(namespace).await {
            Ok(ns) if ns.metadata.deletion_timestamp.is_some() => {
                Termination::Uninstall(format!("namespace {namespace} is being deleted"))
            }
            // The DaemonSet stands; the namespace's answer cannot contradict that.
            _ => Termination::Rollout,
        },
        Err(e) => match status(&e) {
            Some(s) if s.is_not_found() => Termination::Uninstall(format!("{what} not found")),
            Some(s) if s.code == 401 => Termination::Uninstall(
                "the API rejects the agent's credentials (401): its ServiceAccount was deleted"
                    .to_string(),
            ),
            Some(s) if s.code == 403 => {
                // Forbidden on everything (the ClusterRoleBinding is gone), or only on the
                // DaemonSet (its Role or RoleBinding is gone, or an older chart's ClusterRole
                // lacks the rule: nothing says it is an uninstall)? The namespace is a read
                // the agent always had.
                match namespaces.get(namespace).await {
                    Err(e2) if status(&e2).is_some_and(|s| s.code == 403) => {
                        Termination::Uninstall(format!(
                            "the agent's ClusterRoleBinding is gone (403 on {what} and on \
                             namespace {namespace})"
                        ))
                    }
                    _ => Termination::Unknown(format!(
                        "reading {what}: {e} (no Role grants the agent `get` on it)"
                    )),
                }
            }
            _ => Termination::Unknown(format!("reading {what}: {e}")),
        },
    }
}
