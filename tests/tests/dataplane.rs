//! The outbound data plane against the real kernel (root required): a pod (netns + cgroup)
//! registered through the agent library, a server in a second netns over a veth, the
//! forwarding test proxy as UID 2102 in the pod, and the test client as an ordinary UID.
//!
//! Every assertion is on what the kernel and the processes observed: where connections landed,
//! what `SO_ORIGINAL_DST`, `getpeername` and `getsockname` answered, what the pinned maps and
//! links hold.
//!
//! Run: `cargo test -p linkerd-cni-tests --test dataplane -- --test-threads=1`

use linkerd_cni_sys::bpf;
use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    time::{Duration, Instant},
};

use linkerd_cni_agent::{agent::registry::Attachment, dataplane::maps};
use linkerd_cni_common::{POD_ADDR_V4, PodAddrs, names};
use linkerd_cni_proto::config::LinkerdConfig;
use linkerd_cni_tests::{
    AgentHarness, CgroupGuard, EchoServer, Pod, PodAndPeer, TestProxy, UdpEcho,
    client::{Options as ClientOptions, Report, run_client},
    diag,
    proxy::{self, Event, PROXY_UID},
};

const TIMEOUT: Duration = Duration::from_secs(20);
const APP_UID: u32 = 1000;
const SERVER_PORT: u16 = 8080;

fn sock(ip: impl Into<IpAddr>, port: u16) -> SocketAddr {
    SocketAddr::new(ip.into(), port)
}

/// The pod-and-peer topology with a server in the peer and the proxy in the pod.
struct World {
    net: PodAndPeer,
    server: EchoServer,
}

impl World {
    fn new() -> Self {
        let net = PodAndPeer::new().expect("create pod, peer netns and veth");
        let server = EchoServer::bind_in(&net.peer, sock(net.peer_v4(), SERVER_PORT), "server")
            .expect("start server");
        World { net, server }
    }

    fn proxy(&self, ipv6: bool) -> TestProxy {
        let opts = proxy::Options {
            ipv6,
            ..proxy::Options::new()
        };
        self.net
            .pod
            .start_proxy(&opts)
            .expect("start the forwarding proxy as UID 2102")
    }

    fn connect(&self, uid: u32, target: SocketAddr) -> Report {
        connect_as(&self.net.pod, uid, None, target)
    }
}

fn connect_as(pod: &Pod, uid: u32, gid: Option<u32>, target: SocketAddr) -> Report {
    let mut placement = pod.container(uid);
    if let Some(gid) = gid {
        placement = placement.gid(gid);
    }
    run_client(
        &placement,
        &ClientOptions::new(target).send("hello\n"),
        TIMEOUT,
    )
    .expect("run the test client")
}

/// Waits until the proxy has accepted `n` connections and returns them.
fn proxied(proxy: &TestProxy, n: usize) -> Vec<(SocketAddr, SocketAddr)> {
    let events = proxy
        .log()
        .wait_for(TIMEOUT, |e| proxy::accepted(e).len() >= n)
        .expect("proxy accepted");
    proxy::accepted(&events)
}

/// Waits until the proxy has accepted `n` connections and returns, for each, the peer and the
/// local address of its accepted socket (`getpeername`, `getsockname`) and the original
/// destination. The peer is the app socket as the kernel holds it: its real local address and
/// port.
fn accepted_sockets(proxy: &TestProxy, n: usize) -> Vec<(SocketAddr, SocketAddr, SocketAddr)> {
    let events = proxy
        .log()
        .wait_for(TIMEOUT, |e| proxy::accepted(e).len() >= n)
        .expect("proxy accepted");
    events
        .iter()
        .filter_map(|e| match e {
            Event::Accepted {
                peer,
                local,
                orig_dst,
                ..
            } => Some((*peer, *local, *orig_dst)),
            _ => None,
        })
        .collect()
}

/// Detaches the pod's pinned link of `program` (the kernel stops running it for the pod; the
/// pin stays, as after `bpftool link detach`).
fn detach_link(
    h: &AgentHarness,
    record: &linkerd_cni_agent::agent::registry::PodRecord,
    program: &str,
) {
    let dir = h.agent().link_dir(record).expect("per-pod link dir");
    let link = bpf::obj_get(&dir.join(program)).expect("the pinned link");
    bpf::link_detach(&link).expect("detach the link");
}

