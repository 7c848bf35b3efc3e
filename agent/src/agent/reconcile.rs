//! Self-healing: the agent re-verifies every registered pod and puts back what is missing.
//!
//! Removing a pod's link pins (`rm -rf`), `bpftool link detach`, deleting map entries or
//! unmounting bpffs would otherwise turn a meshed pod's redirection off without anyone noticing.
//! The registry is the source of truth: from a pod's record the agent knows which links must be
//! in force (per pod or shared cgroup links, the netns `sk_lookup` link) and which map entries
//! must be present, and restores exactly those: a missing or detached link is re-created and
//! re-pinned one program at a time (the others keep running), a missing entry is re-written
//! (the pod's counters are kept unless their entry was lost too). A lost bpffs is mounted again
//! and the maps and programs this process holds are pinned again before the pods are repaired.
//!
//! [`Reconciler::run_once`] does a pass over up to [`PODS_PER_PASS`] pods, continuing where the
//! last one stopped (the agent runs one every
//! `--reconcile-interval`, and on SIGHUP); [`Reconciler::repair_pod`] one pod (CNI CHECK). Each
//! repair is logged with the pod and counted per [`RepairKind`]; while the pins cannot be
//! restored, [`Reconciler::not_ready`] says why, so `/ready` fails.

use linkerd_cni_sys::bpf;
use std::{
    collections::HashMap,
    os::fd::AsFd,
    path::Path,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use aya::maps::{MapError, PerCpuValues, lpm_trie::Key};
use linkerd_cni_common::{
    names::{self, Hook, Program},
    paths,
    types::PodStats,
};

use super::{Agent, AgentError};
use crate::{
    agent::registry::{Attachment, PodRecord},
    dataplane::DataplaneError,
    dataplane::maps::Maps,
    dataplane::order::{self, Conflict, Ours},
    host::kernel,
    host::netns::{self, Netns},
};

/// What a repair put back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RepairKind {
    /// A cgroup link of a pod (missing pin or detached link), re-attached and re-pinned.
    CgroupLink,
    /// The shared attachment's cgroup link.
    SharedLink,
    /// The pod's netns (`sk_lookup`) link.
    NetnsLink,
    /// Map entries of a pod (config, ignore lists, addresses, counters), re-written.
    MapEntries,
    /// bpffs mounted again, or map and program pins made again.
    Pins,
}

impl RepairKind {
    /// Every kind, in the order `/metrics` lists them.
    pub const ALL: [Self; 5] = [
        Self::CgroupLink,
        Self::SharedLink,
        Self::NetnsLink,
        Self::MapEntries,
        Self::Pins,
    ];

    /// The `kind` label in `/metrics` and the logs.
    pub fn label(self) -> &'static str {
        match self {
            Self::CgroupLink => "cgroup_link",
            Self::SharedLink => "shared_link",
            Self::NetnsLink => "netns_link",
            Self::MapEntries => "map_entries",
            Self::Pins => "pins",
        }
    }
}

/// One thing put back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Repair {
    pub kind: RepairKind,
    /// What was found, in words.
    pub what: String,
}

/// What [`Agent::repair`] found for one registration.
#[derive(Debug, Default)]
pub struct Verified {
    /// The registration's record (`None`: not registered).
    pub record: Option<PodRecord>,
    /// What was put back.
    pub repairs: Vec<Repair>,
    /// The programs its links run, as read while verifying them (for the order checks:
    /// `None` when a link was made again, or nothing was verified).
    pub ours: Option<Ours>,
}

