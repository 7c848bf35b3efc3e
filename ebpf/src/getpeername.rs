//! `cgroup/getpeername4` and `cgroup/getpeername6`: the app's redirected socket reports its
//! original destination as its peer, not the proxy.
//!
//! These hooks also run for every `accept` with an address in the pod's cgroup (the kernel
//! fills the address through the same hook) and every other `getpeername`. A redirected socket
//! always has the proxy's loopback address as its peer (`127.0.0.1`, `::ffff:127.0.0.1` or
//! `::1`, as [`crate::connect`] rewrote it): any other peer returns before any lookup. The
//! destination is in the socket's storage ([`APP_DST`]), or, for a socket that connected under
//! layout-2 programs (before an upgrade), under its cookie in [`SOCK_DST`]. A loopback peer
//! with neither changes nothing. The proxy's accepted socket of a redirected outbound
//! connection also has a loopback peer: its own storage ([`ACC_DST`]) ends the search there.
//!
//! # Minimum kernel version
//! 5.8.

use aya_ebpf::{
    EbpfContext, bindings::bpf_sock_addr, helpers::generated::bpf_get_socket_cookie,
    macros::cgroup_sock_addr, programs::SockAddrContext,
};
use linkerd_cni_common::{FAMILY_V4, OrigDst, v4_mapped_words};

use crate::{
    addr::{LOOPBACK4_BE, read_ip6},
    maps::{ACC_DST, APP_DST, SOCK_DST, stored_dst},
};

/// The app socket's original destination, if it was redirected.
#[inline(always)]
unsafe fn redirected_dst(ctx: &SockAddrContext) -> Option<OrigDst> {
    let sk = unsafe { (*ctx.sock_addr).__bindgen_anon_1.sk };
    if sk.is_null() {
        return None;
    }
    // SAFETY: the hook's socket, checked for null.
    if let Some(dst) = unsafe { stored_dst(&APP_DST, sk.cast()) } {
        return Some(dst);
    }
    // The proxy's accepted side of a redirected outbound connection has a loopback peer too
    // (the app's socket) and runs this hook at every `accept`: its own storage, created when
    // its handshake completed, says it is not an app socket, before the socket's cookie is
    // made and the layout-2 map probed for nothing.
    // SAFETY: as above.
    if unsafe { stored_dst(&ACC_DST, sk.cast()) }.is_some() {
        return None;
    }
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    // SAFETY: the value is copied out at once.
    (unsafe { SOCK_DST.get(&cookie) }).copied()
}

#[cgroup_sock_addr(getpeername4)]
pub fn l5d_getpeer4(ctx: SockAddrContext) -> i32 {
    // SAFETY: 4-byte load of a readable context field.
    if unsafe { (*ctx.sock_addr).user_ip4 } != LOOPBACK4_BE {
        return 1;
    }
    if let Some(dst) = unsafe { redirected_dst(&ctx) }
        && dst.family == FAMILY_V4
    {
        let sa: *mut bpf_sock_addr = ctx.sock_addr;
        // SAFETY: 4-byte stores to writable context fields.
        unsafe {
            (*sa).user_ip4 = dst.addr[3];
            (*sa).user_port = u32::from(dst.port_be);
        }
    }
    1
}

#[cgroup_sock_addr(getpeername6)]
pub fn l5d_getpeer6(ctx: SockAddrContext) -> i32 {
    // SAFETY: 4-byte loads of a readable context field.
    let peer = unsafe { read_ip6(&raw const (*ctx.sock_addr).user_ip6) };
    if peer != v4_mapped_words(LOOPBACK4_BE) && peer != [0, 0, 0, 1u32.to_be()] {
        return 1;
    }
    if let Some(dst) = unsafe { redirected_dst(&ctx) } {
        let sa: *mut bpf_sock_addr = ctx.sock_addr;
        // SAFETY: 4-byte stores to writable context fields. IPv4 destinations are stored
        // v4-mapped, which is what an IPv6 socket reports for them.
        unsafe {
            (*sa).user_ip6[0] = dst.addr[0];
            (*sa).user_ip6[1] = dst.addr[1];
            (*sa).user_ip6[2] = dst.addr[2];
            (*sa).user_ip6[3] = dst.addr[3];
            (*sa).user_port = u32::from(dst.port_be);
        }
    }
    1
}
