//! kubelet's systemd cgroup driver on cgroup v2, as most real nodes run it (root required):
//! `kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid with _>.slice`, guaranteed pods
//! directly under `kubepods.slice`, each container in a `cri-containerd-<id>.scope` below its
//! pod's slice. For each QoS class, two pods side by side in the same slice, one registered
//! with containerd's `runtimeConfig.cgroupPath` (the pod's slice name) and one with only its
//! pod UID: the agent must find each pod's own slice (not its QoS slice, not its container's
//! scope, not its neighbour's), attach there, and its container's connections must reach that
//! pod's proxy with their original destination.
//!
//! Under `cargo xtask vmtest` this runs on a pure cgroup v2 hierarchy at `/sys/fs/cgroup`; on
//! a hybrid host, under its cgroup2 mount.
//!
//! Run: `cargo test -p linkerd-cni-tests --test cgroup_layout -- --test-threads=1`

use std::{
    fs,
    net::{IpAddr, SocketAddr},
    path::{Path, PathBuf},
    time::Duration,
};

use linkerd_cni_agent::{
    Registration,
    agent::registry::{Attachment, PodRecord},
};
use linkerd_cni_proto::{config::LinkerdConfig, wire::PodRef};
use linkerd_cni_tests::{
    AgentHarness, CgroupGuard, EchoServer, PodAndPeer, TestProxy,
    cgroup::cgroup2_root,
    client::{Options as ClientOptions, run_client},
    names::unique_name,
    proxy::{self, Event},
};

const TIMEOUT: Duration = Duration::from_secs(30);
const APP_UID: u32 = 1000;
const SERVER_PORT: u16 = 8080;

/// A pod as kubelet's systemd driver lays it out, with a server beside it and its proxy.
/// Fields drop in order: the proxy, the server, the netns and container scope, the slice.
struct SystemdPod {
    proxy: TestProxy,
    server: EchoServer,
    net: PodAndPeer,
    /// The pod's slice.
    slice: CgroupGuard,
    uid: String,
}

impl SystemdPod {
    /// A pod of QoS class `qos` (`""` for guaranteed).
    fn new(qos: &str) -> Self {
        // A pod UID: 8-4-4-4-12 hex digits, unique on this machine while the test runs.
        let n = unique_name();
        let tail: String = format!("{:012x}", fnv(&n)).chars().take(12).collect();
        let uid = format!(
            "7e57c9a0-{:04x}-4c1d-8a6e-{tail}",
            std::process::id() & 0xffff
        );
        let slice_path = slice_of(qos, &uid);
        let slice = CgroupGuard::at(&slice_path).expect("create the pod's slice");
        let scope = CgroupGuard::at(&slice_path.join(format!("cri-containerd-{tail}.scope")))
            .expect("create the container's scope");
        let mut net = PodAndPeer::new().expect("create pod, peer netns and veth");
        // The pod's containers run in the scope, as under containerd; the guard made by
        // `PodAndPeer` (an `l5dt-*` cgroup) goes.
        net.pod.cgroup = scope;
        let server = EchoServer::bind_in(
            &net.peer,
            SocketAddr::new(net.peer_v4().into(), SERVER_PORT),
            "server",
        )
        .expect("start server");
        let proxy = net
            .pod
            .start_proxy(&proxy::Options::new())
            .expect("start the proxy in the container's scope");
        SystemdPod {
            proxy,
            server,
            net,
            slice,
            uid,
        }
    }

    /// Registers the pod as the plugin does at ADD: its pod UID always, containerd's
    /// `cgroupPath` (the pod's slice name) when `with_cgroup_path`.
    fn register(&self, h: &AgentHarness, qos: &str, with_cgroup_path: bool) -> PodRecord {
        let slice_name = slice_of(qos, &self.uid)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned());
        h.agent()
            .register(Registration {
                id: format!("ctr-{}", self.net.pod.netns.name()),
                ifname: "eth0".into(),
                netns: self.net.pod.netns.path().into(),
                cgroup_hint: slice_name.filter(|_| with_cgroup_path),
                pod: Some(PodRef {
                    namespace: "default".into(),
                    name: format!("pod-{}", &self.uid[..8]),
                    uid: Some(self.uid.clone()),
                }),
                config: LinkerdConfig::default(),
                pod_ips: vec![],
            })
            .expect("register the pod")
    }
}

