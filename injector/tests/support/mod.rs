//! Test support shared by the injector's integration tests: a fake Kubernetes API server
//! (plain HTTP, real JSON shapes), fixture and golden-file helpers, the schema validator, and
//! an HTTPS client that trusts a given CA.
#![allow(
    dead_code,
    reason = "each test binary uses a different part of the support module"
)]

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Command,
    sync::Arc,
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use linkerd_cni_fake_apiserver::FakeApiServer;
use serde_json::{Value, json};

/// Kubernetes version the schemas are checked against (the workspace's k8s-openapi feature).
pub const KUBERNETES_VERSION: &str = "1.34.0";

/// The workspace's fake API server (`linkerd-cni-fake-apiserver`) answering GETs of fixed paths
/// with the object stored there, else a 404 `Status`; every request is counted per path.
#[derive(Clone)]
pub struct FakeApi {
    pub addr: SocketAddr,
    server: Arc<FakeApiServer>,
}

impl FakeApi {
    /// Starts the server on a loopback port.
    pub async fn start() -> Self {
        let server = FakeApiServer::start().expect("start fake API");
        Self {
            addr: server.addr(),
            server: Arc::new(server),
        }
    }

    /// Serves `obj` at `path`.
    pub fn set(&self, path: &str, obj: Value) {
        self.server.route(path, obj);
    }

    /// Makes `path` answer with HTTP `code`.
    pub fn fail(&self, path: &str, code: u16) {
        self.server.fail_path(path, Some(code));
    }

    /// How many requests `path` received.
    pub fn hits(&self, path: &str) -> usize {
        self.server.hits(path)
    }

    /// Serves ConfigMap `linkerd/linkerd-config` with `values`.
    pub fn set_config(&self, values: &linkerd_injector::Values) {
        self.set(CONFIG_PATH, config_map(values));
    }

    /// Serves Namespace `name` with these annotations and labels.
    pub fn set_namespace(&self, name: &str, annotations: Value, labels: Value) {
        self.set(
            &format!("/api/v1/namespaces/{name}"),
            namespace(name, annotations, labels),
        );
    }

    /// A client of this server, exactly as production builds one but for the URL.
    pub fn client(&self) -> kube::Client {
        let url = format!("http://{}", self.addr).parse().expect("URL");
        kube::Client::try_from(kube::Config::new(url)).expect("kube client")
    }
}

/// Path of `linkerd-config` in the fake API.
pub const CONFIG_PATH: &str = "/api/v1/namespaces/linkerd/configmaps/linkerd-config";

/// ConfigMap `linkerd-config` as the API returns it.
pub fn config_map(values: &linkerd_injector::Values) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "linkerd-config", "namespace": "linkerd", "uid": "6f1c1b9e-2d1f-4d4c-9a57-7d0d1f3f2a10", "resourceVersion": "1042"},
        "data": {"values": values.to_yaml().expect("values YAML")},
    })
}

/// Namespace as the API returns it.
pub fn namespace(name: &str, annotations: Value, labels: Value) -> Value {
    let mut labels = labels;
    labels["kubernetes.io/metadata.name"] = json!(name);
    json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "uid": "0d5a3f57-5f1a-4a59-9b44-1a2b3c4d5e6f", "resourceVersion": "311", "annotations": annotations, "labels": labels},
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    })
}

/// The crate's directory.
pub fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Reads a JSON fixture from `tests/fixtures`.
pub fn fixture(name: &str) -> Value {
    let path = crate_dir().join("tests/fixtures").join(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

/// Compares `actual` with golden file `tests/golden/<name>`; with `UPDATE_GOLDEN=1`, rewrites
/// the file instead.
pub fn golden(name: &str, actual: &Value) {
    let path = crate_dir().join("tests/golden").join(name);
    let text = serde_json::to_string_pretty(actual).expect("serialise") + "\n";
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "reading golden {}: {e} (run with UPDATE_GOLDEN=1 to create it, then review it)",
            path.display()
        )
    });
    let want: Value = serde_json::from_str(&want)
        .unwrap_or_else(|e| panic!("parsing golden {}: {e}", path.display()));
    if &want != actual {
        panic!(
            "{} differs from the golden file (UPDATE_GOLDEN=1 rewrites it; review the diff)\n--- golden\n{}\n--- actual\n{}",
            path.display(),
            serde_json::to_string_pretty(&want).unwrap_or_default(),
            text
        );
    }
}

