//! What every check of `linkerd check` produces, and how it is printed: Linkerd's table
//! (`√` / `×` lines under an underlined title), its `short` form (only what did not pass) or
//! its JSON document (`-o json`: categories, each with its checks' description, result,
//! error and hint).

use std::io::Write;

use serde::Serialize;

/// Where Linkerd documents each check; a check's hint is this plus its anchor.
pub const HINT_BASE_URL: &str = "https://linkerd.io/2/checks/#";

/// The category the linkerd-cni checks of the cluster are printed under (Linkerd's name): the
/// DaemonSet's (`super::cluster`) and the pods' redirection (`super::redirection`).
pub const CNI_PLUGIN_CATEGORY: &str = "linkerd-cni-plugin";

/// Outcome of one check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Passed.
    Ok,
    /// Passed with something worth attention.
    Warn,
    /// Failed.
    Fail,
    /// Not applicable in this configuration.
    Skipped,
}

/// One check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckResult {
    /// Category (`linkerd-config`, `linkerd-cni`...), the title it is printed under.
    pub category: &'static str,
    /// What is checked, as printed after the mark.
    pub name: String,
    /// Outcome.
    pub status: Status,
    /// Details or the way out (may be empty).
    pub detail: String,
    /// Anchor of Linkerd's documentation of this check (see [`HINT_BASE_URL`]), if any.
    pub hint_anchor: Option<&'static str>,
}

impl CheckResult {
    /// A result of any status.
    pub fn new(
        category: &'static str,
        name: impl Into<String>,
        status: Status,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            category,
            name: name.into(),
            status,
            detail: detail.into(),
            hint_anchor: None,
        }
    }

    /// The same result, pointing at Linkerd's documentation of the check.
    pub fn with_hint(mut self, anchor: &'static str) -> Self {
        self.hint_anchor = Some(anchor);
        self
    }

    /// The documentation URL of this check, if it has one.
    pub fn hint_url(&self) -> Option<String> {
        self.hint_anchor.map(|a| format!("{HINT_BASE_URL}{a}"))
    }

    /// A passed check.
    pub fn ok(category: &'static str, name: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::new(category, name, Status::Ok, detail)
    }

    /// A failed check, with why.
    pub fn fail(category: &'static str, name: impl Into<String>, why: impl Into<String>) -> Self {
        Self::new(category, name, Status::Fail, why)
    }

    /// Passed (`Ok(detail)`) or failed (`Err(why)`).
    pub fn from_outcome(
        category: &'static str,
        name: impl Into<String>,
        outcome: Result<String, String>,
    ) -> Self {
        match outcome {
            Ok(detail) => Self::ok(category, name, detail),
            Err(why) => Self::fail(category, name, why),
        }
    }

    /// Whether the check did not fail (warnings and skipped checks pass).
    pub fn passed(&self) -> bool {
        self.status != Status::Fail
    }
}

/// Prints one category of results, Linkerd style.
pub fn print_category(
    out: &mut impl Write,
    title: &str,
    results: &[CheckResult],
) -> std::io::Result<()> {
    print_results(out, title, results, false)
}

/// Prints a category in the table form; `short` leaves out what passed (and the whole category
/// when everything did).
fn print_results(
    out: &mut impl Write,
    title: &str,
    results: &[CheckResult],
    short: bool,
) -> std::io::Result<()> {
    let shown: Vec<&CheckResult> = results
        .iter()
        .filter(|r| !short || matches!(r.status, Status::Fail | Status::Warn))
        .collect();
    if short && shown.is_empty() {
        return Ok(());
    }
    writeln!(out, "{title}")?;
    writeln!(out, "{}", "-".repeat(title.chars().count()))?;
    for r in shown {
        let name = &r.name;
        let detail = &r.detail;
        match r.status {
            Status::Ok if detail.is_empty() => writeln!(out, "√ {name}")?,
            Status::Ok => writeln!(out, "√ {name} ({detail})")?,
            Status::Warn => writeln!(out, "√ {name} (warning: {detail})")?,
            Status::Skipped => writeln!(out, "√ {name} (skipped: {detail})")?,
            Status::Fail => {
                writeln!(out, "× {name}")?;
                for line in detail.lines() {
                    writeln!(out, "    {line}")?;
                }
                if let Some(url) = r.hint_url() {
                    writeln!(out, "    see {url} for hints")?;
                }
            }
        }
    }
    writeln!(out)
}

