//! The capabilities the agent's container is given (root required): the agent binary, run
//! with exactly the required capabilities of `host::capabilities` (as the DaemonSet's
//! unprivileged container runs it), loads and pins its programs; without any one of them it
//! refuses at start with one line naming that capability, instead of a raw `EPERM` later.
//!
//! Run: `cargo test -p linkerd-cni-tests --test capabilities -- --test-threads=1`

use std::process::{Command, Output};

use linkerd_cni_agent::host::{capabilities::CAPABILITIES, kernel};
use linkerd_cni_tests::{AgentHarness, node::workspace_bin};

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

fn required() -> Vec<&'static str> {
    CAPABILITIES
        .iter()
        .filter(|c| c.required)
        .map(|c| c.name)
        .collect()
}

#[test]
fn the_required_capabilities_are_enough_to_load_and_pin() {
    let out = load_with(&required());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "with {:?} only: {}\n{stderr}",
        required(),
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
    for missing in required() {
        let caps: Vec<_> = required().into_iter().filter(|c| *c != missing).collect();
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
