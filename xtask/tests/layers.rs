//! The workspace's layered crates call only downwards, each by its own table of layers: the
//! agent ([`AGENT_LAYERS`]), the benchmark ([`BENCH_LAYERS`]) and xtask ([`XTASK_LAYERS`]).
//! The crates at the bottom import only what is below them ([`BOTTOM_CRATES`]): `common`, the
//! `no_std` contract with the eBPF programs, nothing of ours; `sys`, the kernel's raw
//! interface, nothing of ours but `common`.
//!
//! Reads each crate's module graph (`modgraph/mod.rs`: every `crate::` and `super::` path,
//! `crate::{...}` groups included) and fails on any module that names one in a layer above its
//! own, or that is in no layer; in the crates kept as folders (the agent, the benchmark), on any
//! source file outside a layer folder but the crate roots.

mod modgraph;

use std::{fs, path::Path};

/// A crate's layers, top first, each with its modules (a module and everything inside it). A
/// module may name modules of its own layer and of the layers below it. The crate root is above
/// them all and named by none.
type Layers = &'static [(&'static str, &'static [&'static str])];

/// The agent's layers: `service` → `agent` → `dataplane` → `host`.
const AGENT_LAYERS: Layers = &[
    ("service", &["service"]),
    ("agent", &["agent"]),
    ("dataplane", &["dataplane"]),
    ("host", &["host"]),
];

/// The benchmark's layers: `run` → `report` → `scenario` → `node` → `workload` → `measure`.
const BENCH_LAYERS: Layers = &[
    ("run", &["run"]),
    ("report", &["report"]),
    ("scenario", &["scenario"]),
    ("node", &["node"]),
    ("workload", &["workload"]),
    ("measure", &["measure"]),
];

/// xtask's layers: `main.rs` (the command line) → the tasks (`tasks/`, `setup.rs`,
/// `release.rs`) → the test runners (`vmtest.rs`, `privileged.rs`) → `build/` (image → dist →
/// cross → musl → target, elf, ebpf) → `exec.rs` and `phases.rs`.
const XTASK_LAYERS: Layers = &[
    ("tasks", &["tasks", "setup", "release"]),
    ("test runners", &["vmtest", "privileged"]),
    ("image", &["build::image"]),
    ("dist", &["build::dist"]),
    ("cross", &["build::cross"]),
    ("musl", &["build::musl"]),
    ("targets", &["build::target", "build::elf", "build::ebpf"]),
    ("exec", &["exec", "phases"]),
];

/// One layered crate.
struct Layered {
    /// The package's directory, relative to the workspace.
    package: &'static str,
    /// Its crate roots, relative to the workspace (its library first, then its binaries).
    roots: &'static [&'static str],
    layers: Layers,
    /// Modules that only declare others (`mod` lines and their documentation): in no layer.
    declarations_only: &'static [&'static str],
    /// Every layer is a folder (`src/<layer>/mod.rs`) and `src/` holds nothing but the crate
    /// roots and the layer folders.
    folders: bool,
}

const CRATES: &[Layered] = &[
    Layered {
        package: "agent",
        roots: &["agent/src/lib.rs", "agent/src/main.rs"],
        layers: AGENT_LAYERS,
        declarations_only: &[],
        folders: true,
    },
    Layered {
        package: "tests/bench",
        roots: &["tests/bench/src/main.rs"],
        layers: BENCH_LAYERS,
        declarations_only: &[],
        folders: true,
    },
    Layered {
        package: "xtask",
        roots: &["xtask/src/main.rs"],
        layers: XTASK_LAYERS,
        declarations_only: &["build"],
        folders: false,
    },
];

/// The crates at the bottom of the workspace, each with the only crates of ours it may depend
/// on (in its `Cargo.toml`, and by name in its sources).
const BOTTOM_CRATES: &[(&str, &[&str])] = &[("common", &[]), ("sys", &["linkerd-cni-common"])];