/// A connection went straight to `server`, not through the proxy: the server saw the pod's
/// own address, the client saw the server as its peer, and the proxy saw nothing new.
fn assert_direct(
    world: &World,
    proxy: &TestProxy,
    report: &Report,
    seen_before: usize,
    proxied_before: usize,
) {
    assert!(report.succeeded == 1, "connection failed: {report:?}");
    assert_eq!(report.peer, Some(world.server.addr()), "client's peer");
    let got = world
        .server
        .wait_for(seen_before + 1, TIMEOUT)
        .expect("server saw the connection");
    assert_eq!(
        got[seen_before].peer.ip(),
        IpAddr::V4(world.net.pod_v4()),
        "server saw the pod itself"
    );
    let seen = proxy::accepted(&proxy.events().expect("proxy log")).len();
    assert_eq!(seen, proxied_before, "the proxy must not see it");
}

#[test]
fn outbound_goes_through_the_proxy_with_the_original_destination() {
    let h = AgentHarness::new(None);
    let world = World::new();
    let record = h.register(&world.net.pod, LinkerdConfig::default(), true);
    assert!(
        matches!(record.attachment, Attachment::PerPod { .. }),
        "{record:?}"
    );
    let proxy = world.proxy(false);

    let report = world.connect(APP_UID, world.server.addr());
    assert_eq!(report.succeeded, 1, "request through the proxy: {report:?}");
    assert!(
        report.received_matches(&world.server.expected_reply(b"hello\n")),
        "response: {report:?}"
    );
    // The app believes it talks to the server.
    assert_eq!(
        report.peer,
        Some(world.server.addr()),
        "getpeername on the app socket"
    );
    // And its pod's address as its own, as under iptables' REDIRECT (which leaves the source
    // alone), with the socket's real port: the one the proxy's accepted socket sees as its peer
    // (the kernel's socket is bound to 127.0.0.1).
    let (app_side, _, _) = accepted_sockets(&proxy, 1)[0];
    assert_eq!(app_side.ip(), IpAddr::V4(Ipv4Addr::LOCALHOST));
    assert_eq!(
        report.local,
        Some(sock(world.net.pod_v4(), app_side.port())),
        "getsockname on the app socket: {report:?}"
    );
    // The connection landed on the outbound listener, and SO_ORIGINAL_DST named the server.
    assert_eq!(
        proxied(&proxy, 1),
        vec![(sock(Ipv4Addr::LOCALHOST, 4140), world.server.addr())]
    );
    // The proxy's accepted socket has a loopback peer too (the app's socket), and the same
    // getpeername hook ran for it at accept: it must report the app side, not the server.
    let peers: Vec<SocketAddr> = proxy
        .events()
        .expect("proxy log")
        .iter()
        .filter_map(|e| match e {
            Event::Accepted { peer, .. } => Some(*peer),
            _ => None,
        })
        .collect();
    assert_eq!(peers.len(), 1, "{peers:?}");
    assert_eq!(peers[0].ip(), IpAddr::V4(Ipv4Addr::LOCALHOST), "{peers:?}");
    assert_ne!(peers[0], world.server.addr(), "{peers:?}");
    // The server was reached by the proxy (from the pod's address).
    let got = world.server.wait_for(1, TIMEOUT).expect("server reached");
    assert_eq!(got[0].peer.ip(), IpAddr::V4(world.net.pod_v4()));

    let view = h.maps().view(record.netns_cookie);
    assert_eq!(view.stats.out_redirected, 1, "{view:?}");
    assert_eq!(view.stats.orig_dst_answered, 1, "{view:?}");
    // bpftool sees the programs under their names on the pod's cgroup.
    let tree = std::process::Command::new("bpftool")
        .args(["cgroup", "show"])
        .arg(world.net.pod.cgroup.path())
        .output()
        .expect("run bpftool");
    let tree = String::from_utf8_lossy(&tree.stdout);
    for prog in names::CGROUP_PROGRAMS {
        assert!(
            tree.contains(prog),
            "bpftool cgroup show lacks {prog}: {tree}"
        );
    }
}