/// Runs the checks and keeps the counters `/metrics` and `/ready` read.
pub struct Reconciler {
    agent: Arc<Agent>,
    /// Where bpffs is mounted (mounted again there when it is lost).
    bpffs: std::path::PathBuf,
    repairs: [AtomicU64; RepairKind::ALL.len()],
    failures: AtomicU64,
    passes: AtomicU64,
    /// Why the data plane cannot be restored, if it cannot.
    problem: Mutex<Option<String>>,
    /// The last failure logged per registration: a pod that cannot be repaired (its cgroup
    /// is being removed) is logged once, not at every pass.
    logged: Mutex<HashMap<String, String>>,
    /// The pods whose programs do not run first (or switch another tenant off), with the
    /// conflict last reported for each ([`crate::dataplane::order`]).
    conflicts: Mutex<HashMap<String, String>>,
    /// The last pod the previous pass verified.
    cursor: Mutex<Option<String>>,
    pods_per_pass: usize,
}

/// Pods one [`Reconciler::run_once`] pass verifies at most; the next pass continues after the
/// last one. Up to this many pods, every pass verifies every pod; beyond, each pod is verified
/// every `ceil(pods / PODS_PER_PASS)` passes.
pub const PODS_PER_PASS: usize = 512;

/// A reconcile pass at least this long is logged at info level (`slow reconcile pass`; every
/// pass is logged at debug level): half the default `--reconcile-interval`.
pub const SLOW_PASS: std::time::Duration = std::time::Duration::from_secs(1);

impl Reconciler {
    /// A reconciler for `agent` whose bpffs is (to be) mounted at `bpffs`.
    pub fn new(agent: Arc<Agent>, bpffs: &Path) -> Self {
        Self {
            agent,
            bpffs: bpffs.into(),
            repairs: Default::default(),
            failures: AtomicU64::new(0),
            passes: AtomicU64::new(0),
            problem: Mutex::new(None),
            logged: Mutex::new(HashMap::new()),
            conflicts: Mutex::new(HashMap::new()),
            cursor: Mutex::new(None),
            pods_per_pass: PODS_PER_PASS,
        }
    }

    /// Verifies at most `n` pods per pass (default [`PODS_PER_PASS`]).
    #[must_use]
    pub fn with_pods_per_pass(mut self, n: usize) -> Self {
        self.pods_per_pass = n.max(1);
        self
    }

