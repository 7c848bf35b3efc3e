//! The network namespaces a container runtime pins (containerd's and CRI-O's
//! `/var/run/netns/cni-<uuid>`, seen by the agent under its host root), indexed by the
//! addresses they hold, so that a running pod's namespace is found from its address
//! (`status.podIPs`) without looking at any of its processes.
//!
//! Reading a namespace's addresses means entering it (`setns` on the calling thread, then
//! `getifaddrs`), so the index enters each namespace once and keeps what it read by inode: a
//! pass over N pods among M pinned namespaces enters each new namespace once, not N×M times.
//! A namespace that had no address yet (its pin is made before the CNI ADD that configures
//! it) is entered again at the next refresh; one whose pin is gone is forgotten. What the
//! index says is a candidate only: adoption enters the namespace again and checks that it
//! still holds the address before using it.

use std::{
    collections::HashMap,
    fs,
    net::IpAddr,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use crate::host::netns::{self, Netns};

/// What the index knows of one pinned namespace.
#[derive(Clone, Debug)]
struct Entry {
    path: PathBuf,
    addrs: Vec<IpAddr>,
}

/// Where a pod's addresses are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    /// Exactly one pinned namespace holds one of them.
    One { path: PathBuf, ino: u64 },
    /// The agent's own network namespace holds one (a host-network pod).
    Own,
    /// None does; `searched` names the directories looked in.
    None { searched: String },
    /// Several do.
    Several(usize),
}

/// How a refresh went.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Refresh {
    /// Namespace pins seen.
    pub pins: usize,
    /// Namespaces entered to read their addresses.
    pub entered: usize,
}

/// The pinned network namespaces under some directories, by inode.
#[derive(Debug, Default)]
pub struct NetnsIndex {
    dirs: Vec<PathBuf>,
    entries: HashMap<u64, Entry>,
    /// The agent's own namespace's inode and addresses (read at each refresh).
    own: Option<(u64, Vec<IpAddr>)>,
}

impl NetnsIndex {
    /// An empty index of the namespaces pinned in `dirs` (read at the first refresh).
    pub fn new(dirs: Vec<PathBuf>) -> Self {
        Self {
            dirs,
            entries: HashMap::new(),
            own: None,
        }
    }

    /// Brings the index up to date with the pins: new namespaces and those without an address
    /// yet are entered, vanished ones forgotten.
    pub fn refresh(&mut self) -> Refresh {
        let mut stats = Refresh::default();
        let own_ino = fs::metadata("/proc/thread-self/ns/net")
            .ok()
            .map(|m| m.ino());
        self.own = own_ino.map(|ino| (ino, netns::current_addresses().unwrap_or_default()));
        let mut seen: HashMap<u64, PathBuf> = HashMap::new();
        for dir in &self.dirs {
            let Ok(entries) = fs::read_dir(dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                // A pin is a bind mount of an nsfs inode; its inode number is the namespace's.
                let Ok(meta) = fs::metadata(&path) else {
                    continue;
                };
                if !meta.is_file() || seen.contains_key(&meta.ino()) || Some(meta.ino()) == own_ino
                {
                    continue;
                }
                seen.insert(meta.ino(), path);
            }
        }
        stats.pins = seen.len();
        self.entries.retain(|ino, _| seen.contains_key(ino));
        for (ino, path) in seen {
            if self.entries.get(&ino).is_some_and(|e| !e.addrs.is_empty()) {
                continue;
            }
            // Opened as a namespace file (nsfs), not just a file with that inode number.
            let Ok(ns) = Netns::open(&path) else {
                continue;
            };
            if ns.ino != ino {
                continue;
            }
            stats.entered += 1;
            let addrs = ns.run(netns::current_addresses).unwrap_or_default();
            self.entries.insert(ino, Entry { path, addrs });
        }
        stats
    }

    /// The namespace that holds any of `ips`.
    pub fn find(&self, ips: &[IpAddr]) -> Found {
        if self
            .own
            .as_ref()
            .is_some_and(|(_, own)| own.iter().any(|a| ips.contains(a)))
        {
            return Found::Own;
        }
        let holders: Vec<(&u64, &Entry)> = self
            .entries
            .iter()
            .filter(|(_, e)| e.addrs.iter().any(|a| ips.contains(a)))
            .collect();
        match holders.as_slice() {
            [(ino, entry)] => Found::One {
                path: entry.path.clone(),
                ino: **ino,
            },
            [] => Found::None {
                searched: self
                    .dirs
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            },
            several => Found::Several(several.len()),
        }
    }

    /// Forgets the namespace with inode `ino`: the next refresh enters it again.
    pub fn forget(&mut self, ino: u64) {
        self.entries.remove(&ino);
    }

    /// How many namespaces the index holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The directories a runtime pins network namespaces in (`dirs`, host paths such as
/// `/run/netns` and `/var/run/netns`), under `host` (the host's root as the agent sees it);
/// one directory reached by two paths (`/var/run` is usually `/run`) counted once.
pub fn runtime_dirs(dirs: &[PathBuf], host: impl Fn(&Path) -> PathBuf) -> Vec<PathBuf> {
    let mut seen: Vec<PathBuf> = Vec::new();
    for d in dirs {
        let dir = host(d);
        let same = |a: &Path, b: &Path| match (fs::metadata(a), fs::metadata(b)) {
            (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        };
        if !seen.iter().any(|known| same(known, &dir)) {
            seen.push(dir);
        }
    }
    seen
}
