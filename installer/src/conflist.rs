//! Patching CNI network configs: pure functions from file contents to file contents.
//!
//! The rules are Linkerd's (`install-cni.sh` and its jq filter):
//! - a document with a `type` is a single plugin (usually a `.conf`): it becomes
//!   `{"name":"k8s-pod-network","cniVersion":"0.3.1","plugins":[<the document>, <linkerd>]}`,
//!   and a `.conf` file is saved as `.conflist` (the `.conf` removed). The original document is
//!   kept verbatim as the first plugin, its own `name`/`cniVersion` included (the runtime
//!   overrides both with the list's when it calls a plugin);
//! - a document with a `plugins` array is a list: every `linkerd-cni` entry is removed and ours
//!   is appended last. Every other key and entry stays as it was, in its order.
//!
//! Removal on cleanup deletes our entries and nothing else, so the plugin list is exactly the
//! one the primary CNI wrote. A converted `.conf` stays a `.conflist` holding its one plugin
//! (this is what Linkerd does; the runtime treats both the same way).
//!
//! The installer writes its entry and nothing else: old entries are cut out of the file's text
//! and ours is inserted, so every other byte (other plugins, their number spellings such as
//! `6e81` or 44-digit integers, the primary CNI's layout) stays exactly as it was. Patching the
//! output again changes nothing, so a file the installer wrote is a fixed point and can never
//! start a rewrite loop. [`patch_bytes`] and [`unpatch_bytes`] are the pure core, for tests and
//! fuzzing.

use std::{
    ops::Range,
    path::{Path, PathBuf},
};

use crate::{
    error::Malformed,
    json::{self, Json},
};

/// The name of the plugin binary in the image and on the host. It is also the `type` the
/// runtime looks up in the bin dir, and the `type` of old entries the installer replaces.
pub const PLUGIN_TYPE: &str = "linkerd-cni";

/// Name of the list a wrapped `.conf` becomes.
pub const WRAPPED_NAME: &str = "k8s-pod-network";
/// CNI version of the list a wrapped `.conf` becomes.
pub const WRAPPED_CNI_VERSION: &str = "0.3.1";

/// The two kinds of file the installer looks at, by extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfKind {
    /// `*.conf`: usually a single plugin.
    Conf,
    /// `*.conflist`: a plugin list.
    Conflist,
}

impl ConfKind {
    /// The kind of `path`, or `None` for every other file (kubeconfigs, temp files, `.json`).
    pub fn of(path: &Path) -> Option<Self> {
        match path.extension()?.to_str()? {
            "conf" => Some(Self::Conf),
            "conflist" => Some(Self::Conflist),
            _ => None,
        }
    }
}

/// What [`patch`] wants written.
#[derive(Clone, Debug, PartialEq)]
pub struct Patched {
    /// Where to write (the input path, or the `.conflist` next to a `.conf`).
    pub path: PathBuf,
    /// The new contents.
    pub bytes: Vec<u8>,
    /// A file to remove once `bytes` is in place (the converted `.conf`).
    pub remove: Option<PathBuf>,
}

/// Whether a file already carries our entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileState {
    /// A list whose last plugin is exactly our entry, with no other linkerd-cni entry.
    Patched,
    /// A usable config that does not (yet) carry our entry as it should.
    Unpatched,
    /// Left alone, for this reason.
    Malformed(Malformed),
}

enum Shape<'a> {
    Single,
    List(&'a [Json]),
}

fn shape(doc: &Json) -> Result<Shape<'_>, Malformed> {
    let Some(_) = doc.as_object() else {
        return Err(Malformed::NotObject);
    };
    // A `plugins` list makes a list, whatever else the top level holds: libcni reads a
    // conflist's `plugins` and ignores a stray top-level `type` (wrapping such a list as one
    // plugin would break the node's network; found by fuzzing).
    if doc.has("type") && !matches!(doc.get("plugins"), Some(Json::Array(_))) {
        return match doc.get("type").and_then(Json::as_str) {
            Some(_) => Ok(Shape::Single),
            None => Err(Malformed::NoPlugins),
        };
    }
    match doc.get("plugins") {
        Some(Json::Array(plugins)) => {
            if let Some(bad) = plugins
                .iter()
                .position(|p| p.get("type").and_then(Json::as_str).is_none())
            {
                return Err(Malformed::BadPlugin(bad));
            }
            Ok(Shape::List(plugins))
        }
        _ => Err(Malformed::NoPlugins),
    }
}

