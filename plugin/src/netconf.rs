//! The network config on stdin: size-limited read, decode, and the keys this plugin uses.
//!
//! Broken JSON is a decode error (6); JSON of the wrong shape is an invalid config (7) that
//! names the key. Every key of Linkerd's `linkerd` section is accepted (the iptables-only ones
//! are ignored), and unknown keys anywhere are ignored, as the CNI spec asks.

use std::io::Read;

use linkerd_cni_proto::{config::LinkerdConfig, wire::AttachmentRef};
use serde::{Deserialize as _, de::DeserializeOwned};
use serde_json::{Map, Value};

use crate::{error::PluginError, version::SpecVersion};

/// The largest network config accepted on stdin. Real ones are a few KiB; a prevResult with
/// many interfaces stays far below this.
pub const MAX_CONFIG_BYTES: usize = 1 << 20;

/// The network config, as far as this plugin cares.
#[derive(Clone, Debug, PartialEq)]
pub struct NetConf {
    pub cni_version: SpecVersion,
    pub name: Option<String>,
    /// `log_level`, raw (see [`crate::log::Level::from_config`]).
    pub log_level: Option<String>,
    /// `kubernetes.kubeconfig`: read only while the node agent is unreachable, to ask the API
    /// whether the pod is meshed (see `crate::apiserver`).
    pub kubeconfig: Option<String>,
    pub linkerd: LinkerdConfig,
    /// Malformed entries of the `linkerd` section's lists, dropped (Linkerd skips a bad
    /// port rather than fail every pod): one message each, for the log.
    pub dropped_entries: Vec<String>,
    pub prev_result: Option<Value>,
    /// `runtimeConfig.cgroupPath` (the installer declares the `cgroupPath` capability).
    pub cgroup_path: Option<String>,
    /// GC: `cni.dev/valid-attachments`, or the older `cni.dev/attachments`. `None` when the
    /// config has neither.
    pub valid_attachments: Option<Vec<AttachmentRef>>,
}

/// Reads stdin up to [`MAX_CONFIG_BYTES`].
pub fn read_limited(input: &mut dyn Read) -> Result<Vec<u8>, PluginError> {
    let mut buf = Vec::new();
    input
        .take(MAX_CONFIG_BYTES as u64 + 1)
        .read_to_end(&mut buf)
        .map_err(|source| PluginError::Io {
            what: "reading the network config from stdin".into(),
            source,
        })?;
    if buf.len() > MAX_CONFIG_BYTES {
        return Err(PluginError::ConfigTooLarge {
            limit: MAX_CONFIG_BYTES,
        });
    }
    Ok(buf)
}

/// The config's `cniVersion` if it is readable and supported, for error replies written
/// before (or despite) a full parse.
pub fn peek_version(bytes: &[u8]) -> Option<SpecVersion> {
    // Nothing to parse (a VERSION request's stdin is often empty): a JSON error would be built
    // for nothing, and building one costs a start-up's worth of CPU feature detection.
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return None;
    }
    #[derive(serde::Deserialize)]
    struct Peek {
        #[serde(rename = "cniVersion")]
        cni_version: String,
    }
    let peek: Peek = serde_json::from_slice(bytes).ok()?;
    SpecVersion::parse(&peek.cni_version)
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> PluginError {
    PluginError::InvalidConfig {
        field: field.into(),
        reason: reason.into(),
    }
}

/// `obj[key]` as a `T`; absent and `null` are `None`, a wrong type is an error naming `path`.
fn opt<T: DeserializeOwned>(
    obj: &Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<Option<T>, PluginError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => T::deserialize(v)
            .map(Some)
            .map_err(|e| invalid(path, e.to_string())),
    }
}

fn object<'a>(
    obj: &'a Map<String, Value>,
    key: &str,
) -> Result<Option<&'a Map<String, Value>>, PluginError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(o)) => Ok(Some(o)),
        Some(_) => Err(invalid(key, "expected an object")),
    }
}

/// Parses the `linkerd` section, dropping malformed list entries (returned, for the log);
/// on failure, finds the key at fault so the message names it.
fn linkerd_section(
    section: &Map<String, Value>,
) -> Result<(LinkerdConfig, Vec<String>), PluginError> {
    let mut section = section.clone();
    let dropped = linkerd_cni_proto::config::drop_malformed_entries(&mut section);
    let whole = LinkerdConfig::deserialize(&Value::Object(section.clone()));
    let err = match whole {
        Ok(cfg) => return validate_linkerd(cfg).map(|cfg| (cfg, dropped)),
        Err(e) => e,
    };
    for (key, value) in &section {
        let alone = Value::Object(Map::from_iter([(key.clone(), value.clone())]));
        if let Err(e) = LinkerdConfig::deserialize(&alone) {
            return Err(invalid(format!("linkerd.{key}"), e.to_string()));
        }
    }
    Err(invalid("linkerd", err.to_string()))
}

