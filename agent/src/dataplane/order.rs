//! Where our programs run among the other tenants' programs on the same hooks.
//!
//! Cgroup programs chain: for one attach type, the kernel runs a cgroup's *effective* array,
//! the cgroup's own programs first, then each ancestor's (an ancestor's joining only when it
//! was attached with `BPF_F_ALLOW_MULTI`, as every bpf_link is), except that programs attached
//! with `BPF_F_PREORDER` (6.15) run before all others, top-down. Each program sees what the one
//! before it wrote: a socket load balancer ahead of our `connect4` hands us its backend, and the
//! proxy loses the Service address. So the order is read, never assumed:
//!
//! - [`check_cgroup`]: for every cgroup hook we attach, our program is in the cgroup's effective
//!   array, first (presence only for `sockops`, which rewrites nothing another program reads),
//!   and every program that runs for the cgroup's parent still runs for the cgroup (an
//!   exclusive or `BPF_F_ALLOW_OVERRIDE` program on an ancestor is skipped for a cgroup that
//!   has programs of its own: our links would silently switch that tenant off for the pod);
//! - [`check_netns`]: our `sk_lookup` stub is the first program of the pod's network namespace
//!   (the first program to select a socket wins);
//! - [`exclusive_above`]: after an `EPERM`, the exclusive program that caused it.
//!
//! Each finding names the other program (id, name, type, attach type, the cgroup it is attached
//! to, its flags) and what to change, in a [`Conflict`].

use linkerd_cni_sys::uapi;
use std::{
    collections::{HashMap, HashSet},
    fmt, fs, io,
    os::fd::AsFd,
    path::{Path, PathBuf},
};

use linkerd_cni_common::names::{self, Hook, Program};

use linkerd_cni_sys::bpf;

/// Our program ids per attach type: the programs of the links a pod runs.
#[derive(Clone, Debug, Default)]
pub struct Ours(HashMap<u32, HashSet<u32>>);

impl Ours {
    /// The programs of every link pinned in `dirs` (a pod's link directories).
    pub fn in_dirs<'a>(dirs: impl IntoIterator<Item = &'a Path>) -> Self {
        let mut ours = Self::default();
        for dir in dirs {
            let Ok(entries) = fs::read_dir(dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let Ok(link) = bpf::obj_get(&entry.path()) else {
                    continue;
                };
                if let Ok(info) = bpf::link_info(&link) {
                    ours.add(info.attach_type, info.prog_id);
                }
            }
        }
        ours
    }

    /// Counts program `id` as ours on `attach_type`.
    pub fn add(&mut self, attach_type: u32, id: u32) {
        self.0.entry(attach_type).or_default().insert(id);
    }

    /// Counts `other`'s programs as ours too.
    pub fn extend(&mut self, other: Self) {
        for (attach_type, ids) in other.0 {
            self.0.entry(attach_type).or_default().extend(ids);
        }
    }

    fn contains(&self, hook: Hook, id: u32) -> bool {
        self.0
            .get(&hook.attach_type())
            .is_some_and(|ids| ids.contains(&id))
    }
}

/// Another tenant's program, as the kernel describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tenant {
    pub id: u32,
    /// Its name as bpftool prints it: the BTF function's, in full, else the kernel's short
    /// one (said when cut); what can be said without it when the program cannot be opened
    /// by id (gone, or no `CAP_SYS_ADMIN`).
    pub name: String,
    /// `enum bpf_prog_type`.
    pub prog_type: u32,
    pub hook: Hook,
    /// The cgroup it is attached to (`None`: a network namespace's, or not found).
    pub cgroup: Option<PathBuf>,
    /// The cgroup's attach flags for the hook.
    pub flags: u32,
    /// The program's own attach flags: `BPF_F_PREORDER`, inferred (an ancestor's program
    /// that runs before a descendant's).
    pub prog_flags: u32,
}

