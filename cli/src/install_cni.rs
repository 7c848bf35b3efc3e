//! `linkerd install-cni`: renders the `linkerd2-cni` chart for `kubectl apply -f -`, with
//! Linkerd's flags (every one honoured) plus `--mode`.
//!
//! Values are layered as Linkerd's `install-cni` layers them: the chart's `values.yaml` with
//! the values the flags stand for (on the command line or through their environment variable)
//! is the base, and each `-f` source in order, then `--set`, `--set-string` and `--set-file`
//! are coalesced over it, so a values file wins over a flag ([`merged_values`]).

use clap::{ArgMatches, Args, parser::ValueSource};
use linkerd_cni_proto::config::{DEFAULT_INBOUND_PORT, DEFAULT_OUTBOUND_PORT, PortRange};
use serde_json::Value as Json;

use crate::{
    chart::{self, RenderError},
    set_values::{self, SetError, SetKind, Step},
    values::{self, Origins, ValuesError},
};

/// Prefix of the environment variables of `install-cni`'s flags.
pub const ENV_PREFIX: &str = "LINKERD_INSTALL_CNI_";

/// Linkerd's environment variable for the image registry, the default of `--registry`.
pub const DOCKER_REGISTRY_ENV: &str = "LINKERD_DOCKER_REGISTRY";

/// The log levels `--cni-log-level` accepts: Linkerd's (logrus's, `warning` included, any case).
pub const CNI_LOG_LEVELS: &[&str] = &[
    "panic", "fatal", "error", "warn", "warning", "info", "debug", "trace",
];

