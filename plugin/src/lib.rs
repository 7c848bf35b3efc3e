//! The `linkerd-cni` CNI plugin for Linkerd's eBPF redirection mode.
//!
//! A chained plugin: it never touches interfaces or addresses. ADD hands the pod (identity,
//! netns, cgroup, IPs from `prevResult`, the conflist's `linkerd` section) to the node agent
//! over its Unix socket and prints `prevResult` back in the request's CNI version; DEL,
//! CHECK, GC and STATUS ask the agent too. Pods of excluded namespaces never reach the agent.
//! When the agent cannot be reached, ADD asks the Kubernetes API itself ([`apiserver`]): an
//! unmeshed pod starts, a meshed one gets "try again later" (11), so it never starts unmeshed
//! by accident; DEL succeeds (the agent reaps the registration later).
//!
//! - [`cmd`]: the verbs. [`env`]: `CNI_*` variables. [`netconf`]: stdin.
//! - [`result`]: `prevResult` conversion between spec versions. [`version`]: spec versions.
//! - [`netns`]: is `CNI_NETNS` a network namespace. [`agent`]: the socket client.
//! - [`nft`]: the per-node fallback's nftables rules in the pod's netns (`--mode=iptables`).
//! - [`apiserver`]: the fallback "is this pod meshed" lookup when the agent is down.
//! - [`error`]: errors and the one mapping to CNI codes. [`log`]: stderr logging.

pub mod agent;
pub mod apiserver;
pub mod cmd;
pub mod env;
pub mod error;
mod inside;
pub mod log;
pub mod netconf;
pub mod netns;
pub mod nft;
pub mod result;
pub mod version;

use std::io::Write;

/// Runs the plugin for this process (environment, stdin, stdout, stderr) and returns the
/// exit code.
pub fn run_process() -> i32 {
    let mut log = log::Logger::stderr();
    let get = |var: &str| std::env::var_os(var).map(|v| v.to_string_lossy().into_owned());
    let outcome = cmd::run(
        &get,
        &mut std::io::stdin().lock(),
        &agent::UnixAgent,
        &apiserver::KubeApi,
        &mut log,
    );
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout
        .write_all(outcome.stdout.as_bytes())
        .and_then(|()| stdout.flush())
    {
        log.error(format_args!("writing the result to stdout: {e}"));
        return 1;
    }
    outcome.exit_code
}
