//! The kernel's raw interface for linkerd-cni, in one crate: the one `bpf(2)` call and every
//! command issued through it ([`bpf`]), the kernel feature probes ([`probe`]), the socket calls
//! ([`sock`]: netns cookie, `SIOCGSKNS`, `SCM_RIGHTS` both ends), namespace files ([`ns`]), and
//! every kernel number ([`uapi`]). The agent, the CNI plugin, the CLI, the tests and the
//! benchmark reach the kernel's raw interface through here; `xtask/tests/kernel_numbers.rs`
//! fails on a `bpf(2)` call or a second definition of a kernel number anywhere else.
//!
//! Where each number lives: once, here in [`uapi`], unless the eBPF programs need it too. Those
//! live in `linkerd-cni-common`, the `no_std` contract both sides build against (this crate is
//! std and cannot be), and [`uapi`] re-exports them: a hook's program and attach types are its
//! row in `common/src/names.rs` (`Hook::row`, a hook's facts in one place), and
//! `SO_ORIGINAL_DST` with its levels sits beside the socket families in `common/src/types.rs`
//! (the option `l5d_getsockopt` answers and the proxy asks).
//!
//! std and libc only, and nothing of ours but `linkerd-cni-common` (`xtask/tests/layers.rs`):
//! the CNI plugin, a small static binary, depends on it.

pub mod bpf;
pub mod ns;
pub mod probe;
pub mod sock;
pub mod uapi;