/// `getsockname` on a redirected app socket answers the pod's address (the kernel's socket is
/// on loopback); every other socket keeps the kernel's answer: the proxy's own (UID 2102) and
/// a skipped port's (direct, from the pod's address), the pod talking to itself on loopback,
/// the proxy's accepted socket. With `l5d_getsock4` detached (negative control) the redirected
/// socket shows what the kernel holds: `127.0.0.1`, same port.
#[test]
fn getsockname_shows_the_pod_address_for_redirected_sockets_only() {
    const SKIPPED: u16 = 9999;
    let h = AgentHarness::new(None);
    let world = World::new();
    let skipped = EchoServer::bind_in(
        &world.net.peer,
        sock(world.net.peer_v4(), SKIPPED),
        "skipped",
    )
    .expect("server on the skipped port");
    let in_pod = EchoServer::bind_in(&world.net.pod.netns, sock(Ipv4Addr::LOCALHOST, 0), "in-pod")
        .expect("server on the pod's loopback");
    let config = LinkerdConfig {
        outbound_ports_to_ignore: vec![linkerd_cni_proto::config::PortRange {
            first: SKIPPED,
            last: SKIPPED,
        }],
        ..LinkerdConfig::default()
    };
    let record = h.register(&world.net.pod, config, true);
    let view = h.maps().view(record.netns_cookie);
    assert_eq!(
        view.local_addrs,
        vec![
            IpAddr::V4(world.net.pod_v4()),
            IpAddr::V6(world.net.pod_v6())
        ],
        "{view:?}"
    );
    let proxy = world.proxy(false);

    // Redirected: the pod's address, the socket's own port.
    let r = world.connect(APP_UID, world.server.addr());
    assert_eq!(
        (r.succeeded, r.peer),
        (1, Some(world.server.addr())),
        "{r:?}"
    );
    let (app_side, proxy_local, orig_dst) = accepted_sockets(&proxy, 1)[0];
    assert_eq!(orig_dst, world.server.addr());
    assert_eq!(
        r.local,
        Some(sock(world.net.pod_v4(), app_side.port())),
        "{r:?}"
    );
    // The proxy's accepted socket (loopback, with an original destination of its own): as is.
    assert_eq!(proxy_local, sock(Ipv4Addr::LOCALHOST, 4140));

    // The proxy's own socket and a skipped port: not redirected, the kernel's answer (the
    // pod's address the route chose, as the server saw it).
    let as_proxy = connect_as(&world.net.pod, PROXY_UID, None, world.server.addr());
    assert_direct(&world, &proxy, &as_proxy, 1, 1);
    let seen = world.server.wait_for(2, TIMEOUT).expect("server reached");
    assert_eq!(as_proxy.local, Some(seen[1].peer), "{as_proxy:?}");
    let r = world.connect(APP_UID, skipped.addr());
    assert_eq!((r.succeeded, r.peer), (1, Some(skipped.addr())), "{r:?}");
    let seen = skipped
        .wait_for(1, TIMEOUT)
        .expect("skipped server reached");
    assert_eq!(r.local, Some(seen[0].peer), "{r:?}");
    assert_eq!(seen[0].peer.ip(), IpAddr::V4(world.net.pod_v4()));

    // The pod to itself on loopback: not redirected, loopback stays.
    let r = world.connect(APP_UID, in_pod.addr());
    assert_eq!((r.succeeded, r.peer), (1, Some(in_pod.addr())), "{r:?}");
    let seen = in_pod.wait_for(1, TIMEOUT).expect("in-pod server reached");
    assert_eq!(r.local, Some(seen[0].peer), "{r:?}");
    assert_eq!(seen[0].peer.ip(), IpAddr::V4(Ipv4Addr::LOCALHOST));
    assert_eq!(
        accepted_sockets(&proxy, 1).len(),
        1,
        "the proxy saw only the first"
    );

    // Negative control: without l5d_getsock4 the redirected socket says what the kernel holds.
    detach_link(&h, &record, names::PROG_GETSOCKNAME4);
    let r = world.connect(APP_UID, world.server.addr());
    assert_eq!(
        (r.succeeded, r.peer),
        (1, Some(world.server.addr())),
        "{r:?}"
    );
    let (app_side, _, _) = accepted_sockets(&proxy, 2)[1];
    assert_eq!(
        r.local,
        Some(sock(Ipv4Addr::LOCALHOST, app_side.port())),
        "{r:?}"
    );
    // CHECK sees the detached link (and the reconcile would re-make it).
    assert!(
        h.agent().check(&record.id).is_err(),
        "CHECK passed with l5d_getsock4 detached"
    );
}

