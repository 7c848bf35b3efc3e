//! Post-install checks that honour `cniEnabled` (`linkerd check` after `linkerd install`):
//! the control plane's `linkerd-config` and webhook; then, when `cniEnabled` is true, the
//! linkerd-cni objects and the DaemonSet's readiness, the namespace's Pod Security level and
//! the meshed pods (none should still carry `linkerd-init`, no network validator should have
//! failed); when false, the CNI checks are skipped and pods injected for CNI are flagged.
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
    cluster::Retry,
    result::{CheckResult, Printer, Status},
};
use crate::kubernetes::KubeArgs;

/// The data-plane category, printed only with `--proxy`.
pub const DATA_PLANE: &str = "linkerd-data-plane";

/// The checks retried (everything gathered again) while they are the only failures: the
/// installation is complete and its pods are starting.
pub const RETRIED: &[&str] = &[
    "proxy injector is available",
    "cni plugin is ready on all nodes",
];

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
    };
    if config_values(&o.config).is_ok_and(|v| v.cni_enabled) {
        let c = client.clone();
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
                get(Api::<DaemonSet>::namespaced(c, cni_ns), names::CNI_NAME).await,
            ),
        ];
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
    const CONFIG: &str = "linkerd-config";
    match &o.control_plane_namespace {
        Ok(Some(_)) => out.push(CheckResult::new(
            CONFIG,
            "control plane namespace exists",
            Status::Ok,
            "",
        )),
        Ok(None) => out.push(CheckResult::new(
            CONFIG,
            "control plane namespace exists",
            Status::Fail,
            "not found: run linkerd install | kubectl apply -f -",
        )),
        Err(e) => out.push(CheckResult::new(
            CONFIG,
            "control plane namespace exists",
            Status::Fail,
            e.clone(),
        )),
    }
    let values = config_values(&o.config);
    match &values {
        Ok(v) => out.push(CheckResult::new(
            CONFIG,
            "linkerd-config is readable",
            Status::Ok,
            format!("cniEnabled: {}", v.cni_enabled),
        )),
        Err(e) => out.push(CheckResult::new(
            CONFIG,
            "linkerd-config is readable",
            Status::Fail,
            e.clone(),
        )),
    }

    const INJECTOR: &str = "linkerd-proxy-injector";
    out.push(match &o.webhook {
        Ok(Some(w)) => {
            let has_ca = w
                .pointer("/webhooks/0/clientConfig/caBundle")
                .and_then(Value::as_str)
                .is_some_and(|s| !s.is_empty());
            let cert_manager = w
                .pointer("/metadata/annotations/cert-manager.io~1inject-ca-from")
                .is_some();
            if has_ca || cert_manager {
                CheckResult::new(INJECTOR, "webhook configuration exists", Status::Ok, "")
            } else {
                CheckResult::new(
                    INJECTOR,
                    "webhook configuration exists",
                    Status::Fail,
                    "it has no caBundle: the API server cannot trust the injector",
                )
            }
        }
        Ok(None) => CheckResult::new(
            INJECTOR,
            "webhook configuration exists",
            Status::Fail,
            format!("{} not found", names::WEBHOOK_CONFIG),
        ),
        Err(e) => CheckResult::new(
            INJECTOR,
            "webhook configuration exists",
            Status::Fail,
            e.clone(),
        ),
    });
    out.push(match &o.injector {
        Ok(Some(d)) => {
            let available = d.pointer("/status/availableReplicas").and_then(Value::as_i64).unwrap_or(0);
            if available > 0 {
                CheckResult::new(INJECTOR, "proxy injector is available", Status::Ok, format!("{available} replica(s)"))
            } else {
                CheckResult::new(INJECTOR, "proxy injector is available", Status::Fail, "no available replica: kubectl -n linkerd describe deploy linkerd-proxy-injector")
            }
        }
        Ok(None) => CheckResult::new(INJECTOR, "proxy injector is available", Status::Fail, "Deployment linkerd-proxy-injector not found"),
        Err(e) => CheckResult::new(INJECTOR, "proxy injector is available", Status::Fail, e.clone()),
    });

    let Ok(values) = values else { return out };
    const CNI: &str = "linkerd-cni";
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
        let check = format!("cni plugin {kind} {name} exists");
        out.push(match lookup {
            Ok(Some(_)) => CheckResult::new(CNI, check, Status::Ok, ""),
            Ok(None) => CheckResult::new(
                CNI,
                check,
                Status::Fail,
                "not found: linkerd install-cni | kubectl apply -f -",
            ),
            Err(e) => CheckResult::new(CNI, check, Status::Fail, e.clone()),
        });
    }
    if let Some((_, _, Ok(Some(ds)))) = o.cni.iter().find(|(k, _, _)| k == "DaemonSet") {
        let outcome = serde_json::from_value::<DaemonSet>(ds.clone())
            .map_err(|e| format!("unexpected DaemonSet: {e}"))
            .and_then(|ds| super::cluster::daemonset_ready(&ds));
        out.push(CheckResult::from_outcome(
            CNI,
            "cni plugin is ready on all nodes",
            outcome,
        ));
    }
    if let Ok(Some(ns)) = &o.control_plane_namespace {
        let level = decision::label(ns, names::PSA_ENFORCE_LABEL).unwrap_or("(none)");
        out.push(if level == "restricted" {
            CheckResult::new(
                CNI,
                "control plane namespace enforces Pod Security restricted",
                Status::Ok,
                "",
            )
        } else {
            CheckResult::new(
                CNI,
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
        assert_eq!(status_of(&r, "linkerd-config is readable"), Status::Ok);
        assert_eq!(
            status_of(&r, "cni plugin ConfigMap linkerd-cni-config exists"),
            Status::Ok
        );
        assert_eq!(
            status_of(&r, "cni plugin ServiceAccount linkerd-cni exists"),
            Status::Fail
        );
        assert_eq!(
            status_of(&r, "cni plugin is ready on all nodes"),
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
        assert_eq!(status_of(&r, "linkerd-config is readable"), Status::Fail);
        assert!(r.iter().all(|c| c.category != "linkerd-cni"), "{r:#?}");
    }
}
