//! The instruments, the lowest layer: CPU time of a window ([`cpu`]), the kernel's BPF
//! run-time statistics ([`bpfstats`]), where the agent's per-pod time and memory go ([`diag`],
//! [`scale`]) and statistics over samples ([`stats`]). Imports nothing else of the crate.

pub mod bpfstats;
pub mod cpu;
pub mod diag;
pub mod scale;
pub mod stats;
