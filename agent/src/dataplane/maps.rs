//! The pinned maps, opened by path: the only way the agent (and `inspect`) reads or writes
//! per-pod state, whether it loaded the programs itself or adopted them from a previous run.

use linkerd_cni_sys::uapi;
use std::{
    collections::BTreeMap,
    net::IpAddr,
    path::{Path, PathBuf},
};

use aya::maps::{
    HashMap, Map, MapData, MapError, PerCpuHashMap, PerCpuValues, SockHash,
    lpm_trie::{Key, LpmTrie},
};
use linkerd_cni_common::{
    ADDR_INBOUND_SKIP_SOURCE, ADDR_KEY_FIXED_BITS, ADDR_OUTBOUND_SKIP_SUBNET, AF_INET, AF_INET6,
    AddrKey, ConnKey, FLAG_EXEMPT_GID, FLAG_EXEMPT_UID, FLAG_IN_PORTS, FLAG_IN_REDIRECT_ONLY,
    FLAG_IN_SKIP_SOURCES, FLAG_IPV6, FLAG_OUT_PORTS, FLAG_OUT_SUBNETS, ListenerKey, OrigDst,
    POD_ADDR_V4, POD_ADDR_V6, PORT_SET_INBOUND_REDIRECT, PORT_SET_INBOUND_SKIP,
    PORT_SET_OUTBOUND_SKIP, PodAddrs, PodConfig, PodStats, PortBlock, PortSetKey, names,
};
use linkerd_cni_proto::config::{Cidr, LinkerdConfig, PortRange, merge_ranges};

use crate::host::userns::HostIds;

/// A pinned map could not be opened or used.
#[derive(Debug, thiserror::Error)]
pub enum MapsError {
    /// A map is missing from the pin directory or is not the expected type.
    #[error("map {name} at {path}: {source}")]
    Open {
        name: &'static str,
        path: PathBuf,
        source: MapError,
    },
    /// Reading or writing an entry failed (e.g. the map is full).
    #[error("map {name}: {source}")]
    Update {
        name: &'static str,
        source: MapError,
    },
}

fn update(name: &'static str) -> impl Fn(MapError) -> MapsError {
    move |source| MapsError::Update { name, source }
}

/// Handles on every pinned map.
pub struct Maps {
    pub pod_config: HashMap<MapData, u64, PodConfig>,
    pub port_sets: HashMap<MapData, PortSetKey, PortBlock>,
    pub addrs: LpmTrie<MapData, AddrKey, u32>,
    pub sock_dst: HashMap<MapData, u64, OrigDst>,
    pub conn_dst: HashMap<MapData, ConnKey, OrigDst>,
    pub pod_stats: PerCpuHashMap<MapData, u64, PodStats>,
    pub pod_by_ip: HashMap<MapData, [u32; 4], u64>,
    /// `None` only under the pins of an agent before layout 4, which had no such map (the
    /// tests' replay of one): the agent itself always loads its object, which creates it.
    pub pod_addrs: Option<HashMap<MapData, u64, PodAddrs>>,
    pub listeners: SockHash<MapData, ListenerKey>,
    /// Possible CPUs: the length of every per-CPU value.
    cpus: usize,
    /// Each map's capacity, as the kernel reports it.
    max_entries: BTreeMap<&'static str, u32>,
}

/// How full one node-wide map is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fill {
    /// The map's name (`l5d_...`).
    pub name: &'static str,
    pub entries: usize,
    pub max_entries: u32,
}

fn open(
    dir: &Path,
    name: &'static str,
    max_entries: &mut BTreeMap<&'static str, u32>,
) -> Result<Map, MapsError> {
    let path = dir.join(name);
    let err = |source| MapsError::Open {
        name,
        path: path.clone(),
        source,
    };
    let data = MapData::from_pin(&path).map_err(err)?;
    max_entries.insert(name, data.info().map_err(err)?.max_entries());
    Map::from_map_data(data).map_err(err)
}

macro_rules! typed {
    ($dir:expr, $name:expr, $ty:ident, $max:expr) => {{
        let path = $dir.join($name);
        $ty::try_from(open($dir, $name, $max)?).map_err(|source| MapsError::Open {
            name: $name,
            path,
            source,
        })?
    }};
}

/// The per-pod kernel state derived from a pod's config.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodEntries {
    pub config: PodConfig,
    pub port_blocks: BTreeMap<PortSetKey, PortBlock>,
    pub addrs: Vec<(u32, AddrKey)>,
    /// The pod's addresses as `sk_lookup` sees them (IPv6 words, IPv4 v4-mapped).
    pub ips: Vec<[u32; 4]>,
    /// The pod's own address of each family, for `getsockname` ([`pod_addrs`]); `None` when
    /// it has neither.
    pub pod_addrs: Option<PodAddrs>,
}

