//! Map keys and values shared by kernel and user side.

/// [`PodConfig::flags`]: sockets whose owner UID is `proxy_uid` are not redirected.
pub const FLAG_EXEMPT_UID: u32 = 1 << 0;
/// [`PodConfig::flags`]: sockets whose owner GID is `proxy_gid` are not redirected.
pub const FLAG_EXEMPT_GID: u32 = 1 << 1;
/// [`PodConfig::flags`]: redirect IPv6 destinations too (v4-mapped ones always are).
pub const FLAG_IPV6: u32 = 1 << 2;
/// [`PodConfig::flags`]: the pod has outbound ignored ports (skip the lookup otherwise).
pub const FLAG_OUT_PORTS: u32 = 1 << 3;
/// [`PodConfig::flags`]: the pod has outbound ignored subnets (skip the lookup otherwise).
pub const FLAG_OUT_SUBNETS: u32 = 1 << 4;

/// [`PodConfig::flags`]: the pod has inbound ignored ports.
pub const FLAG_IN_PORTS: u32 = 1 << 5;
/// [`PodConfig::flags`]: `ports-to-redirect` is non-empty: only those ports go to the proxy.
pub const FLAG_IN_REDIRECT_ONLY: u32 = 1 << 6;
/// [`PodConfig::flags`]: the pod has inbound ignored source subnets.
pub const FLAG_IN_SKIP_SOURCES: u32 = 1 << 7;

/// Per-pod redirection settings, keyed by the pod's netns cookie.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PodConfig {
    /// `FLAG_*` bits.
    pub flags: u32,
    /// Proxy UID, as the kernel reports it (host UID).
    pub proxy_uid: u32,
    /// Proxy GID (meaningful with [`FLAG_EXEMPT_GID`]).
    pub proxy_gid: u32,
    /// Outbound proxy port (host byte order), 4140 by default.
    pub outbound_port: u16,
    /// Inbound proxy port (host byte order), 4143 by default.
    pub inbound_port: u16,
}
const _: () = assert!(core::mem::size_of::<PodConfig>() == 16);

/// Which port set a [`PortSetKey`] belongs to.
pub const PORT_SET_OUTBOUND_SKIP: u16 = 1;
/// Inbound destination ports not redirected.
pub const PORT_SET_INBOUND_SKIP: u16 = 2;
/// Inbound destination ports redirected (when the list is non-empty).
pub const PORT_SET_INBOUND_REDIRECT: u16 = 3;

/// A block of 256 ports of one pod's port set: `block = port >> 8`.
///
/// A set is a sparse bitmap: lookup is one hash probe and a bit test whatever the number of
/// ranges, and a set holding every port costs 256 entries.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PortSetKey {
    pub netns_cookie: u64,
    /// `PORT_SET_*`.
    pub set: u16,
    /// `port >> 8`.
    pub block: u16,
    pub _pad: u32,
}
const _: () = assert!(core::mem::size_of::<PortSetKey>() == 16);

impl PortSetKey {
    pub const fn new(netns_cookie: u64, set: u16, port: u16) -> Self {
        Self {
            netns_cookie,
            set,
            block: port >> 8,
            _pad: 0,
        }
    }
}

/// 256 bits: bit `port & 0xff` set when the port is in the set.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortBlock {
    pub bits: [u64; 4],
}
const _: () = assert!(core::mem::size_of::<PortBlock>() == 32);

impl PortBlock {
    #[inline(always)]
    pub const fn contains(&self, port: u16) -> bool {
        let low = (port & 0xff) as usize;
        self.bits[low >> 6] & (1u64 << (low & 63)) != 0
    }

    #[inline(always)]
    pub fn insert(&mut self, port: u16) {
        let low = (port & 0xff) as usize;
        self.bits[low >> 6] |= 1u64 << (low & 63);
    }
}

/// Which address set an [`AddrKey`] belongs to.
pub const ADDR_OUTBOUND_SKIP_SUBNET: u32 = 1;
/// Sources whose inbound connections are not redirected (`subnets-to-ignore`).
pub const ADDR_INBOUND_SKIP_SOURCE: u32 = 2;

