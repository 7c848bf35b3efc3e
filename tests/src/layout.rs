//! Pinned state across agent versions, for the layout tests and the benchmark's upgrade
//! scenario: the previous agent version's state replayed from its eBPF object
//! (`tests/fixtures/ebpf-layout-1.o`, layout 1: maps without BTF, no layout record), a state
//! of a newer layout that declares this agent able to read it, and views of what is pinned
//! (which program each link runs, map identities, the layout record).
//!
//! Only the previous version's eBPF object exists here, not its user space: [`previous_loads`]
//! loads that object and pins its maps and programs where that agent did, and
//! [`previous_registers`] writes a pod's entries (same sizes and meaning in layout 1, written
//! with this version's encoder), attaches the previous programs with pinned links and records
//! the pod in the registry, as that agent did on CNI ADD.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

use linkerd_cni_agent::{
    agent::registry::{Attachment, PodRecord, Registry},
    dataplane,
    dataplane::maps::{Maps, PodEntries},
    host::kernel,
    host::netns::Netns,
};
use linkerd_cni_common::{
    LAYOUT_VERSION, LayoutMeta,
    names::{self, MAX_PODS, Program},
    paths,
};
use linkerd_cni_proto::config::LinkerdConfig;
use linkerd_cni_sys::bpf::{self, MapInfo};

use crate::{Error, Result};

/// The eBPF object of the previous agent version (layout 1: maps without BTF), DWARF stripped.
pub static PREVIOUS_OBJECT: &[u8] = aya::include_bytes_aligned!("../fixtures/ebpf-layout-1.o");

fn missing(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.to_string();
    move |e| Error::io(what, e)
}

fn other(what: impl std::fmt::Display, e: impl std::fmt::Display) -> Error {
    Error::Missing(format!("{what}: {e}"))
}

/// The previous agent version's programs: its eBPF object loaded with its maps pinned by name
/// under `pin_root` (no BTF, no meta map) and its programs pinned. Keep the returned object
/// for [`previous_registers`]; dropping it leaves what is pinned in force.
pub fn previous_loads(pin_root: &Path) -> Result<aya::Ebpf> {
    kernel::ensure_bpffs(pin_root).map_err(missing("mounting bpffs"))?;
    for sub in paths::PIN_DIRS {
        let dir = pin_root.join(sub);
        fs::create_dir_all(&dir).map_err(missing(format!("creating {}", dir.display())))?;
    }
    let mut ebpf = aya::EbpfLoader::new()
        .default_map_pin_directory(pin_root.join(paths::PIN_MAPS))
        .load(PREVIOUS_OBJECT)
        .map_err(|e| other("loading the previous eBPF object", e))?;
    for Program { name, hook, .. } in previous_programs(&ebpf)? {
        let program = ebpf
            .program_mut(name)
            .ok_or_else(|| Error::Missing(format!("{name} not in the previous object")))?;
        dataplane::load_program(program, hook).map_err(|e| other(format!("loading {name}"), e))?;
        let prog = program_fd(&ebpf, name)?;
        bpf::obj_pin(prog, &pin_root.join(paths::PIN_PROGS).join(name))
            .map_err(missing(format!("pinning {name}")))?;
    }
    Ok(ebpf)
}

/// The previous object's own programs (not today's list: a program added since is not in
/// it), each with the hook `names` gives its name, in `names`' order.
fn previous_programs(ebpf: &aya::Ebpf) -> Result<Vec<Program>> {
    let known: Vec<Program> = names::PROGRAMS
        .into_iter()
        .chain(names::ITER_PROGRAMS)
        .filter(|p| ebpf.program(p.name).is_some())
        .collect();
    if let Some((name, _)) = ebpf
        .programs()
        .find(|(name, _)| !known.iter().any(|p| p.name == *name))
    {
        return Err(Error::Missing(format!(
            "the previous object's program {name} has no hook in linkerd_cni_common::names"
        )));
    }
    Ok(known)
}

fn program_fd<'a>(ebpf: &'a aya::Ebpf, name: &str) -> Result<&'a aya::programs::ProgramFd> {
    ebpf.program(name)
        .ok_or_else(|| Error::Missing(format!("{name} not in the previous object")))?
        .fd()
        .map_err(|e| other(format!("{name} not loaded"), e))
}

/// A pod as the previous agent registers it.
pub struct PreviousPod<'a> {
    /// The CNI container id.
    pub id: &'a str,
    /// The pod's network namespace (a path under `/run/netns`).
    pub netns: &'a Path,
    /// The pod's cgroup v2.
    pub cgroup: &'a Path,
    /// Whether its cgroup links go under `shared/` (standing for the shared ancestor's
    /// attachment) rather than under the pod's own link directory.
    pub shared: bool,
}

