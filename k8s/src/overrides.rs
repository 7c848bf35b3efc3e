//! The pod overrides: every `config.linkerd.io/*` annotation this project honours, in one table
//! ([`POD_OVERRIDES`]). Each row says which conflist key of the `linkerd` section the
//! annotation stands for (if any), which [`LinkerdConfig`] field it sets, whether it replaces
//! that value or is appended to it, and its parser. The agent's decision
//! ([`crate::decision::decide`]), the data plane's per-pod limits (which name an annotation
//! with its conflist key) and the proxy injector all read this table, and
//! `docs/operating/annotations.md` shows it (held to it by `k8s/tests/annotations_doc.rs`).
//!
//! Where a value is read (Linkerd's rule, [`override_value`]): the pod's annotation when it is
//! set and not blank, else its namespace's, else none. Rows without a conflist key are read by
//! the proxy injector only (the proxy container's image, version and log level).
//!
//! The annotation and label keys that are not overrides but are honoured all the same
//! (`linkerd.io/inject`, the webhook opt-out label, the control-plane label) are
//! [`OTHER_KEYS`], so the page lists every key a user may set and nothing else.

use std::fmt;

use linkerd_cni_proto::config::{Cidr, LinkerdConfig, PortRange, parse_cidr_list, parse_port_list};

use crate::names::{
    ADMISSION_WEBHOOKS_LABEL, CONTROL_PLANE_COMPONENT_LABEL, INJECT_ANNOTATION,
    PROXY_GID_ANNOTATION, PROXY_IMAGE_ANNOTATION, PROXY_LOG_LEVEL_ANNOTATION, PROXY_UID_ANNOTATION,
    PROXY_VERSION_OVERRIDE_ANNOTATION, SKIP_INBOUND_PORTS_ANNOTATION,
    SKIP_OUTBOUND_PORTS_ANNOTATION, SKIP_SUBNETS_ANNOTATION,
};

/// How an override meets the value it overrides (the conflist's, or for the injector's own
/// rows the control plane's values).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Merge {
    /// The annotation's value is used instead.
    Replace,
    /// The annotation's entries are added after the configured ones.
    Append,
}

impl Merge {
    /// The word the page uses.
    pub fn word(self) -> &'static str {
        match self {
            Self::Replace => "replaces",
            Self::Append => "appended",
        }
    }

    fn into_list<T>(self, list: &mut Vec<T>, entries: Vec<T>) {
        match self {
            Self::Replace => *list = entries,
            Self::Append => list.extend(entries),
        }
    }
}

/// How an annotation's text is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Parser {
    /// A comma list of ports and `LOW-HIGH` ranges, bounded in bytes and entries
    /// ([`linkerd_cni_proto::config::parse_port_list`]).
    PortList,
    /// A comma list of CIDRs, bounded alike ([`linkerd_cni_proto::config::parse_cidr_list`]).
    CidrList,
    /// A UID, 0 to 4294967295; 0 means no UID exemption, as in the conflist. A negative value
    /// is refused: it would silently drop the exemption and loop the proxy's own traffic back
    /// to it.
    Uid,
    /// A GID up to 4294967295; negative means no GID exemption, as in the conflist.
    Gid,
    /// Text, used as written (trimmed).
    Text,
}

/// An annotation's value as its [`Parser`] read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Parsed {
    /// From [`Parser::PortList`].
    Ports(Vec<PortRange>),
    /// From [`Parser::CidrList`].
    Cidrs(Vec<Cidr>),
    /// From [`Parser::Uid`] or [`Parser::Gid`].
    Id(i64),
    /// From [`Parser::Text`].
    Text(String),
}

impl fmt::Display for Parsed {
    /// Lists comma-joined (as an annotation writes them), IDs and text as they are.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn join<T: fmt::Display>(f: &mut fmt::Formatter<'_>, items: &[T]) -> fmt::Result {
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    f.write_str(",")?;
                }
                write!(f, "{item}")?;
            }
            Ok(())
        }
        match self {
            Self::Ports(p) => join(f, p),
            Self::Cidrs(c) => join(f, c),
            Self::Id(id) => write!(f, "{id}"),
            Self::Text(t) => f.write_str(t),
        }
    }
}

