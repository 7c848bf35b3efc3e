//! `linkerd-cni-agent uninstall`: takes linkerd-cni off a node for good, whatever the last
//! agent managed to do (it may have been SIGKILLed, or unable to ask the API whether its
//! DaemonSet was being deleted).
//!
//! In order, on each pass:
//! 1. nothing is touched while an agent answers on the registration socket (a DaemonSet still
//!    there, or one being reinstalled): that agent owns the state;
//! 2. the plugin leaves the node (unless `keep_plugin`): its entry in every conflist, its
//!    kubeconfig and its binary, as the installer removes them (new meshed pods then start as
//!    the control plane injected them, without us);
//! 3. the pinned links of pods that have ended are removed: a pod whose inbound link the kernel
//!    reports detached (it detaches it when it destroys the pod's network namespace). The
//!    kernel's view, not the registry's paths: a mount missing from this container can never
//!    make a running pod look ended. (An inbound link detached by hand, `bpftool link detach`,
//!    while no agent runs to repair it, is taken for an ended pod);
//! 4. while any pod's link still acts on a running pod, everything else stays: that pod keeps
//!    its redirection (and the maps and programs it runs) until it ends, so its traffic never
//!    goes past its proxy. The pass reports those pods;
//! 5. once none is left: the shared attachment's links are detached, and what the agent made
//!    in the pin root (maps, programs, links, a migration's staged maps) is unpinned, which
//!    frees every program and map of ours; then the registry's records, the socket, and each
//!    of their directories that linkerd-cni made ([`owned`]) once nothing else is in it. A
//!    bpffs that `mount-bpffs` mounted (its marker present) and that holds nothing else is
//!    unmounted.
//!
//! Only what linkerd-cni made goes: a directory without our marker is never removed nor
//! emptied, another component's file in one of ours stays (with the directory), and a pass
//! refuses to start when a configured path lies inside another component's tree
//! ([`paths::check_node_paths`]). The [`Removal`] says what went and what stayed, and why.
//!
//! Every step is idempotent: a pass on a clean node changes nothing.

use linkerd_cni_sys::bpf;
use std::{
    fs, io,
    os::unix::fs::FileTypeExt,
    path::{Path, PathBuf},
    time::Duration,
};

use linkerd_cni_common::{names, paths};

pub use crate::host::owned::Removal;
use crate::{
    agent::{pod_link_dir, registry::Registry},
    dataplane,
    host::owned,
};

/// Where the node's state is, as this process sees it.
#[derive(Clone, Debug)]
pub struct Options {
    pub pin_root: PathBuf,
    pub state_dir: PathBuf,
    pub socket: PathBuf,
    /// The bpffs mount point (`mount-bpffs`'s).
    pub bpffs: PathBuf,
    /// Where this process sees the host's root (`/host` in the clean-up DaemonSet), for the
    /// check of the paths above against other components' trees.
    pub host_root: Option<PathBuf>,
    /// The installer's configuration (conflists, kubeconfig, binary); `None` leaves the plugin
    /// in place (`--keep-plugin`: the way back to Linkerd's own plugin, which has the same
    /// type and file names).
    pub installer: Option<linkerd_cni_installer::InstallerConfig>,
}

/// What a pass found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing of ours is left on the node.
    Clean,
    /// An agent answers on the socket: nothing was touched.
    AgentRunning,
    /// Pods still redirected by us (their pod names when the registry knows them, else their
    /// link directories): their links, and the maps and programs, stay until they end.
    PodsRunning(Vec<String>),
}

