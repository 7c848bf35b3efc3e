//! Test support for linkerd-cni's privileged tests, benchmarks and demos: real kernel objects
//! (network namespaces, veth pairs and bridges, cgroups, processes placed as a pod's
//! containers) that clean up on drop, the forwarding test proxy and test client binaries, and
//! servers that record where connections landed.
//!
//! Everything needs root. Traffic stays on loopback and inside netns made here.
//!
//! ```no_run
//! use linkerd_cni_tests::{EchoServer, PodAndPeer, client::{Options, run_client}, proxy};
//! # fn main() -> linkerd_cni_tests::Result<()> {
//! let w = PodAndPeer::new()?; // pod netns + cgroup, veth to a peer netns
//! let server = EchoServer::bind_in(&w.peer, (w.peer_v4(), 8080).into(), "server")?;
//! let proxy = w.pod.start_proxy(&proxy::Options::new())?; // UID 2102, in the pod
//! // ... redirect the pod (agent registration, or `iptables::Rules::default().install`) ...
//! let report = run_client(
//!     &w.pod.container(1000),
//!     &Options::new(server.addr()).send("hello\n"),
//!     std::time::Duration::from_secs(10),
//! )?;
//! assert!(report.received_matches(&server.expected_reply(b"hello\n")));
//! let events = proxy.log().wait_for_finished(1, std::time::Duration::from_secs(10))?;
//! # let _ = events;
//! # Ok(())
//! # }
//! ```

pub mod agent;
pub mod bins;
pub mod cgroup;
pub mod child;
pub mod client;
pub mod cniruntime;
pub mod diag;
pub mod echo;
pub mod error;
pub mod hostfs;
pub mod iptables;
pub mod layout;
pub mod link;
pub mod names;
pub mod netns;
pub mod node;
pub mod pod;
pub mod pool;
pub mod proxy;
pub mod strace;
pub mod tenant;
pub mod userns;

/// The fake Kubernetes API server (crate `linkerd-cni-fake-apiserver`).
pub use linkerd_cni_fake_apiserver as fake_apiserver;

pub use agent::AgentHarness;
pub use cgroup::CgroupGuard;
pub use child::{ChildGuard, Placement};
pub use echo::{EchoServer, UdpEcho};
pub use error::{Error, Result};
pub use link::{Bridge, IfAddr, VethPair};
pub use netns::NetnsGuard;
pub use pod::{Pod, PodAndPeer};
pub use proxy::TestProxy;
