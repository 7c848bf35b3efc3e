//! Self-healing data plane (root required): a simulated node (libcni, the agent as a real
//! process, the fake Kubernetes API) where a meshed pod's redirection is removed behind the
//! agent's back (link pins deleted, a link detached with bpftool, a map entry deleted, bpffs
//! unmounted). By the end of the first whole reconcile pass after the damage (passes start 2 s
//! apart: about 6 s on an idle machine) the pod's outbound traffic goes through its proxy
//! again, every link is in force and `/metrics` counts the repair; while bpffs cannot be
//! mounted again `/ready` fails. The tests count the agent's passes rather than seconds, so a
//! busy machine only makes them slower.
//!
//! Run: `cargo build --bins && cargo test -p linkerd-cni-tests --test heal -- --test-threads=1`

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use linkerd_cni_agent::host::kernel;
use linkerd_cni_common::names;
use linkerd_cni_tests::{
    EchoServer,
    client::{Options, run_client},
    cniruntime::Verb,
    node::{self, NodeOptions, PodSpec, SimNode, SimPod, http_get, namespace_manifest, signal},
    proxy::{Event, TestProxy},
};

const APP_UID: u32 = 1000;
/// Only turns an agent whose passes stopped into a failure: far beyond any pass on a busy
/// machine. The bound that matters is counted in passes (see [`Scene::within_a_pass`]).
const HANG: Duration = Duration::from_secs(120);

/// A node with an unmeshed server pod (echo server on :8080) and a meshed client pod whose
/// proxy runs.
struct Scene {
    client: SimPod,
    _server_pod: SimPod,
    server: EchoServer,
    dst: SocketAddr,
    proxy: TestProxy,
    node: SimNode,
}

fn scene(opts: NodeOptions) -> Scene {
    let node = SimNode::start(opts, &[namespace_manifest("shop", &[])])
        .unwrap_or_else(|e| panic!("starting the simulated node: {e}"));
    let (server_pod, server) = node.echo_pod("shop", "server", 8080);
    let client = node.added_pod(PodSpec::meshed("shop", "client"));
    let dst = server.addr();
    let proxy = client.start_proxy().expect("proxy");
    let s = Scene {
        client,
        _server_pod: server_pod,
        server,
        dst,
        proxy,
        node,
    };
    assert!(s.proxied(), "redirected before anything is removed");
    s
}

impl Scene {
    /// One request from the client pod as an application UID: whether its proxy accepted it.
    fn proxied(&self) -> bool {
        let before = self.accepted();
        let opts = Options::new(self.dst).send("ping\n");
        let report = run_client(
            &self.client.container(APP_UID),
            &opts,
            Duration::from_secs(5),
        )
        .unwrap_or_else(|e| panic!("client: {e}"));
        assert!(
            report.received_matches(&self.server.expected_reply(b"ping\n")),
            "the server answers either way: {report:?}"
        );
        self.accepted() > before
    }

    fn accepted(&self) -> usize {
        self.proxy
            .events()
            .expect("proxy events")
            .iter()
            .filter(|e| matches!(e, Event::Accepted { .. }))
            .count()
    }

    fn link_dir(&self) -> PathBuf {
        self.node
            .pin_root()
            .join("pods")
            .join(&self.client.container_id)
    }

