//! The `linkerd-cni` binary: see the library for everything it does.
//!
//! `no_main`: the C `main` below is the entry point, so std's runtime start-up is skipped.
//! That start-up (finding the main thread's stack guard by reading `/proc/self/maps`, an
//! alternate signal stack, SIGSEGV/SIGBUS handlers) is a third of the plugin's run time on a
//! small VM, and a plugin that runs for a millisecond needs none of it. What it did that the
//! plugin relies on is done here: SIGPIPE ignored, so a runtime that closed our stdout makes
//! the write fail (logged, exit 1) rather than kill us silently.

#![no_main]

/// The process entry point (called by the C runtime with `argc`, `argv`; unused: the CNI
/// speaks through the environment and stdin).
#[unsafe(no_mangle)]
pub extern "C" fn main(
    _argc: std::ffi::c_int,
    _argv: *const *const std::ffi::c_char,
) -> std::ffi::c_int {
    // SAFETY: setting a signal's disposition to SIG_IGN has no preconditions.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    // A panic must not unwind out of a C function (that aborts): it ends the plugin with
    // std's exit code for a panicking `main`, its message printed by the panic hook.
    let code = std::panic::catch_unwind(linkerd_cni_plugin::run_process).unwrap_or(101);
    std::process::exit(code)
}
