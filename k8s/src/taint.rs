//! The startup taint: node pools register their nodes with [`STARTUP_TAINT_KEY`]`:NoSchedule`
//! (kubelet `--register-with-taints`, Karpenter `startupTaints`, a cloud node pool's taints),
//! so that no pod is scheduled to a new node before linkerd-cni is ready there; the agent's
//! DaemonSet tolerates it, and the agent removes it from its own node once it is ready
//! ([`remove_when_ready`]). It never puts it back: the taint only keeps the scheduler away,
//! and once the node runs pods an agent restart is covered by the plugin failing closed (an
//! ADD with no agent is refused and retried by kubelet); re-tainting on every restart would
//! make every node unschedulable during each rollout of the DaemonSet.
//!
//! Named as the field names its startup taints (Cilium's `node.cilium.io/agent-not-ready`,
//! Istio's `cni.istio.io/not-ready`): the component's subdomain of the vendor's domain, and
//! the condition. `NoSchedule`, as both: `NoExecute` would also evict what already runs on the
//! node (DaemonSets of other components that do not tolerate it), which nothing here needs.
//!
//! The removal is one strategic merge patch whose `$patch: delete` directive removes the
//! taint by its key: no GET, no read-modify-write race with other writers of the node's
//! taints, idempotent (a node without the taint is unchanged). RBAC: `patch` on `nodes`,
//! narrowed to this taint on the agent's own node by the chart's ValidatingAdmissionPolicy.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};

/// The taint's key.
pub const STARTUP_TAINT_KEY: &str = "cni.linkerd.io/agent-not-ready";
/// The taint's effect.
pub const STARTUP_TAINT_EFFECT: &str = "NoSchedule";

/// The first pause after a failed removal; doubled up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// The longest pause between two attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How often readiness is looked at before the agent is ready.
pub const READY_POLL: Duration = Duration::from_millis(200);

/// Whether node `node` carries the startup taint.
pub fn has_startup_taint(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == STARTUP_TAINT_KEY))
}

/// Removes the startup taint from node `node_name` (a node without it is left unchanged).
pub async fn remove_startup_taint(client: &Client, node_name: &str) -> Result<(), kube::Error> {
    let patch = serde_json::json!({
        "spec": {"taints": [{"key": STARTUP_TAINT_KEY, "$patch": "delete"}]}
    });
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .patch(
            node_name,
            &PatchParams::default(),
            &Patch::Strategic(&patch),
        )
        .await?;
    Ok(())
}

/// Waits until `not_ready` says nothing (the agent's `/ready` rule: programs loaded, the
/// socket serving, the plugin in every conflist), then removes the startup taint from
/// `node_name`, retrying with backoff ([`FIRST_BACKOFF`] doubling to [`MAX_BACKOFF`]) until
/// the API takes it.
pub async fn remove_when_ready(
    client: Client,
    node_name: String,
    not_ready: impl Fn() -> Option<String>,
) {
    let mut logged = false;
    while let Some(why) = not_ready() {
        if !logged {
            tracing::info!(reason = %why, node = %node_name,
                "startup taint stays until the agent is ready");
            logged = true;
        }
        tokio::time::sleep(READY_POLL).await;
    }
    let mut backoff = FIRST_BACKOFF;
    loop {
        match remove_startup_taint(&client, &node_name).await {
            Ok(()) => {
                tracing::info!(node = %node_name, taint = STARTUP_TAINT_KEY,
                    "agent ready: the node's startup taint is gone");
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, node = %node_name, retry_in = ?backoff,
                    "removing the startup taint failed");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}
