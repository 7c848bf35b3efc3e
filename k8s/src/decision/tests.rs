//! Unit tests of the meshing decision: every rule, and the messages of malformed or oversized
//! annotations.

use linkerd_cni_proto::config;
use serde_json::{Value, json};

use super::*;
use crate::names::{
    PROXY_GID_ANNOTATION, PROXY_UID_ANNOTATION, SKIP_INBOUND_PORTS_ANNOTATION,
    SKIP_OUTBOUND_PORTS_ANNOTATION, SKIP_SUBNETS_ANNOTATION,
};

fn pod(containers: &[&str], init_containers: &[&str], annotations: Value, labels: Value) -> Pod {
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
    let named_target_svc =
        service(json!([{"port": 8443, "targetPort": "https"}, {"port": 444, "targetPort": 444}]));
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
