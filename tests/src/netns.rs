//! Named network namespaces that vanish when the test is done.
//!
//! A [`NetnsGuard`] is made with `ip netns add`, so it shows in `ip netns list` and has a
//! stable path (`/run/netns/<name>`) that can be handed to the agent or a CNI plugin exactly
//! like a container runtime's netns path. Code runs inside it on a fresh thread
//! ([`NetnsGuard::run_in`]); a socket keeps the netns it was created in, so the usual pattern
//! for a server is to bind inside `run_in` and serve from any thread.

use std::{
    fs::File,
    os::{
        fd::{AsFd, AsRawFd, OwnedFd},
        unix::{fs::MetadataExt, process::CommandExt},
    },
    path::{Path, PathBuf},
    process::Command,
};

use nix::sched::{CloneFlags, setns};

use crate::{
    error::{Error, IoContext, Result},
    names::{self, run},
};

pub use crate::hostfs::NETNS_RUN_DIR;

/// A named network namespace with `lo` up, deleted on drop.
#[derive(Debug)]
pub struct NetnsGuard {
    name: String,
    path: PathBuf,
}

impl NetnsGuard {
    /// Creates a fresh netns named `l5dt-<pid>-<n>` and brings `lo` up in it.
    pub fn new() -> Result<Self> {
        names::reap_stale();
        let name = names::unique_name();
        run(Command::new("ip").args(["netns", "add", &name]))?;
        // From here on, dropping the guard deletes the netns, also if the next step fails.
        let guard = NetnsGuard {
            path: Path::new(NETNS_RUN_DIR).join(&name),
            name,
        };
        run(Command::new("ip").args(["-n", &guard.name, "link", "set", "lo", "up"]))?;
        Ok(guard)
    }

    /// The name, as `ip netns list` shows it (usable with `ip -n <name>`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The bind-mounted netns file, as a container runtime hands it to CNI plugins.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens the netns file (for `setns`, or to attach programs to the netns).
    pub fn open(&self) -> Result<File> {
        File::open(&self.path).ctx(|| format!("opening {}", self.path.display()))
    }

    /// The netns inode number: what `/proc/<pid>/ns/net` of a process inside points at.
    pub fn inode(&self) -> Result<u64> {
        Ok(std::fs::metadata(&self.path)
            .ctx(|| format!("stat {}", self.path.display()))?
            .ino())
    }

    /// Runs `f` on a fresh thread that has joined this netns, and returns its result.
    /// A panic in `f` is propagated to the caller.
    pub fn run_in<F, T>(&self, f: F) -> Result<T>
    where
        F: FnOnce() -> T + Send,
        T: Send,
    {
        let fd = OwnedFd::from(self.open()?);
        std::thread::scope(|scope| {
            let handle = scope.spawn(move || -> Result<T> {
                setns(fd.as_fd(), CloneFlags::CLONE_NEWNET)
                    .map_err(|e| Error::io("setns into the test netns", e.into()))?;
                Ok(f())
            });
            match handle.join() {
                Ok(result) => result,
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    }

    /// A `Command` whose child joins this netns before `exec` (as root, like `ip netns exec`
    /// without the extra mount namespace). For a child with another UID, or in a cgroup, use
    /// [`crate::child::Placement`].
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Result<Command> {
        let fd = OwnedFd::from(self.open()?);
        let mut cmd = Command::new(program);
        // SAFETY: the closure only calls setns(2), which is async-signal-safe, on an fd that
        // the closure owns and that stays open until the Command is dropped.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        Ok(cmd)
    }

    /// Runs `program args...` inside the netns to completion and returns its stdout; fails
    /// with its stderr when it exits unsuccessfully.
    pub fn exec<I, S>(&self, program: &str, args: I) -> Result<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        run(self.command(program)?.args(args))
    }

    /// The netns cookie (what `bpf_get_netns_cookie` returns for sockets of this netns).
    ///
    /// # Minimum kernel version
    /// 5.14 (`SO_NETNS_COOKIE`).
    pub fn cookie(&self) -> Result<u64> {
        self.run_in(current_netns_cookie)?
    }
}

impl Drop for NetnsGuard {
    fn drop(&mut self) {
        if let Err(e) = run(Command::new("ip").args(["netns", "del", &self.name])) {
            eprintln!("linkerd-cni-tests: cannot delete netns {}: {e}", self.name);
        }
    }
}

/// The netns cookie of the calling thread's network namespace, read with
/// `getsockopt(SO_NETNS_COOKIE)` on a socket made here.
pub fn current_netns_cookie() -> Result<u64> {
    linkerd_cni_sys::sock::current_netns_cookie()
        .map_err(|e| Error::io("getsockopt(SO_NETNS_COOKIE)", e))
}

/// Names of the netns `ip netns list` shows.
pub fn list() -> Result<Vec<String>> {
    let out = run(Command::new("ip").args(["netns", "list"]))?;
    Ok(out
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect())
}
