//! The kernel's numbers, each defined once in the workspace: `bpf(2)` commands, map and link
//! types, attach and query flags, helper ids and instruction opcodes (include/uapi/linux/bpf.h),
//! the socket options and ioctls the agent, the plugin and the tests use.
//!
//! Two kinds of numbers live in `linkerd-cni-common` instead and are re-exported here, because
//! the eBPF programs need them too and cannot depend on this (std) crate: each hook's program
//! and attach types (`Hook::row` in `names.rs`, a hook's facts in one row) and the
//! original-destination socket option the `cgroup/getsockopt` program answers
//! ([`SO_ORIGINAL_DST`] and its levels). `xtask/tests/kernel_numbers.rs` fails on a second
//! definition of any of them, or on a `bpf(2)` call outside [`crate::bpf`].

pub use linkerd_cni_common::{IP6T_SO_ORIGINAL_DST, SO_ORIGINAL_DST, SOL_IP, SOL_IPV6};

/// A `bpf(2)` command (`enum bpf_cmd`).
pub type Cmd = libc::c_long;

pub const BPF_MAP_CREATE: Cmd = 0;
pub const BPF_MAP_LOOKUP_ELEM: Cmd = 1;
pub const BPF_MAP_UPDATE_ELEM: Cmd = 2;
pub const BPF_MAP_DELETE_ELEM: Cmd = 3;
pub const BPF_MAP_GET_NEXT_KEY: Cmd = 4;
pub const BPF_PROG_LOAD: Cmd = 5;
pub const BPF_OBJ_PIN: Cmd = 6;
pub const BPF_OBJ_GET: Cmd = 7;
pub const BPF_PROG_ATTACH: Cmd = 8;
pub const BPF_PROG_DETACH: Cmd = 9;
pub const BPF_PROG_GET_FD_BY_ID: Cmd = 13;
pub const BPF_OBJ_GET_INFO_BY_FD: Cmd = 15;
pub const BPF_PROG_QUERY: Cmd = 16;
pub const BPF_BTF_LOAD: Cmd = 18;
pub const BPF_BTF_GET_FD_BY_ID: Cmd = 19;
pub const BPF_MAP_LOOKUP_BATCH: Cmd = 24;
pub const BPF_LINK_CREATE: Cmd = 28;
pub const BPF_LINK_UPDATE: Cmd = 29;
pub const BPF_ITER_CREATE: Cmd = 33;
pub const BPF_LINK_DETACH: Cmd = 34;

/// `BPF_MAP_TYPE_HASH`.
pub const MAP_TYPE_HASH: u32 = 1;
/// `BPF_MAP_TYPE_ARRAY`.
pub const MAP_TYPE_ARRAY: u32 = 2;
/// `BPF_MAP_TYPE_PROG_ARRAY`.
pub const MAP_TYPE_PROG_ARRAY: u32 = 3;
/// `BPF_MAP_TYPE_PERCPU_HASH`.
pub const MAP_TYPE_PERCPU_HASH: u32 = 5;
/// `BPF_MAP_TYPE_PERCPU_ARRAY`.
pub const MAP_TYPE_PERCPU_ARRAY: u32 = 6;
/// `BPF_MAP_TYPE_LRU_HASH`.
pub const MAP_TYPE_LRU_HASH: u32 = 9;
/// `BPF_MAP_TYPE_LRU_PERCPU_HASH`.
pub const MAP_TYPE_LRU_PERCPU_HASH: u32 = 10;
/// `BPF_MAP_TYPE_SOCKMAP`.
pub const MAP_TYPE_SOCKMAP: u32 = 15;
/// `BPF_MAP_TYPE_SOCKHASH`.
pub const MAP_TYPE_SOCKHASH: u32 = 18;
/// `BPF_MAP_TYPE_SK_STORAGE`.
pub const MAP_TYPE_SK_STORAGE: u32 = 24;

/// `BPF_LINK_TYPE_CGROUP`.
pub const LINK_TYPE_CGROUP: u32 = 3;
/// `BPF_LINK_TYPE_NETNS`.
pub const LINK_TYPE_NETNS: u32 = 5;

/// `BPF_ANY`: a map update creates or replaces.
pub const BPF_ANY: u64 = 0;
/// `BPF_NOEXIST`: a map update only creates.
pub const BPF_NOEXIST: u64 = 1;

