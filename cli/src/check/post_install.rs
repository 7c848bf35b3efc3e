//! Post-install checks that honour `cniEnabled` (`linkerd check` after `linkerd install`):
//! the control plane's `linkerd-config` and webhook; then, when `cniEnabled` is true, the
//! linkerd-cni objects and the DaemonSet's readiness, the namespace's Pod Security level and
//! the meshed pods (none should still carry `linkerd-init`, no network validator should have
//! failed, none should run without redirection by its node agent's Events:
//! [`super::redirection`]); when false, the CNI checks are skipped and pods injected for CNI are flagged.
//!
//! Gathering ([`gather`]) and judging ([`judge`]) are separate so the rules are tested on
//! plain JSON. As Linkerd does, checks of something that becomes ready by itself
//! ([`RETRIED`]) are retried until `--wait` runs out, when they are the only failures.

use std::io::Write;

use k8s_openapi::api::{
    admissionregistration::v1::MutatingWebhookConfiguration,
    apps::v1::{DaemonSet, Deployment},
    core::v1::{ConfigMap, Namespace, Pod, ServiceAccount},
    rbac::v1::{ClusterRole, ClusterRoleBinding},
};
use kube::{Api, Client, api::ListParams};
use serde_json::Value;

use linkerd_cni_k8s::names;

use linkerd_injector::{decision, values::Values};

use super::{
    cluster::{self, Retry},
    redirection,
    result::{CheckResult, Printer, Status},
};
use crate::kubernetes::KubeArgs;

/// The data-plane category, printed only with `--proxy`.
pub const DATA_PLANE: &str = "linkerd-data-plane";

/// The checks retried (everything gathered again) while they are the only failures: the
/// installation is complete and its pods are starting.
pub const RETRIED: &[&str] = &["proxy injector is available", cluster::READY_CHECK];

/// Linkerd's category of the control plane's objects.
pub const CONFIG: &str = "linkerd-config";
/// Linkerd's category of `linkerd-config` and the control plane's readiness.
pub const EXISTENCE: &str = "linkerd-existence";
/// This project's category of the proxy injector (Linkerd has no check of the same scope).
pub const INJECTOR: &str = "linkerd-proxy-injector";

/// Linkerd's names of the checks that are the same here (scripts parse `-o json`), each with
/// the anchor of Linkerd's documentation of it.
pub const NAMESPACE_CHECK: (&str, &str) = ("control plane Namespace exists", "l5d-existence-ns");
/// Linkerd's check of `linkerd-config` (read and parsed, as Linkerd's reads it).
pub const CONFIG_MAP_CHECK: (&str, &str) = (
    "'linkerd-config' config map exists",
    "l5d-existence-linkerd-config",
);
/// Linkerd's check of the MutatingWebhookConfiguration's existence.
pub const WEBHOOK_CHECK: (&str, &str) = (
    "control plane MutatingWebhookConfigurations exist",
    "l5d-existence-mwc",
);

/// Exit code of the network validator when redirection is not in place.
pub const VALIDATOR_FAILED_EXIT_CODE: i64 = 95;

/// What the checks look at, as JSON (absent objects are `None`; API errors are `Err`).
#[derive(Clone, Debug)]
pub struct Observed {
    /// Namespace `linkerd`.
    pub control_plane_namespace: Lookup,
    /// ConfigMap `linkerd-config`.
    pub config: Lookup,
    /// The MutatingWebhookConfiguration.
    pub webhook: Lookup,
    /// The injector Deployment.
    pub injector: Lookup,
    /// The linkerd-cni objects (ConfigMap, ClusterRole, ClusterRoleBinding, ServiceAccount,
    /// DaemonSet), in that order, with their kind and name.
    pub cni: Vec<(String, String, Lookup)>,
    /// Meshed pods (label `linkerd.io/control-plane-ns`), all namespaces.
    pub pods: Result<Vec<Value>, String>,
    /// The CNI namespace's name and Namespace object (read with the other linkerd-cni objects).
    pub cni_namespace: (String, Lookup),
    /// The agents' Events on pods and the pods they report unredirected (read with the other
    /// linkerd-cni objects; `None` when not read).
    pub redirection: Option<Result<redirection::Observed, String>>,
}