/// Registers `pod` the way the previous agent version did, with the default config: the
/// pod's entries written, links of `ebpf`'s programs pinned under `pin_root`, its registry
/// record written under `state_dir`.
pub fn previous_registers(
    ebpf: &aya::Ebpf,
    pin_root: &Path,
    state_dir: &Path,
    pod: &PreviousPod<'_>,
) -> Result<PodRecord> {
    previous_registers_with(ebpf, pin_root, state_dir, pod, LinkerdConfig::default())
}

/// [`previous_registers`] with `cfg`, whatever its size: the previous version held no list
/// to a per-pod limit, so it wrote every entry `cfg` makes.
pub fn previous_registers_with(
    ebpf: &aya::Ebpf,
    pin_root: &Path,
    state_dir: &Path,
    pod: &PreviousPod<'_>,
    cfg: LinkerdConfig,
) -> Result<PodRecord> {
    let ns = Netns::open(pod.netns).map_err(|e| other("opening the pod netns", e))?;
    let (cookie, ips) = ns
        .cookie_and_addresses()
        .map_err(|e| other("reading the netns cookie", e))?;
    let entries = PodEntries::new(cookie, &cfg, &ips);
    Maps::open(&pin_root.join(paths::PIN_MAPS))
        .map_err(|e| other("opening the previous maps", e))?
        .write_pod(cookie, &entries)
        .map_err(|e| other("writing the pod's entries", e))?;
    let link_dir = pin_root
        .join(paths::PIN_PODS)
        .join(dataplane::pin_name(pod.id));
    fs::create_dir_all(&link_dir).map_err(missing("creating the link dir"))?;
    let cgroup = fs::File::open(pod.cgroup).map_err(missing("opening the pod cgroup"))?;
    // The previous object's programs that attach to something (not its iterators, if any).
    let attached = previous_programs(ebpf)?
        .into_iter()
        .filter(|p| names::PROGRAMS.contains(p));
    for Program { name, hook, .. } in attached {
        let prog = program_fd(ebpf, name)?;
        let (link, dir) = if hook.on_cgroup() {
            let dir = match pod.shared {
                true => pin_root.join(paths::PIN_SHARED),
                false => link_dir.clone(),
            };
            (bpf::link_create(prog, &cgroup, hook), dir)
        } else {
            let link = bpf::link_create(prog, ns.file(), hook);
            (link, link_dir.clone())
        };
        let link = link.map_err(missing(format!("attaching {name}")))?;
        bpf::obj_pin(&link, &dir.join(name)).map_err(missing(format!("pinning {name}")))?;
    }
    let cgroup = pod.cgroup.into();
    let attachment = match pod.shared {
        true => Attachment::Shared { cgroup },
        false => Attachment::PerPod { cgroup },
    };
    let record = PodRecord {
        id: pod.id.into(),
        ifname: "eth0".into(),
        netns: pod.netns.into(),
        netns_ino: ns.ino,
        netns_cookie: cookie,
        pod: None,
        reason: attachment.describe().into(),
        attachment,
        config: cfg.into(),
        pod_ips: ips,
        host_ids: None,
        refused: false,
        cgroup_seen: None,
        rules: false,
        cgroup_hint: None,
    };
    Registry::open(state_dir)
        .map_err(|e| other("opening the registry", e))?
        .put(&record)
        .map_err(|e| other("recording the pod", e))?;
    Ok(record)
}

/// The kernel's description of the map pinned at `path`.
pub fn map_info(path: &Path) -> Result<MapInfo> {
    let fd = bpf::obj_get(path).map_err(missing(format!("opening {}", path.display())))?;
    bpf::map_info(fd).map_err(missing(format!("inspecting {}", path.display())))
}

/// The layout record pinned under `pin_root`, if any.
pub fn meta(pin_root: &Path) -> Result<Option<LayoutMeta>> {
    linkerd_cni_agent::dataplane::layout::read_meta(pin_root)
        .map_err(|e| other("reading the meta map", e))
}

/// Overwrites the layout record pinned under `pin_root`.
pub fn set_meta(pin_root: &Path, version: u32, oldest_reader: u32) -> Result<()> {
    let fd = bpf::obj_get(&pin_root.join(paths::PIN_MAPS).join(names::MAP_META))
        .map_err(missing("opening the meta map"))?;
    let mut value = [0u8; 8];
    value[..4].copy_from_slice(&version.to_ne_bytes());
    value[4..].copy_from_slice(&oldest_reader.to_ne_bytes());
    bpf::map_update(fd, &0u32.to_ne_bytes(), &value).map_err(missing("writing the meta map"))
}

