//! The agent's registry of pods: one JSON file per CNI attachment in the state directory,
//! written atomically, so a restarted agent knows every pod an earlier run registered.

use std::{
    fs, io,
    net::IpAddr,
    path::{Path, PathBuf},
};

use linkerd_cni_proto::{config::LinkerdConfig, wire::PodRef};
use serde::{Deserialize, Serialize};

/// How a pod's traffic is steered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum Attachment {
    /// Programs attached to the pod's own cgroup, links pinned under `pods/<id>/`.
    PerPod { cgroup: PathBuf },
    /// The pod's sockets are caught by the shared attachment on an ancestor cgroup and
    /// selected by netns cookie.
    Shared { cgroup: PathBuf },
    /// Not redirected (decision said no, or simulate).
    None,
}

impl Attachment {
    /// Why the pod is redirected, in words.
    pub fn describe(&self) -> String {
        match self {
            Self::PerPod { cgroup } => format!("redirected (programs attached to {})", cgroup.display()),
            Self::Shared { cgroup } => format!(
                "redirected (no pod cgroup v2 found; shared attachment on {}, selected by netns cookie)",
                cgroup.display()
            ),
            Self::None => "not redirected".into(),
        }
    }
}

/// One registered CNI attachment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PodRecord {
    /// `CNI_CONTAINERID`.
    pub id: String,
    pub ifname: String,
    pub netns: PathBuf,
    /// Inode of the netns file at registration: tells a reused path from the same netns.
    pub netns_ino: u64,
    pub netns_cookie: u64,
    pub pod: Option<PodRef>,
    pub attachment: Attachment,
    /// Why the pod is or is not redirected.
    pub reason: String,
    pub config: LinkerdConfig,
    pub pod_ips: Vec<IpAddr>,
}

impl PodRecord {
    pub fn redirected(&self) -> bool {
        self.attachment != Attachment::None
    }
}

/// The state directory.
#[derive(Clone, Debug)]
pub struct Registry {
    dir: PathBuf,
}

/// Container ids become file names: keep them to a safe alphabet.
fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 256
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        && !id.starts_with('.')
}

impl Registry {
    pub fn open(dir: &Path) -> io::Result<Self> {
        fs::create_dir_all(dir)?;
        Ok(Self { dir: dir.into() })
    }

    fn path(&self, id: &str) -> io::Result<PathBuf> {
        if !valid_id(id) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("invalid container id {id:?}")));
        }
        Ok(self.dir.join(format!("{id}.json")))
    }

    pub fn get(&self, id: &str) -> io::Result<Option<PodRecord>> {
        match fs::read(self.path(id)?) {
            Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(io::Error::other),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub fn put(&self, record: &PodRecord) -> io::Result<()> {
        let path = self.path(&record.id)?;
        let tmp = path.with_extension("json.tmp");
        fs::write(&tmp, serde_json::to_vec_pretty(record).map_err(io::Error::other)?)?;
        fs::rename(tmp, path)
    }

    pub fn remove(&self, id: &str) -> io::Result<bool> {
        match fs::remove_file(self.path(id)?) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Every record; unreadable files are reported, not fatal.
    pub fn all(&self) -> io::Result<Vec<PodRecord>> {
        let mut out = Vec::new();
        for entry in fs::read_dir(&self.dir)? {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "json") {
                match fs::read(&path).map(|b| serde_json::from_slice::<PodRecord>(&b)) {
                    Ok(Ok(r)) => out.push(r),
                    Ok(Err(e)) => tracing::warn!(path = %path.display(), error = %e, "ignoring unreadable registry entry"),
                    Err(e) => tracing::warn!(path = %path.display(), error = %e, "ignoring unreadable registry entry"),
                }
            }
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_file_safe() {
        assert!(valid_id("0123abcdef"));
        assert!(valid_id("pod-1_a.b"));
        for bad in ["", "../x", "a/b", ".hidden", "a b"] {
            assert!(!valid_id(bad), "{bad:?}");
        }
    }
}