/// `kubepods.slice[/kubepods-<qos>.slice]/kubepods[-<qos>]-pod<uid with _>.slice`.
fn slice_of(qos: &str, uid: &str) -> PathBuf {
    let uid = uid.replace('-', "_");
    let mut path = PathBuf::from("kubepods.slice");
    if qos.is_empty() {
        path.push(format!("kubepods-pod{uid}.slice"));
    } else {
        path.push(format!("kubepods-{qos}.slice"));
        path.push(format!("kubepods-{qos}-pod{uid}.slice"));
    }
    path
}

/// A cgroup directory shared by the pods of a test (`kubepods.slice`, a QoS slice): made if
/// missing, and then removed on drop, after the pods' own slices are gone.
struct SharedSlice(Option<PathBuf>);

impl SharedSlice {
    fn at(root: &Path, relative: &str) -> Self {
        let path = root.join(relative);
        match fs::create_dir(&path) {
            Ok(()) => SharedSlice(Some(path)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => SharedSlice(None),
            Err(e) => panic!("creating cgroup {}: {e}", path.display()),
        }
    }
}

impl Drop for SharedSlice {
    fn drop(&mut self) {
        if let Some(path) = &self.0 {
            let _ = fs::remove_dir(path);
        }
    }
}

fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[test]
fn each_pod_of_each_qos_class_is_attached_at_its_own_slice_with_and_without_cgroup_path() {
    let h = AgentHarness::new(None);
    let root = cgroup2_root().expect("cgroup2 mount");
    let _kubepods = SharedSlice::at(&root, "kubepods.slice");
    for qos in ["", "burstable", "besteffort"] {
        let class = if qos.is_empty() { "guaranteed" } else { qos };
        let _qos_slice = (!qos.is_empty())
            .then(|| SharedSlice::at(&root, &format!("kubepods.slice/kubepods-{qos}.slice")));
        // Two pods side by side in the same QoS slice.
        let pods = [SystemdPod::new(qos), SystemdPod::new(qos)];
        for (pod, with_cgroup_path) in pods.iter().zip([true, false]) {
            let record = pod.register(&h, qos, with_cgroup_path);
            let want = root.join(slice_of(qos, &pod.uid));
            assert_eq!(want, pod.slice.path(), "the test's own layout");
            match &record.attachment {
                Attachment::PerPod { cgroup } => assert_eq!(
                    cgroup, &want,
                    "{class} pod (cgroupPath given: {with_cgroup_path}) attached elsewhere"
                ),
                other => panic!(
                    "{class} pod (cgroupPath given: {with_cgroup_path}) not attached per pod: \
                     {other:?}"
                ),
            }
        }
        for (pod, with_cgroup_path) in pods.iter().zip([true, false]) {
            let report = run_client(
                &pod.net.pod.container(APP_UID),
                &ClientOptions::new(pod.server.addr()).send("hello\n"),
                TIMEOUT,
            )
            .expect("run the test client in the container's scope");
            assert_eq!(
                report.succeeded, 1,
                "{class} pod (cgroupPath given: {with_cgroup_path}): {report:?}"
            );
            assert_eq!(report.peer, Some(pod.server.addr()), "the app's peer");
            let events = pod
                .proxy
                .log()
                .wait_for_accepted(1, TIMEOUT)
                .expect("the pod's own proxy accepted the connection");
            let orig: Vec<SocketAddr> = events
                .iter()
                .filter_map(|e| match e {
                    Event::Accepted { orig_dst, .. } => Some(*orig_dst),
                    _ => None,
                })
                .collect();
            assert_eq!(
                orig,
                vec![pod.server.addr()],
                "{class} pod (cgroupPath given: {with_cgroup_path}): SO_ORIGINAL_DST"
            );
            let got = pod.server.wait_for(1, TIMEOUT).expect("server saw it");
            assert_eq!(
                got[0].peer.ip(),
                IpAddr::V4(pod.net.pod_v4()),
                "the server saw the pod's address (through its proxy)"
            );
        }
        for pod in &pods {
            h.agent()
                .unregister(&format!("ctr-{}", pod.net.pod.netns.name()))
                .expect("unregister");
        }
    }
}
