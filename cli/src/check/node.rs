//! Checks of the machine this runs on, as a node of the eBPF mode: the kernel has every feature
//! the agent's programs need (asked of the running kernel by the probes the agent runs at
//! start, `linkerd_cni_common::probe`; its version number is only reported), bpffs is mounted
//! (or can be), and cgroup v2 is mounted somewhere (found in mountinfo; its place differs
//! between hosts).

use linkerd_cni_common::probe::Findings;

use super::result::CheckResult;

/// The category these checks are printed under.
pub const CATEGORY: &str = "linkerd-cni-node";

/// The name of the kernel check: one line, failing with every missing feature named (the
/// table is `linkerd_cni_common::kernel`, the probes `linkerd_cni_common::probe`: the agent's
/// start-up check runs the same).
pub const KERNEL_CHECK: &str = "kernel has every feature the eBPF mode needs";

/// What the node checks look at (tests pass their own).
#[derive(Clone, Debug, Default)]
pub struct NodeFacts {
    /// The running kernel's answers to the feature probes.
    pub kernel: Option<Findings>,
    /// `/proc/self/mountinfo`.
    pub mountinfo: Option<String>,
    /// `/proc/filesystems`.
    pub filesystems: Option<String>,
}

impl NodeFacts {
    /// Probes this machine's kernel and reads its mounts; a file that cannot be read stays
    /// `None`.
    pub fn read_local() -> Self {
        let read = |p: &str| std::fs::read_to_string(p).ok();
        Self {
            kernel: Some(Findings::probe()),
            mountinfo: read("/proc/self/mountinfo"),
            filesystems: read("/proc/filesystems"),
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

/// Runs the node checks on `facts`.
pub fn run(facts: &NodeFacts) -> Vec<CheckResult> {
    let mut results = Vec::new();
    results.push(match facts.kernel.as_ref().map(Findings::verdict) {
        Some(Ok(present)) => CheckResult::ok(CATEGORY, KERNEL_CHECK, present),
        Some(Err(why)) => CheckResult::fail(CATEGORY, KERNEL_CHECK, why),
        None => CheckResult::fail(CATEGORY, KERNEL_CHECK, "the kernel was not probed"),
    });

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
    results
}

#[cfg(test)]
mod tests {
    use linkerd_cni_common::{kernel, probe::Answer};

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

    /// The kernel's answers decide, not its number: a 5.14 with every feature passes, a 6.1
    /// that refused two fails naming exactly those, one line.
    #[test]
    fn kernel_answers() {
        let cases: &[(&str, &[usize], Option<&str>)] = &[
            ("5.14.0-503.el9.x86_64", &[], None),
            ("2.6.78", &[], None),
            (
                "6.1.0",
                &[5, 7],
                Some(
                    "kernel 6.1.0 lacks features linkerd-cni's eBPF mode needs; missing: \
                     SO_NETNS_COOKIE (5.14+), ingress_ifindex in the sk_lookup context (5.17+)",
                ),
            ),
        ];
        for (release, absent, want) in cases {
            let facts = NodeFacts {
                kernel: Some(findings(release, absent)),
                mountinfo: Some(MOUNTINFO.into()),
                filesystems: None,
            };
            let results = run(&facts);
            let failed: Vec<_> = results.iter().filter(|r| !r.passed()).collect();
            match want {
                None => {
                    assert!(failed.is_empty(), "kernel {release}: {failed:?}");
                    assert_eq!(
                        results[0].detail,
                        format!("{release}: every feature present")
                    );
                }
                Some(line) => {
                    assert_eq!(failed.len(), 1, "kernel {release}: {failed:?}");
                    assert_eq!(failed[0].name, KERNEL_CHECK);
                    assert_eq!(failed[0].detail, *line);
                }
            }
        }
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
}
