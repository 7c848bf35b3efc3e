//! The addresses of a network namespace, asked of the kernel through a route netlink socket
//! that was created inside it (`RTM_GETADDR` dump): the agent reads a pod's addresses without
//! entering its namespace (which would need `CAP_SYS_ADMIN`), from the socket the plugin made
//! there. A netlink socket answers for the namespace it was created in, whoever holds it.
//!
//! The socket comes from a peer that keeps its own descriptor of it, so nothing it holds is
//! trusted: only messages the kernel sent (sender port 0) answering this dump's sequence
//! number are read, whatever else sits in the queue; the descriptor's blocking mode (shared
//! with the peer) is never relied on: every wait is a `poll` with a deadline.

use linkerd_cni_sys::uapi::{NLMSG_DONE, NLMSG_ERROR, NLMSG_HDRLEN};
use std::{
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    os::fd::{AsRawFd, BorrowedFd},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

/// How long the whole dump may take (a pod's namespace has a handful of addresses).
const DEADLINE: Duration = Duration::from_secs(2);
/// `struct ifaddrmsg` length.
const IFADDRMSG_LEN: usize = 8;
const RTM_NEWADDR: u16 = 20;
const RTM_GETADDR: u16 = 22;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;

/// Whether `fd` is a route netlink socket (the plugin's since it passes one; an older plugin's
/// is an `AF_UNIX` socket, which can tell the namespace but not its addresses).
pub fn is_route_socket(fd: BorrowedFd<'_>) -> bool {
    let int_opt = |opt: libc::c_int| {
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: getsockopt into an int we own, with its size.
        let ret = unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&raw mut v).cast(),
                &mut len,
            )
        };
        (ret == 0).then_some(v)
    };
    int_opt(libc::SO_DOMAIN) == Some(libc::AF_NETLINK)
        && int_opt(libc::SO_PROTOCOL) == Some(libc::NETLINK_ROUTE)
}

/// Every address of the namespace `fd` (a route netlink socket) was created in, loopback
/// included.
pub fn addresses(fd: BorrowedFd<'_>) -> io::Result<Vec<IpAddr>> {
    // A sequence number of this dump: answers to anything else asked on the socket are
    // skipped (whatever the kernel sends is about this same namespace anyway).
    static SEQ: AtomicU32 = AtomicU32::new(1);
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let mut req = [0u8; NLMSG_HDRLEN + IFADDRMSG_LEN];
    req[0..4].copy_from_slice(&((NLMSG_HDRLEN + IFADDRMSG_LEN) as u32).to_ne_bytes());
    req[4..6].copy_from_slice(&RTM_GETADDR.to_ne_bytes());
    let flags = (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16;
    req[6..8].copy_from_slice(&flags.to_ne_bytes());
    req[8..12].copy_from_slice(&seq.to_ne_bytes());
    // ifaddrmsg: family AF_UNSPEC (every family), the rest zero.
    // SAFETY: a zeroed sockaddr_nl with its family set is the kernel's address (port 0).
    let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    kernel.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    // SAFETY: sendto with a buffer and an address we own, with their sizes.
    let sent = unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            req.as_ptr().cast(),
            req.len(),
            libc::MSG_DONTWAIT,
            (&raw const kernel).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    let deadline = Instant::now() + DEADLINE;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        wait_readable(fd, deadline)?;
        // SAFETY: a zeroed sockaddr_nl for recvfrom to fill.
        let mut from: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        let mut from_len = std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t;
        // SAFETY: recvfrom into a buffer and an address we own, with their sizes.
        let n = unsafe {
            libc::recvfrom(
                fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
                (&raw mut from).cast(),
                &mut from_len,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if from.nl_pid != 0 {
            // Not from the kernel: another process's message to this socket.
            continue;
        }
        if parse(&buf[..n as usize], seq, &mut out)? {
            return Ok(out);
        }
    }
}

/// Waits until `fd` is readable, or fails at `deadline`.
fn wait_readable(fd: BorrowedFd<'_>, deadline: Instant) -> io::Result<()> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "the namespace's address dump did not end in time",
        ));
    }
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = left.as_millis().clamp(1, i32::MAX as u128) as libc::c_int;
    // SAFETY: poll on one pollfd we own.
    let ret = unsafe { libc::poll(&mut pfd, 1, ms) };
    if ret < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(());
        }
        return Err(e);
    }
    Ok(())
}

/// Reads one datagram of netlink messages, adding the addresses of this dump's
/// `RTM_NEWADDR`s to `out`; true once the dump's `NLMSG_DONE` came.
fn parse(mut data: &[u8], seq: u32, out: &mut Vec<IpAddr>) -> io::Result<bool> {
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
    while data.len() >= NLMSG_HDRLEN {
        let len = u32::from_ne_bytes(data[0..4].try_into().map_err(|_| bad("header"))?) as usize;
        if len < NLMSG_HDRLEN || len > data.len() {
            return Err(bad("a netlink message's length"));
        }
        let kind = u16::from_ne_bytes([data[4], data[5]]);
        let msg_seq = u32::from_ne_bytes(data[8..12].try_into().map_err(|_| bad("header"))?);
        let body = &data[NLMSG_HDRLEN..len];
        if msg_seq == seq {
            match kind {
                NLMSG_DONE => return Ok(true),
                NLMSG_ERROR => {
                    let errno = body
                        .get(0..4)
                        .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
                        .unwrap_or(0);
                    return Err(io::Error::from_raw_os_error(-errno));
                }
                RTM_NEWADDR => {
                    if let Some(ip) = address(body) {
                        out.push(ip);
                    }
                }
                _ => {}
            }
        }
        let aligned = (len + 3) & !3;
        data = data.get(aligned..).unwrap_or(&[]);
    }
    Ok(false)
}

