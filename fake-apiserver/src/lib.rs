//! A stand-in for the Kubernetes API server, for tests and the demo: plain HTTP on loopback,
//! serving the core `v1` objects it holds (Pods, Namespaces, Services, Nodes, ...) as the real
//! server's JSON, so that an unmodified `kube` client, watcher and reflector work against it.
//!
//! What it answers:
//! - `GET /api/v1/namespaces/{ns}/{resource}/{name}` and `GET /api/v1/namespaces/{name}`:
//!   one object, or a 404 `Status`;
//! - LIST `GET /api/v1/{resource}` and `GET /api/v1/namespaces/{ns}/{resource}`, with
//!   `fieldSelector` (`=`, `==`, `!=` on any dotted field, e.g. `spec.nodeName`) and
//!   `labelSelector` (`k=v`, `k!=v`, `k`, `!k`, `k in (a,b)`, `k notin (a,b)`); no paging;
//! - WATCH (`?watch=1` or `?watch=true`): chunked JSON lines `{"type","object"}`, resumed from
//!   `resourceVersion` (absent or `0`: synthetic `ADDED` for what exists first), with the real
//!   server's selector semantics (an object that starts matching arrives as `ADDED`, one that
//!   stops matching as `DELETED`), ending after `timeoutSeconds`, and `410 Gone` for a
//!   resourceVersion older than [`FakeApiServer::compact`];
//! - metadata-only answers (`Accept: application/json;as=PartialObjectMetadata[List];
//!   g=meta.k8s.io;v=v1`, as kube's `Api<PartialObjectMeta<K>>` and client-go's metadata
//!   informers ask) to GET, LIST and WATCH: `PartialObjectMetadata` objects carrying only
//!   `metadata`;
//! - `/version`, `/api`, `/apis`, `/api/v1` discovery, enough for `kubectl get`;
//! - `GET /fake/stats` (not recorded itself): every request received so far, and how many
//!   watches are open and were ever opened, for test processes that count a client's requests
//!   from outside ([`FakeApiServer::watches_open`], [`FakeApiServer::watches_started`] in
//!   process).
//!
//! Every change bumps one global resourceVersion. Objects come from [`FakeApiServer::apply`] /
//! [`FakeApiServer::delete`] at runtime or from a directory of JSON/YAML manifests
//! ([`ManifestDir`]); [`FakeApiServer::route`] serves any fixed JSON at a path (objects of
//! other API groups, for the CLI's and the injector's tests). Test hooks:
//! [`FakeApiServer::requests`] and [`FakeApiServer::hits`] (what clients asked),
//! [`FakeApiServer::pause_watches`] (hold watch events back, to reproduce a watch that lags
//! behind the kubelet), [`FakeApiServer::fail_requests`] (answer every request with an error),
//! [`FakeApiServer::fail_path`] (answer one path with an error),
//! [`FakeApiServer::fail_path_times`] (answer one path with an error a number of times), and
//! [`FakeApiServer::route_sequence`] (answers that change with each request, as an object's
//! status does).
//!
//! The server runs on its own thread and Tokio runtime, so it works from synchronous tests and
//! from any async runtime alike; dropping it closes the port and every open watch.
//!
//! [`rbac`] holds recorded requests against the RBAC rules of rendered manifests.
//!
//! A crate of its own, with no dependency on the agent, so that every crate's tests can use it.

#![forbid(unsafe_code)]

pub mod rbac;

use std::{
    collections::{BTreeMap, BTreeSet},
    convert::Infallible,
    fmt, fs, io,
    net::{SocketAddr, TcpListener as StdTcpListener},
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicUsize, Ordering},
    },
    thread,
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::{Method, Request, Response, StatusCode, body::Frame, service::service_fn};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot, watch};

/// Longest watch the server keeps open, whatever `timeoutSeconds` asks.
const MAX_WATCH: Duration = Duration::from_secs(3600);

