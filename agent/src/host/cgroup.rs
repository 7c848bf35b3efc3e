//! Finding a pod's cgroup v2 directory: from the runtime's `runtimeConfig.cgroupPath` when it
//! sends one, otherwise from the pod UID in either kubelet layout (cgroupfs or systemd driver);
//! and opening it again later exactly as it was found ([`open_recorded`]).
//!
//! A cgroup is resolved once, at registration (symbolic links and `..` resolved, checked
//! where a peer named it), and the registration records the resolved path with the cgroup's
//! inode. Every later open (a repair re-attaching a link, CHECK's order check) goes through
//! [`open_recorded`]: beneath the cgroup2 root, through no symbolic link and onto no other
//! filesystem, inside the pods' trees when a peer named it, and onto the same inode. A path
//! that now leads elsewhere (a symbolic link retargeted, a directory replaced) is refused,
//! never followed.

use std::{
    fs::File,
    io,
    os::unix::fs::MetadataExt,
    path::{Component, Path, PathBuf},
};

use nix::{
    errno::Errno,
    fcntl::{OFlag, OpenHow, ResolveFlag, open, openat2},
    sys::stat::Mode,
};

/// Why a recorded cgroup was not opened again.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// The path is not a plain path below the cgroup2 root, or leads through a symbolic
    /// link, `..` or onto another filesystem.
    #[error(
        "cgroup {path} is not a plain path below the cgroup2 root {root} (through no symbolic \
         link or `..`, on no other filesystem): refused"
    )]
    Escapes { path: PathBuf, root: PathBuf },
    /// A peer named the cgroup, and its path lies outside the pods' cgroup trees.
    #[error("cgroup {path} is outside the pod cgroup trees ({trees}): refused")]
    OutsideTrees { path: PathBuf, trees: String },
    /// The path leads to another cgroup than the one registered.
    #[error("cgroup {path} is another cgroup now (inode {found}, registered {recorded}): refused")]
    Replaced {
        path: PathBuf,
        recorded: u64,
        found: u64,
    },
    /// Opening it failed otherwise (gone, permissions).
    #[error("opening cgroup {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

/// A cgroup as [`open_recorded`] opened it: the directory, and its inode.
#[derive(Debug)]
pub struct OpenedCgroup {
    pub file: File,
    pub ino: u64,
}

/// Whether `rel` (relative to the cgroup2 root, plain) lies strictly inside one of `trees`
/// (a leading `/` ignored, so `/` stands for every cgroup but the root).
pub fn inside_trees(rel: &Path, trees: &[PathBuf]) -> bool {
    trees.iter().any(|tree| {
        let tree = tree.strip_prefix("/").unwrap_or(tree);
        rel.strip_prefix(tree)
            .is_ok_and(|below| below.components().next().is_some())
    })
}

/// `path` with symbolic links and `..` resolved, relative to `root` (both resolved), if it
/// exists and lies below `root` (or is it: empty).
pub fn resolved_below(root: &Path, path: &Path) -> Option<PathBuf> {
    let (root, path) = (
        std::fs::canonicalize(root).ok()?,
        std::fs::canonicalize(path).ok()?,
    );
    path.strip_prefix(&root).ok().map(Path::to_path_buf)
}

