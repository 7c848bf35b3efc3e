//! The layout of the pinned state, and carrying pinned state from one agent version to another
//! (upgrade or rollback) without a moment where a running pod is not redirected.
//!
//! The pinned meta map ([`names::MAP_META`]) records the layout version
//! ([`LAYOUT_VERSION`]) of the agent that last wrote the state; pins without it are layout 1.
//! Before touching anything, [`plan`] compares the pinned state with the object this agent
//! carries:
//!
//! - meta says the state needs a newer agent ([`LayoutMeta::oldest_reader`] above ours):
//!   [`LayoutError::NewerLayout`], nothing touched;
//! - each map whose pin has the object's type, key and value sizes, capacity, flags, BTF and
//!   meaning is adopted as it is; so is a map holding connections in flight ([`LIVE`]) whose
//!   entries are compatible;
//! - any other map is replaced: a new map is created and filled, per-pod config maps from the
//!   registry (the source of truth), other maps by copying their entries when key and value
//!   are unchanged and mean the same; a socket map holding sockets that cannot be carried over
//!   is refused ([`LayoutError::SocketsWouldBeLost`]).
//!
//! [`migrate`] then fills the new maps (staged under `<pin root>/next`), swaps every pinned
//! link to the new programs with `BPF_LINK_UPDATE` (atomic per link: each hook runs the old
//! program on the old maps or the new program on the new maps), copies once more what the old
//! programs wrote meanwhile, moves the new maps over the old pins and records the version. A
//! crash half way leaves the old pins in place: the next start plans and migrates again.

use std::{
    fs, io,
    os::fd::{AsFd, BorrowedFd, OwnedFd},
    path::{Path, PathBuf},
};

use linkerd_cni_common::{LAYOUT_OLDEST_READER, LAYOUT_VERSION, LayoutMeta, names, paths};

use linkerd_cni_sys::{
    bpf::{self, MapInfo},
    uapi,
};

/// Earlier layouts whose entries mean what ours mean when key and value sizes match (their
/// entries are copied). Layout 1 differs from 2 only by the missing BTF; 3 and 4 only add a
/// map each.
const SAME_MEANING_AS_OURS: &[u32] = &[1, 2, 3];

/// Maps the programs write for connections in flight (a socket's original destination
/// between `connect()` and the proxy's `SO_ORIGINAL_DST`, the proxies' listeners). Links are
/// swapped one at a time, so a new instance of one of them would split a connection between
/// a writer on the old map and a reader on the new one (measured: a few failed connections per
/// thousand under load). They are kept whenever their entries are compatible, even when their
/// capacity or BTF differs from the object's; only a node reboot (empty bpffs) applies those.
/// A map the programs write per connection or per socket belongs here.
///
/// The `sk_lookup` stubs the agent builds per pod refer to the cookie slot and the program
/// array by fd: those two are kept for the same reason (the stubs of running pods would
/// otherwise hand their cookie to a map the new shared program does not read).
const LIVE: &[&str] = &[
    names::MAP_SOCK_DST,
    names::MAP_CONN_DST,
    names::MAP_LISTENERS,
    names::MAP_ACC_DST,
    names::MAP_APP_DST,
    names::MAP_LOOKUP_NS,
    names::MAP_LOOKUP_PROG,
];

/// Maps whose whole content is derived from the registry's pod records (rewritten, never
/// copied, so an older agent's leftovers do not survive a migration).
const FROM_REGISTRY: &[&str] = &[
    names::MAP_POD_CONFIG,
    names::MAP_PORT_SETS,
    names::MAP_ADDRS,
    names::MAP_POD_BY_IP,
    names::MAP_POD_ADDRS,
];

