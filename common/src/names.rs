//! Program and map names as the kernel shows them (`bpftool prog show`, `bpftool map show`).
//!
//! The kernel keeps at most 15 characters of a name: every name here fits, and all start with
//! `l5d_` so `bpftool prog show | grep l5d_` lists exactly this project's objects.

/// `cgroup/connect4`: outbound IPv4 (and v4-mapped) redirection to the proxy.
pub const PROG_CONNECT4: &str = "l5d_connect4";
/// `cgroup/connect6`: outbound IPv6 redirection to the proxy.
pub const PROG_CONNECT6: &str = "l5d_connect6";
/// `sockops`: links a redirected socket to its 4-tuple and cleans up on close.
pub const PROG_SOCKOPS: &str = "l5d_sockops";
/// `cgroup/getsockopt`: answers `SO_ORIGINAL_DST` on the proxy's accepted sockets.
pub const PROG_GETSOCKOPT: &str = "l5d_getsockopt";
/// `cgroup/getpeername4`: the app sees the original destination as its peer.
pub const PROG_GETPEERNAME4: &str = "l5d_getpeer4";
/// `cgroup/getpeername6`: the same for IPv6 sockets.
pub const PROG_GETPEERNAME6: &str = "l5d_getpeer6";
/// `cgroup/getsockname4`: a redirected app socket shows the pod's own address as its local
/// address (as under iptables `REDIRECT`), not the loopback address it has.
pub const PROG_GETSOCKNAME4: &str = "l5d_getsock4";
/// `cgroup/getsockname6`: the same for IPv6 sockets.
pub const PROG_GETSOCKNAME6: &str = "l5d_getsock6";

/// `sk_lookup`: hands the pod's inbound connections to the proxy's inbound listener. Attached
/// to the pod's network namespace.
pub const PROG_SK_LOOKUP: &str = "l5d_sk_lookup";
/// The variant of [`PROG_SK_LOOKUP`] for kernels without `ingress_ifindex` in the `sk_lookup`
/// context (before 5.17, e.g. Ubuntu 22.04's 5.15): the pod's own traffic is known by its
/// source address (loopback, the destination itself, or one of the pod's addresses) instead
/// of by the loopback interface. The agent loads one of the two (see
/// [`crate::kernel::SkLookupVariant`]) and pins it under [`PROG_SK_LOOKUP`]'s name.
pub const PROG_SK_LOOKUP_BY_ADDR: &str = "l5d_sk_lookaddr";

/// `iter/tcp`: run by the agent from inside a pod's network namespace when it adopts a pod
/// that started before linkerd-cni: reports the namespace's listening TCP sockets and puts the
/// proxy's inbound listener in [`MAP_LISTENERS`]. Attached to nothing: one iterator is created
/// per run (see [`ITER_PROGRAMS`]).
pub const PROG_ITER_TCP: &str = "l5d_iter_tcp";

/// The per-netns stub the agent builds for each pod (not in the object): it hands the pod's
/// netns cookie to [`PROG_SK_LOOKUP`] by a tail call. Its link is pinned under the name of
/// [`PROG_SK_LOOKUP`].
pub const PROG_SK_LOOKUP_STUB: &str = "l5d_sk_pod";

/// The kernel hook a program runs at, which also says what it is attached to: every hook but
/// [`Hook::SkLookup`] and [`Hook::IterTcp`] is a cgroup hook. Each hook's facts (its ELF
/// section, program type, attach type and their kernel names) are one row of
/// [`Hook::row`]: every caller (the loader, the raw `bpf(2)` calls, the probes, the queries of
/// other tenants' programs, the docs' tests) reads them there. A new hook is a variant, its
/// row, and its program (in `ebpf/` and [`PROGRAMS`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    /// `cgroup/connect4`.
    Connect4,
    /// `cgroup/connect6`.
    Connect6,
    /// `sockops`.
    SockOps,
    /// `cgroup/getsockopt`.
    Getsockopt,
    /// `cgroup/getpeername4`.
    Getpeername4,
    /// `cgroup/getpeername6`.
    Getpeername6,
    /// `cgroup/getsockname4`.
    Getsockname4,
    /// `cgroup/getsockname6`.
    Getsockname6,
    /// `sk_lookup`, attached to a network namespace.
    SkLookup,
    /// `iter/tcp` (`bpf_iter_tcp`): attached to nothing, run on demand.
    IterTcp,
}