/// Opens the cgroup at `path` (a resolved path below `root`, the cgroup2 mount) again:
/// `openat2` from the root with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV`,
/// non-blocking; inside `trees` when given (a peer named it); and, when `ino` is given, the
/// same inode as recorded. See the module documentation.
pub fn open_recorded(
    root: &Path,
    path: &Path,
    trees: Option<&[PathBuf]>,
    ino: Option<u64>,
) -> Result<OpenedCgroup, CgroupError> {
    let escapes = || CgroupError::Escapes {
        path: path.into(),
        root: root.into(),
    };
    let io_err = |source: io::Error| CgroupError::Io {
        path: path.into(),
        source,
    };
    let rel = path.strip_prefix(root).map_err(|_| escapes())?;
    if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return Err(escapes());
    }
    if let Some(trees) = trees
        && !inside_trees(rel, trees)
    {
        return Err(CgroupError::OutsideTrees {
            path: path.into(),
            trees: trees
                .iter()
                .map(|t| t.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    let rootfd = open(
        root,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io_err(e.into()))?;
    let file = if rel.as_os_str().is_empty() {
        File::from(
            open(
                root,
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
                Mode::empty(),
            )
            .map_err(|e| io_err(e.into()))?,
        )
    } else {
        let how = OpenHow::new()
            .flags(OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)
            .resolve(
                ResolveFlag::RESOLVE_BENEATH
                    | ResolveFlag::RESOLVE_NO_SYMLINKS
                    | ResolveFlag::RESOLVE_NO_MAGICLINKS
                    | ResolveFlag::RESOLVE_NO_XDEV,
            );
        match openat2(&rootfd, rel, how) {
            Ok(fd) => File::from(fd),
            Err(Errno::ELOOP | Errno::EXDEV) => return Err(escapes()),
            Err(e) => return Err(io_err(e.into())),
        }
    };
    let found = file.metadata().map_err(io_err)?.ino();
    match ino {
        Some(recorded) if recorded != found => Err(CgroupError::Replaced {
            path: path.into(),
            recorded,
            found,
        }),
        _ => Ok(OpenedCgroup { file, ino: found }),
    }
}

/// QoS classes kubelet nests pods under.
const QOS: [&str; 3] = ["", "burstable", "besteffort"];

/// Expands a systemd slice name into its path: `a-b-c.slice` lives at
/// `a.slice/a-b.slice/a-b-c.slice`.
fn expand_slice(name: &str) -> Option<PathBuf> {
    let stem = name.strip_suffix(".slice")?;
    if stem.is_empty() || stem.contains('/') {
        return None;
    }
    let mut path = PathBuf::new();
    let mut prefix = String::new();
    for part in stem.split('-') {
        if !prefix.is_empty() {
            prefix.push('-');
        }
        prefix.push_str(part);
        path.push(format!("{prefix}.slice"));
    }
    Some(path)
}

/// The candidate directories (relative to the cgroup2 root) for a pod UID.
pub fn candidates_for_uid(uid: &str) -> Vec<PathBuf> {
    let systemd_uid = uid.replace('-', "_");
    let mut out = Vec::new();
    for qos in QOS {
        // cgroupfs driver: kubepods[/qos]/pod<uid>
        let mut p = PathBuf::from("kubepods");
        if !qos.is_empty() {
            p.push(qos);
        }
        p.push(format!("pod{uid}"));
        out.push(p);
        // systemd driver: kubepods.slice[/kubepods-qos.slice]/kubepods[-qos]-pod<uid_>.slice
        let name = if qos.is_empty() {
            format!("kubepods-pod{systemd_uid}.slice")
        } else {
            format!("kubepods-{qos}-pod{systemd_uid}.slice")
        };
        if let Some(p) = expand_slice(&name) {
            out.push(p);
        }
    }
    out
}

/// kubelet's cgroup of every pod under `root` (the cgroup2 mount): `kubepods.slice` or
/// `kubepods`, whichever exists alone (shared with `linkerd check --node`).
pub use linkerd_cni_common::paths::kubepods;

/// Resolves the pod's cgroup under `root` (the cgroup2 mount): the runtime's hint first, then
/// the pod UID. `None` means no per-pod cgroup v2 exists (the shared attachment applies).
pub fn resolve(root: &Path, hint: Option<&str>, pod_uid: Option<&str>) -> Option<PathBuf> {
    let existing = |rel: &Path| {
        let p = root.join(rel.strip_prefix("/").unwrap_or(rel));
        p.is_dir().then_some(p)
    };
    if let Some(hint) = hint.filter(|h| !h.is_empty()) {
        let hint_path = Path::new(hint);
        if hint_path.is_absolute() && hint_path.starts_with(root) && hint_path.is_dir() {
            return Some(hint_path.into());
        }
        // systemd form "slice:prefix:name" or a bare slice name.
        let slice = hint.split(':').next().unwrap_or(hint);
        if let Some(found) = expand_slice(slice).and_then(|p| existing(&p)) {
            return Some(found);
        }
        if let Some(found) = existing(hint_path) {
            return Some(found);
        }
    }
    let uid = pod_uid.filter(|u| !u.is_empty() && !u.contains('/'))?;
    candidates_for_uid(uid).iter().find_map(|p| existing(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cgroup is opened again only where and as it was registered (issue 45, D1): the
    /// resolved path, through no symbolic link or `..`, onto the recorded inode, inside the
    /// trees when a peer named it.
    #[test]
    fn a_recorded_cgroup_is_opened_only_where_and_as_it_was() {
        let root = std::env::temp_dir().join(format!("l5d-cgroup-reopen-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for d in ["kubepods/poda", "kubepods/podb", "outside"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::os::unix::fs::symlink(root.join("kubepods/poda"), root.join("kubepods/link")).unwrap();
        let trees = [PathBuf::from("kubepods")];
        let pod = root.join("kubepods/poda");
        let first = open_recorded(&root, &pod, Some(&trees), None).expect("the pod's cgroup");
        let again = open_recorded(&root, &pod, Some(&trees), Some(first.ino)).expect("again");
        assert_eq!(again.ino, first.ino);
        // A hint through a symbolic link resolves to the pod's own path, once.
        assert_eq!(
            resolved_below(&root, &root.join("kubepods/link")),
            Some(PathBuf::from("kubepods/poda"))
        );
        for refused in [
            root.join("kubepods/link"),
            root.join("kubepods/../kubepods/poda"),
            PathBuf::from("/elsewhere/kubepods/poda"),
        ] {
            assert!(
                matches!(
                    open_recorded(&root, &refused, None, None),
                    Err(CgroupError::Escapes { .. })
                ),
                "{}",
                refused.display()
            );
        }
        assert!(matches!(
            open_recorded(&root, &root.join("outside"), Some(&trees), None),
            Err(CgroupError::OutsideTrees { .. })
        ));
        // Not a peer's: outside the trees is where the agent put it.
        open_recorded(&root, &root.join("outside"), None, None).expect("the agent's own");
        // The directory replaced by another (or by a link to another): refused.
        std::fs::remove_dir(&pod).unwrap();
        std::fs::create_dir(&pod).unwrap();
        assert!(matches!(
            open_recorded(&root, &pod, Some(&trees), Some(first.ino)),
            Err(CgroupError::Replaced { .. })
        ));
        std::fs::remove_dir(&pod).unwrap();
        std::os::unix::fs::symlink(root.join("outside"), &pod).unwrap();
        assert!(matches!(
            open_recorded(&root, &pod, Some(&trees), Some(first.ino)),
            Err(CgroupError::Escapes { .. })
        ));
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn slices_expand() {
        assert_eq!(
            expand_slice("kubepods-burstable-pod12_34.slice"),
            Some(PathBuf::from(
                "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12_34.slice"
            ))
        );
        assert_eq!(expand_slice("nope"), None);
    }

    #[test]
    fn resolves_both_layouts_and_hints() {
        let root = std::env::temp_dir().join(format!("l5d-cgroup-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let fs_layout = root.join("kubepods/besteffort/podaaaa-1");
        let sd_layout =
            root.join("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podbbbb_2.slice");
        std::fs::create_dir_all(&fs_layout).unwrap();
        std::fs::create_dir_all(&sd_layout).unwrap();
        assert_eq!(
            resolve(&root, None, Some("aaaa-1")),
            Some(fs_layout.clone())
        );
        assert_eq!(
            resolve(&root, None, Some("bbbb-2")),
            Some(sd_layout.clone())
        );
        assert_eq!(
            resolve(&root, Some("/kubepods/besteffort/podaaaa-1"), None),
            Some(fs_layout.clone())
        );
        assert_eq!(
            resolve(&root, Some("kubepods-burstable-podbbbb_2.slice"), None),
            Some(sd_layout.clone())
        );
        assert_eq!(
            resolve(&root, Some(fs_layout.to_str().unwrap()), None),
            Some(fs_layout)
        );
        assert_eq!(resolve(&root, Some("/missing"), Some("cccc")), None);
        assert_eq!(resolve(&root, None, Some("../x")), None);
        // Both layouts at once: no single cgroup holds every pod.
        assert_eq!(kubepods(&root), None);
        std::fs::remove_dir_all(root.join("kubepods.slice")).unwrap();
        assert_eq!(kubepods(&root), Some(root.join("kubepods")));
        std::fs::remove_dir_all(&root).unwrap();
    }
}
