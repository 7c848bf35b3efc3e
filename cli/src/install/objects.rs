//! `linkerd install`: the part of the control plane this project owns, as Kubernetes objects.
//!
//! - Namespace `linkerd`, Pod Security `restricted` when `cniEnabled` (no pod of the mesh needs
//!   NET_ADMIN), `privileged` otherwise (`linkerd-init` does);
//! - ConfigMap `linkerd-config` whose `values` carry `cniEnabled` and the proxy settings;
//! - the proxy injector: ServiceAccount, RBAC, Deployment, Service;
//! - MutatingWebhookConfiguration `linkerd-proxy-injector-webhook-config` with Linkerd's
//!   selectors;
//! - the webhook's TLS: a generated CA and serving certificate (Secret + `caBundle`), or a
//!   cert-manager Certificate and the `cert-manager.io/inject-ca-from` annotation.

use base64::Engine;
use linkerd_cni_k8s::names;
use serde_json::{Value, json};

use linkerd_injector::{
    paths,
    tls::TlsMaterial,
    values::{Values, ValuesError},
};

use crate::manifest::{ManifestError, write_documents};

/// Default injector image repository.
pub const DEFAULT_INJECTOR_IMAGE: &str = "ghcr.io/linkerd/linkerd-cni-ebpf/proxy-injector";
/// UID of the injector (Linkerd's `controllerUID`).
pub const INJECTOR_UID: i64 = 2103;

/// Where the webhook's certificate comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WebhookTls {
    /// Rendered into a Secret; the CA goes into `caBundle`.
    Generated(TlsMaterial),
    /// A cert-manager `Certificate` from this issuer fills the Secret; cert-manager's CA
    /// injector fills `caBundle`.
    CertManager {
        /// Issuer name.
        issuer: String,
        /// `Issuer` or `ClusterIssuer`.
        issuer_kind: String,
    },
}

/// `failurePolicy` of the webhook.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailurePolicy {
    /// Pods are created without a proxy when the webhook is unreachable (Linkerd's default).
    Ignore,
    /// Pod creation fails when the webhook is unreachable.
    Fail,
}

impl FailurePolicy {
    fn as_str(self) -> &'static str {
        match self {
            FailurePolicy::Ignore => "Ignore",
            FailurePolicy::Fail => "Fail",
        }
    }
}

/// Everything `linkerd install` renders from.
#[derive(Clone, Debug)]
pub struct InstallOptions {
    /// The values stored in `linkerd-config` (`cni_enabled` among them).
    pub values: Values,
    /// The injector's image, `repo:tag`.
    pub injector_image: String,
    /// Replicas of the injector.
    pub replicas: u32,
    /// The webhook's failure policy.
    pub failure_policy: FailurePolicy,
    /// The webhook's TLS.
    pub tls: WebhookTls,
    /// The control plane's namespace (`-L/--linkerd-namespace`).
    pub namespace: String,
}