impl Parser {
    /// Reads `value`; the error says what was expected.
    pub fn parse(self, value: &str) -> Result<Parsed, String> {
        // The list parsers trim each entry and measure the whole text.
        let trimmed = value.trim();
        match self {
            Self::PortList => parse_port_list(value)
                .map(Parsed::Ports)
                .map_err(|e| e.to_string()),
            Self::CidrList => parse_cidr_list(value)
                .map(Parsed::Cidrs)
                .map_err(|e| e.to_string()),
            Self::Uid => trimmed
                .parse::<u32>()
                .map(|id| Parsed::Id(i64::from(id)))
                .map_err(|_| "expected an integer 0-4294967295".to_string()),
            Self::Gid => trimmed
                .parse::<i64>()
                .ok()
                .filter(|g| *g <= i64::from(u32::MAX))
                .map(Parsed::Id)
                .ok_or_else(|| "expected an integer <= 4294967295 (negative: none)".to_string()),
            Self::Text => Ok(Parsed::Text(trimmed.to_string())),
        }
    }

    /// The format, as the page states it.
    pub fn format(self) -> &'static str {
        match self {
            Self::PortList => {
                "comma list of ports and ranges (`8080,9000-9100`): at most 16 KiB and 1,024 entries"
            }
            Self::CidrList => {
                "comma list of CIDRs (`10.0.0.0/8,fd00::/8`): at most 16 KiB and 1,024 entries"
            }
            Self::Uid => "integer 0-4294967295 (`0`: no UID exemption)",
            Self::Gid => "integer up to 4294967295 (negative: no GID exemption)",
            Self::Text => "text, used as written",
        }
    }

    /// What becomes of a pod whose value this parser refuses, as the page states it.
    pub fn when_invalid(self) -> &'static str {
        match self {
            Self::Text => "never invalid: the proxy container gets it as written",
            Self::PortList | Self::CidrList | Self::Uid | Self::Gid => {
                "the injector denies the pod; a pod already created is not started: its ADD \
                 fails (CNI code 7) naming the annotation and the object carrying it"
            }
        }
    }
}

/// What an override sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    /// [`LinkerdConfig::inbound_ports_to_ignore`].
    InboundPortsToIgnore,
    /// [`LinkerdConfig::outbound_ports_to_ignore`].
    OutboundPortsToIgnore,
    /// [`LinkerdConfig::subnets_to_ignore`].
    SubnetsToIgnore,
    /// [`LinkerdConfig::proxy_uid`].
    ProxyUid,
    /// [`LinkerdConfig::proxy_gid`].
    ProxyGid,
    /// The proxy container's image name (injector only).
    ProxyImage,
    /// The proxy container's image tag (injector only).
    ProxyVersion,
    /// The proxy's `LINKERD2_PROXY_LOG` (injector only).
    ProxyLogLevel,
}

impl Field {
    /// The [`LinkerdConfig`] field it sets, `None` for what only the injector reads.
    pub fn config_field(self) -> Option<&'static str> {
        match self {
            Self::InboundPortsToIgnore => Some("inbound_ports_to_ignore"),
            Self::OutboundPortsToIgnore => Some("outbound_ports_to_ignore"),
            Self::SubnetsToIgnore => Some("subnets_to_ignore"),
            Self::ProxyUid => Some("proxy_uid"),
            Self::ProxyGid => Some("proxy_gid"),
            Self::ProxyImage | Self::ProxyVersion | Self::ProxyLogLevel => None,
        }
    }
}

/// One pod override: a row of [`POD_OVERRIDES`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodOverride {
    /// The annotation, on the pod or its namespace.
    pub annotation: &'static str,
    /// The key of the conflist's `linkerd` section it stands for (`None`: injector only).
    pub conflist_key: Option<&'static str>,
    /// The control plane's value (`linkerd-config`) the injector uses when the annotation is
    /// not set.
    pub helm_value: &'static str,
    /// What it sets.
    pub field: Field,
    /// Whether it replaces the conflist's value or is appended to it (for injector-only rows:
    /// the control plane's value).
    pub merge: Merge,
    /// How its text is read.
    pub parser: Parser,
    /// What it does, as the page says it.
    pub meaning: &'static str,
}

