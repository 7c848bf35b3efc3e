//! Address helpers: reading addresses from a program's context, and the checks that decide
//! whether an outbound destination is redirected.

use core::ptr::read_volatile;

use aya_ebpf::maps::lpm_trie::Key;
use linkerd_cni_common::{
    ADDR_KEY_FULL_BITS, ADDR_OUTBOUND_SKIP_SUBNET, AddrKey, FLAG_OUT_PORTS, FLAG_OUT_SUBNETS,
    PORT_SET_OUTBOUND_SKIP, PodConfig, PortSetKey,
};

use crate::maps::{ADDRS, POD_BY_IP, PORT_SETS};

/// `127.0.0.1` in network byte order.
pub const LOOPBACK4_BE: u32 = u32::from_be_bytes([127, 0, 0, 1]).to_be();

/// Reads an IPv6 address (network order words) from a context field, one volatile 4-byte load
/// per word: the verifier allows only 4-byte loads of these fields at fixed offsets.
///
/// # Safety
/// `field` points to a readable `[u32; 4]` field of the program's context.
#[inline(always)]
pub unsafe fn read_ip6(field: *const [u32; 4]) -> [u32; 4] {
    let word = field.cast::<u32>();
    // SAFETY: four words inside the field, as the caller promises.
    unsafe {
        [
            read_volatile(word),
            read_volatile(word.add(1)),
            read_volatile(word.add(2)),
            read_volatile(word.add(3)),
        ]
    }
}

/// Whether `port` (host order) is in the pod's port set `set`.
#[inline(always)]
pub fn port_in_set(netns_cookie: u64, set: u16, port: u16) -> bool {
    let key = PortSetKey::new(netns_cookie, set, port);
    // SAFETY: read-only lookup; blocks are replaced whole by the agent.
    match unsafe { PORT_SETS.get(&key) } {
        Some(block) => block.contains(port),
        None => false,
    }
}

/// Whether the address (network order words, IPv4 v4-mapped) is in the pod's address set.
#[inline(always)]
pub fn addr_in_set(netns_cookie: u64, set: u32, words: &[u32; 4]) -> bool {
    let mut addr = [0u8; 16];
    let mut i = 0;
    while i < 4 {
        // Words are already in network order in memory: copy their bytes as they lie.
        let b = words[i].to_ne_bytes();
        addr[i * 4] = b[0];
        addr[i * 4 + 1] = b[1];
        addr[i * 4 + 2] = b[2];
        addr[i * 4 + 3] = b[3];
        i += 1;
    }
    let key = Key::new(
        ADDR_KEY_FULL_BITS,
        AddrKey {
            netns_cookie,
            set_be: set.to_be(),
            addr,
            _pad: 0,
        },
    );
    ADDRS.get(&key).is_some()
}

/// Whether an outbound connection of this pod to `words:port` must go to the proxy, for a
/// destination that is neither loopback nor unspecified (the caller checks those per family).
#[inline(always)]
pub fn outbound_redirected(
    cfg: &PodConfig,
    netns_cookie: u64,
    words: &[u32; 4],
    port: u16,
) -> bool {
    if cfg.flags & FLAG_OUT_PORTS != 0 && port_in_set(netns_cookie, PORT_SET_OUTBOUND_SKIP, port) {
        return false;
    }
    // The pod's own address: one hash probe (the map `sk_lookup` uses to find the pod).
    // SAFETY: read-only lookup.
    if unsafe { POD_BY_IP.get(words) }.is_some_and(|c| *c == netns_cookie) {
        return false;
    }
    if cfg.flags & FLAG_OUT_SUBNETS != 0
        && addr_in_set(netns_cookie, ADDR_OUTBOUND_SKIP_SUBNET, words)
    {
        return false;
    }
    true
}