impl PodEntries {
    /// Translates the contract's settings into map entries for the pod `netns_cookie`.
    pub fn new(netns_cookie: u64, cfg: &LinkerdConfig, pod_ips: &[IpAddr]) -> Self {
        let mut flags = 0;
        if cfg.proxy_uid().is_some() {
            flags |= FLAG_EXEMPT_UID;
        }
        if cfg.proxy_gid().is_some() {
            flags |= FLAG_EXEMPT_GID;
        }
        if cfg.ipv6 {
            flags |= FLAG_IPV6;
        }
        if !cfg.outbound_ports_to_ignore.is_empty() {
            flags |= FLAG_OUT_PORTS;
        }
        if !cfg.outbound_subnets_to_ignore.is_empty() {
            flags |= FLAG_OUT_SUBNETS;
        }
        if !cfg.inbound_ports_to_ignore.is_empty() {
            flags |= FLAG_IN_PORTS;
        }
        if !cfg.ports_to_redirect.is_empty() {
            flags |= FLAG_IN_REDIRECT_ONLY;
        }
        if !cfg.subnets_to_ignore.is_empty() {
            flags |= FLAG_IN_SKIP_SOURCES;
        }
        let config = PodConfig {
            flags,
            proxy_uid: cfg.proxy_uid().unwrap_or(0),
            proxy_gid: cfg.proxy_gid().unwrap_or(0),
            outbound_port: cfg.outgoing_proxy_port,
            inbound_port: cfg.incoming_proxy_port,
        };
        let mut port_blocks = BTreeMap::new();
        for (set, ranges) in [
            (PORT_SET_OUTBOUND_SKIP, &cfg.outbound_ports_to_ignore),
            (PORT_SET_INBOUND_SKIP, &cfg.inbound_ports_to_ignore),
            (PORT_SET_INBOUND_REDIRECT, &cfg.ports_to_redirect),
        ] {
            fill_port_set(&mut port_blocks, netns_cookie, set, ranges);
        }
        let mut addrs = Vec::new();
        for c in &cfg.outbound_subnets_to_ignore {
            addrs.push(addr_key(netns_cookie, ADDR_OUTBOUND_SKIP_SUBNET, c));
        }
        for c in &cfg.subnets_to_ignore {
            addrs.push(addr_key(netns_cookie, ADDR_INBOUND_SKIP_SOURCE, c));
        }
        let ips = pod_ips.iter().map(|ip| ip_words(*ip)).collect();
        Self {
            config,
            port_blocks,
            addrs,
            ips,
            pod_addrs: pod_addrs(pod_ips),
        }
    }
}

/// The address of each family a redirected app socket of the pod shows as its local address
/// (`getsockname`): the first of `pod_ips` of that family (the CNI result's addresses come
/// first, then those found in the netns), leaving out loopback, unspecified and link-local
/// addresses, which the route to an outside destination never picks as the source. `None`
/// when the pod has no address of either family: its sockets keep the kernel's answer
/// (`127.0.0.1`, `::1`).
pub fn pod_addrs(pod_ips: &[IpAddr]) -> Option<PodAddrs> {
    let mut out = PodAddrs::default();
    for ip in pod_ips {
        match ip {
            IpAddr::V4(v4)
                if out.flags & POD_ADDR_V4 == 0
                    && !(v4.is_loopback() || v4.is_unspecified() || v4.is_link_local()) =>
            {
                out.v4 = u32::from_ne_bytes(v4.octets());
                out.flags |= POD_ADDR_V4;
            }
            IpAddr::V6(v6)
                if out.flags & POD_ADDR_V6 == 0
                    && !(v6.is_loopback()
                        || v6.is_unspecified()
                        || v6.is_unicast_link_local()
                        || v6.to_ipv4_mapped().is_some()) =>
            {
                out.v6 = ip_words(*ip);
                out.flags |= POD_ADDR_V6;
            }
            _ => {}
        }
    }
    (out.flags != 0).then_some(out)
}

