//! `linkerd-cni-test-seccomp PROGRAM ARGS...`: runs PROGRAM the way the container runtime's
//! default seccomp profile (`RuntimeDefault`) runs a container that holds no `CAP_SYS_ADMIN`,
//! in the one respect the node agent meets: `setns(2)` fails with `EPERM` (the profile allows
//! it, like `mount(2)` and `unshare(2)`, only to a holder of `CAP_SYS_ADMIN`). Everything
//! else is allowed. Sets `no_new_privs` (as the DaemonSet's `allowPrivilegeEscalation: false`
//! does), installs the filter, and execs PROGRAM.

use std::os::unix::process::CommandExt;

/// `AUDIT_ARCH_*` of this build's architecture, the first thing the filter checks.
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xc000_003e;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xc000_00b7;

/// `seccomp_data` offsets: `nr` then `arch`.
const NR: u32 = 0;
const ARCH: u32 = 4;

fn stmt(code: u32, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u32, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((program, rest)) = args.split_first() else {
        anyhow::bail!("usage: linkerd-cni-test-seccomp PROGRAM ARGS...");
    };
    let (ld, jeq, ret) = (
        libc::BPF_LD | libc::BPF_W | libc::BPF_ABS,
        libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
        libc::BPF_RET | libc::BPF_K,
    );
    let mut filter = [
        stmt(ld, ARCH),
        // Another architecture's calling convention: killed, as the runtime's profile does.
        jump(jeq, AUDIT_ARCH, 1, 0),
        stmt(ret, libc::SECCOMP_RET_KILL_PROCESS),
        stmt(ld, NR),
        jump(jeq, libc::SYS_setns as u32, 0, 1),
        stmt(ret, libc::SECCOMP_RET_ERRNO | libc::EPERM as u32),
        stmt(ret, libc::SECCOMP_RET_ALLOW),
    ];
    let prog = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_mut_ptr(),
    };
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        anyhow::bail!("PR_SET_NO_NEW_PRIVS: {}", std::io::Error::last_os_error());
    }
    // SAFETY: `prog` points at `filter`, both alive across the call; the kernel copies them.
    if unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            libc::SECCOMP_FILTER_FLAG_TSYNC,
            &raw const prog,
        )
    } != 0
    {
        anyhow::bail!("seccomp: {}", std::io::Error::last_os_error());
    }
    let error = std::process::Command::new(program).args(rest).exec();
    anyhow::bail!("exec {program}: {error}")
}
