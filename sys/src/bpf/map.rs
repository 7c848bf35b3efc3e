//! Maps: a program array's slot, creating a map (with its BTF), reading its info, and the raw
//! entry access layout migration needs (copying entries of any map whatever its types).

use std::{
    io,
    os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd},
};

use super::{Attr, bpf, bpf_fd, obj_info};
use crate::uapi;

/// `BPF_MAP_UPDATE_ELEM` with a `u32` key and a `u32` value (a program array slot takes a
/// program fd).
pub fn map_update_u32(map: impl AsFd, key: u32, value: u32) -> io::Result<()> {
    let mut attr = Attr::new();
    attr.put_u32(0, map.as_fd().as_raw_fd() as u32)
        .put_u64(8, &key as *const u32 as u64)
        .put_u64(16, &value as *const u32 as u64);
    bpf(uapi::BPF_MAP_UPDATE_ELEM, &mut attr).map(drop)
}

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
    bpf_fd(uapi::BPF_MAP_CREATE, &mut attr)
}

/// A raw BTF blob as [`btf_load`] takes it and the kernel gives it back (`struct btf_header`,
/// version 1, no flags, then `types` and `strings` back to back): `types` are the records
/// after the header, `strings` the string section (starting with its empty string).
pub fn raw_btf(types: &[u8], strings: &[u8]) -> Vec<u8> {
    const HEADER_LEN: u32 = 24;
    let mut blob = Vec::with_capacity(HEADER_LEN as usize + types.len() + strings.len());
    blob.extend_from_slice(&uapi::BTF_MAGIC.to_ne_bytes());
    blob.extend_from_slice(&[1, 0]); // version, flags
    let (type_len, str_len) = (types.len() as u32, strings.len() as u32);
    // hdr_len, type_off, type_len, str_off, str_len
    for word in [HEADER_LEN, 0, type_len, type_len, str_len] {
        blob.extend_from_slice(&word.to_ne_bytes());
    }
    blob.extend_from_slice(types);
    blob.extend_from_slice(strings);
    blob
}

/// `BPF_BTF_LOAD`: loads a raw BTF blob (header, types, strings; see [`raw_btf`]).
pub fn btf_load(blob: &[u8]) -> io::Result<OwnedFd> {
    let mut attr = Attr::new();
    attr.put_u64(0, blob.as_ptr() as u64)
        .put_u32(16, blob.len() as u32);
    bpf_fd(uapi::BPF_BTF_LOAD, &mut attr)
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
    match bpf(uapi::BPF_MAP_LOOKUP_ELEM, &mut attr) {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
        Err(e) => Err(e),
    }
}

/// `BPF_MAP_UPDATE_ELEM` with raw bytes and `BPF_ANY`.
pub fn map_update(map: impl AsFd, key: &[u8], value: &[u8]) -> io::Result<()> {
    let mut attr = elem_attr(map.as_fd(), key.as_ptr(), value.as_ptr() as u64, 0);
    bpf(uapi::BPF_MAP_UPDATE_ELEM, &mut attr).map(drop)
}

/// `BPF_MAP_DELETE_ELEM` with raw bytes.
pub fn map_delete(map: impl AsFd, key: &[u8]) -> io::Result<()> {
    let mut attr = elem_attr(map.as_fd(), key.as_ptr(), 0, 0);
    bpf(uapi::BPF_MAP_DELETE_ELEM, &mut attr).map(drop)
}

/// `BPF_MAP_GET_NEXT_KEY`: the key after `key` (the first one with `None`) into `next`.
/// `Ok(false)` at the end.
pub fn map_next_key(map: impl AsFd, key: Option<&[u8]>, next: &mut [u8]) -> io::Result<bool> {
    let key = key.map_or(std::ptr::null(), <[u8]>::as_ptr);
    let mut attr = elem_attr(map.as_fd(), key, next.as_mut_ptr() as u64, 0);
    match bpf(uapi::BPF_MAP_GET_NEXT_KEY, &mut attr) {
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
    let result = bpf(uapi::BPF_MAP_LOOKUP_BATCH, &mut attr);
    let n = attr.u32_at(32) as usize;
    match result {
        Ok(_) => Ok(Batch::More { n, next: out_batch }),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(Batch::Done { n }),
        Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => Ok(Batch::NoRoom),
        Err(e) => Err(e),
    }
}