/// Adds the ports of `ranges` to port set `set` of pod `netns_cookie` in `blocks`, by range:
/// the ranges are merged first ([`merge_ranges`]), then each merged range sets whole 64-bit
/// words of the blocks it covers. The work is O(n log n) in the number of ranges plus
/// O(blocks), whatever the ranges cover and however often they repeat: at most 1,024 word
/// writes for a set (256 blocks of 4 words), where filling port by port would take one bit
/// operation per port of every range (2 × 10⁹ for 32,760 copies of `1-65535`).
/// Returns the number of word writes, which tests bound.
pub fn fill_port_set(
    blocks: &mut BTreeMap<PortSetKey, PortBlock>,
    netns_cookie: u64,
    set: u16,
    ranges: &[PortRange],
) -> usize {
    let mut writes = 0;
    for range in merge_ranges(ranges) {
        let (first, last) = (usize::from(range.first), usize::from(range.last));
        for block in (first >> 8)..=(last >> 8) {
            let base = block << 8;
            // The bits of this block the range covers, 0..=255.
            let lo = first.max(base) - base;
            let hi = last.min(base + 255) - base;
            let entry = blocks
                .entry(PortSetKey::new(netns_cookie, set, (block << 8) as u16))
                .or_default();
            for word in (lo >> 6)..=(hi >> 6) {
                let l = lo.max(word << 6) - (word << 6);
                let h = hi.min((word << 6) + 63) - (word << 6);
                let width = h - l + 1;
                let mask = if width == 64 {
                    u64::MAX
                } else {
                    ((1u64 << width) - 1) << l
                };
                entry.bits[word] |= mask;
                writes += 1;
            }
        }
    }
    writes
}

impl PodEntries {
    /// For a pod in its own user namespace: the programs compare the proxy's host IDs.
    pub fn with_host_ids(mut self, ids: Option<&HostIds>) -> Self {
        if let Some(ids) = ids {
            if let Some(uid) = ids.uid {
                self.config.proxy_uid = uid;
            }
            if let Some(gid) = ids.gid {
                self.config.proxy_gid = gid;
            }
        }
        self
    }
}

/// An address as the programs store it: IPv6 words in network order, IPv4 v4-mapped.
pub fn ip_words(ip: IpAddr) -> [u32; 4] {
    let octets = match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    };
    let mut words = [0u32; 4];
    for (i, w) in words.iter_mut().enumerate() {
        *w = u32::from_ne_bytes([
            octets[i * 4],
            octets[i * 4 + 1],
            octets[i * 4 + 2],
            octets[i * 4 + 3],
        ]);
    }
    words
}

/// The trie key for `cidr` in `set` of pod `netns_cookie`, with its prefix length.
pub fn addr_key(netns_cookie: u64, set: u32, cidr: &Cidr) -> (u32, AddrKey) {
    let (addr, prefix) = match cidr.addr {
        IpAddr::V4(v4) => (v4.to_ipv6_mapped().octets(), u32::from(cidr.prefix) + 96),
        IpAddr::V6(v6) => (v6.octets(), u32::from(cidr.prefix)),
    };
    (
        ADDR_KEY_FIXED_BITS + prefix,
        AddrKey {
            netns_cookie,
            set_be: set.to_be(),
            addr,
            _pad: 0,
        },
    )
}

/// Everything the maps hold about one pod, for `inspect` and for tests.
#[derive(Clone, Debug, Default)]
pub struct PodView {
    pub config: Option<PodConfig>,
    pub port_blocks: usize,
    /// Ignored subnets (outbound destinations, inbound sources).
    pub addrs: Vec<Cidr>,
    /// The pod's own addresses.
    pub ips: Vec<IpAddr>,
    /// The addresses its redirected app sockets show as their own (`getsockname`), per family.
    pub local_addrs: Vec<IpAddr>,
    pub stats: PodStats,
    /// Entries of the 4-tuple map: connections between the client's handshake and the
    /// proxy side's (the destination then moves into the accepted socket's storage, which
    /// userspace cannot list), plus TCP Fast Open ones.
    pub live_conns: usize,
    /// The inbound proxy listener is registered, per family (IPv4, IPv6).
    pub listener: (bool, bool),
}

/// One journalled write of [`Maps::update_pod`] and what it replaced (`None`: nothing).
enum Undo {
    Stats(u64),
    PortSet(PortSetKey, Option<PortBlock>),
    Addr(u32, AddrKey),
    PodByIp([u32; 4], Option<u64>),
    PodAddrs(u64, Option<PodAddrs>),
    Config(u64, Option<PodConfig>),
}

