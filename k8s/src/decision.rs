//! The pure decision: from a Pod, its Namespace, the `default/kubernetes` Service and the
//! conflist's `linkerd` section, whether the pod is redirected and with which configuration.
//!
//! Rules (the contract's section 2, steps 3 to 5):
//! - redirected when a container **or** an init container is named `linkerd-proxy` and no init
//!   container is named `linkerd-init` (that pod programs its own iptables); only names count;
//! - overrides come from the pod's annotation, or, when the pod does not carry that annotation
//!   or carries it empty, from its namespace's (as Linkerd's plugin and injector do). An empty
//!   value on both means "no override";
//! - `config.linkerd.io/skip-outbound-ports` replaces the outbound ignore list,
//!   `config.linkerd.io/skip-inbound-ports` is appended to the inbound ignore list,
//!   `config.linkerd.io/skip-subnets` replaces the subnets to ignore,
//!   `config.linkerd.io/proxy-uid` / `config.linkerd.io/proxy-gid` replace the configured IDs;
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
use linkerd_cni_proto::config::{self, LinkerdConfig, PortRange};

use crate::names::{
    CONTROL_PLANE_COMPONENT_LABEL, PROXY_CONTAINER, PROXY_GID_ANNOTATION, PROXY_UID_ANNOTATION,
    SKIP_INBOUND_PORTS_ANNOTATION, SKIP_OUTBOUND_PORTS_ANNOTATION, SKIP_SUBNETS_ANNOTATION,
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
    /// Its value, as written, cut to [`MAX_QUOTED_VALUE`] characters (then `...` and its size
    /// in bytes): a pod may carry 256 KiB of annotations, and this message reaches the CNI
    /// error, the runtime's log and the pod's events.
    pub value: String,
    /// The object that carries it.
    pub source_object: AnnotationSource,
    /// What is wrong with it.
    pub reason: String,
}

/// Which object an override was read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OverrideOrigin {
    /// The pod (or pod template) itself.
    Pod,
    /// The pod's namespace.
    Namespace,
}

