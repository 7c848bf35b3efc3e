//! Whether a pod's cgroup lies below the shared attachment's, and the words of each problem.

use std::path::PathBuf;

use super::{Problem, SharedCover, shared_cover};

#[test]
fn a_pod_cgroup_is_covered_only_below_the_shared_cgroup() {
    let root = std::env::temp_dir().join(format!("l5d-verify-cover-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    for d in [
        "kubepods/besteffort/poda",
        "elsewhere/podb",
        "kubepods-x/podc",
    ] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::os::unix::fs::symlink(root.join("elsewhere/podb"), root.join("kubepods/link")).unwrap();
    let shared = root.join("kubepods");
    let cover = |rel: &str| shared_cover(&root, &shared, root.join(rel));
    assert_eq!(
        cover("kubepods/besteffort/poda"),
        SharedCover::Covered(root.join("kubepods/besteffort/poda"))
    );
    assert_eq!(
        cover("elsewhere/podb"),
        SharedCover::Outside(root.join("elsewhere/podb"))
    );
    // A sibling whose name starts with the shared cgroup's is not below it.
    assert!(matches!(cover("kubepods-x/podc"), SharedCover::Outside(_)));
    // Through a symbolic link, where it really is.
    assert!(matches!(cover("kubepods/link"), SharedCover::Outside(_)));
    // Through `..` out of the shared cgroup.
    assert!(matches!(
        cover("kubepods/../elsewhere/podb"),
        SharedCover::Outside(_)
    ));
    // Outside the cgroup2 root altogether.
    assert!(matches!(
        shared_cover(&root, &shared, PathBuf::from("/")),
        SharedCover::Outside(_)
    ));
    // The shared attachment on the root covers every pod.
    assert!(matches!(
        shared_cover(&root, &root, root.join("elsewhere/podb")),
        SharedCover::Covered(_)
    ));
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn every_problem_has_its_own_label_and_names_what_it_found() {
    let problems = [
        Problem::Unregistered,
        Problem::OutsideShared {
            pod_cgroup: "/cg/other/pod1".into(),
            shared: "/cg/kubepods".into(),
        },
        Problem::Unverified {
            shared: "/cg/kubepods".into(),
        },
    ];
    let labels: Vec<&str> = problems.iter().map(Problem::label).collect();
    assert_eq!(labels, Problem::LABELS);
    let outside = problems[1].note();
    assert!(
        outside.contains("/cg/other/pod1") && outside.contains("/cg/kubepods"),
        "{outside}"
    );
    for p in &problems {
        assert!(p.note().len() <= linkerd_cni_k8s::events::MAX_NOTE, "{p:?}");
    }
}