/// Why a pass failed.
#[derive(Debug, thiserror::Error)]
pub enum UninstallError {
    #[error("removing the plugin from the CNI configs: {0}")]
    Installer(#[from] linkerd_cni_installer::InstallError),
    #[error("the installer's configuration: {0}")]
    Config(#[from] linkerd_cni_installer::ConfigError),
    /// A configured path lies inside another component's tree: nothing is touched.
    #[error("refusing to uninstall: {0}")]
    Path(#[from] paths::PathConflict),
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> UninstallError {
    let path = path.to_path_buf();
    move |source| UninstallError::Io { what, path, source }
}

/// The directory `mount-bpffs` creates in a bpffs it mounted itself: the uninstall unmounts
/// only such a bpffs (never one the host mounted), and only once it holds nothing else. (bpffs
/// refuses names that start with a dot.)
pub const MOUNTED_MARKER: &str = "linkerd-cni-mounted";

/// What the kernel puts in every bpffs it mounts (`bpf_preload`'s iterators), not a user of it.
const KERNEL_ENTRIES: [&str; 2] = ["maps.debug", "progs.debug"];

/// One pass (see the module's documentation).
pub fn pass(opts: &Options) -> Result<Outcome, UninstallError> {
    pass_report(opts).map(|(outcome, _)| outcome)
}

/// One pass, with what it removed and what it left (empty unless [`Outcome::Clean`]).
pub fn pass_report(opts: &Options) -> Result<(Outcome, Removal), UninstallError> {
    paths::check_node_paths(&paths::NodePaths {
        socket: &opts.socket,
        state_dir: &opts.state_dir,
        pin_root: &opts.pin_root,
        bpffs: &opts.bpffs,
        host_root: opts.host_root.as_deref(),
    })?;
    let mut removal = Removal::default();
    if std::os::unix::net::UnixStream::connect(&opts.socket).is_ok() {
        return Ok((Outcome::AgentRunning, removal));
    }
    if let Some(cfg) = &opts.installer {
        linkerd_cni_installer::Installer::new(cfg.clone())?.cleanup()?;
    }
    // A pin root without our marker is not ours: nothing under it is detached or unpinned.
    let pins_ours = owned::is_owned(&opts.pin_root);
    if pins_ours {
        let running = remove_ended_pods(opts)?;
        if !running.is_empty() {
            return Ok((Outcome::PodsRunning(running), removal));
        }
        remove_pins(&opts.pin_root, &mut removal)?;
    }
    removal
        .dir_if_ours_and_empty(&opts.pin_root)
        .map_err(io_err("removing", &opts.pin_root))?;
    remove_registry(&opts.state_dir, &mut removal)?;
    removal
        .file(&opts.socket, |t| t.is_socket(), "a socket")
        .map_err(io_err("removing", &opts.socket))?;
    let mut dirs: Vec<&Path> = [opts.state_dir.as_path()]
        .into_iter()
        .chain(opts.state_dir.parent())
        .chain(opts.socket.parent())
        .collect();
    dirs.dedup();
    for dir in dirs {
        // Ours and empty: it goes; anything else stays, with the reason (a mount point is
        // never empty of our marker... and `remove_dir` refuses one anyway).
        removal
            .dir_if_ours_and_empty(dir)
            .map_err(io_err("removing", dir))?;
    }
    unmount_own_bpffs(&opts.bpffs)?;
    Ok((Outcome::Clean, removal))
}

/// Removes the registry's records (`<id>.json`, and `<id>.json.tmp` a write cut short left)
/// from `dir` when linkerd-cni made it; says so when there is none, or leaves it when it is
/// not ours.
fn remove_registry(dir: &Path, removal: &mut Removal) -> Result<(), UninstallError> {
    if !dir.is_dir() {
        removal.absent.push(format!(
            "no registry at {} (an agent run with another --state-dir keeps its registry there: \
             pass the same --state-dir)",
            dir.display()
        ));
        return Ok(());
    }
    if !owned::is_owned(dir) {
        return Ok(()); // Reported by `dir_if_ours_and_empty` with the reason.
    }
    let mut records = 0;
    for entry in fs::read_dir(dir).map_err(io_err("reading", dir))? {
        let entry = entry.map_err(io_err("reading", dir))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let is_file = entry.file_type().is_ok_and(|t| t.is_file());
        let mode_file = name == paths::MODE_FILE;
        if is_file && (name.ends_with(".json") || name.ends_with(".json.tmp") || mode_file) {
            fs::remove_file(entry.path()).map_err(io_err("removing", &entry.path()))?;
            records += usize::from(!mode_file);
        }
    }
    if records > 0 {
        removal
            .removed
            .push(format!("{records} pod record(s) in {}", dir.display()));
    }
    Ok(())
}

/// Removes the link directories of ended pods; returns the pods still redirected.
fn remove_ended_pods(opts: &Options) -> Result<Vec<String>, UninstallError> {
    let pods = opts.pin_root.join(paths::PIN_PODS);
    let entries = match fs::read_dir(&pods) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err("reading", &pods)(e)),
    };
    let mut running = Vec::new();
    for entry in entries {
        let dir = entry.map_err(io_err("reading", &pods))?.path();
        if acts_on_a_running_pod(&dir).map_err(io_err("reading the links in", &dir))? {
            running.push(dir);
        } else {
            dataplane::detach(&dir).map_err(io_err("unpinning the links in", &dir))?;
        }
    }
    if running.is_empty() {
        return Ok(Vec::new());
    }
    // Named from the registry where it knows them (never made here: `open` would create it).
    let registry = match opts.state_dir.is_dir() {
        true => Registry::open(&opts.state_dir).ok(),
        false => None,
    };
    let names: std::collections::HashMap<PathBuf, String> = registry
        .map(|r| {
            r.map_each(|rec| {
                let name = rec
                    .pod
                    .as_ref()
                    .map_or_else(|| rec.id.clone(), |p| format!("{}/{}", p.namespace, p.name));
                (pod_link_dir(&opts.pin_root, &rec.id), name)
            })
            .into_iter()
            .collect()
        })
        .unwrap_or_default();
    Ok(running
        .into_iter()
        .map(|dir| {
            names
                .get(&dir)
                .cloned()
                .unwrap_or_else(|| dir.display().to_string())
        })
        .collect())
}

/// Whether the pod whose links are pinned in `dir` still runs, as the kernel says: its
/// inbound (netns) link is still attached, i.e. its network namespace exists (the kernel
/// detaches that link when it destroys the namespace, which it does only once no process of
/// the pod is left in it). Its cgroup links may outlive it (a pod cgroup is removed after the
/// pod). Without an inbound link (a registration cut short), any attached link counts. An
/// error (no `CAP_BPF`, say) is reported, never taken for "ended".
fn acts_on_a_running_pod(dir: &Path) -> io::Result<bool> {
    let attached = |path: &Path| -> io::Result<Option<bool>> {
        match bpf::obj_get(path) {
            Ok(link) => Ok(Some(bpf::link_info(&link)?.target != 0)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    };
    if let Some(attached) = attached(&dir.join(names::PROG_SK_LOOKUP))? {
        return Ok(attached);
    }
    for entry in fs::read_dir(dir)? {
        if attached(&entry?.path())? == Some(true) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Detaches the shared attachment's links and unpins what the agent made under `pin_root`
/// (ours: [`owned`]): its subdirectories ([`paths::PIN_DIRS`], [`paths::PIN_NEXT`]), never
/// another entry.
fn remove_pins(pin_root: &Path, removal: &mut Removal) -> Result<(), UninstallError> {
    let shared = pin_root.join(paths::PIN_SHARED);
    dataplane::detach(&shared).map_err(io_err("detaching the shared links in", &shared))?;
    let pods = pin_root.join(paths::PIN_PODS);
    if let Ok(entries) = fs::read_dir(&pods) {
        for dir in entries.flatten() {
            dataplane::detach(&dir.path()).map_err(io_err("unpinning the links in", &pods))?;
        }
    }
    for sub in paths::PIN_DIRS.iter().chain([&paths::PIN_NEXT]) {
        let dir = pin_root.join(sub);
        match fs::remove_dir_all(&dir) {
            Ok(()) => removal.removed.push(dir.display().to_string()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err("unpinning", &dir)(e)),
        }
    }
    Ok(())
}

/// Unmounts the bpffs at `bpffs` when `mount-bpffs` mounted it (its marker is there) and it
/// holds nothing but the marker.
fn unmount_own_bpffs(bpffs: &Path) -> Result<(), UninstallError> {
    let marker = bpffs.join(MOUNTED_MARKER);
    if !marker.is_dir() || !crate::host::kernel::on_bpffs(bpffs).unwrap_or(false) {
        return Ok(());
    }
    let others = fs::read_dir(bpffs)
        .map_err(io_err("reading", bpffs))?
        .flatten()
        .any(|e| {
            let name = e.file_name();
            name != MOUNTED_MARKER && !KERNEL_ENTRIES.iter().any(|k| name == *k)
        });
    if others {
        tracing::info!(bpffs = %bpffs.display(), "bpffs holds other pins: left mounted");
        return Ok(());
    }
    fs::remove_dir(&marker).map_err(io_err("removing", &marker))?;
    nix::mount::umount(bpffs)
        .map_err(|e| io_err("unmounting", bpffs)(io::Error::from_raw_os_error(e as i32)))?;
    tracing::info!(bpffs = %bpffs.display(), "unmounted the bpffs mount-bpffs had mounted");
    Ok(())
}

/// Runs passes until the node is clean (with `wait`, every `interval`, logging what it waits
/// for when that changes; without, once), then, with `stay`, until SIGTERM or SIGINT. Returns
/// the last outcome and what its pass removed and left; a SIGTERM or SIGINT while waiting ends
/// it early.
pub fn run(
    opts: &Options,
    wait: bool,
    stay: bool,
    interval: Duration,
) -> Result<(Outcome, Removal), UninstallError> {
    let signals = Signals::block();
    let mut said = None;
    let (outcome, removal) = loop {
        let (outcome, removal) = pass_report(opts)?;
        if said.as_ref() != Some(&outcome) {
            match &outcome {
                Outcome::Clean => tracing::info!(
                    removed = %removal.removed.join(", "),
                    left = %removal.left_lines().join("; "),
                    absent = %removal.absent.join("; "),
                    "linkerd-cni removed from this node: what it made is gone (removed), what \
                     it did not make stays (left)"
                ),
                Outcome::AgentRunning => tracing::warn!(
                    socket = %opts.socket.display(),
                    "an agent answers on its socket: nothing removed (delete the linkerd-cni \
                     DaemonSet first)"
                ),
                Outcome::PodsRunning(pods) => tracing::warn!(
                    pods = %pods.join(", "),
                    count = pods.len(),
                    "pods redirected by linkerd-cni still run: they keep their redirection until \
                     they end (restart them to finish the uninstall)"
                ),
            }
            said = Some(outcome.clone());
        }
        if outcome == Outcome::Clean || !wait {
            break (outcome, removal);
        }
        if signals.wait(interval) {
            return Ok((outcome, removal));
        }
    };
    if stay && outcome == Outcome::Clean {
        while !signals.wait(Duration::from_secs(3600)) {}
    }
    Ok((outcome, removal))
}

/// SIGTERM and SIGINT, blocked and waited for: the process may be PID 1 of a container, where
/// their default action does nothing.
struct Signals(nix::sys::signal::SigSet);

impl Signals {
    fn block() -> Self {
        use nix::sys::signal::{SigSet, Signal};
        let mut set = SigSet::empty();
        set.add(Signal::SIGTERM);
        set.add(Signal::SIGINT);
        let _ = set.thread_block();
        Self(set)
    }

    /// Waits up to `timeout`; whether a signal came.
    fn wait(&self, timeout: Duration) -> bool {
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: the set and timespec are valid for the call; no siginfo is asked for.
        let r = unsafe { libc::sigtimedwait(self.0.as_ref(), std::ptr::null_mut(), &ts) };
        r > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node layout in a scratch directory: nothing pinned (no bpf() call is made).
    fn scratch(name: &str) -> (PathBuf, Options) {
        let dir = std::env::temp_dir().join(format!("l5d-uninstall-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let run = dir.join("run/linkerd-cni");
        fs::create_dir_all(&dir).unwrap();
        // As the agent makes them (marked as ours).
        owned::create_dir_all(&run.join("pods")).unwrap();
        fs::write(run.join("pods/x.json"), "{}").unwrap();
        let opts = Options {
            pin_root: dir.join("bpf/linkerd-cni"),
            state_dir: run.join("pods"),
            socket: run.join("agent.sock"),
            bpffs: dir.join("bpf"),
            host_root: None,
            installer: None,
        };
        fs::create_dir_all(opts.bpffs.join(MOUNTED_MARKER)).unwrap();
        (dir, opts)
    }

    #[test]
    fn nothing_is_touched_while_an_agent_answers_on_the_socket() {
        let (dir, opts) = scratch("agent");
        let listener = std::os::unix::net::UnixListener::bind(&opts.socket).unwrap();
        assert_eq!(pass(&opts).unwrap(), Outcome::AgentRunning);
        assert!(opts.state_dir.join("x.json").exists() && opts.socket.exists());
        // A socket nobody serves any more is a dead agent's: the pass goes on.
        drop(listener);
        assert_eq!(pass(&opts).unwrap(), Outcome::Clean);
        assert!(!opts.socket.exists() && !opts.state_dir.exists());
        assert!(
            !dir.join("run/linkerd-cni").exists(),
            "its empty directory goes too"
        );
        // Not a bpffs: the marker is not ours to act on, nothing is unmounted.
        assert!(opts.bpffs.join(MOUNTED_MARKER).is_dir());
        // A second pass on the clean node changes nothing.
        assert_eq!(pass(&opts).unwrap(), Outcome::Clean);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_directory_holding_other_files_stays() {
        let (dir, opts) = scratch("other");
        fs::write(dir.join("run/linkerd-cni/not-ours"), "theirs").unwrap();
        let (outcome, removal) = pass_report(&opts).unwrap();
        assert_eq!(outcome, Outcome::Clean);
        assert!(!opts.state_dir.exists());
        assert_eq!(
            fs::read_to_string(dir.join("run/linkerd-cni/not-ours")).unwrap(),
            "theirs"
        );
        let left = removal.left_lines().join("\n");
        assert!(
            left.contains(&format!("{}", dir.join("run/linkerd-cni").display()))
                && left.contains("holds what linkerd-cni did not put there: not-ours"),
            "{left}"
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    /// A registry in a directory linkerd-cni did not make (no marker): neither its records
    /// nor the directory go, and the pass says so.
    #[test]
    fn a_directory_it_did_not_make_is_never_emptied() {
        let (dir, opts) = scratch("foreign");
        fs::remove_dir(opts.state_dir.join(paths::OWNED_MARKER)).unwrap();
        fs::write(opts.state_dir.join("secret.json"), "theirs").unwrap();
        let (outcome, removal) = pass_report(&opts).unwrap();
        assert_eq!(outcome, Outcome::Clean);
        assert_eq!(
            fs::read_to_string(opts.state_dir.join("secret.json")).unwrap(),
            "theirs"
        );
        let left = removal.left_lines().join("\n");
        assert!(left.contains("not made by linkerd-cni"), "{left}");
        fs::remove_dir_all(&dir).unwrap();
    }

    /// A socket path in kubelet's tree: the pass refuses before touching anything.
    #[test]
    fn paths_inside_another_components_tree_are_refused() {
        let (dir, mut opts) = scratch("kubelet");
        opts.host_root = Some(dir.clone());
        opts.socket = dir.join("var/lib/kubelet/agent.sock");
        let err = pass(&opts).expect_err("refused");
        assert!(
            err.to_string()
                .contains("inside /var/lib/kubelet (owned by kubelet)"),
            "{err}"
        );
        assert!(opts.state_dir.join("x.json").exists(), "nothing touched");
        fs::remove_dir_all(&dir).unwrap();
    }
}