#[test]
fn proxy_uid_and_gid_are_exempt() {
    let h = AgentHarness::new(None);
    let world = World::new();
    let config = LinkerdConfig {
        proxy_gid: 3000,
        ..LinkerdConfig::default()
    };
    h.register(&world.net.pod, config, true);
    let proxy = world.proxy(false);

    let as_proxy = connect_as(&world.net.pod, PROXY_UID, None, world.server.addr());
    assert_direct(&world, &proxy, &as_proxy, 0, 0);
    let as_gid = connect_as(&world.net.pod, APP_UID, Some(3000), world.server.addr());
    assert_direct(&world, &proxy, &as_gid, 1, 0);
    // And an ordinary UID/GID is redirected.
    let app = connect_as(&world.net.pod, APP_UID, Some(APP_UID), world.server.addr());
    assert_eq!(app.succeeded, 1, "{app:?}");
    assert_eq!(proxied(&proxy, 1)[0].1, world.server.addr());
}

#[test]
fn ignored_ports_subnets_loopback_own_ip_and_udp_are_not_redirected() {
    let h = AgentHarness::new(None);
    let world = World::new();
    let peer = world.net.peer_v4();
    let config = LinkerdConfig {
        outbound_ports_to_ignore: vec![
            "9000".parse().expect("port"),
            "9100-9200".parse().expect("range"),
        ],
        ..LinkerdConfig::default()
    };
    let record = h.register(&world.net.pod, config, true);
    let proxy = world.proxy(false);

    // Single ignored port and a port inside an ignored range.
    for port in [9000, 9150] {
        let s = EchoServer::bind_in(&world.net.peer, sock(peer, port), "ignored").expect("server");
        let r = world.connect(APP_UID, s.addr());
        assert_eq!(
            (r.succeeded, r.peer),
            (1, Some(s.addr())),
            "port {port}: {r:?}"
        );
        assert_eq!(
            s.wait_for(1, TIMEOUT).expect("reached")[0].peer.ip(),
            IpAddr::V4(world.net.pod_v4())
        );
    }
    // Just outside the range: redirected.
    let s = EchoServer::bind_in(&world.net.peer, sock(peer, 9201), "edge").expect("server");
    assert_eq!(world.connect(APP_UID, s.addr()).succeeded, 1);
    assert_eq!(proxied(&proxy, 1)[0].1, s.addr());

    // Loopback and the pod's own address stay in the pod.
    let local = EchoServer::bind_in(&world.net.pod.netns, sock(Ipv4Addr::LOCALHOST, 7000), "lo")
        .expect("server");
    let r = world.connect(APP_UID, local.addr());
    assert_eq!((r.succeeded, r.peer), (1, Some(local.addr())), "{r:?}");
    let own = EchoServer::bind_in(&world.net.pod.netns, sock(world.net.pod_v4(), 7001), "own")
        .expect("server");
    let r = world.connect(APP_UID, own.addr());
    assert_eq!((r.succeeded, r.peer), (1, Some(own.addr())), "{r:?}");
    assert!(
        record.pod_ips.contains(&IpAddr::V4(world.net.pod_v4())),
        "own IP discovered: {record:?}"
    );

    // UDP is untouched.
    let udp =
        UdpEcho::bind_in(&world.net.peer, sock(peer, SERVER_PORT), "udp").expect("udp server");
    let r = run_client(
        &world.net.pod.container(APP_UID),
        &ClientOptions::new(udp.addr()).udp().send("ping"),
        TIMEOUT,
    )
    .expect("udp client");
    assert_eq!((r.succeeded, r.peer), (1, Some(udp.addr())), "{r:?}");
    assert_eq!(
        udp.wait_for(1, TIMEOUT).expect("datagram")[0].peer.ip(),
        IpAddr::V4(world.net.pod_v4())
    );

    assert_eq!(
        proxied(&proxy, 1).len(),
        1,
        "only the one redirected connection reached the proxy"
    );
    let stats = h.maps().stats(record.netns_cookie);
    assert_eq!(stats.out_redirected, 1, "{stats:?}");
    assert!(stats.out_skipped >= 4, "{stats:?}");
}

#[test]
fn ignored_outbound_subnets_are_not_redirected() {
    let h = AgentHarness::new(None);
    let world = World::new();
    let subnet = format!("{}/24", world.net.peer_v4()).parse().expect("cidr");
    h.register(
        &world.net.pod,
        LinkerdConfig {
            outbound_subnets_to_ignore: vec![subnet],
            ..LinkerdConfig::default()
        },
        true,
    );
    let proxy = world.proxy(false);
    let r = world.connect(APP_UID, world.server.addr());
    assert_direct(&world, &proxy, &r, 0, 0);
}

