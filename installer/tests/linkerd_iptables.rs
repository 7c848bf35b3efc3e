//! A node moved off Linkerd's iptables CNI plugin: its DaemonSet has the same name, the same
//! binary name (`linkerd-cni`) and kubeconfig name, and its installer left a conflist whose last
//! plugin is Linkerd's entry (`type: linkerd-cni`, its `policy` block, `iptables-mode`), the way
//! Linkerd's `install-cni.sh` writes it (`jq`, two-space indentation, its entry appended last).
//! Our installer replaces that entry with its own (one `linkerd-cni` entry, not two), and
//! replaces Linkerd's binary and kubeconfig.

mod support;

use std::fs;

use linkerd_cni_installer::json::Json;
use support::{BINARY, Node, TOKEN, fixture, plugin_types, plugins};

const NAME: &str = "10-calico.conflist";

/// The conflist as Linkerd's installer left it.
fn linkerd_conflist() -> Vec<u8> {
    fs::read(fixture(&format!("linkerd-iptables/{NAME}")))
        .unwrap_or_else(|e| panic!("fixture: {e}"))
}

fn linkerd_entries(bytes: &[u8]) -> Vec<Json> {
    plugins(bytes)
        .into_iter()
        .filter(|p| p.get("type").and_then(Json::as_str) == Some("linkerd-cni"))
        .collect()
}

/// A node as Linkerd's iptables DaemonSet left it: its conflist entry, its own binary and
/// kubeconfig under the names ours uses.
fn node_after_linkerd() -> Node {
    let node = Node::new();
    fs::write(node.net(NAME), linkerd_conflist()).unwrap_or_else(|e| panic!("{e}"));
    let cfg = node.installer.config();
    fs::write(cfg.binary_path(), b"\x7fELF Linkerd's iptables plugin")
        .unwrap_or_else(|e| panic!("{e}"));
    fs::write(
        cfg.kubeconfig_path(),
        "# Kubeconfig file for linkerd CNI plugin.\napiVersion: v1\nkind: Config\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    node
}

#[test]
fn linkerd_iptables_entry_is_replaced_not_duplicated() {
    let node = node_after_linkerd();
    let before = linkerd_entries(&linkerd_conflist());
    assert_eq!(before.len(), 1, "the fixture holds Linkerd's entry");
    assert_eq!(
        before[0]
            .get("linkerd")
            .and_then(|l| l.get("iptables-mode"))
            .and_then(Json::as_str),
        Some("legacy"),
        "Linkerd's entry, in its iptables mode"
    );

    let report = node
        .installer
        .install_once()
        .unwrap_or_else(|e| panic!("install: {e}"));
    assert!(report.errors.is_empty(), "errors: {:?}", report.errors);

    let got = node.read(NAME);
    assert_eq!(
        plugin_types(&got),
        ["calico", "portmap", "linkerd-cni"],
        "{}",
        String::from_utf8_lossy(&got)
    );
    let ours = linkerd_entries(&got);
    assert_eq!(
        ours,
        [node.installer.plugin_entry().clone()],
        "exactly one linkerd-cni entry, ours"
    );
    assert!(
        ours[0].get("policy").is_none(),
        "nothing of Linkerd's entry is kept"
    );
    // The primary CNI's plugins are untouched.
    let primary: Vec<Json> = plugins(&linkerd_conflist())
        .into_iter()
        .filter(|p| p.get("type").and_then(Json::as_str) != Some("linkerd-cni"))
        .collect();
    assert_eq!(plugins(&got)[..2], primary[..]);
    // Linkerd's binary and kubeconfig are replaced by ours.
    let cfg = node.installer.config();
    assert_eq!(
        fs::read(cfg.binary_path()).unwrap_or_else(|e| panic!("{e}")),
        BINARY
    );
    let kubeconfig =
        fs::read_to_string(cfg.kubeconfig_path()).unwrap_or_else(|e| panic!("kubeconfig: {e}"));
    assert!(
        kubeconfig.contains(TOKEN),
        "our kubeconfig, with the service account's token:\n{kubeconfig}"
    );

    // A second pass writes nothing: the entry in place is ours.
    let writes = node.installer.write_counts().conflists;
    node.installer.patch_all();
    assert_eq!(node.installer.write_counts().conflists, writes);
    assert_eq!(node.read(NAME), got);

    // Cleanup leaves the primary's plugins, with no linkerd-cni entry (Linkerd's is gone too).
    node.installer
        .cleanup()
        .unwrap_or_else(|e| panic!("cleanup: {e}"));
    let cleaned = node.read(NAME);
    assert_eq!(plugins(&cleaned), primary);
}
