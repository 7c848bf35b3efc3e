//! Next to another eBPF tenant on our hooks (root required): a stand-in for Cilium's and
//! Calico's socket load balancer (`linkerd_cni_tests::tenant`, translating one Service address
//! to one backend in `connect` and back in `getpeername`) attached the ways the field attaches
//! it, always to a test cgroup standing in for the cgroup2 root (`root` below), never to the
//! real one.
//!
//! For each way: a meshed pod's proxy reads the Service address (`SO_ORIGINAL_DST`), its app's
//! `getpeername` says the Service address, the proxy's own dial is translated by the tenant to
//! the backend, and a process of the same network namespace outside the meshed cgroup (an
//! unmeshed pod) is translated as usual; or the agent refuses the pod (ADD) or reports it
//! (reconcile pass, CNI CHECK) naming the other program, as docs/operating/failure-modes.md says.
//!
//! Run: `cargo test -p linkerd-cni-tests --test coexistence -- --test-threads=1`

use linkerd_cni_sys::bpf;
use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4},
    path::Path,
    time::Duration,
};

use linkerd_cni_agent::{AgentError, agent::registry::PodRecord};
use linkerd_cni_common::names::Hook;
use linkerd_cni_proto::config::LinkerdConfig;
use linkerd_cni_tests::{
    AgentHarness, CgroupGuard, EchoServer, PodAndPeer, TestProxy, bins,
    client::{Options as ClientOptions, Report, run_client},
    proxy,
    tenant::{self, How, SocketLb, detach_every_program},
};

const TIMEOUT: Duration = Duration::from_secs(20);
const APP_UID: u32 = 1000;
const BACKEND_PORT: u16 = 8080;
/// The Service address the tenant translates (routed nowhere: only a translation reaches it).
const VIP: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(10, 96, 0, 10), 80);

/// A pod whose cgroup is under `parent`, a backend server in its peer netns, and a cgroup
/// beside the pod's for a process of the same netns that is not meshed (with programs on the
/// pod's own cgroup only: under a shared attachment the netns selects the pod).
struct World {
    net: PodAndPeer,
    backend: EchoServer,
    unmeshed: CgroupGuard,
}

impl World {
    fn under(parent: &Path) -> Self {
        let mut net = PodAndPeer::new().expect("pod, peer netns and veth");
        net.pod.cgroup = CgroupGuard::new_under(parent).expect("pod cgroup");
        let unmeshed = CgroupGuard::new_under(parent).expect("unmeshed cgroup");
        let backend = EchoServer::bind_in(
            &net.peer,
            SocketAddr::new(net.peer_v4().into(), BACKEND_PORT),
            "backend",
        )
        .expect("backend server");
        World {
            net,
            backend,
            unmeshed,
        }
    }

    fn backend(&self) -> SocketAddrV4 {
        SocketAddrV4::new(self.net.peer_v4(), BACKEND_PORT)
    }

    fn tenant(&self) -> SocketLb {
        SocketLb::load(VIP, self.backend()).expect("load the stand-in socket LB")
    }

    fn proxy(&self) -> TestProxy {
        self.net
            .pod
            .start_proxy(&proxy::Options::new())
            .expect("start the proxy")
    }

    fn connect(&self, cgroup: &CgroupGuard) -> Report {
        let placement = self.net.pod.container(APP_UID).cgroup(cgroup);
        run_client(
            &placement,
            &ClientOptions::new(SocketAddr::V4(VIP)).send("hello\n"),
            TIMEOUT,
        )
        .expect("run the test client")
    }

    /// The meshed app connects to the Service: the proxy reads the Service address, the app's
    /// peer is the Service address, and the backend is reached through the proxy's own dial,
    /// which the tenant translated.
    fn assert_meshed(&self, proxy: &TestProxy, lb: &SocketLb) {
        let (seen, translated) = (self.backend.received().len(), lb.connects());
        let proxied = proxy::accepted(&proxy.events().expect("proxy events")).len();
        let r = self.connect(&self.net.pod.cgroup);
        assert_eq!(r.succeeded, 1, "the meshed app's connection: {r:?}");
        assert_eq!(
            r.peer,
            Some(SocketAddr::V4(VIP)),
            "the app's getpeername: the Service address"
        );
        let events = proxy
            .log()
            .wait_for(TIMEOUT, |e| proxy::accepted(e).len() > proxied)
            .expect("the proxy accepted the connection");
        assert_eq!(
            proxy::accepted(&events)[proxied].1,
            SocketAddr::V4(VIP),
            "the proxy's SO_ORIGINAL_DST: the Service address, not the backend"
        );
        self.backend
            .wait_for(seen + 1, TIMEOUT)
            .expect("the backend reached");
        assert!(
            lb.connects() > translated,
            "the proxy's own dial to the Service was translated by the tenant"
        );
    }