/// Linkerd's rule for `config.linkerd.io/*` overrides, shared by this decision and the proxy
/// injector: the pod's annotation when it is set and not blank, else its namespace's
/// (`on_namespace`, only called then), else none. Linkerd reads both with `!= ""`, so an empty
/// value on the pod falls through to the namespace's rather than hiding it.
pub fn override_value<'a>(
    on_pod: Option<&'a str>,
    on_namespace: impl FnOnce() -> Option<&'a str>,
) -> Option<(&'a str, OverrideOrigin)> {
    let set = |v: &&str| !v.trim().is_empty();
    match on_pod.filter(set) {
        Some(value) => Some((value, OverrideOrigin::Pod)),
        None => Some((on_namespace().filter(set)?, OverrideOrigin::Namespace)),
    }
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

    if let Some((value, source)) = overrides.get(SKIP_OUTBOUND_PORTS_ANNOTATION) {
        config.outbound_ports_to_ignore = ports(SKIP_OUTBOUND_PORTS_ANNOTATION, value, &source)?;
        applied.push(format!("{SKIP_OUTBOUND_PORTS_ANNOTATION} from {source}"));
    }
    if let Some((value, source)) = overrides.get(SKIP_INBOUND_PORTS_ANNOTATION) {
        config.inbound_ports_to_ignore.extend(ports(
            SKIP_INBOUND_PORTS_ANNOTATION,
            value,
            &source,
        )?);
        applied.push(format!("{SKIP_INBOUND_PORTS_ANNOTATION} from {source}"));
    }
    if let Some((value, source)) = overrides.get(SKIP_SUBNETS_ANNOTATION) {
        config.subnets_to_ignore = config::parse_cidr_list(value)
            .map_err(|e| malformed(SKIP_SUBNETS_ANNOTATION, value, &source, e.to_string()))?;
        applied.push(format!("{SKIP_SUBNETS_ANNOTATION} from {source}"));
    }
    if let Some((value, source)) = overrides.get(PROXY_UID_ANNOTATION) {
        // A UID; 0 keeps Linkerd's meaning (no exemption). Negative values are refused: they
        // would silently drop the exemption and loop the proxy's own traffic back to it.
        let uid = value.trim().parse::<u32>().map_err(|_| {
            malformed(
                PROXY_UID_ANNOTATION,
                value,
                &source,
                "expected an integer 0-4294967295".into(),
            )
        })?;
        config.proxy_uid = i64::from(uid);
        applied.push(format!("{PROXY_UID_ANNOTATION} from {source}"));
    }
    if let Some((value, source)) = overrides.get(PROXY_GID_ANNOTATION) {
        // Negative means "no GID exemption", as in the conflist.
        let gid = value
            .trim()
            .parse::<i64>()
            .ok()
            .filter(|g| *g <= i64::from(u32::MAX))
            .ok_or_else(|| {
                malformed(
                    PROXY_GID_ANNOTATION,
                    value,
                    &source,
                    "expected an integer <= 4294967295 (negative: none)".into(),
                )
            })?;
        config.proxy_gid = gid;
        applied.push(format!("{PROXY_GID_ANNOTATION} from {source}"));
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

fn ports(
    annotation: &'static str,
    value: &str,
    source: &AnnotationSource,
) -> Result<Vec<PortRange>, AnnotationError> {
    config::parse_port_list(value).map_err(|e| malformed(annotation, value, source, e.to_string()))
}

/// How many characters of a malformed annotation's value an error quotes.
pub const MAX_QUOTED_VALUE: usize = 128;

/// `value` as an error quotes it (the agent's decision and the proxy injector): whole when
/// short, else its first [`MAX_QUOTED_VALUE`] characters, `...` and its size.
pub fn quote_value(value: &str) -> String {
    match value.char_indices().nth(MAX_QUOTED_VALUE) {
        None => value.to_string(),
        Some((at, _)) => format!("{}... ({} bytes)", &value[..at], value.len()),
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
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn pod(
        containers: &[&str],
        init_containers: &[&str],
        annotations: Value,
        labels: Value,
    ) -> Pod {
        let names = |n: &[&str]| {
            n.iter()
                .map(|n| json!({"name": n, "image": "x"}))
                .collect::<Vec<_>>()
        };
        serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "web", "namespace": "emojivoto", "annotations": annotations, "labels": labels},
            "spec": {"containers": names(containers), "initContainers": names(init_containers)},
        }))
        .expect("test pod JSON is a valid Pod")
    }

    fn namespace(annotations: Value) -> Namespace {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": "emojivoto", "annotations": annotations},
        }))
        .expect("test namespace JSON is a valid Namespace")
    }

    fn service(ports: Value) -> Service {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "kubernetes", "namespace": "default"},
            "spec": {"ports": ports},
        }))
        .expect("test service JSON is a valid Service")
    }

    /// The conflist section every case starts from: non-default lists so that "replaced" and
    /// "appended" are distinguishable from "left alone".
    fn base() -> LinkerdConfig {
        serde_json::from_value(json!({
            "proxy-uid": 2102,
            "proxy-gid": -1,
            "inbound-ports-to-ignore": ["4191", "4190"],
            "outbound-ports-to-ignore": ["25"],
            "subnets-to-ignore": ["10.0.0.0/8"],
        }))
        .expect("base config JSON is valid")
    }

    fn ports(list: &str) -> Vec<PortRange> {
        config::parse_port_list(list).expect("test port list is valid")
    }

    /// What a case expects; `None` fields must equal the base config.
    #[derive(Default)]
    struct Expect {
        redirect: bool,
        outbound: Option<&'static str>,
        inbound: Option<&'static str>,
        subnets: Option<&'static str>,
        uid: Option<i64>,
        gid: Option<i64>,
    }

    /// Name, pod, namespace, `default/kubernetes` Service, expectation.
    type Case<'a> = (&'a str, Pod, Option<Namespace>, Option<&'a Service>, Expect);
    /// Name, pod, namespace, annotation, value, where the error must say it was read.
    type BadCase<'a> = (
        &'a str,
        Pod,
        Option<Namespace>,
        &'a str,
        &'a str,
        AnnotationSource,
    );

    const PROXY: &[&str] = &["app", "linkerd-proxy"];
    const APP: &[&str] = &["app"];

    #[test]
    fn decides_every_rule() {
        let none = json!({});
        let api_svc = service(json!([{"name": "https", "port": 443, "targetPort": 6443}]));
        let named_target_svc = service(
            json!([{"port": 8443, "targetPort": "https"}, {"port": 444, "targetPort": 444}]),
        );
        #[rustfmt::skip]
        let cases: Vec<Case> = vec![
            ("proxy in containers", pod(PROXY, &[], none.clone(), none.clone()), None, None,
                Expect { redirect: true, ..Default::default() }),
            ("proxy as native sidecar in initContainers", pod(APP, &["linkerd-proxy"], none.clone(), none.clone()), None, None,
                Expect { redirect: true, ..Default::default() }),
            ("proxy with linkerd-init", pod(PROXY, &["linkerd-init"], none.clone(), none.clone()), None, None,
                Expect { redirect: false, ..Default::default() }),
            ("native sidecar with linkerd-init", pod(APP, &["linkerd-init", "linkerd-proxy"], none.clone(), none.clone()), None, None,
                Expect { redirect: false, ..Default::default() }),
            ("linkerd-init as a regular container does not count", pod(&["linkerd-proxy", "linkerd-init"], &[], none.clone(), none.clone()), None, None,
                Expect { redirect: true, ..Default::default() }),
            ("no proxy", pod(APP, &["setup"], none.clone(), none.clone()), None, None,
                Expect { redirect: false, ..Default::default() }),
            ("no proxy: overrides ignored", pod(APP, &[], json!({SKIP_OUTBOUND_PORTS_ANNOTATION: "9"}), none.clone()), Some(namespace(json!({SKIP_SUBNETS_ANNOTATION: "1.2.3.0/24"}))), None,
                Expect { redirect: false, ..Default::default() }),
            ("skip-outbound-ports on pod replaces", pod(PROXY, &[], json!({SKIP_OUTBOUND_PORTS_ANNOTATION: "3306, 5432-5433"}), none.clone()), None, None,
                Expect { redirect: true, outbound: Some("3306,5432-5433"), ..Default::default() }),
            ("skip-outbound-ports on namespace", pod(PROXY, &[], none.clone(), none.clone()), Some(namespace(json!({SKIP_OUTBOUND_PORTS_ANNOTATION: "11211"}))), None,
                Expect { redirect: true, outbound: Some("11211"), ..Default::default() }),
            ("skip-outbound-ports on both: pod wins", pod(PROXY, &[], json!({SKIP_OUTBOUND_PORTS_ANNOTATION: "3306"}), none.clone()), Some(namespace(json!({SKIP_OUTBOUND_PORTS_ANNOTATION: "11211"}))), None,
                Expect { redirect: true, outbound: Some("3306"), ..Default::default() }),
            ("skip-inbound-ports on pod appends", pod(PROXY, &[], json!({SKIP_INBOUND_PORTS_ANNOTATION: "8080,9000-9100"}), none.clone()), None, None,
                Expect { redirect: true, inbound: Some("4191,4190,8080,9000-9100"), ..Default::default() }),
            ("skip-inbound-ports on namespace", pod(PROXY, &[], none.clone(), none.clone()), Some(namespace(json!({SKIP_INBOUND_PORTS_ANNOTATION: "22"}))), None,
                Expect { redirect: true, inbound: Some("4191,4190,22"), ..Default::default() }),
            ("skip-inbound-ports on both: pod wins", pod(PROXY, &[], json!({SKIP_INBOUND_PORTS_ANNOTATION: "8080"}), none.clone()), Some(namespace(json!({SKIP_INBOUND_PORTS_ANNOTATION: "22"}))), None,
                Expect { redirect: true, inbound: Some("4191,4190,8080"), ..Default::default() }),
            ("skip-subnets on pod replaces", pod(PROXY, &[], json!({SKIP_SUBNETS_ANNOTATION: "192.168.0.0/16,fd00::/8"}), none.clone()), None, None,
                Expect { redirect: true, subnets: Some("192.168.0.0/16,fd00::/8"), ..Default::default() }),
            ("skip-subnets on namespace", pod(PROXY, &[], none.clone(), none.clone()), Some(namespace(json!({SKIP_SUBNETS_ANNOTATION: "172.16.0.0/12"}))), None,
                Expect { redirect: true, subnets: Some("172.16.0.0/12"), ..Default::default() }),
            ("skip-subnets on both: pod wins", pod(PROXY, &[], json!({SKIP_SUBNETS_ANNOTATION: "192.168.0.0/16"}), none.clone()), Some(namespace(json!({SKIP_SUBNETS_ANNOTATION: "172.16.0.0/12"}))), None,
                Expect { redirect: true, subnets: Some("192.168.0.0/16"), ..Default::default() }),
            ("proxy-uid and proxy-gid on pod", pod(PROXY, &[], json!({PROXY_UID_ANNOTATION: "1337", PROXY_GID_ANNOTATION: "1338"}), none.clone()), None, None,
                Expect { redirect: true, uid: Some(1337), gid: Some(1338), ..Default::default() }),
            ("proxy-uid and proxy-gid on namespace", pod(PROXY, &[], none.clone(), none.clone()), Some(namespace(json!({PROXY_UID_ANNOTATION: "0", PROXY_GID_ANNOTATION: "-1"}))), None,
                Expect { redirect: true, uid: Some(0), gid: Some(-1), ..Default::default() }),
            ("proxy-uid on both: pod wins, gid from namespace", pod(PROXY, &[], json!({PROXY_UID_ANNOTATION: "1337"}), none.clone()), Some(namespace(json!({PROXY_UID_ANNOTATION: "7", PROXY_GID_ANNOTATION: "8"}))), None,
                Expect { redirect: true, uid: Some(1337), gid: Some(8), ..Default::default() }),
            ("empty annotation on pod falls through to the namespace's", pod(PROXY, &[], json!({SKIP_OUTBOUND_PORTS_ANNOTATION: ""}), none.clone()), Some(namespace(json!({SKIP_OUTBOUND_PORTS_ANNOTATION: "11211"}))), None,
                Expect { redirect: true, outbound: Some("11211"), ..Default::default() }),
            ("blank annotation on pod falls through to the namespace's", pod(PROXY, &[], json!({SKIP_SUBNETS_ANNOTATION: "  "}), none.clone()), Some(namespace(json!({SKIP_SUBNETS_ANNOTATION: "172.16.0.0/12"}))), None,
                Expect { redirect: true, subnets: Some("172.16.0.0/12"), ..Default::default() }),
            ("empty annotation on pod and namespace changes nothing", pod(PROXY, &[], json!({SKIP_OUTBOUND_PORTS_ANNOTATION: ""}), none.clone()), Some(namespace(json!({SKIP_OUTBOUND_PORTS_ANNOTATION: ""}))), None,
                Expect { redirect: true, ..Default::default() }),
            ("control plane: service port and integer targetPort", pod(PROXY, &[], none.clone(), json!({CONTROL_PLANE_COMPONENT_LABEL: "destination"})), None, Some(&api_svc),
                Expect { redirect: true, outbound: Some("25,443,6443"), ..Default::default() }),
            ("control plane: named targetPort ignored", pod(PROXY, &[], none.clone(), json!({CONTROL_PLANE_COMPONENT_LABEL: ""})), None, Some(&named_target_svc),
                Expect { redirect: true, outbound: Some("25,8443,444"), ..Default::default() }),
            ("control plane: service lookup failed", pod(PROXY, &[], none.clone(), json!({CONTROL_PLANE_COMPONENT_LABEL: "identity"})), None, None,
                Expect { redirect: true, outbound: Some("25,443,6443"), ..Default::default() }),
            ("control plane: ports added after the replacing annotation", pod(PROXY, &[], json!({SKIP_OUTBOUND_PORTS_ANNOTATION: "443,4567"}), json!({CONTROL_PLANE_COMPONENT_LABEL: "identity"})), None, Some(&api_svc),
                Expect { redirect: true, outbound: Some("443,4567,6443"), ..Default::default() }),
            ("control plane without proxy", pod(APP, &[], none.clone(), json!({CONTROL_PLANE_COMPONENT_LABEL: "identity"})), None, Some(&api_svc),
                Expect { redirect: false, ..Default::default() }),
        ];
        let base = base();
        for (name, pod, ns, svc, expect) in cases {
            let d = decide(&pod, ns.as_ref(), svc, &base)
                .unwrap_or_else(|e| panic!("{name}: unexpected error {e}"));
            assert_eq!(
                d.redirect, expect.redirect,
                "{name}: redirect ({})",
                d.reason
            );
            assert!(!d.reason.is_empty(), "{name}: empty reason");
            let want_out = expect
                .outbound
                .map_or_else(|| base.outbound_ports_to_ignore.clone(), ports);
            assert_eq!(
                d.config.outbound_ports_to_ignore, want_out,
                "{name}: outbound ports"
            );
            let want_in = expect
                .inbound
                .map_or_else(|| base.inbound_ports_to_ignore.clone(), ports);
            assert_eq!(
                d.config.inbound_ports_to_ignore, want_in,
                "{name}: inbound ports"
            );
            let want_subnets = expect.subnets.map_or_else(
                || base.subnets_to_ignore.clone(),
                |s| config::parse_cidr_list(s).expect("test CIDR list is valid"),
            );
            assert_eq!(d.config.subnets_to_ignore, want_subnets, "{name}: subnets");
            assert_eq!(
                d.config.proxy_uid,
                expect.uid.unwrap_or(base.proxy_uid),
                "{name}: proxy uid"
            );
            assert_eq!(
                d.config.proxy_gid,
                expect.gid.unwrap_or(base.proxy_gid),
                "{name}: proxy gid"
            );
            // Nothing else of the conflist section moves.
            let mut rest = d.config.clone();
            rest.outbound_ports_to_ignore = base.outbound_ports_to_ignore.clone();
            rest.inbound_ports_to_ignore = base.inbound_ports_to_ignore.clone();
            rest.subnets_to_ignore = base.subnets_to_ignore.clone();
            rest.proxy_uid = base.proxy_uid;
            rest.proxy_gid = base.proxy_gid;
            assert_eq!(rest, base, "{name}: untouched keys changed");
        }
    }

    #[test]
    fn malformed_annotations_name_the_annotation_and_its_object() {
        let none = json!({});
        let pod_source = AnnotationSource::Pod {
            namespace: "emojivoto".into(),
            name: "web".into(),
        };
        let ns_source = AnnotationSource::Namespace {
            name: "emojivoto".into(),
        };
        #[rustfmt::skip]
        let cases: Vec<BadCase> = vec![
            ("outbound port out of range", pod(PROXY, &[], json!({SKIP_OUTBOUND_PORTS_ANNOTATION: "70000"}), none.clone()), None,
                SKIP_OUTBOUND_PORTS_ANNOTATION, "70000", pod_source.clone()),
            ("inbound reversed range", pod(PROXY, &[], json!({SKIP_INBOUND_PORTS_ANNOTATION: "80,90-10"}), none.clone()), None,
                SKIP_INBOUND_PORTS_ANNOTATION, "80,90-10", pod_source.clone()),
            ("subnet not a CIDR", pod(PROXY, &[], json!({SKIP_SUBNETS_ANNOTATION: "10.0.0.0/33"}), none.clone()), None,
                SKIP_SUBNETS_ANNOTATION, "10.0.0.0/33", pod_source.clone()),
            ("uid not a number", pod(PROXY, &[], json!({PROXY_UID_ANNOTATION: "proxy"}), none.clone()), None,
                PROXY_UID_ANNOTATION, "proxy", pod_source.clone()),
            ("negative uid", pod(PROXY, &[], json!({PROXY_UID_ANNOTATION: "-5"}), none.clone()), None,
                PROXY_UID_ANNOTATION, "-5", pod_source.clone()),
            ("gid too large", pod(PROXY, &[], json!({PROXY_GID_ANNOTATION: "4294967296"}), none.clone()), None,
                PROXY_GID_ANNOTATION, "4294967296", pod_source.clone()),
            ("malformed on namespace", pod(PROXY, &[], none.clone(), none.clone()), Some(namespace(json!({SKIP_OUTBOUND_PORTS_ANNOTATION: "http"}))),
                SKIP_OUTBOUND_PORTS_ANNOTATION, "http", ns_source.clone()),
        ];
        for (name, pod, ns, annotation, value, source) in cases {
            let err = decide(&pod, ns.as_ref(), None, &base())
                .map(|d| panic!("{name}: expected an error, got {d:?}"))
                .unwrap_err();
            assert_eq!(err.annotation, annotation, "{name}");
            assert_eq!(err.value, value, "{name}");
            assert_eq!(err.source_object, source, "{name}");
            let msg = err.to_string();
            assert!(
                msg.contains(annotation) && msg.contains(&source.to_string()),
                "{name}: message {msg:?}"
            );
        }
        // Issue 28: 32,760 copies of `1-65535` (about 256 KiB), on the pod or its namespace,
        // are refused before any of it is parsed, and the error quotes only the start of it.
        let hostile = vec!["1-65535"; 32_760].join(",");
        for (on_pod, on_ns, source) in [
            (
                json!({SKIP_INBOUND_PORTS_ANNOTATION: hostile}),
                none.clone(),
                &pod_source,
            ),
            (
                none.clone(),
                json!({SKIP_INBOUND_PORTS_ANNOTATION: hostile}),
                &ns_source,
            ),
            (
                json!({SKIP_SUBNETS_ANNOTATION: hostile}),
                none.clone(),
                &pod_source,
            ),
        ] {
            let err = decide(
                &pod(PROXY, &[], on_pod, none.clone()),
                Some(&namespace(on_ns)),
                None,
                &base(),
            )
            .map(|d| panic!("expected an error, got {:?}", d.reason))
            .unwrap_err();
            assert_eq!(&err.source_object, source);
            assert!(
                err.reason
                    .contains("262079 bytes, over the per-pod limit of 16384 bytes"),
                "{}",
                err.reason
            );
            assert!(err.value.ends_with("... (262079 bytes)"), "{}", err.value);
            let msg = err.to_string();
            assert!(msg.len() < 512, "a short message: {msg}");
        }
        // Within the byte limit, more than 1,024 entries are refused at the first one too many.
        let many = vec!["8080"; 1025].join(",");
        let err = decide(
            &pod(
                PROXY,
                &[],
                json!({SKIP_OUTBOUND_PORTS_ANNOTATION: many}),
                none.clone(),
            ),
            None,
            None,
            &base(),
        )
        .map(|d| panic!("expected an error, got {:?}", d.reason))
        .unwrap_err();
        assert!(
            err.reason.contains("more than 1024 entries"),
            "{}",
            err.reason
        );
        // At both limits, accepted.
        let at_limit = vec!["1-32767"; 1024].join(",");
        let d = decide(
            &pod(
                PROXY,
                &[],
                json!({SKIP_INBOUND_PORTS_ANNOTATION: at_limit}),
                none.clone(),
            ),
            None,
            None,
            &base(),
        )
        .expect("1,024 entries in 8 KiB are accepted");
        assert_eq!(d.config.inbound_ports_to_ignore.len(), 2 + 1024);

        // A malformed namespace annotation is not read when the pod sets its own.
        let d = decide(
            &pod(
                PROXY,
                &[],
                json!({SKIP_OUTBOUND_PORTS_ANNOTATION: "3306"}),
                none.clone(),
            ),
            Some(&namespace(json!({SKIP_OUTBOUND_PORTS_ANNOTATION: "http"}))),
            None,
            &base(),
        )
        .expect("the pod's own valid annotation wins");
        assert_eq!(d.config.outbound_ports_to_ignore, ports("3306"));
    }
}
