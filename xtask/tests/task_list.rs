//! The architecture page's crate table names xtask's tasks: the set there is the set
//! `cargo xtask --help` prints (the page orders them by a newcomer's path, the help by the
//! enum), so a task added, renamed or removed changes the page too.

use std::{collections::BTreeSet, fs, path::PathBuf, process::Command};

/// The tasks `cargo xtask --help` lists (clap's "Commands:" section, without `help`).
fn tasks_from_help() -> BTreeSet<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .arg("--help")
        .output()
        .expect("running xtask --help");
    assert!(out.status.success(), "xtask --help failed: {out:?}");
    let help = String::from_utf8(out.stdout).expect("help is UTF-8");
    let commands = help
        .split("Commands:\n")
        .nth(1)
        .expect("xtask --help has a Commands: section");
    commands
        .lines()
        .take_while(|line| line.starts_with("  "))
        // Only a command's first line starts at column 2; wrapped descriptions are indented
        // further.
        .filter(|line| !line.starts_with("   "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_string)
        .collect()
}

/// The tasks the crate table's `xtask/` row names: every `code` span of its last column.
fn tasks_from_architecture_page() -> BTreeSet<String> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf();
    let page = root.join("docs/design/architecture.md");
    let text = fs::read_to_string(&page).expect("docs/design/architecture.md");
    let row = text
        .lines()
        .find(|line| line.starts_with("| `xtask/` |"))
        .expect("the crate table has an xtask/ row");
    let description = row
        .trim_end_matches('|')
        .rsplit('|')
        .next()
        .expect("the row has columns");
    description
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

#[test]
fn the_architecture_page_lists_every_task() {
    let help = tasks_from_help();
    assert!(
        help.len() >= 10,
        "parsed too few tasks from --help: {help:?}"
    );
    assert_eq!(
        tasks_from_architecture_page(),
        help,
        "docs/design/architecture.md's xtask/ row against `cargo xtask --help`"
    );
}
