//! Tests of the test-support library itself, against the real kernel (root required): netns,
//! veth and bridge links, cgroups, placed child processes, and the forwarding test proxy, whose
//! `SO_ORIGINAL_DST` handling is checked against the kernel's own answer (ENOENT without
//! redirection; the conntrack record under an iptables REDIRECT).
//!
//! Run: `cargo test -p linkerd-cni-tests --test support -- --test-threads=1`

use std::{
    io::{Read, Write},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream},
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use linkerd_cni_tests::{
    Bridge, CgroupGuard, ChildGuard, EchoServer, Error, NetnsGuard, Placement, PodAndPeer,
    TestProxy, UdpEcho, VethPair,
    cgroup::{cgroup_of, cgroup2_root},
    child::ids_of,
    client::{Options as ClientOptions, Report, run_client},
    iptables::Rules,
    link, netns,
    proxy::{self, CopyMode, Event, Options as ProxyOptions, PROXY_UID},
};

const TIMEOUT: Duration = Duration::from_secs(15);
const APP_UID: u32 = 1000;

fn sock(ip: impl Into<IpAddr>, port: u16) -> SocketAddr {
    SocketAddr::new(ip.into(), port)
}

/// The library's pod-and-peer topology with test shorthands.
struct World(PodAndPeer);

impl std::ops::Deref for World {
    type Target = PodAndPeer;

    fn deref(&self) -> &PodAndPeer {
        &self.0
    }
}

impl World {
    fn new() -> Self {
        World(PodAndPeer::new().expect("create pod, peer netns and veth"))
    }

    /// An application container of the pod, as `uid`.
    fn app(&self, uid: u32) -> Placement {
        self.pod.container(uid)
    }

    /// The proxy container of the pod (UID 2102).
    fn proxy(&self) -> TestProxy {
        let opts = ProxyOptions {
            ipv6: true,
            ..ProxyOptions::new()
        };
        self.pod
            .start_proxy(&opts)
            .expect("start the test proxy in the pod")
    }

    fn redirect_with_iptables(&self) {
        Rules {
            ipv6: true,
            ..Rules::default()
        }
        .install(&self.pod.netns)
        .expect("install iptables redirect rules in the pod");
    }
}

fn client(placement: &Placement, opts: &ClientOptions) -> Report {
    run_client(placement, opts, TIMEOUT)
        .unwrap_or_else(|e| panic!("test client {:?} failed: {e}", opts.to_args()))
}

fn accepted(events: &[Event]) -> Vec<(SocketAddr, SocketAddr, SocketAddr)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Accepted {
                listener,
                peer,
                orig_dst,
                ..
            } => Some((*listener, *peer, *orig_dst)),
            _ => None,
        })
        .collect()
}

#[test]
fn netns_is_listed_isolated_and_deleted_on_drop() {
    let ns = NetnsGuard::new().expect("create netns");
    let name = ns.name().to_string();
    let path = ns.path().to_path_buf();
    assert!(
        netns::list().expect("ip netns list").contains(&name),
        "{name} must be listed by `ip netns list`"
    );
    assert!(path.exists(), "{} must exist", path.display());

    let links = ns
        .exec("ip", ["-o", "link", "show"])
        .expect("ip link show in netns");
    let names: Vec<&str> = links.lines().filter_map(|l| l.split(": ").nth(1)).collect();
    assert_eq!(names, vec!["lo"], "a fresh netns holds only lo: {links}");
    assert!(links.contains("UP"), "lo must be up: {links}");

    // Loopback works inside, and the thread really is in another netns.
    let (inside_ino, echoed) = ns
        .run_in(|| {
            let ino = std::fs::metadata("/proc/thread-self/ns/net")
                .map(|m| std::os::unix::fs::MetadataExt::ino(&m));
            let l = TcpListener::bind("127.0.0.1:0").expect("bind on lo");
            let mut c = TcpStream::connect(l.local_addr().expect("addr")).expect("connect on lo");
            let (mut s, _) = l.accept().expect("accept");
            c.write_all(b"ping").expect("write");
            let mut buf = [0u8; 4];
            s.read_exact(&mut buf).expect("read");
            (ino.expect("stat own netns"), buf)
        })
        .expect("run_in");
    assert_eq!(
        &echoed, b"ping",
        "loopback inside the netns must carry data"
    );
    assert_eq!(
        inside_ino,
        ns.inode().expect("netns inode"),
        "run_in must execute inside the netns"
    );
    let host_ino = std::os::unix::fs::MetadataExt::ino(
        &std::fs::metadata("/proc/thread-self/ns/net").expect("stat"),
    );
    assert_ne!(
        host_ino, inside_ino,
        "the test thread itself must stay in its own netns"
    );

    drop(ns);
    assert!(
        !netns::list().expect("ip netns list").contains(&name),
        "{name} must be gone after drop"
    );
    assert!(!path.exists(), "{} must be gone after drop", path.display());
}