/// An object that may be absent or unreadable.
pub type Lookup = Result<Option<Value>, String>;

async fn get<K>(api: Api<K>, name: &str) -> Lookup
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    match api.get_opt(name).await {
        Ok(obj) => Ok(obj.and_then(|o| serde_json::to_value(o).ok())),
        Err(e) => Err(e.to_string()),
    }
}

/// Reads what the checks need from the cluster. The linkerd-cni objects are read only when
/// `linkerd-config` says `cniEnabled: true`.
pub async fn gather(client: &Client, control_plane_ns: &str, cni_ns: &str) -> Observed {
    let mut o = Observed {
        control_plane_namespace: get(Api::<Namespace>::all(client.clone()), control_plane_ns).await,
        config: get(
            Api::<ConfigMap>::namespaced(client.clone(), control_plane_ns),
            names::CONFIG_MAP,
        )
        .await,
        webhook: get(
            Api::<MutatingWebhookConfiguration>::all(client.clone()),
            names::WEBHOOK_CONFIG,
        )
        .await,
        injector: get(
            Api::<Deployment>::namespaced(client.clone(), control_plane_ns),
            names::INJECTOR,
        )
        .await,
        cni: Vec::new(),
        pods: Ok(Vec::new()),
        cni_namespace: (cni_ns.to_string(), Ok(None)),
        redirection: None,
    };
    if config_values(&o.config).is_ok_and(|v| v.cni_enabled) {
        let c = client.clone();
        o.cni_namespace.1 = get(Api::<Namespace>::all(c.clone()), cni_ns).await;
        o.cni = vec![
            (
                "ConfigMap".into(),
                names::CNI_CONFIG_MAP.into(),
                get(
                    Api::<ConfigMap>::namespaced(c.clone(), cni_ns),
                    names::CNI_CONFIG_MAP,
                )
                .await,
            ),
            (
                "ClusterRole".into(),
                names::CNI_NAME.into(),
                get(Api::<ClusterRole>::all(c.clone()), names::CNI_NAME).await,
            ),
            (
                "ClusterRoleBinding".into(),
                names::CNI_NAME.into(),
                get(Api::<ClusterRoleBinding>::all(c.clone()), names::CNI_NAME).await,
            ),
            (
                "ServiceAccount".into(),
                names::CNI_NAME.into(),
                get(
                    Api::<ServiceAccount>::namespaced(c.clone(), cni_ns),
                    names::CNI_NAME,
                )
                .await,
            ),
            (
                "DaemonSet".into(),
                names::CNI_NAME.into(),
                get(
                    Api::<DaemonSet>::namespaced(c.clone(), cni_ns),
                    names::CNI_NAME,
                )
                .await,
            ),
        ];
        o.redirection = Some(redirection::gather(&c).await);
    }
    let pods: Api<Pod> = Api::all(client.clone());
    o.pods = match pods
        .list(&ListParams::default().labels(names::CONTROL_PLANE_NS_LABEL))
        .await
    {
        Ok(list) => Ok(list
            .items
            .into_iter()
            .filter_map(|p| serde_json::to_value(p).ok())
            .collect()),
        Err(e) => Err(e.to_string()),
    };
    o
}

fn config_values(config: &Lookup) -> Result<Values, String> {
    let cm = config
        .as_ref()
        .map_err(Clone::clone)?
        .as_ref()
        .ok_or("not found: run linkerd install")?;
    let yaml = cm
        .pointer(&format!("/data/{}", names::CONFIG_VALUES_KEY))
        .and_then(Value::as_str)
        .ok_or("no values key")?;
    Values::from_yaml(yaml).map_err(|e| e.to_string())
}

