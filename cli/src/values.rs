//! Chart values: the chart's own `values.yaml` (embedded, so the CLI and the chart share one set
//! of defaults), coalesced with `-f` files, flags and `--set`, then checked.
//!
//! Values stay an untyped JSON tree while they are merged, exactly as Helm keeps them, so the
//! templates see what `helm template` would show them. [`Values`] is the typed view used only to
//! validate the result (wrong types, bad ports and paths are errors here, where Helm would
//! silently render them). Unknown keys are dropped with a warning ([`drop_unknown`]), as Helm
//! ignores them, so that an operator's existing linkerd2-cni values file renders.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use linkerd_cni_proto::config::{PortRange, parse_port_list};
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value as Json};

/// The chart's `values.yaml`.
pub const CHART_VALUES_YAML: &str = include_str!("../../deploy/charts/linkerd2-cni/values.yaml");

/// The only mode that renders today.
pub const MODE_EBPF: &str = "ebpf";

/// Why values could not be read, merged or accepted.
#[derive(Debug, thiserror::Error)]
pub enum ValuesError {
    /// A values file could not be read.
    #[error("reading values file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A values file (or the chart's own) is not YAML, or its top level is not a map.
    #[error("parsing values from {origin}: {message}")]
    Parse { origin: String, message: String },
    /// The merged values do not have the chart's shape (unknown key, wrong type).
    #[error("invalid values: {0}")]
    Shape(String),
    /// A value has the right type but is not acceptable.
    #[error("invalid value for {key}: {reason}")]
    Invalid { key: &'static str, reason: String },
    /// `mode` names a mode that does not exist or is not implemented.
    #[error(
        "mode {0:?} is not supported: \"iptables\" is planned as the fallback for kernels without \
         cgroup BPF and is not implemented yet; use mode \"ebpf\""
    )]
    Mode(String),
}

/// Parses YAML into a JSON tree whose top level is a map (an empty document is an empty map).
pub fn parse_yaml(text: &str, origin: &str) -> Result<Json, ValuesError> {
    let parse_err = |message: String| ValuesError::Parse {
        origin: origin.to_string(),
        message,
    };
    let value: Json = serde_yaml_ng::from_str(text).map_err(|e| parse_err(e.to_string()))?;
    match value {
        Json::Null => Ok(Json::Object(Map::new())),
        Json::Object(_) => Ok(value),
        _ => Err(parse_err("the top level is not a map".into())),
    }
}

/// The chart's default values.
pub fn chart_defaults() -> Result<Json, ValuesError> {
    parse_yaml(CHART_VALUES_YAML, "the chart's values.yaml")
}

/// Reads a `-f` values file.
pub fn read_values_file(path: &Path) -> Result<Json, ValuesError> {
    let text = std::fs::read_to_string(path).map_err(|source| ValuesError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse_yaml(&text, &path.display().to_string())
}

/// Merges `src` into `dst` as Helm coalesces values: maps merge key by key, anything else in
/// `src` replaces what `dst` had, and a `null` in `src` deletes the key.
pub fn coalesce(dst: &mut Json, src: Json) {
    match (dst, src) {
        (Json::Object(d), Json::Object(s)) => {
            for (k, v) in s {
                if v.is_null() {
                    d.remove(&k);
                    continue;
                }
                match d.get_mut(&k) {
                    Some(existing) if existing.is_object() && v.is_object() => {
                        coalesce(existing, v)
                    }
                    _ => {
                        d.insert(k, v);
                    }
                }
            }
        }
        (dst, src) => *dst = src,
    }
}

/// Sets `path` (map keys) in `values` to `value`, creating maps on the way; `null` deletes.
pub fn set_path(values: &mut Json, path: &[String], value: Json) {
    let mut patch = value;
    for key in path.iter().rev() {
        let mut m = Map::new();
        m.insert(key.clone(), patch);
        patch = Json::Object(m);
    }
    coalesce(values, patch);
}

/// Values whose contents are free-form (label maps, Kubernetes objects): any key is theirs.
pub const FREE_FORM: &[&str] = &[
    "commonLabels",
    "podLabels",
    "nodeAffinity",
    "updateStrategy",
];

/// Takes out of `values` every key that the chart's `values.yaml` (`defaults`) does not have,
/// outside the free-form values, and returns their dotted paths, sorted. Helm renders a chart
/// with unknown keys as if they were absent (no template reads them), so an operator's
/// existing linkerd2-cni values file renders here too; the CLI warns about each key instead of
/// silently ignoring it.
pub fn drop_unknown(values: &mut Json, defaults: &Json) -> Vec<String> {
    fn walk(prefix: &str, values: &mut Json, defaults: &Json, out: &mut Vec<String>) {
        let (Json::Object(v), Json::Object(d)) = (values, defaults) else {
            return;
        };
        v.retain(|k, _| {
            let known = d.contains_key(k);
            if !known {
                out.push(format!("{prefix}{k}"));
            }
            known
        });
        for (k, item) in v.iter_mut() {
            let path = format!("{prefix}{k}");
            if !FREE_FORM.contains(&path.as_str()) {
                walk(&format!("{path}."), item, &d[k], out);
            }
        }
    }
    let mut out = Vec::new();
    walk("", values, defaults, &mut out);
    out.sort();
    out
}

/// The warning the CLI prints for a key [`drop_unknown`] took out.
pub fn unknown_key_warning(key: &str) -> String {
    format!("warning: ignoring value {key:?}: the linkerd2-cni chart (eBPF mode) has no such value")
}

/// Accepts a string or an integer (as `--set key=8080` types it) and keeps it as a string.
fn de_stringish<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    match Json::deserialize(d)? {
        Json::String(s) => Ok(s),
        Json::Number(n) if n.is_i64() || n.is_u64() => Ok(n.to_string()),
        other => Err(serde::de::Error::custom(format!(
            "expected a string, got {other}"
        ))),
    }
}

