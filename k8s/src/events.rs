//! Kubernetes Events on pods, from the node agent: what happened to a pod's redirection,
//! where operators look (`kubectl describe pod`, `kubectl events`).
//!
//! The agent calls [`EventRecorder::record`] from any path, ADD included: it never waits and
//! never fails. The event goes into a bounded queue ([`QUEUE_CAPACITY`]); when the queue is
//! full it is dropped and counted in [`EventStats::dropped`] (the agent's
//! `linkerd_cni_agent_events_dropped_total`). One task on the agent's runtime drains the queue
//! and writes to the API:
//!
//! - **API**: `events.k8s.io/v1` Events (GA since Kubernetes 1.19, the API client-go's
//!   `tools/events` and kube's `Recorder` write; `core/v1` Events are the same objects in the
//!   API server's storage, so `kubectl describe pod` shows them). It carries what `core/v1`
//!   leaves to free text: `reportingController` ([`REPORTING_CONTROLLER`]),
//!   `reportingInstance` (the node's name), `action`, and a `series` instead of `count`.
//! - **Aggregation**: an event equal to one written less than [`SERIES_WINDOW`] ago (same pod
//!   UID, reason and note) does not make a new object: it counts into the first one's
//!   `series`, patched at most once per [`PATCH_INTERVAL`] per event (client-go's rule for
//!   isomorphic events), so a pod whose ADD is retried 100 times makes one Event with a count.
//! - **Rate**: every write takes a token of a bucket of [`BURST`] tokens refilled at [`QPS`]
//!   per second; while it is empty the task waits, the queue fills, and what does not fit is
//!   dropped and counted. A storm of ADDs never floods the API and never slows an ADD.
//! - **Failures**: a write the API refuses is logged at debug level and counted in
//!   [`EventStats::failed`]; Events are evidence, never a condition of redirection.
//!
//! RBAC: `create` and `patch` on `events` in the `events.k8s.io` group, in every namespace a
//! meshed pod can live in (the chart's ClusterRole).

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use k8s_openapi::{
    api::{
        core::v1::ObjectReference,
        events::v1::{Event, EventSeries},
    },
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use tokio::{sync::mpsc, time::Instant};

/// The `reportingController` of every Event the agent writes.
pub const REPORTING_CONTROLLER: &str = "linkerd-cni-agent";

/// How many events may wait for the API; more are dropped (and counted).
pub const QUEUE_CAPACITY: usize = 1024;
/// Writes to the API allowed at once after a quiet period.
pub const BURST: u32 = 25;
/// Writes to the API per second, sustained.
pub const QPS: u32 = 5;
/// How long an Event keeps counting its repeats into its `series` (then a repeat makes a new
/// Event). Shorter than the API server's default `--event-ttl` (1 h).
pub const SERIES_WINDOW: Duration = Duration::from_secs(10 * 60);
/// The shortest time between two patches of one Event's `series`.
pub const PATCH_INTERVAL: Duration = Duration::from_secs(30);
/// Events remembered for aggregation; the oldest are forgotten past this.
pub const MAX_REMEMBERED: usize = 4096;
/// The longest `note` the API accepts (1 kB); longer notes are cut.
pub const MAX_NOTE: usize = 1024;

/// Why an Event is written: its `reason` (what `kubectl describe` shows), its type and its
/// `action`. The one list of reasons the agent writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// The pod's redirection is attached and verified (Normal).
    Redirected,
    /// The pod's ADD was refused: it runs without redirection, or not at all (Warning).
    Refused,
    /// A meshed pod found without redirection was brought under it, or recreated (Normal).
    Repaired,
    /// A meshed pod runs without redirection, or its redirection could not be verified
    /// (Warning).
    Unredirected,
}

impl Reason {
    /// Every reason, for tests and for readers of the Events (the CLI's check).
    pub const ALL: [Reason; 4] = [
        Reason::Redirected,
        Reason::Refused,
        Reason::Repaired,
        Reason::Unredirected,
    ];

    /// The Event's `reason`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::Redirected => "LinkerdCNIRedirected",
            Reason::Refused => "LinkerdCNIRefused",
            Reason::Repaired => "LinkerdCNIRepaired",
            Reason::Unredirected => "LinkerdCNIUnredirected",
        }
    }

    /// The Event's `type`: `Normal` or `Warning`.
    pub const fn event_type(self) -> &'static str {
        match self {
            Reason::Redirected | Reason::Repaired => "Normal",
            Reason::Refused | Reason::Unredirected => "Warning",
        }
    }

    /// Whether the pod runs redirected after this event.
    pub const fn redirected(self) -> bool {
        matches!(self, Reason::Redirected | Reason::Repaired)
    }

    /// The Event's `action`: what the agent did.
    pub const fn action(self) -> &'static str {
        match self {
            Reason::Redirected => "Redirect",
            Reason::Refused => "Refuse",
            Reason::Repaired => "Repair",
            Reason::Unredirected => "Verify",
        }
    }

    /// The reason named by an Event's `reason`, if it is one of ours.
    pub fn from_reason(reason: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == reason)
    }
}

