//! Inbound redirection against the real kernel (root required): connections arriving at a
//! registered pod from another netns are handed to the proxy's inbound listener (4143) by the
//! pod's `sk_lookup` program, the proxy learns the dialled address with `SO_ORIGINAL_DST`,
//! forwards to the app as UID 2102 without being captured again, and with no proxy listening
//! the connection is refused.
//!
//! Run: `cargo test -p linkerd-cni-tests --test inbound -- --test-threads=1`

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    time::Duration,
};

use linkerd_cni_common::{kernel::SkLookupVariant, names, paths};
use linkerd_cni_proto::config::{LinkerdConfig, PortRange};
use linkerd_cni_sys::bpf;
use linkerd_cni_tests::{
    AgentHarness, Bridge, EchoServer, IfAddr, NetnsGuard, Placement, Pod, PodAndPeer, TestProxy,
    client::{Options as ClientOptions, Report, run_client},
    proxy::{self, Event, PROXY_UID},
};

const TIMEOUT: Duration = Duration::from_secs(20);
const APP_UID: u32 = 1000;
const ECONNREFUSED: i32 = 111;

fn sock(ip: impl Into<IpAddr>, port: u16) -> SocketAddr {
    SocketAddr::new(ip.into(), port)
}

fn proxy_in(pod: &Pod, ipv6: bool) -> TestProxy {
    pod.start_proxy(&proxy::Options {
        ipv6,
        ..proxy::Options::new()
    })
    .expect("start the proxy as UID 2102")
}

fn accepted(proxy: &TestProxy) -> Vec<(SocketAddr, SocketAddr)> {
    proxy::accepted(&proxy.events().expect("proxy log"))
}

fn wait_accepted(proxy: &TestProxy, n: usize) -> Vec<(SocketAddr, SocketAddr)> {
    proxy
        .log()
        .wait_for(TIMEOUT, |events| {
            events
                .iter()
                .filter(|e| matches!(e, Event::Accepted { .. }))
                .count()
                >= n
        })
        .expect("proxy accepted");
    accepted(proxy)
}

fn request(from: &NetnsGuard, target: SocketAddr) -> Report {
    let placement = linkerd_cni_tests::Placement::new().netns(from).uid(APP_UID);
    run_client(
        &placement,
        &ClientOptions::new(target).send("hello\n"),
        TIMEOUT,
    )
    .expect("run the client")
}

/// A pod with its app listening on `ports` (on the pod's IPv4 address) and a peer netns.
struct World {
    net: PodAndPeer,
    apps: Vec<EchoServer>,
}

impl World {
    fn new(ports: &[u16]) -> Self {
        let net = PodAndPeer::new().expect("pod, peer and veth");
        let apps = ports
            .iter()
            .map(|p| {
                EchoServer::bind_in(&net.pod.netns, sock(Ipv4Addr::UNSPECIFIED, *p), "app")
                    .expect("app")
            })
            .collect();
        World { net, apps }
    }

    fn app(&self, port: u16) -> &EchoServer {
        self.apps
            .iter()
            .find(|a| a.addr().port() == port)
            .expect("app on that port")
    }

    /// Connects from the peer to the pod's `port`, expecting success.
    fn call(&self, port: u16) -> Report {
        let r = request(&self.net.peer, sock(self.net.pod_v4(), port));
        assert_eq!(r.succeeded, 1, "request to pod port {port}: {r:?}");
        r
    }

    /// The app on `port` got its `n`th connection from `expected` (the proxy forwards from the
    /// pod's own address; a direct connection comes from the peer).
    fn app_saw(&self, port: u16, n: usize, expected: IpAddr) {
        let got = self.app(port).wait_for(n, TIMEOUT).expect("app reached");
        assert_eq!(
            got[n - 1].peer.ip(),
            expected,
            "app on {port} saw {:?}",
            got[n - 1]
        );
    }
}

