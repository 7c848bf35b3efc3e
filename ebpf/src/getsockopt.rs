//! `cgroup/getsockopt`: answers `getsockopt(SOL_IP, SO_ORIGINAL_DST)` (and
//! `SOL_IPV6, IP6T_SO_ORIGINAL_DST`) on the proxy's accepted sockets, as conntrack would after
//! an iptables REDIRECT, so an unmodified proxy learns where each connection was going.
//!
//! The answer comes from the accepted socket's own storage, where [`crate::sockops`] moved it
//! when the handshake completed, or else from the 4-tuple map (the socket's peer is the app
//! side of the connection; with TCP Fast Open the proxy's side completes before the app's, so
//! the first answer moves it from there into the socket's storage). Whenever we hold
//! a destination for the socket, ours wins, even over an answer already given: with conntrack
//! active in the pod's netns the kernel answers by itself (`retval == 0`) with the proxy's own
//! address, since the connection was redirected before any packet existed. With nothing held,
//! the kernel's answer stands. Other options pass through untouched.
//!
//! # Minimum kernel version
//! 5.3 (cgroup sockopt hooks), 5.15 for `bpf_get_netns_cookie` here.

use core::ptr::{read_volatile, write_volatile};

use aya_ebpf::{
    EbpfContext,
    bindings::{bpf_sock, bpf_sockopt},
    helpers::generated::{bpf_get_netns_cookie, bpf_sk_storage_get},
    macros::cgroup_sockopt,
    programs::SockoptContext,
};
use linkerd_cni_common::{
    AF_INET, AF_INET6, ConnKey, FAMILY_V4, OrigDst, SO_ORIGINAL_DST, SOL_IP, SOL_IPV6,
    v4_mapped_words,
};

use crate::{
    addr::read_ip6,
    maps::{ACC_DST, CONN_DST, count, store_dst},
};

/// Beyond one page the program sees a truncated buffer and must hand the kernel's answer back.
const PAGE_SIZE: i32 = 4096;

/// `struct sockaddr_in`.
#[repr(C)]
struct SockaddrIn {
    family: u16,
    port_be: u16,
    addr_be: u32,
    zero: [u8; 8],
}

/// `struct sockaddr_in6`.
#[repr(C)]
struct SockaddrIn6 {
    family: u16,
    port_be: u16,
    flowinfo: u32,
    addr: [u32; 4],
    scope_id: u32,
}

#[cgroup_sockopt(getsockopt)]
pub fn l5d_getsockopt(ctx: SockoptContext) -> i32 {
    // SAFETY: the kernel hands a valid `bpf_sockopt`.
    unsafe { getsockopt(&ctx) };
    1
}

unsafe fn getsockopt(ctx: &SockoptContext) {
    let so: *mut bpf_sockopt = ctx.sockopt;
    let (level, optname) = unsafe { ((*so).level, (*so).optname) };
    if optname != SO_ORIGINAL_DST || (level != SOL_IP && level != SOL_IPV6) {
        if unsafe { (*so).optlen } > PAGE_SIZE {
            // SAFETY: 4-byte store to a writable context field.
            unsafe { write_volatile(&raw mut (*so).optlen, 0) };
        }
        return;
    }
    let sk: *mut bpf_sock = unsafe { (*so).__bindgen_anon_1.sk };
    if sk.is_null() {
        return;
    }
    let netns = unsafe { bpf_get_netns_cookie(ctx.as_ptr()) };
    // SAFETY: `sk` is the context's full socket, checked for null; lookup only.
    let stored = unsafe {
        bpf_sk_storage_get(
            core::ptr::from_ref(&ACC_DST).cast_mut().cast(),
            sk.cast(),
            core::ptr::null_mut(),
            0,
        )
    } as *const OrigDst;
    let dst = if stored.is_null() {
        match unsafe { tuple_dst(sk, netns) } {
            Some((key, dst)) => {
                // TCP Fast Open: the proxy's side completed before the app's, so the hand-off
                // is still in the 4-tuple map (nothing else would remove it: app sockets ask
                // for no state callbacks). Move it into the socket's storage now.
                // SAFETY: `sk` is the context's full socket, checked for null.
                if unsafe { store_dst(&ACC_DST, sk.cast(), &dst) } {
                    let _ = CONN_DST.remove(&key);
                }
                dst
            }
            None => {
                if unsafe { (*so).retval } != 0 {
                    count(netns, |s| &mut s.orig_dst_missed);
                }
                return;
            }
        }
    } else {
        // SAFETY: the storage holds an `OrigDst` and lives as long as the socket.
        unsafe { *stored }
    };
    let written = if level == SOL_IP {
        unsafe { answer_v4(so, &dst) }
    } else {
        unsafe { answer_v6(so, &dst) }
    };
    if written {
        count(netns, |s| &mut s.orig_dst_answered);
    }
}

