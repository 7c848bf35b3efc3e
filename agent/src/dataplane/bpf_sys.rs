//! The few `bpf(2)` commands the agent issues itself: creating, pinning, opening, inspecting,
//! updating and detaching bpf_links, setting a program array slot, loading each pod's
//! `sk_lookup` stub (a handful of instructions built here: a full object load per pod costs
//! ~100 times more), and the raw map access layout migration needs (map info, creating the
//! meta map, copying entries of any map whatever its types).
//!
//! aya 0.14 cannot turn every link type it creates into a pinnable link (cgroup sockopt and
//! sock_addr links among them), so links are created here, uniformly, from aya-loaded program
//! fds, and owned by their bpffs pins: the agent keeps no link fd open.
//!
//! # Minimum kernel version
//! 5.7 (`BPF_LINK_CREATE` for cgroups).

use std::{
    ffi::CString,
    io,
    os::{
        fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
        unix::ffi::OsStrExt,
    },
    path::Path,
};

use linkerd_cni_common::{
    names::Hook,
    sys::{Attr, bpf, obj_info},
};

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_OBJ_PIN: libc::c_long = 6;
const BPF_OBJ_GET: libc::c_long = 7;
const BPF_PROG_ATTACH: libc::c_long = 8;
const BPF_PROG_DETACH: libc::c_long = 9;
const BPF_BTF_LOAD: libc::c_long = 18;
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_LINK_UPDATE: libc::c_long = 29;
const BPF_ITER_CREATE: libc::c_long = 33;
const BPF_LINK_DETACH: libc::c_long = 34;

fn owned(fd: libc::c_long) -> OwnedFd {
    // SAFETY: the kernel just returned this new fd to us.
    unsafe { OwnedFd::from_raw_fd(fd as i32) }
}

/// `BPF_LINK_CREATE`: attaches `prog` to `target` (a cgroup or netns fd) as a bpf_link.
pub fn link_create(prog: impl AsFd, target: impl AsFd, hook: Hook) -> io::Result<OwnedFd> {
    let mut attr = Attr::new();
    attr.put_u32(0, prog.as_fd().as_raw_fd() as u32)
        .put_u32(4, target.as_fd().as_raw_fd() as u32)
        .put_u32(8, hook.attach_type());
    bpf(BPF_LINK_CREATE, &mut attr).map(owned)
}

/// `BPF_LINK_CREATE` with `flags` (`BPF_F_BEFORE` and friends, where the kernel orders
/// links on the target; with no relative program or link, `BPF_F_BEFORE` means first).
pub fn link_create_flags(
    prog: impl AsFd,
    target: impl AsFd,
    hook: Hook,
    flags: u32,
) -> io::Result<OwnedFd> {
    let mut attr = Attr::new();
    attr.put_u32(0, prog.as_fd().as_raw_fd() as u32)
        .put_u32(4, target.as_fd().as_raw_fd() as u32)
        .put_u32(8, hook.attach_type())
        .put_u32(12, flags);
    bpf(BPF_LINK_CREATE, &mut attr).map(owned)
}

/// Whether this kernel orders links on a cgroup (`BPF_F_BEFORE`, the mprog API on cgroups):
/// 0 not asked yet, 1 yes, 2 no.
static CGROUP_LINKS_ORDERED: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// `BPF_LINK_CREATE` of a cgroup program, first among the cgroup's own programs of that hook
/// (`BPF_F_BEFORE`) where the kernel orders cgroup links, else last (the kernel's order before
/// that). Asked of the kernel at the first link: `EINVAL` for the flag means no.
pub fn cgroup_link_create(prog: impl AsFd, cgroup: impl AsFd, hook: Hook) -> io::Result<OwnedFd> {
    use std::sync::atomic::Ordering;
    if CGROUP_LINKS_ORDERED.load(Ordering::Relaxed) != 2 {
        match link_create_flags(prog.as_fd(), cgroup.as_fd(), hook, F_BEFORE) {
            Ok(link) => {
                CGROUP_LINKS_ORDERED.store(1, Ordering::Relaxed);
                return Ok(link);
            }
            Err(e)
                if e.raw_os_error() == Some(libc::EINVAL)
                    && CGROUP_LINKS_ORDERED.load(Ordering::Relaxed) == 0 =>
            {
                CGROUP_LINKS_ORDERED.store(2, Ordering::Relaxed);
            }
            Err(e) => return Err(e),
        }
    }
    link_create(prog, cgroup, hook)
}