/// Why rendering failed.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// The values could not be serialised.
    #[error(transparent)]
    Values(#[from] ValuesError),
    /// The YAML could not be written.
    #[error(transparent)]
    Manifest(#[from] ManifestError),
}

fn labels(ns: &str, component: Option<&str>) -> Value {
    let mut l = json!({names::CONTROL_PLANE_NS_LABEL: ns});
    if let Some(c) = component {
        l[names::CONTROL_PLANE_COMPONENT_LABEL] = json!(c);
    }
    l
}

/// The rendered objects, in apply order.
pub fn render(opts: &InstallOptions) -> Result<Vec<Value>, InstallError> {
    let ns = opts.namespace.as_str();
    let inj = names::INJECTOR;
    let component = "proxy-injector";
    let psa = if opts.values.cni_enabled {
        "restricted"
    } else {
        "privileged"
    };
    let mut objs = vec![
        json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": ns,
                "annotations": {names::INJECT_ANNOTATION: names::INJECT_DISABLED},
                "labels": {
                    "linkerd.io/is-control-plane": "true",
                    names::CONTROL_PLANE_NS_LABEL: ns,
                    names::ADMISSION_WEBHOOKS_LABEL: "disabled",
                    names::PSA_ENFORCE_LABEL: psa,
                },
            },
        }),
        json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": names::CONFIG_MAP, "namespace": ns, "labels": labels(ns, Some("controller"))},
            "data": {names::CONFIG_VALUES_KEY: opts.values.to_yaml()?},
        }),
        json!({
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": inj, "namespace": ns, "labels": labels(ns, Some(component))},
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": format!("linkerd-{inj}"), "labels": labels(ns, Some(component))},
            "rules": [
                {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]},
                {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
            ],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": format!("linkerd-{inj}"), "labels": labels(ns, Some(component))},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": format!("linkerd-{inj}")},
            "subjects": [{"kind": "ServiceAccount", "name": inj, "namespace": ns}],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": format!("{inj}-config"), "namespace": ns, "labels": labels(ns, Some(component))},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [names::CONFIG_MAP], "verbs": ["get"]}],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": format!("{inj}-config"), "namespace": ns, "labels": labels(ns, Some(component))},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": format!("{inj}-config")},
            "subjects": [{"kind": "ServiceAccount", "name": inj, "namespace": ns}],
        }),
    ];
    match &opts.tls {
        WebhookTls::Generated(m) => objs.push(json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": {"name": names::INJECTOR_TLS_SECRET, "namespace": ns, "labels": labels(ns, Some(component))},
            "data": {
                "ca.crt": b64(&m.ca_pem),
                "tls.crt": b64(&m.cert_pem),
                "tls.key": b64(&m.key_pem),
            },
        })),
        WebhookTls::CertManager { issuer, issuer_kind } => objs.push(json!({
            "apiVersion": "cert-manager.io/v1",
            "kind": "Certificate",
            "metadata": {"name": inj, "namespace": ns, "labels": labels(ns, Some(component))},
            "spec": {
                "secretName": names::INJECTOR_TLS_SECRET,
                "dnsNames": linkerd_injector::tls::service_dns_names(inj, ns),
                "issuerRef": {"name": issuer, "kind": issuer_kind, "group": "cert-manager.io"},
                "privateKey": {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always"},
                "usages": ["server auth", "digital signature", "key encipherment"],
            },
        })),
    }
    objs.push(deployment(opts));
    objs.push(json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": inj, "namespace": ns, "labels": labels(ns, Some(component))},
        "spec": {
            "type": "ClusterIP",
            "selector": {names::CONTROL_PLANE_COMPONENT_LABEL: component},
            "ports": [{"name": "proxy-injector", "port": 443, "targetPort": "proxy-injector"}],
        },
    }));
    objs.push(webhook_configuration(opts));
    Ok(objs)
}

fn deployment(opts: &InstallOptions) -> Value {
    let ns = opts.namespace.as_str();
    let inj = names::INJECTOR;
    let tls_dir = paths::PROXY_INJECTOR_TLS_DIR;
    let probe = |path: &str| json!({"httpGet": {"path": path, "port": "admin"}, "initialDelaySeconds": 1, "periodSeconds": 10});
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": inj, "namespace": ns, "labels": labels(ns, Some("proxy-injector"))},
        "spec": {
            "replicas": opts.replicas,
            "selector": {"matchLabels": {names::CONTROL_PLANE_COMPONENT_LABEL: "proxy-injector"}},
            "template": {
                "metadata": {
                    "labels": labels(ns, Some("proxy-injector")),
                    "annotations": {names::INJECT_ANNOTATION: names::INJECT_DISABLED},
                },
                "spec": {
                    "serviceAccountName": inj,
                    "nodeSelector": {"kubernetes.io/os": "linux"},
                    "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{
                        "name": "proxy-injector",
                        "image": opts.injector_image,
                        "imagePullPolicy": opts.values.image_pull_policy,
                        "command": ["linkerd-proxy-injector"],
                        "args": [
                            format!("--addr=0.0.0.0:{}", names::INJECTOR_PORT),
                            format!("--admin-addr=0.0.0.0:{}", names::INJECTOR_ADMIN_PORT),
                            format!("--tls-cert={tls_dir}/tls.crt"),
                            format!("--tls-key={tls_dir}/tls.key"),
                            format!("--control-plane-namespace={ns}"),
                        ],
                        "ports": [
                            {"name": "proxy-injector", "containerPort": names::INJECTOR_PORT},
                            {"name": "admin", "containerPort": names::INJECTOR_ADMIN_PORT},
                        ],
                        "readinessProbe": probe("/ready"),
                        "livenessProbe": probe("/live"),
                        "securityContext": {
                            "allowPrivilegeEscalation": false,
                            "capabilities": {"drop": ["ALL"]},
                            "readOnlyRootFilesystem": true,
                            "runAsNonRoot": true,
                            "runAsUser": INJECTOR_UID,
                            "runAsGroup": INJECTOR_UID,
                            "seccompProfile": {"type": "RuntimeDefault"},
                        },
                        "volumeMounts": [{"name": "tls", "mountPath": tls_dir, "readOnly": true}],
                    }],
                    "volumes": [{"name": "tls", "secret": {"secretName": names::INJECTOR_TLS_SECRET}}],
                },
            },
        },
    })
}