/// Output formats of `linkerd check -o`, Linkerd's names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// Every check, by category.
    Table,
    /// One JSON document at the end.
    Json,
    /// Only the checks that did not pass.
    Short,
}

/// `-o json`: Linkerd's document.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct JsonOutput {
    pub success: bool,
    pub categories: Vec<JsonCategory>,
}

/// One category of the JSON document.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct JsonCategory {
    #[serde(rename = "categoryName")]
    pub name: String,
    pub checks: Vec<JsonCheck>,
}

/// One check of the JSON document: `result` is `success`, `warning` or `error`; `error` says
/// why when it is not a success. Skipped checks are left out, as Linkerd leaves them out.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct JsonCheck {
    pub description: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub result: &'static str,
}

impl From<&CheckResult> for Option<JsonCheck> {
    fn from(r: &CheckResult) -> Self {
        let (result, failed) = match r.status {
            Status::Ok => ("success", false),
            Status::Warn => ("warning", true),
            Status::Fail => ("error", true),
            Status::Skipped => return None,
        };
        Some(JsonCheck {
            description: r.name.clone(),
            hint: if failed { r.hint_url() } else { None },
            error: failed.then(|| r.detail.clone()),
            result,
        })
    }
}

/// Prints categories as they complete (table, short) or all at the end (JSON), then the
/// summary; remembers whether everything passed.
pub struct Printer<W: Write> {
    out: W,
    format: OutputFormat,
    categories: Vec<JsonCategory>,
    success: bool,
}

impl<W: Write> Printer<W> {
    /// A printer writing to `out` in `format`.
    pub fn new(out: W, format: OutputFormat) -> Self {
        Self {
            out,
            format,
            categories: Vec::new(),
            success: true,
        }
    }

    /// One category's results.
    pub fn category(&mut self, title: &str, results: &[CheckResult]) -> std::io::Result<()> {
        self.success &= results.iter().all(CheckResult::passed);
        match self.format {
            OutputFormat::Table => print_results(&mut self.out, title, results, false),
            OutputFormat::Short => print_results(&mut self.out, title, results, true),
            OutputFormat::Json => {
                let checks: Vec<JsonCheck> = results
                    .iter()
                    .filter_map(Option::<JsonCheck>::from)
                    .collect();
                match self.categories.iter_mut().find(|c| c.name == title) {
                    Some(c) => c.checks.extend(checks),
                    // A category whose checks were all skipped is left out, as in Linkerd's.
                    None if checks.is_empty() => {}
                    None => self.categories.push(JsonCategory {
                        name: title.to_string(),
                        checks,
                    }),
                }
                Ok(())
            }
        }
    }

    /// Whether every check printed so far passed.
    pub fn success(&self) -> bool {
        self.success
    }

    /// Prints the summary line (table, short) or the JSON document; returns whether every
    /// check passed.
    pub fn finish(mut self) -> std::io::Result<bool> {
        match self.format {
            OutputFormat::Json => {
                let doc = JsonOutput {
                    success: self.success,
                    categories: std::mem::take(&mut self.categories),
                };
                let text = serde_json::to_string_pretty(&doc).map_err(std::io::Error::other)?;
                writeln!(self.out, "{text}")?;
            }
            OutputFormat::Table | OutputFormat::Short => writeln!(
                self.out,
                "Status check results are {}",
                if self.success { "√" } else { "×" }
            )?,
        }
        self.out.flush()?;
        Ok(self.success)
    }
}
