//! No two modules of the workspace depend on each other, directly or through others: in every
//! crate of every member (libraries and binaries), the graph of `crate::` and `super::` paths
//! (see `modgraph/mod.rs`) has no cycle. A cycle fails the test with its modules in order; the
//! fix is to move what both use into a module below them both.

mod modgraph;

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    fs,
    path::{Path, PathBuf},
};

use modgraph::{Graph, display, package_graphs};

/// The workspace root (xtask lives one level below it).
fn workspace() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(PathBuf::from).unwrap_or(manifest)
}

/// The directories of the workspace's members, from the root `Cargo.toml`'s `members`.
fn members(workspace: &Path) -> Vec<PathBuf> {
    let manifest = fs::read_to_string(workspace.join("Cargo.toml")).expect("the root Cargo.toml");
    let start = manifest
        .find("\nmembers = [")
        .expect("the root Cargo.toml lists its members");
    let list = &manifest[start..];
    let list = &list[..list.find(']').expect("the members list ends")];
    list.split('"')
        .skip(1)
        .step_by(2)
        .map(|m| workspace.join(m))
        .collect()
}

/// Every set of modules that depend on each other (strongly connected components of more
/// than one module), each sorted (Tarjan's algorithm).
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct State<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.edges.get(v).into_iter().flatten() {
            if !s.index.contains_key(w.as_str()) {
                visit(s, w);
                let low = s.low[v].min(s.low[w.as_str()]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(w.as_str()) {
                let low = s.low[v].min(s.index[w.as_str()]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.found.push(component);
            }
        }
    }
    let mut s = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in edges.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.found.sort();
    s.found
}

/// A shortest way around the cycle through `component`'s first module: `a -> b -> a`.
fn cycle_path(edges: &BTreeMap<String, BTreeSet<String>>, component: &[String]) -> String {
    let start = &component[0];
    let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = VecDeque::from([start.as_str()]);
    while let Some(v) = queue.pop_front() {
        for w in edges.get(v).into_iter().flatten() {
            if !component.contains(w) {
                continue;
            }
            if w == start {
                let mut path = vec![display(start), display(v)];
                let mut at = v;
                while at != start {
                    at = came_from[at];
                    path.push(display(at));
                }
                path.reverse();
                return path.join(" -> ");
            }
            if !came_from.contains_key(w.as_str()) {
                came_from.insert(w, v);
                queue.push_back(w);
            }
        }
    }
    component.join(", ")
}

fn findings(graph: &Graph) -> Vec<(String, String)> {
    cycles(&graph.edges)
        .into_iter()
        .map(|c| {
            let members: Vec<&str> = c.iter().map(|m| display(m)).collect();
            (members.join(", "), cycle_path(&graph.edges, &c))
        })
        .collect()
}

#[test]
fn no_two_modules_of_the_workspace_depend_on_each_other() {
    let workspace = workspace();
    let mut violations = Vec::new();
    for member in members(&workspace) {
        for graph in package_graphs(&workspace, &member) {
            for (members, path) in findings(&graph) {
                violations.push(format!("{}: {path} (the cycle: {members})", graph.root));
            }
        }
    }
    assert!(
        violations.is_empty(),
        "modules that depend on each other (move what both use below them both):\n{}",
        violations.join("\n")
    );
}

#[test]
fn every_member_has_a_crate_root() {
    let workspace = workspace();
    let members = members(&workspace);
    assert!(members.len() > 10, "{members:?}");
    for member in members {
        assert!(
            !package_graphs(&workspace, &member).is_empty(),
            "{}: no src/lib.rs, src/main.rs or src/bin/",
            member.display()
        );
    }
}

#[test]
fn the_checker_names_a_cycle_through_crate_and_super_paths() {
    let dir = std::env::temp_dir().join(format!("xtask-cycles-{}", std::process::id()));
    let src = dir.join("src");
    fs::create_dir_all(src.join("a")).unwrap();
    fs::write(src.join("lib.rs"), "mod a;\nmod b;\nmod c;\n").unwrap();
    fs::write(
        src.join("a.rs"),
        "//! crate::c in a comment is no dependency.\nmod inner;\nuse crate::{b::{self, X}, c as _};\nconst S: &str = \"crate::c\";\n",
    )
    .unwrap();
    fs::write(src.join("a/inner.rs"), "use super::super::b::Y;\n").unwrap();
    fs::write(
        src.join("b.rs"),
        "pub struct X;\npub struct Y;\nfn f() { crate::a::inner::g(); }\n#[cfg(test)]\nmod tests { use super::*; }\n",
    )
    .unwrap();
    fs::write(src.join("c.rs"), "").unwrap();
    let graphs = package_graphs(&dir, &dir);
    fs::remove_dir_all(&dir).unwrap();
    let [graph] = &graphs[..] else {
        panic!("one crate root, lib.rs")
    };
    assert_eq!(graph.root, "src/lib.rs");
    let modules: Vec<&str> = graph.modules.keys().map(String::as_str).collect();
    assert_eq!(modules, ["", "a", "a::inner", "b", "b::tests", "c"]);
    let edges: Vec<(&str, &str)> = graph
        .edges
        .iter()
        .flat_map(|(from, to)| to.iter().map(move |t| (from.as_str(), t.as_str())))
        .collect();
    assert_eq!(
        edges,
        [
            ("a", "b"),
            ("a", "c"),
            ("a::inner", "b"),
            ("b", "a::inner"),
            ("b::tests", "b")
        ]
    );
    assert_eq!(
        findings(graph),
        [(
            "a::inner, b".to_string(),
            "a::inner -> b -> a::inner".to_string()
        )]
    );
}