    /// A process outside the meshed cgroup is translated by the tenant as usual, and its
    /// connection goes straight to the backend.
    fn assert_unmeshed(&self, proxy: &TestProxy, lb: &SocketLb) {
        let (seen, translated) = (self.backend.received().len(), lb.connects());
        let proxied = proxy::accepted(&proxy.events().expect("proxy events")).len();
        let r = self.connect(&self.unmeshed);
        assert_eq!(r.succeeded, 1, "the unmeshed connection: {r:?}");
        assert_eq!(
            r.peer,
            Some(SocketAddr::V4(VIP)),
            "the tenant's getpeername"
        );
        let got = self
            .backend
            .wait_for(seen + 1, TIMEOUT)
            .expect("the backend reached");
        assert_eq!(
            got[seen].peer.ip(),
            IpAddr::V4(self.net.pod_v4()),
            "straight from the pod"
        );
        assert_eq!(lb.connects(), translated + 1, "translated by the tenant");
        assert_eq!(
            proxy::accepted(&proxy.events().expect("proxy events")).len(),
            proxied,
            "the proxy saw nothing of it"
        );
    }
}

fn refused(h: &AgentHarness, world: &World, per_pod: bool) -> String {
    match h.try_register(&world.net.pod, LinkerdConfig::default(), per_pod) {
        Ok(r) => panic!("the ADD must be refused, it registered {r:?}"),
        Err(e) => {
            assert!(
                h.agent().pods().expect("pods").is_empty(),
                "nothing registered after a refused ADD"
            );
            eprintln!("refused as expected: {e}");
            e.to_string()
        }
    }
}

fn assert_names(message: &str, parts: &[&str]) {
    for part in parts {
        assert!(
            message.contains(part),
            "{part:?} missing from the error: {message}"
        );
    }
}

#[test]
fn meshed_pod_with_its_own_cgroup_runs_first_under_a_link_at_the_root() {
    let root = CgroupGuard::new().expect("stand-in root");
    let world = World::under(root.path());
    let mut lb = world.tenant();
    lb.attach(root.path(), How::Link).expect("tenant link");
    let h = AgentHarness::new(None);
    let record = h.register(&world.net.pod, LinkerdConfig::default(), true);
    h.agent().check_order(&record).expect("ours first");
    let proxy = world.proxy();
    world.assert_meshed(&proxy, &lb);
    world.assert_unmeshed(&proxy, &lb);
    // Attached after our links, with BPF_F_ALLOW_MULTI: it joins after ours.
    lb.detach_all();
    lb.attach(root.path(), How::Multi).expect("tenant, multi");
    h.agent().check_order(&record).expect("ours first");
    world.assert_meshed(&proxy, &lb);
}

#[test]
fn shared_attachment_below_the_tenants_cgroup_runs_first() {
    // The shared attachment on a cgroup below the tenant's (the default: kubelet's kubepods
    // cgroup, below the cgroup2 root where Cilium attaches).
    let root = CgroupGuard::new().expect("stand-in root");
    let kubepods = CgroupGuard::new_under(root.path()).expect("stand-in kubepods");
    let world = World::under(kubepods.path());
    let lb = {
        let mut lb = world.tenant();
        lb.attach(root.path(), How::Link).expect("tenant link");
        lb
    };
    let h = AgentHarness::new(Some(kubepods.path()));
    let record = h.register(&world.net.pod, LinkerdConfig::default(), false);
    h.agent().check_order(&record).expect("ours first");
    let proxy = world.proxy();
    world.assert_meshed(&proxy, &lb);
}

