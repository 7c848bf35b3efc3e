//! Test support: a fake node (host dirs under a temp root, the image's plugin binary, a
//! kubelet-style service-account volume) and polling helpers.
#![allow(
    dead_code,
    reason = "each test binary uses a different part of the support module"
)]

use std::{
    fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use linkerd_cni_installer::{Installer, InstallerConfig, json::Json};

/// Contents of the plugin binary in the "image".
pub const BINARY: &[u8] = b"#!/bin/sh\necho linkerd-cni test binary\n";
/// The service-account token at start.
pub const TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.first-token.sig";
/// The CA at start.
pub const CA: &str = "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n";

/// Path of a file under `tests/fixtures`.
pub fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel)
}

/// The fixture template, as the DaemonSet passes it in `CNI_NETWORK_CONFIG`.
pub fn template() -> String {
    fs::read_to_string(fixture("linkerd-cni-template.json"))
        .unwrap_or_else(|e| panic!("template fixture: {e}"))
}

/// A node: `<root>/host` is the host's `/` as the installer container sees it.
pub struct Node {
    pub root: tempfile::TempDir,
    pub installer: Installer,
    rotation: AtomicU32,
}

impl Node {
    pub fn new() -> Self {
        Self::with_env(&[])
    }

    /// A node whose installer environment has `extra` on top of the defaults.
    pub fn with_env(extra: &[(&str, &str)]) -> Self {
        let root = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let r = root.path();
        for d in ["host/etc/cni/net.d", "host/opt/cni/bin", "image", "sa"] {
            fs::create_dir_all(r.join(d)).unwrap_or_else(|e| panic!("mkdir {d}: {e}"));
        }
        fs::write(r.join("image/linkerd-cni"), BINARY).unwrap_or_else(|e| panic!("binary: {e}"));
        let node_env: Vec<(String, String)> = vec![
            (
                "CONTAINER_MOUNT_PREFIX".into(),
                r.join("host").to_string_lossy().into_owned(),
            ),
            (
                "CONTAINER_CNI_BIN_DIR".into(),
                r.join("image").to_string_lossy().into_owned(),
            ),
            (
                "SERVICEACCOUNT_PATH".into(),
                r.join("sa").to_string_lossy().into_owned(),
            ),
            ("KUBERNETES_SERVICE_HOST".into(), "10.96.0.1".into()),
            ("KUBERNETES_SERVICE_PORT".into(), "443".into()),
            ("CNI_NETWORK_CONFIG".into(), template()),
        ];
        let lookup = |key: &str| {
            extra
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| (*v).to_owned())
                .or_else(|| {
                    node_env
                        .iter()
                        .find(|(k, _)| k == key)
                        .map(|(_, v)| v.clone())
                })
        };
        let cfg = InstallerConfig::from_lookup(lookup).unwrap_or_else(|e| panic!("config: {e}"));
        let installer = Installer::new(cfg).unwrap_or_else(|e| panic!("installer: {e}"));
        let node = Self {
            root,
            installer,
            rotation: AtomicU32::new(0),
        };
        node.rotate_token(TOKEN);
        node
    }

    pub fn net_dir(&self) -> PathBuf {
        self.installer.config().net_dir()
    }

    pub fn net(&self, name: &str) -> PathBuf {
        self.net_dir().join(name)
    }

    pub fn sa_dir(&self) -> PathBuf {
        self.root.path().join("sa")
    }

    /// Copies fixtures from `tests/fixtures/net.d` into the net dir.
    pub fn add_fixtures(&self, names: &[&str]) {
        for name in names {
            fs::copy(fixture(&format!("net.d/{name}")), self.net(name))
                .unwrap_or_else(|e| panic!("fixture {name}: {e}"));
        }
    }

    pub fn read(&self, name: &str) -> Vec<u8> {
        fs::read(self.net(name)).unwrap_or_else(|e| panic!("reading {name}: {e}"))
    }

    /// File names in the net dir, sorted.
    pub fn listing(&self) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(self.net_dir())
            .unwrap_or_else(|e| panic!("listing: {e}"))
            .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect();
        names.sort();
        names
    }

    /// Publishes a new token the way the kubelet's atomic writer does: a fresh timestamped
    /// dir, a `..data_tmp` symlink to it, renamed over `..data`; `token` and `ca.crt` are
    /// symlinks through `..data`.
    pub fn rotate_token(&self, token: &str) {
        let sa = self.sa_dir();
        let n = self.rotation.fetch_add(1, Ordering::Relaxed);
        let ts = format!("..2026_01_01_00_00_{n:02}.000000001");
        fs::create_dir(sa.join(&ts)).unwrap_or_else(|e| panic!("{e}"));
        fs::write(sa.join(&ts).join("token"), token).unwrap_or_else(|e| panic!("{e}"));
        fs::write(sa.join(&ts).join("ca.crt"), CA).unwrap_or_else(|e| panic!("{e}"));
        fs::write(sa.join(&ts).join("namespace"), "linkerd-cni").unwrap_or_else(|e| panic!("{e}"));
        let _ = fs::remove_file(sa.join("..data_tmp"));
        symlink(&ts, sa.join("..data_tmp")).unwrap_or_else(|e| panic!("{e}"));
        fs::rename(sa.join("..data_tmp"), sa.join("..data")).unwrap_or_else(|e| panic!("{e}"));
        for f in ["token", "ca.crt", "namespace"] {
            if fs::symlink_metadata(sa.join(f)).is_err() {
                symlink(format!("..data/{f}"), sa.join(f)).unwrap_or_else(|e| panic!("{e}"));
            }
        }
    }
}

