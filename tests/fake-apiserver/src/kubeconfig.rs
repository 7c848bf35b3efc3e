//! A kubeconfig pointing at a fake server, with no credentials.

use std::{fs, io, path::Path, path::PathBuf};

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

/// A kubeconfig file pointing at a fake server, in the temporary directory under a name of its
/// own (process id and a counter), removed on drop: one per test.
#[derive(Debug)]
pub struct TempKubeconfig(PathBuf);

impl TempKubeconfig {
    /// Writes one for `server_url`.
    ///
    /// # Panics
    /// If it cannot be written (a test helper: the test cannot go on without it).
    pub fn new(server_url: &str) -> Self {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "linkerd-cni-fake-{}-{}.kubeconfig",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        write_kubeconfig(&path, server_url)
            .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        Self(path)
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempKubeconfig {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}