/// Whether cgroup links are made first on their cgroup ([`cgroup_link_create`]); `None`
/// before the first one.
pub fn cgroup_links_ordered() -> Option<bool> {
    match CGROUP_LINKS_ORDERED.load(std::sync::atomic::Ordering::Relaxed) {
        1 => Some(true),
        2 => Some(false),
        _ => None,
    }
}

pub use linkerd_cni_common::query::{F_ALLOW_MULTI, F_ALLOW_OVERRIDE, F_PREORDER};
/// `BPF_F_BEFORE`: ordered before a relative program or link (first when none is named).
pub const F_BEFORE: u32 = 1 << 3;

/// `BPF_PROG_ATTACH` (the attachment the kernel keeps without a link) of `prog` to the cgroup
/// `target` with `flags`. The agent never attaches this way: other tenants do (and the tests'
/// stand-ins for them).
pub fn prog_attach(prog: impl AsFd, target: impl AsFd, hook: Hook, flags: u32) -> io::Result<()> {
    let mut attr = Attr::new();
    attr.put_u32(0, target.as_fd().as_raw_fd() as u32)
        .put_u32(4, prog.as_fd().as_raw_fd() as u32)
        .put_u32(8, hook.attach_type())
        .put_u32(12, flags);
    bpf(BPF_PROG_ATTACH, &mut attr).map(drop)
}

/// `BPF_PROG_DETACH` of `prog` from the cgroup `target` (a `BPF_PROG_ATTACH` attachment).
pub fn prog_detach(prog: impl AsFd, target: impl AsFd, hook: Hook) -> io::Result<()> {
    let mut attr = Attr::new();
    attr.put_u32(0, target.as_fd().as_raw_fd() as u32)
        .put_u32(4, prog.as_fd().as_raw_fd() as u32)
        .put_u32(8, hook.attach_type());
    bpf(BPF_PROG_DETACH, &mut attr).map(drop)
}

pub use linkerd_cni_common::query::{ProgInfo, Query};

/// `BPF_PROG_QUERY` of `hook` on `target` (a cgroup or a netns): with `effective`, the
/// programs that run for the target's sockets, in run order (cgroups only); without, the
/// target's own programs with their flags. The one implementation is
/// `linkerd_cni_common::query`, which `linkerd check --node` uses too.
pub fn prog_query(target: impl AsFd, hook: Hook, effective: bool) -> io::Result<Query> {
    linkerd_cni_common::query::prog_query(target, hook.attach_type(), effective)
}

/// `BPF_LINK_CREATE` for an iterator program (`BPF_TRACE_ITER`, no target, no parameters):
/// the link each iterator is created from.
///
/// # Minimum kernel version
/// 5.9.
pub fn iter_link_create(prog: impl AsFd) -> io::Result<OwnedFd> {
    let mut attr = Attr::new();
    attr.put_u32(0, prog.as_fd().as_raw_fd() as u32)
        .put_u32(8, Hook::IterTcp.attach_type());
    bpf(BPF_LINK_CREATE, &mut attr).map(owned)
}

/// `BPF_ITER_CREATE`: a new iterator of the iterator link `link`; reading it runs the program.
/// A network iterator walks the network namespace of the calling thread.
///
/// # Minimum kernel version
/// 5.8.
pub fn iter_create(link: impl AsFd) -> io::Result<OwnedFd> {
    let mut attr = Attr::new();
    attr.put_u32(0, link.as_fd().as_raw_fd() as u32);
    bpf(BPF_ITER_CREATE, &mut attr).map(owned)
}

/// `BPF_MAP_UPDATE_ELEM` with a `u32` key and a `u32` value (a program array slot takes a
/// program fd).
pub fn map_update_u32(map: impl AsFd, key: u32, value: u32) -> io::Result<()> {
    let mut attr = Attr::new();
    attr.put_u32(0, map.as_fd().as_raw_fd() as u32)
        .put_u64(8, &key as *const u32 as u64)
        .put_u64(16, &value as *const u32 as u64);
    bpf(BPF_MAP_UPDATE_ELEM, &mut attr).map(drop)
}

