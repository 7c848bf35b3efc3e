//! Cheap pods for the pod-setup scenario: a named network namespace made in-process (unshare
//! on a worker thread, then a bind mount under `/run/netns`, what `ip netns add` does without
//! the process spawn) and an empty cgroup. Both are removed on drop.

use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::Context;
use nix::{
    mount::{MntFlags, MsFlags, mount, umount2},
    sched::{CloneFlags, unshare},
};

/// Where `ip netns` keeps its bind mounts.
const NETNS_DIR: &str = "/run/netns";

/// A netns + cgroup pair named `l5dt-<pid>-<n>` (the support library's naming, so a later run
/// reaps what a killed one left).
pub struct LightPod {
    pub name: String,
    pub netns: PathBuf,
    pub cgroup: PathBuf,
}

impl LightPod {
    /// Creates `count` pods under `cgroup_parent`, the namespaces on one worker thread.
    pub fn create_many(count: usize, cgroup_parent: &Path) -> anyhow::Result<Vec<LightPod>> {
        fs::create_dir_all(NETNS_DIR)?;
        let names: Vec<String> = (0..count)
            .map(|_| linkerd_cni_tests::names::unique_name())
            .collect();
        let mut pods = Vec::with_capacity(count);
        // Namespaces first, each pushed as soon as it exists so that a failure cleans up.
        let made: Vec<anyhow::Result<()>> = std::thread::scope(|s| {
            s.spawn(|| {
                names
                    .iter()
                    .map(|name| -> anyhow::Result<()> {
                        let path = Path::new(NETNS_DIR).join(name);
                        fs::File::create(&path)
                            .with_context(|| format!("creating {}", path.display()))?;
                        unshare(CloneFlags::CLONE_NEWNET).context("unshare(CLONE_NEWNET)")?;
                        mount(
                            Some("/proc/thread-self/ns/net"),
                            &path,
                            None::<&str>,
                            MsFlags::MS_BIND,
                            None::<&str>,
                        )
                        .with_context(|| {
                            format!("bind-mounting the netns on {}", path.display())
                        })?;
                        lo_up().context("bringing lo up")?;
                        Ok(())
                    })
                    .collect()
            })
            .join()
            .unwrap_or_else(|_| vec![Err(anyhow::anyhow!("netns worker panicked"))])
        });
        let mut first_err = None;
        for (name, r) in names.into_iter().zip(made) {
            let pod = LightPod {
                netns: Path::new(NETNS_DIR).join(&name),
                cgroup: cgroup_parent.join(&name),
                name,
            };
            match r.and_then(|()| fs::create_dir(&pod.cgroup).context("creating the pod cgroup")) {
                Ok(()) => pods.push(pod),
                Err(e) => {
                    first_err.get_or_insert(e);
                    drop(pod);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(pods),
        }
    }
}

impl Drop for LightPod {
    fn drop(&mut self) {
        let _ = umount2(&self.netns, MntFlags::MNT_DETACH);
        let _ = fs::remove_file(&self.netns);
        let _ = fs::remove_dir(&self.cgroup);
    }
}

/// Brings `lo` of the calling thread's netns up (SIOCSIFFLAGS), as the loopback plugin does.
pub fn lo_up() -> std::io::Result<()> {
    // SAFETY: plain socket and ioctl calls on a zeroed ifreq we own; the fd is closed below.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut req: libc::ifreq = std::mem::zeroed();
        for (d, s) in req.ifr_name.iter_mut().zip(b"lo\0") {
            *d = *s as libc::c_char;
        }
        let mut rc = libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut req);
        if rc == 0 {
            req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            rc = libc::ioctl(fd, libc::SIOCSIFFLAGS, &req);
        }
        let err = std::io::Error::last_os_error();
        libc::close(fd);
        if rc == 0 { Ok(()) } else { Err(err) }
    }
}
