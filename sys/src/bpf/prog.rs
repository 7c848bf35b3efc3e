//! Program loads: the instructions of a program built in user space ([`Insn`]), loading them
//! as a program of a hook ([`prog_load`], with the verifier's log on a rejection for
//! [`load_sk_lookup`]), a program's name, and the pace of program frees the kernel needs.

use std::{
    io,
    os::fd::{AsFd, OwnedFd},
};

use linkerd_cni_common::names::Hook;

use super::{Attr, bpf_fd, prog_info};
use crate::uapi;

/// `struct bpf_insn`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct Insn {
    pub code: u8,
    /// `dst_reg` in the low nibble, `src_reg` in the high one.
    pub regs: u8,
    pub off: i16,
    pub imm: i32,
}

/// One instruction: opcode, destination and source registers, offset, immediate.
pub const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: (dst & 0xf) | (src << 4),
        off,
        imm,
    }
}

/// `BPF_PROG_LOAD` of `insns` as a program of `hook` (its program type, and its attach type as
/// the expected one), named `name` (cut to 15 bytes), GPL; with a non-empty `log`, the
/// verifier writes its log there (level 1). The fd closes when the result drops.
pub fn prog_load(hook: Hook, name: &str, insns: &[Insn], log: &mut [u8]) -> io::Result<OwnedFd> {
    let license = c"GPL";
    let mut attr = Attr::new();
    attr.put_u32(0, hook.prog_type())
        .put_u32(4, insns.len() as u32)
        .put_u64(8, insns.as_ptr() as u64)
        .put_u64(16, license.as_ptr() as u64)
        .put_u32(68, hook.attach_type());
    if !log.is_empty() {
        attr.put_u32(24, 1)
            .put_u32(28, log.len() as u32)
            .put_u64(32, log.as_mut_ptr() as u64);
    }
    let n = name.len().min(15);
    attr.put_bytes(48, &name.as_bytes()[..n]);
    bpf_fd(uapi::BPF_PROG_LOAD, &mut attr)
}

/// `BPF_PROG_LOAD` of an `sk_lookup` program named `name` (at most 15 bytes). On a verifier
/// rejection the error carries the verifier's log.
pub fn load_sk_lookup(name: &str, insns: &[Insn]) -> io::Result<OwnedFd> {
    prog_load(Hook::SkLookup, name, insns, &mut []).or_else(|first| {
        let mut log = vec![0u8; 16 * 1024];
        match prog_load(Hook::SkLookup, name, insns, &mut log) {
            Ok(fd) => Ok(fd),
            Err(_) => {
                let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
                let log = String::from_utf8_lossy(&log[..end]);
                Err(io::Error::new(
                    first.kind(),
                    format!("{first}; verifier log: {log}"),
                ))
            }
        }
    })
}

/// The name a program was loaded with (`struct bpf_prog_info`'s `name`, at most 15 bytes).
pub fn prog_name(prog: impl AsFd) -> io::Result<String> {
    prog_info(prog).map(|i| i.name)
}

/// Programs whose last reference may be dropped before [`pace_program_frees`] pauses.
const FREES_PER_PAUSE: u32 = 256;
/// How long [`pace_program_frees`] pauses: several RCU grace periods, after which the JIT
/// images of the programs dropped before have been released.
const FREE_PAUSE: std::time::Duration = std::time::Duration::from_millis(50);

/// Call after dropping the last reference to `n` programs (a pod's `sk_lookup` stub, by
/// detaching or replacing its link): every [`FREES_PER_PAUSE`] of them, the calling thread
/// pauses for [`FREE_PAUSE`].
///
/// Why: a program's JIT image is released after an RCU grace period by a work item on the
/// kernel's `system_wq` (`bpf_jit_free`), which takes the JIT allocator's `pack_mutex`. When
/// about a thousand of those are pending on one CPU (the queue's concurrency limit) while a
/// program load holds that mutex and waits, inside `set_memory_rox`, for a vmap purge work item
/// queued behind them, every BPF program load on the node blocks for good (seen on 6.18 after
/// 10,000 stubs were dropped at once while stubs were being loaded). Pausing keeps the number
/// of pending frees far below that limit whatever the number of pods.
pub fn pace_program_frees(n: u32) {
    use std::sync::atomic::{AtomicU32, Ordering};
    static FREED: AtomicU32 = AtomicU32::new(0);
    let before = FREED.fetch_add(n, Ordering::Relaxed);
    if crosses_a_pause(before, n) {
        std::thread::sleep(FREE_PAUSE);
    }
}

/// Whether freeing `n` more programs after `before` reaches the next multiple of
/// [`FREES_PER_PAUSE`].
fn crosses_a_pause(before: u32, n: u32) -> bool {
    (before % FREES_PER_PAUSE) + n >= FREES_PER_PAUSE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_frees_pause_once_per_batch() {
        let pauses = |per_call: u32, calls: u32| {
            (0..calls)
                .filter(|i| crosses_a_pause(i * per_call, per_call))
                .count()
        };
        assert_eq!(pauses(1, FREES_PER_PAUSE - 1), 0);
        assert_eq!(pauses(1, FREES_PER_PAUSE), 1);
        assert_eq!(pauses(1, 10_000), 10_000 / FREES_PER_PAUSE as usize);
        assert_eq!(pauses(3, 1_000), 3_000 / FREES_PER_PAUSE as usize);
    }
}