/// The data part of an LPM trie key: pod, set, then the address as IPv6 (IPv4 as
/// `::ffff:a.b.c.d`). The trie matches bits from the first byte on, so the prefix length of a
/// stored entry is `ADDR_KEY_FIXED_BITS + prefix` (IPv4 prefixes add 96).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AddrKey {
    pub netns_cookie: u64,
    /// `ADDR_*`, big-endian so the trie orders it like any other prefix byte.
    pub set_be: u32,
    /// Network byte order, IPv4 as v4-mapped IPv6.
    pub addr: [u8; 16],
    /// Never matched: the longest prefix ends before it.
    pub _pad: u32,
}
const _: () = assert!(core::mem::size_of::<AddrKey>() == 32);

/// Bits of [`AddrKey`] before the address: cookie and set always match exactly.
pub const ADDR_KEY_FIXED_BITS: u32 = 96;
/// Full prefix length of one exact IPv6 address.
pub const ADDR_KEY_FULL_BITS: u32 = ADDR_KEY_FIXED_BITS + 128;

/// `SOL_IP`: the level of `getsockopt(SO_ORIGINAL_DST)` on an IPv4 socket.
pub const SOL_IP: i32 = 0;
/// `SOL_IPV6`: the level of `getsockopt(IP6T_SO_ORIGINAL_DST)` on an IPv6 socket.
pub const SOL_IPV6: i32 = 41;
/// `SO_ORIGINAL_DST` (netfilter, `SOL_IP` level): the option the proxy asks and
/// `l5d_getsockopt` answers.
pub const SO_ORIGINAL_DST: i32 = 80;
/// `IP6T_SO_ORIGINAL_DST` (netfilter, `SOL_IPV6` level): the same number as
/// [`SO_ORIGINAL_DST`].
pub const IP6T_SO_ORIGINAL_DST: i32 = SO_ORIGINAL_DST;

/// `AF_INET`, as the kernel gives a socket's family to eBPF programs (`u32` fields).
pub const AF_INET: u32 = 2;
/// `AF_INET6`.
pub const AF_INET6: u32 = 10;
/// `IPPROTO_TCP`, as in `bpf_sock_addr.protocol` and `bpf_sk_lookup.protocol`.
pub const IPPROTO_TCP: u32 = 6;

/// An address family as stored in [`OrigDst::family`].
pub const FAMILY_V4: u16 = AF_INET as u16;
/// IPv6 (pure, not v4-mapped).
pub const FAMILY_V6: u16 = AF_INET6 as u16;

/// Where a redirected connection was originally going.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OrigDst {
    /// Network byte order words, as in `bpf_sock_addr.user_ip6`; IPv4 is v4-mapped
    /// (`addr[3]` holds it) and `family` says [`FAMILY_V4`].
    pub addr: [u32; 4],
    /// Network byte order.
    pub port_be: u16,
    /// [`FAMILY_V4`] or [`FAMILY_V6`].
    pub family: u16,
}
const _: () = assert!(core::mem::size_of::<OrigDst>() == 20);

/// The app side of a redirected connection as the proxy sees it from its accepted socket:
/// the peer (the app's local address and port) in the pod's netns.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnKey {
    pub netns_cookie: u64,
    /// App socket's local address, network byte order words, IPv4 v4-mapped.
    pub addr: [u32; 4],
    /// App socket's local port, host byte order.
    pub port: u32,
    /// Proxy port the app was redirected to, host byte order.
    pub proxy_port: u32,
}
const _: () = assert!(core::mem::size_of::<ConnKey>() == 32);

/// [`PodAddrs::flags`]: [`PodAddrs::v4`] holds the pod's IPv4 address.
pub const POD_ADDR_V4: u32 = 1 << 0;
/// [`PodAddrs::flags`]: [`PodAddrs::v6`] holds the pod's IPv6 address.
pub const POD_ADDR_V6: u32 = 1 << 1;

/// The pod's own address of each family, keyed by netns cookie: what `getsockname` on a
/// redirected app socket answers as its local address (the address the socket would have had
/// under iptables `REDIRECT`, which leaves the source alone). A family the pod has no address
/// of (its flag clear) leaves the kernel's answer (`127.0.0.1`, `::1`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PodAddrs {
    /// IPv6 address, network byte order words (meaningful with [`POD_ADDR_V6`]).
    pub v6: [u32; 4],
    /// IPv4 address, network byte order (meaningful with [`POD_ADDR_V4`]).
    pub v4: u32,
    /// `POD_ADDR_*` bits.
    pub flags: u32,
}
const _: () = assert!(core::mem::size_of::<PodAddrs>() == 24);