/// Why `install-cni` could not produce manifests.
#[derive(Debug, thiserror::Error)]
pub enum InstallCniError {
    #[error(transparent)]
    Values(#[from] ValuesError),
    #[error(transparent)]
    Render(#[from] RenderError),
    #[error(transparent)]
    Set(#[from] SetError),
    /// `--registry` (or `LINKERD_DOCKER_REGISTRY`) is not a registry.
    #[error(
        "{0} is not a valid Docker registry. The url can contain only letters, numbers, dash, dot, \
         slash and colon"
    )]
    Registry(String),
    /// `-v/--linkerd-version` is not a version.
    #[error("{0} is not a valid version")]
    Version(String),
}

fn port(s: &str) -> Result<u16, String> {
    match s.trim().parse::<u16>() {
        Ok(0) | Err(_) => Err(format!("{s:?} is not a port (1-65535)")),
        Ok(p) => Ok(p),
    }
}

fn port_range(s: &str) -> Result<String, String> {
    s.parse::<PortRange>()
        .map(|r| r.to_string())
        .map_err(|e| e.to_string())
}

fn log_level(s: &str) -> Result<String, String> {
    if CNI_LOG_LEVELS.iter().any(|l| l.eq_ignore_ascii_case(s)) {
        Ok(s.to_string())
    } else {
        Err("--cni-log-level must be one of: panic, fatal, error, warn, info, debug, trace".into())
    }
}

fn check_version(v: &str) -> Result<(), InstallCniError> {
    if !v.is_empty()
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
    {
        Ok(())
    } else {
        Err(InstallCniError::Version(v.to_string()))
    }
}

/// Linkerd's default registry (`--registry`'s default): a `--registry` equal to it leaves the
/// image as it is, as in Linkerd.
pub const DEFAULT_REGISTRY: &str = "cr.l5d.io/linkerd";

fn check_registry(registry: &str) -> Result<(), InstallCniError> {
    if !registry.is_empty()
        && registry
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-./:".contains(c))
    {
        Ok(())
    } else {
        Err(InstallCniError::Registry(registry.to_string()))
    }
}

/// The registry that replaces the image's, and where it came from, as Linkerd decides:
/// `LINKERD_DOCKER_REGISTRY` when set (it overrides `--registry`), else `--registry` unless it
/// is [`DEFAULT_REGISTRY`]. Both are checked as Linkerd checks `--registry` (Linkerd does not
/// check the environment variable; a registry with a space or a `!` renders nothing useful).
fn registry(
    args: &InstallCniArgs,
    matches: &ArgMatches,
) -> Result<Option<(String, String)>, InstallCniError> {
    check_registry(&args.registry)?;
    if let Ok(env) = std::env::var(DOCKER_REGISTRY_ENV)
        && !env.is_empty()
    {
        check_registry(&env)?;
        return Ok(Some((env, format!("${DOCKER_REGISTRY_ENV}"))));
    }
    if args.registry != DEFAULT_REGISTRY {
        return Ok(Some((
            args.registry.clone(),
            flag_origin(matches, "registry"),
        )));
    }
    Ok(None)
}

fn mode(s: &str) -> Result<String, String> {
    match s {
        s if values::MODES.contains(&s) => Ok(s.to_string()),
        other => Err(ValuesError::Mode(other.to_string()).to_string()),
    }
}

/// The flags of `linkerd install-cni`. Defaults are the chart's (a test checks they agree).
#[derive(Args, Debug, Clone)]
pub struct InstallCniArgs {
    /// Redirection mode: "auto" (each node's agent asks its kernel's feature probes: the eBPF
    /// data plane where the kernel has every feature it needs, else Linkerd's rules), "ebpf"
    /// (the eBPF data plane; refused below the floor), or "iptables": Linkerd's own rules, one
    /// nftables table in each meshed pod's network namespace, written by the plugin over
    /// netlink (no host binary), on every node.
    #[arg(long, env = "LINKERD_INSTALL_CNI_MODE", default_value = "auto", value_parser = mode)]
    pub mode: String,
    /// UID of the proxy: its sockets are never redirected.
    #[arg(long, env = "LINKERD_INSTALL_CNI_PROXY_UID", default_value_t = i64::from(linkerd_cni_k8s::names::DEFAULT_PROXY_UID), value_parser = clap::value_parser!(i64).range(0..=i64::from(u32::MAX)))]
    pub proxy_uid: i64,
    /// GID of the proxy: its sockets are never redirected; negative for none.
    #[arg(long, env = "LINKERD_INSTALL_CNI_PROXY_GID", default_value_t = -1, allow_negative_numbers = true, value_parser = clap::value_parser!(i64).range(..=i64::from(u32::MAX)))]
    pub proxy_gid: i64,
    /// Port of the proxy's inbound listener.
    #[arg(long, env = "LINKERD_INSTALL_CNI_INBOUND_PORT", default_value_t = DEFAULT_INBOUND_PORT, value_parser = port)]
    pub inbound_port: u16,
    /// Port of the proxy's outbound listener.
    #[arg(long, env = "LINKERD_INSTALL_CNI_OUTBOUND_PORT", default_value_t = DEFAULT_OUTBOUND_PORT, value_parser = port)]
    pub outbound_port: u16,
    /// The proxy's control port, never redirected inbound.
    #[arg(long, env = "LINKERD_INSTALL_CNI_CONTROL_PORT", default_value_t = 4190, value_parser = port)]
    pub control_port: u16,
    /// The proxy's admin port, never redirected inbound.
    #[arg(long, env = "LINKERD_INSTALL_CNI_ADMIN_PORT", default_value_t = 4191, value_parser = port)]
    pub admin_port: u16,
    /// Inbound ports or ranges (8080, 9000-9100) never redirected; comma-separated or repeated.
    #[arg(long, env = "LINKERD_INSTALL_CNI_SKIP_INBOUND_PORTS", value_delimiter = ',', value_parser = port_range)]
    pub skip_inbound_ports: Vec<String>,
    /// Outbound ports or ranges never redirected; comma-separated or repeated.
    #[arg(long, env = "LINKERD_INSTALL_CNI_SKIP_OUTBOUND_PORTS", value_delimiter = ',', value_parser = port_range)]
    pub skip_outbound_ports: Vec<String>,
    /// Inbound ports to redirect (default: all); comma-separated or repeated.
    #[arg(long, env = "LINKERD_INSTALL_CNI_REDIRECT_PORTS", value_delimiter = ',', value_parser = port)]
    pub redirect_ports: Vec<u16>,
    /// Image of the node agent and plugin.
    #[arg(
        long,
        env = "LINKERD_INSTALL_CNI_CNI_IMAGE",
        default_value = "ghcr.io/linkerd/linkerd-cni-ebpf"
    )]
    pub cni_image: String,
    /// Tag of that image [default: the chart's appVersion].
    #[arg(long, env = "LINKERD_INSTALL_CNI_CNI_IMAGE_VERSION")]
    pub cni_image_version: Option<String>,
    /// Log level of the CNI plugin: panic, fatal, error, warn, info, debug, trace (the plugin
    /// logs at debug, info, or else warn).
    #[arg(
        long,
        env = "LINKERD_INSTALL_CNI_CNI_LOG_LEVEL",
        default_value = "info",
        value_parser = log_level
    )]
    pub cni_log_level: String,
    /// Log format of the node agent: plain or json (as Linkerd's --proxy-log-format and
    /// --controller-log-format).
    #[arg(
        long,
        env = "LINKERD_INSTALL_CNI_AGENT_LOG_FORMAT",
        default_value = "plain",
        value_parser = ["plain", "json"]
    )]
    pub agent_log_format: String,
    /// Host directory of CNI network configs.
    #[arg(
        long,
        env = "LINKERD_INSTALL_CNI_DEST_CNI_NET_DIR",
        default_value = "/etc/cni/net.d"
    )]
    pub dest_cni_net_dir: String,
    /// Host directory of CNI plugin binaries.
    #[arg(
        long,
        env = "LINKERD_INSTALL_CNI_DEST_CNI_BIN_DIR",
        default_value = "/opt/cni/bin"
    )]
    pub dest_cni_bin_dir: String,
    /// PriorityClass of the DaemonSet's pods; empty for none.
    #[arg(
        long,
        env = "LINKERD_INSTALL_CNI_PRIORITY_CLASS_NAME",
        default_value = "system-node-critical"
    )]
    pub priority_class_name: String,
    /// iptables mode only (accepted and ignored in eBPF mode).
    #[arg(long, env = "LINKERD_INSTALL_CNI_USE_WAIT_FLAG", default_value_t = false, num_args = 0..=1,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    pub use_wait_flag: bool,
    /// Registry of the image: replaces what comes before the last "/" of --cni-image; the
    /// default (Linkerd's registry) leaves the image as it is. $LINKERD_DOCKER_REGISTRY, when
    /// set, overrides this flag, as in Linkerd.
    #[arg(long, env = "LINKERD_INSTALL_CNI_REGISTRY", default_value = DEFAULT_REGISTRY)]
    pub registry: String,
    /// Linkerd's version (accepted and checked as Linkerd checks it; the image's tag is
    /// --cni-image-version, as in Linkerd).
    #[arg(short = 'v', long, env = "LINKERD_INSTALL_CNI_LINKERD_VERSION")]
    pub linkerd_version: Option<String>,
    /// Values files (YAML), applied in order over the flags: a path, `-` for standard input,
    /// or an http(s) URL; comma-separated or repeated, as in Linkerd.
    #[arg(
        short = 'f',
        long = "values",
        value_name = "FILE|URL",
        value_delimiter = ','
    )]
    pub values: Vec<String>,
    /// Set values (key.sub=value[,key=value]), applied after the values files; `{a,b}` is a
    /// list, `key[0]` a list element, `\,` escapes.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Set string values (as --set, every value a string), applied after --set.
    #[arg(long = "set-string", value_name = "KEY=VALUE")]
    pub set_string: Vec<String>,
    /// Set values from files (key=path[,key=path]), applied after --set-string.
    #[arg(long = "set-file", value_name = "KEY=PATH")]
    pub set_file: Vec<String>,
}

