//! A hostile peer of the registration socket (root required): a root process of our own
//! speaking the socket's protocol to the agent running as a real process (`SimNode`), with
//! what a runtime would never send. Each case asserts the agent's answer, that the meshed pod
//! already on the node kept its registration, links and map entries, and that the agent's
//! descriptor and thread counts are back where they were (issue 45).
//!
//! - descriptors: 1000 requests each carrying two descriptors leave none open in the agent;
//! - a FIFO named as a netns is refused at once (never opened blocking), many at once wedge
//!   nothing: an honest ADD is served right after and `/ready` says 200;
//! - a refused ADD under another id naming a meshed pod's netns leaves that pod's entries;
//! - a cgroup hint through a symbolic link is recorded resolved: retargeting the link and
//!   removing a link pin makes the repair re-attach to the pod's cgroup, never elsewhere;
//! - addresses a peer claims for its netns that another pod holds are ignored;
//! - what already held: the host's netns by path, `..`, a symbolic link, a bind mount of the
//!   host's netns in the netns directory, a socket from another netns, a cgroup outside the
//!   pod trees, an oversized and a stalled frame.
//!
//! Run: `cargo build --bins && cargo test -p linkerd-cni-tests --test hostile_peer -- --test-threads=1`

use std::{
    ffi::CString,
    fs,
    io::{Read, Write},
    net::IpAddr,
    os::{
        fd::{AsRawFd, RawFd},
        unix::net::{UnixDatagram, UnixStream},
    },
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use linkerd_cni_proto::{
    config::LinkerdConfig,
    wire::{self, AddRequest, AttachmentRef, Envelope, PodRef, Request},
};
use linkerd_cni_tests::{
    CgroupGuard,
    netns::NETNS_RUN_DIR,
    node::{
        AgentState, NODE_NAME, NodeOptions, PodSpec, SimNode, SimPod, http_get, namespace_manifest,
        wait_until,
    },
};
use serde_json::Value;

fn start(opts: NodeOptions) -> SimNode {
    SimNode::start(opts, &[namespace_manifest("shop", &[])])
        .unwrap_or_else(|e| panic!("starting the simulated node: {e}"))
}

fn state(node: &SimNode) -> AgentState {
    node.state()
        .unwrap_or_else(|e| panic!("reading the agent's state: {e}"))
}

fn agent_pid(node: &SimNode) -> u32 {
    node.agent().expect("the agent runs").pid()
}

/// The agent's open descriptors and threads.
fn counts(pid: u32) -> (usize, usize) {
    let n = |d: &str| {
        fs::read_dir(format!("/proc/{pid}/{d}"))
            .unwrap_or_else(|e| panic!("/proc/{pid}/{d}: {e}"))
            .count()
    };
    (n("fd"), n("task"))
}

/// Descriptors and threads the agent may have more than before without a leak: runtime
/// threads started meanwhile, connections still closing.
const SLACK: usize = 16;

fn assert_no_growth(node: &SimNode, before: (usize, usize), what: &str) {
    let pid = agent_pid(node);
    // Connections the agent has not finished closing yet: give it a moment.
    let mut after = counts(pid);
    for _ in 0..50 {
        if after.0 <= before.0 + SLACK && after.1 <= before.1 + SLACK {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        after = counts(pid);
    }
    assert!(
        after.0 <= before.0 + SLACK,
        "{what}: the agent's descriptors grew from {} to {}",
        before.0,
        after.0
    );
    assert!(
        after.1 <= before.1 + SLACK,
        "{what}: the agent's threads grew from {} to {}",
        before.1,
        after.1
    );
}

/// A meshed pod on the node, and what the agent holds for it.
struct Victim {
    pod: SimPod,
    cookie: u64,
    record: Value,
    entries: Vec<String>,
    links: Vec<String>,
}

impl Victim {
    fn new(node: &SimNode, name: &str) -> Self {
        let pod = node.added_pod(PodSpec::meshed("shop", name));
        Self::of(node, pod)
    }

    fn of(node: &SimNode, pod: SimPod) -> Self {
        let cookie = pod.cookie().expect("the pod's netns cookie");
        let st = state(node);
        let record = st.record(&pod.container_id).expect("the pod is registered");
        let entries = st.entries_for(cookie);
        assert!(
            entries.iter().any(|e| e.starts_with("pod_config")),
            "{entries:?}"
        );
        let links = st
            .links_of(&pod.container_id)
            .into_iter()
            .cloned()
            .collect();
        Self {
            pod,
            cookie,
            record,
            entries,
            links,
        }
    }

    /// The pod's registration, links and map entries are as they were.
    fn assert_unchanged(&self, node: &SimNode, what: &str) {
        let st = state(node);
        assert_eq!(
            st.record(&self.pod.container_id).as_ref(),
            Some(&self.record),
            "{what}: the meshed pod's record changed"
        );
        assert_eq!(
            st.entries_for(self.cookie),
            self.entries,
            "{what}: the meshed pod's map entries changed"
        );
        let links: Vec<String> = st
            .links_of(&self.pod.container_id)
            .into_iter()
            .cloned()
            .collect();
        assert_eq!(links, self.links, "{what}: the meshed pod's links changed");
    }
}

/// Sends `body` as one frame with `fds` attached to its first byte; returns the answer.
fn request_with_fds(socket: &Path, body: &[u8], fds: &[RawFd]) -> Value {
    let conn = UnixStream::connect(socket).unwrap_or_else(|e| panic!("connecting: {e}"));
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("read timeout");
    let mut frame = (body.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(body);
    send_fds(conn.as_raw_fd(), &frame, fds);
    read_answer(conn)
}

fn read_answer(mut conn: UnixStream) -> Value {
    let mut header = [0u8; 4];
    conn.read_exact(&mut header)
        .unwrap_or_else(|e| panic!("reading the answer's header: {e}"));
    let mut body = vec![0u8; u32::from_be_bytes(header) as usize];
    conn.read_exact(&mut body).expect("the answer");
    serde_json::from_slice(&body).expect("an answer in JSON")
}

/// `sendmsg` of `bytes` with `fds` in one `SCM_RIGHTS` message (none: a plain send).
fn send_fds(sock: RawFd, bytes: &[u8], fds: &[RawFd]) {
    // SAFETY: the test's socket, open for the duration of the call.
    let sock = unsafe { std::os::fd::BorrowedFd::borrow_raw(sock) };
    let sent = linkerd_cni_sys::sock::send_with_fds(sock, bytes, fds, 0);
    assert_eq!(sent.expect("sendmsg"), bytes.len());
}

/// An ADD as the plugin would send it for `pod`, with its netns, id and cgroup replaced.
fn add_body(
    pod: &SimPod,
    id: &str,
    netns: &str,
    cgroup: Option<&str>,
    netns_addrs: Option<Vec<IpAddr>>,
) -> Vec<u8> {
    let env = Envelope::new(Request::Add(Box::new(AddRequest {
        attachment: AttachmentRef {
            container_id: id.into(),
            ifname: "eth0".into(),
            netns: netns.into(),
        },
        pod: PodRef {
            namespace: pod.spec.namespace.clone(),
            name: pod.spec.name.clone(),
            uid: Some(pod.spec.uid.clone()),
        },
        cgroup_path: cgroup.map(str::to_string),
        pod_ips: Vec::new(),
        config: LinkerdConfig::default(),
        netns_addrs,
        userns: None,
    })));
    serde_json::to_vec(&env).expect("encode")
}

fn status_body() -> Vec<u8> {
    serde_json::to_vec(&Envelope::new(Request::Status)).expect("encode")
}

fn is_error(answer: &Value) -> bool {
    answer["result"] == "error"
}

fn ready(node: &SimNode) -> u16 {
    let addr = node.agent().expect("the agent").health_addr();
    http_get(addr, "/ready", Duration::from_secs(5))
        .map(|(code, _)| code)
        .unwrap_or(0)
}

/// A path in the netns directory, removed on drop.
struct Planted(PathBuf);

impl Planted {
    fn new() -> Self {
        Self(PathBuf::from(NETNS_RUN_DIR).join(linkerd_cni_tests::names::unique_name()))
    }
}

impl Drop for Planted {
    fn drop(&mut self) {
        let c = CString::new(self.0.as_os_str().as_encoded_bytes()).expect("a path");
        // SAFETY: a plain umount2 of a path we may have bind-mounted; failure is fine.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        let _ = fs::remove_file(&self.0);
    }
}

/// D3: every descriptor a request carries is taken and closed. 1000 requests with two each
/// (one more than the plugin ever sends) leave the agent's descriptor count where it was;
/// before, each left one open (the second fit in the room for one on 64-bit).
#[test]
fn descriptors_sent_with_requests_are_all_closed() {
    let node = start(NodeOptions::default());
    let victim = Victim::new(&node, "kept");
    let before = counts(agent_pid(&node));
    let a = fs::File::open("/dev/null").expect("/dev/null");
    let b = fs::File::open("/dev/null").expect("/dev/null");
    let body = status_body();
    for i in 0..1000 {
        let answer = request_with_fds(&node.socket(), &body, &[a.as_raw_fd(), b.as_raw_fd()]);
        assert_eq!(answer["result"], "status", "request {i}: {answer}");
    }
    // More than the agent has room for: refused, and closed all the same.
    let many: Vec<RawFd> = (0..20).map(|_| a.as_raw_fd()).collect();
    for _ in 0..50 {
        let conn = UnixStream::connect(node.socket()).expect("connect");
        conn.set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        let mut frame = (body.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(&body);
        send_fds(conn.as_raw_fd(), &frame, &many);
        let mut answer = Vec::new();
        let _ = (&conn).read_to_end(&mut answer);
    }
    assert_no_growth(&node, before, "1000 requests with two descriptors");
    victim.assert_unchanged(&node, "descriptors");
    assert_eq!(ready(&node), 200);
}

/// D4: a FIFO in the netns directory named as a pod's netns is refused at once, however
/// many peers name it together (never opened blocking: before, each such ADD held a
/// blocking thread until a writer came, for ever); an honest ADD is served right after and
/// `/ready` says 200.
#[test]
fn a_fifo_named_as_a_netns_wedges_nothing() {
    let node = start(NodeOptions::default());
    let victim = Victim::new(&node, "kept");
    let before = counts(agent_pid(&node));
    let fifo = Planted::new();
    let c = CString::new(fifo.0.as_os_str().as_encoded_bytes()).expect("a path");
    // SAFETY: mkfifo of a new path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    let fifo_path = fifo.0.display().to_string();
    let started = Instant::now();
    let answers: Vec<Value> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..24)
            .map(|i| {
                let body = add_body(&victim.pod, &format!("fifo-{i}"), &fifo_path, None, None);
                let socket = node.socket();
                s.spawn(move || request_with_fds(&socket, &body, &[]))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a peer"))
            .collect()
    });
    for answer in &answers {
        assert!(is_error(answer), "a FIFO is no netns: {answer}");
        let message = answer["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("not a network namespace") || message.contains("netns"),
            "{message}"
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "24 ADDs naming a FIFO took {:?}: something waited on it",
        started.elapsed()
    );
    let honest = node.added_pod(PodSpec::meshed("shop", "honest"));
    assert!(state(&node).registered().contains(&honest.container_id));
    assert_eq!(ready(&node), 200);
    assert_no_growth(&node, before, "ADDs naming a FIFO");
    victim.assert_unchanged(&node, "FIFO");
}

/// D2: an ADD under a new id naming an already-meshed pod's netns, refused after its entries
/// were written (here: its cgroup holds another tenant's exclusive program, so the attach
/// fails), rolls back only what it wrote: the meshed pod keeps its config entry (before, the
/// rollback deleted it and the pod's app connected past its proxy).
#[test]
fn a_refused_add_naming_a_meshed_pods_netns_leaves_that_pod_alone() {
    use linkerd_cni_tests::tenant::{How, SocketLb};
    let node = start(NodeOptions::default());
    let victim = Victim::new(&node, "kept");
    let before = counts(agent_pid(&node));
    let blocked = CgroupGuard::new().expect("a cgroup");
    let mut tenant = SocketLb::load(
        "192.0.2.1:80".parse().expect("vip"),
        "192.0.2.2:80".parse().expect("backend"),
    )
    .expect("the tenant's programs");
    tenant
        .attach(blocked.path(), How::Exclusive)
        .expect("an exclusive program on the cgroup");
    let netns = victim.pod.netns_path().display().to_string();
    let cgroup = blocked.path().display().to_string();
    for i in 0..3 {
        let id = format!("{}-again{i}", victim.pod.container_id);
        let body = add_body(&victim.pod, &id, &netns, Some(&cgroup), None);
        let answer = request_with_fds(&node.socket(), &body, &[]);
        assert!(is_error(&answer), "refused: {answer}");
        let st = state(&node);
        assert!(!st.registered().contains(&id), "not registered");
        assert!(st.links_of(&id).is_empty(), "no links");
        victim.assert_unchanged(&node, "a refused ADD in the same netns");
    }
    tenant.detach_all();
    assert_no_growth(&node, before, "refused ADDs");
    // Where operators look (issue 44): the refusal is an Event on the pod the ADD named, as
    // the API holds it (written in the background, the three refusals aggregated into one).
    let events = || {
        node.apiserver()
            .event_reasons("shop", "kept")
            .unwrap_or_else(|e| panic!("listing Events: {e}"))
    };
    wait_until("the refusal's Event", Duration::from_secs(10), || {
        events()
            .iter()
            .any(|r| r == "LinkerdCNIRefused")
            .then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}; Events on the pod: {:?}", events()));
}

/// D1: a cgroup hint through a symbolic link (`<cgroup2>/../../<dir>/l`, `l` pointing at the
/// pod's cgroup) is recorded resolved. Retargeting the link at a cgroup outside the pod trees
/// and removing one link pin, the repair CHECK triggers re-attaches to the pod's own cgroup;
/// nothing is ever attached to the other (before, the repair followed the link there).
#[test]
fn a_cgroup_hint_through_a_symlink_is_recorded_resolved_and_repairs_stay_there() {
    let opts = NodeOptions {
        pod_cgroup_trees: vec!["kubepods".into(), "kubepods.slice".into()],
        ..NodeOptions::default()
    };
    let node = start(opts);
    let spec = PodSpec::meshed("shop", "linked");
    node.apply(&[spec.manifest(NODE_NAME)])
        .expect("the pod's manifest");
    let pod = SimPod::new_kubelet_cgroup(spec).expect("a pod in kubepods");
    let before = counts(agent_pid(&node));
    let outside = CgroupGuard::new().expect("a cgroup outside the pod trees");
    let dir = linkerd_cni_tests::names::TempDir::new().expect("a directory for the link");
    let link = dir.path().join("l");
    std::os::unix::fs::symlink(pod.cgroup.path(), &link).expect("the link");
    let root = linkerd_cni_tests::cgroup::cgroup2_root().expect("the cgroup2 root");
    let ups = "../".repeat(root.components().count());
    let hint = format!(
        "{}/{ups}{}",
        root.display(),
        link.display().to_string().trim_start_matches('/')
    );
    let id = pod.container_id.clone();
    let body = add_body(
        &pod,
        &id,
        &pod.netns_path().display().to_string(),
        Some(&hint),
        None,
    );
    let answer = request_with_fds(&node.socket(), &body, &[]);
    assert_eq!(answer["result"], "added", "{answer}");
    let st = state(&node);
    let record = st.record(&id).expect("registered");
    let recorded = record["attachment"]["cgroup"].as_str().unwrap_or_default();
    let own = fs::canonicalize(pod.cgroup.path()).expect("the pod's cgroup");
    assert_eq!(
        fs::canonicalize(recorded).ok().as_deref(),
        Some(own.as_path()),
        "{record}"
    );
    assert!(
        !recorded.contains("..") && Path::new(recorded) != link,
        "recorded as resolved, not as sent: {recorded}"
    );
    // Retarget the link, remove one of the attachment's link pins, ask CHECK.
    fs::remove_file(&link).expect("unlink");
    std::os::unix::fs::symlink(outside.path(), &link).expect("retarget");
    let pin = node
        .pin_root()
        .join(linkerd_cni_common::paths::PIN_PODS)
        .join(linkerd_cni_agent::dataplane::pin_name(&id))
        .join("l5d_connect4");
    fs::remove_file(&pin).unwrap_or_else(|e| panic!("{}: {e}", pin.display()));
    let check = serde_json::to_vec(&Envelope::new(Request::Check(AttachmentRef {
        container_id: id.clone(),
        ifname: "eth0".into(),
        netns: pod.netns_path().display().to_string(),
    })))
    .expect("encode");
    let answer = request_with_fds(&node.socket(), &check, &[]);
    assert!(
        is_error(&answer),
        "CHECK reports the missing link: {answer}"
    );
    let attached = Command::new("bpftool")
        .args(["cgroup", "show"])
        .arg(outside.path())
        .output()
        .expect("bpftool");
    let shown = String::from_utf8_lossy(&attached.stdout);
    assert!(
        !shown.contains("l5d_"),
        "nothing of ours on the cgroup outside the pod trees: {shown}"
    );
    assert!(pin.exists(), "the link was re-made on the pod's own cgroup");
    let on_pod = Command::new("bpftool")
        .args(["cgroup", "show"])
        .arg(pod.cgroup.path())
        .output()
        .expect("bpftool");
    assert!(String::from_utf8_lossy(&on_pod.stdout).contains("connect4"));
    assert_no_growth(&node, before, "symlinked cgroup");
}

/// Item 2: an address a peer claims for its netns that another registered pod holds is
/// ignored: that pod keeps its `l5d_pod_by_ip` entry (before, the claim displaced it).
#[test]
fn addresses_a_peer_claims_that_another_pod_holds_are_ignored() {
    let node = start(NodeOptions::default());
    let victim = Victim::new(&node, "kept");
    let ip: IpAddr = victim.pod.ip().expect("the meshed pod's address").into();
    let claimer = node
        .new_pod(PodSpec::meshed("shop", "claimer"))
        .expect("a pod");
    node.apply(&[claimer.spec.manifest(NODE_NAME)])
        .expect("the pod's manifest");
    // A socket made inside the claimer's netns, as the plugin passes one.
    let ns = fs::File::open(claimer.netns_path()).expect("the claimer's netns");
    let sock = std::thread::scope(|s| {
        s.spawn(|| {
            nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            UnixDatagram::unbound().expect("a socket inside")
        })
        .join()
        .expect("the thread")
    });
    let id = claimer.container_id.clone();
    let body = add_body(
        &claimer,
        &id,
        &claimer.netns_path().display().to_string(),
        Some(&claimer.cgroup.path().display().to_string()),
        Some(vec![ip]),
    );
    let answer = request_with_fds(&node.socket(), &body, &[sock.as_raw_fd()]);
    assert_eq!(answer["result"], "added", "{answer}");
    let st = state(&node);
    let record = st.record(&id).expect("registered");
    assert!(
        !record["pod_ips"]
            .as_array()
            .is_some_and(|ips| ips.iter().any(|i| i == &Value::from(ip.to_string()))),
        "the claimed address is not the claimer's: {record}"
    );
    victim.assert_unchanged(&node, "a claimed address");
}

/// Item 2 without `CAP_SYS_ADMIN` (the DaemonSet's default): the agent cannot enter the
/// netns, so it reads the netns's addresses from the route netlink socket the plugin made
/// there. A claimed address that neither the netns nor any other pod holds is ignored, the
/// netns's own is kept. With a Unix socket (an older plugin's) the agent has no way to read
/// them, and only the other-pod check applies: the same claim is kept (the gap this closes).
#[test]
fn addresses_a_peer_claims_that_its_netns_does_not_hold_are_ignored_without_sys_admin() {
    let mut node = start(NodeOptions::default());
    node.kill_agent();
    let required = linkerd_cni_agent::host::capabilities::required_names();
    node.start_agent_with_capabilities(&required)
        .unwrap_or_else(|e| panic!("agent: {e}\n{}", node.diagnostics()));
    let unheld: IpAddr = "198.51.100.7".parse().expect("an address");
    for (name, netlink) in [("claimer-netlink", true), ("claimer-unix", false)] {
        // A pod with an address of its own in its netns (the chain without linkerd-cni).
        let mut pod = node.new_pod(PodSpec::meshed("shop", name)).expect("a pod");
        node.add_before_plugin(&mut pod)
            .unwrap_or_else(|e| panic!("CNI ADD without linkerd-cni: {e}"));
        let own: IpAddr = pod.ip().expect("the pod's address").into();
        let ns = fs::File::open(pod.netns_path()).expect("the pod's netns");
        let sock: std::os::fd::OwnedFd = std::thread::scope(|s| {
            s.spawn(|| {
                nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
                if netlink {
                    nix::sys::socket::socket(
                        nix::sys::socket::AddressFamily::Netlink,
                        nix::sys::socket::SockType::Raw,
                        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
                        nix::sys::socket::SockProtocol::NetlinkRoute,
                    )
                    .expect("a route socket inside")
                } else {
                    UnixDatagram::unbound().expect("a socket inside").into()
                }
            })
            .join()
            .expect("the thread")
        });
        let id = pod.container_id.clone();
        let body = add_body(
            &pod,
            &id,
            &pod.netns_path().display().to_string(),
            Some(&pod.cgroup.path().display().to_string()),
            Some(vec![own, unheld]),
        );
        let answer = request_with_fds(&node.socket(), &body, &[sock.as_raw_fd()]);
        assert_eq!(answer["result"], "added", "{name}: {answer}");
        let st = state(&node);
        let record = st.record(&id).expect("registered");
        let ips: Vec<String> = record["pod_ips"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|i| i.as_str().map(str::to_string))
            .collect();
        assert!(
            ips.contains(&own.to_string()),
            "{name}: its own address kept: {record}"
        );
        assert_eq!(
            ips.contains(&unheld.to_string()),
            !netlink,
            "{name}: the claimed address its netns does not hold: {record}"
        );
    }
}

/// What already held, asserted together: each refused with the reason, nothing registered
/// for it, the meshed pod unchanged, the agent's counts back.
#[test]
fn paths_sockets_and_frames_that_were_already_refused_still_are() {
    let node = start(NodeOptions::default());
    let victim = Victim::new(&node, "kept");
    let before = counts(agent_pid(&node));
    let own_netns = victim.pod.netns_path().display().to_string();
    let host_netns = format!("/proc/{}/ns/net", std::process::id());
    let link = Planted::new();
    std::os::unix::fs::symlink(&host_netns, &link.0).expect("a symlink in the netns dir");
    let bind = Planted::new();
    fs::File::create(&bind.0).expect("a mount point");
    let status = Command::new("mount")
        .args(["--bind", &host_netns])
        .arg(&bind.0)
        .status()
        .expect("mount");
    assert!(status.success(), "bind-mounting the host's netns");
    let dotted = format!("{NETNS_RUN_DIR}/../..{host_netns}");
    let cases = [
        (
            "host",
            host_netns.clone(),
            None,
            "node's own network namespace",
        ),
        ("dotdot", dotted, None, "not a plain absolute path"),
        (
            "symlink",
            link.0.display().to_string(),
            None,
            "symbolic link",
        ),
        (
            "bind",
            bind.0.display().to_string(),
            None,
            "node's own network namespace",
        ),
        (
            "cgroup-root",
            own_netns.clone(),
            Some("/".to_string()),
            "pod cgroup trees",
        ),
    ];
    for (name, netns, cgroup, why) in cases {
        let id = format!("hostile-{name}");
        let body = add_body(&victim.pod, &id, &netns, cgroup.as_deref(), None);
        let answer = request_with_fds(&node.socket(), &body, &[]);
        assert!(is_error(&answer), "{name}: {answer}");
        assert!(
            answer["message"].as_str().unwrap_or_default().contains(why),
            "{name}: names why ({why}): {answer}"
        );
        let st = state(&node);
        assert!(!st.registered().contains(&id), "{name}: not registered");
        assert!(st.links_of(&id).is_empty(), "{name}: no links");
        victim.assert_unchanged(&node, name);
    }
    // A socket from another netns (this process's) passed for the pod's netns.
    let elsewhere = UnixDatagram::unbound().expect("a socket here");
    let body = add_body(&victim.pod, "hostile-socket", &own_netns, None, None);
    let answer = request_with_fds(&node.socket(), &body, &[elsewhere.as_raw_fd()]);
    assert!(is_error(&answer), "{answer}");
    assert!(
        answer["message"]
            .as_str()
            .unwrap_or_default()
            .contains("another network namespace"),
        "{answer}"
    );
    victim.assert_unchanged(&node, "socket elsewhere");
    // An oversized frame: refused unread.
    let mut conn = UnixStream::connect(node.socket()).expect("connect");
    conn.write_all(&((wire::MAX_FRAME + 1) as u32).to_be_bytes())
        .expect("header");
    let answer = read_answer(conn);
    assert!(is_error(&answer), "{answer}");
    // A stalled frame: answered (refused) after the read timeout, not held for ever.
    let mut conn = UnixStream::connect(node.socket()).expect("connect");
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    conn.write_all(&[0, 0]).expect("half a header");
    let started = Instant::now();
    let mut rest = Vec::new();
    let _ = conn.read_to_end(&mut rest);
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "a stalled peer is dropped"
    );
    victim.assert_unchanged(&node, "frames");
    assert_eq!(ready(&node), 200);
    assert_no_growth(&node, before, "refused paths and frames");
}

/// D1 for records an earlier agent wrote: such a record names its cgroup by the path as it
/// was sent (here through a symbolic link) and holds no inode. The upgraded agent checks it at
/// start; once the link is retargeted at a cgroup outside the pod trees and a link pin is
/// removed, CHECK's repair refuses to open it and nothing of ours is attached elsewhere.
#[test]
fn an_earlier_agents_record_is_checked_at_start_and_never_followed_elsewhere() {
    let mut node = start(NodeOptions::default());
    let victim = Victim::new(&node, "old");
    let id = victim.pod.container_id.clone();
    let dir = linkerd_cni_tests::names::TempDir::new().expect("a directory for the link");
    let link = dir.path().join("l");
    std::os::unix::fs::symlink(victim.pod.cgroup.path(), &link).expect("the link");
    node.kill_agent();
    // The record as an earlier agent wrote it: the hint as sent, no inode.
    let file = node.state_dir().join(format!("{id}.json"));
    let mut record: Value =
        serde_json::from_str(&fs::read_to_string(&file).expect("the record")).expect("JSON");
    record["attachment"]["cgroup"] = Value::from(link.display().to_string());
    record
        .as_object_mut()
        .expect("an object")
        .remove("cgroup_seen");
    fs::write(&file, record.to_string()).expect("writing the old record");
    node.start_agent()
        .unwrap_or_else(|e| panic!("restarting the agent: {e}"));
    let outside = CgroupGuard::new().expect("another cgroup");
    fs::remove_file(&link).expect("unlink");
    std::os::unix::fs::symlink(outside.path(), &link).expect("retarget");
    let pin = node
        .pin_root()
        .join(linkerd_cni_common::paths::PIN_PODS)
        .join(linkerd_cni_agent::dataplane::pin_name(&id))
        .join("l5d_connect4");
    fs::remove_file(&pin).unwrap_or_else(|e| panic!("{}: {e}", pin.display()));
    let check = serde_json::to_vec(&Envelope::new(Request::Check(AttachmentRef {
        container_id: id.clone(),
        ifname: "eth0".into(),
        netns: victim.pod.netns_path().display().to_string(),
    })))
    .expect("encode");
    let answer = request_with_fds(&node.socket(), &check, &[]);
    assert!(
        is_error(&answer),
        "CHECK reports the missing link: {answer}"
    );
    let shown = Command::new("bpftool")
        .args(["cgroup", "show"])
        .arg(outside.path())
        .output()
        .expect("bpftool");
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(
        !shown.contains("l5d_"),
        "nothing of ours on the cgroup the link now names: {shown}"
    );
    assert!(!pin.exists(), "the link was not re-made through the link");
}