/// The crates of ours `package` names: its `Cargo.toml`'s `linkerd-*` dependencies (every
/// table), and the `linkerd_*` crates its sources' code names (its own left out).
fn our_imports(package: &str) -> Vec<String> {
    let dir = workspace().join(package);
    let manifest = fs::read_to_string(dir.join("Cargo.toml"))
        .unwrap_or_else(|e| panic!("reading {package}/Cargo.toml: {e}"));
    let own = manifest
        .lines()
        .find_map(|l| l.strip_prefix("name = \""))
        .and_then(|n| n.strip_suffix('"'))
        .unwrap_or_else(|| panic!("{package}/Cargo.toml names its package"))
        .to_string();
    let mut found: Vec<String> = manifest
        .lines()
        .filter_map(|l| l.split_once(" = ").map(|(k, _)| k.trim()))
        .filter(|k| k.starts_with("linkerd-"))
        .map(String::from)
        .collect();
    let mut stack = vec![dir];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d).unwrap_or_else(|e| panic!("listing {}: {e}", d.display())) {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = fs::read_to_string(&path)
                    .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
                // Code only: a comment may name any crate.
                for line in text.lines() {
                    let code = line.split("//").next().unwrap_or("");
                    for (i, _) in code.match_indices("linkerd_") {
                        let name: String = code[i..]
                            .chars()
                            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                            .collect();
                        found.push(name.replace('_', "-"));
                    }
                }
            }
        }
    }
    found.retain(|c| *c != own);
    found.sort();
    found.dedup();
    found
}

/// The rank of `module`'s layer (0 is the top) by the longest entry it is or is inside of.
fn rank(layers: Layers, module: &str) -> Option<usize> {
    layers
        .iter()
        .enumerate()
        .flat_map(|(r, (_, entries))| entries.iter().map(move |e| (r, *e)))
        .filter(|(_, e)| module == *e || module.starts_with(&format!("{e}::")))
        .max_by_key(|(_, e)| e.len())
        .map(|(r, _)| r)
}

fn workspace() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask is in the workspace")
}

/// The graphs of the crate's roots, in the order of `roots`.
fn graphs(layered: &Layered) -> Vec<modgraph::Graph> {
    let workspace = workspace();
    let graphs = modgraph::package_graphs(workspace, &workspace.join(layered.package));
    let roots: Vec<&str> = graphs.iter().map(|g| g.root.as_str()).collect();
    assert_eq!(roots, layered.roots, "{}'s crate roots", layered.package);
    graphs
}

/// Every module of `graph` that names one in a layer above its own, or that is in no layer.
fn violations(layered: &Layered, graph: &modgraph::Graph) -> Vec<String> {
    let layers = layered.layers;
    let mut violations = Vec::new();
    for (module, file) in &graph.modules {
        if module.is_empty() || layered.declarations_only.contains(&module.as_str()) {
            continue;
        }
        let Some(own) = rank(layers, module) else {
            violations.push(format!(
                "{} ({module}) is in no layer: add it to {}'s layers",
                file.display(),
                layered.package
            ));
            continue;
        };
        for to in graph.edges.get(module).into_iter().flatten() {
            match rank(layers, to) {
                Some(r) if r >= own => {}
                Some(r) => violations.push(format!(
                    "{} ({module}, layer {}) uses crate::{to}, in the layer above it: {}",
                    file.display(),
                    layers[own].0,
                    layers[r].0
                )),
                None => violations.push(format!(
                    "{} ({module}) uses {}, which is in no layer",
                    file.display(),
                    modgraph::display(to)
                )),
            }
        }
    }
    violations
}

