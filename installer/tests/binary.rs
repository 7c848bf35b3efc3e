//! The plugin binary: copied atomically, executable, removed on cleanup.

mod support;

use std::{
    fs,
    io::Read as _,
    os::unix::fs::{MetadataExt, PermissionsExt},
};

use linkerd_cni_installer::InstallError;
use support::{BINARY, Node};

#[test]
fn binary_is_replaced_atomically_and_executable() {
    let node = Node::new();
    let dest = node.installer.config().binary_path();
    let bin_dir = node.installer.config().bin_dir();
    // An older plugin is installed and a runtime is executing it (holds it open).
    let old = b"old plugin".to_vec();
    fs::write(&dest, &old).unwrap_or_else(|e| panic!("{e}"));
    let mut in_use = fs::File::open(&dest).unwrap_or_else(|e| panic!("{e}"));
    let old_ino = fs::metadata(&dest).map(|m| m.ino()).unwrap_or(0);

    node.installer
        .install_binary()
        .unwrap_or_else(|e| panic!("install: {e}"));

    let meta = fs::metadata(&dest).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(fs::read(&dest).unwrap_or_default(), BINARY, "contents");
    assert_eq!(
        meta.permissions().mode() & 0o7777,
        0o755,
        "mode (the image's copy is 0644)"
    );
    assert_ne!(
        meta.ino(),
        old_ino,
        "old binary overwritten in place instead of replaced"
    );
    let mut seen = Vec::new();
    in_use
        .read_to_end(&mut seen)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(seen, old, "the running copy changed under its reader");
    let names: Vec<_> = fs::read_dir(&bin_dir)
        .unwrap_or_else(|e| panic!("{e}"))
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    assert_eq!(names, ["linkerd-cni"], "bin dir holds leftovers");
    assert!(node.installer.status().binary_installed);

    node.installer
        .cleanup()
        .unwrap_or_else(|e| panic!("cleanup: {e}"));
    assert!(!dest.exists(), "binary left after cleanup");
    assert!(!node.installer.status().binary_installed);
}

#[test]
fn missing_source_binary_names_the_path() {
    let node = Node::new();
    let source = node.installer.config().plugin_source.clone();
    fs::remove_file(&source).unwrap_or_else(|e| panic!("{e}"));
    let err = node.installer.install_once().err();
    assert!(matches!(err, Some(InstallError::Io { .. })), "got {err:?}");
    assert!(
        err.is_some_and(|e| e
            .to_string()
            .contains(&node.installer.config().binary_path().display().to_string())),
        "error does not name the destination"
    );
    assert!(!node.installer.config().binary_path().exists());
}
