//! `cgroup/getpeername4` and `cgroup/getpeername6`: the app's redirected socket reports its
//! original destination as its peer, not the proxy.
//!
//! These hooks also run for sockets the proxy accepted in the pod's cgroup: their cookies are
//! not in the map, and a miss changes nothing.
//!
//! # Minimum kernel version
//! 5.8.

use aya_ebpf::{
    EbpfContext, bindings::bpf_sock_addr, helpers::generated::bpf_get_socket_cookie,
    macros::cgroup_sock_addr, programs::SockAddrContext,
};
use linkerd_cni_common::FAMILY_V4;

use crate::maps::SOCK_DST;

#[cgroup_sock_addr(getpeername4)]
pub fn l5d_getpeer4(ctx: SockAddrContext) -> i32 {
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    // SAFETY: the value is copied out at once.
    if let Some(dst) = (unsafe { SOCK_DST.get(&cookie) }).copied()
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
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    // SAFETY: the value is copied out at once.
    if let Some(dst) = (unsafe { SOCK_DST.get(&cookie) }).copied() {
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
