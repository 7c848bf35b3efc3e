//! Finding a pod's cgroup v2 directory: from the runtime's `runtimeConfig.cgroupPath` when it
//! sends one, otherwise from the pod UID in either kubelet layout (cgroupfs or systemd driver).

use std::path::{Path, PathBuf};

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
pub use linkerd_cni_common::query::kubepods;

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