fn webhook_configuration(opts: &InstallOptions) -> Value {
    let ns = opts.namespace.as_str();
    let disabled =
        |key: &str| json!({"key": key, "operator": "NotIn", "values": [names::INJECT_DISABLED]});
    let mut client_config =
        json!({"service": {"name": names::INJECTOR, "namespace": ns, "path": "/", "port": 443}});
    let mut metadata =
        json!({"name": names::WEBHOOK_CONFIG, "labels": labels(ns, Some("proxy-injector"))});
    match &opts.tls {
        WebhookTls::Generated(m) => client_config["caBundle"] = json!(b64(&m.ca_pem)),
        WebhookTls::CertManager { .. } => {
            metadata["annotations"] =
                json!({"cert-manager.io/inject-ca-from": format!("{ns}/{}", names::INJECTOR)});
        }
    }
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": metadata,
        "webhooks": [{
            "name": names::WEBHOOK_NAME,
            "clientConfig": client_config,
            "failurePolicy": opts.failure_policy.as_str(),
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "timeoutSeconds": 10,
            "reinvocationPolicy": "IfNeeded",
            "rules": [{
                "operations": ["CREATE"],
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "resources": ["pods"],
                "scope": "Namespaced",
            }],
            "namespaceSelector": {"matchExpressions": [
                disabled(names::ADMISSION_WEBHOOKS_LABEL),
                {"key": names::NAMESPACE_NAME_LABEL, "operator": "NotIn", "values": ["kube-system", "cert-manager"]},
            ]},
            "objectSelector": {"matchExpressions": [
                disabled(names::ADMISSION_WEBHOOKS_LABEL),
                {"key": names::CONTROL_PLANE_COMPONENT_LABEL, "operator": "DoesNotExist"},
                {"key": names::CNI_RESOURCE_LABEL, "operator": "DoesNotExist"},
            ]},
        }],
    })
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// [`render`] as one YAML stream for `kubectl apply -f -`.
pub fn render_yaml(opts: &InstallOptions) -> Result<String, InstallError> {
    Ok(write_documents(&render(opts)?)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(cni: bool, tls: WebhookTls) -> InstallOptions {
        InstallOptions {
            values: Values {
                cni_enabled: cni,
                ..Values::default()
            },
            injector_image: format!("{DEFAULT_INJECTOR_IMAGE}:test"),
            replicas: 1,
            failure_policy: FailurePolicy::Ignore,
            tls,
            namespace: names::CONTROL_PLANE_NAMESPACE.into(),
        }
    }

    fn fake_tls() -> WebhookTls {
        WebhookTls::Generated(TlsMaterial {
            ca_pem: "CA".into(),
            cert_pem: "CERT".into(),
            key_pem: "KEY".into(),
        })
    }

    fn find<'a>(objs: &'a [Value], kind: &str) -> &'a Value {
        objs.iter()
            .find(|o| o["kind"] == kind)
            .unwrap_or_else(|| panic!("no {kind}"))
    }

    #[test]
    fn cni_enabled_sets_psa_and_config() {
        for (cni, psa) in [(true, "restricted"), (false, "privileged")] {
            let objs = render(&opts(cni, fake_tls())).expect("render");
            let ns = find(&objs, "Namespace");
            assert_eq!(
                ns["metadata"]["labels"][names::PSA_ENFORCE_LABEL],
                psa,
                "cni={cni}"
            );
            let values = find(&objs, "ConfigMap")["data"]["values"]
                .as_str()
                .expect("values string");
            let parsed = Values::from_yaml(values).expect("values parse back");
            assert_eq!(parsed.cni_enabled, cni);
            assert_eq!(parsed.proxy.uid, 2102);
            assert_eq!(
                parsed.proxy.ports,
                linkerd_injector::values::Ports {
                    admin: 4191,
                    control: 4190,
                    inbound: 4143,
                    outbound: 4140
                }
            );
        }
    }

    /// The Secret and `caBundle` carry generated material the injector can serve with, for
    /// the names the API server uses to reach it (the injector's tests run its binary on such
    /// material).
    #[test]
    fn generated_tls_is_usable_by_the_injector() {
        let material = linkerd_injector::tls::generate(&linkerd_injector::tls::service_dns_names(
            names::INJECTOR,
            names::CONTROL_PLANE_NAMESPACE,
        ))
        .expect("TLS");
        let objs = render(&opts(true, WebhookTls::Generated(material.clone()))).expect("render");
        let decode = |v: &Value| {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(v.as_str().expect("base64 string"))
                .expect("base64");
            String::from_utf8(bytes).expect("PEM is UTF-8")
        };
        let secret = find(&objs, "Secret");
        let (cert, key) = (
            decode(&secret["data"]["tls.crt"]),
            decode(&secret["data"]["tls.key"]),
        );
        assert_eq!((&cert, &key), (&material.cert_pem, &material.key_pem));
        let webhook = find(&objs, "MutatingWebhookConfiguration");
        assert_eq!(
            decode(&webhook["webhooks"][0]["clientConfig"]["caBundle"]),
            material.ca_pem
        );
        linkerd_injector::tls::certified_key(cert.as_bytes(), key.as_bytes())
            .expect("the rendered Secret is a usable serving certificate");
    }

    #[test]
    fn webhook_selectors_and_tls() {
        let objs = render(&opts(true, fake_tls())).expect("render");
        let wh = &find(&objs, "MutatingWebhookConfiguration")["webhooks"][0];
        assert_eq!(wh["clientConfig"]["caBundle"], b64("CA"));
        assert_eq!(wh["failurePolicy"], "Ignore");
        let ns_sel = wh["namespaceSelector"].to_string();
        assert!(
            ns_sel.contains(names::ADMISSION_WEBHOOKS_LABEL) && ns_sel.contains("kube-system"),
            "{ns_sel}"
        );
        let obj_sel = wh["objectSelector"].to_string();
        assert!(
            obj_sel.contains(names::ADMISSION_WEBHOOKS_LABEL)
                && obj_sel.contains(names::CONTROL_PLANE_COMPONENT_LABEL),
            "{obj_sel}"
        );
        assert_eq!(find(&objs, "Secret")["data"]["tls.key"], b64("KEY"));
        assert_eq!(find(&objs, "Secret")["data"]["tls.crt"], b64("CERT"));

        let cm = render(&opts(
            true,
            WebhookTls::CertManager {
                issuer: "ca".into(),
                issuer_kind: "ClusterIssuer".into(),
            },
        ))
        .expect("render");
        assert!(
            cm.iter().all(|o| o["kind"] != "Secret"),
            "cert-manager makes the Secret"
        );
        let mwc = find(&cm, "MutatingWebhookConfiguration");
        assert_eq!(
            mwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
            "linkerd/linkerd-proxy-injector"
        );
        assert!(mwc["webhooks"][0]["clientConfig"].get("caBundle").is_none());
        assert_eq!(
            find(&cm, "Certificate")["spec"]["secretName"],
            names::INJECTOR_TLS_SECRET
        );
    }
}
