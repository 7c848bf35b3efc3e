//! A test pod as the data plane sees it (a netns shared by its containers, plus a cgroup), and
//! the common two-party topology: a pod linked by a veth to a peer netns that stands for
//! another pod or the node.

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::{
    cgroup::CgroupGuard,
    child::Placement,
    error::Result,
    link::VethPair,
    netns::NetnsGuard,
    proxy::{self, PROXY_UID, TestProxy},
};

/// A pod: its netns and a cgroup for its containers. Fields drop in declaration order.
#[derive(Debug)]
pub struct Pod {
    /// The pod's cgroup (register it with the agent as the pod cgroup).
    pub cgroup: CgroupGuard,
    /// The pod's network namespace.
    pub netns: NetnsGuard,
}

impl Pod {
    /// A fresh netns (lo up) and cgroup.
    pub fn new() -> Result<Self> {
        let netns = NetnsGuard::new()?;
        let cgroup = CgroupGuard::new()?;
        Ok(Pod { cgroup, netns })
    }

    /// A container of this pod running as `uid` (GID `uid`, no supplementary groups).
    pub fn container(&self, uid: u32) -> Placement {
        Placement::new()
            .netns(&self.netns)
            .cgroup(&self.cgroup)
            .uid(uid)
    }

    /// Starts the forwarding test proxy as this pod's proxy container (UID 2102).
    pub fn start_proxy(&self, opts: &proxy::Options) -> Result<TestProxy> {
        TestProxy::start(&self.container(PROXY_UID), opts)
    }

    /// The pod's netns cookie.
    pub fn cookie(&self) -> Result<u64> {
        self.netns.cookie()
    }
}

/// A pod linked by a veth to a peer netns (another pod, or the node). The pod side has
/// `10.200.<n>.1/24` and `fd00:200:0:<n>::1/64`, the peer side `.2` and `::2`.
#[derive(Debug)]
pub struct PodAndPeer {
    /// The veth between them.
    pub veth: VethPair,
    /// The peer netns.
    pub peer: NetnsGuard,
    /// The pod.
    pub pod: Pod,
}

impl PodAndPeer {
    /// A fresh pod, peer and link.
    pub fn new() -> Result<Self> {
        let pod = Pod::new()?;
        let peer = NetnsGuard::new()?;
        let veth = VethPair::connect(&pod.netns, &peer)?;
        Ok(PodAndPeer { veth, peer, pod })
    }

    /// The pod's IPv4 address.
    pub fn pod_v4(&self) -> Ipv4Addr {
        // Invariant: `VethPair::connect` assigns one IPv4 address per side.
        self.veth.a_v4().unwrap_or(Ipv4Addr::UNSPECIFIED)
    }

    /// The pod's IPv6 address.
    pub fn pod_v6(&self) -> Ipv6Addr {
        // Invariant: `VethPair::connect` assigns one IPv6 address per side.
        self.veth.a_v6().unwrap_or(Ipv6Addr::UNSPECIFIED)
    }

    /// The peer's IPv4 address.
    pub fn peer_v4(&self) -> Ipv4Addr {
        // Invariant: as above.
        self.veth.b_v4().unwrap_or(Ipv4Addr::UNSPECIFIED)
    }

    /// The peer's IPv6 address.
    pub fn peer_v6(&self) -> Ipv6Addr {
        // Invariant: as above.
        self.veth.b_v6().unwrap_or(Ipv6Addr::UNSPECIFIED)
    }

    /// A process in the peer netns as `uid` (a client "from outside" the pod).
    pub fn remote(&self, uid: u32) -> Placement {
        Placement::new().netns(&self.peer).uid(uid)
    }
}
