//! Loading the eBPF object, pinning its programs and maps, and attaching the programs to
//! cgroups as pinned bpf_links.
//!
//! Maps are pinned by name under `<pin root>/maps` and reused by every later load whose layout
//! they have (see [`layout`]: other maps are migrated, or the load is refused before anything
//! changes), so pods registered by an earlier agent keep their state. Programs are loaded
//! afresh at each start and pinned under `<pin root>/progs`; [`Dataplane::finish_load`] swaps
//! the links made by an earlier run to them (`BPF_LINK_UPDATE`).
//!
//! The iterator program ([`names::ITER_PROGRAMS`]) is loaded and pinned with the others but
//! attached to nothing: [`iter`] runs it on demand, inside a pod's network namespace. Where it
//! cannot be used (no kernel BTF to load it against, or a kernel that lays out the fields it
//! reads differently), the rest of the data plane loads as usual and
//! [`Dataplane::listener_iter`] says why.
//!
//! Below it: [`maps`] (the pinned maps, opened by path: every read and write of per-pod
//! state), [`maps_lock`] (ADDs and DELs before background passes), [`capacity`] and
//! [`limits`] (how large the maps are, how much one pod may take), [`stub`] (each pod's
//! `sk_lookup` stub), [`iter`] (running the iterator). The `bpf(2)` commands aya does not make
//! the way the agent needs them are `linkerd_cni_sys::bpf`'s.

pub mod capacity;
pub mod iter;
pub mod layout;
pub mod limits;
pub mod maps;
pub mod maps_lock;
pub mod order;
pub mod stub;

use linkerd_cni_sys::bpf;
use std::{
    fs, io,
    os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd},
    path::{Path, PathBuf},
};

use aya::{
    Btf, Ebpf, EbpfLoader,
    programs::{Program as AyaProgram, ProgramError},
};
use aya_obj::generated::bpf_prog_type;
use linkerd_cni_common::{
    kernel::SkLookupVariant,
    names::{self, Hook, Program},
    paths,
};

use self::{
    capacity::MapSizes,
    iter::ListenerIter,
    layout::{Action, Carry, LayoutError, MapSpec, Plan},
    maps::{Maps, MapsError, PodEntries},
};
use crate::host::{btf, kernel};

/// The object built from `ebpf/` (see `linkerd-cni-ebpf-build`). Public for the tests that
/// hold the kernel feature table to what the verifier accepts.
pub static OBJECT: &[u8] = aya::include_bytes_aligned!(env!("LINKERD_CNI_EBPF_OBJECT"));