#[test]
fn inbound_goes_through_the_proxy_with_the_original_destination() {
    let h = AgentHarness::new(None);
    let w = World::new(&[8080]);
    let record = h.register(&w.net.pod, LinkerdConfig::default(), true);
    let proxy = proxy_in(&w.net.pod, false);
    let r = w.call(8080);
    assert!(
        r.received_matches(&w.app(8080).expected_reply(b"hello\n")),
        "{r:?}"
    );
    assert_eq!(
        wait_accepted(&proxy, 1),
        vec![(
            sock(Ipv4Addr::UNSPECIFIED, 4143),
            sock(w.net.pod_v4(), 8080)
        )]
    );
    // The proxy forwarded as UID 2102 to the pod IP: the app saw the pod itself, and that hop
    // was not captured again (one accepted connection only).
    w.app_saw(8080, 1, IpAddr::V4(w.net.pod_v4()));
    assert_eq!(accepted(&proxy).len(), 1);
    let stats = h.maps().stats(record.netns_cookie);
    assert_eq!(
        (stats.in_redirected, stats.orig_dst_answered),
        (1, 1),
        "{stats:?}"
    );
    assert_eq!(h.maps().view(record.netns_cookie).listener, (true, false));
}

#[test]
fn ignored_ports_and_redirect_list_and_ignored_sources() {
    let h = AgentHarness::new(None);
    let w = World::new(&[4191, 9050, 8080, 8081]);
    let config = LinkerdConfig {
        inbound_ports_to_ignore: vec![
            PortRange::single(4191),
            PortRange::single(4190),
            "9000-9100".parse().expect("range"),
        ],
        ..LinkerdConfig::default()
    };
    h.register(&w.net.pod, config, true);
    let proxy = proxy_in(&w.net.pod, false);
    let peer = IpAddr::V4(w.net.peer_v4());
    w.call(4191);
    w.app_saw(4191, 1, peer);
    w.call(9050);
    w.app_saw(9050, 1, peer);
    w.call(8081);
    w.app_saw(8081, 1, IpAddr::V4(w.net.pod_v4()));
    assert_eq!(
        wait_accepted(&proxy, 1).len(),
        1,
        "only 8081 went through the proxy"
    );

    // ports-to-redirect: only the listed ports go to the proxy.
    let h2 = AgentHarness::new(None);
    let w2 = World::new(&[8080, 8081]);
    h2.register(
        &w2.net.pod,
        LinkerdConfig {
            ports_to_redirect: vec![PortRange::single(8080)],
            ..Default::default()
        },
        true,
    );
    let proxy2 = proxy_in(&w2.net.pod, false);
    w2.call(8081);
    w2.app_saw(8081, 1, IpAddr::V4(w2.net.peer_v4()));
    w2.call(8080);
    w2.app_saw(8080, 1, IpAddr::V4(w2.net.pod_v4()));
    assert_eq!(
        wait_accepted(&proxy2, 1),
        vec![(
            sock(Ipv4Addr::UNSPECIFIED, 4143),
            sock(w2.net.pod_v4(), 8080)
        )]
    );

    // subnets-to-ignore: connections from those sources go straight to the app.
    let h3 = AgentHarness::new(None);
    let w3 = World::new(&[8080]);
    let subnet = format!("{}/32", w3.net.peer_v4()).parse().expect("cidr");
    h3.register(
        &w3.net.pod,
        LinkerdConfig {
            subnets_to_ignore: vec![subnet],
            ..Default::default()
        },
        true,
    );
    let proxy3 = proxy_in(&w3.net.pod, false);
    w3.call(8080);
    w3.app_saw(8080, 1, IpAddr::V4(w3.net.peer_v4()));
    assert!(accepted(&proxy3).is_empty());
}

#[test]
fn fail_closed_until_the_proxy_listens() {
    let h = AgentHarness::new(None);
    let w = World::new(&[8080]);
    let record = h.register(&w.net.pod, LinkerdConfig::default(), true);
    // The app listens, the proxy does not: refused, never delivered to the app.
    let r = request(&w.net.peer, sock(w.net.pod_v4(), 8080));
    assert_eq!(r.connect.errno, Some(ECONNREFUSED), "{r:?}");
    assert!(w.app(8080).received().is_empty(), "the app must not see it");
    assert_eq!(h.maps().view(record.netns_cookie).listener, (false, false));
    assert_eq!(h.maps().stats(record.netns_cookie).in_refused, 1);
    // The proxy starts: the next connection goes through it, with no action by the agent.
    let proxy = proxy_in(&w.net.pod, false);
    w.call(8080);
    assert_eq!(wait_accepted(&proxy, 1)[0].1, sock(w.net.pod_v4(), 8080));
    // And when it stops, refused again.
    drop(proxy);
    let r = request(&w.net.peer, sock(w.net.pod_v4(), 8080));
    assert_eq!(r.connect.errno, Some(ECONNREFUSED), "{r:?}");
}

