//! `sk_lookup`: every TCP connection arriving at a meshed pod goes to the proxy's inbound
//! listener (4143), except ignored ports and sources, the proxy port itself, and the pod's own
//! traffic (loopback, or from its own address: the proxy forwarding to the app). With no
//! listener, the connection is refused (fail closed), never delivered to the app behind the
//! proxy's back.
//!
//! The accepted socket keeps the address the client dialled as its local address, which is
//! what `SO_ORIGINAL_DST` answers (see [`crate::sockops`]). Nothing is recorded here: this
//! program also runs for segments that open no connection (any TCP segment no socket matches,
//! such as a late retransmission of a connection the pod already closed, reaches the listener
//! lookup), and a record made for one of those would never be removed.
//!
//! `bpf_get_netns_cookie` is not available to `sk_lookup` programs, so the pod is known by
//! where the program runs: the agent attaches to each pod's network namespace a stub of a few
//! instructions carrying that netns's cookie, which writes it to the per-CPU slot
//! [`LOOKUP_NS`] and tail-calls this program (if the tail call fails, the stub refuses the
//! connection). Every local address of the pod counts, whether it was known at ADD or not:
//! the destination address plays no part in finding the pod.
//!
//! Two programs, one decision. Both know the pod's own traffic by its source address: loopback
//! (`127.0.0.0/8`, `::1`), the destination itself, or one of the pod's addresses
//! ([`POD_BY_IP`] says which pod an address is). The pod's own traffic has one of those
//! sources (the kernel picks the destination itself as the source of a connection to a local
//! address, unless the socket was bound), and a packet from outside cannot carry one and
//! complete a handshake: the kernel drops an IPv4 packet whose source is local or loopback
//! arriving on another interface (`fib_validate_source`, martian source), and an IPv6 one
//! from `::1`; to a spoofed pod address, the SYN-ACK goes to the pod itself, never to the
//! sender. [`l5d_sk_lookup`] also passes what arrived on the loopback device
//! (`ingress_ifindex`, 5.17: connections to an address held by `lo`); [`l5d_sk_lookaddr`],
//! for kernels without that field (5.15's context has none), does not read it. The agent
//! loads one of them (`SkLookupVariant`, chosen by the probes) and pins it under
//! `l5d_sk_lookup`'s name; the other is never loaded.
//!
//! # Minimum kernel version
//! 5.9; [`l5d_sk_lookup`] 5.17 (`ingress_ifindex` in the context).

use core::ptr::read_volatile;

use aya_ebpf::{
    bindings::{sk_action::SK_DROP, sk_action::SK_PASS},
    macros::sk_lookup,
    programs::SkLookupContext,
};
use linkerd_cni_common::{
    ADDR_INBOUND_SKIP_SOURCE, AF_INET, AF_INET6, FLAG_IN_PORTS, FLAG_IN_REDIRECT_ONLY,
    FLAG_IN_SKIP_SOURCES, FLAG_IPV6, IPPROTO_TCP, ListenerKey, PORT_SET_INBOUND_REDIRECT,
    PORT_SET_INBOUND_SKIP, v4_mapped_words,
};

use crate::{
    addr::{addr_in_set, port_in_set, read_ip6},
    maps::{LISTENERS, LOOKUP_NS, POD_BY_IP, POD_CONFIG, count},
};
const LOOPBACK_IFINDEX: u32 = 1;

/// The pod's own traffic is what arrived on the loopback device or comes from the pod's own
/// addresses.
#[sk_lookup]
pub fn l5d_sk_lookup(ctx: SkLookupContext) -> u32 {
    // SAFETY: the kernel hands a valid `bpf_sk_lookup`.
    unsafe { lookup::<true>(&ctx) }
}

/// The pod's own traffic is what comes from loopback, from its destination, or from one of the
/// pod's addresses (no `ingress_ifindex` read: loads on 5.9 to 5.16 too).
#[sk_lookup]
pub fn l5d_sk_lookaddr(ctx: SkLookupContext) -> u32 {
    // SAFETY: as above.
    unsafe { lookup::<false>(&ctx) }
}

/// Whether `remote` (network order words, IPv4 v4-mapped) is a loopback address: `127/8` or
/// `::1`.
#[inline(always)]
fn loopback(v4: bool, rip4: u32, remote: &[u32; 4]) -> bool {
    match v4 {
        true => u32::from_be(rip4) >> 24 == 127,
        false => *remote == [0, 0, 0, 1u32.to_be()],
    }
}

