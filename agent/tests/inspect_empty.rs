//! `linkerd-cni-agent inspect` on a node where nothing is installed (issue 37): one line
//! saying so, exit status 0, nothing created; not the kernel's error for the first missing pin.

use std::process::Command;

#[test]
fn inspect_on_an_empty_node_says_so_in_one_line() {
    let dir = std::env::temp_dir().join(format!("l5d-inspect-empty-{}", std::process::id()));
    let (pins, state) = (dir.join("bpf/linkerd-cni"), dir.join("run/pods"));
    let out = Command::new(env!("CARGO_BIN_EXE_linkerd-cni-agent"))
        .arg("inspect")
        .arg("--pin-root")
        .arg(&pins)
        .arg("--state-dir")
        .arg(&state)
        .env_remove("LINKERD_CNI_AGENT_PIN_ROOT")
        .env_remove("LINKERD_CNI_AGENT_STATE_DIR")
        .output()
        .expect("run linkerd-cni-agent inspect");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert!(
        stdout.starts_with("nothing installed: no linkerd-cni maps pinned at ")
            && stdout.contains(&pins.join("maps").display().to_string()),
        "{stdout}"
    );
    assert!(
        !stdout.contains("BPF_OBJ_GET") && stderr.is_empty(),
        "{stdout}{stderr}"
    );
    assert!(!dir.exists(), "inspect created {}", dir.display());
}
