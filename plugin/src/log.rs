//! A tiny stderr logger: one line per event, each `linkerd-cni: LEVEL container=.. namespace=..
//! pod=.. message`, so `journalctl -t kubelet | grep linkerd-cni:` finds them all. stdout is
//! reserved for the CNI result.

use std::{fmt, io::Write};

/// Log levels, least severe first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Debug,
    Info,
    Warn,
    Error,
}

impl Level {
    /// The config's `log_level`: `debug`, `info`; anything else (or nothing) means warn, as in
    /// Linkerd's plugin.
    pub fn from_config(s: Option<&str>) -> Self {
        match s {
            Some(s) if s.eq_ignore_ascii_case("debug") => Level::Debug,
            Some(s) if s.eq_ignore_ascii_case("info") => Level::Info,
            _ => Level::Warn,
        }
    }

    const fn as_str(self) -> &'static str {
        match self {
            Level::Debug => "DEBUG",
            Level::Info => "INFO",
            Level::Warn => "WARN",
            Level::Error => "ERROR",
        }
    }
}

/// Writes prefixed, single-line log records carrying the attachment's identity.
pub struct Logger {
    level: Level,
    container: String,
    namespace: String,
    pod: String,
    sink: Box<dyn Write>,
}

impl Logger {
    /// A logger at warn level (until the config says otherwise) writing to `sink`.
    pub fn new(sink: Box<dyn Write>) -> Self {
        Self {
            level: Level::Warn,
            container: "-".into(),
            namespace: "-".into(),
            pod: "-".into(),
            sink,
        }
    }

    /// The process's stderr.
    pub fn stderr() -> Self {
        Self::new(Box::new(std::io::stderr()))
    }

    pub fn set_level(&mut self, level: Level) {
        self.level = level;
    }

    /// Sets the identity every later line carries; empty values print as `-`.
    pub fn set_context(&mut self, container: &str, namespace: Option<&str>, pod: Option<&str>) {
        let or_dash = |s: Option<&str>| s.filter(|s| !s.is_empty()).unwrap_or("-").to_string();
        self.container = or_dash(Some(container));
        self.namespace = or_dash(namespace);
        self.pod = or_dash(pod);
    }

    pub fn enabled(&self, level: Level) -> bool {
        level >= self.level
    }

    /// Logs `msg` at `level`; newlines in it become spaces so each record stays one line.
    pub fn log(&mut self, level: Level, msg: fmt::Arguments<'_>) {
        if !self.enabled(level) {
            return;
        }
        let msg = msg.to_string().replace(['\n', '\r'], " ");
        // A failing stderr cannot be reported anywhere; the CNI result on stdout matters more.
        let _ = writeln!(
            self.sink,
            "linkerd-cni: {} container={} namespace={} pod={} {}",
            level.as_str(),
            self.container,
            self.namespace,
            self.pod,
            msg
        );
    }

    pub fn debug(&mut self, msg: fmt::Arguments<'_>) {
        self.log(Level::Debug, msg);
    }

    pub fn info(&mut self, msg: fmt::Arguments<'_>) {
        self.log(Level::Info, msg);
    }

    pub fn warn(&mut self, msg: fmt::Arguments<'_>) {
        self.log(Level::Warn, msg);
    }

    pub fn error(&mut self, msg: fmt::Arguments<'_>) {
        self.log(Level::Error, msg);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::{
        io,
        sync::{Arc, Mutex},
    };

    use super::*;

    /// A sink tests can read back.
    #[derive(Clone, Default)]
    pub(crate) struct Captured(pub Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0
                .lock()
                .expect("log buffer lock")
                .extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Captured {
        pub(crate) fn text(&self) -> String {
            String::from_utf8_lossy(&self.0.lock().expect("log buffer lock")).into_owned()
        }
    }

    #[test]
    fn levels_from_config() {
        for (s, level) in [
            (Some("debug"), Level::Debug),
            (Some("DEBUG"), Level::Debug),
            (Some("info"), Level::Info),
            (Some("warn"), Level::Warn),
            (Some("error"), Level::Warn),
            (Some("trace"), Level::Warn),
            (None, Level::Warn),
        ] {
            assert_eq!(Level::from_config(s), level, "{s:?}");
        }
    }

    #[test]
    fn lines_are_prefixed_single_and_filtered() {
        let sink = Captured::default();
        let mut log = Logger::new(Box::new(sink.clone()));
        log.set_level(Level::Info);
        log.set_context("c1", Some("ns"), Some("web"));
        log.debug(format_args!("hidden"));
        log.info(format_args!("two\nlines"));
        log.error(format_args!("bad"));
        let text = sink.text();
        let lines: Vec<_> = text.lines().collect();
        assert_eq!(
            lines,
            [
                "linkerd-cni: INFO container=c1 namespace=ns pod=web two lines",
                "linkerd-cni: ERROR container=c1 namespace=ns pod=web bad",
            ]
        );
    }
}