/// The address of one `RTM_NEWADDR` body: `IFA_LOCAL` for IPv4 (the interface's own address;
/// `IFA_ADDRESS` is the peer's on point-to-point links), else `IFA_ADDRESS`.
fn address(body: &[u8]) -> Option<IpAddr> {
    let family = i32::from(*body.first()?);
    let mut attrs = body.get(IFADDRMSG_LEN..)?;
    let (mut local, mut addr) = (None, None);
    while attrs.len() >= 4 {
        let len = usize::from(u16::from_ne_bytes([attrs[0], attrs[1]]));
        let kind = u16::from_ne_bytes([attrs[2], attrs[3]]);
        if len < 4 || len > attrs.len() {
            break;
        }
        let value = &attrs[4..len];
        let ip = match (family, value.len()) {
            (libc::AF_INET, 4) => Some(IpAddr::V4(Ipv4Addr::new(
                value[0], value[1], value[2], value[3],
            ))),
            (libc::AF_INET6, 16) => {
                let octets: [u8; 16] = value.try_into().ok()?;
                Some(IpAddr::V6(Ipv6Addr::from(octets)))
            }
            _ => None,
        };
        match kind {
            IFA_LOCAL => local = ip,
            IFA_ADDRESS => addr = ip,
            _ => {}
        }
        attrs = attrs.get((len + 3) & !3..).unwrap_or(&[]);
    }
    local.or(addr)
}

#[cfg(test)]
mod tests {
    use std::os::fd::{AsFd, FromRawFd, OwnedFd};

    use super::*;

    fn route_socket() -> OwnedFd {
        // SAFETY: plain socket(2); checked before use.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        };
        assert!(fd >= 0, "socket: {}", io::Error::last_os_error());
        // SAFETY: a new descriptor owned by nothing else.
        unsafe { OwnedFd::from_raw_fd(fd) }
    }

    /// This process's namespace holds loopback: the dump lists 127.0.0.1, as `getifaddrs`
    /// (which reads the same dump) does, and every address `getifaddrs` lists.
    #[test]
    fn the_dump_lists_what_getifaddrs_lists() {
        let sock = route_socket();
        assert!(is_route_socket(sock.as_fd()));
        let got = addresses(sock.as_fd()).expect("the dump");
        assert!(got.contains(&IpAddr::V4(Ipv4Addr::LOCALHOST)), "{got:?}");
        for ifa in nix::ifaddrs::getifaddrs().expect("getifaddrs") {
            let Some(a) = ifa.address else { continue };
            let ip = a
                .as_sockaddr_in()
                .map(|s| IpAddr::V4(s.ip()))
                .or_else(|| a.as_sockaddr_in6().map(|s| IpAddr::V6(s.ip())));
            if let Some(ip) = ip {
                assert!(got.contains(&ip), "{ip} missing from {got:?}");
            }
        }
    }

    /// A Unix socket (an older plugin's) is not a route socket.
    #[test]
    fn a_unix_socket_is_not_a_route_socket() {
        let (a, _b) = std::os::unix::net::UnixDatagram::pair().expect("pair");
        assert!(!is_route_socket(a.as_fd()));
    }

    /// Messages answering another sequence number are skipped; the dump's end is seen.
    #[test]
    fn only_this_dumps_messages_count() {
        let msg = |kind: u16, seq: u32, body: &[u8]| {
            let len = NLMSG_HDRLEN + body.len();
            let mut m = vec![0u8; (len + 3) & !3];
            m[0..4].copy_from_slice(&(len as u32).to_ne_bytes());
            m[4..6].copy_from_slice(&kind.to_ne_bytes());
            m[8..12].copy_from_slice(&seq.to_ne_bytes());
            m[NLMSG_HDRLEN..len].copy_from_slice(body);
            m
        };
        let addr_body = |ip: [u8; 4]| {
            let mut b = vec![libc::AF_INET as u8, 24, 0, 0, 0, 0, 0, 0];
            b.extend_from_slice(&8u16.to_ne_bytes());
            b.extend_from_slice(&IFA_LOCAL.to_ne_bytes());
            b.extend_from_slice(&ip);
            b
        };
        let mut data = msg(RTM_NEWADDR, 7, &addr_body([10, 0, 0, 9]));
        data.extend(msg(RTM_NEWADDR, 8, &addr_body([10, 0, 0, 1])));
        let mut out = Vec::new();
        assert!(!parse(&data, 8, &mut out).expect("parse"));
        assert_eq!(out, vec![IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))]);
        assert!(parse(&msg(NLMSG_DONE, 8, &[0; 4]), 8, &mut out).expect("parse"));
    }
}
