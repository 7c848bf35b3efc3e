//! The CNI result a chained plugin passes on: `prevResult` read in any supported format and
//! written in the request's version.
//!
//! Two formats exist. 0.3.0, 0.3.1 and 0.4.0 results give each IP a `version` (`"4"`/`"6"`);
//! 1.0.0 and 1.1.0 results do not. Everything else (interfaces, the `interface` index of each
//! IP, routes with their 1.1 extras, DNS) is carried over unchanged.

use std::net::IpAddr;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::{error::PluginError, version::SpecVersion};

/// One IP configuration of a result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpConfig {
    /// `ADDR/PREFIX`, as the previous plugin wrote it.
    pub address: String,
    /// The address part of `address`.
    pub ip: IpAddr,
    pub gateway: Option<String>,
    /// Index into the result's interfaces.
    pub interface: Option<u64>,
}

/// A parsed CNI result.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CniResult {
    /// Interface objects, kept as the previous plugin wrote them.
    pub interfaces: Vec<Value>,
    pub ips: Vec<IpConfig>,
    /// Route objects, kept as written (1.1 adds `mtu`, `advmss`, `priority`, `table`, `scope`).
    pub routes: Vec<Value>,
    /// The DNS object, kept as written.
    pub dns: Option<Value>,
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> PluginError {
    PluginError::InvalidConfig {
        field: field.into(),
        reason: reason.into(),
    }
}

fn objects(obj: &Map<String, Value>, key: &str) -> Result<Vec<Value>, PluginError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => {
            if let Some(i) = items.iter().position(|v| !v.is_object()) {
                return Err(invalid(
                    format!("prevResult.{key}[{i}]"),
                    "expected an object",
                ));
            }
            Ok(items.clone())
        }
        Some(_) => Err(invalid(format!("prevResult.{key}"), "expected an array")),
    }
}

fn parse_cidr_address(s: &str) -> Option<IpAddr> {
    let (addr, prefix) = s.split_once('/')?;
    let ip: IpAddr = addr.parse().ok()?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    prefix.parse::<u8>().ok().filter(|p| *p <= max)?;
    Some(ip)
}

fn parse_ip(i: usize, v: &Value) -> Result<IpConfig, PluginError> {
    let field = |k: &str| format!("prevResult.ips[{i}].{k}");
    let obj = v
        .as_object()
        .ok_or_else(|| invalid(format!("prevResult.ips[{i}]"), "expected an object"))?;
    let address = obj
        .get("address")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid(field("address"), "missing or not a string"))?
        .to_string();
    let ip = parse_cidr_address(&address)
        .ok_or_else(|| invalid(field("address"), format!("{address:?} is not ADDR/PREFIX")))?;
    match obj.get("version") {
        None | Some(Value::Null) => {}
        Some(Value::String(ver)) => {
            let family_ok = match ver.as_str() {
                "4" => ip.is_ipv4(),
                "6" => ip.is_ipv6(),
                _ => {
                    return Err(invalid(
                        field("version"),
                        format!("{ver:?} is not \"4\" or \"6\""),
                    ));
                }
            };
            if !family_ok {
                return Err(invalid(
                    field("version"),
                    format!("{ver:?} does not match {address}"),
                ));
            }
        }
        Some(_) => return Err(invalid(field("version"), "expected \"4\" or \"6\"")),
    }
    let gateway = match obj.get("gateway") {
        None | Some(Value::Null) => None,
        Some(Value::String(g)) if g.parse::<IpAddr>().is_ok() => Some(g.clone()),
        Some(_) => return Err(invalid(field("gateway"), "expected an IP address")),
    };
    let interface = match obj.get("interface") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_u64()
                .ok_or_else(|| invalid(field("interface"), "expected an index"))?,
        ),
    };
    Ok(IpConfig {
        address,
        ip,
        gateway,
        interface,
    })
}

