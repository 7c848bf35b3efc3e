//! The agent's registry of pods: one JSON file per CNI attachment in the state directory,
//! written atomically, so a restarted agent knows every pod an earlier run registered.
//!
//! Every operation on one pod costs the same at 1 and at 10,000 pods: a write or removal
//! touches only that pod's file (compact JSON, written to a temporary file and renamed over
//! the old one, so a crash leaves the old record or the new one, never a torn one), and the
//! questions DEL asks of the other pods (does another redirected pod share this netns? is any
//! pod still on the shared attachment?) are answered from counts kept beside the records.

use std::{
    borrow::Borrow,
    collections::{BTreeSet, HashMap, HashSet},
    fs, io,
    net::IpAddr,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use linkerd_cni_memory::{Site, in_site};
use linkerd_cni_proto::{
    config::LinkerdConfig,
    wire::{MAX_FRAME, PodRef},
};
use serde::{Deserialize, Serialize};

use crate::host::userns::HostIds;

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
    /// Why the pod is redirected, in words. The same words for every pod attached the same
    /// way (records share them: see [`Interned`]); the pod's cgroup is [`Self::cgroup`].
    pub fn describe(&self) -> String {
        match self {
            Self::PerPod { .. } => "redirected (programs attached to the pod's own cgroup)".into(),
            // Attached, not yet seen: the pod's connections are redirected only if its
            // processes run below that cgroup, which `crate::agent::verify` checks once the
            // pod's cgroup exists.
            Self::Shared { cgroup } => format!(
                "attached (no pod cgroup v2 found at ADD; shared attachment on {}, selected by \
                 netns cookie; redirected once the pod's cgroup is found below it)",
                cgroup.display()
            ),
            Self::None => "not redirected".into(),
        }
    }

    /// The cgroup the programs are attached to, if any.
    pub fn cgroup(&self) -> Option<&Path> {
        match self {
            Self::PerPod { cgroup } | Self::Shared { cgroup } => Some(cgroup),
            Self::None => None,
        }
    }
}

/// One registered CNI attachment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PodRecord {
    /// `CNI_CONTAINERID`.
    pub id: String,
    /// Shared between records (see [`Interned`]): nearly always `eth0`.
    pub ifname: Arc<str>,
    pub netns: PathBuf,
    /// Inode of the netns file at registration: tells a reused path from the same netns.
    pub netns_ino: u64,
    pub netns_cookie: u64,
    pub pod: Option<PodRef>,
    pub attachment: Attachment,
    /// Why the pod is or is not redirected. Shared between records that say the same (see
    /// [`Interned`]).
    pub reason: Arc<str>,
    /// Shared between records with equal configurations (see [`Interned`]).
    pub config: Arc<LinkerdConfig>,
    pub pod_ips: Vec<IpAddr>,
    /// For a pod in its own user namespace: the proxy's IDs as host IDs (what the programs
    /// compare), read from the namespace's maps at registration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_ids: Option<HostIds>,
    /// An earlier agent redirected the pod with a configuration over the per-pod limits a
    /// fresh ADD is held to, and an agent of a later version refused it at start: the pod is
    /// not redirected ([`Attachment::None`]), `reason` says why, and CNI CHECK reports the
    /// limit as a refused ADD does. Agents no longer write it (such a registration now keeps
    /// its redirection until the pod ends, see [`crate::Agent::start`]); it is read so that
    /// a pod one of those agents refused is still reported as refused, never as in force.
    /// (Absent in other records; an older agent reads such a record as an unredirected pod,
    /// which it is.)
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub refused: bool,
    /// The pod's own cgroup ([`Attachment::PerPod`]) as it was found at registration: every
    /// later open of it must lead to this inode (see `crate::host::cgroup::open_recorded`).
    /// Absent in records of earlier agents, which recorded the path only: the agent checks
    /// those at start and fills it in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup_seen: Option<CgroupSeen>,
    /// Meshed in the per-node fallback (`--mode=iptables`): no programs
    /// ([`Attachment::None`]), Linkerd's rules written by the plugin in the pod's network
    /// namespace from `config` (`docs/design/nftables.md`). CNI CHECK has the plugin compare
    /// them. (Absent in other records; an older agent reads such a record as an unredirected
    /// pod, and its CHECK then passes without reading the rules.)
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rules: bool,
    /// The runtime's cgroup hint (`runtimeConfig.cgroupPath`) of a pod on the shared
    /// attachment, whose cgroup did not exist at ADD: where the pod's cgroup is looked for
    /// again (with its UID) once it exists, to verify that it lies below the shared
    /// attachment's cgroup (`crate::agent::verify`). Absent otherwise, and in records of
    /// earlier agents (their pods are looked for by UID alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup_hint: Option<String>,
}

