//! The contract between the linkerd-cni eBPF programs and the node agent: the `#[repr(C)]`
//! structs stored in the maps, the map names and the program table (name and hook of every
//! program), the kernel constants both sides use, the bpffs pin layout, and the table of kernel
//! features the programs need.
//!
//! Every struct here has no implicit padding (explicit `_pad` fields, `u32` flags instead of
//! `bool`) and a size assertion, so the kernel and user sides can never disagree on layout.
//!
//! The raw calls to the kernel (`bpf(2)`, the probes, socket options) are not here but in
//! `linkerd-cni-sys`, which builds on this crate: only the numbers the eBPF programs need too
//! (each hook's program and attach types, `SO_ORIGINAL_DST`) are defined here.
#![no_std]

pub mod kernel;
pub mod names;
pub mod paths;
pub mod types;

pub use types::*;