/// How a flag's raw value becomes a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlagKind {
    Int,
    Bool,
    Str,
    /// A repeated/comma-separated flag, joined with commas into one string (Linkerd's shape).
    List,
}

/// Every flag that maps directly onto a chart value: (clap argument id, values path, kind).
/// `--registry`, `-f` and `--set` act on values in their own way.
pub const FLAG_VALUES: &[(&str, &str, FlagKind)] = &[
    ("mode", "mode", FlagKind::Str),
    ("proxy_uid", "proxyUID", FlagKind::Int),
    ("proxy_gid", "proxyGID", FlagKind::Int),
    ("inbound_port", "inboundProxyPort", FlagKind::Int),
    ("outbound_port", "outboundProxyPort", FlagKind::Int),
    ("control_port", "proxyControlPort", FlagKind::Int),
    ("admin_port", "proxyAdminPort", FlagKind::Int),
    ("skip_inbound_ports", "ignoreInboundPorts", FlagKind::List),
    ("skip_outbound_ports", "ignoreOutboundPorts", FlagKind::List),
    ("redirect_ports", "portsToRedirect", FlagKind::List),
    ("cni_image", "image.name", FlagKind::Str),
    ("cni_image_version", "image.version", FlagKind::Str),
    ("cni_log_level", "logLevel", FlagKind::Str),
    ("agent_log_format", "agent.logFormat", FlagKind::Str),
    ("dest_cni_net_dir", "destCNINetDir", FlagKind::Str),
    ("dest_cni_bin_dir", "destCNIBinDir", FlagKind::Str),
    ("priority_class_name", "priorityClassName", FlagKind::Str),
    ("use_wait_flag", "useWaitFlag", FlagKind::Bool),
];