/// The facts of one [`Hook`], as the kernel's UAPI (`include/uapi/linux/bpf.h`) and the ELF
/// object name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HookRow {
    /// The ELF section its programs are in (what the eBPF crate's macros write, aya reads and
    /// the docs show).
    pub section: &'static str,
    /// `enum bpf_prog_type`.
    pub prog_type: u32,
    /// The program type as the kernel names it.
    pub prog_type_name: &'static str,
    /// `enum bpf_attach_type`: the attach type of its links and queries (and the expected
    /// attach type its programs are loaded with).
    pub attach_type: u32,
    /// The attach type as the kernel names it.
    pub attach_type_name: &'static str,
    /// The attach type as `bpftool` names it (`bpftool cgroup show`, `bpftool cgroup detach`).
    pub bpftool_name: &'static str,
}

/// `BPF_PROG_TYPE_CGROUP_SOCK_ADDR`: the connect, getpeername and getsockname hooks share it.
const SOCK_ADDR: (u32, &str) = (18, "BPF_PROG_TYPE_CGROUP_SOCK_ADDR");

impl Hook {
    /// Every hook, in declaration order.
    pub const ALL: [Hook; 10] = [
        Hook::Connect4,
        Hook::Connect6,
        Hook::SockOps,
        Hook::Getsockopt,
        Hook::Getpeername4,
        Hook::Getpeername6,
        Hook::Getsockname4,
        Hook::Getsockname6,
        Hook::SkLookup,
        Hook::IterTcp,
    ];

    /// The hook's facts: the one table of them.
    pub const fn row(self) -> HookRow {
        let (section, (prog_type, prog_type_name), attach_type, attach_type_name, bpftool_name) =
            match self {
                Hook::Connect4 => (
                    "cgroup/connect4",
                    SOCK_ADDR,
                    10,
                    "BPF_CGROUP_INET4_CONNECT",
                    "connect4",
                ),
                Hook::Connect6 => (
                    "cgroup/connect6",
                    SOCK_ADDR,
                    11,
                    "BPF_CGROUP_INET6_CONNECT",
                    "connect6",
                ),
                Hook::SockOps => (
                    "sockops",
                    (13, "BPF_PROG_TYPE_SOCK_OPS"),
                    3,
                    "BPF_CGROUP_SOCK_OPS",
                    "sock_ops",
                ),
                Hook::Getsockopt => (
                    "cgroup/getsockopt",
                    (25, "BPF_PROG_TYPE_CGROUP_SOCKOPT"),
                    21,
                    "BPF_CGROUP_GETSOCKOPT",
                    "getsockopt",
                ),
                Hook::Getpeername4 => (
                    "cgroup/getpeername4",
                    SOCK_ADDR,
                    29,
                    "BPF_CGROUP_INET4_GETPEERNAME",
                    "getpeername4",
                ),
                Hook::Getpeername6 => (
                    "cgroup/getpeername6",
                    SOCK_ADDR,
                    30,
                    "BPF_CGROUP_INET6_GETPEERNAME",
                    "getpeername6",
                ),
                Hook::Getsockname4 => (
                    "cgroup/getsockname4",
                    SOCK_ADDR,
                    31,
                    "BPF_CGROUP_INET4_GETSOCKNAME",
                    "getsockname4",
                ),
                Hook::Getsockname6 => (
                    "cgroup/getsockname6",
                    SOCK_ADDR,
                    32,
                    "BPF_CGROUP_INET6_GETSOCKNAME",
                    "getsockname6",
                ),
                Hook::SkLookup => (
                    "sk_lookup",
                    (30, "BPF_PROG_TYPE_SK_LOOKUP"),
                    36,
                    "BPF_SK_LOOKUP",
                    "sk_lookup",
                ),
                Hook::IterTcp => (
                    "iter/tcp",
                    (26, "BPF_PROG_TYPE_TRACING"),
                    28,
                    "BPF_TRACE_ITER",
                    "iter",
                ),
            };
        HookRow {
            section,
            prog_type,
            prog_type_name,
            attach_type,
            attach_type_name,
            bpftool_name,
        }
    }

