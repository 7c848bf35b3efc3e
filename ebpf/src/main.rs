//! The linkerd-cni eBPF programs. The cgroup ones attach to each meshed pod's cgroup (or to
//! one shared ancestor, filtered by netns cookie); `sk_lookup` runs in each pod's network
//! namespace, tail-called by a per-pod stub; the iterator is attached to nothing:
//!
//! - [`connect`]: `cgroup/connect4`, `cgroup/connect6` send the pod's outbound TCP to the proxy.
//! - [`sockops`]: records each redirected connection by its 4-tuple, then moves its original
//!   destination into the proxy's accepted socket.
//! - [`getsockopt`]: answers `SO_ORIGINAL_DST` on the proxy's accepted sockets.
//! - [`getpeername`]: shows the app its original destination as the peer.
//! - [`getsockname`]: shows the app its pod's address as its own local address.
//! - [`sk_lookup`]: hands connections arriving at the pod to the proxy's inbound listener
//!   (tail-called by a per-pod stub the agent builds).
//! - [`iter`]: `iter/tcp`, attached to nothing: the agent runs it inside a pod's network
//!   namespace to adopt a pod whose proxy listened before the programs were attached.
//!
//! What they return: every cgroup program returns 1 (allow), always: outbound redirection
//! rewrites the destination and never refuses a connection, and `getsockopt`, `getpeername`
//! and `getsockname` only rewrite answers. `sk_lookup` refuses: it returns `SK_DROP` when a
//! connection the proxy should take finds no inbound listener (fail closed), and `SK_PASS`
//! otherwise (with the listener assigned, or for what it lets through); the agent's per-pod
//! stub returns `SK_DROP` when its tail call fails. `iter/tcp` returns 0 (its output is the
//! records it writes).
#![no_std]
#![no_main]
// Map keys and values are passed by reference (`&key`) although aya-ebpf's maps take
// `impl Borrow<K>`: passed by value, they are copied to other stack slots and the programs
// come out longer (checked with llvm-objdump). The verifier and the 512-byte stack prefer
// them in place.
#![expect(
    clippy::needless_borrows_for_generic_args,
    reason = "a key passed by value is copied to another stack slot (see above)"
)]

mod addr;
mod connect;
mod getpeername;
mod getsockname;
mod getsockopt;
mod iter;
mod maps;
mod sk_lookup;
mod sockops;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // SAFETY: the verifier proves every program terminates; a panic path is never reached.
    unsafe { core::hint::unreachable_unchecked() }
}

/// The license the kernel is told: GPL-compatible (some helpers are GPL-only), and the same
/// as the crate's `license` in Cargo.toml (`GPL-2.0-only OR BSD-2-Clause`, the kernel's
/// "Dual BSD/GPL"; the agent's tests check that the two agree).
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual BSD/GPL\0";
