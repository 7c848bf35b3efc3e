//! Checks of the machine this runs on, as a node of the eBPF mode: the kernel has every feature
//! the agent's programs need (asked of the running kernel by the probes the agent runs at
//! start, `linkerd_cni_sys::probe`; its version number is only reported), bpffs is mounted
//! (or can be), and cgroup v2 is mounted somewhere (found in mountinfo; its place differs
//! between hosts); and the other tenants' cgroup programs on the pods' path ([`Tenants`]:
//! the cgroup2 root and kubelet's kubepods cgroup, each hook our programs use), each with what
//! it means for the mesh ([`classify`]).

use std::path::{Path, PathBuf};

use linkerd_cni_common::{
    kernel::Mode,
    names::{self, Hook},
    paths,
};
use linkerd_cni_sys::{
    bpf,
    probe::{Choice, Findings},
    uapi::{F_ALLOW_MULTI, F_ALLOW_OVERRIDE, F_PREORDER},
};

use super::result::{CheckResult, Status};

/// The category these checks are printed under.
pub const CATEGORY: &str = "linkerd-cni-node";

/// The name of the kernel check: one line, failing with every missing feature named (the
/// table is `linkerd_cni_common::kernel`, the probes `linkerd_cni_sys::probe`: the agent's
/// start-up check runs the same).
pub const KERNEL_CHECK: &str = "kernel has every feature the eBPF mode needs";

/// The name of the mode check: which mode this node runs (the eBPF data plane or the per-node
/// fallback) and why.
pub const MODE_CHECK: &str = "the node's redirection mode";

/// What the node checks look at (tests pass their own).
#[derive(Clone, Debug, Default)]
pub struct NodeFacts {
    /// The running kernel's answers to the feature probes.
    pub kernel: Option<Findings>,
    /// The mode the agent recorded at its last start (`None`: no agent ran here since the
    /// node booted; `auto` is judged from the probes).
    pub mode: Option<Choice>,
    /// `/proc/self/mountinfo`.
    pub mountinfo: Option<String>,
    /// `/proc/filesystems`.
    pub filesystems: Option<String>,
    /// The other programs on the pods' path (`None`: no cgroup2 mount to look in).
    pub tenants: Option<Tenants>,
}

/// Another tenant's program attached to a cgroup on the pods' path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attached {
    /// The cgroup it is attached to.
    pub cgroup: PathBuf,
    pub hook: Hook,
    /// The cgroup's attach flags for the hook.
    pub flags: u32,
    /// The program's own flags, where the kernel reports them (`BPF_F_PREORDER`).
    pub prog_flags: u32,
    pub id: u32,
    /// The name it was loaded with.
    pub name: String,
    /// Whether it comes before a program of ours in the cgroup's own list (it runs first).
    pub before_ours: bool,
}

/// The other programs on the pods' path.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tenants {
    /// The cgroups looked at: the cgroup2 root, then kubepods when there is one.
    pub roots: Vec<PathBuf>,
    /// Where the agent's shared attachment goes by default: kubepods, else the root.
    pub shared: PathBuf,
    /// Every program found that is not ours.
    pub found: Vec<Attached>,
    /// Queries the kernel refused (`<cgroup> <hook>: <error>`).
    pub errors: Vec<String>,
}

