//! The installer itself: one-shot passes (install, patch, clean up) and the status the agent's
//! readiness probe reads. The watch loop that drives the passes lives in `watch`.

use std::{
    collections::HashMap,
    fs, io,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, MutexGuard, PoisonError},
};

use tracing::{debug, error, info, warn};

use crate::{
    config::InstallerConfig,
    conflist::{self, ConfKind, FileState},
    error::{ConfigError, InstallError, Malformed},
    fsutil,
    json::Json,
    kubeconfig,
};

/// Mode of a config file we create when the original's cannot be read.
const DEFAULT_CONF_MODE: u32 = 0o644;
/// Mode of the installed plugin binary.
const BINARY_MODE: u32 = 0o755;
/// A stand-alone config left by Linkerd releases that ran the plugin in "interface mode".
/// It would be picked before the primary CNI's config, so it is removed at install, as
/// Linkerd's own installer does.
pub const LEGACY_CONF_NAME: &str = "01-linkerd-cni.conf";

/// How many times the installer has written each kind of file since it started (our own
/// writes only; useful as metrics and to prove the watch loop does not spin).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteCounts {
    /// Conflist writes (patches, conversions and cleanup rewrites).
    pub conflists: u64,
    /// Kubeconfig writes.
    pub kubeconfig: u64,
    /// Plugin binary copies.
    pub binary: u64,
}

/// A snapshot of what is on disk now, for the readiness probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    /// The plugin binary is in the host bin dir and executable.
    pub binary_installed: bool,
    /// The kubeconfig is in the net dir.
    pub kubeconfig_written: bool,
    /// Every `.conf`/`.conflist` in the net dir (regular files), sorted, with its state.
    pub files: Vec<(PathBuf, FileState)>,
    /// Our writes so far.
    pub writes: WriteCounts,
}

impl Status {
    /// At least one usable config, and every usable config carries our entry last.
    /// Malformed files are not counted: the runtime cannot use them either.
    pub fn plugin_in_every_conflist(&self) -> bool {
        self.files.iter().any(|(_, s)| *s == FileState::Patched)
            && !self.files.iter().any(|(_, s)| *s == FileState::Unpatched)
    }

    /// Binary, kubeconfig and every conflist in place: pods created now get the plugin.
    pub fn ready(&self) -> bool {
        self.binary_installed && self.kubeconfig_written && self.plugin_in_every_conflist()
    }

    /// The files left alone, and why.
    pub fn malformed(&self) -> impl Iterator<Item = (&Path, &Malformed)> {
        self.files.iter().filter_map(|(p, s)| match s {
            FileState::Malformed(m) => Some((p.as_path(), m)),
            _ => None,
        })
    }
}

/// What happened to one file in a pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileOutcome {
    /// Written (patched, or converted to the given `.conflist`).
    Written(PathBuf),
    /// Already carries our entry.
    AlreadyPatched,
    /// Exactly the bytes we wrote last: our own write coming back through the watch.
    OwnWrite,
    /// Left alone, for this reason.
    Malformed(Malformed),
    /// Gone before it could be read.
    Vanished,
    /// Not a CNI config (our kubeconfig, a temp file, another extension, not a regular file).
    Ignored,
}

/// The result of patching every config in the net dir.
#[derive(Debug, Default)]
pub struct PassReport {
    /// Each config looked at, sorted by path, and what happened to it.
    pub files: Vec<(PathBuf, FileOutcome)>,
    /// Files that could not be read or written.
    pub errors: Vec<InstallError>,
}

impl PassReport {
    /// Whether some usable config exists (patched now or before).
    pub fn found_config(&self) -> bool {
        self.files.iter().any(|(_, o)| {
            matches!(
                o,
                FileOutcome::Written(_) | FileOutcome::AlreadyPatched | FileOutcome::OwnWrite
            )
        })
    }
}

#[derive(Default)]
struct State {
    /// Per config path, the bytes it held after our last write or check.
    known: HashMap<PathBuf, Vec<u8>>,
    /// Per config path, the malformed contents last reported (each is reported once).
    reported: HashMap<PathBuf, Vec<u8>>,
    writes: WriteCounts,
}

