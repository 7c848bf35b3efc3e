//! Linkerd's iptables rules in a pod's network namespace: the `nat` chains Linkerd's
//! proxy-init installs (as the `linkerd-init` container or inside Linkerd's iptables CNI
//! plugin), `PROXY_INIT_REDIRECT` and `PROXY_INIT_OUTPUT`. A pod that carries them is meshed
//! by them already, and attaching our programs on top breaks its inbound connections (they
//! reach the proxy REDIRECTed to its inbound port, which `sockops` then records as their
//! original destination; see `docs/operating/migrating.md`), so adoption leaves such a pod alone.
//!
//! Read from the calling thread's namespace, without running `iptables` and without creating
//! anything in it:
//!
//! - iptables-legacy (`ip_tables`, `ip6_tables`): only a `nat` table the namespace already
//!   has (listed in `/proc/thread-self/net/ip_tables_names`; asking the socket option for a
//!   table the namespace does not have yet would instantiate it, and with it connection
//!   tracking in the pod), its entries through `IPT_SO_GET_INFO` and `IPT_SO_GET_ENTRIES` on a
//!   UDP socket; a user chain is an `ERROR` target named after the chain;
//! - nftables (what `iptables-nft` writes): every chain of every table, from one
//!   `NFT_MSG_GETCHAIN` netlink dump.
//!
//! Both need `CAP_NET_ADMIN` over the namespace, which the agent holds. A kernel without
//! `ip_tables` or `nf_tables` has no such rules: that is an empty answer, not an error.

use linkerd_cni_sys::uapi::{
    NFGENMSG_LEN, NFTA_CHAIN_NAME, NFTA_CHAIN_TABLE, NLMSG_DONE, NLMSG_ERROR, NLMSG_HDRLEN,
};
use std::{fs, io, mem::size_of};

/// The chains Linkerd's proxy-init creates in the `nat` table.
pub const LINKERD_CHAINS: [&str; 2] = ["PROXY_INIT_REDIRECT", "PROXY_INIT_OUTPUT"];

/// One chain of Linkerd's found in the namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chain {
    /// Where: `iptables-legacy`, `ip6tables-legacy`, or `nftables <family> <table>`.
    pub place: String,
    /// The chain's name.
    pub name: String,
}

impl std::fmt::Display for Chain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.place, self.name)
    }
}

/// Linkerd's chains in the calling thread's network namespace (empty when it has none).
pub fn linkerd_chains() -> io::Result<Vec<Chain>> {
    let mut found = Vec::new();
    for legacy in [&IPV4, &IPV6] {
        for name in legacy_nat_chains(legacy)? {
            found.push(Chain {
                place: legacy.backend.into(),
                name,
            });
        }
    }
    for (family, table, name) in nft_chains()? {
        found.push(Chain {
            place: format!("nftables {} {table}", nft_family(family)),
            name,
        });
    }
    found.retain(|c| LINKERD_CHAINS.contains(&c.name.as_str()));
    Ok(found)
}

/// One family of the legacy `x_tables` socket options.
struct Legacy {
    backend: &'static str,
    /// The namespace's instantiated tables, one name a line.
    names_file: &'static str,
    domain: libc::c_int,
    level: libc::c_int,
    /// `sizeof(struct ipt_entry)`'s offsets of `target_offset` and `next_offset`
    /// (`ip6t_entry` for IPv6): both `__u16`.
    target_offset_at: usize,
    next_offset_at: usize,
}

const IPV4: Legacy = Legacy {
    backend: "iptables-legacy",
    names_file: "/proc/thread-self/net/ip_tables_names",
    domain: libc::AF_INET,
    level: libc::SOL_IP,
    target_offset_at: 88,
    next_offset_at: 90,
};

const IPV6: Legacy = Legacy {
    backend: "ip6tables-legacy",
    names_file: "/proc/thread-self/net/ip6_tables_names",
    domain: libc::AF_INET6,
    level: libc::SOL_IPV6,
    target_offset_at: 140,
    next_offset_at: 142,
};

/// `IPT_SO_GET_INFO`, `IP6T_SO_GET_INFO`.
const SO_GET_INFO: libc::c_int = 64;
/// `IPT_SO_GET_ENTRIES`, `IP6T_SO_GET_ENTRIES`.
const SO_GET_ENTRIES: libc::c_int = 65;
/// `XT_TABLE_MAXNAMELEN`.
const TABLE_NAME_LEN: usize = 32;
/// `sizeof(struct ipt_getinfo)`: name, valid_hooks, hook_entry[5], underflow[5],
/// num_entries, size.
const GETINFO_LEN: usize = 84;
/// Offset of `size` in `struct ipt_getinfo`.
const GETINFO_SIZE_AT: usize = 80;
/// `sizeof(struct ipt_get_entries)` before its entries: name, size, padding.
const GET_ENTRIES_HEADER: usize = 40;
/// `struct xt_entry_target`: `target_size` (`__u16`), then the name (29 bytes) and revision.
const TARGET_NAME_AT: usize = 2;
const TARGET_NAME_LEN: usize = 29;
/// Where an `ERROR` target's data (the chain's name, 32 bytes) starts.
const TARGET_DATA_AT: usize = 32;
/// More than any `nat` table a pod would hold: a table beyond it is not read.
const MAX_TABLE_BYTES: usize = 16 << 20;

