//! The guest's initramfs: Debian's static busybox, the kernel modules needed to reach the
//! host's root filesystem (virtio, 9p, overlay, in dependency order, decompressed), and an
//! `/init` script; written as an uncompressed `newc` cpio archive.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::Path,
    process::Command,
};

use anyhow::{Context, bail};

/// Modules the guest loads before it mounts the host's root (whatever the kernel has built in
/// is left out).
const BOOT_MODULES: &[&str] = &[
    "virtio_pci",
    "virtio_console",
    "9pnet_virtio",
    "9p",
    "overlay",
];

/// A file in the archive.
enum Entry {
    Dir,
    File { mode: u32, data: Vec<u8> },
    CharDev { major: u32, minor: u32 },
}

/// Writes the initramfs to `out`: `/init` is `init_script`; `modules` (the kernel's
/// `lib/modules/<release>`, if it has loadable modules) gives the boot modules, loaded in
/// the order of `/modules/order`; `busybox` is Debian's `busybox-static` for the guest's
/// architecture (the host's own, or the guest userland's).
pub fn build(
    out: &Path,
    init_script: &str,
    modules: Option<&Path>,
    busybox: &Path,
) -> anyhow::Result<()> {
    let mut entries: Vec<(String, Entry)> = Vec::new();
    for dir in [
        "bin", "dev", "proc", "sys", "modules", "lower", "rw", "newroot",
    ] {
        entries.push((dir.into(), Entry::Dir));
    }
    entries.push(("dev/console".into(), Entry::CharDev { major: 5, minor: 1 }));
    let busybox = fs::read(busybox)
        .with_context(|| format!("reading {} (Debian's busybox-static)", busybox.display()))?;
    entries.push((
        "bin/busybox".into(),
        Entry::File {
            mode: 0o755,
            data: busybox,
        },
    ));
    entries.push((
        "init".into(),
        Entry::File {
            mode: 0o755,
            data: init_script.as_bytes().to_vec(),
        },
    ));
    let mut order = String::new();
    if let Some(tree) = modules {
        for rel in load_order(tree)? {
            let name = Path::new(&rel)
                .file_name()
                .and_then(|n| n.to_str())
                .context("module path without a name")?;
            let (base, data) = decompressed(&tree.join(&rel), name)?;
            order.push_str(&base);
            order.push('\n');
            entries.push((format!("modules/{base}"), Entry::File { mode: 0o644, data }));
        }
    }
    entries.push((
        "modules/order".into(),
        Entry::File {
            mode: 0o644,
            data: order.into_bytes(),
        },
    ));
    fs::write(out, cpio(&entries)).with_context(|| format!("writing {}", out.display()))
}

/// The boot modules and their dependencies, dependencies first, as paths relative to the tree
/// (from `modules.dep`; built-in ones from `modules.builtin` are skipped).
fn load_order(tree: &Path) -> anyhow::Result<Vec<String>> {
    let dep = fs::read_to_string(tree.join("modules.dep"))
        .with_context(|| format!("reading {}/modules.dep", tree.display()))?;
    let builtin = fs::read_to_string(tree.join("modules.builtin")).unwrap_or_default();
    let name_of = |path: &str| {
        let file = path.rsplit('/').next().unwrap_or(path);
        file.split(".ko").next().unwrap_or(file).replace('-', "_")
    };
    let builtin: BTreeSet<String> = builtin.lines().map(name_of).collect();
    let mut deps: BTreeMap<String, (String, Vec<String>)> = BTreeMap::new();
    for line in dep.lines() {
        let Some((module, rest)) = line.split_once(':') else {
            continue;
        };
        deps.insert(
            name_of(module),
            (
                module.to_string(),
                rest.split_whitespace().map(name_of).collect(),
            ),
        );
    }
    let mut order = Vec::new();
    let mut seen = BTreeSet::new();
    fn visit(
        name: &str,
        deps: &BTreeMap<String, (String, Vec<String>)>,
        seen: &mut BTreeSet<String>,
        order: &mut Vec<String>,
    ) {
        if !seen.insert(name.to_string()) {
            return;
        }
        if let Some((path, needs)) = deps.get(name) {
            for need in needs {
                visit(need, deps, seen, order);
            }
            order.push(path.clone());
        }
    }
    for module in BOOT_MODULES {
        let name = module.replace('-', "_");
        if builtin.contains(&name) {
            continue;
        }
        if !deps.contains_key(&name) {
            bail!("module {module} is neither built in nor in modules.dep");
        }
        visit(&name, &deps, &mut seen, &mut order);
    }
    Ok(order)
}

/// A module file's bytes, decompressed (busybox's `insmod` takes plain ELF), and its plain name.
fn decompressed(path: &Path, name: &str) -> anyhow::Result<(String, Vec<u8>)> {
    for (ext, tool) in [(".xz", "xz"), (".zst", "zstd")] {
        if let Some(base) = name.strip_suffix(ext) {
            let out = Command::new(tool)
                .args(["-d", "-c"])
                .arg(path)
                .output()
                .with_context(|| format!("running {tool} on {}", path.display()))?;
            if !out.status.success() {
                bail!("{tool} -d {} failed: {}", path.display(), out.status);
            }
            return Ok((base.to_string(), out.stdout));
        }
    }
    let data = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    Ok((name.to_string(), data))
}

/// The entries as a `newc` cpio archive (the format the kernel unpacks as initramfs).
fn cpio(entries: &[(String, Entry)]) -> Vec<u8> {
    let mut out = Vec::new();
    let header = |out: &mut Vec<u8>, ino: usize, name: &str, mode: u32, size: usize, rdev| {
        let (rmaj, rmin) = rdev;
        let fields = [
            ino as u32,
            mode,
            0,
            0,
            1,
            0,
            size as u32,
            0,
            0,
            rmaj,
            rmin,
            name.len() as u32 + 1,
            0,
        ];
        out.extend_from_slice(b"070701");
        for f in fields {
            out.extend_from_slice(format!("{f:08x}").as_bytes());
        }
        out.extend_from_slice(name.as_bytes());
        out.push(0);
        pad4(out);
    };
    for (i, (name, entry)) in entries.iter().enumerate() {
        match entry {
            Entry::Dir => header(&mut out, i + 1, name, 0o040_755, 0, (0, 0)),
            Entry::CharDev { major, minor } => {
                header(&mut out, i + 1, name, 0o020_600, 0, (*major, *minor));
            }
            Entry::File { mode, data } => {
                header(&mut out, i + 1, name, 0o100_000 | mode, data.len(), (0, 0));
                out.extend_from_slice(data);
                pad4(&mut out);
            }
        }
    }
    header(&mut out, 0, "TRAILER!!!", 0, 0, (0, 0));
    out
}

fn pad4(out: &mut Vec<u8>) {
    while !out.len().is_multiple_of(4) {
        out.push(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpio_entries_are_newc_and_4_aligned() {
        let archive = cpio(&[
            ("d".into(), Entry::Dir),
            (
                "d/f".into(),
                Entry::File {
                    mode: 0o644,
                    data: b"abc".to_vec(),
                },
            ),
        ]);
        assert!(archive.starts_with(b"070701"));
        // A header is 110 bytes; "d\0" ends at 112 (aligned); "d/f\0" ends at 226, padded to
        // 228, where the data starts.
        assert_eq!(&archive[112..118], b"070701");
        assert_eq!(&archive[222..225], b"d/f");
        assert_eq!(&archive[228..231], b"abc");
        assert_eq!(&archive[232..238], b"070701");
        assert!(archive.windows(10).any(|w| w == b"TRAILER!!!"));
    }
}
