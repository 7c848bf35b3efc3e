//! The installer's errors.

use std::{io, path::PathBuf};

/// A setting that is missing or unusable. Found before anything is written.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A required environment variable is unset or empty.
    #[error("{var} is not set")]
    Missing {
        /// The variable.
        var: &'static str,
    },
    /// An environment variable holds a value that cannot be used.
    #[error("{var}={value:?}: {reason}")]
    Invalid {
        /// The variable.
        var: &'static str,
        /// What it holds.
        value: String,
        /// What was expected.
        reason: &'static str,
    },
    /// Neither `CNI_NETWORK_CONFIG_FILE` (an existing file) nor `CNI_NETWORK_CONFIG` is set.
    #[error("no plugin config template: set CNI_NETWORK_CONFIG or CNI_NETWORK_CONFIG_FILE")]
    MissingTemplate,
    /// `CNI_NETWORK_CONFIG_FILE` exists but cannot be read.
    #[error("reading the plugin config template {path:?}: {source}")]
    TemplateRead {
        /// The file.
        path: PathBuf,
        /// The read error.
        source: io::Error,
    },
    /// The template is not JSON.
    #[error("the plugin config template is not valid JSON: {source}")]
    TemplateJson {
        /// The parse error.
        source: serde_json::Error,
    },
    /// The template is JSON but not a plugin entry.
    #[error("the plugin config template is not a plugin entry: {reason}")]
    TemplateShape {
        /// What is wrong with it.
        reason: &'static str,
    },
}

/// A failure to install, keep or remove a piece of the installation.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// The configuration is unusable.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A filesystem operation failed.
    #[error("{op} {path:?}: {source}")]
    Io {
        /// What was being done ("reading", "writing", "removing", ...).
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// The service-account token is missing, so no kubeconfig can be written.
    #[error(
        "no service-account token at {path:?} (is automountServiceAccountToken off?): {source}"
    )]
    Token {
        /// The token file.
        path: PathBuf,
        /// The read error.
        source: io::Error,
    },
    /// The inotify watches could not be set up.
    #[error("watching {path:?}: {source}")]
    Watch {
        /// The directory.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// A blocking pass panicked or was cancelled.
    #[error("installer task failed: {0}")]
    Task(String),
}

impl InstallError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io { op, path, source }
    }
}

/// Why a CNI config file was left alone. Reported in logs and in [`crate::Status`]; never fatal.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    /// Not valid JSON.
    #[error("not valid JSON: {0}")]
    Json(String),
    /// Valid JSON but not an object.
    #[error("not a JSON object")]
    NotObject,
    /// Neither a plugin (string `type`) nor a list (array `plugins`).
    #[error("neither a plugin config (\"type\") nor a plugin list (\"plugins\" array)")]
    NoPlugins,
    /// A `plugins` entry that is not an object with a string `type`.
    #[error("plugins[{0}] is not an object with a string \"type\"")]
    BadPlugin(usize),
    /// Only linkerd-cni entries: there is no primary CNI to chain after, and the installer never
    /// writes a stand-alone config.
    #[error("holds no plugin other than linkerd-cni")]
    NoPrimary,
}