/// `struct bpf_insn`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct Insn {
    code: u8,
    /// `dst_reg` in the low nibble, `src_reg` in the high one.
    regs: u8,
    off: i16,
    imm: i32,
}

const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: dst | (src << 4),
        off,
        imm,
    }
}

const BPF_PSEUDO_MAP_FD: u8 = 1;
const HELPER_MAP_LOOKUP_ELEM: i32 = 1;
const HELPER_TAIL_CALL: i32 = 12;
const SK_DROP: i32 = 0;
/// Offset of `family` in `struct bpf_sk_lookup`.
const SK_LOOKUP_FAMILY: i16 = 8;

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
        insn(0xbf, 6, 1, 0, 0),                                   // r6 = r1
        insn(0x62, 10, 0, -4, 0),                                 // *(u32 *)(r10 - 4) = 0
        insn(0xbf, 2, 10, 0, 0),                                  // r2 = r10
        insn(0x07, 2, 0, 0, -4),                                  // r2 += -4
        insn(0x18, 1, BPF_PSEUDO_MAP_FD, 0, scratch.as_raw_fd()), // r1 = map (ld_imm64)
        insn(0, 0, 0, 0, 0),
        insn(0x85, 0, 0, 0, HELPER_MAP_LOOKUP_ELEM), // call map_lookup_elem
        insn(0x15, 0, 0, 9, 0),                      // if r0 == 0 goto +9 (drop)
        insn(0x18, 1, 0, 0, lo),                     // r1 = netns_cookie (ld_imm64)
        insn(0, 0, 0, 0, hi),
        insn(0x7b, 0, 1, 0, 0), // *(u64 *)(r0 + 0) = r1
        insn(0xbf, 1, 6, 0, 0), // r1 = r6
        insn(0x18, 2, BPF_PSEUDO_MAP_FD, 0, prog_array.as_raw_fd()), // r2 = map (ld_imm64)
        insn(0, 0, 0, 0, 0),
        insn(0x61, 3, 6, SK_LOOKUP_FAMILY, 0), // r3 = *(u32 *)(r6 + family)
        insn(0xaf, 3, 3, 0, 0),                // r3 ^= r3
        insn(0x85, 0, 0, 0, HELPER_TAIL_CALL), // call tail_call
        insn(0xb7, 0, 0, 0, SK_DROP),          // drop: r0 = SK_DROP
        insn(0x95, 0, 0, 0, 0),                // exit
    ]
}

