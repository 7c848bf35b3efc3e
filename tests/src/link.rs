//! Links between test netns: veth pairs and a bridged "node" with pods attached.
//!
//! Everything is created inside netns the test owns (`ip -n <ns> ...`), never in the host's
//! root netns. IPv6 addresses are added with `nodad` so they are usable at once.

use std::{
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    process::Command,
    str::FromStr,
};

use crate::{
    error::{Error, Result},
    names::{self, run},
    netns::NetnsGuard,
};

/// An interface address with its prefix length, e.g. `10.0.0.1/24` or `fd00::1/64`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IfAddr {
    /// The address.
    pub addr: IpAddr,
    /// The prefix length.
    pub prefix: u8,
}

impl IfAddr {
    /// An address with a prefix length.
    pub fn new(addr: impl Into<IpAddr>, prefix: u8) -> Self {
        IfAddr {
            addr: addr.into(),
            prefix,
        }
    }
}

impl fmt::Display for IfAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl FromStr for IfAddr {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let bad = |detail: &str| Error::Parse {
            what: format!("address {s:?}"),
            detail: detail.into(),
        };
        let (addr, prefix) = s.split_once('/').ok_or_else(|| bad("missing /prefix"))?;
        let addr: IpAddr = addr.parse().map_err(|_| bad("bad IP address"))?;
        let prefix: u8 = prefix.parse().map_err(|_| bad("bad prefix length"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if prefix > max {
            return Err(bad("prefix length too long"));
        }
        Ok(IfAddr { addr, prefix })
    }
}

/// Adds `addr` to `dev` in `ns` (`nodad` for IPv6).
pub fn add_address(ns: &str, dev: &str, addr: IfAddr) -> Result<()> {
    let a = addr.to_string();
    let mut args = vec!["-n", ns, "addr", "add", a.as_str(), "dev", dev];
    if addr.addr.is_ipv6() {
        args.push("nodad");
    }
    run(Command::new("ip").args(&args)).map(drop)
}

/// Brings `dev` up in `ns`.
pub fn set_up(ns: &str, dev: &str) -> Result<()> {
    run(Command::new("ip").args(["-n", ns, "link", "set", dev, "up"])).map(drop)
}

/// Adds a route to `dest` (a CIDR, or `default`) via `gateway` in `ns`.
pub fn add_route(ns: &NetnsGuard, dest: &str, gateway: IpAddr) -> Result<()> {
    let family = if gateway.is_ipv4() { "-4" } else { "-6" };
    let gw = gateway.to_string();
    run(Command::new("ip").args([
        family,
        "-n",
        ns.name(),
        "route",
        "add",
        dest,
        "via",
        gw.as_str(),
    ]))
    .map(drop)
}

/// Adds a default route via `gateway` in `ns` (only ever towards another test netns).
pub fn add_default_route(ns: &NetnsGuard, gateway: IpAddr) -> Result<()> {
    add_route(ns, "default", gateway)
}

fn first_v4(addrs: &[IfAddr]) -> Option<Ipv4Addr> {
    addrs.iter().find_map(|a| match a.addr {
        IpAddr::V4(v4) => Some(v4),
        IpAddr::V6(_) => None,
    })
}

fn first_v6(addrs: &[IfAddr]) -> Option<Ipv6Addr> {
    addrs.iter().find_map(|a| match a.addr {
        IpAddr::V6(v6) => Some(v6),
        IpAddr::V4(_) => None,
    })
}

/// One veth pair between two netns, with addresses, up. Deleted on drop.
#[derive(Debug)]
pub struct VethPair {
    a_ns: String,
    a_if: String,
    b_ns: String,
    b_if: String,
    a_addrs: Vec<IfAddr>,
    b_addrs: Vec<IfAddr>,
}

impl VethPair {
    /// Connects `a` and `b` with fresh addresses: `10.200.<n>.1/24` + `fd00:200:0:<n>::1/64` on
    /// the `a` side, `.2` / `::2` on the `b` side (`n` distinct per pair in this process).
    pub fn connect(a: &NetnsGuard, b: &NetnsGuard) -> Result<Self> {
        let n = names::next() % 250 + 1;
        let v4 = |h: u8| IfAddr::new(Ipv4Addr::new(10, 200, n as u8, h), 24);
        let v6 = |h: u16| IfAddr::new(Ipv6Addr::new(0xfd00, 0x200, 0, n as u16, 0, 0, 0, h), 64);
        Self::connect_with(a, b, &[v4(1), v6(1)], &[v4(2), v6(2)])
    }

