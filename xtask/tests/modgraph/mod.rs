//! A crate's module graph, read from its sources (shared by `layers.rs` and `cycles.rs`).
//!
//! The modules are found from each crate root (`src/lib.rs`, `src/main.rs`, `src/bin/*.rs`) by
//! following its `mod` declarations, files and inline blocks alike. A module depends on another
//! when its code names it through a `crate::` path (`$crate::` too) or a `super::` path,
//! imports and calls alike, `crate::{a::{self, B}, c}` groups included; a path is resolved to
//! the longest module it starts with (`crate::build::cross::Build` is `build::cross`). Paths
//! relative to the module itself (a parent naming its child `child::f`, `self::`) are not
//! followed: they only ever point down. Comments, strings and character literals are skipped.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

#[cfg(test)]
mod tests;

/// One crate's modules and what each depends on.
pub struct Graph {
    /// The crate root, relative to the workspace (`agent/src/lib.rs`).
    pub root: String,
    /// Every module by its path (`""` is the crate root, then `build`, `build::cross`), with
    /// the file it is in, relative to the workspace (inline modules are in their parent's).
    pub modules: BTreeMap<String, PathBuf>,
    /// The modules each module names (never itself).
    pub edges: BTreeMap<String, BTreeSet<String>>,
}

/// A module as printed: `crate` for the root.
pub fn display(module: &str) -> &str {
    if module.is_empty() { "crate" } else { module }
}

/// The graph of every crate of the package in `dir` (its library, its binaries), with paths
/// shown relative to `workspace`.
pub fn package_graphs(workspace: &Path, dir: &Path) -> Vec<Graph> {
    let src = dir.join("src");
    let mut roots: Vec<PathBuf> = ["lib.rs", "main.rs"]
        .iter()
        .map(|f| src.join(f))
        .filter(|p| p.is_file())
        .collect();
    if let Ok(entries) = fs::read_dir(src.join("bin")) {
        let mut bins: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter_map(|p| {
                if p.extension().is_some_and(|e| e == "rs") {
                    Some(p)
                } else if p.join("main.rs").is_file() {
                    Some(p.join("main.rs"))
                } else {
                    None
                }
            })
            .collect();
        bins.sort();
        roots.extend(bins);
    }
    roots
        .into_iter()
        .map(|root| crate_graph(workspace, &root))
        .collect()
}

/// The graph of the crate whose root file is `root`.
fn crate_graph(workspace: &Path, root: &Path) -> Graph {
    let mut modules = BTreeMap::new();
    let mut refs = Vec::new();
    let dir = root.parent().expect("a crate root is in a directory");
    read_module(root, Vec::new(), dir, &mut modules, &mut refs);
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, path) in refs {
        let segments: Vec<&str> = path
            .iter()
            .map(String::as_str)
            .filter(|s| *s != "self")
            .collect();
        let to = (0..=segments.len())
            .rev()
            .map(|n| segments[..n].join("::"))
            .find(|m| modules.contains_key(m))
            .unwrap_or_default();
        if to != from {
            edges.entry(from).or_default().insert(to);
        }
    }
    let modules = modules
        .into_iter()
        .map(|(m, f)| {
            let f = f
                .strip_prefix(workspace)
                .map(Path::to_path_buf)
                .unwrap_or(f);
            (m, f)
        })
        .collect();
    Graph {
        root: root
            .strip_prefix(workspace)
            .unwrap_or(root)
            .display()
            .to_string(),
        modules,
        edges,
    }
}