impl Maps {
    /// Opens every map pinned in `dir`.
    pub fn open(dir: &Path) -> Result<Self, MapsError> {
        let max = &mut BTreeMap::new();
        Ok(Self {
            pod_config: typed!(dir, names::MAP_POD_CONFIG, HashMap, max),
            port_sets: typed!(dir, names::MAP_PORT_SETS, HashMap, max),
            addrs: typed!(dir, names::MAP_ADDRS, LpmTrie, max),
            sock_dst: typed!(dir, names::MAP_SOCK_DST, HashMap, max),
            conn_dst: typed!(dir, names::MAP_CONN_DST, HashMap, max),
            pod_stats: typed!(dir, names::MAP_POD_STATS, PerCpuHashMap, max),
            pod_by_ip: typed!(dir, names::MAP_POD_BY_IP, HashMap, max),
            pod_addrs: match dir.join(names::MAP_POD_ADDRS).exists() {
                true => Some(typed!(dir, names::MAP_POD_ADDRS, HashMap, max)),
                false => None,
            },
            listeners: typed!(dir, names::MAP_LISTENERS, SockHash, max),
            cpus: aya::util::nr_cpus().map_err(|(_, e)| MapsError::Update {
                name: names::MAP_POD_STATS,
                source: MapError::IoError(e),
            })?,
            max_entries: std::mem::take(max),
        })
    }

    /// Entries against capacity for every node-wide map (for `inspect` and `/metrics`). Walks
    /// every map: fine for a scrape or a human, not for a hot path.
    pub fn fill_levels(&self) -> Vec<Fill> {
        let counts = [
            (names::MAP_POD_CONFIG, self.pod_config.keys().count()),
            (names::MAP_POD_STATS, self.pod_stats.keys().count()),
            (names::MAP_PORT_SETS, self.port_sets.keys().count()),
            (names::MAP_ADDRS, self.addrs.keys().count()),
            (names::MAP_POD_BY_IP, self.pod_by_ip.keys().count()),
            (
                names::MAP_POD_ADDRS,
                self.pod_addrs.as_ref().map_or(0, |m| m.keys().count()),
            ),
            (names::MAP_LISTENERS, self.listeners.keys().count()),
            (names::MAP_SOCK_DST, self.sock_dst.keys().count()),
            (names::MAP_CONN_DST, self.conn_dst.keys().count()),
        ];
        counts
            .into_iter()
            .map(|(name, entries)| Fill {
                name,
                entries,
                max_entries: self.max_entries.get(name).copied().unwrap_or(0),
            })
            .collect()
    }

    /// Writes a pod's entries, its config last: the programs act on a pod only once every
    /// list it refers to is in place. A netns cookie is never reused, so a new pod has no
    /// entries to clear. All or nothing: see [`Self::update_pod`].
    pub fn write_pod(&mut self, netns_cookie: u64, entries: &PodEntries) -> Result<(), MapsError> {
        self.update_pod(netns_cookie, None, entries)
    }

    /// Writes `new` for the pod `netns_cookie`, which currently holds `old` (`None`: nothing),
    /// in place: new and changed entries first, the config next, then the entries only `old`
    /// had are removed. Redirection never pauses, and the entries the programs add themselves
    /// (the proxy's inbound listener, live connections, counters) are kept.
    ///
    /// All or nothing: when any write fails (a full map), every entry written so far is put
    /// back as it was (restored or removed), so a failed write leaves no trace.
    pub fn update_pod(
        &mut self,
        netns_cookie: u64,
        old: Option<&PodEntries>,
        new: &PodEntries,
    ) -> Result<(), MapsError> {
        let mut undo = Vec::new();
        if let Err(e) = self.try_write(netns_cookie, new, &mut undo) {
            self.undo(undo);
            return Err(e);
        }
        let Some(old) = old else { return Ok(()) };
        for k in old.port_blocks.keys() {
            if !new.port_blocks.contains_key(k) {
                let _ = self.port_sets.remove(k);
            }
        }
        for (prefix, k) in &old.addrs {
            if !new.addrs.contains(&(*prefix, *k)) {
                let _ = self.addrs.remove(&Key::new(*prefix, *k));
            }
        }
        for ip in &old.ips {
            if !new.ips.contains(ip) && self.pod_by_ip.get(ip, 0).is_ok_and(|c| c == netns_cookie) {
                let _ = self.pod_by_ip.remove(ip);
            }
        }
        if old.pod_addrs.is_some()
            && new.pod_addrs.is_none()
            && let Some(map) = &mut self.pod_addrs
        {
            let _ = map.remove(&netns_cookie);
        }
        Ok(())
    }