fn pod_name(p: &Value) -> String {
    let ns = p
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("");
    let name = p
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    format!("{ns}/{name}")
}

/// Whether the pod's network validator ever exited with [`VALIDATOR_FAILED_EXIT_CODE`].
fn validator_failed(p: &Value) -> bool {
    p.pointer("/status/initContainerStatuses")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|s| s["name"] == names::VALIDATOR_CONTAINER)
        .flat_map(|s| {
            [
                s.pointer("/state/terminated/exitCode"),
                s.pointer("/lastState/terminated/exitCode"),
            ]
        })
        .any(|code| code.and_then(Value::as_i64) == Some(VALIDATOR_FAILED_EXIT_CODE))
}

fn list(pods: &[String]) -> String {
    const SHOWN: usize = 10;
    let mut s = pods
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if pods.len() > SHOWN {
        s.push_str(&format!(" and {} more", pods.len() - SHOWN));
    }
    s
}

/// The checks' verdicts on what was observed.
pub fn judge(o: &Observed) -> Vec<CheckResult> {
    let mut out = Vec::new();
    let (ns_check, ns_hint) = NAMESPACE_CHECK;
    out.push(
        match &o.control_plane_namespace {
            Ok(Some(_)) => CheckResult::new(CONFIG, ns_check, Status::Ok, ""),
            Ok(None) => CheckResult::new(
                CONFIG,
                ns_check,
                Status::Fail,
                "not found: run linkerd install | kubectl apply -f -",
            ),
            Err(e) => CheckResult::new(CONFIG, ns_check, Status::Fail, e.clone()),
        }
        .with_hint(ns_hint),
    );
    let values = config_values(&o.config);
    let (cm_check, cm_hint) = CONFIG_MAP_CHECK;
    let config_check = match &values {
        Ok(v) => CheckResult::new(
            EXISTENCE,
            cm_check,
            Status::Ok,
            format!("cniEnabled: {}", v.cni_enabled),
        ),
        Err(e) => CheckResult::new(EXISTENCE, cm_check, Status::Fail, e.clone()),
    }
    .with_hint(cm_hint);

    // Linkerd's check: the configuration exists. This project's own: the API server can trust
    // the injector (a caBundle, or cert-manager injecting one).
    let (wh_check, wh_hint) = WEBHOOK_CHECK;
    let ca_check = "proxy injector webhook has a caBundle";
    let mut ca_result = None;
    match &o.webhook {
        Ok(Some(w)) => {
            out.push(CheckResult::new(CONFIG, wh_check, Status::Ok, "").with_hint(wh_hint));
            let has_ca = w
                .pointer("/webhooks/0/clientConfig/caBundle")
                .and_then(Value::as_str)
                .is_some_and(|s| !s.is_empty());
            let cert_manager = w
                .pointer("/metadata/annotations/cert-manager.io~1inject-ca-from")
                .is_some();
            ca_result = Some(if has_ca || cert_manager {
                CheckResult::new(INJECTOR, ca_check, Status::Ok, "")
            } else {
                CheckResult::new(
                    INJECTOR,
                    ca_check,
                    Status::Fail,
                    "it has no caBundle: the API server cannot trust the injector",
                )
            });
        }
        Ok(None) => out.push(
            CheckResult::new(
                CONFIG,
                wh_check,
                Status::Fail,
                format!("{} not found", names::WEBHOOK_CONFIG),
            )
            .with_hint(wh_hint),
        ),
        Err(e) => {
            out.push(CheckResult::new(CONFIG, wh_check, Status::Fail, e.clone()).with_hint(wh_hint))
        }
    }
    out.push(config_check);
    out.extend(ca_result);
    out.push(match &o.injector {
        Ok(Some(d)) => {
            let available = d.pointer("/status/availableReplicas").and_then(Value::as_i64).unwrap_or(0);
            if available > 0 {
                CheckResult::new(INJECTOR, "proxy injector is available", Status::Ok, format!("{available} replica(s)"))
            } else {
                let ns = d.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or(names::CONTROL_PLANE_NAMESPACE);
                CheckResult::new(INJECTOR, "proxy injector is available", Status::Fail, format!("no available replica: kubectl -n {ns} describe deploy linkerd-proxy-injector"))
            }
        }
        Ok(None) => CheckResult::new(INJECTOR, "proxy injector is available", Status::Fail, "Deployment linkerd-proxy-injector not found"),
        Err(e) => CheckResult::new(INJECTOR, "proxy injector is available", Status::Fail, e.clone()),
    });

    let Ok(values) = values else { return out };
    const CNI: &str = cluster::CATEGORY;
    let pods = match &o.pods {
        Ok(p) => p.as_slice(),
        Err(e) => {
            out.push(CheckResult::new(
                DATA_PLANE,
                "meshed pods can be listed",
                Status::Fail,
                e.clone(),
            ));
            &[]
        }
    };
    let meshed: Vec<&Value> = pods.iter().filter(|p| decision::has_proxy(p)).collect();
    let with = |name: &str| -> Vec<String> {
        meshed
            .iter()
            .filter(|p| decision::container_names(p).any(|n| n == name))
            .map(|p| pod_name(p))
            .collect()
    };

    if !values.cni_enabled {
        // Linkerd skips each of its CNI checks silently; the table says so once (`-o json`
        // leaves skipped checks out, as Linkerd's does).
        out.push(CheckResult::new(
            CNI,
            "linkerd-cni checks",
            Status::Skipped,
            "cniEnabled is false: proxies bring linkerd-init",
        ));
        let cni_pods = with(names::VALIDATOR_CONTAINER);
        out.push(if cni_pods.is_empty() {
            CheckResult::new(
                DATA_PLANE,
                "meshed pods match cniEnabled: false",
                Status::Ok,
                format!("{} meshed pod(s)", meshed.len()),
            )
        } else {
            CheckResult::new(
                DATA_PLANE,
                "meshed pods match cniEnabled: false",
                Status::Warn,
                format!(
                    "injected for the CNI plugin (no linkerd-init), restart them: {}",
                    list(&cni_pods)
                ),
            )
        });
        return out;
    }

    for (kind, name, lookup) in &o.cni {
        let check = cluster::exists_check(kind);
        let result = match lookup {
            Ok(Some(_)) => CheckResult::new(CNI, check, Status::Ok, ""),
            Ok(None) => CheckResult::new(
                CNI,
                check,
                Status::Fail,
                format!("{kind} {name:?} not found: linkerd install-cni | kubectl apply -f -"),
            ),
            Err(e) => CheckResult::new(CNI, check, Status::Fail, e.clone()),
        };
        out.push(match cluster::exists_hint(kind) {
            Some(hint) => result.with_hint(hint),
            None => result,
        });
    }
    if let Some((_, _, lookup)) = o.cni.iter().find(|(k, _, _)| k == "DaemonSet") {
        let outcome = match lookup {
            Ok(Some(ds)) => serde_json::from_value::<DaemonSet>(ds.clone())
                .map_err(|e| format!("unexpected DaemonSet: {e}"))
                .and_then(|ds| cluster::daemonset_ready(&ds)),
            Ok(None) | Err(_) => Err("no DaemonSet to check".to_string()),
        };
        let (ns_name, ns) = &o.cni_namespace;
        let ns = ns.as_ref().map_err(Clone::clone).and_then(|ns| {
            ns.clone()
                .map(serde_json::from_value::<Namespace>)
                .transpose()
                .map_err(|e| format!("unexpected Namespace: {e}"))
        });
        let psa = cluster::psa_check(
            ns_name,
            ns.as_ref().map(Option::as_ref).map_err(Clone::clone),
        );
        out.push(psa);
        out.push(
            CheckResult::from_outcome(CNI, cluster::READY_CHECK, outcome)
                .with_hint(cluster::READY_HINT),
        );
    }
    match &o.redirection {
        Some(Ok(observed)) => out.push(redirection::judge(observed)),
        Some(Err(e)) => out.push(CheckResult::fail(CNI, redirection::CHECK, e.clone())),
        None => {}
    }
    if let Ok(Some(ns)) = &o.control_plane_namespace {
        let level = decision::label(ns, names::PSA_ENFORCE_LABEL).unwrap_or("(none)");
        out.push(if level == "restricted" {
            CheckResult::new(
                CONFIG,
                "control plane namespace enforces Pod Security restricted",
                Status::Ok,
                "",
            )
        } else {
            CheckResult::new(
                CONFIG,
                "control plane namespace enforces Pod Security restricted",
                Status::Warn,
                format!(
                    "{} is {level}; with cniEnabled no pod needs more than restricted",
                    names::PSA_ENFORCE_LABEL
                ),
            )
        });
    }
    let stale = with(names::INIT_CONTAINER);
    out.push(if stale.is_empty() {
        CheckResult::new(
            DATA_PLANE,
            "no meshed pod carries linkerd-init",
            Status::Ok,
            format!("{} meshed pod(s)", meshed.len()),
        )
    } else {
        CheckResult::new(
            DATA_PLANE,
            "no meshed pod carries linkerd-init",
            Status::Warn,
            format!(
                "injected before cniEnabled (they need NET_ADMIN), restart them: {}",
                list(&stale)
            ),
        )
    });
    let failed: Vec<String> = meshed
        .iter()
        .filter(|p| validator_failed(p))
        .map(|p| pod_name(p))
        .collect();
    out.push(if failed.is_empty() {
        CheckResult::new(DATA_PLANE, "network validators succeeded", Status::Ok, "")
    } else {
        CheckResult::new(
            DATA_PLANE,
            "network validators succeeded",
            Status::Fail,
            format!(
                "exit code {VALIDATOR_FAILED_EXIT_CODE}: the pods started before the CNI plugin was in the chain, delete them: {}",
                list(&failed)
            ),
        )
    });
    out
}

