//! The agent's observable state, read from outside: registry files, pinned links, map entries.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::Path,
};

use linkerd_cni_agent::dataplane::maps::{Maps, cidr_of};
use linkerd_cni_common::paths;
use serde_json::Value;

use crate::error::{Error, Result};

/// Everything the agent keeps, read from outside: registry files, pinned links, map entries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AgentState {
    /// Registry file name → its content.
    pub registry: BTreeMap<String, String>,
    /// Paths under the pin root's `pods/` and `shared/` (link directories and links).
    pub links: BTreeSet<String>,
    /// `l5d_pod_config`: netns cookie → config (debug form).
    pub pod_config: BTreeMap<u64, String>,
    /// `l5d_port_sets` keys: `cookie:set:block`.
    pub port_sets: BTreeSet<String>,
    /// `l5d_addrs` keys: `cookie:set:cidr`.
    pub addrs: BTreeSet<String>,
    /// `l5d_pod_stats` keys.
    pub pod_stats: BTreeSet<u64>,
    /// `l5d_conn_dst` keys: `cookie:port`.
    pub conn_dst: BTreeSet<String>,
    /// `l5d_pod_by_ip`: `cookie:address words`.
    pub pod_by_ip: BTreeSet<String>,
    /// `l5d_listeners` keys: `cookie:family`.
    pub listeners: BTreeSet<String>,
}

impl AgentState {
    /// The registered container ids.
    pub fn registered(&self) -> BTreeSet<String> {
        self.registry
            .keys()
            .filter_map(|f| f.strip_suffix(".json"))
            .map(str::to_string)
            .collect()
    }

    /// The parsed registry record of `id`.
    pub fn record(&self, id: &str) -> Option<Value> {
        serde_json::from_str(self.registry.get(&format!("{id}.json"))?).ok()
    }

    /// The pinned link paths of `id` (under `pods/<id>`).
    pub fn links_of(&self, id: &str) -> Vec<&String> {
        let prefix = format!("{}/{id}", paths::PIN_PODS);
        self.links
            .iter()
            .filter(|l| l.starts_with(&prefix))
            .collect()
    }

    /// Every map entry keyed by netns cookie `cookie`, described.
    pub fn entries_for(&self, cookie: u64) -> Vec<String> {
        let prefix = format!("{cookie}:");
        let mut out = Vec::new();
        if let Some(c) = self.pod_config.get(&cookie) {
            out.push(format!("pod_config {c}"));
        }
        if self.pod_stats.contains(&cookie) {
            out.push("pod_stats".into());
        }
        for (name, set) in [
            ("port_sets", &self.port_sets),
            ("addrs", &self.addrs),
            ("conn_dst", &self.conn_dst),
            ("pod_by_ip", &self.pod_by_ip),
            ("listeners", &self.listeners),
        ] {
            out.extend(
                set.iter()
                    .filter(|k| k.starts_with(&prefix))
                    .map(|k| format!("{name} {k}")),
            );
        }
        out
    }

    /// Nothing registered, pinned or in the per-pod maps.
    pub fn is_empty(&self) -> bool {
        self.registry.is_empty()
            && self.links.is_empty()
            && self.pod_config.is_empty()
            && self.port_sets.is_empty()
            && self.addrs.is_empty()
            && self.pod_stats.is_empty()
            && self.conn_dst.is_empty()
            && self.pod_by_ip.is_empty()
            && self.listeners.is_empty()
    }
}

/// Lists every path below `dir`, relative to `base`.
fn walk(base: &Path, dir: &Path, out: &mut BTreeSet<String>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        if let Ok(rel) = path.strip_prefix(base) {
            out.insert(rel.display().to_string());
        }
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            walk(base, &path, out);
        }
    }
}

/// Reads the state of the agent whose pins are under `pin_root` and registry in `state_dir`.
pub fn read_state(pin_root: &Path, state_dir: &Path) -> Result<AgentState> {
    let mut state = AgentState::default();
    if let Ok(entries) = fs::read_dir(state_dir) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            // The agent's mark on a directory it made and the mode it last started in (not
            // registrations).
            if name == paths::OWNED_MARKER || name == paths::MODE_FILE {
                continue;
            }
            let content = fs::read_to_string(e.path()).unwrap_or_default();
            state.registry.insert(name, content);
        }
    }
    for sub in [paths::PIN_PODS, paths::PIN_SHARED] {
        walk(pin_root, &pin_root.join(sub), &mut state.links);
    }
    let maps_dir = pin_root.join(paths::PIN_MAPS);
    // The per-node fallback pins no map: its state is the registry alone.
    if !maps_dir.exists() {
        return Ok(state);
    }
    let maps = Maps::open(&maps_dir)
        .map_err(|e| Error::Missing(format!("opening the maps in {}: {e}", maps_dir.display())))?;
    for cookie in maps.pod_config.keys().filter_map(|k| k.ok()) {
        let cfg = maps.pod_config(cookie);
        state.pod_config.insert(cookie, format!("{cfg:?}"));
    }
    for k in maps.port_sets.keys().filter_map(|k| k.ok()) {
        state
            .port_sets
            .insert(format!("{}:{}:{}", k.netns_cookie, k.set, k.block));
    }
    for k in maps.addrs.keys().filter_map(|k| k.ok()) {
        let set = u32::from_be(k.data().set_be);
        state
            .addrs
            .insert(format!("{}:{set}:{}", k.data().netns_cookie, cidr_of(&k)));
    }
    state
        .pod_stats
        .extend(maps.pod_stats.keys().filter_map(|k| k.ok()));
    for k in maps.conn_dst.keys().filter_map(|k| k.ok()) {
        state
            .conn_dst
            .insert(format!("{}:{}", k.netns_cookie, k.port));
    }
    for (ip, cookie) in maps.pod_by_ip.iter().filter_map(|e| e.ok()) {
        state.pod_by_ip.insert(format!("{cookie}:{ip:08x?}"));
    }
    for k in maps.listeners.keys().filter_map(|k| k.ok()) {
        state
            .listeners
            .insert(format!("{}:{}", k.netns_cookie, k.family));
    }
    Ok(state)
}
