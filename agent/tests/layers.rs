//! The agent's layers call only downwards: `service` → `agent` → `dataplane` → `host`.
//!
//! Reads every source file under `agent/src/<layer>/` and fails on any path into a layer above
//! the file's own (`crate::service`, `crate::agent`, ... in code, imports included).

use std::{fs, path::Path};

/// The layers, top first.
const LAYERS: [&str; 4] = ["service", "agent", "dataplane", "host"];

fn rank(layer: &str) -> Option<usize> {
    LAYERS.iter().position(|l| *l == layer)
}

/// The code of a source file without its comments (line comments only: the crate has no
/// block comments).
fn code(text: &str) -> String {
    text.lines()
        .map(|line| match line.find("//") {
            Some(i) => &line[..i],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every layer named right after `crate::`, including the first-level names of a
/// `crate::{...}` group.
fn referenced_layers(code: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0usize;
            let mut start_of_item = true;
            let mut word = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => start_of_item = true,
                    c if c.is_alphanumeric() || c == '_' => {
                        if start_of_item {
                            word.push(c)
                        }
                    }
                    _ => {
                        if !word.is_empty() {
                            found.push(std::mem::take(&mut word));
                            start_of_item = false;
                        }
                    }
                }
            }
        } else {
            let word: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            found.push(word);
        }
    }
    found
}

fn check_dir(dir: &Path, own: usize, violations: &mut Vec<String>) {
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("listing {}: {e}", dir.display())) {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            check_dir(&path, own, violations);
            continue;
        }
        let text =
            fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        for layer in referenced_layers(&code(&text)) {
            if let Some(r) = rank(&layer)
                && r < own
            {
                violations.push(format!(
                    "{} ({}) uses crate::{layer}, a layer above it",
                    path.display(),
                    LAYERS[own]
                ));
            }
        }
    }
}

#[test]
fn no_module_imports_from_a_layer_above_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut violations = Vec::new();
    for (own, layer) in LAYERS.iter().enumerate() {
        check_dir(&src.join(layer), own, &mut violations);
    }
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

#[test]
fn the_checker_sees_grouped_and_plain_paths() {
    let code = "use crate::{\n    host::netns,\n    agent::{Agent, reconcile},\n};\nlet x = crate::service::run;";
    assert_eq!(
        referenced_layers(code),
        ["host", "agent", "service"].map(String::from)
    );
}

#[test]
fn every_layer_folder_exists() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    for layer in LAYERS {
        assert!(src.join(layer).join("mod.rs").is_file(), "{layer}/mod.rs");
    }
}
