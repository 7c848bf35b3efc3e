//! Whether a pod gets a proxy: `linkerd.io/inject` on the pod, else on its namespace
//! (`enabled`, `disabled`, `ingress`), with the exclusions Linkerd applies (host-network pods,
//! pods that already have a proxy, namespaces opted out of the admission webhooks).

use serde_json::Value;

use linkerd_cni_k8s::names;

/// How the proxy is injected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InjectMode {
    /// The ordinary sidecar proxy.
    Enabled,
    /// The proxy in ingress mode (`linkerd.io/inject: ingress`).
    Ingress,
}

/// Why a pod is left alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SkipReason {
    /// `hostNetwork: true`: redirection would capture the node's traffic.
    HostNetwork,
    /// A `linkerd-proxy` container is already there.
    AlreadyInjected,
    /// The pod says `linkerd.io/inject: disabled`.
    PodDisabled,
    /// Neither the pod nor its namespace asks for injection.
    NotEnabled,
    /// The namespace (or pod) is labelled `config.linkerd.io/admission-webhooks=disabled`.
    WebhooksDisabled,
    /// The namespace is `kube-system`.
    KubeSystem,
    /// `linkerd.io/inject` has a value Linkerd does not know.
    UnknownAnnotation(String),
}

impl SkipReason {
    /// A short stable label (metrics, logs).
    pub fn label(&self) -> &'static str {
        match self {
            SkipReason::HostNetwork => "host-network",
            SkipReason::AlreadyInjected => "already-injected",
            SkipReason::PodDisabled => "pod-disabled",
            SkipReason::NotEnabled => "not-enabled",
            SkipReason::WebhooksDisabled => "webhooks-disabled",
            SkipReason::KubeSystem => "kube-system",
            SkipReason::UnknownAnnotation(_) => "unknown-annotation",
        }
    }
}

impl std::fmt::Display for SkipReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SkipReason::HostNetwork => f.write_str("pods with hostNetwork: true are not injected"),
            SkipReason::AlreadyInjected => write!(
                f,
                "the pod already has a {} container",
                names::PROXY_CONTAINER
            ),
            SkipReason::PodDisabled => write!(
                f,
                "the pod says {}: {}",
                names::INJECT_ANNOTATION,
                names::INJECT_DISABLED
            ),
            SkipReason::NotEnabled => {
                write!(
                    f,
                    "neither the pod nor its namespace says {}: enabled or ingress",
                    names::INJECT_ANNOTATION
                )
            }
            SkipReason::WebhooksDisabled => {
                write!(f, "labelled {}=disabled", names::ADMISSION_WEBHOOKS_LABEL)
            }
            SkipReason::KubeSystem => f.write_str("pods in kube-system are never injected"),
            SkipReason::UnknownAnnotation(v) => write!(
                f,
                "unknown {} value {v:?} (expected enabled, disabled or ingress)",
                names::INJECT_ANNOTATION
            ),
        }
    }
}

/// The decision for one pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Inject, in this mode.
    Inject(InjectMode),
    /// Leave the pod alone.
    Skip(SkipReason),
}

/// `metadata.annotations[key]` of a Kubernetes object, if a string.
pub fn annotation<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    obj.pointer("/metadata/annotations")?.get(key)?.as_str()
}

/// `metadata.labels[key]` of a Kubernetes object, if a string.
pub fn label<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    obj.pointer("/metadata/labels")?.get(key)?.as_str()
}

/// Names of the containers of a pod (or pod template) in `spec.containers` and
/// `spec.initContainers`.
pub fn container_names(pod: &Value) -> impl Iterator<Item = &str> {
    ["/spec/containers", "/spec/initContainers"]
        .into_iter()
        .filter_map(|p| pod.pointer(p)?.as_array())
        .flatten()
        .filter_map(|c| c.get("name")?.as_str())
}

