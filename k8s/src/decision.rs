//! The pure decision: from a Pod, its Namespace, the `default/kubernetes` Service and the
//! conflist's `linkerd` section, whether the pod is redirected and with which configuration.
//!
//! Rules (the contract's section 2, steps 3 to 5):
//! - redirected when a container **or** an init container is named `linkerd-proxy` and no init
//!   container is named `linkerd-init` (that pod programs its own iptables); only names count;
//! - overrides come from the pod's annotation, or, when the pod does not carry that annotation
//!   or carries it empty, from its namespace's (as Linkerd's plugin and injector do). An empty
//!   value on both means "no override";
//! - each override of [`crate::overrides::POD_OVERRIDES`] that sets the redirection's
//!   configuration (`skip-outbound-ports`, `skip-inbound-ports`, `skip-subnets`, `proxy-uid`,
//!   `proxy-gid`) replaces its conflist value or is appended to it, as its row says;
//! - pods labelled `linkerd.io/control-plane-component` also skip (outbound) the `port` and the
//!   integer `targetPort`s of the `default/kubernetes` Service, or 443 and 6443 when that Service
//!   could not be read.
//!
//! A malformed override is an error naming the annotation and where it came from: the ADD fails
//! with that message rather than meshing the pod with a configuration its owner did not ask for.
//! A port or subnet list over `MAX_LIST_BYTES` (16 KiB) or `MAX_LIST_ENTRIES` (1,024 entries),
//! on the pod or its namespace, is such an error too, refused before it is parsed
//! ([`linkerd_cni_proto::config::parse_port_list`]): the work an annotation can cause is
//! bounded by these limits, whatever the API server lets a pod carry (256 KiB).
//! Annotations of pods that are not redirected are never read, so they cannot fail.

use std::fmt;

use k8s_openapi::{
    api::core::v1::{Namespace, Pod, Service},
    apimachinery::pkg::{apis::meta::v1::ObjectMeta, util::intstr::IntOrString},
};
use linkerd_cni_proto::config::{LinkerdConfig, PortRange};

use crate::{
    names::{CONTROL_PLANE_COMPONENT_LABEL, PROXY_CONTAINER},
    overrides::{OverrideOrigin, POD_OVERRIDES, override_value, quote_value},
};

/// Ports a control-plane pod skips when the `default/kubernetes` Service could not be read.
pub const FALLBACK_API_SERVER_PORTS: [u16; 2] = [443, 6443];

/// What to do with one pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Whether the pod's traffic goes through its proxy.
    pub redirect: bool,
    /// Why, in words fit for a log line.
    pub reason: String,
    /// The conflist's configuration with the pod's overrides applied (unchanged when the pod is
    /// not redirected).
    pub config: LinkerdConfig,
}

/// Where an annotation was read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AnnotationSource {
    /// On the pod itself.
    Pod { namespace: String, name: String },
    /// On the pod's namespace (fallback).
    Namespace { name: String },
}

impl fmt::Display for AnnotationSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Pod { namespace, name } => write!(f, "pod {namespace}/{name}"),
            Self::Namespace { name } => write!(f, "namespace {name}"),
        }
    }
}

/// A `config.linkerd.io/*` override whose value cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("annotation {annotation}={value:?} on {source_object} is malformed: {reason}")]
pub struct AnnotationError {
    /// The annotation's key.
    pub annotation: &'static str,
    /// Its value, as written, cut to [`crate::overrides::MAX_QUOTED_VALUE`] characters (then `...` and its size
    /// in bytes): a pod may carry 256 KiB of annotations, and this message reaches the CNI
    /// error, the runtime's log and the pod's events.
    pub value: String,
    /// The object that carries it.
    pub source_object: AnnotationSource,
    /// What is wrong with it.
    pub reason: String,
}