#[test]
fn shared_attachment_after_the_tenant_on_its_cgroup_goes_first_or_is_refused_naming_it() {
    let root = CgroupGuard::new().expect("stand-in root");
    let world = World::under(root.path());
    let mut lb = world.tenant();
    lb.attach(root.path(), How::Link).expect("tenant link");
    let h = AgentHarness::new(Some(root.path()));
    let added = h.try_register(&world.net.pod, LinkerdConfig::default(), false);
    // Asked of the kernel (by the agent's first link), not of its version.
    if bpf::cgroup_links_ordered() == Some(true) {
        // It orders cgroup links: ours were made first (BPF_F_BEFORE) on the tenant's cgroup.
        let record = added.expect("meshed, ours first");
        h.agent().check_order(&record).expect("ours first");
        let proxy = world.proxy();
        world.assert_meshed(&proxy, &lb);
        return;
    }
    eprintln!("this kernel refuses BPF_F_BEFORE on cgroup links: ours would run after the tenant");
    let message = match added {
        Ok(r) => panic!("the ADD must be refused, it registered {r:?}"),
        Err(e) => e.to_string(),
    };
    assert!(
        h.agent().pods().expect("pods").is_empty(),
        "nothing registered"
    );
    let id = lb.connect4_id().to_string();
    assert_names(
        &message,
        &[
            &format!("program id {id}"),
            "tenant_sock4_connect",
            "BPF_CGROUP_INET4_CONNECT",
            &format!("attached to cgroup {}", root.path().display()),
            "BPF_F_ALLOW_MULTI (or a bpf_link)",
            "runs before ours",
            "--shared-cgroup",
        ],
    );
    // The same ADD once the tenant is gone: meshed, and the proxy reads the destination.
    lb.detach_all();
    let record = h.register(&world.net.pod, LinkerdConfig::default(), false);
    // The tenant coming back after our links: behind ours, so the pod keeps working.
    lb.attach(root.path(), How::Link)
        .expect("tenant link again");
    h.agent().check_order(&record).expect("ours first");
    let proxy = world.proxy();
    world.assert_meshed(&proxy, &lb);
}

#[test]
fn a_tenant_link_made_first_after_ours_is_put_behind_ours_by_the_next_reconcile_pass() {
    let root = CgroupGuard::new().expect("stand-in root");
    let world = World::under(root.path());
    let h = AgentHarness::new(Some(root.path()));
    let record = h.register(&world.net.pod, LinkerdConfig::default(), false);
    let mut lb = world.tenant();
    // Asked of the kernel: before cgroup links could be ordered, it refuses the flag.
    match lb.attach(root.path(), How::LinkFirst) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            assert_ne!(bpf::cgroup_links_ordered(), Some(true));
            eprintln!(
                "this kernel refuses BPF_F_BEFORE on cgroup links: no link can go ahead of ours"
            );
            return;
        }
        Err(e) => panic!("attaching with BPF_F_BEFORE: {e}"),
        Ok(()) => {}
    }
    // A second tenant, made first too: both run before ours, and both are named, in full.
    let mut second = world.tenant();
    second
        .attach(root.path(), How::LinkFirst)
        .expect("a second tenant, first");
    let conflict = h
        .agent()
        .check_order(&record)
        .expect_err("the tenants run first")
        .to_string();
    assert_names(
        &conflict,
        &[
            "runs before ours",
            &format!(
                "program id {} \"tenant_sock4_connect\"",
                second.connect4_id()
            ),
            &format!(
                ", and so does program id {} \"tenant_sock4_connect\"",
                lb.connect4_id()
            ),
        ],
    );
    second.detach_all();
    drop(second);
    let reconciler = h.reconciler();
    reconciler.run_once();
    assert_eq!(reconciler.order_conflicts(), 0, "repaired in one pass");
    h.agent().check_order(&record).expect("ours first again");
    h.agent().check(&record.id).expect("links in force");
    let proxy = world.proxy();
    world.assert_meshed(&proxy, &lb);
}

#[test]
fn exclusive_tenant_above_the_pod_refuses_the_add_naming_it() {
    let root = CgroupGuard::new().expect("stand-in root");
    let world = World::under(root.path());
    let mut lb = world.tenant();
    lb.attach(root.path(), How::Exclusive)
        .expect("tenant, exclusive");
    let h = AgentHarness::new(None);
    let message = refused(&h, &world, true);
    assert_names(
        &message,
        &[
            &format!("program id {}", lb.connect4_id()),
            "tenant_sock4_connect",
            "BPF_CGROUP_INET4_CONNECT",
            &format!("attached to cgroup {}", root.path().display()),
            "flags 0 (exclusive)",
            "re-attach it with BPF_F_ALLOW_MULTI",
        ],
    );
    // The pod's traffic is untouched by us: the tenant translates it.
    let proxy = world.proxy();
    world.assert_unmeshed(&proxy, &lb);
}

