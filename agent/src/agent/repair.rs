//! Repair without `CAP_SYS_ADMIN`: a meshed pod of this node that runs without a registration
//! (it started before linkerd-cni was in the conflist, or the chain was rewritten by another
//! CNI, or the plugin was reinstalled) is deleted, so that its controller recreates it and the
//! new sandbox goes through the plugin, as Linkerd's repair controller does. Adoption in place
//! ([`crate::agent::adopt`]) needs to enter the pod's network namespace, which only an agent
//! holding `CAP_SYS_ADMIN` (`agent.sysAdmin`) may; without it this is the repair.
//!
//! The agent tells such a pod apart without entering its namespace: it knows its own
//! registrations, and the API says which pods run here with an address. A pod is repaired when,
//! from the API alone:
//!
//! - it is meshed by linkerd-cni (Linkerd's rule: a `linkerd-proxy` container and no
//!   `linkerd-init`, whose pod redirects its own traffic with iptables), and the decision rule
//!   redirects it (not excluded, not `simulate`);
//! - it has a UID, is not `hostNetwork`, not being deleted, not `Succeeded` or `Failed`, and
//!   kubelet reports its address (`status.podIPs`: its sandbox's CNI ADD has completed; a
//!   pod whose ADD is under way has none yet);
//! - no registration knows it, continuously for the grace period (`--repair-grace`), counted
//!   from when the agent became ready at the earliest: an ADD that registers it meanwhile
//!   (also a sandbox being recreated, which keeps the old address in the API) ends that;
//! - it was not deleted by this agent within the window (`--repair-window`, by
//!   namespace/name: a pod recreated under the same name that again starts without the
//!   plugin is not deleted in a loop), and the node's token bucket (`--repair-burst`,
//!   `--repair-per-minute`) has a token.
//!
//! The delete carries the pod's UID as a precondition, so a pod recreated under the same name
//! in between is never deleted in its place. The agent deletes rather than evicts, as
//! Linkerd's repair controller does: an eviction honours PodDisruptionBudgets and may be
//! refused for as long as the budget is spent, leaving the pod unredirected (its traffic past
//! its proxy) with no bound; the rate limit keeps a node's repairs from taking many replicas
//! of one workload at once.
//!
//! Each action goes through [`Repairer::report`]: logged, counted in
//! `linkerd_cni_agent_pod_repairs_total{action,reason}`, and an Event on the pod
//! (`LinkerdCNIRepaired` when deleted, `LinkerdCNIUnredirected` when held back or the delete
//! failed).

use std::{
    collections::{BTreeMap, HashMap},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use linkerd_cni_k8s::{
    CachedPod, PodSource,
    events::{self, EventRecorder, Reason},
};
use linkerd_cni_proto::{config::LinkerdConfig, escape::Escaped, wire::PodRef};

use super::{Agent, adopt::KnownPods};

/// How the repair is paced (the agent's `--repair-*` flags).
#[derive(Clone, Debug)]
pub struct RepairOptions {
    /// How long a pod must run unregistered (and the agent be ready) before it is repaired.
    pub grace: Duration,
    /// Deletions the node's bucket holds (so may make at once).
    pub burst: u32,
    /// Tokens added to the bucket per minute.
    pub per_minute: u32,
    /// A pod (namespace/name) deleted is not deleted again within this window.
    pub window: Duration,
}

impl Default for RepairOptions {
    fn default() -> Self {
        Self {
            grace: Duration::from_secs(10),
            burst: 5,
            per_minute: 30,
            window: Duration::from_secs(600),
        }
    }
}

/// What the repair did to a pod (the `action` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Action {
    /// Deleted, to be recreated through the plugin.
    Deleted,
    /// Left for now: the node's bucket was empty, or the pod was deleted within the window.
    RateLimited,
    /// The delete failed (API error); retried at the next pass.
    Failed,
}

impl Action {
    /// The `action` label in `/metrics`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Deleted => "deleted",
            Self::RateLimited => "rate_limited",
            Self::Failed => "failed",
        }
    }
}

/// Why a pod is repaired (the `reason` label): the one reason there is today.
pub const REASON_UNREGISTERED: &str = "unregistered";

/// A token bucket: `capacity` tokens, refilled at `per_sec`.
#[derive(Debug)]
pub struct TokenBucket {
    capacity: f64,
    tokens: f64,
    per_sec: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket.
    pub fn new(capacity: u32, per_minute: u32, now: Instant) -> Self {
        Self {
            capacity: f64::from(capacity),
            tokens: f64::from(capacity),
            per_sec: f64::from(per_minute) / 60.0,
            last: now,
        }
    }

