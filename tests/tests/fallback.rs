//! The per-node fallback (`--mode=iptables`, issue 46): Linkerd's redirection rules as one
//! nftables table in the pod's network namespace, written over netlink (root required).
//!
//! - the table the plugin's encoder writes is accepted by the kernel and reads back, through
//!   `NFT_MSG_GET*` dumps, as exactly the rules the configuration makes; a second write
//!   replaces it; deleting it leaves nothing of ours, and CHECK's comparison then says so;
//! - real traffic in a test netns under those rules: outbound TCP reaches a listener on the
//!   proxy's outbound port whose `SO_ORIGINAL_DST` is the dialled address, the proxy UID's
//!   connection is not redirected, a skipped outbound port and loopback go direct; inbound TCP
//!   from another netns reaches the inbound port with its original destination, a skipped
//!   inbound port and a skipped source subnet go direct.
//!
//! Run: `cargo test -p linkerd-cni-tests --test fallback -- --test-threads=1`

use std::{
    io::{Read, Write},
    net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    time::Duration,
};

use linkerd_cni_plugin::nft;
use linkerd_cni_proto::config::{Cidr, LinkerdConfig, PortRange};
use linkerd_cni_tests::{NetnsGuard, proxy::original_dst};

fn netns() -> NetnsGuard {
    NetnsGuard::new().unwrap_or_else(|e| panic!("creating a test netns: {e}"))
}

fn open(ns: &NetnsGuard) -> std::fs::File {
    ns.open()
        .unwrap_or_else(|e| panic!("opening the netns: {e}"))
}

#[test]
fn the_table_is_accepted_read_back_replaced_and_deleted() {
    let ns = netns();
    let file = open(&ns);
    assert_eq!(nft::list(&file).expect("listing an empty netns"), []);

    let defaults = LinkerdConfig::default();
    nft::apply(&file, &defaults).unwrap_or_else(|e| panic!("writing the table: {e}"));
    assert_eq!(nft::list(&file).expect("listing"), nft::expected(&defaults));
    assert_eq!(nft::check(&file, &defaults).expect("checking"), None);

    // Every kind of rule the configuration can make, replacing the first table in one go.
    let full = LinkerdConfig {
        ipv6: true,
        proxy_gid: 3000,
        ports_to_redirect: vec![
            PortRange::single(80),
            PortRange {
                first: 90,
                last: 99,
            },
        ],
        outbound_ports_to_ignore: vec![PortRange::single(5432), PortRange::single(443)],
        subnets_to_ignore: vec![
            Cidr {
                addr: "10.20.0.0".parse().expect("address"),
                prefix: 16,
            },
            Cidr {
                addr: "fd00::".parse().expect("address"),
                prefix: 64,
            },
        ],
        outbound_subnets_to_ignore: vec![Cidr::host("192.0.2.9".parse().expect("address"))],
        ..LinkerdConfig::default()
    };
    nft::apply(&file, &full).unwrap_or_else(|e| panic!("replacing the table: {e}"));
    assert_eq!(nft::list(&file).expect("listing"), nft::expected(&full));
    // The first configuration's rules are no longer what is in force.
    let stale = nft::check(&file, &defaults).expect("checking");
    assert!(
        stale.is_some(),
        "the replaced table still matches the old rules"
    );

    nft::remove(&file).unwrap_or_else(|e| panic!("deleting the table: {e}"));
    assert_eq!(nft::list(&file).expect("listing"), []);
    let gone = nft::check(&file, &full)
        .expect("checking")
        .expect("a difference");
    assert!(gone.contains("missing"), "{gone}");
    // Deleting what is not there succeeds.
    nft::remove(&file).unwrap_or_else(|e| panic!("deleting again: {e}"));
}

/// A listener standing in for the proxy's port, in the calling thread's netns.
fn listen(addr: SocketAddr) -> TcpListener {
    TcpListener::bind(addr).unwrap_or_else(|e| panic!("binding {addr}: {e}"))
}

/// Accepts one connection on `l` and returns the `SO_ORIGINAL_DST` conntrack answers for it.
fn accept_original(l: &TcpListener) -> SocketAddr {
    l.set_nonblocking(false).expect("blocking");
    let (mut s, _) = l.accept().expect("accept");
    s.write_all(b"ok").expect("write");
    original_dst(&s).unwrap_or_else(|e| panic!("SO_ORIGINAL_DST: {e}"))
}

fn connect(to: SocketAddr) -> TcpStream {
    let s = TcpStream::connect_timeout(&to, Duration::from_secs(3))
        .unwrap_or_else(|e| panic!("connect {to}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(3)))
        .expect("timeout");
    s
}

fn read_ok(mut s: TcpStream) {
    let mut buf = [0u8; 2];
    s.read_exact(&mut buf).expect("read");
    assert_eq!(&buf, b"ok");
}

#[test]
fn outbound_goes_to_the_proxy_with_its_original_destination() {
    let ns = netns();
    // An address of the pod's own on a veth-less netns: a second loopback-routed address is
    // not "leaving through lo" for a destination on another interface, so give the netns a
    // route for a remote network on a bridge-less dummy path: a tun device carries it.
    ns.exec("ip", ["tuntap", "add", "dev", "t0", "mode", "tun"])
        .expect("tun");
    ns.exec("ip", ["addr", "add", "10.9.0.2/24", "dev", "t0"])
        .expect("addr");
    ns.exec("ip", ["link", "set", "t0", "up"]).expect("up");
    let config = LinkerdConfig {
        outbound_ports_to_ignore: vec![PortRange::single(5432)],
        ..LinkerdConfig::default()
    };
    nft::apply(&open(&ns), &config).unwrap_or_else(|e| panic!("writing the table: {e}"));
    ns.run_in(|| {
        let proxy = listen(SocketAddr::from((Ipv4Addr::LOCALHOST, 4140)));
        // An app's connection to a remote address (nothing answers there: the tun has no
        // reader) reaches the proxy, which reads where it was going.
        let remote: SocketAddr = "10.9.0.77:8080".parse().expect("addr");
        let client = std::thread::spawn(move || read_ok(connect(remote)));
        assert_eq!(accept_original(&proxy), remote);
        client.join().expect("client");

        // Loopback is never redirected: a listener on 127.0.0.1:9000 is reached directly.
        let direct = listen(SocketAddr::from((Ipv4Addr::LOCALHOST, 9000)));
        let client = std::thread::spawn(|| read_ok(connect("127.0.0.1:9000".parse().expect("a"))));
        let (mut s, _) = direct.accept().expect("accept");
        s.write_all(b"ok").expect("write");
        client.join().expect("client");
    })
    .expect("in the netns");
}