/// `BPF_F_ALLOW_OVERRIDE`: a descendant may attach its own program, which replaces this one
/// for the descendant's sockets.
pub const F_ALLOW_OVERRIDE: u32 = 1;
/// `BPF_F_ALLOW_MULTI`: a program list; descendants' programs run first, then these.
pub const F_ALLOW_MULTI: u32 = 2;
/// `BPF_F_BEFORE`: ordered before a relative program or link (first when none is named).
pub const F_BEFORE: u32 = 1 << 3;
/// `BPF_F_PREORDER` (6.15): runs before the programs of descendants, top-down.
pub const F_PREORDER: u32 = 1 << 6;
/// `BPF_F_QUERY_EFFECTIVE`.
pub const F_QUERY_EFFECTIVE: u32 = 1;

/// `BPF_PSEUDO_MAP_FD`: the source register of an `ld_imm64` whose immediate is a map fd.
pub const BPF_PSEUDO_MAP_FD: u8 = 1;
/// `BPF_FUNC_map_lookup_elem`.
pub const BPF_FUNC_MAP_LOOKUP_ELEM: i32 = 1;
/// `BPF_FUNC_tail_call`.
pub const BPF_FUNC_TAIL_CALL: i32 = 12;
/// `BPF_FUNC_get_netns_cookie`.
pub const BPF_FUNC_GET_NETNS_COOKIE: i32 = 122;
/// `SK_DROP`: an `sk_lookup` program's refusal.
pub const SK_DROP: i32 = 0;

/// `BPF_ALU64 | BPF_MOV | BPF_K`.
pub const BPF_MOV64_IMM: u8 = 0xb7;
/// `BPF_ALU64 | BPF_MOV | BPF_X`.
pub const BPF_MOV64_REG: u8 = 0xbf;
/// `BPF_ALU64 | BPF_ADD | BPF_K`.
pub const BPF_ADD64_IMM: u8 = 0x07;
/// `BPF_ALU64 | BPF_XOR | BPF_X`.
pub const BPF_XOR64_REG: u8 = 0xaf;
/// `BPF_LD | BPF_IMM | BPF_DW`: `ld_imm64`, two instructions.
pub const BPF_LD_IMM64: u8 = 0x18;
/// `BPF_LDX | BPF_MEM | BPF_W`.
pub const BPF_LDX_MEM_W: u8 = 0x61;
/// `BPF_ST | BPF_MEM | BPF_W`.
pub const BPF_ST_MEM_W: u8 = 0x62;
/// `BPF_STX | BPF_MEM | BPF_DW`.
pub const BPF_STX_MEM_DW: u8 = 0x7b;
/// `BPF_JMP | BPF_JEQ | BPF_K`.
pub const BPF_JEQ_IMM: u8 = 0x15;
/// `BPF_JMP | BPF_CALL`.
pub const BPF_CALL: u8 = 0x85;
/// `BPF_JMP | BPF_EXIT`.
pub const BPF_EXIT: u8 = 0x95;

/// `offsetof(struct bpf_sk_lookup, family)`.
pub const SK_LOOKUP_FAMILY: i16 = 8;
/// `offsetof(struct bpf_sk_lookup, ingress_ifindex)`.
pub const SK_LOOKUP_INGRESS_IFINDEX: i16 = 64;

/// Netlink header flags (`NLM_F_*`).
pub const NLM_F_REQUEST: u16 = 0x1;
pub const NLM_F_ACK: u16 = 0x4;
pub const NLM_F_DUMP: u16 = 0x300;
pub const NLM_F_EXCL: u16 = 0x200;
pub const NLM_F_CREATE: u16 = 0x400;
pub const NLM_F_APPEND: u16 = 0x800;
/// `NLA_F_NESTED`: set on nested attributes.
pub const NLA_F_NESTED: u16 = 0x8000;
/// `struct nlmsghdr`'s length.
pub const NLMSG_HDRLEN: usize = 16;
/// `struct nfgenmsg`'s length.
pub const NFGENMSG_LEN: usize = 4;
pub const NLMSG_ERROR: u16 = 2;
pub const NLMSG_DONE: u16 = 3;
/// `NFTA_CHAIN_TABLE`, `NFTA_CHAIN_NAME` (`enum nft_chain_attributes`).
pub const NFTA_CHAIN_TABLE: u16 = 1;
pub const NFTA_CHAIN_NAME: u16 = 3;

