//! The nf_tables netlink messages the fallback needs, encoded and decoded by hand: a batch
//! (`NFNL_MSG_BATCH_BEGIN` ... `NFNL_MSG_BATCH_END`) of `NEWTABLE`, `NEWCHAIN`, `NEWRULE` and
//! `DELTABLE` messages, rules made of the few expressions Linkerd's rules use (`meta`, `cmp`,
//! `payload`, `bitwise`, `immediate`, `redir`), and the `GET*` dumps that read a table back.
//!
//! Values are laid out as `include/uapi/linux/netfilter/nf_tables.h` says: attribute numbers
//! and expression data in network byte order where the kernel reads them with `ntohl`, a
//! register's contents as the packet or the socket holds them. Why this module and no crate:
//! [`docs/design/nftables.md`](../../../docs/design/nftables.md).

use std::fmt;

/// `NFNL_SUBSYS_NFTABLES`: the high byte of every nf_tables message type.
pub const SUBSYS_NFTABLES: u16 = 10;
/// `NFNL_MSG_BATCH_BEGIN`, `NFNL_MSG_BATCH_END`.
const MSG_BATCH_BEGIN: u16 = 0x10;
const MSG_BATCH_END: u16 = 0x11;

/// `NFT_MSG_*`: the nf_tables message kinds used here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum MsgKind {
    NewTable = 0,
    GetTable = 1,
    DelTable = 2,
    NewChain = 3,
    GetChain = 4,
    NewRule = 6,
    GetRule = 7,
}

impl MsgKind {
    /// The netlink message type: subsystem in the high byte.
    pub fn nlmsg_type(self) -> u16 {
        (SUBSYS_NFTABLES << 8) | self as u16
    }
}

/// `NFPROTO_INET`: one table for IPv4 and IPv6.
pub const NFPROTO_INET: u8 = 1;
/// `NFPROTO_IPV4`, `NFPROTO_IPV6`: the values of `meta nfproto`.
pub const NFPROTO_IPV4: u8 = 2;
pub const NFPROTO_IPV6: u8 = 10;

pub use linkerd_cni_sys::uapi::{
    NFGENMSG_LEN, NLM_F_ACK, NLM_F_APPEND, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST,
    NLMSG_DONE, NLMSG_ERROR, NLMSG_HDRLEN,
};
/// Netlink header flags, message types and lengths (`NLA_F_NESTED` is set on nested
/// attributes, as libnftnl does).
use linkerd_cni_sys::uapi::{NFTA_CHAIN_NAME, NFTA_CHAIN_TABLE, NLA_F_NESTED};

// Attributes (`enum nft_*_attributes`).
const NFTA_TABLE_NAME: u16 = 1;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_POLICY: u16 = 5;
const NFTA_CHAIN_TYPE: u16 = 7;
const NFTA_HOOK_HOOKNUM: u16 = 1;
const NFTA_HOOK_PRIORITY: u16 = 2;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;

/// `NF_ACCEPT`, a base chain's policy.
const NF_ACCEPT: u32 = 1;
/// `NFT_REG_VERDICT`, `NFT_REG_1`: the verdict register and the first 16-byte data register.
pub const REG_VERDICT: u32 = 0;
pub const REG_1: u32 = 1;

/// Netfilter hooks of the inet family (`enum nf_inet_hooks`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Hook {
    Prerouting = 0,
    Output = 3,
}

/// `NF_IP_PRI_NAT_DST`: where `iptables -t nat` PREROUTING and OUTPUT run (`dstnat`).
pub const PRIORITY_DSTNAT: i32 = -100;

/// `enum nft_meta_keys`: what a `meta` expression loads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum MetaKey {
    /// The output interface's name (16 bytes, zero padded).
    OifName = 7,
    /// The socket owner's UID, as the netns's user namespace sees it (4 bytes, host order).
    SkUid = 10,
    /// The socket owner's GID.
    SkGid = 11,
    /// `NFPROTO_IPV4` or `NFPROTO_IPV6` (1 byte).
    NfProto = 15,
    /// The transport protocol (1 byte, `IPPROTO_TCP` = 6).
    L4Proto = 16,
}

