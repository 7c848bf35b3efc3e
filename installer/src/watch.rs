//! The watch loop: inotify on the CNI net dir and the service-account dir, debounced passes,
//! a periodic full resync, cleanup on shutdown.
//!
//! Loop safety: a file is re-patched only when its bytes differ from what the installer last
//! wrote or checked, and a patched file is a fixed point of the patch, so our own writes never
//! cause more writes. Events are gathered until [`QUIET`] passes without one, or [`MAX_DELAY`]
//! after the first, then each touched file is looked at once. Another writer rewriting a file
//! in a tight loop therefore costs at most one pass per [`QUIET`] period, and never less than
//! one pass per [`MAX_DELAY`] (so the entry is back well within a second).

use std::{
    collections::BTreeSet,
    ffi::OsStr,
    future::Future,
    path::{Path, PathBuf},
    time::Duration,
};

use futures_util::StreamExt as _;
use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask};
use tokio::time::{Instant, MissedTickBehavior};
use tracing::{Instrument as _, debug, error, info, info_span, warn};

use crate::{error::InstallError, installer::Installer};

/// A pass runs once no event came for this long...
pub const QUIET: Duration = Duration::from_millis(50);
/// ...or this long after the first event of a burst, whichever comes first.
pub const MAX_DELAY: Duration = Duration::from_millis(300);
/// Everything is checked again this often, in case an event was lost.
pub const RESYNC: Duration = Duration::from_secs(30);

/// Service-account entries whose change means the token or CA changed: the kubelet's atomic
/// writer swaps the `..data` symlink; a non-projected volume would replace the files.
const SA_TRIGGERS: [&str; 3] = ["..data", "token", "ca.crt"];

struct Watches {
    net_dir: PathBuf,
    net: WatchDescriptor,
    sa: Option<WatchDescriptor>,
    stream: inotify::EventStream<Vec<u8>>,
}

impl Watches {
    fn new(installer: &Installer) -> Result<Self, InstallError> {
        let cfg = installer.config();
        let net_dir = cfg.net_dir();
        let err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| InstallError::Watch { path, source }
        };
        std::fs::create_dir_all(&net_dir).map_err(InstallError::io("creating", &net_dir))?;
        let inotify = Inotify::init().map_err(err(&net_dir))?;
        let net = inotify
            .watches()
            .add(
                &net_dir,
                WatchMask::CREATE
                    | WatchMask::MODIFY
                    | WatchMask::CLOSE_WRITE
                    | WatchMask::MOVED_TO
                    | WatchMask::MOVED_FROM
                    | WatchMask::DELETE,
            )
            .map_err(err(&net_dir))?;
        let sa_dir = &cfg.service_account_dir;
        let sa = match inotify.watches().add(
            sa_dir,
            WatchMask::MOVED_TO | WatchMask::CREATE | WatchMask::CLOSE_WRITE,
        ) {
            Ok(wd) => Some(wd),
            Err(e) => {
                warn!(dir = %sa_dir.display(), error = %e, "cannot watch the service-account dir; token rotation is picked up by the periodic resync only");
                None
            }
        };
        let stream = inotify
            .into_event_stream(vec![0u8; 16 * 1024])
            .map_err(err(&net_dir))?;
        Ok(Self {
            net_dir,
            net,
            sa,
            stream,
        })
    }
}

/// What a burst of events asks for.
#[derive(Default)]
struct Pending {
    files: BTreeSet<PathBuf>,
    kubeconfig: bool,
    everything: bool,
    first: Option<Instant>,
    last: Option<Instant>,
}

impl Pending {
    fn due(&self) -> Option<Instant> {
        Some((self.last? + QUIET).min(self.first? + MAX_DELAY))
    }

    fn touch(&mut self, now: Instant) {
        self.first.get_or_insert(now);
        self.last = Some(now);
    }
}

impl Installer {
    /// Installs, then keeps the installation in place until `shutdown` completes, then
    /// [cleans up](Self::cleanup). Returns an error if the first install fails (binary or
    /// kubeconfig) or the watches cannot be set up; later problems are logged and retried.
    pub async fn run(&self, shutdown: impl Future<Output = ()>) -> Result<(), InstallError> {
        let span = info_span!("installer", net_dir = %self.config().net_dir().display());
        async {
            // Watch first, then install: a config created in between is not missed.
            let watches = Watches::new(self)?;
            self.blocking(|i| i.install_once()).await??;
            self.watch(watches, shutdown).await?;
            info!("shutting down: removing linkerd-cni from the host");
            self.blocking(|i| i.cleanup()).await?
        }
        .instrument(span)
        .await
    }

