//! `linkerd check` after `linkerd install` (no `--pre`): the control plane's `linkerd-config`
//! and webhook, then the CNI checks when `cniEnabled` is true (skipped otherwise); with
//! `--proxy`, also the meshed pods. The checks are [`linkerd_injector::check`]; this module
//! prints them with [`crate::check::print_category`].

use std::io::Write;

use linkerd_injector::check::{self as checks, Status};

use crate::{
    check::{CheckResult, print_category},
    kubernetes::KubeArgs,
};

/// The data-plane category, printed only with `--proxy`.
pub const DATA_PLANE: &str = "linkerd-data-plane";

fn convert(r: &checks::CheckResult) -> CheckResult {
    match r.status {
        Status::Ok => CheckResult::ok(&r.name, &r.detail),
        Status::Warn => CheckResult::ok(&r.name, format!("warning: {}", r.detail)),
        Status::Skipped => CheckResult::ok(&r.name, format!("skipped: {}", r.detail)),
        Status::Fail => CheckResult::fail(&r.name, &r.detail),
    }
}

/// Runs the post-install checks, prints them by category, and says whether all passed.
pub async fn run(
    kube: &KubeArgs,
    linkerd_namespace: &str,
    cni_namespace: &str,
    with_data_plane: bool,
    out: &mut impl Write,
) -> anyhow::Result<bool> {
    let results = match kube.client().await {
        Ok(client) => checks::post_install(&client, linkerd_namespace, cni_namespace).await,
        Err(e) => {
            let r = CheckResult::fail("can initialize the client", e.to_string());
            print_category(out, "kubernetes-api", std::slice::from_ref(&r))?;
            return Ok(false);
        }
    };
    let mut all = true;
    let mut categories: Vec<&str> = Vec::new();
    for r in &results {
        if !categories.contains(&r.category) && (with_data_plane || r.category != DATA_PLANE) {
            categories.push(r.category);
        }
    }
    for category in categories {
        let printed: Vec<CheckResult> = results
            .iter()
            .filter(|r| r.category == category)
            .map(convert)
            .collect();
        all &= printed.iter().all(CheckResult::passed);
        print_category(out, category, &printed)?;
    }
    Ok(all)
}
