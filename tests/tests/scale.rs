//! A node of many pods: map capacities come from the agent's configuration (a node configured
//! for more pods than the object's default of 4,096 gets maps that large, and an agent
//! restarted with other sizes resizes the pinned maps while every registered pod keeps its
//! entries), a reconcile pass verifies a bounded share of the pods, round-robin, and makes a
//! bounded number of `bpf()` calls per pod (counted with strace).

use linkerd_cni_sys::bpf;
use std::{path::Path, sync::Arc};

use linkerd_cni_agent::{
    Agent, AgentConfig, Registration, agent::reconcile::Reconciler, dataplane,
    dataplane::capacity::MapSizes,
};
use linkerd_cni_common::{names, paths};
use linkerd_cni_proto::config::LinkerdConfig;
use linkerd_cni_tests::{AgentHarness, Pod, strace};

fn max_entries(pin_root: &Path, map: &str) -> u32 {
    let path = pin_root.join(paths::PIN_MAPS).join(map);
    let fd = bpf::obj_get(&path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    bpf::map_info(fd).expect("map info").max_entries
}

#[test]
fn maps_are_sized_from_configuration_and_resized_at_restart_keeping_pods() {
    let big = MapSizes {
        pods: 12_288,
        port_blocks: 70_000,
        addrs: 90_000,
        conns: 100_000,
    };
    let config = AgentConfig {
        map_sizes: big,
        ..AgentHarness::fresh_config()
    };
    let mut h = AgentHarness::stopped_on(config.clone());
    h.start_again();
    let root = config.pin_root.clone();
    for (map, want) in [
        (names::MAP_POD_CONFIG, 12_288),
        (names::MAP_POD_STATS, 12_288),
        (names::MAP_LISTENERS, 24_576),
        (names::MAP_PORT_SETS, 70_000),
        (names::MAP_ADDRS, 90_000),
        (names::MAP_POD_BY_IP, 90_000),
        (names::MAP_SOCK_DST, 100_000),
        (names::MAP_CONN_DST, 100_000),
    ] {
        assert_eq!(max_entries(&root, map), want, "{map} as configured");
    }
    // The one-entry and program maps keep the object's sizes.
    assert_eq!(max_entries(&root, names::MAP_META), 1);

    let pod = Pod::new().expect("pod");
    let record = h.register(&pod, LinkerdConfig::default(), true);
    assert!(h.maps().pod_config(record.netns_cookie).is_some());

    // Smaller again (the default): the maps are replaced, the pod's entries carried over.
    h.kill();
    // The next harness cleans up the same pins and registry: the killed one must not (its drop
    // would start an agent with the large sizes again).
    std::mem::forget(h);
    let mut h = AgentHarness::stopped_on(AgentConfig {
        map_sizes: MapSizes::default(),
        ..config.clone()
    });
    h.start_again();
    // Maps rewritten from the registry take the new size; the maps the programs fill per
    // connection and socket are kept as pinned (replacing them would drop live connections
    // and listeners): they take a new size only on an empty bpffs (a node reboot).
    assert_eq!(max_entries(&root, names::MAP_POD_CONFIG), names::MAX_PODS);
    assert_eq!(
        max_entries(&root, names::MAP_PORT_SETS),
        names::MAX_PORT_BLOCKS
    );
    assert_eq!(max_entries(&root, names::MAP_LISTENERS), 24_576);
    assert_eq!(max_entries(&root, names::MAP_CONN_DST), 100_000);
    assert!(
        h.maps().pod_config(record.netns_cookie).is_some(),
        "the registered pod's config survived the resize"
    );
    assert_eq!(h.agent().pods().expect("pods").len(), 1);
}

#[test]
fn out_of_range_sizes_are_refused_by_the_agent_binary() {
    let out = std::process::Command::new(
        linkerd_cni_tests::node::workspace_bin("linkerd-cni-agent").expect("agent binary"),
    )
    .args(["--max-pods", "0", "--pin-root", "/nonexistent-l5d", "load"])
    .output()
    .expect("run the agent");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("pods = 0"), "{stderr}");
}

