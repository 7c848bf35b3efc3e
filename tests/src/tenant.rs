//! Another eBPF tenant on our hooks: a stand-in for Cilium's and Calico's socket load balancer
//! (`tests/tenant-ebpf`, its own object, embedded here only), attached the ways the field
//! attaches it (a bpf_link, `BPF_PROG_ATTACH` exclusive, with `BPF_F_ALLOW_OVERRIDE`, with
//! `BPF_F_ALLOW_MULTI` and `BPF_F_PREORDER`), and a loader that detaches every program of a
//! type. Always on test cgroups standing in for the cgroup2 root: everything it attached is
//! detached on drop, and nothing it did not attach is ever touched.

use linkerd_cni_sys::uapi;
use std::{
    fs,
    net::{Ipv4Addr, SocketAddrV4},
    os::fd::{AsFd, OwnedFd},
    path::Path,
};

use aya::{
    Ebpf,
    maps::Array,
    programs::{CgroupSockAddr, SkLookup},
};
use linkerd_cni_common::names::Hook;
use linkerd_cni_sys::bpf;

use crate::error::{Error, Result};

/// The tenant's object (see `tests/build.rs`).
static OBJECT: &[u8] = aya::include_bytes_aligned!(env!("LINKERD_CNI_TENANT_OBJECT"));

/// Its programs and hooks (`getpeername` shows the Service again for a translated socket).
pub const PROGRAMS: [(&str, Hook); 4] = [
    ("tenant_sock4_connect", Hook::Connect4),
    ("tenant_connect6", Hook::Connect6),
    ("tenant_peer4", Hook::Getpeername4),
    ("tenant_peer6", Hook::Getpeername6),
];

/// How the tenant attaches its programs to a cgroup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum How {
    /// A bpf_link (Cilium >= 1.14, Calico).
    Link,
    /// A bpf_link made first on the cgroup (`BPF_F_BEFORE`, where the kernel orders cgroup
    /// links).
    LinkFirst,
    /// `BPF_PROG_ATTACH` with flags 0 (Cilium <= 1.13, Merbridge, Kuma).
    Exclusive,
    /// `BPF_PROG_ATTACH` with `BPF_F_ALLOW_OVERRIDE`.
    Override,
    /// `BPF_PROG_ATTACH` with `BPF_F_ALLOW_MULTI`.
    Multi,
    /// `BPF_PROG_ATTACH` with `BPF_F_ALLOW_MULTI | BPF_F_PREORDER` (6.15).
    Preorder,
}

impl How {
    fn flags(self) -> u32 {
        match self {
            How::Link | How::Exclusive => 0,
            How::LinkFirst => uapi::F_BEFORE,
            How::Override => uapi::F_ALLOW_OVERRIDE,
            How::Multi => uapi::F_ALLOW_MULTI,
            How::Preorder => uapi::F_ALLOW_MULTI | uapi::F_PREORDER,
        }
    }
}

enum Attachment {
    Link(OwnedFd),
    Prog {
        cgroup: fs::File,
        prog: OwnedFd,
        attach: Hook,
    },
}

/// The stand-in socket load balancer: one Service (`vip`) translated to one backend.
pub struct SocketLb {
    ebpf: Ebpf,
    attached: Vec<Attachment>,
}

impl SocketLb {
    /// Loads the programs with `vip` translated to `backend`.
    pub fn load(vip: SocketAddrV4, backend: SocketAddrV4) -> Result<Self> {
        let sys = |what: &str, e: &dyn std::fmt::Display| Error::Missing(format!("{what}: {e}"));
        let mut ebpf = Ebpf::load(OBJECT).map_err(|e| sys("loading the tenant object", &e))?;
        for (name, _) in PROGRAMS {
            let prog: &mut CgroupSockAddr = ebpf
                .program_mut(name)
                .ok_or_else(|| Error::Missing(format!("tenant program {name}")))?
                .try_into()
                .map_err(|e| sys(name, &e))?;
            prog.load().map_err(|e| sys(name, &e))?;
        }
        let lookup: &mut SkLookup = ebpf
            .program_mut("tenant_lookup")
            .ok_or_else(|| Error::Missing("tenant program tenant_lookup".into()))?
            .try_into()
            .map_err(|e| sys("tenant_lookup", &e))?;
        lookup.load().map_err(|e| sys("tenant_lookup", &e))?;
        let mut svc: Array<_, [u32; 12]> = Array::try_from(
            ebpf.map_mut("tenant_svc")
                .ok_or_else(|| Error::Missing("map tenant_svc".into()))?,
        )
        .map_err(|e| sys("tenant_svc", &e))?;
        let be4 = |a: Ipv4Addr| u32::from_ne_bytes(a.octets());
        let port = |p: u16| u32::from(p.to_be());
        let mapped = |a: Ipv4Addr| {
            let v6 = a.to_ipv6_mapped().octets();
            let w = |i: usize| u32::from_ne_bytes([v6[i], v6[i + 1], v6[i + 2], v6[i + 3]]);
            [w(0), w(4), w(8), w(12)]
        };
        let (v6, b6) = (mapped(*vip.ip()), mapped(*backend.ip()));
        let value = [
            be4(*vip.ip()),
            be4(*backend.ip()),
            port(vip.port()),
            port(backend.port()),
            v6[0],
            v6[1],
            v6[2],
            v6[3],
            b6[0],
            b6[1],
            b6[2],
            b6[3],
        ];
        svc.set(0, value, 0).map_err(|e| sys("tenant_svc", &e))?;
        Ok(Self {
            ebpf,
            attached: Vec::new(),
        })
    }