/// Why the pinned state cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    /// The state was written by a newer agent whose layout this agent cannot read.
    #[error(
        "the pinned state under {pin_root} has layout version {found}, which agents of layout \
         {oldest_reader} or later can read; this agent has layout {ours}: refusing to touch it \
         (run an agent of layout {oldest_reader} or later, or drain the node and remove {pin_root})"
    )]
    NewerLayout {
        pin_root: PathBuf,
        found: u32,
        oldest_reader: u32,
        ours: u32,
    },
    /// A socket map changed layout while holding sockets, which user space cannot move.
    #[error(
        "map {name} changed layout ({found}) but holds {entries} sockets, which cannot be carried \
         over (proxies would lose their inbound listener): refusing to touch the pinned state"
    )]
    SocketsWouldBeLost {
        name: String,
        found: String,
        entries: u64,
    },
    /// The eBPF object could not be parsed.
    #[error("parsing the eBPF object: {0}")]
    Object(String),
    /// A bpf(2) or bpffs operation failed.
    #[error("{what} {path}: {source}")]
    Sys {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
}

fn sys(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> LayoutError {
    let path = path.to_path_buf();
    move |source| LayoutError::Sys { what, path, source }
}

/// What a map of the object looks like once created.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapSpec {
    pub name: String,
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub map_flags: u32,
    /// Whether the kernel records key/value BTF for it: BTF-defined maps, but not socket
    /// maps (the kernel takes no BTF for them).
    pub typed: bool,
}

impl MapSpec {
    /// The maps of an eBPF object.
    pub fn of_object(object: &[u8]) -> Result<Vec<Self>, LayoutError> {
        let object =
            aya_obj::Object::parse(object).map_err(|e| LayoutError::Object(e.to_string()))?;
        let mut specs: Vec<Self> = object
            .maps
            .iter()
            .map(|(name, map)| {
                let map_type = map.map_type();
                Self {
                    name: name.clone(),
                    map_type,
                    key_size: map.key_size(),
                    value_size: map.value_size(),
                    max_entries: map.max_entries(),
                    map_flags: map.map_flags(),
                    typed: map.section_kind() == aya_obj::EbpfSectionKind::BtfMaps
                        && !matches!(map_type, uapi::MAP_TYPE_SOCKMAP | uapi::MAP_TYPE_SOCKHASH),
                }
            })
            .collect();
        specs.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(specs)
    }

    /// Same entries: type, key and value sizes and flags.
    fn same_entries(&self, info: &MapInfo) -> bool {
        info.map_type == self.map_type
            && info.key_size == self.key_size
            && info.value_size == self.value_size
            && info.map_flags == self.map_flags
    }

    /// Exactly what this agent would create.
    fn matches(&self, info: &MapInfo) -> bool {
        self.same_entries(info)
            && info.max_entries == self.max_entries
            && (info.btf_id != 0) == self.typed
    }

    fn is_socket_map(&self) -> bool {
        matches!(
            self.map_type,
            uapi::MAP_TYPE_SOCKMAP | uapi::MAP_TYPE_SOCKHASH
        )
    }
}

fn describe(info: &MapInfo) -> String {
    format!(
        "type {} key {}B value {}B max_entries {} flags {:#x} btf {}",
        info.map_type,
        info.key_size,
        info.value_size,
        info.max_entries,
        info.map_flags,
        if info.btf_id != 0 { "yes" } else { "no" }
    )
}

/// What the pinned state says about its version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found {
    /// Nothing pinned: a fresh node (or bpffs was emptied).
    Nothing,
    /// Maps pinned without a meta map: layout 1.
    Unversioned,
    /// The meta map's record.
    Meta(LayoutMeta),
}

impl Found {
    /// The layout version of the pinned state, if any.
    pub fn version(self) -> Option<u32> {
        match self {
            Found::Nothing => None,
            Found::Unversioned => Some(1),
            Found::Meta(m) => Some(m.version),
        }
    }
}

/// How a replaced map's new instance is filled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Carry {
    /// Nothing was pinned: starts empty (registry pods are still written).
    Fresh,
    /// Rewritten from the registry.
    Registry,
    /// The old entries are copied (before and after the programs are swapped).
    Copy,
    /// The old entries cannot be converted: the new map starts empty.
    Drop,
}

