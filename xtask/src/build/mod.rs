//! Building what ships, one layer per file, each using only those below it:
//!
//! - `image`: the DaemonSet's image, OCI archives of `dist`'s files;
//! - `dist`: the shipped binaries (static agent, static plugin) and their places in the image;
//! - `cross`: one static binary for a target, cross-built when the target is another
//!   architecture, and unit tests run under qemu-user;
//! - `musl`: the plugin's C library (Debian's `musl-gcc`, or musl and libunwind built from
//!   Debian's sources);
//! - `target`, `elf`, `ebpf`: the targets (architecture, C library, where std comes from), the
//!   checks of a built binary's ELF headers, and the eBPF object.

pub mod cross;
pub mod dist;
pub mod ebpf;
pub mod elf;
pub mod image;
pub mod musl;
pub mod target;