    fn prog(&self, name: &str) -> Result<OwnedFd> {
        let prog: &CgroupSockAddr = self
            .ebpf
            .program(name)
            .ok_or_else(|| Error::Missing(format!("tenant program {name}")))?
            .try_into()
            .map_err(|e| Error::Missing(format!("{name}: {e}")))?;
        let fd = prog
            .fd()
            .map_err(|e| Error::Missing(format!("{name}: {e}")))?;
        fd.as_fd()
            .try_clone_to_owned()
            .map_err(|e| Error::io(format!("{name}: fd"), e))
    }

    /// Attaches every program to `cgroup`, `how`. On error, what this call attached is
    /// detached again and the kernel's error is returned (`EPERM`, `EINVAL`...).
    pub fn attach(&mut self, cgroup: &Path, how: How) -> std::io::Result<()> {
        let before = self.attached.len();
        let result = self.try_attach(cgroup, how);
        if result.is_err() {
            for a in self.attached.drain(before..).rev() {
                detach(a);
            }
        }
        result
    }

    fn try_attach(&mut self, cgroup: &Path, how: How) -> std::io::Result<()> {
        for (name, attach) in PROGRAMS {
            let prog = self.prog(name).map_err(std::io::Error::other)?;
            let cg = fs::File::open(cgroup)?;
            match how {
                How::Link | How::LinkFirst => {
                    let link = bpf::link_create_flags(&prog, &cg, attach, how.flags())?;
                    self.attached.push(Attachment::Link(link));
                }
                _ => {
                    bpf::prog_attach(&prog, &cg, attach, how.flags())?;
                    self.attached.push(Attachment::Prog {
                        cgroup: cg,
                        prog,
                        attach,
                    });
                }
            }
        }
        Ok(())
    }

    /// Attaches its `sk_lookup` program to the network namespace `netns` (a bpf_link, after
    /// whatever is there), and returns the program's id.
    pub fn attach_lookup(&mut self, netns: impl AsFd) -> std::io::Result<u32> {
        let prog: &SkLookup = self
            .ebpf
            .program("tenant_lookup")
            .and_then(|p| p.try_into().ok())
            .ok_or_else(|| std::io::Error::other("tenant_lookup not loaded"))?;
        let fd = prog.fd().map_err(std::io::Error::other)?;
        let link = bpf::link_create(fd.as_fd(), netns, Hook::SkLookup)?;
        let id = bpf::obj_id(fd.as_fd())?;
        self.attached.push(Attachment::Link(link));
        Ok(id)
    }

    /// Detaches everything this tenant attached.
    pub fn detach_all(&mut self) {
        for a in self.attached.drain(..).rev() {
            detach(a);
        }
    }

    /// The kernel ids of its programs.
    pub fn ids(&self) -> Vec<u32> {
        PROGRAMS
            .iter()
            .filter_map(|(name, _)| self.prog(name).ok())
            .filter_map(|fd| bpf::obj_id(&fd).ok())
            .collect()
    }

    /// The id of its `connect4` program.
    pub fn connect4_id(&self) -> u32 {
        self.prog("tenant_sock4_connect")
            .ok()
            .and_then(|fd| bpf::obj_id(&fd).ok())
            .unwrap_or(0)
    }

    /// Connects translated so far.
    pub fn connects(&self) -> u64 {
        self.hits(0)
    }

    fn hits(&self, slot: u32) -> u64 {
        self.ebpf
            .map("tenant_hits")
            .and_then(|m| Array::<_, u64>::try_from(m).ok())
            .and_then(|a| a.get(&slot, 0).ok())
            .unwrap_or(0)
    }
}

fn detach(a: Attachment) {
    match a {
        Attachment::Link(link) => {
            let _ = bpf::link_detach(&link);
        }
        Attachment::Prog {
            cgroup,
            prog,
            attach,
        } => {
            let _ = bpf::prog_detach(&prog, &cgroup, attach);
        }
    }
}

impl Drop for SocketLb {
    fn drop(&mut self) {
        self.detach_all();
    }
}

/// What a loader that detaches "every program of this type" does at `cgroup` (Cilium's, with
/// its socket LB off, at the root): `BPF_PROG_DETACH` of every program id the cgroup lists.
/// A test's own cgroup only: nothing of anyone else's is there. Returns how many went.
pub fn detach_every_program(cgroup: &Path, attach: Hook) -> Result<usize> {
    let cg = fs::File::open(cgroup).map_err(|e| Error::io(format!("{}", cgroup.display()), e))?;
    let q = bpf::prog_query(&cg, attach, false)
        .map_err(|e| Error::io(format!("querying {}", cgroup.display()), e))?;
    let mut n = 0;
    for id in q.ids {
        let prog = bpf::prog_by_id(id).map_err(|e| Error::io(format!("program id {id}"), e))?;
        match bpf::prog_detach(&prog, &cg, attach) {
            Ok(()) => n += 1,
            // A link's program: PROG_DETACH cannot take it off, the link stays.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(Error::io(format!("detaching program id {id}"), e)),
        }
    }
    Ok(n)
}
