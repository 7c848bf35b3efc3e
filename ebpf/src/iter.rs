//! `iter/tcp`: the listening TCP sockets of one network namespace, for adopting a pod whose
//! proxy listened before any program of ours was attached (so `sockops` never saw its
//! `listen()`).
//!
//! The agent writes [`ITER_ARGS`] and creates an iterator from a thread inside the pod's
//! network namespace: a TCP iterator walks the sockets of the namespace of the task that
//! creates it (`bpf_iter_init_seq_net` takes `current->nsproxy->net_ns`). For every socket in
//! `TCP_LISTEN` this program writes one [`IterListener`] (owner, family, port) to the
//! iterator's output; with [`ITER_REGISTER`], a listener on the inbound proxy port owned by
//! the proxy UID goes into the listener SOCKHASH under the pod's netns cookie, exactly as
//! `sockops` puts it there at `listen()` (an IPv6 listener also serves IPv4 until an IPv4 one
//! exists), and the record says what the update returned. No process of the pod is touched:
//! the agent needs neither the host's PID namespace nor `pidfd_getfd`.
//!
//! The verifier lets an iterator update a SOCKHASH (`may_update_sockmap`: `BPF_TRACE_ITER`)
//! with the context's `sock_common` (a `PTR_TO_BTF_ID` the value argument accepts as
//! `ARG_PTR_TO_BTF_ID_SOCK_COMMON`); the kernel runs the program with the socket locked
//! (`lock_sock`), and `sock_map_update_elem` takes the socket's spinlock and accepts TCP
//! sockets in `LISTEN`.
//!
//! Rust has no CO-RE field relocations: the state, family and port are read at the fixed
//! offsets of `linkerd_cni_common::ITER_KERNEL_FIELDS`, which the agent checks against the
//! running kernel's BTF before it runs this program.
//!
//! # Minimum kernel version
//! 5.10 (SOCKHASH updates from an iterator; TCP iterators and `bpf_seq_write` are 5.8/5.9).

use core::{ffi::c_void, ptr::read_volatile};

use aya_ebpf::{
    bindings::{BPF_ANY, BPF_NOEXIST, seq_file},
    helpers::generated::{bpf_map_update_elem, bpf_seq_write},
};
use linkerd_cni_common::{
    AF_INET, AF_INET6, ITER_NOT_TRIED, ITER_REGISTER, IterListener, ListenerKey, SKC_FAMILY_OFFSET,
    SKC_NUM_OFFSET, SKC_STATE_OFFSET, TCP_LISTEN,
};

use crate::maps::{ITER_ARGS, LISTENERS};

/// `struct bpf_iter_meta`: only its first member is read.
#[repr(C)]
struct IterMeta {
    seq: *mut seq_file,
}

/// `struct bpf_iter__tcp`, the program's context.
#[repr(C)]
pub struct IterTcp {
    meta: *const IterMeta,
    sk_common: *const u8,
    uid: u32,
}

#[unsafe(no_mangle)]
#[unsafe(link_section = "iter/tcp")]
pub fn l5d_iter_tcp(ctx: *const IterTcp) -> i32 {
    // SAFETY: the kernel hands a valid `bpf_iter__tcp`; its socket is checked for null.
    unsafe { iter_tcp(ctx) };
    0
}

#[inline(always)]
unsafe fn iter_tcp(ctx: *const IterTcp) {
    let sk = unsafe { read_volatile(&raw const (*ctx).sk_common) };
    // The last call of a run has no socket.
    if sk.is_null() {
        return;
    }
    // SAFETY: kernel memory behind a BTF pointer: the verifier turns these into checked loads.
    let state = unsafe { read_volatile(sk.add(SKC_STATE_OFFSET as usize)) };
    if state != TCP_LISTEN {
        return;
    }
    let (port, family) = unsafe {
        (
            read_volatile(sk.add(SKC_NUM_OFFSET as usize).cast::<u16>()),
            read_volatile(sk.add(SKC_FAMILY_OFFSET as usize).cast::<u16>()),
        )
    };
    let uid = unsafe { read_volatile(&raw const (*ctx).uid) };
    let mut record = IterListener {
        uid,
        family,
        port,
        registered: ITER_NOT_TRIED,
        _pad: 0,
    };
    if let Some(args) = ITER_ARGS.get_ptr(0) {
        // SAFETY: the map's value, copied out at once.
        let args = unsafe { *args };
        if args.flags & ITER_REGISTER != 0 && port == args.inbound_port && uid == args.proxy_uid {
            record.registered = unsafe { register(sk, args.netns_cookie, u32::from(family)) };
        }
    }
    let meta = unsafe { read_volatile(&raw const (*ctx).meta) };
    if meta.is_null() {
        return;
    }
    let seq = unsafe { read_volatile(&raw const (*meta).seq) };
    // SAFETY: the iterator's own seq_file; the record lives on this stack.
    let _ = unsafe {
        bpf_seq_write(
            seq,
            (&raw const record).cast(),
            size_of::<IterListener>() as u32,
        )
    };
}

/// Puts the listening socket `sk` in the listener SOCKHASH as the pod's listener for `family`
/// (and, for IPv6, for IPv4 unless one is there). Returns what the first update returned.
#[inline(always)]
unsafe fn register(sk: *const u8, netns_cookie: u64, family: u32) -> i32 {
    let map = core::ptr::from_ref(&LISTENERS).cast_mut().cast::<c_void>();
    let key = ListenerKey {
        netns_cookie,
        family,
        _pad: 0,
    };
    // SAFETY: `sk` is the context's `sock_common`, which a SOCKHASH update accepts.
    let ret =
        unsafe { bpf_map_update_elem(map, (&raw const key).cast(), sk.cast(), u64::from(BPF_ANY)) }
            as i32;
    if family == AF_INET6 {
        let v4 = ListenerKey {
            netns_cookie,
            family: AF_INET,
            _pad: 0,
        };
        let _ = unsafe {
            bpf_map_update_elem(
                map,
                (&raw const v4).cast(),
                sk.cast(),
                u64::from(BPF_NOEXIST),
            )
        };
    }
    ret
}
