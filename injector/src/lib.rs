//! Linkerd proxy injection honouring `cniEnabled`.
//!
//! - [`decision`]: whether a pod gets a proxy (`linkerd.io/inject` on pod and namespace).
//! - [`patch`]: what injection adds (`linkerd-proxy` as a native sidecar, and either
//!   `linkerd-init` or, with `cniEnabled`, `linkerd-network-validator`) as an RFC 6902 patch;
//!   [`patch::injected_pod`] turns a pod JSON into the injected pod JSON.
//! - [`values`]: the control plane's values in ConfigMap `linkerd-config`.
//! - [`admission`], [`webhook`], [`server`], [`metrics`], [`tls`]: the HTTPS admission webhook
//!   (binary `linkerd-proxy-injector`).
//! - [`paths`]: where the webhook and injected pods keep their files.
//!
//! Linkerd's names (containers, annotations, labels, objects) are `linkerd_cni_k8s::names`,
//! shared with the node agent's decision; `linkerd inject`, `linkerd install` and the
//! post-install checks live in the CLI (`linkerd-cli`), on top of this crate.

#![forbid(unsafe_code)]

pub mod admission;
pub mod decision;
pub mod metrics;
pub mod patch;
pub mod paths;
pub mod server;
pub mod tls;
pub mod values;
pub mod webhook;

pub use decision::{Decision, InjectMode, SkipReason};
pub use patch::{InjectContext, InjectError, inject_pod, injected_pod, uninject_pod};
pub use values::Values;
