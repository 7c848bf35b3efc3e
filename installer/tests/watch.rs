//! The watch loop: re-patching after another writer, bounded work under bursts, waiting for
//! the first config, cleanup on shutdown.

mod support;

use std::{
    fs,
    time::{Duration, Instant},
};

use linkerd_cni_installer::{QUIET, RESYNC};
use support::{Node, Running, eventually, fixture, is_patched, plugin_types, replace_file};

const FLANNEL: &str = "10-flannel.conflist";

/// How long a test waits for what the installer must do: a guard against a hang, not a claim
/// about latency (the machine may be busy), and well under [`RESYNC`], so that the periodic
/// full pass cannot be what did it.
const GUARD: Duration = Duration::from_secs(10);
const _: () = assert!(3 * GUARD.as_secs() <= RESYNC.as_secs());

/// The most passes the watch loop can make in `elapsed`: a pass waits [`QUIET`] after the first
/// event that follows the pass before it, so passes are at least that far apart however many
/// events come and however busy the machine is (a busy loop only merges passes).
fn most_passes(elapsed: Duration) -> u64 {
    (elapsed.as_millis() / QUIET.as_millis()) as u64 + 1
}

fn flannel_original() -> Vec<u8> {
    fs::read(fixture(&format!("net.d/{FLANNEL}"))).unwrap_or_else(|e| panic!("{e}"))
}

