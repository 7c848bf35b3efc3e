//! The `linkerd2-cni` Helm chart, embedded, and a renderer that runs its templates the way
//! `helm template` does: Go template syntax (the `gotmpl` crate), Helm/sprig functions, the
//! chart's `values.yaml` as defaults. The chart's files are the single source of truth for what
//! `linkerd install-cni` prints; the CLI adds only flag parsing and validation.
//!
//! Only the functions the chart uses are implemented, with sprig's semantics: `toYaml`,
//! `toJson`, `toString`, `quote`, `default`, `splitList`, `compact`, `trim`, `int64`, `dir`,
//! `hasPrefix`, `trimSuffix`, `indent`,
//! `nindent`, `list`, `fail` (plus Go's builtins: `printf`, `index`, `not`, `or`, `eq`, ...). A chart
//! change that needs another function fails the CLI's tests, which render the chart with both
//! this engine and Go's text/template + sprig and compare the objects.

use std::{collections::BTreeMap, sync::Arc};

use gotmpl::{MissingKey, Template, TemplateError, Value};
use serde_json::{Map, Value as Json};

/// The chart's name, as in `Chart.yaml`.
pub const CHART_NAME: &str = "linkerd2-cni";

/// The namespace the CLI renders the chart into by default, as Linkerd's `install-cni` does
/// (`--cni-namespace` chooses another, as Helm users do with `-n`; every template uses
/// `.Release.Namespace`).
pub const RELEASE_NAMESPACE: &str = linkerd_cni_k8s::names::CNI_NAMESPACE;

/// `.Release.Service` of the CLI's render. As Linkerd's CLI, "CLI" rather than Helm's "Helm":
/// the chart renders the Namespace object only then (Helm users create it with
/// `--create-namespace`).
pub const RELEASE_SERVICE: &str = "CLI";

/// `Chart.yaml`.
pub const CHART_YAML: &str = include_str!("../../deploy/charts/linkerd2-cni/Chart.yaml");

/// The templates, in the order their objects must be applied (Helm's install order by kind:
/// Namespace, ServiceAccount, ClusterRole(Binding), Role(Binding), ConfigMap, DaemonSet, then
/// the PodMonitor, a custom resource).
pub const TEMPLATES: &[(&str, &str)] = &[
    (
        "namespace.yaml",
        include_str!("../../deploy/charts/linkerd2-cni/templates/namespace.yaml"),
    ),
    (
        "serviceaccount.yaml",
        include_str!("../../deploy/charts/linkerd2-cni/templates/serviceaccount.yaml"),
    ),
    // Before the ClusterRole that grants `patch` on nodes: the narrowing is in force first.
    (
        "admissionpolicy.yaml",
        include_str!("../../deploy/charts/linkerd2-cni/templates/admissionpolicy.yaml"),
    ),
    (
        "rbac.yaml",
        include_str!("../../deploy/charts/linkerd2-cni/templates/rbac.yaml"),
    ),
    (
        "configmap.yaml",
        include_str!("../../deploy/charts/linkerd2-cni/templates/configmap.yaml"),
    ),
    (
        "daemonset.yaml",
        include_str!("../../deploy/charts/linkerd2-cni/templates/daemonset.yaml"),
    ),
    (
        "uninstall.yaml",
        include_str!("../../deploy/charts/linkerd2-cni/templates/uninstall.yaml"),
    ),
    (
        "podmonitor.yaml",
        include_str!("../../deploy/charts/linkerd2-cni/templates/podmonitor.yaml"),
    ),
];

/// Why the chart could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// `Chart.yaml` is not what the renderer expects (a bug in the chart).
    #[error("the embedded Chart.yaml is invalid: {0}")]
    ChartMeta(String),
    /// A template does not parse (a bug in the chart).
    #[error("parsing template {template}: {source}")]
    Parse {
        template: String,
        #[source]
        source: TemplateError,
    },
    /// A template failed while rendering (including the chart's own `fail`).
    #[error("rendering template {template}: {source}")]
    Execute {
        template: String,
        #[source]
        source: TemplateError,
    },
}

/// The fields of `Chart.yaml` the templates may use.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChartMeta {
    pub name: String,
    pub version: String,
    pub app_version: String,
}

/// Reads the embedded `Chart.yaml`.
pub fn chart_meta() -> Result<ChartMeta, RenderError> {
    serde_yaml_ng::from_str(CHART_YAML).map_err(|e| RenderError::ChartMeta(e.to_string()))
}