#[test]
fn override_tenant_above_the_pod_refuses_the_add_naming_it() {
    let root = CgroupGuard::new().expect("stand-in root");
    let world = World::under(root.path());
    let mut lb = world.tenant();
    lb.attach(root.path(), How::Override)
        .expect("tenant, override");
    let h = AgentHarness::new(None);
    let message = refused(&h, &world, true);
    assert_names(
        &message,
        &[
            &format!("program id {}", lb.connect4_id()),
            &format!("attached to cgroup {}", root.path().display()),
            "BPF_F_ALLOW_OVERRIDE",
            "does not run for this pod's sockets",
        ],
    );
}

/// Two meshed pods below one parent: a pass reads what runs for the parent once per hook (for
/// the first pod) and judges the second pod by the same reading, so both are reported by the
/// one pass after the tenant came, and both clear at the one after it went.
#[test]
fn exclusive_tenant_attached_later_is_reported_within_one_reconcile_pass() {
    let root = CgroupGuard::new().expect("stand-in root");
    let world = World::under(root.path());
    let other = World::under(root.path());
    let h = AgentHarness::new(None);
    let record = h.register(&world.net.pod, LinkerdConfig::default(), true);
    h.register(&other.net.pod, LinkerdConfig::default(), true);
    let reconciler = h.reconciler();
    reconciler.run_once();
    assert_eq!(reconciler.order_conflicts(), 0, "nothing to report yet");
    let mut lb = world.tenant();
    // The kernel accepts it, and skips it for the meshed pods' sockets.
    lb.attach(root.path(), How::Exclusive)
        .expect("tenant, exclusive, after our links");
    reconciler.run_once();
    assert_eq!(
        reconciler.order_conflicts(),
        2,
        "both pods below it reported in one pass"
    );
    let conflict = h
        .agent()
        .check_order(&record)
        .expect_err("a conflict")
        .to_string();
    assert_names(
        &conflict,
        &[
            &format!("program id {}", lb.connect4_id()),
            "flags 0 (exclusive)",
            "does not run for this pod's sockets",
        ],
    );
    // CNI CHECK says so too.
    let check = h.agent().check(&record.id).expect_err("CHECK fails");
    assert!(
        matches!(check, AgentError::NotInForce { .. }),
        "CHECK: {check}"
    );
    // Gone again: the report ends at the next pass.
    lb.detach_all();
    reconciler.run_once();
    assert_eq!(reconciler.order_conflicts(), 0, "cleared");
}

#[test]
fn preorder_tenant_refuses_the_add_where_the_kernel_has_preorder() {
    let root = CgroupGuard::new().expect("stand-in root");
    let world = World::under(root.path());
    let mut lb = world.tenant();
    // Asked of the kernel, not of its version: before 6.15 it refuses the flag.
    match lb.attach(root.path(), How::Preorder) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            eprintln!("this kernel refuses BPF_F_PREORDER (EINVAL): no tenant can run before ours");
            return;
        }
        Err(e) => panic!("attaching with BPF_F_PREORDER: {e}"),
        Ok(()) => {}
    }
    let h = AgentHarness::new(None);
    let message = refused(&h, &world, true);
    assert_names(
        &message,
        &[
            &format!("program id {}", lb.connect4_id()),
            &format!("attached to cgroup {}", root.path().display()),
            "BPF_F_ALLOW_MULTI (or a bpf_link) + BPF_F_PREORDER",
            "runs before ours",
            "attach it without BPF_F_PREORDER",
        ],
    );
}

#[test]
fn a_loader_detaching_every_program_of_a_type_leaves_our_links() {
    // Cilium's loader with socket LB off: PROG_DETACH of every id the cgroup lists.
    let root = CgroupGuard::new().expect("stand-in root");
    let world = World::under(root.path());
    let h = AgentHarness::new(Some(root.path()));
    let record = h.register(&world.net.pod, LinkerdConfig::default(), false);
    let mut lb = world.tenant();
    lb.attach(root.path(), How::Multi).expect("tenant, multi");
    let n =
        detach_every_program(root.path(), Hook::Connect4).expect("detach every connect4 program");
    assert_eq!(n, 1, "the tenant's program went, our link's could not");
    h.agent().check(&record.id).expect("our links in force");
    h.agent().check_order(&record).expect("ours first");
    let proxy = world.proxy();
    let proxied = proxy::accepted(&proxy.events().expect("events")).len();
    let r = world.connect(&world.net.pod.cgroup);
    assert_eq!(r.peer, Some(SocketAddr::V4(VIP)), "{r:?}");
    let events = proxy
        .log()
        .wait_for(TIMEOUT, |e| proxy::accepted(e).len() > proxied)
        .expect("the proxy accepted the connection");
    assert_eq!(proxy::accepted(&events)[proxied].1, SocketAddr::V4(VIP));
    drop(lb);
}

