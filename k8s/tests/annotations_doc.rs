//! docs/operating/annotations.md is the code's: it holds the pod overrides' table
//! (`linkerd_cni_k8s::overrides::POD_OVERRIDES`) and the other honoured keys (`OTHER_KEYS`)
//! row for row, no other row, and names no `config.linkerd.io/*` key that is in neither; every
//! `config.linkerd.io/*` key of `k8s/src/names.rs` is in one of them.

use std::{fs, path::PathBuf};

use linkerd_cni_k8s::overrides::{KeyKind, Merge, OTHER_KEYS, POD_OVERRIDES};

const PAGE: &str = "docs/operating/annotations.md";

fn read(path: &str) -> String {
    let at = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path);
    fs::read_to_string(&at).unwrap_or_else(|e| panic!("reading {}: {e}", at.display()))
}

fn code(s: &str) -> String {
    format!("`{s}`")
}

/// The overrides' table as the page shows it.
fn overrides_table() -> String {
    let mut out = String::from(
        "| annotation | what it does | format | conflist key | `LinkerdConfig` field | replace or \
         append | control plane value (injector) | read by | a pod whose value is invalid |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    for row in &POD_OVERRIDES {
        let merge = match (row.merge, row.redirects()) {
            (Merge::Replace, true) => "replaces the conflist's",
            (Merge::Append, true) => "appended to the conflist's",
            (Merge::Replace, false) => "replaces the control plane's",
            (Merge::Append, false) => "appended to the control plane's",
        };
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {merge} | {} | {} | {} |\n",
            code(row.annotation),
            row.meaning,
            row.parser.format(),
            row.conflist_key.map_or("—".into(), code),
            row.field.config_field().map_or("—".into(), code),
            code(row.helm_value),
            if row.redirects() {
                "agent, injector"
            } else {
                "injector"
            },
            row.parser.when_invalid(),
        ));
    }
    out
}

/// The other keys' table as the page shows it.
fn other_keys_table() -> String {
    let mut out =
        String::from("| key | kind | on | read by | what it does |\n|---|---|---|---|---|\n");
    for key in &OTHER_KEYS {
        let kind = match key.kind {
            KeyKind::Annotation => "annotation",
            KeyKind::Label => "label",
        };
        out.push_str(&format!(
            "| {} | {kind} | {} | {} | {} |\n",
            code(key.key),
            key.on,
            key.read_by,
            key.meaning
        ));
    }
    out
}

fn honoured() -> Vec<&'static str> {
    POD_OVERRIDES
        .iter()
        .map(|r| r.annotation)
        .chain(OTHER_KEYS.iter().map(|k| k.key))
        .collect()
}

#[test]
fn the_page_holds_both_tables() {
    let text = read(PAGE);
    for want in [overrides_table(), other_keys_table()] {
        assert!(
            text.contains(&want),
            "{PAGE} does not hold the table of k8s/src/overrides.rs; it should read:\n{want}"
        );
    }
    // No other row names a key: every table row of the page is one of the code's.
    let rows: Vec<&str> = text.lines().filter(|l| l.starts_with("| `")).collect();
    assert_eq!(
        rows.len(),
        POD_OVERRIDES.len() + OTHER_KEYS.len(),
        "{PAGE} has table rows the code does not: {rows:#?}"
    );
}

/// Every `config.linkerd.io/...` or `linkerd.io/...` key the page names in code spans is one
/// the tables hold: the page promises nothing the code does not honour.
#[test]
fn the_page_names_only_honoured_keys() {
    let text = read(PAGE);
    let keys = honoured();
    for span in text.split('`').skip(1).step_by(2) {
        let key = span.split(':').next().unwrap_or_default().trim();
        if key.starts_with("config.linkerd.io/") || key.starts_with("linkerd.io/") {
            assert!(
                keys.contains(&key),
                "{PAGE} names {key}, which no table row holds"
            );
        }
    }
}

/// Every `config.linkerd.io/*` key Linkerd's vocabulary defines is a row: a new override
/// constant needs its row (and so its line on the page).
#[test]
fn every_config_key_of_the_vocabulary_is_a_row() {
    let names = read("k8s/src/names.rs");
    let keys = honoured();
    for line in names.lines().filter(|l| l.starts_with("pub const ")) {
        let Some(value) = line.split('"').nth(1) else {
            continue;
        };
        if value.starts_with("config.linkerd.io/") {
            assert!(
                keys.contains(&value),
                "k8s/src/names.rs defines {value}, which neither table of \
                 k8s/src/overrides.rs holds"
            );
        }
    }
}
