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
//! # Minimum kernel version
//! 5.9, 5.17 for `ingress_ifindex` in the context.

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
    maps::{LISTENERS, LOOKUP_NS, POD_CONFIG, count},
};
const LOOPBACK_IFINDEX: u32 = 1;

#[sk_lookup]
pub fn l5d_sk_lookup(ctx: SkLookupContext) -> u32 {
    // SAFETY: the kernel hands a valid `bpf_sk_lookup`.
    unsafe { lookup(&ctx) }
}

unsafe fn lookup(ctx: &SkLookupContext) -> u32 {
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
            v(&raw const (*l).ingress_ifindex),
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
    if protocol != IPPROTO_TCP || ifindex == LOOPBACK_IFINDEX {
        return SK_PASS;
    }
    let v4 = family == AF_INET;
    let (local, remote) = if v4 {
        (v4_mapped_words(lip4), v4_mapped_words(rip4))
    } else {
        (lip6, rip6)
    };
    let Some(cfg) = (unsafe { POD_CONFIG.get(&netns_cookie) }).copied() else {
        return SK_PASS;
    };
    let port = local_port as u16;
    let passed = !v4 && cfg.flags & FLAG_IPV6 == 0
        || remote == local
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