/// JSON to a template value (integers stay integers, as YAML-parsed values are in Go).
pub fn to_value(json: &Json) -> Value {
    match json {
        Json::Null => Value::Nil,
        Json::Bool(b) => Value::Bool(*b),
        Json::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => Value::Int(i),
            (None, Some(u), _) => Value::Uint(u),
            (None, None, f) => Value::Float(f.unwrap_or(f64::NAN)),
        },
        Json::String(s) => Value::String(Arc::from(s.as_str())),
        Json::Array(items) => Value::List(items.iter().map(to_value).collect()),
        Json::Object(map) => Value::Map(Arc::new(
            map.iter()
                .map(|(k, v)| (Arc::from(k.as_str()), to_value(v)))
                .collect::<BTreeMap<_, _>>(),
        )),
    }
}

/// A template value to JSON (functions become null).
pub fn to_json(value: &Value) -> Json {
    match value {
        Value::Nil | Value::Function(_) => Json::Null,
        Value::Bool(b) => Json::Bool(*b),
        Value::Int(i) => Json::from(*i),
        Value::Uint(u) => Json::from(*u),
        Value::Float(f) => serde_json::Number::from_f64(*f).map_or(Json::Null, Json::Number),
        Value::String(s) => Json::String(s.to_string()),
        Value::List(items) => Json::Array(items.iter().map(to_json).collect()),
        Value::Map(map) => Json::Object(
            map.iter()
                .map(|(k, v)| (k.to_string(), to_json(v)))
                .collect::<Map<_, _>>(),
        ),
    }
}

fn string(s: impl Into<Arc<str>>) -> Value {
    Value::String(s.into())
}

/// sprig's `strval`: strings as they are, anything else as Go's `%v` prints it.
fn strval(v: &Value) -> String {
    match v {
        Value::String(s) => s.to_string(),
        other => other.to_string(),
    }
}

/// sprig's `empty`: nil, false, zero, and empty strings, lists and maps.
fn is_empty(v: &Value) -> bool {
    match v {
        Value::Nil => true,
        Value::Bool(b) => !b,
        Value::Int(i) => *i == 0,
        Value::Uint(u) => *u == 0,
        Value::Float(f) => *f == 0.0,
        Value::String(s) => s.is_empty(),
        Value::List(l) => l.is_empty(),
        Value::Map(m) => m.is_empty(),
        Value::Function(_) => false,
    }
}

/// sprig's `int64` (spf13/cast's `ToInt64`): integers as they are, floats truncated, booleans
/// 1 or 0, strings parsed as Go's `strconv.ParseInt(s, 0, 64)` does after dropping a `.0...`
/// tail (so `0x10` is 16 and `010` is 8); anything else, or a string that does not parse, 0.
/// The CLI's validation accepts only decimal strings, which every reading agrees on.
fn to_int64(v: &Value) -> i64 {
    fn parse(s: &str) -> Option<i64> {
        let s = match s.split_once('.') {
            Some((int, frac)) if !frac.is_empty() && frac.bytes().all(|b| b == b'0') => int,
            _ => s,
        };
        let (neg, digits) = match s.strip_prefix('-') {
            Some(d) => (true, d),
            None => (false, s.strip_prefix('+').unwrap_or(s)),
        };
        let digits = digits.replace('_', "");
        let (radix, body) = if let Some(b) = digits
            .strip_prefix("0x")
            .or_else(|| digits.strip_prefix("0X"))
        {
            (16, b.to_string())
        } else if let Some(b) = digits
            .strip_prefix("0b")
            .or_else(|| digits.strip_prefix("0B"))
        {
            (2, b.to_string())
        } else if let Some(b) = digits
            .strip_prefix("0o")
            .or_else(|| digits.strip_prefix("0O"))
        {
            (8, b.to_string())
        } else if digits.len() > 1 && digits.starts_with('0') {
            (8, digits[1..].to_string())
        } else {
            (10, digits)
        };
        if body.is_empty() || body.starts_with(['+', '-']) {
            return None;
        }
        let magnitude = i128::from_str_radix(&body, radix).ok()?;
        i64::try_from(if neg { -magnitude } else { magnitude }).ok()
    }
    match v {
        Value::Int(i) => *i,
        // As Go converts: the bits of the uint64.
        Value::Uint(u) => *u as i64,
        Value::Float(f) => *f as i64,
        Value::Bool(b) => i64::from(*b),
        Value::String(s) => parse(s).unwrap_or(0),
        _ => 0,
    }
}