fn parse(input: &[u8]) -> Result<(&str, Json), Malformed> {
    let doc = Json::parse(input).map_err(|e| Malformed::Json(e.to_string()))?;
    // `Json::parse` accepts UTF-8 text only.
    let text = std::str::from_utf8(input).map_err(|e| Malformed::Json(e.to_string()))?;
    Ok((text, doc))
}

/// Whether `plugin` is a linkerd-cni entry (ours or an older one): its `type` is
/// `linkerd-cni` or the type of our entry.
fn is_linkerd(plugin: &Json, entry_type: &str) -> bool {
    matches!(plugin.get("type").and_then(Json::as_str), Some(t) if t == PLUGIN_TYPE || t == entry_type)
}

fn entry_type(entry: &Json) -> &str {
    entry
        .get("type")
        .and_then(Json::as_str)
        .unwrap_or(PLUGIN_TYPE)
}

/// The patch for the file at `path` holding `input`, with `entry` as our plugin entry.
/// `Ok(None)`: the file is already as it should be.
///
/// Only our entry is written; every other byte of the file stays as it was (see
/// [`patch_bytes`]). A `.conf` is moved to its `.conflist`.
pub fn patch(path: &Path, input: &[u8], entry: &Json) -> Result<Option<Patched>, Malformed> {
    let bytes = patched(input, entry)?;
    let (out_path, remove) = match ConfKind::of(path) {
        Some(ConfKind::Conf) => (path.with_extension("conflist"), Some(path.to_path_buf())),
        _ => (path.to_path_buf(), None),
    };
    match (bytes, remove) {
        (None, None) => Ok(None),
        (bytes, remove) => Ok(Some(Patched {
            path: out_path,
            bytes: bytes.unwrap_or_else(|| input.to_vec()),
            remove,
        })),
    }
}

/// What a file holding `input` holds once patched with `entry`: a pure function of bytes,
/// for tests and fuzzing.
///
/// - A list (`plugins` array): every linkerd-cni entry is cut out together with the separator
///   before it, and `entry` is inserted after the last remaining plugin, as `,` + the
///   whitespace that precedes that plugin + the entry (pretty-printed with that plugin's
///   indentation when it sits on its own line, else on one line). Nothing else changes: every
///   other byte, number spellings and whitespace included, is the input's.
/// - A single plugin: `{"name":"k8s-pod-network","cniVersion":"0.3.1","plugins":[<input>,
///   <entry>]}`, pretty-printed, the input inside it verbatim (without surrounding whitespace).
///
/// Patching the output again returns it unchanged (a fixed point); [`unpatch_bytes`] of the
/// output of a list without linkerd-cni entries is the input, byte for byte.
pub fn patch_bytes(input: &[u8], entry: &Json) -> Result<Vec<u8>, Malformed> {
    Ok(patched(input, entry)?.unwrap_or_else(|| input.to_vec()))
}

/// The patched bytes, or `None` when `input` already carries `entry` as it should.
fn patched(input: &[u8], entry: &Json) -> Result<Option<Vec<u8>>, Malformed> {
    let (text, doc) = parse(input)?;
    let ty = entry_type(entry);
    match shape(&doc)? {
        Shape::Single => {
            if is_linkerd(&doc, ty) {
                return Err(Malformed::NoPrimary);
            }
            Ok(Some(wrap(text, entry)))
        }
        Shape::List(plugins) => {
            let keep: Vec<bool> = plugins.iter().map(|p| !is_linkerd(p, ty)).collect();
            if !keep.contains(&true) {
                return Err(Malformed::NoPrimary);
            }
            let n = plugins.len();
            let in_place = plugins.last() == Some(entry) && keep[..n - 1].iter().all(|k| *k);
            if in_place {
                return Ok(None);
            }
            edit_list(text, &keep, Some(entry)).map(Some)
        }
    }
}

