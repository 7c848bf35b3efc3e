//! `EventRecorder` against the fake Kubernetes API server over real HTTP, through the
//! production client path (a kubeconfig file, `client::client`): what the API receives
//! (an `events.k8s.io/v1` Event the real server's validation accepts), how repeats aggregate
//! into a `series`, that a full queue drops and counts instead of waiting, and that a failing
//! API is counted, never fatal.

use std::{
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use linkerd_cni_fake_apiserver::{FakeApiServer, TempKubeconfig};
use linkerd_cni_k8s::{
    client,
    events::{EventRecorder, Limits, PodRef, REPORTING_CONTROLLER, Reason},
};
use serde_json::Value;

const NODE: &str = "node-a";
const WAIT: Duration = Duration::from_secs(10);

async fn recorder(server: &FakeApiServer, limits: Limits) -> (EventRecorder, TempKubeconfig) {
    let kubeconfig = TempKubeconfig::new(&server.url());
    let client = client::client(Some(kubeconfig.path()))
        .await
        .expect("client for the fake API server");
    (EventRecorder::spawn_with(client, NODE, limits), kubeconfig)
}

async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < WAIT, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn pod() -> PodRef {
    PodRef::new("emojivoto", "web-1", Some("uid-web-1".into()))
}

#[tokio::test]
async fn an_event_on_the_pod_as_the_real_api_validates_it() {
    let server = FakeApiServer::start().expect("fake API server");
    let (recorder, _k) = recorder(&server, Limits::default()).await;
    recorder.record(
        &pod(),
        Reason::Refused,
        "tenant cilium holds the pods' cgroup exclusively",
    );
    wait_for("the Event", || server.events().len() == 1).await;
    let e = &server.events()[0];
    assert_eq!(e["apiVersion"], "events.k8s.io/v1");
    assert_eq!(e["metadata"]["namespace"], "emojivoto");
    assert_eq!(e["reason"], "LinkerdCNIRefused");
    assert_eq!(e["type"], "Warning");
    assert_eq!(e["action"], "Refuse");
    assert_eq!(e["reportingController"], REPORTING_CONTROLLER);
    assert_eq!(e["reportingInstance"], NODE);
    assert_eq!(
        e["note"],
        "tenant cilium holds the pods' cgroup exclusively"
    );
    assert_eq!(e["regarding"]["kind"], "Pod");
    assert_eq!(e["regarding"]["name"], "web-1");
    assert_eq!(e["regarding"]["uid"], "uid-web-1");
    assert!(e["eventTime"].is_string());
    assert_eq!(recorder.stats().created.load(Ordering::Relaxed), 1);
    assert_eq!(recorder.stats().failed.load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn repeats_count_into_one_series() {
    let server = FakeApiServer::start().expect("fake API server");
    let limits = Limits {
        patch_interval: Duration::from_millis(100),
        ..Limits::default()
    };
    let (recorder, _k) = recorder(&server, limits).await;
    for _ in 0..50 {
        recorder.record(&pod(), Reason::Redirected, "attached");
    }
    let count = |server: &FakeApiServer| -> Vec<i64> {
        server
            .events()
            .iter()
            .map(|e| e["series"]["count"].as_i64().unwrap_or(1))
            .collect()
    };
    wait_for("one Event counting 50", || count(&server) == vec![50]).await;
    // A different note is a different Event; so is another pod.
    recorder.record(&pod(), Reason::Redirected, "attached again");
    recorder.record(
        &PodRef::new("emojivoto", "web-2", None),
        Reason::Redirected,
        "attached",
    );
    wait_for("three Events", || server.events().len() == 3).await;
    assert_eq!(recorder.stats().created.load(Ordering::Relaxed), 3);
    assert_eq!(recorder.stats().aggregated.load(Ordering::Relaxed), 49);
    // Patches never touch the fields the API keeps immutable (it would refuse them).
    assert_eq!(recorder.stats().failed.load(Ordering::Relaxed), 0);
    let patches = server
        .requests()
        .iter()
        .filter(|r| r.method == "PATCH")
        .count();
    assert!(
        patches < 49,
        "repeats are batched into few patches, got {patches}"
    );
}

#[tokio::test]
async fn a_full_queue_drops_and_counts_without_waiting() {
    let server = FakeApiServer::start().expect("fake API server");
    let limits = Limits {
        queue: 4,
        burst: 1,
        qps: 1,
        ..Limits::default()
    };
    let (recorder, _k) = recorder(&server, limits).await;
    let start = Instant::now();
    for i in 0..100 {
        recorder.record(
            &PodRef::new("emojivoto", format!("web-{i}"), None),
            Reason::Redirected,
            "",
        );
    }
    let took = start.elapsed();
    let dropped = recorder.stats().dropped.load(Ordering::Relaxed);
    // Written while the loop ran: at most the burst plus one a second; queued: at most 4.
    let bound = 100 - 4 - 2 - took.as_secs();
    assert!(
        dropped >= bound,
        "dropped {dropped} of 100 in {took:?} (queue 4, 1 write/s)"
    );
    assert_eq!(recorder.stats().recorded.load(Ordering::Relaxed), 100);
    // What was queued is still written, at the bucket's rate.
    wait_for("the queued Events", || {
        server.events().len() as u64 + dropped == 100
    })
    .await;
}

#[tokio::test]
async fn a_failing_api_is_counted_not_fatal() {
    let server = FakeApiServer::start().expect("fake API server");
    let (recorder, _k) = recorder(&server, Limits::default()).await;
    server.fail_requests(Some(500));
    recorder.record(&pod(), Reason::Unredirected, "no registration");
    wait_for("the failed write", || {
        recorder.stats().failed.load(Ordering::Relaxed) == 1
    })
    .await;
    server.fail_requests(None);
    recorder.record(&pod(), Reason::Unredirected, "no registration");
    wait_for("the Event once the API answers", || {
        server.events().len() == 1
    })
    .await;
    let e: &Value = &server.events()[0];
    assert_eq!(e["reason"], "LinkerdCNIUnredirected");
}