/// Every `config.linkerd.io/*` override, in the order the decision applies them (and its
/// reason lists them).
pub const POD_OVERRIDES: [PodOverride; 8] = [
    PodOverride {
        annotation: SKIP_OUTBOUND_PORTS_ANNOTATION,
        conflist_key: Some("outbound-ports-to-ignore"),
        helm_value: "proxyInit.ignoreOutboundPorts",
        field: Field::OutboundPortsToIgnore,
        merge: Merge::Replace,
        parser: Parser::PortList,
        meaning: "outbound destination ports whose connections go straight out, not to the proxy",
    },
    PodOverride {
        annotation: SKIP_INBOUND_PORTS_ANNOTATION,
        conflist_key: Some("inbound-ports-to-ignore"),
        helm_value: "proxyInit.ignoreInboundPorts",
        field: Field::InboundPortsToIgnore,
        merge: Merge::Append,
        parser: Parser::PortList,
        meaning: "inbound destination ports not redirected to the proxy (the conflist's, by \
                  default the proxy's admin and control ports 4191 and 4190, stay); the \
                  injector puts it in place of `proxyInit.ignoreInboundPorts` after those two \
                  ports, as Linkerd's does",
    },
    PodOverride {
        annotation: SKIP_SUBNETS_ANNOTATION,
        conflist_key: Some("subnets-to-ignore"),
        helm_value: "proxyInit.skipSubnets",
        field: Field::SubnetsToIgnore,
        merge: Merge::Replace,
        parser: Parser::CidrList,
        meaning: "sources whose inbound connections are not redirected (as in Linkerd, the \
                  source of inbound traffic only)",
    },
    PodOverride {
        annotation: PROXY_UID_ANNOTATION,
        conflist_key: Some("proxy-uid"),
        helm_value: "proxy.uid",
        field: Field::ProxyUid,
        merge: Merge::Replace,
        parser: Parser::Uid,
        meaning: "the UID the proxy runs as: its sockets are never redirected",
    },
    PodOverride {
        annotation: PROXY_GID_ANNOTATION,
        conflist_key: Some("proxy-gid"),
        helm_value: "proxy.gid",
        field: Field::ProxyGid,
        merge: Merge::Replace,
        parser: Parser::Gid,
        meaning: "the GID the proxy runs as: its sockets are never redirected",
    },
    PodOverride {
        annotation: PROXY_IMAGE_ANNOTATION,
        conflist_key: None,
        helm_value: "proxy.image.name",
        field: Field::ProxyImage,
        merge: Merge::Replace,
        parser: Parser::Text,
        meaning: "the injected proxy's image name",
    },
    PodOverride {
        annotation: PROXY_VERSION_OVERRIDE_ANNOTATION,
        conflist_key: None,
        helm_value: "proxy.image.version",
        field: Field::ProxyVersion,
        merge: Merge::Replace,
        parser: Parser::Text,
        meaning: "the injected proxy's image tag",
    },
    PodOverride {
        annotation: PROXY_LOG_LEVEL_ANNOTATION,
        conflist_key: None,
        helm_value: "proxy.logLevel",
        field: Field::ProxyLogLevel,
        merge: Merge::Replace,
        parser: Parser::Text,
        meaning: "the injected proxy's log filter (`LINKERD2_PROXY_LOG`)",
    },
];

/// Why an override's value could not be applied to a [`LinkerdConfig`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ApplyError {
    /// The parser refused the value.
    #[error("{0}")]
    Invalid(String),
    /// The row sets no conflist field (an injector-only override).
    #[error("{annotation} sets nothing of the redirection")]
    NotARedirectSetting { annotation: &'static str },
    /// The row's parser does not give what its field holds (a fault of the table, which
    /// `overrides::tests` rules out).
    #[error("{annotation}: the table pairs a {parsed} value with {field:?}")]
    Mismatch {
        annotation: &'static str,
        parsed: &'static str,
        field: Field,
    },
}

impl PodOverride {
    /// Whether the agent reads it (it sets a field of the redirection's configuration).
    pub fn redirects(&self) -> bool {
        self.field.config_field().is_some()
    }

    /// Reads `value` with the row's parser.
    pub fn parse(&self, value: &str) -> Result<Parsed, String> {
        self.parser.parse(value)
    }

