//! The kernel features the eBPF mode needs: feature, the mainline release that brought it, and
//! what of ours uses it. One table, read by the agent's start-up check and by
//! `linkerd check --node`, so both refuse exactly the kernels the programs cannot load on and
//! name the same missing features.
//!
//! Each row names the probe that asks the running kernel whether it has the feature
//! ([`Probe`], run by `crate::probe` with the `probe` feature): the release number is
//! information only, since distributions backport eBPF features far past their version (RHEL 9
//! reports 5.14). A feature with a stand-in ([`Feature::without`]) is not required: without it
//! the agent loads a variant program that keeps the same guarantee another way (today only
//! `ingress_ifindex` in `sk_lookup`'s context, 5.17: [`SkLookupVariant`]). The floor is the
//! newest release among the required features: 5.15 (`bpf_get_netns_cookie` in sock_ops and
//! sockopt programs), the oldest mainline kernel the eBPF mode serves. `tests/tests/kernel.rs`
//! checks in every kernel the suite runs on (the host and the `cargo xtask vmtest` guests) that
//! each program loads exactly when the probes of its features all say yes.

use core::fmt;

use crate::names;

/// How a feature is asked for: each program load is a few instructions, closed at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    /// A `cgroup/connect4` program (`BPF_PROG_TYPE_CGROUP_SOCK_ADDR`,
    /// `BPF_CGROUP_INET4_CONNECT`) loads.
    CgroupConnect,
    /// A `cgroup/getsockopt` program (`BPF_PROG_TYPE_CGROUP_SOCKOPT`) loads.
    CgroupGetsockopt,
    /// `BPF_LINK_CREATE` for a cgroup program exists: with a loaded `cgroup/connect4` program
    /// and an invalid cgroup fd the kernel answers `EBADF` (it looked the fd up), without the
    /// command `EINVAL`. Nothing is attached.
    CgroupLink,
    /// A `cgroup/getpeername4` program (`BPF_CGROUP_INET4_GETPEERNAME`) and a
    /// `cgroup/getsockname4` program (`BPF_CGROUP_INET4_GETSOCKNAME`) load (both hooks came
    /// with the same mainline change, 5.8).
    CgroupGetpeername,
    /// An `sk_lookup` program (`BPF_PROG_TYPE_SK_LOOKUP`) loads.
    SkLookup,
    /// `getsockopt(SO_NETNS_COOKIE)` answers on a socket.
    SoNetnsCookie,
    /// A `sockops` program and a `cgroup/getsockopt` program calling `bpf_get_netns_cookie`
    /// both load.
    NetnsCookieHelper,
    /// An `sk_lookup` program reading `ingress_ifindex` from its context loads.
    SkLookupIngressIfindex,
}

impl Probe {
    /// What the probe asks, in a few words (the docs' table shows it).
    pub const fn asks(self) -> &'static str {
        match self {
            Probe::CgroupConnect => "loads a cgroup/connect4 program",
            Probe::CgroupGetsockopt => "loads a cgroup/getsockopt program",
            Probe::CgroupLink => {
                "BPF_LINK_CREATE of a cgroup/connect4 program on an invalid cgroup fd answers EBADF (not EINVAL)"
            }
            Probe::CgroupGetpeername => {
                "loads a cgroup/getpeername4 and a cgroup/getsockname4 program"
            }
            Probe::SkLookup => "loads an sk_lookup program",
            Probe::SoNetnsCookie => "getsockopt(SO_NETNS_COOKIE) on a Unix socket",
            Probe::NetnsCookieHelper => {
                "loads a sock_ops and a cgroup/getsockopt program calling bpf_get_netns_cookie"
            }
            Probe::SkLookupIngressIfindex => "loads an sk_lookup program reading ingress_ifindex",
        }
    }
}

/// One kernel feature.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Feature {
    /// What it is, in the words an operator searches for.
    pub name: &'static str,
    /// The first mainline release (`major.minor`) that has it.
    pub since: (u32, u32),
    /// What of ours needs it.
    pub used_by: &'static str,
    /// How the running kernel is asked for it.
    pub probe: Probe,
    /// The programs (names in [`names`]) that do not load without it.
    pub programs: &'static [&'static str],
    /// What the agent does without it, when the guarantee it serves is kept another way: the
    /// feature is then not required (a kernel lacking it passes the check, running the
    /// stand-in). `None`: required.
    pub without: Option<&'static str>,
}

impl Feature {
    /// Whether a kernel without it is refused.
    pub const fn required(&self) -> bool {
        self.without.is_none()
    }
}

/// Which `sk_lookup` program the agent loads (and pins under [`names::PROG_SK_LOOKUP`]): both
/// pass the pod's own traffic and hand everything else to the proxy; they differ in how they
/// recognise the pod's own traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SkLookupVariant {
    /// [`names::PROG_SK_LOOKUP`]: a connection whose source is loopback, its own destination
    /// or one of the pod's known addresses, or that arrived on the loopback device
    /// (`ingress_ifindex`, 5.17), is the pod's own.
    Ifindex,
    /// [`names::PROG_SK_LOOKUP_BY_ADDR`]: a connection whose source is loopback, its own
    /// destination, or one of the pod's known addresses is the pod's own (any kernel with
    /// `sk_lookup`).
    Address,
}

