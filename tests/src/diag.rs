//! Which TCP sockets of a netns carry socket-local storage of a given BPF map, asked of the
//! kernel with `sock_diag` (`INET_DIAG_REQ_SK_BPF_STORAGES`): socket storage cannot be listed
//! through the map itself (`bpftool map dump` gets `EOPNOTSUPP`), and this iproute2's `ss` is
//! built without `--bpf-maps`.

use linkerd_cni_sys::uapi::{NLA_F_NESTED, NLM_F_DUMP, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR};
use std::{
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    path::Path,
    time::{Duration, Instant},
};

use crate::{Error, NetnsGuard, Result};

const SOCK_DIAG_BY_FAMILY: u16 = 20;
const INET_DIAG_REQ_SK_BPF_STORAGES: u16 = 2;
const SK_DIAG_BPF_STORAGE_REQ_MAP_FD: u16 = 1;
const INET_DIAG_SK_BPF_STORAGES: u16 = 20;
const NLA_TYPE_MASK: u16 = 0x3fff;
/// `struct nlmsghdr` + `struct inet_diag_req_v2`.
const HDR: usize = 16;
const REQ: usize = 56;
/// `struct inet_diag_msg`.
const MSG: usize = 72;

/// Waits up to `within` until no TCP socket in `netns` holds storage of the map pinned at
/// `map`; panics, listing the sockets that still do, when they outlive it.
pub fn wait_until_no_socket_holds_storage(netns: &NetnsGuard, map: &Path, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let held = sockets_with_storage(netns, map).expect("sock_diag");
        if held.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "storage outlives the sockets: {held:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The (local, peer) addresses of every TCP socket (IPv4 and IPv6, any state) in `netns`
/// that holds storage of the map pinned at `map`.
pub fn sockets_with_storage(
    netns: &NetnsGuard,
    map: &Path,
) -> Result<Vec<(SocketAddr, SocketAddr)>> {
    let map = linkerd_cni_sys::bpf::obj_get(map)
        .map_err(|e| Error::io(format!("opening map {}", map.display()), e))?;
    let fd = map.as_raw_fd() as u32;
    netns
        .run_in(move || {
            let mut out = dump(libc::AF_INET as u8, fd)?;
            out.extend(dump(libc::AF_INET6 as u8, fd)?);
            Ok(out)
        })?
        .map_err(|e: io::Error| Error::io("sock_diag dump", e))
}

fn dump(family: u8, map_fd: u32) -> io::Result<Vec<(SocketAddr, SocketAddr)>> {
    // SAFETY: plain socket(2); the fd is owned at once.
    let raw = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            libc::NETLINK_SOCK_DIAG,
        )
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new fd we own.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    // nested attribute { map fd attribute }
    let attrs_len = 4 + 8;
    let len = HDR + REQ + attrs_len;
    let mut req = vec![0u8; len];
    req[0..4].copy_from_slice(&(len as u32).to_ne_bytes());
    req[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    req[6..8].copy_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    let r = HDR;
    req[r] = family;
    req[r + 1] = libc::IPPROTO_TCP as u8;
    req[r + 4..r + 8].copy_from_slice(&u32::MAX.to_ne_bytes()); // every state
    let a = HDR + REQ;
    req[a..a + 2].copy_from_slice(&(attrs_len as u16).to_ne_bytes());
    req[a + 2..a + 4]
        .copy_from_slice(&(INET_DIAG_REQ_SK_BPF_STORAGES | NLA_F_NESTED).to_ne_bytes());
    req[a + 4..a + 6].copy_from_slice(&8u16.to_ne_bytes());
    req[a + 6..a + 8].copy_from_slice(&SK_DIAG_BPF_STORAGE_REQ_MAP_FD.to_ne_bytes());
    req[a + 8..a + 12].copy_from_slice(&map_fd.to_ne_bytes());
    // SAFETY: sending our buffer on our socket (the kernel is the default destination).
    if unsafe { libc::send(sock.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // SAFETY: receiving into our buffer.
        let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut off = 0;
        let n = n as usize;
        while off + HDR <= n {
            let u32_at = |o: usize| u32::from_ne_bytes(buf[o..o + 4].try_into().expect("4 bytes"));
            let u16_at = |o: usize| u16::from_ne_bytes(buf[o..o + 2].try_into().expect("2 bytes"));
            let msg_len = u32_at(off) as usize;
            match u16_at(off + 4) {
                NLMSG_DONE => return Ok(out),
                NLMSG_ERROR => {
                    let errno = -(u32_at(off + HDR) as i32);
                    return Err(io::Error::from_raw_os_error(errno));
                }
                _ => {}
            }
            let m = off + HDR;
            let port = |o: usize| u16::from_be_bytes([buf[o], buf[o + 1]]);
            let ip = |o: usize| -> IpAddr {
                if family == libc::AF_INET as u8 {
                    Ipv4Addr::new(buf[o], buf[o + 1], buf[o + 2], buf[o + 3]).into()
                } else {
                    let b: [u8; 16] = buf[o..o + 16].try_into().expect("16 bytes");
                    Ipv6Addr::from(b).into()
                }
            };
            // inet_diag_msg: family, state, timer, retrans, then inet_diag_sockid at 4:
            // sport(2) dport(2) src(16) dst(16) ...
            let local = SocketAddr::new(ip(m + 8), port(m + 4));
            let peer = SocketAddr::new(ip(m + 24), port(m + 6));
            let mut at = m + MSG;
            let end = off + msg_len;
            while at + 4 <= end {
                let (alen, atype) = (u16_at(at) as usize, u16_at(at + 2) & NLA_TYPE_MASK);
                if alen < 4 {
                    break;
                }
                if atype == INET_DIAG_SK_BPF_STORAGES {
                    out.push((local, peer));
                }
                at += (alen + 3) & !3;
            }
            off += (msg_len + 3) & !3;
        }
    }
}