/// `BPF_PROG_LOAD` of an `sk_lookup` program named `name` (at most 15 bytes). On a verifier
/// rejection the error carries the verifier's log.
pub fn load_sk_lookup(name: &str, insns: &[Insn]) -> io::Result<OwnedFd> {
    let license = c"GPL";
    let load = |log: &mut [u8]| {
        let mut attr = Attr::new();
        attr.put_u32(0, Hook::SkLookup.prog_type())
            .put_u32(4, insns.len() as u32)
            .put_u64(8, insns.as_ptr() as u64)
            .put_u64(16, license.as_ptr() as u64)
            .put_u32(68, Hook::SkLookup.attach_type());
        if !log.is_empty() {
            attr.put_u32(24, 1)
                .put_u32(28, log.len() as u32)
                .put_u64(32, log.as_mut_ptr() as u64);
        }
        let n = name.len().min(15);
        attr.put_bytes(48, &name.as_bytes()[..n]);
        bpf(BPF_PROG_LOAD, &mut attr).map(owned)
    };
    load(&mut []).or_else(|first| {
        let mut log = vec![0u8; 16 * 1024];
        match load(&mut log) {
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

fn path_cstring(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))
}

/// `BPF_OBJ_PIN`: pins a link, program or map at `path` on a bpffs.
pub fn obj_pin(fd: impl AsFd, path: &Path) -> io::Result<()> {
    let c = path_cstring(path)?;
    let mut attr = Attr::new();
    attr.put_u64(0, c.as_ptr() as u64)
        .put_u32(8, fd.as_fd().as_raw_fd() as u32);
    bpf(BPF_OBJ_PIN, &mut attr).map(drop)
}

/// `BPF_OBJ_GET`: opens a pinned object.
pub fn obj_get(path: &Path) -> io::Result<OwnedFd> {
    let c = path_cstring(path)?;
    let mut attr = Attr::new();
    attr.put_u64(0, c.as_ptr() as u64);
    bpf(BPF_OBJ_GET, &mut attr).map(owned)
}

/// `BPF_LINK_DETACH`: detaches a link from its target; it stays pinned but does nothing.
pub fn link_detach(link: impl AsFd) -> io::Result<()> {
    let mut attr = Attr::new();
    attr.put_u32(0, link.as_fd().as_raw_fd() as u32);
    bpf(BPF_LINK_DETACH, &mut attr).map(drop)
}

/// What the kernel says about a link (`struct bpf_link_info`, cgroup/netns part).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkInfo {
    pub link_type: u32,
    pub id: u32,
    pub prog_id: u32,
    /// Cgroup id for cgroup links (0 once detached or the cgroup is gone), netns inode for
    /// netns links (0 once detached).
    pub target: u64,
    pub attach_type: u32,
}

/// `BPF_OBJ_GET_INFO_BY_FD` on a link.
pub fn link_info(link: impl AsFd) -> io::Result<LinkInfo> {
    let info = obj_info::<64>(link)?;
    let link_type = info.u32_at(0);
    // type, id, prog_id, then the type's own part at 16:
    // BPF_LINK_TYPE_CGROUP = 3: { u64 cgroup_id; u32 attach_type }
    // BPF_LINK_TYPE_NETNS = 5: { u32 netns_ino; u32 attach_type }
    let (target, attach_type) = if link_type == 5 {
        (u64::from(info.u32_at(16)), info.u32_at(20))
    } else {
        (info.u64_at(16), info.u32_at(24))
    };
    Ok(LinkInfo {
        link_type,
        id: info.u32_at(4),
        prog_id: info.u32_at(8),
        target,
        attach_type,
    })
}

/// `BPF_LINK_UPDATE`: atomically replaces the program of a link; the attachment itself (and
/// its place among the target's programs) stays. Every packet or socket operation runs either
/// the old program or the new one, never neither.
///
/// # Minimum kernel version
/// 5.7 (cgroup links), 5.9 (netns links).
pub fn link_update(link: impl AsFd, new_prog: impl AsFd) -> io::Result<()> {
    let mut attr = Attr::new();
    attr.put_u32(0, link.as_fd().as_raw_fd() as u32)
        .put_u32(4, new_prog.as_fd().as_raw_fd() as u32);
    bpf(BPF_LINK_UPDATE, &mut attr).map(drop)
}

/// `BPF_MAP_TYPE_HASH`.
pub const MAP_TYPE_HASH: u32 = 1;
/// `BPF_MAP_TYPE_ARRAY`.
pub const MAP_TYPE_ARRAY: u32 = 2;
/// `BPF_MAP_TYPE_PERCPU_HASH`.
pub const MAP_TYPE_PERCPU_HASH: u32 = 5;
/// `BPF_MAP_TYPE_PERCPU_ARRAY`.
pub const MAP_TYPE_PERCPU_ARRAY: u32 = 6;
/// `BPF_MAP_TYPE_LRU_HASH`.
pub const MAP_TYPE_LRU_HASH: u32 = 9;
/// `BPF_MAP_TYPE_LRU_PERCPU_HASH`.
pub const MAP_TYPE_LRU_PERCPU_HASH: u32 = 10;
/// `BPF_MAP_TYPE_SOCKMAP`.
pub const MAP_TYPE_SOCKMAP: u32 = 15;
/// `BPF_MAP_TYPE_SOCKHASH`.
pub const MAP_TYPE_SOCKHASH: u32 = 18;
/// `BPF_MAP_TYPE_SK_STORAGE`.
pub const MAP_TYPE_SK_STORAGE: u32 = 24;

/// What the kernel says about a map (`struct bpf_map_info`, the part used here).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MapInfo {
    pub map_type: u32,
    pub id: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub map_flags: u32,
    /// 0 when the map was created without BTF (`bpftool` then prints raw bytes).
    pub btf_id: u32,
}