#[test]
fn netns_cookies_are_stable_and_distinct() {
    let (a, b) = (
        NetnsGuard::new().expect("netns a"),
        NetnsGuard::new().expect("netns b"),
    );
    let ca = a.cookie().expect("cookie a");
    let cb = b.cookie().expect("cookie b");
    let host = netns::current_netns_cookie().expect("host cookie");
    assert_eq!(
        ca,
        a.cookie().expect("cookie a again"),
        "a netns cookie is stable"
    );
    assert!(ca != 0 && cb != 0, "cookies are non-zero: {ca} {cb}");
    assert!(
        ca != cb && ca != host && cb != host,
        "cookies differ: a={ca} b={cb} host={host}"
    );
}

#[test]
fn veth_carries_tcp_over_v4_and_v6() {
    let (a, b) = (
        NetnsGuard::new().expect("netns a"),
        NetnsGuard::new().expect("netns b"),
    );
    let veth = VethPair::connect(&a, &b).expect("veth");
    let cases: [(&str, IpAddr, IpAddr); 2] = [
        (
            "v4",
            veth.a_v4().expect("a v4").into(),
            veth.b_v4().expect("b v4").into(),
        ),
        (
            "v6",
            veth.a_v6().expect("a v6").into(),
            veth.b_v6().expect("b v6").into(),
        ),
    ];
    for (family, a_ip, b_ip) in cases {
        let server = EchoServer::bind_in(&b, sock(b_ip, 7000), &format!("server-{family}"))
            .expect("echo server");
        let reply = a
            .run_in(|| -> std::io::Result<Vec<u8>> {
                let mut s = TcpStream::connect_timeout(&server.addr(), TIMEOUT)?;
                s.write_all(b"hi\n")?;
                let mut out = Vec::new();
                s.read_to_end(&mut out)?;
                Ok(out)
            })
            .expect("run_in")
            .unwrap_or_else(|e| panic!("{family}: connect a -> b over the veth: {e}"));
        assert_eq!(reply, server.expected_reply(b"hi\n"), "{family}: reply");
        let got = server
            .wait_for(1, TIMEOUT)
            .expect("server saw the connection");
        assert_eq!(
            got[0].peer.ip(),
            a_ip,
            "{family}: the server saw a's address"
        );
        assert_eq!(got[0].data, b"hi\n", "{family}: request bytes");
    }
}

#[test]
fn bridge_connects_pods_to_each_other_and_to_the_node() {
    let node = NetnsGuard::new().expect("node netns");
    let (p1, p2) = (
        NetnsGuard::new().expect("pod1"),
        NetnsGuard::new().expect("pod2"),
    );
    let mut bridge = Bridge::create(
        &node,
        "10.244.0.1/24".parse().expect("literal"),
        "fd00:244::1/64".parse().expect("literal"),
    )
    .expect("bridge");
    let port1 = bridge.attach(&p1).expect("attach pod1");
    let port2 = bridge.attach(&p2).expect("attach pod2");
    assert_ne!(port1.v4(), port2.v4(), "pods get distinct IPv4 addresses");
    assert_eq!(
        port1.v4(),
        Ipv4Addr::new(10, 244, 0, 2),
        "first pod gets .2"
    );
    assert_eq!(
        port2.v6(),
        "fd00:244::3".parse::<Ipv6Addr>().expect("literal"),
        "second pod gets ::3"
    );

    let gw4 = bridge.gateway_v4().addr;
    let gw6 = bridge.gateway_v6().addr;
    let cases: [(&str, &NetnsGuard, IpAddr, &NetnsGuard, IpAddr); 4] = [
        (
            "pod1 -> pod2 v4",
            &p2,
            port2.v4().into(),
            &p1,
            port1.v4().into(),
        ),
        (
            "pod1 -> pod2 v6",
            &p2,
            port2.v6().into(),
            &p1,
            port1.v6().into(),
        ),
        ("pod2 -> node v4", &node, gw4, &p2, port2.v4().into()),
        ("pod2 -> node v6", &node, gw6, &p2, port2.v6().into()),
    ];
    for (what, server_ns, server_ip, client_ns, client_ip) in cases {
        let server =
            EchoServer::bind_in(server_ns, sock(server_ip, 7100), what).expect("echo server");
        let report = client(
            &Placement::new().netns(client_ns).uid(APP_UID),
            &ClientOptions::new(server.addr()).send("x\n"),
        );
        assert!(report.connect.ok, "{what}: connect: {report:?}");
        assert!(
            report.received_matches(&server.expected_reply(b"x\n")),
            "{what}: reply: {report:?}"
        );
        let got = server.wait_for(1, TIMEOUT).expect("server saw it");
        assert_eq!(
            got[0].peer.ip(),
            client_ip,
            "{what}: peer seen by the server"
        );
    }
}

