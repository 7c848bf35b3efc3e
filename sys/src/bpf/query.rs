//! What is attached where: `BPF_PROG_QUERY` of a cgroup's or network namespace's programs and
//! `BPF_OBJ_GET_INFO_BY_FD` of a program, for the agent's order checks
//! (`agent/src/dataplane/order.rs`) and `linkerd check --node`'s list of the other tenants on
//! the pods' path.
//!
//! Reading only: nothing here attaches, detaches or pins. Querying needs root (or `CAP_BPF`
//! with `CAP_NET_ADMIN`), as `bpftool cgroup show` does.

use std::{
    io,
    os::fd::{AsFd, AsRawFd},
};

use linkerd_cni_common::names::Hook;

use super::{Attr, Info, bpf, bpf_fd, obj_info, obj_info_into};
use crate::uapi;

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

/// `BPF_PROG_QUERY` of `hook` on `target` (a cgroup or a netns): with `effective`, the
/// programs that run for the target's sockets, in run order (cgroups only); without, the
/// target's own programs with their flags.
pub fn prog_query(target: impl AsFd, hook: Hook, effective: bool) -> io::Result<Query> {
    let target = target.as_fd().as_raw_fd() as u32;
    let attach_type = hook.attach_type();
    let mut cap = 16usize;
    loop {
        let mut ids = vec![0u32; cap];
        let mut prog_flags = vec![0u32; cap];
        let query = |with_flags: bool, ids: &mut [u32], prog_flags: &mut [u32]| {
            let mut attr = Attr::new();
            attr.put_u32(0, target)
                .put_u32(4, attach_type)
                .put_u32(
                    8,
                    if effective {
                        uapi::F_QUERY_EFFECTIVE
                    } else {
                        0
                    },
                )
                .put_u64(16, ids.as_mut_ptr() as u64)
                .put_u32(24, ids.len() as u32);
            if with_flags {
                attr.put_u64(32, prog_flags.as_mut_ptr() as u64);
            }
            let res = bpf(uapi::BPF_PROG_QUERY, &mut attr);
            res.map(|_| (attr.u32_at(12), attr.u32_at(24) as usize))
        };
        // Per-program flags where the kernel has them (netns and effective queries refuse them).
        let with_flags = !effective && hook != Hook::SkLookup;
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
pub fn prog_by_id(id: u32) -> io::Result<std::os::fd::OwnedFd> {
    let mut attr = Attr::new();
    attr.put_u32(0, id);
    bpf_fd(uapi::BPF_PROG_GET_FD_BY_ID, &mut attr)
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

/// The bytes of `struct bpf_prog_info` read for [`prog_full_name`], up to `nr_func_info`.
const PROG_INFO_FUNC: usize = 152;
/// The kernel keeps at most this many bytes of a program's name (`BPF_OBJ_NAME_LEN` - 1).
pub const SHORT_NAME_MAX: usize = 15;

/// A program's name as `bpftool prog show` prints it: the name of its BTF function (the
/// function the program was compiled from, in full: `cil_sock4_connect`), or, for a program
/// loaded without BTF, the kernel's name, which it cuts to [`SHORT_NAME_MAX`] bytes (said,
/// when it may have been cut).
pub fn prog_full_name(prog: impl AsFd) -> io::Result<String> {
    let prog = prog.as_fd();
    let short = prog_info(prog)?.name;
    match btf_func_name(prog) {
        Ok(Some(full)) => Ok(full),
        _ if short.len() >= SHORT_NAME_MAX => Ok(format!(
            "{short} (the kernel's name, cut to {SHORT_NAME_MAX} characters: the program has \
             no BTF to read the full one from)"
        )),
        _ => Ok(short),
    }
}

/// The name of the program's BTF function: its first `func_info` record's type
/// (`BPF_OBJ_GET_INFO_BY_FD`: `btf_id`, `func_info`), looked up in the program's BTF object
/// (`BPF_BTF_GET_FD_BY_ID`, then its raw data). `None` when the program has no BTF.
fn btf_func_name(prog: std::os::fd::BorrowedFd<'_>) -> io::Result<Option<String>> {
    // btf_id (128), func_info_rec_size (132), func_info (136), nr_func_info (144).
    let counts = obj_info::<PROG_INFO_FUNC>(prog)?;
    let (btf_id, rec_size, nr) = (counts.u32_at(128), counts.u32_at(132), counts.u32_at(144));
    if btf_id == 0 || nr == 0 || rec_size < 8 {
        return Ok(None);
    }
    let mut records = vec![0u8; rec_size as usize * nr as usize];
    let mut info = Info([0u8; PROG_INFO_FUNC]);
    info.put_u32(132, rec_size)
        .put_u64(136, records.as_mut_ptr() as u64)
        .put_u32(144, nr);
    obj_info_into(prog, &mut info)?;
    // struct bpf_func_info { insn_off, type_id }: the first is the program's entry.
    let type_id = u32::from_ne_bytes([records[4], records[5], records[6], records[7]]);
    let mut attr = Attr::new();
    attr.put_u32(0, btf_id);
    let btf = bpf_fd(uapi::BPF_BTF_GET_FD_BY_ID, &mut attr)?;
    // struct bpf_btf_info { btf (0), btf_size (8), id (12), ... }: the size first, then the data.
    let size = obj_info::<32>(&btf)?.u32_at(8);
    let mut data = vec![0u8; size as usize];
    let mut info = Info([0u8; 32]);
    info.put_u64(0, data.as_mut_ptr() as u64).put_u32(8, size);
    obj_info_into(&btf, &mut info)?;
    Ok(btf_type_name(&data, type_id))
}

/// The name of type `type_id` in raw BTF `data` (`struct btf_header`, then the type and string
/// sections); `None` when the data is not BTF, the type is not there or has no name.
pub fn btf_type_name(data: &[u8], type_id: u32) -> Option<String> {
    let u32_at = |off: usize| -> Option<u32> {
        data.get(off..off + 4)
            .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
    };
    let magic = data.get(0..2).map(|b| u16::from_ne_bytes([b[0], b[1]]))?;
    if magic != uapi::BTF_MAGIC {
        return None;
    }
    let hdr_len = u32_at(4)? as usize;
    let (type_off, type_len) = (u32_at(8)? as usize, u32_at(12)? as usize);
    let (str_off, str_len) = (u32_at(16)? as usize, u32_at(20)? as usize);
    let (types, strings) = (hdr_len + type_off, hdr_len + str_off);
    let end = types.checked_add(type_len)?;
    let mut off = types;
    let mut id = 1;
    while off + 12 <= end {
        let (name_off, info) = (u32_at(off)?, u32_at(off + 4)?);
        if id == type_id {
            if name_off == 0 || name_off as usize >= str_len {
                return None;
            }
            let from = strings + name_off as usize;
            let bytes = data.get(from..strings + str_len)?;
            let len = bytes.iter().position(|b| *b == 0)?;
            return Some(String::from_utf8_lossy(&bytes[..len]).into_owned());
        }
        let vlen = (info & 0xffff) as usize;
        let extra = uapi::btf_type_trailer((info >> 24) & 0x1f, vlen)?;
        off += 12 + extra;
        id += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Raw BTF: an INT `int`, a FUNC_PROTO with one parameter, a FUNC named longer than the
    /// kernel's 15 bytes, as a compiler emits them.
    fn btf() -> Vec<u8> {
        let strings = b"\0int\0ctx\0tenant_sock4_connect\0";
        let mut types = Vec::new();
        let mut ty = |name_off: u32, kind: u32, vlen: u32, size_or_type: u32, extra: &[u32]| {
            for v in [name_off, (kind << 24) | vlen, size_or_type]
                .iter()
                .chain(extra)
            {
                types.extend_from_slice(&v.to_ne_bytes());
            }
        };
        ty(1, 1, 0, 4, &[32]); // [1] INT int
        ty(0, 13, 1, 1, &[5, 1]); // [2] FUNC_PROTO (ctx: int) -> int
        ty(9, 12, 1, 2, &[]); // [3] FUNC tenant_sock4_connect
        crate::bpf::raw_btf(&types, strings)
    }

    #[test]
    fn a_btf_function_is_named_in_full() {
        let data = btf();
        assert_eq!(
            btf_type_name(&data, 3).as_deref(),
            Some("tenant_sock4_connect")
        );
        assert_eq!(btf_type_name(&data, 1).as_deref(), Some("int"));
        assert_eq!(btf_type_name(&data, 2), None, "a FUNC_PROTO has no name");
        assert_eq!(btf_type_name(&data, 4), None, "no such type");
        assert_eq!(btf_type_name(&data[..30], 3), None, "cut short");
        assert_eq!(btf_type_name(&[0; 24], 1), None, "not BTF");
    }
}