/// Reads the module in `file` (path `module`; its children's files are in `dir`), recording
/// every module it declares and every path it names: (module, absolute path).
fn read_module(
    file: &Path,
    module: Vec<String>,
    dir: &Path,
    modules: &mut BTreeMap<String, PathBuf>,
    refs: &mut Vec<(String, Vec<String>)>,
) {
    let text = fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let tokens = tokens(&code(&text));
    modules.insert(module.join("::"), file.to_path_buf());
    // The inline modules open at this point: (path, directory of their children, depth).
    let mut open: Vec<(Vec<String>, PathBuf, usize)> = vec![(module, dir.to_path_buf(), 0)];
    let mut depth = 0usize;
    let mut i = 0;
    while i < tokens.len() {
        let (current, current_dir, _) = open.last().expect("the file's own module").clone();
        let at_path_start = i == 0 || tokens[i - 1] != "::";
        match tokens[i].as_str() {
            "{" => depth += 1,
            "}" => {
                depth = depth.saturating_sub(1);
                if open.len() > 1 && open.last().is_some_and(|(_, _, d)| *d > depth) {
                    open.pop();
                }
            }
            "mod" if tokens.get(i + 1).is_some_and(|t| is_ident(t)) => {
                let name = tokens[i + 1].clone();
                let mut child = current.clone();
                child.push(name.clone());
                match tokens.get(i + 2).map(String::as_str) {
                    Some(";") => {
                        let flat = current_dir.join(format!("{name}.rs"));
                        let (child_file, child_dir) = if flat.is_file() {
                            (flat, current_dir.join(&name))
                        } else {
                            let nested = current_dir.join(&name).join("mod.rs");
                            assert!(
                                nested.is_file(),
                                "{}: mod {name}: neither {} nor {}",
                                file.display(),
                                flat.display(),
                                nested.display()
                            );
                            (nested, current_dir.join(&name))
                        };
                        read_module(&child_file, child, &child_dir, modules, refs);
                        i += 3;
                        continue;
                    }
                    Some("{") => {
                        modules.insert(child.join("::"), file.to_path_buf());
                        depth += 1;
                        open.push((child, current_dir.join(&name), depth));
                        i += 3;
                        continue;
                    }
                    _ => {}
                }
            }
            "crate" if at_path_start && tokens.get(i + 1).is_some_and(|t| t == "::") => {
                let mut paths = Vec::new();
                i = use_tree(&tokens, i + 2, Vec::new(), &mut paths);
                refs.extend(paths.into_iter().map(|p| (current.join("::"), p)));
                continue;
            }
            "super" if at_path_start && tokens.get(i + 1).is_some_and(|t| t == "::") => {
                let mut base = current.clone();
                while tokens.get(i).is_some_and(|t| t == "super")
                    && tokens.get(i + 1).is_some_and(|t| t == "::")
                {
                    base.pop();
                    i += 2;
                }
                let mut paths = Vec::new();
                i = use_tree(&tokens, i, base, &mut paths);
                refs.extend(paths.into_iter().map(|p| (current.join("::"), p)));
                continue;
            }
            _ => {}
        }
        i += 1;
    }
}

/// Reads the path or use tree starting at `tokens[i]` below `prefix` into `out`; returns the
/// index after it.
fn use_tree(
    tokens: &[String],
    mut i: usize,
    mut prefix: Vec<String>,
    out: &mut Vec<Vec<String>>,
) -> usize {
    loop {
        match tokens.get(i).map(String::as_str) {
            Some("{") => {
                i += 1;
                while i < tokens.len() && tokens[i] != "}" {
                    i = use_tree(tokens, i, prefix.clone(), out);
                    // `as name`, then the separator.
                    while i < tokens.len() && tokens[i] != "," && tokens[i] != "}" {
                        i += 1;
                    }
                    if tokens.get(i).is_some_and(|t| t == ",") {
                        i += 1;
                    }
                }
                return i + 1;
            }
            Some(t) if is_ident(t) => {
                prefix.push(t.to_string());
                i += 1;
                if tokens.get(i).is_some_and(|t| t == "::") {
                    i += 1;
                    continue;
                }
                out.push(prefix);
                return i;
            }
            Some("*") => {
                out.push(prefix);
                return i + 1;
            }
            _ => {
                out.push(prefix);
                return i;
            }
        }
    }
}

fn is_ident(t: &str) -> bool {
    t.chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_')
}

/// Identifiers, `::`, and every other character as a token of its own.
fn tokens(code: &str) -> Vec<String> {
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(chars[start..i].iter().collect());
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            out.push("::".to_string());
            i += 2;
        } else {
            if !c.is_whitespace() {
                out.push(c.to_string());
            }
            i += 1;
        }
    }
    out
}

/// `text` with its comments, strings and character literals blanked out.
fn code(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut nesting = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    nesting += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    nesting -= 1;
                    i += 2;
                    if nesting == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if c == 'r'
            && (i == 0
                || !ident(chars[i - 1])
                || (chars[i - 1] == 'b' && (i < 2 || !ident(chars[i - 2]))))
            && matches!(next, Some('"' | '#'))
            && raw_string_end(&chars, i + 1).is_some()
        {
            i = raw_string_end(&chars, i + 1).unwrap_or(chars.len());
            out.push_str("\"\"");
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' && next == Some('\\') {
            // An escaped character literal: '\n', '\'', '\u{1f}'.
            i += 2;
            while i < chars.len() && chars[i] != '\'' {
                i += 1;
            }
            i += 1;
            out.push_str("' '");
        } else if c == '\'' && chars.get(i + 2) == Some(&'\'') {
            i += 3;
            out.push_str("' '");
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// Where the raw string whose `#`s or opening quote start at `i` ends (the index after it).
fn raw_string_end(chars: &[char], mut i: usize) -> Option<usize> {
    let mut hashes = 0;
    while chars.get(i) == Some(&'#') {
        hashes += 1;
        i += 1;
    }
    if chars.get(i) != Some(&'"') {
        return None;
    }
    i += 1;
    while i < chars.len() {
        if chars[i] == '"' && (1..=hashes).all(|k| chars.get(i + k) == Some(&'#')) {
            return Some(i + 1 + hashes);
        }
        i += 1;
    }
    None
}