fn arg<'a>(name: &str, args: &'a [Value], i: usize, n: usize) -> Result<&'a Value, TemplateError> {
    if args.len() != n {
        return Err(TemplateError::ArgCount {
            name: name.into(),
            expected: n,
            got: args.len(),
        });
    }
    args.get(i).ok_or(TemplateError::ArgCount {
        name: name.into(),
        expected: n,
        got: args.len(),
    })
}

fn int_arg(name: &str, v: &Value) -> Result<usize, TemplateError> {
    v.as_int()
        .and_then(|i| usize::try_from(i).ok())
        .ok_or_else(|| {
            TemplateError::Exec(format!("{name}: expected a non-negative integer, got {v}"))
        })
}

fn indent(n: usize, s: &str) -> String {
    let pad = " ".repeat(n);
    format!("{pad}{}", s.replace('\n', &format!("\n{pad}")))
}

/// Go's `path.Dir` for the absolute, clean paths the values allow.
fn dir(p: &str) -> String {
    match p.trim_end_matches('/').rfind('/') {
        Some(0) => "/".into(),
        Some(i) => p[..i].into(),
        None => ".".into(),
    }
}

/// YAML as Helm's `toYaml` writes it: strings that a YAML 1.1 reader (kubectl, the API server)
/// would take for a boolean or a number are quoted. `serde_yaml_ng` follows YAML 1.2 and leaves
/// `off`, `yes`, `n`, `1_000` or `1:30` plain, which Kubernetes then reads as `false`, `true`,
/// `false`, `1000` and `90`.
fn to_yaml_1_1_safe(mut json: Json) -> Result<String, serde_yaml_ng::Error> {
    /// Appended to a string to quote (after it, so that map keys keep their order); plain in
    /// `serde_yaml_ng`'s output, and never in chart values.
    const MARK: char = '\u{E000}';
    fn yaml_1_1_ambiguous(s: &str) -> bool {
        const WORDS: &[&str] = &[
            "y", "Y", "yes", "Yes", "YES", "n", "N", "no", "No", "NO", "on", "On", "ON", "off",
            "Off", "OFF",
        ];
        let numeric_with = |extra: char| {
            s.contains(extra)
                && s.chars().any(|c| c.is_ascii_digit())
                && s.chars()
                    .all(|c| c.is_ascii_digit() || c == extra || "+-.".contains(c))
        };
        WORDS.contains(&s) || numeric_with('_') || numeric_with(':')
    }
    fn mark(v: &mut Json, marked: &mut Vec<String>) {
        match v {
            Json::String(s) if yaml_1_1_ambiguous(s) => {
                marked.push(s.clone());
                s.push(MARK);
            }
            Json::Array(items) => items.iter_mut().for_each(|i| mark(i, marked)),
            Json::Object(map) => {
                let entries = std::mem::take(map);
                for (mut k, mut item) in entries {
                    mark(&mut item, marked);
                    if yaml_1_1_ambiguous(&k) {
                        marked.push(k.clone());
                        k.push(MARK);
                    }
                    map.insert(k, item);
                }
            }
            _ => {}
        }
    }
    let mut marked = Vec::new();
    if !json.to_string().contains(MARK) {
        mark(&mut json, &mut marked);
    }
    let mut yaml = serde_yaml_ng::to_string(&json)?;
    marked.sort_by_key(|m| std::cmp::Reverse(m.len()));
    marked.dedup();
    for m in marked {
        // Longest first: a marked `on` must not be taken for a marked `n`.
        yaml = yaml.replace(&format!("{m}{MARK}"), &format!("'{m}'"));
    }
    Ok(yaml)
}