/// Whether the pod already carries a proxy.
pub fn has_proxy(pod: &Value) -> bool {
    container_names(pod).any(|n| n == names::PROXY_CONTAINER)
}

/// Whether the pod runs in the node's network namespace.
pub fn host_network(pod: &Value) -> bool {
    pod.pointer("/spec/hostNetwork")
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

/// Reads an inject annotation value.
fn parse_inject(value: &str) -> Result<Option<InjectMode>, SkipReason> {
    match value {
        names::INJECT_ENABLED => Ok(Some(InjectMode::Enabled)),
        names::INJECT_INGRESS => Ok(Some(InjectMode::Ingress)),
        names::INJECT_DISABLED => Ok(None),
        other => Err(SkipReason::UnknownAnnotation(other.to_string())),
    }
}

/// Exclusions that hold whatever the annotations say (host network, existing proxy).
pub fn structural_skip(pod: &Value) -> Option<SkipReason> {
    if host_network(pod) {
        Some(SkipReason::HostNetwork)
    } else if has_proxy(pod) {
        Some(SkipReason::AlreadyInjected)
    } else {
        None
    }
}

/// The webhook's rule. `namespace_name` is the request's namespace; `namespace` the Namespace
/// object when it could be read (its annotations are the fallback for the pod's).
pub fn decide(pod: &Value, namespace_name: &str, namespace: Option<&Value>) -> Decision {
    if namespace_name == "kube-system" {
        return Decision::Skip(SkipReason::KubeSystem);
    }
    let webhooks_disabled =
        |o: &Value| label(o, names::ADMISSION_WEBHOOKS_LABEL) == Some(names::INJECT_DISABLED);
    if webhooks_disabled(pod) || namespace.is_some_and(webhooks_disabled) {
        return Decision::Skip(SkipReason::WebhooksDisabled);
    }
    if let Some(reason) = structural_skip(pod) {
        return Decision::Skip(reason);
    }
    match annotation(pod, names::INJECT_ANNOTATION).map(parse_inject) {
        Some(Ok(Some(mode))) => return Decision::Inject(mode),
        Some(Ok(None)) => return Decision::Skip(SkipReason::PodDisabled),
        Some(Err(reason)) => return Decision::Skip(reason),
        None => {}
    }
    match namespace
        .and_then(|ns| annotation(ns, names::INJECT_ANNOTATION))
        .map(parse_inject)
    {
        Some(Ok(Some(mode))) => Decision::Inject(mode),
        Some(Ok(None)) | None => Decision::Skip(SkipReason::NotEnabled),
        Some(Err(reason)) => Decision::Skip(reason),
    }
}

/// The mode `linkerd inject --manual` uses for a pod: forced, but `ingress` is kept.
pub fn manual_mode(pod: &Value) -> InjectMode {
    match annotation(pod, names::INJECT_ANNOTATION) {
        Some(names::INJECT_INGRESS) => InjectMode::Ingress,
        _ => InjectMode::Enabled,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(
        annotation: Option<&str>,
        host_network: bool,
        containers: &[&str],
        init: &[&str],
    ) -> Value {
        let mut p = json!({
            "metadata": {"name": "p", "annotations": {}},
            "spec": {
                "hostNetwork": host_network,
                "containers": containers.iter().map(|n| json!({"name": n})).collect::<Vec<_>>(),
                "initContainers": init.iter().map(|n| json!({"name": n})).collect::<Vec<_>>(),
            }
        });
        if let Some(a) = annotation {
            p["metadata"]["annotations"][names::INJECT_ANNOTATION] = json!(a);
        }
        p
    }

    fn ns(annotation: Option<&str>, webhooks: Option<&str>) -> Value {
        let mut n = json!({"metadata": {"name": "app", "annotations": {}, "labels": {}}});
        if let Some(a) = annotation {
            n["metadata"]["annotations"][names::INJECT_ANNOTATION] = json!(a);
        }
        if let Some(w) = webhooks {
            n["metadata"]["labels"][names::ADMISSION_WEBHOOKS_LABEL] = json!(w);
        }
        n
    }

    #[test]
    fn namespace_precedence_and_exclusions() {
        use Decision::*;
        use InjectMode::*;
        use SkipReason::*;
        let app = ["app"];
        let cases: Vec<(&str, Value, &str, Option<Value>, Decision)> = vec![
            (
                "ns enabled, pod silent",
                pod(None, false, &app, &[]),
                "app",
                Some(ns(Some("enabled"), None)),
                Inject(Enabled),
            ),
            (
                "ns enabled, pod disabled",
                pod(Some("disabled"), false, &app, &[]),
                "app",
                Some(ns(Some("enabled"), None)),
                Skip(PodDisabled),
            ),
            (
                "ns enabled, pod ingress",
                pod(Some("ingress"), false, &app, &[]),
                "app",
                Some(ns(Some("enabled"), None)),
                Inject(Ingress),
            ),
            (
                "ns ingress, pod silent",
                pod(None, false, &app, &[]),
                "app",
                Some(ns(Some("ingress"), None)),
                Inject(Ingress),
            ),
            (
                "ns silent, pod silent",
                pod(None, false, &app, &[]),
                "app",
                Some(ns(None, None)),
                Skip(NotEnabled),
            ),
            (
                "ns unreadable, pod silent",
                pod(None, false, &app, &[]),
                "app",
                None,
                Skip(NotEnabled),
            ),
            (
                "ns silent, pod enabled",
                pod(Some("enabled"), false, &app, &[]),
                "app",
                Some(ns(None, None)),
                Inject(Enabled),
            ),
            (
                "ns disabled, pod enabled",
                pod(Some("enabled"), false, &app, &[]),
                "app",
                Some(ns(Some("disabled"), None)),
                Inject(Enabled),
            ),
            (
                "ns disabled, pod silent",
                pod(None, false, &app, &[]),
                "app",
                Some(ns(Some("disabled"), None)),
                Skip(NotEnabled),
            ),
            (
                "hostNetwork",
                pod(Some("enabled"), true, &app, &[]),
                "app",
                None,
                Skip(HostNetwork),
            ),
            (
                "proxy container",
                pod(Some("enabled"), false, &["app", "linkerd-proxy"], &[]),
                "app",
                None,
                Skip(AlreadyInjected),
            ),
            (
                "native sidecar proxy",
                pod(Some("enabled"), false, &app, &["linkerd-proxy"]),
                "app",
                None,
                Skip(AlreadyInjected),
            ),
            (
                "kube-system",
                pod(Some("enabled"), false, &app, &[]),
                "kube-system",
                None,
                Skip(KubeSystem),
            ),
            (
                "ns webhooks disabled",
                pod(Some("enabled"), false, &app, &[]),
                "app",
                Some(ns(Some("enabled"), Some("disabled"))),
                Skip(WebhooksDisabled),
            ),
            (
                "unknown value",
                pod(Some("true"), false, &app, &[]),
                "app",
                None,
                Skip(UnknownAnnotation("true".into())),
            ),
            (
                "unknown ns value",
                pod(None, false, &app, &[]),
                "app",
                Some(ns(Some("yes"), None)),
                Skip(UnknownAnnotation("yes".into())),
            ),
        ];
        for (name, pod, ns_name, ns, want) in cases {
            assert_eq!(decide(&pod, ns_name, ns.as_ref()), want, "case {name}");
        }
    }

    #[test]
    fn pod_label_disables_webhook() {
        let mut p = pod(Some("enabled"), false, &["app"], &[]);
        p["metadata"]["labels"] = json!({names::ADMISSION_WEBHOOKS_LABEL: "disabled"});
        assert_eq!(
            decide(&p, "app", None),
            Decision::Skip(SkipReason::WebhooksDisabled)
        );
    }
}
