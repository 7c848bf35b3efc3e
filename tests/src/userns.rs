//! A user-namespaced pod's sandbox (`hostUsers: false`) for privileged tests: a process
//! holding a user namespace of its own and a network namespace owned by it.

use std::{os::unix::process::CommandExt, path::PathBuf, process::Command};

use crate::{
    child::{ChildGuard, Placement},
    error::{Error, IoContext, Result},
};

/// A process holding a new user namespace mapping in-ns 0-65535 to host 100000-165535 and a
/// network namespace owned by it, like a `hostUsers: false` pod's sandbox (its loopback up).
/// The process is killed on drop, and both namespaces go with it.
#[derive(Debug)]
pub struct UsernsPod {
    holder: ChildGuard,
}

impl UsernsPod {
    /// The first host ID the pod's namespace maps (in-ns 0).
    pub const HOST_BASE: u32 = 100_000;

    pub fn new() -> Result<Self> {
        let mut cmd = Command::new("sleep");
        cmd.arg("600");
        // SAFETY: unshare is async-signal-safe; the child is single-threaded.
        unsafe {
            cmd.pre_exec(|| {
                if libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let holder = ChildGuard::spawn(&mut cmd)?;
        let pid = holder.pid();
        for map in ["uid_map", "gid_map"] {
            let path = format!("/proc/{pid}/{map}");
            std::fs::write(&path, format!("0 {} 65536\n", Self::HOST_BASE))
                .ctx(|| format!("writing {path}"))?;
        }
        let this = Self { holder };
        this.ip(&["link", "set", "lo", "up"])?;
        Ok(this)
    }

    /// `/proc/<holder>/ns/<ns>`.
    pub fn path(&self, ns: &str) -> PathBuf {
        PathBuf::from(format!("/proc/{}/ns/{ns}", self.holder.pid()))
    }

    /// Runs `ip ARGS` inside the pod's network namespace.
    pub fn ip(&self, args: &[&str]) -> Result<()> {
        let out = Placement::new()
            .netns_path(self.path("net"))
            .command("ip")?
            .args(args)
            .output()
            .ctx(|| format!("ip {args:?}"))?;
        if !out.status.success() {
            return Err(Error::Missing(format!("ip {args:?}: {out:?}")));
        }
        Ok(())
    }
}
