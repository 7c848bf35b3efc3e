//! A node's own view of the filesystem: a mount namespace in which the paths a DaemonSet's
//! `hostPath` volumes name (`/etc/cni/net.d`, `/opt/cni/bin`, `/run/...`, `/var/run/netns`,
//! `/sys/fs/bpf`) are the node's and not this machine's, so that the chart's default paths can
//! be run as rendered without touching a real installation.
//!
//! Inside it, `/etc` and `/opt` are overlays whose upper layers live in the node's scratch
//! directory (writes land there, the host's files stay as they are), `/run` is a fresh tmpfs
//! (so `/run/linkerd-cni`, `/var/run/netns` and containerd's shim sockets are the node's own),
//! and `/sys/fs/bpf` is unmounted, so the DaemonSet's `mount-bpffs` init container really
//! mounts bpffs there, and only Bidirectional propagation brings that mount back to the node.
//! Finally every mount is made shared (`mount --make-rshared /`), as systemd does on real
//! nodes: containerd refuses Bidirectional and HostToContainer mounts of private sources.
//!
//! The namespace lives as long as a holder process (`unshare --mount`, then `sleep`) and the
//! processes that joined it (containerd, its shims and containers, started with
//! `nsenter --mount`). The test reaches the node's files through `/proc/<holder>/root`
//! ([`NodeRoot::path`]). Dropping the guard kills the holder (by PID); once the node's other
//! processes are gone too, the kernel tears the namespace down with every mount in it (the
//! bpffs instance and its pins included).

use std::{
    fs,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use crate::{
    child::ChildGuard,
    error::{Error, IoContext, Result},
};

/// How long setting the namespace up may take.
const SETUP_TIMEOUT: Duration = Duration::from_secs(20);
/// The holder's environment names the scratch directory here, so that the holder of a test
/// process that died without cleaning up can be found and killed.
pub const HOLDER_ENV: &str = "LINKERD_CNI_TESTS_NODE_ROOT";

/// The node's mount namespace, held by a process of its own.
#[derive(Debug)]
pub struct NodeRoot {
    holder: ChildGuard,
}

impl NodeRoot {
    /// Creates the namespace; the overlays' upper and work directories go below `dir`.
    pub fn new(dir: &Path) -> Result<Self> {
        let mut script = String::from("set -e\n");
        for top in ["etc", "opt"] {
            let upper = dir.join(top).join("upper");
            let work = dir.join(top).join("work");
            for d in [&upper, &work] {
                fs::create_dir_all(d).ctx(|| format!("creating {}", d.display()))?;
            }
            script.push_str(&format!(
                "mount -t overlay overlay -o lowerdir=/{top},upperdir={},workdir={} /{top}\n",
                upper.display(),
                work.display()
            ));
        }
        script.push_str(
            "mount -t tmpfs -o mode=755 tmpfs /run\n\
             while grep -q ' /sys/fs/bpf ' /proc/self/mountinfo; do umount -l /sys/fs/bpf; done\n\
             mkdir -p /etc/cni/net.d /opt/cni/bin\n\
             mount --make-rshared /\n\
             echo ready\n\
             exec sleep 2147483647\n",
        );
        let mut cmd = Command::new("unshare");
        cmd.args(["--mount", "--propagation", "private", "sh", "-c", &script])
            .env(HOLDER_ENV, dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut holder = ChildGuard::spawn(&mut cmd)?;
        let stdout = holder
            .child_mut()
            .stdout
            .take()
            .ok_or_else(|| Error::Missing("the node root holder's stdout".into()))?;
        let stderr = holder.child_mut().stderr.take();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        match rx.recv_timeout(SETUP_TIMEOUT) {
            Ok(line) if line.trim() == "ready" => Ok(Self { holder }),
            other => {
                holder.kill();
                let mut err = String::new();
                if let Some(mut e) = stderr {
                    let _ = std::io::Read::read_to_string(&mut e, &mut err);
                }
                Err(Error::Missing(format!(
                    "setting up the node's mount namespace failed ({other:?}): {err}"
                )))
            }
        }
    }

    /// The holder's PID.
    pub fn pid(&self) -> u32 {
        self.holder.pid()
    }

    /// The namespace file, for `nsenter --mount=`.
    pub fn ns_file(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/ns/mnt", self.pid()))
    }

    /// Where this process reaches the node's `node_path` (an absolute path as the node sees
    /// it), through `/proc/<holder>/root`. Symbolic links on the way are resolved inside the
    /// node's root (the kernel would resolve an absolute link such as Debian's
    /// `/var/run -> /run` against this process's root instead).
    pub fn path(&self, node_path: impl AsRef<Path>) -> PathBuf {
        let root = PathBuf::from(format!("/proc/{}/root", self.pid()));
        resolve_in(&root, node_path.as_ref())
    }

    /// The node's mount table (`/proc/<holder>/mountinfo`).
    pub fn mountinfo(&self) -> String {
        fs::read_to_string(format!("/proc/{}/mountinfo", self.pid())).unwrap_or_default()
    }

    /// The filesystem type mounted exactly at `node_path`, if any.
    pub fn fstype_at(&self, node_path: &str) -> Option<String> {
        self.mountinfo().lines().rev().find_map(|l| {
            let fields: Vec<&str> = l.split(' ').collect();
            let sep = fields.iter().position(|f| *f == "-")?;
            (fields.get(4) == Some(&node_path))
                .then(|| fields.get(sep + 1).map(|s| s.to_string()))?
        })
    }
}

/// `path` (as seen from `root`) below `root`, with every symbolic link on the way resolved
/// inside `root` (absolute targets start again at `root`, `..` never climbs above it); a
/// component that does not exist ends the resolution and the rest is appended as it is.
fn resolve_in(root: &Path, path: &Path) -> PathBuf {
    use std::path::Component;
    let mut pending: Vec<std::ffi::OsString> = path
        .components()
        .rev()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some("..".into()),
            _ => None,
        })
        .collect();
    let mut done: Vec<std::ffi::OsString> = Vec::new();
    let mut links = 0;
    while let Some(next) = pending.pop() {
        if next == ".." {
            done.pop();
            continue;
        }
        let candidate: PathBuf = root.join(done.iter().collect::<PathBuf>()).join(&next);
        match fs::read_link(&candidate) {
            Ok(target) if links < 40 => {
                links += 1;
                if target.is_absolute() {
                    done.clear();
                }
                for c in target.components().rev() {
                    match c {
                        Component::Normal(n) => pending.push(n.to_os_string()),
                        Component::ParentDir => pending.push("..".into()),
                        _ => {}
                    }
                }
            }
            _ => done.push(next),
        }
    }
    root.join(done.iter().collect::<PathBuf>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_resolve_inside_the_root() {
        let dir = crate::names::TempDir::new().unwrap();
        let root = dir.path();
        fs::create_dir_all(root.join("run/netns")).unwrap();
        fs::create_dir_all(root.join("var")).unwrap();
        std::os::unix::fs::symlink("/run", root.join("var/run")).unwrap();
        std::os::unix::fs::symlink("../../run", root.join("var/rel")).unwrap();
        assert_eq!(
            resolve_in(root, Path::new("/var/run/netns/x")),
            root.join("run/netns/x")
        );
        assert_eq!(
            resolve_in(root, Path::new("/var/rel/netns")),
            root.join("run/netns")
        );
        assert_eq!(
            resolve_in(root, Path::new("/etc/cni")),
            root.join("etc/cni")
        );
    }
}