    /// Repairs counted so far, per kind.
    pub fn repairs(&self) -> impl Iterator<Item = (RepairKind, u64)> + '_ {
        RepairKind::ALL
            .into_iter()
            .zip(&self.repairs)
            .map(|(k, n)| (k, n.load(Ordering::Relaxed)))
    }

    /// Repairs that failed (the pod stays as it is until the next pass).
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// Passes done (each verifies up to `pods_per_pass` pods).
    pub fn passes(&self) -> u64 {
        self.passes.load(Ordering::Relaxed)
    }

    /// Pods whose programs were found, at their last check, not to run first or to switch
    /// another tenant's program off.
    pub fn order_conflicts(&self) -> usize {
        self.conflicts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// Why the data plane cannot be restored, while it cannot.
    pub fn not_ready(&self) -> Option<String> {
        self.problem
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn set_problem(&self, problem: Option<String>) {
        *self.problem.lock().unwrap_or_else(|p| p.into_inner()) = problem;
    }

    fn count(&self, record: Option<&PodRecord>, repairs: &[Repair]) {
        for r in repairs {
            self.repairs[r.kind as usize].fetch_add(1, Ordering::Relaxed);
            let (namespace, pod) = record
                .and_then(|rec| rec.pod.as_ref())
                .map_or(("", ""), |p| (p.namespace.as_str(), p.name.as_str()));
            tracing::warn!(
                kind = r.kind.label(),
                container = record.map_or("", |rec| rec.id.as_str()),
                namespace,
                pod,
                found = %r.what,
                "data plane repaired"
            );
        }
    }

    /// One pass (blocking): pins first, then up to `pods_per_pass` registered pods after the
    /// last pass's. Returns the repairs. Logs the pass (pods checked, repairs, wall and CPU
    /// time of this thread, the part of it spent in the order checks) at debug level, and at
    /// info level when it took [`SLOW_PASS`] or more.
    pub fn run_once(&self) -> Vec<Repair> {
        self.passes.fetch_add(1, Ordering::Relaxed);
        let mut all = Vec::new();
        match self.agent.restore_pins(&self.bpffs) {
            Ok(repairs) => {
                self.set_problem(None);
                self.count(None, &repairs);
                all.extend(repairs);
            }
            Err(e) => {
                let why = format!("the data plane cannot be restored: {e}");
                if self.not_ready().as_deref() != Some(why.as_str()) {
                    tracing::error!(error = %e, "the data plane cannot be restored");
                }
                self.failures.fetch_add(1, Ordering::Relaxed);
                self.set_problem(Some(why));
                return all;
            }
        }
        self.logged
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|id, _| self.agent.is_registered(id));
        self.conflicts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|id, _| self.agent.is_registered(id));
        // A bounded share of the pods, continuing where the last pass stopped: on a node of
        // 10,000 pods a whole pass every interval would keep a core busy and the maps lock
        // contended for the ADDs.
        let mut cursor = self.cursor.lock().unwrap_or_else(|p| p.into_inner());
        let ids = self.agent.ids_from(cursor.as_deref(), self.pods_per_pass);
        let (start, cpu_start) = (std::time::Instant::now(), super::thread_cpu_time());
        let mut order_cpu = std::time::Duration::ZERO;
        let mut parents = order::Parents::default();
        for id in &ids {
            all.extend(self.verify(id, &mut order_cpu, &mut parents));
        }
        if let Some(last) = ids.last() {
            *cursor = Some(last.clone());
        }
        let wall = start.elapsed();
        let (checked, repaired) = (ids.len(), all.len());
        let cpu_us = (super::thread_cpu_time() - cpu_start).as_micros() as u64;
        let (wall_us, order_cpu_us) = (wall.as_micros() as u64, order_cpu.as_micros() as u64);
        if wall >= SLOW_PASS {
            tracing::info!(
                checked,
                repaired,
                wall_us,
                cpu_us,
                order_cpu_us,
                "slow reconcile pass"
            );
        } else {
            tracing::debug!(
                checked,
                repaired,
                wall_us,
                cpu_us,
                order_cpu_us,
                "reconcile pass"
            );
        }
        all
    }

    /// Verifies one registration and repairs it (blocking). Failures are logged and counted.
    pub fn repair_pod(&self, id: &str) -> Vec<Repair> {
        self.verify(
            id,
            &mut std::time::Duration::default(),
            &mut order::Parents::default(),
        )
    }

    /// [`Self::repair_pod`], adding the CPU time this thread spent reading where the pod's
    /// programs run among other tenants' ([`Self::check_order`]) to `order_cpu`; what runs
    /// above pod cgroups is read once per pass into `parents`.
    fn verify(
        &self,
        id: &str,
        order_cpu: &mut std::time::Duration,
        parents: &mut order::Parents,
    ) -> Vec<Repair> {
        let result = self.agent.repair(id);
        let mut logged = self.logged.lock().unwrap_or_else(|p| p.into_inner());
        match result {
            Ok(Verified {
                record,
                repairs,
                ours,
            }) => {
                logged.remove(id);
                self.count(record.as_ref(), &repairs);
                drop(logged);
                if let Some(record) =
                    record.filter(|r| r.redirected() && netns::still_exists(&r.netns, r.netns_ino))
                {
                    let cpu_start = super::thread_cpu_time();
                    self.check_order(&record, ours, parents);
                    *order_cpu += super::thread_cpu_time() - cpu_start;
                }
                repairs
            }
            Err(e) => {
                self.failures.fetch_add(1, Ordering::Relaxed);
                let message = e.to_string();
                if logged.get(id) != Some(&message) {
                    tracing::warn!(container = id, error = %message, "reconcile: repair failed");
                    logged.insert(id.into(), message);
                }
                Vec::new()
            }
        }
    }
}