/// Errors of the fake server's library API.
#[derive(Debug, thiserror::Error)]
pub enum FakeApiError {
    /// Binding the listener or starting the server thread failed.
    #[error("starting the fake API server: {0}")]
    Start(#[source] io::Error),
    /// An object that is not a core `v1` object this server knows, or lacks a name.
    #[error("unsupported object: {0}")]
    Unsupported(String),
    /// A manifest file could not be read.
    #[error("reading {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A manifest file is not JSON/YAML Kubernetes objects.
    #[error("parsing {}: {reason}", path.display())]
    Parse { path: PathBuf, reason: String },
    /// Serializing an object given to [`FakeApiServer::apply`] failed.
    #[error("serializing object: {0}")]
    Serialize(#[from] serde_json::Error),
}

/// The core `v1` resources served: (kind, plural, namespaced).
const RESOURCES: &[(&str, &str, bool)] = &[
    ("Pod", "pods", true),
    ("Namespace", "namespaces", false),
    ("Service", "services", true),
    ("Endpoints", "endpoints", true),
    ("Node", "nodes", false),
    ("ConfigMap", "configmaps", true),
    ("Secret", "secrets", true),
    ("ServiceAccount", "serviceaccounts", true),
];

/// kubectl's short names, for discovery.
fn short_names(plural: &str) -> &'static [&'static str] {
    match plural {
        "pods" => &["po"],
        "namespaces" => &["ns"],
        "services" => &["svc"],
        "endpoints" => &["ep"],
        "nodes" => &["no"],
        "configmaps" => &["cm"],
        "serviceaccounts" => &["sa"],
        _ => &[],
    }
}

fn resource_by_kind(kind: &str) -> Option<(&'static str, &'static str, bool)> {
    RESOURCES.iter().copied().find(|(k, _, _)| *k == kind)
}

fn resource_by_plural(plural: &str) -> Option<(&'static str, &'static str, bool)> {
    RESOURCES.iter().copied().find(|(_, p, _)| *p == plural)
}

/// Identifies one stored object.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    /// The resource's plural (`pods`).
    pub plural: &'static str,
    /// `None` for cluster-scoped objects.
    pub namespace: Option<String>,
    pub name: String,
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{}/{}/{}", self.plural, ns, self.name),
            None => write!(f, "{}/{}", self.plural, self.name),
        }
    }
}

/// One request a client made, as received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedRequest {
    pub method: String,
    pub path: String,
    /// Decoded query parameters, in order.
    pub query: Vec<(String, String)>,
}