impl Tenant {
    fn describe(id: u32, hook: Hook, at: Option<(PathBuf, u32, u32)>) -> Self {
        let info = bpf::prog_by_id(id).and_then(|fd| {
            let info = bpf::prog_info(&fd)?;
            Ok((bpf::prog_full_name(&fd)?, info.prog_type))
        });
        let (name, prog_type) = match info {
            Ok(found) => found,
            Err(e) => (unnamed(&e), 0),
        };
        let (cgroup, flags, prog_flags) = match at {
            Some((c, f, p)) => (Some(c), f, p),
            None => (None, 0, 0),
        };
        Self {
            id,
            name,
            prog_type,
            hook,
            cgroup,
            flags,
            prog_flags,
        }
    }

    fn preorder(&self) -> bool {
        self.prog_flags & uapi::F_PREORDER != 0
    }
}

/// What is said of a program that cannot be opened by id: its id and hook are known (from
/// the query), its name and type are not.
pub fn unnamed(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::EPERM) => "? (name and type unknown: opening a program by id needs \
                              CAP_SYS_ADMIN, which the agent lacks)"
            .into(),
        Some(libc::ENOENT) => "? (gone: unloaded while it was being described)".into(),
        _ => format!("? (name and type unknown: opening it by id: {e})"),
    }
}

impl fmt::Display for Tenant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "program id {} {:?} (type {}, attach type {})",
            self.id,
            self.name,
            prog_type_name(self.prog_type),
            self.hook.attach_type_name()
        )?;
        match &self.cgroup {
            Some(c) => write!(
                f,
                " attached to cgroup {} with {}",
                c.display(),
                flag_words(self.flags, self.prog_flags)
            ),
            None if self.hook == Hook::SkLookup => write!(f, " in the pod's network namespace"),
            None => write!(f, " (where it is attached was not found)"),
        }
    }
}

/// Why our programs do not run first, or would switch another tenant off, for a pod.
#[derive(Debug, thiserror::Error)]
pub enum Conflict {
    /// Another program runs before ours for the pod's sockets.
    #[error("{tenant} runs before ours (program id {ours}) for this pod's sockets{}: it can rewrite or answer what ours reads, so the proxy could lose the original destination; {}", also_ahead(.also), ahead_fix(.tenant, .attached_to))]
    Ahead {
        tenant: Tenant,
        /// Every other program that runs before ours, in run order (each named: fixing the
        /// first alone would leave the pod refused for the next).
        also: Vec<Tenant>,
        ours: u32,
        /// The cgroup our links are attached to.
        attached_to: PathBuf,
    },
    /// A program attached above the pod's cgroup no longer runs for it.
    #[error("{tenant} does not run for this pod's sockets while ours are attached to {}: the kernel skips an ancestor's program attached without BPF_F_ALLOW_MULTI for a cgroup with programs of its own; re-attach it with BPF_F_ALLOW_MULTI or as a bpf_link (Cilium >= 1.14 and Calico do), or detach it", attached_to.display())]
    Shadowed {
        tenant: Tenant,
        attached_to: PathBuf,
    },
    /// An exclusive program above (or on) the cgroup refuses every other program (`EPERM`).
    #[error("{tenant} is exclusive: the kernel lets no other program of its attach type attach at or below it; re-attach it with BPF_F_ALLOW_MULTI or as a bpf_link (Cilium >= 1.14 and Calico do), or detach it ({})", detach_command(.tenant))]
    Exclusive { tenant: Tenant },
    /// Our program is missing from the effective array.
    #[error("our {} program is not among the programs that run for {}", .hook.attach_type_name(), .cgroup.display())]
    Absent { hook: Hook, cgroup: PathBuf },
    /// The kernel could not be asked.
    #[error("reading the {} programs of {}: {source}", .hook.attach_type_name(), .target.display())]
    Query {
        hook: Hook,
        target: PathBuf,
        source: io::Error,
    },
}

fn also_ahead(also: &[Tenant]) -> String {
    also.iter().map(|t| format!(", and so does {t}")).collect()
}

