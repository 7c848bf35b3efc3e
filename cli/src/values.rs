//! Chart values: the chart's own `values.yaml` (embedded, so the CLI and the chart share one set
//! of defaults), coalesced with `-f` files, flags and `--set`, then checked.
//!
//! Values stay an untyped JSON tree while they are merged, exactly as Helm keeps them, so the
//! templates see what `helm template` would show them. [`Values`] is the typed view used only to
//! validate the result, reading each value as Helm's templates read it (a numeric string is an
//! integer); wrong types, bad ports and paths are errors here, where Helm would silently render
//! them, and every error names the key path and, from [`Origins`], the file or flag it came
//! from. Unknown keys are dropped with a warning ([`drop_unknown`]), as Helm ignores them, so
//! that an operator's existing linkerd2-cni values file renders. `-f` sources are files,
//! standard input or URLs ([`ValuesSource`]).

use std::{
    collections::BTreeMap,
    io::Read,
    path::{Path, PathBuf},
    time::Duration,
};

use linkerd_cni_proto::config::{PortRange, parse_port_list};
use serde_json::{Map, Value as Json};

/// The chart's `values.yaml`.
pub const CHART_VALUES_YAML: &str = include_str!("../../deploy/charts/linkerd2-cni/values.yaml");

/// The only mode that renders today.
pub const MODE_EBPF: &str = "ebpf";

/// Why values could not be read, merged or accepted.
#[derive(Debug, thiserror::Error)]
pub enum ValuesError {
    /// A values source (file, standard input, URL) could not be read.
    #[error("reading {origin}: {reason}")]
    Read { origin: String, reason: String },
    /// A values file (or the chart's own) is not YAML, or its top level is not a map.
    #[error("parsing values from {origin}: {message}")]
    Parse { origin: String, message: String },
    /// A value is not acceptable: its key path, where it came from (a values file, a flag,
    /// `--set`) and why.
    #[error("invalid value for {key} (from {origin}): {reason}")]
    Invalid {
        key: String,
        origin: String,
        reason: String,
    },
    /// `mode` names a mode that does not exist or is not implemented.
    #[error(
        "mode {0:?} is not supported: \"iptables\" is planned as the fallback for kernels without \
         cgroup BPF and is not implemented yet; use mode \"ebpf\""
    )]
    Mode(String),
}

/// Parses YAML into a JSON tree whose top level is a map (an empty document is an empty map).
pub fn parse_yaml(text: &str, origin: &str) -> Result<Json, ValuesError> {
    let parse_err = |message: String| ValuesError::Parse {
        origin: origin.to_string(),
        message,
    };
    let value: Json = serde_yaml_ng::from_str(text).map_err(|e| parse_err(e.to_string()))?;
    match value {
        Json::Null => Ok(Json::Object(Map::new())),
        Json::Object(_) => Ok(value),
        _ => Err(parse_err("the top level is not a map".into())),
    }
}

/// What Helm (a YAML 1.1 reader) makes of a plain scalar that a YAML 1.2 reader (this CLI, and
/// the API server's JSON) takes for a string: `yes`, `on`, `n` ... are booleans, `010` is octal,
/// `1_000` has separators. `None` when both readers agree.
fn yaml_1_1_reading(s: &str) -> Option<String> {
    const TRUE: &[&str] = &["y", "Y", "yes", "Yes", "YES", "on", "On", "ON"];
    const FALSE: &[&str] = &["n", "N", "no", "No", "NO", "off", "Off", "OFF"];
    if TRUE.contains(&s) {
        return Some("the boolean true".into());
    }
    if FALSE.contains(&s) {
        return Some("the boolean false".into());
    }
    let digits = s.strip_prefix(['-', '+']).unwrap_or(s);
    let numeric = !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit() || b == b'_');
    if numeric && digits.starts_with(|c: char| c.is_ascii_digit()) {
        if digits.contains('_') {
            return Some("an integer (YAML 1.1 allows `_` between digits)".into());
        }
        if digits.len() > 1 && digits.starts_with('0') {
            return Some("an octal integer".into());
        }
    }
    None
}

/// Whether `word` appears as a plain (unquoted) scalar value in `text`: after `key: `, after
/// `- `, or as a flow item, outside comments. A line-based reading, enough to tell `a: yes`
/// from `a: "yes"`.
fn appears_plain(text: &str, word: &str) -> bool {
    text.lines().any(|line| {
        let code = match line.find(" #") {
            Some(at) => &line[..at],
            None if line.trim_start().starts_with('#') => "",
            None => line,
        };
        code.split([',', '[', ']', '{', '}']).any(|piece| {
            let mut item = piece.trim();
            while let Some(rest) = item.strip_prefix("- ") {
                item = rest.trim_start();
            }
            if let Some((_, value)) = item.split_once(": ") {
                item = value.trim();
            }
            item == word
        })
    })
}

/// Refuses a values file whose plain scalars Helm reads otherwise than this CLI does (YAML 1.1
/// against 1.2: see [`yaml_1_1_reading`]), naming the key and the file: the CLI and
/// `helm template` must render a file alike or not at all.
fn check_yaml_1_1(text: &str, tree: &Json, origin: &str) -> Result<(), ValuesError> {
    fn walk(text: &str, path: &mut Vec<String>, v: &Json, origin: &str) -> Result<(), ValuesError> {
        match v {
            Json::Object(m) => {
                for (k, item) in m {
                    path.push(if path.is_empty() {
                        k.clone()
                    } else {
                        format!(".{k}")
                    });
                    walk(text, path, item, origin)?;
                    path.pop();
                }
            }
            Json::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    path.push(format!("[{i}]"));
                    walk(text, path, item, origin)?;
                    path.pop();
                }
            }
            Json::String(s) => {
                if let Some(helm) = yaml_1_1_reading(s)
                    && appears_plain(text, s)
                {
                    return Err(ValuesError::Invalid {
                        key: path.concat(),
                        origin: origin.to_string(),
                        reason: format!(
                            "the plain value {s} is {helm} to Helm (YAML 1.1) and the string \
                             {s:?} to this CLI (YAML 1.2): write what you mean unambiguously \
                             (true or false, a decimal integer), or quote it to keep a string"
                        ),
                    });
                }
            }
            _ => {}
        }
        Ok(())
    }
    walk(text, &mut Vec::new(), tree, origin)
}

