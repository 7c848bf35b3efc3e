//! Evidence per pod, where operators look (root required): on a simulated node (libcni, the
//! agent as a real process, the fake Kubernetes API), what the agent says about each meshed
//! pod's redirection, read back as the Events the API server holds, the agent's gauge, and
//! `linkerd check`'s output:
//!
//! - a pod on the shared attachment (its cgroup did not exist at ADD) gets no
//!   `LinkerdCNIRedirected` at ADD; once its cgroup exists below the shared attachment's
//!   cgroup it does, and one whose cgroup appears elsewhere gets `LinkerdCNIUnredirected`
//!   naming both cgroups (negative control: each gets only its own);
//! - a meshed pod running without a registration (started before the plugin, no adoption, no
//!   repair) and a shared pod whose cgroup never appears get a standing
//!   `LinkerdCNIUnredirected`, refreshed while it lasts, listed by `linkerd check`, and cleared
//!   by `LinkerdCNIRedirected` once the pod is registered; unmeshed and `hostNetwork` pods get
//!   nothing.
//!
//! Run: `cargo build --bins && cargo test -p linkerd-cni-tests --test evidence -- --test-threads=1`

use std::{net::IpAddr, path::Path, time::Duration};

use linkerd_cni_agent::host::capabilities::required_names;
use linkerd_cni_tests::{
    CgroupGuard,
    node::{
        self, NODE_NAME, NodeOptions, PodSpec, SimNode, SimPod, namespace_manifest, wait_until,
        workspace_bin,
    },
};
use serde_json::Value;

const APP_UID: u32 = 1000;
/// Only turns a verification loop whose passes stopped into a failure.
const HANG: Duration = Duration::from_secs(120);

fn options(shared: &CgroupGuard, grace: Duration, refresh: Duration) -> NodeOptions {
    NodeOptions {
        agent_args: [
            "--adopt-interval=300ms".to_string(),
            format!("--repair-grace={}ms", grace.as_millis()),
            format!("--unredirected-event-interval={}ms", refresh.as_millis()),
            "--repair-pods=false".into(),
            format!("--shared-cgroup={}", shared.path().display()),
        ]
        .into(),
        ..NodeOptions::default()
    }
}

fn metric(node: &SimNode, name: &str) -> u64 {
    node.agent()
        .expect("agent")
        .metric(name)
        .unwrap_or_else(|e| panic!("{e}"))
}

fn passes(node: &SimNode) -> u64 {
    metric(node, "linkerd_cni_agent_verify_passes_total")
}

fn unredirected(node: &SimNode, reason: &str) -> u64 {
    metric(
        node,
        &format!("linkerd_cni_agent_pods_unredirected{{reason=\"{reason}\"}}"),
    )
}

/// The Events on pod `name` of namespace `shop`: (reason, note).
fn events(node: &SimNode, name: &str) -> Vec<(String, String)> {
    node.apiserver()
        .pod_events("shop", name)
        .unwrap_or_else(|e| panic!("listing Events: {e}"))
        .iter()
        .map(|e| {
            let s = |k: &str| e[k].as_str().unwrap_or_default().to_string();
            (s("reason"), s("note"))
        })
        .collect()
}

fn has(node: &SimNode, name: &str, reason: &str, note_has: &str) -> bool {
    events(node, name)
        .iter()
        .any(|(r, n)| r == reason && n.contains(note_has))
}

/// Waits until `done` holds, failing if a whole verification pass that began after this call
/// ended without it (Events are written a moment after the pass: polled on).
fn within_a_pass(node: &SimNode, what: &str, mut done: impl FnMut() -> bool) {
    node::within_a_pass(what, passes(node), HANG, || passes(node), &mut done)
        .or_else(|_| {
            // The pass recorded it; the recorder's write to the API follows.
            wait_until(what, Duration::from_secs(10), || done().then_some(()))
        })
        .unwrap_or_else(|e| panic!("{e}\n{}", node.diagnostics()));
}

