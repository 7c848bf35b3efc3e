//! What fuzzing the installer found (`fuzz/`, target `conflist_patch`), each input kept as the
//! fuzzer found it, so the test failed before the fix.

use linkerd_cni_installer::{config, conflist, json::Json};

const TEMPLATE: &str = include_str!("fixtures/linkerd-cni-template.json");
const KUBECONFIG: &str = "/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig";

fn entry() -> Json {
    config::plugin_entry(TEMPLATE, KUBECONFIG).unwrap_or_else(|e| panic!("entry: {e}"))
}

/// A conflist whose top level also has a `type` (libcni ignores it and reads `plugins`) was
/// taken for a single plugin: the whole list was wrapped as one plugin of a new list, which
/// breaks the node's network. It is patched as a list: our entry appended after the last
/// plugin, every other byte kept.
#[test]
fn a_list_with_a_top_level_type_is_patched_as_a_list() {
    let input = "{\n  \"type\": \"cbr0\",\n  \"cniVersion\": \"0.3.1\",\n  \"plugins\": [\n {\n         \"type\": \"flannVVVVVVVVV\",\n      \"capablitiies\":  \n     {  \"portMa$pings\": true\n      }\n    }\n  ]\n}\n";
    let entry = entry();
    let once = conflist::patch_bytes(input.as_bytes(), &entry).unwrap_or_else(|e| panic!("{e}"));
    let doc = Json::parse(&once).unwrap_or_else(|e| panic!("{e}"));
    let plugins = doc
        .get("plugins")
        .and_then(Json::as_array)
        .unwrap_or_else(|| panic!("a list: {}", String::from_utf8_lossy(&once)));
    let types: Vec<&str> = plugins
        .iter()
        .filter_map(|p| p.get("type").and_then(Json::as_str))
        .collect();
    assert_eq!(types, ["flannVVVVVVVVV", "linkerd-cni"]);
    assert_eq!(
        conflist::patch_bytes(&once, &entry).unwrap_or_else(|e| panic!("{e}")),
        once,
        "a fixed point"
    );
    assert_eq!(
        conflist::unpatch_bytes(&once, &entry).unwrap_or_else(|e| panic!("{e}")),
        input.as_bytes(),
        "nothing else changed"
    );
}
