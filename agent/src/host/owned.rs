//! The directories linkerd-cni made: each (the socket's, the registry's, the pin root; what
//! the agent makes inside the pin root is ours with it) carries the marker [`paths::OWNED_MARKER`] from the
//! moment the agent creates it, and the uninstall removes a directory only when it carries
//! one (and then only what linkerd-cni put there). A directory that already existed is taken
//! as ours only when it is empty (kubelet makes a hostPath mount's directory before the agent
//! starts) or is one of the default paths, which only linkerd-cni uses (an agent of an earlier
//! version made them without a marker).

use std::{
    fs, io,
    path::{Path, PathBuf},
};

use linkerd_cni_common::{names, paths};

/// Whether `dir` carries our marker.
pub fn is_owned(dir: &Path) -> bool {
    dir.join(paths::OWNED_MARKER).is_dir()
}

/// `fs::create_dir_all`, marking every directory it creates as ours, and `dir` itself when it
/// existed and is ours to take (empty, or a default path: see the module's documentation).
pub fn create_dir_all(dir: &Path) -> io::Result<()> {
    let mut missing = Vec::new();
    let mut cur = Some(dir);
    while let Some(d) = cur {
        match fs::symlink_metadata(d) {
            Ok(_) => break,
            Err(e) if e.kind() == io::ErrorKind::NotFound => missing.push(d.to_path_buf()),
            Err(e) => return Err(e),
        }
        cur = d.parent().filter(|p| !p.as_os_str().is_empty());
    }
    for d in missing.iter().rev() {
        match fs::create_dir(d) {
            Ok(()) => mark(d)?,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    if !is_owned(dir) && takeable(dir)? {
        mark(dir)?;
    }
    Ok(())
}

fn mark(dir: &Path) -> io::Result<()> {
    match fs::create_dir(dir.join(paths::OWNED_MARKER)) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(e),
        _ => Ok(()),
    }
}

/// An existing directory without the marker that is ours anyway.
fn takeable(dir: &Path) -> io::Result<bool> {
    let defaults = [
        Path::new(paths::AGENT_SOCKET).parent(),
        Some(Path::new(paths::STATE_DIR)),
        Some(Path::new(paths::PIN_ROOT)),
    ];
    let normal = paths::normalize(dir);
    // A pin root holding our layout's version map is an earlier agent's.
    let our_layout = dir.join(paths::PIN_MAPS).join(names::MAP_META).exists();
    if our_layout || defaults.iter().flatten().any(|d| *d == normal) {
        return Ok(true);
    }
    Ok(fs::read_dir(dir)?.next().is_none())
}

/// What a removal did: every path removed, every path left with the reason, and what it
/// looked for and did not find.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Removal {
    pub removed: Vec<String>,
    pub left: Vec<(PathBuf, String)>,
    pub absent: Vec<String>,
}

impl Removal {
    /// Removes `dir` (and the marker) when it is ours and holds nothing else; otherwise says
    /// why it stays. A missing directory is neither removed nor left.
    pub fn dir_if_ours_and_empty(&mut self, dir: &Path) -> io::Result<()> {
        if !dir.is_dir() {
            return Ok(());
        }
        if !is_owned(dir) {
            self.left.push((
                dir.to_path_buf(),
                format!(
                    "not made by linkerd-cni (no {} marker)",
                    paths::OWNED_MARKER
                ),
            ));
            return Ok(());
        }
        let mut others: Vec<String> = fs::read_dir(dir)?
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n != paths::OWNED_MARKER)
            .collect();
        if !others.is_empty() {
            others.sort();
            self.left.push((
                dir.to_path_buf(),
                format!(
                    "holds what linkerd-cni did not put there: {}",
                    others.join(", ")
                ),
            ));
            return Ok(());
        }
        fs::remove_dir(dir.join(paths::OWNED_MARKER))?;
        fs::remove_dir(dir)?;
        self.removed.push(dir.display().to_string());
        Ok(())
    }

    /// Removes the file `path` when `ours(type)` says its type is ours (a socket, a regular
    /// file); a missing one is neither removed nor left.
    pub fn file(
        &mut self,
        path: &Path,
        ours: impl Fn(&fs::FileType) -> bool,
        what: &str,
    ) -> io::Result<()> {
        let meta = match fs::symlink_metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        if !ours(&meta.file_type()) {
            self.left.push((path.to_path_buf(), format!("not {what}")));
            return Ok(());
        }
        fs::remove_file(path)?;
        self.removed.push(path.display().to_string());
        Ok(())
    }

    /// `<path>: <why>` for each path left.
    pub fn left_lines(&self) -> Vec<String> {
        self.left
            .iter()
            .map(|(p, why)| format!("{}: {why}", p.display()))
            .collect()
    }

    /// One line per entry: `removed <what>`, `left <path>: <why>`, `not found: <what>`.
    pub fn lines(&self) -> Vec<String> {
        let removed = self.removed.iter().map(|p| format!("removed {p}"));
        let left = self.left_lines().into_iter().map(|l| format!("left {l}"));
        let absent = self.absent.iter().map(|a| format!("not found: {a}"));
        removed.chain(left).chain(absent).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("l5d-owned-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn every_directory_made_is_marked_and_an_existing_one_only_when_empty() {
        let dir = scratch("made");
        create_dir_all(&dir.join("a/b/c")).unwrap();
        for d in ["a", "a/b", "a/b/c"] {
            assert!(is_owned(&dir.join(d)), "{d}");
        }
        assert!(
            !is_owned(&dir),
            "an existing directory holding files is not taken"
        );
        fs::create_dir(dir.join("empty")).unwrap();
        create_dir_all(&dir.join("empty")).unwrap();
        assert!(is_owned(&dir.join("empty")));
        fs::create_dir(dir.join("full")).unwrap();
        fs::write(dir.join("full/theirs"), "").unwrap();
        create_dir_all(&dir.join("full")).unwrap();
        assert!(!is_owned(&dir.join("full")));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn only_our_empty_directories_go() {
        let dir = scratch("remove");
        create_dir_all(&dir.join("ours")).unwrap();
        create_dir_all(&dir.join("shared")).unwrap();
        fs::write(dir.join("shared/theirs"), "x").unwrap();
        fs::create_dir(dir.join("not-ours")).unwrap();
        let mut r = Removal::default();
        for d in ["ours", "shared", "not-ours", "missing"] {
            r.dir_if_ours_and_empty(&dir.join(d)).unwrap();
        }
        assert_eq!(r.removed, vec![dir.join("ours").display().to_string()]);
        assert_eq!(r.left.len(), 2, "{:?}", r.left);
        assert!(r.left[0].1.contains("theirs"), "{:?}", r.left);
        assert!(
            r.left[1].1.contains("not made by linkerd-cni"),
            "{:?}",
            r.left
        );
        assert_eq!(fs::read_to_string(dir.join("shared/theirs")).unwrap(), "x");
        assert!(dir.join("not-ours").is_dir());
        fs::remove_dir_all(&dir).unwrap();
    }
}