/// `enum nft_cmp_ops`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum CmpOp {
    Eq = 0,
    Neq = 1,
    Gte = 5,
    Lte = 3,
}

/// `enum nft_payload_bases`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum PayloadBase {
    Network = 1,
    Transport = 2,
}

/// `NFT_RETURN`: leave the chain (in a base chain: its policy, accept).
pub const VERDICT_RETURN: i32 = -5;

/// One expression of a rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expr {
    /// Load `key` into `dreg`.
    Meta { key: MetaKey, dreg: u32 },
    /// Compare `sreg` with `data`; the rule stops here when it does not hold.
    Cmp { sreg: u32, op: CmpOp, data: Vec<u8> },
    /// Load `len` bytes at `offset` of the `base` header into `dreg`.
    Payload {
        base: PayloadBase,
        offset: u32,
        len: u32,
        dreg: u32,
    },
    /// `dreg = (sreg & mask) ^ xor`.
    Bitwise {
        sreg: u32,
        dreg: u32,
        mask: Vec<u8>,
        xor: Vec<u8>,
    },
    /// A verdict (`NFT_RETURN`, ...) into the verdict register.
    Verdict(i32),
    /// `data` into `dreg`.
    Immediate { dreg: u32, data: Vec<u8> },
    /// Redirect to this host (the netns's loopback for locally made packets, the receiving
    /// interface's first address otherwise), the port in `port_reg` (2 bytes, network order).
    Redir { port_reg: u32 },
}

impl Expr {
    /// The expression's kernel name (`NFTA_EXPR_NAME`).
    pub fn name(&self) -> &'static str {
        match self {
            Self::Meta { .. } => "meta",
            Self::Cmp { .. } => "cmp",
            Self::Payload { .. } => "payload",
            Self::Bitwise { .. } => "bitwise",
            Self::Verdict(_) | Self::Immediate { .. } => "immediate",
            Self::Redir { .. } => "redir",
        }
    }

    /// Writes `NFTA_EXPR_DATA`'s attributes.
    fn encode_data(&self, b: &mut Vec<u8>) {
        match self {
            Self::Meta { key, dreg } => {
                attr_u32(b, 1, *dreg); // NFTA_META_DREG
                attr_u32(b, 2, *key as u32); // NFTA_META_KEY
            }
            Self::Cmp { sreg, op, data } => {
                attr_u32(b, 1, *sreg); // NFTA_CMP_SREG
                attr_u32(b, 2, *op as u32); // NFTA_CMP_OP
                nest(b, 3, |b| attr(b, NFTA_DATA_VALUE, data)); // NFTA_CMP_DATA
            }
            Self::Payload {
                base,
                offset,
                len,
                dreg,
            } => {
                attr_u32(b, 1, *dreg); // NFTA_PAYLOAD_DREG
                attr_u32(b, 2, *base as u32); // NFTA_PAYLOAD_BASE
                attr_u32(b, 3, *offset); // NFTA_PAYLOAD_OFFSET
                attr_u32(b, 4, *len); // NFTA_PAYLOAD_LEN
            }
            Self::Bitwise {
                sreg,
                dreg,
                mask,
                xor,
            } => {
                attr_u32(b, 1, *sreg); // NFTA_BITWISE_SREG
                attr_u32(b, 2, *dreg); // NFTA_BITWISE_DREG
                attr_u32(b, 3, mask.len() as u32); // NFTA_BITWISE_LEN
                nest(b, 4, |b| attr(b, NFTA_DATA_VALUE, mask)); // NFTA_BITWISE_MASK
                nest(b, 5, |b| attr(b, NFTA_DATA_VALUE, xor)); // NFTA_BITWISE_XOR
            }
            Self::Verdict(code) => {
                attr_u32(b, 1, REG_VERDICT); // NFTA_IMMEDIATE_DREG
                nest(b, 2, |b| {
                    // NFTA_IMMEDIATE_DATA
                    nest(b, NFTA_DATA_VERDICT, |b| {
                        attr(b, NFTA_VERDICT_CODE, &code.to_be_bytes());
                    });
                });
            }
            Self::Immediate { dreg, data } => {
                attr_u32(b, 1, *dreg);
                nest(b, 2, |b| attr(b, NFTA_DATA_VALUE, data));
            }
            Self::Redir { port_reg } => {
                attr_u32(b, 1, *port_reg); // NFTA_REDIR_REG_PROTO_MIN
            }
        }
    }
}

