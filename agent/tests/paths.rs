//! The agent refuses node paths inside another component's tree before it touches anything
//! (issue 45): `run` and `load` refuse to start, `uninstall` refuses to remove. The check is
//! the first thing each command does, so these need no privilege.

use std::process::Command;

fn agent(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_linkerd-cni-agent"))
        .args(args)
        .env("DEST_CNI_NET_DIR", "/nonexistent/net.d")
        .env("DEST_CNI_BIN_DIR", "/nonexistent/bin")
        .env("CNI_NETWORK_CONFIG", "{}")
        .output()
        .expect("run linkerd-cni-agent");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn paths_inside_other_components_trees_are_refused() {
    for (args, want) in [
        (
            &["run", "--socket", "/var/lib/kubelet/agent.sock"][..],
            "the socket's directory /var/lib/kubelet lies inside /var/lib/kubelet (owned by kubelet)",
        ),
        (
            &["--state-dir", "/etc/cni/net.d/l5d", "run"][..],
            "the registry /etc/cni/net.d/l5d lies inside /etc/cni/net.d",
        ),
        (
            &["--pin-root", "/sys/fs/bpf/tc", "load"][..],
            "the pin root /sys/fs/bpf/tc lies inside /sys/fs/bpf/tc (owned by another eBPF tenant)",
        ),
        (
            &["--pin-root", "/sys/fs/bpf/", "run"][..],
            "the pin root /sys/fs/bpf/ lies inside /sys/fs/bpf (owned by every eBPF tenant",
        ),
        (
            &[
                "uninstall",
                "--keep-plugin",
                "--socket",
                "/run/netns/l5d/agent.sock",
            ][..],
            "refusing to uninstall: the socket's directory /run/netns/l5d lies inside /run/netns",
        ),
        (
            &[
                "uninstall",
                "--keep-plugin",
                "--host-root",
                "/host",
                "--socket",
                "/host/var/lib/kubelet/pods/agent.sock",
            ][..],
            "lies inside /var/lib/kubelet (owned by kubelet)",
        ),
    ] {
        let (ok, stderr) = agent(args);
        assert!(!ok, "{args:?} started");
        assert!(stderr.contains(want), "{args:?}: {stderr}");
    }
}
