//! A stand-in for another tenant's socket load balancer (Cilium's and Calico's connect-time
//! load balancing), for the coexistence tests only: a separate object, never embedded in the
//! agent and never shipped.
//!
//! `connect4`/`connect6` rewrite one Service address (`vip:port`) to one backend; and
//! `getpeername4`/`getpeername6` show the Service address again for a socket whose peer is that
//! backend. Loopback and every other address are left alone, and no connection is ever refused.
//! The Service is slot 0 of [`TENANT_SVC`], written by the test; [`TENANT_HITS`] counts the
//! rewrites (slot 0: connects, slot 1: peer names).
//!
//! [`tenant_lookup`] stands for another tenant's `sk_lookup` program in a pod's network
//! namespace: it selects no socket and passes every connection on.
#![no_std]
#![no_main]

use core::ptr::read_volatile;

use aya_ebpf::{
    bindings::bpf_sock_addr,
    btf_maps::Array,
    macros::{btf_map, cgroup_sock_addr, sk_lookup},
    programs::{SkLookupContext, SockAddrContext},
};

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // SAFETY: the verifier proves every program terminates; a panic path is never reached.
    unsafe { core::hint::unreachable_unchecked() }
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual BSD/GPL\0";

/// One Service. Addresses and ports in network byte order, ports as the context holds them
/// (the 16-bit port in the low half of a 32-bit word).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Service {
    pub vip4: u32,
    pub backend4: u32,
    pub vport: u32,
    pub bport: u32,
    pub vip6: [u32; 4],
    pub backend6: [u32; 4],
}

#[btf_map(name = "tenant_svc")]
static TENANT_SVC: Array<Service, 1> = Array::new();

#[btf_map(name = "tenant_hits")]
static TENANT_HITS: Array<u64, 2> = Array::new();

const ALLOW: i32 = 1;

#[inline(always)]
fn hit(slot: u32) {
    if let Some(n) = TENANT_HITS.get_ptr_mut(slot) {
        // SAFETY: a valid slot of the array; a lost increment under a race is harmless here.
        unsafe { *n += 1 };
    }
}

#[inline(always)]
unsafe fn read6(field: *const [u32; 4]) -> [u32; 4] {
    let w = field.cast::<u32>();
    // SAFETY: four words of a readable context field, as the caller promises.
    unsafe {
        [
            read_volatile(w),
            read_volatile(w.add(1)),
            read_volatile(w.add(2)),
            read_volatile(w.add(3)),
        ]
    }
}

#[inline(always)]
unsafe fn write6(sa: *mut bpf_sock_addr, ip: [u32; 4], port: u32) {
    // SAFETY: 4-byte stores to writable context fields.
    unsafe {
        (*sa).user_ip6[0] = ip[0];
        (*sa).user_ip6[1] = ip[1];
        (*sa).user_ip6[2] = ip[2];
        (*sa).user_ip6[3] = ip[3];
        (*sa).user_port = port;
    }
}

#[cgroup_sock_addr(connect4)]
pub fn tenant_sock4_connect(ctx: SockAddrContext) -> i32 {
    let Some(svc) = TENANT_SVC.get(0) else {
        return ALLOW;
    };
    let sa = ctx.sock_addr;
    // SAFETY: 4-byte loads and stores of the context's address fields.
    unsafe {
        if (*sa).user_ip4 == svc.vip4 && (*sa).user_port == svc.vport {
            (*sa).user_ip4 = svc.backend4;
            (*sa).user_port = svc.bport;
            hit(0);
        }
    }
    ALLOW
}

#[cgroup_sock_addr(getpeername4)]
pub fn tenant_peer4(ctx: SockAddrContext) -> i32 {
    let Some(svc) = TENANT_SVC.get(0) else {
        return ALLOW;
    };
    let sa = ctx.sock_addr;
    // SAFETY: as above.
    unsafe {
        if (*sa).user_ip4 == svc.backend4 && (*sa).user_port == svc.bport {
            (*sa).user_ip4 = svc.vip4;
            (*sa).user_port = svc.vport;
            hit(1);
        }
    }
    ALLOW
}

#[cgroup_sock_addr(connect6)]
pub fn tenant_connect6(ctx: SockAddrContext) -> i32 {
    let Some(svc) = TENANT_SVC.get(0) else {
        return ALLOW;
    };
    let sa = ctx.sock_addr;
    // SAFETY: as above.
    unsafe {
        if read6(&raw const (*sa).user_ip6) == svc.vip6 && (*sa).user_port == svc.vport {
            write6(sa, svc.backend6, svc.bport);
            hit(0);
        }
    }
    ALLOW
}

#[cgroup_sock_addr(getpeername6)]
pub fn tenant_peer6(ctx: SockAddrContext) -> i32 {
    let Some(svc) = TENANT_SVC.get(0) else {
        return ALLOW;
    };
    let sa = ctx.sock_addr;
    // SAFETY: as above.
    unsafe {
        if read6(&raw const (*sa).user_ip6) == svc.backend6 && (*sa).user_port == svc.bport {
            write6(sa, svc.vip6, svc.vport);
            hit(1);
        }
    }
    ALLOW
}

#[sk_lookup]
pub fn tenant_lookup(_ctx: SkLookupContext) -> u32 {
    // SK_PASS: no socket selected, the next program (or the usual lookup) decides.
    1
}
