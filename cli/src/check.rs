//! `linkerd check`: with no flag (or `--proxy`), the post-install checks ([`post_install`]);
//! with `--linkerd-cni-enabled`, the contract's checks of the linkerd-cni objects in the cluster
//! ([`cluster`]); with `--node`, checks of the machine it runs on as a node ([`node`]: kernel
//! features, bpffs, cgroup v2). Every check gives a [`result::CheckResult`], printed as
//! Linkerd-style `√` / `×` lines; exits non-zero on failure.

pub mod cluster;
pub mod node;
pub mod post_install;
pub mod result;

use std::io::Write;

use clap::Args;
use linkerd_cni_k8s::names;

use self::result::{CheckResult, print_category};
use crate::kubernetes::KubeArgs;

/// The flags of `linkerd check`.
#[derive(Args, Debug, Clone)]
pub struct CheckArgs {
    /// Checks to run before installing the control plane (accepted; the CNI checks are the same
    /// before and after).
    #[arg(long, env = "LINKERD_CHECK_PRE")]
    pub pre: bool,
    /// Check the linkerd-cni installation in the cluster.
    #[arg(long, env = "LINKERD_CHECK_LINKERD_CNI_ENABLED")]
    pub linkerd_cni_enabled: bool,
    /// Namespace of the linkerd-cni objects.
    #[arg(long, env = "LINKERD_CHECK_CNI_NAMESPACE", default_value = names::CNI_NAMESPACE)]
    pub cni_namespace: String,
    /// Also check this machine as a node of the eBPF mode (kernel version, bpffs, cgroup v2).
    /// Meaningful on a node, e.g. from `kubectl debug node/<name>`.
    #[arg(long, env = "LINKERD_CHECK_NODE")]
    pub node: bool,
    /// Post-install checks (what `linkerd check` runs when no other check is asked for):
    /// linkerd-config, the proxy injector, the linkerd-cni objects when cniEnabled is true;
    /// with --proxy also the meshed pods.
    #[arg(long, env = "LINKERD_CHECK_PROXY")]
    pub proxy: bool,
    /// Namespace of the control plane (post-install checks).
    #[arg(long, env = "LINKERD_CHECK_LINKERD_NAMESPACE", default_value = names::CONTROL_PLANE_NAMESPACE)]
    pub linkerd_namespace: String,
}

/// Runs the requested checks, prints them, and says whether all passed.
pub async fn run(args: &CheckArgs, kube: &KubeArgs, out: &mut impl Write) -> anyhow::Result<bool> {
    let post_install = args.proxy || !(args.pre || args.linkerd_cni_enabled || args.node);
    if !post_install && !args.linkerd_cni_enabled && !args.node {
        anyhow::bail!(
            "nothing to check: use --linkerd-cni-enabled for the linkerd-cni objects in the cluster \
             and/or --node for this machine, or no flag (or --proxy) for the post-install checks"
        );
    }
    let mut all = true;
    if post_install {
        all &= post_install::run(
            kube,
            &args.linkerd_namespace,
            &args.cni_namespace,
            args.proxy,
            out,
        )
        .await?;
    }
    if args.linkerd_cni_enabled {
        let results = match kube.client().await {
            Ok(client) => cluster::run(&client, &args.cni_namespace).await,
            Err(e) => vec![CheckResult::fail(
                cluster::CATEGORY,
                "can initialize the client",
                e.to_string(),
            )],
        };
        all &= results.iter().all(CheckResult::passed);
        print_category(out, cluster::CATEGORY, &results)?;
    }
    if args.node {
        let results = node::run(&node::NodeFacts::read_local());
        all &= results.iter().all(CheckResult::passed);
        print_category(out, node::CATEGORY, &results)?;
    }
    writeln!(
        out,
        "Status check results are {}",
        if all { "√" } else { "×" }
    )?;
    Ok(all)
}
