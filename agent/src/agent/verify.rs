//! Evidence, per pod, of whether its redirection is in force, where operators look: Events on
//! the pod, a gauge in `/metrics`, a log line naming the pod. Whatever the agent can do about
//! it (adopt, repair, nothing), a meshed pod of this node that runs without redirection is
//! said so, for as long as it does.
//!
//! - **"Redirected" only once verified.** A pod attached per pod is redirected by its own
//!   cgroup's links (its ADD records `LinkerdCNIRedirected`). A pod on the shared attachment is
//!   selected by netns cookie, and its connections are redirected only if its processes run
//!   below the shared attachment's cgroup, which is known only once its cgroup exists (after
//!   ADD under containerd 1.6). Each pass looks for the pod's cgroup v2 as the ADD did
//!   ([`cgroup::resolve`]: the runtime's hint kept in the record, then the pod UID in either
//!   kubelet layout) and checks that it lies below the shared attachment's cgroup
//!   ([`shared_cover`]): then, and only then, `LinkerdCNIRedirected` is recorded. A cgroup
//!   outside it is reported at once ([`Problem::OutsideShared`]); no cgroup found within the
//!   grace period is reported as unverified ([`Problem::Unverified`]).
//! - **A standing "missing" signal.** A meshed pod of this node with an address and no
//!   registration ([`super::repair::unredirected`]: never `hostNetwork`, unmeshed,
//!   `linkerd-init`, terminating or ended pods) for the grace period is reported
//!   ([`Problem::Unregistered`]), whether or not the repair or adoption then acts on it.
//! - **Refreshed, then cleared.** A reported problem is recorded as `LinkerdCNIUnredirected`
//!   (Warning) when first seen or when it changes, and again every `refresh` while it lasts
//!   ([`DEFAULT_REFRESH`], well within the API server's default `--event-ttl` of 1 h; a
//!   repeat within the recorder's series window counts into the same Event, whose update
//!   renews its TTL, a later one makes a new Event). When it ends with the pod registered and
//!   verified, `LinkerdCNIRedirected` says so; a pod that is gone is forgotten (a repaired
//!   pod's deletion has its own `LinkerdCNIRepaired`).
//! - **Rate.** At most one Event per pod per `refresh` while nothing changes, and every Event
//!   goes through the recorder's token bucket and bounded queue
//!   ([`linkerd_cni_k8s::events`]).
//!
//! `linkerd check` reads these Events cluster-wide: a pod whose latest Event of ours is
//! `LinkerdCNIUnredirected` runs without redirection.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use linkerd_cni_k8s::{
    PodSource,
    events::{self, EventRecorder, Reason},
};
use linkerd_cni_proto::{config::LinkerdConfig, escape::Escaped};

use super::{
    Agent,
    registry::{Attachment, PodRecord},
    repair,
};
use crate::host::{cgroup, netns};

/// How often a standing problem's Event is recorded again while it lasts (the agent's
/// `--unredirected-event-interval`): a quarter of the API server's default Event TTL (1 h).
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(15 * 60);

/// How the verification is paced (the agent's flags).
#[derive(Clone, Debug)]
pub struct VerifyOptions {
    /// How long a pod may run unregistered, or on the shared attachment with no cgroup
    /// found, before it is reported (the repair's `--repair-grace`: an ADD under way).
    pub grace: Duration,
    /// How often a standing problem is recorded again.
    pub refresh: Duration,
}

impl Default for VerifyOptions {
    fn default() -> Self {
        Self {
            grace: repair::RepairOptions::default().grace,
            refresh: DEFAULT_REFRESH,
        }
    }
}

/// Why a meshed pod runs without (verified) redirection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    /// No registration: no CNI ADD of its sandbox reached the agent.
    Unregistered,
    /// On the shared attachment, and its cgroup lies outside the attachment's cgroup: its
    /// connections are not seen by the programs.
    OutsideShared {
        pod_cgroup: PathBuf,
        shared: PathBuf,
    },
    /// On the shared attachment, and no cgroup v2 of the pod was found within the grace
    /// period: whether its connections are seen is unknown.
    Unverified { shared: PathBuf },
}

