//! Work done inside a pod's network namespace: a thread of its own enters it and makes what
//! must be made there (a netlink socket), which then answers for that namespace from any
//! thread. Below every other module of the plugin (it imports none of them).

use std::{
    fs::File,
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
};

/// Runs `f` on a thread of its own that first enters `netns` (and ends there: no other thread
/// changes namespace); what `f` makes there (a socket) answers for that namespace from any
/// thread.
pub fn run_inside<T: Send>(
    netns: &File,
    f: impl FnOnce() -> io::Result<T> + Send,
) -> io::Result<T> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                // SAFETY: setns on a descriptor we hold open; affects this thread only.
                if unsafe { libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    return Err(io::Error::last_os_error());
                }
                f()
            })
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the netns thread panicked")))
    })
}

/// A netlink socket of `protocol` in the calling thread's network namespace.
pub fn netlink_socket(protocol: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2); the result is checked before use.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            protocol,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