struct Inner {
    cfg: InstallerConfig,
    entry: Json,
    state: Mutex<State>,
    /// Serialises passes: the watch loop and a direct call never interleave writes.
    pass: Mutex<()>,
}

/// The node installer. Cheap to clone; clones share state, so the agent can keep one for
/// [`status`](Self::status) while another runs [`run`](Self::run).
#[derive(Clone)]
pub struct Installer {
    inner: Arc<Inner>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves maps that are still consistent (each update is a
    // single insert or remove), so a poisoned lock is safe to keep using.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Installer {
    /// Checks the configuration and builds our plugin entry. Touches nothing on disk.
    pub fn new(cfg: InstallerConfig) -> Result<Self, ConfigError> {
        cfg.validate()?;
        let entry = cfg.plugin_entry()?;
        Ok(Self {
            inner: Arc::new(Inner {
                cfg,
                entry,
                state: Mutex::default(),
                pass: Mutex::new(()),
            }),
        })
    }

    /// The configuration in use.
    pub fn config(&self) -> &InstallerConfig {
        &self.inner.cfg
    }

    /// The `linkerd-cni` entry appended to every conflist.
    pub fn plugin_entry(&self) -> &Json {
        &self.inner.entry
    }

    /// Installs everything once: removes the legacy stand-alone config, copies the binary,
    /// writes the kubeconfig, patches every config present. Without any config yet this
    /// succeeds with an empty report: [`run`](Self::run) then waits for one.
    ///
    /// Errors on the binary or the kubeconfig are returned (the plugin cannot work without
    /// them, and no config is patched); per-file problems are in the report.
    pub fn install_once(&self) -> Result<PassReport, InstallError> {
        let _pass = lock(&self.inner.pass);
        let net_dir = self.inner.cfg.net_dir();
        fs::create_dir_all(&net_dir).map_err(InstallError::io("creating", &net_dir))?;
        let legacy = net_dir.join(LEGACY_CONF_NAME);
        if fsutil::remove_if_exists(&legacy).map_err(InstallError::io("removing", &legacy))? {
            info!(path = %legacy.display(), "removed the legacy stand-alone linkerd-cni config");
        }
        self.install_binary_locked()?;
        self.write_kubeconfig_locked()?;
        let report = self.patch_all_locked();
        if !report.found_config() {
            info!(dir = %net_dir.display(), "no primary CNI config yet; waiting for one");
        }
        Ok(report)
    }

    /// Copies the plugin binary into the host bin dir (temp file, fsync, chmod 0755, rename).
    pub fn install_binary(&self) -> Result<(), InstallError> {
        let _pass = lock(&self.inner.pass);
        self.install_binary_locked()
    }

    fn install_binary_locked(&self) -> Result<(), InstallError> {
        let cfg = &self.inner.cfg;
        let dest = cfg.binary_path();
        self.counted(
            |w| &mut w.binary,
            || fsutil::copy_atomic(&cfg.plugin_source, &dest, BINARY_MODE),
        )
        .map_err(InstallError::io("copying the plugin binary to", &dest))?;
        info!(from = %cfg.plugin_source.display(), to = %dest.display(), "installed the plugin binary");
        Ok(())
    }

    /// Writes the kubeconfig if its contents or mode differ from what they should be.
    /// Returns whether it wrote.
    pub fn write_kubeconfig(&self) -> Result<bool, InstallError> {
        let _pass = lock(&self.inner.pass);
        self.write_kubeconfig_locked()
    }

    fn write_kubeconfig_locked(&self) -> Result<bool, InstallError> {
        let cfg = &self.inner.cfg;
        let path = cfg.kubeconfig_path();
        let want = kubeconfig::render(cfg)?;
        let current = fsutil::read_if_exists(&path).map_err(InstallError::io("reading", &path))?;
        let mode_ok = fs::metadata(&path)
            .is_ok_and(|m| m.permissions().mode() & 0o7777 == cfg.kubeconfig_mode);
        if current.as_deref() == Some(&want[..]) && mode_ok {
            return Ok(false);
        }
        self.counted(
            |w| &mut w.kubeconfig,
            || fsutil::write_atomic(&path, &want, cfg.kubeconfig_mode),
        )
        .map_err(InstallError::io("writing", &path))?;
        info!(path = %path.display(), "wrote the plugin kubeconfig");
        Ok(true)
    }

    /// Patches every `.conf`/`.conflist` in the net dir. Never fails as a whole.
    pub fn patch_all(&self) -> PassReport {
        let _pass = lock(&self.inner.pass);
        self.patch_all_locked()
    }

    fn patch_all_locked(&self) -> PassReport {
        let mut report = PassReport::default();
        match self.config_files() {
            Ok(paths) => {
                for path in paths {
                    match self.patch_file_locked(&path) {
                        Ok(outcome) => report.files.push((path, outcome)),
                        Err(e) => {
                            error!(error = %e, "patching a CNI config failed");
                            report.errors.push(e);
                        }
                    }
                }
            }
            Err(e) => {
                error!(error = %e, "listing the CNI net dir failed");
                report.errors.push(e);
            }
        }
        report
    }

    /// Patches one file (by its path in the net dir) if it needs it.
    pub fn patch_file(&self, path: &Path) -> Result<FileOutcome, InstallError> {
        let _pass = lock(&self.inner.pass);
        self.patch_file_locked(path)
    }

    pub(crate) fn patch_file_locked(&self, path: &Path) -> Result<FileOutcome, InstallError> {
        if !self.is_config_name(path) {
            return Ok(FileOutcome::Ignored);
        }
        match fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_file() => {}
            Ok(_) => return Ok(FileOutcome::Ignored),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(self.forget(path)),
            Err(e) => return Err(InstallError::io("reading", path)(e)),
        }
        let Some(bytes) =
            fsutil::read_if_exists(path).map_err(InstallError::io("reading", path))?
        else {
            return Ok(self.forget(path));
        };
        if lock(&self.inner.state).known.get(path) == Some(&bytes) {
            return Ok(FileOutcome::OwnWrite);
        }
        match conflist::patch(path, &bytes, &self.inner.entry) {
            Err(m) => {
                let mut state = lock(&self.inner.state);
                state.known.remove(path);
                if state.reported.get(path) != Some(&bytes) {
                    error!(path = %path.display(), reason = %m, "leaving a CNI config alone: it cannot be patched");
                    state.reported.insert(path.to_path_buf(), bytes);
                }
                Ok(FileOutcome::Malformed(m))
            }
            Ok(None) => {
                let mut state = lock(&self.inner.state);
                state.reported.remove(path);
                state.known.insert(path.to_path_buf(), bytes);
                debug!(path = %path.display(), "already patched");
                Ok(FileOutcome::AlreadyPatched)
            }
            Ok(Some(p)) => {
                let mode = file_mode(path);
                self.counted(
                    |w| &mut w.conflists,
                    || fsutil::write_atomic(&p.path, &p.bytes, mode),
                )
                .map_err(InstallError::io("writing", &p.path))?;
                {
                    let mut state = lock(&self.inner.state);
                    state.reported.remove(path);
                    state.known.insert(p.path.clone(), p.bytes);
                }
                if let Some(old) = &p.remove {
                    fsutil::remove_if_exists(old).map_err(InstallError::io("removing", old))?;
                    self.forget(old);
                    info!(from = %old.display(), to = %p.path.display(), "converted a CNI config to a plugin list with linkerd-cni");
                } else {
                    info!(path = %p.path.display(), "added linkerd-cni to a CNI plugin list");
                }
                Ok(FileOutcome::Written(p.path))
            }
        }
    }

