//! `sockops`: ties a redirected app socket to the connection the proxy accepts.
//!
//! - `TCP_CONNECT_CB` (the app's SYN is about to leave): ask for state callbacks on sockets we
//!   redirected, so their entries are removed however the connection ends.
//! - `ACTIVE_ESTABLISHED_CB`: the 4-tuple is now known; store the original destination under
//!   the app side's address and port, which is the peer of the proxy's accepted socket.
//! - `STATE_CB` to `TCP_CLOSE`: forget both entries, so the maps hold no more entries than
//!   live connections.
//!
//! # Minimum kernel version
//! 4.13 (sock_ops), 5.7 for `bpf_get_netns_cookie` here.

use core::ptr::read_volatile;

use aya_ebpf::{
    bindings::{
        BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB, BPF_SOCK_OPS_STATE_CB, BPF_SOCK_OPS_STATE_CB_FLAG,
        BPF_SOCK_OPS_TCP_CONNECT_CB, BPF_TCP_CLOSE,
    },
    helpers::generated::{bpf_get_netns_cookie, bpf_get_socket_cookie},
    macros::sock_ops,
    programs::SockOpsContext,
    EbpfContext,
};
use linkerd_cni_common::{v4_mapped_words, ConnKey};

use crate::maps::{CONN_DST, SOCK_DST};

const AF_INET: u32 = 2;

#[sock_ops]
pub fn l5d_sockops(ctx: SockOpsContext) -> u32 {
    // SAFETY: the kernel hands a valid `bpf_sock_ops`.
    unsafe { sockops(&ctx) };
    1
}

unsafe fn sockops(ctx: &SockOpsContext) {
    match ctx.op() {
        BPF_SOCK_OPS_TCP_CONNECT_CB => {
            let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
            // SAFETY: lookup only.
            if unsafe { SOCK_DST.get(&cookie) }.is_some() {
                let _ = ctx.set_cb_flags((ctx.cb_flags() | BPF_SOCK_OPS_STATE_CB_FLAG) as i32);
            }
        }
        BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB => {
            let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
            // SAFETY: the value is copied out at once.
            let Some(dst) = (unsafe { SOCK_DST.get(&cookie) }).copied() else { return };
            let key = unsafe { conn_key(ctx) };
            let _ = CONN_DST.insert(&key, &dst, 0);
        }
        BPF_SOCK_OPS_STATE_CB => {
            if ctx.arg(1) != BPF_TCP_CLOSE {
                return;
            }
            let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
            if SOCK_DST.remove(&cookie).is_ok() {
                let key = unsafe { conn_key(ctx) };
                let _ = CONN_DST.remove(&key);
            }
        }
        _ => {}
    }
}

/// The app side of the connection, as the proxy's accepted socket sees its peer.
///
/// Context fields are read with volatile loads, all of them, before choosing: with a load in
/// each branch LLVM merges them into one load at `ctx + variable offset`, which the verifier
/// rejects (`dereference of modified ctx ptr`).
#[inline(always)]
unsafe fn conn_key(ctx: &SockOpsContext) -> ConnKey {
    let ops = ctx.ops;
    // Both addresses are loaded unconditionally and the choice is made on values.
    let (family, ip4, ip6) = unsafe {
        (
            read_volatile(&raw const (*ops).family),
            read_volatile(&raw const (*ops).local_ip4),
            [
                read_volatile(&raw const (*ops).local_ip6[0]),
                read_volatile(&raw const (*ops).local_ip6[1]),
                read_volatile(&raw const (*ops).local_ip6[2]),
                read_volatile(&raw const (*ops).local_ip6[3]),
            ],
        )
    };
    // A v4-mapped connection reports `::ffff:a.b.c.d` as its IPv6 address: the same key.
    let addr = if family == AF_INET { v4_mapped_words(ip4) } else { ip6 };
    ConnKey {
        netns_cookie: unsafe { bpf_get_netns_cookie(ctx.as_ptr()) },
        addr,
        port: unsafe { read_volatile(&raw const (*ops).local_port) },
        // `remote_port` is network order in the upper half of a host-order u32.
        proxy_port: u32::from(u16::from_be((unsafe { read_volatile(&raw const (*ops).remote_port) } >> 16) as u16)),
    }
}
