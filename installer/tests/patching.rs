//! Conflist patching on fixtures shaped like real primary CNIs, compared to golden files, and
//! cleanup restoring the original plugin lists.

mod support;

use std::{fs, os::unix::fs::PermissionsExt};

use linkerd_cni_installer::{FileOutcome, FileState, Installer, Malformed, json::Json};
use support::{Node, fixture, plugin_types, plugins};

/// (fixture, file it becomes, the primary CNI's plugin types: what cleanup must leave)
const CASES: &[(&str, &str, &[&str])] = &[
    ("05-cilium.conflist", "05-cilium.conflist", &["cilium-cni"]),
    ("10-calico.conf", "10-calico.conflist", &["calico"]),
    (
        "10-flannel.conflist",
        "10-flannel.conflist",
        &["flannel", "portmap"],
    ),
    // An old linkerd-cni entry in the middle: removed, ours appended last.
    (
        "10-kindnet.conflist",
        "10-kindnet.conflist",
        &["ptp", "portmap"],
    ),
];
const MALFORMED: &str = "20-broken.conflist";
const UNRELATED: &str = "calico-kubeconfig";

fn all_fixtures(node: &Node) {
    let mut names: Vec<&str> = CASES.iter().map(|c| c.0).collect();
    names.extend([MALFORMED, UNRELATED]);
    node.add_fixtures(&names);
}

/// The primary CNI's plugins as the fixture holds them, old linkerd-cni entries left out; a
/// single-plugin `.conf` is its own one plugin.
fn original_plugins(name: &str) -> Vec<Json> {
    let bytes =
        fs::read(fixture(&format!("net.d/{name}"))).unwrap_or_else(|e| panic!("{name}: {e}"));
    let doc = Json::parse(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
    if doc.has("type") {
        return vec![doc];
    }
    plugins(&bytes)
        .into_iter()
        .filter(|p| p.get("type").and_then(Json::as_str) != Some("linkerd-cni"))
        .collect()
}

#[test]
fn patched_files_match_golden_files() {
    let node = Node::new();
    all_fixtures(&node);
    let report = node
        .installer
        .install_once()
        .unwrap_or_else(|e| panic!("install: {e}"));
    assert!(report.errors.is_empty(), "errors: {:?}", report.errors);

    let update = std::env::var_os("LINKERD_CNI_UPDATE_GOLDEN").is_some();
    for (input, output, primary) in CASES {
        let got = node.read(output);
        let golden = fixture(&format!("expected/{output}"));
        if update {
            fs::write(&golden, &got).unwrap_or_else(|e| panic!("{e}"));
        }
        let want = fs::read(&golden).unwrap_or_else(|e| panic!("golden {output}: {e}"));
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(&want),
            "{input} patched differs from expected/{output}"
        );
        let mut types: Vec<&str> = primary.to_vec();
        types.push("linkerd-cni");
        assert_eq!(plugin_types(&got), types, "{input}: plugin order");
        assert!(
            support::is_patched(&node, &got),
            "{input}: our entry is not last"
        );
    }

    assert_eq!(
        node.listing(),
        [
            "05-cilium.conflist",
            "10-calico.conflist",
            "10-flannel.conflist",
            "10-kindnet.conflist",
            MALFORMED,
            "ZZZ-linkerd-cni-kubeconfig",
            UNRELATED,
        ],
        "net dir after install (the .conf replaced by its .conflist, nothing else added)"
    );
    for name in [MALFORMED, UNRELATED] {
        let original = fs::read(fixture(&format!("net.d/{name}"))).unwrap_or_default();
        assert_eq!(node.read(name), original, "{name} was modified");
    }

    let malformed: Vec<_> = report
        .files
        .iter()
        .filter_map(|(p, o)| match o {
            FileOutcome::Malformed(m) => Some((
                p.file_name().map(|n| n.to_string_lossy().into_owned()),
                m.clone(),
            )),
            _ => None,
        })
        .collect();
    assert_eq!(malformed.len(), 1, "report: {:?}", report.files);
    assert_eq!(malformed[0].0.as_deref(), Some(MALFORMED));
    assert!(
        matches!(malformed[0].1, Malformed::Json(_)),
        "reason: {:?}",
        malformed[0].1
    );

    let status = node.installer.status();
    let reported: Vec<_> = status.malformed().map(|(p, _)| p.to_path_buf()).collect();
    assert_eq!(reported, [node.net(MALFORMED)], "status: {status:?}");
    assert!(status.plugin_in_every_conflist(), "status: {status:?}");
    assert!(status.ready(), "status: {status:?}");
}