#[test]
fn ipv6_and_v4_mapped_destinations_are_redirected() {
    let h = AgentHarness::new(None);
    let world = World::new();
    let server6 = EchoServer::bind_in(
        &world.net.peer,
        sock(world.net.peer_v6(), SERVER_PORT),
        "server6",
    )
    .expect("v6 server");
    let record = h.register(
        &world.net.pod,
        LinkerdConfig {
            ipv6: true,
            ..LinkerdConfig::default()
        },
        true,
    );
    let proxy = world.proxy(true);

    let r = world.connect(APP_UID, server6.addr());
    assert_eq!((r.succeeded, r.peer), (1, Some(server6.addr())), "{r:?}");
    assert!(r.received_matches(&server6.expected_reply(b"hello\n")));
    let mapped = SocketAddr::new(
        IpAddr::V6(world.net.peer_v4().to_ipv6_mapped()),
        SERVER_PORT,
    );
    let r2 = world.connect(APP_UID, mapped);
    assert_eq!((r2.succeeded, r2.peer), (1, Some(mapped)), "{r2:?}");
    assert_eq!(
        proxied(&proxy, 2),
        vec![
            (sock(std::net::Ipv6Addr::LOCALHOST, 4140), server6.addr()),
            (sock(Ipv4Addr::LOCALHOST, 4140), world.server.addr()),
        ]
    );
    // getsockname: the pod's IPv6 address for the IPv6 connection, its IPv4 address v4-mapped
    // for the v4-mapped one, each with the app socket's real port (the proxy's peer).
    let sides: Vec<SocketAddr> = accepted_sockets(&proxy, 2).iter().map(|a| a.0).collect();
    assert_eq!(sides[0].ip(), IpAddr::V6(std::net::Ipv6Addr::LOCALHOST));
    assert_eq!(
        r.local,
        Some(sock(world.net.pod_v6(), sides[0].port())),
        "{r:?}"
    );
    let pod_mapped = IpAddr::V6(world.net.pod_v4().to_ipv6_mapped());
    assert_eq!(
        r2.local,
        Some(SocketAddr::new(pod_mapped, sides[1].port())),
        "{r2:?}"
    );

    // A pod with no IPv6 address of its own (its entry holds only IPv4): the IPv6 socket
    // keeps the kernel's `::1`; the v4-mapped one still shows the pod's IPv4 address.
    let mut maps = h.maps();
    let addrs = maps
        .pod_addrs(record.netns_cookie)
        .expect("the pod's addresses");
    let v4_only = PodAddrs {
        flags: POD_ADDR_V4,
        v6: [0; 4],
        ..addrs
    };
    maps.pod_addrs
        .as_mut()
        .expect("the map")
        .insert(record.netns_cookie, v4_only, 0)
        .expect("write the entry");
    let r = world.connect(APP_UID, server6.addr());
    assert_eq!((r.succeeded, r.peer), (1, Some(server6.addr())), "{r:?}");
    let r2 = world.connect(APP_UID, mapped);
    assert_eq!((r2.succeeded, r2.peer), (1, Some(mapped)), "{r2:?}");
    let sides: Vec<SocketAddr> = accepted_sockets(&proxy, 4).iter().map(|a| a.0).collect();
    assert_eq!(
        r.local,
        Some(sock(std::net::Ipv6Addr::LOCALHOST, sides[2].port())),
        "{r:?}"
    );
    assert_eq!(
        r2.local,
        Some(SocketAddr::new(pod_mapped, sides[3].port())),
        "{r2:?}"
    );
}

#[test]
fn ipv6_is_left_alone_when_disabled() {
    let h = AgentHarness::new(None);
    let world = World::new();
    let server6 = EchoServer::bind_in(
        &world.net.peer,
        sock(world.net.peer_v6(), SERVER_PORT),
        "server6",
    )
    .expect("v6 server");
    h.register(&world.net.pod, LinkerdConfig::default(), true);
    let proxy = world.proxy(true);
    let r = world.connect(APP_UID, server6.addr());
    assert_eq!((r.succeeded, r.peer), (1, Some(server6.addr())), "{r:?}");
    assert_eq!(
        server6.wait_for(1, TIMEOUT).expect("reached")[0].peer.ip(),
        IpAddr::V6(world.net.pod_v6())
    );
    assert!(proxy::accepted(&proxy.events().expect("log")).is_empty());
}

