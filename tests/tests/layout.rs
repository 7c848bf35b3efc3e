//! Typed maps and the lifecycle of pinned state across agent versions (root required):
//! `bpftool` prints named fields of the maps, a node left by the previous agent version
//! (untyped maps, layout 1, replayed from that version's eBPF object in
//! `tests/fixtures/ebpf-layout-1.o`) is upgraded under connection load without a failed
//! connection, a state of a newer readable layout is rolled back the same way, and an unknown
//! newer layout, or a socket map whose sockets could not be carried over, is refused without
//! touching anything.
//!
//! Run: `cargo test -p linkerd-cni-tests --test layout -- --test-threads=1`

use linkerd_cni_sys::{bpf, uapi};
use std::{
    collections::BTreeMap,
    fs,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use linkerd_cni_agent::{
    Agent, AgentConfig, agent::registry::PodRecord, dataplane::maps::PodEntries,
};
use linkerd_cni_common::{
    LAYOUT_VERSION, LayoutMeta,
    names::{self, MAX_PODS},
    paths,
};
use linkerd_cni_proto::config::{Cidr, LinkerdConfig, PortRange};
use linkerd_cni_tests::{
    AgentHarness, EchoServer, Placement, Pod, PodAndPeer, TestProxy,
    client::{Options as ClientOptions, Report, run_client},
    layout,
    proxy::{self, Event},
};
use serde_json::Value;

const TIMEOUT: Duration = Duration::from_secs(60);
const APP_UID: u32 = 1000;
const OUT_PORT: u16 = 8080;
const IN_PORT: u16 = 8081;

fn sock(ip: impl Into<IpAddr>, port: u16) -> SocketAddr {
    SocketAddr::new(ip.into(), port)
}

/// A pod with an app listening on [`IN_PORT`], a peer with a server on [`OUT_PORT`].
struct World {
    net: PodAndPeer,
    server: EchoServer,
    _app: EchoServer,
}

impl World {
    fn new() -> Self {
        let net = PodAndPeer::new().expect("pod, peer and veth");
        let server = EchoServer::bind_in(&net.peer, sock(net.peer_v4(), OUT_PORT), "server")
            .expect("server in the peer");
        let app = EchoServer::bind_in(&net.pod.netns, sock(Ipv4Addr::UNSPECIFIED, IN_PORT), "app")
            .expect("app in the pod");
        World {
            net,
            server,
            _app: app,
        }
    }

    fn proxy(&self) -> TestProxy {
        self.net
            .pod
            .start_proxy(&proxy::Options::new())
            .expect("start the forwarding proxy as UID 2102")
    }

    fn outbound(&self) -> SocketAddr {
        self.server.addr()
    }

    fn inbound(&self) -> SocketAddr {
        sock(self.net.pod_v4(), IN_PORT)
    }

    /// `count` outbound connections from the pod's app, one after another.
    fn out_client(&self, count: u64) -> (Placement, ClientOptions) {
        let mut opts = ClientOptions::new(self.outbound()).send("hello\n");
        opts.count = count;
        (self.net.pod.container(APP_UID), opts)
    }

    /// `count` inbound connections from the peer to the pod's app.
    fn in_client(&self, count: u64) -> (Placement, ClientOptions) {
        let mut opts = ClientOptions::new(self.inbound()).send("hello\n");
        opts.count = count;
        (Placement::new().netns(&self.net.peer).uid(APP_UID), opts)
    }
}

fn run(client: (Placement, ClientOptions)) -> Report {
    run_client(&client.0, &client.1, TIMEOUT).expect("run the test client")
}

/// The proxy's accepted connections (listener, original destination) and how many
/// `SO_ORIGINAL_DST` failures it logged.
fn proxy_view(proxy: &TestProxy) -> (Vec<(SocketAddr, SocketAddr)>, usize) {
    let events = proxy.events().expect("proxy log");
    let accepted = proxy::accepted(&events);
    let errors = events
        .iter()
        .filter(|e| matches!(e, Event::OrigDstError { .. }))
        .count();
    (accepted, errors)
}

fn wait_accepted(proxy: &TestProxy, n: usize) {
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
}

/// `bpftool -j map dump pinned <path>`, each entry as bpftool formats it from BTF (its
/// `formatted` member; raw hex bytes only when the map has no BTF).
fn bpftool_dump(path: &Path) -> Vec<Value> {
    let out = Command::new("bpftool")
        .args(["-j", "map", "dump", "pinned"])
        .arg(path)
        .output()
        .expect("run bpftool");
    assert!(
        out.status.success(),
        "bpftool map dump {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let entries: Vec<Value> = serde_json::from_slice(&out.stdout).expect("bpftool JSON");
    entries
        .into_iter()
        .map(|e| {
            e.get("formatted").cloned().unwrap_or_else(|| {
                panic!(
                    "{}: bpftool printed raw bytes (no BTF): {e}",
                    path.display()
                )
            })
        })
        .collect()
}

fn map_info(path: &Path) -> bpf::MapInfo {
    layout::map_info(path).unwrap_or_else(|e| panic!("{e}"))
}

fn meta(pin_root: &Path) -> Option<LayoutMeta> {
    layout::meta(pin_root).expect("read the meta map")
}

fn set_meta(pin_root: &Path, version: u32, oldest_reader: u32) {
    layout::set_meta(pin_root, version, oldest_reader).expect("write the meta map");
}

fn pinned_ids(pin_root: &Path) -> BTreeMap<PathBuf, (u32, Option<u32>)> {
    layout::pinned_ids(pin_root).expect("pinned objects")
}

/// Registers `pod` the way the previous agent version did (see [`layout::previous_registers`]).
fn previous_agent_registers(
    ebpf: &aya::Ebpf,
    config: &AgentConfig,
    pod: &Pod,
    shared: bool,
) -> PodRecord {
    let id = format!("ctr-{}", pod.netns.name());
    let pod = layout::PreviousPod {
        id: &id,
        netns: pod.netns.path(),
        cgroup: pod.cgroup.path(),
        shared,
    };
    layout::previous_registers(ebpf, &config.pin_root, &config.state_dir, &pod)
        .expect("register a pod as the previous agent did")
}

/// Runs, for every pod, outbound and inbound clients (batches of [`BATCH`] connections one
/// after another) from before `change` starts until every proxy has accepted 100 more
/// connections after it finished, then checks that every connection succeeded and went
/// through its pod's proxy with its original destination.
fn under_load(pods: &[(&World, &TestProxy)], change: impl FnOnce()) {
    const BATCH: u64 = 200;
    let before: Vec<usize> = pods.iter().map(|(_, p)| proxy_view(p).0.len()).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = pods
        .iter()
        .flat_map(|(w, _)| [w.out_client(BATCH), w.in_client(BATCH)])
        .map(|c| {
            let stop = stop.clone();
            thread::spawn(move || {
                let (mut attempted, mut failures) = (0, Vec::new());
                while !stop.load(Ordering::Relaxed) {
                    let r = run(c.clone());
                    attempted += r.count;
                    if r.failed > 0 {
                        failures.push(r);
                    }
                }
                (attempted, failures)
            })
        })
        .collect();
    for ((_, proxy), before) in pods.iter().zip(&before) {
        wait_accepted(proxy, before + 50);
    }
    change();
    for (_, proxy) in pods {
        let at_change = proxy_view(proxy).0.len();
        wait_accepted(proxy, at_change + 100);
    }
    stop.store(true, Ordering::Relaxed);
    let mut attempted = Vec::new();
    for client in clients {
        let (n, failures) = client.join().expect("client");
        assert!(failures.is_empty(), "failed connections: {failures:?}");
        attempted.push(n);
    }
    for (i, ((world, proxy), before)) in pods.iter().zip(before).enumerate() {
        let (out, inb) = (attempted[2 * i] as usize, attempted[2 * i + 1] as usize);
        wait_accepted(proxy, before + out + inb);
        let (accepted, errors) = proxy_view(proxy);
        assert_eq!(errors, 0, "SO_ORIGINAL_DST failed on the proxy");
        let during = &accepted[before..];
        let outbound = during
            .iter()
            .filter(|(_, d)| *d == world.outbound())
            .count();
        let inbound = during.iter().filter(|(_, d)| *d == world.inbound()).count();
        assert_eq!(
            (during.len(), outbound, inbound),
            (out + inb, out, inb),
            "every connection went through the proxy with its original destination"
        );
    }
}

fn per_pod_config() -> LinkerdConfig {
    LinkerdConfig {
        outbound_ports_to_ignore: vec![PortRange {
            first: 9999,
            last: 9999,
        }],
        outbound_subnets_to_ignore: vec!["10.9.0.0/16".parse::<Cidr>().expect("cidr")],
        ..LinkerdConfig::default()
    }
}

#[test]
fn bpftool_prints_named_fields_of_every_typed_map() {
    let h = AgentHarness::new(None);
    let world = World::new();
    let record = h.register(&world.net.pod, per_pod_config(), true);
    let proxy = world.proxy();
    let r = run(world.out_client(1));
    assert_eq!(r.succeeded, 1, "{r:?}");
    wait_accepted(&proxy, 1);
    let cookie = record.netns_cookie;
    let maps = h.config().pin_root.join(paths::PIN_MAPS);

    let config = bpftool_dump(&maps.join(names::MAP_POD_CONFIG));
    let entry = config
        .iter()
        .find(|e| e["key"] == cookie)
        .unwrap_or_else(|| panic!("no entry for cookie {cookie}: {config:?}"));
    let value = &entry["value"];
    assert_eq!(value["proxy_uid"], 2102, "{entry}");
    assert_eq!(value["outbound_port"], 4140, "{entry}");
    assert_eq!(value["inbound_port"], 4143, "{entry}");
    let flags = value["flags"].as_u64().expect("flags is a number");
    assert_eq!(
        flags as u32,
        PodEntries::new(cookie, &per_pod_config(), &record.pod_ips)
            .config
            .flags,
        "{entry}"
    );

    let ports = bpftool_dump(&maps.join(names::MAP_PORT_SETS));
    let block = ports
        .iter()
        .find(|e| e["key"]["netns_cookie"] == cookie && e["key"]["set"] == 1)
        .unwrap_or_else(|| panic!("no outbound port block: {ports:?}"));
    assert_eq!(block["key"]["block"], 9999 >> 8, "{block}");
    assert_eq!(block["value"]["bits"][0], 1u64 << (9999 & 0xff), "{block}");

    let addrs = bpftool_dump(&maps.join(names::MAP_ADDRS));
    let subnet = addrs
        .iter()
        .find(|e| e["key"]["data"]["netns_cookie"] == cookie && e["key"]["data"]["set_be"] != 0)
        .unwrap_or_else(|| panic!("no subnet: {addrs:?}"));
    // 10.9.0.0/16 as v4-mapped: 96 fixed bits + 96 + 16.
    assert_eq!(subnet["key"]["prefix_len"], 96 + 96 + 16, "{subnet}");
    let addr: Vec<u64> = subnet["key"]["data"]["addr"]
        .as_array()
        .expect("addr bytes")
        .iter()
        .map(|b| b.as_u64().expect("byte"))
        .collect();
    assert_eq!(addr[10..14], [0xff, 0xff, 10, 9], "{subnet}");

    let by_ip = bpftool_dump(&maps.join(names::MAP_POD_BY_IP));
    assert!(
        by_ip.iter().any(|e| e["value"] == cookie),
        "pod address → cookie: {by_ip:?}"
    );

    // getsockname's addresses: the pod has both families.
    let local = bpftool_dump(&maps.join(names::MAP_POD_ADDRS));
    let entry = local
        .iter()
        .find(|e| e["key"] == cookie)
        .unwrap_or_else(|| panic!("no getsockname addresses for cookie {cookie}: {local:?}"));
    assert_eq!(
        entry["value"]["flags"],
        linkerd_cni_common::POD_ADDR_V4 | linkerd_cni_common::POD_ADDR_V6,
        "{entry}"
    );
    assert_eq!(
        entry["value"]["v4"],
        u32::from_ne_bytes(world.net.pod_v4().octets()),
        "{entry}"
    );

    let stats = bpftool_dump(&maps.join(names::MAP_POD_STATS));
    let mine = stats
        .iter()
        .find(|e| e["key"] == cookie)
        .unwrap_or_else(|| panic!("no stats: {stats:?}"));
    let redirected: u64 = mine["values"]
        .as_array()
        .expect("per-CPU values")
        .iter()
        .map(|v| {
            v["value"]["out_redirected"]
                .as_u64()
                .expect("named counter")
        })
        .sum();
    assert_eq!(redirected, 1, "{mine}");

    // The per-connection maps carry BTF too (their entries are gone once connections close);
    // the listener SOCKHASH cannot (the kernel takes no BTF for socket maps).
    for name in names::MAPS {
        let info = map_info(&maps.join(name));
        assert_eq!(
            info.btf_id != 0,
            name != names::MAP_LISTENERS,
            "{name}: {info:?}"
        );
    }
    // The layout record is typed too.
    let meta = bpftool_dump(&maps.join(names::MAP_META));
    assert_eq!(meta.len(), 1, "{meta:?}");
    assert_eq!(meta[0]["key"], 0, "{meta:?}");
    assert_eq!(meta[0]["value"]["version"], LAYOUT_VERSION, "{meta:?}");
    assert_eq!(meta[0]["value"]["oldest_reader"], 1, "{meta:?}");
    // `inspect` still decodes the maps.
    let view = h.maps().view(cookie);
    assert_eq!(view.config.map(|c| c.proxy_uid), Some(2102), "{view:?}");
}

#[test]
fn upgrade_from_the_previous_layout_under_load_keeps_every_pod_redirected() {
    // Two pods: one attached per pod, one through the shared attachment.
    let world = World::new();
    let world2 = World::new();
    let config = AgentConfig {
        shared_cgroup: Some(world2.net.pod.cgroup.path().into()),
        ..AgentHarness::fresh_config()
    };
    let mut h = AgentHarness::stopped_on(config.clone());
    let previous = layout::previous_loads(&config.pin_root).expect("load the previous eBPF object");
    let record = previous_agent_registers(&previous, &config, &world.net.pod, false);
    let record2 = previous_agent_registers(&previous, &config, &world2.net.pod, true);
    drop(previous);
    let proxy = world.proxy();
    let proxy2 = world2.proxy();
    let pin_root = &config.pin_root;
    let maps = pin_root.join(paths::PIN_MAPS);
    // The previous version's state: untyped maps, no layout record.
    assert_eq!(meta(pin_root), None);
    assert_eq!(map_info(&maps.join(names::MAP_POD_CONFIG)).btf_id, 0);
    let live_before: Vec<_> = [
        names::MAP_SOCK_DST,
        names::MAP_CONN_DST,
        names::MAP_LISTENERS,
    ]
    .into_iter()
    .map(|name| (name, map_info(&maps.join(name)).id))
    .collect();
    let links_before = pinned_ids(pin_root);

    // The new agent starts while clients keep connecting, both ways.
    under_load(&[(&world, &proxy), (&world2, &proxy2)], || h.start_again());

    assert_eq!(
        meta(pin_root).map(|m| m.version),
        Some(LAYOUT_VERSION),
        "layout recorded"
    );
    // Maps holding connections in flight are kept (compatible entries); every other map is
    // typed now.
    let live = [
        names::MAP_SOCK_DST,
        names::MAP_CONN_DST,
        names::MAP_LISTENERS,
    ];
    for name in names::MAPS {
        let info = map_info(&maps.join(name));
        assert_eq!(
            info.btf_id != 0,
            !live.contains(&name),
            "{name} after the upgrade: {info:?}"
        );
    }
    for (name, id) in live_before {
        assert_eq!(
            map_info(&maps.join(name)).id,
            id,
            "{name} is kept: connections in flight and proxies' listeners stay"
        );
    }
    let programs = layout::pinned_programs(pin_root).expect("pinned programs");
    let mut added = Vec::new();
    for (path, (_, prog)) in pinned_ids(pin_root) {
        if let Some(prog) = prog {
            let name = path.file_name().expect("link name").to_string_lossy();
            if !links_before.contains_key(&path) {
                // A program the previous version did not have (getsockname): attached at
                // start, running this version's program.
                assert_eq!(
                    Some(&prog),
                    programs.get(name.as_ref()),
                    "added link {} runs the new program",
                    path.display()
                );
                added.push(name.into_owned());
                continue;
            }
            if name == names::PROG_SK_LOOKUP {
                // The inbound link now runs a per-pod stub that tail-calls the new shared
                // program (the previous version attached the shared program itself).
                assert_ne!(
                    Some(&prog),
                    programs.get(name.as_ref()),
                    "link {} runs a stub",
                    path.display()
                );
            } else {
                assert_eq!(
                    Some(&prog),
                    programs.get(name.as_ref()),
                    "link {} runs the new program",
                    path.display()
                );
            }
            assert_ne!(
                links_before[&path].1,
                Some(prog),
                "link {} was swapped",
                path.display()
            );
            assert_eq!(
                links_before[&path].0,
                pinned_ids(pin_root)[&path].0,
                "same link"
            );
        }
    }
    // The getsockname links, per pod for the first pod and once in the shared directory for
    // the second.
    added.sort();
    assert_eq!(
        added,
        [
            names::PROG_GETSOCKNAME4,
            names::PROG_GETSOCKNAME4,
            names::PROG_GETSOCKNAME6,
            names::PROG_GETSOCKNAME6
        ],
        "links added by the upgrade"
    );
    for r in [&record, &record2] {
        h.agent().check(&r.id).expect("the pod is in force");
    }
    assert!(
        !bpftool_dump(&maps.join(names::MAP_POD_CONFIG)).is_empty(),
        "the pod's config was carried into the typed map"
    );
    // The running pods' apps now see their pod address as their own (the new map was filled
    // from the registry), with their socket's real port.
    for (world, proxy) in [(&world, &proxy), (&world2, &proxy2)] {
        let before = proxy_view(proxy).0.len();
        let r = run(world.out_client(1));
        assert_eq!(r.succeeded, 1, "{r:?}");
        wait_accepted(proxy, before + 1);
        let app_side = proxy
            .events()
            .expect("proxy log")
            .iter()
            .filter_map(|e| match e {
                Event::Accepted { peer, .. } => Some(*peer),
                _ => None,
            })
            .nth(before)
            .expect("the connection's accept");
        assert_eq!(
            r.local,
            Some(sock(world.net.pod_v4(), app_side.port())),
            "getsockname after the upgrade: {r:?}"
        );
    }
    assert!(!pin_root.join(paths::PIN_NEXT).exists(), "staging removed");

    // Rollback from a newer layout that declares this agent able to read it, with a map of
    // another capacity: migrated back the same way, under load.
    h.kill();
    layout::make_newer_readable_layout(pin_root).expect("a newer readable layout");
    let cfg_pin = maps.join(names::MAP_POD_CONFIG);
    under_load(&[(&world, &proxy), (&world2, &proxy2)], || h.start_again());
    let info = map_info(&cfg_pin);
    assert_eq!(
        (info.max_entries, info.btf_id != 0),
        (MAX_PODS, true),
        "{info:?}"
    );
    assert_eq!(meta(pin_root).map(|m| m.version), Some(LAYOUT_VERSION));
    for r in [&record, &record2] {
        h.agent().check(&r.id).expect("the pod is in force");
    }
}

#[test]
fn an_unknown_newer_layout_is_refused_and_nothing_is_touched() {
    let mut h = AgentHarness::new(None);
    let world = World::new();
    h.register(&world.net.pod, LinkerdConfig::default(), true);
    let proxy = world.proxy();
    h.kill();
    let pin_root = h.config().pin_root.clone();
    set_meta(&pin_root, 99, 99);
    let before = pinned_ids(&pin_root);

    let err = match Agent::start(h.config().clone()) {
        Ok(_) => panic!("an agent started on state of layout 99"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("layout version 99") && err.contains("refusing"),
        "unclear error: {err}"
    );
    assert_eq!(pinned_ids(&pin_root), before, "pinned state changed");
    assert_eq!(
        meta(&pin_root),
        Some(LayoutMeta {
            version: 99,
            oldest_reader: 99
        })
    );
    // What runs keeps running.
    let r = run(world.out_client(1));
    assert_eq!(r.succeeded, 1, "{r:?}");
    wait_accepted(&proxy, 1);
    assert_eq!(proxy_view(&proxy).0, vec![(proxy_addr(), world.outbound())]);
    // Let the harness clean up with an agent of this layout.
    set_meta(&pin_root, LAYOUT_VERSION, 1);
}

fn proxy_addr() -> SocketAddr {
    sock(Ipv4Addr::LOCALHOST, proxy::OUTBOUND_PORT)
}

#[test]
fn a_socket_map_whose_sockets_cannot_be_carried_over_is_refused() {
    let mut h = AgentHarness::new(None);
    let world = World::new();
    h.register(&world.net.pod, LinkerdConfig::default(), true);
    let _proxy = world.proxy();
    h.kill();
    let pin_root = h.config().pin_root.clone();
    let pin = pin_root.join(paths::PIN_MAPS).join(names::MAP_LISTENERS);
    // A listener map of another key layout, holding a listening socket.
    let info = map_info(&pin);
    let other = bpf::map_create(
        info.map_type,
        info.key_size + 8,
        info.value_size,
        info.max_entries,
        info.map_flags,
        names::MAP_LISTENERS,
        None,
    )
    .expect("create a socket map of another layout");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
    let key = vec![0u8; (info.key_size + 8) as usize];
    let fd = std::os::fd::AsRawFd::as_raw_fd(&listener) as u32;
    bpf::map_update(&other, &key, &fd.to_ne_bytes()).expect("insert the listener");
    let original = bpf::obj_get(&pin).expect("open the original map");
    fs::remove_file(&pin).expect("unpin");
    bpf::obj_pin(&other, &pin).expect("pin the other layout's map");
    let before = pinned_ids(&pin_root);

    let err = match Agent::start(h.config().clone()) {
        Ok(_) => panic!("an agent dropped the sockets of a socket map"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains(names::MAP_LISTENERS) && err.contains("1 sockets") && err.contains("refusing"),
        "unclear error: {err}"
    );
    assert_eq!(pinned_ids(&pin_root), before, "pinned state changed");
    // Put the original back so the harness cleans up with an agent.
    fs::remove_file(&pin).expect("unpin");
    bpf::obj_pin(&original, &pin).expect("pin the original map back");
    h.start_again();
}

/// A hash map walked key by key goes back to its first key when the key in hand was deleted
/// meanwhile (the kernel's `BPF_MAP_GET_NEXT_KEY`, asked here): under load such a walk need not
/// end. The layout migration's copy walks hash maps by bucket (`BPF_MAP_LOOKUP_BATCH`) instead:
/// with one thread adding and deleting entries as fast as it can, the copy ends and carries
/// every entry that was there throughout.
#[test]
fn copying_a_hash_map_whose_entries_come_and_go_ends_and_keeps_the_steady_ones() {
    use linkerd_cni_agent::dataplane::layout::{MapSpec, copy_entries};
    const STEADY: u32 = 20_000;
    let create = |name: &str| {
        bpf::map_create(uapi::MAP_TYPE_HASH, 4, 8, 65536, 0, name, None).expect("create a hash map")
    };
    let (from, to) = (create("l5dt_from"), create("l5dt_to"));

    // The kernel's key-by-key walk: a deleted key in hand restarts it.
    for k in [1u32, 2, 3] {
        bpf::map_update(&from, &k.to_ne_bytes(), &u64::from(k).to_ne_bytes()).expect("insert");
    }
    let mut first = [0u8; 4];
    assert!(bpf::map_next_key(&from, None, &mut first).expect("first key"));
    let mut second = [0u8; 4];
    assert!(bpf::map_next_key(&from, Some(&first), &mut second).expect("second key"));
    assert_ne!(first, second);
    bpf::map_delete(&from, &second).expect("delete the key in hand");
    let mut after = [0u8; 4];
    assert!(bpf::map_next_key(&from, Some(&second), &mut after).expect("next of a deleted key"));
    assert_eq!(after, first, "the walk went back to the first key");
    for k in [1u32, 2, 3] {
        let _ = bpf::map_delete(&from, &k.to_ne_bytes());
    }

    for k in 0..STEADY {
        bpf::map_update(&from, &k.to_ne_bytes(), &u64::from(k).to_ne_bytes()).expect("insert");
    }
    let stop = Arc::new(AtomicBool::new(false));
    let (churning, churn_started) = std::sync::mpsc::channel();
    let churn = {
        let stop = stop.clone();
        let from = from.try_clone().expect("dup the map fd");
        // Connections opening in bursts and closing: a thousand entries added, then deleted.
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                for k in STEADY..STEADY + 1000 {
                    bpf::map_update(&from, &k.to_ne_bytes(), &0u64.to_ne_bytes())
                        .expect("churn insert");
                }
                for k in STEADY..STEADY + 1000 {
                    bpf::map_delete(&from, &k.to_ne_bytes()).expect("churn delete");
                }
                let _ = churning.send(());
            }
        })
    };
    churn_started.recv().expect("the churn thread runs");
    let spec = MapSpec {
        name: "l5dt_from".into(),
        map_type: uapi::MAP_TYPE_HASH,
        key_size: 4,
        value_size: 8,
        max_entries: 65536,
        map_flags: 0,
        typed: false,
    };
    let started = Instant::now();
    let (done, copy) = std::sync::mpsc::channel();
    {
        let (from, to) = (from.try_clone().expect("dup"), to.try_clone().expect("dup"));
        // A walk that never ends is left running: the process ends with the test binary.
        thread::spawn(move || {
            let _ = done.send(copy_entries(&from, &to, &spec));
        });
    }
    let copied = copy.recv_timeout(TIMEOUT);
    let took = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    churn.join().expect("churn thread");
    let copied = copied
        .unwrap_or_else(|_| panic!("the copy had not ended after {took:?}"))
        .expect("copy");
    assert!(copied >= u64::from(STEADY), "copied {copied}");
    for k in 0..STEADY {
        let mut value = [0u8; 8];
        assert!(
            bpf::map_lookup(&to, &k.to_ne_bytes(), &mut value).expect("lookup"),
            "steady key {k} was not copied"
        );
        assert_eq!(u64::from_ne_bytes(value), u64::from(k));
    }
}
