//! The installer's conflist rewrite on any file a node may hold: `conflist::patch_bytes`, the
//! pure function the installer's watcher applies to every file of the CNI directory.
//!
//! Properties: nothing panics; what patches, patches again to itself (a fixed point: the
//! watcher never rewrites its own output); the patched file reads as patched; for a list
//! that held no linkerd-cni entry, removing the entry again gives back the input byte for
//! byte (nothing outside the entry changed: other plugins' numbers, whitespace, order).

#![no_main]

use std::{path::Path, sync::OnceLock};

use libfuzzer_sys::fuzz_target;
use linkerd_cni_installer::{FileState, config, conflist, json::Json};

/// The entry the DaemonSet's template gives (the installer's test fixture).
const TEMPLATE: &str = include_str!("../../installer/tests/fixtures/linkerd-cni-template.json");
const KUBECONFIG: &str = "/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig";

fn entry() -> &'static Json {
    static ENTRY: OnceLock<Json> = OnceLock::new();
    ENTRY.get_or_init(|| config::plugin_entry(TEMPLATE, KUBECONFIG).expect("the fixture's entry"))
}

fn is_list(input: &[u8]) -> bool {
    Json::parse(input)
        .ok()
        .is_some_and(|doc| doc.get("plugins").and_then(Json::as_array).is_some())
}

fuzz_target!(|data: &[u8]| {
    let entry = entry();
    let Ok(once) = conflist::patch_bytes(data, entry) else {
        return;
    };
    let twice = conflist::patch_bytes(&once, entry).expect("the patched file patches again");
    assert!(twice == once, "not a fixed point");
    let path = Path::new("/etc/cni/net.d/10-fuzz.conflist");
    assert!(
        matches!(conflist::state(path, &once, entry), FileState::Patched),
        "the patched file reads as patched"
    );
    let had_none = conflist::unpatch_bytes(data, entry).is_ok_and(|u| u == data);
    if had_none && is_list(data) {
        let back = conflist::unpatch_bytes(&once, entry).expect("the patched file unpatches");
        assert!(back == data, "unpatch(patch(x)) == x, byte for byte");
    }
});
