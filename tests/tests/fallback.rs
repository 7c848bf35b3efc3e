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
//!   inbound port and a skipped source subnet go direct;
//! - the same for IPv6 between two test netns (`ipv6: true`: outbound to `[::1]:4140` and
//!   inbound to 4143 with `IP6T_SO_ORIGINAL_DST` answering the dialled address, skipped ports
//!   direct), and IPv6 left alone in both directions without it (Linkerd's default);
//! - end to end, forced (`--mode=iptables`) and as the probes choose (`--mode=auto`: eBPF on
//!   the host, the fallback on 5.10, asserted as this test's own probes say): libcni runs the
//!   real plugin, the agent runs as a process and says its mode and why (`inspect`, the
//!   metric; the fallback pins nothing); a meshed client's request reaches the server through
//!   its proxy (which reads `SO_ORIGINAL_DST`), the proxy UID and a skipped outbound port go
//!   direct; a meshed server's proxy gets inbound connections on 4143 with their original
//!   destination, its admin port and a skipped source subnet go direct; CHECK passes, also
//!   after the agent's restart (which leaves the pods redirected), and in the fallback fails
//!   (100) once the table is deleted; DEL leaves the netns without our table;
//! - an agent restarted in the mode its kernel now gets (a node upgraded above the floor):
//!   running pods keep their rules until their DEL removes them, new pods get the new mode.
//!
//! Run: `cargo build --bins && cargo test -p linkerd-cni-tests --test fallback -- --test-threads=1`

use std::{
    io::{Read, Write},
    net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    time::Duration,
};

use linkerd_cni_common::{kernel::Mode, paths};
use linkerd_cni_plugin::nft;
use linkerd_cni_proto::config::{Cidr, LinkerdConfig, PortRange};
use linkerd_cni_sys::probe::{Choice as ModeChoice, Findings};
use linkerd_cni_tests::{
    EchoServer, NetnsGuard, Placement,
    client::{Options, Report, run_client},
    cniruntime::Verb,
    node::{NodeOptions, PodSpec, SimNode, SimPod, http_get, namespace_manifest},
    proxy::{self, INBOUND_PORT, OUTBOUND_PORT, PROXY_UID, TestProxy, original_dst},
};

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
    // A remote network reached through a non-loopback interface (a veth pair with both ends
    // in this netns: no packet leaves it; the guests' kernels have no /dev/net/tun), so that
    // connections to it are not "leaving through lo".
    ns.exec(
        "ip",
        ["link", "add", "v0", "type", "veth", "peer", "name", "v1"],
    )
    .expect("veth");
    ns.exec("ip", ["addr", "add", "10.9.0.2/24", "dev", "v0"])
        .expect("addr");
    ns.exec("ip", ["link", "set", "v0", "up"]).expect("up");
    ns.exec("ip", ["link", "set", "v1", "up"]).expect("up");
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

/// A listener in `ns` (its socket stays in that netns whichever thread uses it later).
fn listen_in(ns: &NetnsGuard, addr: SocketAddr) -> TcpListener {
    ns.run_in(move || listen(addr)).expect("in the netns")
}

/// A connection from `ns` to `to`, once the kernel completed its handshake (the listener's
/// backlog holds it: no `accept` is needed for `connect` to return).
fn connect_from(ns: &NetnsGuard, to: SocketAddr) -> TcpStream {
    ns.run_in(move || connect(to)).expect("in the netns")
}

/// A connection from `client`'s namespace to `to`, listened on in `server`'s, arrives there
/// from `source` itself: it went direct, not through a proxy.
fn reaches_directly(
    server: &NetnsGuard,
    client: &NetnsGuard,
    to: SocketAddr,
    source: std::net::IpAddr,
    what: &str,
) {
    let listener = listen_in(server, to);
    let _conn = connect_from(client, to);
    assert_eq!(waiting(&listener).map(|p| p.ip()), Some(source), "{what}");
}