#[test]
fn proxy_to_app_over_pod_ip_and_localhost_is_not_captured() {
    let h = AgentHarness::new(None);
    let w = World::new(&[8080]);
    h.register(&w.net.pod, LinkerdConfig::default(), true);
    let proxy = proxy_in(&w.net.pod, false);
    for target in [sock(w.net.pod_v4(), 8080), sock(Ipv4Addr::LOCALHOST, 8080)] {
        let r = run_client(
            &w.net.pod.container(PROXY_UID),
            &ClientOptions::new(target).send("hi\n"),
            TIMEOUT,
        )
        .expect("client as the proxy");
        assert_eq!((r.succeeded, r.peer), (1, Some(target)), "{r:?}");
    }
    w.app(8080).wait_for(2, TIMEOUT).expect("the app got both");
    assert!(accepted(&proxy).is_empty(), "no loop through the proxy");
}

#[test]
fn ipv6_inbound_and_outbound() {
    let h = AgentHarness::new(None);
    let net = PodAndPeer::new().expect("pod and peer");
    let app = EchoServer::bind_in(&net.pod.netns, sock(Ipv6Addr::UNSPECIFIED, 8080), "app6")
        .expect("app");
    let remote =
        EchoServer::bind_in(&net.peer, sock(net.peer_v6(), 9090), "remote6").expect("remote");
    h.register(
        &net.pod,
        LinkerdConfig {
            ipv6: true,
            ..Default::default()
        },
        true,
    );
    let proxy = proxy_in(&net.pod, true);
    let r = request(&net.peer, sock(net.pod_v6(), 8080));
    assert_eq!(r.succeeded, 1, "{r:?}");
    let got = app.wait_for(1, TIMEOUT).expect("app reached");
    assert_eq!(
        got[0].peer.ip(),
        IpAddr::V6(net.pod_v6()),
        "forwarded by the proxy"
    );
    let r = run_client(
        &net.pod.container(APP_UID),
        &ClientOptions::new(remote.addr()).send("x\n"),
        TIMEOUT,
    )
    .expect("outbound");
    assert_eq!((r.succeeded, r.peer), (1, Some(remote.addr())), "{r:?}");
    assert_eq!(
        wait_accepted(&proxy, 2),
        vec![
            (sock(Ipv6Addr::UNSPECIFIED, 4143), sock(net.pod_v6(), 8080)),
            (sock(Ipv6Addr::LOCALHOST, 4140), remote.addr()),
        ]
    );
}

#[test]
fn meshed_pods_on_one_node_traverse_both_proxies() {
    let h = AgentHarness::new(None);
    let node = NetnsGuard::new().expect("node netns");
    let mut bridge = Bridge::create(
        &node,
        "10.245.0.1/24".parse().expect("literal"),
        "fd00:245::1/64".parse().expect("literal"),
    )
    .expect("bridge");
    let client = Pod::new().expect("client pod");
    let server = Pod::new().expect("server pod");
    let _client_port = bridge.attach(&client.netns).expect("attach client");
    let server_port = bridge.attach(&server.netns).expect("attach server");
    h.register(&client, LinkerdConfig::default(), true);
    h.register(&server, LinkerdConfig::default(), true);
    let app = EchoServer::bind_in(
        &server.netns,
        sock(Ipv4Addr::UNSPECIFIED, 8080),
        "server-app",
    )
    .expect("app");
    let client_proxy = proxy_in(&client, false);
    let server_proxy = proxy_in(&server, false);
    let target = sock(server_port.v4(), 8080);
    let r = run_client(
        &client.container(APP_UID),
        &ClientOptions::new(target).send("hello\n"),
        TIMEOUT,
    )
    .expect("client");
    let detail = || {
        format!(
            "{r:?}\nclient proxy: {:?}\nserver proxy: {:?}",
            client_proxy.events(),
            server_proxy.events()
        )
    };
    assert_eq!((r.succeeded, r.peer), (1, Some(target)), "{}", detail());
    assert!(
        r.received_matches(&app.expected_reply(b"hello\n")),
        "{}",
        detail()
    );
    assert_eq!(
        wait_accepted(&client_proxy, 1),
        vec![(sock(Ipv4Addr::LOCALHOST, 4140), target)]
    );
    assert_eq!(
        wait_accepted(&server_proxy, 1),
        vec![(sock(Ipv4Addr::UNSPECIFIED, 4143), target)]
    );
    assert_eq!(
        app.wait_for(1, TIMEOUT).expect("app")[0].peer.ip(),
        IpAddr::V4(server_port.v4())
    );
}

