//! `cargo xtask fuzz [--secs N] [--target NAME]...`: every cargo-fuzz target of `fuzz/` for N
//! seconds, one after another, each from its committed seeds (`fuzz/seeds/<target>`) plus the
//! corpus earlier runs grew (`target/fuzz/corpus/<target>`, never committed).
//!
//! cargo-fuzz drives libFuzzer, whose instrumentation needs `-Z` compiler flags: on the stable
//! toolchain they are allowed with `RUSTC_BOOTSTRAP=1`, set here for cargo-fuzz only (the rest
//! of the build never sees it). A crash leaves its input in `fuzz/artifacts/<target>/`; keep it
//! as a regression test in the crate it concerns (docs/developing/fuzzing.md).

use std::{
    fs,
    path::PathBuf,
    process::{Command, Stdio},
};

use anyhow::{Context, bail};

use crate::exec::workspace;

/// Every target, with the longest input libFuzzer makes for it (`-max_len`): the annotations
/// target needs inputs over the 16 KiB list limit to reach the refusal.
pub const TARGETS: &[(&str, usize)] = &[
    ("plugin_cni", 16 * 1024),
    ("wire_request", 16 * 1024),
    ("wire_response", 4 * 1024),
    ("annotations", 40 * 1024),
    ("conflist_patch", 16 * 1024),
    ("cni_template", 8 * 1024),
    ("cli_values", 4 * 1024),
];

/// What one target's run did.
pub struct Run {
    pub target: &'static str,
    pub execs: u64,
    pub ok: bool,
    pub log: PathBuf,
}

/// `cargo fuzz`, from the workspace root, with `-Z` flags allowed on the stable toolchain, in
/// the environment of a shell (see [`set_by_cargo_run`]).
fn cargo_fuzz() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(workspace())
        .env("RUSTC_BOOTSTRAP", "1")
        .arg("fuzz");
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(set_by_cargo_run) {
            cmd.env_remove(name);
        }
    }
    cmd
}

/// Whether `name` is one of the variables `cargo run` set for this task's own process (they
/// describe the xtask package) and a shell does not have.
///
/// Cargo compares the variables a build script asked to be re-run on
/// (`cargo:rerun-if-env-changed`) with its own environment, and `ring`'s build script asks
/// about `CARGO_MANIFEST_DIR`: inherited from here, it made the instrumented build of `ring`
/// and everything above it (rustls, kube, our crates: 15-20 minutes on two busy cores) stale
/// for a `cargo fuzz` started from a shell, and the shell's build stale for this task. Without
/// them both see the same environment and reuse one build in `target/fuzz`.
fn set_by_cargo_run(name: &str) -> bool {
    name.starts_with("CARGO_PKG_")
        || matches!(
            name,
            "CARGO_MANIFEST_DIR"
                | "CARGO_MANIFEST_PATH"
                | "CARGO_MANIFEST_LINKS"
                | "CARGO_CRATE_NAME"
                | "CARGO_BIN_NAME"
                | "CARGO_PRIMARY_PACKAGE"
                | "CARGO_RUSTC_CURRENT_DIR"
        )
}

/// Builds and runs each target (or those in `only`) for `secs` seconds; fails when a target
/// found a crash, a panic, a leak, a timeout or an out-of-memory.
pub fn fuzz(secs: u64, only: &[String]) -> anyhow::Result<Vec<Run>> {
    let root = workspace();
    let fuzz_dir = root.join("fuzz");
    let target_dir = root.join("target/fuzz");
    for name in only {
        if !TARGETS.iter().any(|(t, _)| t == name) {
            bail!("no fuzz target {name:?}; the targets: {}", names());
        }
    }
    let selected: Vec<(&'static str, usize)> = TARGETS
        .iter()
        .copied()
        .filter(|(t, _)| only.is_empty() || only.iter().any(|o| o == t))
        .collect();
    // `cargo fuzz run` builds what it runs: a separate `cargo fuzz build` of every target
    // uses other flags and would rebuild every dependency twice.
    let logs = target_dir.join("logs");
    fs::create_dir_all(&logs)?;
    let mut runs = Vec::new();
    for (target, max_len) in selected {
        let corpus = target_dir.join("corpus").join(target);
        fs::create_dir_all(&corpus)?;
        let log = logs.join(format!("{target}.log"));
        let mut cmd = cargo_fuzz();
        cmd.args(["run", "--fuzz-dir"])
            .arg(&fuzz_dir)
            .arg("--target-dir")
            .arg(&target_dir)
            .arg(target)
            // New inputs go to the first directory; the seeds are only read.
            .arg(&corpus)
            .arg(fuzz_dir.join("seeds").join(target))
            .arg("--")
            .arg(format!("-max_total_time={secs}"))
            .arg(format!("-max_len={max_len}"))
            // A single input may take this long (an unbounded loop is a finding)...
            .arg("-timeout=10")
            // ... and this much memory (an unbounded allocation is one too).
            .arg("-rss_limit_mb=2048")
            .arg("-print_final_stats=1")
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log)?);
        eprintln!("+ fuzz {target} for {secs} s (log: {})", log.display());
        let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
        let text = fs::read_to_string(&log).unwrap_or_default();
        let run = Run {
            target,
            execs: final_stat(&text, "stat::number_of_executed_units").unwrap_or(0),
            ok: status.success(),
            log,
        };
        eprintln!(
            "  {target}: {} executions, {}",
            run.execs,
            if run.ok {
                "nothing found"
            } else {
                "FOUND A FAILURE"
            }
        );
        if !run.ok {
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            for line in tail.into_iter().rev() {
                eprintln!("  | {line}");
            }
        }
        runs.push(run);
    }
    let failed: Vec<&str> = runs.iter().filter(|r| !r.ok).map(|r| r.target).collect();
    eprintln!("fuzz summary ({secs} s per target):");
    for r in &runs {
        eprintln!(
            "  {:<16} {:>12} executions  {}",
            r.target,
            r.execs,
            if r.ok {
                "ok".to_string()
            } else {
                format!("FAILED (log: {})", r.log.display())
            }
        );
    }
    if !failed.is_empty() {
        bail!(
            "fuzzing found failures in {}: the inputs are in fuzz/artifacts/<target>/",
            failed.join(", ")
        );
    }
    Ok(runs)
}

