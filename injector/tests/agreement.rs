//! The two halves of the contract agree: a pod the proxy injector patched with `cniEnabled`
//! is redirected by the agent's decision (linkerd-proxy present, no linkerd-init), with the
//! pod's `config.linkerd.io/skip-*` overrides; the same pod uninjected, or injected for the
//! iptables mode (`cniEnabled: false`, with linkerd-init), is not. (It lives here rather than
//! in `linkerd-cni-k8s` because this crate already depends on that one.)

use k8s_openapi::api::core::v1::Pod;
use linkerd_cni_k8s::decision::decide;
use linkerd_cni_proto::config::{LinkerdConfig, PortRange};
use linkerd_injector::{injected_pod, values::Values};
use serde_json::Value;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

fn fixture_pods() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(FIXTURES).expect("injector fixtures") {
        let path = entry.expect("entry").path();
        let review: Value =
            serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("json");
        let pod = review
            .pointer("/request/object")
            .cloned()
            .expect("review carries a pod");
        out.push((path.display().to_string(), pod));
    }
    assert!(
        out.len() >= 3,
        "expected the injector's AdmissionReview fixtures in {FIXTURES}"
    );
    out
}

fn as_pod(v: &Value) -> Pod {
    serde_json::from_value(v.clone()).expect("a valid Pod")
}

#[test]
fn injected_with_cni_is_redirected_and_the_others_are_not() {
    let base = LinkerdConfig::default();
    for (name, pod) in fixture_pods() {
        let cni = Values {
            cni_enabled: true,
            ..Values::default()
        };
        let injected = injected_pod(&pod, &cni).unwrap_or_else(|e| panic!("{name}: inject: {e}"));
        let decision =
            decide(&as_pod(&injected), None, None, &base).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            decision.redirect,
            "{name}: injected with cniEnabled must be redirected: {}",
            decision.reason
        );

        let plain = decide(&as_pod(&pod), None, None, &base).expect("decide");
        assert!(
            !plain.redirect,
            "{name}: an uninjected pod is not redirected: {}",
            plain.reason
        );

        let iptables = Values {
            cni_enabled: false,
            ..Values::default()
        };
        let injected = injected_pod(&pod, &iptables).expect("inject");
        let decision = decide(&as_pod(&injected), None, None, &base).expect("decide");
        assert!(
            !decision.redirect,
            "{name}: a pod with linkerd-init does its own iptables: {}",
            decision.reason
        );
    }
}

#[test]
fn skip_annotations_carried_by_injection_reach_the_redirect_config() {
    let (name, pod) = fixture_pods()
        .into_iter()
        .find(|(_, p)| {
            p.pointer("/metadata/annotations/config.linkerd.io~1skip-outbound-ports")
                .is_some()
        })
        .expect("a fixture with skip annotations");
    let injected = injected_pod(
        &pod,
        &Values {
            cni_enabled: true,
            ..Values::default()
        },
    )
    .expect("inject");
    let decision =
        decide(&as_pod(&injected), None, None, &LinkerdConfig::default()).expect("decide");
    assert!(decision.redirect, "{name}");
    let expected: Vec<PortRange> = linkerd_cni_proto::config::parse_port_list(
        pod.pointer("/metadata/annotations/config.linkerd.io~1skip-outbound-ports")
            .and_then(Value::as_str)
            .expect("annotation"),
    )
    .expect("ports");
    assert_eq!(decision.config.outbound_ports_to_ignore, expected, "{name}");
}