/// A single plugin's text wrapped into a list with `entry` after it.
fn wrap(text: &str, entry: &Json) -> Vec<u8> {
    let original = text.trim_matches(|c: char| c.is_ascii() && json::is_ws(c as u8));
    let mut out = String::with_capacity(text.len() + 1024);
    out.push_str("{\n  \"name\": ");
    out.push_str(&Json::string(WRAPPED_NAME).to_compact_string());
    out.push_str(",\n  \"cniVersion\": ");
    out.push_str(&Json::string(WRAPPED_CNI_VERSION).to_compact_string());
    out.push_str(",\n  \"plugins\": [\n    ");
    out.push_str(original);
    out.push_str(",\n    ");
    entry.write_pretty(&mut out, "    ", "  ");
    out.push_str("\n  ]\n}\n");
    out.into_bytes()
}

/// `text` (a list whose `plugins` are kept or cut as `keep` says, at least one kept) with the
/// cut plugins removed and `insert` after the last kept one. Every other byte is kept.
fn edit_list(text: &str, keep: &[bool], insert: Option<&Json>) -> Result<Vec<u8>, Malformed> {
    let layout_changed = || Malformed::Json("the plugin list could not be located".into());
    let spans = json::array_spans(text, "plugins").ok_or_else(layout_changed)?;
    let el = &spans.elements;
    let (Some(first), Some(last)) = (keep.iter().position(|k| *k), keep.iter().rposition(|k| *k))
    else {
        return Err(Malformed::NoPrimary);
    };
    if el.len() != keep.len() {
        return Err(layout_changed());
    }
    // Each cut plugin goes with the separator before it (the first ones: with the separator
    // after them), so the list stays valid and the rest keeps its layout.
    let mut cuts: Vec<Range<usize>> = Vec::new();
    if first > 0 {
        cuts.push(el[0].start..el[first].start);
    }
    for k in first + 1..el.len() {
        if !keep[k] {
            cuts.push(el[k - 1].end..el[k].end);
        }
    }
    let at = el[last].end;
    let insertion = insert.map(|entry| {
        let sep = leading_ws(text, el[last].start);
        let mut s = String::from(",");
        s.push_str(sep);
        match sep.rfind('\n') {
            Some(nl) => {
                let indent = &sep[nl + 1..];
                let unit = indent_unit(&text[el[last].clone()], indent);
                entry.write_pretty(&mut s, indent, unit);
            }
            None => s.push_str(&entry.to_compact_string()),
        }
        s
    });
    let mut out = String::with_capacity(text.len() + insertion.as_ref().map_or(0, String::len));
    let mut pos = 0;
    let mut pending = insertion.as_deref();
    for cut in cuts {
        if let Some(ins) = pending.filter(|_| at <= cut.start) {
            out.push_str(&text[pos..at]);
            out.push_str(ins);
            pos = at;
            pending = None;
        }
        out.push_str(&text[pos..cut.start]);
        pos = cut.end;
    }
    if let Some(ins) = pending {
        out.push_str(&text[pos..at]);
        out.push_str(ins);
        pos = at;
    }
    out.push_str(&text[pos..]);
    Ok(out.into_bytes())
}

/// The whitespace right before byte `at` of `text`.
fn leading_ws(text: &str, at: usize) -> &str {
    let before = &text.as_bytes()[..at];
    let n = before.iter().rev().take_while(|b| json::is_ws(**b)).count();
    &text[at - n..at]
}