    /// Connects `a` and `b` with the given addresses on each side.
    pub fn connect_with(
        a: &NetnsGuard,
        b: &NetnsGuard,
        a_addrs: &[IfAddr],
        b_addrs: &[IfAddr],
    ) -> Result<Self> {
        let n = names::next();
        let (a_if, b_if) = (format!("l5v{n}a"), format!("l5v{n}b"));
        Self::create(a.name(), &a_if, b.name(), &b_if, a_addrs, b_addrs)
    }

    fn create(
        a_ns: &str,
        a_if: &str,
        b_ns: &str,
        b_if: &str,
        a_addrs: &[IfAddr],
        b_addrs: &[IfAddr],
    ) -> Result<Self> {
        // Created inside `a`, the peer end placed straight into `b`: nothing passes through
        // the root netns.
        run(Command::new("ip").args([
            "-n", a_ns, "link", "add", a_if, "type", "veth", "peer", "name", b_if, "netns", b_ns,
        ]))?;
        let pair = VethPair {
            a_ns: a_ns.into(),
            a_if: a_if.into(),
            b_ns: b_ns.into(),
            b_if: b_if.into(),
            a_addrs: a_addrs.to_vec(),
            b_addrs: b_addrs.to_vec(),
        };
        for &addr in a_addrs {
            add_address(a_ns, a_if, addr)?;
        }
        for &addr in b_addrs {
            add_address(b_ns, b_if, addr)?;
        }
        set_up(a_ns, a_if)?;
        set_up(b_ns, b_if)?;
        Ok(pair)
    }

    /// The netns name of the `a` side.
    pub fn a_netns(&self) -> &str {
        &self.a_ns
    }

    /// The netns name of the `b` side.
    pub fn b_netns(&self) -> &str {
        &self.b_ns
    }

    /// The interface name on the `a` side.
    pub fn a_ifname(&self) -> &str {
        &self.a_if
    }

    /// The interface name on the `b` side.
    pub fn b_ifname(&self) -> &str {
        &self.b_if
    }

    /// All addresses on the `a` side.
    pub fn a_addrs(&self) -> &[IfAddr] {
        &self.a_addrs
    }

    /// All addresses on the `b` side.
    pub fn b_addrs(&self) -> &[IfAddr] {
        &self.b_addrs
    }

    /// The first IPv4 address on the `a` side.
    pub fn a_v4(&self) -> Option<Ipv4Addr> {
        first_v4(&self.a_addrs)
    }

    /// The first IPv4 address on the `b` side.
    pub fn b_v4(&self) -> Option<Ipv4Addr> {
        first_v4(&self.b_addrs)
    }

    /// The first IPv6 address on the `a` side.
    pub fn a_v6(&self) -> Option<Ipv6Addr> {
        first_v6(&self.a_addrs)
    }

    /// The first IPv6 address on the `b` side.
    pub fn b_v6(&self) -> Option<Ipv6Addr> {
        first_v6(&self.b_addrs)
    }
}

impl Drop for VethPair {
    fn drop(&mut self) {
        // Deleting one end deletes both; the netns may already be gone, taking the pair along.
        if std::path::Path::new(crate::netns::NETNS_RUN_DIR)
            .join(&self.a_ns)
            .exists()
        {
            let _ = run(Command::new("ip").args(["-n", &self.a_ns, "link", "del", &self.a_if]));
        }
    }
}

/// A "node": a bridge in a node netns with a gateway address per family, and pod netns
/// attached to it by veth pairs (the topology the CNI bridge plugin builds). Pods get
/// `<subnet>.<n>` addresses and default routes via the bridge; the node netns has no route
/// out, so nothing leaves the test's netns.
#[derive(Debug)]
pub struct Bridge {
    ns: String,
    name: String,
    gw4: IfAddr,
    gw6: IfAddr,
    next_host: u16,
}

impl Bridge {
    /// Creates bridge `l5br0` in `node` with `gw4` and `gw6` (e.g. `10.244.0.1/24`,
    /// `fd00:244::1/64`) on it.
    pub fn create(node: &NetnsGuard, gw4: IfAddr, gw6: IfAddr) -> Result<Self> {
        let name = "l5br0".to_string();
        run(Command::new("ip").args(["-n", node.name(), "link", "add", &name, "type", "bridge"]))?;
        let bridge = Bridge {
            ns: node.name().into(),
            name,
            gw4,
            gw6,
            next_host: 2,
        };
        add_address(&bridge.ns, &bridge.name, gw4)?;
        add_address(&bridge.ns, &bridge.name, gw6)?;
        set_up(&bridge.ns, &bridge.name)?;
        Ok(bridge)
    }