impl Reconciler {
    /// Reads where a running pod's programs are among other tenants' ([`Agent::check_order`])
    /// and reports a change: a conflict at error level (once, until it changes), its end at
    /// info level. Nothing is detached: the pod keeps whatever redirection it has, and
    /// `linkerd_cni_agent_order_conflicts` counts it.
    /// `ours`: the programs of the pod's links as the repair read them (`None`: a link was
    /// made again, read them afresh).
    fn check_order(&self, record: &PodRecord, ours: Option<Ours>, parents: &mut order::Parents) {
        let mut found = match ours {
            Some(ours) => self.agent.check_order_of(record, &ours, parents),
            None => self.agent.check_order(record),
        };
        // Another program on the very cgroup of our links, ahead of them: where the kernel
        // orders cgroup links, ours made again go first (one hook at a time).
        for _ in names::PROGRAMS {
            let Err(Conflict::Ahead {
                tenant,
                attached_to,
                ..
            }) = &found
            else {
                break;
            };
            if !(tenant.hook.on_cgroup()
                && tenant.cgroup.as_deref() == Some(attached_to.as_path())
                && bpf::cgroup_links_ordered() == Some(true))
            {
                break;
            }
            match self.agent.reorder(record, tenant.hook) {
                Ok(kind) => {
                    let what = format!("{tenant} ran before ours: our link re-made first");
                    self.count(Some(record), &[Repair { kind, what }]);
                    found = self.agent.check_order(record);
                }
                Err(e) => {
                    tracing::warn!(container = record.id.as_str(), error = %e, "re-making a link first failed");
                    break;
                }
            }
        }
        let found = found.err().map(|c| c.to_string());
        let mut conflicts = self.conflicts.lock().unwrap_or_else(|p| p.into_inner());
        let (namespace, pod) = record
            .pod
            .as_ref()
            .map_or(("", ""), |p| (p.namespace.as_str(), p.name.as_str()));
        match found {
            Some(why) if conflicts.get(&record.id) != Some(&why) => {
                tracing::error!(
                    container = record.id.as_str(),
                    namespace,
                    pod,
                    conflict = %why,
                    "another program runs before ours or no longer runs for this meshed pod: \
                     its proxy may not see original destinations"
                );
                conflicts.insert(record.id.clone(), why);
            }
            Some(_) => {}
            None => {
                if conflicts.remove(&record.id).is_some() {
                    tracing::info!(
                        container = record.id.as_str(),
                        namespace,
                        pod,
                        "our programs run first again for this pod"
                    );
                }
            }
        }
    }
}

impl Agent {
    /// Makes sure bpffs is mounted and the map and program pins exist, mounting and pinning
    /// again what is missing.
    /// The fallback pins nothing: nothing to restore.
    pub fn restore_pins(&self, bpffs: &Path) -> Result<Vec<Repair>, AgentError> {
        let Some(dataplane) = &self.dataplane else {
            return Ok(Vec::new());
        };
        let pin_root = &self.config.pin_root;
        let complete = pin_root.join(paths::PIN_PODS).is_dir()
            && names::MAPS
                .iter()
                .all(|m| pin_root.join(paths::PIN_MAPS).join(m).exists())
            && names::ALL_PROGRAMS
                .iter()
                .all(|p| pin_root.join(paths::PIN_PROGS).join(p).exists());
        if complete {
            return Ok(Vec::new());
        }
        let pin_dir = |source| DataplaneError::PinDir {
            path: pin_root.clone(),
            source,
        };
        let _guard = self.lock_background();
        if self.config.bpffs_from_host {
            // A bpffs mounted here would be this container's only (see
            // `kernel::require_bpffs`): wait for the host's, unready.
            kernel::require_bpffs(pin_root).map_err(pin_dir)?;
        } else {
            if pin_root.starts_with(bpffs) {
                kernel::ensure_bpffs_at(bpffs).map_err(pin_dir)?;
            }
            kernel::ensure_bpffs(pin_root).map_err(pin_dir)?;
        }
        let made = dataplane.restore_pins()?;
        Ok(vec![Repair {
            kind: RepairKind::Pins,
            what: format!(
                "pins under {} were missing ({made} made again)",
                pin_root.display()
            ),
        }])
    }