/// Converts a flag's raw strings (already checked by its parser) to a value.
pub fn flag_json(kind: FlagKind, raw: &[String]) -> Json {
    let one = raw.last().cloned().unwrap_or_default();
    match kind {
        FlagKind::Int => one
            .trim()
            .parse::<i64>()
            .map(Json::from)
            .unwrap_or(Json::String(one)),
        FlagKind::Bool => Json::Bool(one == "true"),
        FlagKind::Str => Json::String(one),
        FlagKind::List => Json::String(raw.iter().map(|s| s.trim()).collect::<Vec<_>>().join(",")),
    }
}

fn steps(dotted: &str) -> Vec<Step> {
    dotted
        .split('.')
        .map(|k| Step::Key(k.to_string()))
        .collect()
}

fn explicit(matches: &ArgMatches, id: &str) -> bool {
    matches!(
        matches.value_source(id),
        Some(ValueSource::CommandLine | ValueSource::EnvVariable)
    )
}

/// How an error names a flag's value: `--flag`, or the environment variable that stood for it.
fn flag_origin(matches: &ArgMatches, id: &str) -> String {
    match matches.value_source(id) {
        Some(ValueSource::EnvVariable) => format!("${ENV_PREFIX}{}", id.to_uppercase()),
        Some(ValueSource::DefaultValue) => format!("the default of --{}", id.replace('_', "-")),
        _ => format!("--{}", id.replace('_', "-")),
    }
}

fn raw(matches: &ArgMatches, id: &str) -> Vec<String> {
    matches
        .get_raw(id)
        .map(|vals| vals.map(|v| v.to_string_lossy().into_owned()).collect())
        .unwrap_or_default()
}

/// `--registry`: the image name with everything before its last "/" replaced.
pub fn with_registry(image: &str, registry: &str) -> String {
    let base = image.rsplit_once('/').map_or(image, |(_, b)| b);
    format!("{}/{base}", registry.trim_end_matches('/'))
}

/// `cliVersion` as `linkerd install-cni` sets it, as Linkerd's does: the value of the
/// `linkerd.io/created-by` annotation of the DaemonSet and its pods.
pub fn created_by() -> String {
    format!("linkerd/cli {}", crate::version::CLIENT_VERSION)
}

fn path_steps(steps: &[Step]) -> Vec<values::PathStep<'_>> {
    steps
        .iter()
        .map(|s| match s {
            Step::Key(k) => values::PathStep::Key(k),
            Step::Index(i) => values::PathStep::Index(*i),
        })
        .collect()
}

/// The merged values for these arguments, and where each came from.
///
/// As Linkerd's `install-cni`: the values its flags stand for (every flag, at its value or its
/// default, which is the chart's; the image with the registry applied; `cliVersion`) are the
/// base, and the values files, `--set`, `--set-string` and `--set-file` (Helm's order) are
/// coalesced over them, so a values file wins over a flag. The overrides are gathered first
/// and coalesced as a whole, so a list they set replaces the base's list, as with Helm.
pub fn merged_values(
    args: &InstallCniArgs,
    matches: &ArgMatches,
) -> Result<(Json, Origins), InstallCniError> {
    let mut base = values::chart_defaults()?;
    let mut origins = Origins::default();
    for (id, key, kind) in FLAG_VALUES {
        if explicit(matches, id) {
            let steps = steps(key);
            set_values::set(&mut base, &steps, flag_json(*kind, &raw(matches, id)));
            origins.record(&path_steps(&steps), &flag_origin(matches, id));
        }
    }
    if let Some((registry, origin)) = registry(args, matches)? {
        let image = base
            .pointer("/image/name")
            .and_then(Json::as_str)
            .unwrap_or_default()
            .to_string();
        let steps = steps("image.name");
        set_values::set(
            &mut base,
            &steps,
            Json::String(with_registry(&image, &registry)),
        );
        origins.record(&path_steps(&steps), &origin);
    }
    set_values::set(&mut base, &steps("cliVersion"), Json::String(created_by()));

    let mut overrides = Json::Object(Default::default());
    for arg in &args.values {
        let source = values::ValuesSource::parse(arg);
        let tree = source.read()?;
        origins.record_tree(&tree, &source.origin());
        set_values::merge_file(&mut overrides, tree);
    }
    for (kind, flag, exprs) in [
        (SetKind::Typed, "--set", &args.set),
        (SetKind::String, "--set-string", &args.set_string),
        (SetKind::File, "--set-file", &args.set_file),
    ] {
        for expr in exprs {
            for (key, value) in set_values::parse(kind, expr)? {
                origins.record(
                    &path_steps(&key),
                    &format!("{flag} {:?}", set_values::shown(expr)),
                );
                set_values::set(&mut overrides, &key, value);
            }
        }
    }
    values::coalesce(&mut base, overrides);
    Ok((base, origins))
}

