//! The benchmark's layers call only downwards: `run` → `report` → `scenario` → `node` →
//! `workload` → `measure`.
//!
//! Reads every source file under `bench/src/<layer>/` and fails on any path into a layer above
//! the file's own (`crate::run`, `crate::report`, ... in code, imports and tests included).

use std::{fs, path::Path};

/// The layers, top first.
const LAYERS: [&str; 6] = ["run", "report", "scenario", "node", "workload", "measure"];

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
/// `crate::{...}` group (bare ones such as `node,` among them).
fn referenced_layers(code: &str) -> Vec<String> {
    let ident = |c: &char| c.is_alphanumeric() || *c == '_';
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0usize;
            let mut items = vec![String::new()];
            for c in group.chars() {
                match c {
                    '}' if depth == 0 => break,
                    ',' if depth == 0 => items.push(String::new()),
                    c => {
                        match c {
                            '{' => depth += 1,
                            '}' => depth -= 1,
                            _ => {}
                        }
                        items.last_mut().expect("one item at least").push(c);
                    }
                }
            }
            found.extend(
                items
                    .iter()
                    .map(|item| {
                        item.trim_start()
                            .chars()
                            .take_while(ident)
                            .collect::<String>()
                    })
                    .filter(|word| !word.is_empty()),
            );
        } else {
            found.push(rest.chars().take_while(ident).collect());
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
    let code = "use crate::{\n    measure::stats,\n    scenario::{chain, traffic::Mode},\n};\nlet x = crate::report::write;";
    assert_eq!(
        referenced_layers(code),
        ["measure", "scenario", "report"].map(String::from)
    );
    let bare = "use crate::{\n    node,\n    workload::load::Kind,\n};\nuse crate::{measure::stats, report};";
    assert_eq!(
        referenced_layers(bare),
        ["node", "workload", "measure", "report"].map(String::from)
    );
}

#[test]
fn every_layer_folder_exists() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    for layer in LAYERS {
        assert!(src.join(layer).join("mod.rs").is_file(), "{layer}/mod.rs");
    }
}

#[test]
fn every_module_sits_in_a_layer_folder() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    for entry in fs::read_dir(&src).unwrap_or_else(|e| panic!("listing {}: {e}", src.display())) {
        let path = entry.expect("directory entry").path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if path.is_dir() {
            assert!(
                rank(name).is_some(),
                "{name}/ is not one of the layers {LAYERS:?}"
            );
        } else {
            assert_eq!(
                name, "main.rs",
                "only the dispatcher sits outside the layers"
            );
        }
    }
}