/// The chart's default values.
pub fn chart_defaults() -> Result<Json, ValuesError> {
    parse_yaml(CHART_VALUES_YAML, "the chart's values.yaml")
}

/// The most a values source may hold (a values file is a few kilobytes).
pub const MAX_VALUES_BYTES: u64 = 16 << 20;

/// How long fetching a values URL may take, connection and body included.
pub const URL_TIMEOUT: Duration = Duration::from_secs(30);

/// Where a `-f` argument reads from, as Helm (and so Linkerd) takes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ValuesSource {
    /// `-`: standard input.
    Stdin,
    /// An `http://` or `https://` URL.
    Url(String),
    /// A path.
    File(PathBuf),
}

impl ValuesSource {
    /// What `-f` names.
    pub fn parse(arg: &str) -> Self {
        let lower = arg.to_ascii_lowercase();
        if arg.trim() == "-" {
            ValuesSource::Stdin
        } else if lower.starts_with("http://") || lower.starts_with("https://") {
            ValuesSource::Url(arg.to_string())
        } else {
            ValuesSource::File(PathBuf::from(arg))
        }
    }

    /// How errors and warnings name it.
    pub fn origin(&self) -> String {
        match self {
            ValuesSource::Stdin => "values from standard input".into(),
            ValuesSource::Url(url) => format!("values URL {url}"),
            ValuesSource::File(path) => format!("values file {}", path.display()),
        }
    }

    /// Reads and parses it.
    pub fn read(&self) -> Result<Json, ValuesError> {
        let origin = self.origin();
        let read_err = |reason: String| ValuesError::Read {
            origin: origin.clone(),
            reason,
        };
        let text = match self {
            ValuesSource::Stdin => {
                let mut text = String::new();
                std::io::stdin()
                    .take(MAX_VALUES_BYTES)
                    .read_to_string(&mut text)
                    .map_err(|e| read_err(e.to_string()))?;
                text
            }
            ValuesSource::File(path) => {
                std::fs::read_to_string(path).map_err(|e| read_err(e.to_string()))?
            }
            ValuesSource::Url(url) => fetch(url).map_err(read_err)?,
        };
        let tree = parse_yaml(&text, &origin)?;
        check_yaml_1_1(&text, &tree, &origin)?;
        Ok(tree)
    }
}

/// GETs a values URL as Helm's HTTP getter does: redirects followed, the proxy from the
/// environment, the answer must be a success; bounded in time and size.
fn fetch(url: &str) -> Result<String, String> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(URL_TIMEOUT))
        .http_status_as_error(false)
        .build()
        .into();
    let mut response = agent.get(url).call().map_err(|e| e.to_string())?;
    let status = response.status();
    let body = response
        .body_mut()
        .with_config()
        .limit(MAX_VALUES_BYTES)
        .read_to_string()
        .map_err(|e| format!("reading the answer: {e}"))?;
    if !status.is_success() {
        let text: String = body.chars().take(200).collect();
        return Err(format!("the server answered {status}: {text}"));
    }
    Ok(body)
}

/// Reads a `-f` values file.
pub fn read_values_file(path: &Path) -> Result<Json, ValuesError> {
    ValuesSource::File(path.to_path_buf()).read()
}

/// Merges `src` into `dst` as Helm coalesces values: maps merge key by key, anything else in
/// `src` replaces what `dst` had, and a `null` in `src` deletes the key.
pub fn coalesce(dst: &mut Json, src: Json) {
    match (dst, src) {
        (Json::Object(d), Json::Object(s)) => {
            for (k, v) in s {
                if v.is_null() {
                    d.remove(&k);
                    continue;
                }
                match d.get_mut(&k) {
                    Some(existing) if existing.is_object() && v.is_object() => {
                        coalesce(existing, v)
                    }
                    _ => {
                        d.insert(k, v);
                    }
                }
            }
        }
        (dst, src) => *dst = src,
    }
}

/// Sets `path` (map keys) in `values` to `value`, creating maps on the way; `null` deletes.
pub fn set_path(values: &mut Json, path: &[String], value: Json) {
    let mut patch = value;
    for key in path.iter().rev() {
        let mut m = Map::new();
        m.insert(key.clone(), patch);
        patch = Json::Object(m);
    }
    coalesce(values, patch);
}

/// Values whose contents are free-form (label maps, Kubernetes objects): any key is theirs.
pub const FREE_FORM: &[&str] = &[
    "commonLabels",
    "podLabels",
    "nodeAffinity",
    "updateStrategy",
    "agent.metrics.podMonitor.labels",
    // Checked by `validate` instead: the keys of Kubernetes' SELinuxOptions.
    "agent.seLinuxOptions",
];

/// Takes out of `values` every key that the chart's `values.yaml` (`defaults`) does not have,
/// outside the free-form values, and returns their dotted paths, sorted. Helm renders a chart
/// with unknown keys as if they were absent (no template reads them), so an operator's
/// existing linkerd2-cni values file renders here too; the CLI warns about each key instead of
/// silently ignoring it.
pub fn drop_unknown(values: &mut Json, defaults: &Json) -> Vec<String> {
    fn walk(prefix: &str, values: &mut Json, defaults: &Json, out: &mut Vec<String>) {
        let (Json::Object(v), Json::Object(d)) = (values, defaults) else {
            return;
        };
        v.retain(|k, _| {
            let known = d.contains_key(k);
            if !known {
                out.push(format!("{prefix}{k}"));
            }
            known
        });
        for (k, item) in v.iter_mut() {
            let path = format!("{prefix}{k}");
            if !FREE_FORM.contains(&path.as_str()) {
                walk(&format!("{path}."), item, &d[k], out);
            }
        }
    }
    let mut out = Vec::new();
    walk("", values, defaults, &mut out);
    out.sort();
    out
}