/// What happens to one map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// The pinned map is used as it is.
    Adopt,
    /// A new map replaces the pinned one.
    Replace(Carry),
}

/// The decision for the whole pinned state, taken before anything is touched.
#[derive(Clone, Debug)]
pub struct Plan {
    pub found: Found,
    pub maps: Vec<(MapSpec, Action)>,
}

impl Plan {
    /// Whether any map is replaced.
    pub fn migrates(&self) -> bool {
        self.maps.iter().any(|(_, a)| *a != Action::Adopt)
    }

    /// The pin path aya must reuse for each adopted map.
    pub fn adopted(&self) -> impl Iterator<Item = &str> {
        self.maps
            .iter()
            .filter(|(_, a)| *a == Action::Adopt)
            .map(|(s, _)| s.name.as_str())
    }
}

/// Reads the meta map under `pin_root`, if pinned.
pub fn read_meta(pin_root: &Path) -> Result<Option<LayoutMeta>, LayoutError> {
    let path = meta_path(pin_root);
    let fd = match bpf::obj_get(&path) {
        Ok(fd) => fd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(sys("opening", &path)(e)),
    };
    let mut value = [0u8; 8];
    let found =
        bpf::map_lookup(&fd, &0u32.to_ne_bytes(), &mut value).map_err(sys("reading", &path))?;
    let word = |o: usize| u32::from_ne_bytes([value[o], value[o + 1], value[o + 2], value[o + 3]]);
    Ok(found.then(|| LayoutMeta {
        version: word(0),
        oldest_reader: word(4),
    }))
}

fn meta_path(pin_root: &Path) -> PathBuf {
    pin_root.join(paths::PIN_MAPS).join(names::MAP_META)
}

/// Raw BTF describing the meta map's key (`[1] u32`) and value (`[2] struct LayoutMeta`).
fn meta_btf() -> Vec<u8> {
    let strings = b"\0u32\0LayoutMeta\0version\0oldest_reader\0";
    let (u32_name, struct_name, version_name, reader_name) = (1u32, 5u32, 16u32, 24u32);
    let types: [u32; 13] = [
        // [1] INT 'u32' size 4, 32 bits unsigned at offset 0.
        u32_name,
        uapi::BTF_KIND_INT << 24,
        4,
        32,
        // [2] STRUCT 'LayoutMeta' size 8, two members.
        struct_name,
        uapi::BTF_KIND_STRUCT << 24 | 2,
        8,
        version_name,
        1,
        0,
        reader_name,
        1,
        32,
    ];
    let types: Vec<u8> = types.iter().flat_map(|w| w.to_ne_bytes()).collect();
    bpf::raw_btf(&types, strings)
}

/// Records this agent's layout in the meta map (created and pinned if missing).
pub fn write_meta(pin_root: &Path) -> Result<(), LayoutError> {
    let path = meta_path(pin_root);
    let fd = match bpf::obj_get(&path) {
        Ok(fd) => fd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            // Typed like every other map, so `bpftool map dump` prints the version by name.
            let btf = bpf::btf_load(&meta_btf()).map_err(sys("loading the BTF of", &path))?;
            let typed = bpf::MapBtf {
                btf: btf.as_fd(),
                key_type_id: 1,
                value_type_id: 2,
            };
            let fd = bpf::map_create(
                uapi::MAP_TYPE_ARRAY,
                4,
                8,
                1,
                0,
                names::MAP_META,
                Some(typed),
            )
            .map_err(sys("creating", &path))?;
            bpf::obj_pin(&fd, &path).map_err(sys("pinning", &path))?;
            fd
        }
        Err(e) => return Err(sys("opening", &path)(e)),
    };
    let mut value = [0u8; 8];
    value[..4].copy_from_slice(&LAYOUT_VERSION.to_ne_bytes());
    value[4..].copy_from_slice(&LAYOUT_OLDEST_READER.to_ne_bytes());
    bpf::map_update(&fd, &0u32.to_ne_bytes(), &value).map_err(sys("writing", &path))
}

