//! Which pods the check lists, from Events and pods as the API returns them.

use serde_json::json;

use super::*;

fn event(name: &str, pod: &str, uid: &str, reason: &str, at: &str, node: &str) -> Event {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "shop"},
        "eventTime": at,
        "reason": reason,
        "note": format!("{reason} note"),
        "type": "Normal",
        "action": "Verify",
        "reportingController": REPORTING_CONTROLLER,
        "reportingInstance": node,
        "regarding": {"apiVersion": "v1", "kind": "Pod", "namespace": "shop", "name": pod, "uid": uid},
    }))
    .expect("an Event")
}

fn pod(name: &str, uid: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "shop", "uid": uid},
        "spec": {"nodeName": "node-b", "containers": [{"name": "app"}]},
        "status": {"phase": "Running"},
    }))
    .expect("a Pod")
}

fn observed(events: Vec<Event>, pods: &[Pod]) -> Observed {
    let mut o = Observed {
        events,
        ..Observed::default()
    };
    for (ns, name) in reported_unredirected(&o.events) {
        let found = pods
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(name.as_str()))
            .cloned();
        o.pods.insert((ns, name), found);
    }
    o
}

const T0: &str = "2026-11-29T10:00:00.000000Z";
const T1: &str = "2026-11-29T10:05:00.000000Z";

#[test]
fn a_pod_whose_latest_event_is_unredirected_is_listed_with_its_node_and_reason() {
    let events = vec![
        event(
            "a.1",
            "web",
            "u-web",
            "LinkerdCNIUnredirected",
            T0,
            "node-a",
        ),
        // Redirected before, unredirected since: listed.
        event("b.1", "api", "u-api", "LinkerdCNIRedirected", T0, "node-a"),
        event(
            "b.2",
            "api",
            "u-api",
            "LinkerdCNIUnredirected",
            T1,
            "node-a",
        ),
        // Unredirected, then repaired: not listed.
        event("c.1", "db", "u-db", "LinkerdCNIUnredirected", T0, "node-a"),
        event("c.2", "db", "u-db", "LinkerdCNIRepaired", T1, "node-a"),
    ];
    let pods = [pod("web", "u-web"), pod("api", "u-api"), pod("db", "u-db")];
    let r = judge(&observed(events, &pods));
    assert_eq!(r.status, Status::Fail, "{r:?}");
    assert!(
        r.detail
            .contains("shop/web on node node-a: LinkerdCNIUnredirected note"),
        "{}",
        r.detail
    );
    assert!(r.detail.contains("shop/api on node node-a"), "{}", r.detail);
    assert!(!r.detail.contains("shop/db"), "{}", r.detail);
    assert!(r.detail.starts_with("2 meshed pod(s)"), "{}", r.detail);
}

#[test]
fn pods_gone_recreated_or_redirected_again_pass() {
    let events = vec![
        // Deleted since (the repair, or by hand).
        event(
            "a.1",
            "gone",
            "u-gone",
            "LinkerdCNIUnredirected",
            T0,
            "node-a",
        ),
        // Recreated under the same name: another UID.
        event(
            "b.1",
            "again",
            "u-old",
            "LinkerdCNIUnredirected",
            T0,
            "node-a",
        ),
        // Redirected once its problem ended (the series' last observation counts).
        event(
            "c.1",
            "late",
            "u-late",
            "LinkerdCNIUnredirected",
            T0,
            "node-a",
        ),
        event(
            "c.2",
            "late",
            "u-late",
            "LinkerdCNIRedirected",
            T1,
            "node-a",
        ),
    ];
    let pods = [pod("again", "u-new"), pod("late", "u-late")];
    let r = judge(&observed(events, &pods));
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.name, CHECK);
    // None at all: passes too.
    assert_eq!(judge(&Observed::default()).status, Status::Ok);
}

#[test]
fn a_series_observed_later_outranks_a_newer_first_event() {
    let mut standing = event(
        "a.1",
        "web",
        "u-web",
        "LinkerdCNIUnredirected",
        T0,
        "node-a",
    );
    standing.series = Some(k8s_openapi::api::events::v1::EventSeries {
        count: 3,
        last_observed_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
            "2026-11-29T10:09:00Z".parse().expect("time"),
        ),
    });
    let events = vec![
        standing,
        event("a.2", "web", "u-web", "LinkerdCNIRedirected", T1, "node-a"),
    ];
    let r = judge(&observed(events, &[pod("web", "u-web")]));
    assert_eq!(r.status, Status::Fail, "{r:?}");
}

#[test]
fn events_of_other_controllers_are_ignored() {
    let mut other = event(
        "a.1",
        "web",
        "u-web",
        "LinkerdCNIUnredirected",
        T0,
        "node-a",
    );
    other.reporting_controller = Some("someone-else".into());
    let r = judge(&observed(vec![other], &[pod("web", "u-web")]));
    assert_eq!(r.status, Status::Ok, "{r:?}");
}