async fn started_with_flannel() -> (Node, Running) {
    support::init_tracing();
    let node = Node::new();
    node.add_fixtures(&[FLANNEL]);
    let running = Running::start(&node.installer);
    eventually(GUARD, "initial patch", || {
        fs::read(node.net(FLANNEL)).is_ok_and(|b| is_patched(&node, &b))
    })
    .await;
    (node, running)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewritten_conflist_is_repatched_by_the_watch() {
    let (node, running) = started_with_flannel().await;
    let path = node.net(FLANNEL);
    // (how the other CNI writes, its content)
    type Writer = fn(&std::path::Path, &[u8]);
    let writers: &[(&str, Writer)] = &[
        ("rename over", |p, b| replace_file(p, b)),
        ("in place", |p, b| {
            fs::write(p, b).unwrap_or_else(|e| panic!("{e}"))
        }),
    ];
    for (how, write) in writers {
        let before = node.installer.write_counts().conflists;
        write(&path, &flannel_original());
        eventually(
            GUARD,
            &format!("entry back after a rewrite ({how})"),
            || fs::read(&path).is_ok_and(|b| is_patched(&node, &b)),
        )
        .await;
        assert_eq!(
            plugin_types(&node.read(FLANNEL)),
            ["flannel", "portmap", "linkerd-cni"],
            "{how}"
        );
        assert_eq!(
            node.installer.write_counts().conflists,
            before + 1,
            "{how}: one write of ours"
        );
    }
    running.stop().await.unwrap_or_else(|e| panic!("stop: {e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burst_of_rewrites_causes_bounded_work() {
    let (node, running) = started_with_flannel().await;
    let path = node.net(FLANNEL);
    let before = node.installer.write_counts().conflists;
    let original = flannel_original();
    let start = Instant::now();
    // 100 rewrites spread over ~200 ms (longer on a busy machine), so the loop is awake during
    // the burst.
    for i in 0..100 {
        if i % 2 == 0 {
            replace_file(&path, &original);
        } else {
            fs::write(&path, &original).unwrap_or_else(|e| panic!("{e}"));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    eventually(GUARD, "entry back after the burst", || {
        fs::read(&path).is_ok_and(|b| is_patched(&node, &b))
    })
    .await;
    let after_burst = node.installer.write_counts().conflists;
    // Every write of ours so far happened within `elapsed` (a write is counted before it is
    // visible).
    let elapsed = start.elapsed();
    let ours = after_burst - before;
    let max = most_passes(elapsed);
    assert!(
        (1..=max).contains(&ours),
        "{ours} writes of ours for 100 foreign rewrites in {elapsed:?} (at most {max})"
    );

    // Quiet afterwards: no write chases another.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        node.installer.write_counts().conflists,
        after_burst,
        "writes kept coming after the burst"
    );
    assert!(
        is_patched(&node, &node.read(FLANNEL)),
        "final file not patched"
    );
    running.stop().await.unwrap_or_else(|e| panic!("stop: {e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_for_the_first_config_and_never_writes_a_standalone_one() {
    support::init_tracing();
    let node = Node::new();
    let running = Running::start(&node.installer);
    let kubeconfig = node.installer.config().kubeconfig_path();
    eventually(GUARD, "kubeconfig", || kubeconfig.exists()).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        node.listing(),
        ["ZZZ-linkerd-cni-kubeconfig"],
        "something besides the kubeconfig was written"
    );
    assert!(!node.installer.status().ready(), "ready without any config");

    // The primary CNI arrives and writes a single-plugin .conf.
    let calico = fs::read(fixture("net.d/10-calico.conf")).unwrap_or_else(|e| panic!("{e}"));
    replace_file(&node.net("10-calico.conf"), &calico);
    eventually(GUARD, "the new .conf converted and patched", || {
        fs::read(node.net("10-calico.conflist")).is_ok_and(|b| is_patched(&node, &b))
            && !node.net("10-calico.conf").exists()
    })
    .await;
    let status = node.installer.status();
    assert!(status.ready(), "{status:?}");
    running.stop().await.unwrap_or_else(|e| panic!("stop: {e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_removes_everything() {
    let (node, running) = started_with_flannel().await;
    node.add_fixtures(&["05-cilium.conflist"]);
    eventually(GUARD, "second config patched", || {
        fs::read(node.net("05-cilium.conflist")).is_ok_and(|b| is_patched(&node, &b))
    })
    .await;
    running.stop().await.unwrap_or_else(|e| panic!("stop: {e}"));
    assert_eq!(plugin_types(&node.read(FLANNEL)), ["flannel", "portmap"]);
    assert_eq!(
        plugin_types(&node.read("05-cilium.conflist")),
        ["cilium-cni"]
    );
    assert_eq!(
        node.listing(),
        ["05-cilium.conflist", FLANNEL],
        "kubeconfig or temp files left"
    );
    assert!(
        !node.installer.config().binary_path().exists(),
        "binary left"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writer_that_never_stops_gets_a_bounded_rate_of_repatches() {
    let (node, running) = started_with_flannel().await;
    let path = node.net(FLANNEL);
    let before = node.installer.write_counts().conflists;
    let ours = || node.installer.write_counts().conflists - before;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let start = Instant::now();
    let writer = {
        let (path, stop, original) = (path.clone(), stop.clone(), flannel_original());
        std::thread::spawn(move || {
            let mut n = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                replace_file(&path, &original);
                n += 1;
                std::thread::sleep(Duration::from_millis(1));
            }
            n
        })
    };
    // Events never pause, yet the loop keeps flushing (its timer comes before the events):
    // it re-patches again and again while the writer runs, never starved by the events...
    eventually(
        GUARD,
        "two writes of ours while the writer never stops",
        || ours() >= 2,
    )
    .await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let rewrites = writer
        .join()
        .unwrap_or_else(|_| panic!("writer thread panicked"));
    // ... and at a bounded rate: every write of ours so far happened within `elapsed`.
    let ours = ours();
    let elapsed = start.elapsed();
    let max = most_passes(elapsed);
    assert!(
        (2..=max).contains(&ours),
        "{ours} writes of ours against {rewrites} foreign rewrites in {elapsed:?} (at most {max})"
    );
    eventually(GUARD, "entry back once the writer stops", || {
        fs::read(&path).is_ok_and(|b| is_patched(&node, &b))
    })
    .await;
    running.stop().await.unwrap_or_else(|e| panic!("stop: {e}"));
}