    /// Verifies the registration `id` against its record and puts back what is missing.
    pub fn repair(&self, id: &str) -> Result<Verified, AgentError> {
        let mut maps = self.lock_background();
        // Read under the lock: a DEL in between must not be undone.
        let Some(record) = self.registry.get(id)? else {
            return Ok(Verified::default());
        };
        if !record.redirected() || !netns::still_exists(&record.netns, record.netns_ino) {
            // Nothing to keep in force; a gone netns is the reaper's.
            return Ok(Verified {
                record: Some(record),
                ..Verified::default()
            });
        }
        // The fallback cannot put back what an earlier eBPF agent made: such a pod keeps the
        // links and entries it has until it ends.
        let (Some(maps), Some(_)) = (maps.as_mut(), &self.dataplane) else {
            return Ok(Verified {
                record: Some(record),
                ..Verified::default()
            });
        };
        let mut repairs = Vec::new();
        if let Some(r) = repair_entries(maps, &record)? {
            repairs.push(r);
        }
        let mut ours = Some(Ours::default());
        for (dir, programs) in self.links_of(&record) {
            for name in programs {
                match crate::dataplane::links_in_force(&dir, &[name]) {
                    Ok(found) => {
                        if let Some(ours) = &mut ours {
                            ours.extend(found);
                        }
                    }
                    Err(why) => {
                        let kind = self.relink(&record, &dir, name)?;
                        repairs.push(Repair { kind, what: why });
                        ours = None;
                    }
                }
            }
        }
        Ok(Verified {
            record: Some(record),
            repairs,
            ours,
        })
    }

    /// Attaches, for every redirected pod whose attachment an earlier agent made, the programs
    /// of this version that its link directories lack (layout 4 added `l5d_getsock4/6`): at
    /// start, before any CHECK or reconcile pass, so an upgrade gives running pods every
    /// program at once instead of a CHECK failing until a pass repairs them. A directory with
    /// no link at all is left to the reconcile passes (a repair, counted as such). A link that
    /// cannot be made (the pod's cgroup is going away) is logged; the pod keeps the links it
    /// has. Returns how many links were made.
    /// The fallback attaches nothing.
    pub(super) fn attach_added_programs(&self) -> usize {
        if self.dataplane.is_none() {
            return 0;
        }
        let _guard = self.lock_background();
        let records = match self.registry.all() {
            Ok(records) => records,
            Err(e) => {
                tracing::warn!(error = %e, "reading the registry to attach programs this version adds");
                return 0;
            }
        };
        let mut made = 0;
        for record in records
            .iter()
            .filter(|r| r.redirected() && netns::still_exists(&r.netns, r.netns_ino))
        {
            for (dir, programs) in self.links_of(record) {
                let missing: Vec<&'static str> = programs
                    .iter()
                    .copied()
                    .filter(|name| !dir.join(name).exists())
                    .collect();
                if missing.is_empty() || missing.len() == programs.len() {
                    continue;
                }
                for name in missing {
                    match self.relink(record, &dir, name) {
                        Ok(_) => {
                            made += 1;
                            tracing::info!(container = record.id.as_str(), program = name, links = %dir.display(), "attached a program this version adds");
                        }
                        Err(e) => {
                            tracing::warn!(container = record.id.as_str(), program = name, error = %e, "a program this version adds could not be attached")
                        }
                    }
                }
            }
        }
        made
    }