    /// Takes a token if there is one at `now`.
    pub fn take(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.per_sec).min(self.capacity);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Whether `pod` is a candidate for repair from what the API says and the registry knows
/// (see the module documentation; the decision rule and the grace period come after).
pub fn unredirected(pod: &CachedPod, base: &LinkerdConfig, known: &KnownPods) -> bool {
    let Some(uid) = pod.uid.as_deref() else {
        return false;
    };
    pod.deletion_timestamp.is_none()
        && !pod.terminated
        && pod.host_network != Some(true)
        && !pod.pod_ips.is_empty()
        && pod.wants_redirect()
        && !base.is_excluded(&pod.namespace)
        && !known.contains(&pod.namespace, &pod.name, uid)
}

/// The pacing state, kept across passes.
#[derive(Debug)]
struct Pacing {
    bucket: TokenBucket,
    /// Per pod UID, since when it has been a candidate without a break.
    since: HashMap<String, Instant>,
    /// Per namespace/name, when this agent deleted it.
    deleted: HashMap<(String, String), Instant>,
    /// Pod UIDs whose rate limiting was reported (once each).
    limited: std::collections::HashSet<String>,
    /// Since when the agent has been ready without a break (`None`: not ready).
    ready_since: Option<Instant>,
}

/// Deletes meshed pods of this node that run without redirection; see the module
/// documentation.
pub struct Repairer {
    agent: Arc<Agent>,
    events: EventRecorder,
    options: RepairOptions,
    pacing: Mutex<Pacing>,
    passes: AtomicU64,
    counts: Mutex<BTreeMap<(Action, &'static str), u64>>,
}

impl Repairer {
    pub fn new(agent: Arc<Agent>, options: RepairOptions, events: EventRecorder) -> Self {
        let now = Instant::now();
        Self {
            agent,
            events,
            pacing: Mutex::new(Pacing {
                bucket: TokenBucket::new(options.burst, options.per_minute, now),
                since: HashMap::new(),
                deleted: HashMap::new(),
                limited: Default::default(),
                ready_since: None,
            }),
            options,
            passes: AtomicU64::new(0),
            counts: Mutex::new(BTreeMap::new()),
        }
    }

    /// Passes completed so far.
    pub fn passes(&self) -> u64 {
        self.passes.load(Ordering::Relaxed)
    }

    /// One pass over this node's pods (`ready`: whether the agent is ready now; `base`: the
    /// conflist's `linkerd` section), counted when it completes.
    pub async fn run_once(&self, pods: &PodSource, base: &LinkerdConfig, ready: bool) {
        self.pass(pods, base, ready).await;
        self.passes.fetch_add(1, Ordering::Relaxed);
    }