/// The typed view of the chart's values, for validation. Field names are the chart's.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Values {
    pub mode: String,
    pub inbound_proxy_port: u16,
    pub outbound_proxy_port: u16,
    pub proxy_admin_port: u16,
    pub proxy_control_port: u16,
    #[serde(deserialize_with = "de_stringish")]
    pub ignore_inbound_ports: String,
    #[serde(deserialize_with = "de_stringish")]
    pub ignore_outbound_ports: String,
    #[serde(deserialize_with = "de_stringish")]
    pub ports_to_redirect: String,
    #[serde(rename = "proxyUID")]
    pub proxy_uid: i64,
    #[serde(rename = "proxyGID")]
    pub proxy_gid: i64,
    pub log_level: String,
    #[serde(rename = "destCNINetDir")]
    pub dest_cni_net_dir: String,
    #[serde(rename = "destCNIBinDir")]
    pub dest_cni_bin_dir: String,
    pub use_wait_flag: bool,
    pub iptables_mode: String,
    #[serde(rename = "disableIPv6")]
    pub disable_ipv6: bool,
    pub priority_class_name: String,
    pub install_namespace: bool,
    pub excluded_namespaces: Vec<String>,
    pub image: Image,
    pub tolerations: Vec<Json>,
    pub resources: Resources,
    pub agent: Agent,
    pub common_labels: BTreeMap<String, String>,
    pub pod_labels: BTreeMap<String, String>,
    pub image_pull_secrets: Vec<Json>,
    pub node_affinity: Map<String, Json>,
    pub extra_init_containers: Vec<Json>,
    pub update_strategy: Map<String, Json>,
    pub revision_history_limit: u32,
    pub cli_version: String,
    /// Accepted (Linkerd's chart has it); the agent container is always privileged.
    pub privileged: bool,
    /// Accepted (Linkerd's chart has it); no PodSecurityPolicy is rendered.
    #[serde(rename = "enablePSP")]
    pub enable_psp: bool,
    /// Accepted (Linkerd's chart has it); no repair controller: the agent adopts pods that
    /// started before the plugin where they run.
    pub repair_controller: RepairController,
}

/// `repairController`, in Linkerd's shape; validated, no effect in eBPF mode.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RepairController {
    pub enabled: bool,
    pub log_level: String,
    pub log_format: String,
    pub enable_security_context: bool,
    pub resources: Resources,
}

/// `image`.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Image {
    pub name: String,
    #[serde(deserialize_with = "de_stringish")]
    pub version: String,
    pub pull_policy: String,
}

/// `resources`, in Linkerd's shape (`cpu.limit`, `memory.request`, ...).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resources {
    pub cpu: Resource,
    pub memory: Resource,
    #[serde(rename = "ephemeral-storage")]
    pub ephemeral_storage: Resource,
}

/// One resource's request and limit; empty leaves it unset.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resource {
    #[serde(deserialize_with = "de_stringish")]
    pub limit: String,
    #[serde(deserialize_with = "de_stringish")]
    pub request: String,
}

/// `agent`: the node agent's settings (eBPF mode).
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Agent {
    pub log_level: String,
    pub socket_path: String,
    pub bpffs_path: String,
    pub pin_root: String,
    pub health_port: u16,
    pub host_cgroup_root: String,
    pub host_netns_dir: String,
}

fn invalid(key: &'static str, reason: impl Into<String>) -> ValuesError {
    ValuesError::Invalid {
        key,
        reason: reason.into(),
    }
}

fn check_port(key: &'static str, port: u16) -> Result<(), ValuesError> {
    if port == 0 {
        Err(invalid(key, "port 0"))
    } else {
        Ok(())
    }
}

fn check_ports(key: &'static str, list: &str) -> Result<Vec<PortRange>, ValuesError> {
    parse_port_list(list).map_err(|e| invalid(key, e.to_string()))
}

fn check_abs(key: &'static str, path: &str) -> Result<(), ValuesError> {
    if path.starts_with('/') && !path.contains("..") && path.len() > 1 {
        Ok(())
    } else {
        Err(invalid(key, format!("{path:?} is not an absolute path")))
    }
}

