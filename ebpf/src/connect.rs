//! `cgroup/connect4` and `cgroup/connect6`: a meshed pod's outbound TCP goes to its proxy.
//!
//! The original destination is saved in the socket's own storage ([`APP_DST`]) for
//! [`crate::sockops`] and [`crate::getpeername`], then the destination is rewritten to the proxy's outbound listener
//! (`127.0.0.1:4140`, `[::1]:4140` for IPv6, `::ffff:127.0.0.1:4140` for v4-mapped).
//!
//! # Minimum kernel version
//! 4.17 (cgroup sock_addr hooks); `bpf_get_netns_cookie` here needs 5.7, socket storage from
//! these hooks 5.10 (verified on 6.18).

use aya_ebpf::{
    EbpfContext,
    bindings::bpf_sock_addr,
    helpers::generated::{bpf_get_current_uid_gid, bpf_get_netns_cookie},
    macros::cgroup_sock_addr,
    programs::SockAddrContext,
};
use linkerd_cni_common::{
    FAMILY_V4, FAMILY_V6, FLAG_EXEMPT_GID, FLAG_EXEMPT_UID, FLAG_IPV6, IPPROTO_TCP, OrigDst,
    PodConfig, is_v4_mapped, v4_mapped_words,
};

use crate::{
    addr::{LOOPBACK4_BE, outbound_redirected, read_ip6},
    maps::{APP_DST, POD_CONFIG, count, store_dst},
};

const ALLOW: i32 = 1;

#[cgroup_sock_addr(connect4)]
pub fn l5d_connect4(ctx: SockAddrContext) -> i32 {
    // SAFETY: the kernel hands a valid `bpf_sock_addr`.
    unsafe { connect4(&ctx) };
    ALLOW
}

#[cgroup_sock_addr(connect6)]
pub fn l5d_connect6(ctx: SockAddrContext) -> i32 {
    // SAFETY: as above.
    unsafe { connect6(&ctx) };
    ALLOW
}

/// The pod's config when this socket's owner is subject to redirection.
#[inline(always)]
unsafe fn meshed_caller(ctx: &SockAddrContext) -> Option<(u64, PodConfig)> {
    let sa = ctx.sock_addr;
    if unsafe { (*sa).protocol } != IPPROTO_TCP {
        return None;
    }
    let netns = unsafe { bpf_get_netns_cookie(ctx.as_ptr()) };
    let cfg = *unsafe { POD_CONFIG.get(&netns) }?;
    let uid_gid = unsafe { bpf_get_current_uid_gid() };
    let (uid, gid) = (uid_gid as u32, (uid_gid >> 32) as u32);
    if (cfg.flags & FLAG_EXEMPT_UID != 0 && uid == cfg.proxy_uid)
        || (cfg.flags & FLAG_EXEMPT_GID != 0 && gid == cfg.proxy_gid)
    {
        count(netns, |s| &mut s.out_exempt_owner);
        return None;
    }
    Some((netns, cfg))
}

/// Saves the original destination in the socket's storage.
#[inline(always)]
unsafe fn save(ctx: &SockAddrContext, dst: &OrigDst) -> bool {
    let sk = unsafe { (*ctx.sock_addr).__bindgen_anon_1.sk };
    // SAFETY: the hook's socket, checked for null.
    !sk.is_null() && unsafe { store_dst(&APP_DST, sk.cast(), dst) }
}

unsafe fn connect4(ctx: &SockAddrContext) {
    let Some((netns, cfg)) = (unsafe { meshed_caller(ctx) }) else {
        return;
    };
    let sa: *mut bpf_sock_addr = ctx.sock_addr;
    let ip = unsafe { (*sa).user_ip4 };
    let port_be = unsafe { (*sa).user_port } as u16;
    let words = v4_mapped_words(ip);
    if is_local4(ip) || !outbound_redirected(&cfg, netns, &words, u16::from_be(port_be)) {
        count(netns, |s| &mut s.out_skipped);
        return;
    }
    let dst = OrigDst {
        addr: words,
        port_be,
        family: FAMILY_V4,
    };
    if !unsafe { save(ctx, &dst) } {
        // Without a saved destination the proxy could not forward: leave the connect alone.
        return;
    }
    unsafe {
        (*sa).user_ip4 = LOOPBACK4_BE;
        (*sa).user_port = u32::from(cfg.outbound_port.to_be());
    }
    count(netns, |s| &mut s.out_redirected);
}

unsafe fn connect6(ctx: &SockAddrContext) {
    let Some((netns, cfg)) = (unsafe { meshed_caller(ctx) }) else {
        return;
    };
    let sa: *mut bpf_sock_addr = ctx.sock_addr;
    // Read the words one by one: the context only allows 4-byte loads of `user_ip6`.
    let words = unsafe { read_ip6(&raw const (*sa).user_ip6) };
    let port_be = unsafe { (*sa).user_port } as u16;
    let port = u16::from_be(port_be);
    let mapped = is_v4_mapped(&words);
    let skip = if mapped {
        // An IPv4 connection made through an IPv6 socket: IPv4 rules apply.
        is_local4(words[3])
    } else {
        cfg.flags & FLAG_IPV6 == 0 || is_local6(&words)
    };
    if skip || !outbound_redirected(&cfg, netns, &words, port) {
        count(netns, |s| &mut s.out_skipped);
        return;
    }
    let family = if mapped { FAMILY_V4 } else { FAMILY_V6 };
    let dst = OrigDst {
        addr: words,
        port_be,
        family,
    };
    if !unsafe { save(ctx, &dst) } {
        return;
    }
    let proxy = if mapped {
        v4_mapped_words(LOOPBACK4_BE)
    } else {
        [0, 0, 0, 1u32.to_be()]
    };
    unsafe {
        (*sa).user_ip6[0] = proxy[0];
        (*sa).user_ip6[1] = proxy[1];
        (*sa).user_ip6[2] = proxy[2];
        (*sa).user_ip6[3] = proxy[3];
        (*sa).user_port = u32::from(cfg.outbound_port.to_be());
    }
    count(netns, |s| &mut s.out_redirected);
}

/// 127.0.0.0/8 and 0.0.0.0 stay in the pod (iptables sees them leave via `lo`).
#[inline(always)]
fn is_local4(ip_be: u32) -> bool {
    let first = ip_be.to_ne_bytes()[0];
    first == 127 || ip_be == 0
}

/// `::1` and `::`.
#[inline(always)]
fn is_local6(words: &[u32; 4]) -> bool {
    words[0] == 0 && words[1] == 0 && words[2] == 0 && (words[3] == 0 || words[3] == 1u32.to_be())
}
