//! The two halves of the contract agree: a pod the proxy injector patched with `cniEnabled`
//! is redirected by the agent's decision (linkerd-proxy present, no linkerd-init), with the
//! pod's `config.linkerd.io/skip-*` overrides; the same pod uninjected, or injected for the
//! iptables mode (`cniEnabled: false`, with linkerd-init), is not. (It lives here rather than
//! in `linkerd-cni-k8s` because this crate already depends on that one.)
//!
//! With a real Linkerd control plane, the pods come from Linkerd's own injector:
//! `tests/linkerd/injected-cni-pod.json` is a pod shaped as Linkerd's proxy injector returns
//! it with `cniEnabled: true` and its defaults (`proxy.nativeSidecar: true`,
//! `disableIPv6: true`): the network validator and then the proxy as init containers, the
//! validator's command, arguments and securityContext, the injector's annotations and labels.
//! The agent must redirect it (both proxy layouts), and this project's injector must produce
//! the same shape.

use k8s_openapi::api::core::v1::Pod;
use linkerd_cni_k8s::{decision::decide, overrides::POD_OVERRIDES};
use linkerd_cni_proto::config::{LinkerdConfig, PortRange};
use linkerd_injector::{injected_pod, values::Values};
use serde_json::Value;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
const LINKERD_INJECTED: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/linkerd/injected-cni-pod.json"
);

fn linkerd_injected() -> Value {
    serde_json::from_slice(&std::fs::read(LINKERD_INJECTED).expect("read the Linkerd fixture"))
        .expect("the Linkerd fixture is JSON")
}

fn init_container<'a>(pod: &'a Value, name: &str) -> &'a Value {
    pod.pointer("/spec/initContainers")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no init container {name}"))
}

fn init_names(pod: &Value) -> Vec<&str> {
    pod.pointer("/spec/initContainers")
        .and_then(Value::as_array)
        .map(|cs| cs.iter().filter_map(|c| c["name"].as_str()).collect())
        .unwrap_or_default()
}

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

/// A pod as Linkerd's own injector returns it with cniEnabled is redirected, with its
/// skip annotation applied, whether the proxy is a native sidecar (init container, Linkerd's
/// default) or the first regular container (`proxy.nativeSidecar: false`); given
/// `linkerd-init` as well (cniEnabled false), it is not.
#[test]
fn linkerds_own_injector_output_is_redirected() {
    let native = linkerd_injected();
    assert_eq!(
        init_names(&native),
        ["linkerd-network-validator", "linkerd-proxy"]
    );
    let mut classic = native.clone();
    let proxy = classic["spec"]["initContainers"]
        .as_array_mut()
        .expect("init containers")
        .remove(1);
    classic["spec"]["containers"]
        .as_array_mut()
        .expect("containers")
        .insert(0, proxy);
    for (layout, pod) in [("native sidecar", &native), ("classic", &classic)] {
        let decision = decide(&as_pod(pod), None, None, &LinkerdConfig::default())
            .unwrap_or_else(|e| panic!("{layout}: {e}"));
        assert!(decision.redirect, "{layout}: {}", decision.reason);
        assert_eq!(
            decision.config.outbound_ports_to_ignore,
            linkerd_cni_proto::config::parse_port_list("5432").expect("ports"),
            "{layout}"
        );
    }
    let mut with_init = native.clone();
    with_init["spec"]["initContainers"]
        .as_array_mut()
        .expect("init containers")
        .insert(0, serde_json::json!({"name": "linkerd-init", "image": "cr.l5d.io/linkerd/proxy-init:v2.4.3"}));
    let decision =
        decide(&as_pod(&with_init), None, None, &LinkerdConfig::default()).expect("decide");
    assert!(!decision.redirect, "{}", decision.reason);
}