/// A pod cgroup as the registration found it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupSeen {
    /// The cgroup directory's inode (its cgroup id).
    pub ino: u64,
    /// A peer of the socket named it: it must stay inside the pods' cgroup trees.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub peer: bool,
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
    records: Mutex<Records>,
}

/// The records and the indexes derived from them (rebuilt from the files at every open, so
/// nothing but the files needs to survive a crash).
#[derive(Debug, Default)]
struct Records {
    /// The records, ordered and found by container id (the record's own `id` is the key: no
    /// second copy of it).
    by_id: BTreeSet<ById>,
    /// Redirected records per netns cookie.
    redirected_by_cookie: HashMap<u64, usize>,
    /// Records on the shared attachment.
    shared: usize,
    interned: Interned,
}

/// A record in [`Records::by_id`]: compared, and looked up, by its container id. Boxed: the
/// tree's nodes hold eleven slots each, and a record inline (about 300 bytes) left a node's
/// empty slots costing megabytes at 10,000 pods.
#[derive(Debug)]
struct ById(Box<PodRecord>);

impl PartialEq for ById {
    fn eq(&self, other: &Self) -> bool {
        self.0.id == other.0.id
    }
}

impl Eq for ById {}

impl PartialOrd for ById {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ById {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.id.cmp(&other.0.id)
    }
}

// `str`'s order is `String`'s: lookups by `&str` agree with the set's order.
impl Borrow<str> for ById {
    fn borrow(&self) -> &str {
        &self.0.id
    }
}

/// Values records share, held once: a node's pods nearly all have the same `linkerd`
/// configuration and one of a few reasons, and a copy of each per record was most of a
/// record's memory (at 10,000 pods, megabytes). A value leaves the pool with the last record
/// holding it; a sweep drops any the pool alone still holds (a record clone held elsewhere at
/// that removal) once the pool outgrows the records.
#[derive(Debug, Default)]
struct Interned {
    configs: HashSet<Arc<LinkerdConfig>>,
    /// Reasons and interface names.
    strings: HashSet<Arc<str>>,
}

impl Interned {
    /// `record` with its config, reason and interface name replaced by the pool's equal ones.
    fn share(&mut self, mut record: PodRecord) -> PodRecord {
        record.config = Self::intern(&mut self.configs, record.config);
        record.reason = Self::intern(&mut self.strings, record.reason);
        record.ifname = Self::intern(&mut self.strings, record.ifname);
        record
    }

    fn intern<T: Eq + std::hash::Hash + ?Sized>(
        pool: &mut HashSet<Arc<T>>,
        value: Arc<T>,
    ) -> Arc<T> {
        if let Some(shared) = pool.get(&*value) {
            return shared.clone();
        }
        pool.insert(value.clone());
        value
    }

    /// After `record` left the records (the caller holds it): drops its values from the pool
    /// when no other record holds them.
    fn release(&mut self, record: &PodRecord, records: usize) {
        // The pool's reference and the caller's.
        if Arc::strong_count(&record.config) <= 2 {
            self.configs.remove(&*record.config);
        }
        for s in [&record.reason, &record.ifname] {
            if Arc::strong_count(s) <= 2 {
                self.strings.remove(&**s);
            }
        }
        if self.configs.len() + self.strings.len() > 2 * records + 64 {
            self.configs.retain(|c| Arc::strong_count(c) > 1);
            self.strings.retain(|s| Arc::strong_count(s) > 1);
        }
    }
}

impl Records {
    fn insert(&mut self, record: PodRecord) {
        self.remove(&record.id);
        self.count(&record, true);
        let record = self.interned.share(record);
        self.by_id.insert(ById(Box::new(record)));
    }

    fn remove(&mut self, id: &str) -> Option<PodRecord> {
        let ById(old) = self.by_id.take(id)?;
        self.count(&old, false);
        self.interned.release(&old, self.by_id.len());
        Some(*old)
    }

    fn get(&self, id: &str) -> Option<&PodRecord> {
        self.by_id.get(id).map(|r| &*r.0)
    }

    fn values(&self) -> impl Iterator<Item = &PodRecord> {
        self.by_id.iter().map(|r| &*r.0)
    }

