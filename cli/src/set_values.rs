//! Helm's `--set`, `--set-string` and `--set-file` expressions, applied to a values tree.
//!
//! Syntax (Helm's): `key.sub=value[,key2=value2...]`; a value `{a,b}` is a list; `key[0]=v`
//! sets a list element and `a.b[1].c=d` / `a[0][1]=v` go through lists (missing elements are
//! `null`, as Helm pads them); a backslash escapes the next character (`\,`, `\.`, `\[`).
//! `--set` types scalars as Helm does (`true`/`false`, `null`, integers without a leading zero;
//! anything else is a string), `--set-string` keeps every value a string, `--set-file` reads
//! the value from the named file.
//!
//! The expressions are applied to the user's overrides (values files, then flags), not to the
//! chart's defaults, and the overrides then replace the defaults the way Helm coalesces them:
//! `--set tolerations[0].operator=Exists` gives a one-element list, not the chart's list
//! with an element changed.

use std::path::PathBuf;

use serde_json::{Map, Value as Json};

/// Helm's largest accepted list index.
pub const MAX_INDEX: usize = 65536;

/// Helm's limit on nested names in a key: `a.b.c` is nested level 2, and a key nested deeper
/// than this (more than 31 names) is refused, as Helm refuses it.
pub const MAX_NESTED_NAME_LEVEL: usize = 30;

/// The most steps (names and list indexes together) a key may have. The values tree is merged,
/// checked and rendered by recursive walks, so its depth must be bounded: a key 20,000 levels
/// deep would overflow the stack. Helm bounds only the names (its stacks grow); no value of the
/// chart is nested deeper than a few levels, Kubernetes objects included.
pub const MAX_KEY_DEPTH: usize = 64;

/// Which flag an expression came from: how its values are typed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetKind {
    /// `--set`: typed scalars.
    Typed,
    /// `--set-string`: strings.
    String,
    /// `--set-file`: the value is a path; the file's content is the (string) value.
    File,
}

impl SetKind {
    fn flag(self) -> &'static str {
        match self {
            SetKind::Typed => "--set",
            SetKind::String => "--set-string",
            SetKind::File => "--set-file",
        }
    }
}

/// Why an expression was rejected.
#[derive(Debug, thiserror::Error)]
pub enum SetError {
    /// The expression is malformed.
    #[error("invalid {flag} {:?}: {reason}", shown(expr))]
    Syntax {
        flag: &'static str,
        expr: String,
        reason: String,
    },
    /// `--set-file` names a file that cannot be read.
    #[error("{flag} {:?}: reading {}: {source}", shown(expr), path.display())]
    File {
        flag: &'static str,
        expr: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// An expression as error messages show it: its first 200 characters, then how many more.
pub fn shown(expr: &str) -> String {
    const SHOWN: usize = 200;
    match expr.char_indices().nth(SHOWN) {
        Some((at, _)) => format!(
            "{}... ({} more characters)",
            &expr[..at],
            expr[at..].chars().count()
        ),
        None => expr.to_string(),
    }
}

/// One step of a key: a map key or a list index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    Key(String),
    Index(usize),
}

/// Splits `s` on `sep` where it is not escaped and not inside `{...}`; escapes are kept
/// (the key and value parsers resolve them).
fn split_top(s: &str, sep: char) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut depth = 0usize;
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        let last = out.len() - 1;
        match c {
            '\\' => {
                out[last].push('\\');
                if let Some(n) = chars.next() {
                    out[last].push(n);
                }
            }
            '{' => {
                depth += 1;
                out[last].push(c);
            }
            '}' => {
                depth = depth.saturating_sub(1);
                out[last].push(c);
            }
            c if c == sep && depth == 0 => out.push(String::new()),
            c => out[last].push(c),
        }
    }
    out
}

/// Resolves backslash escapes.
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.extend(chars.next()),
            c => out.push(c),
        }
    }
    out
}

fn too_deep() -> String {
    format!(
        "key has more than {MAX_KEY_DEPTH} names and list indexes: no value of the chart is \
         nested that deep"
    )
}