fn detach_command(tenant: &Tenant) -> String {
    let cgroup = tenant.cgroup.as_deref().unwrap_or(Path::new("<cgroup>"));
    format!(
        "`bpftool cgroup detach {} {} id {}`",
        cgroup.display(),
        tenant.hook.bpftool_name(),
        tenant.id
    )
}

fn ahead_fix(tenant: &Tenant, attached_to: &Path) -> String {
    if tenant.hook == Hook::SkLookup {
        return "detach it from the pod's network namespace (`bpftool net`), or attach it \
                after ours"
            .into();
    }
    if tenant.preorder() {
        return "it was attached with BPF_F_PREORDER, which runs it before the programs of \
                every cgroup below; attach it without BPF_F_PREORDER, or keep it out of pod \
                cgroups (Cilium: socketLB.hostNamespaceOnly=true)"
            .into();
    }
    if tenant.cgroup.as_deref() == Some(attached_to) {
        return format!(
            "it was attached to {} before ours; give the pod a cgroup of its own \
             (runtimeConfig.cgroupPath), or set the agent's --shared-cgroup to a cgroup below {}",
            attached_to.display(),
            attached_to.display()
        );
    }
    "detach it, or attach it to an ancestor of the pod's cgroup without BPF_F_PREORDER".into()
}

/// The programs that run for the cgroups above pods, per hook, as [`check_cgroup`] read them:
/// kept for one reconcile pass, so the pods below one parent (`kubepods/besteffort`) cost one
/// query of that parent per hook and pass, not one per pod. A program attached to the parent
/// during the pass is seen by the next pass over its pods.
#[derive(Debug, Default)]
pub struct Parents(HashMap<(PathBuf, u32), Vec<u32>>);

/// Whether our program must be the first of its hook (else: present).
fn must_be_first(hook: Hook) -> bool {
    hook != Hook::SockOps
}

/// Checks the order of every cgroup hook we attach at `cgroup` (a pod's own cgroup, or the
/// shared attachment's): see the module documentation. What runs for the cgroup's parent is
/// taken from `parents` when read before (else read and kept there).
pub fn check_cgroup(cgroup: &Path, ours: &Ours, parents: &mut Parents) -> Result<(), Conflict> {
    let open = |path: &Path, hook| {
        fs::File::open(path).map_err(|source| Conflict::Query {
            hook,
            target: path.into(),
            source,
        })
    };
    let cg = open(cgroup, Hook::Connect4)?;
    let parent_path = cgroup.parent().filter(|p| is_cgroup(p));
    // Opened at the first hook whose parent's programs are not known yet.
    let mut parent_fd: Option<Option<fs::File>> = None;
    for Program { hook, .. } in names::PROGRAMS {
        if !hook.on_cgroup() {
            continue;
        }
        let query = |fd: &fs::File, target: &Path| {
            bpf::prog_query(fd.as_fd(), hook, true).map_err(|source| Conflict::Query {
                hook,
                target: target.into(),
                source,
            })
        };
        let effective = query(&cg, cgroup)?.ids;
        let Some(first_ours) = effective.iter().position(|id| ours.contains(hook, *id)) else {
            return Err(Conflict::Absent {
                hook,
                cgroup: cgroup.into(),
            });
        };
        if must_be_first(hook) && first_ours > 0 {
            let id = effective[0];
            let mut at = locate(id, hook, cgroup);
            // The kernel does not report a program's own flags (the query's per-program
            // flags are the cgroup's): an ancestor's program runs before a descendant's only
            // when it was attached with BPF_F_PREORDER.
            if let Some((dir, _, prog_flags)) = &mut at
                && dir != cgroup
            {
                *prog_flags |= uapi::F_PREORDER;
            }
            let also = effective[1..first_ours]
                .iter()
                .map(|&id| Tenant::describe(id, hook, locate(id, hook, cgroup)))
                .collect();
            return Err(Conflict::Ahead {
                tenant: Tenant::describe(id, hook, at),
                also,
                ours: effective[first_ours],
                attached_to: cgroup.into(),
            });
        }
        if let Some(parent_path) = parent_path {
            let key = (parent_path.to_path_buf(), hook.attach_type());
            let above = match parents.0.get(&key) {
                Some(ids) => ids.clone(),
                None => {
                    let Some(fd) =
                        parent_fd.get_or_insert_with(|| fs::File::open(parent_path).ok())
                    else {
                        continue;
                    };
                    let ids = query(fd, parent_path)?.ids;
                    parents.0.insert(key, ids.clone());
                    ids
                }
            };
            if let Some(id) = above.into_iter().find(|id| !effective.contains(id)) {
                return Err(Conflict::Shadowed {
                    tenant: Tenant::describe(id, hook, locate(id, hook, parent_path)),
                    attached_to: cgroup.into(),
                });
            }
        }
    }
    Ok(())
}

