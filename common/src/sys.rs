//! The raw `bpf(2)` call, for the commands aya does not make the way we need them (or at all):
//! a `union bpf_attr` filled by offset ([`Attr`]) and `BPF_OBJ_GET_INFO_BY_FD` read into a
//! buffer of the caller's size ([`obj_info`]). One copy for the agent's `bpf_sys` and the
//! queries of [`crate::query`]; the probes of [`crate::probe`] use typed attribute prefixes.

extern crate std;

use std::{
    io,
    os::fd::{AsFd, AsRawFd},
};

/// `BPF_OBJ_GET_INFO_BY_FD`.
pub const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;

/// `union bpf_attr`, large enough for every command used here (the kernel checks that the
/// bytes past the command's own fields are zero).
#[repr(C, align(8))]
pub struct Attr([u8; 128]);

impl Attr {
    /// All zero.
    pub fn new() -> Self {
        Self([0; 128])
    }

    pub fn put_u32(&mut self, off: usize, v: u32) -> &mut Self {
        self.0[off..off + 4].copy_from_slice(&v.to_ne_bytes());
        self
    }

    pub fn put_u64(&mut self, off: usize, v: u64) -> &mut Self {
        self.0[off..off + 8].copy_from_slice(&v.to_ne_bytes());
        self
    }

    /// `bytes` at `off` (a name field).
    pub fn put_bytes(&mut self, off: usize, bytes: &[u8]) -> &mut Self {
        self.0[off..off + bytes.len()].copy_from_slice(bytes);
        self
    }

    /// The `u32` the kernel wrote back at `off` (a query's count, a flags word).
    pub fn u32_at(&self, off: usize) -> u32 {
        u32_at(&self.0, off)
    }
}

impl Default for Attr {
    fn default() -> Self {
        Self::new()
    }
}

/// `bpf(cmd, attr, sizeof attr)`: the kernel's return value (a new fd for the commands that
/// make one, 0 otherwise), or its errno.
pub fn bpf(cmd: libc::c_long, attr: &mut Attr) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a live `bpf_attr` of the size passed; every pointer the caller put in
    // it points at memory that outlives this call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.0.as_mut_ptr(),
            core::mem::size_of::<Attr>(),
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// The first `N` bytes of a bpf object's info struct (`bpf_prog_info`, `bpf_map_info`,
/// `bpf_link_info`, ...), as the kernel filled them.
#[repr(C, align(8))]
pub struct Info<const N: usize>(pub [u8; N]);

impl<const N: usize> Info<N> {
    pub fn u32_at(&self, off: usize) -> u32 {
        u32_at(&self.0, off)
    }

    pub fn put_u32(&mut self, off: usize, v: u32) -> &mut Self {
        self.0[off..off + 4].copy_from_slice(&v.to_ne_bytes());
        self
    }

    pub fn put_u64(&mut self, off: usize, v: u64) -> &mut Self {
        self.0[off..off + 8].copy_from_slice(&v.to_ne_bytes());
        self
    }

    pub fn u64_at(&self, off: usize) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.0[off..off + 8]);
        u64::from_ne_bytes(b)
    }
}

/// `BPF_OBJ_GET_INFO_BY_FD` of the program, map, link or BTF object behind `fd`, its first
/// `N` bytes (the kernel fills what it has of them and zeroes nothing past its own struct).
pub fn obj_info<const N: usize>(fd: impl AsFd) -> io::Result<Info<N>> {
    let mut info = Info([0u8; N]);
    obj_info_into(fd, &mut info)?;
    Ok(info)
}

/// `BPF_OBJ_GET_INFO_BY_FD` into `info` as the caller filled it: the fields that ask for more
/// (a buffer's address and size, such as `bpf_prog_info`'s `func_info`, or `bpf_btf_info`'s
/// `btf`) are read by the kernel, which fills the buffers they point at (they must outlive the
/// call) and writes the struct back.
pub fn obj_info_into<const N: usize>(fd: impl AsFd, info: &mut Info<N>) -> io::Result<()> {
    let mut attr = Attr::new();
    attr.put_u32(0, fd.as_fd().as_raw_fd() as u32)
        .put_u32(4, N as u32)
        .put_u64(8, info.0.as_mut_ptr() as u64);
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
    Ok(())
}

fn u32_at(bytes: &[u8], off: usize) -> u32 {
    u32::from_ne_bytes([bytes[off], bytes[off + 1], bytes[off + 2], bytes[off + 3]])
}