/// Live per-pod counters (one copy per CPU; sum them).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PodStats {
    /// Outbound connects rewritten to the proxy.
    pub out_redirected: u64,
    /// Outbound connects left alone: owned by the proxy UID/GID.
    pub out_exempt_owner: u64,
    /// Outbound connects left alone: ignored port or subnet, loopback, own address, IPv6 off.
    pub out_skipped: u64,
    /// `SO_ORIGINAL_DST` answered from our maps.
    pub orig_dst_answered: u64,
    /// `SO_ORIGINAL_DST` asked on a proxy socket we knew nothing about.
    pub orig_dst_missed: u64,
    /// Inbound connections handed to the proxy's inbound listener.
    pub in_redirected: u64,
    /// Inbound connections refused: the proxy was not listening (fail closed).
    pub in_refused: u64,
    /// Inbound connections left to the normal lookup: ignored port or source, own traffic.
    pub in_passed: u64,
}
const _: () = assert!(core::mem::size_of::<PodStats>() == 64);

impl PodStats {
    pub fn add(&mut self, other: &PodStats) {
        self.out_redirected += other.out_redirected;
        self.out_exempt_owner += other.out_exempt_owner;
        self.out_skipped += other.out_skipped;
        self.orig_dst_answered += other.orig_dst_answered;
        self.orig_dst_missed += other.orig_dst_missed;
        self.in_redirected += other.in_redirected;
        self.in_refused += other.in_refused;
        self.in_passed += other.in_passed;
    }
}

/// Key of a pod's inbound proxy listener in the listener SOCKHASH. `sk_lookup` cannot read the
/// netns cookie, so it finds the pod by destination address first (pod-by-IP map).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ListenerKey {
    pub netns_cookie: u64,
    /// [`AF_INET`] or [`AF_INET6`]: the listener's socket family.
    pub family: u32,
    pub _pad: u32,
}
const _: () = assert!(core::mem::size_of::<ListenerKey>() == 16);

/// Kernel structures the `iter/tcp` program reads at fixed offsets (Rust has no CO-RE field
/// relocations). The fields are the first of `struct sock_common`, before any member that
/// depends on the kernel's configuration, and have not moved since the 3.x kernels; the agent
/// still reads the running kernel's BTF at start and refuses to run the iterator when one
/// differs (see the agent's `host::btf`). Each entry: struct, member, byte offset, size.
pub const ITER_KERNEL_FIELDS: [(&str, &str, u32, u32); 6] = [
    ("sock_common", "skc_num", SKC_NUM_OFFSET, 2),
    ("sock_common", "skc_family", SKC_FAMILY_OFFSET, 2),
    ("sock_common", "skc_state", SKC_STATE_OFFSET, 1),
    ("bpf_iter_meta", "seq", 0, 8),
    ("bpf_iter__tcp", "sk_common", 8, 8),
    ("bpf_iter__tcp", "uid", 16, 4),
];
/// `sock_common.skc_num`: the local port, host byte order (`__u16`).
pub const SKC_NUM_OFFSET: u32 = 14;
/// `sock_common.skc_family` (`unsigned short`).
pub const SKC_FAMILY_OFFSET: u32 = 16;
/// `sock_common.skc_state` (`volatile unsigned char`).
pub const SKC_STATE_OFFSET: u32 = 18;
/// `TCP_LISTEN` in `skc_state`.
pub const TCP_LISTEN: u8 = 10;

/// [`IterArgs::flags`]: put the proxy's inbound listener in the listener SOCKHASH (otherwise
/// the run only reports what listens).
pub const ITER_REGISTER: u32 = 1 << 0;

/// What the agent asks of one run of the `iter/tcp` program (`names::MAP_ITER_ARGS`, key 0),
/// written right before it creates the iterator inside the pod's network namespace.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IterArgs {
    /// The pod's netns cookie: the [`ListenerKey`] the listener goes under (an iterator program
    /// cannot ask for its namespace's cookie).
    pub netns_cookie: u64,
    /// `ITER_*` bits.
    pub flags: u32,
    /// The proxy's UID as the iterator reports owners (in the agent's user namespace).
    pub proxy_uid: u32,
    /// The inbound proxy port (host byte order).
    pub inbound_port: u16,
    pub _pad: [u16; 3],
}
const _: () = assert!(core::mem::size_of::<IterArgs>() == 24);

