//! `sockops`: ties redirected connections to the sockets the proxy accepts, and registers the
//! proxy's inbound listener.
//!
//! - `ACTIVE_ESTABLISHED_CB`: the 4-tuple is now known; a socket connected to the proxy's
//!   loopback address with an original destination in its storage ([`APP_DST`], saved by
//!   [`crate::connect`]) hands it to the 4-tuple map under the app side's address and port,
//!   which is the peer of the proxy's accepted socket. Any other socket returns after the
//!   address check, or after one storage lookup and one probe of [`SOCK_DST`] (empty but for
//!   sockets connected under layout-2 programs); the app socket asks for no state callback
//!   (its storage goes with it).
//! - `TCP_CONNECT_CB`, for sockets that connected under layout-2 programs (an upgrade while
//!   they connect; their destination is under their cookie in [`SOCK_DST`]): ask for state
//!   callbacks so that entry is removed however the connection ends; `ACTIVE_ESTABLISHED_CB`
//!   hands it over the same way, and asks for them itself when the socket's `TCP_CONNECT_CB`
//!   ran the previous generation's sockops.
//! - `PASSIVE_ESTABLISHED_CB`: the proxy's side of a redirected outbound connection completed
//!   its handshake: move the original destination from the 4-tuple map into the accepted
//!   socket's own storage ([`ACC_DST`]), where `SO_ORIGINAL_DST` finds it for as long as that
//!   socket exists, however early the app closes and however late the proxy accepts. The
//!   kernel frees it with the socket. A socket accepted from outside the pod (inbound, handed
//!   to the proxy by [`crate::sk_lookup`], or passed to the app) gets its own local address
//!   there: `sk_lookup` rewrites nothing, so the address the client dialled is the socket's
//!   local address. Nothing is recorded for inbound connections before they exist: a segment
//!   that opens no connection (a late retransmission of one the pod already closed) also runs
//!   `sk_lookup`, and an entry made there would be owned by no socket. The client's `ACTIVE_ESTABLISHED_CB` always runs first (it runs before the client
//!   sends the final ACK), except with TCP Fast Open: then the 4-tuple entry stays, and
//!   `getsockopt` falls back to it. Accepted sockets of a netns without a pod config (an
//!   unmeshed pod under the shared attachment) stop at that lookup; a meshed pod's config
//!   only goes at its DEL, when a connection still in flight keeps its 4-tuple entry for the
//!   same fallback.
//! - `TCP_LISTEN_CB`: a socket of a meshed pod listens on the inbound proxy port; put it in
//!   the listener SOCKHASH (the kernel removes it when the socket closes).
//! - `STATE_CB` to `TCP_CLOSE` (only sockets that asked: a layout-2 app socket, an accepted
//!   socket whose storage could not be allocated): forget the connection's entries.
//!
//! A 4-tuple entry whose proxy side never completes its handshake (the proxy gone, the
//! connection reset before the proxy's kernel answered) is left to the map's LRU eviction.
//!
//! # Minimum kernel version
//! 4.13 (sock_ops), 5.15 for `bpf_get_netns_cookie` here.

use core::ptr::read_volatile;

use aya_ebpf::{
    EbpfContext,
    bindings::{
        BPF_ANY, BPF_NOEXIST, BPF_SK_STORAGE_GET_F_CREATE, BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB,
        BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB, BPF_SOCK_OPS_STATE_CB, BPF_SOCK_OPS_STATE_CB_FLAG,
        BPF_SOCK_OPS_TCP_CONNECT_CB, BPF_SOCK_OPS_TCP_LISTEN_CB, BPF_TCP_CLOSE,
    },
    helpers::generated::{bpf_get_netns_cookie, bpf_get_socket_cookie, bpf_sk_storage_get},
    macros::sock_ops,
    programs::SockOpsContext,
};
use linkerd_cni_common::{
    AF_INET, AF_INET6, ConnKey, FAMILY_V4, FAMILY_V6, ListenerKey, OrigDst, is_v4_mapped,
    v4_mapped_words,
};

use crate::{
    addr::{LOOPBACK4_BE, read_ip6},
    maps::{ACC_DST, APP_DST, CONN_DST, LISTENERS, POD_CONFIG, SOCK_DST, stored_dst},
};

/// The original destination in the socket's storage, saved by [`crate::connect`].
#[inline(always)]
unsafe fn app_dst(ctx: &SockOpsContext) -> Option<OrigDst> {
    let sk = unsafe { (*ctx.ops).__bindgen_anon_2.sk };
    // SAFETY: the context's socket, checked for null.
    (!sk.is_null())
        .then(|| unsafe { stored_dst(&APP_DST, sk.cast()) })
        .flatten()
}

#[sock_ops]
pub fn l5d_sockops(ctx: SockOpsContext) -> u32 {
    // SAFETY: the kernel hands a valid `bpf_sock_ops`.
    unsafe { sockops(&ctx) };
    1
}