impl Problem {
    /// Every label, in the order `/metrics` lists them.
    pub const LABELS: [&'static str; 3] = ["unregistered", "outside_shared_cgroup", "unverified"];

    /// The `reason` label in `/metrics`.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Unregistered => Self::LABELS[0],
            Self::OutsideShared { .. } => Self::LABELS[1],
            Self::Unverified { .. } => Self::LABELS[2],
        }
    }

    /// The Event's note.
    pub fn note(&self) -> String {
        match self {
            Self::Unregistered => "meshed pod running without linkerd-cni's redirection: no CNI \
                 ADD of its sandbox reached the agent (it started before linkerd-cni was in the \
                 node's CNI chain, or the chain was rewritten)"
                .into(),
            Self::OutsideShared { pod_cgroup, shared } => format!(
                "meshed pod running without linkerd-cni's redirection: its cgroup {} is not \
                 below the shared attachment's cgroup {}, so its connections are not \
                 redirected",
                pod_cgroup.display(),
                shared.display()
            ),
            Self::Unverified { shared } => format!(
                "meshed pod whose redirection is not verified: it is registered on the shared \
                 attachment ({}), and no cgroup v2 of the pod was found (by the runtime's \
                 cgroupPath or the pod UID in kubelet's layouts) to show that its processes \
                 run below it",
                shared.display()
            ),
        }
    }
}

/// Where a pod on the shared attachment runs, as far as its cgroup shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SharedCover {
    /// Its cgroup (this path) lies below the shared attachment's: redirected.
    Covered(PathBuf),
    /// Its cgroup (this path) lies elsewhere: not redirected.
    Outside(PathBuf),
    /// No cgroup v2 of the pod exists (yet).
    NotFound,
}

/// Whether the pod cgroup `found` (a path below `root`, the cgroup2 mount) lies below
/// `shared` (or is it), both with symbolic links and `..` resolved; a path that does not
/// resolve below the root is outside.
pub fn shared_cover(root: &Path, shared: &Path, found: PathBuf) -> SharedCover {
    let shared_rel = cgroup::resolved_below(root, shared);
    match (shared_rel, cgroup::resolved_below(root, &found)) {
        (Some(s), Some(f)) if f.starts_with(&s) => SharedCover::Covered(found),
        _ => SharedCover::Outside(found),
    }
}

impl Agent {
    /// For `record` on the shared attachment: where its pod's cgroup v2 is found (as the ADD
    /// looked for it: the runtime's hint, then the pod UID) and whether it lies below the
    /// shared attachment's cgroup. `None` for any other record.
    pub fn shared_cover(&self, record: &PodRecord) -> Option<SharedCover> {
        let Attachment::Shared { cgroup: shared } = &record.attachment else {
            return None;
        };
        let uid = record.pod.as_ref().and_then(|p| p.uid.as_deref());
        Some(
            match cgroup::resolve(&self.cgroup_root, record.cgroup_hint.as_deref(), uid) {
                Some(found) => shared_cover(&self.cgroup_root, shared, found),
                None => SharedCover::NotFound,
            },
        )
    }
}

/// A problem reported on a pod.
#[derive(Debug)]
struct Reported {
    pod: events::PodRef,
    problem: Problem,
    at: Instant,
}

#[derive(Debug, Default)]
struct State {
    /// Per pod UID, since when it has had a problem without a break (within the grace period
    /// or reported).
    since: HashMap<String, Instant>,
    /// Per pod UID, the problem reported, while it lasts.
    reported: HashMap<String, Reported>,
    /// Registrations on the shared attachment whose cover was verified (their Event
    /// recorded); forgotten when they go.
    verified: HashSet<String>,
}

/// Verifies this node's meshed pods and reports those without redirection; see the module
/// documentation.
pub struct Verifier {
    agent: Arc<Agent>,
    events: EventRecorder,
    options: VerifyOptions,
    state: Mutex<State>,
    passes: AtomicU64,
    verified: AtomicU64,
}