/// An address added to the pod after ADD (Multus, SLAAC, another plugin) is the pod's too:
/// refused while the proxy does not listen, then through the proxy with that address as
/// `SO_ORIGINAL_DST`; the app never sees the connection directly.
#[test]
fn an_address_added_after_add_goes_through_the_proxy() {
    let h = AgentHarness::new(None);
    let w = World::new(&[8080]);
    let record = h.register(&w.net.pod, LinkerdConfig::default(), true);
    let extra = Ipv4Addr::new(10, 251, 0, 99);
    linkerd_cni_tests::link::add_address(
        w.net.pod.netns.name(),
        w.net.veth.a_ifname(),
        linkerd_cni_tests::IfAddr::new(extra, 32),
    )
    .expect("add an address in the pod");
    linkerd_cni_tests::link::add_route(&w.net.peer, "10.251.0.99/32", w.net.pod_v4().into())
        .expect("route to it from the peer");

    let r = request(&w.net.peer, sock(extra, 8080));
    assert_eq!(r.connect.errno, Some(ECONNREFUSED), "no listener: {r:?}");
    assert!(w.app(8080).received().is_empty(), "the app must not see it");

    let proxy = proxy_in(&w.net.pod, false);
    for n in 1..=3 {
        let r = request(&w.net.peer, sock(extra, 8080));
        assert_eq!(r.succeeded, 1, "{r:?}");
        // The proxy forwarded from the pod itself, never the peer directly.
        w.app_saw(8080, n, IpAddr::V4(extra));
    }
    assert_eq!(
        wait_accepted(&proxy, 3),
        vec![(sock(Ipv4Addr::UNSPECIFIED, 4143), sock(extra, 8080)); 3]
    );
    assert!(
        w.app(8080)
            .received()
            .iter()
            .all(|c| c.peer.ip() != IpAddr::V4(w.net.peer_v4())),
        "the app saw the peer directly: {:?}",
        w.app(8080).received()
    );
    let stats = h.maps().stats(record.netns_cookie);
    assert_eq!((stats.in_redirected, stats.in_refused), (3, 1), "{stats:?}");
}

