//! Reading YAML values: a values file, or the chart's own `values.yaml`, into a JSON tree,
//! refusing what Helm (YAML 1.1) would read otherwise than this CLI (YAML 1.2).

use serde_json::{Map, Value as Json};

use super::ValuesError;

/// Parses YAML into a JSON tree whose top level is a map (an empty document is an empty map).
pub fn parse_yaml(text: &str, origin: &str) -> Result<Json, ValuesError> {
    let parse_err = |message: String| ValuesError::Parse {
        origin: origin.to_string(),
        message,
    };
    let value: Json = serde_yaml_ng::from_str(text).map_err(|e| parse_err(e.to_string()))?;
    match value {
        Json::Null => Ok(Json::Object(Map::new())),
        Json::Object(_) => Ok(value),
        _ => Err(parse_err("the top level is not a map".into())),
    }
}

/// What Helm (a YAML 1.1 reader) makes of a plain scalar that a YAML 1.2 reader (this CLI, and
/// the API server's JSON) takes for a string: `yes`, `on`, `n` ... are booleans, `010` is octal,
/// `1_000` has separators. `None` when both readers agree.
fn yaml_1_1_reading(s: &str) -> Option<String> {
    const TRUE: &[&str] = &["y", "Y", "yes", "Yes", "YES", "on", "On", "ON"];
    const FALSE: &[&str] = &["n", "N", "no", "No", "NO", "off", "Off", "OFF"];
    if TRUE.contains(&s) {
        return Some("the boolean true".into());
    }
    if FALSE.contains(&s) {
        return Some("the boolean false".into());
    }
    let digits = s.strip_prefix(['-', '+']).unwrap_or(s);
    let numeric = !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit() || b == b'_');
    if numeric && digits.starts_with(|c: char| c.is_ascii_digit()) {
        if digits.contains('_') {
            return Some("an integer (YAML 1.1 allows `_` between digits)".into());
        }
        if digits.len() > 1 && digits.starts_with('0') {
            return Some("an octal integer".into());
        }
    }
    None
}

/// Whether `word` appears as a plain (unquoted) scalar value in `text`: after `key: `, after
/// `- `, or as a flow item, outside comments. A line-based reading, enough to tell `a: yes`
/// from `a: "yes"`.
fn appears_plain(text: &str, word: &str) -> bool {
    text.lines().any(|line| {
        let code = match line.find(" #") {
            Some(at) => &line[..at],
            None if line.trim_start().starts_with('#') => "",
            None => line,
        };
        code.split([',', '[', ']', '{', '}']).any(|piece| {
            let mut item = piece.trim();
            while let Some(rest) = item.strip_prefix("- ") {
                item = rest.trim_start();
            }
            if let Some((_, value)) = item.split_once(": ") {
                item = value.trim();
            }
            item == word
        })
    })
}

/// Refuses a values file whose plain scalars Helm reads otherwise than this CLI does (YAML 1.1
/// against 1.2: see [`yaml_1_1_reading`]), naming the key and the file: the CLI and
/// `helm template` must render a file alike or not at all.
pub(super) fn check_yaml_1_1(text: &str, tree: &Json, origin: &str) -> Result<(), ValuesError> {
    fn walk(text: &str, path: &mut Vec<String>, v: &Json, origin: &str) -> Result<(), ValuesError> {
        match v {
            Json::Object(m) => {
                for (k, item) in m {
                    path.push(if path.is_empty() {
                        k.clone()
                    } else {
                        format!(".{k}")
                    });
                    walk(text, path, item, origin)?;
                    path.pop();
                }
            }
            Json::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    path.push(format!("[{i}]"));
                    walk(text, path, item, origin)?;
                    path.pop();
                }
            }
            Json::String(s) => {
                if let Some(helm) = yaml_1_1_reading(s)
                    && appears_plain(text, s)
                {
                    return Err(ValuesError::Invalid {
                        key: path.concat(),
                        origin: origin.to_string(),
                        reason: format!(
                            "the plain value {s} is {helm} to Helm (YAML 1.1) and the string \
                             {s:?} to this CLI (YAML 1.2): write what you mean unambiguously \
                             (true or false, a decimal integer), or quote it to keep a string"
                        ),
                    });
                }
            }
            _ => {}
        }
        Ok(())
    }
    walk(text, &mut Vec::new(), tree, origin)
}
