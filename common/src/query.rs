//! What is attached where: `BPF_PROG_QUERY` of a cgroup's or network namespace's programs and
//! `BPF_OBJ_GET_INFO_BY_FD` of a program, for the agent's order checks
//! (`agent/src/dataplane/order.rs`) and `linkerd check --node`'s list of the other tenants on
//! the pods' path; and kubelet's cgroup of every pod, which both look at.
//!
//! Reading only: nothing here attaches, detaches or pins. Querying needs root (or `CAP_BPF`
//! with `CAP_NET_ADMIN`), as `bpftool cgroup show` does.

extern crate std;

use std::{
    io,
    os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd},
    path::{Path, PathBuf},
    string::String,
    vec,
    vec::Vec,
};

use crate::sys::{Attr, bpf, obj_info};

const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
const BPF_PROG_QUERY: libc::c_long = 16;

/// `BPF_F_ALLOW_OVERRIDE`: a descendant may attach its own program, which replaces this one
/// for the descendant's sockets.
pub const F_ALLOW_OVERRIDE: u32 = 1;
/// `BPF_F_ALLOW_MULTI`: a program list; descendants' programs run first, then these.
pub const F_ALLOW_MULTI: u32 = 2;
/// `BPF_F_PREORDER` (6.15): runs before the programs of descendants, top-down.
pub const F_PREORDER: u32 = 1 << 6;
/// `BPF_F_QUERY_EFFECTIVE`.
const F_QUERY_EFFECTIVE: u32 = 1;
/// `BPF_SK_LOOKUP`: netns queries take no per-program flags.
const ATTACH_SK_LOOKUP: u32 = 36;

/// What `BPF_PROG_QUERY` says about one hook of a cgroup or netns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Query {
    /// The cgroup's attach flags for the hook (0 for an effective query, and for netns).
    pub flags: u32,
    /// Program ids: the target's own in attach order, or (effective) the run order.
    pub ids: Vec<u32>,
    /// Attach flags per program, parallel to `ids` (the kernel reports the cgroup's flags for
    /// each, not the program's own `BPF_F_PREORDER`); empty when the kernel does not report
    /// them (before 6.0, and for effective queries).
    pub prog_flags: Vec<u32>,
}

/// `BPF_PROG_QUERY` of `attach_type` (`enum bpf_attach_type`) on `target` (a cgroup or a
/// netns): with `effective`, the programs that run for the target's sockets, in run order
/// (cgroups only); without, the target's own programs with their flags.
pub fn prog_query(target: impl AsFd, attach_type: u32, effective: bool) -> io::Result<Query> {
    let target = target.as_fd().as_raw_fd() as u32;
    let mut cap = 16usize;
    loop {
        let mut ids = vec![0u32; cap];
        let mut prog_flags = vec![0u32; cap];
        let query = |with_flags: bool, ids: &mut [u32], prog_flags: &mut [u32]| {
            let mut attr = Attr::new();
            attr.put_u32(0, target)
                .put_u32(4, attach_type)
                .put_u32(8, if effective { F_QUERY_EFFECTIVE } else { 0 })
                .put_u64(16, ids.as_mut_ptr() as u64)
                .put_u32(24, ids.len() as u32);
            if with_flags {
                attr.put_u64(32, prog_flags.as_mut_ptr() as u64);
            }
            let res = bpf(BPF_PROG_QUERY, &mut attr);
            res.map(|_| (attr.u32_at(12), attr.u32_at(24) as usize))
        };
        // Per-program flags where the kernel has them (netns and effective queries refuse them).
        let with_flags = !effective && attach_type != ATTACH_SK_LOOKUP;
        let res = match query(with_flags, &mut ids, &mut prog_flags) {
            Err(e) if with_flags && e.raw_os_error() == Some(libc::EINVAL) => {
                query(false, &mut ids, &mut prog_flags).map(|r| (r, false))
            }
            r => r.map(|r| (r, with_flags)),
        };
        match res {
            Ok(((flags, count), got_flags)) if count <= cap => {
                ids.truncate(count);
                prog_flags.truncate(if got_flags { count } else { 0 });
                return Ok(Query {
                    flags,
                    ids,
                    prog_flags,
                });
            }
            Ok(((_, count), _)) => cap = count,
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => cap *= 4,
            Err(e) => return Err(e),
        }
    }
}

/// `BPF_PROG_GET_FD_BY_ID`: a new reference to the program with kernel id `id` (`ENOENT`
/// once it is gone).
pub fn prog_by_id(id: u32) -> io::Result<OwnedFd> {
    let mut attr = Attr::new();
    attr.put_u32(0, id);
    let fd = bpf(BPF_PROG_GET_FD_BY_ID, &mut attr)?;
    // SAFETY: the kernel just returned this new fd to us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// What the kernel says about a program (`struct bpf_prog_info`, the part used here).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProgInfo {
    /// `enum bpf_prog_type`.
    pub prog_type: u32,
    pub id: u32,
    /// Bytes of machine code the JIT made (`jited_prog_len`): 0 when the program runs in the
    /// interpreter (`net.core.bpf_jit_enable` = 0) or the info is withheld from the caller.
    pub jited_len: u32,
    /// The name it was loaded with (at most 15 bytes).
    pub name: String,
}

/// `BPF_OBJ_GET_INFO_BY_FD` on a program.
pub fn prog_info(prog: impl AsFd) -> io::Result<ProgInfo> {
    // type, id, tag[8], jited_prog_len (16), xlated_prog_len, jited_prog_insns,
    // xlated_prog_insns, load_time, created_by_uid, nr_map_ids, map_ids, name[16] (64).
    let info = obj_info::<80>(prog)?;
    let name = &info.0[64..80];
    let len = name.iter().position(|b| *b == 0).unwrap_or(name.len());
    Ok(ProgInfo {
        prog_type: info.u32_at(0),
        id: info.u32_at(4),
        jited_len: info.u32_at(16),
        name: String::from_utf8_lossy(&name[..len]).into_owned(),
    })
}

/// kubelet's cgroup of every pod under `root` (the cgroup2 mount): `kubepods.slice` (systemd
/// driver) or `kubepods` (cgroupfs driver), whichever exists; `None` when neither or both do.
pub fn kubepods(root: &Path) -> Option<PathBuf> {
    let found: Vec<PathBuf> = crate::paths::POD_CGROUP_TREES
        .iter()
        .rev()
        .map(|d| root.join(d))
        .filter(|p| p.is_dir())
        .collect();
    match found.as_slice() {
        [one] => Some(one.clone()),
        _ => None,
    }
}

/// The kernel's attach type (`enum bpf_attach_type`) of a hook.
pub const fn attach_type(hook: crate::names::Hook) -> u32 {
    use crate::names::Hook;
    match hook {
        Hook::Connect4 => 10,
        Hook::Connect6 => 11,
        Hook::SockOps => 3,
        Hook::Getsockopt => 21,
        Hook::Getpeername4 => 29,
        Hook::Getpeername6 => 30,
        Hook::IterTcp => 28,
        Hook::SkLookup => ATTACH_SK_LOOKUP,
    }
}
