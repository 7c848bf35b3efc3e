//! The contract's checks of an installation in the cluster: the linkerd-cni ConfigMap,
//! ClusterRole, ClusterRoleBinding, ServiceAccount and DaemonSet exist, the namespace's Pod
//! Security level admits the DaemonSet's pod ([`PSA_CHECK`], this project's own), the
//! DaemonSet is ready on every node it is scheduled to, and (this project's own) no meshed pod
//! of any node runs without redirection ([`super::redirection`]).
//!
//! As in Linkerd, the existence checks run once, and the readiness check is retried every
//! [`RETRY_INTERVAL`] until it passes or `--wait` runs out (when everything before it passed),
//! so `kubectl apply` followed by `linkerd check` waits for a fresh DaemonSet.

use std::time::{Duration, Instant};

use k8s_openapi::{
    api::{
        apps::v1::DaemonSet,
        core::v1::{ConfigMap, Namespace, ServiceAccount},
        rbac::v1::{ClusterRole, ClusterRoleBinding},
    },
    serde::de::DeserializeOwned,
};
use kube::{Api, Client, Resource};

use linkerd_cni_k8s::names;

use super::result::{CheckResult, Status};

/// The category these checks are printed under.
pub const CATEGORY: &str = super::result::CNI_PLUGIN_CATEGORY;

/// How long a failing check that is retried waits before the next attempt (Linkerd's).
pub const RETRY_INTERVAL: Duration = Duration::from_secs(5);

/// The check retried until `--wait` runs out (Linkerd's name: scripts parse `-o json`).
pub const READY_CHECK: &str = "cni plugin pod is running on all nodes";

/// Linkerd's hint anchor of [`READY_CHECK`].
pub const READY_HINT: &str = "cni-plugin-ready";

/// This project's check of the CNI namespace's Pod Security level (Linkerd has none).
pub const PSA_CHECK: &str = "cni plugin namespace allows privileged pods";

/// The verdict on the CNI namespace's `pod-security.kubernetes.io/enforce` label: the
/// DaemonSet's pod uses the host's network, hostPath volumes, added capabilities and (with
/// `agent.mountBpffs`) a privileged init container, which only the `privileged` level admits;
/// under `baseline` or `restricted` the DaemonSet controller's pods are refused and no node
/// gets the plugin. `namespace` is the Namespace object (`None`: not found).
pub fn psa_check(
    namespace_name: &str,
    namespace: Result<Option<&Namespace>, String>,
) -> CheckResult {
    let fix = format!(
        "kubectl label namespace {namespace_name} {}=privileged --overwrite",
        names::PSA_ENFORCE_LABEL
    );
    let ns = match namespace {
        Ok(Some(ns)) => ns,
        Ok(None) => {
            return CheckResult::fail(
                CATEGORY,
                PSA_CHECK,
                format!("namespace {namespace_name} not found"),
            );
        }
        Err(e) => {
            return CheckResult::fail(
                CATEGORY,
                PSA_CHECK,
                format!("getting namespace {namespace_name}: {e}"),
            );
        }
    };
    let level = ns
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(names::PSA_ENFORCE_LABEL))
        .map(String::as_str);
    match level {
        Some("privileged") => CheckResult::ok(
            CATEGORY,
            PSA_CHECK,
            format!("{}=privileged", names::PSA_ENFORCE_LABEL),
        ),
        Some(other) => CheckResult::fail(
            CATEGORY,
            PSA_CHECK,
            format!(
                "namespace {namespace_name} enforces Pod Security {other:?}, which refuses the \
                 DaemonSet's pod (host network, hostPath volumes, added capabilities, a \
                 privileged init container): {fix}"
            ),
        ),
        None => CheckResult::new(
            CATEGORY,
            PSA_CHECK,
            Status::Warn,
            format!(
                "namespace {namespace_name} has no {} label: the cluster's default level \
                 applies, and anything stricter than privileged refuses the DaemonSet's pod: {fix}",
                names::PSA_ENFORCE_LABEL
            ),
        ),
    }
}

/// The linkerd-cni objects whose existence is checked, in Linkerd's order, with the anchor of
/// Linkerd's documentation of each check.
pub const OBJECTS: &[(&str, &str, &str)] = &[
    ("ConfigMap", names::CNI_CONFIG_MAP, "cni-plugin-cm-exists"),
    ("ClusterRole", names::CNI_NAME, "cni-plugin-cr-exists"),
    (
        "ClusterRoleBinding",
        names::CNI_NAME,
        "cni-plugin-crb-exists",
    ),
    ("ServiceAccount", names::CNI_NAME, "cni-plugin-sa-exists"),
    ("DaemonSet", names::CNI_NAME, "cni-plugin-ds-exists"),
];

/// Linkerd's name of the existence check of the linkerd-cni object of `kind` ("cni plugin
/// ConfigMap exists"), the same in the pre-install and the post-install checks.
pub fn exists_check(kind: &str) -> String {
    format!("cni plugin {kind} exists")
}

/// The hint anchor of the existence check of `kind`, if it is one of [`OBJECTS`].
pub fn exists_hint(kind: &str) -> Option<&'static str> {
    OBJECTS
        .iter()
        .find(|(k, _, _)| *k == kind)
        .map(|(_, _, hint)| *hint)
}

/// Until when, and how often, a failing check is tried again.
#[derive(Clone, Copy, Debug)]
pub struct Retry {
    /// No attempt starts after this.
    pub deadline: Instant,
    /// Pause between attempts.
    pub interval: Duration,
}