fn names() -> String {
    TARGETS
        .iter()
        .map(|(t, _)| *t)
        .collect::<Vec<_>>()
        .join(", ")
}

/// A `-print_final_stats=1` line's value, e.g. `stat::number_of_executed_units: 123`.
fn final_stat(log: &str, name: &str) -> Option<u64> {
    log.lines().rev().find_map(|l| {
        l.strip_prefix(name)?
            .trim_start_matches(':')
            .trim()
            .parse()
            .ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_target_is_listed_and_has_seeds() {
        let fuzz = workspace().join("fuzz");
        let manifest = fs::read_to_string(fuzz.join("Cargo.toml")).expect("fuzz/Cargo.toml");
        for (target, _) in TARGETS {
            assert!(
                manifest.contains(&format!("name = \"{target}\"")),
                "{target} is a [[bin]] of fuzz/Cargo.toml"
            );
            let seeds = fs::read_dir(fuzz.join("seeds").join(target))
                .unwrap_or_else(|e| panic!("fuzz/seeds/{target}: {e}"))
                .count();
            assert!(seeds > 0, "{target} has seeds");
        }
        let listed = manifest.matches("[[bin]]").count();
        assert_eq!(listed, TARGETS.len(), "every [[bin]] is in TARGETS");
    }

    /// `cargo test` sets `CARGO_MANIFEST_DIR` and `CARGO_PKG_NAME` for this test as `cargo run`
    /// does for the task: cargo-fuzz must not inherit them, or its build and a shell's
    /// invalidate each other (`ring`'s build script is re-run on `CARGO_MANIFEST_DIR`).
    #[test]
    fn cargo_fuzz_runs_without_the_tasks_own_cargo_variables() {
        assert!(std::env::var_os("CARGO_MANIFEST_DIR").is_some());
        assert!(std::env::var_os("CARGO_PKG_NAME").is_some());
        let cmd = cargo_fuzz();
        let envs: Vec<_> = cmd.get_envs().collect();
        for name in ["CARGO_MANIFEST_DIR", "CARGO_PKG_NAME", "CARGO_PKG_VERSION"] {
            assert!(
                envs.contains(&(std::ffi::OsStr::new(name), None)),
                "{name} is removed: {envs:?}"
            );
        }
        assert!(envs.contains(&(
            std::ffi::OsStr::new("RUSTC_BOOTSTRAP"),
            Some(std::ffi::OsStr::new("1"))
        )));
        // What the user set for cargo is kept.
        for name in [
            "CARGO_HOME",
            "CARGO_TARGET_DIR",
            "CARGO_BUILD_JOBS",
            "RUSTFLAGS",
        ] {
            assert!(!set_by_cargo_run(name), "{name} is kept");
        }
    }

    #[test]
    fn reads_the_final_stats() {
        let log = "#123 DONE cov: 1\nstat::number_of_executed_units: 4567\nstat::peak_rss_mb: 80\n";
        assert_eq!(
            final_stat(log, "stat::number_of_executed_units"),
            Some(4567)
        );
        assert_eq!(
            final_stat("crashed", "stat::number_of_executed_units"),
            None
        );
    }
}
