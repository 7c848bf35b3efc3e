//! The privileged test binaries (`tests/tests/*.rs`: real BPF, netns, cgroups), one at a time,
//! each under a time limit. A test that hangs (a process stuck in the kernel, a peer that never
//! answers) is killed with its whole process group and reported with what the kernel shows
//! about stuck tasks, and the run goes on to the next binary; the task fails at the end. A
//! killed binary cleans nothing up: its netns, cgroups, bpffs pins and scratch directories
//! (all named `l5dt-<pid>-*`) stay for inspection.

use std::{
    fs,
    os::unix::process::CommandExt,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};

use crate::{
    build::{image, target::Arch},
    exec::{cargo, run, workspace},
    phases::Phases,
};

/// Longest any one test binary may run (the slowest takes a few minutes), unless
/// `LINKERD_CNI_TEST_LIMIT_SECS` says otherwise.
const LIMIT: Duration = Duration::from_secs(15 * 60);

pub fn limit() -> Duration {
    std::env::var("LINKERD_CNI_TEST_LIMIT_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(LIMIT, Duration::from_secs)
}

/// The privileged test binaries, by name (`cargo test --test <name>`).
fn binaries() -> anyhow::Result<Vec<String>> {
    let dir = workspace().join("tests/tests");
    let mut names = Vec::new();
    for entry in fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "rs")
            && let Some(stem) = path.file_stem()
        {
            names.push(stem.to_string_lossy().into_owned());
        }
    }
    names.sort();
    Ok(names)
}

/// The image archive the DaemonSet test (`tests/tests/daemonset.rs`) imports and runs.
const IMAGE_ENV: &str = "LINKERD_CNI_TEST_IMAGE";

/// Builds every privileged test binary and the DaemonSet's image for this machine (`cargo
/// xtask image`, named by [`IMAGE_ENV`]), then runs each binary (`args` passed to `cargo
/// test`, tests one at a time) under [`limit`], recording each step's wall time in `phases`.
pub fn test(args: &[String], phases: &mut Phases) -> anyhow::Result<()> {
    phases.run("privileged: build", || {
        run(cargo().args(["test", "-p", "linkerd-cni-tests", "--no-run"]))
    })?;
    let arch = Arch::host().context("no image for this machine's architecture")?;
    let (_, archives) = phases.run("image", || {
        image::image(&workspace().join("target/image"), &[arch])
    })?;
    let image = archives
        .first()
        .context("`cargo xtask image` wrote no archive")?;
    let limit = limit();
    let mut failed = Vec::new();
    for name in binaries()? {
        let mut cmd = cargo();
        cmd.args(["test", "-p", "linkerd-cni-tests", "--test", &name])
            .args(args)
            .args(["--", "--test-threads=1"])
            .env(IMAGE_ENV, image)
            .process_group(0);
        eprintln!("+ {cmd:?}");
        let start = Instant::now();
        let mut child = cmd.spawn().with_context(|| format!("starting {cmd:?}"))?;
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break Some(status);
            }
            if start.elapsed() > limit {
                break None;
            }
            std::thread::sleep(Duration::from_millis(500));
        };
        phases.record(
            format!("privileged: {name}"),
            start.elapsed(),
            status.is_some_and(|s| s.success()),
        );
        let took = start.elapsed().as_secs();
        match status {
            Some(s) if s.success() => eprintln!("xtask: test binary {name}: passed in {took} s"),
            Some(s) => {
                eprintln!("xtask: test binary {name}: FAILED ({s}) after {took} s");
                failed.push(name);
            }
            None => {
                eprintln!(
                    "xtask: test binary {name}: still running after {} s: killed",
                    limit.as_secs()
                );
                stuck_tasks();
                let _ = Command::new("kill")
                    .args(["-KILL", "--", &format!("-{}", child.id())])
                    .status();
                let _ = child.wait();
                failed.push(format!("{name} (hung)"));
            }
        }
    }
    if !failed.is_empty() {
        bail!("privileged test binaries failed: {}", failed.join(", "));
    }
    Ok(())
}

/// Prints the tasks in uninterruptible sleep (`D`) and the kernel stacks of a few of them:
/// what a hang inside the kernel looks like from outside.
fn stuck_tasks() {
    let Ok(procs) = fs::read_dir("/proc") else {
        return;
    };
    let mut stuck = Vec::new();
    for entry in procs.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // "pid (comm) S ...": the state follows the last ')'.
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        if rest.trim_start().starts_with('D') {
            let comm = stat
                .split_once('(')
                .and_then(|(_, r)| r.rsplit_once(')'))
                .map_or("", |(c, _)| c);
            stuck.push((pid, comm.to_string()));
        }
    }
    eprintln!("xtask: {} tasks in D state", stuck.len());
    for (pid, comm) in stuck.iter().take(8) {
        let stack = fs::read_to_string(format!("/proc/{pid}/stack")).unwrap_or_default();
        eprintln!("xtask: D task {pid} ({comm}):\n{stack}");
    }
}