/// Decides, without changing anything, what to do with the state pinned under `pin_root`
/// for an agent whose object has the maps `specs`.
pub fn plan(pin_root: &Path, specs: &[MapSpec]) -> Result<Plan, LayoutError> {
    let maps_dir = pin_root.join(paths::PIN_MAPS);
    let mut pinned = Vec::new();
    for spec in specs {
        let path = maps_dir.join(&spec.name);
        match bpf::obj_get(&path) {
            Ok(fd) => {
                let info = bpf::map_info(&fd).map_err(sys("inspecting", &path))?;
                pinned.push(Some((fd, info)));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => pinned.push(None),
            Err(e) => return Err(sys("opening", &path)(e)),
        }
    }
    let found = match read_meta(pin_root)? {
        Some(meta) => Found::Meta(meta),
        None if pinned.iter().any(Option::is_some) => Found::Unversioned,
        None => Found::Nothing,
    };
    if let Found::Meta(meta) = found
        && meta.oldest_reader > LAYOUT_VERSION
    {
        return Err(LayoutError::NewerLayout {
            pin_root: pin_root.into(),
            found: meta.version,
            oldest_reader: meta.oldest_reader,
            ours: LAYOUT_VERSION,
        });
    }
    // Entries of equal size mean the same: our own layout, an earlier one listed as such, or
    // a newer one that declares us able to read it.
    let same_meaning = match found {
        Found::Nothing => true,
        Found::Unversioned => SAME_MEANING_AS_OURS.contains(&1),
        Found::Meta(m) => {
            m.version == LAYOUT_VERSION
                || SAME_MEANING_AS_OURS.contains(&m.version)
                || m.version > LAYOUT_VERSION
        }
    };
    let mut maps = Vec::new();
    for (spec, pinned) in specs.iter().zip(pinned) {
        let action = match pinned {
            None => Action::Replace(Carry::Fresh),
            Some((_, info)) if same_meaning && spec.matches(&info) => Action::Adopt,
            Some((_, info))
                if same_meaning
                    && LIVE.contains(&spec.name.as_str())
                    && spec.same_entries(&info) =>
            {
                if !spec.matches(&info) {
                    tracing::info!(map = %spec.name, pinned = %describe(&info), "kept as pinned: it holds connections in flight");
                }
                Action::Adopt
            }
            Some(_) if FROM_REGISTRY.contains(&spec.name.as_str()) => {
                Action::Replace(Carry::Registry)
            }
            Some((_, info)) if same_meaning && spec.same_entries(&info) => {
                Action::Replace(Carry::Copy)
            }
            Some((fd, info)) => {
                if spec.is_socket_map() || is_socket_map_type(info.map_type) {
                    let entries = count_entries(&fd, info.key_size)
                        .map_err(sys("counting entries of", &maps_dir.join(&spec.name)))?;
                    if entries > 0 {
                        return Err(LayoutError::SocketsWouldBeLost {
                            name: spec.name.clone(),
                            found: describe(&info),
                            entries,
                        });
                    }
                }
                Action::Replace(Carry::Drop)
            }
        };
        maps.push((spec.clone(), action));
    }
    Ok(Plan { found, maps })
}

fn is_socket_map_type(t: u32) -> bool {
    matches!(t, uapi::MAP_TYPE_SOCKMAP | uapi::MAP_TYPE_SOCKHASH)
}

fn count_entries(map: impl AsFd, key_size: u32) -> io::Result<u64> {
    let mut key = vec![0u8; key_size as usize];
    let mut next = vec![0u8; key_size as usize];
    let mut n = 0;
    let mut first = true;
    while bpf::map_next_key(map.as_fd(), (!first).then_some(&key[..]), &mut next)? {
        n += 1;
        first = false;
        std::mem::swap(&mut key, &mut next);
        if n > u64::from(u32::MAX) {
            break;
        }
    }
    Ok(n)
}

/// Copies every entry of `from` into `to` (same key and value sizes), overwriting. Entries
/// that vanish while copying (closed connections) are skipped. Returns how many were copied.
///
/// Hash maps are walked with `BPF_MAP_LOOKUP_BATCH`, whose cursor is a bucket: walked key by
/// key, a map whose entries come and go while it is copied (connections opening and closing
/// under load) sends the walk back to its first key each time the key in hand is deleted (the
/// kernel's `BPF_MAP_GET_NEXT_KEY`, asserted in `tests/tests/layout.rs`), so the copy is not
/// bounded by the map's size. Arrays, whose keys are never deleted, are walked key by key.
pub fn copy_entries(from: impl AsFd, to: impl AsFd, spec: &MapSpec) -> io::Result<u64> {
    let per_cpu = matches!(
        spec.map_type,
        uapi::MAP_TYPE_PERCPU_HASH | uapi::MAP_TYPE_PERCPU_ARRAY | uapi::MAP_TYPE_LRU_PERCPU_HASH
    );
    let value_len = if per_cpu {
        let cpus = aya::util::nr_cpus().map_err(|(_, e)| e)?;
        (spec.value_size as usize).next_multiple_of(8) * cpus
    } else {
        spec.value_size as usize
    };
    let hash = matches!(
        spec.map_type,
        uapi::MAP_TYPE_HASH
            | uapi::MAP_TYPE_LRU_HASH
            | uapi::MAP_TYPE_PERCPU_HASH
            | uapi::MAP_TYPE_LRU_PERCPU_HASH
    );
    if hash {
        copy_hash_entries(from.as_fd(), to.as_fd(), spec.key_size as usize, value_len)
    } else {
        copy_keyed_entries(from.as_fd(), to.as_fd(), spec.key_size as usize, value_len)
    }
}

/// Entries per `BPF_MAP_LOOKUP_BATCH` call to begin with (doubled when one bucket holds more).
const BATCH: usize = 256;

fn copy_hash_entries(
    from: BorrowedFd<'_>,
    to: BorrowedFd<'_>,
    key_size: usize,
    value_len: usize,
) -> io::Result<u64> {
    let mut room = BATCH;
    let mut keys = vec![0u8; room * key_size];
    let mut values = vec![0u8; room * value_len];
    let mut cursor = None;
    let mut copied = 0;
    loop {
        let (n, next) = match bpf::map_lookup_batch(from, cursor, key_size, &mut keys, &mut values)?
        {
            bpf::Batch::More { n, next } => (n, Some(next)),
            bpf::Batch::Done { n } => (n, None),
            bpf::Batch::NoRoom => {
                room *= 2;
                keys.resize(room * key_size, 0);
                values.resize(room * value_len, 0);
                continue;
            }
        };
        for i in 0..n {
            bpf::map_update(
                to,
                &keys[i * key_size..(i + 1) * key_size],
                &values[i * value_len..(i + 1) * value_len],
            )?;
            copied += 1;
        }
        match next {
            Some(next) => cursor = Some(next),
            None => return Ok(copied),
        }
    }
}

fn copy_keyed_entries(
    from: BorrowedFd<'_>,
    to: BorrowedFd<'_>,
    key_size: usize,
    value_len: usize,
) -> io::Result<u64> {
    let mut key = vec![0u8; key_size];
    let mut next = vec![0u8; key_size];
    let mut value = vec![0u8; value_len];
    let mut copied = 0;
    let mut first = true;
    while bpf::map_next_key(from, (!first).then_some(&key[..]), &mut next)? {
        first = false;
        std::mem::swap(&mut key, &mut next);
        if bpf::map_lookup(from, &key, &mut value)? {
            bpf::map_update(to, &key, &value)?;
            copied += 1;
        }
    }
    Ok(copied)
}

/// Programs in the order their links are swapped: [`names::Chain`] order (the readers, then
/// the relays, then the writers), each group in [`names::PROGRAMS`] order. A new program
/// understands what an old one upstream of it wrote; an old one does not know a new one's
/// state (layout 1's getsockopt reads no accepted socket's storage, which today's sockops
/// fills), so no old program ever runs downstream of a new one. A connection whose
/// `connect()` ran the old writer finds its entry in the new maps because it was copied before
/// the readers were swapped, or in the copy pass right after.
fn swap_order() -> Vec<&'static str> {
    let mut programs = names::PROGRAMS.to_vec();
    programs.sort_by_key(|p| p.chain);
    programs.into_iter().map(|p| p.name).collect()
}