/// This project's injector, given the same application pod, produces Linkerd's shape: the
/// same init containers in the same order, the validator's command, arguments and
/// securityContext exactly, the proxy's UID and ports, and the injector's annotations and
/// labels.
#[test]
fn our_injector_output_has_linkerds_shape() {
    let linkerd = linkerd_injected();
    let mut app = linkerd.clone();
    app["spec"]["initContainers"] = Value::Array(Vec::new());
    app["spec"]["volumes"] = Value::Array(Vec::new());
    for key in [
        "linkerd.io/created-by",
        "linkerd.io/proxy-version",
        "linkerd.io/trust-root-sha256",
    ] {
        app["metadata"]["annotations"]
            .as_object_mut()
            .expect("annotations")
            .remove(key);
    }
    for key in [
        "linkerd.io/control-plane-ns",
        "linkerd.io/proxy-deployment",
        "linkerd.io/workload-ns",
    ] {
        app["metadata"]["labels"]
            .as_object_mut()
            .expect("labels")
            .remove(key);
    }
    let ours = injected_pod(
        &app,
        &Values {
            cni_enabled: true,
            ..Values::default()
        },
    )
    .expect("inject");
    assert_eq!(init_names(&ours), init_names(&linkerd));
    let (theirs_v, ours_v) = (
        init_container(&linkerd, "linkerd-network-validator"),
        init_container(&ours, "linkerd-network-validator"),
    );
    for field in ["command", "args", "securityContext", "imagePullPolicy"] {
        assert_eq!(ours_v[field], theirs_v[field], "validator {field}");
    }
    let image_repo = |c: &Value| {
        c["image"]
            .as_str()
            .and_then(|i| i.rsplit_once(':'))
            .map(|(repo, _)| repo.to_string())
    };
    assert_eq!(image_repo(ours_v), image_repo(theirs_v), "validator image");
    let (theirs_p, ours_p) = (
        init_container(&linkerd, "linkerd-proxy"),
        init_container(&ours, "linkerd-proxy"),
    );
    for field in ["restartPolicy", "ports"] {
        assert_eq!(ours_p[field], theirs_p[field], "proxy {field}");
    }
    assert_eq!(
        ours_p["securityContext"]["runAsUser"],
        theirs_p["securityContext"]["runAsUser"]
    );
    for key in ["linkerd.io/created-by", "linkerd.io/proxy-version"] {
        assert!(
            ours.pointer(&format!("/metadata/annotations/{}", key.replace('/', "~1")))
                .is_some(),
            "annotation {key}"
        );
    }
    for key in ["linkerd.io/control-plane-ns", "linkerd.io/workload-ns"] {
        assert_eq!(
            ours["metadata"]["labels"][key], linkerd["metadata"]["labels"][key],
            "label {key}"
        );
    }
    // What the user wrote is kept.
    assert_eq!(
        ours["metadata"]["annotations"]["config.linkerd.io/skip-outbound-ports"],
        "5432"
    );
}

/// The injector and the agent read every override of the one table alike: a value one
/// accepts the other accepts, a value one refuses the other refuses (before the table, the
/// injector refused `proxy-gid: "-1"`, which the agent and the conflist read as "no GID").
#[test]
fn every_override_is_accepted_or_refused_alike() {
    let (name, app) = fixture_pods().into_iter().next().expect("a fixture");
    let cni = Values {
        cni_enabled: true,
        ..Values::default()
    };
    let meshed = injected_pod(&app, &cni).unwrap_or_else(|e| panic!("{name}: inject: {e}"));
    let annotate = |pod: &Value, key: &str, value: &str| {
        let mut pod = pod.clone();
        pod["metadata"]["annotations"][key] = Value::from(value);
        pod
    };
    let values = [
        "0",
        "1337",
        "-1",
        "-5",
        "4294967295",
        "4294967296",
        "8080,9000-9100",
        "80,90-10",
        "70000",
        "http",
        "10.0.0.0/8,fd00::/8",
        "10.0.0.0/33",
        " 3306 ",
    ];
    let rows: Vec<_> = POD_OVERRIDES.iter().filter(|r| r.redirects()).collect();
    assert_eq!(rows.len(), 5, "the five redirect settings");
    for row in rows {
        for value in values {
            let injector = injected_pod(&annotate(&app, row.annotation, value), &cni);
            let agent = decide(
                &as_pod(&annotate(&meshed, row.annotation, value)),
                None,
                None,
                &LinkerdConfig::default(),
            );
            assert_eq!(
                injector.is_ok(),
                agent.is_ok(),
                "{}: {value:?}: injector {:?}, agent {:?}",
                row.annotation,
                injector.as_ref().err().map(ToString::to_string),
                agent.as_ref().err().map(ToString::to_string),
            );
        }
    }
    // A negative GID is no GID for both: the proxy gets no runAsGroup.
    let pod = injected_pod(&annotate(&app, "config.linkerd.io/proxy-gid", "-1"), &cni)
        .expect("a negative GID is accepted");
    let proxy = init_container(&pod, "linkerd-proxy");
    assert!(
        proxy["securityContext"].get("runAsGroup").is_none(),
        "{}",
        proxy["securityContext"]
    );
}
