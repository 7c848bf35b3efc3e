//! The results of a run and their renderings: `BENCHMARKS.md` (tables, ratios, goals, the
//! machine, the exact command), `tests/bench/results.json` (everything, raw samples included) and
//! `tests/bench/chart.svg` (the main comparisons, hand-drawn).
//!
//! [`results`] holds what a run produced, [`traffic_goals`] and [`goals`] judge it,
//! [`markdown`] and [`svg`] render it.

mod goals;
mod markdown;
mod results;
mod svg;
#[cfg(test)]
mod tests;
mod traffic_goals;

use std::path::Path;

pub use goals::*;
pub use markdown::*;
pub use results::*;
pub use svg::*;
pub use traffic_goals::*;

/// Writes BENCHMARKS.md, tests/bench/results.json and tests/bench/chart.svg under `root`.
pub fn write(root: &Path, r: &Results) -> anyhow::Result<()> {
    std::fs::create_dir_all(root.join("bench"))?;
    std::fs::write(
        root.join("tests/bench/results.json"),
        serde_json::to_string_pretty(r)? + "\n",
    )?;
    std::fs::write(root.join("tests/bench/chart.svg"), svg(r))?;
    std::fs::write(root.join("BENCHMARKS.md"), markdown(r))?;
    Ok(())
}
