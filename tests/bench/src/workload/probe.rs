//! `linkerd-cni-bench probe`: tells whether a pod's outbound redirection is in force, from
//! inside the pod (its cgroup and netns), without starting a process per check.
//!
//! Reads lines `<cgroup dir> <netns path>` on stdin; for each it moves itself into the cgroup,
//! enters the netns, connects to `192.0.2.1:80` (no route in a bare pod) and answers
//! `redirected` (the connect was rewritten to the proxy port, where nothing listens:
//! connection refused), `direct` (network unreachable: nothing rewrote it) or `other <error>`,
//! then moves back to its home cgroup so the pod's cgroup can be removed.

use std::{
    fs::File,
    io::{BufRead, Write},
    net::{SocketAddr, TcpStream},
    path::Path,
    time::Duration,
};

use nix::sched::{CloneFlags, setns};

fn join_cgroup(dir: &Path) -> std::io::Result<()> {
    std::fs::write(dir.join("cgroup.procs"), b"0\n")
}

fn check(cgroup: &Path, netns: &Path) -> String {
    if let Err(e) = join_cgroup(cgroup) {
        return format!("other joining the cgroup: {e}");
    }
    let ns = match File::open(netns) {
        Ok(f) => f,
        Err(e) => return format!("other opening the netns: {e}"),
    };
    if let Err(e) = setns(&ns, CloneFlags::CLONE_NEWNET) {
        return format!("other setns: {e}");
    }
    let target = SocketAddr::from(([192, 0, 2, 1], 80));
    match TcpStream::connect_timeout(&target, Duration::from_secs(1)) {
        Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => "redirected".into(),
        Err(e) if e.raw_os_error() == Some(libc::ENETUNREACH) => "direct".into(),
        Err(e) => format!("other {e}"),
        Ok(_) => "other connected".into(),
    }
}

/// Serves checks until stdin closes. Must be single-threaded (cgroup moves and setns apply
/// to the whole process only then).
pub fn run(home: &Path) -> anyhow::Result<()> {
    let root_ns = File::open("/proc/self/ns/net")?;
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    for line in stdin.lock().lines() {
        let line = line?;
        let Some((cg, ns)) = line.split_once(' ') else {
            continue;
        };
        let answer = check(Path::new(cg), Path::new(ns));
        join_cgroup(home)?;
        setns(&root_ns, CloneFlags::CLONE_NEWNET)?;
        writeln!(out, "{answer}")?;
        out.flush()?;
    }
    Ok(())
}