/// Gathers and judges.
pub async fn post_install(
    client: &Client,
    control_plane_ns: &str,
    cni_ns: &str,
) -> Vec<CheckResult> {
    judge(&gather(client, control_plane_ns, cni_ns).await)
}

/// Runs the post-install checks and prints them by category (the data plane only when
/// `with_data_plane`); while the only failures are [`RETRIED`] checks, tries again as `retry`
/// allows, showing each failed attempt to `on_retry`.
pub async fn run(
    kube: &KubeArgs,
    linkerd_namespace: &str,
    cni_namespace: &str,
    with_data_plane: bool,
    retry: Retry,
    on_retry: &mut dyn FnMut(&CheckResult),
    printer: &mut Printer<impl Write>,
) -> anyhow::Result<()> {
    let shown = |r: &CheckResult| with_data_plane || r.category != DATA_PLANE;
    let results = match kube.client().await {
        Ok(client) => loop {
            let results = post_install(&client, linkerd_namespace, cni_namespace).await;
            let failed: Vec<&CheckResult> =
                results.iter().filter(|r| !r.passed() && shown(r)).collect();
            let starting =
                !failed.is_empty() && failed.iter().all(|r| RETRIED.contains(&r.name.as_str()));
            if !starting || !retry.again() {
                break results;
            }
            failed.into_iter().for_each(&mut *on_retry);
            tokio::time::sleep(retry.interval).await;
        },
        Err(e) => {
            let r = CheckResult::fail("kubernetes-api", "can initialize the client", e.to_string());
            printer.category(r.category, std::slice::from_ref(&r))?;
            return Ok(());
        }
    };
    let mut categories: Vec<&str> = Vec::new();
    for r in &results {
        if !categories.contains(&r.category) && shown(r) {
            categories.push(r.category);
        }
    }
    for category in categories {
        let printed: Vec<CheckResult> = results
            .iter()
            .filter(|r| r.category == category)
            .cloned()
            .collect();
        printer.category(category, &printed)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn observed(cni: bool, psa: &str, pods: Vec<Value>) -> Observed {
        let values = Values {
            cni_enabled: cni,
            ..Values::default()
        }
        .to_yaml()
        .expect("yaml");
        let present =
            |kind: &str, name: &str| (kind.to_string(), name.to_string(), Ok(Some(json!({}))));
        Observed {
            control_plane_namespace: Ok(Some(
                json!({"metadata": {"labels": {names::PSA_ENFORCE_LABEL: psa}}}),
            )),
            config: Ok(Some(json!({"data": {"values": values}}))),
            webhook: Ok(Some(
                json!({"webhooks": [{"clientConfig": {"caBundle": "Q0E="}}]}),
            )),
            injector: Ok(Some(json!({"status": {"availableReplicas": 1}}))),
            cni: if cni {
                vec![
                    present("ConfigMap", "linkerd-cni-config"),
                    present("ClusterRole", "linkerd-cni"),
                    present("ClusterRoleBinding", "linkerd-cni"),
                    ("ServiceAccount".into(), "linkerd-cni".into(), Ok(None)),
                    (
                        "DaemonSet".into(),
                        names::CNI_NAME.into(),
                        Ok(Some(
                            json!({"status": {"desiredNumberScheduled": 3, "numberReady": 2}}),
                        )),
                    ),
                ]
            } else {
                vec![]
            },
            pods: Ok(pods),
            cni_namespace: (
                "linkerd-cni".into(),
                Ok(Some(
                    json!({"metadata": {"labels": {names::PSA_ENFORCE_LABEL: "privileged"}}}),
                )),
            ),
            redirection: cni.then(|| Ok(redirection::Observed::default())),
        }
    }

    fn pod(name: &str, inits: &[&str], validator_exit: Option<i64>) -> Value {
        let mut p = json!({
            "metadata": {"name": name, "namespace": "app"},
            "spec": {"containers": [{"name": "app"}], "initContainers": inits.iter().map(|n| json!({"name": n})).collect::<Vec<_>>()},
        });
        if let Some(code) = validator_exit {
            p["status"] = json!({"initContainerStatuses": [{"name": names::VALIDATOR_CONTAINER, "lastState": {"terminated": {"exitCode": code}}}]});
        }
        p
    }

    fn status_of(results: &[CheckResult], name: &str) -> Status {
        results
            .iter()
            .find(|r| r.name == name)
            .unwrap_or_else(|| panic!("no check {name:?} in {results:#?}"))
            .status
    }

    #[test]
    fn cni_enabled_checks_the_cni_objects_and_pods() {
        let pods = vec![
            pod(
                "good",
                &[names::VALIDATOR_CONTAINER, names::PROXY_CONTAINER],
                Some(0),
            ),
            pod(
                "stale",
                &[names::INIT_CONTAINER, names::PROXY_CONTAINER],
                None,
            ),
            pod(
                "broken",
                &[names::VALIDATOR_CONTAINER, names::PROXY_CONTAINER],
                Some(95),
            ),
        ];
        let r = judge(&observed(true, "privileged", pods));
        assert_eq!(
            status_of(&r, "'linkerd-config' config map exists"),
            Status::Ok
        );
        assert_eq!(status_of(&r, "cni plugin ConfigMap exists"), Status::Ok);
        assert_eq!(
            status_of(&r, "cni plugin ServiceAccount exists"),
            Status::Fail
        );
        assert_eq!(
            status_of(&r, "cni plugin pod is running on all nodes"),
            Status::Fail
        );
        assert_eq!(
            status_of(
                &r,
                "control plane namespace enforces Pod Security restricted"
            ),
            Status::Warn
        );
        let stale = r
            .iter()
            .find(|c| c.name == "no meshed pod carries linkerd-init")
            .expect("check");
        assert_eq!(
            (stale.status, stale.detail.contains("app/stale")),
            (Status::Warn, true),
            "{stale:?}"
        );
        let broken = r
            .iter()
            .find(|c| c.name == "network validators succeeded")
            .expect("check");
        assert_eq!(broken.status, Status::Fail);
        assert!(
            broken.detail.contains("app/broken") && !broken.detail.contains("app/good"),
            "{broken:?}"
        );
    }

    /// The checks that are Linkerd's keep Linkerd's category, name and hint anchor, in
    /// Linkerd's order (`linkerd check -o json` is parsed by scripts); the others are this
    /// project's own.
    #[test]
    fn linkerd_checks_keep_linkerd_names() {
        let r = judge(&observed(true, "restricted", vec![]));
        let linkerd: Vec<(&str, &str, Option<&str>)> = r
            .iter()
            .filter(|c| c.hint_anchor.is_some())
            .map(|c| (c.category, c.name.as_str(), c.hint_anchor))
            .collect();
        assert_eq!(
            linkerd,
            [
                (
                    "linkerd-config",
                    "control plane Namespace exists",
                    Some("l5d-existence-ns")
                ),
                (
                    "linkerd-config",
                    "control plane MutatingWebhookConfigurations exist",
                    Some("l5d-existence-mwc")
                ),
                (
                    "linkerd-existence",
                    "'linkerd-config' config map exists",
                    Some("l5d-existence-linkerd-config")
                ),
                (
                    "linkerd-cni-plugin",
                    "cni plugin ConfigMap exists",
                    Some("cni-plugin-cm-exists")
                ),
                (
                    "linkerd-cni-plugin",
                    "cni plugin ClusterRole exists",
                    Some("cni-plugin-cr-exists")
                ),
                (
                    "linkerd-cni-plugin",
                    "cni plugin ClusterRoleBinding exists",
                    Some("cni-plugin-crb-exists")
                ),
                (
                    "linkerd-cni-plugin",
                    "cni plugin ServiceAccount exists",
                    Some("cni-plugin-sa-exists")
                ),
                (
                    "linkerd-cni-plugin",
                    "cni plugin DaemonSet exists",
                    Some("cni-plugin-ds-exists")
                ),
                (
                    "linkerd-cni-plugin",
                    "cni plugin pod is running on all nodes",
                    Some("cni-plugin-ready")
                ),
            ]
        );
        let categories: Vec<&str> = r.iter().map(|c| c.category).fold(Vec::new(), |mut v, c| {
            if !v.contains(&c) {
                v.push(c);
            }
            v
        });
        assert_eq!(
            categories,
            [
                "linkerd-config",
                "linkerd-existence",
                "linkerd-proxy-injector",
                "linkerd-cni-plugin",
                "linkerd-data-plane"
            ],
            "Linkerd's categories in Linkerd's order, then this project's"
        );
    }

    #[test]
    fn cni_disabled_skips_the_cni_checks() {
        let pods = vec![pod(
            "cni-era",
            &[names::VALIDATOR_CONTAINER, names::PROXY_CONTAINER],
            None,
        )];
        let r = judge(&observed(false, "privileged", pods));
        assert_eq!(status_of(&r, "linkerd-cni checks"), Status::Skipped);
        assert!(
            r.iter().all(|c| !c.name.starts_with("cni plugin")),
            "{r:#?}"
        );
        assert_eq!(
            status_of(&r, "meshed pods match cniEnabled: false"),
            Status::Warn
        );
    }

    #[test]
    fn missing_config_stops_at_the_config_checks() {
        let mut o = observed(true, "restricted", vec![]);
        o.config = Ok(None);
        let r = judge(&o);
        assert_eq!(
            status_of(&r, "'linkerd-config' config map exists"),
            Status::Fail
        );
        assert!(r.iter().all(|c| c.category != cluster::CATEGORY), "{r:#?}");
    }
}