#[test]
fn cgroup_guard_holds_children_and_cleans_up() {
    let root = cgroup2_root().expect("cgroup2 root");
    let cg = CgroupGuard::new().expect("create cgroup");
    let path = cg.path().to_path_buf();
    assert!(
        path.starts_with(&root) && path.is_dir(),
        "{} under {}",
        path.display(),
        root.display()
    );
    let rel = cg.relative_path().expect("relative path");

    // Joined at spawn time (pre_exec) ...
    let mut sleeper = Placement::new()
        .cgroup(&cg)
        .spawn(Command::new("sleep").arg("30").stdout(Stdio::null()))
        .expect("spawn sleep in cgroup");
    assert_eq!(
        cgroup_of(sleeper.pid()).expect("cgroup of child"),
        rel,
        "child spawned into the cgroup"
    );
    // ... or moved in afterwards.
    let mut moved = ChildGuard::spawn(Command::new("sleep").arg("30")).expect("spawn sleep");
    assert_ne!(
        cgroup_of(moved.pid()).expect("cgroup"),
        rel,
        "not in the cgroup before the move"
    );
    cg.add_process(moved.pid()).expect("move into cgroup");
    assert_eq!(
        cgroup_of(moved.pid()).expect("cgroup"),
        rel,
        "moved into the cgroup"
    );
    let mut procs = cg.processes().expect("cgroup.procs");
    procs.sort();
    let mut want = vec![sleeper.pid(), moved.pid()];
    want.sort();
    assert_eq!(procs, want, "cgroup.procs lists both children");

    // Dropping the guard with live processes inside moves them out and removes the cgroup.
    let parent = path.parent().expect("parent").to_path_buf();
    let parent_rel = format!(
        "/{}",
        parent.strip_prefix(&root).expect("under root").display()
    );
    let parent_rel = if parent_rel == "/" {
        parent_rel
    } else {
        parent_rel.trim_end_matches('/').to_string()
    };
    drop(cg);
    assert!(!path.exists(), "{} must be removed on drop", path.display());
    for child in [&mut sleeper, &mut moved] {
        assert_eq!(
            cgroup_of(child.pid()).expect("cgroup"),
            parent_rel,
            "pid {} moved back to the parent",
            child.pid()
        );
        assert!(
            child.try_wait().expect("try_wait").is_none(),
            "pid {} still alive",
            child.pid()
        );
    }
}

#[test]
fn child_runs_with_requested_identity_in_netns_and_cgroup() {
    let ns = NetnsGuard::new().expect("netns");
    let cg = CgroupGuard::new().expect("cgroup");
    let ns_link = format!("net:[{}]", ns.inode().expect("netns inode"));
    // (uid, gid set explicitly, supplementary groups, expected gid)
    let cases: [(u32, Option<u32>, Vec<u32>, u32); 4] = [
        (APP_UID, None, vec![], APP_UID),
        (PROXY_UID, Some(PROXY_UID), vec![], PROXY_UID),
        (65534, Some(65534), vec![], 65534),
        (APP_UID, Some(PROXY_UID), vec![5, 6], PROXY_UID),
    ];
    for (uid, gid, groups, want_gid) in cases {
        let mut placement = Placement::new()
            .netns(&ns)
            .cgroup(&cg)
            .uid(uid)
            .groups(groups.clone());
        if let Some(gid) = gid {
            placement = placement.gid(gid);
        }
        let guard = placement
            .spawn(Command::new("sleep").arg("30"))
            .expect("spawn placed sleep");
        let pid = guard.pid();
        let (uids, gids, got_groups) = ids_of(pid).expect("read /proc status");
        assert_eq!(uids, [uid; 4], "uid {uid}: real/effective/saved/fs UIDs");
        assert_eq!(gids, [want_gid; 4], "uid {uid}: GIDs");
        assert_eq!(got_groups, groups, "uid {uid}: supplementary groups");
        let link = std::fs::read_link(format!("/proc/{pid}/ns/net")).expect("readlink ns/net");
        assert_eq!(
            link.to_string_lossy(),
            ns_link,
            "uid {uid}: child is in the netns"
        );
        assert_eq!(
            cgroup_of(pid).expect("cgroup"),
            cg.relative_path().expect("rel"),
            "uid {uid}: child is in the cgroup"
        );
        drop(guard);
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "pid {pid} killed and reaped on drop"
        );
    }
}

