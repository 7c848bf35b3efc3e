//! The agent container's bpffs comes from the host (root required). The DaemonSet gives the
//! agent container the node's `/sys/fs/bpf` by HostToContainer propagation and sets
//! `LINKERD_CNI_AGENT_BPFFS_FROM_HOST`: where the node has no bpffs there (the host does not
//! mount one and `agent.mountBpffs=false` left out the init container that would), the agent
//! must refuse to start, naming why in one line, instead of mounting a bpffs of its own, which
//! would live in its container's mount namespace only and take every pod's links with it when
//! the container stops.
//!
//! The container is reproduced by a private mount namespace (`unshare --mount`) whose
//! `/sys/fs/bpf` is a plain tmpfs, as a hostPath volume of a node without bpffs would be; the
//! control shows that, without the setting, the agent does mount its own bpffs there.
//!
//! Run: `cargo test -p linkerd-cni-tests --test host_bpffs -- --test-threads=1`

use std::process::{Command, Output};

use linkerd_cni_agent::host::kernel;
use linkerd_cni_tests::{AgentHarness, names::TempDir, node::workspace_bin};

const REFUSAL: &str = "no bpffs at or above";

/// Runs `linkerd-cni-agent <args>` in a new private mount namespace whose `/sys/fs/bpf` is a
/// tmpfs (no bpffs), then prints the filesystem `/sys/fs/bpf` is on once the agent exited
/// (`stat -f`: the kernel's word; `/proc/self/mountinfo` would also list the host's bpffs,
/// covered by the tmpfs). The namespace, and anything mounted in it, goes with the shell.
fn in_container_without_bpffs(state: &TempDir, from_host: bool, args: &[&str]) -> Output {
    let agent = workspace_bin("linkerd-cni-agent").expect("the agent binary is built");
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(
            "mount -t tmpfs l5dt-no-bpffs /sys/fs/bpf || exit 90; \
             \"$@\"; echo \"agent-exit=$?\"; \
             echo \"fs=$(stat -f -c %T /sys/fs/bpf)\"",
        )
        .arg("sh")
        .arg(agent)
        .arg("--state-dir")
        .arg(state.path())
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .env("NO_COLOR", "1")
        // The agent's `run` would need these; it must refuse before reading them.
        .env("LINKERD_CNI_AGENT_SOCKET", state.path().join("agent.sock"))
        .env("LINKERD_CNI_AGENT_NODE_NAME", "l5dt-node");
    if from_host {
        // As the chart sets it.
        cmd.env("LINKERD_CNI_AGENT_BPFFS_FROM_HOST", "true");
    }
    cmd.output().expect("unshare (util-linux) runs the agent")
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn without_the_nodes_bpffs_run_and_load_refuse_in_one_line_and_mount_nothing() {
    for command in ["load", "run"] {
        let state = TempDir::new().expect("scratch dir");
        let out = in_container_without_bpffs(&state, true, &[command]);
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "the shell ran: {stdout}\n{stderr}");
        assert!(
            !stdout.contains("agent-exit=0"),
            "`{command}` started without the node's bpffs: {stdout}\n{stderr}"
        );
        let refusals: Vec<_> = stderr.lines().filter(|l| l.contains(REFUSAL)).collect();
        assert_eq!(refusals.len(), 1, "`{command}`: {stderr}");
        assert!(
            refusals[0].contains("/sys/fs/bpf/linkerd-cni")
                && refusals[0].contains("agent.mountBpffs=true"),
            "the line names the pin root and the fix: {}",
            refusals[0]
        );
        assert!(
            stdout.contains("fs=tmpfs"),
            "`{command}` mounted a bpffs of its own: {stdout}"
        );
    }
}

#[test]
fn control_without_the_setting_the_agent_mounts_a_bpffs_of_its_own() {
    // What the setting prevents: the same namespace, and `load` mounts a bpffs there and
    // pins into it (it all goes with the namespace when the shell exits).
    let state = TempDir::new().expect("scratch dir");
    let out = in_container_without_bpffs(&state, false, &["load"]);
    let (stdout, stderr) = text(&out);
    assert!(
        stdout.contains("agent-exit=0") && stdout.contains("programs loaded and pinned"),
        "{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains("fs=bpf_fs"),
        "a bpffs of its own at /sys/fs/bpf: {stdout}"
    );
    assert!(!stderr.contains(REFUSAL), "{stderr}");
}

#[test]
fn with_the_nodes_bpffs_the_setting_changes_nothing() {
    let config = AgentHarness::fresh_config();
    kernel::ensure_bpffs(&config.pin_root).expect("bpffs mounted for the test's pin root");
    let _cleanup = AgentHarness::stopped_on(config.clone());
    let agent = workspace_bin("linkerd-cni-agent").expect("the agent binary is built");
    let out = Command::new(agent)
        .arg("--pin-root")
        .arg(&config.pin_root)
        .arg("--state-dir")
        .arg(&config.state_dir)
        .arg("load")
        .env("LINKERD_CNI_AGENT_BPFFS_FROM_HOST", "true")
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("the agent runs");
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("programs loaded and pinned"), "{stdout}");
    assert!(
        config.pin_root.join("maps").is_dir(),
        "pinned under {}",
        config.pin_root.display()
    );
}