/// A rule: the chain it is appended to and its expressions, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub chain: &'static str,
    pub exprs: Vec<Expr>,
}

/// A base chain of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chain {
    pub name: &'static str,
    pub hook: Hook,
    pub priority: i32,
}

/// Netlink messages sent together, applied by the kernel all or nothing.
pub struct Batch {
    buf: Vec<u8>,
    /// The first message's sequence number, and the next one's.
    first: u32,
    seq: u32,
    /// Messages that ask for an acknowledgement (all but begin and end).
    acked: usize,
}

impl Batch {
    /// A batch whose messages are numbered from `seq`.
    pub fn new(seq: u32) -> Self {
        let mut batch = Self {
            buf: Vec::with_capacity(4096),
            first: seq,
            seq,
            acked: 0,
        };
        batch.header(MSG_BATCH_BEGIN, 0, NLM_F_REQUEST, |_| {});
        batch
    }

    /// The sequence number of the first message (the batch's begin).
    pub fn first_seq(&self) -> u32 {
        self.first
    }

    /// How many acknowledgements the kernel sends for this batch when all goes well.
    pub fn acks(&self) -> usize {
        self.acked
    }

    /// One message with the `nfgenmsg` header for `family`, its attributes written by `body`.
    fn header(&mut self, ty: u16, family: u8, flags: u16, body: impl FnOnce(&mut Vec<u8>)) {
        let start = self.buf.len();
        self.buf.extend_from_slice(&[0; 4]); // length, below
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(&flags.to_ne_bytes());
        let seq = self.seq;
        self.seq = self.seq.wrapping_add(1);
        self.buf.extend_from_slice(&seq.to_ne_bytes());
        self.buf.extend_from_slice(&0u32.to_ne_bytes()); // port: the kernel fills it in
        // nfgenmsg: family, version NFNETLINK_V0, resource id (the subsystem for a batch).
        let res_id = if ty == MSG_BATCH_BEGIN || ty == MSG_BATCH_END {
            SUBSYS_NFTABLES
        } else {
            0
        };
        self.buf.push(family);
        self.buf.push(0);
        self.buf.extend_from_slice(&res_id.to_be_bytes());
        body(&mut self.buf);
        let len = (self.buf.len() - start) as u32;
        self.buf[start..start + 4].copy_from_slice(&len.to_ne_bytes());
        if flags & NLM_F_ACK != 0 {
            self.acked += 1;
        }
    }

    /// `NFT_MSG_NEWTABLE`: the table, created if missing (kept as it is otherwise).
    pub fn new_table(&mut self, family: u8, table: &str) {
        self.header(
            MsgKind::NewTable.nlmsg_type(),
            family,
            NLM_F_REQUEST | NLM_F_CREATE | NLM_F_ACK,
            |b| attr_str(b, NFTA_TABLE_NAME, table),
        );
    }

    /// `NFT_MSG_DELTABLE`: the table with its chains and rules.
    pub fn del_table(&mut self, family: u8, table: &str) {
        self.header(
            MsgKind::DelTable.nlmsg_type(),
            family,
            NLM_F_REQUEST | NLM_F_ACK,
            |b| attr_str(b, NFTA_TABLE_NAME, table),
        );
    }