/// Checks that our `sk_lookup` stub is the first program of the network namespace `netns`.
/// With `shared_netns` (another registration of ours is in the same network namespace), a stub
/// of ours ([`names::PROG_SK_LOOKUP_STUB`]) ahead counts as ours: it hands the connection to
/// the same shared program.
pub fn check_netns(
    netns: impl AsFd,
    netns_path: &Path,
    ours: &Ours,
    shared_netns: bool,
) -> Result<(), Conflict> {
    let hook = Hook::SkLookup;
    let ids = bpf::prog_query(netns, hook, false)
        .map_err(|source| Conflict::Query {
            hook,
            target: netns_path.into(),
            source,
        })?
        .ids;
    let is_ours = |id: u32| {
        ours.contains(hook, id)
            || (shared_netns
                && bpf::prog_by_id(id)
                    .and_then(bpf::prog_name)
                    .is_ok_and(|n| n == names::PROG_SK_LOOKUP_STUB))
    };
    match ids.iter().position(|id| is_ours(*id)) {
        None => Err(Conflict::Absent {
            hook,
            cgroup: netns_path.into(),
        }),
        Some(0) => Ok(()),
        Some(i) => Err(Conflict::Ahead {
            tenant: Tenant::describe(ids[0], hook, None),
            also: ids[1..i]
                .iter()
                .map(|&id| Tenant::describe(id, hook, None))
                .collect(),
            ours: ids[i],
            attached_to: netns_path.into(),
        }),
    }
}

/// The program that makes attaching `hook` at `cgroup` fail with `EPERM`: one attached
/// without `BPF_F_ALLOW_MULTI` to `cgroup` itself, or exclusively (flags 0) to an ancestor.
pub fn exclusive_above(cgroup: &Path, hook: Hook) -> Option<Tenant> {
    let mut at = Some(cgroup);
    while let Some(dir) = at.filter(|d| is_cgroup(d)) {
        if let Ok(q) = fs::File::open(dir).and_then(|f| bpf::prog_query(&f, hook, false)) {
            let blocks = match dir == cgroup {
                true => q.flags & uapi::F_ALLOW_MULTI == 0,
                false => q.flags & (uapi::F_ALLOW_MULTI | uapi::F_ALLOW_OVERRIDE) == 0,
            };
            if let Some(&id) = q.ids.first().filter(|_| blocks) {
                let prog_flags = q.prog_flags.first().copied().unwrap_or(0);
                return Some(Tenant::describe(
                    id,
                    hook,
                    Some((dir.into(), q.flags, prog_flags)),
                ));
            }
        }
        at = dir.parent();
    }
    None
}

/// Where program `id` is attached for `hook`, from `from` up: the cgroup, its flags for the
/// hook and the program's own flags.
fn locate(id: u32, hook: Hook, from: &Path) -> Option<(PathBuf, u32, u32)> {
    let mut at = Some(from);
    while let Some(dir) = at.filter(|d| is_cgroup(d)) {
        let found = fs::File::open(dir)
            .and_then(|f| bpf::prog_query(&f, hook, false))
            .ok()
            .and_then(|q| {
                let i = q.ids.iter().position(|x| *x == id)?;
                Some((q.flags, q.prog_flags.get(i).copied().unwrap_or(0)))
            });
        if let Some((flags, prog_flags)) = found {
            return Some((dir.into(), flags, prog_flags));
        }
        at = dir.parent();
    }
    None
}

