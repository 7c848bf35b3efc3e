//! `cargo xtask demo`: sets up the machine, builds the eBPF object and the binaries, then runs
//! `linkerd-cni-demo` (in `tests/`): a simulated node where libcni meshes a client pod, leaves
//! an unmeshed pod alone, shows the agent's view and `bpftool`'s, and tears everything down.

use anyhow::bail;

use crate::{
    build::{dist, ebpf::build_ebpf},
    exec::{cargo, nix_is_root, run},
    setup,
};

/// The packages whose binaries the demo runs: the plugin, the agent, and the test-support
/// binaries (fake API server, forwarding proxy, client, the demo itself).
const PACKAGES: [&str; 4] = [
    "linkerd-cni-plugin",
    "linkerd-cni-agent",
    "linkerd-cni-fake-apiserver",
    "linkerd-cni-tests",
];

pub fn demo() -> anyhow::Result<()> {
    if !nix_is_root() {
        bail!(
            "the demo installs packages, loads BPF programs and creates network namespaces and cgroups: run it as root"
        );
    }
    setup::setup(false)?;
    build_ebpf()?;
    let mut build = cargo();
    build.args(["build", "--bins"]);
    for p in PACKAGES {
        build.args(["-p", p]);
    }
    run(&mut build)?;
    // The plugin as shipped (replaces the one just built).
    dist::build_plugin(false)?;
    run(cargo().args([
        "run",
        "--quiet",
        "-p",
        "linkerd-cni-tests",
        "--bin",
        "linkerd-cni-demo",
    ]))
}
