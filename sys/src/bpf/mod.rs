//! The one `bpf(2)` call of the workspace ([`bpf`]), with the `union bpf_attr` it takes
//! filled by offset ([`Attr`]), `BPF_OBJ_GET_INFO_BY_FD` read into a buffer of the caller's
//! size ([`obj_info`]), and the commands built on them: pinning and opening objects (here),
//! links and attachments ([`link`]), maps ([`map`]), program loads ([`prog`]) and what is
//! attached where ([`query`]). The agent, the CLI, the tests and the benchmark issue every
//! command aya does not make the way they need it (or at all) through these.
//!
//! Unit tests replace the system call for their thread ([`tests::Double`]), as aya's
//! `aya/src/sys` does, to drive the paths a kernel takes only on other releases (a flag
//! refused, a probe not permitted).

pub mod link;
pub mod map;
pub mod prog;
pub mod query;

use std::{
    ffi::CString,
    io,
    os::{
        fd::{AsFd, AsRawFd, FromRawFd, OwnedFd},
        unix::ffi::OsStrExt,
    },
    path::Path,
};

pub use link::*;
pub use map::*;
pub use prog::*;
pub use query::*;

use crate::uapi::{self, Cmd};

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
/// make one, 0 otherwise), or its errno. The workspace's only `bpf(2)` call site.
pub fn bpf(cmd: Cmd, attr: &mut Attr) -> io::Result<libc::c_long> {
    #[cfg(test)]
    if let Some(answer) = tests::Double::answer(cmd, attr) {
        return answer;
    }
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

/// [`bpf`] for the commands that return a new fd.
fn bpf_fd(cmd: Cmd, attr: &mut Attr) -> io::Result<OwnedFd> {
    let fd = bpf(cmd, attr)?;
    // SAFETY: the commands this is called for return a new fd on success, which nothing
    // else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
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
    bpf(uapi::BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
    Ok(())
}

/// The kernel id of any bpf object (program, map or link): `BPF_OBJ_GET_INFO_BY_FD` reading
/// only the common head of the info structs (type, id).
pub fn obj_id(fd: impl AsFd) -> io::Result<u32> {
    Ok(obj_info::<8>(fd)?.u32_at(4))
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
    bpf(uapi::BPF_OBJ_PIN, &mut attr).map(drop)
}

/// `BPF_OBJ_GET`: opens a pinned object.
pub fn obj_get(path: &Path) -> io::Result<OwnedFd> {
    let c = path_cstring(path)?;
    let mut attr = Attr::new();
    attr.put_u64(0, c.as_ptr() as u64);
    bpf_fd(uapi::BPF_OBJ_GET, &mut attr)
}

fn u32_at(bytes: &[u8], off: usize) -> u32 {
    u32::from_ne_bytes([bytes[off], bytes[off + 1], bytes[off + 2], bytes[off + 3]])
}

#[cfg(test)]
pub(crate) mod tests {
    use std::{cell::RefCell, io, vec::Vec};

    use super::{Attr, Cmd};

    type Answer = Box<dyn FnMut(Cmd, &Attr) -> io::Result<libc::c_long>>;
    /// The double's answer, and every call it answered (command, attribute as passed).
    type State = Option<(Answer, Vec<(Cmd, [u8; 128])>)>;

    thread_local! {
        static DOUBLE: RefCell<State> = const { RefCell::new(None) };
    }

    /// The test double of [`super::bpf`]: while it lives, every call on its thread is
    /// recorded and answered by its closure instead of the kernel.
    pub struct Double;

    impl Double {
        pub fn new(answer: impl FnMut(Cmd, &Attr) -> io::Result<libc::c_long> + 'static) -> Self {
            DOUBLE.with(|d| *d.borrow_mut() = Some((Box::new(answer), Vec::new())));
            Double
        }

        /// Every call so far: the command and the attribute as it was passed.
        pub fn calls(&self) -> Vec<(Cmd, [u8; 128])> {
            DOUBLE.with(|d| {
                d.borrow()
                    .as_ref()
                    .map(|(_, c)| c.clone())
                    .unwrap_or_default()
            })
        }

        pub(super) fn answer(cmd: Cmd, attr: &Attr) -> Option<io::Result<libc::c_long>> {
            DOUBLE.with(|d| {
                let mut d = d.borrow_mut();
                let (answer, calls) = d.as_mut()?;
                calls.push((cmd, attr.0));
                Some(answer(cmd, attr))
            })
        }
    }

    impl Drop for Double {
        fn drop(&mut self) {
            DOUBLE.with(|d| *d.borrow_mut() = None);
        }
    }
}
