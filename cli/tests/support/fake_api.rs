//! The workspace's fake Kubernetes API server (`linkerd-cni-fake-apiserver`) serving fixed JSON
//! objects by URL path (404 with a `Status` elsewhere, like the real server), recording the
//! paths asked. The client under test is the production one, pointed at it through a
//! kubeconfig.

use std::{collections::BTreeMap, net::SocketAddr, path::PathBuf};

use linkerd_cni_fake_apiserver::FakeApiServer;
use serde_json::Value as Json;

/// A running fake API server; stops on drop.
pub struct FakeApi {
    pub addr: SocketAddr,
    server: FakeApiServer,
}

impl FakeApi {
    /// Starts a server answering `routes` (URL path -> JSON body).
    pub fn start(routes: BTreeMap<String, Json>) -> Self {
        let server = FakeApiServer::start().expect("starting the fake API server on loopback");
        for (path, body) in routes {
            server.route(&path, body);
        }
        Self {
            addr: server.addr(),
            server,
        }
    }

    /// A kubeconfig pointing at this server, written to a temp file.
    pub fn kubeconfig(&self, name: &str) -> PathBuf {
        super::temp_file(
            name,
            &linkerd_cni_fake_apiserver::kubeconfig(&self.server.url()),
        )
    }

    /// The server itself, for its test hooks (changing answers, failures, hit counts).
    pub fn server(&self) -> &FakeApiServer {
        &self.server
    }

    /// The URL paths requested so far, oldest first.
    pub fn requested(&self) -> Vec<String> {
        self.server.requests().into_iter().map(|r| r.path).collect()
    }
}