impl SkLookupVariant {
    /// The variant for a kernel that has (`true`) or lacks `ingress_ifindex` in the
    /// `sk_lookup` context.
    pub const fn for_kernel(has_ingress_ifindex: bool) -> Self {
        match has_ingress_ifindex {
            true => Self::Ifindex,
            false => Self::Address,
        }
    }

    /// The program's name in the object (and as `bpftool prog show` lists it).
    pub const fn program(self) -> &'static str {
        match self {
            Self::Ifindex => names::PROG_SK_LOOKUP,
            Self::Address => names::PROG_SK_LOOKUP_BY_ADDR,
        }
    }

    /// The variant whose program is named `name`.
    pub fn of_program(name: &str) -> Option<Self> {
        [Self::Ifindex, Self::Address]
            .into_iter()
            .find(|v| v.program() == name)
    }

    /// The value of the agent's `--sk-lookup` flag that forces it.
    pub const fn flag(self) -> &'static str {
        match self {
            Self::Ifindex => "ifindex",
            Self::Address => "address",
        }
    }

    /// How it recognises the pod's own traffic, in a few words.
    pub const fn rule(self) -> &'static str {
        match self {
            Self::Ifindex => {
                "the pod's own traffic: from loopback, its destination or a pod address, or \
                 arriving on lo"
            }
            Self::Address => {
                "the pod's own traffic: from loopback, its destination or a pod address"
            }
        }
    }
}

impl fmt::Display for SkLookupVariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.program(), self.rule())
    }
}

/// How a node's meshed pods are redirected: the eBPF data plane where the kernel has every
/// required feature, else the per-node fallback (Linkerd's own rules, one nftables table in
/// each meshed pod's network namespace, written by the plugin). The agent chooses at start
/// (`crate::probe::Findings::choose`, its `--mode`), and `linkerd check --node` says which.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// The eBPF data plane (programs on the pod's cgroup and netns).
    #[default]
    Ebpf,
    /// The per-node fallback: Linkerd's rules in the pod's network namespace, no program.
    Iptables,
}

impl Mode {
    /// The mode's name, as `--mode`, the chart and the metrics' label say it.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Ebpf => "ebpf",
            Self::Iptables => "iptables",
        }
    }

    /// The mode named `name` ([`Self::name`]).
    pub fn of_name(name: &str) -> Option<Self> {
        [Self::Ebpf, Self::Iptables]
            .into_iter()
            .find(|m| m.name() == name)
    }
}

/// Every feature, oldest first.
pub const FEATURES: &[Feature] = &[
    Feature {
        name: "cgroup sock_addr hooks (connect4/connect6)",
        since: (4, 17),
        used_by: "l5d_connect4, l5d_connect6: outbound redirection to the proxy",
        probe: Probe::CgroupConnect,
        programs: &[names::PROG_CONNECT4, names::PROG_CONNECT6],
        without: None,
    },
    Feature {
        name: "cgroup getsockopt hook",
        since: (5, 3),
        used_by: "l5d_getsockopt: SO_ORIGINAL_DST for the proxy",
        probe: Probe::CgroupGetsockopt,
        programs: &[names::PROG_GETSOCKOPT],
        without: None,
    },
    Feature {
        name: "bpf_link for cgroup programs",
        since: (5, 7),
        used_by: "the agent's attachments (pinned links, replaced atomically on upgrade)",
        probe: Probe::CgroupLink,
        programs: &[],
        without: None,
    },
    Feature {
        name: "cgroup getpeername and getsockname hooks",
        since: (5, 8),
        used_by: "l5d_getpeer4/6: the app sees its original peer; l5d_getsock4/6: its pod \
                  address as its local address",
        probe: Probe::CgroupGetpeername,
        programs: &[
            names::PROG_GETPEERNAME4,
            names::PROG_GETPEERNAME6,
            names::PROG_GETSOCKNAME4,
            names::PROG_GETSOCKNAME6,
        ],
        without: None,
    },
    Feature {
        name: "sk_lookup programs",
        since: (5, 9),
        used_by: "l5d_sk_lookup and the per-pod stubs: inbound redirection",
        probe: Probe::SkLookup,
        programs: &[
            names::PROG_SK_LOOKUP,
            names::PROG_SK_LOOKUP_BY_ADDR,
            names::PROG_SK_LOOKUP_STUB,
        ],
        without: None,
    },
    Feature {
        name: "SO_NETNS_COOKIE",
        since: (5, 14),
        used_by: "the agent: the network namespace cookie that keys each pod's maps",
        probe: Probe::SoNetnsCookie,
        programs: &[],
        without: None,
    },
    Feature {
        name: "bpf_get_netns_cookie in sock_ops and cgroup sockopt programs",
        since: (5, 15),
        used_by: "l5d_sockops, l5d_getsockopt: the pod of a connection",
        probe: Probe::NetnsCookieHelper,
        programs: &[names::PROG_SOCKOPS, names::PROG_GETSOCKOPT],
        without: None,
    },
    Feature {
        name: "ingress_ifindex in the sk_lookup context",
        since: (5, 17),
        used_by: "l5d_sk_lookup: connections arriving on loopback (the pod's own) pass",
        probe: Probe::SkLookupIngressIfindex,
        programs: &[names::PROG_SK_LOOKUP],
        without: Some(
            "l5d_sk_lookaddr: the pod's own traffic is known by its source address (loopback, \
             the destination itself, or one of the pod's addresses)",
        ),
    },
];