/// `BPF_OBJ_GET_INFO_BY_FD` on a map.
pub fn map_info(map: impl AsFd) -> io::Result<MapInfo> {
    let info = obj_info::<96>(map)?;
    // type, id, key_size, value_size, max_entries, map_flags, name[16], ifindex,
    // btf_vmlinux_value_type_id, netns_dev, netns_ino, btf_id (offset 64).
    Ok(MapInfo {
        map_type: info.u32_at(0),
        id: info.u32_at(4),
        key_size: info.u32_at(8),
        value_size: info.u32_at(12),
        max_entries: info.u32_at(16),
        map_flags: info.u32_at(20),
        btf_id: info.u32_at(64),
    })
}

/// Key and value types of a map in a loaded BTF object.
#[derive(Clone, Copy, Debug)]
pub struct MapBtf<'a> {
    pub btf: BorrowedFd<'a>,
    pub key_type_id: u32,
    pub value_type_id: u32,
}

/// `BPF_MAP_CREATE`, with key/value BTF when given.
pub fn map_create(
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    name: &str,
    btf: Option<MapBtf<'_>>,
) -> io::Result<OwnedFd> {
    let mut attr = Attr::new();
    attr.put_u32(0, map_type)
        .put_u32(4, key_size)
        .put_u32(8, value_size)
        .put_u32(12, max_entries)
        .put_u32(16, map_flags);
    let name = name.as_bytes();
    let len = name.len().min(15);
    attr.put_bytes(28, &name[..len]);
    if let Some(b) = btf {
        // btf_fd, btf_key_type_id, btf_value_type_id.
        attr.put_u32(48, b.btf.as_raw_fd() as u32)
            .put_u32(52, b.key_type_id)
            .put_u32(56, b.value_type_id);
    }
    bpf(BPF_MAP_CREATE, &mut attr).map(owned)
}

/// `BPF_BTF_LOAD`: loads a raw BTF blob (header, types, strings).
pub fn btf_load(blob: &[u8]) -> io::Result<OwnedFd> {
    let mut attr = Attr::new();
    attr.put_u64(0, blob.as_ptr() as u64)
        .put_u32(16, blob.len() as u32);
    bpf(BPF_BTF_LOAD, &mut attr).map(owned)
}

fn elem_attr(map: BorrowedFd<'_>, key: *const u8, value: u64, flags: u64) -> Attr {
    let mut attr = Attr::new();
    attr.put_u32(0, map.as_raw_fd() as u32)
        .put_u64(8, key as u64)
        .put_u64(16, value)
        .put_u64(24, flags);
    attr
}

/// `BPF_MAP_LOOKUP_ELEM` with raw bytes: `value` must hold the whole value (all CPUs' copies
/// for per-CPU maps). `Ok(false)` when the key is absent.
pub fn map_lookup(map: impl AsFd, key: &[u8], value: &mut [u8]) -> io::Result<bool> {
    let mut attr = elem_attr(map.as_fd(), key.as_ptr(), value.as_mut_ptr() as u64, 0);
    match bpf(BPF_MAP_LOOKUP_ELEM, &mut attr) {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
        Err(e) => Err(e),
    }
}

/// `BPF_MAP_UPDATE_ELEM` with raw bytes and `BPF_ANY`.
pub fn map_update(map: impl AsFd, key: &[u8], value: &[u8]) -> io::Result<()> {
    let mut attr = elem_attr(map.as_fd(), key.as_ptr(), value.as_ptr() as u64, 0);
    bpf(BPF_MAP_UPDATE_ELEM, &mut attr).map(drop)
}

/// `BPF_MAP_DELETE_ELEM` with raw bytes.
pub fn map_delete(map: impl AsFd, key: &[u8]) -> io::Result<()> {
    let mut attr = elem_attr(map.as_fd(), key.as_ptr(), 0, 0);
    bpf(BPF_MAP_DELETE_ELEM, &mut attr).map(drop)
}