#[test]
fn reconcile_passes_take_a_bounded_share_of_the_pods_round_robin() {
    let config = AgentHarness::fresh_config();
    // Cleans up (restarts an agent on these pins and unregisters everything) on drop.
    let _cleanup = AgentHarness::stopped_on(config.clone());
    let agent = Arc::new(Agent::start(config.clone()).expect("agent"));
    let pods: Vec<Pod> = (0..3).map(|_| Pod::new().expect("pod")).collect();
    let mut dirs = Vec::new();
    for (i, pod) in pods.iter().enumerate() {
        let record = agent
            .register(Registration {
                id: format!("ctr-rr-{i}"),
                ifname: "eth0".into(),
                netns: pod.netns.path().into(),
                cgroup_hint: Some(pod.cgroup.path().display().to_string()),
                pod: None,
                config: LinkerdConfig::default(),
                pod_ips: vec![],
            })
            .expect("register");
        dirs.push(agent.link_dir(&record).expect("redirected"));
    }
    let in_force = |dir: &Path| dataplane::links_in_force(dir, &names::ALL_PROGRAMS).is_ok();
    // Every pod's links unpinned (and so detached).
    for dir in &dirs {
        for name in names::ALL_PROGRAMS {
            std::fs::remove_file(dir.join(name)).expect("unpin");
        }
        assert!(!in_force(dir));
    }
    let reconciler = Reconciler::new(agent.clone(), Path::new(paths::BPFFS)).with_pods_per_pass(2);
    reconciler.run_once();
    let fixed: Vec<bool> = dirs.iter().map(|d| in_force(d)).collect();
    assert_eq!(
        fixed,
        [true, true, false],
        "the first pass verifies the first two pods"
    );
    reconciler.run_once();
    assert!(
        dirs.iter().all(|d| in_force(d)),
        "the second pass continues with the third"
    );
    drop(reconciler);
    drop(agent);
}

/// What a reconcile pass costs per pod in `bpf()` calls, counted by strace on the thread that
/// runs it: verifying a pod's links (one per cgroup hook and the netns's: a pin open and a
/// link info each), its map entries (a lookup each: at most 4 for these pods) and where its
/// programs run (its cgroup's hooks and its netns): with `h` cgroup hooks at most
/// 2(h+1) + 4 + (h+1) = 3h + 7 per pod (25 with six hooks, 31 with eight since getsockname's;
/// 30 measured); the parent cgroup's hooks are read once per pass, not once per pod. Before
/// the pass reused what it had read, the order checks opened the links again and queried the
/// parent per pod: 44 per pod with six hooks (352 for the 8 pods).
#[test]
fn a_reconcile_pass_reads_each_link_once_and_the_parent_once_per_pass() {
    const PODS: usize = 8;
    let config = AgentHarness::fresh_config();
    let _cleanup = AgentHarness::stopped_on(config.clone());
    let agent = Arc::new(Agent::start(config.clone()).expect("agent"));
    let pods: Vec<Pod> = (0..PODS).map(|_| Pod::new().expect("pod")).collect();
    for (i, pod) in pods.iter().enumerate() {
        agent
            .register(Registration {
                id: format!("ctr-calls-{i}"),
                ifname: "eth0".into(),
                netns: pod.netns.path().into(),
                cgroup_hint: Some(pod.cgroup.path().display().to_string()),
                pod: None,
                config: LinkerdConfig::default(),
                pod_ips: vec![],
            })
            .expect("register");
    }
    let reconciler = Reconciler::new(agent.clone(), Path::new(paths::BPFFS));
    // The pass runs on a thread of its own, counted alone once strace is attached to it.
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let passes = std::thread::scope(|s| {
        let reconciler = &reconciler;
        let pass = s.spawn(move || {
            tid_tx
                .send(nix::unistd::gettid().as_raw())
                .expect("send tid");
            go_rx.recv().expect("go");
            reconciler.run_once()
        });
        let tid = tid_rx.recv().expect("the pass thread's id");
        let counter = strace::Counter::attach(tid as u32, false, "bpf")
            .expect("strace (Debian package strace) attached to the pass thread");
        go_tx.send(()).expect("go");
        let repairs = pass.join().expect("the pass");
        let calls = counter.finish().expect("strace's counts");
        (repairs, calls)
    });
    let (repairs, calls) = passes;
    assert!(repairs.is_empty(), "nothing to repair: {repairs:?}");
    let bpf = calls.get("bpf").copied().unwrap_or(0);
    eprintln!("{bpf} bpf() calls for {PODS} pods: {calls:?}");
    assert!(bpf > 0, "strace counted the pass: {calls:?}");
    let hooks = names::CGROUP_PROGRAMS.len() as u64;
    let per_pod = 3 * hooks + 7;
    assert!(
        bpf <= PODS as u64 * per_pod + hooks,
        "{bpf} bpf() calls for a pass over {PODS} pods: more than {per_pod} per pod and the \
         parent's {hooks} once"
    );
    drop(reconciler);
    drop(agent);
}