    async fn pass(&self, pods: &PodSource, base: &LinkerdConfig, ready: bool) {
        let now = Instant::now();
        {
            let mut pacing = self.lock();
            if !ready {
                // Not ready: the plugin may not be in the chain, so a recreated pod would
                // start unredirected again. Every clock starts over once it is.
                pacing.ready_since = None;
                pacing.since.clear();
                return;
            }
            pacing.ready_since.get_or_insert(now);
            let window = self.options.window;
            pacing
                .deleted
                .retain(|_, at| now.duration_since(*at) < window);
        }
        // The pods first, the registry after: an ADD that completes in between is then seen
        // as registered, never as a pod with an address and no registration.
        let cached = pods.cached_pods();
        let known = match self.agent.known_pods() {
            Ok(k) => k,
            Err(error) => {
                tracing::warn!(%error, "repair: reading the registry");
                return;
            }
        };
        let candidates: Vec<Arc<CachedPod>> = cached
            .into_iter()
            .filter(|p| unredirected(p, base, &known))
            .collect();
        let due: Vec<Arc<CachedPod>> = {
            let mut pacing = self.lock();
            let uids: std::collections::HashSet<&str> =
                candidates.iter().filter_map(|p| p.uid.as_deref()).collect();
            pacing.since.retain(|uid, _| uids.contains(uid.as_str()));
            pacing.limited.retain(|uid| uids.contains(uid.as_str()));
            let ready_since = pacing.ready_since.unwrap_or(now);
            let grace = self.options.grace;
            candidates
                .into_iter()
                .filter(|p| {
                    let uid = p.uid.as_deref().unwrap_or_default().to_string();
                    let since = *pacing.since.entry(uid).or_insert(now);
                    now.duration_since(since.max(ready_since)) >= grace
                })
                .collect()
        };
        for pod in due {
            let uid = pod.uid.as_deref().unwrap_or_default();
            let (namespace, name) = (&*pod.namespace, &*pod.name);
            match pods.decide(namespace, name, Some(uid), base).await {
                Ok(d) if d.redirect && !d.config.simulate => {}
                Ok(_) => continue,
                Err(error) => {
                    tracing::debug!(namespace, pod = %Escaped(name), %error, "repair: cannot decide; retrying");
                    continue;
                }
            }
            let pod_ref = PodRef {
                namespace: namespace.to_string(),
                name: name.to_string(),
                uid: Some(uid.to_string()),
            };
            // Registered since the pass began (an ADD that was under way): nothing to repair.
            if self.agent.knows_pod(&pod_ref).unwrap_or(true) {
                continue;
            }
            let allowed = {
                let mut pacing = self.lock();
                let key = (namespace.to_string(), name.to_string());
                if pacing.deleted.contains_key(&key) {
                    Err("deleted by this agent within the repair window")
                } else if !pacing.bucket.take(Instant::now()) {
                    Err("the node's repair rate limit is reached")
                } else {
                    pacing.deleted.insert(key, Instant::now());
                    Ok(())
                }
            };
            if let Err(why) = allowed {
                let first = self.lock().limited.insert(uid.to_string());
                if first {
                    self.report(&pod_ref, Action::RateLimited, why);
                }
                continue;
            }
            match pods.delete_pod(namespace, name, uid).await {
                Ok(_) => self.report(
                    &pod_ref,
                    Action::Deleted,
                    "meshed pod running without linkerd-cni's redirection (no CNI ADD reached \
                     the agent): deleted so that it is recreated through the plugin",
                ),
                Err(error) => {
                    // Not charged to the window: the next pass tries again.
                    self.lock()
                        .deleted
                        .remove(&(namespace.to_string(), name.to_string()));
                    self.report(&pod_ref, Action::Failed, &error.to_string());
                }
            }
        }
    }

    /// Reports one repair action on `pod`: logged, counted, and an Event on the pod.
    pub fn report(&self, pod: &PodRef, action: Action, message: &str) {
        *self
            .counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry((action, REASON_UNREGISTERED))
            .or_default() += 1;
        let (namespace, name) = (&pod.namespace, Escaped(&pod.name));
        let uid = pod.uid.as_deref().unwrap_or_default();
        let (reason, note) = match action {
            Action::Deleted => (
                Reason::Repaired,
                format!("deleted by linkerd-cni: {message}"),
            ),
            Action::RateLimited | Action::Failed => (
                Reason::Unredirected,
                format!(
                    "meshed pod running without linkerd-cni's redirection, not repaired yet: {message}"
                ),
            ),
        };
        self.events.record(
            &events::PodRef::new(namespace.clone(), pod.name.clone(), pod.uid.clone()),
            reason,
            note,
        );
        match action {
            Action::Deleted => {
                tracing::info!(namespace, pod = %name, uid, reason = REASON_UNREGISTERED, "repair: {message}")
            }
            Action::RateLimited | Action::Failed => {
                tracing::warn!(namespace, pod = %name, uid, action = action.label(), reason = REASON_UNREGISTERED, "repair: meshed pod running without redirection left as it is: {message}")
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pacing> {
        self.pacing.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The repairer's lines of `/metrics`.
    pub fn metrics(&self) -> String {
        let mut out = String::from(
            "# HELP linkerd_cni_agent_pod_repairs_total Meshed pods of this node running without \
             redirection that the agent acted on without entering them, per action (deleted, \
             rate_limited: left for now, once per pod; failed: the delete failed) and reason.\n\
             # TYPE linkerd_cni_agent_pod_repairs_total counter\n",
        );
        let counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        for action in [Action::Deleted, Action::RateLimited, Action::Failed] {
            out.push_str(&format!(
                "linkerd_cni_agent_pod_repairs_total{{action=\"{}\",reason=\"{REASON_UNREGISTERED}\"}} {}\n",
                action.label(),
                counts
                    .get(&(action, REASON_UNREGISTERED))
                    .copied()
                    .unwrap_or(0)
            ));
        }
        out.push_str(&format!(
            "# HELP linkerd_cni_agent_pod_repair_passes_total Passes of the repair over this node's \
             pods completed (one every --adopt-interval while repair runs).\n\
             # TYPE linkerd_cni_agent_pod_repair_passes_total counter\n\
             linkerd_cni_agent_pod_repair_passes_total {}\n",
            self.passes()
        ));
        out
    }
}

#[cfg(test)]
mod tests;
