//! The socket calls of the kernel's raw interface: a socket's network namespace cookie
//! (`SO_NETNS_COOKIE`) and namespace (`SIOCGSKNS`), and descriptors passed over a Unix socket
//! (`SCM_RIGHTS`, both ends: the plugin sends the socket it made inside a pod's netns, the
//! agent receives it).

use std::{
    fs::File,
    io,
    os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd},
};

use crate::uapi::{SIOCGSKNS, SO_NETNS_COOKIE};

/// `getsockopt(SO_NETNS_COOKIE)`: the cookie of the network namespace `sock` was made in.
///
/// # Minimum kernel version
/// 5.14.
pub fn netns_cookie(sock: impl AsFd) -> io::Result<u64> {
    let mut cookie: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: getsockopt into a u64 we own, with its size.
    let ret = unsafe {
        libc::getsockopt(
            sock.as_fd().as_raw_fd(),
            libc::SOL_SOCKET,
            SO_NETNS_COOKIE,
            (&raw mut cookie).cast(),
            &mut len,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cookie)
}

/// The cookie of the calling thread's network namespace: [`netns_cookie`] of a UDP socket
/// made here and closed at once.
pub fn current_netns_cookie() -> io::Result<u64> {
    // SAFETY: plain socket(2).
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the socket just made, owned by nothing else.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    netns_cookie(&sock)
}

/// `ioctl(SIOCGSKNS)`: the network namespace `sock` was made in, as a namespace file
/// (`CAP_NET_ADMIN` over that namespace).
pub fn socket_netns(sock: impl AsFd) -> io::Result<File> {
    // SAFETY: an ioctl on a socket we hold; on success it returns a new descriptor.
    let raw = unsafe { libc::ioctl(sock.as_fd().as_raw_fd(), SIOCGSKNS as _) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor owned by nothing else.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(raw) }))
}

/// One `sendmsg` of `bytes` on `sock` with `fds` in one `SCM_RIGHTS` message (none: a plain
/// send), with `flags` (`MSG_NOSIGNAL`, ...); how many bytes went (the descriptors travel with
/// the first byte). An interrupted call is the caller's to retry.
pub fn send_with_fds(
    sock: impl AsFd,
    bytes: &[u8],
    fds: &[RawFd],
    flags: libc::c_int,
) -> io::Result<usize> {
    let len = std::mem::size_of_val(fds) as u32;
    // SAFETY: CMSG_SPACE is a pure computation.
    let space = unsafe { libc::CMSG_SPACE(len) } as usize;
    // u64s: the control buffer must be aligned for cmsghdr.
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // SAFETY: msghdr is plain data; all zeroes is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: the control buffer holds one cmsghdr with room for `fds` (CMSG_SPACE),
        // aligned; CMSG_FIRSTHDR of it is non-null.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(len) as _;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr(),
                libc::CMSG_DATA(cmsg).cast::<RawFd>(),
                fds.len(),
            );
        }
    }
    // SAFETY: `msg` points to live buffers for the duration of the call.
    let n = unsafe { libc::sendmsg(sock.as_fd().as_raw_fd(), &msg, flags) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// What one [`recv_with_fds`] got.
#[derive(Debug)]
pub struct Received {
    /// Bytes read into the buffer.
    pub len: usize,
    /// Every descriptor received (close-on-exec), in the order sent.
    pub fds: Vec<OwnedFd>,
    /// The control data was cut short (`MSG_CTRUNC`: more descriptors than there was room
    /// for, which the kernel closed).
    pub truncated: bool,
}

/// One `recvmsg` on `sock` into `buf`, with room for `max_fds` descriptors, with `flags`
/// (`MSG_DONTWAIT`, ...; `MSG_CMSG_CLOEXEC` is always added). Every `SCM_RIGHTS` descriptor
/// received is taken: none is left open unowned.
pub fn recv_with_fds(
    sock: RawFd,
    buf: &mut [u8],
    max_fds: usize,
    flags: libc::c_int,
) -> io::Result<Received> {
    let fds_len = (max_fds * std::mem::size_of::<libc::c_int>()) as u32;
    // SAFETY: CMSG_SPACE is a pure computation.
    let space = unsafe { libc::CMSG_SPACE(fds_len) } as usize;
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain data; all zeroes is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: `msg` points to live buffers for the duration of the call.
    let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC | flags) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut fds = Vec::new();
    // SAFETY: walking the control messages the kernel wrote into `control`, within
    // `msg_controllen`; an SCM_RIGHTS message's data holds descriptors now ours, as many as
    // fit in its length.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg);
                let header = data.offset_from(cmsg.cast::<u8>()) as usize;
                let count = ((*cmsg).cmsg_len as usize).saturating_sub(header)
                    / std::mem::size_of::<libc::c_int>();
                for i in 0..count {
                    let raw = std::ptr::read_unaligned(data.cast::<libc::c_int>().add(i));
                    if raw >= 0 {
                        fds.push(OwnedFd::from_raw_fd(raw));
                    }
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    Ok(Received {
        len: n as usize,
        fds,
        truncated: msg.msg_flags & libc::MSG_CTRUNC != 0,
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixDatagram;

    use super::*;

    /// Descriptors sent at one end arrive at the other, each a new descriptor of the same
    /// file, and more than there is room for is said (`truncated`), with what fitted owned.
    #[test]
    fn descriptors_cross_a_unix_socket() {
        let (a, b) = UnixDatagram::pair().expect("socketpair");
        let (r1, _w1) = std::io::pipe().expect("pipe");
        let (r2, _w2) = std::io::pipe().expect("pipe");
        let sent = [r1.as_raw_fd(), r2.as_raw_fd()];
        assert_eq!(send_with_fds(&a, b"hi", &sent, 0).expect("sendmsg"), 2);
        let mut buf = [0u8; 8];
        let got = recv_with_fds(b.as_raw_fd(), &mut buf, 4, 0).expect("recvmsg");
        assert_eq!((got.len, &buf[..2], got.truncated), (2, &b"hi"[..], false));
        assert_eq!(got.fds.len(), 2);
        let ino = |fd: RawFd| {
            let path = format!("/proc/self/fd/{fd}");
            std::fs::read_link(path).expect("the fd's link")
        };
        for (fd, want) in got.fds.iter().zip(sent) {
            assert_ne!(fd.as_raw_fd(), want, "a new descriptor");
            assert_eq!(ino(fd.as_raw_fd()), ino(want), "of the same pipe");
        }

        // Room for one is rounded up to the control data's alignment (two on 64-bit): three.
        let three = [sent[0], sent[1], sent[0]];
        assert_eq!(send_with_fds(&a, b"x", &three, 0).expect("sendmsg"), 1);
        let got = recv_with_fds(b.as_raw_fd(), &mut buf, 1, 0).expect("recvmsg");
        assert!(got.truncated, "three descriptors in room for one");
        assert!(got.fds.len() < 3);
    }

    /// The cookie read on a socket is the calling thread's netns's, the same for every socket
    /// made in it (on kernels with `SO_NETNS_COOKIE`; refused, not guessed, on older ones).
    #[test]
    fn every_socket_of_a_netns_has_its_cookie() {
        let (a, _b) = UnixDatagram::pair().expect("socketpair");
        match (netns_cookie(&a), current_netns_cookie()) {
            (Ok(x), Ok(y)) => assert_eq!(x, y),
            (Err(x), Err(y)) => assert_eq!(x.raw_os_error(), y.raw_os_error()),
            other => panic!("{other:?}"),
        }
    }
}
