//! The Linux capabilities the agent uses, each with the system calls that need it, and the
//! start-up check that names a missing one in one line instead of a raw `EPERM` later.
//!
//! The DaemonSet runs the agent's container unprivileged with exactly the capabilities marked
//! required here (and the chart lists the same ones): a new use of a capability must be added
//! here, with its reason, or the agent would fail at its first use on a real node. The
//! optional ones serve paths a node may not need (adoption, user-namespaced pods, older
//! plugins); without them those paths fail closed with an error naming the capability, and
//! the chart adds them only when asked (`agent.sysAdmin`).

use std::{fmt, fs, io};

/// One capability the agent uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capability {
    /// Its name as the kernel and Kubernetes spell it (without `CAP_`).
    pub name: &'static str,
    /// Its bit in the capability sets (`include/uapi/linux/capability.h`).
    pub bit: u32,
    /// Whether the agent cannot work without it (else: a warning naming what will not work).
    pub required: bool,
    /// What needs it: the system calls and what the agent uses them for.
    pub why: &'static str,
}

/// Every capability the agent uses, and every system call that needs one. Read from the
/// kernel's checks (6.1 and later): `bpf_prog_load` wants `CAP_BPF` for every program type
/// but socket filters, plus `CAP_NET_ADMIN` for the cgroup sock_addr, sockops and sockopt
/// types and `CAP_PERFMON` for tracing programs such as `iter/tcp`; `sk_lookup` needs
/// `CAP_BPF` alone. `BPF_LINK_CREATE` on a netns (`netns_bpf_link_create`) checks nothing
/// beyond holding the netns descriptor; on a cgroup it needs the program loaded.
/// `BPF_PROG_GET_FD_BY_ID` wants `CAP_SYS_ADMIN`. The verifier's `allow_ptr_leaks` is
/// `CAP_PERFMON`: without it 6.1 refuses our connect programs (see [`CAPABILITIES`]'s entry). Opening pins (`BPF_OBJ_GET`), reading link
/// and program info by descriptor and map reads and writes need no capability beyond the
/// descriptor (the maps were made by `CAP_BPF`).
pub const CAPABILITIES: [Capability; 5] = [
    Capability {
        name: "BPF",
        bit: 39,
        required: true,
        why: "bpf(2): creating the maps and loading the programs (BPF_MAP_CREATE, \
              BPF_PROG_LOAD), attaching them (BPF_LINK_CREATE), reading and updating map \
              entries",
    },
    Capability {
        name: "NET_ADMIN",
        bit: 12,
        required: true,
        why: "bpf(2) BPF_PROG_LOAD of the cgroup sock_addr, sockops and sockopt programs, \
              and ioctl(2) SIOCGSKNS on the socket the plugin passes from inside a pod's \
              network namespace (which namespace it is, without entering it)",
    },
    Capability {
        name: "SYS_ADMIN",
        bit: 21,
        required: false,
        why: "setns(2) into pods' network namespaces for pods running before the plugin \
              (adoption) and for ADDs from plugins older than the agent (for a user-namespaced \
              pod also setns(2) into its user namespace, to read its uid_map), mount(2) of \
              bpffs when it is \
              gone, and bpf(2) BPF_PROG_GET_FD_BY_ID (keeping pods' inbound stubs across a \
              restart; without it each is replaced)",
    },
    Capability {
        name: "PERFMON",
        bit: 38,
        required: true,
        why: "bpf(2) BPF_PROG_LOAD of the connect programs on kernels whose verifier refuses, \
              to a loader without it (no allow_ptr_leaks), a write to part of a stack slot \
              holding a spilled register (6.1: 'attempt to corrupt spilled pointer on stack'), \
              and of the iter/tcp program (a tracing program) that adoption runs",
    },
    Capability {
        name: "SYS_PTRACE",
        bit: 19,
        required: false,
        why: "open(2) of /proc/<pid>/ns/net of another user's process, for runtimes that pass \
              such a path as CNI_NETNS (containerd and CRI-O pass /run/netns pins, which do \
              not need it)",
    },
];

/// Required capabilities the process does not have.
#[derive(Debug, PartialEq, Eq)]
pub struct MissingCapabilities(pub Vec<Capability>);

impl fmt::Display for MissingCapabilities {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, cap) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(
                f,
                "missing capability CAP_{} (needed for {})",
                cap.name, cap.why
            )?;
        }
        Ok(())
    }
}