/// Every directory of pinned links under `pin_root`: each pod's, and the shared one.
fn link_dirs(pin_root: &Path) -> io::Result<Vec<PathBuf>> {
    let mut dirs = vec![pin_root.join(paths::PIN_SHARED)];
    match fs::read_dir(pin_root.join(paths::PIN_PODS)) {
        Ok(entries) => {
            for entry in entries {
                dirs.push(entry?.path());
            }
        }
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        Err(_) => {}
    }
    Ok(dirs)
}

/// What [`swap_links`] does with one pinned link.
pub enum Swap {
    /// The link keeps its program (a pod's `sk_lookup` stub still valid for this generation).
    Keep,
    /// Swap to this program; the old one is shared with other links (not freed by this swap).
    Shared(OwnedFd),
    /// Swap to this program; this link held the only reference to the old one (a pod's stub),
    /// so the swap frees a program and is paced ([`bpf::pace_program_frees`]).
    Private(OwnedFd),
}

/// What [`swap_links`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Swapped {
    /// Links now running another program.
    pub swapped: usize,
    /// Links left on their program on purpose ([`Swap::Keep`]).
    pub kept: usize,
}

/// Goes over every pinned link under `pin_root`, pod by pod, in [`swap_order`], and does
/// what `prog_for(link dir, link name, link info)` says: keep it, or swap it to a program
/// (this generation's program of that name, or a new `sk_lookup` stub for the pod). A link
/// it has nothing for (`None`) is left as it is, with a warning.
pub fn swap_links(
    pin_root: &Path,
    prog_for: impl Fn(&Path, &str, &bpf::LinkInfo) -> Option<Swap>,
) -> Result<Swapped, LayoutError> {
    let order = swap_order();
    let mut done = Swapped::default();
    for dir in link_dirs(pin_root).map_err(sys("listing links under", pin_root))? {
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(sys("listing", &dir)(e)),
        };
        let mut names_here: Vec<String> = Vec::new();
        for entry in entries {
            let entry = entry.map_err(sys("listing", &dir))?;
            names_here.push(entry.file_name().to_string_lossy().into_owned());
        }
        names_here.sort_by_key(|n| order.iter().position(|p| p == n).unwrap_or(usize::MAX));
        for name in names_here {
            let path = dir.join(&name);
            let Ok(link) = bpf::obj_get(&path) else {
                continue;
            };
            let info = bpf::link_info(&link).unwrap_or_default();
            let (prog, frees_old) = match prog_for(&dir, &name, &info) {
                Some(Swap::Keep) => {
                    done.kept += 1;
                    continue;
                }
                Some(Swap::Shared(prog)) => (prog, false),
                Some(Swap::Private(prog)) => (prog, true),
                None => {
                    tracing::warn!(link = %path.display(), "no new program for this link: left as it is");
                    continue;
                }
            };
            match bpf::link_update(&link, &prog) {
                Ok(()) => {
                    done.swapped += 1;
                    if frees_old {
                        bpf::pace_program_frees(1);
                    }
                }
                // A link whose cgroup or netns is gone cannot be updated; the pod's
                // registration is reaped on its own. Never a reason not to start.
                Err(e) => {
                    tracing::warn!(link = %path.display(), error = %e, "link not switched to the new program")
                }
            }
        }
    }
    Ok(done)
}