/// Clients that connect, send and close at once, the proxy accepting `delay` later: every
/// accepted socket still answers `SO_ORIGINAL_DST`, the answer lives in the accepted socket's
/// storage (not in the 4-tuple map), and it is gone once the proxy closed the socket.
fn late_accept(delay: Duration) {
    const N: u64 = 20;
    let h = AgentHarness::new(None);
    let w = World::new(&[8080]);
    let record = h.register(&w.net.pod, LinkerdConfig::default(), true);
    let proxy = w
        .net
        .pod
        .start_proxy(&proxy::Options {
            // It accepts only when the test says so: the queue is inspected first, however
            // long the clients took on this machine.
            accept_gate: Some("accept-gate".into()),
            ..proxy::Options::new()
        })
        .expect("start the proxy");
    let mut opts = ClientOptions::new(sock(w.net.pod_v4(), 8080)).send("hello\n");
    opts.no_read = true;
    opts.count = N;
    let r = run_client(&w.net.remote(APP_UID), &opts, TIMEOUT).expect("clients");
    assert_eq!((r.succeeded, r.failed), (N, 0), "{r:?}");
    h.check_late_accept(
        &w.net.pod,
        &proxy,
        record.netns_cookie,
        N,
        sock(w.net.pod_v4(), 8080),
        (
            sock(Ipv4Addr::UNSPECIFIED, 4143),
            sock(w.net.pod_v4(), 8080),
        ),
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

/// The id of the program the pod's inbound link runs (its stub).
fn stub_of(h: &AgentHarness, record: &linkerd_cni_agent::agent::registry::PodRecord) -> u32 {
    let link_dir = h.agent().link_dir(record).expect("per-pod link dir");
    let link = linkerd_cni_sys::bpf::obj_get(&link_dir.join(names::PROG_SK_LOOKUP))
        .expect("pinned netns link");
    linkerd_cni_sys::bpf::link_info(&link)
        .expect("link info")
        .prog_id
}

/// A restart (crash, upgrade of the same layout) keeps every pod's stub: it loads and frees
/// no program per pod, so a node of thousands of pods does not flood the kernel with program
/// frees while programs load (a mass free during loads has deadlocked the BPF JIT allocator).
/// The kept stubs reach the restarted agent's shared program.
#[test]
fn a_restart_keeps_every_pods_stub() {
    const PODS: usize = 100;
    let mut h = AgentHarness::new(None);
    let pods: Vec<Pod> = (0..PODS).map(|_| Pod::new().expect("pod")).collect();
    let records: Vec<_> = pods
        .iter()
        .map(|pod| h.register(pod, LinkerdConfig::default(), true))
        .collect();
    let before: Vec<u32> = records.iter().map(|r| stub_of(&h, r)).collect();
    let shared_program = |h: &AgentHarness| {
        linkerd_cni_tests::layout::pinned_programs(&h.config().pin_root).expect("pinned programs")
            [names::PROG_SK_LOOKUP]
    };
    let shared_before = shared_program(&h);
    h.kill();
    h.start_again();
    let after: Vec<u32> = records.iter().map(|r| stub_of(&h, r)).collect();
    assert_eq!(after, before, "every pod kept its stub");
    assert_ne!(
        shared_program(&h),
        shared_before,
        "the restarted agent loaded its own shared program"
    );
    for r in &records {
        h.agent().check(&r.id).expect("in force after the restart");
    }
    // And the kept stubs reach the new shared program: a connection into one of the pods
    // goes to its proxy.
    let w = World::new(&[8080]);
    let record = h.register(&w.net.pod, LinkerdConfig::default(), true);
    let proxy = proxy_in(&w.net.pod, false);
    let stub = stub_of(&h, &record);
    h.kill();
    h.start_again();
    assert_eq!(stub_of(&h, &record), stub);
    w.call(8080);
    assert_eq!(wait_accepted(&proxy, 1).len(), 1, "through the kept stub");
}

/// The per-netns stub outlives the agent (pinned link) and reaches whichever shared program
/// the running agent installed; unregistering removes it from the kernel.
#[test]
fn inbound_survives_the_agent_and_unregister_removes_the_stub() {
    let mut h = AgentHarness::new(None);
    let w = World::new(&[8080]);
    let record = h.register(&w.net.pod, LinkerdConfig::default(), true);
    let proxy = proxy_in(&w.net.pod, false);
    let stub = stub_of(&h, &record);
    let bpftool_prog = |id: u32| {
        std::process::Command::new("bpftool")
            .args(["prog", "show", "id", &id.to_string()])
            .output()
            .expect("bpftool")
    };
    let shown = bpftool_prog(stub);
    assert!(
        String::from_utf8_lossy(&shown.stdout).contains(names::PROG_SK_LOOKUP_STUB),
        "{shown:?}"
    );

    h.kill();
    w.call(8080);
    assert_eq!(wait_accepted(&proxy, 1).len(), 1, "agent down");
    h.start_again();
    assert_eq!(
        stub_of(&h, &record),
        stub,
        "the restarted agent kept the pod's stub"
    );
    w.call(8080);
    assert_eq!(
        wait_accepted(&proxy, 2),
        vec![
            (
                sock(Ipv4Addr::UNSPECIFIED, 4143),
                sock(w.net.pod_v4(), 8080)
            );
            2
        ],
        "after restart, through the new shared program"
    );
    h.agent().check(&record.id).expect("adopted and in force");
    w.app_saw(8080, 2, IpAddr::V4(w.net.pod_v4()));

    assert!(h.agent().unregister(&record.id).expect("unregister"));
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while bpftool_prog(stub).status.success() {
        assert!(
            std::time::Instant::now() < deadline,
            "stub {stub} still loaded"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Unmeshed: straight to the app.
    w.call(8080);
    w.app_saw(8080, 3, IpAddr::V4(w.net.peer_v4()));
    assert_eq!(accepted(&proxy).len(), 2);
}

/// A TCP segment without SYN (an ACK, as a late retransmission or a stray segment of a
/// connection the pod already closed would be) sent from `from` to `to`: a raw IPv4 socket, the
/// kernel adds the IP header, the TCP checksum covers the pseudo-header.
fn send_stray_ack(peer: &NetnsGuard, from: SocketAddr, to: SocketAddr) {
    let (SocketAddr::V4(from), SocketAddr::V4(to)) = (from, to) else {
        panic!("IPv4 only");
    };
    let mut seg = [0u8; 20];
    seg[0..2].copy_from_slice(&from.port().to_be_bytes());
    seg[2..4].copy_from_slice(&to.port().to_be_bytes());
    seg[4..8].copy_from_slice(&0x1234_5678u32.to_be_bytes());
    seg[8..12].copy_from_slice(&0x0bad_cafeu32.to_be_bytes());
    seg[12] = 5 << 4; // data offset: 5 words
    seg[13] = 0x10; // ACK
    seg[14..16].copy_from_slice(&512u16.to_be_bytes());
    let mut sum: u32 = 0;
    let mut add = |b: &[u8]| {
        for pair in b.chunks(2) {
            sum += u32::from(u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]));
        }
    };
    add(&from.ip().octets());
    add(&to.ip().octets());
    add(&[0, 6, 0, 20]);
    add(&seg);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    seg[16..18].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    peer.run_in(|| {
        let raw = socket2::Socket::new(
            socket2::Domain::IPV4,
            socket2::Type::RAW,
            Some(socket2::Protocol::TCP),
        )
        .expect("raw socket");
        raw.send_to(&seg, &SocketAddr::V4(to).into())
            .expect("send the segment");
    })
    .expect("run in the peer netns");
}

/// A segment that opens no connection (no SYN) still runs the pod's `sk_lookup` (no socket
/// matches it, so the kernel looks for a listener) and is handed to the proxy's listener, which
/// answers it with a reset: it must leave nothing behind in the maps, where no socket would
/// ever remove it.
#[test]
fn a_segment_without_syn_leaves_no_connection_entry() {
    let h = AgentHarness::new(None);
    let w = World::new(&[8080]);
    h.register(&w.net.pod, LinkerdConfig::default(), true);
    let _proxy = proxy_in(&w.net.pod, false);
    // A real connection first: the inbound path works.
    w.call(8080);
    assert_eq!(h.maps().orig_dst_entries(), (0, 0), "after one connection");
    for port in [8080, 8081, 40_000] {
        send_stray_ack(
            &w.net.peer,
            sock(w.net.peer_v4(), 45_000),
            sock(w.net.pod_v4(), port),
        );
    }
    // The segments crossed the veth and were answered (or dropped) by now; give a busy
    // machine time, then look.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        h.maps().orig_dst_entries(),
        (0, 0),
        "4-tuple entries made by segments that opened no connection"
    );
}

/// Who accepted a connection to the pod's app port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Taker {
    /// The proxy's inbound listener (`sk_lookup` handed it over).
    Proxy,
    /// The app itself (`sk_lookup` let it pass).
    App,
}