/// The original destination recorded under the accepted socket's 4-tuple, if any, with its key.
#[inline(always)]
unsafe fn tuple_dst(sk: *mut bpf_sock, netns: u64) -> Option<(ConnKey, OrigDst)> {
    // Volatile loads at fixed offsets, for the same reason as in `sockops::Tuple::read`.
    let key = unsafe {
        let (family, ip4, ip6) = (
            read_volatile(&raw const (*sk).family),
            read_volatile(&raw const (*sk).dst_ip4),
            read_ip6(&raw const (*sk).dst_ip6),
        );
        ConnKey {
            netns_cookie: netns,
            addr: if family == AF_INET {
                v4_mapped_words(ip4)
            } else {
                ip6
            },
            port: u32::from(u16::from_be(read_volatile(&raw const (*sk).dst_port))),
            proxy_port: read_volatile(&raw const (*sk).src_port),
        }
    };
    // SAFETY: the value is copied out at once.
    (unsafe { CONN_DST.get(&key) })
        .copied()
        .map(|dst| (key, dst))
}

/// Writes a `sockaddr_in`; only for an IPv4 original destination, like conntrack.
unsafe fn answer_v4(so: *mut bpf_sockopt, dst: &OrigDst) -> bool {
    if dst.family != FAMILY_V4 {
        return false;
    }
    let optval = unsafe { (*so).__bindgen_anon_2.optval } as *mut SockaddrIn;
    let end = unsafe { (*so).__bindgen_anon_3.optval_end } as *mut u8;
    if unsafe { optval.add(1) } as *mut u8 > end {
        return false;
    }
    unsafe {
        (*optval).family = AF_INET as u16;
        (*optval).port_be = dst.port_be;
        (*optval).addr_be = dst.addr[3];
        (*optval).zero = [0; 8];
        finish(so, core::mem::size_of::<SockaddrIn>() as i32);
    }
    true
}

/// Writes a `sockaddr_in6` (an IPv4 destination as `::ffff:a.b.c.d`).
unsafe fn answer_v6(so: *mut bpf_sockopt, dst: &OrigDst) -> bool {
    let optval = unsafe { (*so).__bindgen_anon_2.optval } as *mut SockaddrIn6;
    let end = unsafe { (*so).__bindgen_anon_3.optval_end } as *mut u8;
    if unsafe { optval.add(1) } as *mut u8 > end {
        return false;
    }
    unsafe {
        (*optval).family = AF_INET6 as u16;
        (*optval).port_be = dst.port_be;
        (*optval).flowinfo = 0;
        (*optval).addr = dst.addr;
        (*optval).scope_id = 0;
        finish(so, core::mem::size_of::<SockaddrIn6>() as i32);
    }
    true
}

/// Sets `optlen` then `retval` with two separate 4-byte stores: merged into one 8-byte store
/// the verifier rejects the program (`invalid bpf_context access`).
#[inline(always)]
unsafe fn finish(so: *mut bpf_sockopt, len: i32) {
    unsafe {
        write_volatile(&raw mut (*so).optlen, len);
        write_volatile(&raw mut (*so).retval, 0);
    }
}
