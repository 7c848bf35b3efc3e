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
//! - PATCH of any object held (merge and strategic merge patches, e.g. removing a Node's
//!   taint by key), stored and watched like an apply;
//! - `events.k8s.io/v1` Events: create, merge-patch (an Event's `series`), get and list, with
//!   the real server's validation ([`FakeApiServer::events`] returns them);
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

mod events;
mod http;
mod kubeconfig;
mod manifests;
mod patch;
pub mod rbac;
mod resources;
mod response;
mod select;
mod server;
mod state;
mod watch;

pub use http::STATS_PATH;
pub use kubeconfig::{TempKubeconfig, kubeconfig, write_kubeconfig};
pub use manifests::{ManifestDir, SyncReport, read_manifest, read_manifests};
pub use server::FakeApiServer;

use std::{fmt, io, path::PathBuf};

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

/// Logging without a logging framework: test-support output goes to stderr when
/// `LINKERD_CNI_FAKE_APISERVER_LOG` is set.
fn log(msg: &str) {
    if std::env::var_os("LINKERD_CNI_FAKE_APISERVER_LOG").is_some() {
        eprintln!("fake-apiserver: {msg}");
    }
}
