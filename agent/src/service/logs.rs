//! The agent's log records, on standard error (docs/operating/logs.md), in one of two formats
//! ([`LogFormat`], `--log-format`, `LINKERD_CNI_AGENT_LOG_FORMAT`, the chart's
//! `agent.logFormat`), as Linkerd's proxy and controllers take `plain` or `json`:
//!
//! - `plain`: tracing's text line, `<timestamp> <LEVEL> <span>{<fields>}: <target>: <message>
//!   <fields>`, with ANSI colours only when standard error is a terminal (never in a pod's log,
//!   which `kubectl logs` and log pipelines read as text);
//! - `json`: one JSON object per line with the same fields: `timestamp` (RFC 3339, UTC),
//!   `level`, `target`, `message`, `fields` (the event's other fields), `spans` (outermost
//!   first, each `{"name", "fields"}`).

use std::{fmt, io::IsTerminal};

use serde_json::{Map, Value};
use tracing::{
    Event, Subscriber,
    field::{Field, Visit},
};
use tracing_subscriber::{
    EnvFilter,
    field::RecordFields,
    fmt::{
        FmtContext, FormatEvent, FormatFields, FormattedFields,
        format::Writer,
        time::{FormatTime, SystemTime},
    },
    registry::LookupSpan,
};

/// How log records are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// tracing's text lines (colours only on a terminal).
    #[default]
    Plain,
    /// One JSON object per line.
    Json,
}

/// Installs the process's subscriber: records that pass `filter` (tracing's syntax), in
/// `format`, to standard error.
pub fn init(filter: &str, format: LogFormat) {
    let builder = tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::new(filter))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Plain => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => builder
            .with_ansi(false)
            .fmt_fields(JsonFields)
            .event_format(JsonEvent)
            .init(),
    }
}

/// Collects fields as JSON values: numbers and booleans as such, the rest as text.
struct JsonVisitor<'a>(&'a mut Map<String, Value>);

impl Visit for JsonVisitor<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().into(), Value::String(format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0
            .insert(field.name().into(), Value::String(value.into()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.0
            .insert(field.name().into(), Value::String(value.to_string()));
    }
}

/// Span fields, kept as a JSON object's text (read back by [`JsonEvent`]).
struct JsonFields;

impl<'w> FormatFields<'w> for JsonFields {
    fn format_fields<R: RecordFields>(&self, mut writer: Writer<'w>, fields: R) -> fmt::Result {
        let mut map = Map::new();
        fields.record(&mut JsonVisitor(&mut map));
        write!(writer, "{}", Value::Object(map))
    }

    fn add_fields(
        &self,
        current: &'w mut FormattedFields<Self>,
        fields: &tracing::span::Record<'_>,
    ) -> fmt::Result {
        let mut map = match serde_json::from_str(&current.fields) {
            Ok(Value::Object(m)) => m,
            _ => Map::new(),
        };
        fields.record(&mut JsonVisitor(&mut map));
        current.fields = Value::Object(map).to_string();
        Ok(())
    }
}

/// One record as one JSON line.
struct JsonEvent;

impl<S, N> FormatEvent<S, N> for JsonEvent
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let mut timestamp = String::new();
        SystemTime.format_time(&mut Writer::new(&mut timestamp))?;
        let mut fields = Map::new();
        event.record(&mut JsonVisitor(&mut fields));
        let message = fields.remove("message").unwrap_or(Value::Null);
        let spans: Vec<Value> = ctx
            .event_scope()
            .into_iter()
            .flat_map(|scope| scope.from_root())
            .map(|span| {
                let ext = span.extensions();
                let fields = ext
                    .get::<FormattedFields<N>>()
                    .and_then(|f| serde_json::from_str::<Value>(&f.fields).ok())
                    .unwrap_or_else(|| Value::Object(Map::new()));
                serde_json::json!({"name": span.name(), "fields": fields})
            })
            .collect();
        let line = serde_json::json!({
            "timestamp": timestamp,
            "level": meta.level().as_str(),
            "target": meta.target(),
            "message": message,
            "fields": fields,
            "spans": spans,
        });
        writeln!(writer, "{line}")
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn emit() {
        let span = tracing::info_span!("add", container = "c1", namespace = "shop");
        let _entered = span.entered();
        tracing::info!(redirected = true, port = 4143_u64, "pod added");
    }

    fn text(sink: &Captured) -> String {
        String::from_utf8(sink.0.lock().unwrap().clone()).unwrap()
    }

    /// The JSON line carries what the plain line carries: time, level, target, span name and
    /// fields, message and fields.
    #[test]
    fn json_has_the_plain_lines_fields() {
        let (json_sink, plain_sink) = (Captured::default(), Captured::default());
        let w = json_sink.clone();
        let json = tracing_subscriber::fmt()
            .with_writer(move || w.clone())
            .with_ansi(false)
            .fmt_fields(JsonFields)
            .event_format(JsonEvent)
            .finish();
        tracing::subscriber::with_default(json, emit);
        let w = plain_sink.clone();
        let plain = tracing_subscriber::fmt()
            .with_writer(move || w.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(plain, emit);

        let line: Value = serde_json::from_str(text(&json_sink).trim()).expect("one JSON line");
        assert_eq!(line["level"], "INFO");
        assert_eq!(line["target"], module_path!());
        assert_eq!(line["message"], "pod added");
        assert_eq!(
            line["fields"],
            serde_json::json!({"redirected": true, "port": 4143})
        );
        assert_eq!(
            line["spans"],
            serde_json::json!([{"name": "add", "fields": {"container": "c1", "namespace": "shop"}}])
        );
        let ts = line["timestamp"].as_str().expect("timestamp");
        assert!(ts.ends_with('Z') && ts.contains('T'), "{ts}");

        let plain = text(&plain_sink);
        for part in [
            "INFO",
            "add{container=\"c1\" namespace=\"shop\"}",
            module_path!(),
            "pod added",
            "redirected=true",
            "port=4143",
        ] {
            assert!(plain.contains(part), "{part:?} in {plain:?}");
        }
        // The plain line as a pod's log has it: no escape sequences.
        assert!(!plain.contains('\u{1b}'), "{plain:?}");
    }
}