/// Parses a key (`a.b[1].c`) into steps: at most [`MAX_KEY_DEPTH`] of them, nested at most
/// [`MAX_NESTED_NAME_LEVEL`] levels as Helm counts them (each `.` after a name; a `.` after a
/// list index does not count).
pub fn parse_key(key: &str) -> Result<Vec<Step>, String> {
    let mut steps = Vec::new();
    let mut name = String::new();
    // Helm's nested name level: the `.`s that follow a name.
    let mut nested_level = 0usize;
    // Whether the current name may be empty: right after an index (`a[0].b` or `a[0][1]`).
    let mut after_index = false;
    let mut chars = key.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => name.extend(chars.next()),
            '.' => {
                if name.is_empty() && !after_index {
                    return Err("empty key".into());
                }
                if !name.is_empty() {
                    steps.push(Step::Key(std::mem::take(&mut name)));
                }
                if steps.len() >= MAX_KEY_DEPTH {
                    return Err(too_deep());
                }
                if !after_index {
                    nested_level += 1;
                    if nested_level > MAX_NESTED_NAME_LEVEL {
                        return Err(format!(
                            "key nested level is greater than the maximum supported nested \
                             level of {MAX_NESTED_NAME_LEVEL} (Helm's limit)"
                        ));
                    }
                }
                after_index = false;
                if chars.peek().is_none() {
                    return Err("empty key".into());
                }
            }
            '[' => {
                if !name.is_empty() {
                    steps.push(Step::Key(std::mem::take(&mut name)));
                } else if steps.is_empty() {
                    return Err("a list index needs a key before it (key[0])".into());
                } else if !after_index {
                    return Err("empty key".into());
                }
                let mut digits = String::new();
                loop {
                    match chars.next() {
                        Some(']') => break,
                        Some(d) => digits.push(d),
                        None => return Err("unterminated list index".into()),
                    }
                }
                let index: i64 = digits
                    .trim()
                    .parse()
                    .map_err(|_| format!("list index {digits:?} is not a number"))?;
                if index < 0 {
                    return Err(format!("negative list index {index} not allowed"));
                }
                let index = usize::try_from(index).unwrap_or(usize::MAX);
                if index > MAX_INDEX {
                    return Err(format!(
                        "list index {index} is greater than the maximum supported index {MAX_INDEX}"
                    ));
                }
                if steps.len() >= MAX_KEY_DEPTH {
                    return Err(too_deep());
                }
                steps.push(Step::Index(index));
                after_index = true;
                match chars.peek() {
                    None | Some('.') | Some('[') => {}
                    Some(_) => return Err("expected '.' or '[' after a list index".into()),
                }
            }
            ']' => return Err("unexpected ']'".into()),
            c => {
                name.push(c);
                after_index = false;
            }
        }
    }
    if !name.is_empty() {
        steps.push(Step::Key(name));
    } else if !after_index {
        return Err("empty key".into());
    }
    Ok(steps)
}

/// A scalar of `--set`, typed as Helm types it.
fn typed_scalar(s: &str) -> Json {
    match s {
        "true" => Json::Bool(true),
        "false" => Json::Bool(false),
        "null" => Json::Null,
        _ => {
            let digits = s.strip_prefix('-').unwrap_or(s);
            let leading_zero = digits.len() > 1 && digits.starts_with('0');
            match s.parse::<i64>() {
                Ok(n) if !leading_zero => Json::from(n),
                _ => Json::String(s.to_string()),
            }
        }
    }
}

/// Parses one expression into (key, value) assignments, in order.
pub fn parse(kind: SetKind, expr: &str) -> Result<Vec<(Vec<Step>, Json)>, SetError> {
    let syntax = |reason: String| SetError::Syntax {
        flag: kind.flag(),
        expr: expr.to_string(),
        reason,
    };
    let mut out = Vec::new();
    for item in split_top(expr, ',') {
        if item.is_empty() {
            continue;
        }
        // The first unescaped '=' separates key and value.
        let mut split = None;
        let mut escaped = false;
        for (i, c) in item.char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '=' => {
                    split = Some(i);
                    break;
                }
                _ => {}
            }
        }
        let Some(at) = split else {
            return Err(syntax("expected key=value".into()));
        };
        let (key, raw) = (&item[..at], &item[at + 1..]);
        let steps = parse_key(key).map_err(syntax)?;
        let scalar = |s: &str| match kind {
            SetKind::Typed => typed_scalar(&unescape(s)),
            SetKind::String | SetKind::File => Json::String(unescape(s)),
        };
        let value = match (
            kind,
            raw.strip_prefix('{').and_then(|r| r.strip_suffix('}')),
        ) {
            (SetKind::File, _) => {
                let path = PathBuf::from(unescape(raw));
                let text = std::fs::read_to_string(&path).map_err(|source| SetError::File {
                    flag: kind.flag(),
                    expr: expr.to_string(),
                    path: path.clone(),
                    source,
                })?;
                Json::String(text)
            }
            (_, Some("")) => Json::Array(Vec::new()),
            (_, Some(inner)) => {
                Json::Array(split_top(inner, ',').iter().map(|s| scalar(s)).collect())
            }
            (_, None) => scalar(raw),
        };
        out.push((steps, value));
    }
    Ok(out)
}