    fn count(&mut self, r: &PodRecord, add: bool) {
        if r.redirected() {
            let n = self.redirected_by_cookie.entry(r.netns_cookie).or_default();
            match add {
                true => *n += 1,
                false => *n -= 1,
            }
            if *n == 0 {
                self.redirected_by_cookie.remove(&r.netns_cookie);
            }
        }
        if matches!(r.attachment, Attachment::Shared { .. }) {
            match add {
                true => self.shared += 1,
                false => self.shared -= 1,
            }
        }
    }

    /// Whether `id`'s own stored record satisfies `f`.
    fn own(&self, id: &str, f: impl Fn(&PodRecord) -> bool) -> usize {
        self.get(id).is_some_and(f) as usize
    }
}

/// The largest record file [`Registry::open`] reads; a larger one is reported and not read.
/// A record holds one ADD's configuration (at most a wire frame, [`MAX_FRAME`]) with what the
/// agent added to it (the pod's annotations' lists, addresses): four frames' worth leaves
/// room for what any earlier agent wrote, and keeps a corrupt or planted file from costing
/// the agent its memory at every start.
pub const MAX_RECORD_BYTES: u64 = 4 * MAX_FRAME as u64;

/// Container ids become file names: keep them to a safe alphabet.
fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 256
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        && !id.starts_with('.')
}

