//! [`FakeApiServer`]: starting the server on its own thread and runtime, and the library API
//! tests use to change what it holds and to see what clients asked.

use std::{
    io,
    net::{SocketAddr, TcpListener as StdTcpListener},
    path::Path,
    sync::{Arc, Mutex, atomic::AtomicUsize, atomic::Ordering},
    thread,
};

use hyper::StatusCode;
use serde_json::Value;
use tokio::sync::{oneshot, watch};

use crate::{
    FakeApiError, ObjectKey, RecordedRequest,
    http::serve,
    kubeconfig::write_kubeconfig,
    log,
    state::{Shared, State, key_for},
};

/// A running fake API server. See the module documentation.
pub struct FakeApiServer {
    addr: SocketAddr,
    pub(crate) shared: Arc<Shared>,
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

    /// Writes a kubeconfig pointing at this server (see [`kubeconfig`](fn@crate::kubeconfig)).
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

    /// Every `events.k8s.io/v1` Event clients created, as stored (ordered by namespace, name).
    pub fn events(&self) -> Vec<Value> {
        self.shared.lock().events.values().cloned().collect()
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
