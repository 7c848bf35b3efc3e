//! Namespace files: a namespace's type (`NS_GET_NSTYPE`), whether a file is on nsfs, and a
//! namespace's owning user namespace with that user namespace's `uid_map`/`gid_map` as the
//! initial user namespace sees them (host IDs): shared by the CNI plugin, which reads them at
//! ADD and sends them to the agent, and the agent, which checks what it is sent against the
//! pod's netns and reads them itself when it can.
//!
//! The maps are readable only through a process inside the user namespace, and at ADD there
//! may be none (the netns alone keeps the user namespace alive). A multithreaded process
//! cannot `setns` into a user namespace (EINVAL), and a thread is not enough: a forked child
//! does it and waits, and the caller reads `/proc/<child>/uid_map` from its own namespace,
//! which shows the extents in its own IDs whatever the nesting. The child makes only raw system
//! calls (it is the child of a multithreaded process) and is killed and reaped at once.
//!
//! The kernel lets a process whose effective UID owns the user namespace (root, for the
//! namespaces the runtime creates as root) `setns` into it without `CAP_SYS_ADMIN` in the
//! initial namespace (`cap_capable` grants the owner every capability there); what stops the
//! agent's container is the runtime's default seccomp profile, which allows `setns(2)` only to
//! a holder of `CAP_SYS_ADMIN`. The plugin runs unconfined, as the runtime's child.

use std::{
    fs::File,
    io,
    os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd},
    os::unix::fs::MetadataExt,
};

use crate::uapi::{NS_GET_NSTYPE, NS_GET_USERNS, NSFS_MAGIC};

/// The `CLONE_NEW*` type of the namespace file `ns` (`NS_GET_NSTYPE`, 4.11: before it the
/// kernel answers `ENOTTY` or `EINVAL`).
pub fn ns_type(ns: &impl AsFd) -> io::Result<libc::c_int> {
    // SAFETY: an ioctl on an fd we hold; NS_GET_NSTYPE takes no argument and returns the
    // namespace type or -1.
    let kind = unsafe { libc::ioctl(ns.as_fd().as_raw_fd(), NS_GET_NSTYPE as _) };
    if kind == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(kind)
}

/// Whether a filesystem's `statfs` magic (`f_type`) is nsfs's, the filesystem of
/// `/proc/<pid>/ns/*` and their bind mounts.
pub fn is_nsfs(f_type: i64) -> bool {
    f_type == NSFS_MAGIC
}

/// The user namespace that owns the namespace `ns` (`NS_GET_USERNS`).
pub fn owner(ns: &File) -> io::Result<File> {
    // SAFETY: an ioctl on an fd we hold; on success it returns a new fd, which we own.
    let raw = unsafe { libc::ioctl(ns.as_raw_fd(), NS_GET_USERNS as _) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh fd returned by the kernel.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(raw) }))
}

/// The identity of the namespace `ns` (nsfs device and inode).
pub fn id(ns: &File) -> io::Result<(u64, u64)> {
    let meta = ns.metadata()?;
    Ok((meta.dev(), meta.ino()))
}

/// Whether `userns` is the caller's own user namespace.
pub fn is_own(userns: &File) -> io::Result<bool> {
    let ours = std::fs::metadata("/proc/self/ns/user")?;
    Ok(id(userns)? == (ours.dev(), ours.ino()))
}

/// Reads the `uid_map` and `gid_map` of `userns` through a forked child that entered it.
/// Fails naming the step (`setns` refused, the child gone).
pub fn read_maps(userns: &File) -> Result<(String, String), (&'static str, io::Error)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills `fds` with two fds we then own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(("pipe", io::Error::last_os_error()));
    }
    // SAFETY: fresh fds from pipe2.
    let (ready_r, ready_w) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let userns_fd = userns.as_fd().as_raw_fd();
    let (w, r) = (ready_w.as_raw_fd(), ready_r.as_raw_fd());
    // SAFETY: the child runs only async-signal-safe system calls on fds and integers prepared
    // before the fork (no allocation, no locks), and never returns: it is killed below.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(("fork", io::Error::last_os_error()));
    }
    if pid == 0 {
        // SAFETY: see above; the child never returns.
        unsafe {
            libc::close(r);
            // Killed with the caller's thread should the caller die before killing it.
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            // 0, or the errno of setns.
            let status: i32 = if libc::setns(userns_fd, libc::CLONE_NEWUSER) == 0 {
                0
            } else {
                *libc::__errno_location()
            };
            libc::write(w, (&raw const status).cast(), 4);
            loop {
                libc::pause();
            }
        }
    }
    drop(ready_w);
    let result = (|| {
        let mut status = 0i32;
        // SAFETY: reading four bytes into a local i32.
        let n = unsafe { libc::read(r, (&raw mut status).cast(), 4) };
        let step = "setns(CLONE_NEWUSER) in a child";
        match n {
            4 if status == 0 => {}
            4 => return Err((step, io::Error::from_raw_os_error(status))),
            n if n < 0 => return Err((step, io::Error::last_os_error())),
            _ => return Err((step, io::Error::other("the child died before answering"))),
        }
        let read = |what| {
            std::fs::read_to_string(std::format!("/proc/{pid}/{what}"))
                .map_err(|e| ("reading the maps", e))
        };
        Ok((read("uid_map")?, read("gid_map")?))
    })();
    // SAFETY: our own child, killed and reaped by its PID.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, std::ptr::null_mut(), 0);
    }
    result
}