    /// Parses `value` and sets the row's field of `config`, replacing or appending.
    pub fn apply(&self, config: &mut LinkerdConfig, value: &str) -> Result<(), ApplyError> {
        if !self.redirects() {
            return Err(ApplyError::NotARedirectSetting {
                annotation: self.annotation,
            });
        }
        let parsed = self.parse(value).map_err(ApplyError::Invalid)?;
        match (self.field, parsed) {
            (Field::InboundPortsToIgnore, Parsed::Ports(p)) => {
                self.merge.into_list(&mut config.inbound_ports_to_ignore, p);
            }
            (Field::OutboundPortsToIgnore, Parsed::Ports(p)) => {
                self.merge
                    .into_list(&mut config.outbound_ports_to_ignore, p);
            }
            (Field::SubnetsToIgnore, Parsed::Cidrs(c)) => {
                self.merge.into_list(&mut config.subnets_to_ignore, c);
            }
            (Field::ProxyUid, Parsed::Id(id)) => config.proxy_uid = id,
            (Field::ProxyGid, Parsed::Id(id)) => config.proxy_gid = id,
            (field, parsed) => {
                return Err(ApplyError::Mismatch {
                    annotation: self.annotation,
                    parsed: match parsed {
                        Parsed::Ports(_) => "port list",
                        Parsed::Cidrs(_) => "CIDR list",
                        Parsed::Id(_) => "numeric ID",
                        Parsed::Text(_) => "text",
                    },
                    field,
                });
            }
        }
        Ok(())
    }

    /// How errors and limits name where a value comes from: the annotation and its conflist
    /// key (`config.linkerd.io/skip-subnets / conflist subnets-to-ignore`).
    pub fn sources(&self) -> String {
        match self.conflist_key {
            Some(key) => format!("{} / conflist {key}", self.annotation),
            None => self.annotation.to_string(),
        }
    }
}

/// How a per-pod limit or an error names the origin of a conflist list: with the annotation
/// that overrides it when there is one (`config.linkerd.io/skip-subnets / conflist
/// subnets-to-ignore`), else the key alone (`conflist ports-to-redirect`).
pub fn sources_of(conflist_key: &str) -> String {
    POD_OVERRIDES
        .iter()
        .find(|row| row.conflist_key == Some(conflist_key))
        .map_or_else(|| format!("conflist {conflist_key}"), PodOverride::sources)
}

/// Which object an override was read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OverrideOrigin {
    /// The pod (or pod template) itself.
    Pod,
    /// The pod's namespace.
    Namespace,
}

/// Linkerd's rule for `config.linkerd.io/*` overrides, shared by the decision and the proxy
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

/// Whether a key is an annotation or a label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyKind {
    Annotation,
    Label,
}

/// A key honoured besides the overrides: a row of [`OTHER_KEYS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OtherKey {
    pub key: &'static str,
    pub kind: KeyKind,
    /// Where it is read.
    pub on: &'static str,
    /// Who reads it.
    pub read_by: &'static str,
    /// What it does, its values, and what an unknown value does.
    pub meaning: &'static str,
}

/// Every other annotation or label whose value changes what is done to a pod.
pub const OTHER_KEYS: [OtherKey; 3] = [
    OtherKey {
        key: INJECT_ANNOTATION,
        kind: KeyKind::Annotation,
        on: "pod, else its namespace",
        read_by: "injector",
        meaning: "`enabled` injects the proxy, `ingress` injects it in ingress mode, `disabled` \
                  never injects; another value: not injected (counted as `unknown-annotation` in the \
                  injector's metrics)",
    },
    OtherKey {
        key: ADMISSION_WEBHOOKS_LABEL,
        kind: KeyKind::Label,
        on: "pod or namespace",
        read_by: "injector",
        meaning: "`disabled`: the injector leaves the pod alone (the `linkerd-cni` namespace \
                  carries it)",
    },
    OtherKey {
        key: CONTROL_PLANE_COMPONENT_LABEL,
        kind: KeyKind::Label,
        on: "pod",
        read_by: "agent",
        meaning: "any value: the pod also skips (outbound) the `port` and integer \
                  `targetPort`s of the `default/kubernetes` Service, or 443 and 6443 when that \
                  Service cannot be read",
    },
];

#[cfg(test)]
mod tests;
