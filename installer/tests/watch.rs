//! The watch loop: re-patching after another writer, bounded work under bursts, waiting for
//! the first config, cleanup on shutdown.

mod support;

use std::{fs, time::Duration};

use support::{Node, Running, eventually, fixture, is_patched, plugin_types, replace_file};

const FLANNEL: &str = "10-flannel.conflist";

fn flannel_original() -> Vec<u8> {
    fs::read(fixture(&format!("net.d/{FLANNEL}"))).unwrap_or_else(|e| panic!("{e}"))
}

async fn started_with_flannel() -> (Node, Running) {
    support::init_tracing();
    let node = Node::new();
    node.add_fixtures(&[FLANNEL]);
    let running = Running::start(&node.installer);
    eventually(Duration::from_secs(5), "initial patch", || {
        fs::read(node.net(FLANNEL)).is_ok_and(|b| is_patched(&node, &b))
    })
    .await;
    (node, running)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewritten_conflist_is_repatched_within_a_second() {
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
            Duration::from_secs(1),
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
    // 100 rewrites spread over ~200 ms, so the loop is awake during the burst.
    for i in 0..100 {
        if i % 2 == 0 {
            replace_file(&path, &original);
        } else {
            fs::write(&path, &original).unwrap_or_else(|e| panic!("{e}"));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    eventually(Duration::from_secs(1), "entry back after the burst", || {
        fs::read(&path).is_ok_and(|b| is_patched(&node, &b))
    })
    .await;
    let after_burst = node.installer.write_counts().conflists;
    let ours = after_burst - before;
    assert!(
        (1..=5).contains(&ours),
        "{ours} writes of ours for 100 foreign rewrites"
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
    eventually(Duration::from_secs(5), "kubeconfig", || kubeconfig.exists()).await;
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
    eventually(
        Duration::from_secs(1),
        "the new .conf converted and patched",
        || {
            fs::read(node.net("10-calico.conflist")).is_ok_and(|b| is_patched(&node, &b))
                && !node.net("10-calico.conf").exists()
        },
    )
    .await;
    let status = node.installer.status();
    assert!(status.ready(), "{status:?}");
    running.stop().await.unwrap_or_else(|e| panic!("stop: {e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_removes_everything() {
    let (node, running) = started_with_flannel().await;
    node.add_fixtures(&["05-cilium.conflist"]);
    eventually(Duration::from_secs(1), "second config patched", || {
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
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
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
    let window = Duration::from_millis(1500);
    tokio::time::sleep(window).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let rewrites = writer
        .join()
        .unwrap_or_else(|_| panic!("writer thread panicked"));
    let ours = node.installer.write_counts().conflists - before;
    // Events never pause, so the loop flushes every MAX_DELAY: it keeps trying (is not
    // starved by the events) but at a bounded rate.
    let max = (window.as_millis() / linkerd_cni_installer::MAX_DELAY.as_millis()) as u64 + 2;
    assert!(
        (2..=max).contains(&ours),
        "{ours} writes of ours against {rewrites} foreign rewrites (max {max})"
    );
    eventually(
        Duration::from_secs(1),
        "entry back once the writer stops",
        || fs::read(&path).is_ok_and(|b| is_patched(&node, &b)),
    )
    .await;
    running.stop().await.unwrap_or_else(|e| panic!("stop: {e}"));
}