impl Verifier {
    pub fn new(agent: Arc<Agent>, options: VerifyOptions, events: EventRecorder) -> Self {
        Self {
            agent,
            events,
            options,
            state: Mutex::default(),
            passes: AtomicU64::new(0),
            verified: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Passes completed so far.
    pub fn passes(&self) -> u64 {
        self.passes.load(Ordering::Relaxed)
    }

    /// One pass over this node's pods and registrations (`base`: the conflist's `linkerd`
    /// section), counted when it completes.
    pub async fn run_once(&self, pods: &PodSource, base: &LinkerdConfig) {
        self.pass(pods, base).await;
        self.passes.fetch_add(1, Ordering::Relaxed);
    }

    async fn pass(&self, pods: &PodSource, base: &LinkerdConfig) {
        let now = Instant::now();
        // The pods first, the registry after (as the repair does): an ADD that completes in
        // between is seen as registered.
        let cached = pods.cached_pods();
        let known = match self.agent.known_pods() {
            Ok(k) => k,
            Err(error) => {
                tracing::warn!(%error, "verify: reading the registry");
                return;
            }
        };
        let records = self.agent.shared_pods();
        let mut found: BTreeMap<String, (events::PodRef, Problem)> = BTreeMap::new();
        let mut shared_ids = HashSet::new();
        for record in &records {
            if !matches!(record.attachment, Attachment::Shared { .. }) {
                continue;
            }
            let Some(pod) = record.pod.as_ref() else {
                continue;
            };
            // A pod whose sandbox is gone is the reaper's, not a pod without redirection.
            if !netns::still_exists(&record.netns, record.netns_ino) {
                continue;
            }
            shared_ids.insert(record.id.clone());
            // Verified once: a cgroup does not move out from under its pod.
            if self.lock().verified.contains(&record.id) {
                continue;
            }
            let Some(cover) = self.agent.shared_cover(record) else {
                continue;
            };
            let pod_ref =
                events::PodRef::new(pod.namespace.clone(), pod.name.clone(), pod.uid.clone());
            let key = pod.uid.clone().unwrap_or_else(|| record.id.clone());
            let shared: PathBuf = record.attachment.cgroup().unwrap_or(Path::new("")).into();
            match cover {
                SharedCover::Covered(pod_cgroup) => {
                    if self.lock().verified.insert(record.id.clone()) {
                        self.verified.fetch_add(1, Ordering::Relaxed);
                        let note = format!(
                            "redirected: the pod's cgroup {} lies below the shared attachment's \
                             cgroup {} (programs selected by netns cookie)",
                            pod_cgroup.display(),
                            Path::new(&shared).display()
                        );
                        tracing::info!(namespace = %pod.namespace, pod = %Escaped(&pod.name), id = %record.id, cgroup = %pod_cgroup.display(), "redirection on the shared attachment verified");
                        self.events.record(&pod_ref, Reason::Redirected, note);
                    }
                }
                SharedCover::Outside(pod_cgroup) => {
                    found.insert(
                        key,
                        (pod_ref, Problem::OutsideShared { pod_cgroup, shared }),
                    );
                }
                SharedCover::NotFound => {
                    found.insert(key, (pod_ref, Problem::Unverified { shared }));
                }
            }
        }
        for pod in cached
            .iter()
            .filter(|p| repair::unredirected(p, base, &known))
        {
            let uid = pod.uid.as_deref().unwrap_or_default().to_string();
            let pod_ref = events::PodRef::new(&*pod.namespace, &*pod.name, Some(uid.clone()));
            found.insert(uid, (pod_ref, Problem::Unregistered));
        }
        // Within the grace period: an ADD under way, or a cgroup about to be made.
        let due: Vec<(String, events::PodRef, Problem)> = {
            let mut state = self.lock();
            state.verified.retain(|id| shared_ids.contains(id));
            state.since.retain(|uid, _| found.contains_key(uid));
            let grace = self.options.grace;
            found
                .into_iter()
                .filter(|(uid, (_, problem))| {
                    let since = *state.since.entry(uid.clone()).or_insert(now);
                    matches!(problem, Problem::OutsideShared { .. })
                        || now.duration_since(since) >= grace
                })
                .map(|(uid, (pod, problem))| (uid, pod, problem))
                .collect()
        };
        let mut still = HashSet::new();
        for (uid, pod, problem) in due {
            // A pod without a registration is reported only when the decision meshes it
            // (not excluded, not `simulate`), as the repair decides.
            if problem == Problem::Unregistered {
                match pods
                    .decide(&pod.namespace, &pod.name, pod.uid.as_deref(), base)
                    .await
                {
                    Ok(d) if d.redirect && !d.config.simulate => {}
                    Ok(_) => continue,
                    Err(error) => {
                        tracing::debug!(namespace = %pod.namespace, pod = %Escaped(&pod.name), %error, "verify: cannot decide; retrying");
                        still.insert(uid.clone());
                        continue;
                    }
                }
            }
            still.insert(uid.clone());
            self.report(uid, pod, problem, now);
        }
        // Problems that ended: said so when the pod is now registered (and not reported
        // again above); forgotten when the pod is gone. A pod without a registration that
        // merely stopped being a candidate for a while (its pod object rewritten without its
        // addresses, as a status update can) stays reported until it is registered or gone:
        // forgetting it then would leave its last Event saying unredirected after the ADD.
        let known = self.agent.known_pods().unwrap_or_default();
        let alive: HashSet<&str> = cached
            .iter()
            .filter(|p| p.deletion_timestamp.is_none() && !p.terminated)
            .filter_map(|p| p.uid.as_deref())
            .collect();
        let ended: Vec<Reported> = {
            let mut state = self.lock();
            let gone: Vec<String> = state
                .reported
                .iter()
                .filter(|(uid, r)| {
                    !still.contains(*uid)
                        && (r.problem != Problem::Unregistered
                            || !alive.contains(uid.as_str())
                            || known.contains(&r.pod.namespace, &r.pod.name, uid))
                })
                .map(|(uid, _)| uid.clone())
                .collect();
            gone.into_iter()
                .filter_map(|uid| state.reported.remove(&uid))
                .collect()
        };
        for r in ended {
            let uid = r.pod.uid.as_deref().unwrap_or_default();
            if known.contains(&r.pod.namespace, &r.pod.name, uid) {
                tracing::info!(namespace = %r.pod.namespace, pod = %Escaped(&r.pod.name), uid, was = r.problem.label(), "meshed pod runs with redirection now");
                self.events.record(
                    &r.pod,
                    Reason::Redirected,
                    format!(
                        "redirected now (was: {})",
                        r.problem.label().replace('_', " ")
                    ),
                );
            }
        }
    }

    /// Reports `problem` on `pod` (keyed by `uid`) when new, changed or due for a refresh.
    fn report(&self, uid: String, pod: events::PodRef, problem: Problem, now: Instant) {
        let mut state = self.lock();
        let fresh = match state.reported.get(&uid) {
            None => true,
            Some(r) if r.problem != problem => true,
            Some(r) if now.duration_since(r.at) >= self.options.refresh => {
                tracing::debug!(namespace = %pod.namespace, pod = %Escaped(&pod.name), uid, reason = problem.label(), "meshed pod still runs without redirection: Event recorded again");
                false
            }
            Some(_) => return,
        };
        if fresh {
            tracing::warn!(namespace = %pod.namespace, pod = %Escaped(&pod.name), uid, reason = problem.label(), "{}", problem.note());
        }
        self.events
            .record(&pod, Reason::Unredirected, problem.note());
        state.reported.insert(
            uid,
            Reported {
                pod,
                problem,
                at: now,
            },
        );
    }

    /// The verifier's lines of `/metrics`.
    pub fn metrics(&self) -> String {
        let mut counts: BTreeMap<&str, u64> = Problem::LABELS.iter().map(|l| (*l, 0)).collect();
        for r in self.lock().reported.values() {
            *counts.entry(r.problem.label()).or_default() += 1;
        }
        let mut out = String::from(
            "# HELP linkerd_cni_agent_pods_unredirected Meshed pods of this node running without \
             verified redirection, reported by an Event on the pod, per reason (unregistered: no \
             CNI ADD reached the agent; outside_shared_cgroup: on the shared attachment with its \
             cgroup outside it; unverified: on the shared attachment with no cgroup v2 found).\n\
             # TYPE linkerd_cni_agent_pods_unredirected gauge\n",
        );
        for (label, n) in counts {
            out.push_str(&format!(
                "linkerd_cni_agent_pods_unredirected{{reason=\"{label}\"}} {n}\n"
            ));
        }
        out.push_str(&format!(
            "# HELP linkerd_cni_agent_shared_verified_total Registrations on the shared attachment \
             whose pod cgroup was found below the attachment's cgroup (then reported redirected).\n\
             # TYPE linkerd_cni_agent_shared_verified_total counter\n\
             linkerd_cni_agent_shared_verified_total {}\n\
             # HELP linkerd_cni_agent_verify_passes_total Passes of the verification over this \
             node's pods completed (one every --adopt-interval).\n\
             # TYPE linkerd_cni_agent_verify_passes_total counter\n\
             linkerd_cni_agent_verify_passes_total {}\n",
            self.verified.load(Ordering::Relaxed),
            self.passes()
        ));
        out
    }
}

#[cfg(test)]
mod tests;
