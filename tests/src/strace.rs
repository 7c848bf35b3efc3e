//! System calls a running process (or one thread of it) makes over a window, counted by
//! `strace -c` attached to it and detached at the window's end: the benchmark's count of the
//! agent's `bpf()` calls per reconcile pass, and the tests' bound on it. strace slows the
//! traced calls down: a window it counts is never one whose time is measured.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use crate::{ChildGuard, names::TempDir};
use anyhow::{Context, bail};

/// `strace -c` attached to a process until [`Counter::finish`].
pub struct Counter {
    child: ChildGuard,
    out: PathBuf,
    _dir: TempDir,
}

impl Counter {
    /// Attaches to every thread of process `pid` (or to thread `pid` only, with `threads`
    /// false), counting the calls named in `calls` (strace's `-e trace=` list, e.g. `bpf`), and
    /// returns once strace reports it is attached.
    pub fn attach(pid: u32, threads: bool, calls: &str) -> anyhow::Result<Self> {
        let dir = TempDir::new()?;
        let out = dir.path().join("strace.txt");
        let mut cmd = Command::new("strace");
        if threads {
            cmd.arg("-f");
        }
        cmd.args(["-c", "-e"])
            .arg(format!("trace={calls}"))
            .arg("-o")
            .arg(&out)
            .arg("-p")
            .arg(pid.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = ChildGuard::spawn(&mut cmd).context("strace (Debian package strace)")?;
        let stderr = child.child_mut().stderr.take().context("strace's stderr")?;
        // strace says `Process N attached` once per thread, the threads given with -p first.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        let attached = format!("Process {pid} attached");
        loop {
            match rx.recv_timeout(Duration::from_millis(50)) {
                Ok(line) if line.contains(&attached) => break,
                Ok(_) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    bail!("strace exited before attaching to {pid}")
                }
            }
            if Instant::now() >= deadline {
                bail!("strace did not attach to {pid} within 10 s");
            }
        }
        // The other threads follow within the same burst of lines.
        std::thread::sleep(Duration::from_millis(200));
        Ok(Self {
            child,
            out,
            _dir: dir,
        })
    }

    /// Detaches (SIGINT to strace, by PID) and returns the calls counted, by name.
    pub fn finish(mut self) -> anyhow::Result<BTreeMap<String, u64>> {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.pid() as i32),
            nix::sys::signal::Signal::SIGINT,
        )?;
        self.child.wait_timeout(Duration::from_secs(10))?;
        parse_summary(&std::fs::read_to_string(&self.out)?)
    }
}

/// The calls per system call of `strace -c`'s table (columns `% time`, `seconds`,
/// `usecs/call`, `calls`, `errors` (may be empty), `syscall`; the `total` line left out).
pub fn parse_summary(text: &str) -> anyhow::Result<BTreeMap<String, u64>> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (Some(name), Some(calls)) = (fields.last(), fields.get(3)) else {
            continue;
        };
        if fields.len() < 5 || *name == "total" || fields[0].parse::<f64>().is_err() {
            continue;
        }
        let calls: u64 = calls
            .parse()
            .with_context(|| format!("strace summary line {line:?}"))?;
        out.insert((*name).to_string(), calls);
    }
    Ok(out)
}

/// Whether strace can be run here (`strace -V`).
pub fn available() -> bool {
    Command::new("strace")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// strace 6's table, with and without an errors column.
    #[test]
    fn summary_counts_per_call() {
        let text = "% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 97.91    0.051515           3     14336        12 bpf
  2.09    0.001100           1       700           close
------ ----------- ----------- --------- --------- ----------------
100.00    0.052615           3     15036        12 total
";
        let calls = parse_summary(text).unwrap();
        assert_eq!(calls.get("bpf"), Some(&14336));
        assert_eq!(calls.get("close"), Some(&700));
        assert_eq!(calls.len(), 2, "{calls:?}");
        assert!(parse_summary("").unwrap().is_empty());
    }
}