impl Tenants {
    /// Reads the programs of every cgroup hook we use on `root` (the cgroup2 mount, or a test's
    /// stand-in) and on its kubepods cgroup (found as the agent finds it).
    pub fn read(root: &Path) -> Self {
        let shared = paths::kubepods(root);
        let mut roots = vec![root.to_path_buf()];
        roots.extend(shared.clone());
        let mut out = Self {
            shared: shared.unwrap_or_else(|| root.to_path_buf()),
            ..Self::default()
        };
        for cgroup in &roots {
            let file = match std::fs::File::open(cgroup) {
                Ok(f) => f,
                Err(e) => {
                    out.errors.push(format!("{}: {e}", cgroup.display()));
                    continue;
                }
            };
            for program in names::PROGRAMS.iter().filter(|p| p.hook.on_cgroup()) {
                let q = match bpf::prog_query(&file, program.hook, false) {
                    Ok(q) => q,
                    Err(e) => {
                        out.errors.push(format!(
                            "{} {}: {e}",
                            cgroup.display(),
                            program.hook.bpftool_name()
                        ));
                        continue;
                    }
                };
                let named: Vec<(u32, String)> = q
                    .ids
                    .iter()
                    .map(|&id| {
                        // In full (the BTF function's name), as bpftool prints it.
                        let name = bpf::prog_by_id(id)
                            .and_then(bpf::prog_full_name)
                            .unwrap_or_else(|e| match e.raw_os_error() {
                                Some(libc::EPERM) => "? (opening a program by id needs \
                                                      CAP_SYS_ADMIN)"
                                    .into(),
                                _ => format!("? ({e})"),
                            });
                        (id, name)
                    })
                    .collect();
                let is_ours = |name: &str| names::PROGRAMS.iter().any(|p| p.name == name);
                let first_ours = named.iter().position(|(_, n)| is_ours(n));
                for (i, (id, name)) in named.iter().enumerate() {
                    if is_ours(name) {
                        continue;
                    }
                    out.found.push(Attached {
                        cgroup: cgroup.clone(),
                        hook: program.hook,
                        flags: q.flags,
                        prog_flags: q.prog_flags.get(i).copied().unwrap_or(0),
                        id: *id,
                        name: name.clone(),
                        before_ours: first_ours.is_some_and(|o| i < o),
                    });
                }
            }
            drop(file);
        }
        out.roots = roots;
        out
    }
}

/// What one tenant's program means for the mesh, as one check line: an exclusive program
/// fails (no pod below it can be meshed), one that runs ahead of ours or is switched off for
/// meshed pods warns, one that runs after ours passes.
pub fn classify(t: &Attached, shared: &Path) -> CheckResult {
    let name = format!(
        "{} program id {} \"{}\" on {}",
        t.hook.bpftool_name(),
        t.id,
        t.name,
        t.cgroup.display()
    );
    let see = format!("`bpftool cgroup show {}`", t.cgroup.display());
    let (status, detail) = if t.flags & (F_ALLOW_MULTI | F_ALLOW_OVERRIDE) == 0 {
        (
            Status::Fail,
            format!(
                "attached with flags 0 (exclusive): pods below it cannot be meshed (their CNI \
                 ADD fails naming it); re-attach it with BPF_F_ALLOW_MULTI or as a bpf_link, \
                 or detach it; see {see}"
            ),
        )
    } else if t.flags & F_ALLOW_MULTI == 0 {
        (
            Status::Fail,
            format!(
                "attached with BPF_F_ALLOW_OVERRIDE: the kernel skips it for a cgroup with \
                 programs of its own, so meshed pods would lose it and the agent refuses them; \
                 re-attach it with BPF_F_ALLOW_MULTI or as a bpf_link; see {see}"
            ),
        )
    } else if t.prog_flags & F_PREORDER != 0 {
        (
            Status::Warn,
            format!(
                "BPF_F_ALLOW_MULTI + BPF_F_PREORDER: it runs before our programs for pods \
                 below it, so a proxy could lose the original destination (the agent refuses \
                 such pods); attach it without BPF_F_PREORDER; see {see}"
            ),
        )
    } else if t.cgroup == shared && (t.before_ours || t.hook != Hook::SockOps) {
        let order = if t.before_ours {
            "it comes before our shared attachment's program"
        } else {
            "our shared attachment goes first only where the kernel orders cgroup links \
             (BPF_F_BEFORE)"
        };
        (
            Status::Warn,
            format!(
                "BPF_F_ALLOW_MULTI (or a bpf_link) on the shared attachment's cgroup: {order}; \
                 a meshed pod without a cgroup of its own could lose the original destination \
                 (the agent checks and refuses or reports it); pods with their own cgroup are \
                 fine; see {see}"
            ),
        )
    } else {
        (
            Status::Ok,
            format!(
                "BPF_F_ALLOW_MULTI (or a bpf_link) below ours in run order: fine, it runs after \
                 our programs for meshed pods; see {see}"
            ),
        )
    };
    CheckResult::new(CATEGORY, name, status, detail)
}