/// Registers the Helm/sprig functions the chart uses.
fn with_funcs(t: Template) -> Template {
    t.func("toYaml", |a| {
        let json = to_json(arg("toYaml", a, 0, 1)?);
        to_yaml_1_1_safe(json)
            .map(|yaml| string(yaml.trim_end_matches('\n')))
            .map_err(|e| TemplateError::Exec(format!("toYaml: {e}")))
    })
    .func("toJson", |a| {
        let json = to_json(arg("toJson", a, 0, 1)?);
        serde_json::to_string(&json)
            .map(string)
            .map_err(|e| TemplateError::Exec(format!("toJson: {e}")))
    })
    .func("toString", |a| {
        Ok(string(strval(arg("toString", a, 0, 1)?)))
    })
    .func("quote", |a| {
        let quoted: Vec<String> = a
            .iter()
            .filter(|v| !matches!(v, Value::Nil))
            .map(|v| serde_json::to_string(&strval(v)).unwrap_or_default())
            .collect();
        Ok(string(quoted.join(" ")))
    })
    .func("default", |a| {
        // `x | default d` calls `default d x`; a missing x is an empty value.
        let fallback = a.first().ok_or(TemplateError::ArgCount {
            name: "default".into(),
            expected: 2,
            got: 0,
        })?;
        match a.get(1) {
            Some(v) if !is_empty(v) => Ok(v.clone()),
            _ => Ok(fallback.clone()),
        }
    })
    .func("splitList", |a| {
        let sep = strval(arg("splitList", a, 0, 2)?);
        let s = strval(arg("splitList", a, 1, 2)?);
        Ok(Value::List(s.split(sep.as_str()).map(string).collect()))
    })
    .func("compact", |a| match arg("compact", a, 0, 1)? {
        Value::List(l) => Ok(Value::List(
            l.iter().filter(|v| !is_empty(v)).cloned().collect(),
        )),
        other => Err(TemplateError::Exec(format!(
            "compact: expected a list, got {other}"
        ))),
    })
    .func("int64", |a| {
        Ok(Value::Int(to_int64(arg("int64", a, 0, 1)?)))
    })
    .func("trim", |a| Ok(string(strval(arg("trim", a, 0, 1)?).trim())))
    .func("dir", |a| Ok(string(dir(&strval(arg("dir", a, 0, 1)?)))))
    // sprig's argument order: the prefix or suffix first, the string last (piped).
    .func("hasPrefix", |a| {
        let prefix = strval(arg("hasPrefix", a, 0, 2)?);
        Ok(Value::Bool(
            strval(arg("hasPrefix", a, 1, 2)?).starts_with(prefix.as_str()),
        ))
    })
    .func("trimSuffix", |a| {
        let suffix = strval(arg("trimSuffix", a, 0, 2)?);
        let s = strval(arg("trimSuffix", a, 1, 2)?);
        Ok(string(s.strip_suffix(suffix.as_str()).unwrap_or(&s)))
    })
    .func("indent", |a| {
        let n = int_arg("indent", arg("indent", a, 0, 2)?)?;
        Ok(string(indent(n, &strval(arg("indent", a, 1, 2)?))))
    })
    .func("nindent", |a| {
        let n = int_arg("nindent", arg("nindent", a, 0, 2)?)?;
        Ok(string(format!(
            "\n{}",
            indent(n, &strval(arg("nindent", a, 1, 2)?))
        )))
    })
    .func("list", |a| Ok(Value::List(a.into())))
    .func("fail", |a| {
        Err(TemplateError::Exec(strval(arg("fail", a, 0, 1)?)))
    })
}

/// The template name Helm gives a chart file.
pub fn template_name(file: &str) -> String {
    format!("{CHART_NAME}/templates/{file}")
}