/// One record file, read only when it is at most [`MAX_RECORD_BYTES`] long.
fn read_record(path: &Path) -> io::Result<PodRecord> {
    let mut file = fs::File::open(path)?;
    let len = file.metadata()?.len();
    if len > MAX_RECORD_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{len} bytes, over the limit of {MAX_RECORD_BYTES}: not read"),
        ));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    // Bounded again in case the file grew since.
    io::Read::read_to_end(
        &mut io::Read::take(&mut file, MAX_RECORD_BYTES + 1),
        &mut bytes,
    )?;
    if bytes.len() as u64 > MAX_RECORD_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("over {MAX_RECORD_BYTES} bytes: not read"),
        ));
    }
    serde_json::from_slice(&bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

impl Registry {
    /// Opens the directory and loads every record; unreadable files, and files over
    /// [`MAX_RECORD_BYTES`] (not read), are reported, not fatal. What a record holds is
    /// checked against the per-pod limits by the agent at start (`Agent::start`).
    pub fn open(dir: &Path) -> io::Result<Self> {
        crate::host::owned::create_dir_all(dir)?;
        let mut records = Records::default();
        for entry in fs::read_dir(dir)? {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "json") {
                match read_record(&path) {
                    Ok(r) => in_site(Site::Registry, || records.insert(r)),
                    Err(e) => {
                        tracing::warn!(path = %path.display(), error = %e, "ignoring unreadable registry entry: the pod's links and map entries, if any, are left as they are")
                    }
                }
            }
        }
        Ok(Self {
            dir: dir.into(),
            records: Mutex::new(records),
        })
    }

    fn records(&self) -> std::sync::MutexGuard<'_, Records> {
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
        // Compact: a third of the bytes of pretty JSON, and `open` reads either.
        fs::write(&tmp, serde_json::to_vec(record).map_err(io::Error::other)?)?;
        fs::rename(tmp, path)?;
        let mut records = self.records();
        in_site(Site::Registry, || records.insert(record.clone()));
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

    /// The records that satisfy `f`, cloned, in id order (the others are not copied).
    pub fn filtered(&self, f: impl Fn(&PodRecord) -> bool) -> Vec<PodRecord> {
        self.records().values().filter(|r| f(r)).cloned().collect()
    }

    /// `f` of every record, in id order, without cloning them (the registry is locked
    /// meanwhile: keep `f` short and free of I/O).
    pub fn map_each<T>(&self, mut f: impl FnMut(&PodRecord) -> T) -> Vec<T> {
        self.records().values().map(&mut f).collect()
    }

    /// Whether any record satisfies `f` (without cloning them).
    pub fn any(&self, f: impl Fn(&PodRecord) -> bool) -> bool {
        self.records().values().any(f)
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
        let records = &self.records().by_id;
        let tail = records.range::<str, _>((after.map_or(Unbounded, Excluded), Unbounded));
        let head = after
            .map(|a| records.range::<str, _>((Unbounded, Included(a))))
            .into_iter()
            .flatten();
        tail.chain(head).take(n).map(|r| r.0.id.clone()).collect()
    }

    /// How many records there are.
    pub fn len(&self) -> usize {
        self.records().by_id.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `id` is registered.
    pub fn contains(&self, id: &str) -> bool {
        self.records().by_id.contains(id)
    }

    /// Whether a redirected record other than `id` has netns cookie `cookie` (in constant
    /// time: from a count kept per cookie).
    pub fn other_redirected_with_cookie(&self, id: &str, cookie: u64) -> bool {
        let records = self.records();
        let all = records
            .redirected_by_cookie
            .get(&cookie)
            .copied()
            .unwrap_or(0);
        all > records.own(id, |r| r.redirected() && r.netns_cookie == cookie)
    }

    /// The ids of the redirected records other than `id` with netns cookie `cookie`: the
    /// count kept per cookie answers first, so only a shared cookie (rare) costs a walk.
    pub fn other_redirected_ids_with_cookie(&self, id: &str, cookie: u64) -> Vec<String> {
        if !self.other_redirected_with_cookie(id, cookie) {
            return Vec::new();
        }
        self.records()
            .values()
            .filter(|r| redirected_other(r, id, cookie))
            .map(|r| r.id.clone())
            .collect()
    }

    /// A redirected record other than `id` with netns cookie `cookie`, if any: the count
    /// kept per cookie answers first, so only a shared cookie (rare) costs a walk.
    pub fn other_redirected_record_with_cookie(&self, id: &str, cookie: u64) -> Option<PodRecord> {
        if !self.other_redirected_with_cookie(id, cookie) {
            return None;
        }
        self.records()
            .values()
            .find(|r| redirected_other(r, id, cookie))
            .cloned()
    }

    /// Whether a record other than `id` is on the shared attachment (in constant time).
    pub fn other_shared(&self, id: &str) -> bool {
        let records = self.records();
        records.shared > records.own(id, |r| matches!(r.attachment, Attachment::Shared { .. }))
    }
}

/// Whether `r` is a redirected registration other than `id` in the netns of cookie `cookie`.
fn redirected_other(r: &PodRecord, id: &str, cookie: u64) -> bool {
    r.id != id && r.redirected() && r.netns_cookie == cookie
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record of container `id` in netns cookie `cookie`, attached as `attachment`, with the
    /// default config and an empty reason.
    fn record(id: &str, cookie: u64, attachment: Attachment) -> PodRecord {
        PodRecord {
            id: id.into(),
            ifname: "eth0".into(),
            netns: "/run/netns/x".into(),
            netns_ino: 1,
            netns_cookie: cookie,
            pod: None,
            attachment,
            reason: "".into(),
            config: LinkerdConfig::default().into(),
            pod_ips: vec![],
            host_ids: None,
            refused: false,
            cgroup_seen: None,
            rules: false,
            cgroup_hint: None,
        }
    }

    #[test]
    fn records_persist_across_opens() {
        let dir = std::env::temp_dir().join(format!("l5d-registry-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let record = PodRecord {
            reason: "test".into(),
            ..record("abc", 2, Attachment::None)
        };
        let reg = Registry::open(&dir).unwrap();
        reg.put(&record).unwrap();
        // Unredirected: counted in no index.
        assert!(!reg.other_redirected_with_cookie("zzz", 2));
        assert!(!reg.other_shared("zzz"));
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
            reg.put(&record(id, 2, Attachment::None)).unwrap();
        }
        assert_eq!(reg.ids_from(None, 3), ["a", "b", "c"]);
        assert_eq!(reg.ids_from(Some("c"), 3), ["d", "a", "b"]);
        assert_eq!(reg.ids_from(Some("b"), 10), ["c", "d", "a", "b"]);
        assert_eq!(reg.ids_from(Some("zz"), 2), ["a", "b"]);
        assert!(reg.contains("a") && !reg.contains("e"));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn indexes_follow_puts_replacements_and_removes() {
        let dir = std::env::temp_dir().join(format!("l5d-registry-idx-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let reg = Registry::open(&dir).unwrap();
        let shared = || Attachment::Shared {
            cgroup: "/sys/fs/cgroup".into(),
        };
        let per_pod = || Attachment::PerPod {
            cgroup: "/sys/fs/cgroup/p".into(),
        };
        reg.put(&record("a", 7, shared())).unwrap();
        assert!(!reg.other_redirected_with_cookie("a", 7));
        assert!(reg.other_redirected_with_cookie("b", 7));
        assert!(!reg.other_shared("a") && reg.other_shared("b"));
        reg.put(&record("b", 7, per_pod())).unwrap();
        assert!(reg.other_redirected_with_cookie("a", 7));
        // Replacing a record moves its counts.
        reg.put(&record("a", 8, per_pod())).unwrap();
        assert!(!reg.other_redirected_with_cookie("b", 7));
        assert!(!reg.other_shared("zzz"));
        // The counts are rebuilt from the files.
        let reopened = Registry::open(&dir).unwrap();
        assert!(reopened.other_redirected_with_cookie("zzz", 8));
        assert!(reopened.remove("a").unwrap());
        assert!(!reopened.other_redirected_with_cookie("zzz", 8));
        assert!(reopened.other_redirected_with_cookie("zzz", 7));
        // Written compact.
        let text = fs::read_to_string(dir.join("b.json")).unwrap();
        assert!(!text.contains('\n'), "{text}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn equal_configs_and_reasons_are_held_once_and_released_with_the_last_record() {
        let dir = std::env::temp_dir().join(format!("l5d-registry-intern-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let reg = Registry::open(&dir).unwrap();
        let rec = |id: &str, port: u16| PodRecord {
            // Each record brings its own copies, as a registration does.
            reason: String::from("not meshed").into(),
            config: LinkerdConfig {
                outgoing_proxy_port: port,
                ..LinkerdConfig::default()
            }
            .into(),
            ..record(id, 2, Attachment::None)
        };
        for id in ["a", "b", "c"] {
            reg.put(&rec(id, 4140)).unwrap();
        }
        reg.put(&rec("d", 5000)).unwrap();
        let get = |id| reg.get(id).unwrap().unwrap();
        assert!(Arc::ptr_eq(&get("a").config, &get("c").config));
        assert!(Arc::ptr_eq(&get("a").reason, &get("d").reason));
        assert!(Arc::ptr_eq(&get("b").ifname, &get("d").ifname));
        assert!(!Arc::ptr_eq(&get("a").config, &get("d").config));
        let pool = |reg: &Registry| {
            let r = reg.records();
            (r.interned.configs.len(), r.interned.strings.len())
        };
        // Two configs; one reason and one interface name.
        assert_eq!(pool(&reg), (2, 2));
        // A value leaves the pool with the last record holding it.
        assert!(reg.remove("d").unwrap());
        assert_eq!(pool(&reg), (1, 2));
        for id in ["a", "b", "c"] {
            assert!(reg.remove(id).unwrap());
        }
        assert_eq!(pool(&reg), (0, 0));
        // What was shared in memory is written out whole: a reopened registry reads the same.
        reg.put(&rec("e", 4140)).unwrap();
        assert_eq!(
            Registry::open(&dir).unwrap().get("e").unwrap(),
            Some(rec("e", 4140))
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    /// A record file over the limit is reported and not read (a corrupt or planted file costs
    /// nothing at start); the other records load, and a record of an older agent (no
    /// `refused` key) reads as not refused.
    #[test]
    fn a_record_over_the_size_limit_is_not_read_and_the_others_load() {
        let dir = std::env::temp_dir().join(format!("l5d-registry-size-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let reg = Registry::open(&dir).unwrap();
        let kept = record("kept", 3, Attachment::None);
        reg.put(&kept).unwrap();
        let text = fs::read_to_string(dir.join("kept.json")).unwrap();
        assert!(!text.contains("refused"), "written only when set: {text}");
        // A record as an earlier agent wrote it, padded past the limit with a long reason.
        let mut big = serde_json::to_value(record("big", 4, Attachment::None)).unwrap();
        big["reason"] = "x".repeat(MAX_RECORD_BYTES as usize).into();
        fs::write(dir.join("big.json"), serde_json::to_vec(&big).unwrap()).unwrap();
        assert!(read_record(&dir.join("big.json")).is_err_and(|e| {
            e.kind() == io::ErrorKind::InvalidData && e.to_string().contains("not read")
        }));
        let reopened = Registry::open(&dir).unwrap();
        assert_eq!(reopened.map_each(|r| r.id.clone()), ["kept"]);
        assert_eq!(reopened.get("kept").unwrap(), Some(kept));
        // The same record within the limit reads.
        big["reason"] = "x".into();
        fs::write(dir.join("big.json"), serde_json::to_vec(&big).unwrap()).unwrap();
        let big = Registry::open(&dir).unwrap().get("big").unwrap().unwrap();
        assert!(!big.refused);
        // A refused record keeps the mark across opens.
        reg.put(&PodRecord {
            refused: true,
            ..big
        })
        .unwrap();
        assert!(
            Registry::open(&dir)
                .unwrap()
                .get("big")
                .unwrap()
                .unwrap()
                .refused
        );
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