/// A cgroup2 directory (the root included; the directory it is mounted in is none).
fn is_cgroup(dir: &Path) -> bool {
    dir.join("cgroup.controllers").exists()
}

/// The attach flags in the kernel's words.
pub fn flag_words(flags: u32, prog_flags: u32) -> String {
    let mut words = match flags & (uapi::F_ALLOW_MULTI | uapi::F_ALLOW_OVERRIDE) {
        0 => vec!["flags 0 (exclusive)"],
        f if f & uapi::F_ALLOW_MULTI != 0 => vec!["BPF_F_ALLOW_MULTI (or a bpf_link)"],
        _ => vec!["BPF_F_ALLOW_OVERRIDE"],
    };
    if prog_flags & uapi::F_PREORDER != 0 {
        words.push("BPF_F_PREORDER");
    }
    words.join(" + ")
}

/// A program type as the kernel names it: the name of our hooks' types, else its number.
fn prog_type_name(t: u32) -> String {
    match Hook::prog_type_name(t) {
        Some(name) => name.into(),
        // BPF_PROG_TYPE_UNSPEC: no loaded program has it; what is said of one that could
        // not be opened ([`unnamed`]).
        None if t == 0 => "unknown".into(),
        None => format!("{t}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_are_named_as_the_kernel_names_them() {
        assert_eq!(flag_words(0, 0), "flags 0 (exclusive)");
        assert_eq!(
            flag_words(uapi::F_ALLOW_OVERRIDE, 0),
            "BPF_F_ALLOW_OVERRIDE"
        );
        assert_eq!(
            flag_words(uapi::F_ALLOW_MULTI, uapi::F_PREORDER),
            "BPF_F_ALLOW_MULTI (or a bpf_link) + BPF_F_PREORDER"
        );
    }

    #[test]
    fn a_conflict_names_the_program_its_cgroup_flags_and_the_fix() {
        let tenant = Tenant {
            id: 42,
            name: "cil_sock4_conne".into(),
            prog_type: Hook::Connect4.prog_type(),
            hook: Hook::Connect4,
            cgroup: Some("/sys/fs/cgroup".into()),
            flags: 0,
            prog_flags: 0,
        };
        let text = Conflict::Exclusive {
            tenant: tenant.clone(),
        }
        .to_string();
        for part in [
            "program id 42",
            "\"cil_sock4_conne\"",
            "BPF_PROG_TYPE_CGROUP_SOCK_ADDR",
            "BPF_CGROUP_INET4_CONNECT",
            "cgroup /sys/fs/cgroup",
            "flags 0 (exclusive)",
            "BPF_F_ALLOW_MULTI",
            "bpftool cgroup detach /sys/fs/cgroup connect4 id 42",
        ] {
            assert!(text.contains(part), "{part:?} missing from {text:?}");
        }
        let text = Conflict::Ahead {
            tenant: Tenant {
                flags: uapi::F_ALLOW_MULTI,
                prog_flags: uapi::F_PREORDER,
                ..tenant.clone()
            },
            also: vec![Tenant {
                id: 43,
                name: "calico_connect_v4".into(),
                ..tenant
            }],
            ours: 7,
            attached_to: "/sys/fs/cgroup/kubepods/pod1".into(),
        }
        .to_string();
        assert!(text.contains("runs before ours (program id 7)"), "{text}");
        assert!(
            text.contains(", and so does program id 43 \"calico_connect_v4\""),
            "every program ahead is named: {text}"
        );
        assert!(text.contains("without BPF_F_PREORDER"), "{text}");
    }
}