    /// The bridge's interface name (in the node netns).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The IPv4 gateway (the bridge's address).
    pub fn gateway_v4(&self) -> IfAddr {
        self.gw4
    }

    /// The IPv6 gateway (the bridge's address).
    pub fn gateway_v6(&self) -> IfAddr {
        self.gw6
    }

    /// Attaches `pod` to the bridge: a veth with `eth0` in the pod, the next free host address
    /// of each subnet, and default routes via the gateways.
    pub fn attach(&mut self, pod: &NetnsGuard) -> Result<PodPort> {
        let host = self.next_host;
        let v4 = match self.gw4.addr {
            IpAddr::V4(gw) => {
                let base = u32::from(gw) & (u32::MAX << (32 - u32::from(self.gw4.prefix)));
                IfAddr::new(Ipv4Addr::from(base + u32::from(host)), self.gw4.prefix)
            }
            IpAddr::V6(_) => return Err(Error::Missing("the IPv4 gateway is not IPv4".into())),
        };
        let v6 = match self.gw6.addr {
            IpAddr::V6(gw) => {
                let shift = 128 - u32::from(self.gw6.prefix);
                let base = u128::from(gw) & (u128::MAX.checked_shl(shift).unwrap_or(0));
                IfAddr::new(Ipv6Addr::from(base + u128::from(host)), self.gw6.prefix)
            }
            IpAddr::V4(_) => return Err(Error::Missing("the IPv6 gateway is not IPv6".into())),
        };
        self.next_host += 1;
        let node_if = format!("l5p{}", names::next());
        let pair = VethPair::create(&self.ns, &node_if, pod.name(), "eth0", &[], &[v4, v6])?;
        run(Command::new("ip").args([
            "-n", &self.ns, "link", "set", &node_if, "master", &self.name,
        ]))?;
        add_default_route(pod, self.gw4.addr)?;
        add_default_route(pod, self.gw6.addr)?;
        Ok(PodPort { pair })
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        if std::path::Path::new(crate::netns::NETNS_RUN_DIR)
            .join(&self.ns)
            .exists()
        {
            let _ = run(Command::new("ip").args(["-n", &self.ns, "link", "del", &self.name]));
        }
    }
}

/// A pod's attachment to a [`Bridge`]. Removed on drop.
#[derive(Debug)]
pub struct PodPort {
    pair: VethPair,
}

impl PodPort {
    /// The pod's IPv4 address.
    pub fn v4(&self) -> Ipv4Addr {
        // Invariant: `Bridge::attach` always assigns one IPv4 address on the pod side.
        self.pair.b_v4().unwrap_or(Ipv4Addr::UNSPECIFIED)
    }

    /// The pod's IPv6 address.
    pub fn v6(&self) -> Ipv6Addr {
        // Invariant: `Bridge::attach` always assigns one IPv6 address on the pod side.
        self.pair.b_v6().unwrap_or(Ipv6Addr::UNSPECIFIED)
    }

    /// The pod-side interface (`eth0`).
    pub fn pod_ifname(&self) -> &str {
        self.pair.b_ifname()
    }

    /// The node-side interface (a bridge port).
    pub fn node_ifname(&self) -> &str {
        self.pair.a_ifname()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ifaddr_parses_and_rejects() {
        let ok = [
            ("10.0.0.1/24", "10.0.0.1", 24),
            ("fd00::1/64", "fd00::1", 64),
            ("::/0", "::", 0),
        ];
        for (s, addr, prefix) in ok {
            let got: IfAddr = s.parse().unwrap_or_else(|e| panic!("{s} must parse: {e}"));
            assert_eq!(
                got.addr,
                addr.parse::<IpAddr>().expect("test literal"),
                "{s}"
            );
            assert_eq!(got.prefix, prefix, "{s}");
            assert_eq!(got.to_string(), s, "round trip of {s}");
        }
        for bad in [
            "10.0.0.1",
            "10.0.0.1/33",
            "fd00::1/129",
            "x/8",
            "10.0.0.1/x",
        ] {
            assert!(bad.parse::<IfAddr>().is_err(), "{bad} must be rejected");
        }
    }
}
