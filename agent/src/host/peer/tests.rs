use std::{
    fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
};

use super::*;

fn dirs() -> Vec<PathBuf> {
    PeerPlaces::default().netns_dirs
}

/// A scratch directory named after this process, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(what: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("l5d-peer-{what}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("scratch dir");
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

#[test]
fn netns_paths_are_placed_by_their_text() {
    let dirs = dirs();
    let place = |p: &str| netns_place(Path::new(p), &dirs);
    assert_eq!(
        place("/var/run/netns/cni-1234").expect("containerd's pin"),
        NetnsPlace::Pinned {
            dir: Path::new("/var/run/netns"),
            rest: "cni-1234".into()
        }
    );
    assert!(matches!(
        place("/run/netns/a/b"),
        Ok(NetnsPlace::Pinned { .. })
    ));
    assert_eq!(place("/proc/4242/ns/net").unwrap(), NetnsPlace::Process);
    for dotted in [
        "/run/netns/../../proc/1/ns/net",
        "/run/netns/./cni-1",
        "/run/netns/..",
        "/proc/1/ns/../ns/net",
        "run/netns/cni-1",
        "",
    ] {
        assert!(
            matches!(place(dotted), Err(PeerError::NotPlain { .. })),
            "{dotted}: {:?}",
            place(dotted)
        );
    }
    for outside in [
        "/etc/passwd",
        "/run/netns",
        "/run/netnsx/cni-1",
        "/proc/self/ns/net",
        "/proc/1/ns/mnt",
        "/proc/1/task/1/ns/net",
    ] {
        assert!(
            matches!(place(outside), Err(PeerError::NetnsOutside { .. })),
            "{outside}: {:?}",
            place(outside)
        );
    }
}

#[test]
fn the_agents_own_netns_is_refused() {
    let own = format!("/proc/{}/ns/net", std::process::id());
    let err = open_netns(Path::new(&own), &PeerPlaces::default(), Path::to_path_buf)
        .expect_err("the agent's own netns");
    assert!(matches!(err, PeerError::HostNetns { .. }), "{err}");
}

#[test]
fn symbolic_links_and_files_below_a_netns_dir_are_refused() {
    let scratch = Scratch::new("netns");
    let dir = scratch.0.join("netns");
    fs::create_dir(&dir).unwrap();
    symlink("/proc/self/ns/net", dir.join("to-own")).unwrap();
    symlink("..", dir.join("up")).unwrap();
    fs::write(scratch.0.join("outside"), "").unwrap();
    fs::write(dir.join("plain-file"), "").unwrap();
    let places = PeerPlaces {
        netns_dirs: vec![dir.clone()],
        ..PeerPlaces::default()
    };
    let open = |name: &str| open_netns(&dir.join(name), &places, Path::to_path_buf);
    for escape in ["to-own", "up/outside"] {
        let err = open(escape).expect_err(escape);
        assert!(
            matches!(err, PeerError::NetnsEscapes { .. }),
            "{escape}: {err}"
        );
    }
    assert!(matches!(
        open("plain-file"),
        Err(PeerError::Netns(NetnsError::NotNetns { .. }))
    ));
    assert!(matches!(
        open("missing"),
        Err(PeerError::Netns(NetnsError::NotFound { .. }))
    ));
}

#[test]
fn only_cgroups_strictly_inside_the_pod_trees_pass() {
    let scratch = Scratch::new("cgroup");
    let root = &scratch.0;
    for d in [
        "kubepods/besteffort/podaaaa",
        "kubepods/podbbbb",
        "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podcc_cc.slice",
        "system.slice/podevil",
        "other/podq",
    ] {
        fs::create_dir_all(root.join(d)).unwrap();
    }
    symlink(root.join("other/podq"), root.join("kubepods/podlink")).unwrap();
    let trees = PeerPlaces::default().pod_cgroup_trees;
    let check = |rel: &str| check_pod_cgroup(root, &trees, &root.join(rel));
    for ok in [
        "kubepods/besteffort/podaaaa",
        "kubepods/podbbbb",
        "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podcc_cc.slice",
    ] {
        check(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
    for refused in [
        "",
        "kubepods",
        "kubepods/besteffort",
        "kubepods.slice",
        "kubepods.slice/kubepods-burstable.slice",
        "system.slice/podevil",
        "other/podq",
        "kubepods/../other/podq",
        "kubepods/podlink",
        "kubepods/podmissing",
    ] {
        assert!(
            matches!(check(refused), Err(PeerError::CgroupOutside { .. })),
            "{refused:?}: {:?}",
            check(refused)
        );
    }
    assert!(check_pod_cgroup(root, &trees, Path::new("/")).is_err());
    // A link inside the trees to a pod cgroup passes as the path it resolves to: the
    // registration records that, never the link (issue 45, D1).
    symlink(
        root.join("kubepods/podbbbb"),
        root.join("kubepods/podalias"),
    )
    .unwrap();
    assert_eq!(
        check("kubepods/podalias").expect("resolves to a pod cgroup"),
        root.join("kubepods/podbbbb")
    );
    // `/` as a tree: every cgroup but the root (and the QoS ones).
    let everywhere = [PathBuf::from("/")];
    check_pod_cgroup(root, &everywhere, &root.join("other/podq")).expect("inside /");
    check_pod_cgroup(root, &everywhere, &root.join("other")).expect("inside /");
    assert!(check_pod_cgroup(root, &everywhere, root).is_err());
    assert!(check_pod_cgroup(root, &everywhere, &root.join("kubepods/besteffort")).is_err());
}