/// The `type` of every plugin of a conflist, in order.
pub fn plugin_types(bytes: &[u8]) -> Vec<String> {
    plugins(bytes)
        .iter()
        .map(|p| {
            p.get("type")
                .and_then(Json::as_str)
                .unwrap_or_else(|| panic!("plugin without type: {p:?}"))
                .to_owned()
        })
        .collect()
}

/// The plugins of a conflist.
pub fn plugins(bytes: &[u8]) -> Vec<Json> {
    let doc = Json::parse(bytes)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(bytes)));
    match doc.get("plugins") {
        Some(Json::Array(p)) => p.clone(),
        other => panic!("no plugins array: {other:?}"),
    }
}

/// Whether a conflist ends with exactly the installer's entry and holds no other linkerd-cni.
pub fn is_patched(node: &Node, bytes: &[u8]) -> bool {
    let Ok(doc) = Json::parse(bytes) else {
        return false;
    };
    let Some(Json::Array(ps)) = doc.get("plugins") else {
        return false;
    };
    ps.last() == Some(node.installer.plugin_entry())
        && ps
            .iter()
            .filter(|p| p.get("type").and_then(Json::as_str) == Some("linkerd-cni"))
            .count()
            == 1
}

/// Polls `check` every 5 ms until it holds; panics naming `what` after `limit`. Returns how
/// long it took.
pub async fn eventually(limit: Duration, what: &str, mut check: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    loop {
        if check() {
            return start.elapsed();
        }
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Logs to the test output when `RUST_LOG` is set.
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// An installer running its watch loop on the test's runtime.
pub struct Running {
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), linkerd_cni_installer::InstallError>>,
}

impl Running {
    /// Starts `installer.run` (install, watch, cleanup on shutdown).
    pub fn start(installer: &Installer) -> Self {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let installer = installer.clone();
        let task = tokio::spawn(async move {
            installer
                .run(async move {
                    let _ = rx.await;
                })
                .await
        });
        Self {
            shutdown: Some(tx),
            task,
        }
    }

    /// Signals shutdown and waits for `run` to return (after its cleanup).
    pub async fn stop(mut self) -> Result<(), linkerd_cni_installer::InstallError> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        match tokio::time::timeout(Duration::from_secs(5), &mut self.task).await {
            Ok(joined) => joined.unwrap_or_else(|e| panic!("installer task: {e}")),
            Err(_) => panic!("installer did not stop within 5s of shutdown"),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Writes `bytes` to `path` the way most CNI installers do: a temp file renamed over it.
pub fn replace_file(path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension("writer-tmp");
    fs::write(&tmp, bytes).unwrap_or_else(|e| panic!("writing {}: {e}", tmp.display()));
    fs::rename(&tmp, path).unwrap_or_else(|e| panic!("renaming over {}: {e}", path.display()));
}