/// Opens the pin of `name` under `dir`.
pub fn open_pin(dir: &Path, name: &str) -> Result<OwnedFd, LayoutError> {
    let path = dir.join(name);
    bpf::obj_get(&path).map_err(sys("opening", &path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readers_are_swapped_before_the_relays_and_the_relays_before_the_connect_hooks() {
        let order = swap_order();
        assert_eq!(order.len(), names::ALL_PROGRAMS.len());
        let pos = |p| order.iter().position(|n| *n == p).expect("listed");
        // getsockopt before sockops: layout 1's getsockopt reads only the 4-tuple map, which
        // today's sockops empties into the accepted socket's storage (swapped the other way
        // round, the proxy's SO_ORIGINAL_DST failed under load in the 6.1 guest).
        for reader in [
            names::PROG_GETSOCKOPT,
            names::PROG_GETPEERNAME4,
            names::PROG_GETSOCKNAME4,
        ] {
            assert!(pos(reader) < pos(names::PROG_SOCKOPS), "{order:?}");
        }
        // sockops before sk_lookup: today's sockops takes an inbound connection's
        // destination from an old sk_lookup's entry or from the socket's own address.
        assert!(
            pos(names::PROG_SOCKOPS) < pos(names::PROG_SK_LOOKUP),
            "{order:?}"
        );
        for relay in [names::PROG_SOCKOPS, names::PROG_SK_LOOKUP] {
            assert!(pos(relay) < pos(names::PROG_CONNECT4), "{order:?}");
            assert!(pos(relay) < pos(names::PROG_CONNECT6), "{order:?}");
        }
    }

    /// The order derived from the program table, written out by name.
    #[test]
    fn swap_order_of_todays_programs() {
        assert_eq!(
            swap_order(),
            [
                names::PROG_GETSOCKOPT,
                names::PROG_GETPEERNAME4,
                names::PROG_GETPEERNAME6,
                names::PROG_GETSOCKNAME4,
                names::PROG_GETSOCKNAME6,
                names::PROG_SOCKOPS,
                names::PROG_SK_LOOKUP,
                names::PROG_CONNECT4,
                names::PROG_CONNECT6,
            ]
        );
    }

    /// No program of a later place in the chain comes before one of an earlier place.
    #[test]
    fn the_swap_follows_the_chain() {
        let chain = |name: &str| {
            names::PROGRAMS
                .iter()
                .find(|p| p.name == name)
                .expect("listed")
                .chain
        };
        let order = swap_order();
        assert!(
            order.windows(2).all(|w| chain(w[0]) <= chain(w[1])),
            "{order:?}"
        );
    }

    #[test]
    fn meta_btf_is_well_formed() {
        let blob = meta_btf();
        let word = |o: usize| u32::from_ne_bytes(blob[o..o + 4].try_into().expect("4 bytes"));
        assert_eq!(u16::from_ne_bytes([blob[0], blob[1]]), uapi::BTF_MAGIC);
        let (hdr, type_len, str_off, str_len) = (word(4), word(12), word(16), word(20));
        assert_eq!(hdr, 24);
        assert_eq!(blob.len() as u32, hdr + str_off + str_len);
        assert_eq!(type_len, 13 * 4);
        let strings = &blob[(hdr + str_off) as usize..];
        let name = |off: u32| {
            let s = &strings[off as usize..];
            std::str::from_utf8(&s[..s.iter().position(|b| *b == 0).expect("NUL")])
                .expect("utf-8")
                .to_string()
        };
        let t = |i: usize| word(hdr as usize + 4 * i);
        assert_eq!(name(t(0)), "u32");
        assert_eq!(name(t(4)), "LayoutMeta");
        assert_eq!(t(6), core::mem::size_of::<LayoutMeta>() as u32);
        assert_eq!((name(t(7)), t(9)), ("version".into(), 0));
        assert_eq!((name(t(10)), t(12)), ("oldest_reader".into(), 32));
    }
}