/// The recorder's bounds (the constants above by default; tests shorten the intervals).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub queue: usize,
    pub burst: u32,
    pub qps: u32,
    pub series_window: Duration,
    pub patch_interval: Duration,
    pub max_remembered: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            queue: QUEUE_CAPACITY,
            burst: BURST,
            qps: QPS,
            series_window: SERIES_WINDOW,
            patch_interval: PATCH_INTERVAL,
            max_remembered: MAX_REMEMBERED,
        }
    }
}

/// The pod an Event is about.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    /// The pod's UID, when known: Events of a recreated pod (same name) stay apart.
    pub uid: Option<String>,
}

impl PodRef {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>, uid: Option<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            uid,
        }
    }

    fn object_reference(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            namespace: Some(self.namespace.clone()),
            name: Some(self.name.clone()),
            uid: self.uid.clone(),
            ..Default::default()
        }
    }
}

/// Counters of the recorder, for the agent's `/metrics`.
#[derive(Debug, Default)]
pub struct EventStats {
    /// Events handed to [`EventRecorder::record`].
    pub recorded: AtomicU64,
    /// Events dropped because the queue was full (or the recorder is disabled).
    pub dropped: AtomicU64,
    /// Events created in the API.
    pub created: AtomicU64,
    /// Repeats counted into an existing Event's `series` instead of a new Event.
    pub aggregated: AtomicU64,
    /// Writes the API refused or that failed.
    pub failed: AtomicU64,
}

struct Queued {
    pod: PodRef,
    reason: Reason,
    note: String,
}

/// Records Events on pods without ever waiting. Cheap to clone; see the module documentation.
#[derive(Clone)]
pub struct EventRecorder {
    tx: Option<mpsc::Sender<Queued>>,
    stats: Arc<EventStats>,
}

impl EventRecorder {
    /// Starts the writer task on the current Tokio runtime (so this must be called from
    /// within one), writing as `reportingInstance` `node_name`.
    pub fn spawn(client: Client, node_name: impl Into<String>) -> Self {
        Self::spawn_with(client, node_name, Limits::default())
    }

    /// [`EventRecorder::spawn`] with other bounds.
    pub fn spawn_with(client: Client, node_name: impl Into<String>, limits: Limits) -> Self {
        let (tx, rx) = mpsc::channel(limits.queue.max(1));
        let stats = Arc::new(EventStats::default());
        let writer = Writer {
            client,
            instance: node_name.into(),
            stats: stats.clone(),
            remembered: HashMap::new(),
            bucket: Bucket::new(limits.burst, limits.qps),
            limits,
        };
        tokio::spawn(writer.run(rx));
        Self {
            tx: Some(tx),
            stats,
        }
    }

    /// A recorder that writes nothing (no API client: tests, `--no-api`); every event is
    /// counted as dropped.
    pub fn disabled() -> Self {
        Self {
            tx: None,
            stats: Arc::default(),
        }
    }

    /// Records `reason` on `pod` with `note` (cut to [`MAX_NOTE`] bytes). Never waits.
    pub fn record(&self, pod: &PodRef, reason: Reason, note: impl Into<String>) {
        self.stats.recorded.fetch_add(1, Ordering::Relaxed);
        let mut note = note.into();
        truncate(&mut note, MAX_NOTE);
        let queued = Queued {
            pod: pod.clone(),
            reason,
            note,
        };
        let sent = self
            .tx
            .as_ref()
            .is_some_and(|tx| tx.try_send(queued).is_ok());
        if !sent {
            self.stats.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The recorder's counters.
    pub fn stats(&self) -> &Arc<EventStats> {
        &self.stats
    }
}

fn truncate(s: &mut String, max: usize) {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
}

/// The identity of isomorphic events.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    pod: PodRef,
    reason: Reason,
    note: String,
}

/// An Event written, for counting its repeats.
struct Written {
    name: String,
    first: Instant,
    patched: Instant,
    /// The series count the API holds (1: no series yet).
    count: i32,
    /// Repeats not written yet.
    pending: i32,
}

/// A token bucket: [`Bucket::take`] waits for a token.
struct Bucket {
    tokens: f64,
    burst: f64,
    rate: f64,
    last: Instant,
}

impl Bucket {
    fn new(burst: u32, per_second: u32) -> Self {
        Self {
            tokens: f64::from(burst),
            burst: f64::from(burst),
            rate: f64::from(per_second.max(1)),
            last: Instant::now(),
        }
    }

