//! The `linkerd` section of the conflist entry, as Linkerd's CNI plugin defines it, plus the
//! eBPF mode's own keys.

use std::{fmt, net::IpAddr, str::FromStr};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Default inbound proxy port.
pub const DEFAULT_INBOUND_PORT: u16 = 4143;
/// Default outbound proxy port.
pub const DEFAULT_OUTBOUND_PORT: u16 = 4140;
/// Default proxy UID.
pub const DEFAULT_PROXY_UID: u32 = 2102;
/// Inbound ports never redirected by default: the proxy's control and admin ports.
pub const DEFAULT_INBOUND_PORTS_TO_IGNORE: [&str; 2] = ["4191", "4190"];
/// Namespaces whose pods the plugin never sends to the agent by default: the CNI's own (its
/// DaemonSet must start while the agent is down) and `kube-system` (Linkerd never meshes it).
pub const DEFAULT_EXCLUDED_NAMESPACES: [&str; 2] = ["linkerd-cni", "kube-system"];

/// A parse error in a port, range or CIDR.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ParseError {
    /// Not a port number, or 0.
    #[error("invalid port {0:?}: expected 1-65535")]
    Port(String),
    /// A range whose bounds are not ports or are reversed.
    #[error(
        "invalid port range {0:?}: expected \"N\" or \"LOW-HIGH\" with 1 <= LOW <= HIGH <= 65535"
    )]
    Range(String),
    /// Not `ADDR/PREFIX` with a prefix that fits the address family.
    #[error("invalid CIDR {0:?}: expected ADDR/PREFIX")]
    Cidr(String),
    /// A list longer than [`MAX_LIST_BYTES`]: refused before any of it is parsed.
    #[error("the list is {len} bytes, over the per-pod limit of {max} bytes; it was not parsed")]
    TooLong { len: usize, max: usize },
    /// A list of more than [`MAX_LIST_ENTRIES`] entries: refused at the first one too many.
    #[error("the list has more than {max} entries, the per-pod limit")]
    TooMany { max: usize },
}

/// The longest port or subnet list that is parsed at all, in bytes: a pod annotation
/// (`config.linkerd.io/skip-*`, on the pod or its namespace) or a list given as text. The API
/// server lets a pod carry 256 KiB of annotations; a list over this limit is refused before
/// any of it is read, so the work a list can cause is bounded by its size.
pub const MAX_LIST_BYTES: usize = 16 * 1024;
/// The most entries (ports, ranges or subnets) one list may have, as text or in the conflist.
pub const MAX_LIST_ENTRIES: usize = 1024;
/// How much of a malformed entry an error quotes.
const MAX_QUOTED: usize = 64;

/// `s`, cut to [`MAX_QUOTED`] characters (with `...` when cut), for an error message.
fn quoted(s: &str) -> String {
    match s.char_indices().nth(MAX_QUOTED) {
        None => s.to_string(),
        Some((at, _)) => format!("{}...", &s[..at]),
    }
}

/// An inclusive range of ports; a single port is `first == last`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PortRange {
    pub first: u16,
    pub last: u16,
}

impl PortRange {
    pub const fn single(port: u16) -> Self {
        Self {
            first: port,
            last: port,
        }
    }

    pub fn contains(&self, port: u16) -> bool {
        (self.first..=self.last).contains(&port)
    }

    pub fn ports(&self) -> impl Iterator<Item = u16> {
        self.first..=self.last
    }
}

fn parse_port(s: &str) -> Option<u16> {
    s.trim().parse::<u16>().ok().filter(|p| *p != 0)
}

impl FromStr for PortRange {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        match s.split_once('-') {
            None => parse_port(s)
                .map(Self::single)
                .ok_or_else(|| ParseError::Port(quoted(s))),
            Some((a, b)) => match (parse_port(a), parse_port(b)) {
                (Some(first), Some(last)) if first <= last => Ok(Self { first, last }),
                _ => Err(ParseError::Range(quoted(s))),
            },
        }
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.first == self.last {
            write!(f, "{}", self.first)
        } else {
            write!(f, "{}-{}", self.first, self.last)
        }
    }
}

