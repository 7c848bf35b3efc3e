//! The control plane's values, as stored in ConfigMap `linkerd-config` (key `values`): the
//! subset the injector needs (`cniEnabled`, the proxy, proxy-init and network validator
//! settings), laid out exactly as Linkerd's Helm chart lays them out so that a `linkerd-config`
//! written by Linkerd itself parses too. Unknown keys are ignored; missing keys take Linkerd's
//! defaults.

use linkerd_cni_proto::config::{DEFAULT_INBOUND_PORT, DEFAULT_OUTBOUND_PORT};
use serde::{Deserialize, Deserializer, Serialize};

/// Linkerd version used for images when neither the values nor a flag name one.
pub const DEFAULT_LINKERD_VERSION: &str = "edge-25.11.1";
/// Default proxy image (also carries the network validator binary).
pub const DEFAULT_PROXY_IMAGE: &str = "cr.l5d.io/linkerd/proxy";
/// Default proxy-init image.
pub const DEFAULT_PROXY_INIT_IMAGE: &str = "cr.l5d.io/linkerd/proxy-init";
/// Default proxy-init image version.
pub const DEFAULT_PROXY_INIT_VERSION: &str = "v2.4.3";

/// Why the values could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ValuesError {
    /// The YAML does not parse, or a key has the wrong type.
    #[error("invalid linkerd-config values: {0}")]
    Yaml(#[from] serde_yaml_ng::Error),
    /// The ConfigMap has no `values` key.
    #[error("ConfigMap {namespace}/{name} has no {key:?} key")]
    MissingKey {
        /// Namespace of the ConfigMap.
        namespace: String,
        /// Name of the ConfigMap.
        name: String,
        /// The missing key.
        key: String,
    },
    /// The ConfigMap does not exist.
    #[error(
        "ConfigMap {namespace}/{name} not found: is the control plane installed (linkerd install)?"
    )]
    NotFound {
        /// Namespace of the ConfigMap.
        namespace: String,
        /// Name of the ConfigMap.
        name: String,
    },
    /// The API request failed.
    #[error("reading ConfigMap {namespace}/{name}: {source}")]
    Api {
        /// Namespace of the ConfigMap.
        namespace: String,
        /// Name of the ConfigMap.
        name: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
}

/// The control plane values the injector uses (Helm layout, camelCase keys).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Values {
    /// The CNI plugin does the redirection: no `linkerd-init`, add the network validator.
    pub cni_enabled: bool,
    /// Default version of every image.
    #[serde(deserialize_with = "lenient_string")]
    pub linkerd_version: String,
    /// The cluster's DNS domain.
    pub cluster_domain: String,
    /// Identity trust domain (empty: the cluster domain).
    pub identity_trust_domain: String,
    /// PEM trust anchors handed to every proxy.
    pub identity_trust_anchors_pem: String,
    /// Networks for which the proxy does service discovery.
    pub cluster_networks: String,
    /// Default image pull policy.
    pub image_pull_policy: String,
    /// Proxy settings.
    pub proxy: ProxyValues,
    /// `linkerd-init` settings.
    pub proxy_init: ProxyInitValues,
    /// `linkerd-network-validator` settings.
    pub network_validator: NetworkValidatorValues,
}

impl Default for Values {
    fn default() -> Self {
        Self {
            cni_enabled: false,
            linkerd_version: DEFAULT_LINKERD_VERSION.into(),
            cluster_domain: "cluster.local".into(),
            identity_trust_domain: String::new(),
            identity_trust_anchors_pem: String::new(),
            cluster_networks: "10.0.0.0/8,100.64.0.0/10,172.16.0.0/12,192.168.0.0/16,fd00::/8"
                .into(),
            image_pull_policy: "IfNotPresent".into(),
            proxy: ProxyValues::default(),
            proxy_init: ProxyInitValues::default(),
            network_validator: NetworkValidatorValues::default(),
        }
    }
}

/// A container image.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Image {
    /// Repository.
    pub name: String,
    /// Tag (empty: `linkerdVersion`).
    #[serde(deserialize_with = "lenient_string")]
    pub version: String,
    /// Pull policy (empty: the global `imagePullPolicy`).
    pub pull_policy: String,
}

/// The proxy's four ports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Ports {
    /// Admin (metrics, probes).
    pub admin: u16,
    /// Control (tap).
    pub control: u16,
    /// Inbound listener.
    pub inbound: u16,
    /// Outbound listener (bound on 127.0.0.1).
    pub outbound: u16,
}

impl Default for Ports {
    fn default() -> Self {
        Self {
            admin: 4191,
            control: 4190,
            inbound: DEFAULT_INBOUND_PORT,
            outbound: DEFAULT_OUTBOUND_PORT,
        }
    }
}