/// The warning the CLI prints for a key [`drop_unknown`] took out, naming where it came from.
pub fn unknown_key_warning(key: &str, origin: &str) -> String {
    format!(
        "warning: ignoring value {key:?} (from {origin}): the linkerd2-cni chart (eBPF mode) has \
         no such value"
    )
}

/// The origin of a value nobody set: the chart's own default.
pub const CHART_ORIGIN: &str = "the chart's values.yaml";

/// Where each value came from (a values file, a flag, `--set`), by key path as Helm spells keys
/// (`image.name`, `tolerations[0].operator`), so that an error can name both.
#[derive(Clone, Debug, Default)]
pub struct Origins {
    paths: BTreeMap<String, String>,
}

/// One step of a key path, for [`Origins`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathStep<'a> {
    /// A map key.
    Key(&'a str),
    /// A list index.
    Index(usize),
}

fn join_path(steps: &[PathStep<'_>]) -> String {
    let mut out = String::new();
    for step in steps {
        match step {
            PathStep::Key(k) if out.is_empty() => out.push_str(k),
            PathStep::Key(k) => {
                out.push('.');
                out.push_str(k);
            }
            PathStep::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

impl Origins {
    /// Records that `origin` set the value at `steps` (a leaf: a scalar or a list). What was
    /// recorded under it is replaced; a source that had set a non-map above it (now a map) no
    /// longer owns it.
    pub fn record(&mut self, steps: &[PathStep<'_>], origin: &str) {
        let path = join_path(steps);
        self.paths.retain(|p, _| {
            let below = p.len() > path.len()
                && p.starts_with(&path)
                && matches!(p.as_bytes()[path.len()], b'.' | b'[');
            !below
        });
        for n in 1..steps.len() {
            if matches!(steps[n], PathStep::Key(_)) {
                self.paths.remove(&join_path(&steps[..n]));
            }
        }
        self.paths.insert(path, origin.to_string());
    }

    /// Records that `origin` set every value of `tree` (a values file): each leaf, maps being
    /// merged key by key.
    pub fn record_tree(&mut self, tree: &Json, origin: &str) {
        fn walk<'a>(
            origins: &mut Origins,
            prefix: &mut Vec<PathStep<'a>>,
            tree: &'a Json,
            origin: &str,
        ) {
            match tree {
                Json::Object(m) if !m.is_empty() => {
                    for (k, v) in m {
                        prefix.push(PathStep::Key(k));
                        walk(origins, prefix, v, origin);
                        prefix.pop();
                    }
                }
                _ if prefix.is_empty() => {}
                _ => origins.record(prefix, origin),
            }
        }
        walk(self, &mut Vec::new(), tree, origin);
    }

    /// Where the value at `path` came from: the last source that set it, or a value under it
    /// (which made it a map), or a value above it; [`CHART_ORIGIN`] when none did.
    pub fn of(&self, path: &str) -> &str {
        if let Some(origin) = self.paths.get(path) {
            return origin;
        }
        if let Some((_, origin)) = self.paths.range(path.to_string()..).find(|(p, _)| {
            p.len() > path.len()
                && p.starts_with(path)
                && matches!(p.as_bytes()[path.len()], b'.' | b'[')
        }) {
            return origin;
        }
        let mut p = path;
        loop {
            if let Some(origin) = self.paths.get(p) {
                return origin;
            }
            match p.rfind(['.', '[']) {
                Some(at) => p = &p[..at],
                None => return CHART_ORIGIN,
            }
        }
    }
}

/// The typed view of the chart's values, for validation. Field names are the chart's.
#[derive(Clone, Debug)]
pub struct Values {
    pub mode: String,
    pub inbound_proxy_port: u16,
    pub outbound_proxy_port: u16,
    pub proxy_admin_port: u16,
    pub proxy_control_port: u16,
    pub ignore_inbound_ports: String,
    pub ignore_outbound_ports: String,
    pub ports_to_redirect: String,
    pub proxy_uid: i64,
    pub proxy_gid: i64,
    pub log_level: String,
    pub dest_cni_net_dir: String,
    pub dest_cni_bin_dir: String,
    pub use_wait_flag: bool,
    pub iptables_mode: String,
    pub disable_ipv6: bool,
    pub priority_class_name: String,
    pub install_namespace: bool,
    pub excluded_namespaces: Vec<String>,
    pub image: Image,
    pub tolerations: Vec<Json>,
    pub resources: Resources,
    pub agent: Agent,
    pub common_labels: BTreeMap<String, String>,
    pub pod_labels: BTreeMap<String, String>,
    pub image_pull_secrets: Vec<Json>,
    pub node_affinity: Map<String, Json>,
    pub extra_init_containers: Vec<Json>,
    pub update_strategy: Map<String, Json>,
    pub revision_history_limit: u32,
    pub cli_version: String,
    /// Accepted (Linkerd's chart has it) with a warning when true: the agent container is never
    /// privileged (only the `mount-bpffs` init container is, see [`Agent::mount_bpffs`]); on
    /// SELinux-enforcing nodes [`Agent::se_linux_options`] is what to set.
    pub privileged: bool,
    /// Accepted (Linkerd's chart has it); no PodSecurityPolicy is rendered.
    pub enable_psp: bool,
    /// Accepted (Linkerd's chart has it); no repair controller: the agent adopts pods that
    /// started before the plugin where they run.
    pub repair_controller: RepairController,
}

/// `repairController`, in Linkerd's shape; validated, no effect in eBPF mode.
#[derive(Clone, Debug)]
pub struct RepairController {
    pub enabled: bool,
    pub log_level: String,
    pub log_format: String,
    pub enable_security_context: bool,
    pub resources: Resources,
}

/// `image`.
#[derive(Clone, Debug)]
pub struct Image {
    pub name: String,
    pub version: String,
    pub pull_policy: String,
}

/// `resources`, in Linkerd's shape (`cpu.limit`, `memory.request`, ...).
#[derive(Clone, Debug)]
pub struct Resources {
    pub cpu: Resource,
    pub memory: Resource,
    pub ephemeral_storage: Resource,
}

/// One resource's request and limit; empty leaves it unset.
#[derive(Clone, Debug)]
pub struct Resource {
    pub limit: String,
    pub request: String,
}

/// `agent`: the node agent's settings (eBPF mode).
#[derive(Clone, Debug)]
pub struct Agent {
    pub log_level: String,
    /// `plain` or `json`.
    pub log_format: String,
    pub socket_path: String,
    pub bpffs_path: String,
    pub pin_root: String,
    pub health_port: u16,
    pub host_cgroup_root: String,
    pub host_netns_dir: String,
    /// Whether the privileged `mount-bpffs` init container runs (false: the host mounts bpffs
    /// and no container is privileged).
    pub mount_bpffs: bool,
    /// Whether the runtime passes `/proc/<pid>/ns/net` as CNI_NETNS (host `/proc` mounted,
    /// CAP_SYS_PTRACE added).
    pub cni_netns_from_proc: bool,
    /// The agent's and mount-bpffs's `securityContext.seLinuxOptions` (empty: the runtime's
    /// default label); only the keys of Kubernetes' SELinuxOptions, each a string.
    pub se_linux_options: Map<String, Json>,
    /// Whether the agent's container gets CAP_SYS_ADMIN (adoption, user-namespaced pods).
    pub sys_admin: bool,
    pub metrics: Metrics,
}

/// `agent.metrics`: `/metrics` on an address of the node, for Prometheus.
#[derive(Clone, Debug)]
pub struct Metrics {
    pub enabled: bool,
    /// An IP address (the template brackets an IPv6 one).
    pub bind_address: std::net::IpAddr,
    pub port: u16,
    /// `agent.metrics.podMonitor`: a Prometheus Operator PodMonitor.
    pub pod_monitor: PodMonitor,
}

/// `agent.metrics.podMonitor`.
#[derive(Clone, Debug)]
pub struct PodMonitor {
    pub enabled: bool,
    pub labels: BTreeMap<String, String>,
    pub interval: String,
}

/// What a JSON value is, for messages.
fn describe(v: &Json) -> String {
    match v {
        Json::Null => "null".into(),
        Json::Bool(b) => format!("the boolean {b}"),
        Json::Number(n) => format!("the number {n}"),
        Json::String(s) => format!("the string {s:?}"),
        Json::Array(_) => "a list".into(),
        Json::Object(_) => "a map".into(),
    }
}

/// An integer as Helm's templates read one: a number (values files give every number as a
/// float; whole ones only) or a string of decimal digits (as `--set-string`, or a quoted value
/// in a file, gives it). Other spellings Go would read differently (`0x10`, `010`) are refused.
fn as_integer(v: &Json) -> Option<i64> {
    match v {
        Json::Number(n) => n.as_i64().or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15)
                // Whole and within f64's exact integers: the cast is exact.
                .map(|f| f as i64)
        }),
        Json::String(s) => {
            let digits = s.strip_prefix('-').unwrap_or(s);
            let canonical = !digits.is_empty()
                && digits.bytes().all(|b| b.is_ascii_digit())
                && (digits == "0" || !digits.starts_with('0'));
            if canonical { s.parse().ok() } else { None }
        }
        _ => None,
    }
}

/// Reads the merged values, naming the key path and where the value came from in every error.
struct Reader<'a> {
    root: &'a Json,
    origins: &'a Origins,
}