/// Runs every case of the pod's own traffic and of traffic from elsewhere against a pod whose
/// agent runs the `sk_lookup` program `variant` (forced, whatever the kernel has), and says
/// who accepted each connection. The node's netns (the bridge's) stands for the host's.
fn sk_lookup_decisions(variant: SkLookupVariant) -> Vec<(&'static str, Taker)> {
    let mut config = AgentHarness::fresh_config();
    config.sk_lookup = Some(variant);
    let mut h = AgentHarness::stopped_on(config);
    h.start_again();
    // The program every stub tail-calls is pinned under l5d_sk_lookup: the one forced.
    let pinned = h
        .config()
        .pin_root
        .join(paths::PIN_PROGS)
        .join(names::PROG_SK_LOOKUP);
    let name = bpf::obj_get(&pinned)
        .and_then(bpf::prog_name)
        .expect("the pinned sk_lookup program's name");
    assert_eq!(name, variant.program());

    let node = NetnsGuard::new().expect("node netns");
    let mut bridge = Bridge::create(
        &node,
        "10.245.0.1/24".parse().expect("literal"),
        "fd00:245::1/64".parse().expect("literal"),
    )
    .expect("bridge");
    let pod = Pod::new().expect("pod");
    let other = Pod::new().expect("another pod");
    let port = bridge.attach(&pod.netns).expect("attach the pod");
    let other_port = bridge.attach(&other.netns).expect("attach the other pod");
    let dual = LinkerdConfig {
        ipv6: true,
        ..Default::default()
    };
    h.register(&pod, dual.clone(), true);
    h.register(&other, dual, true);
    // A second local address, added after ADD: not among the pod's known addresses.
    let extra = Ipv4Addr::new(10, 245, 0, 250);
    linkerd_cni_tests::link::add_address(
        pod.netns.name(),
        port.pod_ifname(),
        IfAddr::new(extra, 32),
    )
    .expect("a second address in the pod");
    let app = EchoServer::bind_in(&pod.netns, sock(Ipv6Addr::UNSPECIFIED, 8080), "app")
        .expect("the app, dual-stack");
    let proxy = proxy_in(&pod, true);
    let (me4, me6) = (port.v4(), port.v6());
    let from_node = || Placement::new().netns(&node).uid(APP_UID);
    // (case, from, bound to, to)
    let cases: Vec<(&'static str, Placement, Option<SocketAddr>, SocketAddr)> = vec![
        (
            "the pod to itself on its pod IP",
            pod.container(PROXY_UID),
            None,
            sock(me4, 8080),
        ),
        (
            "the pod to itself on 127.0.0.1",
            pod.container(PROXY_UID),
            None,
            sock(Ipv4Addr::LOCALHOST, 8080),
        ),
        (
            "the pod to itself on a second local address",
            pod.container(PROXY_UID),
            None,
            sock(extra, 8080),
        ),
        (
            "the pod from its pod IP to its second address",
            pod.container(PROXY_UID),
            Some(sock(me4, 0)),
            sock(extra, 8080),
        ),
        (
            "the pod from 127.0.0.1 to its pod IP",
            pod.container(PROXY_UID),
            Some(sock(Ipv4Addr::LOCALHOST, 0)),
            sock(me4, 8080),
        ),
        (
            "the pod to itself on its IPv6 pod IP",
            pod.container(PROXY_UID),
            None,
            sock(me6, 8080),
        ),
        (
            "the pod to itself on ::1",
            pod.container(PROXY_UID),
            None,
            sock(Ipv6Addr::LOCALHOST, 8080),
        ),
        (
            "the app to its own pod IP",
            pod.container(APP_UID),
            None,
            sock(me4, 8080),
        ),
        (
            "the app to 127.0.0.1",
            pod.container(APP_UID),
            None,
            sock(Ipv4Addr::LOCALHOST, 8080),
        ),
        (
            "another pod",
            other.container(PROXY_UID),
            None,
            sock(me4, 8080),
        ),
        (
            "another pod over IPv6",
            other.container(PROXY_UID),
            None,
            sock(me6, 8080),
        ),
        ("the host", from_node(), None, sock(me4, 8080)),
        (
            "the host to the second address",
            from_node(),
            None,
            sock(extra, 8080),
        ),
        ("the host over IPv6", from_node(), None, sock(me6, 8080)),
        // From an address the agent does not know (added after ADD) to another of the pod's:
        // neither program knows it for the pod's own (it arrives on the device holding the
        // pod IP, not on loopback), so both mesh it, as a connection from outside.
        (
            "the pod from its second address to its pod IP",
            pod.container(PROXY_UID),
            Some(sock(extra, 0)),
            sock(me4, 8080),
        ),
    ];
    let _ = other_port;
    let mut decided = Vec::new();
    for (n, (case, placement, bind, target)) in cases.into_iter().enumerate() {
        let before = accepted(&proxy).len();
        let options = ClientOptions {
            bind,
            ..ClientOptions::new(target).send("hi\n")
        };
        let r = run_client(&placement, &options, TIMEOUT).expect("run the client");
        assert_eq!(r.succeeded, 1, "{variant:?}, {case}: {r:?}");
        // Through the proxy or not, the app gets it: once it has, the proxy has logged its
        // accept if it took it.
        app.wait_for(n + 1, TIMEOUT)
            .unwrap_or_else(|e| panic!("{variant:?}, {case}: the app was not reached: {e}"));
        let taker = match accepted(&proxy).len() - before {
            0 => Taker::App,
            1 => Taker::Proxy,
            k => panic!("{variant:?}, {case}: the proxy accepted {k}"),
        };
        decided.push((case, taker));
    }
    decided
}

