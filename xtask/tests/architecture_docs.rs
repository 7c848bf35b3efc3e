//! docs/design/architecture.md's tables are the code's: its program table lists the programs of
//! `linkerd_cni_common::names` (the one list the agent loads and attaches, and the eBPF crate
//! defines) with their hooks, and its crate table lists the workspace's members with their
//! package names.

use std::{fs, path::PathBuf};

use linkerd_cni_common::names::{
    Hook, ITER_PROGRAMS, PROG_SK_LOOKUP_STUB, PROGRAMS, variant_programs,
};

const ARCHITECTURE: &str = "docs/design/architecture.md";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(path: &str) -> String {
    let at = root().join(path);
    fs::read_to_string(&at).unwrap_or_else(|e| panic!("reading {}: {e}", at.display()))
}

/// The rows of the first table after the heading `heading`, as cells without their
/// surrounding spaces (header and separator rows left out).
fn table(text: &str, heading: &str) -> Vec<Vec<String>> {
    let section = text
        .split_once(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("{ARCHITECTURE} has no heading {heading:?}"))
        .1;
    section
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|l| {
            l.trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().to_string())
                .collect()
        })
        .collect()
}

fn code(s: &str) -> String {
    format!("`{s}`")
}

#[test]
fn the_program_table_is_the_program_list() {
    let rows = table(&read(ARCHITECTURE), "## The programs");
    // The object's programs in their order, the variants, then the agent's per-pod stub.
    let mut want: Vec<(String, String, bool)> = PROGRAMS
        .into_iter()
        .chain(ITER_PROGRAMS)
        .chain(variant_programs())
        .map(|p| (code(p.name), code(p.hook.section()), p.hook.on_cgroup()))
        .collect();
    want.push((
        code(PROG_SK_LOOKUP_STUB),
        code(Hook::SkLookup.section()),
        false,
    ));
    let got: Vec<(String, String)> = rows
        .iter()
        .map(|r| (r[0].clone(), r.get(1).cloned().unwrap_or_default()))
        .collect();
    let want_names: Vec<(String, String)> = want
        .iter()
        .map(|(n, h, _)| (n.clone(), h.clone()))
        .collect();
    assert_eq!(
        got, want_names,
        "{ARCHITECTURE}'s program table (program, hook) is not common/src/names.rs's list"
    );
    for (row, (name, _, on_cgroup)) in rows.iter().zip(&want) {
        let attached = row.get(2).map(String::as_str).unwrap_or_default();
        assert_eq!(
            attached.contains("cgroup"),
            *on_cgroup,
            "{ARCHITECTURE}: {name} is attached to {attached:?}"
        );
        assert!(
            row.get(3).is_some_and(|r| !r.is_empty()),
            "{ARCHITECTURE}: {name} has no return value"
        );
    }
}

/// Every program of the object is a function of that name in `ebpf/src`, and no other `l5d_`
/// function is.
#[test]
fn the_ebpf_crate_defines_the_program_list() {
    let dir = root().join("ebpf/src");
    let mut defined = Vec::new();
    for entry in fs::read_dir(&dir).expect("ebpf/src") {
        let path = entry.expect("ebpf/src entry").path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = fs::read_to_string(&path).expect("an ebpf source file");
        for line in text.lines() {
            if let Some(rest) = line.trim_start().strip_prefix("pub fn l5d_") {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                defined.push(format!("l5d_{name}"));
            }
        }
    }
    defined.sort();
    let mut want: Vec<String> = PROGRAMS
        .into_iter()
        .chain(ITER_PROGRAMS)
        .chain(variant_programs())
        .map(|p| p.name.to_string())
        .collect();
    want.sort();
    assert_eq!(defined, want, "ebpf/src's programs are not common's list");
}

/// The workspace's members, in `Cargo.toml`'s order.
fn members() -> Vec<String> {
    let manifest = read("Cargo.toml");
    let list = manifest
        .split_once("\nmembers = [")
        .expect("Cargo.toml lists members")
        .1
        .split_once(']')
        .expect("the members list ends")
        .0;
    list.split(',')
        .map(|m| m.trim().trim_matches('"').to_string())
        .filter(|m| !m.is_empty())
        .collect()
}

/// The `name` of a member's `[package]`.
fn package(member: &str) -> String {
    let manifest = read(&format!("{member}/Cargo.toml"));
    let package = manifest
        .split_once("[package]")
        .unwrap_or_else(|| panic!("{member}/Cargo.toml has no [package]"))
        .1;
    package
        .lines()
        .find_map(|l| l.trim().strip_prefix("name = "))
        .unwrap_or_else(|| panic!("{member}/Cargo.toml has no package name"))
        .trim_matches('"')
        .to_string()
}

#[test]
fn the_crate_table_is_the_workspace() {
    let rows = table(&read(ARCHITECTURE), "## Where things are");
    let mut got: Vec<(String, String)> = rows
        .iter()
        .map(|r| (r[0].clone(), r.get(1).cloned().unwrap_or_default()))
        .collect();
    let mut want: Vec<(String, String)> = members()
        .iter()
        .map(|m| (code(&format!("{m}/")), code(&package(m))))
        .collect();
    got.sort();
    want.sort();
    assert_eq!(
        got, want,
        "{ARCHITECTURE}'s crate table (crate, package) is not the workspace's members"
    );
}

/// Every agent folder has a row, and every file (`x.rs`) or folder (`x/`) a row names is there.
#[test]
fn the_agent_folder_table_names_what_is_there() {
    let text = read(ARCHITECTURE);
    let rows: Vec<Vec<String>> = text
        .split_once("\n| agent folder |")
        .expect("an agent folder table")
        .1
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            l.trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().to_string())
                .collect()
        })
        .collect();
    let mut folders: Vec<String> = fs::read_dir(root().join("agent/src"))
        .expect("agent/src")
        .map(|e| e.expect("agent/src entry").path())
        .filter(|p| p.is_dir())
        .map(|p| {
            code(&format!(
                "agent/src/{}/",
                p.file_name().expect("a name").to_string_lossy()
            ))
        })
        .collect();
    folders.sort();
    let mut named: Vec<String> = rows.iter().map(|r| r[0].clone()).collect();
    named.sort();
    assert_eq!(named, folders, "{ARCHITECTURE}'s agent folder table");
    let is_name =
        |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    for row in &rows {
        let folder = row[0].trim_matches('`');
        let what = row.get(1).map(String::as_str).unwrap_or_default();
        for token in what.split('`').skip(1).step_by(2) {
            let names_a_path = token.strip_suffix(".rs").is_some_and(is_name)
                || token.strip_suffix('/').is_some_and(is_name);
            if names_a_path {
                assert!(
                    root().join(folder).join(token).exists(),
                    "{ARCHITECTURE} names {folder}{token}, which is not there"
                );
            }
        }
    }
}