/// One level of indentation as the plugin `element` (whose first line starts at `indent`) uses
/// it: what its second line adds to `indent`; two spaces when it does not tell.
fn indent_unit<'a>(element: &'a str, indent: &str) -> &'a str {
    let Some(nl) = element.find('\n') else {
        return "  ";
    };
    let next = &element[nl + 1..];
    let n = next
        .bytes()
        .take_while(|b| matches!(b, b' ' | b'\t'))
        .count();
    match next[..n].strip_prefix(indent) {
        Some(unit) if !unit.is_empty() => unit,
        _ => "  ",
    }
}

/// The file without any linkerd-cni entry. `Ok(None)`: there is none, nothing to write.
/// A list made only of linkerd-cni entries is not ours to empty: `Err(NoPrimary)`.
///
/// Each entry is cut out with the separator before it; every other byte stays as it was.
pub fn unpatch(input: &[u8], entry: &Json) -> Result<Option<Vec<u8>>, Malformed> {
    let (text, doc) = parse(input)?;
    let ty = entry_type(entry);
    let Shape::List(plugins) = shape(&doc)? else {
        return Ok(None);
    };
    let keep: Vec<bool> = plugins.iter().map(|p| !is_linkerd(p, ty)).collect();
    if !keep.contains(&false) {
        return Ok(None);
    }
    if !keep.contains(&true) {
        return Err(Malformed::NoPrimary);
    }
    edit_list(text, &keep, None).map(Some)
}

/// [`unpatch`] as a pure function of bytes: the input when there is nothing to remove.
pub fn unpatch_bytes(input: &[u8], entry: &Json) -> Result<Vec<u8>, Malformed> {
    Ok(unpatch(input, entry)?.unwrap_or_else(|| input.to_vec()))
}

