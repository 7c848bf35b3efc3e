//! Unit tests of the chart values: the chart's defaults, merging, unknown keys, validation and
//! origins.

use serde_json::json;

use super::*;

#[test]
fn chart_defaults_are_valid_and_contractual() {
    let d = chart_defaults().expect("the chart's values.yaml parses");
    let v = validate(&d, &Origins::default()).expect("the chart's defaults validate");
    assert_eq!(v.mode, "auto");
    assert_eq!((v.inbound_proxy_port, v.outbound_proxy_port), (4143, 4140));
    assert_eq!((v.proxy_admin_port, v.proxy_control_port), (4191, 4190));
    assert_eq!((v.proxy_uid, v.proxy_gid), (2102, -1));
    assert_eq!(
        (v.dest_cni_net_dir.as_str(), v.dest_cni_bin_dir.as_str()),
        ("/etc/cni/net.d", "/opt/cni/bin")
    );
    assert_eq!(v.log_level, "info");
    // With the release namespace, which the chart always puts first, the plugin's default.
    let mut excluded = vec![linkerd_cni_k8s::names::CNI_NAMESPACE.to_string()];
    excluded.extend(v.excluded_namespaces.iter().cloned());
    assert_eq!(
        excluded,
        linkerd_cni_proto::config::DEFAULT_EXCLUDED_NAMESPACES
    );
    assert_eq!(v.agent.socket_path, linkerd_cni_common::paths::AGENT_SOCKET);
    assert_eq!(v.agent.bpffs_path, linkerd_cni_common::paths::BPFFS);
    assert_eq!(v.agent.pin_root, linkerd_cni_common::paths::PIN_ROOT);
    // Issue 25: nothing exposed, a priority, the privileged mount kept by default.
    assert_eq!(v.priority_class_name, "system-node-critical");
    assert!(!v.agent.metrics.enabled);
    assert!(v.agent.mount_bpffs);
    assert!(!v.agent.cni_netns_from_proc);
    assert!(!v.agent.sys_admin);
}

#[test]
fn coalesce_merges_maps_and_replaces_the_rest() {
    let mut v = json!({"a": {"b": 1, "c": [1, 2]}, "d": "x", "e": 1});
    coalesce(
        &mut v,
        json!({"a": {"c": [3], "n": true}, "d": {"m": 1}, "e": null}),
    );
    assert_eq!(
        v,
        json!({"a": {"b": 1, "c": [3], "n": true}, "d": {"m": 1}})
    );
    set_path(&mut v, &["a".into(), "b".into()], json!(2));
    assert_eq!(v["a"]["b"], json!(2));
    assert_eq!(v["a"]["c"], json!([3]), "set_path keeps siblings");
}

#[test]
fn unknown_keys_are_dropped_and_named() {
    let defaults = chart_defaults().expect("defaults");
    let mut v = defaults.clone();
    coalesce(
        &mut v,
        json!({
            "someFutureController": {"enabled": true},
            "image": {"name": "x", "digest": "sha256:0"},
            "resources": {"cpu": {"limit": "1", "burst": "2"}},
            "commonLabels": {"any": "label"},
            "podLabels": {"p": "q"},
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}},
            "updateStrategy": {"type": "OnDelete", "rollingUpdate": null},
            "tolerations": [{"operator": "Exists", "key": "k"}],
        }),
    );
    let dropped = drop_unknown(&mut v, &defaults);
    assert_eq!(
        dropped,
        [
            "image.digest",
            "resources.cpu.burst",
            "someFutureController"
        ]
    );
    let kept = validate(&v, &Origins::default()).expect("what is left validates");
    assert_eq!(kept.image.name, "x");
    assert_eq!(kept.resources.cpu.limit, "1");
    assert_eq!(kept.common_labels["any"], "label");
    assert!(
        kept.node_affinity
            .contains_key("requiredDuringSchedulingIgnoredDuringExecution")
    );
    assert_eq!(kept.update_strategy["type"], "OnDelete");
    assert_eq!(drop_unknown(&mut v, &defaults), Vec::<String>::new());
}