impl Serialize for PortRange {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Accepts `"8080"`, `"9000-9100"` and, as some configs write them, bare integers.
impl<'de> Deserialize<'de> for PortRange {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u64),
            Str(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(n) => u16::try_from(n)
                .ok()
                .filter(|p| *p != 0)
                .map(PortRange::single)
                .ok_or_else(|| serde::de::Error::custom(ParseError::Port(n.to_string()))),
            Raw::Str(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// Parses a comma-separated list of ports and ranges, as in `config.linkerd.io/skip-*-ports`.
/// Empty items are ignored. A list over [`MAX_LIST_BYTES`] is refused before it is parsed,
/// one of more than [`MAX_LIST_ENTRIES`] entries at the first entry too many.
pub fn parse_port_list(s: &str) -> Result<Vec<PortRange>, ParseError> {
    parse_list(s)
}

/// The bounded comma-list parser behind [`parse_port_list`] and [`parse_cidr_list`].
fn parse_list<T: FromStr<Err = ParseError>>(s: &str) -> Result<Vec<T>, ParseError> {
    if s.len() > MAX_LIST_BYTES {
        return Err(ParseError::TooLong {
            len: s.len(),
            max: MAX_LIST_BYTES,
        });
    }
    let mut out = Vec::new();
    for item in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if out.len() == MAX_LIST_ENTRIES {
            return Err(ParseError::TooMany {
                max: MAX_LIST_ENTRIES,
            });
        }
        out.push(item.parse()?);
    }
    Ok(out)
}

/// `ranges` sorted, with overlapping and adjacent ranges merged into one: the same ports in
/// at most as many ranges, none of which touch. O(n log n) in the number of ranges, whatever
/// ports they cover: 32,760 copies of `1-65535` become one range.
pub fn merge_ranges(ranges: &[PortRange]) -> Vec<PortRange> {
    let mut sorted = ranges.to_vec();
    sorted.sort_unstable();
    let mut out: Vec<PortRange> = Vec::with_capacity(sorted.len());
    for r in sorted {
        match out.last_mut() {
            Some(last) if u32::from(r.first) <= u32::from(last.last) + 1 => {
                last.last = last.last.max(r.last);
            }
            _ => out.push(r),
        }
    }
    out
}

/// An IPv4 or IPv6 network, `ADDR/PREFIX` (a bare address is a host route).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Cidr {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl Cidr {
    pub fn host(addr: IpAddr) -> Self {
        let prefix = if addr.is_ipv4() { 32 } else { 128 };
        Self { addr, prefix }
    }

    /// Whether `ip` is inside this network (same family only).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

impl FromStr for Cidr {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        let err = || ParseError::Cidr(quoted(s));
        let (addr, prefix) = match s.trim().split_once('/') {
            Some((a, p)) => (a.parse::<IpAddr>().map_err(|_| err())?, Some(p)),
            None => (s.trim().parse::<IpAddr>().map_err(|_| err())?, None),
        };
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p.parse::<u8>().ok().filter(|p| *p <= max).ok_or_else(err)?,
            None => max,
        };
        Ok(Self { addr, prefix })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl Serialize for Cidr {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Cidr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// Parses a comma-separated list of CIDRs, as in `config.linkerd.io/skip-subnets`, bounded as
/// [`parse_port_list`] is.
pub fn parse_cidr_list(s: &str) -> Result<Vec<Cidr>, ParseError> {
    parse_list(s)
}

/// The port lists of the `linkerd` section.
pub const PORT_LIST_KEYS: [&str; 3] = [
    "ports-to-redirect",
    "inbound-ports-to-ignore",
    "outbound-ports-to-ignore",
];
/// The subnet lists of the `linkerd` section.
pub const SUBNET_LIST_KEYS: [&str; 2] = ["subnets-to-ignore", "outbound-subnets-to-ignore"];

/// Linkerd's tolerance for the node's conflist: one malformed entry of a port or subnet list
/// (`"http"`, `"0"`, `"9100-9000"`, `"10.0.0.0/33"`) is dropped from `section` rather than
/// failing every pod on the node, as Linkerd's plugin skips a bad port. Returns one message
/// per dropped entry, naming the key, for the plugin's log. A list that is not a list is left
/// alone (the whole section is then refused, naming the key).
pub fn drop_malformed_entries(
    section: &mut serde_json::Map<String, serde_json::Value>,
) -> Vec<String> {
    let mut dropped = Vec::new();
    let keys = PORT_LIST_KEYS
        .iter()
        .map(|k| (k, true))
        .chain(SUBNET_LIST_KEYS.iter().map(|k| (k, false)));
    for (key, ports) in keys {
        let Some(serde_json::Value::Array(items)) = section.get_mut(*key) else {
            continue;
        };
        // Refused whole by `LinkerdConfig::check_list_lengths`: not walked entry by entry.
        if items.len() > MAX_LIST_ENTRIES {
            continue;
        }
        items.retain(|item| {
            let parsed = if ports {
                PortRange::deserialize(item).map(drop)
            } else {
                Cidr::deserialize(item).map(drop)
            };
            match parsed {
                Ok(()) => true,
                Err(e) => {
                    dropped.push(format!("linkerd.{key}: skipping entry {item}: {e}"));
                    false
                }
            }
        });
    }
    dropped
}

/// The `linkerd` section of the `linkerd-cni` conflist entry. Every key is optional; unknown
/// keys are ignored (Linkerd adds keys over time). Defaults are Linkerd's.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", default)]
pub struct LinkerdConfig {
    pub incoming_proxy_port: u16,
    pub outgoing_proxy_port: u16,
    /// 0 means no UID exemption.
    pub proxy_uid: i64,
    /// Negative means no GID exemption.
    pub proxy_gid: i64,
    /// Inbound only: when non-empty, only these destination ports are redirected.
    pub ports_to_redirect: Vec<PortRange>,
    pub inbound_ports_to_ignore: Vec<PortRange>,
    pub outbound_ports_to_ignore: Vec<PortRange>,
    /// Sources whose inbound connections are not redirected (Linkerd's meaning).
    pub subnets_to_ignore: Vec<Cidr>,
    /// eBPF mode: destinations whose outbound connections are not redirected.
    pub outbound_subnets_to_ignore: Vec<Cidr>,
    /// Log what would be done and change nothing.
    pub simulate: bool,
    /// iptables mode only; accepted and ignored.
    pub use_wait_flag: bool,
    /// iptables mode only; accepted and ignored.
    pub iptables_mode: Option<String>,
    pub ipv6: bool,
    /// eBPF mode: the node agent's registration socket.
    pub agent_socket: String,
    /// eBPF mode: how long the plugin waits for the agent, in milliseconds. The agent
    /// abandons an ADD it cannot finish in that time (see `wire::Envelope::budget_ms`).
    pub agent_timeout_ms: u64,
    /// eBPF mode: pods in these namespaces are never sent to the agent (ADD passes
    /// `prevResult` through, DEL and CHECK do nothing), so they start while it is down.
    pub excluded_namespaces: Vec<String>,
}

impl Default for LinkerdConfig {
    fn default() -> Self {
        Self {
            incoming_proxy_port: DEFAULT_INBOUND_PORT,
            outgoing_proxy_port: DEFAULT_OUTBOUND_PORT,
            proxy_uid: i64::from(DEFAULT_PROXY_UID),
            proxy_gid: -1,
            ports_to_redirect: Vec::new(),
            inbound_ports_to_ignore: DEFAULT_INBOUND_PORTS_TO_IGNORE
                .iter()
                .filter_map(|p| p.parse().ok())
                .collect(),
            outbound_ports_to_ignore: Vec::new(),
            subnets_to_ignore: Vec::new(),
            outbound_subnets_to_ignore: Vec::new(),
            simulate: false,
            use_wait_flag: false,
            iptables_mode: None,
            ipv6: false,
            agent_socket: linkerd_cni_common::paths::AGENT_SOCKET.to_string(),
            agent_timeout_ms: 10_000,
            excluded_namespaces: DEFAULT_EXCLUDED_NAMESPACES.map(String::from).to_vec(),
        }
    }
}

/// A list of the `linkerd` section with more than [`MAX_LIST_ENTRIES`] entries.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{count} entries, over the limit of {max}")]
pub struct ListTooLong {
    /// The list's key in the section.
    pub key: &'static str,
    pub count: usize,
    pub max: usize,
}

impl LinkerdConfig {
    /// Checks every list of the section against [`MAX_LIST_ENTRIES`], as an annotation's list
    /// is checked when it is parsed: the plugin refuses such a network config, naming the key.
    /// (Deserializing does not check, so that what an earlier version stored still reads.)
    pub fn check_list_lengths(&self) -> Result<(), ListTooLong> {
        let lists = [
            ("ports-to-redirect", self.ports_to_redirect.len()),
            (
                "inbound-ports-to-ignore",
                self.inbound_ports_to_ignore.len(),
            ),
            (
                "outbound-ports-to-ignore",
                self.outbound_ports_to_ignore.len(),
            ),
            ("subnets-to-ignore", self.subnets_to_ignore.len()),
            (
                "outbound-subnets-to-ignore",
                self.outbound_subnets_to_ignore.len(),
            ),
            ("excluded-namespaces", self.excluded_namespaces.len()),
        ];
        match lists.into_iter().find(|(_, n)| *n > MAX_LIST_ENTRIES) {
            Some((key, count)) => Err(ListTooLong {
                key,
                count,
                max: MAX_LIST_ENTRIES,
            }),
            None => Ok(()),
        }
    }

    /// The proxy UID exemption, if any (`proxy-uid` 0 or absent in Linkerd means none).
    pub fn proxy_uid(&self) -> Option<u32> {
        u32::try_from(self.proxy_uid).ok().filter(|u| *u != 0)
    }

    /// The proxy GID exemption, if any (negative means none).
    pub fn proxy_gid(&self) -> Option<u32> {
        u32::try_from(self.proxy_gid).ok()
    }

    /// Whether pods of `namespace` are never sent to the agent.
    pub fn is_excluded(&self, namespace: &str) -> bool {
        self.excluded_namespaces.iter().any(|n| n == namespace)
    }
}

/// The proxy container Linkerd injects (a native sidecar in `initContainers`, or a container).
pub const PROXY_CONTAINER: &str = "linkerd-proxy";
/// The iptables init container: a pod that has it redirects its own traffic.
pub const INIT_CONTAINER: &str = "linkerd-init";

/// Linkerd's "is this pod meshed" rule (contract section 2, rule 3) on container names only:
/// some container or init container is named `linkerd-proxy` and no init container is named
/// `linkerd-init`.
pub fn wants_redirect<'a>(
    containers: impl IntoIterator<Item = &'a str>,
    init_containers: impl IntoIterator<Item = &'a str> + Clone,
) -> bool {
    let has_proxy = containers.into_iter().any(|c| c == PROXY_CONTAINER)
        || init_containers
            .clone()
            .into_iter()
            .any(|c| c == PROXY_CONTAINER);
    has_proxy && !init_containers.into_iter().any(|c| c == INIT_CONTAINER)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_ranges() {
        assert_eq!("8080".parse(), Ok(PortRange::single(8080)));
        assert_eq!(
            "9000-9100".parse(),
            Ok(PortRange {
                first: 9000,
                last: 9100
            })
        );
        assert!("0".parse::<PortRange>().is_err());
        assert!("70000".parse::<PortRange>().is_err());
        assert!("9100-9000".parse::<PortRange>().is_err());
        assert!("a-b".parse::<PortRange>().is_err());
        assert_eq!(
            parse_port_list("25, 587,,9000-9001").unwrap(),
            vec![
                PortRange::single(25),
                PortRange::single(587),
                PortRange {
                    first: 9000,
                    last: 9001
                }
            ]
        );
    }

    /// Issue 28: the work a list can cause is bounded by its size. Over the byte limit, a list
    /// is refused before any of it is read: a list that starts with an invalid entry says it
    /// is too long, not that its first entry is invalid.
    #[test]
    fn lists_over_the_byte_limit_are_refused_unread() {
        let hostile = vec!["1-65535"; 32_760].join(",");
        assert_eq!(hostile.len(), 262_079);
        assert_eq!(
            parse_port_list(&hostile),
            Err(ParseError::TooLong {
                len: 262_079,
                max: MAX_LIST_BYTES
            })
        );
        let unread = format!("not-a-port,{}", "1".repeat(MAX_LIST_BYTES));
        assert!(matches!(
            parse_port_list(&unread),
            Err(ParseError::TooLong { .. })
        ));
        assert!(matches!(
            parse_cidr_list(&unread),
            Err(ParseError::TooLong { .. })
        ));
        // At the limit, parsed (and refused for what it holds).
        let at = format!("x{}", " ".repeat(MAX_LIST_BYTES - 1));
        assert_eq!(parse_port_list(&at), Err(ParseError::Port("x".into())));
    }

    #[test]
    fn lists_over_the_entry_limit_are_refused_at_the_first_entry_too_many() {
        let at = vec!["25"; MAX_LIST_ENTRIES].join(",");
        assert_eq!(parse_port_list(&at).map(|l| l.len()), Ok(MAX_LIST_ENTRIES));
        // Entry 1,025 is not even parsed: an invalid one is refused as one too many.
        let over = format!("{at},not-a-port");
        assert_eq!(
            parse_port_list(&over),
            Err(ParseError::TooMany {
                max: MAX_LIST_ENTRIES
            })
        );
        // Empty items do not count.
        let sparse = format!("{at},,, ,");
        assert!(parse_port_list(&sparse).is_ok());
        let cidrs = vec!["10.0.0.0/8"; MAX_LIST_ENTRIES + 1].join(",");
        assert_eq!(
            parse_cidr_list(&cidrs),
            Err(ParseError::TooMany {
                max: MAX_LIST_ENTRIES
            })
        );
    }

    #[test]
    fn errors_quote_at_most_64_characters_of_an_entry() {
        let long = "9".repeat(5000);
        let Err(ParseError::Port(quoted)) = parse_port_list(&long) else {
            panic!("a port error");
        };
        assert_eq!(quoted, format!("{}...", "9".repeat(64)));
    }

    #[test]
    fn merged_ranges_cover_the_same_ports_once() {
        let r = |first, last| PortRange { first, last };
        assert_eq!(merge_ranges(&vec![r(1, 65535); 32_760]), vec![r(1, 65535)]);
        assert_eq!(
            merge_ranges(&[
                r(10, 20),
                r(1, 3),
                r(4, 5),
                r(15, 30),
                r(32, 32),
                r(65535, 65535)
            ]),
            vec![r(1, 5), r(10, 30), r(32, 32), r(65535, 65535)]
        );
        assert_eq!(merge_ranges(&[]), vec![]);
    }

    #[test]
    fn section_lists_are_bounded_in_entries() {
        let mut c = LinkerdConfig::default();
        assert_eq!(c.check_list_lengths(), Ok(()));
        c.ports_to_redirect = vec![PortRange::single(80); MAX_LIST_ENTRIES];
        assert_eq!(c.check_list_lengths(), Ok(()));
        c.subnets_to_ignore = vec!["10.0.0.0/8".parse().unwrap(); MAX_LIST_ENTRIES + 1];
        let err = c.check_list_lengths().unwrap_err();
        assert_eq!(err.key, "subnets-to-ignore");
        assert_eq!(err.count, MAX_LIST_ENTRIES + 1);
        // Too long to be walked entry by entry: left whole for the check to refuse.
        let mut section = serde_json::json!({
            "inbound-ports-to-ignore": vec!["http"; MAX_LIST_ENTRIES + 1],
        });
        assert!(drop_malformed_entries(section.as_object_mut().unwrap()).is_empty());
    }

    #[test]
    fn cidrs() {
        let c: Cidr = "10.0.0.0/8".parse().unwrap();
        assert!(c.contains("10.1.2.3".parse().unwrap()));
        assert!(!c.contains("11.0.0.1".parse().unwrap()));
        assert!(!c.contains("::1".parse().unwrap()));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("1.2.3.4".parse().unwrap()));
        assert_eq!("fd00::1".parse::<Cidr>().unwrap().prefix, 128);
        assert!("10.0.0.0/33".parse::<Cidr>().is_err());
        assert!("nope/8".parse::<Cidr>().is_err());
    }

    #[test]
    fn malformed_list_entries_are_dropped_and_named() {
        let mut section = serde_json::json!({
            "inbound-ports-to-ignore": ["4191", "http", "0", 4190, "9100-9000"],
            "outbound-ports-to-ignore": ["25"],
            "ports-to-redirect": [70000, 8080],
            "subnets-to-ignore": ["10.0.0.0/8", "10.0.0.0/33", "nope"],
            "outbound-subnets-to-ignore": "not a list",
            "proxy-uid": 2102,
        });
        let dropped = drop_malformed_entries(section.as_object_mut().unwrap());
        assert_eq!(dropped.len(), 6, "{dropped:#?}");
        assert!(dropped[0].starts_with("linkerd.ports-to-redirect: skipping entry 70000"));
        assert!(dropped.iter().any(|d| d.starts_with(r#"linkerd.inbound-ports-to-ignore: skipping entry "http""#)));
        assert!(
            dropped
                .iter()
                .any(|d| d.starts_with(r#"linkerd.subnets-to-ignore: skipping entry "nope""#))
        );
        // A list key that is not a list is still refused as a whole; the rest parses.
        assert!(serde_json::from_value::<LinkerdConfig>(section.clone()).is_err());
        section
            .as_object_mut()
            .unwrap()
            .remove("outbound-subnets-to-ignore");
        let c: LinkerdConfig = serde_json::from_value(section).unwrap();
        assert_eq!(
            c.inbound_ports_to_ignore,
            vec![PortRange::single(4191), PortRange::single(4190)]
        );
        assert_eq!(c.ports_to_redirect, vec![PortRange::single(8080)]);
        assert_eq!(c.subnets_to_ignore, vec!["10.0.0.0/8".parse().unwrap()]);
    }

    #[test]
    fn linkerd_section_defaults_and_keys() {
        let c: LinkerdConfig = serde_json::from_str("{}").unwrap();
        assert_eq!(c, LinkerdConfig::default());
        assert_eq!(c.proxy_uid(), Some(2102));
        assert_eq!(c.proxy_gid(), None);
        let c: LinkerdConfig = serde_json::from_str(
            r#"{"incoming-proxy-port":1,"outgoing-proxy-port":2,"proxy-uid":0,"proxy-gid":7,
                "ports-to-redirect":[8080],"inbound-ports-to-ignore":["4191","4190"],
                "outbound-ports-to-ignore":["25","9000-9100"],"subnets-to-ignore":["10.0.0.0/8"],
                "simulate":true,"use-wait-flag":true,"iptables-mode":"legacy","ipv6":true,
                "some-future-key":1}"#,
        )
        .unwrap();
        assert_eq!(c.proxy_uid(), None);
        assert_eq!(c.proxy_gid(), Some(7));
        assert_eq!(
            c.outbound_ports_to_ignore[1],
            PortRange {
                first: 9000,
                last: 9100
            }
        );
        assert!(serde_json::from_str::<LinkerdConfig>(r#"{"proxy-uid":"x"}"#).is_err());
    }

    #[test]
    fn excluded_namespaces() {
        let c = LinkerdConfig::default();
        assert!(c.is_excluded("kube-system") && c.is_excluded("linkerd-cni"));
        assert!(!c.is_excluded("default"));
        let c: LinkerdConfig =
            serde_json::from_str(r#"{"excluded-namespaces":["infra"]}"#).unwrap();
        assert!(c.is_excluded("infra") && !c.is_excluded("kube-system"));
    }

    #[test]
    fn meshed_rule() {
        let none: [&str; 0] = [];
        assert!(wants_redirect(["app", "linkerd-proxy"], none));
        assert!(wants_redirect(["app"], ["linkerd-proxy"]));
        assert!(!wants_redirect(["app"], none));
        assert!(!wants_redirect(["app", "linkerd-proxy"], ["linkerd-init"]));
        assert!(!wants_redirect(["app"], ["linkerd-init", "linkerd-proxy"]));
        // Only an init container named linkerd-init counts.
        assert!(wants_redirect(["linkerd-proxy", "linkerd-init"], none));
    }
}
