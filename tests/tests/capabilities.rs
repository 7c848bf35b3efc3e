//! The capabilities the agent's container is given (root required): the agent binary, run
//! with exactly the required capabilities of `host::capabilities` (as the DaemonSet's
//! unprivileged container runs it), loads and pins its programs; without any one of them it
//! refuses at start with one line naming that capability, instead of a raw `EPERM` later.
//!
//! Run: `cargo test -p linkerd-cni-tests --test capabilities -- --test-threads=1`

use std::process::{Command, Output};

use linkerd_cni_agent::host::{
    capabilities::{CAPABILITIES, required_names},
    kernel,
};
use linkerd_cni_tests::{
    AgentHarness,
    cniruntime::Verb,
    node::{NodeOptions, PodSpec, SimNode, namespace_manifest, workspace_bin},
};

/// Runs `linkerd-cni-agent load` with exactly `caps` (bounding set, so also its effective set
/// as root) on a fresh pin root and registry, cleaned up afterwards.
fn load_with(caps: &[&str]) -> Output {
    let config = AgentHarness::fresh_config();
    kernel::ensure_bpffs(&config.pin_root).expect("bpffs mounted for the test's pin root");
    let _cleanup = AgentHarness::stopped_on(config.clone());
    let bounding = std::iter::once("-all".to_string())
        .chain(caps.iter().map(|c| format!("+{}", c.to_lowercase())))
        .collect::<Vec<_>>()
        .join(",");
    let agent = workspace_bin("linkerd-cni-agent").expect("the agent binary is built");
    Command::new("setpriv")
        .arg("--bounding-set")
        .arg(&bounding)
        .arg(agent)
        .arg("--pin-root")
        .arg(&config.pin_root)
        .arg("--state-dir")
        .arg(&config.state_dir)
        .arg("load")
        .env("RUST_BACKTRACE", "0")
        .env("NO_COLOR", "1")
        .output()
        .expect("setpriv (util-linux) runs the agent")
}

#[test]
fn the_required_capabilities_are_enough_to_load_and_pin() {
    let out = load_with(&required_names());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "with {:?} only: {}\n{stderr}",
        required_names(),
        out.status
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("programs loaded and pinned"),
        "{stderr}"
    );
    // The optional one, not given, is named as a warning, not an error.
    assert!(
        stderr.contains("capability CAP_SYS_PTRACE not held"),
        "{stderr}"
    );
}

#[test]
fn each_missing_required_capability_is_named_at_start_in_one_line() {
    for missing in required_names() {
        let caps: Vec<_> = required_names()
            .into_iter()
            .filter(|c| *c != missing)
            .collect();
        let out = load_with(&caps);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "without CAP_{missing}: {stderr}");
        let lines: Vec<_> = stderr
            .lines()
            .filter(|l| l.contains("missing capability"))
            .collect();
        assert_eq!(lines.len(), 1, "without CAP_{missing}: {stderr}");
        assert!(
            lines[0].contains(&format!("missing capability CAP_{missing} (needed for ")),
            "without CAP_{missing}: {stderr}"
        );
        // Nothing was loaded before the check refused.
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("programs loaded"),
            "{stderr}"
        );
    }
}

/// The effective capability set of process `pid`.
fn cap_eff(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("agent status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .expect("CapEff")
}

/// Issue 36 item 1: the agent holding exactly the required capabilities (no `CAP_SYS_ADMIN`:
/// its effective set is read from `/proc`) serves the ADD, CHECK and DEL of a meshed pod
/// through the real plugin and socket: the plugin passes a socket from inside the pod's
/// netns, so the agent never enters it; the pod's links and map entries are in place after
/// ADD, CHECK passes (also after a restart on the same capabilities), and DEL removes them.
#[test]
fn the_required_capabilities_serve_add_check_and_del() {
    let mut node = SimNode::start(NodeOptions::default(), &[namespace_manifest("shop", &[])])
        .unwrap_or_else(|e| panic!("starting the simulated node: {e}"));
    node.start_agent_with_capabilities(&required_names())
        .unwrap_or_else(|e| panic!("the agent with {:?} only: {e}", required_names()));
    let pid = node.agent().expect("agent running").pid();
    let held = cap_eff(pid);
    let want: u64 = CAPABILITIES
        .iter()
        .filter(|c| c.required)
        .map(|c| 1u64 << c.bit)
        .sum();
    assert_eq!(held, want, "the agent holds exactly the required set");
    assert_eq!(held & (1 << 21), 0, "no CAP_SYS_ADMIN");

    let pod = node.added_pod(PodSpec::meshed("shop", "capped"));
    let cookie = pod.cookie().expect("cookie");
    let st = node.state().expect("state");
    assert!(st.registered().contains(&pod.container_id), "registered");
    assert!(!st.links_of(&pod.container_id).is_empty(), "links attached");
    assert!(
        st.pod_config.contains_key(&cookie),
        "config entry under the pod's cookie"
    );
    let check = node.cni(Verb::Check, &pod).expect("CHECK runs");
    assert!(check.ok(), "CHECK: {}\n{}", check.stdout, check.stderr);
    // A restart on the same capabilities: without CAP_SYS_ADMIN the pod's inbound stub
    // cannot be opened by ID, so it is replaced (not kept); the pod stays registered, linked
    // and in force.
    node.start_agent_with_capabilities(&required_names())
        .unwrap_or_else(|e| panic!("restarting the agent with {:?} only: {e}", required_names()));
    let st = node.state().expect("state");
    assert!(
        st.registered().contains(&pod.container_id),
        "still registered"
    );
    assert!(!st.links_of(&pod.container_id).is_empty(), "still linked");
    let check = node.cni(Verb::Check, &pod).expect("CHECK runs");
    assert!(
        check.ok(),
        "CHECK after the restart: {}\n{}",
        check.stdout,
        check.stderr
    );
    let del = node.cni(Verb::Del, &pod).expect("DEL runs");
    assert!(del.ok(), "DEL: {}\n{}", del.stdout, del.stderr);
    let st = node.state().expect("state");
    assert!(!st.registered().contains(&pod.container_id), "unregistered");
    assert!(!st.pod_config.contains_key(&cookie), "entries removed");
}