    /// `NFT_MSG_NEWCHAIN`: a `nat` base chain with policy accept. `NLM_F_EXCL`: a chain of
    /// that name already there fails the batch (the table is always deleted first).
    pub fn new_nat_chain(&mut self, family: u8, table: &str, chain: &Chain) {
        self.header(
            MsgKind::NewChain.nlmsg_type(),
            family,
            NLM_F_REQUEST | NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK,
            |b| {
                attr_str(b, NFTA_CHAIN_TABLE, table);
                attr_str(b, NFTA_CHAIN_NAME, chain.name);
                nest(b, NFTA_CHAIN_HOOK, |b| {
                    attr_u32(b, NFTA_HOOK_HOOKNUM, chain.hook as u32);
                    attr(b, NFTA_HOOK_PRIORITY, &chain.priority.to_be_bytes());
                });
                attr_u32(b, NFTA_CHAIN_POLICY, NF_ACCEPT);
                attr_str(b, NFTA_CHAIN_TYPE, "nat");
            },
        );
    }

    /// `NFT_MSG_NEWRULE`: `rule` appended to its chain.
    pub fn new_rule(&mut self, family: u8, table: &str, rule: &Rule) {
        self.header(
            MsgKind::NewRule.nlmsg_type(),
            family,
            NLM_F_REQUEST | NLM_F_CREATE | NLM_F_APPEND | NLM_F_ACK,
            |b| {
                attr_str(b, NFTA_RULE_TABLE, table);
                attr_str(b, NFTA_RULE_CHAIN, rule.chain);
                nest(b, NFTA_RULE_EXPRESSIONS, |b| {
                    for expr in &rule.exprs {
                        nest(b, NFTA_LIST_ELEM, |b| {
                            attr_str(b, NFTA_EXPR_NAME, expr.name());
                            nest(b, NFTA_EXPR_DATA, |b| expr.encode_data(b));
                        });
                    }
                });
            },
        );
    }

    /// The batch's bytes, closed with `NFNL_MSG_BATCH_END`.
    pub fn finish(mut self) -> Vec<u8> {
        self.header(MSG_BATCH_END, 0, NLM_F_REQUEST, |_| {});
        self.buf
    }
}

/// A `GET*` dump request of every object of `kind` in `family`.
pub fn dump_request(kind: MsgKind, family: u8, seq: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(NLMSG_HDRLEN + NFGENMSG_LEN);
    let len = (NLMSG_HDRLEN + NFGENMSG_LEN) as u32;
    b.extend_from_slice(&len.to_ne_bytes());
    b.extend_from_slice(&kind.nlmsg_type().to_ne_bytes());
    b.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    b.extend_from_slice(&seq.to_ne_bytes());
    b.extend_from_slice(&0u32.to_ne_bytes());
    b.extend_from_slice(&[family, 0, 0, 0]);
    b
}

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

fn attr(b: &mut Vec<u8>, ty: u16, payload: &[u8]) {
    let len = 4 + payload.len();
    b.extend_from_slice(&(len as u16).to_ne_bytes());
    b.extend_from_slice(&ty.to_ne_bytes());
    b.extend_from_slice(payload);
    b.resize(b.len() + align4(len) - len, 0);
}

/// A u32 attribute, in network order (the kernel reads them with `ntohl`).
fn attr_u32(b: &mut Vec<u8>, ty: u16, v: u32) {
    attr(b, ty, &v.to_be_bytes());
}

/// A NUL-terminated string attribute.
fn attr_str(b: &mut Vec<u8>, ty: u16, s: &str) {
    let mut v = Vec::with_capacity(s.len() + 1);
    v.extend_from_slice(s.as_bytes());
    v.push(0);
    attr(b, ty, &v);
}

fn nest(b: &mut Vec<u8>, ty: u16, body: impl FnOnce(&mut Vec<u8>)) {
    let start = b.len();
    b.extend_from_slice(&[0; 2]);
    b.extend_from_slice(&(ty | NLA_F_NESTED).to_ne_bytes());
    body(b);
    let len = (b.len() - start) as u16;
    b[start..start + 2].copy_from_slice(&len.to_ne_bytes());
}

/// One message of a reply: its type, flags, sequence number and payload after the header.
pub struct Reply<'a> {
    pub ty: u16,
    pub seq: u32,
    pub payload: &'a [u8],
}

