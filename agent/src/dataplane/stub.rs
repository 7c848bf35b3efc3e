//! Each meshed pod's `sk_lookup` stub: a handful of instructions built here, carrying the pod's
//! netns cookie, loaded with `linkerd_cni_sys::bpf::load_sk_lookup` (a full object load per
//! pod costs ~100 times more).

use std::os::fd::{AsRawFd, BorrowedFd};

use linkerd_cni_sys::{
    bpf::{Insn, insn},
    uapi::{
        BPF_ADD64_IMM, BPF_CALL, BPF_EXIT, BPF_FUNC_MAP_LOOKUP_ELEM, BPF_FUNC_TAIL_CALL,
        BPF_JEQ_IMM, BPF_LD_IMM64, BPF_LDX_MEM_W, BPF_MOV64_IMM, BPF_MOV64_REG, BPF_PSEUDO_MAP_FD,
        BPF_ST_MEM_W, BPF_STX_MEM_DW, BPF_XOR64_REG, SK_DROP, SK_LOOKUP_FAMILY,
    },
};

/// The instructions of a pod's `sk_lookup` stub:
///
/// ```text
/// r6 = r1                                  ; the context
/// *(u32 *)(r10 - 4) = 0; r2 = r10 - 4      ; key 0
/// r0 = map_lookup_elem(scratch, r2)        ; this CPU's slot
/// if r0 == 0 goto drop
/// *(u64 *)r0 = netns_cookie
/// r3 = ctx->family; r3 ^= r3               ; index 0, not a constant to the verifier
/// tail_call(r6, prog_array, r3)            ; the shared program; does not return
/// drop: return SK_DROP                     ; no shared program: refuse (fail closed)
/// ```
///
/// The index is 0 but not a constant the verifier knows: with a constant index the JIT emits
/// a direct jump and the kernel tracks the program on the program array's list of programs to
/// patch (`prog_array_map_poke_track`), which it searches linearly on every load and free, and
/// walks on every update of the array, patching each program's code. With 10,000 stubs that
/// made a stub's load 2.5 times slower (124 → 307 µs median from the first to the last 1,000
/// pods of a fill), and an upgrade's swap of the shared program 10,000 text patches. The
/// indirect tail call reads the array at run time instead: a load and a bounds check per
/// inbound connection.
pub fn sk_lookup_stub(
    netns_cookie: u64,
    scratch: BorrowedFd<'_>,
    prog_array: BorrowedFd<'_>,
) -> [Insn; 19] {
    let (lo, hi) = (
        netns_cookie as u32 as i32,
        (netns_cookie >> 32) as u32 as i32,
    );
    [
        insn(BPF_MOV64_REG, 6, 1, 0, 0),  // r6 = r1
        insn(BPF_ST_MEM_W, 10, 0, -4, 0), // *(u32 *)(r10 - 4) = 0
        insn(BPF_MOV64_REG, 2, 10, 0, 0), // r2 = r10
        insn(BPF_ADD64_IMM, 2, 0, 0, -4), // r2 += -4
        insn(BPF_LD_IMM64, 1, BPF_PSEUDO_MAP_FD, 0, scratch.as_raw_fd()), // r1 = map
        insn(0, 0, 0, 0, 0),
        insn(BPF_CALL, 0, 0, 0, BPF_FUNC_MAP_LOOKUP_ELEM), // call map_lookup_elem
        insn(BPF_JEQ_IMM, 0, 0, 9, 0),                     // if r0 == 0 goto +9 (drop)
        insn(BPF_LD_IMM64, 1, 0, 0, lo),                   // r1 = netns_cookie
        insn(0, 0, 0, 0, hi),
        insn(BPF_STX_MEM_DW, 0, 1, 0, 0), // *(u64 *)(r0 + 0) = r1
        insn(BPF_MOV64_REG, 1, 6, 0, 0),  // r1 = r6
        insn(
            BPF_LD_IMM64,
            2,
            BPF_PSEUDO_MAP_FD,
            0,
            prog_array.as_raw_fd(),
        ), // r2 = map
        insn(0, 0, 0, 0, 0),
        insn(BPF_LDX_MEM_W, 3, 6, SK_LOOKUP_FAMILY, 0), // r3 = *(u32 *)(r6 + family)
        insn(BPF_XOR64_REG, 3, 3, 0, 0),                // r3 ^= r3
        insn(BPF_CALL, 0, 0, 0, BPF_FUNC_TAIL_CALL),    // call tail_call
        insn(BPF_MOV64_IMM, 0, 0, 0, SK_DROP),          // drop: r0 = SK_DROP
        insn(BPF_EXIT, 0, 0, 0, 0),                     // exit
    ]
}

#[cfg(test)]
mod tests {
    use std::os::fd::BorrowedFd;

    use super::*;

    #[test]
    fn stub_carries_the_cookie_and_fails_closed() {
        // SAFETY: the fds are only copied into instructions, never used.
        let (a, b) = unsafe { (BorrowedFd::borrow_raw(7), BorrowedFd::borrow_raw(9)) };
        let cookie = 0x1234_5678_9abc_def0_u64;
        let insns = sk_lookup_stub(cookie, a, b);
        // The cookie, split over the two halves of its ld_imm64.
        let ld = insns
            .iter()
            .position(|i| i.code == 0x18 && i.regs == 1)
            .expect("ld_imm64 r1, cookie");
        let got = u64::from(insns[ld].imm as u32) | (u64::from(insns[ld + 1].imm as u32) << 32);
        assert_eq!(got, cookie);
        // Maps by fd, in the registers the helpers take them.
        assert_eq!(
            (insns[4].regs, insns[4].imm),
            (1 | (BPF_PSEUDO_MAP_FD << 4), 7)
        );
        assert_eq!(
            (insns[12].regs, insns[12].imm),
            (2 | (BPF_PSEUDO_MAP_FD << 4), 9)
        );
        // The index register is zeroed by a XOR of itself, not set from a constant (see the
        // function's doc).
        let call = insns
            .iter()
            .position(|i| i.code == 0x85 && i.imm == BPF_FUNC_TAIL_CALL)
            .expect("tail call");
        assert_eq!(insns[call - 1], insn(0xaf, 3, 3, 0, 0));
        assert_eq!(insns[call - 2].code, 0x61);
        assert!(!insns.iter().any(|i| i.code == 0xb7 && i.regs == 3));
        // The null check jumps to `r0 = SK_DROP; exit`, which also follows a failed tail call.
        let jump = 7;
        let target = (jump as i16 + 1 + insns[jump].off) as usize;
        assert_eq!(insns[target], insn(0xb7, 0, 0, 0, SK_DROP));
        assert_eq!(insns[target - 1].imm, BPF_FUNC_TAIL_CALL);
        assert_eq!(insns[target + 1].code, 0x95);
        assert_eq!(target + 2, insns.len());
    }
}