/// Decides whether `pod` is redirected and computes its configuration from `base`.
///
/// `namespace` is the pod's namespace, for annotation fallback (`None`: no fallback).
/// `kubernetes_service` is the `default/kubernetes` Service, `None` when it could not be read
/// (only used for control-plane pods).
pub fn decide(
    pod: &Pod,
    namespace: Option<&Namespace>,
    kubernetes_service: Option<&Service>,
    base: &LinkerdConfig,
) -> Result<Decision, AnnotationError> {
    let unchanged = |reason: &str| Decision {
        redirect: false,
        reason: reason.to_string(),
        config: base.clone(),
    };
    if !wants_redirect(pod) {
        return Ok(unchanged(if has_proxy(pod) {
            "linkerd-init init container present: the pod redirects its own traffic"
        } else {
            "no linkerd-proxy container"
        }));
    }

    let overrides = Overrides { pod, namespace };
    let mut config = base.clone();
    let mut applied = Vec::new();

    for row in POD_OVERRIDES.iter().filter(|row| row.redirects()) {
        if let Some((value, source)) = overrides.get(row.annotation) {
            row.apply(&mut config, value)
                .map_err(|e| malformed(row.annotation, value, &source, e.to_string()))?;
            applied.push(format!("{} from {source}", row.annotation));
        }
    }

    if is_control_plane(pod) {
        let ports = match kubernetes_service {
            Some(svc) => service_ports(svc),
            None => FALLBACK_API_SERVER_PORTS.to_vec(),
        };
        for port in ports {
            let range = PortRange::single(port);
            if !config.outbound_ports_to_ignore.contains(&range) {
                config.outbound_ports_to_ignore.push(range);
            }
        }
        applied.push(match kubernetes_service {
            Some(_) => "control plane: skipping the default/kubernetes Service ports".to_string(),
            None => "control plane: default/kubernetes Service unavailable, skipping 443 and 6443"
                .to_string(),
        });
    }

    let mut reason = "linkerd-proxy present, no linkerd-init".to_string();
    if !applied.is_empty() {
        reason.push_str("; ");
        reason.push_str(&applied.join(", "));
    }
    Ok(Decision {
        redirect: true,
        reason,
        config,
    })
}

/// Whether the pod is redirected at all (rule 3), before any override is read.
pub fn wants_redirect(pod: &Pod) -> bool {
    let Some(spec) = &pod.spec else { return false };
    let init_names = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| c.name.as_str());
    linkerd_cni_proto::config::wants_redirect(
        spec.containers.iter().map(|c| c.name.as_str()),
        init_names,
    )
}

/// Whether some container or init container is named `linkerd-proxy`.
fn has_proxy(pod: &Pod) -> bool {
    let Some(spec) = &pod.spec else { return false };
    spec.containers.iter().any(|c| c.name == PROXY_CONTAINER)
        || spec
            .init_containers
            .iter()
            .flatten()
            .any(|c| c.name == PROXY_CONTAINER)
}

/// Whether the pod carries the control-plane label (any value).
pub fn is_control_plane(pod: &Pod) -> bool {
    pod.metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(CONTROL_PLANE_COMPONENT_LABEL))
}

/// The Service's ports and integer target ports, in order, without duplicates.
fn service_ports(svc: &Service) -> Vec<u16> {
    let mut out = Vec::new();
    for p in svc.spec.iter().flat_map(|s| s.ports.iter().flatten()) {
        let target = match &p.target_port {
            Some(IntOrString::Int(t)) => Some(*t),
            // A named target port says nothing about the number the API server listens on.
            Some(IntOrString::String(_)) | None => None,
        };
        for port in std::iter::once(p.port).chain(target) {
            if let Some(port) = u16::try_from(port).ok().filter(|p| *p != 0)
                && !out.contains(&port)
            {
                out.push(port);
            }
        }
    }
    out
}

/// Reads overrides from the pod, falling back to its namespace.
struct Overrides<'a> {
    pod: &'a Pod,
    namespace: Option<&'a Namespace>,
}

impl<'a> Overrides<'a> {
    /// The override's value and where it came from; `None` when unset or empty on both (an
    /// empty value on the pod falls through to the namespace's).
    fn get(&self, key: &str) -> Option<(&'a str, AnnotationSource)> {
        let annotation = |meta: &'a ObjectMeta| Some(meta.annotations.as_ref()?.get(key)?.as_str());
        let (value, origin) = override_value(annotation(&self.pod.metadata), || {
            annotation(&self.namespace?.metadata)
        })?;
        let source = match origin {
            OverrideOrigin::Pod => AnnotationSource::Pod {
                namespace: self.pod.metadata.namespace.clone().unwrap_or_default(),
                name: self.pod.metadata.name.clone().unwrap_or_default(),
            },
            OverrideOrigin::Namespace => AnnotationSource::Namespace {
                name: self
                    .namespace
                    .and_then(|ns| ns.metadata.name.clone())
                    .unwrap_or_default(),
            },
        };
        Some((value, source))
    }
}

fn malformed(
    annotation: &'static str,
    value: &str,
    source: &AnnotationSource,
    reason: String,
) -> AnnotationError {
    AnnotationError {
        annotation,
        value: quote_value(value),
        source_object: source.clone(),
        reason,
    }
}

#[cfg(test)]
mod tests;