unsafe fn sockops(ctx: &SockOpsContext) {
    match ctx.op() {
        BPF_SOCK_OPS_TCP_CONNECT_CB => {
            // Only a socket redirected by layout-2 programs needs anything here: it connects
            // to loopback with no storage of ours and its destination under its cookie.
            if !unsafe { to_loopback(ctx) } || unsafe { app_dst(ctx) }.is_some() {
                return;
            }
            let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
            // SAFETY: lookup only.
            if unsafe { SOCK_DST.get(&cookie) }.is_some() {
                watch_state(ctx);
            }
        }
        BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB => {
            // Redirected sockets connect to the proxy's loopback address: every other one (the
            // proxy's own connects, unredirected apps) stops at the address check.
            if !unsafe { to_loopback(ctx) } {
                return;
            }
            let dst = match unsafe { app_dst(ctx) } {
                Some(dst) => dst,
                // A layout-2 socket. Its `TCP_CONNECT_CB` may have run the previous
                // generation's sockops (the links are swapped between the two callbacks),
                // which asked for no state callbacks: ask now, so the entry goes with it.
                None => {
                    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
                    // SAFETY: the value is copied out at once.
                    let Some(dst) = (unsafe { SOCK_DST.get(&cookie) }).copied() else {
                        return;
                    };
                    if ctx.cb_flags() & BPF_SOCK_OPS_STATE_CB_FLAG == 0 {
                        watch_state(ctx);
                    }
                    dst
                }
            };
            let netns_cookie = unsafe { bpf_get_netns_cookie(ctx.as_ptr()) };
            let tuple = unsafe { Tuple::read(ctx, netns_cookie) };
            let _ = CONN_DST.insert(&tuple.app_side_key(), &dst, 0);
        }
        BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB => {
            // Every accepted socket of every attached cgroup gets here: a pod without a
            // config (an unmeshed pod under the shared attachment) stops at one small hash
            // probe instead of reading the 4-tuple and probing the connection map.
            let netns_cookie = unsafe { bpf_get_netns_cookie(ctx.as_ptr()) };
            // SAFETY: lookup only.
            if unsafe { POD_CONFIG.get(&netns_cookie) }.is_none() {
                return;
            }
            let tuple = unsafe { Tuple::read(ctx, netns_cookie) };
            let key = tuple.accepted_key();
            // SAFETY: the value is copied out at once.
            let handed_over = (unsafe { CONN_DST.get(&key) }).copied();
            let mut dst = match handed_over {
                Some(dst) => dst,
                // Not an outbound connection to the proxy: a connection from outside keeps the
                // address its client dialled as its local address (`sk_lookup` assigns the
                // socket, it rewrites nothing), and that is its original destination. The
                // pod's own connections (loopback, or from its own address) need none.
                None if !tuple.is_pods_own() => tuple.local_dst(),
                None => return,
            };
            // SAFETY: the context's socket, checked for null; `dst` initialises new storage.
            let stored = unsafe {
                let sk = (*ctx.ops).__bindgen_anon_2.sk;
                !sk.is_null()
                    && !bpf_sk_storage_get(
                        core::ptr::from_ref(&ACC_DST).cast_mut().cast(),
                        sk.cast(),
                        core::ptr::from_mut(&mut dst).cast(),
                        u64::from(BPF_SK_STORAGE_GET_F_CREATE),
                    )
                    .is_null()
            };
            if handed_over.is_none() {
                return;
            }
            if stored {
                let _ = CONN_DST.remove(&key);
            } else {
                // No memory for the storage: keep the 4-tuple entry until the socket closes.
                watch_state(ctx);
            }
        }
        BPF_SOCK_OPS_TCP_LISTEN_CB => unsafe { listening(ctx) },
        BPF_SOCK_OPS_STATE_CB => {
            if ctx.arg(1) != BPF_TCP_CLOSE {
                return;
            }
            let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
            let app = SOCK_DST.remove(&cookie).is_ok();
            let netns_cookie = unsafe { bpf_get_netns_cookie(ctx.as_ptr()) };
            let tuple = unsafe { Tuple::read(ctx, netns_cookie) };
            // Only sockets we asked state callbacks for get here. A redirected app socket (it
            // still had a saved destination) owns at most its app-side entry: one removal.
            // Otherwise (an accepted socket whose storage could not be allocated, or an app
            // socket whose saved destination the LRU evicted) either side may own one.
            let _ = CONN_DST.remove(&tuple.app_side_key());
            if !app {
                let _ = CONN_DST.remove(&tuple.accepted_key());
            }
        }
        _ => {}
    }
}