    /// Keeps the installation in place until `shutdown` completes, without the first install
    /// and without cleanup (for callers that do those themselves).
    pub async fn watch_until(
        &self,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), InstallError> {
        let watches = Watches::new(self)?;
        // Catch up with anything that changed before the watches existed.
        self.blocking(|i| i.patch_all()).await?;
        self.watch(watches, shutdown).await
    }

    async fn watch(
        &self,
        mut w: Watches,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), InstallError> {
        tokio::pin!(shutdown);
        let mut resync = tokio::time::interval_at(Instant::now() + RESYNC, RESYNC);
        resync.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut pending = Pending::default();
        let kubeconfig_name = self.config().kubeconfig_file_name.clone();
        loop {
            let due = pending.due();
            tokio::select! {
                biased;
                () = &mut shutdown => return Ok(()),
                // Before events: a writer that never stops must not starve the flush.
                () = tokio::time::sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => {
                    let work = std::mem::take(&mut pending);
                    self.flush(work).await?;
                }
                event = w.stream.next() => self.note(event, &w, &kubeconfig_name, &mut pending)?,
                _ = resync.tick() => {
                    self.flush(Pending { everything: true, kubeconfig: true, ..Pending::default() }).await?;
                }
            }
        }
    }

    /// Adds what one inotify event asks for to `pending`.
    fn note(
        &self,
        event: Option<std::io::Result<inotify::Event<std::ffi::OsString>>>,
        w: &Watches,
        kubeconfig_name: &str,
        pending: &mut Pending,
    ) -> Result<(), InstallError> {
        let event = match event {
            Some(Ok(e)) => e,
            Some(Err(source)) => {
                return Err(InstallError::Watch {
                    path: w.net_dir.clone(),
                    source,
                });
            }
            None => {
                return Err(InstallError::Watch {
                    path: w.net_dir.clone(),
                    source: std::io::Error::other("inotify stream ended"),
                });
            }
        };
        if event.mask.contains(EventMask::Q_OVERFLOW) {
            warn!("inotify queue overflowed; rechecking everything");
            pending.everything = true;
        } else if event.mask.contains(EventMask::IGNORED) {
            // Only if the directory itself is removed; a hostPath mount cannot come back
            // under a running pod anyway.
            warn!(?event.wd, "a watched directory went away; relying on the periodic resync");
            return Ok(());
        } else if let Some(name) = event.name.as_deref() {
            if event.wd == w.net && name == OsStr::new(kubeconfig_name) {
                // Someone else touched our kubeconfig (or it is our own write coming back):
                // compare and restore.
                pending.kubeconfig = true;
            } else if event.wd == w.net {
                let path = w.net_dir.join(name);
                if !self.is_config_name(&path) {
                    return Ok(());
                }
                debug!(file = %path.display(), mask = ?event.mask, "net dir event");
                pending.files.insert(path);
            } else if Some(&event.wd) == w.sa.as_ref()
                && SA_TRIGGERS.iter().any(|t| name == OsStr::new(t))
            {
                debug!(entry = ?name, "service-account volume changed");
                pending.kubeconfig = true;
            } else {
                return Ok(());
            }
        } else {
            return Ok(());
        }
        pending.touch(Instant::now());
        Ok(())
    }

    /// Does what a burst of events asked for.
    async fn flush(&self, work: Pending) -> Result<(), InstallError> {
        self.blocking(move |i| {
            if work.kubeconfig || work.everything {
                match i.write_kubeconfig() {
                    Ok(true) => info!("kubeconfig rewritten (token or CA changed)"),
                    Ok(false) => {}
                    Err(e) => error!(error = %e, "cannot rewrite the kubeconfig"),
                }
            }
            if work.everything {
                if !i.binary_present() {
                    warn!("the plugin binary disappeared; installing it again");
                    if let Err(e) = i.install_binary() {
                        error!(error = %e, "cannot reinstall the plugin binary");
                    }
                }
                i.patch_all();
            } else {
                for path in &work.files {
                    if let Err(e) = i.patch_file(path) {
                        error!(error = %e, "patching a CNI config failed");
                    }
                }
            }
        })
        .await
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Installer) -> T + Send + 'static,
    ) -> Result<T, InstallError> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || f(&this))
            .await
            .map_err(|e| InstallError::Task(e.to_string()))
    }
}