#[inline(always)]
unsafe fn lookup<const BY_IFINDEX: bool>(ctx: &SkLookupContext) -> u32 {
    let l = ctx.lookup;
    // The stub wrote the pod's cookie just before the tail call, on this CPU (sk_lookup runs
    // with bottom halves off: nothing runs in between). Cleared after reading, so a run that
    // did not come through a stub finds no pod.
    let Some(slot) = LOOKUP_NS.get_ptr_mut(0) else {
        return SK_DROP;
    };
    // SAFETY: per-CPU value of this CPU.
    let netns_cookie = unsafe { core::ptr::replace(slot, 0) };
    let v = |p: *const u32| unsafe { read_volatile(p) };
    // Every field is loaded before any choice (see `sockops::Tuple::read` for why).
    let (family, protocol, ifindex, rip4, lip4, local_port) = unsafe {
        (
            v(&raw const (*l).family),
            v(&raw const (*l).protocol),
            // Not read at all by the address variant: the verifier of a kernel without the
            // field refuses any access to it.
            if BY_IFINDEX {
                v(&raw const (*l).ingress_ifindex)
            } else {
                0
            },
            v(&raw const (*l).remote_ip4),
            v(&raw const (*l).local_ip4),
            v(&raw const (*l).local_port),
        )
    };
    let (rip6, lip6) = unsafe {
        (
            read_ip6(&raw const (*l).remote_ip6),
            read_ip6(&raw const (*l).local_ip6),
        )
    };
    if protocol != IPPROTO_TCP || (BY_IFINDEX && ifindex == LOOPBACK_IFINDEX) {
        return SK_PASS;
    }
    let v4 = family == AF_INET;
    let (local, remote) = if v4 {
        (v4_mapped_words(lip4), v4_mapped_words(rip4))
    } else {
        (lip6, rip6)
    };
    // The pod's own traffic by its source, in both programs: `ingress_ifindex` is loopback
    // only for connections to an address on the loopback device; one to the pod's own
    // address reports the device that holds the address (the kernel's local route,
    // `orig_oif` in `ip_route_output_key_hash_rcu`), so `127.0.0.1` to the pod IP would
    // otherwise be handed to the proxy. Passed uncounted, as what arrived on loopback is.
    if loopback(v4, rip4, &remote) || remote == local {
        return SK_PASS;
    }
    let Some(cfg) = (unsafe { POD_CONFIG.get(&netns_cookie) }).copied() else {
        return SK_PASS;
    };
    // SAFETY: read-only lookup.
    if unsafe { POD_BY_IP.get(&remote) }.is_some_and(|c| *c == netns_cookie) {
        return SK_PASS;
    }
    let port = local_port as u16;
    let passed = !v4 && cfg.flags & FLAG_IPV6 == 0
        || port == cfg.inbound_port
        || (cfg.flags & FLAG_IN_PORTS != 0
            && port_in_set(netns_cookie, PORT_SET_INBOUND_SKIP, port))
        || (cfg.flags & FLAG_IN_REDIRECT_ONLY != 0
            && !port_in_set(netns_cookie, PORT_SET_INBOUND_REDIRECT, port))
        || (cfg.flags & FLAG_IN_SKIP_SOURCES != 0
            && addr_in_set(netns_cookie, ADDR_INBOUND_SKIP_SOURCE, &remote));
    if passed {
        count(netns_cookie, |s| &mut s.in_passed);
        return SK_PASS;
    }
    let mut assigned = LISTENERS.redirect_sk_lookup(
        ctx,
        ListenerKey {
            netns_cookie,
            family,
            _pad: 0,
        },
        0,
    );
    if assigned.is_err() && v4 {
        // A dual-stack IPv6 listener serves IPv4 too.
        assigned = LISTENERS.redirect_sk_lookup(
            ctx,
            ListenerKey {
                netns_cookie,
                family: AF_INET6,
                _pad: 0,
            },
            0,
        );
    }
    match assigned {
        Ok(()) => {
            count(netns_cookie, |s| &mut s.in_redirected);
            SK_PASS
        }
        Err(_) => {
            count(netns_cookie, |s| &mut s.in_refused);
            SK_DROP
        }
    }
}