/// Checks merged values: their shape, then what the templates cannot check.
pub fn validate(values: &Json) -> Result<Values, ValuesError> {
    let v: Values =
        serde_json::from_value(values.clone()).map_err(|e| ValuesError::Shape(e.to_string()))?;
    if v.mode != MODE_EBPF {
        return Err(ValuesError::Mode(v.mode));
    }
    for (key, port) in [
        ("inboundProxyPort", v.inbound_proxy_port),
        ("outboundProxyPort", v.outbound_proxy_port),
        ("proxyAdminPort", v.proxy_admin_port),
        ("proxyControlPort", v.proxy_control_port),
        ("agent.healthPort", v.agent.health_port),
    ] {
        check_port(key, port)?;
    }
    check_ports("ignoreInboundPorts", &v.ignore_inbound_ports)?;
    check_ports("ignoreOutboundPorts", &v.ignore_outbound_ports)?;
    if let Some(range) = check_ports("portsToRedirect", &v.ports_to_redirect)?
        .iter()
        .find(|r| r.first != r.last)
    {
        return Err(invalid(
            "portsToRedirect",
            format!("{range} is a range; list single ports"),
        ));
    }
    if v.proxy_uid < 0 || v.proxy_uid > i64::from(u32::MAX) {
        return Err(invalid("proxyUID", format!("{} is not a UID", v.proxy_uid)));
    }
    if v.proxy_gid > i64::from(u32::MAX) {
        return Err(invalid("proxyGID", format!("{} is not a GID", v.proxy_gid)));
    }
    for (key, path) in [
        ("destCNINetDir", &v.dest_cni_net_dir),
        ("destCNIBinDir", &v.dest_cni_bin_dir),
        ("agent.socketPath", &v.agent.socket_path),
        ("agent.bpffsPath", &v.agent.bpffs_path),
        ("agent.pinRoot", &v.agent.pin_root),
        ("agent.hostCgroupRoot", &v.agent.host_cgroup_root),
        ("agent.hostNetnsDir", &v.agent.host_netns_dir),
    ] {
        check_abs(key, path)?;
    }
    let bpffs = v.agent.bpffs_path.trim_end_matches('/');
    if !v.agent.pin_root.starts_with(&format!("{bpffs}/")) {
        return Err(invalid(
            "agent.pinRoot",
            format!("must be inside agent.bpffsPath ({bpffs})"),
        ));
    }
    if v.image.name.is_empty() || v.image.name.contains(char::is_whitespace) {
        return Err(invalid(
            "image.name",
            format!("{:?} is not an image name", v.image.name),
        ));
    }
    if !["Always", "IfNotPresent", "Never"].contains(&v.image.pull_policy.as_str()) {
        return Err(invalid(
            "image.pullPolicy",
            "expected Always, IfNotPresent or Never",
        ));
    }
    if !["legacy", "nft", "plain"].contains(&v.iptables_mode.as_str()) {
        return Err(invalid("iptablesMode", "expected legacy, nft or plain"));
    }
    // A namespace name is a DNS label.
    if let Some(bad) = v.excluded_namespaces.iter().find(|n| {
        n.is_empty()
            || n.len() > 63
            || n.starts_with('-')
            || n.ends_with('-')
            || !n
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    }) {
        return Err(invalid(
            "excludedNamespaces",
            format!("{bad:?} is not a namespace name"),
        ));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn chart_defaults_are_valid_and_contractual() {
        let d = chart_defaults().expect("the chart's values.yaml parses");
        let v = validate(&d).expect("the chart's defaults validate");
        assert_eq!(v.mode, "ebpf");
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
        let kept = validate(&v).expect("what is left validates");
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
            ("mode", json!("iptables"), "not implemented"),
            ("mode", json!("nope"), "not supported"),
            ("inboundProxyPort", json!(0), "port 0"),
            ("inboundProxyPort", json!(70000), "invalid values"),
            ("ignoreInboundPorts", json!("80,x"), "ignoreInboundPorts"),
            ("portsToRedirect", json!("80-90"), "range"),
            ("proxyUID", json!(-5), "proxyUID"),
            ("destCNINetDir", json!("etc/cni"), "absolute"),
            ("image", json!({"version": true}), "expected a string"),
            ("image", json!({"pullPolicy": "Sometimes"}), "pullPolicy"),
            ("agent", json!({"pinRoot": "/elsewhere/x"}), "agent.pinRoot"),
        ];
        for (key, value, want) in cases {
            let mut v = chart_defaults().expect("defaults");
            coalesce(&mut v, json!({ *key: value }));
            let err = validate(&v)
                .map(|_| ())
                .expect_err(&format!("{key}={value} should be rejected"));
            assert!(
                err.to_string().contains(want),
                "{key}={value}: error {err:?} should mention {want:?}"
            );
        }
        let mut v = chart_defaults().expect("defaults");
        coalesce(
            &mut v,
            json!({"ignoreInboundPorts": 8080, "image": {"version": 2}}),
        );
        let ok = validate(&v)
            .expect("integers where the chart wants strings, as --set types them, are accepted");
        assert_eq!(
            (ok.ignore_inbound_ports.as_str(), ok.image.version.as_str()),
            ("8080", "2")
        );
    }
}