#[test]
fn unregistered_pods_and_the_host_are_untouched_with_a_shared_attachment() {
    // Both pods live under one parent cgroup that carries the shared attachment: only the
    // registered pod's netns cookie selects its sockets.
    let parent = CgroupGuard::new().expect("parent cgroup");
    let h = AgentHarness::new(Some(parent.path()));
    let meshed = World::new();
    let other = World::new();
    let meshed_pod_cg = CgroupGuard::new_under(parent.path()).expect("pod cgroup");
    let other_pod_cg = CgroupGuard::new_under(parent.path()).expect("pod cgroup");
    let record = h.register(&meshed.net.pod, LinkerdConfig::default(), false);
    assert!(
        matches!(record.attachment, Attachment::Shared { .. }),
        "{record:?}"
    );

    let placed = |w: &World, cg: &CgroupGuard, uid| {
        let p = w.net.pod.container(uid).cgroup(cg);
        run_client(
            &p,
            &ClientOptions::new(w.server.addr()).send("hello\n"),
            TIMEOUT,
        )
        .expect("client")
    };
    let proxy = TestProxy::start(
        &meshed.net.pod.container(PROXY_UID).cgroup(&meshed_pod_cg),
        &proxy::Options::new(),
    )
    .expect("proxy");
    let r = placed(&meshed, &meshed_pod_cg, APP_UID);
    assert_eq!(r.succeeded, 1, "{r:?}");
    assert_eq!(proxied(&proxy, 1)[0].1, meshed.server.addr());
    // Through the shared attachment too, the meshed app sees its pod's address as its own.
    let (app_side, _, _) = accepted_sockets(&proxy, 1)[0];
    assert_eq!(
        r.local,
        Some(sock(meshed.net.pod_v4(), app_side.port())),
        "{r:?}"
    );

    let other_proxy = TestProxy::start(
        &other.net.pod.container(PROXY_UID).cgroup(&other_pod_cg),
        &proxy::Options::new(),
    )
    .expect("proxy");
    let r = placed(&other, &other_pod_cg, APP_UID);
    assert_direct(&other, &other_proxy, &r, 0, 0);
    let seen = other.server.wait_for(1, TIMEOUT).expect("server reached");
    assert_eq!(
        r.local,
        Some(seen[0].peer),
        "the unmeshed pod's own answer: {r:?}"
    );

    // The host (this process, root netns, outside the pods' cgroups) is untouched too.
    let host = EchoServer::bind(sock(Ipv4Addr::new(127, 0, 0, 1), 0), "host").expect("host server");
    let mut s = std::net::TcpStream::connect(host.addr()).expect("host connect");
    assert_eq!(s.peer_addr().expect("peer"), host.addr());
    use std::io::Write;
    let _ = s.write_all(b"x\n");
    drop(s);
    host.wait_for(1, TIMEOUT).expect("host server reached");
    drop((proxy, other_proxy));
}

#[test]
fn validator_reaches_itself() {
    let h = AgentHarness::new(None);
    let world = World::new();
    h.register(&world.net.pod, LinkerdConfig::default(), true);
    // As linkerd-network-validator does: UID 65534, listen on 0.0.0.0:4140, dial an address
    // with no route out of the netns.
    let mut opts = ClientOptions::new(sock(Ipv4Addr::new(192, 0, 2, 2), 1404));
    opts.listen = Some(sock(Ipv4Addr::UNSPECIFIED, 4140));
    let r = run_client(&world.net.pod.container(65534), &opts, TIMEOUT).expect("validator");
    let accepted = r
        .accepted
        .clone()
        .unwrap_or_else(|| panic!("validator accepted nothing: {r:?}"));
    assert!(accepted.reached_self, "{r:?}");
}

