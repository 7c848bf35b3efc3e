//! What the `linkerd-cni` plugin and the node agent say to each other.
//!
//! - [`config`]: the `linkerd` section of the CNI network config (Linkerd's keys, parsed and
//!   validated once), ports, port ranges and CIDRs.
//! - [`wire`]: the versioned request/response protocol over the agent's Unix socket.
//! - [`escape`]: how both sides log text that came from outside (escaped, one line per record).
//!
//! Kept free of async runtimes and TLS so the plugin binary stays small and starts fast.

#![forbid(unsafe_code)]

pub mod config;
pub mod escape;
pub mod wire;
