//! Test support for linkerd-cni's privileged tests, benchmarks and demos: real kernel objects
//! (network namespaces, veth pairs and bridges, cgroups, processes placed as a pod's
//! containers) that clean up on drop, the forwarding test proxy and test client binaries, and
//! servers that record where connections landed.
//!
//! Everything needs root. Traffic stays on loopback and inside netns made here.

pub mod bins;
pub mod cgroup;
pub mod child;
pub mod client;
pub mod cniruntime;
pub mod echo;
pub mod error;
pub mod fake_apiserver;
pub mod iptables;
pub mod link;
pub mod names;
pub mod netns;
pub mod node;
pub mod pod;
mod pool;
pub mod proxy;

pub use cgroup::CgroupGuard;
pub use child::{ChildGuard, Placement};
pub use echo::{EchoServer, UdpEcho};
pub use error::{Error, Result};
pub use link::{Bridge, IfAddr, VethPair};
pub use netns::NetnsGuard;
pub use pod::{Pod, PodAndPeer};
pub use proxy::TestProxy;