impl CniResult {
    /// Reads a `prevResult` in any supported format (with or without `ips[].version`).
    pub fn parse(value: &Value) -> Result<Self, PluginError> {
        let obj = value
            .as_object()
            .ok_or_else(|| invalid("prevResult", "expected an object"))?;
        for old in ["ip4", "ip6"] {
            if obj.contains_key(old) {
                return Err(PluginError::UnsupportedField {
                    field: format!("prevResult.{old}"),
                    reason: "results older than CNI 0.3.0 are not supported".into(),
                });
            }
        }
        let ips = match obj.get("ips") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, v)| parse_ip(i, v))
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(invalid("prevResult.ips", "expected an array")),
        };
        let dns = match obj.get("dns") {
            None | Some(Value::Null) => None,
            Some(v @ Value::Object(_)) => Some(v.clone()),
            Some(_) => return Err(invalid("prevResult.dns", "expected an object")),
        };
        Ok(Self {
            interfaces: objects(obj, "interfaces")?,
            ips,
            routes: objects(obj, "routes")?,
            dns,
        })
    }

    /// The result in spec version `version`: empty lists are left out, IPs get `version` in
    /// 0.x formats and lose it in 1.x.
    pub fn to_json(&self, version: SpecVersion) -> Value {
        #[derive(Serialize)]
        struct Ip<'a> {
            #[serde(skip_serializing_if = "Option::is_none")]
            version: Option<&'static str>,
            address: &'a str,
            #[serde(skip_serializing_if = "Option::is_none")]
            gateway: Option<&'a str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            interface: Option<u64>,
        }
        #[derive(Serialize)]
        struct Out<'a> {
            #[serde(rename = "cniVersion")]
            cni_version: &'static str,
            #[serde(skip_serializing_if = "<[_]>::is_empty")]
            interfaces: &'a [Value],
            #[serde(skip_serializing_if = "Vec::is_empty")]
            ips: Vec<Ip<'a>>,
            #[serde(skip_serializing_if = "<[_]>::is_empty")]
            routes: &'a [Value],
            #[serde(skip_serializing_if = "Option::is_none")]
            dns: Option<&'a Value>,
        }
        let ips = self
            .ips
            .iter()
            .map(|ip| Ip {
                version: version.ip_version_field().then_some(if ip.ip.is_ipv4() {
                    "4"
                } else {
                    "6"
                }),
                address: &ip.address,
                gateway: ip.gateway.as_deref(),
                interface: ip.interface,
            })
            .collect();
        let out = Out {
            cni_version: version.as_str(),
            interfaces: &self.interfaces,
            ips,
            routes: &self.routes,
            dns: self.dns.as_ref(),
        };
        // Serializing plain structs of strings, numbers and `Value`s into a `Value` cannot
        // fail (no maps with non-string keys, no custom serializers that error).
        serde_json::to_value(out).unwrap_or(Value::Null)
    }

    /// The pod's own addresses. When the result marks container-side interfaces (`sandbox`
    /// set), IPs on host-side interfaces (bridge, host veth) are left out; otherwise every IP
    /// counts.
    pub fn pod_ips(&self) -> Vec<IpAddr> {
        let in_sandbox = |i: &Value| {
            i.get("sandbox")
                .and_then(Value::as_str)
                .is_some_and(|s| !s.is_empty())
        };
        let any_sandbox = self.interfaces.iter().any(in_sandbox);
        self.ips
            .iter()
            .filter(|ip| {
                let iface = ip
                    .interface
                    .and_then(|i| usize::try_from(i).ok())
                    .and_then(|i| self.interfaces.get(i));
                match iface {
                    Some(iface) if any_sandbox => in_sandbox(iface),
                    _ => true,
                }
            })
            .map(|ip| ip.ip)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::error::cni_code;

    /// What the bridge + host-local plugins print for a dual-stack pod, in the 0.x format.
    fn bridge_0x(version: &str) -> Value {
        json!({
            "cniVersion": version,
            "interfaces": [
                {"name": "cni0", "mac": "aa:bb:cc:00:00:01"},
                {"name": "veth1234", "mac": "aa:bb:cc:00:00:02"},
                {"name": "eth0", "mac": "aa:bb:cc:00:00:03", "sandbox": "/var/run/netns/cni-1"}
            ],
            "ips": [
                {"version": "4", "address": "10.22.0.5/16", "gateway": "10.22.0.1", "interface": 2},
                {"version": "6", "address": "fd00:22::5/64", "gateway": "fd00:22::1", "interface": 2}
            ],
            "routes": [{"dst": "0.0.0.0/0", "gw": "10.22.0.1"}],
            "dns": {"nameservers": ["10.96.0.10"], "search": ["svc.cluster.local"]}
        })
    }

    /// The same result in the 1.x format, with 1.1 route extras.
    fn bridge_1x(version: &str) -> Value {
        json!({
            "cniVersion": version,
            "interfaces": [
                {"name": "cni0", "mac": "aa:bb:cc:00:00:01"},
                {"name": "veth1234", "mac": "aa:bb:cc:00:00:02"},
                {"name": "eth0", "mac": "aa:bb:cc:00:00:03", "sandbox": "/var/run/netns/cni-1"}
            ],
            "ips": [
                {"address": "10.22.0.5/16", "gateway": "10.22.0.1", "interface": 2},
                {"address": "fd00:22::5/64", "gateway": "fd00:22::1", "interface": 2}
            ],
            "routes": [{"dst": "0.0.0.0/0", "gw": "10.22.0.1"}],
            "dns": {"nameservers": ["10.96.0.10"], "search": ["svc.cluster.local"]}
        })
    }

    #[test]
    fn converts_between_every_pair_of_versions() {
        for from in SpecVersion::ALL {
            let input = if from.ip_version_field() {
                bridge_0x(from.as_str())
            } else {
                bridge_1x(from.as_str())
            };
            let parsed = CniResult::parse(&input).unwrap_or_else(|e| panic!("parse {from}: {e}"));
            for to in SpecVersion::ALL {
                let golden = if to.ip_version_field() {
                    bridge_0x(to.as_str())
                } else {
                    bridge_1x(to.as_str())
                };
                assert_eq!(parsed.to_json(to), golden, "{from} -> {to}");
            }
        }
    }

    #[test]
    fn keeps_route_extras_and_unknown_interface_fields() {
        let input = json!({
            "cniVersion": "1.1.0",
            "interfaces": [{"name": "eth0", "sandbox": "/n", "mtu": 1450, "socketPath": "/s"}],
            "ips": [{"address": "10.0.0.2/24"}],
            "routes": [{"dst": "10.1.0.0/16", "gw": "10.0.0.1", "mtu": 1400, "advmss": 1360,
                        "priority": 5, "table": 100, "scope": 0}]
        });
        let out = CniResult::parse(&input)
            .expect("parses")
            .to_json(SpecVersion::V0_4_0);
        assert_eq!(
            out,
            json!({
                "cniVersion": "0.4.0",
                "interfaces": [{"name": "eth0", "sandbox": "/n", "mtu": 1450, "socketPath": "/s"}],
                "ips": [{"version": "4", "address": "10.0.0.2/24"}],
                "routes": [{"dst": "10.1.0.0/16", "gw": "10.0.0.1", "mtu": 1400, "advmss": 1360,
                            "priority": 5, "table": 100, "scope": 0}]
            })
        );
    }

    #[test]
    fn empty_result_is_minimal() {
        for v in SpecVersion::ALL {
            assert_eq!(
                CniResult::default().to_json(v),
                json!({"cniVersion": v.as_str()}),
                "{v}"
            );
            let parsed = CniResult::parse(&json!({"cniVersion": v.as_str()})).expect("parses");
            assert_eq!(parsed, CniResult::default());
        }
    }

    #[test]
    fn pod_ips_skip_host_side_interfaces() {
        let mut r = CniResult::parse(&bridge_0x("0.4.0")).expect("parses");
        r.ips.push(IpConfig {
            address: "10.22.0.1/16".into(),
            ip: "10.22.0.1".parse().expect("ip"),
            gateway: None,
            interface: Some(0),
        });
        assert_eq!(
            r.pod_ips(),
            [
                "10.22.0.5".parse::<IpAddr>().expect("ip"),
                "fd00:22::5".parse().expect("ip")
            ]
        );
        // No sandbox anywhere (some plugins only list the host veth): every IP is the pod's.
        let calico_like = json!({"interfaces": [{"name": "cali1"}], "ips": [{"address": "192.168.1.7/32", "interface": 0}]});
        let r = CniResult::parse(&calico_like).expect("parses");
        assert_eq!(r.pod_ips(), ["192.168.1.7".parse::<IpAddr>().expect("ip")]);
    }

    #[test]
    fn bad_results_name_the_field() {
        let table = [
            (json!([]), 7, "prevResult"),
            (json!({"ips": {}}), 7, "prevResult.ips"),
            (
                json!({"ips": [{"version": "4"}]}),
                7,
                "prevResult.ips[0].address",
            ),
            (
                json!({"ips": [{"address": "10.0.0.1"}]}),
                7,
                "prevResult.ips[0].address",
            ),
            (
                json!({"ips": [{"address": "10.0.0.1/33"}]}),
                7,
                "prevResult.ips[0].address",
            ),
            (
                json!({"ips": [{"address": "10.0.0.1/8", "version": "6"}]}),
                7,
                "prevResult.ips[0].version",
            ),
            (
                json!({"ips": [{"address": "10.0.0.1/8", "version": 4}]}),
                7,
                "prevResult.ips[0].version",
            ),
            (
                json!({"ips": [{"address": "10.0.0.1/8", "gateway": "x"}]}),
                7,
                "prevResult.ips[0].gateway",
            ),
            (
                json!({"ips": [{"address": "10.0.0.1/8", "interface": -1}]}),
                7,
                "prevResult.ips[0].interface",
            ),
            (json!({"interfaces": [1]}), 7, "prevResult.interfaces[0]"),
            (json!({"routes": "x"}), 7, "prevResult.routes"),
            (json!({"dns": []}), 7, "prevResult.dns"),
            (json!({"ip4": {"ip": "10.0.0.1/8"}}), 2, "prevResult.ip4"),
        ];
        for (input, code, field) in table {
            let err = CniResult::parse(&input).expect_err(&input.to_string());
            assert_eq!(cni_code(&err), code, "{input}: {err}");
            assert!(
                err.to_string().contains(field),
                "{input}: {err} should name {field}"
            );
        }
    }
}