#[test]
fn child_wait_output_times_out_and_kills() {
    let mut cmd = Command::new("sleep");
    cmd.arg("30").stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = ChildGuard::spawn(&mut cmd).expect("spawn");
    let pid = child.pid();
    match child.wait_output(Duration::from_millis(200)) {
        Err(Error::Timeout { timeout, .. }) => assert_eq!(timeout, Duration::from_millis(200)),
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "pid {pid} killed and reaped after the timeout"
    );
}

#[test]
fn proxy_without_redirection_gets_enoent_and_closes() {
    let ns = NetnsGuard::new().expect("netns");
    let cg = CgroupGuard::new().expect("cgroup");
    let opts = ProxyOptions {
        ipv6: true,
        ..ProxyOptions::new()
    };
    let placement = Placement::new().netns(&ns).cgroup(&cg).uid(PROXY_UID);
    let proxy = TestProxy::start(&placement, &opts).expect("start proxy");
    let events = proxy.events().expect("events");
    assert!(
        events.contains(&Event::Ready {
            pid: proxy.pid(),
            uid: PROXY_UID,
            gid: PROXY_UID
        }),
        "proxy reports it runs as {PROXY_UID}: {events:?}"
    );
    let (uids, _, _) = ids_of(proxy.pid()).expect("proxy ids");
    assert_eq!(
        uids, [PROXY_UID; 4],
        "the proxy process runs as {PROXY_UID}"
    );

    let targets: [SocketAddr; 4] = [
        "127.0.0.1:4140".parse().expect("literal"),
        "[::1]:4140".parse().expect("literal"),
        "127.0.0.1:4143".parse().expect("literal"),
        "[::1]:4143".parse().expect("literal"),
    ];
    let app = Placement::new().netns(&ns).cgroup(&cg).uid(APP_UID);
    for (i, target) in targets.into_iter().enumerate() {
        let report = client(&app, &ClientOptions::new(target));
        assert!(report.connect.ok, "{target}: the proxy listens: {report:?}");
        assert_eq!(
            report.received_len, 0,
            "{target}: nothing is forwarded: {report:?}"
        );
        assert!(
            report.read.ok,
            "{target}: the proxy closes cleanly (EOF): {report:?}"
        );
        let events = proxy
            .log()
            .wait_for_finished(i + 1, TIMEOUT)
            .expect("proxy finished the connection");
        let last = proxy::finished(&events).last().cloned();
        match last {
            Some(Event::OrigDstError {
                listener,
                peer,
                local,
                errno,
                ..
            }) => {
                assert_eq!(
                    errno,
                    Some(libc::ENOENT),
                    "{target}: the kernel's answer without redirection"
                );
                assert_eq!(
                    listener.port(),
                    target.port(),
                    "{target}: accepted on the right listener"
                );
                assert_eq!(
                    Some(peer),
                    report.local,
                    "{target}: the proxy saw the client socket"
                );
                assert_eq!(local, target, "{target}: accepted socket's local address");
            }
            other => panic!("{target}: expected an orig_dst_error, got {other:?} in {events:?}"),
        }
        assert!(
            accepted(&events).is_empty(),
            "{target}: no connection may be forwarded: {events:?}"
        );
    }
}

