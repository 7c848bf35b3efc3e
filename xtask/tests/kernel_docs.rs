//! The docs' kernel requirements are the code's: docs/operating/kernel-requirements.md holds the feature
//! table of `linkerd_cni_common::kernel` row for row, and every place that states the kernel
//! floor (README.md, deploy/README.md) states the table's.

use std::{fs, path::PathBuf};

use linkerd_cni_common::kernel::{FEATURES, FLOOR};

fn doc(path: &str) -> String {
    let at = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path);
    fs::read_to_string(&at).unwrap_or_else(|e| panic!("reading {}: {e}", at.display()))
}

/// The table as docs/operating/kernel-requirements.md shows it.
fn table() -> String {
    let mut out = String::from(
        "| feature | mainline | used by | the probe | without it |\n|---|---|---|---|---|\n",
    );
    for f in FEATURES {
        out.push_str(&format!(
            "| {} | {}.{} | {} | {} | {} |\n",
            f.name,
            f.since.0,
            f.since.1,
            f.used_by,
            f.probe.asks(),
            f.without.unwrap_or("the kernel is refused")
        ));
    }
    out
}

#[test]
fn kernel_requirements_holds_the_feature_table() {
    let text = doc("docs/operating/kernel-requirements.md");
    let want = table();
    assert!(
        text.contains(&want),
        "docs/operating/kernel-requirements.md does not hold the table of common/src/kernel.rs; it \
         should read:\n{want}"
    );
    // No other table row names a feature: one table.
    let rows = text
        .lines()
        .filter(|l| {
            FEATURES
                .iter()
                .any(|f| l.starts_with(&format!("| {} |", f.name)))
        })
        .count();
    assert_eq!(rows, FEATURES.len(), "a feature row appears twice");
}

#[test]
fn every_stated_floor_is_the_tables() {
    let floor = format!("{}.{}", FLOOR.0, FLOOR.1);
    for (path, phrase) in [
        ("README.md", format!("Linux **{floor} or later**")),
        (
            "docs/operating/kernel-requirements.md",
            format!("mainline **{floor} or later**"),
        ),
        ("deploy/README.md", format!("mainline {floor} or later")),
    ] {
        let text = doc(path);
        assert!(text.contains(&phrase), "{path} does not say {phrase:?}");
    }
    // The older floors the docs once stated are gone from the check's description.
    let deploy = doc("deploy/README.md");
    let check = deploy
        .split("`linkerd check --node`")
        .nth(1)
        .expect("deploy/README.md describes check --node");
    let paragraph = check.split("\n\n").next().unwrap_or_default();
    for f in FEATURES {
        let since = format!("{}.{} (", f.since.0, f.since.1);
        assert!(
            f.since == FLOOR || !paragraph.contains(&since),
            "deploy/README.md's check --node paragraph lists a floor of its own: {paragraph}"
        );
    }
}

/// The kernels booted here are listed once, in kernel-requirements.md's "Tested kernels" table:
/// no other page repeats a row of it (README.md once had a copy that went stale).
#[test]
fn the_tested_kernels_are_one_table() {
    let text = doc("docs/operating/kernel-requirements.md");
    let section = text
        .split("\n## Tested kernels\n")
        .nth(1)
        .expect("kernel-requirements.md has a Tested kernels section");
    let kernels: Vec<&str> = section
        .lines()
        .take_while(|l| !l.starts_with("## "))
        .filter_map(|l| l.strip_prefix("| "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|cell| cell.starts_with(|c: char| c.is_ascii_digit()))
        .collect();
    assert!(
        kernels.len() >= 4,
        "the Tested kernels table lists the host's and the guests' kernels: {kernels:?}"
    );
    for path in ["README.md", "deploy/README.md", "docs/developing/tests.md"] {
        let other = doc(path);
        for kernel in &kernels {
            assert!(
                !other
                    .lines()
                    .any(|l| l.starts_with(&format!("| {kernel} "))),
                "{path} repeats the tested kernel {kernel}'s row: link to kernel-requirements.md"
            );
        }
    }
}