/// Both `sk_lookup` programs decide every case alike, on whatever kernel this runs on: the
/// address variant (the only one a kernel without `ingress_ifindex` in the `sk_lookup` context,
/// such as Ubuntu 22.04's 5.15, loads) passes exactly what the loopback-interface one passes.
/// The pod's own traffic from `127.0.0.1` or its pod IP to another of its addresses passes
/// (a connection to the pod IP arrives with the ingress device of the pod IP, not loopback:
/// before the source rule, the ifindex program handed `127.0.0.1` to pod IP to the proxy).
#[test]
fn both_sk_lookup_variants_decide_every_case_alike() {
    use Taker::{App, Proxy};
    let want = vec![
        ("the pod to itself on its pod IP", App),
        ("the pod to itself on 127.0.0.1", App),
        ("the pod to itself on a second local address", App),
        ("the pod from its pod IP to its second address", App),
        ("the pod from 127.0.0.1 to its pod IP", App),
        ("the pod to itself on its IPv6 pod IP", App),
        ("the pod to itself on ::1", App),
        ("the app to its own pod IP", App),
        ("the app to 127.0.0.1", App),
        ("another pod", Proxy),
        ("another pod over IPv6", Proxy),
        ("the host", Proxy),
        ("the host to the second address", Proxy),
        ("the host over IPv6", Proxy),
        ("the pod from its second address to its pod IP", Proxy),
    ];
    let ifindex = sk_lookup_decisions(SkLookupVariant::Ifindex);
    assert_eq!(ifindex, want, "the ifindex variant");
    let address = sk_lookup_decisions(SkLookupVariant::Address);
    assert_eq!(address, want, "the address variant");
}

