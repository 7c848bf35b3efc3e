//! The `linkerd` command line (the eBPF mode's edition): `install-cni` renders the
//! `linkerd2-cni` chart, `check` checks the installation and the node, `version` prints the
//! client's and the control plane's versions. One module per subcommand; the chart and its
//! values live in [`chart`] and [`values`], the flags every subcommand takes in [`kubernetes`].

#![forbid(unsafe_code)]

pub mod chart;
pub mod check;
pub mod install_cni;
pub mod kubernetes;
pub mod set_values;
pub mod values;
pub mod version;

// `install` and `inject`/`uninject`, on top of `linkerd-injector`'s patch logic and values.
pub mod inject;
pub mod install;
pub mod manifest;