/// The check lines of the other tenants: one per program, the cgroups looked at, and what
/// could not be looked at (the pods' network namespaces).
pub fn tenant_results(t: &Tenants) -> Vec<CheckResult> {
    let roots: Vec<String> = t.roots.iter().map(|r| r.display().to_string()).collect();
    let mut results = vec![if t.errors.is_empty() {
        CheckResult::ok(
            CATEGORY,
            "other cgroup programs on the pods' path",
            format!(
                "{} found on {} (connect4/6, sock_ops, getsockopt, getpeername4/6, getsockname4/6)",
                t.found.len(),
                roots.join(" and ")
            ),
        )
    } else {
        CheckResult::fail(
            CATEGORY,
            "other cgroup programs on the pods' path",
            format!("cannot read them (run as root): {}", t.errors.join("; ")),
        )
    }];
    results.extend(t.found.iter().map(|a| classify(a, &t.shared)));
    results.push(CheckResult::new(
        CATEGORY,
        "sk_lookup programs in pods' network namespaces",
        Status::Skipped,
        "not listed here (one per pod); the agent checks that each meshed pod's sk_lookup \
         program runs first and refuses or reports the pod (`linkerd_cni_agent_order_conflicts`); \
         to see them: `bpftool net` inside the pod's network namespace",
    ));
    results
}

impl NodeFacts {
    /// Probes this machine's kernel and reads its mounts; a file that cannot be read stays
    /// `None`.
    /// The other tenants are read on `cgroup_root` when given (a test's stand-in for the
    /// cgroup2 root), else on the first cgroup2 mount.
    pub fn read_local(cgroup_root: Option<&Path>) -> Self {
        let read = |p: &str| std::fs::read_to_string(p).ok();
        let mountinfo = read("/proc/self/mountinfo");
        let root = cgroup_root.map(Path::to_path_buf).or_else(|| {
            let m = mountinfo.as_deref()?;
            mounts_of_type(m, "cgroup2").first().map(PathBuf::from)
        });
        let mode = std::fs::read_to_string(Path::new(paths::STATE_DIR).join(paths::MODE_FILE))
            .ok()
            .and_then(|text| Choice::parse(&text));
        Self {
            kernel: Some(Findings::probe()),
            mode,
            mountinfo,
            filesystems: read("/proc/filesystems"),
            tenants: root.map(|r| Tenants::read(&r)),
        }
    }
}