/// [`IterListener::registered`] when the run did not try to register this socket.
pub const ITER_NOT_TRIED: i32 = 1;

/// One listening TCP socket of the pod's network namespace, as the `iter/tcp` program writes
/// it to the iterator's output (records back to back, nothing else).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IterListener {
    /// Owner, in the user namespace of the process that created the iterator.
    pub uid: u32,
    /// [`AF_INET`] or [`AF_INET6`] (as `u16`, the socket's `skc_family`).
    pub family: u16,
    /// Local port, host byte order.
    pub port: u16,
    /// What registering it in the listener SOCKHASH returned: 0, a negative errno, or
    /// [`ITER_NOT_TRIED`].
    pub registered: i32,
    pub _pad: u32,
}
const _: () = assert!(core::mem::size_of::<IterListener>() == 16);

/// Version of the layout of the pinned state (maps and what their entries mean), recorded in
/// the pinned [`crate::names::MAP_META`] map as a [`LayoutMeta`]. Bump it whenever a map's
/// key, value, type, flags or the meaning of its entries changes; the agent migrates pinned
/// state across versions (see the agent's `layout` module).
///
/// 1: maps without BTF and no meta map (agents before this record existed).
/// 2: BTF-typed maps (`bpftool map dump` prints named fields) and the meta map.
/// 3: an app socket's original destination in its own storage (`l5d_app_dst`) instead of
///    `l5d_sock_dst`, which is only read and cleaned for sockets connected under layout 2.
/// 4: each pod's own address per family (`l5d_pod_addrs`, [`PodAddrs`]) for the
///    `getsockname` programs, which are attached with the others.
pub const LAYOUT_VERSION: u32 = 4;

/// The oldest layout version whose agents can run on state of [`LAYOUT_VERSION`] as it is:
/// no layout since 1 changed a key or value of layout 1 (3 and 4 only add a map), so a
/// layout-1, -2 or -3 agent (which reuses pinned maps by name) still works on it. Rolling back
/// from 3 costs this: app sockets connected under layout 3 report the proxy, not their original
/// destination, as their peer (`getpeername`), and a connection whose `connect()` and handshake
/// straddle the swap finds no original destination (the proxy refuses it, as when it starts).
/// Rolling back from 4: the older agent leaves the `getsockname` links of running pods as they
/// are (it has no program of that name to swap them to), so those pods keep the pod-address
/// answer; pods it registers answer `127.0.0.1` again.
pub const LAYOUT_OLDEST_READER: u32 = 1;

/// The value of the meta map's single entry (key `0u32`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LayoutMeta {
    /// [`LAYOUT_VERSION`] of the agent that last wrote the state.
    pub version: u32,
    /// [`LAYOUT_OLDEST_READER`] of that agent: agents of an older layout must refuse the
    /// state.
    pub oldest_reader: u32,
}
const _: () = assert!(core::mem::size_of::<LayoutMeta>() == 8);

/// `::ffff:a.b.c.d` words for an IPv4 address in network byte order.
#[inline(always)]
pub const fn v4_mapped_words(ip4_be: u32) -> [u32; 4] {
    [0, 0, 0xffff_u32.to_be(), ip4_be]
}

/// Whether the words (network order) are a v4-mapped IPv6 address.
#[inline(always)]
pub const fn is_v4_mapped(words: &[u32; 4]) -> bool {
    words[0] == 0 && words[1] == 0 && words[2] == 0xffff_u32.to_be()
}

#[cfg(feature = "user")]
mod user {
    use super::*;
    // SAFETY: all of these are `#[repr(C)]`, plain integers, with no padding (asserted above).
    unsafe impl aya::Pod for PodConfig {}
    unsafe impl aya::Pod for PortSetKey {}
    unsafe impl aya::Pod for PortBlock {}
    unsafe impl aya::Pod for AddrKey {}
    unsafe impl aya::Pod for OrigDst {}
    unsafe impl aya::Pod for ConnKey {}
    unsafe impl aya::Pod for PodStats {}
    unsafe impl aya::Pod for PodAddrs {}
    unsafe impl aya::Pod for ListenerKey {}
    unsafe impl aya::Pod for LayoutMeta {}
    unsafe impl aya::Pod for IterArgs {}
    unsafe impl aya::Pod for IterListener {}
}
