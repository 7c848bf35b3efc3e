//! `linkerd check --pre`: Linkerd's pre-install checks that read the cluster, with Linkerd's
//! categories, descriptions and hint anchors (scripts parse `-o json`):
//!
//! - `kubernetes-api`: "can initialize the client", "can query the Kubernetes API" (its
//!   version); when either fails, nothing else is asked;
//! - `kubernetes-version`: "is running the minimum Kubernetes API version" ([`MIN_VERSION`]:
//!   the DaemonSet's `appArmorProfile` field needs 1.30);
//! - `pre-kubernetes-setup`: "control plane namespace does not already exist".
//!
//! Not run (Linkerd's other pre-install checks): the permission checks ("can create ...",
//! "can read Secrets", which ask the API server's SelfSubjectAccessReview), the clock-skew
//! check, the Gateway API CRD check and the version checks against linkerd.io. `kubectl auth
//! can-i create deployments -n linkerd` answers the first kind; Linkerd's own `linkerd check
//! --pre` runs all of them.

use k8s_openapi::api::core::v1::Namespace;
use kube::{Api, Client};

use super::result::CheckResult;
use crate::kubernetes::KubeArgs;

/// Linkerd's category of the client and API checks.
pub const API_CATEGORY: &str = "kubernetes-api";
/// Linkerd's category of the version check.
pub const VERSION_CATEGORY: &str = "kubernetes-version";
/// Linkerd's category of the pre-install checks.
pub const SETUP_CATEGORY: &str = "pre-kubernetes-setup";

/// The oldest Kubernetes the chart renders for: the agent container's
/// `securityContext.appArmorProfile` is a field of 1.30 and later.
pub const MIN_VERSION: (u64, u64) = (1, 30);

/// (major, minor) of a Kubernetes version (`major` "1", `minor` "30" or "30+").
pub fn parse_version(major: &str, minor: &str) -> Option<(u64, u64)> {
    let digits = |s: &str| -> Option<u64> {
        s.chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse()
            .ok()
    };
    Some((digits(major)?, digits(minor)?))
}

/// The version check's verdict.
pub fn version_check(major: &str, minor: &str, git_version: &str) -> CheckResult {
    const NAME: &str = "is running the minimum Kubernetes API version";
    match parse_version(major, minor) {
        Some(v) if v >= MIN_VERSION => CheckResult::ok(VERSION_CATEGORY, NAME, git_version),
        Some((a, b)) => CheckResult::fail(
            VERSION_CATEGORY,
            NAME,
            format!(
                "Kubernetes is on version [{a}.{b}], but version [{}.{}] or more recent is required",
                MIN_VERSION.0, MIN_VERSION.1
            ),
        ),
        None => CheckResult::fail(
            VERSION_CATEGORY,
            NAME,
            format!("cannot read the version {git_version:?} ({major}.{minor})"),
        ),
    }
    .with_hint("k8s-version")
}

/// Runs the checks; every result in order, by category.
pub async fn run(kube: &KubeArgs, control_plane_ns: &str) -> Vec<CheckResult> {
    let mut out = Vec::new();
    let client: Client = match kube.client().await {
        Ok(c) => {
            out.push(
                CheckResult::ok(API_CATEGORY, "can initialize the client", "").with_hint("k8s-api"),
            );
            c
        }
        Err(e) => {
            out.push(
                CheckResult::fail(API_CATEGORY, "can initialize the client", e.to_string())
                    .with_hint("k8s-api"),
            );
            return out;
        }
    };
    let version = match client.apiserver_version().await {
        Ok(v) => {
            out.push(
                CheckResult::ok(API_CATEGORY, "can query the Kubernetes API", "")
                    .with_hint("k8s-api"),
            );
            v
        }
        Err(e) => {
            out.push(
                CheckResult::fail(API_CATEGORY, "can query the Kubernetes API", e.to_string())
                    .with_hint("k8s-api"),
            );
            return out;
        }
    };
    out.push(version_check(
        &version.major,
        &version.minor,
        &version.git_version,
    ));
    const NS_CHECK: &str = "control plane namespace does not already exist";
    out.push(
        match Api::<Namespace>::all(client)
            .get_opt(control_plane_ns)
            .await
        {
            Ok(None) => CheckResult::ok(SETUP_CATEGORY, NS_CHECK, ""),
            Ok(Some(_)) => CheckResult::fail(
                SETUP_CATEGORY,
                NS_CHECK,
                format!("The \"{control_plane_ns}\" namespace already exists"),
            ),
            Err(e) => CheckResult::fail(SETUP_CATEGORY, NS_CHECK, e.to_string()),
        }
        .with_hint("pre-ns"),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        assert_eq!(parse_version("1", "30+"), Some((1, 30)));
        assert!(version_check("1", "30", "v1.30.2").passed());
        assert!(version_check("1", "34", "v1.34.0").passed());
        assert!(!version_check("1", "29", "v1.29.9").passed());
        assert!(!version_check("", "", "?").passed());
    }
}
