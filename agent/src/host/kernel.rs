//! What the agent needs from the kernel and the host: every kernel feature of the table
//! (asked of the running kernel by the shared probes, the missing ones named), the cgroup v2
//! mount, and a bpffs at the pin root.

use std::{
    fs, io,
    path::{Path, PathBuf},
};

use linkerd_cni_common::paths;

pub use linkerd_cni_common::kernel::{FEATURES, Feature, SkLookupVariant, parse_release};
pub use linkerd_cni_sys::probe::Findings;

/// The kernel lacks features the data plane needs, or could not be asked (the one line of
/// [`Findings::verdict`], the one `linkerd check --node` prints too).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct KernelUnfit(pub String);

/// Asks the running kernel for every feature of [`FEATURES`] (its version number is not
/// consulted: distributions backport); returns `<release>: every feature present`.
pub fn check_kernel() -> Result<String, KernelUnfit> {
    check(&Findings::probe())
}

/// The verdict on `findings`.
pub fn check(findings: &Findings) -> Result<String, KernelUnfit> {
    findings.verdict().map_err(KernelUnfit)
}

/// Finds the cgroup v2 mount point in `/proc/self/mountinfo` (hybrid hosts mount it at
/// `/sys/fs/cgroup/unified`, unified hosts at `/sys/fs/cgroup`). With a host root (the agent in
/// a container with the host's filesystems under `/host`), the host's cgroup2 mount under it.
pub fn cgroup2_mount(host_root: Option<&Path>) -> io::Result<PathBuf> {
    let info = fs::read_to_string("/proc/self/mountinfo")?;
    find_mount(&info, "cgroup2", host_root.unwrap_or(Path::new("/")))
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no cgroup2 filesystem is mounted"))
}

/// The mount point of the first mount of filesystem type `fstype` under `within` in mountinfo
/// text.
pub fn find_mount(mountinfo: &str, fstype: &str, within: &Path) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (pre, post) = line.split_once(" - ")?;
        let ty = post.split_whitespace().next()?;
        let mount = PathBuf::from(unescape(pre.split_whitespace().nth(4)?));
        (ty == fstype && mount.starts_with(within)).then_some(mount)
    })
}

/// mountinfo escapes spaces and friends as `\040`.
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 4 <= b.len()
            && let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8)
        {
            out.push(v as char);
            i += 4;
            continue;
        }
        out.push(b[i] as char);
        i += 1;
    }
    out
}

/// Whether `path` is on a bpffs: the filesystem `statfs(2)` reports for it, or for its
/// nearest existing ancestor when it does not exist yet (where it would be created). The
/// kernel's answer, not `/proc/self/mountinfo`'s list: a bpffs that another mount covers
/// (a tmpfs mounted over `/sys/fs/bpf`, as a container's hostPath volume on a node without
/// bpffs is) is listed there but is not where a pin would go.
pub fn on_bpffs(path: &Path) -> io::Result<bool> {
    let mut at = path;
    loop {
        match nix::sys::statfs::statfs(at) {
            Ok(fs) => return Ok(fs.filesystem_type().0 == libc::BPF_FS_MAGIC),
            Err(nix::errno::Errno::ENOENT) => match at.parent() {
                Some(parent) => at = parent,
                None => return Ok(false),
            },
            Err(e) => {
                return Err(io::Error::other(format!("statfs {}: {e}", at.display())));
            }
        }
    }
}

/// Mounts a bpffs at `mount_point` unless one already covers it.
pub fn ensure_bpffs_at(mount_point: &Path) -> io::Result<()> {
    if on_bpffs(mount_point)? {
        return Ok(());
    }
    fs::create_dir_all(mount_point)?;
    nix::mount::mount(
        Some("bpf"),
        mount_point,
        Some("bpf"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .map_err(|e| io::Error::other(format!("mounting bpffs at {}: {e}", mount_point.display())))
}

/// Fails unless a bpffs is already mounted at or above `pin_root`, mounting nothing: for an
/// agent told that the node's bpffs comes from the host (`--bpffs-from-host`, the DaemonSet's
/// agent container). There, a bpffs the agent mounted itself would live in the container's
/// mount namespace only: the host would not see the pins, and they, with every pod's links,
/// would go with the container, leaving meshed pods unredirected until the next agent
/// re-attached them. Refusing to start keeps the agent unready and says why.
pub fn require_bpffs(pin_root: &Path) -> io::Result<()> {
    if on_bpffs(pin_root)? {
        return Ok(());
    }
    Err(io::Error::other(format!(
        "no bpffs at or above {}: the agent is told to use the host's (--bpffs-from-host) and \
         mounts none itself (one mounted in its container would not be the node's); mount bpffs \
         on the node, or let the DaemonSet's mount-bpffs init container do it \
         (agent.mountBpffs=true)",
        pin_root.display()
    )))
}

/// Makes sure a bpffs is mounted at or above `pin_root` (mounting one at `/sys/fs/bpf` if
/// none is), then creates `pin_root` (marked as ours: [`super::owned`]).
pub fn ensure_bpffs(pin_root: &Path) -> io::Result<()> {
    if !on_bpffs(pin_root)? {
        let bpffs = Path::new(paths::BPFFS);
        ensure_bpffs_at(bpffs)?;
        if !pin_root.starts_with(bpffs) {
            return Err(io::Error::other(format!(
                "pin root {} is not on a bpffs (mounted one at {})",
                pin_root.display(),
                bpffs.display()
            )));
        }
    }
    super::owned::create_dir_all(pin_root)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_parsing() {
        let info = "25 30 0:22 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n\
                    40 25 0:35 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n\
                    50 30 0:40 / /my\\040bpf rw - bpf bpf rw\n";
        let root = Path::new("/");
        assert_eq!(
            find_mount(info, "cgroup2", root),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        assert_eq!(
            find_mount(info, "bpf", root),
            Some(PathBuf::from("/my bpf"))
        );
        assert_eq!(find_mount(info, "nfs", root), None);
        let host = "60 30 0:35 / /host/sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let both = format!("{info}{host}");
        assert_eq!(
            find_mount(&both, "cgroup2", Path::new("/host")),
            Some(PathBuf::from("/host/sys/fs/cgroup"))
        );
    }
}
