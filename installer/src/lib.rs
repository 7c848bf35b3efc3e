//! The node installer of linkerd-cni: puts the plugin on the host and keeps it there.
//!
//! It does what Linkerd's `install-cni.sh` does, with the same environment variables
//! ([`InstallerConfig::from_env`]), minus its known bugs:
//! - copies the plugin binary into the host CNI bin dir (temp file, fsync, chmod 0755, rename);
//! - writes the plugin's kubeconfig into the net dir, mode 0600, and rewrites it when the
//!   service-account token rotates (the kubelet swaps the `..data` symlink);
//! - appends the `linkerd-cni` entry to every `.conf`/`.conflist` in the net dir (see
//!   [`conflist`] for the exact rules), atomically, leaving files it cannot parse untouched;
//! - watches the net dir and re-patches within a second when another CNI rewrites its file,
//!   without reacting to its own writes;
//! - on shutdown removes its entry from every conflist, the kubeconfig and the binary.
//!
//! The agent drives it:
//!
//! ```no_run
//! # async fn agent(shutdown: impl std::future::Future<Output = ()>) -> Result<(), Box<dyn std::error::Error>> {
//! use linkerd_cni_installer::{Installer, InstallerConfig};
//! let installer = Installer::new(InstallerConfig::from_env()?)?;
//! let probe = installer.clone(); // readiness: probe.status().ready()
//! installer.run(shutdown).await?; // install, watch, clean up when `shutdown` completes
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]

pub mod config;
pub mod conflist;
mod error;
mod fsutil;
mod installer;
pub mod json;
pub mod kubeconfig;
mod watch;

pub use config::{InstallerConfig, KUBECONFIG_PLACEHOLDER};
pub use conflist::{FileState, PLUGIN_TYPE};
pub use error::{ConfigError, InstallError, Malformed};
pub use installer::{FileOutcome, Installer, LEGACY_CONF_NAME, PassReport, Status, WriteCounts};
pub use watch::{MAX_DELAY, QUIET, RESYNC};