/// `proxy.*` values.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ProxyValues {
    /// Proxy image.
    pub image: Image,
    /// `LINKERD2_PROXY_LOG`.
    pub log_level: String,
    /// `LINKERD2_PROXY_LOG_FORMAT`.
    pub log_format: String,
    /// Listener ports.
    pub ports: Ports,
    /// UID the proxy runs as; its sockets are never redirected.
    pub uid: i64,
    /// GID the proxy runs as (negative: unset).
    pub gid: i64,
    /// Hold the application's containers until the proxy is ready.
    #[serde(rename = "await")]
    pub await_ready: bool,
    /// Inbound policy when no Server selects a pod.
    pub default_inbound_policy: String,
    /// Ports whose protocol is never detected (opaque).
    #[serde(deserialize_with = "lenient_string")]
    pub opaque_ports: String,
}

impl Default for ProxyValues {
    fn default() -> Self {
        Self {
            image: Image {
                name: DEFAULT_PROXY_IMAGE.into(),
                ..Image::default()
            },
            log_level: "warn,linkerd=info,hickory=error".into(),
            log_format: "plain".into(),
            ports: Ports::default(),
            uid: i64::from(linkerd_cni_k8s::names::DEFAULT_PROXY_UID),
            gid: -1,
            await_ready: true,
            default_inbound_policy: "all-unauthenticated".into(),
            opaque_ports: "25,587,3306,4444,5432,6379,9300,11211".into(),
        }
    }
}

/// `proxyInit.*` values.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ProxyInitValues {
    /// proxy-init image.
    pub image: Image,
    /// `legacy` or `nft`.
    pub iptables_mode: String,
    /// Inbound ports never redirected, besides the proxy's control and admin ports.
    #[serde(deserialize_with = "lenient_string")]
    pub ignore_inbound_ports: String,
    /// Outbound ports never redirected.
    #[serde(deserialize_with = "lenient_string")]
    pub ignore_outbound_ports: String,
    /// Subnets whose inbound traffic is never redirected.
    pub skip_subnets: String,
    /// proxy-init log level (empty: its default).
    pub log_level: String,
    /// proxy-init log format (empty: its default).
    pub log_format: String,
    /// Run proxy-init as root.
    pub run_as_root: bool,
    /// UID proxy-init runs as when not root.
    pub run_as_user: i64,
    /// Where the xtables lock volume is mounted.
    pub xt_mount_path: XtMountPath,
}

impl Default for ProxyInitValues {
    fn default() -> Self {
        Self {
            image: Image {
                name: DEFAULT_PROXY_INIT_IMAGE.into(),
                version: DEFAULT_PROXY_INIT_VERSION.into(),
                ..Image::default()
            },
            iptables_mode: "legacy".into(),
            ignore_inbound_ports: "4567,4568".into(),
            ignore_outbound_ports: "4567,4568".into(),
            skip_subnets: String::new(),
            log_level: String::new(),
            log_format: String::new(),
            run_as_root: false,
            run_as_user: 65534,
            xt_mount_path: XtMountPath::default(),
        }
    }
}

/// `proxyInit.xtMountPath`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct XtMountPath {
    /// Mount point inside `linkerd-init`.
    pub mount_path: String,
    /// Volume name.
    pub name: String,
}

impl Default for XtMountPath {
    fn default() -> Self {
        Self {
            mount_path: crate::paths::PROXY_INIT_XTABLES_LOCK_DIR.into(),
            name: linkerd_cni_k8s::names::XTABLES_LOCK_VOLUME.into(),
        }
    }
}

/// `networkValidator.*` values.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct NetworkValidatorValues {
    /// Validator log level.
    pub log_level: String,
    /// Validator log format.
    pub log_format: String,
    /// Unroutable address the validator connects to (empty: `1.1.1.1:20001`).
    pub connect_addr: String,
    /// Where it listens, standing in for the proxy (empty: `0.0.0.0:<outbound port>`).
    pub listen_addr: String,
    /// How long it waits for its own connection.
    pub timeout: String,
}

impl Default for NetworkValidatorValues {
    fn default() -> Self {
        Self {
            log_level: "debug".into(),
            log_format: "plain".into(),
            connect_addr: String::new(),
            listen_addr: String::new(),
            timeout: "10s".into(),
        }
    }
}

impl Values {
    /// Parses the YAML of `linkerd-config`'s `values` key.
    pub fn from_yaml(yaml: &str) -> Result<Self, ValuesError> {
        if yaml.trim().is_empty() {
            return Ok(Self::default());
        }
        Ok(serde_yaml_ng::from_str(yaml)?)
    }

    /// Serialises as the YAML stored under `linkerd-config`'s `values` key.
    pub fn to_yaml(&self) -> Result<String, ValuesError> {
        Ok(serde_yaml_ng::to_string(self)?)
    }