impl<'a> Reader<'a> {
    fn err(&self, path: &str, reason: impl Into<String>) -> ValuesError {
        ValuesError::Invalid {
            key: path.to_string(),
            origin: self.origins.of(path).to_string(),
            reason: reason.into(),
        }
    }

    fn get(&self, path: &str) -> Result<&'a Json, ValuesError> {
        let mut at = self.root;
        let mut walked = String::new();
        for key in path.split('.') {
            let Json::Object(map) = at else {
                return Err(self.err(
                    &walked,
                    format!("expected a map (with {key:?}), got {}", describe(at)),
                ));
            };
            if !walked.is_empty() {
                walked.push('.');
            }
            walked.push_str(key);
            at = map.get(key).ok_or_else(|| {
                self.err(
                    &walked,
                    "no value (a null removes the chart's default, and this key needs one)",
                )
            })?;
        }
        Ok(at)
    }

    fn int(&self, path: &str, min: i64, max: i64) -> Result<i64, ValuesError> {
        let v = self.get(path)?;
        let n = as_integer(v)
            .ok_or_else(|| self.err(path, format!("expected an integer, got {}", describe(v))))?;
        if n < min || n > max {
            return Err(self.err(path, format!("{n} is out of range ({min} to {max})")));
        }
        Ok(n)
    }

    fn port(&self, path: &str) -> Result<u16, ValuesError> {
        let n = self.int(path, 1, 65535)?;
        u16::try_from(n).map_err(|_| self.err(path, format!("{n} is not a port")))
    }

    /// An IP address (as the agent parses it: no brackets, no port).
    fn ip(&self, path: &str) -> Result<std::net::IpAddr, ValuesError> {
        let s = self.string(path)?;
        s.parse()
            .map_err(|_| self.err(path, format!("{s:?} is not an IPv4 or IPv6 address")))
    }

    fn string(&self, path: &str) -> Result<String, ValuesError> {
        match self.get(path)? {
            Json::String(s) => Ok(s.clone()),
            other => Err(self.err(path, format!("expected a string, got {}", describe(other)))),
        }
    }

    /// A string the templates print as text (`toString`, `quote`): an integer, as `--set key=8080`
    /// types it, is taken as its digits.
    fn text(&self, path: &str) -> Result<String, ValuesError> {
        match self.get(path)? {
            Json::String(s) => Ok(s.clone()),
            v @ Json::Number(_) => as_integer(v)
                .map(|n| n.to_string())
                .ok_or_else(|| self.err(path, format!("expected a string, got {}", describe(v)))),
            other => Err(self.err(path, format!("expected a string, got {}", describe(other)))),
        }
    }

    fn boolean(&self, path: &str) -> Result<bool, ValuesError> {
        match self.get(path)? {
            Json::Bool(b) => Ok(*b),
            other => Err(self.err(
                path,
                format!(
                    "expected true or false, got {} (--set types true and false as booleans; \
                     --set-string and quoted YAML make strings)",
                    describe(other)
                ),
            )),
        }
    }

    fn list(&self, path: &str) -> Result<Vec<Json>, ValuesError> {
        match self.get(path)? {
            Json::Array(items) => Ok(items.clone()),
            other => Err(self.err(path, format!("expected a list, got {}", describe(other)))),
        }
    }

    fn map(&self, path: &str) -> Result<Map<String, Json>, ValuesError> {
        match self.get(path)? {
            Json::Object(m) => Ok(m.clone()),
            other => Err(self.err(path, format!("expected a map, got {}", describe(other)))),
        }
    }

    fn string_list(&self, path: &str) -> Result<Vec<String>, ValuesError> {
        self.list(path)?
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Json::String(s) => Ok(s.clone()),
                other => Err(self.err(
                    &format!("{path}[{i}]"),
                    format!("expected a string, got {}", describe(other)),
                )),
            })
            .collect()
    }

    /// Labels: string values only (the API server refuses anything else).
    fn labels(&self, path: &str) -> Result<BTreeMap<String, String>, ValuesError> {
        self.map(path)?
            .into_iter()
            .map(|(k, v)| match v {
                Json::String(s) => Ok((k, s)),
                other => Err(self.err(
                    &format!("{path}.{k}"),
                    format!(
                        "expected a string (label values are strings), got {}",
                        describe(&other)
                    ),
                )),
            })
            .collect()
    }

    fn resources(&self, path: &str) -> Result<Resources, ValuesError> {
        let one = |r: &str| -> Result<Resource, ValuesError> {
            Ok(Resource {
                limit: self.text(&format!("{path}.{r}.limit"))?,
                request: self.text(&format!("{path}.{r}.request"))?,
            })
        };
        Ok(Resources {
            cpu: one("cpu")?,
            memory: one("memory")?,
            ephemeral_storage: one("ephemeral-storage")?,
        })
    }

    fn values(&self) -> Result<Values, ValuesError> {
        Ok(Values {
            mode: self.string("mode")?,
            inbound_proxy_port: self.port("inboundProxyPort")?,
            outbound_proxy_port: self.port("outboundProxyPort")?,
            proxy_admin_port: self.port("proxyAdminPort")?,
            proxy_control_port: self.port("proxyControlPort")?,
            ignore_inbound_ports: self.text("ignoreInboundPorts")?,
            ignore_outbound_ports: self.text("ignoreOutboundPorts")?,
            ports_to_redirect: self.text("portsToRedirect")?,
            proxy_uid: self.int("proxyUID", 0, i64::from(u32::MAX))?,
            proxy_gid: self.int("proxyGID", i64::MIN, i64::from(u32::MAX))?,
            log_level: self.string("logLevel")?,
            dest_cni_net_dir: self.string("destCNINetDir")?,
            dest_cni_bin_dir: self.string("destCNIBinDir")?,
            use_wait_flag: self.boolean("useWaitFlag")?,
            iptables_mode: self.string("iptablesMode")?,
            disable_ipv6: self.boolean("disableIPv6")?,
            priority_class_name: self.string("priorityClassName")?,
            install_namespace: self.boolean("installNamespace")?,
            excluded_namespaces: self.string_list("excludedNamespaces")?,
            image: Image {
                name: self.string("image.name")?,
                version: self.text("image.version")?,
                pull_policy: self.string("image.pullPolicy")?,
            },
            tolerations: self.list("tolerations")?,
            resources: self.resources("resources")?,
            agent: Agent {
                log_level: self.string("agent.logLevel")?,
                log_format: self.string("agent.logFormat")?,
                socket_path: self.string("agent.socketPath")?,
                bpffs_path: self.string("agent.bpffsPath")?,
                pin_root: self.string("agent.pinRoot")?,
                health_port: self.port("agent.healthPort")?,
                host_cgroup_root: self.string("agent.hostCgroupRoot")?,
                host_netns_dir: self.string("agent.hostNetnsDir")?,
                mount_bpffs: self.boolean("agent.mountBpffs")?,
                cni_netns_from_proc: self.boolean("agent.cniNetnsFromProc")?,
                se_linux_options: self.map("agent.seLinuxOptions")?,
                sys_admin: self.boolean("agent.sysAdmin")?,
                metrics: Metrics {
                    enabled: self.boolean("agent.metrics.enabled")?,
                    bind_address: self.ip("agent.metrics.bindAddress")?,
                    port: self.port("agent.metrics.port")?,
                    pod_monitor: PodMonitor {
                        enabled: self.boolean("agent.metrics.podMonitor.enabled")?,
                        labels: self.labels("agent.metrics.podMonitor.labels")?,
                        interval: self.text("agent.metrics.podMonitor.interval")?,
                    },
                },
            },
            common_labels: self.labels("commonLabels")?,
            pod_labels: self.labels("podLabels")?,
            image_pull_secrets: self.list("imagePullSecrets")?,
            node_affinity: self.map("nodeAffinity")?,
            extra_init_containers: self.list("extraInitContainers")?,
            update_strategy: self.map("updateStrategy")?,
            revision_history_limit: u32::try_from(self.int(
                "revisionHistoryLimit",
                0,
                i64::from(i32::MAX),
            )?)
            .unwrap_or(0),
            cli_version: self.string("cliVersion")?,
            privileged: self.boolean("privileged")?,
            enable_psp: self.boolean("enablePSP")?,
            repair_controller: RepairController {
                enabled: self.boolean("repairController.enabled")?,
                log_level: self.string("repairController.logLevel")?,
                log_format: self.string("repairController.logFormat")?,
                enable_security_context: self.boolean("repairController.enableSecurityContext")?,
                resources: self.resources("repairController.resources")?,
            },
        })
    }
}