/// What `install-cni` prints: the manifests, and warnings for standard error.
#[derive(Debug)]
pub struct Rendered {
    pub manifests: String,
    /// One line per value the chart does not have (ignored, as Helm ignores it).
    pub warnings: Vec<String>,
}

/// Renders the manifests for these arguments into `namespace` (`--cni-namespace`).
pub fn render(
    args: &InstallCniArgs,
    matches: &ArgMatches,
    namespace: &str,
) -> Result<Rendered, InstallCniError> {
    if let Some(version) = &args.linkerd_version {
        check_version(version)?;
    }
    let (mut v, origins) = merged_values(args, matches)?;
    let unknown = values::drop_unknown(&mut v, &values::chart_defaults()?);
    let checked = values::validate(&v, &origins)?;
    let mut warnings: Vec<String> = unknown
        .iter()
        .map(|k| values::unknown_key_warning(k, origins.of(k)))
        .collect();
    if checked.image.name.ends_with(LINKERD_IPTABLES_IMAGE) {
        warnings.push(linkerd_image_warning(&checked.image.name));
    }
    if checked.privileged {
        warnings.push(PRIVILEGED_WARNING.to_string());
    }
    Ok(Rendered {
        manifests: chart::render(&v, namespace)?,
        warnings,
    })
}

/// The last part of the name of Linkerd's iptables plugin image (`cr.l5d.io/linkerd/cni-plugin`),
/// which values files written for Linkerd's chart set as `image.name`.
pub const LINKERD_IPTABLES_IMAGE: &str = "/cni-plugin";

/// The warning for `privileged: true`, which Linkerd's chart uses on SELinux-enforcing nodes
/// and which changes nothing here (the chart's NOTES.txt says the same to Helm users).
pub const PRIVILEGED_WARNING: &str = "warning: privileged has no effect in eBPF mode: the agent \
     container holds a list of capabilities and is never privileged. On SELinux-enforcing nodes \
     (what Linkerd's chart uses privileged for), set agent.seLinuxOptions.type=spc_t instead.";

/// The warning for an `image.name` that looks like Linkerd's iptables plugin image.
pub fn linkerd_image_warning(image: &str) -> String {
    format!(
        "warning: image.name {image:?} looks like Linkerd's iptables plugin image, which has no \
         linkerd-cni-agent: the DaemonSet's pods would not start; remove image.name (and \
         image.version) from the values to use this chart's image"
    )
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;

    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        args: InstallCniArgs,
    }

    /// The flags' defaults are the chart's defaults, so a flag left alone changes nothing.
    #[test]
    fn flag_defaults_are_the_chart_defaults() {
        let defaults = values::chart_defaults().expect("defaults");
        let cmd = Wrap::command();
        for (id, key, kind) in FLAG_VALUES {
            let arg = cmd
                .get_arguments()
                .find(|a| a.get_id() == *id)
                .unwrap_or_else(|| panic!("FLAG_VALUES names {id}, which is not a flag"));
            let raw: Vec<String> = arg
                .get_default_values()
                .iter()
                .map(|s| s.to_string_lossy().into_owned())
                .collect();
            let want = defaults
                .pointer(&format!("/{}", key.replace('.', "/")))
                .unwrap_or_else(|| panic!("no value {key}"));
            let got = if raw.is_empty() {
                Json::String(String::new())
            } else {
                flag_json(*kind, &raw)
            };
            assert_eq!(
                &got,
                want,
                "--{} default vs values {key}",
                arg.get_long().unwrap_or(id)
            );
        }
    }

    /// Every flag has an environment variable with the product prefix.
    #[test]
    fn every_flag_has_a_prefixed_env_var() {
        for arg in Wrap::command().get_arguments() {
            let id = arg.get_id().as_str();
            if ["values", "set", "set_string", "set_file"].contains(&id) {
                continue;
            }
            let env = arg
                .get_env()
                .unwrap_or_else(|| panic!("--{id} has no env var"))
                .to_string_lossy();
            assert_eq!(
                env,
                format!("{ENV_PREFIX}{}", id.to_uppercase()),
                "env var of --{id}"
            );
        }
    }

    #[test]
    fn registry_replaces_the_registry_part() {
        for (image, reg, want) in [
            (
                "ghcr.io/linkerd/linkerd-cni-ebpf",
                "my.reg/x",
                "my.reg/x/linkerd-cni-ebpf",
            ),
            ("plain", "r/", "r/plain"),
        ] {
            assert_eq!(with_registry(image, reg), want);
        }
    }
}