#[test]
fn proxy_forwards_outbound_redirected_by_iptables() {
    let w = World::new();
    w.redirect_with_iptables();
    let server_v4 =
        EchoServer::bind_in(&w.peer, sock(w.peer_v4(), 8080), "server-v4").expect("server v4");
    let server_v6 =
        EchoServer::bind_in(&w.peer, sock(w.peer_v6(), 8080), "server-v6").expect("server v6");
    let mapped = sock(w.peer_v4().to_ipv6_mapped(), 8080);
    // (case, server, address the client dials, payload size, no_splice, outbound listener)
    let cases: [(&str, &EchoServer, SocketAddr, usize, bool, SocketAddr); 5] = [
        (
            "v4",
            &server_v4,
            server_v4.addr(),
            0,
            false,
            "127.0.0.1:4140".parse().expect("literal"),
        ),
        (
            "v6",
            &server_v6,
            server_v6.addr(),
            0,
            false,
            "[::1]:4140".parse().expect("literal"),
        ),
        (
            "v4-mapped",
            &server_v4,
            mapped,
            0,
            false,
            "127.0.0.1:4140".parse().expect("literal"),
        ),
        (
            "v4 2MiB",
            &server_v4,
            server_v4.addr(),
            2 << 20,
            false,
            "127.0.0.1:4140".parse().expect("literal"),
        ),
        (
            "v6 2MiB read/write",
            &server_v6,
            server_v6.addr(),
            2 << 20,
            true,
            "[::1]:4140".parse().expect("literal"),
        ),
    ];
    for (what, server, dial, payload_size, no_splice, listener_want) in cases {
        let proxy = TestProxy::start(
            &w.app(PROXY_UID),
            &ProxyOptions {
                ipv6: true,
                no_splice,
                ..ProxyOptions::new()
            },
        )
        .expect("start proxy");
        let before = server.received().len();
        let mut opts = ClientOptions::new(dial).send("hello ");
        opts.payload_size = payload_size;
        let report = client(&w.app(APP_UID), &opts);
        let request = opts.payload();
        let mut expected = server.expected_reply(&request);
        if payload_size == 0 {
            // No newline in "hello ": the server read up to EOF.
            expected = server.expected_reply(b"hello ");
        }
        assert!(
            report.connect.ok && report.write.ok && report.read.ok,
            "{what}: {report:?}"
        );
        assert_eq!(
            report.peer,
            Some(dial),
            "{what}: getpeername shows the original destination"
        );
        assert!(
            report.received_matches(&expected),
            "{what}: end-to-end reply ({} bytes): {report:?}",
            expected.len()
        );

        let events = proxy
            .log()
            .wait_for_finished(1, TIMEOUT)
            .expect("proxy finished the connection");
        let Some(Event::Closed {
            listener,
            peer,
            orig_dst,
            upstream_local,
            bytes_to_upstream,
            bytes_to_client,
            copy,
            error,
            ..
        }) = proxy::finished(&events).next().cloned()
        else {
            panic!("{what}: expected a closed connection, got {events:?}")
        };
        assert_eq!(
            listener, listener_want,
            "{what}: accepted on the outbound listener"
        );
        assert_eq!(
            orig_dst,
            server.addr(),
            "{what}: SO_ORIGINAL_DST is the server's address"
        );
        assert_eq!(
            Some(peer),
            report.local.map(|a| sock(a.ip().to_canonical(), a.port())),
            "{what}: the proxy saw the client socket"
        );
        // iptables' answer to the app's getsockname, which l5d_getsock4/6 reproduce
        // (tests/tests/dataplane.rs): the pod's own address of the socket's family.
        let pod_ip = match dial.ip() {
            IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some() => {
                IpAddr::V6(w.pod_v4().to_ipv6_mapped())
            }
            IpAddr::V6(_) => IpAddr::V6(w.pod_v6()),
            IpAddr::V4(_) => IpAddr::V4(w.pod_v4()),
        };
        assert_eq!(
            report.local.map(|a| a.ip()),
            Some(pod_ip),
            "{what}: getsockname under iptables"
        );
        assert_eq!(
            bytes_to_upstream,
            request.len() as u64,
            "{what}: bytes to upstream"
        );
        assert_eq!(
            bytes_to_client,
            expected.len() as u64,
            "{what}: bytes to client"
        );
        assert_eq!(
            copy,
            if no_splice {
                CopyMode::ReadWrite
            } else {
                CopyMode::Splice
            },
            "{what}: copy mode"
        );
        assert_eq!(error, None, "{what}: clean close");
        let got = server
            .wait_for(before + 1, TIMEOUT)
            .expect("server received");
        assert_eq!(
            got.len(),
            before + 1,
            "{what}: exactly one connection reached the server"
        );
        assert_eq!(
            got[before].peer, upstream_local,
            "{what}: the server was reached by the proxy's socket"
        );
    }
}

