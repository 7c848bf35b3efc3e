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

/// Target `cni_template`: the kubeconfig placeholder is replaced in one pass, as Linkerd's
/// installer's `sed s|__KUBECONFIG_FILEPATH__|<path>|g` does, so text of the template around
/// one placeholder can form another once it is replaced (here with an empty path); that
/// result is the template's own text, not a placeholder left unreplaced. The harness, not the
/// installer, was wrong: it now compares each string with its one-pass replacement.
#[test]
fn the_placeholder_is_replaced_in_one_pass_as_sed_does() {
    let template =
        r#"{"type":"linkerd-cni","kubeconfig":"__KUB__KUBECONFIG_FILEPATH__ECONFIG_FILEPATH__/x"}"#;
    for path in ["", KUBECONFIG] {
        let entry = config::plugin_entry(template, path).unwrap_or_else(|e| panic!("entry: {e}"));
        let want = "__KUB__KUBECONFIG_FILEPATH__ECONFIG_FILEPATH__/x"
            .replace("__KUBECONFIG_FILEPATH__", path);
        assert_eq!(
            entry.get("kubeconfig").and_then(Json::as_str),
            Some(want.as_str()),
            "path {path:?}"
        );
    }
}