/// Waits for two more verification passes.
fn two_passes(node: &SimNode) {
    let before = passes(node);
    wait_until("two verification passes", HANG, || {
        (passes(node) >= before + 2).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", node.diagnostics()));
}

/// `cgroup` relative to the cgroup2 root, without its leading `/`.
fn relative(cgroup: &CgroupGuard) -> String {
    cgroup
        .relative_path()
        .expect("below the cgroup2 root")
        .trim_start_matches('/')
        .to_string()
}

/// A meshed pod added while the cgroup its runtime names (`rel`) does not exist yet: on the
/// shared attachment.
fn shared_pod(node: &SimNode, name: &str, rel: &str) -> SimPod {
    let mut pod = node
        .new_pod(PodSpec::meshed("shop", name))
        .unwrap_or_else(|e| panic!("pod {name}: {e}"));
    node.add_naming_cgroup(&mut pod, rel)
        .unwrap_or_else(|e| panic!("ADD of {name}: {e}\n{}", node.diagnostics()));
    let record = node
        .state()
        .expect("agent state")
        .record(&pod.container_id)
        .unwrap_or_else(|| panic!("no record of {name}"));
    assert_eq!(
        record["attachment"]["mode"], "shared",
        "no cgroup at ADD: the shared attachment: {record}"
    );
    pod
}

#[test]
fn a_pod_on_the_shared_attachment_is_redirected_only_once_its_cgroup_is_found_below_it() {
    let shared = CgroupGuard::new().expect("the shared attachment's cgroup");
    let elsewhere = CgroupGuard::new().expect("a cgroup outside it");
    // A grace longer than the test: nothing is reported for want of a cgroup.
    let grace = Duration::from_secs(120);
    let mut node = SimNode::start(
        options(&shared, grace, Duration::from_secs(900)),
        &[namespace_manifest("shop", &[])],
    )
    .unwrap_or_else(|e| panic!("starting the simulated node: {e}"));
    let inside_rel = format!("{}/pod-inside", relative(&shared));
    let outside_rel = format!("{}/pod-outside", relative(&elsewhere));
    let _inside = shared_pod(&node, "inside", &inside_rel);
    let _outside = shared_pod(&node, "outside", &outside_rel);

    // Attached, not seen: no Event claims either pod redirected, at ADD or since.
    two_passes(&node);
    std::thread::sleep(Duration::from_millis(500));
    for name in ["inside", "outside"] {
        assert_eq!(
            events(&node, name),
            Vec::<(String, String)>::new(),
            "{name}: nothing said before its cgroup exists\n{}",
            node.diagnostics()
        );
    }

    // The runtime makes the sandboxes' cgroups.
    let inside_cg = CgroupGuard::at(Path::new(&inside_rel)).expect("the inside pod's cgroup");
    let outside_cg = CgroupGuard::at(Path::new(&outside_rel)).expect("the outside pod's cgroup");
    let inside_path = inside_cg.path().display().to_string();
    let outside_path = outside_cg.path().display().to_string();
    within_a_pass(&node, "both pods' cgroups verified", || {
        has(&node, "inside", "LinkerdCNIRedirected", &inside_path)
            && has(&node, "outside", "LinkerdCNIUnredirected", &outside_path)
    });
    let (_, note) = events(&node, "outside")
        .into_iter()
        .find(|(r, _)| r == "LinkerdCNIUnredirected")
        .expect("checked above");
    assert!(
        note.contains(&shared.path().display().to_string()),
        "the note names the shared attachment's cgroup too: {note}"
    );
    assert_eq!(unredirected(&node, "outside_shared_cgroup"), 1);
    assert_eq!(unredirected(&node, "unverified"), 0);
    assert_eq!(
        metric(&node, "linkerd_cni_agent_shared_verified_total"),
        1,
        "the inside pod verified, once"
    );
    // Negative control: each pod got only its own verdict.
    two_passes(&node);
    assert!(
        !events(&node, "inside")
            .iter()
            .any(|(r, _)| r == "LinkerdCNIUnredirected"),
        "{:?}",
        events(&node, "inside")
    );
    assert!(
        !events(&node, "outside")
            .iter()
            .any(|(r, _)| r == "LinkerdCNIRedirected"),
        "{:?}",
        events(&node, "outside")
    );
    assert!(
        node.agent_log().contains("pod=outside"),
        "a log line names the pod"
    );
    node.kill_agent();
}

/// `linkerd check --pre --linkerd-cni-enabled` against the node's API server: the redirection
/// check's line and what follows it (its details), until the next check.
fn check_lines(node: &SimNode) -> String {
    let out = std::process::Command::new(workspace_bin("linkerd").expect("the linkerd binary"))
        .args(["check", "--pre", "--linkerd-cni-enabled", "--wait=0s"])
        .arg("--kubeconfig")
        .arg(node.kubeconfig())
        .output()
        .expect("running linkerd check");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut lines = stdout
        .lines()
        .skip_while(|l| !l.contains("no meshed pod runs without redirection"));
    let mut section: Vec<&str> = lines.next().into_iter().collect();
    section.extend(lines.take_while(|l| l.starts_with("    ")));
    assert!(!section.is_empty(), "no redirection check in:\n{stdout}");
    section.join("\n")
}

#[test]
fn a_meshed_pod_without_redirection_is_reported_while_it_lasts_then_cleared() {
    let shared = CgroupGuard::new().expect("the shared attachment's cgroup");
    let mut node = SimNode::start(
        options(&shared, Duration::from_secs(1), Duration::from_secs(1)),
        &[namespace_manifest("shop", &[])],
    )
    .unwrap_or_else(|e| panic!("starting the simulated node: {e}"));
    // Pods that start while the agent is down and linkerd-cni is not in the chain.
    node.kill_agent();
    let (early, _app) = node
        .early_pod(PodSpec::meshed("shop", "early"), APP_UID)
        .unwrap_or_else(|e| panic!("an early pod: {e}"));
    let (_plain, _plain_app) = node
        .early_pod(PodSpec::unmeshed("shop", "plain"), APP_UID)
        .unwrap_or_else(|e| panic!("an early unmeshed pod: {e}"));
    let host = PodSpec::meshed("shop", "host");
    let mut manifest = host.manifest_running(NODE_NAME, &[IpAddr::from([192, 0, 2, 10])]);
    manifest["spec"]["hostNetwork"] = true.into();
    node.apply(&[manifest]).expect("a hostNetwork pod");
    node.start_agent_with_capabilities(&required_names())
        .unwrap_or_else(|e| panic!("agent: {e}\n{}", node.diagnostics()));
    // And a pod on the shared attachment whose cgroup never appears.
    let never_rel = format!("{}/pod-never", relative(&shared));
    let _never = shared_pod(&node, "never", &never_rel);

    within_a_pass(&node, "both pods reported", || {
        has(&node, "early", "LinkerdCNIUnredirected", "no CNI ADD")
            && has(&node, "never", "LinkerdCNIUnredirected", "not verified")
    });
    assert_eq!(unredirected(&node, "unregistered"), 1);
    assert_eq!(unredirected(&node, "unverified"), 1);
    for name in ["plain", "host"] {
        assert_eq!(
            events(&node, name),
            Vec::<(String, String)>::new(),
            "nothing said of {name}"
        );
    }
    let listed = check_lines(&node);
    assert!(
        listed.starts_with('×')
            && listed.contains(&format!(
                "shop/early on node {NODE_NAME}: meshed pod running"
            ))
            && listed.contains("shop/never on node"),
        "linkerd check lists both: {listed}"
    );

    // Refreshed while it lasts (every second here): the standing Event's series counts on
    // (each update renews an Event's TTL in a real API server); the recorder patches a
    // series at most every 30 s.
    let counted = |node: &SimNode| {
        node.apiserver()
            .pod_events("shop", "early")
            .expect("Events")
            .iter()
            .filter(|e| e["reason"] == "LinkerdCNIUnredirected")
            .map(|e| {
                e.pointer("/series/count")
                    .and_then(Value::as_i64)
                    .unwrap_or(1)
            })
            .max()
            .unwrap_or(0)
    };
    wait_until(
        "the standing Event refreshed",
        Duration::from_secs(75),
        || (counted(&node) >= 2).then_some(()),
    )
    .unwrap_or_else(|e| panic!("{e}: {:?}\n{}", events(&node, "early"), node.diagnostics()));

    // The pod's sandbox recreated through the plugin: registered, so cleared.
    let mut again = node
        .new_pod(early.spec.clone())
        .unwrap_or_else(|e| panic!("the recreated sandbox: {e}"));
    // The pod object is rewritten without its addresses (its new sandbox has none yet), so it
    // is no candidate for a while: it stays reported, and its ADD below still clears it (a
    // pass falling between the two forgot it once, in the 6.1 guest).
    two_passes(&node);
    node.add(&mut again)
        .unwrap_or_else(|e| panic!("ADD: {e}\n{}", node.diagnostics()));
    within_a_pass(&node, "the early pod cleared", || {
        has(&node, "early", "LinkerdCNIRedirected", "redirected now")
    });
    assert_eq!(unredirected(&node, "unregistered"), 0);
    assert_eq!(unredirected(&node, "unverified"), 1, "the other stands");
    let listed = check_lines(&node);
    assert!(
        !listed.contains("shop/early") && listed.contains("shop/never"),
        "linkerd check lists only the pod still unredirected: {listed}"
    );
    node.kill_agent();
}