    fn metric(&self, name: &str) -> u64 {
        self.node
            .agent()
            .expect("agent")
            .metric(name)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Repairs of `kind` so far (0 before the agent counted any, or if it does not count).
    fn repairs_before(&self, kind: &str) -> u64 {
        self.node
            .agent()
            .expect("agent")
            .metric(&format!(
                "linkerd_cni_agent_repairs_total{{kind=\"{kind}\"}}"
            ))
            .unwrap_or(0)
    }

    fn repairs(&self, kind: &str) -> u64 {
        self.metric(&format!(
            "linkerd_cni_agent_repairs_total{{kind=\"{kind}\"}}"
        ))
    }

    /// Reconcile passes started so far. Read it after damaging the data plane: the next pass
    /// starts after the damage.
    fn passes(&self) -> u64 {
        self.metric("linkerd_cni_agent_reconcile_passes_total")
    }

    /// Waits until `done` holds, and fails if it still does not once a whole reconcile pass
    /// that started after `passes_before` was read has ended (reconcile passes are counted
    /// when they start; see [`node::within_a_pass`]).
    fn within_a_pass(&self, what: &str, passes_before: u64, done: impl FnMut() -> bool) {
        node::within_a_pass(what, passes_before, HANG, || self.passes(), done)
            .unwrap_or_else(|e| panic!("{e}:\n{}", self.node.agent_log()));
    }

    /// Waits until the client is redirected again and every link is in force: by the end of
    /// the first whole pass after `passes_before` was read (see [`Self::within_a_pass`]).
    fn assert_healed(&self, passes_before: u64) {
        self.within_a_pass("repaired", passes_before, || {
            let links = linkerd_cni_agent::dataplane::links_in_force(
                &self.link_dir(),
                &names::ALL_PROGRAMS,
            );
            links.is_ok() && self.proxied()
        });
    }
}

fn bpftool_detach(link: &Path) {
    let out = std::process::Command::new("bpftool")
        .args(["link", "detach", "pinned"])
        .arg(link)
        .output()
        .expect("bpftool");
    assert!(
        out.status.success(),
        "bpftool link detach {}: {}",
        link.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn removed_link_pins_are_restored() {
    let s = scene(NodeOptions::default());
    let before = s.repairs_before("cgroup_link");
    std::fs::remove_dir_all(s.link_dir()).expect("rm -rf the pod's link pins");
    let passes = s.passes();
    s.assert_healed(passes);
    assert!(
        s.repairs("cgroup_link") >= before + names::CGROUP_PROGRAMS.len() as u64,
        "every cgroup link counted"
    );
    assert!(s.repairs("netns_link") >= 1, "the inbound link counted");
    assert!(
        s.node.agent_log().contains("data plane repaired"),
        "the repair is logged"
    );
}

#[test]
fn detached_link_is_reattached() {
    let s = scene(NodeOptions::default());
    let before = s.repairs_before("cgroup_link");
    bpftool_detach(&s.link_dir().join(names::PROG_CONNECT4));
    let passes = s.passes();
    s.assert_healed(passes);
    assert_eq!(s.repairs("cgroup_link"), before + 1, "one link re-attached");
    // The inbound link too.
    let before = s.repairs_before("netns_link");
    bpftool_detach(&s.link_dir().join(names::PROG_SK_LOOKUP));
    let passes = s.passes();
    s.assert_healed(passes);
    assert_eq!(
        s.repairs("netns_link"),
        before + 1,
        "the sk_lookup link re-attached"
    );
}

#[test]
fn deleted_map_entry_is_rewritten() {
    let s = scene(NodeOptions::default());
    let cookie = s.client.cookie().expect("cookie");
    let mut maps = linkerd_cni_agent::dataplane::maps::Maps::open(&s.node.pin_root().join("maps"))
        .unwrap_or_else(|e| panic!("opening the pinned maps: {e}"));
    let expected = maps.pod_config(cookie).expect("config entry");
    let local = maps.pod_addrs(cookie).expect("getsockname's addresses");
    maps.pod_config.remove(&cookie).expect("delete the entry");
    maps.pod_addrs
        .as_mut()
        .expect("the map")
        .remove(&cookie)
        .expect("delete getsockname's entry");
    let passes = s.passes();
    s.assert_healed(passes);
    assert_eq!(
        maps.pod_config(cookie),
        Some(expected),
        "the same entry is back"
    );
    assert_eq!(
        maps.pod_addrs(cookie),
        Some(local),
        "getsockname's entry is back"
    );
    assert!(s.repairs("map_entries") >= 1);
}

#[test]
fn unmounted_bpffs_is_mounted_again_and_repaired() {
    let s = scene(NodeOptions {
        private_bpffs: true,
        ..NodeOptions::default()
    });
    let bpffs = s.node.bpffs().expect("private bpffs").to_path_buf();
    let health = s.node.agent().expect("agent").health_addr();
    let ready = || {
        http_get(health, "/ready", Duration::from_secs(2))
            .map(|r| r.0)
            .ok()
    };
    assert_eq!(ready(), Some(200));

    // Unmounted and nothing in the way: mounted again, pins and links restored.
    nix::mount::umount(&bpffs).expect("umount bpffs");
    let passes = s.passes();
    s.assert_healed(passes);
    assert!(s.repairs("pins") >= 1);
    assert!(
        s.node
            .pin_root()
            .join("maps")
            .join(names::MAP_POD_CONFIG)
            .exists(),
        "the maps are pinned again"
    );

    // Unmounted and cannot be mounted again (a file where the mount point was): not ready.
    nix::mount::umount(&bpffs).expect("umount bpffs again");
    std::fs::remove_dir(&bpffs).expect("rmdir the mount point");
    std::fs::write(&bpffs, "in the way").expect("a file in the way");
    let passes = s.passes();
    s.within_a_pass("/ready fails", passes, || ready() == Some(503));
    assert_eq!(s.metric("linkerd_cni_agent_dataplane_ready"), 0);

    // Fixed: mounted again, ready again, the pod redirected again.
    std::fs::remove_file(&bpffs).expect("remove the file");
    let passes = s.passes();
    s.assert_healed(passes);
    s.within_a_pass("/ready passes", passes, || ready() == Some(200));
}

#[test]
fn told_the_bpffs_is_the_hosts_the_agent_waits_for_it_instead_of_mounting_its_own() {
    // The DaemonSet's agent (`--bpffs-from-host`): a bpffs it mounted itself would be its
    // container's only, so when the pins go with an unmount it stays unready, naming why,
    // until the host mounts bpffs again; then it pins there and repairs the pod.
    let s = scene(NodeOptions {
        private_bpffs: true,
        bpffs_from_host: true,
        ..NodeOptions::default()
    });
    let bpffs = s.node.bpffs().expect("private bpffs").to_path_buf();
    let health = s.node.agent().expect("agent").health_addr();
    let ready = || http_get(health, "/ready", Duration::from_secs(2)).ok();
    assert_eq!(ready().map(|r| r.0), Some(200));
    let on_bpffs = || kernel::on_bpffs(&bpffs).expect("statfs the mount point");

    nix::mount::umount(&bpffs).expect("umount bpffs");
    let passes = s.passes();
    s.within_a_pass(
        "/ready fails naming the missing bpffs",
        passes,
        || matches!(ready(), Some((503, body)) if body.contains("no bpffs at or above")),
    );
    assert_eq!(s.metric("linkerd_cni_agent_dataplane_ready"), 0);
    // Another whole pass: still nothing mounted (the kernel's word, statfs), no pins made.
    let passes = s.passes();
    s.within_a_pass("a whole pass ran", passes, || s.passes() >= passes + 2);
    assert!(
        !on_bpffs(),
        "the agent mounted a bpffs of its own at {}",
        bpffs.display()
    );
    assert!(
        !s.node.pin_root().join("maps").exists(),
        "pins made outside a bpffs under {}",
        s.node.pin_root().display()
    );

    // The host mounts bpffs again: pinned there, the pod repaired, ready again.
    kernel::ensure_bpffs_at(&bpffs).expect("mount bpffs as the host would");
    let passes = s.passes();
    s.assert_healed(passes);
    s.within_a_pass("/ready passes", passes, || {
        ready().map(|r| r.0) == Some(200)
    });
    assert!(s.repairs("pins") >= 1);
}

/// Periodic passes far apart: the repairs below can only come from the on-demand paths.
fn on_demand_only() -> NodeOptions {
    NodeOptions {
        reconcile_interval: Some(Duration::from_secs(3600)),
        ..NodeOptions::default()
    }
}

#[test]
fn cni_check_reports_and_repairs() {
    let s = scene(on_demand_only());
    bpftool_detach(&s.link_dir().join(names::PROG_CONNECT4));
    let passes = s.passes();
    let out = s.node.cni(Verb::Check, &s.client).expect("CHECK");
    let err = out
        .error()
        .unwrap_or_else(|| panic!("CHECK reports what it found: {}", out.stdout));
    assert_eq!(err.code, 100, "{err:?}");
    assert!(
        err.msg.contains("detached") && err.msg.contains("repaired"),
        "{err:?}"
    );
    // No periodic pass runs: CHECK itself repaired it.
    s.assert_healed(passes);
    let out = s.node.cni(Verb::Check, &s.client).expect("CHECK");
    assert!(out.ok(), "CHECK passes once repaired: {}", out.stdout);
    assert_eq!(s.repairs("cgroup_link"), 1);
}

#[test]
fn sighup_runs_a_pass_at_once() {
    let s = scene(on_demand_only());
    std::fs::remove_dir_all(s.link_dir()).expect("rm -rf the pod's link pins");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(s.repairs("cgroup_link"), 0, "no pass before SIGHUP");
    let pid = s.node.agent().expect("agent").pid();
    // The next periodic pass is an hour away: only the SIGHUP's pass can repair this.
    let passes = s.passes();
    signal(pid, nix::sys::signal::Signal::SIGHUP).expect("SIGHUP");
    s.assert_healed(passes);
    assert_eq!(
        s.repairs("cgroup_link"),
        names::CGROUP_PROGRAMS.len() as u64
    );
}
