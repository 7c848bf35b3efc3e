//! Links and attachments: creating, updating, detaching and reading bpf_links of cgroups,
//! network namespaces and iterators, and the attachments the kernel keeps without a link
//! (`BPF_PROG_ATTACH`, which other tenants use).
//!
//! aya 0.14 cannot turn every link type it creates into a pinnable link (cgroup sockopt and
//! sock_addr links among them), so the agent creates links here, uniformly, from aya-loaded
//! program fds, and owns them by their bpffs pins: it keeps no link fd open.
//!
//! # Minimum kernel version
//! 5.7 (`BPF_LINK_CREATE` for cgroups).

use std::{
    io,
    os::fd::{AsFd, AsRawFd, OwnedFd},
};

use linkerd_cni_common::names::Hook;

use super::{Attr, bpf, bpf_fd, obj_info};
use crate::uapi;

/// `BPF_LINK_CREATE`: attaches `prog` to `target` (a cgroup or netns fd) as a bpf_link.
pub fn link_create(prog: impl AsFd, target: impl AsFd, hook: Hook) -> io::Result<OwnedFd> {
    link_create_flags(prog, target, hook, 0)
}

/// `BPF_LINK_CREATE` with `flags` (`BPF_F_BEFORE` and friends, where the kernel orders
/// links on the target; with no relative program or link, `BPF_F_BEFORE` means first).
pub fn link_create_flags(
    prog: impl AsFd,
    target: impl AsFd,
    hook: Hook,
    flags: u32,
) -> io::Result<OwnedFd> {
    link_create_raw(
        prog.as_fd().as_raw_fd() as u32,
        target.as_fd().as_raw_fd() as u32,
        hook,
        flags,
    )
}

/// `BPF_LINK_CREATE` with the target as a raw number (the probes pass an invalid one).
pub(crate) fn link_create_raw(
    prog: u32,
    target: u32,
    hook: Hook,
    flags: u32,
) -> io::Result<OwnedFd> {
    let mut attr = Attr::new();
    attr.put_u32(0, prog)
        .put_u32(4, target)
        .put_u32(8, hook.attach_type())
        .put_u32(12, flags);
    bpf_fd(uapi::BPF_LINK_CREATE, &mut attr)
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
        match link_create_flags(prog.as_fd(), cgroup.as_fd(), hook, uapi::F_BEFORE) {
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

/// `BPF_PROG_ATTACH` (the attachment the kernel keeps without a link) of `prog` to the cgroup
/// `target` with `flags`. The agent never attaches this way: other tenants do (and the tests'
/// stand-ins for them).
pub fn prog_attach(prog: impl AsFd, target: impl AsFd, hook: Hook, flags: u32) -> io::Result<()> {
    let mut attr = Attr::new();
    attr.put_u32(0, target.as_fd().as_raw_fd() as u32)
        .put_u32(4, prog.as_fd().as_raw_fd() as u32)
        .put_u32(8, hook.attach_type())
        .put_u32(12, flags);
    bpf(uapi::BPF_PROG_ATTACH, &mut attr).map(drop)
}

/// `BPF_PROG_DETACH` of `prog` from the cgroup `target` (a `BPF_PROG_ATTACH` attachment).
pub fn prog_detach(prog: impl AsFd, target: impl AsFd, hook: Hook) -> io::Result<()> {
    let mut attr = Attr::new();
    attr.put_u32(0, target.as_fd().as_raw_fd() as u32)
        .put_u32(4, prog.as_fd().as_raw_fd() as u32)
        .put_u32(8, hook.attach_type());
    bpf(uapi::BPF_PROG_DETACH, &mut attr).map(drop)
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
    bpf_fd(uapi::BPF_LINK_CREATE, &mut attr)
}

/// `BPF_ITER_CREATE`: a new iterator of the iterator link `link`; reading it runs the program.
/// A network iterator walks the network namespace of the calling thread.
///
/// # Minimum kernel version
/// 5.8.
pub fn iter_create(link: impl AsFd) -> io::Result<OwnedFd> {
    let mut attr = Attr::new();
    attr.put_u32(0, link.as_fd().as_raw_fd() as u32);
    bpf_fd(uapi::BPF_ITER_CREATE, &mut attr)
}

/// `BPF_LINK_DETACH`: detaches a link from its target; it stays pinned but does nothing.
pub fn link_detach(link: impl AsFd) -> io::Result<()> {
    let mut attr = Attr::new();
    attr.put_u32(0, link.as_fd().as_raw_fd() as u32);
    bpf(uapi::BPF_LINK_DETACH, &mut attr).map(drop)
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
    // BPF_LINK_TYPE_CGROUP: { u64 cgroup_id; u32 attach_type }
    // BPF_LINK_TYPE_NETNS: { u32 netns_ino; u32 attach_type }
    let (target, attach_type) = if link_type == uapi::LINK_TYPE_NETNS {
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
    bpf(uapi::BPF_LINK_UPDATE, &mut attr).map(drop)
}

#[cfg(test)]
mod tests {
    use std::{fs::File, os::fd::IntoRawFd};

    use super::*;
    use crate::bpf::tests::Double;

    /// A kernel that does not order cgroup links (before 6.6) refuses `BPF_F_BEFORE` with
    /// `EINVAL`: the link is made without it, and every later one without asking again.
    #[test]
    fn cgroup_links_without_ordering_are_made_last() {
        let double = Double::new(|cmd, attr| {
            assert_eq!(cmd, uapi::BPF_LINK_CREATE);
            match attr.u32_at(12) {
                uapi::F_BEFORE => Err(io::Error::from_raw_os_error(libc::EINVAL)),
                _ => Ok(File::open("/dev/null").expect("/dev/null").into_raw_fd() as _),
            }
        });
        let (prog, cgroup) = (File::open("/dev/null").unwrap(), File::open("/").unwrap());
        assert_eq!(cgroup_links_ordered(), None);
        cgroup_link_create(&prog, &cgroup, Hook::Connect4).expect("made without the flag");
        assert_eq!(cgroup_links_ordered(), Some(false));
        cgroup_link_create(&prog, &cgroup, Hook::Connect6).expect("made without the flag");
        let calls: Vec<(u32, u32)> = double
            .calls()
            .iter()
            .map(|(_, a)| {
                let at = |o: usize| u32::from_ne_bytes([a[o], a[o + 1], a[o + 2], a[o + 3]]);
                (at(8), at(12))
            })
            .collect();
        assert_eq!(
            calls,
            [
                (Hook::Connect4.attach_type(), uapi::F_BEFORE),
                (Hook::Connect4.attach_type(), 0),
                (Hook::Connect6.attach_type(), 0),
            ]
        );
    }
}