impl Retry {
    /// Retries for `wait` from now, at Linkerd's interval.
    pub fn for_wait(wait: Duration) -> Self {
        Self {
            deadline: Instant::now() + wait,
            interval: RETRY_INTERVAL,
        }
    }

    /// Whether a check that just failed is tried again.
    pub fn again(&self) -> bool {
        Instant::now() < self.deadline
    }
}

async fn exists<K>(
    api: Api<K>,
    what: &str,
    name: &str,
    where_: &str,
    hint: &'static str,
) -> (CheckResult, Option<K>)
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let (check, obj) = get(api, what, name, where_).await;
    (check.with_hint(hint), obj)
}

async fn get<K>(api: Api<K>, what: &str, name: &str, where_: &str) -> (CheckResult, Option<K>)
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let check = exists_check(what);
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

/// Whether the DaemonSet runs a ready pod on every node it should run on. A DaemonSet the
/// controller has not looked at yet (a fresh one) is not ready; one that the controller
/// schedules on no node is (there is nothing to wait for), and says so.
pub fn daemonset_ready(ds: &DaemonSet) -> Result<String, String> {
    let status = ds
        .status
        .as_ref()
        .ok_or("the DaemonSet has no status yet")?;
    if let Some(generation) = ds.metadata.generation {
        let observed = status.observed_generation.unwrap_or(0);
        if observed < generation {
            return Err(format!(
                "the DaemonSet controller has not yet seen the DaemonSet's latest spec \
                 (observedGeneration {observed}, generation {generation})"
            ));
        }
    }
    let (desired, ready) = (status.desired_number_scheduled, status.number_ready);
    if desired == 0 {
        return Ok("scheduled on no node: no node matches its nodeSelector and tolerations".into());
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

/// Runs the checks against the cluster behind `client`: the objects and their readiness,
/// then that no meshed pod runs without redirection ([`super::redirection`]); `on_retry`
/// sees each failed attempt of a check that is tried again.
pub async fn run(
    client: &Client,
    namespace: &str,
    retry: Retry,
    on_retry: &mut dyn FnMut(&CheckResult),
) -> Vec<CheckResult> {
    let mut results = objects(client, namespace, retry, on_retry).await;
    results.push(super::redirection::run(client).await);
    results
}

/// The checks of the installation's objects and the DaemonSet's readiness.
async fn objects(
    client: &Client,
    namespace: &str,
    retry: Retry,
    on_retry: &mut dyn FnMut(&CheckResult),
) -> Vec<CheckResult> {
    let in_ns = format!(" in namespace {namespace}");
    let mut results = vec![
        exists(
            Api::<ConfigMap>::namespaced(client.clone(), namespace),
            "ConfigMap",
            names::CNI_CONFIG_MAP,
            &in_ns,
            "cni-plugin-cm-exists",
        )
        .await
        .0,
        exists(
            Api::<ClusterRole>::all(client.clone()),
            "ClusterRole",
            names::CNI_NAME,
            "",
            "cni-plugin-cr-exists",
        )
        .await
        .0,
        exists(
            Api::<ClusterRoleBinding>::all(client.clone()),
            "ClusterRoleBinding",
            names::CNI_NAME,
            "",
            "cni-plugin-crb-exists",
        )
        .await
        .0,
        exists(
            Api::<ServiceAccount>::namespaced(client.clone(), namespace),
            "ServiceAccount",
            names::CNI_NAME,
            &in_ns,
            "cni-plugin-sa-exists",
        )
        .await
        .0,
    ];
    let api = Api::<DaemonSet>::namespaced(client.clone(), namespace);
    let (ds_check, ds) = exists(
        api.clone(),
        "DaemonSet",
        names::CNI_NAME,
        &in_ns,
        "cni-plugin-ds-exists",
    )
    .await;
    results.push(ds_check);
    let ns = Api::<Namespace>::all(client.clone())
        .get_opt(namespace)
        .await
        .map_err(|e| e.to_string());
    results.push(psa_check(
        namespace,
        ns.as_ref().map(Option::as_ref).map_err(Clone::clone),
    ));
    let Some(ds) = ds else {
        results.push(
            CheckResult::fail(CATEGORY, READY_CHECK, "no DaemonSet to check").with_hint(READY_HINT),
        );
        return results;
    };
    // Waiting makes sense only for an installation that is complete but not ready yet.
    let may_wait = results.iter().all(CheckResult::passed);
    let mut attempt: Result<DaemonSet, String> = Ok(ds);
    loop {
        let ready = CheckResult::from_outcome(
            CATEGORY,
            READY_CHECK,
            attempt.and_then(|ds| daemonset_ready(&ds)),
        )
        .with_hint(READY_HINT);
        if ready.passed() || !may_wait || !retry.again() {
            results.push(ready);
            return results;
        }
        on_retry(&ready);
        tokio::time::sleep(retry.interval).await;
        // A failed read is a failed attempt, tried again as well (as Linkerd does).
        attempt = match api.get_opt(names::CNI_NAME).await {
            Ok(Some(ds)) => Ok(ds),
            Ok(None) => Err(format!("DaemonSet {:?} not found{in_ns}", names::CNI_NAME)),
            Err(e) => Err(format!(
                "getting DaemonSet {:?}{in_ns}: {e}",
                names::CNI_NAME
            )),
        };
    }
}