/// Sets `steps` in `tree` to `value` (kept as is, `null` included: it deletes the chart's
/// default when the tree is coalesced onto the defaults), creating maps and lists on the way
/// and replacing what is in the way.
pub fn set(tree: &mut Json, steps: &[Step], value: Json) {
    let Some((first, rest)) = steps.split_first() else {
        *tree = value;
        return;
    };
    let slot = match first {
        Step::Key(k) => {
            if !tree.is_object() {
                *tree = Json::Object(Map::new());
            }
            let Json::Object(m) = tree else {
                unreachable!("made a map just above")
            };
            m.entry(k.clone()).or_insert(Json::Null)
        }
        Step::Index(i) => {
            if !tree.is_array() {
                *tree = Json::Array(Vec::new());
            }
            let Json::Array(a) = tree else {
                unreachable!("made a list just above")
            };
            if a.len() <= *i {
                a.resize(*i + 1, Json::Null);
            }
            &mut a[*i]
        }
    };
    if rest.is_empty() {
        *slot = value;
    } else {
        set(slot, rest, value);
    }
}

/// Merges a values file into the overrides as Helm merges `-f` files: maps key by key,
/// anything else replaced; `null` is kept, so that it deletes the chart's default later.
pub fn merge_file(dst: &mut Json, src: Json) {
    match (dst, src) {
        (Json::Object(d), Json::Object(s)) => {
            for (k, v) in s {
                match d.get_mut(&k) {
                    Some(existing) if existing.is_object() && v.is_object() => {
                        merge_file(existing, v)
                    }
                    _ => {
                        d.insert(k, v);
                    }
                }
            }
        }
        (dst, src) => *dst = src,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn key(steps: &[&str]) -> Vec<Step> {
        steps
            .iter()
            .map(|s| match s.parse::<usize>() {
                Ok(i) => Step::Index(i),
                Err(_) => Step::Key(s.to_string()),
            })
            .collect()
    }

    #[test]
    fn typed_expressions() {
        type Case<'a> = (&'a str, Vec<(Vec<&'a str>, Json)>);
        let cases: &[Case] = &[
            ("a=1", vec![(vec!["a"], json!(1))]),
            (
                "a.b=x,c=true",
                vec![(vec!["a", "b"], json!("x")), (vec!["c"], json!(true))],
            ),
            ("a=-1", vec![(vec!["a"], json!(-1))]),
            ("a=0123", vec![(vec!["a"], json!("0123"))]),
            ("a=1.2", vec![(vec!["a"], json!("1.2"))]),
            ("a=null", vec![(vec!["a"], Json::Null)]),
            (r"a=8080\,9090", vec![(vec!["a"], json!("8080,9090"))]),
            (
                "a={x,2},b=",
                vec![(vec!["a"], json!(["x", 2])), (vec!["b"], json!(""))],
            ),
            ("a={}", vec![(vec!["a"], json!([]))]),
            (r"a\.b.c=v", vec![(vec!["a.b", "c"], json!("v"))]),
            ("a=x=y", vec![(vec!["a"], json!("x=y"))]),
            (
                "resources.ephemeral-storage.limit=1Gi",
                vec![(
                    vec!["resources", "ephemeral-storage", "limit"],
                    json!("1Gi"),
                )],
            ),
            ("a[0]=b", vec![(vec!["a", "0"], json!("b"))]),
            ("a.b[1].c=d", vec![(vec!["a", "b", "1", "c"], json!("d"))]),
            ("a[0][2]=1", vec![(vec!["a", "0", "2"], json!(1))]),
        ];
        for (expr, want) in cases {
            let got = parse(SetKind::Typed, expr).unwrap_or_else(|e| panic!("{expr}: {e}"));
            let want: Vec<(Vec<Step>, Json)> =
                want.iter().map(|(p, v)| (key(p), v.clone())).collect();
            assert_eq!(got, want, "--set {expr}");
        }
        for (bad, why) in [
            ("a", "key=value"),
            (".a=1", "empty key"),
            ("a..b=1", "empty key"),
            ("a.=1", "empty key"),
            ("[0]=1", "key before"),
            ("a[-1]=1", "negative"),
            ("a[x]=1", "not a number"),
            ("a[70000]=1", "maximum"),
            ("a[0=1", "unterminated"),
            ("a[0]b=1", "after a list index"),
        ] {
            let err = parse(SetKind::Typed, bad)
                .map(|_| ())
                .expect_err(&format!("--set {bad} should be rejected"));
            assert!(err.to_string().contains(why), "--set {bad}: {err}");
        }
    }

    /// Helm's nested name limit, counted as Helm counts it (a `.` after a list index is not a
    /// level), and the bound on all steps that keeps the recursive walks off the end of the
    /// stack: a key 20,000 levels deep is an error, not a crash.
    #[test]
    fn key_depth_is_bounded() {
        let dotted = |n: usize| vec!["a"; n].join(".");
        let ok = |key: &str| {
            parse(SetKind::Typed, &format!("{key}=1"))
                .unwrap_or_else(|e| panic!("{} rejected: {e}", shown(key)))
        };
        let refused = |key: &str, why: &str| {
            let err = parse(SetKind::Typed, &format!("{key}=1"))
                .map(|_| ())
                .expect_err(&format!("{} accepted", shown(key)));
            assert!(err.to_string().contains(why), "{}: {err}", shown(key));
            assert!(
                err.to_string().len() < 600,
                "the message quotes a bounded part of the expression: {err}"
            );
        };
        assert_eq!(
            ok(&dotted(31))[0].0.len(),
            31,
            "nested level 30: Helm's most"
        );
        refused(&dotted(32), "maximum supported nested level of 30");
        // Helm counts the `.`s after names only.
        ok(&format!("x[0].{}", dotted(31)));
        refused(&format!("x[0].{}", dotted(32)), "nested level of 30");
        ok(&format!("{}[0].{}", dotted(20), dotted(12)));
        refused(
            &format!("{}[0].{}", dotted(20), dotted(13)),
            "nested level of 30",
        );
        ok(&format!("b{}", "[0].c".repeat(31)));
        // Every step counts towards the bound on depth.
        assert_eq!(ok(&format!("a{}", "[0]".repeat(63)))[0].0.len(), 64);
        refused(
            &format!("a{}", "[0]".repeat(64)),
            "more than 64 names and list indexes",
        );
        refused(&format!("b{}", "[0].c".repeat(40)), "more than 64");
        // The fuzzer's finding: 20,000 levels, as names and as indexes.
        refused(&dotted(20_000), "nested level of 30");
        refused(&format!("a{}", "[0]".repeat(20_000)), "more than 64");
        refused(&format!("b{}", "[0].c".repeat(20_000)), "more than 64");
    }

    #[test]
    fn string_and_file_expressions() {
        assert_eq!(
            parse(SetKind::String, "a=1,b=true,c=null,d={1,x}").expect("parses"),
            vec![
                (key(&["a"]), json!("1")),
                (key(&["b"]), json!("true")),
                (key(&["c"]), json!("null")),
                (key(&["d"]), json!(["1", "x"])),
            ]
        );
        let dir = std::env::temp_dir().join(format!("set-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let file = dir.join("v.txt");
        std::fs::write(&file, "line 1\nline 2, with a comma\n").expect("write");
        assert_eq!(
            parse(SetKind::File, &format!("x.y[1]={}", file.display())).expect("parses"),
            vec![(
                key(&["x", "y", "1"]),
                json!("line 1\nline 2, with a comma\n")
            )]
        );
        let err = parse(SetKind::File, "x=/nonexistent/file").expect_err("missing file");
        assert!(err.to_string().contains("/nonexistent/file"), "{err}");
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn set_walks_and_pads_lists() {
        let mut t = json!({"a": [{"x": 1}], "m": {"k": 1}});
        set(&mut t, &key(&["a", "0", "y"]), json!(2));
        set(&mut t, &key(&["a", "2"]), json!("z"));
        set(&mut t, &key(&["n", "1", "c"]), json!("d"));
        set(&mut t, &key(&["m", "k"]), Json::Null);
        set(&mut t, &key(&["l", "0", "1"]), json!(true));
        assert_eq!(
            t,
            json!({
                "a": [{"x": 1, "y": 2}, null, "z"],
                "m": {"k": null},
                "n": [null, {"c": "d"}],
                "l": [[null, true]],
            })
        );
    }
}