/// The user chains of the namespace's legacy `nat` table of one family; none when the
/// namespace has no such table (or the kernel no `x_tables` for that family).
fn legacy_nat_chains(legacy: &Legacy) -> io::Result<Vec<String>> {
    match fs::read_to_string(legacy.names_file) {
        Ok(names) if names.lines().any(|l| l.trim() == "nat") => {}
        Ok(_) => return Ok(Vec::new()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    }
    let socket = Socket::new(legacy.domain, libc::SOCK_DGRAM, 0)?;
    let mut info = [0u8; GETINFO_LEN];
    info[..3].copy_from_slice(b"nat");
    socket.getsockopt(legacy.level, SO_GET_INFO, &mut info)?;
    let size = u32::from_ne_bytes(word(&info, GETINFO_SIZE_AT)) as usize;
    if size > MAX_TABLE_BYTES {
        return Err(io::Error::other(format!(
            "the nat table holds {size} bytes of rules"
        )));
    }
    let mut entries = vec![0u8; GET_ENTRIES_HEADER + size];
    entries[..3].copy_from_slice(b"nat");
    entries[TABLE_NAME_LEN..TABLE_NAME_LEN + 4].copy_from_slice(&(size as u32).to_ne_bytes());
    socket.getsockopt(legacy.level, SO_GET_ENTRIES, &mut entries)?;
    Ok(user_chains(&entries[GET_ENTRIES_HEADER..], legacy))
}

fn word(bytes: &[u8], at: usize) -> [u8; 4] {
    let mut w = [0u8; 4];
    if let Some(src) = bytes.get(at..at + 4) {
        w.copy_from_slice(src);
    }
    w
}

fn half(bytes: &[u8], at: usize) -> Option<usize> {
    let b = bytes.get(at..at + 2)?;
    Some(usize::from(u16::from_ne_bytes([b[0], b[1]])))
}

/// A NUL-terminated name in `bytes[at..at + len]`.
fn name_at(bytes: &[u8], at: usize, len: usize) -> Option<&str> {
    let field = bytes.get(at..at + len)?;
    let end = field.iter().position(|b| *b == 0).unwrap_or(len);
    std::str::from_utf8(&field[..end]).ok()
}

/// The user chains of a legacy table's entries: each begins with an entry whose target is
/// `ERROR` with the chain's name as its data (the table's last entry is an `ERROR` target
/// named `ERROR`).
fn user_chains(entries: &[u8], legacy: &Legacy) -> Vec<String> {
    let mut chains = Vec::new();
    let mut at = 0;
    while at < entries.len() {
        let (Some(target), Some(next)) = (
            half(entries, at + legacy.target_offset_at),
            half(entries, at + legacy.next_offset_at),
        ) else {
            break;
        };
        let target = at + target;
        if name_at(entries, target + TARGET_NAME_AT, TARGET_NAME_LEN) == Some("ERROR")
            && let Some(chain) = name_at(entries, target + TARGET_DATA_AT, TABLE_NAME_LEN)
            && chain != "ERROR"
        {
            chains.push(chain.to_string());
        }
        if next == 0 {
            break;
        }
        at += next;
    }
    chains
}

/// `NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_GETCHAIN`.
const NFT_GETCHAIN: u16 = (10 << 8) | 4;

/// Every nftables chain of the namespace: (family, table, chain).
fn nft_chains() -> io::Result<Vec<(u8, String, String)>> {
    let socket = match Socket::new(libc::AF_NETLINK, libc::SOCK_RAW, libc::NETLINK_NETFILTER) {
        Ok(s) => s,
        // No nfnetlink in this kernel: no nftables rules either.
        Err(e) if e.raw_os_error() == Some(libc::EPROTONOSUPPORT) => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut request = [0u8; NLMSG_HDRLEN + NFGENMSG_LEN];
    request[0..4].copy_from_slice(&((NLMSG_HDRLEN + NFGENMSG_LEN) as u32).to_ne_bytes());
    request[4..6].copy_from_slice(&NFT_GETCHAIN.to_ne_bytes());
    let flags = (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16;
    request[6..8].copy_from_slice(&flags.to_ne_bytes());
    request[8..12].copy_from_slice(&1u32.to_ne_bytes());
    // nfgenmsg: AF_UNSPEC (every family), NFNETLINK_V0, res_id 0.
    socket.send(&request)?;
    let mut chains = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = socket.recv(&mut buf)?;
        if n == 0 {
            return Ok(chains);
        }
        match parse_chain_dump(&buf[..n], &mut chains) {
            Dump::More => {}
            Dump::Done => return Ok(chains),
            // nf_tables not loaded (nothing can hold rules), or not in this namespace.
            Dump::Error(errno) if [libc::EOPNOTSUPP, libc::ENOENT].contains(&errno) => {
                return Ok(chains);
            }
            Dump::Error(errno) => return Err(io::Error::from_raw_os_error(errno)),
        }
    }
}

/// Where a netlink dump stands after one datagram.
#[derive(Debug, PartialEq, Eq)]
enum Dump {
    More,
    Done,
    Error(i32),
}

/// Adds the chains of one datagram of an `NFT_MSG_GETCHAIN` dump to `chains`.
fn parse_chain_dump(mut data: &[u8], chains: &mut Vec<(u8, String, String)>) -> Dump {
    while data.len() >= NLMSG_HDRLEN {
        let len = u32::from_ne_bytes(word(data, 0)) as usize;
        let kind = half(data, 4).unwrap_or(0) as u16;
        if len < NLMSG_HDRLEN || len > data.len() {
            return Dump::Error(libc::EBADMSG);
        }
        let body = &data[NLMSG_HDRLEN..len];
        match kind {
            NLMSG_DONE => return Dump::Done,
            NLMSG_ERROR => {
                let errno = i32::from_ne_bytes(word(body, 0));
                return if errno == 0 {
                    Dump::Done
                } else {
                    Dump::Error(-errno)
                };
            }
            NFT_GETCHAIN_REPLY if body.len() >= NFGENMSG_LEN => {
                let family = body[0];
                let (mut table, mut name) = (None, None);
                let mut attrs = &body[NFGENMSG_LEN..];
                while attrs.len() >= 4 {
                    let alen = half(attrs, 0).unwrap_or(0);
                    let atype = half(attrs, 2).unwrap_or(0) as u16 & 0x3fff;
                    if alen < 4 || alen > attrs.len() {
                        break;
                    }
                    let value = name_at(attrs, 4, alen - 4).map(str::to_string);
                    match atype {
                        NFTA_CHAIN_TABLE => table = value,
                        NFTA_CHAIN_NAME => name = value,
                        _ => {}
                    }
                    attrs = attrs.get(align4(alen)..).unwrap_or_default();
                }
                if let (Some(t), Some(n)) = (table, name) {
                    chains.push((family, t, n));
                }
            }
            _ => {}
        }
        data = data.get(align4(len)..).unwrap_or_default();
    }
    Dump::More
}

/// A chain's message in the dump (`NFT_MSG_NEWCHAIN`).
const NFT_GETCHAIN_REPLY: u16 = (10 << 8) | 3;

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

fn nft_family(family: u8) -> &'static str {
    match i32::from(family) {
        libc::AF_INET => "ip",
        libc::AF_INET6 => "ip6",
        1 => "inet",
        libc::AF_BRIDGE => "bridge",
        3 => "arp",
        5 => "netdev",
        _ => "unknown",
    }
}

/// A socket closed on drop.
struct Socket(libc::c_int);

impl Socket {
    fn new(domain: libc::c_int, kind: libc::c_int, protocol: libc::c_int) -> io::Result<Self> {
        // SAFETY: a plain socket(2); the descriptor is owned by the value returned.
        let fd = unsafe { libc::socket(domain, kind | libc::SOCK_CLOEXEC, protocol) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self(fd))
    }

    /// A getsockopt(2) whose buffer is both input and output, filled to its length.
    fn getsockopt(&self, level: libc::c_int, name: libc::c_int, buf: &mut [u8]) -> io::Result<()> {
        let mut len = libc::socklen_t::try_from(buf.len())
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: `buf` is valid for `len` bytes and outlives the call.
        let ret =
            unsafe { libc::getsockopt(self.0, level, name, buf.as_mut_ptr().cast(), &mut len) };
        if ret < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn send(&self, data: &[u8]) -> io::Result<()> {
        // SAFETY: `data` is valid for its length; the kernel address is zeroed (the kernel).
        let ret = unsafe {
            let mut to: libc::sockaddr_nl = std::mem::zeroed();
            to.nl_family = libc::AF_NETLINK as libc::sa_family_t;
            libc::sendto(
                self.0,
                data.as_ptr().cast(),
                data.len(),
                0,
                (&raw const to).cast(),
                size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if ret < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: `buf` is valid for its length.
        let ret = unsafe { libc::recv(self.0, buf.as_mut_ptr().cast(), buf.len(), 0) };
        if ret < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(ret as usize)
    }
}

impl Drop for Socket {
    fn drop(&mut self) {
        // SAFETY: the descriptor is ours and closed once.
        unsafe { libc::close(self.0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A legacy entry of `len` bytes whose target (at 112, the entry's fixed part) is `name`
    /// with `data`.
    fn entry(legacy: &Legacy, fixed: usize, name: &str, data: &str, len: usize) -> Vec<u8> {
        let mut e = vec![0u8; len];
        e[legacy.target_offset_at..legacy.target_offset_at + 2]
            .copy_from_slice(&(fixed as u16).to_ne_bytes());
        e[legacy.next_offset_at..legacy.next_offset_at + 2]
            .copy_from_slice(&(len as u16).to_ne_bytes());
        let t = fixed + TARGET_NAME_AT;
        e[t..t + name.len()].copy_from_slice(name.as_bytes());
        let d = fixed + TARGET_DATA_AT;
        e[d..d + data.len()].copy_from_slice(data.as_bytes());
        e
    }

    #[test]
    fn legacy_user_chains_are_error_targets() {
        for (legacy, fixed) in [(&IPV4, 112), (&IPV6, 168)] {
            let len = fixed + 64;
            let mut table = Vec::new();
            table.extend(entry(legacy, fixed, "", "", len));
            table.extend(entry(legacy, fixed, "ERROR", "PROXY_INIT_OUTPUT", len));
            table.extend(entry(legacy, fixed, "REDIRECT", "PROXY_INIT_FAKE", len));
            table.extend(entry(legacy, fixed, "ERROR", "PROXY_INIT_REDIRECT", len));
            table.extend(entry(legacy, fixed, "ERROR", "ERROR", len));
            assert_eq!(
                user_chains(&table, legacy),
                ["PROXY_INIT_OUTPUT", "PROXY_INIT_REDIRECT"],
                "{}",
                legacy.backend
            );
            // Truncated or zero-length entries end the walk instead of looping.
            assert!(user_chains(&table[..fixed], legacy).is_empty());
            let mut stuck = entry(legacy, fixed, "ERROR", "X", len);
            stuck[legacy.next_offset_at..legacy.next_offset_at + 2].copy_from_slice(&[0, 0]);
            assert_eq!(user_chains(&stuck, legacy), ["X"]);
        }
    }

    fn attr(kind: u16, value: &str) -> Vec<u8> {
        let mut a = Vec::new();
        let len = 4 + value.len() + 1;
        a.extend((len as u16).to_ne_bytes());
        a.extend(kind.to_ne_bytes());
        a.extend(value.as_bytes());
        a.push(0);
        a.resize(align4(len), 0);
        a
    }

    fn message(kind: u16, body: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend(((NLMSG_HDRLEN + body.len()) as u32).to_ne_bytes());
        m.extend(kind.to_ne_bytes());
        m.extend([0u8; 10]);
        m.extend(body);
        m
    }

    #[test]
    fn nft_chain_dump_is_parsed() {
        let mut body = vec![libc::AF_INET as u8, 0, 0, 0];
        body.extend(attr(NFTA_CHAIN_TABLE, "nat"));
        body.extend(attr(2, "ignored handle"));
        body.extend(attr(NFTA_CHAIN_NAME, "PROXY_INIT_REDIRECT"));
        let mut datagram = message(NFT_GETCHAIN_REPLY, &body);
        let mut chains = Vec::new();
        assert_eq!(parse_chain_dump(&datagram, &mut chains), Dump::More);
        assert_eq!(
            chains,
            [(
                libc::AF_INET as u8,
                "nat".into(),
                "PROXY_INIT_REDIRECT".into()
            )]
        );
        datagram.extend(message(NLMSG_DONE, &[0; 4]));
        chains.clear();
        assert_eq!(parse_chain_dump(&datagram, &mut chains), Dump::Done);
        assert_eq!(chains.len(), 1);
        let error = message(NLMSG_ERROR, &(-libc::EPERM).to_ne_bytes());
        assert_eq!(
            parse_chain_dump(&error, &mut chains),
            Dump::Error(libc::EPERM)
        );
        // A length beyond the datagram is an error, not a read past it.
        let mut bad = message(NFT_GETCHAIN_REPLY, &body);
        bad[0] = 0xff;
        assert_eq!(
            parse_chain_dump(&bad, &mut chains),
            Dump::Error(libc::EBADMSG)
        );
    }
}