/// The `sk_lookup` program pinned as `progs/l5d_sk_lookup`, by the kernel's name of it.
fn pinned_sk_lookup(h: &AgentHarness) -> String {
    let pinned = h
        .config()
        .pin_root
        .join(paths::PIN_PROGS)
        .join(names::PROG_SK_LOOKUP);
    bpf::obj_get(&pinned)
        .and_then(bpf::prog_name)
        .expect("the pinned sk_lookup program's name")
}

/// The choice of `sk_lookup` program is kept by a restart on the same terms, and follows the
/// kernel's answer when the agent is left to ask (a kernel upgraded past 5.17 gets the ifindex
/// program at the next start): each time every pod keeps its stub, which reaches the program
/// just loaded, and `inspect` names it.
#[test]
fn the_sk_lookup_choice_survives_restarts_and_follows_the_probes() {
    let mut config = AgentHarness::fresh_config();
    config.sk_lookup = Some(SkLookupVariant::Address);
    let mut h = AgentHarness::stopped_on(config);
    h.start_again();
    let w = World::new(&[8080]);
    let record = h.register(&w.net.pod, LinkerdConfig::default(), true);
    let proxy = proxy_in(&w.net.pod, false);
    let stub = stub_of(&h, &record);
    let (pin_root, state_dir) = (h.config().pin_root.clone(), h.config().state_dir.clone());
    let inspect =
        || linkerd_cni_agent::service::inspect::render(&pin_root, &state_dir).expect("inspect");
    let through_proxy = |n: usize| {
        w.call(8080);
        assert_eq!(wait_accepted(&proxy, n).len(), n, "through the proxy");
    };
    let own_traffic_passes = |n: usize| {
        let r = run_client(
            &w.net.pod.container(PROXY_UID),
            &ClientOptions {
                bind: Some(sock(Ipv4Addr::LOCALHOST, 0)),
                ..ClientOptions::new(sock(w.net.pod_v4(), 8080)).send("hi\n")
            },
            TIMEOUT,
        )
        .expect("client");
        assert_eq!(r.succeeded, 1, "{r:?}");
        assert_eq!(
            accepted(&proxy).len(),
            n,
            "127.0.0.1 to the pod IP is the pod's own"
        );
    };
    assert_eq!(pinned_sk_lookup(&h), names::PROG_SK_LOOKUP_BY_ADDR);
    let line = format!("sk_lookup program: {}", SkLookupVariant::Address);
    assert!(inspect().contains(&line), "{}", inspect());
    through_proxy(1);
    own_traffic_passes(1);

    h.kill();
    h.start_again();
    assert_eq!(
        pinned_sk_lookup(&h),
        names::PROG_SK_LOOKUP_BY_ADDR,
        "same terms, same choice"
    );
    assert_eq!(stub_of(&h, &record), stub, "the pod kept its stub");
    through_proxy(2);

    h.kill();
    h.config_mut().sk_lookup = None;
    h.start_again();
    let probed = linkerd_cni_sys::probe::Findings::probe().sk_lookup_variant();
    assert_eq!(pinned_sk_lookup(&h), probed.program(), "the probes' choice");
    let line = format!("sk_lookup program: {probed}");
    assert!(inspect().contains(&line), "{}", inspect());
    assert_eq!(stub_of(&h, &record), stub, "the pod kept its stub");
    through_proxy(3);
    own_traffic_passes(3);
}
