//! The plugin entry made from the CNI template (`CNI_NETWORK_CONFIG`) and the kubeconfig
//! path (`DEST_CNI_NET_DIR`), both set by whoever installs the DaemonSet.
//!
//! Input: the template, then optionally a NUL and the kubeconfig path.
//!
//! Properties: nothing panics; the entry has exactly the template's keys (plus
//! `capabilities`), whatever the path holds (it goes in as data, never as text); every
//! placeholder in a string value is replaced in one pass and nothing else changes; the entry written out parses back to itself;
//! and patching the installer's fixtures with it is a fixed point that leaves every other byte
//! of each fixture as it was (unless its `type` is that of a plugin of the fixture, which the
//! installer would take for its own).

#![no_main]

use libfuzzer_sys::fuzz_target;
use linkerd_cni_installer::{KUBECONFIG_PLACEHOLDER, PLUGIN_TYPE, config, conflist, json::Json};

const FIXTURES: &[&[u8]] = &[
    include_bytes!("../../installer/tests/fixtures/net.d/10-flannel.conflist"),
    include_bytes!("../../installer/tests/fixtures/net.d/05-cilium.conflist"),
    include_bytes!("../../installer/tests/fixtures/net.d/10-kindnet.conflist"),
];

fn keys(doc: &Json) -> Vec<String> {
    let mut keys: Vec<String> = doc
        .as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default();
    keys.sort();
    keys.dedup();
    keys
}

/// Whether every string of `entry` is the template's string with each placeholder replaced
/// by `path` in one pass (Linkerd's installer's `sed s|...|...|g`), everything else equal;
/// the top level's `capabilities`, which the entry may add to, is compared elsewhere. A
/// placeholder can still show in the result when the template's text around one forms it
/// (`__KUB` + placeholder + `ECONFIG_FILEPATH__` with an empty path): one pass, as sed does.
fn replaced_once(template: &Json, entry: &Json, path: &str, top: bool) -> bool {
    match (template, entry) {
        (Json::String(t), Json::String(e)) => *e == t.replace(KUBECONFIG_PLACEHOLDER, path),
        (Json::Array(t), Json::Array(e)) => {
            t.len() == e.len()
                && t.iter()
                    .zip(e)
                    .all(|(t, e)| replaced_once(t, e, path, false))
        }
        (Json::Object(t), Json::Object(e)) => t.iter().all(|(key, tv)| {
            (top && key == "capabilities")
                || e.get(key)
                    .is_some_and(|ev| replaced_once(tv, ev, path, false))
        }),
        (t, e) => t == e,
    }
}

fuzz_target!(|data: &[u8]| {
    let (template, path) = match data.iter().position(|b| *b == 0) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &b"/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig"[..]),
    };
    let (Ok(template), Ok(path)) = (std::str::from_utf8(template), std::str::from_utf8(path))
    else {
        return;
    };
    let Ok(entry) = config::plugin_entry(template, path) else {
        return;
    };
    let parsed = Json::parse(template.as_bytes()).expect("an accepted template parses");
    let mut want = keys(&parsed);
    want.push("capabilities".into());
    want.sort();
    want.dedup();
    assert_eq!(keys(&entry), want, "the entry has the template's keys");
    assert!(
        replaced_once(&parsed, &entry, path, true),
        "every placeholder replaced, once, and nothing else changed"
    );
    let written = entry.to_pretty_bytes();
    assert!(
        Json::parse(&written).expect("the entry parses back") == entry,
        "the entry written out reads back the same"
    );
    let ty = entry.get("type").and_then(Json::as_str).unwrap_or_default();
    for fixture in FIXTURES {
        // An entry whose type is another plugin's would claim that plugin as its own (the
        // installer recognises its entry by type): a template names its own plugin.
        let doc = Json::parse(fixture).expect("a fixture parses");
        let plugins = doc
            .get("plugins")
            .and_then(Json::as_array)
            .unwrap_or_default();
        if ty != PLUGIN_TYPE
            && plugins
                .iter()
                .any(|p| p.get("type").and_then(Json::as_str) == Some(ty))
        {
            continue;
        }
        let once = conflist::patch_bytes(fixture, &entry).expect("a fixture patches");
        let twice = conflist::patch_bytes(&once, &entry).expect("and again");
        assert!(twice == once, "not a fixed point");
        // Compared with the fixture less any linkerd-cni entry it already held (one has an
        // older entry, which patching replaces).
        let back = conflist::unpatch_bytes(&once, &entry).expect("and unpatches");
        let without = conflist::unpatch_bytes(fixture, &entry).expect("the fixture unpatches");
        assert!(back == without, "the fixture's other bytes unchanged");
    }
});