#[test]
fn proxy_forwards_inbound_redirected_by_iptables() {
    let w = World::new();
    w.redirect_with_iptables();
    let proxy = w.proxy();
    let app_v4 = EchoServer::bind_in(&w.pod.netns, sock(Ipv4Addr::UNSPECIFIED, 8080), "app-v4")
        .expect("app v4");
    let app_v6 = {
        let l = w
            .pod
            .netns
            .run_in(|| {
                let s = socket2::Socket::new(socket2::Domain::IPV6, socket2::Type::STREAM, None)?;
                s.set_only_v6(true)?;
                s.set_reuse_address(true)?;
                s.bind(&sock(Ipv6Addr::UNSPECIFIED, 8080).into())?;
                s.listen(64)?;
                Ok::<_, std::io::Error>(TcpListener::from(s))
            })
            .expect("run_in")
            .expect("bind app v6");
        EchoServer::serve(l, "app-v6", linkerd_cni_tests::echo::Mode::Echo).expect("app v6")
    };
    let ignored_v4 = EchoServer::bind_in(&w.pod.netns, sock(Ipv4Addr::UNSPECIFIED, 4190), "admin")
        .expect("app 4190");
    // (case, app, pod address dialled from the peer, through the proxy?)
    let cases: [(&str, &EchoServer, SocketAddr, bool); 3] = [
        ("v4", &app_v4, sock(w.pod_v4(), 8080), true),
        ("v6", &app_v6, sock(w.pod_v6(), 8080), true),
        (
            "v4 ignored port 4190",
            &ignored_v4,
            sock(w.pod_v4(), 4190),
            false,
        ),
    ];
    let remote = Placement::new().netns(&w.peer).uid(APP_UID);
    let mut finished = 0;
    for (what, app, dial, via_proxy) in cases {
        let report = client(&remote, &ClientOptions::new(dial).send("in\n"));
        assert!(report.connect.ok && report.read.ok, "{what}: {report:?}");
        assert!(
            report.received_matches(&app.expected_reply(b"in\n")),
            "{what}: reply from the app: {report:?}"
        );
        let seen = app
            .wait_for(1, TIMEOUT)
            .expect("app received")
            .pop()
            .expect("one connection");
        let client_local = report.local.expect("client local address");
        if via_proxy {
            finished += 1;
            let events = proxy
                .log()
                .wait_for_finished(finished, TIMEOUT)
                .expect("proxy finished");
            let (listener, peer, orig_dst) = *accepted(&events).last().expect("accepted");
            assert_eq!(
                listener.port(),
                proxy::INBOUND_PORT,
                "{what}: accepted on the inbound listener"
            );
            assert_eq!(
                orig_dst, dial,
                "{what}: SO_ORIGINAL_DST is the pod address dialled"
            );
            assert_eq!(
                peer, client_local,
                "{what}: the proxy saw the remote client"
            );
            assert_eq!(
                seen.peer.ip(),
                dial.ip(),
                "{what}: the app was reached from the pod's own IP (the proxy)"
            );
        } else {
            assert_eq!(
                seen.peer, client_local,
                "{what}: the app was reached directly by the remote client"
            );
            let events = proxy.events().expect("events");
            assert_eq!(
                proxy::finished(&events).count(),
                finished,
                "{what}: the proxy saw nothing: {events:?}"
            );
        }
    }

    // Dialling the proxy's inbound port itself: the original destination is the listener, so
    // the proxy refuses to loop and closes.
    let dial = sock(w.pod_v4(), proxy::INBOUND_PORT);
    let report = client(&remote, &ClientOptions::new(dial));
    assert!(report.connect.ok, "connect to the inbound port: {report:?}");
    assert_eq!(report.received_len, 0, "nothing forwarded: {report:?}");
    let events = proxy
        .log()
        .wait_for_finished(finished + 1, TIMEOUT)
        .expect("proxy finished");
    match proxy::finished(&events).last() {
        Some(Event::Rejected { orig_dst, peer, .. }) => {
            assert_eq!(
                *orig_dst, dial,
                "original destination is the listener itself"
            );
            assert_eq!(Some(*peer), report.local, "the proxy saw the remote client");
        }
        other => panic!("expected a rejected loop, got {other:?} in {events:?}"),
    }
}