    /// The writes of [`Self::update_pod`], each journalled in `undo` with what it replaced.
    fn try_write(
        &mut self,
        netns_cookie: u64,
        entries: &PodEntries,
        undo: &mut Vec<Undo>,
    ) -> Result<(), MapsError> {
        if self.pod_stats.get(&netns_cookie, 0).is_err() {
            let zeros = PerCpuValues::try_from(vec![PodStats::default(); self.cpus])
                .map_err(|e| update(names::MAP_POD_STATS)(MapError::IoError(e)))?;
            self.pod_stats
                .insert(netns_cookie, zeros, 0)
                .map_err(update(names::MAP_POD_STATS))?;
            undo.push(Undo::Stats(netns_cookie));
        }
        for (k, v) in &entries.port_blocks {
            let before = self.port_sets.get(k, 0).ok();
            if before.as_ref() != Some(v) {
                self.port_sets
                    .insert(k, v, 0)
                    .map_err(update(names::MAP_PORT_SETS))?;
                undo.push(Undo::PortSet(*k, before));
            }
        }
        for (prefix, k) in &entries.addrs {
            // A trie's lookup is longest-prefix, not exact: ask the insert whether the exact
            // key was there (the value is always 1, nothing to restore).
            match self
                .addrs
                .insert(&Key::new(*prefix, *k), 1, uapi::BPF_NOEXIST)
            {
                Ok(()) => undo.push(Undo::Addr(*prefix, *k)),
                Err(MapError::SyscallError(e))
                    if e.io_error.raw_os_error() == Some(libc::EEXIST) => {}
                Err(e) => return Err(update(names::MAP_ADDRS)(e)),
            }
        }
        for ip in &entries.ips {
            let before = self.pod_by_ip.get(ip, 0).ok();
            if before != Some(netns_cookie) {
                self.pod_by_ip
                    .insert(ip, netns_cookie, 0)
                    .map_err(update(names::MAP_POD_BY_IP))?;
                undo.push(Undo::PodByIp(*ip, before));
            }
        }
        if let (Some(addrs), Some(map)) = (entries.pod_addrs, &mut self.pod_addrs) {
            let before = map.get(&netns_cookie, 0).ok();
            if before != Some(addrs) {
                map.insert(netns_cookie, addrs, 0)
                    .map_err(update(names::MAP_POD_ADDRS))?;
                undo.push(Undo::PodAddrs(netns_cookie, before));
            }
        }
        let before = self.pod_config(netns_cookie);
        self.pod_config
            .insert(netns_cookie, entries.config, 0)
            .map_err(update(names::MAP_POD_CONFIG))?;
        undo.push(Undo::Config(netns_cookie, before));
        Ok(())
    }

    /// Puts back what the journalled writes replaced, newest first. Best effort: these
    /// restore entries that fitted a moment ago, or delete.
    fn undo(&mut self, undo: Vec<Undo>) {
        for step in undo.into_iter().rev() {
            let _ = match step {
                Undo::Stats(cookie) => self.pod_stats.remove(&cookie),
                Undo::PortSet(k, Some(v)) => self.port_sets.insert(k, v, 0),
                Undo::PortSet(k, None) => self.port_sets.remove(&k),
                Undo::Addr(prefix, k) => self.addrs.remove(&Key::new(prefix, k)),
                Undo::PodByIp(ip, Some(c)) => self.pod_by_ip.insert(ip, c, 0),
                Undo::PodByIp(ip, None) => self.pod_by_ip.remove(&ip),
                Undo::PodAddrs(cookie, before) => match &mut self.pod_addrs {
                    Some(map) => match before {
                        Some(a) => map.insert(cookie, a, 0),
                        None => map.remove(&cookie),
                    },
                    None => Ok(()),
                },
                Undo::Config(cookie, Some(c)) => self.pod_config.insert(cookie, c, 0),
                Undo::Config(cookie, None) => self.pod_config.remove(&cookie),
            };
        }
    }

