//! Linkerd's redirection rules (what linkerd2-proxy-init programs with iptables) as one
//! nftables table of ours, built from the pod's configuration as the node agent decided it
//! (the conflist's `linkerd` section with the pod's and its namespace's overrides applied).
//!
//! Table `inet linkerd` (IPv4 and IPv6 alike; IPv6 returns at once unless `ipv6: true`), two
//! `nat` base chains at the `dstnat` priority iptables' `nat` table has, named after
//! proxy-init's chains:
//!
//! - `PROXY_INIT_REDIRECT` (prerouting, inbound): not TCP returns; ignored inbound ports
//!   return; sources in `subnets-to-ignore` return; then TCP to `ports-to-redirect` (every
//!   port when the list is empty) is redirected to the proxy's inbound port.
//! - `PROXY_INIT_OUTPUT` (output, outbound): not TCP returns; the proxy UID's (and GID's)
//!   sockets return; anything leaving through `lo` returns (loopback, and the pod's own
//!   addresses); ignored outbound ports and destinations in `outbound-subnets-to-ignore`
//!   return; the rest of TCP is redirected to the proxy's outbound port.
//!
//! A `nat` chain is consulted for a connection's first packet only; the redirection is kept by
//! connection tracking, which answers the proxy's `SO_ORIGINAL_DST` natively.

use std::net::IpAddr;

use linkerd_cni_proto::config::{Cidr, LinkerdConfig, PortRange, merge_ranges};

use super::msg::{
    Chain, CmpOp, Expr, Hook, MetaKey, NFPROTO_IPV4, NFPROTO_IPV6, PRIORITY_DSTNAT, PayloadBase,
    REG_1, Rule, VERDICT_RETURN,
};

/// The table's name (family `inet`).
pub const TABLE: &str = "linkerd";
/// The inbound chain (hook prerouting).
pub const REDIRECT_CHAIN: &str = "PROXY_INIT_REDIRECT";
/// The outbound chain (hook output).
pub const OUTPUT_CHAIN: &str = "PROXY_INIT_OUTPUT";

/// The table's base chains.
pub const CHAINS: [Chain; 2] = [
    Chain {
        name: REDIRECT_CHAIN,
        hook: Hook::Prerouting,
        priority: PRIORITY_DSTNAT,
    },
    Chain {
        name: OUTPUT_CHAIN,
        hook: Hook::Output,
        priority: PRIORITY_DSTNAT,
    },
];

const IPPROTO_TCP: u8 = 6;

/// Every rule of the table for `config`, chain by chain, in order.
pub fn rules(config: &LinkerdConfig) -> Vec<Rule> {
    let mut out = Vec::new();
    // Inbound.
    let chain = REDIRECT_CHAIN;
    out.push(not_tcp_returns(chain));
    if !config.ipv6 {
        out.push(ipv6_returns(chain));
    }
    for range in merge_ranges(&config.inbound_ports_to_ignore) {
        out.push(rule(chain, [dport(range), vec![ret()]]));
    }
    for cidr in &config.subnets_to_ignore {
        out.push(rule(chain, [address(Side::Source, cidr), vec![ret()]]));
    }
    let to_inbound = redirect(config.incoming_proxy_port);
    if config.ports_to_redirect.is_empty() {
        out.push(rule(chain, [to_inbound]));
    } else {
        for range in merge_ranges(&config.ports_to_redirect) {
            out.push(rule(chain, [dport(range), to_inbound.clone()]));
        }
    }

    // Outbound.
    let chain = OUTPUT_CHAIN;
    out.push(not_tcp_returns(chain));
    if !config.ipv6 {
        out.push(ipv6_returns(chain));
    }
    if let Some(uid) = config.proxy_uid() {
        out.push(rule(chain, [owner(MetaKey::SkUid, uid), vec![ret()]]));
    }
    if let Some(gid) = config.proxy_gid() {
        out.push(rule(chain, [owner(MetaKey::SkGid, gid), vec![ret()]]));
    }
    out.push(rule(chain, [oifname_lo(), vec![ret()]]));
    for range in merge_ranges(&config.outbound_ports_to_ignore) {
        out.push(rule(chain, [dport(range), vec![ret()]]));
    }
    for cidr in &config.outbound_subnets_to_ignore {
        out.push(rule(chain, [address(Side::Destination, cidr), vec![ret()]]));
    }
    out.push(rule(chain, [redirect(config.outgoing_proxy_port)]));
    out
}

fn rule<const N: usize>(chain: &'static str, parts: [Vec<Expr>; N]) -> Rule {
    Rule {
        chain,
        exprs: parts.into_iter().flatten().collect(),
    }
}

