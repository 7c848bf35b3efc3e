//! What is measured, one module per scenario: [`traffic`] (1-3: connections, throughput,
//! persistent connections), [`podsetup`] (4-5: CNI ADD and DEL, the agent's footprint),
//! [`restart`] (6: the agent killed under load), [`apiload`] (7: Kubernetes API load),
//! [`crisandbox`] (8: RunPodSandbox through containerd), [`upgrade`] (9: the agent replaced
//! under load), [`chain`] (another tenant's socket LB, the feature probes) and [`imagesize`]
//! (the DaemonSet's image).

pub mod apiload;
pub mod chain;
pub mod crisandbox;
pub mod imagesize;
pub mod podsetup;
pub mod restart;
pub mod traffic;
pub mod upgrade;
