//! The wall time of each phase of a long task (`cargo xtask test`: setup, build, lint, unit
//! tests, each privileged test binary, each guest kernel), kept as the phases run and printed
//! as one table at the end, whether the task passed or not.

use std::time::{Duration, Instant};

/// One phase that ran.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Phase {
    /// What it was (`unit`, `privileged: agent`, `vmtest: 6.1`, ...).
    pub name: String,
    /// How long it took, start to end.
    pub wall: Duration,
    /// Whether it passed.
    pub passed: bool,
}

/// The phases that ran, in the order they ran.
#[derive(Debug, Default)]
pub struct Phases {
    ran: Vec<Phase>,
}

impl Phases {
    /// Runs `f` as the phase `name`, records its wall time and outcome, and returns its result.
    pub fn run<T>(
        &mut self,
        name: &str,
        f: impl FnOnce() -> anyhow::Result<T>,
    ) -> anyhow::Result<T> {
        let start = Instant::now();
        let result = f();
        self.record(name, start.elapsed(), result.is_ok());
        result
    }

    /// Records a phase timed by its caller.
    pub fn record(&mut self, name: impl Into<String>, wall: Duration, passed: bool) {
        self.ran.push(Phase {
            name: name.into(),
            wall,
            passed,
        });
    }

    /// The phases as a table: name, wall time (`m:ss`), `ok` or `FAILED`; then their total.
    pub fn table(&self) -> String {
        const TOTAL: &str = "total";
        let name_width = self
            .ran
            .iter()
            .map(|p| p.name.len())
            .chain([TOTAL.len(), "phase".len()])
            .max()
            .unwrap_or_default();
        let total: Duration = self.ran.iter().map(|p| p.wall).sum();
        let wall_width = self
            .ran
            .iter()
            .map(|p| minutes(p.wall).len())
            .chain([minutes(total).len(), "wall".len()])
            .max()
            .unwrap_or_default();
        let mut out = format!("{:name_width$}  {:>wall_width$}  result\n", "phase", "wall");
        for p in &self.ran {
            out.push_str(&format!(
                "{:name_width$}  {:>wall_width$}  {}\n",
                p.name,
                minutes(p.wall),
                if p.passed { "ok" } else { "FAILED" }
            ));
        }
        out.push_str(&format!(
            "{TOTAL:name_width$}  {:>wall_width$}\n",
            minutes(total)
        ));
        out
    }
}

/// `m:ss`, whole seconds (`0:07`, `12:05`, `75:00`).
fn minutes(d: Duration) -> String {
    let s = d.as_secs();
    format!("{}:{:02}", s / 60, s % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_lists_each_phase_then_the_total() {
        let mut phases = Phases::default();
        phases.record("setup", Duration::from_millis(3_400), true);
        phases.record("privileged: agent", Duration::from_secs(725), false);
        phases.record("vmtest: 6.1", Duration::from_secs(4_500), true);
        assert_eq!(
            phases.table(),
            "phase               wall  result\n\
             setup               0:03  ok\n\
             privileged: agent  12:05  FAILED\n\
             vmtest: 6.1        75:00  ok\n\
             total              87:08\n"
        );
    }

    #[test]
    fn a_failed_phase_is_recorded_and_its_error_returned() {
        let mut phases = Phases::default();
        assert_eq!(phases.run("build", || Ok(7)).unwrap(), 7);
        let err = phases
            .run("unit", || -> anyhow::Result<()> {
                anyhow::bail!("2 tests failed")
            })
            .unwrap_err();
        assert_eq!(err.to_string(), "2 tests failed");
        let ran: Vec<(&str, bool)> = phases
            .ran
            .iter()
            .map(|p| (p.name.as_str(), p.passed))
            .collect();
        assert_eq!(ran, [("build", true), ("unit", false)]);
    }

    #[test]
    fn an_empty_run_has_a_zero_total() {
        assert_eq!(
            Phases::default().table(),
            "phase  wall  result\ntotal  0:00\n"
        );
    }
}