impl RecordedRequest {
    /// The value of query parameter `key`, if present.
    pub fn param(&self, key: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Whether this is a watch request.
    pub fn is_watch(&self) -> bool {
        matches!(self.param("watch"), Some("1" | "true"))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EventType {
    Added,
    Modified,
    Deleted,
}

/// One change, kept for watches that resume from an older resourceVersion.
#[derive(Clone, Debug)]
struct Change {
    rv: u64,
    key: ObjectKey,
    kind: EventType,
    /// The object before the change (`None` when created).
    old: Option<Value>,
    /// The object after the change (for deletions: its last state, at the deletion's rv).
    new: Value,
}

#[derive(Default)]
struct State {
    rv: u64,
    objects: BTreeMap<ObjectKey, Value>,
    history: Vec<Change>,
    /// Watches from a resourceVersion below this get `410 Gone`.
    compacted: u64,
    requests: Vec<RecordedRequest>,
    paused: bool,
    failing: Option<StatusCode>,
    next_uid: u64,
    /// Fixed answers by exact URL path, ahead of the stored objects.
    routes: BTreeMap<String, Value>,
    /// URL paths answered with an error status.
    failing_paths: BTreeMap<String, StatusCode>,
    /// URL paths answered with an error status a number of times more.
    failing_times: BTreeMap<String, (StatusCode, usize)>,
    /// Answers by exact URL path that change with each GET: the bodies, and how many GETs
    /// were answered so far.
    sequences: BTreeMap<String, (Vec<Value>, usize)>,
}

struct Shared {
    state: Mutex<State>,
    /// Watches streaming right now.
    watches_open: AtomicUsize,
    /// Watches ever opened.
    watches_started: AtomicUsize,
    /// Bumped on every change of `state` that a watch may care about.
    notify: watch::Sender<u64>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock (only possible in a test's own code path) must not
        // hide the state from the rest of the test: take it anyway.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wake(&self) {
        self.notify.send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// A running fake API server. See the module documentation.
pub struct FakeApiServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl FakeApiServer {
    /// Starts a server on an ephemeral port of 127.0.0.1.
    pub fn start() -> Result<Self, FakeApiError> {
        Self::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
    }

    /// Starts a server on `addr`.
    pub fn bind(addr: SocketAddr) -> Result<Self, FakeApiError> {
        let listener = StdTcpListener::bind(addr).map_err(FakeApiError::Start)?;
        listener
            .set_nonblocking(true)
            .map_err(FakeApiError::Start)?;
        let addr = listener.local_addr().map_err(FakeApiError::Start)?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            notify: watch::Sender::new(0),
            watches_open: AtomicUsize::new(0),
            watches_started: AtomicUsize::new(0),
        });
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(FakeApiError::Start)?;
        let (shutdown, stop) = oneshot::channel();
        let served = shared.clone();
        let thread = thread::Builder::new()
            .name("fake-apiserver".into())
            .spawn(move || runtime.block_on(serve(listener, served, stop)))
            .map_err(FakeApiError::Start)?;
        Ok(Self {
            addr,
            shared,
            shutdown: Some(shutdown),
            thread: Some(thread),
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its base URL, `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Writes a kubeconfig pointing at this server (see [`kubeconfig`]).
    pub fn write_kubeconfig(&self, path: &Path) -> io::Result<()> {
        write_kubeconfig(path, &self.url())
    }

    /// Creates or replaces an object (anything that serializes to a core `v1` object: a
    /// k8s-openapi type or JSON). Fills in `metadata.uid` (kept across updates), the namespace
    /// of namespaced objects (`default`) and `metadata.resourceVersion`. Applying an object
    /// identical to the stored one changes nothing. Returns the stored object.
    pub fn apply<T: serde::Serialize>(&self, object: &T) -> Result<Value, FakeApiError> {
        let object = serde_json::to_value(object)?;
        let mut state = self.shared.lock();
        let (key, stored) = state.apply(object)?;
        drop(state);
        self.shared.wake();
        log(&format!("applied {key}"));
        Ok(stored)
    }

    /// Deletes an object by kind (`Pod`), namespace (ignored for cluster-scoped kinds) and name.
    /// Returns whether it existed.
    pub fn delete(
        &self,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<bool, FakeApiError> {
        let key = key_for(kind, namespace, name)?;
        let existed = self.shared.lock().delete(&key);
        self.shared.wake();
        Ok(existed)
    }

    /// Deletes a pod. Returns whether it existed.
    pub fn delete_pod(&self, namespace: &str, name: &str) -> Result<bool, FakeApiError> {
        self.delete("Pod", Some(namespace), name)
    }

    /// The stored object, if any.
    pub fn get(
        &self,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Option<Value>, FakeApiError> {
        let key = key_for(kind, namespace, name)?;
        Ok(self.shared.lock().objects.get(&key).cloned())
    }

    /// Every stored object's key.
    pub fn keys(&self) -> Vec<ObjectKey> {
        self.shared.lock().objects.keys().cloned().collect()
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.lock().rv
    }

    /// Every request received so far, oldest first.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.lock().requests.clone()
    }

    /// How many watches are streaming right now.
    pub fn watches_open(&self) -> usize {
        self.shared.watches_open.load(Ordering::SeqCst)
    }

    /// How many watches were opened since the server started.
    pub fn watches_started(&self) -> usize {
        self.shared.watches_started.load(Ordering::SeqCst)
    }

    /// Forgets the recorded requests.
    pub fn clear_requests(&self) {
        self.shared.lock().requests.clear();
    }

    /// While paused, open watches deliver nothing (events queue up and are delivered on
    /// resume). GETs and LISTs still see every change.
    pub fn pause_watches(&self, paused: bool) {
        self.shared.lock().paused = paused;
        self.shared.wake();
    }

    /// Answers every request with `status` (an error `Status` body) until called with `None`.
    /// Open watches end.
    pub fn fail_requests(&self, status: Option<u16>) {
        self.shared.lock().failing = status.and_then(|s| StatusCode::from_u16(s).ok());
        self.shared.wake();
    }

    /// Answers GETs of exactly `path` (query ignored) with `body`, ahead of the stored objects
    /// and whatever the path means otherwise: any JSON (a List, an object of any API group),
    /// no resourceVersion bookkeeping, no watch events. Ends a failure set by
    /// [`FakeApiServer::fail_path`].
    pub fn route(&self, path: &str, body: Value) {
        let mut state = self.shared.lock();
        state.failing_paths.remove(path);
        state.sequences.remove(path);
        state.routes.insert(path.to_string(), body);
    }

    /// Like [`FakeApiServer::route`], but the answer changes over time: the n-th GET of `path`
    /// (from 0) gets `bodies[n]`, and every GET after the last body gets the last one again
    /// (an object whose status changes, e.g. a DaemonSet becoming ready). Empty `bodies`
    /// removes the sequence.
    pub fn route_sequence(&self, path: &str, bodies: Vec<Value>) {
        let mut state = self.shared.lock();
        state.failing_paths.remove(path);
        state.routes.remove(path);
        if bodies.is_empty() {
            state.sequences.remove(path);
        } else {
            state.sequences.insert(path.to_string(), (bodies, 0));
        }
    }

    /// Stops answering `path` from [`FakeApiServer::route`] or
    /// [`FakeApiServer::route_sequence`].
    pub fn remove_route(&self, path: &str) {
        let mut state = self.shared.lock();
        state.routes.remove(path);
        state.sequences.remove(path);
    }

    /// Answers requests of exactly `path` with `status` (an error `Status` body) until called
    /// with `None`.
    pub fn fail_path(&self, path: &str, status: Option<u16>) {
        let mut state = self.shared.lock();
        match status.and_then(|s| StatusCode::from_u16(s).ok()) {
            Some(code) => state.failing_paths.insert(path.to_string(), code),
            None => state.failing_paths.remove(path),
        };
    }

    /// Answers the next `times` requests of exactly `path` with `status` (an error `Status`
    /// body), then answers as before: an API server that fails for a while.
    pub fn fail_path_times(&self, path: &str, status: u16, times: usize) {
        let mut state = self.shared.lock();
        match StatusCode::from_u16(status) {
            Ok(code) if times > 0 => state.failing_times.insert(path.to_string(), (code, times)),
            _ => state.failing_times.remove(path),
        };
    }

    /// How many requests of exactly `path` were received (since the last
    /// [`FakeApiServer::clear_requests`]).
    pub fn hits(&self, path: &str) -> usize {
        let state = self.shared.lock();
        state.requests.iter().filter(|r| r.path == path).count()
    }

    /// Forgets the change history: watches resuming from an older resourceVersion get
    /// `410 Gone` and must list again.
    pub fn compact(&self) {
        let mut state = self.shared.lock();
        state.compacted = state.rv;
        state.history.clear();
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Logging without a logging framework: test-support output goes to stderr when
/// `LINKERD_CNI_FAKE_APISERVER_LOG` is set.
fn log(msg: &str) {
    if std::env::var_os("LINKERD_CNI_FAKE_APISERVER_LOG").is_some() {
        eprintln!("fake-apiserver: {msg}");
    }
}

fn key_for(kind: &str, namespace: Option<&str>, name: &str) -> Result<ObjectKey, FakeApiError> {
    let (_, plural, namespaced) =
        resource_by_kind(kind).ok_or_else(|| FakeApiError::Unsupported(format!("kind {kind}")))?;
    Ok(ObjectKey {
        plural,
        namespace: namespaced.then(|| namespace.unwrap_or("default").to_string()),
        name: name.to_string(),
    })
}

/// The key of a core `v1` object given as JSON.
fn object_key(object: &Value) -> Result<ObjectKey, FakeApiError> {
    let api_version = object
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("v1");
    if api_version != "v1" {
        return Err(FakeApiError::Unsupported(format!(
            "apiVersion {api_version} (only core v1)"
        )));
    }
    let kind = object
        .get("kind")
        .and_then(Value::as_str)
        .ok_or_else(|| FakeApiError::Unsupported("object without kind".into()))?;
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| FakeApiError::Unsupported(format!("{kind} without metadata.name")))?;
    let namespace = object
        .pointer("/metadata/namespace")
        .and_then(Value::as_str);
    key_for(kind, namespace, name)
}

impl State {
    fn apply(&mut self, mut object: Value) -> Result<(ObjectKey, Value), FakeApiError> {
        let key = object_key(&object)?;

        let old = self.objects.get(&key).cloned();
        let uid = match old
            .as_ref()
            .and_then(|o| o.pointer("/metadata/uid"))
            .and_then(Value::as_str)
        {
            Some(uid) => uid.to_string(),
            None => match object.pointer("/metadata/uid").and_then(Value::as_str) {
                Some(uid) => uid.to_string(),
                None => {
                    self.next_uid += 1;
                    format!("00000000-0000-4000-8000-{:012x}", self.next_uid)
                }
            },
        };
        object["apiVersion"] = json!("v1");
        if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("uid".into(), json!(uid));
            if let Some(ns) = &key.namespace {
                meta.insert("namespace".into(), json!(ns));
            }
            if let Some(old) = &old {
                meta.insert(
                    "resourceVersion".into(),
                    old["metadata"]["resourceVersion"].clone(),
                );
            }
        }
        if old.as_ref() == Some(&object) {
            return Ok((key, object));
        }
        self.rv += 1;
        object["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        self.objects.insert(key.clone(), object.clone());
        let kind = if old.is_some() {
            EventType::Modified
        } else {
            EventType::Added
        };
        self.history.push(Change {
            rv: self.rv,
            key: key.clone(),
            kind,
            old,
            new: object.clone(),
        });
        Ok((key, object))
    }

    fn delete(&mut self, key: &ObjectKey) -> bool {
        let Some(old) = self.objects.remove(key) else {
            return false;
        };
        self.rv += 1;
        let mut last = old.clone();
        last["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        self.history.push(Change {
            rv: self.rv,
            key: key.clone(),
            kind: EventType::Deleted,
            old: Some(old),
            new: last,
        });
        true
    }
}

// --- manifests -------------------------------------------------------------------------------

/// Reads every object of the `*.json`, `*.yaml` and `*.yml` files of `dir` (not recursive;
/// YAML files may hold several documents; `kind: List` is flattened). Files are read in name
/// order.
pub fn read_manifests(dir: &Path) -> Result<Vec<(PathBuf, Value)>, FakeApiError> {
    let read_err = |source| FakeApiError::Read {
        path: dir.to_path_buf(),
        source,
    };
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .map_err(read_err)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.is_file()
                && matches!(
                    p.extension().and_then(|e| e.to_str()),
                    Some("json" | "yaml" | "yml")
                )
        })
        .collect();
    files.sort();
    let mut out = Vec::new();
    for path in files {
        for object in read_manifest(&path)? {
            out.push((path.clone(), object));
        }
    }
    Ok(out)
}

/// Reads the objects of one JSON or YAML file.
pub fn read_manifest(path: &Path) -> Result<Vec<Value>, FakeApiError> {
    let text = fs::read_to_string(path).map_err(|source| FakeApiError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let parse_err = |reason: String| FakeApiError::Parse {
        path: path.to_path_buf(),
        reason,
    };
    let docs: Vec<Value> = if path.extension().is_some_and(|e| e == "json") {
        vec![serde_json::from_str(&text).map_err(|e| parse_err(e.to_string()))?]
    } else {
        let mut docs = Vec::new();
        for doc in serde_yaml_ng::Deserializer::from_str(&text) {
            let value: Value =
                serde::Deserialize::deserialize(doc).map_err(|e| parse_err(e.to_string()))?;
            if !value.is_null() {
                docs.push(value);
            }
        }
        docs
    };
    let mut out = Vec::new();
    for doc in docs {
        match (doc.get("kind").and_then(Value::as_str), doc.get("items")) {
            (Some(k), Some(Value::Array(items))) if k == "List" || k.ends_with("List") => {
                out.extend(items.iter().cloned())
            }
            _ => out.push(doc),
        }
    }
    Ok(out)
}

/// A directory of manifests kept in sync with a server: objects of new or changed files are
/// applied, objects whose file (or document) disappeared are deleted.
pub struct ManifestDir {
    path: PathBuf,
    loaded: BTreeSet<ObjectKey>,
}

/// What one [`ManifestDir::sync`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// Objects in the directory (applied; unchanged ones are no-ops on the server).
    pub objects: usize,
    /// Objects deleted because their manifest disappeared.
    pub deleted: usize,
}

impl ManifestDir {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            loaded: BTreeSet::new(),
        }
    }

    /// Applies the directory's current content to `server`. On a read or parse error nothing is
    /// changed (a half-written file does not delete its objects).
    pub fn sync(&mut self, server: &FakeApiServer) -> Result<SyncReport, FakeApiError> {
        let objects = read_manifests(&self.path)?;
        let mut seen = BTreeSet::new();
        let mut state = server.shared.lock();
        // Validate everything before changing anything.
        for (path, object) in &objects {
            let key = object_key(object).map_err(|e| FakeApiError::Parse {
                path: path.clone(),
                reason: e.to_string(),
            })?;
            seen.insert(key);
        }
        for (path, object) in objects {
            state.apply(object).map_err(|e| FakeApiError::Parse {
                path,
                reason: e.to_string(),
            })?;
        }
        let gone: Vec<ObjectKey> = self.loaded.difference(&seen).cloned().collect();
        for key in &gone {
            state.delete(key);
        }
        drop(state);
        server.shared.wake();
        let report = SyncReport {
            objects: seen.len(),
            deleted: gone.len(),
        };
        self.loaded = seen;
        Ok(report)
    }
}

// --- kubeconfig ------------------------------------------------------------------------------

/// A kubeconfig whose current context points at `server_url` with no credentials (the fake
/// server asks for none).
pub fn kubeconfig(server_url: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: fake
  cluster:
    server: {server_url}
users:
- name: fake
  user: {{}}
contexts:
- name: fake
  context:
    cluster: fake
    user: fake
    namespace: default
current-context: fake
"
    )
}

/// Writes [`kubeconfig`] to `path` atomically (temporary file, then rename), mode 0600.
pub fn write_kubeconfig(path: &Path, server_url: &str) -> io::Result<()> {
    use std::{io::Write, os::unix::fs::OpenOptionsExt};
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    file.write_all(kubeconfig(server_url).as_bytes())?;
    file.sync_all()?;
    fs::rename(&tmp, path)
}

// --- HTTP ------------------------------------------------------------------------------------

type Body = BoxBody<Bytes, Infallible>;

async fn serve(listener: StdTcpListener, shared: Arc<Shared>, mut stop: oneshot::Receiver<()>) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("fake-apiserver: cannot use listener: {e}");
            return;
        }
    };
    loop {
        tokio::select! {
            _ = &mut stop => return,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let shared = shared.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| {
                        let shared = shared.clone();
                        async move { Ok::<_, Infallible>(handle(&shared, req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        }
    }
}

fn full(status: StatusCode, body: Value) -> Response<Body> {
    let mut bytes = serde_json::to_vec(&body).unwrap_or_default();
    bytes.push(b'\n');
    let mut resp = Response::new(Full::new(Bytes::from(bytes)).boxed());
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    resp
}

fn status_object(code: StatusCode, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code.as_u16(),
    })
}

fn error(code: StatusCode, reason: &str, message: &str) -> Response<Body> {
    full(code, status_object(code, reason, message))
}

fn percent_decode(s: &str) -> String {
    let hex = |b: u8| char::from(b).to_digit(16);
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                    (Some(h), Some(l)) => {
                        // Two hex digits make one byte: h, l < 16.
                        out.push((h * 16 + l) as u8);
                        i += 2;
                    }
                    _ => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn parse_query(q: Option<&str>) -> Vec<(String, String)> {
    q.unwrap_or_default()
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) => (percent_decode(k), percent_decode(v)),
            None => (percent_decode(kv), String::new()),
        })
        .collect()
}

/// The path of the server's own statistics (see the module documentation).
pub const STATS_PATH: &str = "/fake/stats";

/// What `GET /fake/stats` answers.
fn stats(shared: &Shared) -> Value {
    let requests: Vec<Value> = shared
        .lock()
        .requests
        .iter()
        .map(|r| json!({"method": r.method, "path": r.path, "query": r.query}))
        .collect();
    json!({
        "requests": requests,
        "watchesOpen": shared.watches_open.load(Ordering::SeqCst),
        "watchesStarted": shared.watches_started.load(Ordering::SeqCst),
    })
}

/// Whether the client asked for `PartialObjectMetadata` (metadata-only) answers.
fn wants_metadata_only(req: &Request<hyper::body::Incoming>) -> bool {
    req.headers()
        .get_all(hyper::header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("as=PartialObjectMetadata"))
}

/// An object as a metadata-only answer carries it.
fn metadata_only(object: &Value) -> Value {
    json!({
        "apiVersion": "meta.k8s.io/v1",
        "kind": "PartialObjectMetadata",
        "metadata": object.get("metadata").cloned().unwrap_or_else(|| json!({})),
    })
}

async fn handle(shared: &Arc<Shared>, req: Request<hyper::body::Incoming>) -> Response<Body> {
    if req.uri().path() == STATS_PATH && req.method() == Method::GET {
        return full(StatusCode::OK, stats(shared));
    }
    let meta_only = wants_metadata_only(&req);
    let record = RecordedRequest {
        method: req.method().to_string(),
        path: req.uri().path().to_string(),
        query: parse_query(req.uri().query()),
    };
    let (failing, route) = {
        let mut state = shared.lock();
        state.requests.push(record.clone());
        let mut failing = state
            .failing_paths
            .get(&record.path)
            .copied()
            .or(state.failing);
        if failing.is_none()
            && let Some((code, left)) = state.failing_times.get_mut(&record.path)
        {
            failing = Some(*code);
            *left -= 1;
            if *left == 0 {
                state.failing_times.remove(&record.path);
            }
        }
        let mut route = state.routes.get(&record.path).cloned();
        if failing.is_none()
            && record.method == "GET"
            && let Some((bodies, served)) = state.sequences.get_mut(&record.path)
        {
            route = bodies.get(*served).or(bodies.last()).cloned();
            *served += 1;
        }
        (failing, route)
    };
    log(&format!(
        "{} {} {:?}",
        record.method, record.path, record.query
    ));
    if let Some(code) = failing {
        return error(
            code,
            "InternalError",
            "the fake API server was told to fail",
        );
    }
    if req.method() != Method::GET {
        return error(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "the fake API server is read-only",
        );
    }
    if let Some(body) = route {
        return full(StatusCode::OK, body);
    }
    match record.path.trim_end_matches('/') {
        "/version" => {
            return full(
                StatusCode::OK,
                json!({"major": "1", "minor": "34", "gitVersion": "v1.34.0-fake", "platform": "linux/amd64"}),
            );
        }
        "/api" => {
            return full(
                StatusCode::OK,
                json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}),
            );
        }
        "/apis" => {
            return full(
                StatusCode::OK,
                json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": []}),
            );
        }
        "/api/v1" => {
            let resources: Vec<Value> = RESOURCES
                .iter()
                .map(|(kind, plural, namespaced)| {
                    json!({"name": plural, "singularName": kind.to_lowercase(), "namespaced": namespaced, "shortNames": short_names(plural), "kind": kind, "verbs": ["get", "list", "watch"]})
                })
                .collect();
            return full(
                StatusCode::OK,
                json!({"kind": "APIResourceList", "groupVersion": "v1", "resources": resources}),
            );
        }
        _ => {}
    }
    let Some(rest) = record.path.strip_prefix("/api/v1/") else {
        return error(
            StatusCode::NOT_FOUND,
            "NotFound",
            "the server could not find the requested resource",
        );
    };
    let segs: Vec<&str> = rest.trim_end_matches('/').split('/').collect();
    // (plural, namespace scope of a collection, object name)
    let (plural, namespace, name) = match segs.as_slice() {
        [plural] => (*plural, None, None),
        ["namespaces", name] => ("namespaces", None, Some(*name)),
        ["namespaces", ns, plural] => (*plural, Some(*ns), None),
        ["namespaces", ns, plural, name] => (*plural, Some(*ns), Some(*name)),
        _ => {
            return error(
                StatusCode::NOT_FOUND,
                "NotFound",
                "the server could not find the requested resource",
            );
        }
    };
    let Some((kind, plural, namespaced)) = resource_by_plural(plural) else {
        return error(
            StatusCode::NOT_FOUND,
            "NotFound",
            &format!("the server doesn't have a resource type {plural:?}"),
        );
    };
    if namespace.is_some() && !namespaced {
        return error(
            StatusCode::NOT_FOUND,
            "NotFound",
            &format!("{plural} are not namespaced"),
        );
    }
    if let Some(name) = name {
        let key = ObjectKey {
            plural,
            namespace: namespaced.then(|| namespace.unwrap_or("default").to_string()),
            name: name.to_string(),
        };
        return match shared.lock().objects.get(&key) {
            Some(obj) if meta_only => full(StatusCode::OK, metadata_only(obj)),
            Some(obj) => full(StatusCode::OK, obj.clone()),
            None => error(
                StatusCode::NOT_FOUND,
                "NotFound",
                &format!("{plural} {name:?} not found"),
            ),
        };
    }
    let filter = match Filter::new(plural, namespace, &record) {
        Ok(f) => Filter { meta_only, ..f },
        Err(msg) => return error(StatusCode::BAD_REQUEST, "BadRequest", &msg),
    };
    if record.is_watch() {
        return watch_response(shared.clone(), filter, &record);
    }
    let state = shared.lock();
    let items: Vec<Value> = state
        .objects
        .iter()
        .filter(|(k, v)| filter.in_scope(k) && filter.matches(v))
        .map(|(_, v)| filter.shape(v))
        .collect();
    let (list_kind, api_version) = if meta_only {
        ("PartialObjectMetadataList".to_string(), "meta.k8s.io/v1")
    } else {
        (format!("{kind}List"), "v1")
    };
    full(
        StatusCode::OK,
        json!({"kind": list_kind, "apiVersion": api_version, "metadata": {"resourceVersion": state.rv.to_string()}, "items": items}),
    )
}

// --- selectors -------------------------------------------------------------------------------

#[derive(Debug)]
enum FieldTerm {
    Eq(String, String),
    Ne(String, String),
}

#[derive(Debug)]
enum LabelTerm {
    Eq(String, String),
    Ne(String, String),
    Exists(String),
    Absent(String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

/// Which objects one LIST or WATCH is about.
#[derive(Debug)]
struct Filter {
    plural: &'static str,
    namespace: Option<String>,
    fields: Vec<FieldTerm>,
    labels: Vec<LabelTerm>,
    /// Answer with `PartialObjectMetadata` objects.
    meta_only: bool,
}

/// Splits on commas outside parentheses.
fn split_terms(s: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out.into_iter()
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .collect()
}

fn parse_field_selector(s: &str) -> Result<Vec<FieldTerm>, String> {
    split_terms(s)
        .into_iter()
        .map(|t| {
            if let Some((k, v)) = t.split_once("!=") {
                Ok(FieldTerm::Ne(k.trim().into(), v.trim().into()))
            } else if let Some((k, v)) = t.split_once("==").or_else(|| t.split_once('=')) {
                Ok(FieldTerm::Eq(k.trim().into(), v.trim().into()))
            } else {
                Err(format!("invalid field selector term {t:?}"))
            }
        })
        .collect()
}

fn parse_label_selector(s: &str) -> Result<Vec<LabelTerm>, String> {
    let set = |v: &str| -> Result<Vec<String>, String> {
        let v = v.trim();
        v.strip_prefix('(')
            .and_then(|v| v.strip_suffix(')'))
            .map(|v| v.split(',').map(|x| x.trim().to_string()).collect())
            .ok_or_else(|| format!("invalid label set {v:?}"))
    };
    split_terms(s)
        .into_iter()
        .map(|t| {
            if let Some((k, v)) = t.split_once(" notin ") {
                Ok(LabelTerm::NotIn(k.trim().into(), set(v)?))
            } else if let Some((k, v)) = t.split_once(" in ") {
                Ok(LabelTerm::In(k.trim().into(), set(v)?))
            } else if let Some((k, v)) = t.split_once("!=") {
                Ok(LabelTerm::Ne(k.trim().into(), v.trim().into()))
            } else if let Some((k, v)) = t.split_once("==").or_else(|| t.split_once('=')) {
                Ok(LabelTerm::Eq(k.trim().into(), v.trim().into()))
            } else if let Some(k) = t.strip_prefix('!') {
                Ok(LabelTerm::Absent(k.trim().into()))
            } else if t
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
            {
                Ok(LabelTerm::Exists(t.into()))
            } else {
                Err(format!("invalid label selector term {t:?}"))
            }
        })
        .collect()
}

/// A dotted field's value as the API server compares it (absent: empty string).
fn field_value(obj: &Value, path: &str) -> String {
    let mut v = obj;
    for part in path.split('.') {
        match v.get(part) {
            Some(next) => v = next,
            None => return String::new(),
        }
    }
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

impl Filter {
    fn new(
        plural: &'static str,
        namespace: Option<&str>,
        req: &RecordedRequest,
    ) -> Result<Self, String> {
        Ok(Self {
            plural,
            namespace: namespace.map(str::to_string),
            fields: req
                .param("fieldSelector")
                .map(parse_field_selector)
                .transpose()?
                .unwrap_or_default(),
            labels: req
                .param("labelSelector")
                .map(parse_label_selector)
                .transpose()?
                .unwrap_or_default(),
            meta_only: false,
        })
    }

    /// An object as this LIST or WATCH answers it.
    fn shape(&self, object: &Value) -> Value {
        if self.meta_only {
            metadata_only(object)
        } else {
            object.clone()
        }
    }

    fn in_scope(&self, key: &ObjectKey) -> bool {
        key.plural == self.plural && (self.namespace.is_none() || key.namespace == self.namespace)
    }

    fn matches(&self, obj: &Value) -> bool {
        let fields = self.fields.iter().all(|t| match t {
            FieldTerm::Eq(k, v) => field_value(obj, k) == *v,
            FieldTerm::Ne(k, v) => field_value(obj, k) != *v,
        });
        let labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
        let label = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        fields
            && self.labels.iter().all(|t| match t {
                LabelTerm::Eq(k, v) => label(k) == Some(v.as_str()),
                LabelTerm::Ne(k, v) => label(k) != Some(v.as_str()),
                LabelTerm::Exists(k) => label(k).is_some(),
                LabelTerm::Absent(k) => label(k).is_none(),
                LabelTerm::In(k, set) => label(k).is_some_and(|l| set.iter().any(|s| s == l)),
                LabelTerm::NotIn(k, set) => label(k).is_none_or(|l| !set.iter().any(|s| s == l)),
            })
    }

    /// The event a watcher with this filter sees for `change`, if any.
    fn event(&self, change: &Change) -> Option<Value> {
        if !self.in_scope(&change.key) {
            return None;
        }
        let was = change.old.as_ref().is_some_and(|o| self.matches(o));
        let is = change.kind != EventType::Deleted && self.matches(&change.new);
        let kind = match (change.kind, was, is) {
            (EventType::Deleted, true, _) => "DELETED",
            (EventType::Deleted, false, _) => return None,
            (_, false, true) => "ADDED",
            (_, true, true) => "MODIFIED",
            (_, true, false) => "DELETED",
            (_, false, false) => return None,
        };
        Some(json!({"type": kind, "object": self.shape(&change.new)}))
    }
}

// --- watch -----------------------------------------------------------------------------------

fn watch_response(shared: Arc<Shared>, filter: Filter, req: &RecordedRequest) -> Response<Body> {
    let from = match req.param("resourceVersion") {
        None | Some("" | "0") => None,
        Some(rv) => match rv.parse::<u64>() {
            Ok(rv) => Some(rv),
            Err(_) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    &format!("invalid resourceVersion {rv:?}"),
                );
            }
        },
    };
    let timeout = req
        .param("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map_or(MAX_WATCH, |t| Duration::from_secs(t).min(MAX_WATCH));
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    shared.watches_started.fetch_add(1, Ordering::SeqCst);
    shared.watches_open.fetch_add(1, Ordering::SeqCst);
    tokio::spawn(async move {
        let _ = tokio::time::timeout(timeout, stream_events(&shared, &filter, from, &tx)).await;
        shared.watches_open.fetch_sub(1, Ordering::SeqCst);
    });
    let body = StreamBody::new(futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    }));
    let mut resp = Response::new(BodyExt::boxed(body));
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    resp
}

fn line(event: &Value) -> Bytes {
    let mut bytes = serde_json::to_vec(event).unwrap_or_default();
    bytes.push(b'\n');
    Bytes::from(bytes)
}

/// Sends events until the client goes away, the server is told to fail, or (outside) the
/// timeout ends the watch.
async fn stream_events(
    shared: &Shared,
    filter: &Filter,
    from: Option<u64>,
    tx: &mpsc::Sender<Bytes>,
) {
    let mut notified = shared.notify.subscribe();
    // Synthetic ADDED events for a watch without a starting point.
    let mut cursor = match from {
        Some(rv) => rv,
        None => {
            let (rv, initial): (u64, Vec<Value>) = {
                let state = shared.lock();
                let objs = state
                    .objects
                    .iter()
                    .filter(|(k, v)| filter.in_scope(k) && filter.matches(v))
                    .map(|(_, v)| json!({"type": "ADDED", "object": filter.shape(v)}))
                    .collect();
                (state.rv, objs)
            };
            for ev in initial {
                if tx.send(line(&ev)).await.is_err() {
                    return;
                }
            }
            rv
        }
    };
    loop {
        let batch: Result<Vec<Value>, ()> = {
            let state = shared.lock();
            if state.failing.is_some() {
                return;
            }
            if state.paused {
                Ok(Vec::new())
            } else if cursor < state.compacted {
                Err(())
            } else {
                // The history is in resourceVersion order: skip what this watch has seen
                // without scanning it (many watches over a long history, as in the
                // benchmark's API-load scenario).
                let unseen = state.history.partition_point(|c| c.rv <= cursor);
                let events = state.history[unseen..]
                    .iter()
                    .filter_map(|c| filter.event(c))
                    .collect();
                cursor = cursor.max(state.rv);
                Ok(events)
            }
        };
        match batch {
            Err(()) => {
                let gone = status_object(StatusCode::GONE, "Expired", "too old resource version");
                let _ = tx
                    .send(line(&json!({"type": "ERROR", "object": gone})))
                    .await;
                return;
            }
            Ok(events) => {
                for ev in events {
                    if tx.send(line(&ev)).await.is_err() {
                        return;
                    }
                }
            }
        }
        tokio::select! {
            changed = notified.changed() => if changed.is_err() { return },
            _ = tx.closed() => return,
        }
    }
}