#[test]
fn second_install_writes_nothing() {
    let node = Node::new();
    all_fixtures(&node);
    node.installer
        .install_once()
        .unwrap_or_else(|e| panic!("install: {e}"));
    let first = node.installer.write_counts();
    assert_eq!(
        first.conflists,
        CASES.len() as u64,
        "one write per patchable fixture"
    );
    let before: Vec<_> = CASES.iter().map(|c| node.read(c.1)).collect();

    // The same installer again, and a fresh one (an agent restart): both find the entry in place.
    let report = node.installer.patch_all();
    assert_eq!(
        node.installer.write_counts().conflists,
        first.conflists,
        "report: {:?}",
        report.files
    );
    let restarted =
        Installer::new(node.installer.config().clone()).unwrap_or_else(|e| panic!("{e}"));
    let report = restarted.patch_all();
    assert_eq!(
        restarted.write_counts().conflists,
        0,
        "report: {:?}",
        report.files
    );
    let already = report
        .files
        .iter()
        .filter(|(_, o)| *o == FileOutcome::AlreadyPatched)
        .count();
    assert_eq!(already, CASES.len(), "report: {:?}", report.files);
    let after: Vec<_> = CASES.iter().map(|c| node.read(c.1)).collect();
    assert_eq!(before, after);
}

#[test]
fn cleanup_restores_the_original_plugin_lists() {
    let node = Node::new();
    all_fixtures(&node);
    // Permission bits of the primary's file survive patching and cleanup.
    fs::set_permissions(
        node.net("10-flannel.conflist"),
        fs::Permissions::from_mode(0o600),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    node.installer
        .install_once()
        .unwrap_or_else(|e| panic!("install: {e}"));
    assert!(node.installer.status().ready());
    let mode = |name: &str| {
        fs::metadata(node.net(name))
            .map(|m| m.permissions().mode() & 0o777)
            .unwrap_or(0)
    };
    assert_eq!(mode("10-flannel.conflist"), 0o600, "mode after patching");

    node.installer
        .cleanup()
        .unwrap_or_else(|e| panic!("cleanup: {e}"));

    for (input, output, _) in CASES {
        assert_eq!(
            plugins(&node.read(output)),
            original_plugins(input),
            "{input}: plugin list after cleanup"
        );
    }
    assert_eq!(mode("10-flannel.conflist"), 0o600, "mode after cleanup");
    // Everything but the plugin list of a conflist is as the primary CNI wrote it.
    let flannel = Json::parse(&node.read("10-flannel.conflist")).unwrap_or_else(|e| panic!("{e}"));
    let original = Json::parse(&fs::read(fixture("net.d/10-flannel.conflist")).unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(flannel, original, "flannel conflist after cleanup");
    assert_eq!(
        node.read(MALFORMED),
        fs::read(fixture(&format!("net.d/{MALFORMED}"))).unwrap_or_default(),
        "malformed file touched by cleanup"
    );
    assert!(
        !node.net("ZZZ-linkerd-cni-kubeconfig").exists(),
        "kubeconfig left behind"
    );
    assert!(
        !node.installer.config().binary_path().exists(),
        "binary left behind"
    );

    let status = node.installer.status();
    assert!(!status.ready(), "ready after cleanup: {status:?}");
    let unpatched = status
        .files
        .iter()
        .filter(|(_, s)| *s == FileState::Unpatched)
        .count();
    assert_eq!(unpatched, CASES.len(), "status after cleanup: {status:?}");
}

#[test]
fn conf_conversion_keeps_mode_and_removes_the_conf() {
    let node = Node::new();
    node.add_fixtures(&["10-calico.conf"]);
    fs::set_permissions(
        node.net("10-calico.conf"),
        fs::Permissions::from_mode(0o600),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    node.installer
        .install_once()
        .unwrap_or_else(|e| panic!("install: {e}"));
    assert_eq!(
        node.listing(),
        ["10-calico.conflist", "ZZZ-linkerd-cni-kubeconfig"]
    );
    let mode = fs::metadata(node.net("10-calico.conflist"))
        .map(|m| m.permissions().mode() & 0o777)
        .unwrap_or(0);
    assert_eq!(mode, 0o600);
}

#[test]
fn only_linkerd_configs_are_never_completed() {
    // No primary CNI: a list of only linkerd-cni, and the legacy stand-alone file.
    let node = Node::new();
    let lone = r#"{"cniVersion":"0.3.1","name":"x","plugins":[{"type":"linkerd-cni"}]}"#;
    fs::write(node.net("50-lone.conflist"), lone).unwrap_or_else(|e| panic!("{e}"));
    fs::write(
        node.net(linkerd_cni_installer::LEGACY_CONF_NAME),
        r#"{"type":"linkerd-cni"}"#,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let report = node
        .installer
        .install_once()
        .unwrap_or_else(|e| panic!("install: {e}"));
    assert!(!report.found_config(), "report: {:?}", report.files);
    assert_eq!(
        node.listing(),
        ["50-lone.conflist", "ZZZ-linkerd-cni-kubeconfig"],
        "legacy file not removed"
    );
    assert_eq!(node.read("50-lone.conflist"), lone.as_bytes());
    let status = node.installer.status();
    assert!(!status.ready(), "{status:?}");
    assert_eq!(
        status
            .malformed()
            .map(|(_, m)| m.clone())
            .collect::<Vec<_>>(),
        [Malformed::NoPrimary]
    );
}
