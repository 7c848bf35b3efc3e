//! Atomic file replacement: write a temp file in the same directory, fsync, chmod, rename,
//! fsync the directory. Readers (the container runtime, the plugin) see the old file or the
//! new one, never a mix.

use std::{
    fs::{self, File, OpenOptions},
    io::{self, Write},
    os::unix::fs::{OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
};

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A temp name next to `path`: hidden, and ending in neither `.conf` nor `.conflist`, so no
/// runtime and no watcher takes it for a network config.
pub(crate) fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    path.with_file_name(format!(".{name}.linkerd-tmp-{}-{n}", std::process::id()))
}

/// Whether `name` is one of our temp names.
pub(crate) fn is_temp_name(name: &str) -> bool {
    name.starts_with('.') && name.contains(".linkerd-tmp-")
}

/// Replaces `path` with `bytes`, permission bits `mode`.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    replace_with(path, mode, |f| f.write_all(bytes))
}

/// Replaces `path` with a copy of `source`, permission bits `mode`.
pub(crate) fn copy_atomic(source: &Path, path: &Path, mode: u32) -> io::Result<()> {
    let mut src = File::open(source)?;
    replace_with(path, mode, |f| io::copy(&mut src, f).map(drop))
}

fn replace_with(
    path: &Path,
    mode: u32,
    fill: impl FnOnce(&mut File) -> io::Result<()>,
) -> io::Result<()> {
    let tmp = temp_path(path);
    let result = (|| {
        // Created with the final mode already, so a token never sits in a world-readable file.
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        fill(&mut f)?;
        // The umask may have cleared bits of `mode`: set them exactly.
        f.set_permissions(fs::Permissions::from_mode(mode))?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result?;
    sync_dir(path)
}

/// fsyncs the directory holding `path`, making a rename or removal in it durable.
pub(crate) fn sync_dir(path: &Path) -> io::Result<()> {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => File::open(dir)?.sync_all(),
        _ => Ok(()),
    }
}

/// Removes `path`; a file already gone is not an error. Returns whether it existed.
pub(crate) fn remove_if_exists(path: &Path) -> io::Result<bool> {
    match fs::remove_file(path) {
        Ok(()) => {
            sync_dir(path)?;
            Ok(true)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Reads `path`; `Ok(None)` when it does not exist (it may vanish between listing and reading).
pub(crate) fn read_if_exists(path: &Path) -> io::Result<Option<Vec<u8>>> {
    match fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;

    #[test]
    fn replaces_with_exact_mode_and_no_leftovers() {
        use std::io::Read as _;
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let path = dir.path().join("f.conflist");
        fs::write(&path, b"old").unwrap_or_else(|e| panic!("{e}"));
        for (i, mode) in [0o600, 0o644, 0o755].into_iter().enumerate() {
            // A reader that opened the previous version keeps seeing it whole: the file is
            // replaced, never modified in place. (Holding it open also pins its inode number.)
            let mut reader = File::open(&path).unwrap_or_else(|e| panic!("{e}"));
            let before = fs::read(&path).unwrap_or_default();
            let old_ino = fs::metadata(&path).unwrap_or_else(|e| panic!("{e}")).ino();
            let content = format!("new {i}");
            write_atomic(&path, content.as_bytes(), mode)
                .unwrap_or_else(|e| panic!("mode {mode:o}: {e}"));
            let meta = fs::metadata(&path).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(meta.mode() & 0o7777, mode, "mode");
            assert_ne!(
                meta.ino(),
                old_ino,
                "file was rewritten in place, not renamed over"
            );
            assert_eq!(fs::read(&path).unwrap_or_default(), content.as_bytes());
            let mut seen = Vec::new();
            reader
                .read_to_end(&mut seen)
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(seen, before, "an open reader saw the file change under it");
        }
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap_or_else(|e| panic!("{e}"))
            .filter_map(|e| e.ok().map(|e| e.file_name()))
            .collect();
        assert_eq!(
            names,
            vec![std::ffi::OsString::from("f.conflist")],
            "leftover files"
        );
    }

    #[test]
    fn temp_names_are_never_configs() {
        let tmp = temp_path(Path::new("/d/10-calico.conflist"));
        let name = tmp
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        assert!(
            crate::conflist::ConfKind::of(&tmp).is_none(),
            "{name} looks like a config"
        );
        assert!(is_temp_name(&name), "{name} not recognised as temp");
        assert!(!is_temp_name("10-calico.conflist"));
    }
}
