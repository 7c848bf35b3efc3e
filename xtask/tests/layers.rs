//! xtask's layers call only downwards: `main.rs` (the command line) → the tasks (`tasks/`,
//! `setup.rs`, `release.rs`) → the test runners (`vmtest.rs`, `privileged.rs`) → `build/`
//! (image → dist → cross → musl → target, elf, ebpf) → `exec.rs` and `phases.rs`.
//!
//! Reads xtask's module graph (`modgraph/mod.rs`: every `crate::` and `super::` path) and fails
//! on any module that names one in a layer above its own, or that is in no layer.

mod modgraph;

use std::path::Path;

/// The layers, top first, each with its modules (a module and everything inside it). A module
/// may name modules of its own layer and of the layers below it. The crate root (`main.rs`)
/// is above them all and named by none.
const LAYERS: &[(&str, &[&str])] = &[
    ("tasks", &["tasks", "setup", "release"]),
    ("test runners", &["vmtest", "privileged"]),
    ("image", &["build::image"]),
    ("dist", &["build::dist"]),
    ("cross", &["build::cross"]),
    ("musl", &["build::musl"]),
    ("targets", &["build::target", "build::elf", "build::ebpf"]),
    ("exec", &["exec", "phases"]),
];

/// Modules that only declare others (`mod` lines and their documentation): in no layer.
const DECLARATIONS_ONLY: &[&str] = &["build"];

/// The rank of `module`'s layer (0 is the top) by the longest entry it is or is inside of.
fn rank(module: &str) -> Option<usize> {
    LAYERS
        .iter()
        .enumerate()
        .flat_map(|(r, (_, entries))| entries.iter().map(move |e| (r, *e)))
        .filter(|(_, e)| module == *e || module.starts_with(&format!("{e}::")))
        .max_by_key(|(_, e)| e.len())
        .map(|(r, _)| r)
}

fn graph() -> modgraph::Graph {
    let xtask = Path::new(env!("CARGO_MANIFEST_DIR"));
    let workspace = xtask.parent().expect("xtask is in the workspace");
    let mut graphs = modgraph::package_graphs(workspace, xtask);
    assert_eq!(graphs.len(), 1, "xtask is one crate");
    let graph = graphs.remove(0);
    assert_eq!(graph.root, "xtask/src/main.rs");
    graph
}

#[test]
fn no_module_names_one_in_a_layer_above_it() {
    let graph = graph();
    let mut violations = Vec::new();
    for (module, file) in &graph.modules {
        if module.is_empty() || DECLARATIONS_ONLY.contains(&module.as_str()) {
            continue;
        }
        let Some(own) = rank(module) else {
            violations.push(format!(
                "{} ({module}) is in no layer: add it to LAYERS",
                file.display()
            ));
            continue;
        };
        for to in graph.edges.get(module).into_iter().flatten() {
            match rank(to) {
                Some(r) if r >= own => {}
                Some(r) => violations.push(format!(
                    "{} ({module}, layer {}) uses crate::{to}, in the layer above it: {}",
                    file.display(),
                    LAYERS[own].0,
                    LAYERS[r].0
                )),
                None => violations.push(format!(
                    "{} ({module}) uses {}, which is in no layer",
                    file.display(),
                    modgraph::display(to)
                )),
            }
        }
    }
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

#[test]
fn the_declaration_only_modules_declare_only() {
    let graph = graph();
    for module in DECLARATIONS_ONLY {
        assert!(
            graph.modules.contains_key(*module),
            "{module} is no module of xtask"
        );
        assert!(
            !graph.edges.contains_key(*module),
            "{module} names other modules: put it in a layer"
        );
    }
}

#[test]
fn every_layer_module_exists() {
    let graph = graph();
    for (layer, entries) in LAYERS {
        for entry in *entries {
            assert!(
                graph.modules.contains_key(*entry),
                "layer {layer}: {entry} is no module of xtask"
            );
        }
    }
}

#[test]
fn layers_rank_a_module_by_its_longest_entry() {
    assert_eq!(rank("tasks::test"), Some(0));
    assert_eq!(rank("build::image::tests"), Some(2));
    assert_eq!(rank("build::target"), Some(6));
    assert_eq!(rank("build"), None);
    assert_eq!(rank("builder"), None);
}