#[test]
fn iptables_baseline_exempts_proxy_uid_udp_and_validates() {
    let w = World::new();
    w.redirect_with_iptables();
    let proxy = w.proxy();
    let server = EchoServer::bind_in(&w.peer, sock(w.peer_v4(), 8080), "server").expect("server");
    let udp = UdpEcho::bind_in(&w.peer, sock(w.peer_v4(), 5353), "dns").expect("udp server");

    // The proxy's UID goes straight out.
    let report = client(
        &w.app(PROXY_UID),
        &ClientOptions::new(server.addr()).send("direct\n"),
    );
    assert!(
        report.received_matches(&server.expected_reply(b"direct\n")),
        "proxy UID reaches the server: {report:?}"
    );
    let seen = server.wait_for(1, TIMEOUT).expect("server received");
    assert_eq!(
        Some(seen[0].peer),
        report.local,
        "the server saw the client itself, not the proxy"
    );
    assert!(
        accepted(&proxy.events().expect("events")).is_empty(),
        "the proxy saw nothing"
    );

    // UDP is untouched.
    let report = client(
        &w.app(APP_UID),
        &ClientOptions::new(udp.addr()).udp().send("query"),
    );
    assert!(report.connect.ok, "sendto: {report:?}");
    assert_eq!(
        report.peer,
        Some(udp.addr()),
        "the reply came from the server itself: {report:?}"
    );
    assert!(
        report.received_matches(&udp.expected_reply(b"query")),
        "udp reply: {report:?}"
    );
    let seen = udp.wait_for(1, TIMEOUT).expect("udp received");
    let local_port = report.local.expect("udp local address").port();
    assert_eq!(
        seen[0].peer,
        sock(w.pod_v4(), local_port),
        "the datagram came from the pod itself"
    );
    assert_eq!(seen[0].data, b"query", "udp datagram as sent");

    // Validator mode (no proxy listening on 4140): 192.0.2.2:1404 comes back to the client's
    // own listener. iptables needs a route for the destination; eBPF will not.
    drop(proxy);
    link::add_default_route(&w.pod.netns, w.peer_v4().into())
        .expect("default route towards the peer netns");
    let mut opts = ClientOptions::new("192.0.2.2:1404".parse().expect("literal"));
    opts.listen = Some("0.0.0.0:4140".parse().expect("literal"));
    // It reads what its listener wrote (the token), as linkerd-network-validator does.
    let report = client(&w.app(65534), &opts);
    assert_eq!(report.uid, 65534, "validator runs as nobody");
    let acc = report
        .accepted
        .clone()
        .unwrap_or_else(|| panic!("validator accepted nothing: {report:?}"));
    assert!(acc.reached_self, "validator reached itself: {report:?}");
    assert_eq!(acc.local.port(), 4140, "validator listener port");
}

#[test]
fn proxy_started_as_root_drops_to_uid() {
    let ns = NetnsGuard::new().expect("netns");
    let opts = ProxyOptions {
        uid: Some(PROXY_UID),
        gid: Some(PROXY_UID),
        ..ProxyOptions::new()
    };
    let proxy = TestProxy::start(&Placement::new().netns(&ns), &opts).expect("start proxy as root");
    let events = proxy.events().expect("events");
    let listening: Vec<SocketAddr> = events
        .iter()
        .filter_map(|e| {
            if let Event::Listening { addr } = e {
                Some(*addr)
            } else {
                None
            }
        })
        .collect();
    assert_eq!(
        listening,
        ProxyOptions::new().listen_addrs(),
        "default listeners: {events:?}"
    );
    assert!(
        events.contains(&Event::Ready {
            pid: proxy.pid(),
            uid: PROXY_UID,
            gid: PROXY_UID
        }),
        "{events:?}"
    );
    let (uids, gids, groups) = ids_of(proxy.pid()).expect("ids");
    assert_eq!(
        (uids, gids, groups),
        ([PROXY_UID; 4], [PROXY_UID; 4], vec![]),
        "credentials after the drop"
    );
}

#[test]
fn client_counts_many_connections() {
    let ns = NetnsGuard::new().expect("netns");
    let server = EchoServer::bind_in(&ns, "127.0.0.1:7200".parse().expect("literal"), "many")
        .expect("server");
    let mut opts = ClientOptions::new(server.addr()).send("n\n");
    opts.count = 200;
    let report = client(&Placement::new().netns(&ns).uid(APP_UID), &opts);
    assert_eq!(
        (report.count, report.succeeded, report.failed),
        (200, 200, 0),
        "{report:?}"
    );
    assert_eq!(
        server.wait_for(200, TIMEOUT).expect("server").len(),
        200,
        "server saw every connection"
    );
    let refused = client(
        &Placement::new().netns(&ns),
        &ClientOptions::new("127.0.0.1:1".parse().expect("literal")),
    );
    assert_eq!(
        refused.connect.errno,
        Some(libc::ECONNREFUSED),
        "{refused:?}"
    );
    assert_eq!((refused.succeeded, refused.failed), (0, 1), "{refused:?}");
}

