//! `linkerd check`: with no flag (or `--proxy`), the post-install checks ([`post_install`]);
//! with `--linkerd-cni-enabled`, the contract's checks of the linkerd-cni objects in the cluster
//! ([`cluster`]); with `--node`, checks of the machine it runs on as a node ([`node`]: kernel
//! features, bpffs, cgroup v2). Every check gives a [`result::CheckResult`], printed as
//! Linkerd-style `√` / `×` lines (or Linkerd's JSON with `-o json`); exits non-zero on
//! failure. `--wait` bounds how long the readiness checks (the linkerd-cni DaemonSet, the
//! proxy injector) are tried again, every 5 s, as Linkerd's `--wait` does.

pub mod cluster;
pub mod node;
pub mod post_install;
pub mod pre;
pub mod redirection;
pub mod result;

use std::{io::Write, time::Duration};

use clap::Args;

use self::result::{CheckResult, OutputFormat, Printer};
use crate::kubernetes::KubeArgs;

/// Linkerd's default of `--wait`.
pub const DEFAULT_WAIT: &str = "5m0s";

/// Parses a duration the way Go's `time.ParseDuration` does (`300s`, `5m0s`, `1m30s`, `1.5h`,
/// `500ms`, `0`), as Linkerd's `--wait` takes it.
pub fn parse_go_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("invalid duration {s:?} (e.g. 300s, 5m0s, 1m30s)");
    let t = s.trim();
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    if t.is_empty() || t.starts_with('-') {
        return Err(bad());
    }
    let mut rest = t.strip_prefix('+').unwrap_or(t);
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let number: f64 = rest[..num_len].parse().map_err(|_| bad())?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += number * seconds;
        rest = &rest[unit_len..];
    }
    Duration::try_from_secs_f64(total).map_err(|_| bad())
}

/// The flags of `linkerd check`.
#[derive(Args, Debug, Clone)]
pub struct CheckArgs {
    /// Pre-installation checks: alone, Linkerd's checks that read the cluster (the client, the
    /// API, the minimum Kubernetes version, the control plane namespace absent); with
    /// --linkerd-cni-enabled, the linkerd-cni installation the control plane will rely on.
    #[arg(long, env = "LINKERD_CHECK_PRE")]
    pub pre: bool,
    /// With --pre: check the linkerd-cni installation in the cluster (its objects, and its
    /// DaemonSet ready on every node, waited for up to --wait).
    #[arg(long, env = "LINKERD_CHECK_LINKERD_CNI_ENABLED")]
    pub linkerd_cni_enabled: bool,
    /// Also check this machine as a node of the eBPF mode (kernel version, bpffs, cgroup v2,
    /// other programs on the cgroup hooks we use on the pods' path).
    /// Meaningful on a node, e.g. from `kubectl debug node/<name>`.
    #[arg(long, env = "LINKERD_CHECK_NODE")]
    pub node: bool,
    /// With --node: the cgroup whose programs (and its kubepods cgroup's) are listed as the
    /// other tenants on the pods' path (default: the cgroup2 mount).
    #[arg(long, requires = "node")]
    pub cgroup_root: Option<std::path::PathBuf>,
    /// Post-install checks (what `linkerd check` runs when no other check is asked for):
    /// linkerd-config, the proxy injector, the linkerd-cni objects when cniEnabled is true;
    /// with --proxy also the meshed pods.
    #[arg(long, env = "LINKERD_CHECK_PROXY")]
    pub proxy: bool,
    /// Maximum allowed time for all checks to pass: readiness checks (the linkerd-cni
    /// DaemonSet, the proxy injector) are retried every 5s until then (Go duration: 300s,
    /// 5m0s, 1m30s; 0 for no retry).
    #[arg(long, env = "LINKERD_CHECK_WAIT", default_value = DEFAULT_WAIT, value_parser = parse_go_duration)]
    pub wait: Duration,
    /// Output format.
    #[arg(
        short = 'o',
        long,
        env = "LINKERD_CHECK_OUTPUT",
        value_enum,
        default_value = "table"
    )]
    pub output: OutputFormat,
}

impl CheckArgs {
    /// Linkerd's rules for combining the flags.
    pub fn validate(&self) -> Result<(), String> {
        if self.pre && self.proxy {
            return Err("--pre and --proxy flags are mutually exclusive".into());
        }
        if self.linkerd_cni_enabled && !self.pre {
            return Err("--linkerd-cni-enabled can only be used with --pre".into());
        }
        Ok(())
    }
}

/// Runs the requested checks, prints them, and says whether all passed.
pub async fn run(args: &CheckArgs, kube: &KubeArgs, out: &mut impl Write) -> anyhow::Result<bool> {
    if let Err(e) = args.validate() {
        anyhow::bail!("Validation error when executing check command: {e}");
    }
    let post_install = args.proxy || !(args.pre || args.node);
    let mut printer = Printer::new(out, args.output);
    // --pre alone: Linkerd's pre-install checks that read the cluster (check/pre.rs says which);
    // with --linkerd-cni-enabled, the linkerd-cni installation's checks instead.
    if args.pre && !args.linkerd_cni_enabled && !args.node {
        let results = pre::run(kube, &kube.linkerd_namespace).await;
        for category in [
            pre::API_CATEGORY,
            pre::VERSION_CATEGORY,
            pre::SETUP_CATEGORY,
        ] {
            let in_category: Vec<CheckResult> = results
                .iter()
                .filter(|r| r.category == category)
                .cloned()
                .collect();
            if !in_category.is_empty() {
                printer.category(category, &in_category)?;
            }
        }
    }
    let retry = cluster::Retry::for_wait(args.wait);
    // Progress while a check is retried, for a person watching (Linkerd's spinner).
    let interactive =
        args.output != OutputFormat::Json && std::io::IsTerminal::is_terminal(&std::io::stderr());
    let mut on_retry = |r: &CheckResult| {
        if interactive {
            eprintln!(
                "waiting for \"{}\": {}",
                r.name,
                r.detail.lines().next().unwrap_or("")
            );
        }
    };
    if post_install {
        post_install::run(
            kube,
            &kube.linkerd_namespace,
            &kube.cni_namespace,
            args.proxy,
            retry,
            &mut on_retry,
            &mut printer,
        )
        .await?;
    }
    if args.linkerd_cni_enabled {
        let results = match kube.client().await {
            Ok(client) => cluster::run(&client, &kube.cni_namespace, retry, &mut on_retry).await,
            Err(e) => vec![CheckResult::fail(
                cluster::CATEGORY,
                "can initialize the client",
                e.to_string(),
            )],
        };
        printer.category(cluster::CATEGORY, &results)?;
    }
    if args.node {
        let results = node::run(&node::NodeFacts::read_local(args.cgroup_root.as_deref()));
        printer.category(node::CATEGORY, &results)?;
    }
    Ok(printer.finish()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        for (s, secs) in [
            ("5m0s", 300.0),
            ("300s", 300.0),
            ("1m30s", 90.0),
            ("1.5h", 5400.0),
            ("500ms", 0.5),
            ("0", 0.0),
            ("0s", 0.0),
            ("2h45m", 9900.0),
        ] {
            assert_eq!(
                parse_go_duration(s).map(|d| d.as_secs_f64()),
                Ok(secs),
                "{s}"
            );
        }
        for bad in ["", "5", "5x", "-1s", "s", "1..5s", "m5"] {
            assert!(
                parse_go_duration(bad).is_err(),
                "{bad:?} should be rejected"
            );
        }
    }
}