    /// The ELF section of its programs.
    pub const fn section(self) -> &'static str {
        self.row().section
    }

    /// Its program type (`enum bpf_prog_type`).
    pub const fn prog_type(self) -> u32 {
        self.row().prog_type
    }

    /// Its attach type (`enum bpf_attach_type`).
    pub const fn attach_type(self) -> u32 {
        self.row().attach_type
    }

    /// The attach type as the kernel names it (`BPF_CGROUP_INET4_CONNECT`).
    pub const fn attach_type_name(self) -> &'static str {
        self.row().attach_type_name
    }

    /// The attach type as `bpftool` names it (`bpftool cgroup show`, `bpftool cgroup detach`).
    pub const fn bpftool_name(self) -> &'static str {
        self.row().bpftool_name
    }

    /// A program type as the kernel names it, when one of our hooks has it (another tenant's
    /// program may have any).
    pub fn prog_type_name(prog_type: u32) -> Option<&'static str> {
        Hook::ALL
            .into_iter()
            .map(Hook::row)
            .find(|r| r.prog_type == prog_type)
            .map(|r| r.prog_type_name)
    }

    /// Whether programs of this hook attach to a cgroup (otherwise to a network namespace, or,
    /// for an iterator, to nothing).
    pub const fn on_cgroup(self) -> bool {
        !matches!(self, Hook::SkLookup | Hook::IterTcp)
    }
}

/// Where a program stands in the chain of state a redirected connection leaves behind it,
/// which sets when the agent swaps its pinned links to a new generation of programs
/// ([`Program::chain`]): the readers first, then the relays, then the writers. Each link
/// update is atomic, so for the length of a swap a connection may meet old and new programs
/// in any mix the order allows; a new program always understands what an old one upstream of
/// it wrote (the new maps are filled, and the kept maps hold compatible entries), while an old
/// program does not know a new one's state. So a program is swapped only after everything
/// downstream of it runs the new generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Chain {
    /// Answers the application or the proxy from state others wrote, and writes none that
    /// another program reads (getsockopt's `SO_ORIGINAL_DST`, getpeername, getsockname).
    Reader,
    /// Reads what a writer left and writes what a reader takes (sockops hands a connection's
    /// destination from the app's socket to the proxy's; `sk_lookup` hands inbound
    /// connections to the proxy's listener).
    Relay,
    /// Writes the first state of a connection (the connect hooks save the original
    /// destination at `connect()`).
    Writer,
}

/// One eBPF program: its name (the function's name in `ebpf/`), its hook, and where it stands
/// in a connection's chain of state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Program {
    pub name: &'static str,
    pub hook: Hook,
    /// Its place in the chain of state, which orders the links' swap at an upgrade.
    pub chain: Chain,
}

/// Every program of the object, with its hook: the cgroup ones in attach order, then the netns
/// one. The only list of programs; the others below are derived from it.
pub const PROGRAMS: [Program; 9] = [
    Program {
        name: PROG_CONNECT4,
        hook: Hook::Connect4,
        chain: Chain::Writer,
    },
    Program {
        name: PROG_CONNECT6,
        hook: Hook::Connect6,
        chain: Chain::Writer,
    },
    Program {
        name: PROG_SOCKOPS,
        hook: Hook::SockOps,
        chain: Chain::Relay,
    },
    Program {
        name: PROG_GETSOCKOPT,
        hook: Hook::Getsockopt,
        chain: Chain::Reader,
    },
    Program {
        name: PROG_GETPEERNAME4,
        hook: Hook::Getpeername4,
        chain: Chain::Reader,
    },
    Program {
        name: PROG_GETPEERNAME6,
        hook: Hook::Getpeername6,
        chain: Chain::Reader,
    },
    Program {
        name: PROG_GETSOCKNAME4,
        hook: Hook::Getsockname4,
        chain: Chain::Reader,
    },
    Program {
        name: PROG_GETSOCKNAME6,
        hook: Hook::Getsockname6,
        chain: Chain::Reader,
    },
    Program {
        name: PROG_SK_LOOKUP,
        hook: Hook::SkLookup,
        chain: Chain::Relay,
    },
];

/// The programs of the object that are attached to nothing: iterators the agent runs on
/// demand. Loaded and pinned under `progs/` like [`PROGRAMS`], never linked to a pod.
pub const ITER_PROGRAMS: [Program; 1] = [Program {
    name: PROG_ITER_TCP,
    hook: Hook::IterTcp,
    chain: Chain::Reader,
}];

/// Programs of the object that stand in for one of [`PROGRAMS`] on kernels lacking a feature
/// it uses: loaded instead of it, pinned and attached under its name. `(variant, stands for)`.
pub const VARIANT_PROGRAMS: [(&str, &str); 1] = [(PROG_SK_LOOKUP_BY_ADDR, PROG_SK_LOOKUP)];

/// [`VARIANT_PROGRAMS`] as programs, each with the hook of the program it stands for.
pub fn variant_programs() -> impl Iterator<Item = Program> {
    VARIANT_PROGRAMS.into_iter().filter_map(|(name, of)| {
        PROGRAMS
            .into_iter()
            .find(|p| p.name == of)
            .map(|p| Program { name, ..p })
    })
}

