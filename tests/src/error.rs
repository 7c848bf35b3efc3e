//! The error type of the test-support library.

use std::{io, process::ExitStatus, time::Duration};

/// What can go wrong while building or tearing down a test environment.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A system call or file operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// An external command (`ip`, `iptables`, ...) exited unsuccessfully.
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        /// The command line.
        command: String,
        /// How it exited.
        status: ExitStatus,
        /// What it wrote to stderr.
        stderr: String,
    },
    /// A child process or a condition did not finish in time.
    #[error("{what} did not finish within {timeout:?}{}", detail_suffix(.detail))]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long we waited.
        timeout: Duration,
        /// Diagnostics gathered at the deadline (a child's stderr, the last state seen).
        detail: String,
    },
    /// A child's output or a log line could not be parsed.
    #[error("cannot parse {what}: {detail}")]
    Parse {
        /// What was being parsed.
        what: String,
        /// Why it failed, with the offending text.
        detail: String,
    },
    /// The environment lacks something the support code needs (a binary, a mount).
    #[error("{0}")]
    Missing(String),
}

fn detail_suffix(detail: &str) -> String {
    if detail.is_empty() {
        String::new()
    } else {
        format!(": {detail}")
    }
}

impl Error {
    /// Wraps an I/O error with what was being done.
    pub fn io(context: impl Into<String>, source: io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// The OS error number behind this error, if there is one.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            Error::Io { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

impl From<nix::Error> for Error {
    fn from(e: nix::Error) -> Self {
        Error::io("system call", io::Error::from(e))
    }
}

/// The result type of the test-support library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Adds context to `io::Result`s.
pub(crate) trait IoContext<T> {
    /// Wraps the error with a lazily built description of what was being done.
    fn ctx<S: Into<String>>(self, f: impl FnOnce() -> S) -> Result<T>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn ctx<S: Into<String>>(self, f: impl FnOnce() -> S) -> Result<T> {
        self.map_err(|e| Error::io(f(), e))
    }
}
