//! The linkerd-cni node agent: loads and pins the eBPF programs, meshes the pods the CNI
//! plugin registers, and keeps their redirection in force.
//!
//! - [`agent`]: the library API (register, unregister, check, gc) over the three stores of
//!   state: pinned maps, pinned links and the registry; [`agent::reconcile`] re-verifies every
//!   registered pod and repairs what was removed behind the agent's back.
//! - [`dataplane`]: loading the object, pinning, attaching. [`maps`]: the pinned maps.
//!   [`layout`]: the pinned state's layout version, upgrades and rollbacks.
//! - [`netns`], [`userns`], [`cgroup`], [`kernel`]: the host facts registration depends on.
//! - [`limits`]: how much of the node-wide maps one pod may take; [`capacity`]: how large
//!   the node-wide maps are (configured).
//! - [`inspect`]: the human view of the pinned state.
//! - [`adopt`]: attaching redirection to meshed pods that started before the plugin was in the
//!   node's chain, found from the host's side by [`podscan`].

pub mod adopt;
pub mod agent;
pub mod bpf_sys;
pub mod capacity;
pub mod cgroup;
pub mod dataplane;
pub mod health;
#[cfg(feature = "heap-profile")]
pub mod heap_profile;
pub mod inspect;
pub mod kernel;
pub mod layout;
pub mod limits;
pub mod maps;
pub mod maps_lock;
pub mod netns;
pub mod podscan;
pub mod registry;
pub mod server;
pub mod userns;

pub use agent::{Agent, AgentConfig, AgentError, Registration};