    /// Makes `record`'s cgroup link of `hook` again, first on its cgroup (where the kernel
    /// orders cgroup links): the new link is pinned over the old one, which is then detached,
    /// so the program runs throughout (twice for a moment: a second run finds its work done).
    pub fn reorder(&self, record: &PodRecord, hook: Hook) -> Result<RepairKind, AgentError> {
        let _guard = self.lock_background();
        // Read again under the lock: a DEL in between must not be undone.
        let Some(record) = self.registry.get(&record.id)? else {
            return Err(AgentError::UnknownContainer(record.id.clone()));
        };
        let (cgroup, dir, kind) = match &record.attachment {
            Attachment::PerPod { cgroup } => (
                cgroup.clone(),
                self.pod_link_dir(&record.id),
                RepairKind::CgroupLink,
            ),
            Attachment::Shared { cgroup } => (
                cgroup.clone(),
                self.shared_link_dir(),
                RepairKind::SharedLink,
            ),
            Attachment::None => return Err(AgentError::UnknownContainer(record.id.clone())),
        };
        let Some(Program { name, .. }) = names::PROGRAMS.iter().find(|p| p.hook == hook) else {
            return Err(DataplaneError::MissingProgram("?").into());
        };
        let path = dir.join(name);
        let pin_err = |source| DataplaneError::Pin {
            path: path.clone(),
            source,
        };
        let prog = bpf::obj_get(&self.config.pin_root.join(paths::PIN_PROGS).join(name))
            .map_err(pin_err)?;
        let cg = match kind {
            RepairKind::CgroupLink => self.open_pod_cgroup(&cgroup, &record)?,
            _ => std::fs::File::open(&cgroup).map_err(|source| DataplaneError::Cgroup {
                path: cgroup.clone(),
                source,
            })?,
        };
        let old = bpf::obj_get(&path).map_err(pin_err)?;
        let new = bpf::cgroup_link_create(prog.as_fd(), &cg, hook).map_err(|source| {
            DataplaneError::Attach {
                program: name,
                path: cgroup.clone(),
                source,
                hint: "",
            }
        })?;
        let mut tmp = path.as_os_str().to_owned();
        tmp.push("_new");
        let tmp = std::path::PathBuf::from(tmp);
        let _ = std::fs::remove_file(&tmp);
        let pinned = bpf::obj_pin(new.as_fd(), &tmp).and_then(|()| std::fs::rename(&tmp, &path));
        if let Err(e) = pinned {
            let _ = bpf::link_detach(&new);
            let _ = std::fs::remove_file(&tmp);
            return Err(pin_err(e).into());
        }
        let _ = bpf::link_detach(&old);
        Ok(kind)
    }

    /// Re-creates the link of program `name` for `record` and pins it in `dir`.
    fn relink(
        &self,
        record: &PodRecord,
        dir: &Path,
        name: &'static str,
    ) -> Result<RepairKind, AgentError> {
        let path = dir.join(name);
        let pin_err = |source| DataplaneError::Pin {
            path: path.clone(),
            source,
        };
        // A detached link's pin, or anything else in the way.
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(pin_err(e).into()),
        }
        std::fs::create_dir_all(dir).map_err(pin_err)?;
        let Some(Program { hook, .. }) = names::PROGRAMS.iter().find(|p| p.name == name) else {
            return Err(DataplaneError::MissingProgram(name).into());
        };
        let prog = bpf::obj_get(&self.config.pin_root.join(paths::PIN_PROGS).join(name))
            .map_err(pin_err)?;
        let attach_err = |target: &Path| {
            let target = target.to_path_buf();
            move |source| DataplaneError::Attach {
                program: name,
                path: target,
                source,
                hint: "",
            }
        };
        let (link, kind) = if hook.on_cgroup() {
            let (cgroup, kind) = match &record.attachment {
                Attachment::PerPod { cgroup } => (cgroup.clone(), RepairKind::CgroupLink),
                _ => (self.shared_cgroup.clone(), RepairKind::SharedLink),
            };
            let cg = match kind {
                // The pod's own: opened again only where and as it was registered.
                RepairKind::CgroupLink => self.open_pod_cgroup(&cgroup, record)?,
                _ => std::fs::File::open(&cgroup).map_err(|source| DataplaneError::Cgroup {
                    path: cgroup.clone(),
                    source,
                })?,
            };
            let link =
                bpf::cgroup_link_create(prog.as_fd(), &cg, *hook).map_err(attach_err(&cgroup))?;
            (link, kind)
        } else {
            let ns = Netns::open(&record.netns)?;
            if ns.ino != record.netns_ino {
                return Err(AgentError::NotInForce {
                    id: record.id.clone(),
                    why: format!(
                        "{} is another network namespace now",
                        record.netns.display()
                    ),
                });
            }
            // The netns gets its own stub carrying the pod's cookie (see
            // `Dataplane::attach_netns`), never the shared program itself, which would not
            // know which pod it runs for.
            self.dataplane()?
                .attach_netns(ns.file(), record.netns_cookie, dir)?;
            return Ok(RepairKind::NetnsLink);
        };
        bpf::obj_pin(link.as_fd(), &path).map_err(pin_err)?;
        Ok(kind)
    }
}