/// Validates Kubernetes objects with `kubernetes-validate --strict` (PyPI). Fails the test
/// with a clear message when the tool is missing.
pub fn validate(objects: &[Value]) {
    let dir = tempdir();
    let mut files = Vec::new();
    for (i, obj) in objects.iter().enumerate() {
        let path = dir.path.join(format!("object-{i}.yaml"));
        std::fs::write(&path, serde_yaml_ng::to_string(obj).expect("YAML")).expect("write object");
        files.push(path);
    }
    let out = match Command::new("kubernetes-validate")
        .args(["-k", KUBERNETES_VERSION, "--strict", "--no-warn"])
        .args(&files)
        .output()
    {
        Ok(out) => out,
        Err(e) => panic!(
            "kubernetes-validate is required to check the manifests against the Kubernetes schemas \
             but cannot be run ({e}); install it with `pip install kubernetes-validate`"
        ),
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !stdout.contains("ERROR") && !stderr.contains("ERROR"),
        "kubernetes-validate --strict failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
}

/// A temporary directory removed on drop.
pub struct TempDir {
    pub path: PathBuf,
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Creates a fresh temporary directory.
pub fn tempdir() -> TempDir {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let path = std::env::temp_dir().join(format!(
        "linkerd-injector-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&path).unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
    TempDir { path }
}

/// Applies an AdmissionReview response's patch to `pod` with the `json-patch` crate.
pub fn apply_response(pod: &Value, review: &Value) -> Value {
    let ops = linkerd_injector::admission::response_patch(review)
        .unwrap_or_else(|| panic!("no decodable patch in {review}"));
    let patch: json_patch::Patch =
        serde_json::from_value(Value::Array(ops)).expect("the patch is RFC 6902");
    let mut out = pod.clone();
    json_patch::patch(&mut out, &patch).unwrap_or_else(|e| panic!("the patch does not apply: {e}"));
    out
}

/// Makes `path` exist as an empty directory's parent (helper for file-based tests).
pub fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}

/// An HTTPS client trusting one CA, one connection per request.
pub struct HttpsClient {
    pub addr: SocketAddr,
    pub server_name: String,
    config: Arc<rustls::ClientConfig>,
}

impl HttpsClient {
    /// Trusts `ca_pem` and expects the server to present `server_name`.
    pub fn new(addr: SocketAddr, ca_pem: &str, server_name: &str) -> Self {
        use rustls::pki_types::{CertificateDer, pem::PemObject};
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            roots.add(cert.expect("CA PEM")).expect("CA accepted");
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
        Self {
            addr,
            server_name: server_name.to_string(),
            config: Arc::new(config),
        }
    }

    /// Opens a TLS connection (verifying the server's certificate).
    pub async fn connect(
        &self,
    ) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, String> {
        let tcp = tokio::net::TcpStream::connect(self.addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let name = rustls::pki_types::ServerName::try_from(self.server_name.clone())
            .map_err(|e| e.to_string())?;
        tokio_rustls::TlsConnector::from(self.config.clone())
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS handshake: {e}"))
    }

    /// Sends one request; returns status and body.
    pub async fn request(
        &self,
        method: &str,
        path: &str,
        body: Vec<u8>,
    ) -> Result<(u16, Vec<u8>), String> {
        let tls = self.connect().await?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| format!("HTTP handshake: {e}"))?;
        tokio::spawn(conn);
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", self.server_name.as_str())
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| e.to_string())?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| format!("request: {e}"))?;
        let status = resp.status().as_u16();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("body: {e}"))?
            .to_bytes()
            .to_vec();
        Ok((status, body))
    }

    /// POSTs an AdmissionReview and parses the answer (panics unless HTTP 200 with JSON).
    pub async fn review(&self, review: &Value) -> Value {
        let (status, body) = self
            .request("POST", "/", review.to_string().into_bytes())
            .await
            .expect("webhook reachable");
        assert_eq!(
            status,
            200,
            "webhook answered {status}: {}",
            String::from_utf8_lossy(&body)
        );
        serde_json::from_slice(&body).unwrap_or_else(|e| {
            panic!(
                "response is not JSON ({e}): {}",
                String::from_utf8_lossy(&body)
            )
        })
    }
}