    async fn take(&mut self) {
        loop {
            let now = Instant::now();
            self.tokens = (self.tokens + now.duration_since(self.last).as_secs_f64() * self.rate)
                .min(self.burst);
            self.last = now;
            if self.tokens >= 1.0 {
                self.tokens -= 1.0;
                return;
            }
            let wait = (1.0 - self.tokens) / self.rate;
            tokio::time::sleep(Duration::from_secs_f64(wait)).await;
        }
    }
}

struct Writer {
    client: Client,
    instance: String,
    stats: Arc<EventStats>,
    remembered: HashMap<Key, Written>,
    bucket: Bucket,
    limits: Limits,
}

impl Writer {
    async fn run(mut self, mut rx: mpsc::Receiver<Queued>) {
        let mut flush = tokio::time::interval(self.limits.patch_interval / 2);
        flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                queued = rx.recv() => match queued {
                    Some(q) => self.write(q).await,
                    None => return,
                },
                _ = flush.tick() => self.flush_pending().await,
            }
        }
    }

    async fn write(&mut self, q: Queued) {
        let now = Instant::now();
        let key = Key {
            pod: q.pod,
            reason: q.reason,
            note: q.note,
        };
        if let Some(w) = self.remembered.get_mut(&key)
            && now.duration_since(w.first) < self.limits.series_window
        {
            self.stats.aggregated.fetch_add(1, Ordering::Relaxed);
            w.pending += 1;
            if now.duration_since(w.patched) >= self.limits.patch_interval {
                self.patch_series(&key).await;
            }
            return;
        }
        self.create(key).await;
    }

    /// Patches every Event with repeats not written whose last patch is old enough.
    async fn flush_pending(&mut self) {
        let now = Instant::now();
        let (interval, window) = (self.limits.patch_interval, self.limits.series_window);
        let due: Vec<Key> = self
            .remembered
            .iter()
            .filter(|(_, w)| w.pending > 0 && now.duration_since(w.patched) >= interval)
            .map(|(k, _)| k.clone())
            .collect();
        for key in due {
            self.patch_series(&key).await;
        }
        self.remembered
            .retain(|_, w| now.duration_since(w.first) < window || w.pending > 0);
    }

    async fn create(&mut self, key: Key) {
        self.bucket.take().await;
        let now = Timestamp::now();
        let name = format!("{}.{:x}", key.pod.name, now.as_nanosecond());
        let event = Event {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(key.pod.namespace.clone()),
                ..Default::default()
            },
            action: Some(key.reason.action().into()),
            reason: Some(key.reason.as_str().into()),
            note: (!key.note.is_empty()).then(|| key.note.clone()),
            type_: Some(key.reason.event_type().into()),
            event_time: Some(MicroTime(now)),
            regarding: Some(key.pod.object_reference()),
            reporting_controller: Some(REPORTING_CONTROLLER.into()),
            reporting_instance: Some(self.instance.clone()),
            ..Default::default()
        };
        let api: Api<Event> = Api::namespaced(self.client.clone(), &key.pod.namespace);
        match api.create(&PostParams::default(), &event).await {
            Ok(_) => {
                self.stats.created.fetch_add(1, Ordering::Relaxed);
                if self.remembered.len() >= self.limits.max_remembered {
                    self.forget_oldest();
                }
                let now = Instant::now();
                self.remembered.insert(
                    key,
                    Written {
                        name,
                        first: now,
                        patched: now,
                        count: 1,
                        pending: 0,
                    },
                );
            }
            Err(e) => {
                self.stats.failed.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(error = %e, pod = %key.pod.name, namespace = %key.pod.namespace,
                    reason = key.reason.as_str(), "creating an Event failed");
            }
        }
    }

    async fn patch_series(&mut self, key: &Key) {
        let Some(w) = self.remembered.get(key) else {
            return;
        };
        let (name, count) = (w.name.clone(), w.count + w.pending);
        self.bucket.take().await;
        let series = EventSeries {
            count,
            last_observed_time: MicroTime(Timestamp::now()),
        };
        let patch = serde_json::json!({ "series": series });
        let api: Api<Event> = Api::namespaced(self.client.clone(), &key.pod.namespace);
        let result = api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await;
        match result {
            Ok(_) => {
                if let Some(w) = self.remembered.get_mut(key) {
                    w.count = count;
                    w.pending = 0;
                    w.patched = Instant::now();
                }
            }
            Err(e) => {
                self.stats.failed.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(error = %e, event = %name, "patching an Event's series failed");
                // Gone (expired, deleted) or refused: the next repeat makes a new Event.
                self.remembered.remove(key);
            }
        }
    }

    fn forget_oldest(&mut self) {
        if let Some(oldest) = self
            .remembered
            .iter()
            .min_by_key(|(_, w)| w.first)
            .map(|(k, _)| k.clone())
        {
            self.remembered.remove(&oldest);
        }
    }
}

#[cfg(test)]
mod tests;