/// Every program of the object: the attached ones ([`ALL_PROGRAMS`]), the iterators, then the
/// variants ([`VARIANT_PROGRAMS`]).
pub const OBJECT_PROGRAMS: [&str; PROGRAMS.len() + ITER_PROGRAMS.len() + VARIANT_PROGRAMS.len()] = {
    let mut out = [""; PROGRAMS.len() + ITER_PROGRAMS.len() + VARIANT_PROGRAMS.len()];
    let mut i = 0;
    while i < PROGRAMS.len() {
        out[i] = PROGRAMS[i].name;
        i += 1;
    }
    while i < PROGRAMS.len() + ITER_PROGRAMS.len() {
        out[i] = ITER_PROGRAMS[i - PROGRAMS.len()].name;
        i += 1;
    }
    while i < out.len() {
        out[i] = VARIANT_PROGRAMS[i - PROGRAMS.len() - ITER_PROGRAMS.len()].0;
        i += 1;
    }
    out
};

/// The names of every attached program, in [`PROGRAMS`] order.
pub const ALL_PROGRAMS: [&str; PROGRAMS.len()] = program_names(Attached::Anywhere);

/// Every program attached to a pod's cgroup, in attach order.
pub const CGROUP_PROGRAMS: [&str; 8] = program_names(Attached::Cgroup);

/// Every program attached to a pod's network namespace.
pub const NETNS_PROGRAMS: [&str; 1] = program_names(Attached::Netns);

/// Which programs [`program_names`] keeps.
enum Attached {
    Anywhere,
    Cgroup,
    Netns,
}

/// The names of the [`PROGRAMS`] attached `where_`, in order. Evaluated at compile time: an
/// `N` that is not their number fails the build.
const fn program_names<const N: usize>(where_: Attached) -> [&'static str; N] {
    let mut out = [""; N];
    let (mut i, mut n) = (0, 0);
    while i < PROGRAMS.len() {
        let on_cgroup = PROGRAMS[i].hook.on_cgroup();
        let keep = match where_ {
            Attached::Anywhere => true,
            Attached::Cgroup => on_cgroup,
            Attached::Netns => !on_cgroup,
        };
        if keep {
            out[n] = PROGRAMS[i].name;
            n += 1;
        }
        i += 1;
    }
    assert!(
        n == N,
        "the array length must be the number of programs it lists"
    );
    out
}

/// netns cookie → [`crate::PodConfig`]: which pods are meshed, and how.
pub const MAP_POD_CONFIG: &str = "l5d_pod_config";
/// [`crate::PortSetKey`] → [`crate::PortBlock`]: per-pod port sets (ignored ports), as bitmaps.
pub const MAP_PORT_SETS: &str = "l5d_port_sets";
/// LPM trie of [`crate::AddrKey`]: per-pod ignored subnets and the pod's own addresses.
pub const MAP_ADDRS: &str = "l5d_addrs";
/// socket cookie → [`crate::OrigDst`]: original destination of an app socket redirected by
/// layout-2 programs (layout 3 keeps it in the socket's storage, [`MAP_APP_DST`]); read and
/// cleaned for sockets that connected before an upgrade.
pub const MAP_SOCK_DST: &str = "l5d_sock_dst";
/// [`crate::ConnKey`] → [`crate::OrigDst`]: original destination by the proxy-side 4-tuple.
pub const MAP_CONN_DST: &str = "l5d_conn_dst";
/// netns cookie → [`crate::PodStats`] (per CPU): live counters.
pub const MAP_POD_STATS: &str = "l5d_pod_stats";

/// pod address (IPv6 words, IPv4 v4-mapped) → netns cookie: the pods' known addresses.
pub const MAP_POD_BY_IP: &str = "l5d_pod_by_ip";
/// netns cookie → [`crate::PodAddrs`]: the pod's own address of each family, which
/// `getsockname` shows a redirected app socket as its local address (layout 4).
pub const MAP_POD_ADDRS: &str = "l5d_pod_addrs";
/// SOCKHASH of [`crate::ListenerKey`]: each pod's inbound proxy listener, inserted by sockops
/// when the proxy calls `listen()` (or by [`PROG_ITER_TCP`] when the agent adopts a pod whose
/// proxy listened before), gone when it closes.
pub const MAP_LISTENERS: &str = "l5d_listeners";