/// The messages of one datagram; a truncated message ends the walk.
pub fn replies(mut data: &[u8]) -> Vec<Reply<'_>> {
    let mut out = Vec::new();
    while data.len() >= NLMSG_HDRLEN {
        let len = u32::from_ne_bytes([data[0], data[1], data[2], data[3]]) as usize;
        if len < NLMSG_HDRLEN || len > data.len() {
            break;
        }
        out.push(Reply {
            ty: u16::from_ne_bytes([data[4], data[5]]),
            seq: u32::from_ne_bytes([data[8], data[9], data[10], data[11]]),
            payload: &data[NLMSG_HDRLEN..len],
        });
        data = &data[align4(len).min(data.len())..];
    }
    out
}

/// The errno of an `NLMSG_ERROR` payload (0: an acknowledgement).
pub fn error_code(payload: &[u8]) -> Option<i32> {
    Some(i32::from_ne_bytes(payload.get(..4)?.try_into().ok()?))
}

/// The attributes of `data` (type without flag bits, payload).
pub fn attrs(mut data: &[u8]) -> Vec<(u16, &[u8])> {
    let mut out = Vec::new();
    while data.len() >= 4 {
        let len = u16::from_ne_bytes([data[0], data[1]]) as usize;
        let ty = u16::from_ne_bytes([data[2], data[3]]) & 0x3fff;
        if len < 4 || len > data.len() {
            break;
        }
        out.push((ty, &data[4..len]));
        data = &data[align4(len).min(data.len())..];
    }
    out
}

/// A string attribute's value, without its NUL.
pub fn attr_string(v: &[u8]) -> String {
    let end = v.iter().position(|&c| c == 0).unwrap_or(v.len());
    String::from_utf8_lossy(&v[..end]).into_owned()
}

/// What a dump says about one object of a table, as read back from the kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Object {
    Table {
        name: String,
    },
    Chain {
        table: String,
        name: String,
    },
    /// A rule: its table, chain and expression names in order.
    Rule {
        table: String,
        chain: String,
        exprs: Vec<String>,
    },
}

impl fmt::Display for Object {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Table { name } => write!(f, "table {name}"),
            Self::Chain { table, name } => write!(f, "chain {table} {name}"),
            Self::Rule {
                table,
                chain,
                exprs,
            } => write!(f, "rule {table} {chain}: {}", exprs.join(" ")),
        }
    }
}

/// The object a dump message of `kind` describes (`payload` after the netlink header).
pub fn parse_object(kind: MsgKind, payload: &[u8]) -> Option<Object> {
    let attrs = attrs(payload.get(NFGENMSG_LEN..)?);
    let get = |ty: u16| {
        attrs
            .iter()
            .find(|(t, _)| *t == ty)
            .map(|(_, v)| attr_string(v))
    };
    match kind {
        MsgKind::GetTable => Some(Object::Table {
            name: get(NFTA_TABLE_NAME)?,
        }),
        MsgKind::GetChain => Some(Object::Chain {
            table: get(NFTA_CHAIN_TABLE)?,
            name: get(NFTA_CHAIN_NAME)?,
        }),
        MsgKind::GetRule => {
            let list = attrs
                .iter()
                .find(|(t, _)| *t == NFTA_RULE_EXPRESSIONS)
                .map(|(_, v)| *v)
                .unwrap_or_default();
            let exprs = self::attrs(list)
                .into_iter()
                .filter(|(t, _)| *t == NFTA_LIST_ELEM)
                .filter_map(|(_, elem)| {
                    self::attrs(elem)
                        .into_iter()
                        .find(|(t, _)| *t == NFTA_EXPR_NAME)
                        .map(|(_, v)| attr_string(v))
                })
                .collect();
            Some(Object::Rule {
                table: get(NFTA_RULE_TABLE)?,
                chain: get(NFTA_RULE_CHAIN)?,
                exprs,
            })
        }
        _ => None,
    }
}

/// The reply message type of a dump of `kind` (`GET*` is answered with `NEW*`).
pub fn reply_type(kind: MsgKind) -> u16 {
    (SUBSYS_NFTABLES << 8) | (kind as u16 - 1)
}

#[cfg(test)]
mod tests;