#[test]
fn no_module_names_one_in_a_layer_above_it() {
    let mut violations = Vec::new();
    for layered in CRATES {
        for graph in graphs(layered) {
            violations.extend(self::violations(layered, &graph));
        }
    }
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

#[test]
fn the_bottom_crates_import_only_what_is_below_them() {
    for (package, allowed) in BOTTOM_CRATES {
        let imports = our_imports(package);
        let above: Vec<&String> = imports
            .iter()
            .filter(|c| !allowed.contains(&c.as_str()))
            .collect();
        assert!(
            above.is_empty(),
            "{package} may import nothing of ours but {allowed:?}; it imports {above:?}"
        );
    }
    // The check sees imports: the agent names both bottom crates, and more.
    let agent = our_imports("agent");
    for c in ["linkerd-cni-common", "linkerd-cni-sys", "linkerd-cni-proto"] {
        assert!(agent.iter().any(|a| a == c), "{c} not seen in {agent:?}");
    }
}

#[test]
fn the_declaration_only_modules_declare_only() {
    for layered in CRATES {
        let graphs = graphs(layered);
        for module in layered.declarations_only {
            let graph = graphs
                .iter()
                .find(|g| g.modules.contains_key(*module))
                .unwrap_or_else(|| panic!("{module} is no module of {}", layered.package));
            assert!(
                !graph.edges.contains_key(*module),
                "{}: {module} names other modules: put it in a layer",
                layered.package
            );
        }
    }
}

#[test]
fn every_layer_module_exists() {
    for layered in CRATES {
        let graphs = graphs(layered);
        for (layer, entries) in layered.layers {
            for entry in *entries {
                assert!(
                    graphs.iter().any(|g| g.modules.contains_key(*entry)),
                    "{}: layer {layer}: {entry} is no module of it",
                    layered.package
                );
            }
        }
    }
}

#[test]
fn every_layer_folder_exists() {
    let workspace = workspace();
    for layered in CRATES.iter().filter(|l| l.folders) {
        let src = workspace.join(layered.package).join("src");
        for (_, entries) in layered.layers {
            for entry in *entries {
                assert!(
                    src.join(entry).join("mod.rs").is_file(),
                    "{}: {entry}/mod.rs",
                    layered.package
                );
            }
        }
    }
}

#[test]
fn every_module_sits_in_a_layer_folder() {
    let workspace = workspace();
    for layered in CRATES.iter().filter(|l| l.folders) {
        let src = workspace.join(layered.package).join("src");
        let folders: Vec<&str> = layered
            .layers
            .iter()
            .flat_map(|(_, entries)| entries.iter().copied())
            .collect();
        for entry in fs::read_dir(&src).unwrap_or_else(|e| panic!("listing {}: {e}", src.display()))
        {
            let path = entry.expect("directory entry").path();
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            if path.is_dir() {
                assert!(
                    folders.contains(&name),
                    "{}: {name}/ is not one of the layers {folders:?}",
                    layered.package
                );
            } else {
                let file = format!("{}/src/{name}", layered.package);
                assert!(
                    layered.roots.contains(&file.as_str()),
                    "{file}: only the crate roots {:?} sit outside the layers",
                    layered.roots
                );
            }
        }
    }
}

#[test]
fn every_crate_lists_distinct_layers() {
    for layered in CRATES {
        let entries: Vec<&str> = layered
            .layers
            .iter()
            .flat_map(|(_, entries)| entries.iter().copied())
            .collect();
        for (i, entry) in entries.iter().enumerate() {
            assert!(
                !entries[..i].contains(entry),
                "{}: {entry} is in two layers",
                layered.package
            );
        }
    }
}

#[test]
fn layers_rank_a_module_by_its_longest_entry() {
    assert_eq!(rank(XTASK_LAYERS, "tasks::test"), Some(0));
    assert_eq!(rank(XTASK_LAYERS, "build::image::tests"), Some(2));
    assert_eq!(rank(XTASK_LAYERS, "build::target"), Some(6));
    assert_eq!(rank(XTASK_LAYERS, "build"), None);
    assert_eq!(rank(XTASK_LAYERS, "builder"), None);
    assert_eq!(rank(AGENT_LAYERS, "dataplane::maps"), Some(2));
    assert_eq!(rank(BENCH_LAYERS, "measure"), Some(5));
}