    /// Runs a write, counting it *before* it becomes visible (and uncounting it if it fails),
    /// so whoever sees the new file also sees the count include it.
    fn counted(
        &self,
        counter: fn(&mut WriteCounts) -> &mut u64,
        write: impl FnOnce() -> io::Result<()>,
    ) -> io::Result<()> {
        *counter(&mut lock(&self.inner.state).writes) += 1;
        let result = write();
        if result.is_err() {
            *counter(&mut lock(&self.inner.state).writes) -= 1;
        }
        result
    }

    fn forget(&self, path: &Path) -> FileOutcome {
        let mut state = lock(&self.inner.state);
        state.known.remove(path);
        state.reported.remove(path);
        FileOutcome::Vanished
    }

    /// Whether `path` names a CNI config of the net dir (not our kubeconfig, not a temp file).
    pub(crate) fn is_config_name(&self, path: &Path) -> bool {
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            return false;
        };
        name != self.inner.cfg.kubeconfig_file_name
            && !fsutil::is_temp_name(name)
            && ConfKind::of(path).is_some()
    }

    /// The CNI configs in the net dir (regular files only, as Linkerd's `find -type f`), sorted.
    fn config_files(&self) -> Result<Vec<PathBuf>, InstallError> {
        let dir = self.inner.cfg.net_dir();
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(InstallError::io("listing", &dir)(e)),
        };
        let mut paths: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .map(|e| e.path())
            .filter(|p| self.is_config_name(p))
            .collect();
        paths.sort();
        Ok(paths)
    }

    /// Whether the plugin binary is in the host bin dir and executable.
    pub fn binary_present(&self) -> bool {
        fs::metadata(self.inner.cfg.binary_path())
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    }

    /// What is on disk now. Reads the net dir (a few small files); writes nothing.
    pub fn status(&self) -> Status {
        let cfg = &self.inner.cfg;
        let binary_installed = self.binary_present();
        let kubeconfig_written =
            fs::metadata(cfg.kubeconfig_path()).is_ok_and(|m| m.is_file() && m.len() > 0);
        let files = self
            .config_files()
            .unwrap_or_default()
            .into_iter()
            .filter_map(|p| {
                let bytes = fsutil::read_if_exists(&p).ok().flatten()?;
                let state = conflist::state(&p, &bytes, &self.inner.entry);
                Some((p, state))
            })
            .collect();
        Status {
            binary_installed,
            kubeconfig_written,
            files,
            writes: lock(&self.inner.state).writes,
        }
    }

    /// Our writes so far.
    pub fn write_counts(&self) -> WriteCounts {
        lock(&self.inner.state).writes
    }

    /// Undoes the installation: removes every linkerd-cni entry from every config (the rest of
    /// each plugin list stays exactly as it was; a `.conf` converted at install stays a
    /// `.conflist` of its one plugin), then deletes the kubeconfig and the binary. Tries every
    /// step and returns the first error.
    pub fn cleanup(&self) -> Result<(), InstallError> {
        let _pass = lock(&self.inner.pass);
        let mut first_error = None;
        let mut fail = |e: InstallError| {
            error!(error = %e, "cleanup step failed");
            first_error.get_or_insert(e);
        };
        match self.config_files() {
            Ok(paths) => {
                for path in paths {
                    if let Err(e) = self.unpatch_file_locked(&path) {
                        fail(e);
                    }
                }
            }
            Err(e) => fail(e),
        }
        let cfg = &self.inner.cfg;
        for (what, path) in [
            ("kubeconfig", cfg.kubeconfig_path()),
            ("plugin binary", cfg.binary_path()),
        ] {
            match fsutil::remove_if_exists(&path) {
                Ok(true) => info!(path = %path.display(), "removed the {what}"),
                Ok(false) => {}
                Err(e) => fail(InstallError::io("removing", &path)(e)),
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    fn unpatch_file_locked(&self, path: &Path) -> Result<(), InstallError> {
        let Some(bytes) =
            fsutil::read_if_exists(path).map_err(InstallError::io("reading", path))?
        else {
            return Ok(());
        };
        match conflist::unpatch(&bytes, &self.inner.entry) {
            Ok(None) => Ok(()),
            Ok(Some(restored)) => {
                self.counted(
                    |w| &mut w.conflists,
                    || fsutil::write_atomic(path, &restored, file_mode(path)),
                )
                .map_err(InstallError::io("writing", path))?;
                lock(&self.inner.state)
                    .known
                    .insert(path.to_path_buf(), restored);
                info!(path = %path.display(), "removed linkerd-cni from a CNI plugin list");
                Ok(())
            }
            Err(m) => {
                warn!(path = %path.display(), reason = %m, "cleanup left a CNI config alone");
                Ok(())
            }
        }
    }
}

/// The permission bits of `path`, kept when it is rewritten (Linkerd loses them).
fn file_mode(path: &Path) -> u32 {
    fs::metadata(path).map_or(DEFAULT_CONF_MODE, |m| m.permissions().mode() & 0o7777)
}