#[test]
fn a_second_sk_lookup_program_in_the_pod_netns() {
    let root = CgroupGuard::new().expect("stand-in root");
    let world = World::under(root.path());
    let h = AgentHarness::new(None);
    let netns = || std::fs::File::open(world.net.pod.netns.path()).expect("open the pod netns");
    // Before the ADD: it would answer first, so the pod is refused, naming it.
    let mut lb = world.tenant();
    let id = lb.attach_lookup(netns()).expect("tenant sk_lookup");
    let message = refused(&h, &world, true);
    assert_names(
        &message,
        &[
            &format!("program id {id}"),
            "tenant_lookup",
            "BPF_SK_LOOKUP",
            "network namespace",
        ],
    );
    lb.detach_all();
    // After the ADD: it runs after ours.
    let record: PodRecord = h.register(&world.net.pod, LinkerdConfig::default(), true);
    lb.attach_lookup(netns())
        .expect("tenant sk_lookup after ours");
    h.agent().check_order(&record).expect("ours first");
}

/// Without `CAP_SYS_ADMIN` (the DaemonSet's capabilities) the agent cannot open another
/// tenant's program by id, so it cannot read its name or type: the refused ADD still names the
/// program by id, hook and place (and, for an exclusive one, the `bpftool` command that
/// detaches it) and says why the name is missing, instead of a bare `"?"`. The agent runs as a
/// real process with exactly the required capabilities; the ADD goes through libcni and the
/// plugin, so the message asserted is the one the runtime gets. Two places the name is needed:
/// an exclusive program above the pod's cgroup (the `EPERM` at attach), and an `sk_lookup`
/// program ahead of ours in the pod's network namespace (the order check).
#[test]
fn without_sys_admin_the_refused_add_says_why_the_tenant_has_no_name() {
    use linkerd_cni_tests::{
        cniruntime::Verb,
        node::{NodeOptions, PodSpec, SimNode, SimPod, namespace_manifest},
    };
    let mut node = SimNode::start(NodeOptions::default(), &[namespace_manifest("shop", &[])])
        .unwrap_or_else(|e| panic!("starting the simulated node: {e}"));
    node.kill_agent();
    let required = linkerd_cni_agent::host::capabilities::required_names();
    assert!(!required.contains(&"SYS_ADMIN"), "{required:?}");
    node.start_agent_with_capabilities(&required)
        .unwrap_or_else(|e| panic!("agent with {required:?}: {e}\n{}", node.diagnostics()));
    let add_refused = |pod: &SimPod| -> String {
        let out = node.cni(Verb::Add, pod).expect("run CNI ADD");
        let err = out
            .error()
            .unwrap_or_else(|| panic!("the ADD must be refused: {}", out.stdout));
        assert_eq!(err.code, 101, "{err:?}");
        let st = node.state().expect("the agent's state");
        assert!(
            st.record(&pod.container_id).is_none(),
            "nothing registered after a refused ADD"
        );
        eprintln!("refused as expected: {} {}", err.msg, err.details);
        format!("{} {}", err.msg, err.details)
    };
    let unnamed = "? (name and type unknown: opening a program by id needs CAP_SYS_ADMIN, which \
                   the agent lacks)";

    // An exclusive connect4 program on a stand-in root above the pod's cgroup.
    let root = CgroupGuard::new().expect("stand-in root");
    let mut pod = node
        .new_pod(PodSpec::meshed("shop", "below-exclusive"))
        .expect("a pod");
    pod.cgroup = CgroupGuard::new_under(root.path()).expect("the pod's cgroup below it");
    let backend = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), BACKEND_PORT);
    let mut lb = SocketLb::load(VIP, backend).expect("load the stand-in socket LB");
    lb.attach(root.path(), How::Exclusive)
        .expect("tenant, exclusive");
    let message = add_refused(&pod);
    assert_names(
        &message,
        &[
            &format!("program id {} \"{unnamed}\"", lb.connect4_id()),
            "(type unknown, attach type BPF_CGROUP_INET4_CONNECT)",
            &format!("attached to cgroup {}", root.path().display()),
            "flags 0 (exclusive)",
            &format!(
                "`bpftool cgroup detach {} connect4 id {}`",
                root.path().display(),
                lb.connect4_id()
            ),
        ],
    );
    assert!(
        !message.contains("tenant_sock4_connect"),
        "without CAP_SYS_ADMIN the agent cannot have read the name: {message}"
    );
    lb.detach_all();

    // An sk_lookup program in the pod's network namespace, attached before the ADD.
    let pod = node
        .new_pod(PodSpec::meshed("shop", "lookup-ahead"))
        .expect("a pod");
    let netns = std::fs::File::open(pod.netns_path()).expect("open the pod netns");
    let id = lb.attach_lookup(&netns).expect("tenant sk_lookup");
    let message = add_refused(&pod);
    assert_names(
        &message,
        &[
            &format!("program id {id} \"{unnamed}\""),
            "(type unknown, attach type BPF_SK_LOOKUP)",
            "in the pod's network namespace",
        ],
    );
    assert!(!message.contains("tenant_lookup"), "{message}");
    lb.detach_all();
}

