//! The kernel's raw interface has one home, `sys/` (`linkerd-cni-sys`): one `bpf(2)` call site
//! (`sys/src/bpf/mod.rs`), and each kernel number `sys/src/uapi.rs` defines (commands, types,
//! flags, socket options, ioctls), or that it re-exports from `common` (the ones the eBPF
//! programs need too), defined once in the workspace's sources. Fails on a stray: a `SYS_bpf`
//! anywhere else, a second `const` of one of those names, or an ioctl's number written out.

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
};

/// The one file that calls `bpf(2)`.
const BPF_CALL_SITE: &str = "sys/src/bpf/mod.rs";
/// Where the kernel's numbers are defined.
const UAPI: &str = "sys/src/uapi.rs";
/// The numbers defined in `common` (shared with the eBPF programs) that `uapi` re-exports.
const COMMON_NUMBERS: &str = "common/src/types.rs";
/// Numbers of ioctls, filesystems and formats that say nothing but themselves: written out
/// only in [`UAPI`] (`SIOCGSKNS`, `NS_GET_USERNS`, `NS_GET_NSTYPE`, `NSFS_MAGIC`, `BTF_MAGIC`).
const LITERALS: [&str; 5] = ["0x894c", "0xb701", "0xb703", "0x6e73_6673", "0xeb9f"];

fn workspace() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(PathBuf::from).unwrap_or(manifest)
}

/// Every `.rs` file of the workspace (the fuzz workspace included), relative to its root,
/// with its text; build output and this test left out.
fn sources(root: &Path) -> Vec<(String, String)> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, String)>) {
        let entries =
            fs::read_dir(dir).unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if path.is_dir() {
                if !matches!(name, "target" | ".git" | "node_modules") {
                    walk(root, &path, out);
                }
            } else if name.ends_with(".rs") {
                let rel = path
                    .strip_prefix(root)
                    .expect("below the root")
                    .to_string_lossy()
                    .into_owned();
                if rel != "xtask/tests/kernel_numbers.rs" {
                    let text = fs::read_to_string(&path)
                        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
                    out.push((rel, text));
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out
}

/// The name a line defines as a constant (`const NAME:`, `pub const NAME:`, ...).
fn const_name(line: &str) -> Option<&str> {
    let code = line.split("//").next().unwrap_or("").trim_start();
    let rest = code
        .strip_prefix("pub(crate) ")
        .or_else(|| code.strip_prefix("pub "))
        .unwrap_or(code)
        .strip_prefix("const ")?;
    let name = rest.split(':').next()?.trim();
    (!name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
    .then_some(name)
}

/// Every stray in `files` (path, text): `SYS_bpf` outside [`BPF_CALL_SITE`], a name
/// [`UAPI`] or [`COMMON_NUMBERS`] defines defined again, an ioctl number outside [`UAPI`].
fn strays(files: &[(String, String)]) -> Vec<String> {
    let text_of = |path: &str| {
        files
            .iter()
            .find(|(p, _)| p == path)
            .map(|(_, t)| t.as_str())
            .unwrap_or_else(|| panic!("{path} is not in the workspace"))
    };
    let common_names: Vec<&str> = text_of(COMMON_NUMBERS)
        .lines()
        .filter_map(const_name)
        .filter(|n| n.starts_with("SO") || n.starts_with("IP6T_"))
        .collect();
    let names: Vec<&str> = text_of(UAPI)
        .lines()
        .filter_map(const_name)
        .chain(common_names)
        .collect();
    let mut defined: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    let mut out = Vec::new();
    for (path, text) in files {
        for (i, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            let at = format!("{path}:{}", i + 1);
            if code.contains("SYS_bpf") && path != BPF_CALL_SITE {
                out.push(format!(
                    "{at}: a bpf(2) call outside {BPF_CALL_SITE}: use linkerd_cni_sys::bpf"
                ));
            }
            if let Some(name) = const_name(line).filter(|n| names.contains(n)) {
                defined.entry(name).or_default().push(at.clone());
            }
            if path != UAPI {
                for literal in LITERALS.iter().filter(|l| code.contains(*l)) {
                    out.push(format!(
                        "{at}: {literal} written out: use linkerd_cni_sys::uapi"
                    ));
                }
            }
        }
    }
    for (name, places) in defined.into_iter().filter(|(_, p)| p.len() > 1) {
        out.push(format!(
            "{name} is defined {} times ({}): keep the one in {UAPI} (or, shared with the eBPF \
             programs, in common) and use it",
            places.len(),
            places.join(", ")
        ));
    }
    if !text_of(BPF_CALL_SITE).contains("libc::SYS_bpf") {
        out.push(format!(
            "{BPF_CALL_SITE} no longer calls bpf(2): update this test"
        ));
    }
    out
}

#[test]
fn the_kernel_interface_has_one_call_site_and_one_definition_of_each_number() {
    let strays = strays(&sources(&workspace()));
    assert!(strays.is_empty(), "{}", strays.join("\n"));
}

#[test]
fn the_checker_finds_each_kind_of_stray() {
    let file = |p: &str, t: &str| (p.to_string(), t.to_string());
    let clean = vec![
        file(
            BPF_CALL_SITE,
            "fn bpf() { libc::syscall(libc::SYS_bpf, 0) }\n",
        ),
        file(
            UAPI,
            "pub const SO_NETNS_COOKIE: c_int = 71;\npub const SIOCGSKNS: c_ulong = 0x894c;\n",
        ),
        file(
            COMMON_NUMBERS,
            "pub const SO_ORIGINAL_DST: i32 = 80;\npub const FLAG_IPV6: u32 = 4;\n",
        ),
        file(
            "agent/src/a.rs",
            "// SYS_bpf in a comment, 0x894c too\nconst FLAG_IPV6: u32 = 4;\n",
        ),
    ];
    assert_eq!(strays(&clean), Vec::<String>::new());
    let mut dirty = clean;
    dirty.push(file(
        "plugin/src/b.rs",
        "const SO_NETNS_COOKIE: libc::c_int = 71;\npub(crate) const SO_ORIGINAL_DST: i32 = 80;\n\
         fn f() { libc::syscall(libc::SYS_bpf, 1); libc::ioctl(0, 0x894c) }\n",
    ));
    let found = strays(&dirty);
    assert_eq!(found.len(), 4, "{found:#?}");
    assert!(
        found[0].starts_with("plugin/src/b.rs:3: a bpf(2) call"),
        "{found:#?}"
    );
    assert!(
        found[1].starts_with("plugin/src/b.rs:3: 0x894c written out"),
        "{found:#?}"
    );
    assert!(
        found[2].starts_with("SO_NETNS_COOKIE is defined 2 times"),
        "{found:#?}"
    );
    assert!(
        found[3].starts_with("SO_ORIGINAL_DST is defined 2 times"),
        "{found:#?}"
    );
}
