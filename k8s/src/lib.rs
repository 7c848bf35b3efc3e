//! The node agent's Kubernetes side: decides from the API whether a pod's traffic is redirected
//! to its proxy, and with which per-pod overrides (the contract's section 2).
//!
//! - [`decision::decide`] is the pure rule: Pod + Namespace + `default/kubernetes` Service +
//!   the conflist's `linkerd` section in, [`Decision`] out.
//! - [`PodSource`] feeds it from a watch cache of this node's pods, with direct GETs for what
//!   the cache does not hold yet.
//! - [`client::ClientBuilder`] builds the API client for every binary of the project;
//!   [`client::client`] is the agent's (in-cluster, or from a kubeconfig file).
//! - [`overrides`]: the pod overrides (`config.linkerd.io/*` annotations) in one table, with
//!   their conflist keys, fields, replace or append, and parsers; the decision, the data
//!   plane's per-pod limits and the proxy injector read it, `docs/operating/annotations.md`
//!   shows it.
//! - [`names`]: Linkerd's vocabulary (container names, annotation and label keys, object
//!   names, defaults), shared with the proxy injector and the CLI.
//! - [`events::EventRecorder`]: Events on pods (redirected, refused, repaired, unredirected),
//!   aggregated, rate-limited and never waited for.
//! - [`taint`]: the node's startup taint, removed by the agent once it is ready.
//! - [`termination::termination`]: on SIGTERM, a rollout or an uninstall, from the agent's
//!   own DaemonSet.

#![forbid(unsafe_code)]

pub mod client;
pub mod decision;
mod error;
pub mod events;
pub mod names;
pub mod overrides;
pub mod podcache;
pub mod source;
pub mod taint;
pub mod termination;

pub use decision::{AnnotationError, Decision};
pub use error::K8sError;
pub use podcache::CachedPod;
pub use source::{NamespaceOrigin, PodOrigin, PodSource};