/// Socket-local storage ([`crate::OrigDst`]) of the proxy's accepted sockets: their original
/// destination, for as long as the socket exists.
pub const MAP_ACC_DST: &str = "l5d_acc_dst";
/// Socket-local storage ([`crate::OrigDst`]) of redirected app sockets: their original
/// destination, saved at `connect()` (layout 3; before, [`MAP_SOCK_DST`]).
pub const MAP_APP_DST: &str = "l5d_app_dst";
/// Per-CPU slot 0: the netns cookie a pod's `sk_lookup` stub hands to the shared program.
pub const MAP_LOOKUP_NS: &str = "l5d_lookup_ns";
/// Program array, slot 0: the shared `sk_lookup` program the pods' stubs tail-call.
pub const MAP_LOOKUP_PROG: &str = "l5d_lookup_prog";
/// ARRAY of one [`crate::IterArgs`] (key `0u32`): what the agent asks of the next run of
/// [`PROG_ITER_TCP`] (which pod, which port and owner are the proxy's, whether to register).
pub const MAP_ITER_ARGS: &str = "l5d_iter_args";

/// ARRAY of one [`crate::LayoutMeta`] (key `0u32`): the layout version of the pinned state.
/// Created and pinned by the agent next to the maps; not part of the eBPF object.
pub const MAP_META: &str = "l5d_meta";

/// Every map, as pinned under `paths::PIN_MAPS`. The map macro of `ebpf/` takes only string
/// literals: the agent's tests check the built object against this list.
pub const MAPS: [&str; 14] = [
    MAP_POD_CONFIG,
    MAP_PORT_SETS,
    MAP_ADDRS,
    MAP_SOCK_DST,
    MAP_CONN_DST,
    MAP_POD_STATS,
    MAP_POD_BY_IP,
    MAP_POD_ADDRS,
    MAP_LISTENERS,
    MAP_ACC_DST,
    MAP_APP_DST,
    MAP_LOOKUP_NS,
    MAP_LOOKUP_PROG,
    MAP_ITER_ARGS,
];

// The kernel keeps 15 characters of a name (`BPF_OBJ_NAME_LEN` with its NUL): a longer one
// would show truncated in `bpftool` and no longer match. Checked at compile time.
const _: () = {
    let mut i = 0;
    while i < OBJECT_PROGRAMS.len() {
        assert!(
            OBJECT_PROGRAMS[i].len() <= 15,
            "program name longer than 15 characters"
        );
        i += 1;
    }
    let mut i = 0;
    while i < MAPS.len() {
        assert!(MAPS[i].len() <= 15, "map name longer than 15 characters");
        i += 1;
    }
};

/// Capacity of the pod config map: the most pods one node agent can mesh.
pub const MAX_PODS: u32 = 4096;
/// Capacity of the port-set map (a pod with every port ignored uses 256 blocks).
pub const MAX_PORT_BLOCKS: u32 = 65536;
/// Capacity of the subnet / own-address trie.
pub const MAX_ADDRS: u32 = 65536;
/// Capacity of the per-socket and per-connection original destination maps: live redirected
/// connections on the node. They are cleaned on close and are LRU, so a leak can never fill
/// them; past this many live connections the oldest lose their `getpeername` rewrite (the
/// proxy reads `SO_ORIGINAL_DST` right after accepting). LRU maps are preallocated: about
/// 7 MiB each at this size.
pub const MAX_CONNS: u32 = 65536;

#[cfg(test)]
mod tests {
    use super::*;

    /// [`Hook::ALL`] lists every variant once, and no two rows share a section or an attach
    /// type (each is how the kernel and the object tell one hook from another).
    #[test]
    fn every_hook_has_its_own_row() {
        for (i, hook) in Hook::ALL.into_iter().enumerate() {
            assert_eq!(
                hook as usize, i,
                "Hook::ALL out of declaration order at {hook:?}"
            );
            for other in &Hook::ALL[..i] {
                let (a, b) = (hook.row(), other.row());
                assert_ne!(a.section, b.section, "{hook:?} and {other:?}");
                assert_ne!(a.attach_type, b.attach_type, "{hook:?} and {other:?}");
                assert_ne!(
                    a.attach_type_name, b.attach_type_name,
                    "{hook:?} and {other:?}"
                );
                assert_ne!(a.bpftool_name, b.bpftool_name, "{hook:?} and {other:?}");
                // One program type, one name.
                assert_eq!(
                    a.prog_type == b.prog_type,
                    a.prog_type_name == b.prog_type_name,
                    "{hook:?} and {other:?}"
                );
            }
            assert_eq!(
                Hook::prog_type_name(hook.prog_type()),
                Some(hook.row().prog_type_name)
            );
        }
        assert_eq!(Hook::prog_type_name(0), None);
    }
}
