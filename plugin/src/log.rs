//! A tiny stderr logger: one line per event, each `linkerd-cni: LEVEL container=.. namespace=..
//! pod=.. message`; stdout is reserved for the CNI result. The container runtime (containerd,
//! CRI-O) runs the plugin through libcni, which copies this stderr into the runtime's own log
//! (`journalctl -u containerd | grep linkerd-cni:`) when the call succeeds and drops it when the
//! call fails: a failing call's `msg; details` reach the pod's `FailedCreatePodSandBox` event
//! instead (docs/operating/logs.md). The kubelet runs no CNI plugin since the dockershim's removal.

use std::{fmt, io::Write};

use linkerd_cni_proto::escape::{Escaped, escape_unprintable};

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
///
/// Every field and message may hold outside input (`CNI_ARGS`, the network config, the
/// agent's replies, the Kubernetes API), so nothing reaches the sink unescaped: the identity
/// fields print as [`Escaped`] tokens (quoted when not plain, `-` when absent), and the message
/// has every unprintable character written as its escape (`\n`, `\u{1b}`). A record is always
/// one line, and no value can pass for another field or another record.
pub struct Logger {
    level: Level,
    container: Option<String>,
    namespace: Option<String>,
    pod: Option<String>,
    sink: Box<dyn Write>,
}

/// An identity field: its value as one [`Escaped`] token, or `-` when unknown.
struct Field<'a>(Option<&'a str>);

impl fmt::Display for Field<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(v) => Escaped(v).fmt(f),
            None => f.write_str("-"),
        }
    }
}

impl Logger {
    /// A logger at warn level (until the config says otherwise) writing to `sink`.
    pub fn new(sink: Box<dyn Write>) -> Self {
        Self {
            level: Level::Warn,
            container: None,
            namespace: None,
            pod: None,
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
        let known = |s: Option<&str>| s.filter(|s| !s.is_empty()).map(str::to_string);
        self.container = known(Some(container));
        self.namespace = known(namespace);
        self.pod = known(pod);
    }

    pub fn enabled(&self, level: Level) -> bool {
        level >= self.level
    }

    /// Logs `msg` at `level`; unprintable characters in it (newlines included) are escaped so
    /// each record stays one line.
    pub fn log(&mut self, level: Level, msg: fmt::Arguments<'_>) {
        if !self.enabled(level) {
            return;
        }
        let msg = msg.to_string();
        // A failing stderr cannot be reported anywhere; the CNI result on stdout matters more.
        let _ = writeln!(
            self.sink,
            "linkerd-cni: {} container={} namespace={} pod={} {}",
            level.as_str(),
            Field(self.container.as_deref()),
            Field(self.namespace.as_deref()),
            Field(self.pod.as_deref()),
            escape_unprintable(&msg)
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
                r"linkerd-cni: INFO container=c1 namespace=ns pod=web two\nlines",
                "linkerd-cni: ERROR container=c1 namespace=ns pod=web bad",
            ]
        );
    }

    #[test]
    fn outside_values_cannot_forge_a_record_or_a_field() {
        let sink = Captured::default();
        let mut log = Logger::new(Box::new(sink.clone()));
        log.set_level(Level::Info);
        log.set_context(
            "c1",
            Some("shop\nlinkerd-cni: INFO container=c9 namespace=shop pod=web forged"),
            Some("web pod=admin"),
        );
        log.info(format_args!(
            "reason: {}",
            "a\u{1b}[2K\rb\u{85}c\u{2028}d\u{7f}"
        ));
        log.set_context("c1", Some("-"), Some("\"web\""));
        log.info(format_args!("two\nlines"));
        let text = sink.text();
        let lines: Vec<_> = text.lines().collect();
        assert_eq!(
            lines,
            [
                r#"linkerd-cni: INFO container=c1 namespace="shop\nlinkerd-cni: INFO container=c9 namespace=shop pod=web forged" pod="web pod=admin" reason: a\u{1b}[2K\rb\u{85}c\u{2028}d\u{7f}"#,
                r#"linkerd-cni: INFO container=c1 namespace="-" pod="\"web\"" two\nlines"#,
            ]
        );
    }
}