#[test]
fn validation_rejects_what_the_chart_cannot_render() {
    let cases: &[(&str, Json, &str)] = &[
        ("mode", json!("nope"), "not supported"),
        (
            "inboundProxyPort",
            json!(0),
            "inboundProxyPort (from x): 0 is out of range",
        ),
        (
            "inboundProxyPort",
            json!(70000),
            "out of range (1 to 65535)",
        ),
        (
            "inboundProxyPort",
            json!("4143x"),
            "expected an integer, got the string \"4143x\"",
        ),
        ("inboundProxyPort", json!("0x10"), "expected an integer"),
        ("inboundProxyPort", json!("010"), "expected an integer"),
        (
            "inboundProxyPort",
            json!(4143.5),
            "expected an integer, got the number 4143.5",
        ),
        (
            "ignoreInboundPorts",
            json!("80,x"),
            "ignoreInboundPorts (from x)",
        ),
        ("portsToRedirect", json!("80-90"), "range"),
        (
            "proxyUID",
            json!(-5),
            "proxyUID (from x): -5 is out of range",
        ),
        (
            "proxyUID",
            json!(true),
            "expected an integer, got the boolean true",
        ),
        ("destCNINetDir", json!("etc/cni"), "absolute"),
        (
            "useWaitFlag",
            json!("true"),
            "useWaitFlag (from x): expected true or false, got the string \"true\"",
        ),
        (
            "image",
            json!({"version": true}),
            "image.version (from x): expected a string",
        ),
        (
            "image",
            json!("x"),
            "invalid value for image (from x): expected a map",
        ),
        ("image", json!({"pullPolicy": "Sometimes"}), "pullPolicy"),
        ("agent", json!({"pinRoot": "/elsewhere/x"}), "agent.pinRoot"),
        (
            "agent",
            json!({"metrics": {"bindAddress": "[::]"}}),
            "agent.metrics.bindAddress (from x): \"[::]\" is not an IPv4 or IPv6 address",
        ),
        (
            "agent",
            json!({"metrics": {"bindAddress": "node.example"}}),
            "is not an IPv4 or IPv6 address",
        ),
        (
            "agent",
            json!({"metrics": {"enabled": true, "port": 9990}}),
            "agent.metrics.port (from x): 9990 is agent.healthPort's",
        ),
        (
            "agent",
            json!({"mountBpffs": "false"}),
            "agent.mountBpffs (from x): expected true or false",
        ),
        (
            "commonLabels",
            json!({"a": 1}),
            "commonLabels.a (from x): expected a string",
        ),
        (
            "excludedNamespaces",
            json!(["ok", "Not-OK"]),
            "excludedNamespaces[1] (from x)",
        ),
        ("proxyUID", Json::Null, "proxyUID (from x): no value"),
    ];
    for (key, value, want) in cases {
        let mut v = chart_defaults().expect("defaults");
        let mut origins = Origins::default();
        let patch = json!({ *key: value });
        origins.record_tree(&patch, "x");
        coalesce(&mut v, patch);
        let err = validate(&v, &origins)
            .map(|_| ())
            .expect_err(&format!("{key}={value} should be rejected"));
        assert!(
            err.to_string().contains(want),
            "{key}={value}: error {err:?} should mention {want:?}"
        );
    }
}

/// What Helm's templates read as integers and text is accepted: numeric strings
/// (`--set-string`, quoted YAML), whole floats (every number of a values file is a float to
/// Helm), integers where text goes (`--set image.version=2`).
#[test]
fn values_are_read_as_helm_types_them() {
    let mut v = chart_defaults().expect("defaults");
    coalesce(
        &mut v,
        json!({
            "proxyUID": "2102", "proxyGID": "-1", "proxyAdminPort": "4191",
            "inboundProxyPort": 5143.0, "revisionHistoryLimit": "3",
            "ignoreInboundPorts": 8080, "image": {"version": 2},
            "agent": {"healthPort": "9991"},
            "resources": {"cpu": {"limit": 1}},
        }),
    );
    let ok = validate(&v, &Origins::default()).expect("accepted as Helm reads them");
    assert_eq!(
        (
            ok.proxy_uid,
            ok.proxy_gid,
            ok.proxy_admin_port,
            ok.inbound_proxy_port
        ),
        (2102, -1, 4191, 5143)
    );
    assert_eq!(ok.revision_history_limit, 3);
    assert_eq!(ok.agent.health_port, 9991);
    assert_eq!(
        (
            ok.ignore_inbound_ports.as_str(),
            ok.image.version.as_str(),
            ok.resources.cpu.limit.as_str()
        ),
        ("8080", "2", "1")
    );
}

/// An error names where the value came from: the last source that set it or a map above
/// it, not one that set a sibling; the chart's values.yaml when nobody did.
#[test]
fn origins_follow_the_merge_order() {
    let mut o = Origins::default();
    o.record_tree(
        &json!({"image": {"name": "a", "version": "1"}, "tolerations": []}),
        "file a",
    );
    o.record(&[PathStep::Key("image"), PathStep::Key("version")], "--set");
    o.record(
        &[
            PathStep::Key("tolerations"),
            PathStep::Index(1),
            PathStep::Key("key"),
        ],
        "--set tolerations",
    );
    assert_eq!(o.of("image.name"), "file a");
    assert_eq!(o.of("image.version"), "--set");
    assert_eq!(o.of("image.pullPolicy"), CHART_ORIGIN);
    assert_eq!(o.of("tolerations[0].operator"), "file a");
    assert_eq!(o.of("tolerations[1].key"), "--set tolerations");
    assert_eq!(o.of("agent.logLevel"), CHART_ORIGIN);
    // A map made by a source that set a key under it is that source's.
    o.record(
        &[
            PathStep::Key("agent"),
            PathStep::Key("extra"),
            PathStep::Key("deep"),
        ],
        "--set deep",
    );
    assert_eq!(o.of("agent.extra"), "--set deep");
    assert_eq!(o.of("agent.logLevel"), CHART_ORIGIN);
    // A later file that sets the whole map takes it over; one that sets a map where a
    // scalar was no longer leaves the scalar's owner above it.
    o.record_tree(&json!({"image": "scalar"}), "file b");
    assert_eq!(o.of("image.version"), "file b");
    o.record(
        &[PathStep::Key("image"), PathStep::Key("name")],
        "--set image.name",
    );
    assert_eq!(o.of("image.name"), "--set image.name");
    assert_eq!(o.of("image.version"), CHART_ORIGIN);
}