    /// Removes every entry of the pod, its config first (the programs stop acting on it at
    /// once). `entries` are what [`Self::write_pod`] wrote (they derive from the pod's record),
    /// so each is deleted by key; only the live-connection map is walked, since its keys come
    /// from the traffic.
    pub fn remove_pod(
        &mut self,
        netns_cookie: u64,
        entries: &PodEntries,
    ) -> Result<bool, MapsError> {
        let existed = self.pod_config.remove(&netns_cookie).is_ok();
        for k in entries.port_blocks.keys() {
            let _ = self.port_sets.remove(k);
        }
        for (prefix, k) in &entries.addrs {
            let _ = self.addrs.remove(&Key::new(*prefix, *k));
        }
        for ip in &entries.ips {
            // Another pod may hold the address by now (IPs are reused, cookies are not).
            if self.pod_by_ip.get(ip, 0).is_ok_and(|c| c == netns_cookie) {
                let _ = self.pod_by_ip.remove(ip);
            }
        }
        if let Some(map) = &mut self.pod_addrs {
            let _ = map.remove(&netns_cookie);
        }
        for family in [AF_INET, AF_INET6] {
            let _ = self.listeners.remove(&ListenerKey {
                netns_cookie,
                family,
                _pad: 0,
            });
        }
        let conns: Vec<_> = self
            .conn_dst
            .keys()
            .filter_map(Result::ok)
            .filter(|k| k.netns_cookie == netns_cookie)
            .collect();
        for k in conns {
            let _ = self.conn_dst.remove(&k);
        }
        let _ = self.pod_stats.remove(&netns_cookie);
        Ok(existed)
    }

    /// The `getsockname` addresses of a pod, if present.
    pub fn pod_addrs(&self, netns_cookie: u64) -> Option<PodAddrs> {
        self.pod_addrs.as_ref()?.get(&netns_cookie, 0).ok()
    }

    /// The config entry of a pod, if present.
    pub fn pod_config(&self, netns_cookie: u64) -> Option<PodConfig> {
        self.pod_config.get(&netns_cookie, 0).ok()
    }

    /// Every netns cookie with a config entry.
    pub fn pods(&self) -> Vec<u64> {
        self.pod_config.keys().filter_map(Result::ok).collect()
    }

    /// Summed counters of a pod.
    pub fn stats(&self, netns_cookie: u64) -> PodStats {
        let mut total = PodStats::default();
        if let Ok(per_cpu) = self.pod_stats.get(&netns_cookie, 0) {
            for s in per_cpu.iter() {
                total.add(s);
            }
        }
        total
    }

    /// All the maps say about one pod.
    pub fn view(&self, netns_cookie: u64) -> PodView {
        let addrs = self
            .addrs
            .keys()
            .filter_map(Result::ok)
            .filter(|k| k.data().netns_cookie == netns_cookie)
            .map(|k| cidr_of(&k))
            .collect();
        let ips = self
            .pod_by_ip
            .iter()
            .filter_map(Result::ok)
            .filter(|(_, c)| *c == netns_cookie)
            .map(|(words, _)| ip_of(words))
            .collect();
        PodView {
            config: self.pod_config(netns_cookie),
            ips,
            local_addrs: self
                .pod_addrs(netns_cookie)
                .map(|a| addrs_of(&a))
                .unwrap_or_default(),
            port_blocks: self
                .port_sets
                .keys()
                .filter_map(Result::ok)
                .filter(|k| k.netns_cookie == netns_cookie)
                .count(),
            addrs,
            stats: self.stats(netns_cookie),
            live_conns: self
                .conn_dst
                .keys()
                .filter_map(Result::ok)
                .filter(|k| k.netns_cookie == netns_cookie)
                .count(),
            listener: (
                self.has_listener(netns_cookie, AF_INET),
                self.has_listener(netns_cookie, AF_INET6),
            ),
        }
    }

    /// Whether the pod's inbound proxy listener of `family` (2, 10) is registered.
    pub fn has_listener(&self, netns_cookie: u64, family: u32) -> bool {
        self.listeners
            .keys()
            .filter_map(Result::ok)
            .any(|k| k.netns_cookie == netns_cookie && k.family == family)
    }

    /// Number of entries in the original-destination maps (socket-keyed, connection-keyed).
    pub fn orig_dst_entries(&self) -> (usize, usize) {
        (self.sock_dst.keys().count(), self.conn_dst.keys().count())
    }
}

/// Turns program-side address words back into an address.
pub fn ip_of(words: [u32; 4]) -> IpAddr {
    let mut octets = [0u8; 16];
    for (i, w) in words.iter().enumerate() {
        octets[i * 4..i * 4 + 4].copy_from_slice(&w.to_ne_bytes());
    }
    let v6 = std::net::Ipv6Addr::from(octets);
    v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
}

/// The addresses a [`PodAddrs`] holds, IPv4 first.
pub fn addrs_of(addrs: &PodAddrs) -> Vec<IpAddr> {
    let mut out = Vec::new();
    if addrs.flags & POD_ADDR_V4 != 0 {
        out.push(IpAddr::V4(std::net::Ipv4Addr::from(addrs.v4.to_ne_bytes())));
    }
    if addrs.flags & POD_ADDR_V6 != 0 {
        out.push(ip_of(addrs.v6));
    }
    out
}