fn ret() -> Expr {
    Expr::Verdict(VERDICT_RETURN)
}

/// `meta l4proto != tcp return`.
fn not_tcp_returns(chain: &'static str) -> Rule {
    rule(
        chain,
        [vec![
            Expr::Meta {
                key: MetaKey::L4Proto,
                dreg: REG_1,
            },
            Expr::Cmp {
                sreg: REG_1,
                op: CmpOp::Neq,
                data: vec![IPPROTO_TCP],
            },
            ret(),
        ]],
    )
}

/// `meta nfproto ipv6 return`.
fn ipv6_returns(chain: &'static str) -> Rule {
    rule(chain, [nfproto(NFPROTO_IPV6), vec![ret()]])
}

fn nfproto(proto: u8) -> Vec<Expr> {
    vec![
        Expr::Meta {
            key: MetaKey::NfProto,
            dreg: REG_1,
        },
        Expr::Cmp {
            sreg: REG_1,
            op: CmpOp::Eq,
            data: vec![proto],
        },
    ]
}

/// `tcp dport FIRST-LAST` (the chains' rules after the first see TCP only).
fn dport(range: PortRange) -> Vec<Expr> {
    let mut exprs = vec![Expr::Payload {
        base: PayloadBase::Transport,
        offset: 2,
        len: 2,
        dreg: REG_1,
    }];
    let cmp = |op, port: u16| Expr::Cmp {
        sreg: REG_1,
        op,
        data: port.to_be_bytes().to_vec(),
    };
    if range.first == range.last {
        exprs.push(cmp(CmpOp::Eq, range.first));
    } else {
        exprs.push(cmp(CmpOp::Gte, range.first));
        exprs.push(cmp(CmpOp::Lte, range.last));
    }
    exprs
}

/// `meta skuid ID` / `meta skgid ID`: the socket's owner as the pod's user namespace sees it,
/// as iptables' `owner` match compares it.
fn owner(key: MetaKey, id: u32) -> Vec<Expr> {
    vec![
        Expr::Meta { key, dreg: REG_1 },
        Expr::Cmp {
            sreg: REG_1,
            op: CmpOp::Eq,
            data: id.to_ne_bytes().to_vec(),
        },
    ]
}

/// `oifname "lo"` (iptables' `-o lo`).
fn oifname_lo() -> Vec<Expr> {
    let mut name = vec![0u8; 16];
    name[..2].copy_from_slice(b"lo");
    vec![
        Expr::Meta {
            key: MetaKey::OifName,
            dreg: REG_1,
        },
        Expr::Cmp {
            sreg: REG_1,
            op: CmpOp::Eq,
            data: name,
        },
    ]
}

enum Side {
    Source,
    Destination,
}

/// `ip saddr CIDR` / `ip6 daddr CIDR` ...: the family first, then the masked address.
fn address(side: Side, cidr: &Cidr) -> Vec<Expr> {
    let (proto, offset, bytes) = match (cidr.addr, side) {
        (IpAddr::V4(a), Side::Source) => (NFPROTO_IPV4, 12, a.octets().to_vec()),
        (IpAddr::V4(a), Side::Destination) => (NFPROTO_IPV4, 16, a.octets().to_vec()),
        (IpAddr::V6(a), Side::Source) => (NFPROTO_IPV6, 8, a.octets().to_vec()),
        (IpAddr::V6(a), Side::Destination) => (NFPROTO_IPV6, 24, a.octets().to_vec()),
    };
    let mask = prefix_mask(bytes.len(), cidr.prefix);
    let network: Vec<u8> = bytes.iter().zip(&mask).map(|(b, m)| b & m).collect();
    let mut exprs = nfproto(proto);
    exprs.push(Expr::Payload {
        base: PayloadBase::Network,
        offset,
        len: bytes.len() as u32,
        dreg: REG_1,
    });
    if mask.iter().any(|m| *m != 0xff) {
        exprs.push(Expr::Bitwise {
            sreg: REG_1,
            dreg: REG_1,
            xor: vec![0; mask.len()],
            mask,
        });
    }
    exprs.push(Expr::Cmp {
        sreg: REG_1,
        op: CmpOp::Eq,
        data: network,
    });
    exprs
}

fn prefix_mask(len: usize, prefix: u8) -> Vec<u8> {
    (0..len)
        .map(|i| {
            let bits = usize::from(prefix).saturating_sub(i * 8).min(8);
            match bits {
                0 => 0,
                n => 0xffu8 << (8 - n),
            }
        })
        .collect()
}

