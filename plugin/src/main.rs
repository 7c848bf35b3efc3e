//! The `linkerd-cni` binary: see the library for everything it does.

fn main() {
    std::process::exit(linkerd_cni_plugin::run_process());
}
