//! The agent's registry of pods: one JSON file per CNI attachment in the state directory,
//! written atomically, so a restarted agent knows every pod an earlier run registered.

use std::{
    collections::BTreeMap,
    fs, io,
    net::IpAddr,
    path::{Path, PathBuf},
    sync::Mutex,
};

use linkerd_cni_proto::{config::LinkerdConfig, wire::PodRef};
use serde::{Deserialize, Serialize};

use crate::userns::HostIds;

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
            Self::PerPod { cgroup } => {
                format!("redirected (programs attached to {})", cgroup.display())
            }
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
    /// For a pod in its own user namespace: the proxy's IDs as host IDs (what the programs
    /// compare), read from the namespace's maps at registration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_ids: Option<HostIds>,
}

impl PodRecord {
    pub fn redirected(&self) -> bool {
        self.attachment != Attachment::None
    }
}

/// The state directory, with every record also held in memory: reads never touch the disk,
/// writes go to the file first (atomically) and then to memory.
#[derive(Debug)]
pub struct Registry {
    dir: PathBuf,
    records: Mutex<BTreeMap<String, PodRecord>>,
}

/// Container ids become file names: keep them to a safe alphabet.
fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 256
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        && !id.starts_with('.')
}

impl Registry {
    /// Opens the directory and loads every record; unreadable files are reported, not fatal.
    pub fn open(dir: &Path) -> io::Result<Self> {
        fs::create_dir_all(dir)?;
        let mut records = BTreeMap::new();
        for entry in fs::read_dir(dir)? {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "json") {
                match fs::read(&path).map(|b| serde_json::from_slice::<PodRecord>(&b)) {
                    Ok(Ok(r)) => {
                        records.insert(r.id.clone(), r);
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(path = %path.display(), error = %e, "ignoring unreadable registry entry")
                    }
                    Err(e) => {
                        tracing::warn!(path = %path.display(), error = %e, "ignoring unreadable registry entry")
                    }
                }
            }
        }
        Ok(Self {
            dir: dir.into(),
            records: Mutex::new(records),
        })
    }

    fn records(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, PodRecord>> {
        // Every update leaves the map consistent before it can panic.
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn path(&self, id: &str) -> io::Result<PathBuf> {
        if !valid_id(id) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("invalid container id {id:?}"),
            ));
        }
        Ok(self.dir.join(format!("{id}.json")))
    }

    pub fn get(&self, id: &str) -> io::Result<Option<PodRecord>> {
        self.path(id)?;
        Ok(self.records().get(id).cloned())
    }

    pub fn put(&self, record: &PodRecord) -> io::Result<()> {
        let path = self.path(&record.id)?;
        let tmp = path.with_extension("json.tmp");
        fs::write(
            &tmp,
            serde_json::to_vec_pretty(record).map_err(io::Error::other)?,
        )?;
        fs::rename(tmp, path)?;
        self.records().insert(record.id.clone(), record.clone());
        Ok(())
    }

    pub fn remove(&self, id: &str) -> io::Result<bool> {
        let path = self.path(id)?;
        match fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        Ok(self.records().remove(id).is_some())
    }

    /// Every record, by container id.
    pub fn all(&self) -> io::Result<Vec<PodRecord>> {
        Ok(self.records().values().cloned().collect())
    }

    /// Visits every record in memory without cloning it (the lock is held meanwhile: keep
    /// `f` short).
    pub fn for_each(&self, mut f: impl FnMut(&PodRecord)) {
        self.records().values().for_each(&mut f);
    }

    /// Up to `n` ids in id order, starting after `after` and wrapping around to the first,
    /// each at most once (without cloning the records).
    pub fn ids_from(&self, after: Option<&str>, n: usize) -> Vec<String> {
        use std::ops::Bound::{Excluded, Included, Unbounded};
        let records = self.records();
        let tail = records.range::<str, _>((after.map_or(Unbounded, Excluded), Unbounded));
        let head = after
            .map(|a| records.range::<str, _>((Unbounded, Included(a))))
            .into_iter()
            .flatten();
        tail.chain(head).take(n).map(|(id, _)| id.clone()).collect()
    }

    /// Whether `id` is registered.
    pub fn contains(&self, id: &str) -> bool {
        self.records().contains_key(id)
    }

    /// Whether any record other than `id` satisfies `f` (without cloning them all).
    pub fn any_other(&self, id: &str, f: impl Fn(&PodRecord) -> bool) -> bool {
        self.records().values().any(|r| r.id != id && f(r))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_persist_across_opens() {
        let dir = std::env::temp_dir().join(format!("l5d-registry-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let record = PodRecord {
            id: "abc".into(),
            ifname: "eth0".into(),
            netns: "/run/netns/x".into(),
            netns_ino: 1,
            netns_cookie: 2,
            pod: None,
            attachment: Attachment::None,
            reason: "test".into(),
            config: LinkerdConfig::default(),
            pod_ips: vec![],
            host_ids: None,
        };
        let reg = Registry::open(&dir).unwrap();
        reg.put(&record).unwrap();
        assert!(reg.any_other("zzz", |r| r.netns_cookie == 2));
        assert!(!reg.any_other("abc", |_| true));
        let reopened = Registry::open(&dir).unwrap();
        assert_eq!(reopened.get("abc").unwrap(), Some(record));
        assert!(reopened.remove("abc").unwrap());
        assert!(!reopened.remove("abc").unwrap());
        assert!(Registry::open(&dir).unwrap().all().unwrap().is_empty());
        assert!(reopened.get("../etc").is_err());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn ids_from_goes_round_in_order() {
        let dir = std::env::temp_dir().join(format!("l5d-registry-ids-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let reg = Registry::open(&dir).unwrap();
        for id in ["c", "a", "b", "d"] {
            reg.put(&PodRecord {
                id: id.into(),
                ifname: "eth0".into(),
                netns: "/run/netns/x".into(),
                netns_ino: 1,
                netns_cookie: 2,
                pod: None,
                attachment: Attachment::None,
                reason: String::new(),
                config: LinkerdConfig::default(),
                pod_ips: vec![],
                host_ids: None,
            })
            .unwrap();
        }
        assert_eq!(reg.ids_from(None, 3), ["a", "b", "c"]);
        assert_eq!(reg.ids_from(Some("c"), 3), ["d", "a", "b"]);
        assert_eq!(reg.ids_from(Some("b"), 10), ["c", "d", "a", "b"]);
        assert_eq!(reg.ids_from(Some("zz"), 2), ["a", "b"]);
        assert!(reg.contains("a") && !reg.contains("e"));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn ids_are_file_safe() {
        assert!(valid_id("0123abcdef"));
        assert!(valid_id("pod-1_a.b"));
        for bad in ["", "../x", "a/b", ".hidden", "a b"] {
            assert!(!valid_id(bad), "{bad:?}");
        }
    }
}