/// Undoes mountinfo's octal escapes (`\040` for a space, ...).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .and_then(|d| std::str::from_utf8(d).ok())
            .and_then(|d| u8::from_str_radix(d, 8).ok());
        match (bytes[i], octal) {
            (b'\\', Some(b)) => {
                out.push(b);
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Mount points of filesystems of type `fstype`, in mountinfo order.
pub fn mounts_of_type(mountinfo: &str, fstype: &str) -> Vec<String> {
    mountinfo
        .lines()
        .filter_map(|line| {
            // "<id> <parent> <maj:min> <root> <mount point> <options> [optional...] - <fstype> <source> <super options>"
            let (left, right) = line.split_once(" - ")?;
            let mount_point = left.split(' ').nth(4)?;
            (right.split(' ').next()? == fstype).then(|| unescape(mount_point))
        })
        .collect()
}

/// Whether `/proc/filesystems` lists `fstype`.
pub fn filesystem_supported(filesystems: &str, fstype: &str) -> bool {
    filesystems
        .lines()
        .any(|l| l.split_whitespace().last() == Some(fstype))
}

/// The mode this node runs: the one the agent recorded, else the one `--mode=auto` (the
/// chart's default) chooses from the probes; or why none can be said.
fn node_mode(facts: &NodeFacts) -> Result<(Choice, &'static str), String> {
    match (&facts.mode, &facts.kernel) {
        (Some(recorded), _) => Ok((recorded.clone(), "as the agent chose at its start")),
        (None, Some(findings)) => findings
            .choose(None)
            .map(|c| (c, "no agent has started here: what --mode=auto chooses")),
        (None, None) => Err("the kernel was not probed".into()),
    }
}

/// Runs the node checks on `facts`. On a node of the per-node fallback, the eBPF checks that
/// cannot apply there say so (skipped) instead of failing: the kernel's missing features are a
/// warning, bpffs, cgroup v2 and other tenants' cgroup programs do not matter.
pub fn run(facts: &NodeFacts) -> Vec<CheckResult> {
    let mut results = Vec::new();
    let mode = node_mode(facts);
    let fallback = matches!(&mode, Ok((c, _)) if c.mode == Mode::Iptables);
    let verdict = facts
        .kernel
        .as_ref()
        .map(|f| (f.verdict(), f.sk_lookup_variant()));
    results.push(match verdict {
        // Which sk_lookup program the agent runs here (it asks the same probes).
        Some((Ok(present), sk_lookup)) => CheckResult::ok(
            CATEGORY,
            KERNEL_CHECK,
            format!("{present}; sk_lookup program: {sk_lookup}"),
        ),
        Some((Err(why), _)) if fallback => CheckResult::new(
            CATEGORY,
            KERNEL_CHECK,
            Status::Warn,
            format!("{why}; the eBPF mode does not apply: this node runs the per-node fallback"),
        ),
        Some((Err(why), _)) => CheckResult::fail(CATEGORY, KERNEL_CHECK, why),
        None => CheckResult::fail(CATEGORY, KERNEL_CHECK, "the kernel was not probed"),
    });
    results.push(match mode {
        Ok((choice, source)) => {
            CheckResult::ok(CATEGORY, MODE_CHECK, format!("{choice} ({source})"))
        }
        Err(why) => CheckResult::fail(CATEGORY, MODE_CHECK, why),
    });
    let mut rest = ebpf_node_checks(facts);
    if fallback {
        for r in rest.iter_mut().filter(|r| r.status == Status::Fail) {
            r.status = Status::Skipped;
            r.detail = format!(
                "does not apply: the per-node fallback loads no eBPF program ({})",
                r.detail
            );
        }
    }
    results.extend(rest);
    results
}

/// The checks of what the eBPF data plane needs besides the kernel's features: bpffs, cgroup
/// v2, other tenants' programs on the pods' path.
fn ebpf_node_checks(facts: &NodeFacts) -> Vec<CheckResult> {
    let mut results = Vec::new();

    let Some(mountinfo) = facts.mountinfo.as_deref() else {
        results.push(CheckResult::fail(
            CATEGORY,
            "bpffs is mounted or mountable",
            "cannot read /proc/self/mountinfo",
        ));
        results.push(CheckResult::fail(
            CATEGORY,
            "cgroup v2 is mounted",
            "cannot read /proc/self/mountinfo",
        ));
        return results;
    };
    let bpffs = mounts_of_type(mountinfo, "bpf");
    let bpf_supported = facts
        .filesystems
        .as_deref()
        .is_some_and(|f| filesystem_supported(f, "bpf"));
    results.push(match (bpffs.first(), bpf_supported) {
        (Some(at), _) => CheckResult::ok(CATEGORY, "bpffs is mounted or mountable", format!("mounted at {at}")),
        (None, true) => CheckResult::ok(CATEGORY, "bpffs is mounted or mountable",
            "not mounted; the kernel supports it and the DaemonSet's init container mounts it",
        ),
        (None, false) => CheckResult::fail(CATEGORY, "bpffs is mounted or mountable",
            "bpffs is not mounted and /proc/filesystems does not list \"bpf\" (kernel without CONFIG_BPF_SYSCALL?)",
        ),
    });
    let cgroup2 = mounts_of_type(mountinfo, "cgroup2");
    results.push(match cgroup2.first() {
        Some(at) => CheckResult::ok(CATEGORY, "cgroup v2 is mounted", format!("at {at}")),
        None => CheckResult::fail(CATEGORY, "cgroup v2 is mounted",
            "no cgroup2 filesystem in /proc/self/mountinfo; the eBPF mode attaches its programs to cgroup v2",
        ),
    });
    if let Some(tenants) = &facts.tenants {
        results.extend(tenant_results(tenants));
    }
    results
}

#[cfg(test)]
mod tests {
    use linkerd_cni_common::kernel;
    use linkerd_cni_sys::probe::Answer;

    use super::*;

    const MOUNTINFO: &str = "\
22 1 0:21 / /sys rw,nosuid shared:7 - sysfs sysfs rw
25 22 0:23 / /sys/fs/cgroup ro,nosuid shared:9 - tmpfs tmpfs ro,mode=755
26 25 0:24 / /sys/fs/cgroup/unified rw,nosuid shared:10 - cgroup2 cgroup2 rw,nsdelegate
40 22 0:35 / /sys/fs/bpf rw,nosuid - bpf bpf rw,mode=700
41 1 0:36 / /mnt/with\\040space rw - cgroup2 none rw
";

    #[test]
    fn mountinfo_parsing() {
        assert_eq!(
            mounts_of_type(MOUNTINFO, "cgroup2"),
            ["/sys/fs/cgroup/unified", "/mnt/with space"]
        );
        assert_eq!(mounts_of_type(MOUNTINFO, "bpf"), ["/sys/fs/bpf"]);
        assert!(mounts_of_type(MOUNTINFO, "ext4").is_empty());
        assert!(filesystem_supported("nodev\tsysfs\nnodev\tbpf\n", "bpf"));
        assert!(!filesystem_supported("nodev\tsysfs\n", "bpf"));
    }

    fn findings(release: &str, absent: &[usize]) -> Findings {
        Findings {
            release: release.into(),
            answers: kernel::FEATURES
                .iter()
                .enumerate()
                .map(|(i, f)| {
                    let answer = if absent.contains(&i) {
                        Answer::Absent("Invalid argument (os error 22)".into())
                    } else {
                        Answer::Present
                    };
                    (f, answer)
                })
                .collect(),
        }
    }

    /// The kernel's answers decide, not its number: a 5.14 with every feature passes; a 6.1
    /// that refused two names exactly those, one line: a warning where no agent recorded a
    /// mode (`auto` runs the fallback there, and the mode line says so).
    #[test]
    fn kernel_answers() {
        let cases: &[(&str, &[usize], Option<&str>)] = &[
            ("5.14.0-503.el9.x86_64", &[], None),
            ("2.6.78", &[], None),
            ("5.15.0-1049-azure", &[7], None),
            (
                "6.1.0",
                &[5, 7],
                Some(
                    "kernel 6.1.0 lacks features linkerd-cni's eBPF mode needs; missing: \
                     SO_NETNS_COOKIE (5.14+)",
                ),
            ),
        ];
        for (release, absent, want) in cases {
            let facts = NodeFacts {
                kernel: Some(findings(release, absent)),
                mountinfo: Some(MOUNTINFO.into()),
                filesystems: None,
                tenants: None,
                mode: None,
            };
            let results = run(&facts);
            let failed: Vec<_> = results.iter().filter(|r| !r.passed()).collect();
            match want {
                None => {
                    assert!(failed.is_empty(), "kernel {release}: {failed:?}");
                    let want = match absent.is_empty() {
                        true => format!(
                            "{release}: every feature present; sk_lookup program: l5d_sk_lookup \
                             (the pod's own traffic: from loopback, its destination or a pod \
                             address, or arriving on lo)"
                        ),
                        // Ubuntu 22.04's 5.15: served, by the address variant.
                        false => format!(
                            "{release}: every required feature present (without ingress_ifindex \
                             in the sk_lookup context, l5d_sk_lookaddr: the pod's own traffic is \
                             known by its source address (loopback, the destination itself, or \
                             one of the pod's addresses)); sk_lookup program: l5d_sk_lookaddr \
                             (the pod's own traffic: from loopback, its destination or a pod \
                             address)"
                        ),
                    };
                    assert_eq!(results[0].detail, want);
                }
                Some(line) => {
                    assert!(failed.is_empty(), "kernel {release}: {failed:?}");
                    assert_eq!(results[0].name, KERNEL_CHECK);
                    assert_eq!(results[0].status, Status::Warn);
                    assert_eq!(
                        results[0].detail,
                        format!(
                            "{line}; the eBPF mode does not apply: this node runs the per-node \
                             fallback"
                        )
                    );
                    assert_eq!(results[1].name, MODE_CHECK);
                    assert!(
                        results[1].detail.starts_with(&format!(
                            "iptables (chosen by the kernel probes): {line}"
                        )),
                        "{}",
                        results[1].detail
                    );
                }
            }
        }
    }

    /// The mode line says what the agent recorded (forced or chosen) and why; on a node of the
    /// fallback, what only eBPF needs (bpffs, cgroup v2) is skipped, not failed; forcing
    /// eBPF on a kernel below the floor is failed.
    #[test]
    fn the_mode_line_and_what_the_fallback_does_not_need() {
        let no_mounts = "22 1 0:21 / /sys rw - sysfs sysfs rw\n";
        let forced = Choice {
            mode: Mode::Iptables,
            forced: true,
            reason: "--mode=iptables".into(),
        };
        let facts = NodeFacts {
            kernel: Some(findings("6.18.0", &[])),
            mountinfo: Some(no_mounts.into()),
            filesystems: Some("nodev\tsysfs\n".into()),
            tenants: None,
            mode: Some(forced),
        };
        let results = run(&facts);
        assert!(results.iter().all(CheckResult::passed), "{results:?}");
        let mode = results.iter().find(|r| r.name == MODE_CHECK).expect("mode");
        assert_eq!(
            mode.detail,
            "iptables (forced by --mode): --mode=iptables (as the agent chose at its start)"
        );
        let skipped: Vec<&str> = results
            .iter()
            .filter(|r| r.status == Status::Skipped)
            .map(|r| r.name.as_str())
            .collect();
        assert_eq!(
            skipped,
            ["bpffs is mounted or mountable", "cgroup v2 is mounted"]
        );

        // The same node in eBPF mode fails them.
        let facts = NodeFacts {
            mode: None,
            ..facts
        };
        let results = run(&facts);
        let failed = results.iter().filter(|r| !r.passed()).count();
        assert_eq!(failed, 2, "{results:?}");
    }

    #[test]
    fn mounts_checks() {
        let no_mounts = "22 1 0:21 / /sys rw - sysfs sysfs rw\n";
        let cases: &[(&str, Option<&str>, bool, bool)] = &[
            (MOUNTINFO, None, true, true),
            (no_mounts, Some("nodev\tbpf\n"), true, false),
            (no_mounts, Some("nodev\tsysfs\n"), false, false),
        ];
        for (mountinfo, filesystems, bpf_ok, cgroup_ok) in cases {
            let facts = NodeFacts {
                kernel: Some(findings("6.18.0", &[])),
                mountinfo: Some(mountinfo.to_string()),
                filesystems: filesystems.map(str::to_string),
                tenants: None,
                mode: None,
            };
            let results = run(&facts);
            let by_name = |n: &str| {
                results
                    .iter()
                    .find(|r| r.name == n)
                    .unwrap_or_else(|| panic!("no check {n}"))
                    .passed()
            };
            assert_eq!(
                by_name("bpffs is mounted or mountable"),
                *bpf_ok,
                "{mountinfo}"
            );
            assert_eq!(by_name("cgroup v2 is mounted"), *cgroup_ok, "{mountinfo}");
        }
    }

    fn tenant(cgroup: &str, hook: Hook, flags: u32, prog_flags: u32, before: bool) -> Attached {
        Attached {
            cgroup: cgroup.into(),
            hook,
            flags,
            prog_flags,
            id: 42,
            name: "cil_sock4_conne".into(),
            before_ours: before,
        }
    }

    /// Each way a tenant can be attached, as the line it gives: exclusive and override fail
    /// (pods cannot be meshed), PREORDER and ahead of ours on the shared attachment's cgroup
    /// warn, multi or a link above the shared attachment passes; every line names the
    /// program, its cgroup and flags, and the bpftool command to see more.
    #[test]
    fn tenants_are_classified_by_their_flags_and_place() {
        let (root, kubepods) = ("/sys/fs/cgroup", "/sys/fs/cgroup/kubepods.slice");
        let shared = Path::new(kubepods);
        let multi = F_ALLOW_MULTI;
        let cases: &[(Attached, Status, &str)] = &[
            (
                tenant(root, Hook::Connect4, 0, 0, false),
                Status::Fail,
                "flags 0 (exclusive): pods below it cannot be meshed",
            ),
            (
                tenant(
                    root,
                    Hook::SockOps,
                    F_ALLOW_OVERRIDE,
                    F_ALLOW_OVERRIDE,
                    false,
                ),
                Status::Fail,
                "BPF_F_ALLOW_OVERRIDE: the kernel skips it",
            ),
            (
                tenant(root, Hook::Connect4, multi, multi | F_PREORDER, false),
                Status::Warn,
                "BPF_F_PREORDER: it runs before our programs",
            ),
            (
                tenant(kubepods, Hook::Connect6, multi, multi, true),
                Status::Warn,
                "it comes before our shared attachment's program",
            ),
            (
                tenant(kubepods, Hook::Getpeername4, multi, multi, false),
                Status::Warn,
                "goes first only where the kernel orders cgroup links",
            ),
            (
                tenant(kubepods, Hook::SockOps, multi, multi, false),
                Status::Ok,
                "runs after our programs",
            ),
            (
                tenant(root, Hook::Connect4, multi, multi, false),
                Status::Ok,
                "runs after our programs",
            ),
            (
                tenant(root, Hook::Getsockopt, multi, 0, false),
                Status::Ok,
                "runs after our programs",
            ),
        ];
        for (t, status, says) in cases {
            let r = classify(t, shared);
            assert_eq!(r.status, *status, "{t:?}: {r:?}");
            assert!(r.detail.contains(says), "{t:?}: {r:?}");
            assert!(
                r.name.contains(&format!(
                    "program id 42 \"cil_sock4_conne\" on {}",
                    t.cgroup.display()
                )),
                "{r:?}"
            );
            assert!(
                r.detail
                    .contains(&format!("`bpftool cgroup show {}`", t.cgroup.display())),
                "{r:?}"
            );
        }
    }

    #[test]
    fn tenant_lines_say_what_was_looked_at() {
        let tenants = Tenants {
            roots: vec!["/sys/fs/cgroup".into(), "/sys/fs/cgroup/kubepods".into()],
            shared: "/sys/fs/cgroup/kubepods".into(),
            found: vec![tenant("/sys/fs/cgroup", Hook::Connect4, 0, 0, false)],
            errors: vec![],
        };
        let results = tenant_results(&tenants);
        assert_eq!(results.len(), 3);
        assert_eq!(results[0].status, Status::Ok);
        assert!(
            results[0]
                .detail
                .starts_with("1 found on /sys/fs/cgroup and /sys/fs/cgroup/kubepods"),
            "{results:?}"
        );
        assert_eq!(results[1].status, Status::Fail);
        assert_eq!(results[2].status, Status::Skipped);
        assert!(results[2].detail.contains("bpftool net"), "{results:?}");
        let denied = Tenants {
            errors: vec!["/sys/fs/cgroup connect4: Operation not permitted (os error 1)".into()],
            found: vec![],
            ..tenants
        };
        let results = tenant_results(&denied);
        assert_eq!(results[0].status, Status::Fail);
        assert!(results[0].detail.contains("run as root"), "{results:?}");
    }
}
