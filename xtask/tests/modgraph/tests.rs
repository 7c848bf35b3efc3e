//! The parser's cases: which modules a file names through its `crate::` paths, grouped or
//! plain (the cases the agent's and the benchmark's own layers tests had).

use std::{collections::BTreeSet, fs};

use super::package_graphs;

/// The modules that `code`, the whole of module `x`, names in a crate whose other modules are
/// `modules` (each an empty file); `name` keeps each case's crate apart.
fn named(name: &str, modules: &[&str], code: &str) -> BTreeSet<String> {
    let dir = std::env::temp_dir().join(format!("xtask-modgraph-{name}-{}", std::process::id()));
    let src = dir.join("src");
    fs::create_dir_all(&src).unwrap();
    let mut lib: String = modules.iter().map(|m| format!("mod {m};\n")).collect();
    lib.push_str("mod x;\n");
    fs::write(src.join("lib.rs"), lib).unwrap();
    for m in modules {
        fs::write(src.join(format!("{m}.rs")), "").unwrap();
    }
    fs::write(src.join("x.rs"), code).unwrap();
    let graphs = package_graphs(&dir, &dir);
    fs::remove_dir_all(&dir).unwrap();
    let [graph] = &graphs[..] else {
        panic!("one crate root, lib.rs")
    };
    graph.edges.get("x").cloned().unwrap_or_default()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| n.to_string()).collect()
}

#[test]
fn grouped_and_plain_paths() {
    let code = "use crate::{\n    host::netns,\n    agent::{Agent, reconcile},\n};\nfn f() { let x = crate::service::run; }\n";
    assert_eq!(
        named("agent", &["service", "agent", "host", "dataplane"], code),
        set(&["host", "agent", "service"])
    );
    let code = "use crate::{\n    measure::stats,\n    scenario::{chain, traffic::Mode},\n};\nfn f() { let x = crate::report::write; }\n";
    assert_eq!(
        named("bench", &["report", "scenario", "measure", "node"], code),
        set(&["measure", "scenario", "report"])
    );
}

#[test]
fn bare_names_in_a_group() {
    // A bare name followed by another item, and a bare last item.
    let code = "use crate::{\n    node,\n    workload::load::Kind,\n};\nuse crate::{measure::stats, report};\n";
    assert_eq!(
        named(
            "bare",
            &["run", "report", "node", "workload", "measure"],
            code
        ),
        set(&["node", "workload", "measure", "report"])
    );
    let code = "use crate::{node, report as r, measure::{self}};\nuse crate::{workload,};\n";
    assert_eq!(
        named(
            "bare-last",
            &["report", "node", "workload", "measure"],
            code
        ),
        set(&["node", "workload", "measure", "report"])
    );
}