/// The oldest release with every required feature.
pub const FLOOR: (u32, u32) = floor();

const fn floor() -> (u32, u32) {
    let mut max = (0, 0);
    let mut i = 0;
    while i < FEATURES.len() {
        let since = FEATURES[i].since;
        let newer = since.0 > max.0 || (since.0 == max.0 && since.1 > max.1);
        if FEATURES[i].required() && newer {
            max = since;
        }
        i += 1;
    }
    max
}

/// `major.minor` of a release string such as `6.1.0-56-amd64` or `5.15.0-1049-aws`.
pub fn parse_release(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.trim().split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// The required features `version` lacks, oldest first.
pub fn missing(version: (u32, u32)) -> impl Iterator<Item = &'static Feature> {
    FEATURES
        .iter()
        .filter(move |f| f.required() && version < f.since)
}

/// The required features `version` lacks as one line: `name (5.14+), name (5.15+)`.
#[derive(Clone, Copy, Debug)]
pub struct MissingList(pub (u32, u32));

impl fmt::Display for MissingList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_features(f, missing(self.0))
    }
}

/// Features as one line: `name (5.15+), name (5.17+)`, each with the mainline release that
/// brought it (the probes' findings, where [`MissingList`] is a version's).
#[derive(Clone, Copy, Debug)]
pub struct Named<'a>(pub &'a [&'static Feature]);

impl fmt::Display for Named<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_features(f, self.0.iter().copied())
    }
}

/// The one way a list of features is written: `name (major.minor+)`, comma separated.
fn write_features<'a>(
    f: &mut fmt::Formatter<'_>,
    features: impl Iterator<Item = &'a Feature>,
) -> fmt::Result {
    for (i, feature) in features.enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        write!(
            f,
            "{} ({}.{}+)",
            feature.name, feature.since.0, feature.since.1
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::string::ToString;

    use super::*;

    #[test]
    fn releases_parse_to_major_minor() {
        for (release, want) in [
            ("6.1.0-56-amd64", Some((6, 1))),
            ("5.15.0-1049-aws\n", Some((5, 15))),
            ("6.12.95+deb12-amd64", Some((6, 12))),
            ("5.9", Some((5, 9))),
            ("garbage", None),
        ] {
            assert_eq!(parse_release(release), want, "{release:?}");
        }
    }

    #[test]
    fn the_floor_is_the_newest_required_feature_and_lacks_nothing() {
        assert_eq!(FLOOR, (5, 15));
        assert_eq!(missing(FLOOR).count(), 0);
        assert_eq!(MissingList(FLOOR).to_string(), "");
        assert!(FEATURES.windows(2).all(|w| w[0].since <= w[1].since));
        // Ubuntu 22.04's GA kernel: served, with the address variant of sk_lookup.
        assert_eq!(MissingList((5, 15)).to_string(), "");
        let ifindex = FEATURES
            .iter()
            .find(|f| f.probe == Probe::SkLookupIngressIfindex)
            .expect("the ingress_ifindex row");
        assert!(!ifindex.required());
        assert_eq!(SkLookupVariant::for_kernel(false), SkLookupVariant::Address);
    }

    #[test]
    fn each_release_below_a_required_feature_lacks_it() {
        assert_eq!(
            MissingList((5, 14)).to_string(),
            "bpf_get_netns_cookie in sock_ops and cgroup sockopt programs (5.15+)"
        );
        assert_eq!(
            MissingList((5, 10)).to_string(),
            "SO_NETNS_COOKIE (5.14+), bpf_get_netns_cookie in sock_ops and cgroup sockopt \
             programs (5.15+)"
        );
        assert_eq!(missing((4, 19)).count(), 6);
        // The probes' list of features is written the same way.
        let found: std::vec::Vec<&Feature> = missing((5, 10)).collect();
        assert_eq!(Named(&found).to_string(), MissingList((5, 10)).to_string());
        assert_eq!(Named(&[]).to_string(), "");
    }

    #[test]
    fn each_variant_names_its_program_and_only_the_stand_in_has_one() {
        for v in [SkLookupVariant::Ifindex, SkLookupVariant::Address] {
            assert_eq!(SkLookupVariant::of_program(v.program()), Some(v));
        }
        assert_eq!(
            SkLookupVariant::Address.program(),
            names::VARIANT_PROGRAMS[0].0
        );
        // Every feature with a stand-in is one whose programs have a variant.
        for f in FEATURES.iter().filter(|f| !f.required()) {
            assert!(
                f.programs
                    .iter()
                    .all(|p| names::VARIANT_PROGRAMS.iter().any(|(_, of)| of == p)),
                "{}",
                f.name
            );
        }
    }
}