#[test]
fn redirection_survives_the_agent_and_unregister_leaves_nothing() {
    let mut h = AgentHarness::new(None);
    let world = World::new();
    let record = h.register(&world.net.pod, LinkerdConfig::default(), true);
    let proxy = world.proxy(false);
    h.kill();
    // Agent gone: the pinned links and maps keep redirecting.
    let r = world.connect(APP_UID, world.server.addr());
    assert_eq!(r.succeeded, 1, "{r:?}");
    assert_eq!(proxied(&proxy, 1)[0].1, world.server.addr());
    // A new agent adopts the pod: CHECK passes, unregister removes every trace.
    h.start_again();
    h.agent()
        .check(&record.id)
        .expect("adopted registration is in force");
    let link_dir = h.agent().link_dir(&record).expect("per-pod link dir");
    assert!(h.agent().unregister(&record.id).expect("unregister"));
    assert!(
        !link_dir.exists(),
        "links still pinned at {}",
        link_dir.display()
    );
    let tree = std::process::Command::new("bpftool")
        .args(["cgroup", "show"])
        .arg(world.net.pod.cgroup.path())
        .output()
        .expect("bpftool");
    assert!(
        String::from_utf8_lossy(&tree.stdout).trim().is_empty(),
        "programs still attached"
    );
    let maps = h.maps();
    let view = maps.view(record.netns_cookie);
    assert!(
        view.config.is_none()
            && view.port_blocks == 0
            && view.addrs.is_empty()
            && view.ips.is_empty(),
        "{view:?}"
    );
    assert!(
        maps.pod_stats.get(&record.netns_cookie, 0).is_err(),
        "stats entry left"
    );
    assert!(h.agent().pods().expect("registry").is_empty());
    // And the pod is no longer redirected.
    let r = world.connect(APP_UID, world.server.addr());
    assert_direct(&world, &proxy, &r, 1, 1);
}