impl std::error::Error for MissingCapabilities {}

/// The effective capability set of this process (`CapEff` in `/proc/self/status`).
pub fn effective() -> io::Result<u64> {
    let status = fs::read_to_string("/proc/self/status")?;
    parse_cap_eff(&status).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "no CapEff line in /proc/self/status",
        )
    })
}

fn parse_cap_eff(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
}

/// The names (without `CAP_`) of the required capabilities: the set the DaemonSet's agent
/// container is granted, and all it holds.
pub fn required_names() -> Vec<&'static str> {
    CAPABILITIES
        .iter()
        .filter(|c| c.required)
        .map(|c| c.name)
        .collect()
}

/// The capabilities of [`CAPABILITIES`] missing from the set `effective`: required ones first.
pub fn missing(effective: u64) -> (Vec<Capability>, Vec<Capability>) {
    CAPABILITIES
        .iter()
        .filter(|c| effective & (1u64 << c.bit) == 0)
        .partition(|c| c.required)
}

/// Checks that this process holds every required capability; logs each optional one it lacks.
/// When the set cannot be read, passes (the first system call that needs one will say).
pub fn check() -> Result<(), MissingCapabilities> {
    let effective = match effective() {
        Ok(set) => set,
        Err(error) => {
            tracing::warn!(%error, "cannot read this process's capabilities; not checked");
            return Ok(());
        }
    };
    let (required, optional) = missing(effective);
    for cap in optional {
        tracing::warn!(
            "capability CAP_{} not held: no {} (only some nodes need it)",
            cap.name,
            cap.why
        );
    }
    if required.is_empty() {
        Ok(())
    } else {
        Err(MissingCapabilities(required))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> u64 {
        names
            .iter()
            .map(|n| {
                let cap = CAPABILITIES.iter().find(|c| c.name == *n).expect("known");
                1u64 << cap.bit
            })
            .fold(0, |a, b| a | b)
    }

    #[test]
    fn the_required_names_are_the_set_that_misses_nothing_required() {
        let names = required_names();
        assert!(!names.contains(&"SYS_ADMIN"), "{names:?}");
        assert!(
            names.contains(&"BPF") && names.contains(&"NET_ADMIN"),
            "{names:?}"
        );
        let (required, _) = missing(set(&names));
        assert!(required.is_empty(), "{required:?}");
    }

    #[test]
    fn reads_the_effective_set() {
        let status = "Name:\tagent\nCapInh:\t0000000000000000\nCapEff:\t000000800000100\n";
        assert_eq!(parse_cap_eff(status), Some(0x800000100));
        assert_eq!(parse_cap_eff("Name: x\n"), None);
        assert!(effective().is_ok());
    }

    #[test]
    fn each_missing_required_capability_is_named_in_one_line() {
        let all = set(&["BPF", "NET_ADMIN", "SYS_ADMIN", "PERFMON", "SYS_PTRACE"]);
        assert_eq!(missing(all), (vec![], vec![]));
        for cap in CAPABILITIES.iter().filter(|c| c.required) {
            let (required, optional) = missing(all & !(1u64 << cap.bit));
            assert_eq!(required, vec![*cap]);
            assert!(optional.is_empty());
            let line = MissingCapabilities(required).to_string();
            assert!(
                line.starts_with(&format!("missing capability CAP_{} (needed for ", cap.name)),
                "{line}"
            );
            assert!(!line.contains('\n'), "{line}");
        }
        let (required, optional) = missing(set(&["BPF", "NET_ADMIN", "PERFMON"]));
        assert!(required.is_empty());
        assert_eq!(
            optional.iter().map(|c| c.name).collect::<Vec<_>>(),
            ["SYS_ADMIN", "SYS_PTRACE"]
        );
    }

    #[test]
    fn bits_are_the_kernels() {
        // include/uapi/linux/capability.h
        let bit = |n: &str| CAPABILITIES.iter().find(|c| c.name == n).map(|c| c.bit);
        assert_eq!(bit("NET_ADMIN"), Some(12));
        assert_eq!(bit("SYS_PTRACE"), Some(19));
        assert_eq!(bit("SYS_ADMIN"), Some(21));
        assert_eq!(bit("PERFMON"), Some(38));
        assert_eq!(bit("BPF"), Some(39));
    }
}
