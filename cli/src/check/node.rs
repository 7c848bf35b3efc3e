//! Checks of the machine this runs on, as a node of the eBPF mode: the kernel is recent enough
//! for every program the agent loads, bpffs is mounted (or can be), and cgroup v2 is mounted
//! somewhere (found in mountinfo; its place differs between hosts).

use std::fmt;

use linkerd_cni_common::kernel;

use super::result::CheckResult;

/// The category these checks are printed under.
pub const CATEGORY: &str = "linkerd-cni-node";

/// A kernel version, `major.minor.patch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct KernelVersion(pub u32, pub u32, pub u32);

impl KernelVersion {
    /// Parses a release such as `6.18.0-1-amd64` or `5.15.0+`: the leading numbers count.
    pub fn parse(release: &str) -> Option<Self> {
        let mut nums = release.trim().split('.').map(|part| {
            let digits: String = part.chars().take_while(char::is_ascii_digit).collect();
            digits.parse::<u32>().ok()
        });
        let major = nums.next()??;
        let minor = nums.next()??;
        let patch = nums.next().flatten().unwrap_or(0);
        Some(Self(major, minor, patch))
    }
}

impl fmt::Display for KernelVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.0, self.1, self.2)
    }
}

/// The name of the kernel check: one line, failing with every missing feature named (the
/// table is `linkerd_cni_common::kernel`, the one the agent checks at start-up).
pub fn kernel_check_name() -> String {
    let (major, minor) = kernel::FLOOR;
    format!("kernel has every feature the eBPF mode needs (>= {major}.{minor})")
}

/// What the node checks look at, read from `/proc` (tests pass their own).
#[derive(Clone, Debug, Default)]
pub struct NodeFacts {
    /// `/proc/sys/kernel/osrelease`.
    pub kernel_release: Option<String>,
    /// `/proc/self/mountinfo`.
    pub mountinfo: Option<String>,
    /// `/proc/filesystems`.
    pub filesystems: Option<String>,
}

impl NodeFacts {
    /// Reads the facts of this machine; a file that cannot be read stays `None`.
    pub fn read_local() -> Self {
        let read = |p: &str| std::fs::read_to_string(p).ok();
        Self {
            kernel_release: read("/proc/sys/kernel/osrelease"),
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
    let version = facts
        .kernel_release
        .as_deref()
        .map(|r| (r.trim(), KernelVersion::parse(r)));
    let name = kernel_check_name();
    results.push(match version {
        Some((release, Some(v))) => match kernel::parse_release(release) {
            Some(major_minor) if kernel::missing(major_minor).next().is_some() => {
                CheckResult::fail(
                    CATEGORY,
                    name,
                    format!(
                        "kernel {v} is too old; missing: {}",
                        kernel::MissingList(major_minor)
                    ),
                )
            }
            _ => CheckResult::ok(CATEGORY, name, format!("kernel {v}")),
        },
        Some((release, None)) => CheckResult::fail(
            CATEGORY,
            name,
            format!("cannot parse kernel release {release:?}"),
        ),
        None => CheckResult::fail(CATEGORY, name, "cannot read /proc/sys/kernel/osrelease"),
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
    use super::*;

    const MOUNTINFO: &str = "\
22 1 0:21 / /sys rw,nosuid shared:7 - sysfs sysfs rw
25 22 0:23 / /sys/fs/cgroup ro,nosuid shared:9 - tmpfs tmpfs ro,mode=755
26 25 0:24 / /sys/fs/cgroup/unified rw,nosuid shared:10 - cgroup2 cgroup2 rw,nsdelegate
40 22 0:35 / /sys/fs/bpf rw,nosuid - bpf bpf rw,mode=700
41 1 0:36 / /mnt/with\\040space rw - cgroup2 none rw
";

    #[test]
    fn kernel_versions() {
        for (release, want) in [
            ("6.18.0-1-amd64", Some(KernelVersion(6, 18, 0))),
            ("5.9\n", Some(KernelVersion(5, 9, 0))),
            ("4.17.3+", Some(KernelVersion(4, 17, 3))),
            ("5.15.0-1049-aws", Some(KernelVersion(5, 15, 0))),
            ("garbage", None),
        ] {
            assert_eq!(KernelVersion::parse(release), want, "{release:?}");
        }
    }

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

    /// Each kernel below the floor fails the one kernel check, naming exactly the features
    /// that need more; the floor and above pass it.
    #[test]
    fn kernel_floors() {
        let cases: &[(&str, Option<&str>)] = &[
            ("6.1.0", None),
            ("5.17.0", None),
            (
                "5.16.20",
                Some("missing: ingress_ifindex in the sk_lookup context (5.17+)"),
            ),
            (
                "5.15.0-1049-aws",
                Some("missing: ingress_ifindex in the sk_lookup context (5.17+)"),
            ),
            (
                "5.10.0-46-amd64",
                Some(
                    "missing: SO_NETNS_COOKIE (5.14+), bpf_get_netns_cookie in sock_ops and \
                     cgroup sockopt programs (5.15+), ingress_ifindex in the sk_lookup context \
                     (5.17+)",
                ),
            ),
        ];
        for (release, want) in cases {
            let facts = NodeFacts {
                kernel_release: Some(release.to_string()),
                mountinfo: Some(MOUNTINFO.into()),
                filesystems: None,
            };
            let results = run(&facts);
            let failed: Vec<_> = results.iter().filter(|r| !r.passed()).collect();
            match want {
                None => assert!(failed.is_empty(), "kernel {release}: {failed:?}"),
                Some(missing) => {
                    assert_eq!(failed.len(), 1, "kernel {release}: {failed:?}");
                    assert_eq!(failed[0].name, kernel_check_name());
                    assert!(
                        failed[0].detail.contains(missing),
                        "kernel {release}: {failed:?}"
                    );
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
                kernel_release: Some("6.18.0".into()),
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