/// Whether YAML can carry `c` in a manifest: its printable set (tab, line breaks, printable
/// ASCII, NEL and the rest of Unicode but C1 controls and U+FFFE/U+FFFF).
fn yaml_printable(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{7e}' | '\u{85}')
        || (c >= '\u{a0}' && c != '\u{fffe}' && c != '\u{ffff}')
}

/// Refuses a key or string anywhere in the values that holds a character YAML cannot carry
/// (found by fuzzing: an `image.name` with a DEL rendered a manifest that no YAML reader
/// accepts), naming its key path and origin.
fn unprintable(v: &Json, path: &mut String, r: &Reader<'_>) -> Result<(), ValuesError> {
    let bad = |s: &str| s.chars().find(|c| !yaml_printable(*c));
    match v {
        Json::String(s) => match bad(s) {
            Some(c) => Err(r.err(
                path,
                format!(
                    "holds the control character U+{:04X}, which a YAML manifest cannot carry",
                    u32::from(c)
                ),
            )),
            None => Ok(()),
        },
        Json::Array(items) => {
            let len = path.len();
            for (i, item) in items.iter().enumerate() {
                path.push_str(&format!("[{i}]"));
                unprintable(item, path, r)?;
                path.truncate(len);
            }
            Ok(())
        }
        Json::Object(map) => {
            let len = path.len();
            for (key, item) in map {
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(key);
                if let Some(c) = bad(key) {
                    return Err(r.err(
                        path,
                        format!(
                            "the key holds the control character U+{:04X}, which a YAML \
                             manifest cannot carry",
                            u32::from(c)
                        ),
                    ));
                }
                unprintable(item, path, r)?;
                path.truncate(len);
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Why `agent.socketPath` cannot be rendered, if it cannot: its directory becomes a writable
/// hostPath mount at the same path in the agent's container, which also holds the pod registry
/// (`<dir>/pods`), so it must be a directory of its own, at least two levels deep, and not one
/// the container needs for itself. The chart's template refuses the same paths (for Helm).
pub fn socket_dir_problem(socket_path: &str) -> Option<String> {
    let dir = match socket_path.trim_end_matches('/').rfind('/') {
        Some(0) | None => "/",
        Some(i) => &socket_path[..i],
    };
    let parts: Vec<&str> = dir.split('/').collect();
    let top = parts.get(1).copied().unwrap_or_default();
    (parts.len() < 3 || ["host", "proc", "sys", "dev"].contains(&top)).then(|| {
        format!(
            "its directory {dir:?} is mounted from the host (writable) and holds the agent's \
             pod registry too: put the socket in a directory of its own, at least two levels \
             deep and not under /host, /proc, /sys or /dev (e.g. /run/linkerd-cni/agent.sock)"
        )
    })
}

/// Checks merged values (after [`drop_unknown`]): their types, then what the templates cannot
/// check. Every error names the key path and, from `origins`, the file or flag it came from.
/// Values are accepted as Helm's templates read them: integers also as whole numbers (values
/// files give floats) and as strings of decimal digits (`--set-string`, quoted YAML); text also
/// as integers (`--set image.version=2`).
pub fn validate(values: &Json, origins: &Origins) -> Result<Values, ValuesError> {
    let r = Reader {
        root: values,
        origins,
    };
    unprintable(values, &mut String::new(), &r)?;
    let mode = r.string("mode")?;
    if mode != MODE_EBPF {
        return Err(ValuesError::Mode(mode));
    }
    let v = r.values()?;
    let ports = |key: &str, list: &str| -> Result<Vec<PortRange>, ValuesError> {
        parse_port_list(list).map_err(|e| r.err(key, e.to_string()))
    };
    ports("ignoreInboundPorts", &v.ignore_inbound_ports)?;
    ports("ignoreOutboundPorts", &v.ignore_outbound_ports)?;
    if let Some(range) = ports("portsToRedirect", &v.ports_to_redirect)?
        .iter()
        .find(|r| r.first != r.last)
    {
        return Err(r.err(
            "portsToRedirect",
            format!("{range} is a range; list single ports"),
        ));
    }
    for (key, path) in [
        ("destCNINetDir", &v.dest_cni_net_dir),
        ("destCNIBinDir", &v.dest_cni_bin_dir),
        ("agent.socketPath", &v.agent.socket_path),
        ("agent.bpffsPath", &v.agent.bpffs_path),
        ("agent.pinRoot", &v.agent.pin_root),
        ("agent.hostCgroupRoot", &v.agent.host_cgroup_root),
        ("agent.hostNetnsDir", &v.agent.host_netns_dir),
    ] {
        if !(path.starts_with('/') && !path.contains("..") && path.len() > 1) {
            return Err(r.err(key, format!("{path:?} is not an absolute path")));
        }
    }
    for (k, value) in &v.agent.se_linux_options {
        if !["user", "role", "type", "level"].contains(&k.as_str()) {
            return Err(r.err(
                &format!("agent.seLinuxOptions.{k}"),
                "not a field of SELinuxOptions (user, role, type, level)",
            ));
        }
        if !value.is_string() {
            return Err(r.err(
                &format!("agent.seLinuxOptions.{k}"),
                format!("expected a string, got {value}"),
            ));
        }
    }
    if v.agent.metrics.pod_monitor.enabled && !v.agent.metrics.enabled {
        return Err(r.err(
            "agent.metrics.podMonitor.enabled",
            "needs agent.metrics.enabled: the PodMonitor scrapes the /metrics that \
             agent.metrics.enabled serves on the node's addresses",
        ));
    }
    if !["plain", "json"].contains(&v.agent.log_format.as_str()) {
        return Err(r.err("agent.logFormat", "expected plain or json"));
    }
    if let Some(reason) = socket_dir_problem(&v.agent.socket_path) {
        return Err(r.err("agent.socketPath", reason));
    }
    let bpffs = v.agent.bpffs_path.trim_end_matches('/');
    if !v.agent.pin_root.starts_with(&format!("{bpffs}/")) {
        return Err(r.err(
            "agent.pinRoot",
            format!("must be inside agent.bpffsPath ({bpffs})"),
        ));
    }
    if v.agent.metrics.enabled && v.agent.metrics.port == v.agent.health_port {
        return Err(r.err(
            "agent.metrics.port",
            format!(
                "{} is agent.healthPort's: the health endpoint listens on loopback there \
                 (serving /metrics too), and a wildcard bindAddress could not be bound next to \
                 it; choose another port",
                v.agent.metrics.port
            ),
        ));
    }
    if v.image.name.is_empty() || v.image.name.contains(char::is_whitespace) {
        return Err(r.err(
            "image.name",
            format!("{:?} is not an image name", v.image.name),
        ));
    }
    if !["Always", "IfNotPresent", "Never"].contains(&v.image.pull_policy.as_str()) {
        return Err(r.err("image.pullPolicy", "expected Always, IfNotPresent or Never"));
    }
    if !["legacy", "nft", "plain"].contains(&v.iptables_mode.as_str()) {
        return Err(r.err("iptablesMode", "expected legacy, nft or plain"));
    }
    // A namespace name is a DNS label.
    if let Some((i, bad)) = v.excluded_namespaces.iter().enumerate().find(|(_, n)| {
        n.is_empty()
            || n.len() > 63
            || n.starts_with('-')
            || n.ends_with('-')
            || !n
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    }) {
        return Err(r.err(
            &format!("excludedNamespaces[{i}]"),
            format!("{bad:?} is not a namespace name"),
        ));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn chart_defaults_are_valid_and_contractual() {
        let d = chart_defaults().expect("the chart's values.yaml parses");
        let v = validate(&d, &Origins::default()).expect("the chart's defaults validate");
        assert_eq!(v.mode, "ebpf");
        assert_eq!((v.inbound_proxy_port, v.outbound_proxy_port), (4143, 4140));
        assert_eq!((v.proxy_admin_port, v.proxy_control_port), (4191, 4190));
        assert_eq!((v.proxy_uid, v.proxy_gid), (2102, -1));
        assert_eq!(
            (v.dest_cni_net_dir.as_str(), v.dest_cni_bin_dir.as_str()),
            ("/etc/cni/net.d", "/opt/cni/bin")
        );
        assert_eq!(v.log_level, "info");
        // With the release namespace, which the chart always puts first, the plugin's default.
        let mut excluded = vec![linkerd_cni_k8s::names::CNI_NAMESPACE.to_string()];
        excluded.extend(v.excluded_namespaces.iter().cloned());
        assert_eq!(
            excluded,
            linkerd_cni_proto::config::DEFAULT_EXCLUDED_NAMESPACES
        );
        assert_eq!(v.agent.socket_path, linkerd_cni_common::paths::AGENT_SOCKET);
        assert_eq!(v.agent.bpffs_path, linkerd_cni_common::paths::BPFFS);
        assert_eq!(v.agent.pin_root, linkerd_cni_common::paths::PIN_ROOT);
        // Issue 25: nothing exposed, a priority, the privileged mount kept by default.
        assert_eq!(v.priority_class_name, "system-node-critical");
        assert!(!v.agent.metrics.enabled);
        assert!(v.agent.mount_bpffs);
        assert!(!v.agent.cni_netns_from_proc);
        assert!(!v.agent.sys_admin);
    }

    #[test]
    fn coalesce_merges_maps_and_replaces_the_rest() {
        let mut v = json!({"a": {"b": 1, "c": [1, 2]}, "d": "x", "e": 1});
        coalesce(
            &mut v,
            json!({"a": {"c": [3], "n": true}, "d": {"m": 1}, "e": null}),
        );
        assert_eq!(
            v,
            json!({"a": {"b": 1, "c": [3], "n": true}, "d": {"m": 1}})
        );
        set_path(&mut v, &["a".into(), "b".into()], json!(2));
        assert_eq!(v["a"]["b"], json!(2));
        assert_eq!(v["a"]["c"], json!([3]), "set_path keeps siblings");
    }

    #[test]
    fn unknown_keys_are_dropped_and_named() {
        let defaults = chart_defaults().expect("defaults");
        let mut v = defaults.clone();
        coalesce(
            &mut v,
            json!({
                "someFutureController": {"enabled": true},
                "image": {"name": "x", "digest": "sha256:0"},
                "resources": {"cpu": {"limit": "1", "burst": "2"}},
                "commonLabels": {"any": "label"},
                "podLabels": {"p": "q"},
                "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}},
                "updateStrategy": {"type": "OnDelete", "rollingUpdate": null},
                "tolerations": [{"operator": "Exists", "key": "k"}],
            }),
        );
        let dropped = drop_unknown(&mut v, &defaults);
        assert_eq!(
            dropped,
            [
                "image.digest",
                "resources.cpu.burst",
                "someFutureController"
            ]
        );
        let kept = validate(&v, &Origins::default()).expect("what is left validates");
        assert_eq!(kept.image.name, "x");
        assert_eq!(kept.resources.cpu.limit, "1");
        assert_eq!(kept.common_labels["any"], "label");
        assert!(
            kept.node_affinity
                .contains_key("requiredDuringSchedulingIgnoredDuringExecution")
        );
        assert_eq!(kept.update_strategy["type"], "OnDelete");
        assert_eq!(drop_unknown(&mut v, &defaults), Vec::<String>::new());
    }

    #[test]
    fn validation_rejects_what_the_chart_cannot_render() {
        let cases: &[(&str, Json, &str)] = &[
            ("mode", json!("iptables"), "not implemented"),
            ("mode", json!("nope"), "not supported"),
            (
                "inboundProxyPort",
                json!(0),
                "inboundProxyPort (from x): 0 is out of range",
            ),
            (
                "inboundProxyPort",
                json!(70000),
                "out of range (1 to 65535)",
            ),
            (
                "inboundProxyPort",
                json!("4143x"),
                "expected an integer, got the string \"4143x\"",
            ),
            ("inboundProxyPort", json!("0x10"), "expected an integer"),
            ("inboundProxyPort", json!("010"), "expected an integer"),
            (
                "inboundProxyPort",
                json!(4143.5),
                "expected an integer, got the number 4143.5",
            ),
            (
                "ignoreInboundPorts",
                json!("80,x"),
                "ignoreInboundPorts (from x)",
            ),
            ("portsToRedirect", json!("80-90"), "range"),
            (
                "proxyUID",
                json!(-5),
                "proxyUID (from x): -5 is out of range",
            ),
            (
                "proxyUID",
                json!(true),
                "expected an integer, got the boolean true",
            ),
            ("destCNINetDir", json!("etc/cni"), "absolute"),
            (
                "useWaitFlag",
                json!("true"),
                "useWaitFlag (from x): expected true or false, got the string \"true\"",
            ),
            (
                "image",
                json!({"version": true}),
                "image.version (from x): expected a string",
            ),
            (
                "image",
                json!("x"),
                "invalid value for image (from x): expected a map",
            ),
            ("image", json!({"pullPolicy": "Sometimes"}), "pullPolicy"),
            ("agent", json!({"pinRoot": "/elsewhere/x"}), "agent.pinRoot"),
            (
                "agent",
                json!({"metrics": {"bindAddress": "[::]"}}),
                "agent.metrics.bindAddress (from x): \"[::]\" is not an IPv4 or IPv6 address",
            ),
            (
                "agent",
                json!({"metrics": {"bindAddress": "node.example"}}),
                "is not an IPv4 or IPv6 address",
            ),
            (
                "agent",
                json!({"metrics": {"enabled": true, "port": 9990}}),
                "agent.metrics.port (from x): 9990 is agent.healthPort's",
            ),
            (
                "agent",
                json!({"mountBpffs": "false"}),
                "agent.mountBpffs (from x): expected true or false",
            ),
            (
                "commonLabels",
                json!({"a": 1}),
                "commonLabels.a (from x): expected a string",
            ),
            (
                "excludedNamespaces",
                json!(["ok", "Not-OK"]),
                "excludedNamespaces[1] (from x)",
            ),
            ("proxyUID", Json::Null, "proxyUID (from x): no value"),
        ];
        for (key, value, want) in cases {
            let mut v = chart_defaults().expect("defaults");
            let mut origins = Origins::default();
            let patch = json!({ *key: value });
            origins.record_tree(&patch, "x");
            coalesce(&mut v, patch);
            let err = validate(&v, &origins)
                .map(|_| ())
                .expect_err(&format!("{key}={value} should be rejected"));
            assert!(
                err.to_string().contains(want),
                "{key}={value}: error {err:?} should mention {want:?}"
            );
        }
    }

    /// What Helm's templates read as integers and text is accepted: numeric strings
    /// (`--set-string`, quoted YAML), whole floats (every number of a values file is a float to
    /// Helm), integers where text goes (`--set image.version=2`).
    #[test]
    fn values_are_read_as_helm_types_them() {
        let mut v = chart_defaults().expect("defaults");
        coalesce(
            &mut v,
            json!({
                "proxyUID": "2102", "proxyGID": "-1", "proxyAdminPort": "4191",
                "inboundProxyPort": 5143.0, "revisionHistoryLimit": "3",
                "ignoreInboundPorts": 8080, "image": {"version": 2},
                "agent": {"healthPort": "9991"},
                "resources": {"cpu": {"limit": 1}},
            }),
        );
        let ok = validate(&v, &Origins::default()).expect("accepted as Helm reads them");
        assert_eq!(
            (
                ok.proxy_uid,
                ok.proxy_gid,
                ok.proxy_admin_port,
                ok.inbound_proxy_port
            ),
            (2102, -1, 4191, 5143)
        );
        assert_eq!(ok.revision_history_limit, 3);
        assert_eq!(ok.agent.health_port, 9991);
        assert_eq!(
            (
                ok.ignore_inbound_ports.as_str(),
                ok.image.version.as_str(),
                ok.resources.cpu.limit.as_str()
            ),
            ("8080", "2", "1")
        );
    }

    /// An error names where the value came from: the last source that set it or a map above
    /// it, not one that set a sibling; the chart's values.yaml when nobody did.
    #[test]
    fn origins_follow_the_merge_order() {
        let mut o = Origins::default();
        o.record_tree(
            &json!({"image": {"name": "a", "version": "1"}, "tolerations": []}),
            "file a",
        );
        o.record(&[PathStep::Key("image"), PathStep::Key("version")], "--set");
        o.record(
            &[
                PathStep::Key("tolerations"),
                PathStep::Index(1),
                PathStep::Key("key"),
            ],
            "--set tolerations",
        );
        assert_eq!(o.of("image.name"), "file a");
        assert_eq!(o.of("image.version"), "--set");
        assert_eq!(o.of("image.pullPolicy"), CHART_ORIGIN);
        assert_eq!(o.of("tolerations[0].operator"), "file a");
        assert_eq!(o.of("tolerations[1].key"), "--set tolerations");
        assert_eq!(o.of("agent.logLevel"), CHART_ORIGIN);
        // A map made by a source that set a key under it is that source's.
        o.record(
            &[
                PathStep::Key("agent"),
                PathStep::Key("extra"),
                PathStep::Key("deep"),
            ],
            "--set deep",
        );
        assert_eq!(o.of("agent.extra"), "--set deep");
        assert_eq!(o.of("agent.logLevel"), CHART_ORIGIN);
        // A later file that sets the whole map takes it over; one that sets a map where a
        // scalar was no longer leaves the scalar's owner above it.
        o.record_tree(&json!({"image": "scalar"}), "file b");
        assert_eq!(o.of("image.version"), "file b");
        o.record(
            &[PathStep::Key("image"), PathStep::Key("name")],
            "--set image.name",
        );
        assert_eq!(o.of("image.name"), "--set image.name");
        assert_eq!(o.of("image.version"), CHART_ORIGIN);
    }
}