/// Whether the file at `path` holding `input` carries `entry` the way [`patch`] leaves it.
pub fn state(path: &Path, input: &[u8], entry: &Json) -> FileState {
    match patch(path, input, entry) {
        Ok(None) => FileState::Patched,
        Ok(Some(_)) => FileState::Unpatched,
        Err(m) => FileState::Malformed(m),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> Json {
        Json::parse(
            br#"{"name":"linkerd-cni","type":"linkerd-cni","capabilities":{"cgroupPath":true}}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"))
    }

    fn types(bytes: &[u8]) -> Vec<String> {
        let doc = Json::parse(bytes).unwrap_or_else(|e| panic!("output is not JSON: {e}"));
        match doc.get("plugins") {
            Some(Json::Array(ps)) => ps
                .iter()
                .filter_map(|p| p.get("type")?.as_str().map(String::from))
                .collect(),
            other => panic!("no plugins array: {other:?}"),
        }
    }

    #[test]
    fn patch_table() {
        // (file name, input, expected plugin types after patching, expected output name)
        let cases: &[(&str, &str, &[&str], &str)] = &[
            (
                "10-a.conf",
                r#"{"cniVersion":"1.0.0","name":"a","type":"bridge"}"#,
                &["bridge", "linkerd-cni"],
                "10-a.conflist",
            ),
            (
                "10-a.conflist",
                r#"{"name":"a","plugins":[{"type":"bridge"}]}"#,
                &["bridge", "linkerd-cni"],
                "10-a.conflist",
            ),
            (
                "10-a.conflist",
                r#"{"name":"a","plugins":[{"type":"bridge"},{"type":"linkerd-cni","old":1},{"type":"portmap"}]}"#,
                &["bridge", "portmap", "linkerd-cni"],
                "10-a.conflist",
            ),
            (
                "10-a.conflist",
                r#"{"name":"a","plugins":[{"type":"linkerd-cni"},{"type":"bridge"},{"type":"linkerd-cni"}]}"#,
                &["bridge", "linkerd-cni"],
                "10-a.conflist",
            ),
            // A list in a `.conf` file is still a list; the file is renamed like every `.conf`.
            (
                "10-a.conf",
                r#"{"name":"a","plugins":[{"type":"bridge"}]}"#,
                &["bridge", "linkerd-cni"],
                "10-a.conflist",
            ),
        ];
        for (name, input, want_types, want_name) in cases {
            let path = Path::new("/d").join(name);
            let p = patch(&path, input.as_bytes(), &entry())
                .unwrap_or_else(|e| panic!("{name} {input}: {e}"))
                .unwrap_or_else(|| panic!("{name} {input}: no patch"));
            assert_eq!(types(&p.bytes), *want_types, "{name} {input}");
            assert_eq!(p.path, Path::new("/d").join(want_name), "{name} {input}");
            assert_eq!(
                p.remove.is_some(),
                name.ends_with(".conf"),
                "{name} {input}: removal"
            );
            // The output is a fixed point.
            let again =
                patch(&p.path, &p.bytes, &entry()).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(
                again, None,
                "{name} {input}: patching the output changed it"
            );
            assert_eq!(
                state(&p.path, &p.bytes, &entry()),
                FileState::Patched,
                "{name}"
            );
            assert_eq!(
                state(&path, input.as_bytes(), &entry()),
                FileState::Unpatched,
                "{name}"
            );
        }
    }

    #[test]
    fn wrapped_conf_has_linkerd_header_and_verbatim_original() {
        let input = br#"{"cniVersion":"1.0.0","name":"mynet","type":"bridge","ipam":{"type":"host-local"}}"#;
        let p = patch(Path::new("/d/x.conf"), input, &entry())
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("no patch"));
        let doc = Json::parse(&p.bytes).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(doc.get("name").and_then(Json::as_str), Some(WRAPPED_NAME));
        assert_eq!(
            doc.get("cniVersion").and_then(Json::as_str),
            Some(WRAPPED_CNI_VERSION)
        );
        let original = Json::parse(input).unwrap_or_else(|e| panic!("{e}"));
        match doc.get("plugins") {
            Some(Json::Array(ps)) => assert_eq!(ps.first(), Some(&original)),
            other => panic!("plugins: {other:?}"),
        }
    }

    #[test]
    fn malformed_table() {
        let cases: &[(&str, Malformed)] = &[
            ("{", Malformed::Json(String::new())),
            ("[]", Malformed::NotObject),
            (r#"{"name":"x"}"#, Malformed::NoPlugins),
            (r#"{"plugins":{}}"#, Malformed::NoPlugins),
            (r#"{"type":7}"#, Malformed::NoPlugins),
            (
                r#"{"plugins":[{"type":"bridge"},{"name":"no type"}]}"#,
                Malformed::BadPlugin(1),
            ),
            (
                r#"{"plugins":[{"type":"linkerd-cni"}]}"#,
                Malformed::NoPrimary,
            ),
            (r#"{"type":"linkerd-cni"}"#, Malformed::NoPrimary),
        ];
        for (input, want) in cases {
            let got = patch(Path::new("/d/x.conflist"), input.as_bytes(), &entry()).err();
            match (got, want) {
                (Some(Malformed::Json(_)), Malformed::Json(_)) => {}
                (got, want) => assert_eq!(got.as_ref(), Some(want), "{input}"),
            }
        }
    }

    #[test]
    fn unpatch_restores_the_list() {
        let cases: &[(&str, Option<&[&str]>)] = &[
            (
                r#"{"plugins":[{"type":"bridge"},{"type":"linkerd-cni"}]}"#,
                Some(&["bridge"]),
            ),
            (
                r#"{"plugins":[{"type":"linkerd-cni"},{"type":"a"},{"type":"b"},{"type":"linkerd-cni"}]}"#,
                Some(&["a", "b"]),
            ),
            (r#"{"plugins":[{"type":"bridge"}]}"#, None),
            (r#"{"type":"bridge"}"#, None),
        ];
        for (input, want) in cases {
            let got =
                unpatch(input.as_bytes(), &entry()).unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(
                got.as_deref().map(types),
                want.map(|w| w.iter().map(|s| s.to_string()).collect()),
                "{input}"
            );
        }
        let only = unpatch(br#"{"plugins":[{"type":"linkerd-cni"}]}"#, &entry()).err();
        assert_eq!(only, Some(Malformed::NoPrimary));
    }
}