#[test]
fn original_destination_maps_are_cleaned_after_many_connections() {
    let h = AgentHarness::new(None);
    let world = World::new();
    let record = h.register(&world.net.pod, LinkerdConfig::default(), true);
    let proxy = world.proxy(false);
    let mut opts = ClientOptions::new(world.server.addr()).send("x\n");
    opts.count = 10_000;
    let r = run_client(
        &world.net.pod.container(APP_UID),
        &opts,
        // A hang guard: 10,000 connections take seconds on the host and minutes in an emulated
        // guest on a busy machine (300 s was not enough on 6.1 there).
        Duration::from_secs(600),
    )
    .expect("client");
    assert_eq!(
        (r.succeeded, r.failed),
        (10_000, 0),
        "{:?}",
        r.first_failure
    );
    let events = proxy
        .log()
        .wait_for_finished(10_000, Duration::from_secs(60))
        .expect("proxy finished every connection");
    // The client counts a connection the proxy closed unanswered as a success: the proxy's
    // own log says whether every accepted socket got its original destination.
    let missed: Vec<_> = events
        .iter()
        .filter(|e| matches!(e, Event::OrigDstError { .. }))
        .collect();
    // Every connection is closed now: the maps must hold no entry for them.
    let deadline = Instant::now() + Duration::from_secs(10);
    let maps = h.maps();
    loop {
        let (socks, conns) = maps.orig_dst_entries();
        if (socks, conns) == (0, 0) {
            break;
        }
        if Instant::now() >= deadline {
            let left: Vec<String> = maps
                .conn_dst
                .iter()
                .filter_map(Result::ok)
                .map(|(k, v)| {
                    format!(
                        "{}:{} (proxy port {}) -> {}:{}",
                        maps::ip_of(k.addr),
                        k.port,
                        k.proxy_port,
                        maps::ip_of(v.addr),
                        u16::from_be(v.port_be)
                    )
                })
                .collect();
            panic!(
                "entries left after all connections closed: {socks} socket, {conns} connection \
                 {left:?}; the proxy missed {} original destinations: {missed:?}",
                missed.len()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        missed.is_empty(),
        "SO_ORIGINAL_DST failed for {} connections: {missed:?}",
        missed.len()
    );
    assert_eq!(maps.stats(record.netns_cookie).out_redirected, 10_000);
}

/// Apps that connect, send and close at once, the proxy accepting `delay` later: every
/// accepted socket still answers `SO_ORIGINAL_DST` (the apps' sockets closed long before),
/// the answer lives in the accepted socket's storage, not in the 4-tuple map, and it is gone
/// once the proxy closed the socket.
fn late_accept(delay: Duration) {
    const N: u64 = 20;
    let h = AgentHarness::new(None);
    let world = World::new();
    let record = h.register(&world.net.pod, LinkerdConfig::default(), true);
    let proxy = world
        .net
        .pod
        .start_proxy(&proxy::Options {
            // It accepts only when the test says so: the queue is inspected first, however
            // long the clients took on this machine.
            accept_gate: Some("accept-gate".into()),
            ..proxy::Options::new()
        })
        .expect("start the proxy");
    let mut opts = ClientOptions::new(world.server.addr()).send("hello\n");
    opts.no_read = true;
    opts.count = N;
    let r = run_client(&world.net.pod.container(APP_UID), &opts, TIMEOUT).expect("clients");
    assert_eq!((r.succeeded, r.failed), (N, 0), "{r:?}");
    h.check_late_accept(
        &world.net.pod,
        &proxy,
        record.netns_cookie,
        N,
        sock(Ipv4Addr::LOCALHOST, 4140),
        (sock(Ipv4Addr::LOCALHOST, 4140), world.server.addr()),
        delay,
    );
}

#[test]
fn original_destination_survives_a_300ms_late_accept() {
    late_accept(Duration::from_millis(300));
}

#[test]
fn original_destination_survives_a_5s_late_accept() {
    late_accept(Duration::from_secs(5));
}

/// With conntrack active in the pod's netns (a nat REDIRECT rule on an unrelated port), the
/// kernel answers `SO_ORIGINAL_DST` itself with the proxy's own address: ours must win.
#[test]
fn our_original_destination_wins_over_conntrack() {
    let h = AgentHarness::new(None);
    let world = World::new();
    let record = h.register(&world.net.pod, LinkerdConfig::default(), true);
    world
        .net
        .pod
        .netns
        .exec(
            "iptables",
            [
                "-t",
                "nat",
                "-A",
                "OUTPUT",
                "-p",
                "tcp",
                "--dport",
                "7",
                "-j",
                "REDIRECT",
                "--to-ports",
                "4140",
            ],
        )
        .expect("a nat rule in the pod's netns");
    let proxy = world.proxy(false);
    for n in 1..=3 {
        let report = world.connect(APP_UID, world.server.addr());
        assert_eq!(report.succeeded, 1, "{report:?}");
        assert_eq!(
            proxied(&proxy, n)[n - 1],
            (sock(Ipv4Addr::LOCALHOST, 4140), world.server.addr())
        );
    }
    // conntrack was in play: it tracked the connections.
    let count = world
        .net
        .pod
        .netns
        .exec("cat", ["/proc/sys/net/netfilter/nf_conntrack_count"])
        .expect("conntrack count");
    assert_ne!(count.trim(), "0", "conntrack is not active in the pod");
    assert_eq!(h.maps().stats(record.netns_cookie).orig_dst_answered, 3);
}

/// A redirected app socket keeps its original destination in its own storage (`l5d_app_dst`),
/// not in a node-wide map: while its connection is open the socket holds storage, and neither
/// `l5d_sock_dst` nor `l5d_conn_dst` holds an entry (no insert, no delete, no state callback
/// per connection); the storage goes with the socket.
#[test]
fn an_app_sockets_original_destination_lives_in_its_storage() {
    let h = AgentHarness::new(None);
    let world = World::new();
    h.register(&world.net.pod, LinkerdConfig::default(), true);
    let proxy = world.proxy(false);
    let dst = world.server.addr();
    // An app that connects and holds the connection open.
    let script = format!(
        "import socket, time\ns = socket.create_connection(('{}', {}))\ntime.sleep(60)\n",
        dst.ip(),
        dst.port()
    );
    let app = world
        .net
        .pod
        .container(APP_UID)
        .spawn(std::process::Command::new("python3").args(["-c", &script]))
        .expect("app");
    let storage = h.config().pin_root.join("maps").join(names::MAP_APP_DST);
    let deadline = Instant::now() + TIMEOUT;
    let held = loop {
        let held = diag::sockets_with_storage(&world.net.pod.netns, &storage).expect("sock_diag");
        if !held.is_empty() || Instant::now() > deadline {
            break held;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(held.len(), 1, "sockets with app storage: {held:?}");
    assert_eq!(
        held[0].1,
        sock(Ipv4Addr::LOCALHOST, 4140),
        "the app's socket"
    );
    proxy
        .log()
        .wait_for_accepted(1, TIMEOUT)
        .expect("proxy accepted");
    assert_eq!(
        h.maps().orig_dst_entries(),
        (0, 0),
        "no socket-keyed or 4-tuple entry for a live connection"
    );
    drop(app);
    diag::wait_until_no_socket_holds_storage(&world.net.pod.netns, &storage, TIMEOUT);
}
