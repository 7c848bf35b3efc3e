//! The cluster-wide check that no meshed pod runs without redirection, from the Events the
//! node agents record on pods (`linkerd_cni_k8s::events`): on every node, the agent records
//! `LinkerdCNIUnredirected` on a meshed pod that runs without (verified) redirection and
//! records it again while that lasts, before the API server's Event TTL drops it; it records
//! `LinkerdCNIRedirected` or `LinkerdCNIRepaired` when that ends. So a pod whose latest Event
//! of ours is `LinkerdCNIUnredirected`, and which still exists (the same UID, not being
//! deleted), runs without redirection: the check lists each with its node and the reason the
//! agent gave.
//!
//! Reads: LIST of `events.k8s.io/v1` Events in every namespace (paged), and a GET of each
//! pod so reported. Gathering ([`gather`]) and judging ([`judge`]) are apart, so the rule is
//! tested on plain objects.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::{core::v1::Pod, events::v1::Event},
    jiff::Timestamp,
};
use kube::{Api, Client, api::ListParams};

use linkerd_cni_k8s::events::{REPORTING_CONTROLLER, Reason};

use super::result::{CheckResult, Status};

/// The check's name, in the `linkerd-cni-plugin` category.
pub const CHECK: &str = "no meshed pod runs without redirection";

/// Events listed per request.
const PAGE: u32 = 500;
/// Pods named in the check's failure, at most (the rest counted).
const SHOWN: usize = 20;

/// What the check reads.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    /// The linkerd-cni agents' Events on pods (others may be included: they are ignored).
    pub events: Vec<Event>,
    /// The pods whose latest Event says unredirected, by namespace/name (`None`: gone).
    pub pods: BTreeMap<(String, String), Option<Pod>>,
}

/// A pod's identity in the Events: namespace, name and UID (when the Event has one).
type PodKey = (String, String, Option<String>);

/// The latest time an Event says something: its series' last observation, else its
/// `eventTime`, else its creation.
fn observed_at(e: &Event) -> Option<Timestamp> {
    e.series
        .as_ref()
        .map(|s| s.last_observed_time.0)
        .or_else(|| e.event_time.as_ref().map(|t| t.0))
        .or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

/// Per pod, the latest Event an agent of ours recorded on it.
pub fn latest_per_pod(events: &[Event]) -> BTreeMap<PodKey, &Event> {
    let mut latest: BTreeMap<PodKey, &Event> = BTreeMap::new();
    for e in events {
        if e.reporting_controller.as_deref() != Some(REPORTING_CONTROLLER)
            || e.reason.as_deref().and_then(Reason::from_reason).is_none()
        {
            continue;
        }
        let Some(pod) = e
            .regarding
            .as_ref()
            .filter(|r| r.kind.as_deref() == Some("Pod"))
        else {
            continue;
        };
        let (Some(namespace), Some(name)) = (pod.namespace.clone(), pod.name.clone()) else {
            continue;
        };
        let key = (namespace, name, pod.uid.clone());
        match latest.get(&key) {
            Some(seen) if observed_at(seen) >= observed_at(e) => {}
            _ => {
                latest.insert(key, e);
            }
        }
    }
    latest
}

/// The pods (namespace/name) whose latest Event of ours says they run without redirection.
pub fn reported_unredirected(events: &[Event]) -> Vec<(String, String)> {
    latest_per_pod(events)
        .into_iter()
        .filter(|(_, e)| e.reason.as_deref() == Some(Reason::Unredirected.as_str()))
        .map(|((ns, name, _), _)| (ns, name))
        .collect()
}

/// The check's verdict on what was observed.
pub fn judge(o: &Observed) -> CheckResult {
    let latest = latest_per_pod(&o.events);
    let mut unredirected = Vec::new();
    for ((namespace, name, uid), e) in &latest {
        if e.reason.as_deref() != Some(Reason::Unredirected.as_str()) {
            continue;
        }
        let pod = o
            .pods
            .get(&(namespace.clone(), name.clone()))
            .and_then(Option::as_ref);
        // Still the pod the Event is about, and still running: a pod deleted (by the repair,
        // or recreated under its name) keeps its Events until they expire.
        let Some(pod) = pod.filter(|p| {
            (uid.is_none() || p.metadata.uid == *uid)
                && p.metadata.deletion_timestamp.is_none()
                && !p
                    .status
                    .as_ref()
                    .and_then(|s| s.phase.as_deref())
                    .is_some_and(|phase| phase == "Succeeded" || phase == "Failed")
        }) else {
            continue;
        };
        let node = e
            .reporting_instance
            .clone()
            .or_else(|| pod.spec.as_ref().and_then(|s| s.node_name.clone()))
            .unwrap_or_else(|| "?".into());
        let note = e.note.clone().unwrap_or_default();
        unredirected.push(format!("{namespace}/{name} on node {node}: {note}"));
    }
    if unredirected.is_empty() {
        let redirected = latest.len();
        return CheckResult::ok(
            super::result::CNI_PLUGIN_CATEGORY,
            CHECK,
            format!("{redirected} meshed pod(s) with a linkerd-cni Event, none unredirected"),
        );
    }
    let count = unredirected.len();
    let mut detail = format!(
        "{count} meshed pod(s) run without linkerd-cni's redirection (their traffic bypasses \
         the proxy):"
    );
    for line in unredirected.iter().take(SHOWN) {
        detail.push_str("\n* ");
        detail.push_str(line);
    }
    if count > SHOWN {
        detail.push_str(&format!("\n* and {} more", count - SHOWN));
    }
    detail.push_str(
        "\nsee: kubectl describe pod <pod>; delete such a pod to recreate it through the plugin \
         (the agent does so itself with repairController.enabled)",
    );
    CheckResult::new(
        super::result::CNI_PLUGIN_CATEGORY,
        CHECK,
        Status::Fail,
        detail,
    )
}

/// Reads the Events of every namespace, then the pods they report unredirected.
pub async fn gather(client: &Client) -> Result<Observed, String> {
    let api: Api<Event> = Api::all(client.clone());
    let mut events = Vec::new();
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page = api
            .list(&params)
            .await
            .map_err(|e| format!("listing Events (events.k8s.io/v1): {e}"))?;
        events.extend(
            page.items
                .into_iter()
                .filter(|e| e.reporting_controller.as_deref() == Some(REPORTING_CONTROLLER)),
        );
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => break,
        }
    }
    let mut pods = BTreeMap::new();
    for (namespace, name) in reported_unredirected(&events) {
        let pod = Api::<Pod>::namespaced(client.clone(), &namespace)
            .get_opt(&name)
            .await
            .map_err(|e| format!("getting pod {namespace}/{name}: {e}"))?;
        pods.insert((namespace, name), pod);
    }
    Ok(Observed { events, pods })
}

/// Gathers and judges; an API error fails the check with it.
pub async fn run(client: &Client) -> CheckResult {
    match gather(client).await {
        Ok(o) => judge(&o),
        Err(e) => CheckResult::fail(super::result::CNI_PLUGIN_CATEGORY, CHECK, e),
    }
}

#[cfg(test)]
mod tests;
