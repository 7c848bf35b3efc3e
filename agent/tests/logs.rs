//! The agent's log records as a pod's log carries them (issue 37): the binary run with its
//! standard error a pipe, as the container runtime gives it: `plain` lines carry no ANSI escape
//! sequences, `json` lines are JSON objects with the plain line's fields, and both go to
//! standard error (docs/operating/logs.md), standard output keeping only the command's own result.
//! `linkerd-cni-agent uninstall` on a scratch CNI directory is the command: it logs a record
//! and needs no privilege beyond writing there.

use std::{path::Path, process::Command};

fn run(dir: &Path, format: &[&str]) -> (String, String) {
    let (net, bin, sa) = (dir.join("net"), dir.join("bin"), dir.join("sa"));
    for d in [&net, &bin, &sa] {
        std::fs::create_dir_all(d).expect("mkdir");
    }
    std::fs::write(sa.join("token"), "t").expect("token");
    std::fs::write(
        net.join("10-x.conflist"),
        r#"{"name":"x","cniVersion":"1.0.0","plugins":[{"type":"bridge"},{"type":"linkerd-cni"}]}"#,
    )
    .expect("conflist");
    let out = Command::new(env!("CARGO_BIN_EXE_linkerd-cni-agent"))
        .args(format)
        .arg("uninstall")
        // Everything else the uninstall removes, in the scratch directory too: the defaults
        // are the node's own paths.
        .args(["--pin-root".as_ref(), dir.join("pins").as_os_str()])
        .args(["--state-dir".as_ref(), dir.join("state").as_os_str()])
        .args(["--socket".as_ref(), dir.join("agent.sock").as_os_str()])
        .args(["--bpffs".as_ref(), dir.as_os_str()])
        .env("DEST_CNI_NET_DIR", &net)
        .env("DEST_CNI_BIN_DIR", &bin)
        .env("CONTAINER_MOUNT_PREFIX", "")
        .env(
            "CNI_NETWORK_CONFIG",
            r#"{"type":"linkerd-cni","name":"linkerd-cni"}"#,
        )
        .env("KUBERNETES_SERVICE_HOST", "10.0.0.1")
        .env("KUBERNETES_SERVICE_PORT", "443")
        .env("SERVICEACCOUNT_PATH", &sa)
        .env_remove("LINKERD_CNI_AGENT_LOG_FORMAT")
        .env_remove("NO_COLOR")
        .output()
        .expect("run linkerd-cni-agent");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        String::from_utf8(out.stdout).expect("UTF-8"),
        String::from_utf8(out.stderr).expect("UTF-8"),
    )
}

#[test]
fn plain_and_json_records_on_standard_error() {
    let dir = std::env::temp_dir().join(format!("l5d-agent-logs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    const MESSAGE: &str = "removed linkerd-cni from a CNI plugin list";

    for format in [&[][..], &["--log-format", "plain"][..]] {
        let (stdout, stderr) = run(&dir.join("plain"), format);
        assert!(
            stdout.starts_with("linkerd-cni removed from this node\n"),
            "{stdout}"
        );
        let line = stderr
            .lines()
            .find(|l| l.contains(MESSAGE))
            .unwrap_or_else(|| panic!("no record on standard error: {stderr:?}"));
        assert!(!stderr.contains('\u{1b}'), "escape codes in {stderr:?}");
        assert!(
            line.contains(" INFO linkerd_cni_installer::installer: ") && line.contains(" path="),
            "{line}"
        );
    }

    let (stdout, stderr) = run(&dir.join("json"), &["--log-format", "json"]);
    assert!(
        stdout.starts_with("linkerd-cni removed from this node\n"),
        "{stdout}"
    );
    let records: Vec<serde_json::Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect();
    let r = records
        .iter()
        .find(|r| r["message"] == MESSAGE)
        .unwrap_or_else(|| panic!("no record: {stderr}"));
    assert_eq!(r["level"], "INFO");
    assert_eq!(r["target"], "linkerd_cni_installer::installer");
    assert!(
        r["fields"]["path"]
            .as_str()
            .is_some_and(|p| p.ends_with("10-x.conflist")),
        "{r}"
    );
    assert!(
        r["timestamp"].as_str().is_some_and(|t| t.ends_with('Z')),
        "{r}"
    );
    assert!(r["spans"].is_array(), "{r}");
    let _ = std::fs::remove_dir_all(&dir);
}
