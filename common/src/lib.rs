//! The contract between the linkerd-cni eBPF programs and the node agent: the `#[repr(C)]`
//! structs stored in the maps, the map names and the program table (name and hook of every
//! program), the kernel constants both sides use, the bpffs pin layout, and the table of kernel
//! features the programs need.
//!
//! Every struct here has no implicit padding (explicit `_pad` fields, `u32` flags instead of
//! `bool`) and a size assertion, so the kernel and user sides can never disagree on layout.
#![no_std]

pub mod kernel;
pub mod names;
pub mod paths;
#[cfg(feature = "probe")]
pub mod probe;
#[cfg(feature = "query")]
pub mod query;
#[cfg(any(feature = "probe", feature = "query"))]
pub mod sys;
pub mod types;
#[cfg(feature = "userns")]
pub mod userns;

pub use types::*;
