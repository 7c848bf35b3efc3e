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

use serde_json::Value as Json;

mod merge;
mod origins;
mod source;
mod typed;
mod validate;
mod yaml;

#[cfg(test)]
mod tests;

pub use merge::{FREE_FORM, coalesce, drop_unknown, set_path, unknown_key_warning};
pub use origins::{CHART_ORIGIN, Origins, PathStep};
pub use source::{MAX_VALUES_BYTES, URL_TIMEOUT, ValuesSource, read_values_file};
pub use typed::{
    Agent, Image, Metrics, PodMonitor, RepairController, Resource, Resources, StartupTaint, Values,
};
pub use validate::{socket_dir_problem, validate};
pub use yaml::parse_yaml;

/// The chart's `values.yaml`.
pub const CHART_VALUES_YAML: &str = include_str!("../../../deploy/charts/linkerd2-cni/values.yaml");

/// Each node's agent chooses from its kernel's feature probes (the default).
pub const MODE_AUTO: &str = "auto";
/// The eBPF data plane.
pub const MODE_EBPF: &str = "ebpf";
/// The per-node fallback: Linkerd's own rules as nftables in each meshed pod's netns
/// (`docs/design/nftables.md`), forced for the whole cluster.
pub const MODE_IPTABLES: &str = "iptables";
/// Every mode the chart renders (the agent's `--mode` takes each).
pub const MODES: [&str; 3] = [MODE_AUTO, MODE_EBPF, MODE_IPTABLES];

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
    /// `mode` names a mode that does not exist.
    #[error("mode {0:?} is not supported: use mode \"auto\", \"ebpf\" or \"iptables\"")]
    Mode(String),
}

/// The chart's default values.
pub fn chart_defaults() -> Result<Json, ValuesError> {
    parse_yaml(CHART_VALUES_YAML, "the chart's values.yaml")
}