fn validate_linkerd(cfg: LinkerdConfig) -> Result<LinkerdConfig, PluginError> {
    if let Err(e) = cfg.check_list_lengths() {
        return Err(invalid(format!("linkerd.{}", e.key), e.to_string()));
    }
    if cfg.agent_socket.is_empty() {
        return Err(invalid("linkerd.agent-socket", "must not be empty"));
    }
    if cfg.agent_timeout_ms == 0 {
        return Err(invalid(
            "linkerd.agent-timeout-ms",
            "must be greater than 0",
        ));
    }
    Ok(cfg)
}

fn attachments(
    obj: &Map<String, Value>,
    key: &str,
) -> Result<Option<Vec<AttachmentRef>>, PluginError> {
    let Some(value) = obj.get(key) else {
        return Ok(None);
    };
    let items = match value {
        Value::Null => return Ok(Some(Vec::new())),
        Value::Array(items) => items,
        _ => return Err(invalid(key, "expected an array")),
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let field = |k: &str| format!("{key}[{i}].{k}");
            let get = |k: &str| {
                item.get(k)
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
            };
            let container_id = get("containerID")
                .ok_or_else(|| invalid(field("containerID"), "missing or not a string"))?;
            let ifname =
                get("ifname").ok_or_else(|| invalid(field("ifname"), "missing or not a string"))?;
            Ok(AttachmentRef {
                container_id: container_id.into(),
                ifname: ifname.into(),
                netns: String::new(),
            })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

impl NetConf {
    /// Decodes and validates a network config.
    pub fn parse(bytes: &[u8]) -> Result<Self, PluginError> {
        let value: Value =
            serde_json::from_slice(bytes).map_err(|source| PluginError::Decode { source })?;
        let Value::Object(obj) = value else {
            return Err(invalid("(top level)", "expected a JSON object"));
        };
        let version: String = opt(&obj, "cniVersion", "cniVersion")?
            .ok_or_else(|| invalid("cniVersion", "missing"))?;
        let cni_version =
            SpecVersion::parse(&version).ok_or_else(|| PluginError::UnsupportedVersion {
                version: version.clone(),
                supported: SpecVersion::supported_list(),
            })?;
        let kubeconfig = match object(&obj, "kubernetes")? {
            Some(k) => opt(k, "kubeconfig", "kubernetes.kubeconfig")?,
            None => None,
        };
        let (linkerd, dropped_entries) = match object(&obj, "linkerd")? {
            Some(section) => linkerd_section(section)?,
            None => (LinkerdConfig::default(), Vec::new()),
        };
        let cgroup_path = match object(&obj, "runtimeConfig")? {
            Some(rc) => opt(rc, "cgroupPath", "runtimeConfig.cgroupPath")?,
            None => None,
        };
        let valid_attachments = match attachments(&obj, "cni.dev/valid-attachments")? {
            Some(a) => Some(a),
            None => attachments(&obj, "cni.dev/attachments")?,
        };
        Ok(Self {
            cni_version,
            name: opt(&obj, "name", "name")?,
            log_level: opt(&obj, "log_level", "log_level")?,
            kubeconfig,
            linkerd,
            dropped_entries,
            prev_result: obj.get("prevResult").filter(|v| !v.is_null()).cloned(),
            cgroup_path,
            valid_attachments,
        })
    }
}

#[cfg(test)]
mod tests {
    use linkerd_cni_proto::config::PortRange;
    use serde_json::json;

    use super::*;
    use crate::error::cni_code;

    #[test]
    fn full_linkerd_config_with_every_contract_key() {
        let conf = json!({
            "cniVersion": "0.3.1",
            "name": "k8s-pod-network",
            "type": "linkerd-cni",
            "log_level": "debug",
            "kubernetes": {"kubeconfig": "/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig"},
            "linkerd": {
                "incoming-proxy-port": 4143, "outgoing-proxy-port": 4140, "proxy-uid": 2102,
                "proxy-gid": 2103, "ports-to-redirect": [80, 443],
                "inbound-ports-to-ignore": ["4191", "4190"], "outbound-ports-to-ignore": ["25", "9000-9100"],
                "subnets-to-ignore": ["10.0.0.0/8"], "simulate": false, "use-wait-flag": true,
                "iptables-mode": "nft", "ipv6": true, "agent-socket": "/tmp/a.sock", "agent-timeout-ms": 500
            },
            "runtimeConfig": {"cgroupPath": "/kubepods/pod1", "portMappings": []},
            "prevResult": {"cniVersion": "0.3.1"},
            "args": {"cni": {}}
        });
        let nc = NetConf::parse(conf.to_string().as_bytes()).expect("parses");
        assert_eq!(nc.cni_version, SpecVersion::V0_3_1);
        assert_eq!(nc.name.as_deref(), Some("k8s-pod-network"));
        assert_eq!(nc.log_level.as_deref(), Some("debug"));
        assert_eq!(
            nc.kubeconfig.as_deref(),
            Some("/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig")
        );
        assert_eq!(nc.linkerd.proxy_gid(), Some(2103));
        assert_eq!(nc.linkerd.ports_to_redirect.len(), 2);
        assert_eq!(nc.linkerd.agent_socket, "/tmp/a.sock");
        assert_eq!(nc.linkerd.agent_timeout_ms, 500);
        assert!(nc.linkerd.ipv6 && nc.linkerd.use_wait_flag);
        assert_eq!(nc.cgroup_path.as_deref(), Some("/kubepods/pod1"));
        assert_eq!(nc.prev_result, Some(json!({"cniVersion": "0.3.1"})));
        assert_eq!(nc.valid_attachments, None);
    }

    #[test]
    fn minimal_config_gets_linkerd_defaults() {
        let nc = NetConf::parse(br#"{"cniVersion":"1.0.0","name":"n","type":"linkerd-cni"}"#)
            .expect("parses");
        assert_eq!(nc.linkerd, LinkerdConfig::default());
        assert_eq!(nc.prev_result, None);
    }

    #[test]
    fn gc_attachments_new_and_old_keys() {
        let att = |c: &str| AttachmentRef {
            container_id: c.into(),
            ifname: "eth0".into(),
            netns: String::new(),
        };
        for (key, other) in [
            ("cni.dev/valid-attachments", None),
            ("cni.dev/attachments", None),
            ("cni.dev/valid-attachments", Some("cni.dev/attachments")),
        ] {
            let mut conf = json!({"cniVersion": "1.1.0", key: [{"containerID": "a", "ifname": "eth0"}, {"containerID": "b", "ifname": "eth0"}]});
            if let Some(other) = other {
                conf[other] = json!([{"containerID": "old", "ifname": "eth0"}]);
            }
            let nc = NetConf::parse(conf.to_string().as_bytes()).expect("parses");
            assert_eq!(
                nc.valid_attachments,
                Some(vec![att("a"), att("b")]),
                "{conf}"
            );
        }
        let nc = NetConf::parse(br#"{"cniVersion":"1.1.0","cni.dev/valid-attachments":null}"#)
            .expect("parses");
        assert_eq!(nc.valid_attachments, Some(vec![]));
    }

    #[test]
    fn bad_configs_get_the_right_code_and_name_the_key() {
        let table: &[(&str, u32, &str)] = &[
            ("{", 6, "decode"),
            ("", 6, "decode"),
            ("not json", 6, "decode"),
            ("[]", 7, "top level"),
            (r#"{"name":"x"}"#, 7, "cniVersion"),
            (r#"{"cniVersion":1}"#, 7, "cniVersion"),
            (r#"{"cniVersion":"0.2.0"}"#, 1, "0.2.0"),
            (r#"{"cniVersion":"9.9.9"}"#, 1, "9.9.9"),
            (r#"{"cniVersion":"1.0.0","linkerd":"x"}"#, 7, "linkerd"),
            (
                r#"{"cniVersion":"1.0.0","linkerd":{"proxy-uid":"x"}}"#,
                7,
                "linkerd.proxy-uid",
            ),
            (
                r#"{"cniVersion":"1.0.0","linkerd":{"simulate":"yes","ipv6":false}}"#,
                7,
                "linkerd.simulate",
            ),
            (
                r#"{"cniVersion":"1.0.0","linkerd":{"inbound-ports-to-ignore":"4190"}}"#,
                7,
                "linkerd.inbound-ports-to-ignore",
            ),
            (
                r#"{"cniVersion":"1.0.0","linkerd":{"subnets-to-ignore":"nope"}}"#,
                7,
                "linkerd.subnets-to-ignore",
            ),
            (
                r#"{"cniVersion":"1.0.0","linkerd":{"agent-timeout-ms":0}}"#,
                7,
                "linkerd.agent-timeout-ms",
            ),
            (
                r#"{"cniVersion":"1.0.0","linkerd":{"agent-socket":""}}"#,
                7,
                "linkerd.agent-socket",
            ),
            (r#"{"cniVersion":"1.0.0","log_level":3}"#, 7, "log_level"),
            (
                r#"{"cniVersion":"1.0.0","kubernetes":{"kubeconfig":1}}"#,
                7,
                "kubernetes.kubeconfig",
            ),
            (
                r#"{"cniVersion":"1.0.0","runtimeConfig":{"cgroupPath":[]}}"#,
                7,
                "runtimeConfig.cgroupPath",
            ),
            (
                r#"{"cniVersion":"1.0.0","runtimeConfig":5}"#,
                7,
                "runtimeConfig",
            ),
            (
                r#"{"cniVersion":"1.1.0","cni.dev/valid-attachments":[{"ifname":"eth0"}]}"#,
                7,
                "containerID",
            ),
            (
                r#"{"cniVersion":"1.1.0","cni.dev/attachments":"x"}"#,
                7,
                "cni.dev/attachments",
            ),
        ];
        for (input, code, needle) in table {
            let err = NetConf::parse(input.as_bytes()).expect_err(input);
            assert_eq!(cni_code(&err), *code, "{input}: {err}");
            assert!(
                err.to_string().contains(needle),
                "{input}: {err:?} should mention {needle}"
            );
        }
    }

    #[test]
    fn malformed_list_entries_are_dropped_not_fatal() {
        let nc = NetConf::parse(
            br#"{"cniVersion":"1.0.0","linkerd":{"inbound-ports-to-ignore":["4191","0","http","4190"],
                "subnets-to-ignore":["nope","10.0.0.0/8"],"outbound-ports-to-ignore":["9100-9000","25"]}}"#,
        )
        .expect("one bad entry does not fail the config");
        assert_eq!(
            nc.linkerd.inbound_ports_to_ignore,
            vec![PortRange::single(4191), PortRange::single(4190)]
        );
        assert_eq!(
            nc.linkerd.outbound_ports_to_ignore,
            vec![PortRange::single(25)]
        );
        assert_eq!(nc.linkerd.subnets_to_ignore.len(), 1);
        assert_eq!(nc.dropped_entries.len(), 4, "{:#?}", nc.dropped_entries);
        assert!(
            nc.dropped_entries
                .iter()
                .any(|d| d.contains("linkerd.inbound-ports-to-ignore") && d.contains("\"http\""))
        );
    }

    /// Issue 28: a list of the `linkerd` section over 1,024 entries (a 1 MiB conflist holds
    /// 130,000) is refused, naming the key, as an annotation's list is; such a list is not
    /// walked entry by entry for malformed ones either.
    #[test]
    fn lists_over_the_entry_limit_are_refused_naming_the_key() {
        let at = vec!["1-65535"; 1024];
        let over = vec!["1-65535"; 1025];
        let conf = |list: &[&str]| {
            serde_json::json!({"cniVersion": "1.0.0", "linkerd": {"inbound-ports-to-ignore": list}})
                .to_string()
        };
        let nc = NetConf::parse(conf(&at).as_bytes()).expect("1,024 entries");
        assert_eq!(nc.linkerd.inbound_ports_to_ignore.len(), 1024);
        let err = NetConf::parse(conf(&over).as_bytes()).expect_err("1,025 entries");
        assert_eq!(cni_code(&err), 7, "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains("linkerd.inbound-ports-to-ignore") && msg.contains("1025 entries"),
            "{msg}"
        );
        let malformed = vec!["http"; 1025];
        let err = NetConf::parse(conf(&malformed).as_bytes()).expect_err("1,025 bad entries");
        assert!(
            err.to_string().contains("linkerd.inbound-ports-to-ignore"),
            "{err}"
        );
    }

    #[test]
    fn stdin_size_limit() {
        let ok = vec![b' '; MAX_CONFIG_BYTES];
        assert_eq!(
            read_limited(&mut &ok[..]).expect("at the limit").len(),
            MAX_CONFIG_BYTES
        );
        let big = vec![b' '; MAX_CONFIG_BYTES + 1];
        let err = read_limited(&mut &big[..]).expect_err("over the limit");
        assert_eq!(cni_code(&err), 6, "{err}");
    }

    #[test]
    fn peek_only_supported_versions() {
        assert_eq!(
            peek_version(br#"{"cniVersion":"0.4.0","x":1}"#),
            Some(SpecVersion::V0_4_0)
        );
        assert_eq!(peek_version(br#"{"cniVersion":"0.2.0"}"#), None);
        assert_eq!(peek_version(b"{"), None);
    }
}