/// `SO_NETNS_COOKIE` (asm-generic, as x86_64 and arm64 use; not in every libc release yet):
/// a socket's network namespace cookie, 5.14.
pub const SO_NETNS_COOKIE: libc::c_int = 71;
/// `SIOCGSKNS`: a descriptor of a socket's network namespace (`CAP_NET_ADMIN` over it).
pub const SIOCGSKNS: libc::c_ulong = 0x894c;
/// `NS_GET_USERNS`: `_IO(0xb7, 0x1)`, the user namespace that owns a namespace.
pub const NS_GET_USERNS: libc::c_ulong = 0xb701;
/// `NS_GET_NSTYPE`: `_IO(0xb7, 0x3)`, the `CLONE_NEW*` type of a namespace file.
pub const NS_GET_NSTYPE: libc::c_ulong = 0xb703;
/// `NSFS_MAGIC`: the filesystem of `/proc/<pid>/ns/*` and their bind mounts.
pub const NSFS_MAGIC: i64 = 0x6e73_6673;

/// `BTF_MAGIC`: the first two bytes of raw BTF (`struct btf_header`, include/uapi/linux/btf.h).
pub const BTF_MAGIC: u16 = 0xeb9f;
/// A BTF type's kind (`BTF_KIND_*`, bits 24-28 of `btf_type.info`).
pub type BtfKind = u32;
pub const BTF_KIND_INT: BtfKind = 1;
pub const BTF_KIND_PTR: BtfKind = 2;
pub const BTF_KIND_ARRAY: BtfKind = 3;
pub const BTF_KIND_STRUCT: BtfKind = 4;
pub const BTF_KIND_UNION: BtfKind = 5;
pub const BTF_KIND_ENUM: BtfKind = 6;
pub const BTF_KIND_TYPEDEF: BtfKind = 8;
pub const BTF_KIND_VOLATILE: BtfKind = 9;
pub const BTF_KIND_CONST: BtfKind = 10;
pub const BTF_KIND_RESTRICT: BtfKind = 11;
pub const BTF_KIND_FUNC: BtfKind = 12;
pub const BTF_KIND_FUNC_PROTO: BtfKind = 13;
pub const BTF_KIND_VAR: BtfKind = 14;
pub const BTF_KIND_DATASEC: BtfKind = 15;
pub const BTF_KIND_DECL_TAG: BtfKind = 17;
pub const BTF_KIND_TYPE_TAG: BtfKind = 18;
pub const BTF_KIND_ENUM64: BtfKind = 19;
/// The last kind this reader knows (`BTF_KIND_MAX` of the 6.x headers).
pub const BTF_KIND_MAX: BtfKind = BTF_KIND_ENUM64;

/// How many bytes follow a `struct btf_type` of `kind` with `vlen` members (btf.h); `None` for
/// a kind newer than [`BTF_KIND_MAX`], whose size cannot be known.
pub const fn btf_type_trailer(kind: BtfKind, vlen: usize) -> Option<usize> {
    Some(match kind {
        BTF_KIND_INT | BTF_KIND_VAR | BTF_KIND_DECL_TAG => 4,
        BTF_KIND_ARRAY => 12,
        BTF_KIND_STRUCT | BTF_KIND_UNION | BTF_KIND_DATASEC | BTF_KIND_ENUM64 => 12 * vlen,
        BTF_KIND_ENUM | BTF_KIND_FUNC_PROTO => 8 * vlen,
        // PTR, FWD, TYPEDEF, the qualifiers, FUNC, FLOAT, TYPE_TAG: nothing.
        0..=BTF_KIND_MAX => 0,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The numbers libc also has are libc's: ours are for the targets and libc releases that
    /// lack them, never a different value.
    #[test]
    fn the_numbers_libc_has_agree_with_libc() {
        assert_eq!(SO_ORIGINAL_DST, libc::SO_ORIGINAL_DST);
        assert_eq!(IP6T_SO_ORIGINAL_DST, libc::IP6T_SO_ORIGINAL_DST);
        assert_eq!(SOL_IP, libc::SOL_IP);
        assert_eq!(SOL_IPV6, libc::SOL_IPV6);
        assert_eq!(SIOCGSKNS, libc::SIOCGSKNS);
        assert_eq!(NS_GET_USERNS, libc::NS_GET_USERNS as libc::c_ulong);
        assert_eq!(NS_GET_NSTYPE, libc::NS_GET_NSTYPE as libc::c_ulong);
    }
}
