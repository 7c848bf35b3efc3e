//! The documentation's relative links resolve: every link of README.md, deploy/README.md and
//! docs/**/*.md to a file of this repository names a file that exists and, with `#anchor`, a
//! heading of that page; README.md links every page of docs/; and no page keeps a `@@NAME@@`
//! placeholder.

use std::{
    fs,
    path::{Component, Path, PathBuf},
};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The pages checked, relative to the root.
fn pages() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("a docs entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let mut out = vec![root().join("README.md"), root().join("deploy/README.md")];
    walk(&root().join("docs"), &mut out);
    out
}

/// The page without its fenced code blocks and inline code spans (a `[x](y)` there is code).
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            let mut in_code = false;
            for part in line.split('`') {
                if !in_code {
                    out.push_str(part);
                }
                in_code = !in_code;
            }
            out.push('\n');
        }
    }
    out
}

/// The targets of the page's inline links, `[text](target)`.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        if let Some(end) = rest.find(')') {
            out.push(rest[..end].to_string());
        }
    }
    out
}

/// The anchors GitHub makes of a page's headings: lower case, punctuation dropped, spaces as
/// hyphens.
fn anchors(text: &str) -> Vec<String> {
    prose_headings(text)
        .iter()
        .map(|h| {
            h.to_lowercase()
                .chars()
                .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
                .map(|c| if c == ' ' { '-' } else { c })
                .collect()
        })
        .collect()
}

/// The headings outside code blocks, inline code kept (GitHub keeps its text in the anchor).
fn prose_headings(text: &str) -> Vec<String> {
    let mut fenced = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            out.push(line.trim_start_matches('#').trim().to_string());
        }
    }
    out
}

/// `path` with `.` and `..` resolved, without touching the file system.
fn normal(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

#[test]
fn every_relative_link_resolves() {
    let root = normal(&root());
    let mut broken = Vec::new();
    for page in pages() {
        let text = fs::read_to_string(&page).expect("a page");
        let page = normal(&page);
        let name = page.strip_prefix(&root).unwrap_or(&page).to_owned();
        for target in links(&prose(&text)) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let at = if file.is_empty() {
                page.clone()
            } else {
                normal(&page.parent().expect("a folder").join(file))
            };
            if !at.starts_with(&root) || !at.exists() {
                broken.push(format!("{}: {target}: no such file", name.display()));
                continue;
            }
            if !anchor.is_empty() && at.extension().is_some_and(|e| e == "md") {
                let target_text = fs::read_to_string(&at).expect("a linked page");
                if !anchors(&target_text).iter().any(|a| a == anchor) {
                    broken.push(format!("{}: {target}: no such heading", name.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_readme_links_every_page_of_docs() {
    let readme = fs::read_to_string(root().join("README.md")).expect("README.md");
    let linked = links(&prose(&readme));
    let docs = normal(&root().join("docs"));
    let mut missing = Vec::new();
    for page in pages() {
        let page = normal(&page);
        let Ok(rel) = page.strip_prefix(&docs) else {
            continue;
        };
        let want = format!("docs/{}", rel.display());
        if !linked
            .iter()
            .any(|l| l.split('#').next() == Some(want.as_str()))
        {
            missing.push(want);
        }
    }
    assert!(
        missing.is_empty(),
        "README.md's Documentation list lacks {missing:?}"
    );
}

#[test]
fn a_broken_link_is_found() {
    // The checks above see links at all: this page's own shapes.
    let text = "See [a](docs/x.md#y) and `[not](code)`.\n```\n[nor](this)\n```\n## A `b`: c\n";
    assert_eq!(links(&prose(text)), ["docs/x.md#y"]);
    assert_eq!(anchors(text), ["a-b-c"]);
}

/// The `@@NAME@@` markers of a text: a name of capitals, digits and underscores between two
/// `@@`, the shape of a placeholder meant to be filled in before the page was committed.
fn placeholders(text: &str) -> Vec<String> {
    text.split("@@")
        .skip(1)
        .step_by(2)
        .filter(|name| {
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        })
        .map(|name| format!("@@{name}@@"))
        .collect()
}

#[test]
fn no_page_keeps_an_unfilled_placeholder() {
    let mut found = Vec::new();
    for page in pages() {
        let text = fs::read_to_string(&page).unwrap_or_else(|e| panic!("{}: {e}", page.display()));
        for marker in placeholders(&text) {
            found.push(format!("{}: {marker}", page.display()));
        }
    }
    assert!(
        found.is_empty(),
        "placeholders left in the docs: {found:#?}"
    );
    assert_eq!(
        placeholders("a @@RESULTS@@ b @@ c @@x@@"),
        ["@@RESULTS@@"],
        "the marker shape"
    );
}
