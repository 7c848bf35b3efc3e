//! The kernel features the eBPF mode needs: feature, the mainline release that brought it, and
//! what of ours uses it. One table, read by the agent's start-up check and by
//! `linkerd check --node`, so both refuse exactly the kernels the programs cannot load on and
//! name the same missing features.
//!
//! Each row names the probe that asks the running kernel whether it has the feature
//! ([`Probe`], run by `crate::probe` with the `probe` feature): the release number is
//! information only, since distributions backport eBPF features far past their version (RHEL 9
//! reports 5.14). The floor is the newest release in the table: 5.17 today (`ingress_ifindex` in
//! `sk_lookup`'s context), the oldest mainline kernel with everything. `tests/tests/kernel.rs`
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
    /// A `cgroup/getpeername4` program (`BPF_CGROUP_INET4_GETPEERNAME`) loads.
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
            Probe::CgroupGetpeername => "loads a cgroup/getpeername4 program",
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
}

/// Every feature, oldest first.
pub const FEATURES: &[Feature] = &[
    Feature {
        name: "cgroup sock_addr hooks (connect4/connect6)",
        since: (4, 17),
        used_by: "l5d_connect4, l5d_connect6: outbound redirection to the proxy",
        probe: Probe::CgroupConnect,
        programs: &[names::PROG_CONNECT4, names::PROG_CONNECT6],
    },
    Feature {
        name: "cgroup getsockopt hook",
        since: (5, 3),
        used_by: "l5d_getsockopt: SO_ORIGINAL_DST for the proxy",
        probe: Probe::CgroupGetsockopt,
        programs: &[names::PROG_GETSOCKOPT],
    },
    Feature {
        name: "bpf_link for cgroup programs",
        since: (5, 7),
        used_by: "the agent's attachments (pinned links, replaced atomically on upgrade)",
        probe: Probe::CgroupLink,
        programs: &[],
    },
    Feature {
        name: "cgroup getpeername hooks",
        since: (5, 8),
        used_by: "l5d_getpeername4, l5d_getpeername6: the app sees its original peer",
        probe: Probe::CgroupGetpeername,
        programs: &[names::PROG_GETPEERNAME4, names::PROG_GETPEERNAME6],
    },
    Feature {
        name: "sk_lookup programs",
        since: (5, 9),
        used_by: "l5d_sk_lookup and the per-pod stubs: inbound redirection",
        probe: Probe::SkLookup,
        programs: &[names::PROG_SK_LOOKUP, names::PROG_SK_LOOKUP_STUB],
    },
    Feature {
        name: "SO_NETNS_COOKIE",
        since: (5, 14),
        used_by: "the agent: the network namespace cookie that keys each pod's maps",
        probe: Probe::SoNetnsCookie,
        programs: &[],
    },
    Feature {
        name: "bpf_get_netns_cookie in sock_ops and cgroup sockopt programs",
        since: (5, 15),
        used_by: "l5d_sockops, l5d_getsockopt: the pod of a connection",
        probe: Probe::NetnsCookieHelper,
        programs: &[names::PROG_SOCKOPS, names::PROG_GETSOCKOPT],
    },
    Feature {
        name: "ingress_ifindex in the sk_lookup context",
        since: (5, 17),
        used_by: "l5d_sk_lookup: connections arriving on loopback (the pod's own) pass",
        probe: Probe::SkLookupIngressIfindex,
        programs: &[names::PROG_SK_LOOKUP],
    },
];

/// The oldest release with every feature.
pub const FLOOR: (u32, u32) = floor();

const fn floor() -> (u32, u32) {
    let mut max = (0, 0);
    let mut i = 0;
    while i < FEATURES.len() {
        let since = FEATURES[i].since;
        if since.0 > max.0 || (since.0 == max.0 && since.1 > max.1) {
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

/// The features `version` lacks, oldest first.
pub fn missing(version: (u32, u32)) -> impl Iterator<Item = &'static Feature> {
    FEATURES.iter().filter(move |f| version < f.since)
}

/// The features `version` lacks as one line: `name (5.15+), name (5.17+)`.
#[derive(Clone, Copy, Debug)]
pub struct MissingList(pub (u32, u32));

impl fmt::Display for MissingList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, feature) in missing(self.0).enumerate() {
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
    fn the_floor_is_the_newest_feature_and_lacks_nothing() {
        assert_eq!(FLOOR, (5, 17));
        assert_eq!(missing(FLOOR).count(), 0);
        assert_eq!(MissingList(FLOOR).to_string(), "");
        assert!(FEATURES.windows(2).all(|w| w[0].since <= w[1].since));
    }

    #[test]
    fn each_release_below_a_feature_lacks_it() {
        assert_eq!(
            MissingList((5, 16)).to_string(),
            "ingress_ifindex in the sk_lookup context (5.17+)"
        );
        assert_eq!(
            MissingList((5, 10)).to_string(),
            "SO_NETNS_COOKIE (5.14+), bpf_get_netns_cookie in sock_ops and cgroup sockopt \
             programs (5.15+), ingress_ifindex in the sk_lookup context (5.17+)"
        );
        assert_eq!(missing((4, 19)).count(), 7);
    }
}