/// A checkout in a home directory (mode 0700, as `/root` is) cannot be traversed by the UIDs
/// the tests drop to: the support code runs copies of such binaries from its shared directory.
#[test]
fn binaries_under_a_0700_directory_still_run_as_other_uids() {
    use std::os::unix::{
        fs::{MetadataExt, PermissionsExt},
        process::CommandExt,
    };

    use linkerd_cni_tests::{bins, names::TempDir};

    // A stand-in for `/root/<checkout>/target/debug/linkerd-cni-test-client`.
    let home = TempDir::new().expect("scratch dir");
    std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let checkout = home.path().join("repo");
    let target = checkout.join("target").join("debug");
    std::fs::create_dir_all(&target).expect("target dir");
    let inside = target.join(bins::CLIENT);
    std::fs::copy(
        bins::bin_path(bins::CLIENT).expect("client binary"),
        &inside,
    )
    .expect("copy the client into the checkout");

    // Straight from there, UID 2102 gets EACCES: what the suite hit from such a checkout.
    let err = Command::new(&inside)
        .arg("--help")
        .uid(PROXY_UID)
        .gid(PROXY_UID)
        .stdout(Stdio::null())
        .status()
        .expect_err("UID 2102 cannot reach a binary below a 0700 directory");
    assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied, "{err}");

    // The support code resolves a copy that is runnable: root-owned, nobody else may write it
    // or its directories, once per process.
    let runnable = bins::runnable_as(&inside, PROXY_UID, PROXY_UID, &[]).expect("runnable copy");
    assert!(
        runnable.starts_with(bins::SHARED_DIR),
        "{} under {}",
        runnable.display(),
        bins::SHARED_DIR
    );
    for p in [
        runnable.as_path(),
        runnable.parent().expect("dir"),
        Path::new(bins::SHARED_DIR),
    ] {
        let m = std::fs::symlink_metadata(p).expect("stat");
        assert_eq!(m.uid(), 0, "{} is root's", p.display());
        assert_eq!(
            m.mode() & 0o022,
            0,
            "{} is writable by root only",
            p.display()
        );
        assert_eq!(
            m.mode() & 0o005,
            0o005,
            "{} is readable and executable by all",
            p.display()
        );
    }
    assert_eq!(
        bins::runnable_as(&inside, PROXY_UID, PROXY_UID, &[]).expect("again"),
        runnable,
        "one copy per program and process"
    );
    assert_eq!(
        bins::runnable_as(&inside, 0, 0, &[]).expect("as root"),
        inside,
        "root runs it where it is"
    );
    let system = Path::new("/usr/bin/true");
    assert_eq!(
        bins::runnable_as(system, PROXY_UID, PROXY_UID, &[]).expect("system binary"),
        system,
        "a binary everyone reaches runs where it is"
    );
    let link = home.path().join("usr-bin");
    std::os::unix::fs::symlink("/usr/bin", &link).expect("symlink");
    assert_ne!(
        bins::runnable_as(&link.join("true"), PROXY_UID, PROXY_UID, &[]).expect("via a symlink"),
        link.join("true"),
        "a symlink below the 0700 directory is still below it"
    );

    // Placed as UID 2102 (with the checkout as its working directory, as under `cargo test`),
    // the client runs and reports its identity.
    let closed = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = closed.local_addr().expect("addr");
    drop(closed);
    let mut cmd = Placement::new()
        .uid(PROXY_UID)
        .command(&inside)
        .expect("command");
    cmd.args(ClientOptions::new(addr).to_args())
        .current_dir(&checkout)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = ChildGuard::spawn(&mut cmd)
        .expect("spawn the client as UID 2102")
        .wait_output(TIMEOUT)
        .expect("client exits");
    assert!(
        out.status.success(),
        "{}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Report = serde_json::from_slice(&out.stdout).expect("client report");
    assert_eq!((report.uid, report.gid), (PROXY_UID, PROXY_UID));
}

/// Copies made for processes that died are removed; this process's own stay.
#[test]
fn stale_binary_copies_are_reaped() {
    use std::os::unix::fs::PermissionsExt;

    use linkerd_cni_tests::{bins, names::TempDir};

    let home = TempDir::new().expect("scratch dir");
    std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let inside = home.path().join("true");
    std::fs::copy("/bin/true", &inside).expect("copy true");
    let mine = bins::runnable_as(&inside, 65534, 65534, &[]).expect("runnable copy");
    assert_ne!(mine, inside, "a copy was made");
    // A PID above pid_max never lives.
    let pid_max: u32 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .expect("pid_max")
        .trim()
        .parse()
        .expect("number");
    let stale = Path::new(bins::SHARED_DIR).join(format!("l5dt-{}-0", pid_max + 1));
    std::fs::create_dir_all(stale.join("sub")).expect("stale dir");
    bins::reap_stale_copies();
    assert!(!stale.exists(), "{} reaped", stale.display());
    assert!(mine.exists(), "{} kept", mine.display());
}