    /// Reads and parses `linkerd-config` from the API (one GET per call: never cached).
    pub async fn fetch(client: &kube::Client, namespace: &str) -> Result<Self, ValuesError> {
        use k8s_openapi::api::core::v1::ConfigMap;
        let name = linkerd_cni_k8s::names::CONFIG_MAP;
        let api: kube::Api<ConfigMap> = kube::Api::namespaced(client.clone(), namespace);
        let cm = api
            .get_opt(name)
            .await
            .map_err(|source| ValuesError::Api {
                namespace: namespace.into(),
                name: name.into(),
                source,
            })?
            .ok_or_else(|| ValuesError::NotFound {
                namespace: namespace.into(),
                name: name.into(),
            })?;
        let yaml = cm
            .data
            .as_ref()
            .and_then(|d| d.get(linkerd_cni_k8s::names::CONFIG_VALUES_KEY))
            .ok_or_else(|| ValuesError::MissingKey {
                namespace: namespace.into(),
                name: name.into(),
                key: linkerd_cni_k8s::names::CONFIG_VALUES_KEY.into(),
            })?;
        Self::from_yaml(yaml)
    }

    /// The proxy image's tag.
    pub fn proxy_version(&self) -> &str {
        non_empty(&self.proxy.image.version).unwrap_or(&self.linkerd_version)
    }

    /// The identity trust domain (the cluster domain unless set).
    pub fn trust_domain(&self) -> &str {
        non_empty(&self.identity_trust_domain).unwrap_or(&self.cluster_domain)
    }

    /// Pull policy of an image (its own, else the global one).
    pub fn pull_policy<'a>(&'a self, image: &'a Image) -> &'a str {
        non_empty(&image.pull_policy).unwrap_or(&self.image_pull_policy)
    }

    /// The network validator's `--connect-addr`.
    pub fn validator_connect_addr(&self) -> &str {
        non_empty(&self.network_validator.connect_addr).unwrap_or("1.1.1.1:20001")
    }

    /// The network validator's `--listen-addr`.
    pub fn validator_listen_addr(&self) -> String {
        match non_empty(&self.network_validator.listen_addr) {
            Some(addr) => addr.to_string(),
            None => format!("0.0.0.0:{}", self.proxy.ports.outbound),
        }
    }
}

/// `Some(s)` unless `s` is empty.
pub(crate) fn non_empty(s: &str) -> Option<&str> {
    if s.trim().is_empty() { None } else { Some(s) }
}

/// Accepts a string, a number or null where Helm users write either (`ignoreInboundPorts: 4567`).
fn lenient_string<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Lenient {
        S(String),
        I(i64),
        F(f64),
        B(bool),
    }
    Ok(match Option::<Lenient>::deserialize(d)? {
        None => String::new(),
        Some(Lenient::S(s)) => s,
        Some(Lenient::I(i)) => i.to_string(),
        Some(Lenient::F(f)) => f.to_string(),
        Some(Lenient::B(b)) => b.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_linkerd_layout_and_keeps_defaults_for_missing_keys() {
        let cases: &[(&str, bool, u16, &str, &str)] = &[
            // yaml, cniEnabled, inbound port, ignoreInboundPorts, proxy version
            ("", false, 4143, "4567,4568", DEFAULT_LINKERD_VERSION),
            (
                "cniEnabled: true\n",
                true,
                4143,
                "4567,4568",
                DEFAULT_LINKERD_VERSION,
            ),
            (
                "cniEnabled: false\nlinkerdVersion: stable-2.14.10\nproxy:\n  ports:\n    inbound: 5143\nproxyInit:\n  ignoreInboundPorts: 4567\nunknownKey: {a: 1}\n",
                false,
                5143,
                "4567",
                "stable-2.14.10",
            ),
            (
                "proxy:\n  image:\n    version: v9\n",
                false,
                4143,
                "4567,4568",
                "v9",
            ),
        ];
        for (yaml, cni, inbound, ignore, version) in cases {
            let v = Values::from_yaml(yaml).unwrap_or_else(|e| panic!("{yaml:?}: {e}"));
            assert_eq!(v.cni_enabled, *cni, "{yaml:?}");
            assert_eq!(v.proxy.ports.inbound, *inbound, "{yaml:?}");
            assert_eq!(v.proxy.ports.outbound, 4140, "{yaml:?}");
            assert_eq!(v.proxy.uid, 2102, "{yaml:?}");
            assert_eq!(v.proxy_init.ignore_inbound_ports, *ignore, "{yaml:?}");
            assert_eq!(v.proxy_version(), *version, "{yaml:?}");
        }
    }

    #[test]
    fn yaml_round_trips() {
        let mut v = Values {
            cni_enabled: true,
            ..Values::default()
        };
        v.proxy.log_level = "debug".into();
        let yaml = v.to_yaml().expect("serialise");
        assert!(yaml.contains("cniEnabled: true"), "{yaml}");
        assert_eq!(Values::from_yaml(&yaml).expect("parse"), v);
    }

    #[test]
    fn rejects_wrong_types() {
        let err = Values::from_yaml("cniEnabled: [1]\n").expect_err("a list is not a bool");
        assert!(err.to_string().contains("cniEnabled"), "{err}");
    }
}