/// Whether the socket's remote address is one [`crate::connect`] rewrites to: `127.0.0.1`,
/// `::ffff:127.0.0.1` or `::1`. Every load happens before choosing (see [`Tuple::read`]).
#[inline(always)]
unsafe fn to_loopback(ctx: &SockOpsContext) -> bool {
    let ops = ctx.ops;
    let (family, rip4, rip6) = unsafe {
        (
            read_volatile(&raw const (*ops).family),
            read_volatile(&raw const (*ops).remote_ip4),
            read_ip6(&raw const (*ops).remote_ip6),
        )
    };
    if family == AF_INET {
        rip4 == LOOPBACK4_BE
    } else {
        rip6 == v4_mapped_words(LOOPBACK4_BE) || rip6 == [0, 0, 0, 1u32.to_be()]
    }
}

fn watch_state(ctx: &SockOpsContext) {
    let _ = ctx.set_cb_flags((ctx.cb_flags() | BPF_SOCK_OPS_STATE_CB_FLAG) as i32);
}

/// A meshed pod's socket listens: if it is the inbound proxy port, it becomes the pod's
/// inbound listener for its family. An IPv6 listener also serves IPv4 until an IPv4 one exists
/// (dual-stack sockets accept both).
unsafe fn listening(ctx: &SockOpsContext) {
    let netns_cookie = unsafe { bpf_get_netns_cookie(ctx.as_ptr()) };
    // SAFETY: the value is copied out at once.
    let Some(cfg) = (unsafe { POD_CONFIG.get(&netns_cookie) }).copied() else {
        return;
    };
    if ctx.local_port() != u32::from(cfg.inbound_port) {
        return;
    }
    let family = ctx.family();
    let mut key = ListenerKey {
        netns_cookie,
        family,
        _pad: 0,
    };
    // SAFETY: `ops` is the program's context.
    let ops = unsafe { &mut *ctx.ops };
    let _ = LISTENERS.update(&mut key, &mut *ops, u64::from(BPF_ANY));
    if family == AF_INET6 {
        let mut v4 = ListenerKey {
            netns_cookie,
            family: AF_INET,
            _pad: 0,
        };
        let _ = LISTENERS.update(&mut v4, ops, u64::from(BPF_NOEXIST));
    }
}

/// The connection's addresses, IPv4 as v4-mapped, ports in host order.
struct Tuple {
    netns_cookie: u64,
    local: [u32; 4],
    local_port: u32,
    remote: [u32; 4],
    remote_port: u32,
}

impl Tuple {
    /// Reads the context with volatile loads, all of them before choosing: with a load in each
    /// branch LLVM merges them into one load at `ctx + variable offset`, which the verifier
    /// rejects (`dereference of modified ctx ptr`).
    #[inline(always)]
    unsafe fn read(ctx: &SockOpsContext, netns_cookie: u64) -> Self {
        let ops = ctx.ops;
        let v = |p: *const u32| unsafe { read_volatile(p) };
        let (family, lip4, rip4, lport, rport) = unsafe {
            (
                v(&raw const (*ops).family),
                v(&raw const (*ops).local_ip4),
                v(&raw const (*ops).remote_ip4),
                v(&raw const (*ops).local_port),
                v(&raw const (*ops).remote_port),
            )
        };
        let (lip6, rip6) = unsafe {
            (
                read_ip6(&raw const (*ops).local_ip6),
                read_ip6(&raw const (*ops).remote_ip6),
            )
        };
        // A v4-mapped connection reports `::ffff:a.b.c.d` as its IPv6 addresses: same keys.
        let v4 = family == AF_INET;
        Tuple {
            netns_cookie,
            local: if v4 { v4_mapped_words(lip4) } else { lip6 },
            local_port: lport,
            remote: if v4 { v4_mapped_words(rip4) } else { rip6 },
            // `remote_port` is network order in the upper half of a host-order u32.
            remote_port: u32::from(u16::from_be((rport >> 16) as u16)),
        }
    }

    /// Key of an outbound connection, from the app's socket: the proxy's accepted socket sees
    /// the app side as its peer.
    fn app_side_key(&self) -> ConnKey {
        ConnKey {
            netns_cookie: self.netns_cookie,
            addr: self.local,
            port: self.local_port,
            proxy_port: self.remote_port,
        }
    }

    /// Whether both ends are the pod's own: a loopback local address, or the peer's address
    /// equal to the local one (what `sk_lookup` passes as the pod's own traffic).
    fn is_pods_own(&self) -> bool {
        let w = self.local;
        let loopback4 = is_v4_mapped(&w) && w[3].to_ne_bytes()[0] == 127;
        loopback4 || w == [0, 0, 0, 1u32.to_be()] || self.remote == self.local
    }

    /// The local address and port as an original destination.
    fn local_dst(&self) -> OrigDst {
        OrigDst {
            addr: self.local,
            port_be: (self.local_port as u16).to_be(),
            family: if is_v4_mapped(&self.local) {
                FAMILY_V4
            } else {
                FAMILY_V6
            },
        }
    }

    /// Key of an accepted socket (its peer, and its own port), as `getsockopt` builds it.
    fn accepted_key(&self) -> ConnKey {
        ConnKey {
            netns_cookie: self.netns_cookie,
            addr: self.remote,
            port: self.remote_port,
            proxy_port: self.local_port,
        }
    }
}
