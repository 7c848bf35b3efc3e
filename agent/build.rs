//! Builds the eBPF object the agent embeds (see `linkerd-cni-ebpf-build`), or fails with one
//! line saying which command to run.

use std::path::Path;

fn main() {
    let manifest = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let workspace = Path::new(&manifest)
        .parent()
        .expect("agent/ lives in the workspace root");
    for path in linkerd_cni_ebpf_build::source_paths(workspace) {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    println!("cargo:rerun-if-env-changed=LINKERD_CNI_EBPF_OBJECT");
    // A prebuilt object (e.g. from a packaging pipeline) wins over building one here.
    let object = match std::env::var("LINKERD_CNI_EBPF_OBJECT") {
        Ok(path) => path.into(),
        Err(_) => match linkerd_cni_ebpf_build::build(workspace) {
            Ok(path) => path,
            Err(e) => {
                eprintln!("error: {e}");
                std::process::exit(1);
            }
        },
    };
    println!("cargo:rerun-if-changed={}", object.display());
    println!(
        "cargo:rustc-env=LINKERD_CNI_EBPF_OBJECT={}",
        object.display()
    );
}
