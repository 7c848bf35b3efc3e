//! Child processes placed like a container's: in a given netns and cgroup, as a given UID/GID,
//! killed (by PID) on drop.
//!
//! The placement is done between `fork` and `exec` (`pre_exec`), in this order: join the cgroup
//! (write `0` to its `cgroup.procs`), join the user namespace if one is given (`setns`; UIDs
//! and GIDs below are then the namespace's), join the netns (`setns`), drop supplementary
//! groups, set the GID, set the UID. Everything the child needs is opened beforehand, so the pre-exec code
//! only makes async-signal-safe system calls.

use std::{
    fs::{File, OpenOptions},
    io::Read,
    os::{
        fd::{AsRawFd, OwnedFd},
        unix::{ffi::OsStrExt, process::CommandExt},
    },
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Output},
    time::{Duration, Instant},
};

use crate::{
    cgroup::CgroupGuard,
    error::{Error, IoContext, Result},
    netns::NetnsGuard,
};

/// Where and as whom a child process runs.
#[derive(Debug, Clone, Default)]
pub struct Placement {
    userns: Option<PathBuf>,
    netns: Option<PathBuf>,
    cgroup: Option<PathBuf>,
    uid: Option<u32>,
    gid: Option<u32>,
    groups: Vec<u32>,
}

impl Placement {
    /// Runs where and as whom the caller runs.
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs inside `netns`.
    pub fn netns(self, netns: &NetnsGuard) -> Self {
        self.netns_path(netns.path())
    }