/// Why the data plane could not be loaded or attached.
#[derive(Debug, thiserror::Error)]
pub enum DataplaneError {
    /// The kernel lacks a feature (named).
    #[error(transparent)]
    Kernel(#[from] kernel::KernelUnfit),
    /// bpffs or the pin directories could not be set up.
    #[error("preparing the pin directory {path}: {source}")]
    PinDir { path: PathBuf, source: io::Error },
    /// No bpffs at or above the pin root where the agent was told to use the node's
    /// (`--bpffs-from-host`): the error names the pin root and the fix, in one line (the
    /// agent's exit prints it once, not again as its own cause).
    #[error(transparent)]
    NoHostBpffs(io::Error),
    /// The pinned state has a layout this agent will not touch, or migrating it failed.
    #[error(transparent)]
    Layout(Box<LayoutError>),
    /// Rewriting registered pods into migrated maps failed.
    #[error(transparent)]
    Maps(Box<MapsError>),
    /// The object or one of its maps failed to load.
    #[error("loading the eBPF object: {0}")]
    Load(#[from] aya::EbpfError),
    /// A program failed to load; the verifier log says why.
    #[error("loading program {program}: {source}")]
    Program {
        program: &'static str,
        source: aya::programs::ProgramError,
    },
    /// The object has no program of that name (build mismatch).
    #[error("the eBPF object has no program {0}")]
    MissingProgram(&'static str),
    /// Pinning a program or link failed.
    #[error("pinning {path}: {source}")]
    Pin { path: PathBuf, source: io::Error },
    /// The cgroup could not be opened.
    #[error("opening cgroup {path}: {source}")]
    Cgroup { path: PathBuf, source: io::Error },
    /// Another tenant's program is in the way (named, with what to change).
    #[error("attaching to {}: {conflict}", path.display())]
    Order {
        path: PathBuf,
        conflict: Box<order::Conflict>,
    },
    /// Attaching failed; `hint` explains the usual cause.
    #[error("attaching {program} to {path}: {source}{hint}")]
    Attach {
        program: &'static str,
        path: PathBuf,
        source: io::Error,
        hint: &'static str,
    },
}

impl From<LayoutError> for DataplaneError {
    fn from(e: LayoutError) -> Self {
        Self::Layout(Box::new(e))
    }
}

impl From<MapsError> for DataplaneError {
    fn from(e: MapsError) -> Self {
        Self::Maps(Box::new(e))
    }
}

/// The loaded programs and the pin layout.
pub struct Dataplane {
    pin_root: PathBuf,
    ebpf: Ebpf,
    /// The maps each pod's `sk_lookup` stub refers to: the per-CPU netns cookie slot and the
    /// program array holding the shared `sk_lookup` program.
    lookup_ns: OwnedFd,
    lookup_prog: OwnedFd,
    /// The `iter/tcp` program ready to run, or why it cannot be.
    listener_iter: Result<ListenerIter, String>,
    /// The iterator programs that loaded (pinned with the others).
    iter_loaded: Vec<&'static str>,
    /// The `sk_lookup` program loaded (and pinned under [`names::PROG_SK_LOOKUP`]).
    sk_lookup: SkLookupVariant,
    /// What [`Self::load`] decided about the pinned maps; carried out by
    /// [`Self::finish_load`].
    plan: Plan,
}

impl Dataplane {
    /// Checks the kernel, mounts bpffs if needed, plans what to do with the pinned maps
    /// ([`layout::plan`]: an error here means nothing was touched), loads the object (reusing
    /// the pinned maps it adopts, creating the others), stages every map under
    /// `<pin root>/next` when some are replaced, and pins the programs. Running pods keep
    /// their programs and maps until [`Self::finish_load`], which must follow.
    pub fn load(pin_root: &Path) -> Result<Self, DataplaneError> {
        Self::load_sized(pin_root, &MapSizes::default())
    }

    /// [`Self::load`] with the node-wide maps created at `sizes` (a pinned map of another
    /// size is replaced as any layout change is).
    pub fn load_sized(pin_root: &Path, sizes: &MapSizes) -> Result<Self, DataplaneError> {
        Self::load_with(pin_root, sizes, None)
    }

    /// [`Self::load_sized`] with the `sk_lookup` variant forced (`Some`, the agent's
    /// `--sk-lookup`), or chosen by the probes (`None`: the ifindex one where the kernel has
    /// `ingress_ifindex` in the `sk_lookup` context). The choice is the kernel's answer, asked
    /// at every load: an agent restarted or upgraded on the same kernel makes the same one,
    /// and whichever it makes, every pod's stub tail-calls it (through
    /// [`names::MAP_LOOKUP_PROG`], set in [`Self::finish_load`]).
    pub fn load_with(
        pin_root: &Path,
        sizes: &MapSizes,
        sk_lookup: Option<SkLookupVariant>,
    ) -> Result<Self, DataplaneError> {
        Self::load_probed(pin_root, sizes, sk_lookup, &kernel::Findings::probe())
    }

    /// [`Self::load_with`] on a kernel whose probes already answered `findings` (the agent
    /// asked them to choose its mode): refused, each missing feature named, below the floor.
    pub fn load_probed(
        pin_root: &Path,
        sizes: &MapSizes,
        sk_lookup: Option<SkLookupVariant>,
        findings: &kernel::Findings,
    ) -> Result<Self, DataplaneError> {
        let kernel = kernel::check(findings)?;
        let sk_lookup = sk_lookup.unwrap_or_else(|| findings.sk_lookup_variant());
        tracing::info!("kernel {kernel}; sk_lookup program: {sk_lookup}");
        let pin_dir = |path: PathBuf| move |source| DataplaneError::PinDir { path, source };
        kernel::ensure_bpffs(pin_root).map_err(pin_dir(pin_root.into()))?;
        let mut specs = MapSpec::of_object(OBJECT)?;
        sizes.apply(&mut specs);
        let plan = layout::plan(pin_root, &specs)?;
        for sub in paths::PIN_DIRS {
            let dir = pin_root.join(sub);
            fs::create_dir_all(&dir).map_err(pin_dir(dir))?;
        }
        let maps_dir = pin_root.join(paths::PIN_MAPS);
        let adopted: Vec<(&str, PathBuf)> = plan.adopted().map(|n| (n, maps_dir.join(n))).collect();
        // The kernel's BTF: for the loader's relocations and for loading the iterator, which is
        // attached to a kernel function it names (`bpf_iter_tcp`).
        let vmlinux = Btf::from_sys_fs().map_err(|e| e.to_string());
        let mut loader = EbpfLoader::new();
        loader.btf(vmlinux.as_ref().ok());
        for spec in &specs {
            if let Some(n) = sizes.of(&spec.name) {
                loader.map_max_entries(&spec.name, n);
            }
        }
        for (name, path) in &adopted {
            loader.map_pin_path(name, path.as_path());
        }
        let mut ebpf = loader.load(OBJECT)?;
        for Program { name, hook, .. } in names::PROGRAMS {
            // The variant chosen stands for the sk_lookup program: only it is loaded.
            let name = match name {
                names::PROG_SK_LOOKUP => sk_lookup.program(),
                name => name,
            };
            let program = ebpf
                .program_mut(name)
                .ok_or(DataplaneError::MissingProgram(name))?;
            load_program(program, hook).map_err(|source| DataplaneError::Program {
                program: name,
                source,
            })?;
        }
        // The iterator serves adoption only: without it everything else still works.
        let mut iter_loaded = Vec::new();
        let mut iter_error = None;
        for Program { name, hook, .. } in names::ITER_PROGRAMS {
            let program = ebpf
                .program_mut(name)
                .ok_or(DataplaneError::MissingProgram(name))?;
            let loaded = match &vmlinux {
                Ok(btf) => load_program_btf(program, hook, btf).map_err(|e| match e {
                    ProgramError::LoadError { verifier_log, .. } => {
                        format!("loading {name}: the verifier refused it: {verifier_log}")
                    }
                    e => format!("loading {name}: {e}"),
                }),
                Err(e) => Err(format!(
                    "loading {name}: the kernel's BTF ({}) cannot be read: {e}",
                    btf::VMLINUX_BTF
                )),
            };
            match loaded {
                Ok(()) => iter_loaded.push(name),
                Err(e) => iter_error = Some(e),
            }
        }
        drop(vmlinux);
        // Stage: every map of the new generation under `next/` (a leftover of an interrupted
        // migration is discarded first), so they can be opened and filled like the live ones.
        let next_dir = pin_root.join(paths::PIN_NEXT);
        remove_pins(&next_dir).map_err(pin_dir(next_dir.clone()))?;
        if plan.migrates() {
            fs::create_dir_all(&next_dir).map_err(pin_dir(next_dir.clone()))?;
            for (spec, _) in &plan.maps {
                let path = next_dir.join(&spec.name);
                let map = ebpf
                    .map(&spec.name)
                    .ok_or_else(|| LayoutError::Object(format!("no map {}", spec.name)))?;
                map.pin(&path).map_err(|e| DataplaneError::Pin {
                    path: path.clone(),
                    source: io::Error::other(e),
                })?;
            }
        }
        // The stubs' maps as this generation's programs use them: the pinned ones when
        // adopted, the staged ones otherwise.
        let open_map = |name: &str| {
            let dir = match plan.adopted().any(|a| a == name) {
                true => &maps_dir,
                false => &next_dir,
            };
            let path = dir.join(name);
            bpf::obj_get(&path).map_err(|source| DataplaneError::Pin { path, source })
        };
        let listener_iter = match iter_error {
            Some(e) => Err(e),
            None => {
                let prog = ebpf
                    .program(names::PROG_ITER_TCP)
                    .ok_or(DataplaneError::MissingProgram(names::PROG_ITER_TCP))?
                    .fd()
                    .map_err(|source| DataplaneError::Program {
                        program: names::PROG_ITER_TCP,
                        source,
                    })?;
                // Rust has no CO-RE: the fields it reads at fixed offsets must be where this
                // kernel keeps them.
                match btf::check_iter_fields(std::path::Path::new(btf::VMLINUX_BTF)) {
                    Ok(()) => ListenerIter::new(prog, open_map(names::MAP_ITER_ARGS)?)
                        .map_err(|e| format!("creating the {} link: {e}", names::PROG_ITER_TCP)),
                    Err(e) => Err(e),
                }
            }
        };
        if let Err(reason) = &listener_iter {
            tracing::warn!(%reason, "the iter/tcp program cannot be used: running pods that started without linkerd-cni cannot be adopted");
        }
        let this = Self {
            pin_root: pin_root.into(),
            ebpf,
            lookup_ns: open_map(names::MAP_LOOKUP_NS)?,
            lookup_prog: open_map(names::MAP_LOOKUP_PROG)?,
            listener_iter,
            iter_loaded,
            sk_lookup,
            plan,
        };
        for name in names::ALL_PROGRAMS
            .into_iter()
            .chain(this.iter_loaded.iter().copied())
        {
            let path = this.pin_root.join(paths::PIN_PROGS).join(name);
            replace_pin(this.prog_fd(name)?, &path)?;
        }
        Ok(this)
    }

    /// Completes [`Self::load`]: when maps are replaced, writes the registered pods (`pods`:
    /// link directory, netns cookie and entries of every redirected registration) into the new maps and
    /// copies the carried-over entries; then swaps every pinned link to the new programs
    /// (always: running pods get the new code); then copies once more what the old programs
    /// wrote meanwhile, moves the new maps over the old pins and records the layout version.
    pub fn finish_load(&self, pods: &[(PathBuf, u64, PodEntries)]) -> Result<(), DataplaneError> {
        let maps_dir = self.pin_root.join(paths::PIN_MAPS);
        let next_dir = self.pin_root.join(paths::PIN_NEXT);
        let migrates = self.plan.migrates();
        if migrates {
            let mut next = Maps::open(&next_dir)?;
            for (_, cookie, entries) in pods {
                next.write_pod(*cookie, entries)?;
            }
            self.copy_pass(&maps_dir, &next_dir)?;
        }
        // Every pod's stub, including those an earlier run attached, now tail-calls this run's
        // shared program: a swap for every stub at once, done only now that the maps the new
        // program reads are filled.
        let main = self.prog_fd(names::PROG_SK_LOOKUP)?;
        bpf::map_update_u32(&self.lookup_prog, 0, main.as_raw_fd() as u32).map_err(|source| {
            DataplaneError::Attach {
                program: names::PROG_SK_LOOKUP,
                path: maps_dir.join(names::MAP_LOOKUP_PROG),
                source,
                hint: "",
            }
        })?;
        // Inbound links run a per-pod stub (or, left by agents before stubs, the shared
        // program itself). A stub refers to nothing of a generation but the cookie slot and
        // the program array; while both are the pinned ones, it already hands its pod to this
        // run's shared program (just set above) and is kept: a restart or upgrade loads and
        // frees no program per pod. Otherwise the pod gets a new stub bound to this
        // generation's maps.
        let shared_dir = self.pin_root.join(paths::PIN_SHARED);
        let stubs_stay = [names::MAP_LOOKUP_NS, names::MAP_LOOKUP_PROG]
            .iter()
            .all(|m| self.plan.adopted().any(|a| a == *m));
        // By link directory: a node of 10,000 pods would otherwise search the list once per pod.
        let cookies: std::collections::HashMap<&Path, u64> = pods
            .iter()
            .map(|(dir, cookie, _)| (dir.as_path(), *cookie))
            .collect();
        let swapped = layout::swap_links(&self.pin_root, |dir, name, link| {
            if name == names::PROG_SK_LOOKUP && dir != shared_dir {
                // Opening a program by ID needs CAP_SYS_ADMIN (agent.sysAdmin): without it
                // what the link runs is unknown, so it is never kept, and its swap is paced as
                // a stub's is (a stub's is the likely case; pacing a shared one costs a pause).
                let runs_stub = bpf::prog_by_id(link.prog_id)
                    .and_then(bpf::prog_name)
                    .map(|n| n == names::PROG_SK_LOOKUP_STUB)
                    .ok();
                if runs_stub == Some(true) && stubs_stay {
                    return Some(layout::Swap::Keep);
                }
                let stub = self.sk_lookup_stub(*cookies.get(dir)?).ok()?;
                return Some(match runs_stub {
                    Some(false) => layout::Swap::Shared(stub),
                    Some(true) | None => layout::Swap::Private(stub),
                });
            }
            let name = names::ALL_PROGRAMS.into_iter().find(|p| *p == name)?;
            let prog = self.prog_fd(name).ok()?.try_clone_to_owned().ok()?;
            Some(layout::Swap::Shared(prog))
        })?;
        if migrates {
            self.copy_pass(&maps_dir, &next_dir)?;
            for (spec, action) in &self.plan.maps {
                let (from, to) = (next_dir.join(&spec.name), maps_dir.join(&spec.name));
                let moved = match action {
                    Action::Adopt => fs::remove_file(&from),
                    Action::Replace(_) => fs::rename(&from, &to),
                };
                moved.map_err(|source| DataplaneError::Pin { path: to, source })?;
            }
            let _ = fs::remove_dir(&next_dir);
        }
        layout::write_meta(&self.pin_root)?;
        let replaced: Vec<String> = self
            .plan
            .maps
            .iter()
            .filter_map(|(s, a)| match a {
                Action::Adopt => None,
                Action::Replace(carry) => Some(format!("{} ({carry:?})", s.name)),
            })
            .collect();
        tracing::info!(
            found_layout = ?self.plan.found.version(),
            layout = linkerd_cni_common::LAYOUT_VERSION,
            links_swapped = swapped.swapped,
            stubs_kept = swapped.kept,
            ?replaced,
            "pinned state adopted"
        );
        Ok(())
    }

    /// Copies the entries of every map carried over by copy from its old pin to its new one.
    fn copy_pass(&self, maps_dir: &Path, next_dir: &Path) -> Result<(), DataplaneError> {
        for (spec, action) in &self.plan.maps {
            match action {
                Action::Replace(Carry::Copy) => {
                    let from = layout::open_pin(maps_dir, &spec.name)?;
                    let to = layout::open_pin(next_dir, &spec.name)?;
                    layout::copy_entries(&from, &to, spec).map_err(|source| LayoutError::Sys {
                        what: "copying entries into",
                        path: next_dir.join(&spec.name),
                        source,
                    })?;
                }
                Action::Replace(Carry::Drop) => {
                    tracing::warn!(map = %spec.name, "map changed layout: its entries are not carried over");
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The `iter/tcp` program, ready to run; or why it cannot be used on this kernel.
    pub fn listener_iter(&self) -> Result<&ListenerIter, &str> {
        self.listener_iter.as_ref().map_err(String::as_str)
    }

    /// The loaded program that serves as `name` (one of [`names::PROGRAMS`] or
    /// [`names::ITER_PROGRAMS`]): for [`names::PROG_SK_LOOKUP`], the variant loaded.
    fn prog_fd(&self, name: &'static str) -> Result<BorrowedFd<'_>, DataplaneError> {
        let name = match name {
            names::PROG_SK_LOOKUP => self.sk_lookup.program(),
            name => name,
        };
        let program = self
            .ebpf
            .program(name)
            .ok_or(DataplaneError::MissingProgram(name))?;
        let fd = program.fd().map_err(|source| DataplaneError::Program {
            program: name,
            source,
        })?;
        Ok(fd.as_fd())
    }

    /// Attaches every program to `cgroup` and pins the links in `link_dir`. On failure, the
    /// links made so far are removed: an attachment is all or nothing.
    pub fn attach(&self, cgroup: &Path, link_dir: &Path) -> Result<(), DataplaneError> {
        let result = self.try_attach(cgroup, link_dir);
        if result.is_err() {
            let _ = detach(link_dir);
        }
        result
    }

    /// [`Self::attach`] to the cgroup `cg` the caller opened (and checked) from `cgroup`.
    pub fn attach_opened(
        &self,
        cg: &fs::File,
        cgroup: &Path,
        link_dir: &Path,
    ) -> Result<(), DataplaneError> {
        let result = self.try_attach_opened(cg, cgroup, link_dir);
        if result.is_err() {
            let _ = detach(link_dir);
        }
        result
    }

    fn try_attach(&self, cgroup: &Path, link_dir: &Path) -> Result<(), DataplaneError> {
        let cg = fs::File::open(cgroup).map_err(|source| DataplaneError::Cgroup {
            path: cgroup.into(),
            source,
        })?;
        self.try_attach_opened(&cg, cgroup, link_dir)
    }

    fn try_attach_opened(
        &self,
        cg: &fs::File,
        cgroup: &Path,
        link_dir: &Path,
    ) -> Result<(), DataplaneError> {
        fs::create_dir_all(link_dir).map_err(|source| DataplaneError::Pin {
            path: link_dir.into(),
            source,
        })?;
        for Program { name, hook, .. } in names::PROGRAMS {
            if !hook.on_cgroup() {
                continue;
            }
            let attach = hook;
            let link = bpf::cgroup_link_create(self.prog_fd(name)?, cg, attach).map_err(|source| {
                let eperm = source.raw_os_error() == Some(libc::EPERM);
                // The program in the way, named from the attach flags of the cgroup and its
                // ancestors.
                match eperm.then(|| order::exclusive_above(cgroup, hook)).flatten() {
                    Some(tenant) => DataplaneError::Order {
                        path: cgroup.into(),
                        conflict: Box::new(order::Conflict::Exclusive { tenant }),
                    },
                    None => {
                        let hint = if eperm {
                            " (an exclusive, non-multi program of this type is attached to this cgroup or an ancestor; \
                             detach it or attach it with BPF_F_ALLOW_MULTI)"
                        } else {
                            ""
                        };
                        DataplaneError::Attach { program: name, path: cgroup.into(), source, hint }
                    }
                }
            })?;
            pin_new(link.as_fd(), &link_dir.join(name))?;
        }
        Ok(())
    }
}

impl Dataplane {
    /// Pins again whatever map or program pin is missing (bpffs remounted, pins removed by
    /// hand), from the objects this process holds. Returns how many pins it made.
    pub fn restore_pins(&self) -> Result<usize, DataplaneError> {
        let mut made = 0;
        for sub in paths::PIN_DIRS {
            let dir = self.pin_root.join(sub);
            fs::create_dir_all(&dir)
                .map_err(|source| DataplaneError::PinDir { path: dir, source })?;
        }
        for (name, map) in self.ebpf.maps() {
            let path = self.pin_root.join(paths::PIN_MAPS).join(name);
            if !path.exists() {
                map.pin(&path).map_err(|e| DataplaneError::Pin {
                    path,
                    source: io::Error::other(e.to_string()),
                })?;
                made += 1;
            }
        }
        let iters = self.iter_loaded.iter().copied();
        for name in names::ALL_PROGRAMS.into_iter().chain(iters) {
            let path = self.pin_root.join(paths::PIN_PROGS).join(name);
            if !path.exists() {
                replace_pin(self.prog_fd(name)?, &path)?;
                made += 1;
            }
        }
        Ok(made)
    }

    /// Attaches the inbound `sk_lookup` to a pod's network namespace and pins the link in
    /// `link_dir`, under the shared program's name.
    ///
    /// What is attached is a stub of 19 instructions loaded for this netns, carrying its
    /// cookie: it tail-calls the shared program, which thereby knows which pod it runs for
    /// (sk_lookup programs cannot ask for their netns). A failed tail call refuses the
    /// connection. The pinned link keeps the stub alive across agent restarts.
    ///
    /// # Minimum kernel version
    /// 5.9.
    pub fn attach_netns(
        &self,
        netns: impl AsFd,
        netns_cookie: u64,
        link_dir: &Path,
    ) -> Result<(), DataplaneError> {
        self.attach_netns_marked(netns, netns_cookie, link_dir, &mut |_| {})
    }

    /// [`Self::attach_netns`], calling `mark` at the end of each step (`stub_load`,
    /// `netns_link`, `netns_pin`) for the per-phase timing of an ADD.
    pub fn attach_netns_marked(
        &self,
        netns: impl AsFd,
        netns_cookie: u64,
        link_dir: &Path,
        mark: &mut dyn FnMut(&'static str),
    ) -> Result<(), DataplaneError> {
        fs::create_dir_all(link_dir).map_err(|source| DataplaneError::Pin {
            path: link_dir.into(),
            source,
        })?;
        let name = names::PROG_SK_LOOKUP;
        let attach_err = |source| DataplaneError::Attach {
            program: name,
            path: link_dir.into(),
            source,
            hint: "",
        };
        let stub = self.sk_lookup_stub(netns_cookie)?;
        mark("stub_load");
        let link = bpf::link_create(&stub, &netns, Hook::SkLookup).map_err(attach_err)?;
        mark("netns_link");
        pin_new(link.as_fd(), &link_dir.join(name))?;
        mark("netns_pin");
        Ok(())
    }
}

impl Dataplane {
    /// Loads a pod's `sk_lookup` stub: hands `netns_cookie` to the shared program.
    fn sk_lookup_stub(&self, netns_cookie: u64) -> Result<OwnedFd, DataplaneError> {
        let insns = stub::sk_lookup_stub(
            netns_cookie,
            self.lookup_ns.as_fd(),
            self.lookup_prog.as_fd(),
        );
        bpf::load_sk_lookup(names::PROG_SK_LOOKUP_STUB, &insns).map_err(|source| {
            DataplaneError::Program {
                program: names::PROG_SK_LOOKUP_STUB,
                source: aya::programs::ProgramError::IOError(source),
            }
        })
    }
}

/// Pins a new link. A pod's link directory starts empty (re-registration detaches the old
/// one first), so there is nothing to replace.
fn pin_new(fd: BorrowedFd<'_>, path: &Path) -> Result<(), DataplaneError> {
    bpf::obj_pin(fd, path).map_err(|source| DataplaneError::Pin {
        path: path.into(),
        source,
    })
}

/// Pins `fd` at `path`, replacing whatever was pinned there (atomically, by rename).
fn replace_pin(fd: BorrowedFd<'_>, path: &Path) -> Result<(), DataplaneError> {
    // bpffs refuses names with a dot.
    let mut tmp = path.as_os_str().to_owned();
    tmp.push("_new");
    let tmp = PathBuf::from(tmp);
    let _ = fs::remove_file(&tmp);
    let err = |source| DataplaneError::Pin {
        path: path.into(),
        source,
    };
    bpf::obj_pin(fd, &tmp).map_err(err)?;
    fs::rename(&tmp, path).map_err(err)
}

/// Unpins every object in `dir` and removes it; nothing to do when it does not exist.
fn remove_pins(dir: &Path) -> io::Result<()> {
    match fs::read_dir(dir) {
        Ok(entries) => {
            for entry in entries {
                fs::remove_file(entry?.path())?;
            }
            fs::remove_dir(dir)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// A bpffs-safe name for a CNI container id: bpffs refuses dots, which the CNI spec allows.
pub fn pin_name(id: &str) -> String {
    id.replace('.', "_2e")
}

/// Detaches and unpins every link in `link_dir`, then removes the directory. Detaching first
/// makes the effect immediate even if some process still holds a link fd. Dropping a pod's
/// stub is paced ([`bpf::pace_program_frees`]): reaping thousands of pods at once must not
/// leave thousands of program frees pending in the kernel.
pub fn detach(link_dir: &Path) -> io::Result<()> {
    let entries = match fs::read_dir(link_dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let path = entry?.path();
        if let Ok(link) = bpf::obj_get(&path) {
            let _ = bpf::link_detach(&link);
        }
        fs::remove_file(&path)?;
        // A pod's inbound link held the only reference to its stub.
        if path.file_name() == Some(names::PROG_SK_LOOKUP.as_ref()) {
            bpf::pace_program_frees(1);
        }
    }
    fs::remove_dir(link_dir)
}

/// Checks that each of `programs` has a live link in `link_dir`: pinned, and still attached
/// to its cgroup or netns. Returns what is wrong, in words; when nothing is, the programs the
/// links run, read from the same link infos (what the order checks count as ours: a reconcile
/// pass or CHECK that verified the links does not open them a second time).
pub fn links_in_force(link_dir: &Path, programs: &[&str]) -> Result<order::Ours, String> {
    let mut ours = order::Ours::default();
    for name in programs {
        let path = link_dir.join(name);
        let link =
            bpf::obj_get(&path).map_err(|e| format!("link {} is gone: {e}", path.display()))?;
        let info = bpf::link_info(&link).map_err(|e| format!("link {}: {e}", path.display()))?;
        if info.target == 0 {
            return Err(format!("link {} is detached", path.display()));
        }
        ours.add(info.attach_type, info.prog_id);
    }
    Ok(ours)
}

/// Loads one program of an object into the kernel, checking that aya found it of the program
/// type of its `hook`'s row.
///
/// Used for the object the agent embeds and, by the tests, for an earlier version's object.
/// An iterator is loaded against the kernel's BTF, read here for it.
pub fn load_program(program: &mut AyaProgram, hook: Hook) -> Result<(), ProgramError> {
    match program {
        AyaProgram::Iter(_) => {
            let btf = Btf::from_sys_fs()
                .map_err(|e| ProgramError::IOError(io::Error::other(e.to_string())))?;
            load_program_btf(program, hook, &btf)
        }
        _ => load_program_btf(program, hook, &Btf::new()),
    }
}

/// [`load_program`] with the kernel's BTF already read (`vmlinux`, used by iterators only,
/// for the target their section names: `iter/tcp`).
fn load_program_btf(
    program: &mut AyaProgram,
    hook: Hook,
    vmlinux: &Btf,
) -> Result<(), ProgramError> {
    if bpf_prog_type::from(program.prog_type()) as u32 != hook.prog_type() {
        return Err(ProgramError::UnexpectedProgramType);
    }
    match program {
        AyaProgram::Iter(p) => {
            let target = hook.section().strip_prefix("iter/").unwrap_or_default();
            p.load(target, vmlinux)
        }
        AyaProgram::SockOps(p) => p.load(),
        AyaProgram::CgroupSockopt(p) => p.load(),
        AyaProgram::SkLookup(p) => p.load(),
        AyaProgram::CgroupSockAddr(p) => p.load(),
        _ => Err(ProgramError::UnexpectedProgramType),
    }
}

#[cfg(test)]
mod tests {
    //! The eBPF side names its maps in string literals (the map macro takes nothing else) and
    //! its programs by function name: these tests hold the built object to `common`'s names,
    //! and each hook's row (section, program and attach types) to the object as aya reads it.

    use std::{collections::BTreeSet, str::FromStr};

    use aya_obj::{
        EbpfSectionKind, Object, ProgramSection,
        generated::{bpf_attach_type, bpf_prog_type},
    };

    use super::*;

    /// The license the object declares to the kernel is the eBPF crate's own (Cargo.toml),
    /// in the kernel's spelling, and one the kernel counts as GPL-compatible.
    #[test]
    fn object_license_is_the_ebpf_crates() {
        let manifest = include_str!("../../../ebpf/Cargo.toml");
        let spdx = manifest
            .lines()
            .find_map(|l| l.strip_prefix("license = "))
            .map(|v| v.trim().trim_matches('"'))
            .expect("the eBPF crate names its license in Cargo.toml");
        // SPDX expression -> the kernel's module-license string (include/linux/license.h).
        let kernel = match spdx {
            "GPL-2.0-only OR BSD-2-Clause" => "Dual BSD/GPL",
            "GPL-2.0-only OR MIT" => "Dual MIT/GPL",
            "GPL-2.0-only" | "GPL-2.0-or-later" => "GPL",
            other => panic!("no GPL-compatible kernel license string for {other:?}"),
        };
        assert_eq!(object().license.to_str(), Ok(kernel));
    }

    fn object() -> Object {
        Object::parse(OBJECT).expect("the embedded eBPF object parses")
    }

    /// Prints what is missing on each side, so a drift names itself.
    fn assert_same(what: &str, in_object: BTreeSet<&str>, in_common: BTreeSet<&str>) {
        let missing: Vec<_> = in_common.difference(&in_object).collect();
        let extra: Vec<_> = in_object.difference(&in_common).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "{what} of the eBPF object differ from linkerd_cni_common::names: \
             named in common but not in the object: {missing:?}; \
             in the object but not in common: {extra:?}"
        );
    }

    #[test]
    fn object_maps_are_common_maps() {
        let object = object();
        for (name, map) in &object.maps {
            assert!(
                matches!(
                    map.section_kind(),
                    EbpfSectionKind::Maps | EbpfSectionKind::BtfMaps
                ),
                "the eBPF object has a map {name} of kind {:?} (global data?); the agent pins \
                 only the maps of `common::names::MAPS`",
                map.section_kind()
            );
        }
        assert_same(
            "maps",
            object.maps.keys().map(String::as_str).collect(),
            names::MAPS.into_iter().collect(),
        );
        assert_eq!(
            names::MAPS.len(),
            object.maps.len(),
            "no map name is listed twice"
        );
    }

    #[test]
    fn object_maps_carry_key_and_value_btf_but_socket_maps() {
        let specs = MapSpec::of_object(OBJECT).expect("map specs");
        assert_eq!(specs.len(), names::MAPS.len());
        for spec in specs {
            assert_eq!(
                spec.typed,
                spec.name != names::MAP_LISTENERS,
                "{}: a BTF map (bpftool prints its fields), unless a socket map",
                spec.name
            );
        }
        let object = object();
        let btf = object.btf.as_ref().expect("the object carries BTF");
        for ty in [
            "PodConfig",
            "PortSetKey",
            "PortBlock",
            "AddrKey",
            "OrigDst",
            "ConnKey",
            "PodStats",
            "ListenerKey",
            "PodAddrs",
        ] {
            assert!(
                btf.id_by_type_name_kind(ty, aya_obj::btf::BtfKind::Struct)
                    .is_ok(),
                "struct {ty} is missing from the object's BTF"
            );
        }
    }

    #[test]
    fn object_programs_are_common_programs() {
        let object = object();
        assert_same(
            "programs",
            object.programs.keys().map(String::as_str).collect(),
            names::OBJECT_PROGRAMS.into_iter().collect(),
        );
        assert_eq!(
            names::PROGRAMS.len() + names::ITER_PROGRAMS.len() + names::VARIANT_PROGRAMS.len(),
            object.programs.len(),
            "no program name is listed twice"
        );
    }

    #[test]
    fn object_programs_have_their_common_hooks() {
        let object = object();
        assert_eq!(
            names::variant_programs().count(),
            names::VARIANT_PROGRAMS.len(),
            "each variant stands for a program of PROGRAMS"
        );
        let mut seen = Vec::new();
        for Program { name, hook, .. } in names::PROGRAMS
            .into_iter()
            .chain(names::ITER_PROGRAMS)
            .chain(names::variant_programs())
        {
            let Some(program) = object.programs.get(name) else {
                continue; // `object_programs_are_common_programs` reports it.
            };
            let expected = ProgramSection::from_str(hook.section()).unwrap_or_else(|e| {
                panic!("{name}: aya reads no section {:?}: {e}", hook.section())
            });
            assert_eq!(
                format!("{:?}", program.section),
                format!("{expected:?}"),
                "program {name}: section of the object vs its hook in common"
            );
            let (prog_type, attach_type) = aya_types(&program.section);
            let row = hook.row();
            assert_eq!(
                (prog_type as u32, format!("{prog_type:?}")),
                (row.prog_type, row.prog_type_name.to_string()),
                "program {name}: program type as aya sees it vs {hook:?}'s row"
            );
            assert_eq!(
                (attach_type as u32, format!("{attach_type:?}")),
                (row.attach_type, row.attach_type_name.to_string()),
                "program {name}: attach type as aya sees it vs {hook:?}'s row"
            );
            seen.push(hook);
        }
        for hook in Hook::ALL {
            assert!(
                seen.contains(&hook),
                "no program of the object has hook {hook:?}"
            );
        }
    }

    /// The program type of the `Program` aya's loader makes of a section, and the attach type
    /// it loads and attaches that program with (aya's own numbers and names of the kernel's
    /// enums).
    fn aya_types(section: &ProgramSection) -> (bpf_prog_type, bpf_attach_type) {
        match section {
            ProgramSection::CgroupSockAddr { attach_type } => (
                bpf_prog_type::BPF_PROG_TYPE_CGROUP_SOCK_ADDR,
                (*attach_type).into(),
            ),
            ProgramSection::CgroupSockopt { attach_type } => (
                bpf_prog_type::BPF_PROG_TYPE_CGROUP_SOCKOPT,
                (*attach_type).into(),
            ),
            ProgramSection::SockOps => (
                bpf_prog_type::BPF_PROG_TYPE_SOCK_OPS,
                bpf_attach_type::BPF_CGROUP_SOCK_OPS,
            ),
            ProgramSection::SkLookup => (
                bpf_prog_type::BPF_PROG_TYPE_SK_LOOKUP,
                bpf_attach_type::BPF_SK_LOOKUP,
            ),
            ProgramSection::Iter { .. } => (
                bpf_prog_type::BPF_PROG_TYPE_TRACING,
                bpf_attach_type::BPF_TRACE_ITER,
            ),
            other => panic!("no hook of ours has a section aya reads as {other:?}"),
        }
    }
}
