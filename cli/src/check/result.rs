//! What every check of `linkerd check` produces, and how a category of them is printed
//! (Linkerd style: `√` / `×` lines under an underlined title).

use std::io::Write;

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
        }
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
    writeln!(out, "{title}")?;
    writeln!(out, "{}", "-".repeat(title.chars().count()))?;
    for r in results {
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
            }
        }
    }
    writeln!(out)
}