/// Renders the chart with `values` (already merged with the chart's defaults) into the release
/// namespace `namespace`, as a multi-document YAML stream, each document headed `---` and
/// `# Source: <template>` like `helm template`'s output. Templates that render nothing are left
/// out.
pub fn render(values: &Json, namespace: &str) -> Result<String, RenderError> {
    let meta = chart_meta()?;
    let data = to_value(&serde_json::json!({
        "Values": values,
        "Chart": { "Name": meta.name, "Version": meta.version, "AppVersion": meta.app_version },
        "Release": { "Name": CHART_NAME, "Namespace": namespace, "Service": RELEASE_SERVICE },
    }));
    let mut out = String::new();
    for (file, source) in TEMPLATES {
        let name = template_name(file);
        let template = with_funcs(Template::new(&name))
            .missing_key(MissingKey::Error)
            .parse(source)
            .map_err(|source| RenderError::Parse {
                template: name.clone(),
                source,
            })?;
        let rendered =
            template
                .execute_to_string(&data)
                .map_err(|source| RenderError::Execute {
                    template: name.clone(),
                    source,
                })?;
        let rendered = rendered.trim();
        if !rendered.is_empty() {
            out.push_str(&format!("---\n# Source: {name}\n{rendered}\n"));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn run(src: &str, data: Json) -> String {
        with_funcs(Template::new("t"))
            .missing_key(MissingKey::Error)
            .parse(src)
            .unwrap_or_else(|e| panic!("parse {src}: {e}"))
            .execute_to_string(&to_value(&data))
            .unwrap_or_else(|e| panic!("execute {src}: {e}"))
    }

    /// Each function against what sprig/Helm print for the same input.
    #[test]
    fn functions_behave_like_sprig() {
        let cases: &[(&str, Json, &str)] = &[
            (
                r#"{{ .a | toJson }}"#,
                json!({"a": {"b": [1, "x"]}}),
                r#"{"b":[1,"x"]}"#,
            ),
            (
                r#"{{ .a | toYaml }}"#,
                json!({"a": [{"operator": "Exists"}]}),
                "- operator: Exists",
            ),
            (
                r#"{{ .a | toYaml }}"#,
                json!({"a": {"values": ["off", "yes", "n", "1_000", "1:30", "8080", "plain"], "on": "x"}}),
                "'on': x\nvalues:\n- 'off'\n- 'yes'\n- 'n'\n- '1_000'\n- '1:30'\n- '8080'\n- plain",
            ),
            (
                r#"{{ .a | toString | quote }}"#,
                json!({"a": 9990}),
                r#""9990""#,
            ),
            (
                r#"{{ quote .a .b }}"#,
                json!({"a": "x", "b": 1}),
                r#""x" "1""#,
            ),
            (
                r#"{{ .a | default "d" }}|{{ .b | default "d" }}"#,
                json!({"a": "", "b": "v"}),
                "d|v",
            ),
            (r#"{{ .a | default 5 }}"#, json!({"a": 0}), "5"),
            (
                r#"{{ range .a | splitList "," | compact }}[{{ trim . }}]{{ end }}"#,
                json!({"a": "1, 2,,3"}),
                "[1][2][3]",
            ),
            (r#"{{ len (splitList "," "") }}"#, json!({}), "1"),
            (
                r#"{{ dir .a }}|{{ dir "/x" }}|{{ dir "x" }}"#,
                json!({"a": "/run/l/agent.sock"}),
                "/run/l|/|.",
            ),
            (
                r#"a:{{ "x: 1\ny: 2" | nindent 2 }}"#,
                json!({}),
                "a:\n  x: 1\n  y: 2",
            ),
            (r#"{{ "x\ny" | indent 3 }}"#, json!({}), "   x\n   y"),
            (r#"{{ not .a | toJson }}"#, json!({"a": true}), "false"),
            (
                r#"{{ .a | int64 }} {{ .b | int64 }} {{ .c | int64 }} {{ .d | int64 }} {{ .e | int64 }}"#,
                json!({"a": "2102", "b": 4143.0, "c": -1, "d": "-7", "e": "abc"}),
                "2102 4143 -1 -7 0",
            ),
            (
                r#"{{ int64 "0x10" }} {{ int64 "010" }} {{ int64 "12.00" }} {{ int64 true }}"#,
                json!({}),
                "16 8 12 1",
            ),
            (
                r#"{{ printf "0.0.0.0:%v" .a }}"#,
                json!({"a": 9990}),
                "0.0.0.0:9990",
            ),
            (
                r#"{{ index .a "e-s" "r" }}"#,
                json!({"a": {"e-s": {"r": "1Gi"}}}),
                "1Gi",
            ),
        ];
        for (src, data, want) in cases {
            assert_eq!(run(src, data.clone()), *want, "template {src}");
        }
    }

    #[test]
    fn fail_stops_the_render_with_its_message() {
        let err = with_funcs(Template::new("t"))
            .parse(r#"{{ fail "boom" }}"#)
            .expect("parses")
            .execute_to_string(&to_value(&json!({})))
            .expect_err("fail must fail");
        assert!(err.to_string().contains("boom"), "{err}");
    }

    #[test]
    fn json_round_trips_through_template_values() {
        let j = json!({"a": [1, -2, 1.5, "s", true, null, {"b": u64::MAX}]});
        assert_eq!(to_json(&to_value(&j)), j);
    }
}
