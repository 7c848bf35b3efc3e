//! Checking merged values: each read as Helm's templates read it (a numeric string is an
//! integer), then what the templates cannot check (ports, paths, names), every error naming
//! the key path and where the value came from.

use std::{collections::BTreeMap, path::Path};

use linkerd_cni_common::paths;
use linkerd_cni_proto::config::{PortRange, parse_port_list};
use serde_json::{Map, Value as Json};

use super::{
    Agent, Image, MODES, Metrics, Origins, PodMonitor, RepairController, Resource, Resources,
    StartupTaint, Values, ValuesError,
};

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
                startup_taint: StartupTaint {
                    enabled: self.boolean("agent.startupTaint.enabled")?,
                    admission_policy: self.boolean("agent.startupTaint.admissionPolicy")?,
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

/// Checks merged values (after [`drop_unknown`](super::drop_unknown)): their types, then
/// what the templates cannot check. Every error names the key path and, from `origins`, the
/// file or flag it came from. Values are accepted as Helm's templates read them: integers also
/// as whole numbers (values files give floats) and as strings of decimal digits
/// (`--set-string`, quoted YAML); text also as integers (`--set image.version=2`).
pub fn validate(values: &Json, origins: &Origins) -> Result<Values, ValuesError> {
    let r = Reader {
        root: values,
        origins,
    };
    unprintable(values, &mut String::new(), &r)?;
    let mode = r.string("mode")?;
    if !MODES.contains(&mode.as_str()) {
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
    // The agent refuses the same paths at start (and the clean-up before touching anything):
    // one list and one check, `paths::check_node_paths`; the chart's `_paths.tpl` for Helm.
    let socket = Path::new(&v.agent.socket_path);
    let state_dir = socket.parent().unwrap_or(socket).join("pods");
    if let Err(conflict) = paths::check_node_paths(&paths::NodePaths {
        socket,
        state_dir: &state_dir,
        pin_root: Path::new(&v.agent.pin_root),
        bpffs: Path::new(&v.agent.bpffs_path),
        host_root: None,
    }) {
        let key = match conflict.what {
            "the pin root" => "agent.pinRoot",
            _ => "agent.socketPath",
        };
        return Err(r.err(key, conflict.to_string()));
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