/// The peer address of the one connection waiting on `l` (within 3 s), or `None`.
fn waiting(l: &TcpListener) -> Option<SocketAddr> {
    l.set_nonblocking(true).expect("non-blocking");
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    loop {
        match l.accept() {
            Ok((_, peer)) => return Some(peer),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if std::time::Instant::now() > deadline {
                    return None;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("accept: {e}"),
        }
    }
}

#[test]
fn ipv6_is_redirected_both_ways_when_enabled_and_left_alone_when_not() {
    use std::net::Ipv6Addr;
    // The pod's netns and a peer's, joined by a veth pair (addresses without duplicate
    // address detection, so they are usable at once).
    let pod = netns();
    let peer = netns();
    pod.exec(
        "ip",
        [
            "link",
            "add",
            "p0",
            "type",
            "veth",
            "peer",
            "name",
            "r0",
            "netns",
            peer.name(),
        ],
    )
    .expect("veth");
    pod.exec(
        "ip",
        ["-6", "addr", "add", "fd09::2/64", "dev", "p0", "nodad"],
    )
    .expect("pod addr");
    peer.exec(
        "ip",
        ["-6", "addr", "add", "fd09::1/64", "dev", "r0", "nodad"],
    )
    .expect("peer addr");
    pod.exec("ip", ["link", "set", "p0", "up"]).expect("up");
    peer.exec("ip", ["link", "set", "r0", "up"]).expect("up");
    let pod_ip = Ipv6Addr::new(0xfd09, 0, 0, 0, 0, 0, 0, 2);
    let peer_ip = Ipv6Addr::new(0xfd09, 0, 0, 0, 0, 0, 0, 1);
    let at = |ip: Ipv6Addr, port: u16| SocketAddr::from((ip, port));

    let v6 = LinkerdConfig {
        ipv6: true,
        outbound_ports_to_ignore: vec![PortRange::single(5432)],
        ..LinkerdConfig::default()
    };
    nft::apply(&open(&pod), &v6).unwrap_or_else(|e| panic!("writing the table: {e}"));
    // The proxy's ports as Linkerd's proxy binds them with IPv6: outbound on loopback (where
    // REDIRECT sends a locally made connection), inbound on every address.
    let outbound = listen_in(&pod, at(Ipv6Addr::LOCALHOST, OUTBOUND_PORT));
    let inbound = listen_in(&pod, at(Ipv6Addr::UNSPECIFIED, INBOUND_PORT));

    // Outbound: the app's connection to the peer (nothing listens there) reaches the proxy,
    // which reads the dialled address with IP6T_SO_ORIGINAL_DST.
    let dialled = at(peer_ip, 8080);
    let app = connect_from(&pod, dialled);
    assert_eq!(accept_original(&outbound), dialled, "outbound original dst");
    read_ok(app);
    // A skipped outbound port goes direct to the peer.
    reaches_directly(&peer, &pod, at(peer_ip, 5432), pod_ip.into(), "5432 direct");
    assert_eq!(waiting(&outbound), None, "5432 not proxied");

    // Inbound: the peer's connection to the pod reaches the inbound port with its dialled
    // address; the admin port (4191, ignored by default) goes direct.
    let dialled = at(pod_ip, 8080);
    let from_peer = connect_from(&peer, dialled);
    assert_eq!(accept_original(&inbound), dialled, "inbound original dst");
    read_ok(from_peer);
    reaches_directly(&pod, &peer, at(pod_ip, 4191), peer_ip.into(), "4191 direct");
    assert_eq!(waiting(&inbound), None, "4191 not proxied");

    // Without `ipv6: true` (Linkerd's default) IPv6 is not touched: both directions direct.
    let v4_only = LinkerdConfig {
        ipv6: false,
        ..v6.clone()
    };
    nft::apply(&open(&pod), &v4_only).unwrap_or_else(|e| panic!("replacing the table: {e}"));
    assert_eq!(
        nft::list(&open(&pod)).expect("listing"),
        nft::expected(&v4_only)
    );
    reaches_directly(
        &peer,
        &pod,
        at(peer_ip, 8081),
        pod_ip.into(),
        "outbound direct",
    );
    reaches_directly(
        &pod,
        &peer,
        at(pod_ip, 8082),
        peer_ip.into(),
        "inbound direct",
    );
    assert_eq!(waiting(&outbound), None, "nothing proxied outbound");
    assert_eq!(waiting(&inbound), None, "nothing proxied inbound");
}

// End to end: the real plugin through libcni, the agent as a process in forced
// `--mode=iptables`, the fake Kubernetes API, the forwarding test proxy as UID 2102.

const APP_UID: u32 = 1000;
const CLIENT_TIMEOUT: Duration = Duration::from_secs(15);

/// A node whose agent runs with `args` (`--mode iptables`, or none: `auto`).
fn node_with(args: &[&str]) -> SimNode {
    let opts = NodeOptions {
        agent_args: args.iter().map(|a| a.to_string()).collect(),
        ..NodeOptions::default()
    };
    SimNode::start(opts, &[namespace_manifest("shop", &[])])
        .unwrap_or_else(|e| panic!("starting the simulated node: {e}"))
}

const FORCED: &[&str] = &["--mode", "iptables"];

/// The mode `--mode=auto` gets on this kernel: what the probes say (eBPF on the host and the
/// guests above the floor, the fallback on 5.10).
fn probed() -> ModeChoice {
    Findings::probe()
        .choose(None)
        .unwrap_or_else(|e| panic!("the probes choose no mode: {e}"))
}

/// The client's report, after checking the server's answer came back.
fn request(placement: &Placement, server: &EchoServer, dst: SocketAddr, payload: &str) -> Report {
    let opts = Options::new(dst).send(payload);
    let report = run_client(placement, &opts, CLIENT_TIMEOUT)
        .unwrap_or_else(|e| panic!("client to {dst}: {e}"));
    assert!(
        report.received_matches(&server.expected_reply(payload.as_bytes())),
        "-> {dst}: the server's answer must come back: {report:?}"
    );
    report
}

/// Original destinations `proxy` accepted on its `port` listener.
fn accepted_on(proxy: &TestProxy, port: u16) -> Vec<SocketAddr> {
    let events = proxy
        .events()
        .unwrap_or_else(|e| panic!("proxy events: {e}"));
    proxy::accepted_on(&events, port)
}

/// The server saw the client's own socket: no proxy in between.
fn assert_direct(report: &Report, server: &EchoServer, before: usize) {
    let local = report.local.expect("the client's local address");
    let seen = server.received();
    assert!(
        seen[before..].iter().any(|r| r.peer == local),
        "the server must see the client socket {local} itself: {seen:?}"
    );
}

/// What the agent recorded of `pod`'s redirection, held to `mode`: in the fallback, Linkerd's
/// rules (`rules: true`, no attachment, no link, the pod's table as its config makes it); in
/// eBPF mode, programs (an attachment, its links, no table). Returns the recorded config.
fn recorded(node: &SimNode, pod: &SimPod, mode: Mode) -> LinkerdConfig {
    let st = node
        .state()
        .unwrap_or_else(|e| panic!("the agent's state: {e}"));
    let rec = st
        .record(&pod.container_id)
        .unwrap_or_else(|| panic!("no record of {}", pod.spec.name));
    let config: LinkerdConfig =
        serde_json::from_value(rec["config"].clone()).expect("the recorded config");
    let table = nft::list(&pod_netns(pod)).expect("listing");
    match mode {
        Mode::Iptables => {
            assert_eq!(rec["rules"], true, "recorded in the fallback: {rec}");
            assert_eq!(rec["attachment"]["mode"], "none", "no programs: {rec}");
            assert!(
                st.links_of(&pod.container_id).is_empty(),
                "no pinned links for a pod of the fallback"
            );
            assert_eq!(table, nft::expected(&config), "the pod's table");
        }
        Mode::Ebpf => {
            assert_ne!(rec["rules"], true, "recorded in eBPF mode: {rec}");
            assert_ne!(rec["attachment"]["mode"], "none", "programs: {rec}");
            assert!(
                !st.links_of(&pod.container_id).is_empty(),
                "pinned links for a pod of eBPF mode"
            );
            assert_eq!(table, [], "no table of ours in eBPF mode");
        }
    }
    config
}

fn pod_netns(pod: &SimPod) -> std::fs::File {
    open(pod.netns().expect("the pod's netns"))
}

fn check(node: &SimNode, pod: &SimPod) -> linkerd_cni_tests::cniruntime::Outcome {
    node.cni(Verb::Check, pod).expect("CHECK")
}

fn cni_code(out: &linkerd_cni_tests::cniruntime::Outcome) -> Option<u64> {
    serde_json::from_str::<serde_json::Value>(&out.stdout)
        .ok()?
        .get("code")?
        .as_u64()
}

/// The agent says which mode it runs and why: `inspect`'s mode line and the metric (what
/// chose it), and, in the fallback, nothing of eBPF under its pin root.
fn assert_mode_shown(node: &SimNode, choice: &ModeChoice) {
    let inspect = node.inspect().expect("inspect");
    assert!(
        inspect.starts_with(&format!("mode: {choice}\n")),
        "inspect says the mode and why ({choice}):\n{inspect}"
    );
    let health = node.agent().expect("the agent").health_addr();
    let (_, metrics) = http_get(health, "/metrics", Duration::from_secs(5)).expect("metrics");
    let chosen_by = match choice.forced {
        true => "flag",
        false => "probes",
    };
    let line = format!(
        "linkerd_cni_agent_mode{{mode=\"{}\",chosen_by=\"{chosen_by}\"}} 1",
        choice.mode.name()
    );
    assert!(metrics.contains(&line), "{line} in:\n{metrics}");
    if choice.mode == Mode::Iptables {
        for sub in paths::PIN_DIRS {
            let dir = node.pin_root().join(sub);
            assert!(
                !dir.exists(),
                "the fallback pins nothing, yet {} exists",
                dir.display()
            );
        }
    }
}

/// Meshed pods on `node`, whose agent runs `mode`, end to end: outbound through the client's
/// proxy (which reads `SO_ORIGINAL_DST`), the proxy UID and a skipped outbound port direct;
/// inbound to a meshed server's proxy on 4143 with the dialled address, its admin port and a
/// skipped source subnet direct; CHECK, also after the agent's restart (pods stay
/// redirected); in the fallback, CHECK fails (100) once the table is deleted; DEL leaves the
/// netns without our table and the registry without the pod.
fn meshes_pods_end_to_end(node: &mut SimNode, mode: Mode) {
    let (_server_pod, server) = node.echo_pod("shop", "server", 8080);
    let (_skipped_pod, skipped) = node.echo_pod("shop", "db", 5432);
    let dst = server.addr();

    // Outbound: a meshed client, 5432 skipped by its annotation.
    let client = node.added_pod(
        PodSpec::meshed("shop", "client").annotate("config.linkerd.io/skip-outbound-ports", "5432"),
    );
    let config = recorded(node, &client, mode);
    assert_eq!(config.outbound_ports_to_ignore, [PortRange::single(5432)]);
    let proxy = client.start_proxy().expect("the client's proxy");
    if mode == Mode::Iptables {
        let inspect = node.inspect().expect("inspect");
        assert!(
            inspect.contains("mode: iptables (no programs")
                && inspect.contains("outbound ports [5432]"),
            "inspect shows the pod's mode and rules' config:\n{inspect}"
        );
    }

    let before = server.received().len();
    request(
        &client.container(APP_UID),
        &server,
        dst,
        "through the proxy\n",
    );
    assert_eq!(accepted_on(&proxy, OUTBOUND_PORT), [dst], "SO_ORIGINAL_DST");
    let fresh: Vec<SocketAddr> = server.received()[before..].iter().map(|r| r.peer).collect();
    assert!(
        fresh
            .iter()
            .all(|p| p.ip() == std::net::IpAddr::V4(client.ip().expect("ip"))),
        "the proxy's upstream connection comes from the pod: {fresh:?}"
    );

    // The proxy's UID is exempt, and so is the skipped port.
    let before = server.received().len();
    let report = request(&client.container(PROXY_UID), &server, dst, "as 2102\n");
    assert_direct(&report, &server, before);
    let report = request(&client.container(APP_UID), &skipped, skipped.addr(), "db\n");
    assert_direct(&report, &skipped, 0);
    assert_eq!(
        accepted_on(&proxy, OUTBOUND_PORT),
        [dst],
        "nothing more proxied"
    );

    // Inbound: a meshed server whose proxy gets the connection on 4143 with the dialled
    // address; its admin port (4191, ignored by default) and one source subnet go direct.
    let (plain, _) = node.echo_pod("shop", "plain", 7000);
    let (other, _) = node.echo_pod("shop", "other", 7001);
    let skipped_source = format!("{}/32", other.ip().expect("ip"));
    let mut meshed_server = node
        .new_pod(
            PodSpec::meshed("shop", "api")
                .annotate("config.linkerd.io/skip-subnets", &skipped_source),
        )
        .expect("pod");
    node.add(&mut meshed_server)
        .expect("ADD of the meshed server");
    let config = recorded(node, &meshed_server, mode);
    assert_eq!(config.subnets_to_ignore.len(), 1);
    let api_ip = meshed_server.ip().expect("ip");
    let api = EchoServer::bind_in(
        meshed_server.netns().expect("netns"),
        SocketAddr::from((api_ip, 8080)),
        "api",
    )
    .expect("echo");
    let admin = EchoServer::bind_in(
        meshed_server.netns().expect("netns"),
        SocketAddr::from((api_ip, 4191)),
        "admin",
    )
    .expect("echo");
    let api_proxy = meshed_server.start_proxy().expect("the server's proxy");
    request(&plain.container(APP_UID), &api, api.addr(), "inbound\n");
    assert_eq!(accepted_on(&api_proxy, INBOUND_PORT), [api.addr()]);
    let report = request(&plain.container(APP_UID), &admin, admin.addr(), "admin\n");
    assert_direct(&report, &admin, 0);
    let before = api.received().len();
    let report = request(
        &other.container(APP_UID),
        &api,
        api.addr(),
        "skipped source\n",
    );
    assert_direct(&report, &api, before);
    assert_eq!(
        accepted_on(&api_proxy, INBOUND_PORT),
        [api.addr()],
        "one proxied"
    );

    // CHECK passes; the agent restarted keeps the pods redirected.
    assert!(
        check(node, &client).ok(),
        "CHECK: {}",
        check(node, &client).stdout
    );
    node.kill_agent();
    node.start_agent().expect("the agent again");
    request(
        &client.container(APP_UID),
        &server,
        dst,
        "after the restart\n",
    );
    assert_eq!(accepted_on(&proxy, OUTBOUND_PORT), [dst, dst]);
    let out = check(node, &client);
    assert!(out.ok(), "CHECK after the restart: {}", out.stdout);

    if mode == Mode::Iptables {
        // CHECK fails once the table is gone (not in force, 100).
        nft::remove(&pod_netns(&client)).expect("deleting the table behind the plugin's back");
        let out = check(node, &client);
        assert!(!out.ok(), "CHECK without the rules must fail");
        assert_eq!(cni_code(&out), Some(100), "{}", out.stdout);
    }

    // DEL leaves the netns without our table, the registry without the pod.
    let out = node.cni(Verb::Del, &meshed_server).expect("DEL");
    assert!(out.ok(), "DEL: {}", out.stdout);
    assert_eq!(nft::list(&pod_netns(&meshed_server)).expect("listing"), []);
    let st = node.state().expect("state");
    assert!(
        st.record(&meshed_server.container_id).is_none(),
        "unregistered"
    );
}

#[test]
fn forced_fallback_meshes_pods_with_linkerds_rules_end_to_end() {
    let mut node = node_with(FORCED);
    let forced = Findings::probe()
        .choose(Some(Mode::Iptables))
        .expect("iptables is forced on any kernel");
    assert_mode_shown(&node, &forced);
    meshes_pods_end_to_end(&mut node, Mode::Iptables);
}

/// `--mode=auto` (the default): the agent asks the kernel probes at start and runs what they
/// choose, which this test asks of the same probes: the eBPF data plane on the host and the
/// guests above the floor, the fallback on 5.10 (its reason naming the missing features); the
/// agent says which, and meshed pods are redirected end to end in it.
#[test]
fn the_probes_choose_the_mode_and_meshed_pods_are_redirected_in_it() {
    let choice = probed();
    eprintln!("this kernel gets: {choice}");
    if choice.mode == Mode::Iptables {
        let missing = Findings::probe().missing();
        assert!(!missing.is_empty(), "the fallback only below the floor");
        for f in missing {
            assert!(
                choice.reason.contains(f.name),
                "{} names {}",
                choice.reason,
                f.name
            );
        }
    }
    let mut node = node_with(&[]);
    assert_mode_shown(&node, &choice);
    meshes_pods_end_to_end(&mut node, choice.mode);
}

/// A meshed pod `name` added in `mode`, its proxy started, and one request of its app to
/// `server` that reached the server through that proxy.
fn meshed_pod_through_its_proxy(
    node: &SimNode,
    name: &str,
    mode: Mode,
    server: &EchoServer,
) -> (SimPod, TestProxy) {
    let pod = node.added_pod(PodSpec::meshed("shop", name));
    recorded(node, &pod, mode);
    let proxy = pod.start_proxy().expect("the pod's proxy");
    request(&pod.container(APP_UID), server, server.addr(), "before\n");
    assert_eq!(accepted_on(&proxy, OUTBOUND_PORT), [server.addr()]);
    (pod, proxy)
}

/// After the agent's restart, `pod` (of [`meshed_pod_through_its_proxy`]) is as it was: its
/// record and its `mode`'s state, a second request through its proxy, CHECK passing.
fn still_through_its_proxy(
    node: &SimNode,
    pod: &SimPod,
    mode: Mode,
    proxy: &TestProxy,
    server: &EchoServer,
) {
    let dst = server.addr();
    recorded(node, pod, mode);
    request(&pod.container(APP_UID), server, dst, "after\n");
    assert_eq!(accepted_on(proxy, OUTBOUND_PORT), [dst, dst]);
    let out = check(node, pod);
    assert!(
        out.ok(),
        "CHECK of {} after the restart: {}",
        pod.spec.name,
        out.stdout
    );
}

/// A node whose agent restarts in the mode its kernel now gets (`auto`; on the host, eBPF: a
/// node upgraded above the floor, or `--mode=iptables` dropped): a pod meshed by the fallback
/// keeps its rules and its record (`rules: true`) until it ends, still redirected and CHECK
/// passing, and its DEL removes its table; a new pod gets the new mode. Where the kernel is
/// still below the floor (5.10), the new agent runs the fallback too, and the same holds.
#[test]
fn running_pods_keep_their_rules_when_the_agent_restarts_in_another_mode() {
    let mut node = node_with(FORCED);
    let (_server_pod, server) = node.echo_pod("shop", "server", 8080);
    let dst = server.addr();
    let (old, old_proxy) = meshed_pod_through_its_proxy(&node, "old", Mode::Iptables, &server);

    let now = probed();
    node.kill_agent();
    node.set_agent_args(Vec::new());
    node.start_agent().expect("the agent in auto mode");
    assert_mode_shown(&node, &now);

    // The running pod: its rules and record as they were, still redirected, CHECK passes.
    still_through_its_proxy(&node, &old, Mode::Iptables, &old_proxy, &server);

    // A new pod: the mode the kernel gets now.
    let new = node.added_pod(PodSpec::meshed("shop", "new"));
    recorded(&node, &new, now.mode);
    let new_proxy = new.start_proxy().expect("the new pod's proxy");
    request(&new.container(APP_UID), &server, dst, "new\n");
    assert_eq!(accepted_on(&new_proxy, OUTBOUND_PORT), [dst]);

    // The old pod ends: its DEL removes its table and its record.
    let out = node.cni(Verb::Del, &old).expect("DEL");
    assert!(out.ok(), "DEL: {}", out.stdout);
    assert_eq!(nft::list(&pod_netns(&old)).expect("listing"), []);
    let st = node.state().expect("state");
    assert!(st.record(&old.container_id).is_none(), "unregistered");
    let out = node.cni(Verb::Del, &new).expect("DEL");
    assert!(out.ok(), "DEL of the new pod: {}", out.stdout);
}

/// The other way round: the agent of a node running eBPF restarts in the fallback
/// (`--mode=iptables` set on a running node). A pod the eBPF agent meshed keeps the
/// redirection it has, made by the programs, links and maps that agent left pinned: still
/// redirected, CHECK passing, and its DEL removes its record and links. A new pod gets
/// Linkerd's rules. Once those pins are gone too (the node's bpffs lost), the fallback agent
/// cannot show the old pod's redirection in force, and CHECK fails naming the node's mode.
/// On a kernel below the floor (the 5.10 guest) no agent can mesh a pod with eBPF: there the
/// test holds that `--mode=ebpf` is refused, so no such pod can exist.
#[test]
fn pods_the_ebpf_agent_meshed_keep_their_redirection_when_the_agent_restarts_in_the_fallback() {
    if probed().mode == Mode::Iptables {
        // One round of probes for both: the list and the refusal must be of the same answers.
        let findings = Findings::probe();
        let missing = findings.missing();
        let err = findings
            .choose(Some(Mode::Ebpf))
            .expect_err("--mode=ebpf below the floor is refused");
        for f in missing {
            assert!(err.contains(f.name), "{err} names {}", f.name);
        }
        return;
    }
    let mut node = node_with(&["--mode", "ebpf"]);
    let (_server_pod, server) = node.echo_pod("shop", "server", 8080);
    let (old, old_proxy) = meshed_pod_through_its_proxy(&node, "old", Mode::Ebpf, &server);

    node.kill_agent();
    node.set_agent_args(FORCED.iter().map(|a| a.to_string()).collect());
    node.start_agent().expect("the agent in the fallback");
    let forced = Findings::probe()
        .choose(Some(Mode::Iptables))
        .expect("--mode=iptables runs anywhere");
    assert_eq!(
        node.inspect()
            .expect("inspect")
            .lines()
            .next()
            .map(String::from),
        Some(format!("mode: {forced}")),
        "inspect says the node's mode"
    );

    // The old pod: its record and links as the eBPF agent left them, still redirected,
    // CHECK passes.
    still_through_its_proxy(&node, &old, Mode::Ebpf, &old_proxy, &server);

    // A new pod: Linkerd's rules.
    let new = node.added_pod(PodSpec::meshed("shop", "new"));
    recorded(&node, &new, Mode::Iptables);

    // The old pod ends: its DEL removes its record and its links.
    let out = node.cni(Verb::Del, &old).expect("DEL");
    assert!(out.ok(), "DEL: {}", out.stdout);
    let st = node.state().expect("state");
    assert!(st.record(&old.container_id).is_none(), "unregistered");
    assert!(
        st.links_of(&old.container_id).is_empty(),
        "its links unpinned"
    );

    // Another eBPF-meshed pod, then the pins are lost under a fallback agent: its CHECK
    // fails, naming why nothing can be in force.
    node.kill_agent();
    node.set_agent_args(vec!["--mode".into(), "ebpf".into()]);
    node.start_agent().expect("the agent in eBPF mode again");
    let lost = node.added_pod(PodSpec::meshed("shop", "lost"));
    recorded(&node, &lost, Mode::Ebpf);
    node.kill_agent();
    for sub in paths::PIN_DIRS {
        let dir = node.pin_root().join(sub);
        if dir.exists() {
            std::fs::remove_dir_all(&dir)
                .unwrap_or_else(|e| panic!("removing {}: {e}", dir.display()));
        }
    }
    node.set_agent_args(FORCED.iter().map(|a| a.to_string()).collect());
    node.start_agent().expect("the agent in the fallback");
    let out = check(&node, &lost);
    assert!(
        !out.ok(),
        "CHECK with no program left must fail: {}",
        out.stdout
    );
    assert!(
        out.stdout.contains(&forced.reason),
        "CHECK names the node's mode ({}): {}",
        forced.reason,
        out.stdout
    );
    for pod in [&new, &lost] {
        let out = node.cni(Verb::Del, pod).expect("DEL");
        assert!(out.ok(), "DEL of {}: {}", pod.spec.name, out.stdout);
    }
}
