//! The linkerd-cni node agent: loads and pins the eBPF programs, meshes the pods the CNI
//! plugin registers, and keeps their redirection in force.
//!
//! Four layers, each a folder, each calling only the ones below it (kept by
//! `xtask/tests/layers.rs`):
//!
//! - [`service`]: the running agent: the registration socket ([`service::server`]), the
//!   health and metrics endpoint ([`service::health`]), the background passes and the stop
//!   ([`service::run`]); and the `inspect` view ([`service::inspect`]).
//! - [`agent`]: pods: registering and unregistering them, checking and garbage collection over
//!   the three stores of state (pinned maps, pinned links, [`agent::registry`]);
//!   [`agent::reconcile`] re-verifies every registered pod and repairs what was removed behind
//!   the agent's back; [`agent::adopt`] attaches redirection to meshed pods that started
//!   before the plugin was in the node's chain.
//! - [`dataplane`]: the eBPF side: loading the object, pinning, attaching; the pinned maps
//!   ([`dataplane::maps`]) and their layout across versions ([`dataplane::layout`]); how large
//!   the maps are ([`dataplane::capacity`]) and how much of them one pod may take
//!   ([`dataplane::limits`]); each pod's `sk_lookup` stub ([`dataplane::stub`]). The raw
//!   `bpf(2)` commands aya does not offer, the kernel probes and the socket calls are
//!   `linkerd_cni_sys`'s.
//! - [`host`]: facts read from the kernel and the filesystem: a pod's netns, cgroup and user
//!   namespace, a running pod as the host sees it, the kernel's features.

pub mod agent;
pub mod dataplane;
pub mod host;
pub mod service;

pub use agent::{Agent, AgentConfig, AgentError, Registration};
