//! Which pods the repair takes, and its token bucket.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Pod, PodIP, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use linkerd_cni_k8s::CachedPod;
use linkerd_cni_proto::config::LinkerdConfig;

use super::{TokenBucket, unredirected};
use crate::agent::adopt::KnownPods;

fn pod(name: &str, init: &[&str], containers: &[&str]) -> Pod {
    let list = |names: &[&str]| {
        names
            .iter()
            .map(|n| Container {
                name: n.to_string(),
                ..Container::default()
            })
            .collect()
    };
    Pod {
        metadata: ObjectMeta {
            namespace: Some("shop".into()),
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: list(containers),
            init_containers: Some(list(init)),
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            phase: Some("Running".into()),
            pod_ips: Some(vec![PodIP {
                ip: "10.0.0.7".into(),
            }]),
            ..PodStatus::default()
        }),
    }
}

fn meshed(name: &str) -> Pod {
    pod(name, &["linkerd-proxy"], &["app"])
}

fn candidate(p: &Pod, known: &KnownPods) -> bool {
    let cached = CachedPod::from_pod(p).expect("named pod");
    unredirected(&cached, &LinkerdConfig::default(), known)
}

#[test]
fn only_running_unregistered_meshed_pods_are_candidates() {
    let none = KnownPods::default();
    assert!(candidate(&meshed("early"), &none));
    // Registered (by UID): redirected already.
    assert!(!candidate(
        &meshed("early"),
        &KnownPods::from_uids(["uid-early"])
    ));
    // Unmeshed.
    assert!(!candidate(&pod("plain", &[], &["app"]), &none));
    // Meshed by Linkerd's iptables (linkerd-init): not ours.
    assert!(!candidate(
        &pod("iptables", &["linkerd-init", "linkerd-proxy"], &["app"]),
        &none
    ));
    // hostNetwork.
    let mut host = meshed("host");
    host.spec.as_mut().expect("spec").host_network = Some(true);
    assert!(!candidate(&host, &none));
    // Being deleted.
    let mut going = meshed("going");
    going.metadata.deletion_timestamp = Some(Time(Default::default()));
    assert!(!candidate(&going, &none));
    // No address yet: its CNI ADD may be under way.
    let mut adding = meshed("adding");
    adding.status.as_mut().expect("status").pod_ips = None;
    assert!(!candidate(&adding, &none));
    // Ended.
    let mut done = meshed("done");
    done.status.as_mut().expect("status").phase = Some("Succeeded".into());
    assert!(!candidate(&done, &none));
    // No UID: nothing to make the delete's precondition of.
    let mut anonymous = meshed("anonymous");
    anonymous.metadata.uid = None;
    assert!(!candidate(&anonymous, &none));
    // In a namespace the conflist excludes.
    let cached = CachedPod::from_pod(&meshed("excluded")).expect("named pod");
    let base = LinkerdConfig {
        excluded_namespaces: vec!["shop".into()],
        ..LinkerdConfig::default()
    };
    assert!(!unredirected(&cached, &base, &none));
}

#[test]
fn the_bucket_allows_its_burst_then_its_rate() {
    let t0 = Instant::now();
    let mut bucket = TokenBucket::new(2, 60, t0);
    assert!(bucket.take(t0));
    assert!(bucket.take(t0));
    assert!(!bucket.take(t0), "burst spent");
    assert!(!bucket.take(t0 + Duration::from_millis(500)));
    assert!(
        bucket.take(t0 + Duration::from_millis(1000)),
        "one a second"
    );
    assert!(!bucket.take(t0 + Duration::from_millis(1000)));
    // Never above its capacity, however long it waited.
    let later = t0 + Duration::from_secs(3600);
    assert!(bucket.take(later));
    assert!(bucket.take(later));
    assert!(!bucket.take(later));
}