/// Makes the (stopped) agent's state under `pin_root` look like a newer layout that declares
/// this agent able to read it: layout record `LAYOUT_VERSION + 1`, oldest reader ours, and the
/// pod config map re-pinned as a map of half the capacity without BTF (the running programs
/// keep the map they hold). No newer agent exists; this is what one would leave.
pub fn make_newer_readable_layout(pin_root: &Path) -> Result<()> {
    set_meta(pin_root, LAYOUT_VERSION + 1, LAYOUT_VERSION)?;
    let pin = pin_root.join(paths::PIN_MAPS).join(names::MAP_POD_CONFIG);
    let info = map_info(&pin)?;
    let newer = bpf::map_create(
        info.map_type,
        info.key_size,
        info.value_size,
        MAX_PODS / 2,
        info.map_flags,
        names::MAP_POD_CONFIG,
        None,
    )
    .map_err(missing("creating a map of the newer layout"))?;
    fs::remove_file(&pin).map_err(missing("unpinning the pod config map"))?;
    bpf::obj_pin(&newer, &pin).map_err(missing("pinning the newer layout's map"))
}

/// Every pinned object under `pin_root` (maps, programs, links) → its kernel id, and for
/// links the id of the program they run.
pub fn pinned_ids(pin_root: &Path) -> Result<BTreeMap<PathBuf, (u32, Option<u32>)>> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![pin_root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let entries = fs::read_dir(&dir).map_err(missing(format!("listing {}", dir.display())))?;
        for entry in entries {
            let path = entry.map_err(missing("listing pins"))?.path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let fd = bpf::obj_get(&path).map_err(missing(format!("opening {}", path.display())))?;
            let id = bpf::obj_id(&fd).map_err(missing("object id"))?;
            let is_link = path.starts_with(pin_root.join(paths::PIN_PODS))
                || path.starts_with(pin_root.join(paths::PIN_SHARED));
            let prog = is_link
                .then(|| bpf::link_info(&fd).ok().map(|l| l.prog_id))
                .flatten();
            out.insert(path, (id, prog));
        }
    }
    Ok(out)
}

/// The kernel ids of everything pinned under `pin_root` by kind, as `bpftool` names them
/// (`prog`, `map`, `link`): the programs the links run included (a pod's inbound stub is
/// pinned only through its link).
pub fn pinned_objects(pin_root: &Path) -> Result<BTreeMap<&'static str, BTreeSet<u32>>> {
    let mut out: BTreeMap<&'static str, BTreeSet<u32>> = BTreeMap::new();
    for (path, (id, prog)) in pinned_ids(pin_root)? {
        let kind = if path.starts_with(pin_root.join(paths::PIN_PROGS)) {
            "prog"
        } else if prog.is_some() {
            "link"
        } else {
            "map"
        };
        out.entry(kind).or_default().insert(id);
        if let Some(prog) = prog {
            out.entry("prog").or_default().insert(prog);
        }
    }
    Ok(out)
}

/// Which of `objects` (from [`pinned_objects`]) `bpftool <kind> show` still lists, each as
/// "<kind> <id> (<name>)".
pub fn still_loaded(objects: &BTreeMap<&'static str, BTreeSet<u32>>) -> Result<Vec<String>> {
    let mut left = Vec::new();
    for (kind, ids) in objects {
        let out =
            crate::names::run(std::process::Command::new("bpftool").args(["-j", kind, "show"]))?;
        let listed: Vec<serde_json::Value> =
            serde_json::from_str(&out).map_err(|e| other(format!("bpftool {kind} show"), e))?;
        for o in listed {
            if let Some(id) = o["id"].as_u64().and_then(|id| u32::try_from(id).ok())
                && ids.contains(&id)
            {
                left.push(format!("{kind} {id} ({})", o["name"]));
            }
        }
    }
    Ok(left)
}

/// The program each pinned link under `pin_root` runs: link pin → program id.
pub fn link_programs(pin_root: &Path) -> Result<BTreeMap<PathBuf, u32>> {
    Ok(pinned_ids(pin_root)?
        .into_iter()
        .filter_map(|(path, (_, prog))| Some((path, prog?)))
        .collect())
}

/// The ids of the programs pinned under `progs/`, by name.
pub fn pinned_programs(pin_root: &Path) -> Result<BTreeMap<String, u32>> {
    names::ALL_PROGRAMS
        .into_iter()
        .map(|name| {
            let fd = bpf::obj_get(&pin_root.join(paths::PIN_PROGS).join(name))
                .map_err(missing(format!("opening program {name}")))?;
            let id = bpf::obj_id(fd).map_err(missing("program id"))?;
            Ok((name.to_string(), id))
        })
        .collect()
}