/// A `kubepods` cgroup inside the stand-in root (kubelet's cgroupfs layout), removed on drop.
struct Kubepods(std::path::PathBuf);

impl Drop for Kubepods {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// `linkerd check --node --cgroup-root <stand-in>`: the real command, its output.
fn check_node(root: &Path) -> String {
    let out = std::process::Command::new(bins::bin_path("linkerd").expect("linkerd binary"))
        .args(["check", "--node", "--cgroup-root"])
        .arg(root)
        .output()
        .expect("run linkerd check --node");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("{text}");
    text
}

/// The line of tenant program `name` (`id`) on `cgroup`, with its detail lines joined.
fn tenant_line(out: &str, name: &str, id: u32, cgroup: &Path) -> String {
    let head = format!("program id {id} \"{name}\" on {}", cgroup.display());
    let mut lines = out.lines().skip_while(|l| !l.contains(&head));
    let first = lines
        .next()
        .unwrap_or_else(|| panic!("no line for {head} in check --node:\n{out}"));
    let detail: Vec<&str> = lines
        .take_while(|l| l.starts_with(' '))
        .map(str::trim)
        .collect();
    [first, &detail.join(" ")].join(" ")
}

#[test]
fn check_node_lists_the_tenant_with_its_flags_and_what_it_means() {
    let root = CgroupGuard::new().expect("stand-in root");
    let backend = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), BACKEND_PORT);
    // (how, on kubepods below the stand-in root, mark, what the line says)
    let cases = [
        (
            How::Exclusive,
            false,
            "×",
            "flags 0 (exclusive): pods below it cannot be meshed",
        ),
        (
            How::Multi,
            false,
            "√",
            "warning: BPF_F_ALLOW_MULTI (or a bpf_link) on the shared attachment's cgroup",
        ),
        (How::Multi, true, "√", "fine, it runs after our programs"),
        (How::Link, true, "√", "fine, it runs after our programs"),
    ];
    for (how, with_kubepods, mark, says) in cases {
        let kubepods = with_kubepods.then(|| {
            let dir = root.path().join("kubepods");
            std::fs::create_dir(&dir).expect("kubepods cgroup");
            Kubepods(dir)
        });
        let mut lb = SocketLb::load(VIP, backend).expect("load the stand-in socket LB");
        lb.attach(root.path(), how).expect("attach the tenant");
        let out = check_node(root.path());
        let ids = lb.ids();
        assert_eq!(ids.len(), tenant::PROGRAMS.len());
        for ((name, _), id) in tenant::PROGRAMS.iter().zip(ids) {
            let line = tenant_line(&out, name, id, root.path());
            assert!(line.starts_with(mark), "{how:?}: {line}");
            assert!(line.contains(says), "{how:?}: {says:?} missing from {line}");
            assert!(
                line.contains(&format!("`bpftool cgroup show {}`", root.path().display())),
                "{line}"
            );
        }
        let looked_at = match &kubepods {
            Some(k) => format!("on {} and {}", root.path().display(), k.0.display()),
            None => format!("on {} (", root.path().display()),
        };
        assert!(out.contains(&looked_at), "{looked_at:?} missing:\n{out}");
        assert!(
            out.contains(
                "sk_lookup programs in pods' network namespaces (skipped: not listed here"
            ),
            "{out}"
        );
        lb.detach_all();
        drop(kubepods);
        let out = check_node(root.path());
        assert!(
            out.contains(&format!("0 found on {}", root.path().display())),
            "nothing left after the tenant detached:\n{out}"
        );
    }
}
