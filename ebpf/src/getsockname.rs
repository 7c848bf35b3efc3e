//! `cgroup/getsockname4` and `cgroup/getsockname6`: a redirected app socket reports its pod's
//! own address as its local address, as it would under Linkerd's iptables rules.
//!
//! [`crate::connect`] sends the app's socket to the proxy on loopback, so the kernel binds it
//! to a loopback address (`127.0.0.1`, `::ffff:127.0.0.1` or `::1`) and `getsockname()` says
//! so. iptables' `REDIRECT` in `OUTPUT` leaves the source alone: there the socket keeps the
//! pod's address the route chose. These hooks put the pod's address of the socket's family
//! ([`POD_ADDRS`], written by the agent at registration) in the kernel's answer and keep its
//! port (the socket's real local port).
//!
//! Every other socket is left alone: one whose local address is not loopback returns before
//! any lookup; a loopback one without an original destination in its storage ([`APP_DST`]) is
//! not a redirected app socket (the proxy's own sockets, its listeners and accepted sockets,
//! the pod talking to itself on loopback); a pod without an address of the family keeps the
//! kernel's answer. Sockets connected under a layout before 3 (their destination under
//! their cookie in `l5d_sock_dst`) keep the kernel's answer too.
//!
//! The kernel's contract (`inet_getname`, `inet6_getname`): the hook runs after the kernel
//! filled the address, the program may rewrite `user_ip4`/`user_ip6` and `user_port`, and the
//! verifier holds it to returning 1 (the call's result is not changed by the program).
//!
//! # Minimum kernel version
//! 5.8 (the hooks); socket storage from these hooks 5.10, as for [`crate::getpeername`].

use aya_ebpf::{
    EbpfContext, bindings::bpf_sock_addr, helpers::generated::bpf_get_netns_cookie,
    macros::cgroup_sock_addr, programs::SockAddrContext,
};
use linkerd_cni_common::{
    FAMILY_V4, FAMILY_V6, POD_ADDR_V4, POD_ADDR_V6, PodAddrs, v4_mapped_words,
};

use crate::{
    addr::{LOOPBACK4_BE, read_ip6},
    maps::{APP_DST, POD_ADDRS, stored_dst},
};

/// The family ([`FAMILY_V4`] or [`FAMILY_V6`]) of the original destination of this socket, if
/// [`crate::connect`] redirected it, with its pod's addresses.
#[inline(always)]
unsafe fn redirected(ctx: &SockAddrContext) -> Option<(u16, PodAddrs)> {
    let sk = unsafe { (*ctx.sock_addr).__bindgen_anon_1.sk };
    if sk.is_null() {
        return None;
    }
    // SAFETY: the hook's socket, checked for null.
    let dst = unsafe { stored_dst(&APP_DST, sk.cast()) }?;
    let netns = unsafe { bpf_get_netns_cookie(ctx.as_ptr()) };
    // SAFETY: the value is copied out at once.
    let addrs = *unsafe { POD_ADDRS.get(&netns) }?;
    Some((dst.family, addrs))
}

#[cgroup_sock_addr(getsockname4)]
pub fn l5d_getsock4(ctx: SockAddrContext) -> i32 {
    // SAFETY: 4-byte load of a readable context field.
    if unsafe { (*ctx.sock_addr).user_ip4 } != LOOPBACK4_BE {
        return 1;
    }
    if let Some((family, addrs)) = unsafe { redirected(&ctx) }
        && family == FAMILY_V4
        && addrs.flags & POD_ADDR_V4 != 0
    {
        let sa: *mut bpf_sock_addr = ctx.sock_addr;
        // SAFETY: a 4-byte store to a writable context field; the port stays the kernel's.
        unsafe { (*sa).user_ip4 = addrs.v4 };
    }
    1
}

#[cgroup_sock_addr(getsockname6)]
pub fn l5d_getsock6(ctx: SockAddrContext) -> i32 {
    // SAFETY: 4-byte loads of a readable context field.
    let local = unsafe { read_ip6(&raw const (*ctx.sock_addr).user_ip6) };
    let mapped = local == v4_mapped_words(LOOPBACK4_BE);
    if !mapped && local != [0, 0, 0, 1u32.to_be()] {
        return 1;
    }
    let Some((family, addrs)) = (unsafe { redirected(&ctx) }) else {
        return 1;
    };
    // A v4-mapped destination was redirected to `::ffff:127.0.0.1` (the socket speaks IPv4):
    // the pod's IPv4 address, v4-mapped. A pure IPv6 one to `::1`: the pod's IPv6 address.
    let pod = match (mapped, family) {
        (true, FAMILY_V4) if addrs.flags & POD_ADDR_V4 != 0 => v4_mapped_words(addrs.v4),
        (false, FAMILY_V6) if addrs.flags & POD_ADDR_V6 != 0 => addrs.v6,
        _ => return 1,
    };
    let sa: *mut bpf_sock_addr = ctx.sock_addr;
    // SAFETY: 4-byte stores to writable context fields, one word each (the verifier allows no
    // wider access); the port stays the kernel's.
    unsafe {
        (*sa).user_ip6[0] = pod[0];
        (*sa).user_ip6[1] = pod[1];
        (*sa).user_ip6[2] = pod[2];
        (*sa).user_ip6[3] = pod[3];
    }
    1
}