/// `redirect to :PORT`.
fn redirect(port: u16) -> Vec<Expr> {
    vec![
        Expr::Immediate {
            dreg: REG_1,
            data: port.to_be_bytes().to_vec(),
        },
        Expr::Redir { port_reg: REG_1 },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(rule: &Rule) -> Vec<&'static str> {
        rule.exprs.iter().map(Expr::name).collect()
    }

    #[test]
    fn defaults_are_proxy_inits_rules() {
        let rules = rules(&LinkerdConfig::default());
        let described: Vec<(&str, Vec<&str>)> = rules.iter().map(|r| (r.chain, names(r))).collect();
        let ret = "immediate";
        let expected = vec![
            (REDIRECT_CHAIN, vec!["meta", "cmp", ret]),
            (REDIRECT_CHAIN, vec!["meta", "cmp", ret]),
            // 4190-4191, merged.
            (REDIRECT_CHAIN, vec!["payload", "cmp", "cmp", ret]),
            (REDIRECT_CHAIN, vec!["immediate", "redir"]),
            (OUTPUT_CHAIN, vec!["meta", "cmp", ret]),
            (OUTPUT_CHAIN, vec!["meta", "cmp", ret]),
            (OUTPUT_CHAIN, vec!["meta", "cmp", ret]),
            (OUTPUT_CHAIN, vec!["meta", "cmp", ret]),
            (OUTPUT_CHAIN, vec!["immediate", "redir"]),
        ];
        assert_eq!(described, expected);
        // The UID exemption compares 2102 in host order; the redirects carry the ports in
        // network order.
        assert!(rules[6].exprs.contains(&Expr::Cmp {
            sreg: REG_1,
            op: CmpOp::Eq,
            data: 2102u32.to_ne_bytes().to_vec()
        }));
        assert_eq!(
            rules[3].exprs[0],
            Expr::Immediate {
                dreg: REG_1,
                data: vec![0x10, 0x2f]
            }
        );
        assert_eq!(
            rules[8].exprs[0],
            Expr::Immediate {
                dreg: REG_1,
                data: vec![0x10, 0x2c]
            }
        );
    }

    #[test]
    fn overrides_add_their_rules() {
        let config = LinkerdConfig {
            ipv6: true,
            proxy_uid: 0,
            proxy_gid: 7,
            ports_to_redirect: vec![
                PortRange::single(80),
                PortRange {
                    first: 90,
                    last: 99,
                },
            ],
            outbound_ports_to_ignore: vec![PortRange::single(5432)],
            subnets_to_ignore: vec![Cidr {
                addr: "10.1.2.3".parse().unwrap(),
                prefix: 16,
            }],
            outbound_subnets_to_ignore: vec![Cidr::host("fd00::1".parse().unwrap())],
            ..LinkerdConfig::default()
        };
        let rules = rules(&config);
        let inbound: Vec<_> = rules.iter().filter(|r| r.chain == REDIRECT_CHAIN).collect();
        // not-TCP, ignored ports, the subnet, two redirects (no IPv6 return).
        assert_eq!(inbound.len(), 5);
        assert_eq!(
            names(inbound[2]),
            ["meta", "cmp", "payload", "bitwise", "cmp", "immediate"]
        );
        // 10.1.2.3/16: network 10.1.0.0 at the source's offset.
        assert!(inbound[2].exprs.contains(&Expr::Cmp {
            sreg: REG_1,
            op: CmpOp::Eq,
            data: vec![10, 1, 0, 0]
        }));
        assert_eq!(names(inbound[3]), ["payload", "cmp", "immediate", "redir"]);
        assert_eq!(
            names(inbound[4]),
            ["payload", "cmp", "cmp", "immediate", "redir"]
        );
        let outbound: Vec<_> = rules.iter().filter(|r| r.chain == OUTPUT_CHAIN).collect();
        // not-TCP, GID (no UID: 0 is none), lo, 5432, the host route (no mask), redirect.
        assert_eq!(outbound.len(), 6);
        assert_eq!(
            names(outbound[4]),
            ["meta", "cmp", "payload", "cmp", "immediate"]
        );
        assert!(outbound[4].exprs.contains(&Expr::Payload {
            base: PayloadBase::Network,
            offset: 24,
            len: 16,
            dreg: REG_1
        }));
    }

    #[test]
    fn masks() {
        assert_eq!(prefix_mask(4, 0), [0, 0, 0, 0]);
        assert_eq!(prefix_mask(4, 12), [0xff, 0xf0, 0, 0]);
        assert_eq!(prefix_mask(4, 32), [0xff; 4]);
        assert_eq!(prefix_mask(16, 64)[7..9], [0xff, 0]);
    }
}
