//! The vocabulary Linkerd and this project share: annotation and label keys, container and
//! volume names, the names of the control-plane objects and Linkerd's defaults. The agent's
//! decision, the webhook, `linkerd inject`, `linkerd uninject`, `linkerd install` and the
//! checks all use these constants, so they can never disagree on a spelling.

/// The proxy's default UID (Linkerd's `proxy.uid`), exempt from outbound redirection.
pub use linkerd_cni_proto::config::DEFAULT_PROXY_UID;

/// Pod or namespace annotation asking for injection (`enabled`, `disabled`, `ingress`).
pub const INJECT_ANNOTATION: &str = "linkerd.io/inject";
/// [`INJECT_ANNOTATION`] value: inject the proxy.
pub const INJECT_ENABLED: &str = "enabled";
/// [`INJECT_ANNOTATION`] value: never inject.
pub const INJECT_DISABLED: &str = "disabled";
/// [`INJECT_ANNOTATION`] value: inject the proxy in ingress mode.
pub const INJECT_INGRESS: &str = "ingress";

/// Annotation recording who injected the pod.
pub const CREATED_BY_ANNOTATION: &str = "linkerd.io/created-by";
/// Annotation recording the injected proxy's version.
pub const PROXY_VERSION_ANNOTATION: &str = "linkerd.io/proxy-version";
/// Annotations Linkerd itself adds on injection; `uninject` removes them as well.
pub const LINKERD_ADDED_ANNOTATIONS: &[&str] = &[
    INJECT_ANNOTATION,
    CREATED_BY_ANNOTATION,
    PROXY_VERSION_ANNOTATION,
    "linkerd.io/trust-root-sha256",
    "linkerd.io/identity-mode",
];

/// Label naming the control plane namespace of an injected pod.
pub const CONTROL_PLANE_NS_LABEL: &str = "linkerd.io/control-plane-ns";
/// Label naming the namespace of an injected workload.
pub const WORKLOAD_NS_LABEL: &str = "linkerd.io/workload-ns";
/// Labels added on injection; `uninject` removes them.
pub const LINKERD_ADDED_LABELS: &[&str] = &[CONTROL_PLANE_NS_LABEL, WORKLOAD_NS_LABEL];

/// Namespace (or pod) label excluding it from Linkerd's admission webhooks (`disabled`).
pub const ADMISSION_WEBHOOKS_LABEL: &str = "config.linkerd.io/admission-webhooks";
/// Label of Linkerd's control-plane pods (injected at render time, never by the webhook).
pub const CONTROL_PLANE_COMPONENT_LABEL: &str = "linkerd.io/control-plane-component";
/// Label of every object `linkerd install-cni` renders.
pub const CNI_RESOURCE_LABEL: &str = "linkerd.io/cni-resource";
/// The well-known label holding a namespace's name.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";
/// Pod Security Admission level enforced on a namespace.
pub const PSA_ENFORCE_LABEL: &str = "pod-security.kubernetes.io/enforce";

// The `config.linkerd.io/*` overrides: what each sets, replace or append, its parser, in
// `crate::overrides::POD_OVERRIDES`.

/// Inbound ports the proxy must not see.
pub const SKIP_INBOUND_PORTS_ANNOTATION: &str = "config.linkerd.io/skip-inbound-ports";
/// Outbound ports the proxy must not see.
pub const SKIP_OUTBOUND_PORTS_ANNOTATION: &str = "config.linkerd.io/skip-outbound-ports";
/// Subnets whose inbound traffic is not redirected.
pub const SKIP_SUBNETS_ANNOTATION: &str = "config.linkerd.io/skip-subnets";
/// Overrides the proxy's UID.
pub const PROXY_UID_ANNOTATION: &str = "config.linkerd.io/proxy-uid";
/// Overrides the proxy's GID.
pub const PROXY_GID_ANNOTATION: &str = "config.linkerd.io/proxy-gid";
/// Overrides the proxy image name.
pub const PROXY_IMAGE_ANNOTATION: &str = "config.linkerd.io/proxy-image";
/// Overrides the proxy image version.
pub const PROXY_VERSION_OVERRIDE_ANNOTATION: &str = "config.linkerd.io/proxy-version";
/// Overrides the proxy's log level.
pub const PROXY_LOG_LEVEL_ANNOTATION: &str = "config.linkerd.io/proxy-log-level";

/// The proxy container (a native sidecar: an init container with `restartPolicy: Always`), and
/// the iptables init container, present only when `cniEnabled` is false. Defined in `proto`,
/// whose "is this pod meshed" rule the plugin applies without this crate.
pub use linkerd_cni_proto::config::{INIT_CONTAINER, PROXY_CONTAINER};
/// The network validator init container, present only when `cniEnabled` is true.
pub const VALIDATOR_CONTAINER: &str = "linkerd-network-validator";
/// Every container injection may add; `uninject` removes them all.
pub const INJECTED_CONTAINERS: &[&str] = &[PROXY_CONTAINER, INIT_CONTAINER, VALIDATOR_CONTAINER];

/// The emptyDir `linkerd-init` keeps the xtables lock in.
pub const XTABLES_LOCK_VOLUME: &str = "linkerd-proxy-init-xtables-lock";
/// The in-memory volume holding the proxy's identity key and certificate.
pub const IDENTITY_END_ENTITY_VOLUME: &str = "linkerd-identity-end-entity";
/// The projected service-account token the proxy presents to the identity service.
pub const IDENTITY_TOKEN_VOLUME: &str = "linkerd-identity-token";
/// Every volume injection may add; `uninject` removes them all.
pub const INJECTED_VOLUMES: &[&str] = &[
    XTABLES_LOCK_VOLUME,
    IDENTITY_END_ENTITY_VOLUME,
    IDENTITY_TOKEN_VOLUME,
];

/// The control plane's namespace.
pub const CONTROL_PLANE_NAMESPACE: &str = "linkerd";
/// The ConfigMap holding the control plane's values.
pub const CONFIG_MAP: &str = "linkerd-config";
/// The key of [`CONFIG_MAP`] holding the values as YAML.
pub const CONFIG_VALUES_KEY: &str = "values";
/// The namespace `linkerd install-cni` renders into.
pub const CNI_NAMESPACE: &str = "linkerd-cni";
/// Name of linkerd-cni's DaemonSet, ServiceAccount, ClusterRole and ClusterRoleBinding.
pub const CNI_NAME: &str = "linkerd-cni";
/// linkerd-cni's ConfigMap.
pub const CNI_CONFIG_MAP: &str = "linkerd-cni-config";
/// Name of the injector's Deployment, Service and ServiceAccount.
pub const INJECTOR: &str = "linkerd-proxy-injector";
/// The Secret holding the webhook's serving certificate.
pub const INJECTOR_TLS_SECRET: &str = "linkerd-proxy-injector-k8s-tls";
/// The MutatingWebhookConfiguration.
pub const WEBHOOK_CONFIG: &str = "linkerd-proxy-injector-webhook-config";
/// The webhook's name inside [`WEBHOOK_CONFIG`].
pub const WEBHOOK_NAME: &str = "linkerd-proxy-injector.linkerd.io";
/// The injector's HTTPS port inside its pod.
pub const INJECTOR_PORT: u16 = 8443;
/// The injector's plain-HTTP admin port (metrics, probes).
pub const INJECTOR_ADMIN_PORT: u16 = 9995;