/// Re-writes whatever entry of `record` the maps lack (its config last, as at registration).
fn repair_entries(maps: &mut Maps, record: &PodRecord) -> Result<Option<Repair>, AgentError> {
    let cookie = record.netns_cookie;
    let entries = super::entries_of(record);
    let mut missing = Vec::new();
    let update = |name| move |source| crate::dataplane::maps::MapsError::Update { name, source };
    if maps.pod_stats.get(&cookie, 0).is_err() {
        missing.push("counters");
        let cpus = aya::util::nr_cpus()
            .map_err(|(_, e)| update(names::MAP_POD_STATS)(MapError::IoError(e)))?;
        let zeros = PerCpuValues::try_from(vec![PodStats::default(); cpus])
            .map_err(|e| update(names::MAP_POD_STATS)(MapError::IoError(e)))?;
        maps.pod_stats
            .insert(cookie, zeros, 0)
            .map_err(update(names::MAP_POD_STATS))?;
    }
    for (k, v) in &entries.port_blocks {
        if maps.port_sets.get(k, 0).ok().as_ref() != Some(v) {
            missing.push("port set");
            maps.port_sets
                .insert(k, v, 0)
                .map_err(update(names::MAP_PORT_SETS))?;
        }
    }
    for (prefix, k) in &entries.addrs {
        let key = Key::new(*prefix, *k);
        if maps.addrs.get(&key, 0).is_err() {
            missing.push("address");
            maps.addrs
                .insert(&key, 1, 0)
                .map_err(update(names::MAP_ADDRS))?;
        }
    }
    for ip in &entries.ips {
        // Absent only: another pod may hold a reused address by now.
        if maps.pod_by_ip.get(ip, 0).is_err() {
            missing.push("pod address");
            maps.pod_by_ip
                .insert(ip, cookie, 0)
                .map_err(update(names::MAP_POD_BY_IP))?;
        }
    }
    if let Some(addrs) = entries.pod_addrs
        && maps.pod_addrs(cookie) != Some(addrs)
        && let Some(map) = &mut maps.pod_addrs
    {
        missing.push("getsockname addresses");
        map.insert(cookie, addrs, 0)
            .map_err(update(names::MAP_POD_ADDRS))?;
    }
    if maps.pod_config(cookie) != Some(entries.config) {
        missing.push("config");
        maps.pod_config
            .insert(cookie, entries.config, 0)
            .map_err(update(names::MAP_POD_CONFIG))?;
    }
    if missing.is_empty() {
        return Ok(None);
    }
    missing.dedup();
    Ok(Some(Repair {
        kind: RepairKind::MapEntries,
        what: format!(
            "map entries of netns cookie {cookie} missing or changed: {}",
            missing.join(", ")
        ),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_indexed_by_kind() {
        for (i, kind) in RepairKind::ALL.into_iter().enumerate() {
            assert_eq!(kind as usize, i, "{kind:?} counts in its own slot");
        }
        let labels: std::collections::BTreeSet<_> =
            RepairKind::ALL.iter().map(|k| k.label()).collect();
        assert_eq!(labels.len(), RepairKind::ALL.len(), "labels are distinct");
    }
}