    /// Runs inside the netns at `path` (any netns file: `/run/netns/x`, `/proc/<pid>/ns/net`).
    pub fn netns_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.netns = Some(path.into());
        self
    }

    /// Runs inside the user namespace at `path` (`/proc/<pid>/ns/user`): the UID and GID given
    /// are then IDs of that namespace (a user-namespaced pod's container).
    pub fn userns_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.userns = Some(path.into());
        self
    }

    /// Runs inside `cgroup`.
    pub fn cgroup(self, cgroup: &CgroupGuard) -> Self {
        self.cgroup_path(cgroup.path())
    }

    /// Runs inside the cgroup (v2) directory `path`.
    pub fn cgroup_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.cgroup = Some(path.into());
        self
    }

    /// Runs as `uid`, with primary group `uid` too unless [`Placement::gid`] says otherwise,
    /// and no supplementary groups unless [`Placement::groups`] gives some.
    pub fn uid(mut self, uid: u32) -> Self {
        self.uid = Some(uid);
        self
    }

    /// Runs with primary group `gid`.
    pub fn gid(mut self, gid: u32) -> Self {
        self.gid = Some(gid);
        self
    }

    /// Runs with these supplementary groups (only applied with a UID or GID set).
    pub fn groups(mut self, groups: impl IntoIterator<Item = u32>) -> Self {
        self.groups = groups.into_iter().collect();
        self
    }

    /// The UID the child will have, if changed.
    pub fn get_uid(&self) -> Option<u32> {
        self.uid
    }

    /// The GID the child will have, if changed (defaults to the UID when only that is set).
    pub fn get_gid(&self) -> Option<u32> {
        self.gid.or(self.uid)
    }

    /// The netns the child will join, if any.
    pub fn get_netns(&self) -> Option<&Path> {
        self.netns.as_deref()
    }

    /// The cgroup the child will join, if any.
    pub fn get_cgroup(&self) -> Option<&Path> {
        self.cgroup.as_deref()
    }

    /// A `Command` for `program` with this placement applied. When the child runs as another
    /// UID and `program` is a path that UID cannot reach (a checkout under a 0700 home), the
    /// command runs a copy it can ([`crate::bins::runnable_as`]).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Result<Command> {
        let program = program.as_ref();
        let mut cmd = match self.uid {
            Some(uid) if program.as_bytes().contains(&b'/') => {
                Command::new(crate::bins::runnable_as(
                    Path::new(program),
                    uid,
                    self.get_gid().unwrap_or(uid),
                    &self.groups,
                )?)
            }
            _ => Command::new(program),
        };
        self.configure(&mut cmd)?;
        Ok(cmd)
    }

    /// Applies this placement to `cmd` (adds a `pre_exec` step; do not also use
    /// `Command::uid`/`gid`, which std applies before `pre_exec`, i.e. too early for `setns`).
    pub fn configure(&self, cmd: &mut Command) -> Result<()> {
        let procs: Option<OwnedFd> = match &self.cgroup {
            Some(cg) => {
                let file = cg.join("cgroup.procs");
                Some(OwnedFd::from(
                    OpenOptions::new()
                        .write(true)
                        .open(&file)
                        .ctx(|| format!("opening {}", file.display()))?,
                ))
            }
            None => None,
        };
        let userns: Option<OwnedFd> = match &self.userns {
            Some(ns) => Some(OwnedFd::from(
                File::open(ns).ctx(|| format!("opening {}", ns.display()))?,
            )),
            None => None,
        };
        let netns: Option<OwnedFd> = match &self.netns {
            Some(ns) => Some(OwnedFd::from(
                File::open(ns).ctx(|| format!("opening {}", ns.display()))?,
            )),
            None => None,
        };
        let uid = self.uid;
        let gid = self.get_gid();
        let groups: Vec<libc::gid_t> = self.groups.clone();
        // SAFETY: the closure owns everything it touches (fds opened above, plain integers, a
        // vector it only reads) and makes only async-signal-safe system calls, no allocation.
        unsafe {
            cmd.pre_exec(move || {
                if let Some(fd) = &procs {
                    // "0" moves the writing process.
                    if libc::write(fd.as_raw_fd(), b"0\n".as_ptr().cast(), 2) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                if let Some(fd) = &userns
                    && libc::setns(fd.as_raw_fd(), libc::CLONE_NEWUSER) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                if let Some(fd) = &netns
                    && libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                if (uid.is_some() || gid.is_some())
                    && libc::setgroups(groups.len(), groups.as_ptr()) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                if let Some(gid) = gid
                    && libc::setgid(gid) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                if let Some(uid) = uid
                    && libc::setuid(uid) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        Ok(())
    }

    /// Spawns `cmd` with this placement (`cmd`'s program must be reachable by the UID given:
    /// [`Placement::command`] sees to that for paths that may lie under a checkout).
    pub fn spawn(&self, cmd: &mut Command) -> Result<ChildGuard> {
        self.configure(cmd)?;
        ChildGuard::spawn(cmd)
    }
}

/// A child process that is killed (SIGKILL, by its PID) and reaped on drop.
#[derive(Debug)]
pub struct ChildGuard {
    child: Child,
    what: String,
    done: bool,
}

impl ChildGuard {
    /// Spawns `cmd`.
    pub fn spawn(cmd: &mut Command) -> Result<Self> {
        let what = format!("{:?}", cmd.get_program());
        let child = cmd.spawn().ctx(|| format!("spawning {cmd:?}"))?;
        Ok(ChildGuard {
            child,
            what,
            done: false,
        })
    }

    /// The child's PID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The underlying `std::process::Child` (e.g. to take its stdin).
    pub fn child_mut(&mut self) -> &mut Child {
        &mut self.child
    }

    /// The exit status, if the child has exited (reaps it).
    pub fn try_wait(&mut self) -> Result<Option<ExitStatus>> {
        let status = self
            .child
            .try_wait()
            .ctx(|| format!("waiting for {}", self.what))?;
        if status.is_some() {
            self.done = true;
        }
        Ok(status)
    }

    /// Waits up to `timeout` for the child to exit; kills it and fails otherwise.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Result<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_wait()? {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                self.kill();
                return Err(Error::Timeout {
                    what: self.what.clone(),
                    timeout,
                    detail: String::new(),
                });
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits up to `timeout` for the child to exit and collects what it wrote to its piped
    /// stdout and stderr (pipes that were not requested read as empty). On timeout the child
    /// is killed and the error carries its stderr so far.
    pub fn wait_output(mut self, timeout: Duration) -> Result<Output> {
        let drain = |pipe: Option<Box<dyn Read + Send>>| {
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                if let Some(mut p) = pipe {
                    let _ = p.read_to_end(&mut buf);
                }
                buf
            })
        };
        let stdout = drain(
            self.child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
        );
        let stderr = drain(
            self.child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
        );
        let status = self.wait_timeout(timeout);
        // The pipes close once the child is gone (exited or killed), so the readers finish.
        let stdout = stdout.join().unwrap_or_default();
        let stderr = stderr.join().unwrap_or_default();
        match status {
            Ok(status) => Ok(Output {
                status,
                stdout,
                stderr,
            }),
            Err(Error::Timeout { what, timeout, .. }) => Err(Error::Timeout {
                what,
                timeout,
                detail: String::from_utf8_lossy(&stderr).into_owned(),
            }),
            Err(e) => Err(e),
        }
    }

    /// Sends SIGKILL (to this PID only) and reaps the child.
    pub fn kill(&mut self) {
        if self.done {
            return;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.done = true;
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The `Uid:`/`Gid:` lines of `/proc/<pid>/status`: (real, effective, saved, fs) each.
pub fn ids_of(pid: u32) -> Result<([u32; 4], [u32; 4], Vec<u32>)> {
    let file = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&file).ctx(|| format!("reading {file}"))?;
    let field = |name: &str| -> Vec<u32> {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|rest| {
                rest.split_whitespace()
                    .filter_map(|v| v.parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    };
    let four = |v: Vec<u32>, name: &str| -> Result<[u32; 4]> {
        v.try_into().map_err(|v| Error::Parse {
            what: format!("{name} in {file}"),
            detail: format!("{v:?}"),
        })
    };
    Ok((
        four(field("Uid:"), "Uid")?,
        four(field("Gid:"), "Gid")?,
        field("Groups:"),
    ))
}