/// `BPF_MAP_GET_NEXT_KEY`: the key after `key` (the first one with `None`) into `next`.
/// `Ok(false)` at the end.
pub fn map_next_key(map: impl AsFd, key: Option<&[u8]>, next: &mut [u8]) -> io::Result<bool> {
    let key = key.map_or(std::ptr::null(), <[u8]>::as_ptr);
    let mut attr = elem_attr(map.as_fd(), key, next.as_mut_ptr() as u64, 0);
    match bpf(BPF_MAP_GET_NEXT_KEY, &mut attr) {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
        Err(e) => Err(e),
    }
}

/// What one [`map_lookup_batch`] call gave.
#[derive(Debug, PartialEq, Eq)]
pub enum Batch {
    /// `n` entries, and more may follow from the returned cursor.
    More { n: usize, next: u32 },
    /// The last `n` entries: the map has been walked to its end.
    Done { n: usize },
    /// One bucket holds more entries than `keys` has room for: retry with more room.
    NoRoom,
}

/// `BPF_MAP_LOOKUP_BATCH` on a hash map (plain, LRU, per-CPU): up to `keys.len() / key_size`
/// entries from the bucket `cursor` on (the start with `None`) into `keys` and `values`
/// (`value_len` bytes each, all CPUs' copies for per-CPU maps). Its cursor is a bucket index, so
/// entries deleted meanwhile do not send the walk back to the start as `BPF_MAP_GET_NEXT_KEY`
/// does when the key it is given has gone (which, on a map whose entries come and go faster
/// than the walk moves, never ends).
pub fn map_lookup_batch(
    map: impl AsFd,
    cursor: Option<u32>,
    key_size: usize,
    keys: &mut [u8],
    values: &mut [u8],
) -> io::Result<Batch> {
    let room = (keys.len() / key_size.max(1)) as u32;
    let in_batch = cursor.unwrap_or(0);
    let mut out_batch: u32 = 0;
    let mut attr = Attr::new();
    attr.put_u64(
        0,
        if cursor.is_some() {
            &in_batch as *const u32 as u64
        } else {
            0
        },
    )
    .put_u64(8, &mut out_batch as *mut u32 as u64)
    .put_u64(16, keys.as_mut_ptr() as u64)
    .put_u64(24, values.as_mut_ptr() as u64)
    .put_u32(32, room)
    .put_u32(36, map.as_fd().as_raw_fd() as u32);
    let result = bpf(BPF_MAP_LOOKUP_BATCH, &mut attr);
    let n = attr.u32_at(32) as usize;
    match result {
        Ok(_) => Ok(Batch::More { n, next: out_batch }),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(Batch::Done { n }),
        Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => Ok(Batch::NoRoom),
        Err(e) => Err(e),
    }
}

pub use linkerd_cni_common::query::{prog_by_id, prog_full_name, prog_info};

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

/// The kernel id of any bpf object (program, map or link): `BPF_OBJ_GET_INFO_BY_FD` reading
/// only the common head of the info structs (type, id).
pub fn obj_id(fd: impl AsFd) -> io::Result<u32> {
    Ok(obj_info::<8>(fd)?.u32_at(4))
}

#[cfg(test)]
mod tests {
    use std::os::fd::BorrowedFd;

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
            .position(|i| i.code == 0x85 && i.imm == HELPER_TAIL_CALL)
            .expect("tail call");
        assert_eq!(insns[call - 1], insn(0xaf, 3, 3, 0, 0));
        assert_eq!(insns[call - 2].code, 0x61);
        assert!(!insns.iter().any(|i| i.code == 0xb7 && i.regs == 3));
        // The null check jumps to `r0 = SK_DROP; exit`, which also follows a failed tail call.
        let jump = 7;
        let target = (jump as i16 + 1 + insns[jump].off) as usize;
        assert_eq!(insns[target], insn(0xb7, 0, 0, 0, SK_DROP));
        assert_eq!(insns[target - 1].imm, HELPER_TAIL_CALL);
        assert_eq!(insns[target + 1].code, 0x95);
        assert_eq!(target + 2, insns.len());
    }
}