/// Turns a trie key back into the CIDR it stores.
pub fn cidr_of(key: &Key<AddrKey>) -> Cidr {
    let data = key.data();
    let v6 = std::net::Ipv6Addr::from(data.addr);
    let bits = key.prefix_len().saturating_sub(ADDR_KEY_FIXED_BITS);
    match v6.to_ipv4_mapped() {
        Some(v4) if bits >= 96 => Cidr {
            addr: IpAddr::V4(v4),
            prefix: (bits - 96) as u8,
        },
        _ => Cidr {
            addr: IpAddr::V6(v6),
            prefix: bits as u8,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_from_config() {
        let cfg: LinkerdConfig = serde_json::from_str(
            r#"{"outbound-ports-to-ignore":["25","9000-9300"],"outbound-subnets-to-ignore":["10.0.0.0/8"],
                "subnets-to-ignore":["fd00::/8"],"proxy-gid":5}"#,
        )
        .unwrap();
        let e = PodEntries::new(7, &cfg, &["10.1.2.3".parse().unwrap()]);
        // Default inbound ignores (4190, 4191) and an ignored source subnet set the inbound flags.
        assert_eq!(
            e.config.flags,
            FLAG_EXEMPT_UID
                | FLAG_EXEMPT_GID
                | FLAG_OUT_PORTS
                | FLAG_OUT_SUBNETS
                | FLAG_IN_PORTS
                | FLAG_IN_SKIP_SOURCES
        );
        assert_eq!((e.config.proxy_uid, e.config.proxy_gid), (2102, 5));
        // 25 → block 0; 9000-9300 → blocks 35, 36; default inbound skips 4190/4191 → block 16.
        let out: Vec<u16> = e
            .port_blocks
            .keys()
            .filter(|k| k.set == PORT_SET_OUTBOUND_SKIP)
            .map(|k| k.block)
            .collect();
        assert_eq!(out, vec![0, 35, 36]);
        let b35 = e.port_blocks[&PortSetKey::new(7, PORT_SET_OUTBOUND_SKIP, 9000)];
        assert!(b35.contains(9000) && b35.contains(9215) && !b35.contains(8999));
        assert!(e.port_blocks[&PortSetKey::new(7, PORT_SET_INBOUND_SKIP, 4190)].contains(4191));
        let cidrs: Vec<Cidr> = e
            .addrs
            .iter()
            .map(|(p, k)| cidr_of(&Key::new(*p, *k)))
            .collect();
        assert_eq!(
            cidrs,
            vec!["10.0.0.0/8".parse().unwrap(), "fd00::/8".parse().unwrap()]
        );
        let ip: IpAddr = "10.1.2.3".parse().unwrap();
        assert_eq!(
            e.ips.iter().map(|w| ip_of(*w)).collect::<Vec<_>>(),
            vec![ip]
        );
        assert_eq!(
            ip_of(ip_words("fd00::5".parse().unwrap())),
            "fd00::5".parse::<IpAddr>().unwrap()
        );
    }

    /// `getsockname`'s address per family: the first usable one of each, CNI result first;
    /// loopback, unspecified, link-local and v4-mapped addresses are never picked; none of
    /// either family: no entry.
    #[test]
    fn pod_addrs_are_the_first_usable_address_of_each_family() {
        let ips = |list: &[&str]| -> Vec<IpAddr> {
            list.iter().map(|s| s.parse().expect("address")).collect()
        };
        let picked = |list: &[&str]| pod_addrs(&ips(list)).map(|a| addrs_of(&a));
        assert_eq!(
            picked(&["10.1.2.3", "fe80::1", "fd00::5", "10.9.9.9", "fd00::6"]),
            Some(ips(&["10.1.2.3", "fd00::5"]))
        );
        assert_eq!(
            picked(&["169.254.1.1", "127.0.0.2", "0.0.0.0", "10.1.2.3"]),
            Some(ips(&["10.1.2.3"]))
        );
        assert_eq!(
            picked(&[
                "fe80::9c84:4fff:fe39:fd2b",
                "::ffff:10.1.2.3",
                "::1",
                "2001:db8::7"
            ]),
            Some(ips(&["2001:db8::7"]))
        );
        assert_eq!(picked(&["fe80::1", "127.0.0.1"]), None);
        assert_eq!(picked(&[]), None);
        // As the programs read them: IPv4 in network order, IPv6 as words.
        let a = pod_addrs(&ips(&["10.1.2.3", "fd00::5"])).expect("both families");
        assert_eq!(a.flags, POD_ADDR_V4 | POD_ADDR_V6);
        assert_eq!(a.v4.to_ne_bytes(), [10, 1, 2, 3]);
        assert_eq!(a.v6, ip_words("fd00::5".parse().expect("address")));
        // And in a pod's entries.
        let e = PodEntries::new(7, &LinkerdConfig::default(), &ips(&["10.1.2.3"]));
        assert_eq!(e.pod_addrs.map(|a| addrs_of(&a)), Some(ips(&["10.1.2.3"])));
    }

    /// The port-by-port fill this module did before: the reference for the fill by range.
    fn fill_port_by_port(ranges: &[PortRange]) -> BTreeMap<PortSetKey, PortBlock> {
        let mut blocks = BTreeMap::new();
        for port in ranges.iter().flat_map(PortRange::ports) {
            blocks
                .entry(PortSetKey::new(1, PORT_SET_INBOUND_SKIP, port))
                .or_insert_with(PortBlock::default)
                .insert(port);
        }
        blocks
    }

    fn range(first: u16, last: u16) -> PortRange {
        PortRange { first, last }
    }

    #[test]
    fn fill_by_range_sets_exactly_the_ports_of_the_ranges() {
        // Edges of words (63/64) and blocks (255/256), single ports, overlaps, adjacency,
        // the first and last port, reversed order.
        let cases: Vec<Vec<PortRange>> = vec![
            vec![range(1, 65535)],
            vec![range(65535, 65535), range(1, 1)],
            vec![range(63, 64), range(255, 256), range(511, 513)],
            vec![
                range(100, 200),
                range(150, 300),
                range(301, 301),
                range(302, 400),
            ],
            vec![range(4190, 4191), range(4096, 4351), range(9000, 9300)],
            vec![range(1, 64), range(65, 128), range(129, 255)],
            (1..200).map(|i| range(i * 300, i * 300 + i)).collect(),
        ];
        for ranges in cases {
            let mut blocks = BTreeMap::new();
            fill_port_set(&mut blocks, 1, PORT_SET_INBOUND_SKIP, &ranges);
            assert_eq!(blocks, fill_port_by_port(&ranges), "{ranges:?}");
        }
    }

    /// Issue 28: `config.linkerd.io/skip-inbound-ports` of 32,760 copies of `1-65535` took
    /// 2 × 10⁹ bit operations (about 30 s of CPU) to expand. Merged first and filled by range,
    /// it is one range and 1,024 word writes (256 blocks of 4 words): the work depends on the
    /// ports covered, never on how often a range is repeated.
    #[test]
    fn repeated_ranges_cost_one_fill() {
        let ranges = vec![range(1, 65535); 32_760];
        let mut blocks = BTreeMap::new();
        let writes = fill_port_set(&mut blocks, 1, PORT_SET_INBOUND_SKIP, &ranges);
        assert_eq!(writes, 256 * 4);
        assert_eq!(blocks.len(), 256);
        assert!(!blocks[&PortSetKey::new(1, PORT_SET_INBOUND_SKIP, 0)].contains(0));
        assert!(blocks.values().all(|b| b.contains(65535) && b.contains(1)));

        // Half the ports, the other pattern the issue measured (accepted after 14.6 s).
        let ranges = vec![range(1, 32767); 32_760];
        let mut blocks = BTreeMap::new();
        let writes = fill_port_set(&mut blocks, 1, PORT_SET_INBOUND_SKIP, &ranges);
        assert_eq!((writes, blocks.len()), (128 * 4, 128));

        // Through the entries the agent builds at ADD, at every reconcile pass and at DEL.
        let cfg = LinkerdConfig {
            inbound_ports_to_ignore: vec![range(1, 32767); 32_760],
            ..LinkerdConfig::default()
        };
        let e = PodEntries::new(1, &cfg, &[]);
        assert_eq!(e.port_blocks.len(), 128);
    }

    #[test]
    fn word_writes_are_bounded_by_the_blocks_covered() {
        // Disjoint single ports in one block: one write each (they share a word at most).
        let ranges: Vec<PortRange> = (0..64).map(|i| range(1000 + 2 * i, 1000 + 2 * i)).collect();
        let mut blocks = BTreeMap::new();
        let writes = fill_port_set(&mut blocks, 1, PORT_SET_OUTBOUND_SKIP, &ranges);
        assert_eq!(writes, 64);
        // A range within one word: one write.
        let mut blocks = BTreeMap::new();
        assert_eq!(
            fill_port_set(&mut blocks, 1, PORT_SET_OUTBOUND_SKIP, &[range(70, 80)]),
            1
        );
    }
}
